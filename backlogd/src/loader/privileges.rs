//! Checks the capabilities loading needs before trying, so the error says what to do.

const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

#[derive(Debug, Clone, thiserror::Error)]
#[error(
    "backlogd needs root, or the capabilities CAP_BPF, CAP_PERFMON and CAP_NET_ADMIN (or \
     CAP_SYS_ADMIN, the only one on kernels older than 5.8), to load eBPF programs and attach \
     them; this process has effective capabilities {effective:#x}. Fix: run it as root (`sudo \
     backlogd {command}`), or grant them, e.g. `setcap cap_bpf,cap_perfmon,cap_net_admin+ep \
     $(command -v backlogd)`"
)]
pub struct MissingPrivileges {
    pub effective: u64,
    /// The subcommand that needs them (`run`, `load`), for the fix.
    pub command: &'static str,
}

/// Effective capability set of this process, from /proc/self/status.
fn effective_caps() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        })
        .unwrap_or(0)
}

/// Whether this process can load and attach; `command`: the subcommand asking, named in
/// the fix.
pub fn check(command: &'static str) -> Result<(), MissingPrivileges> {
    let effective = effective_caps();
    let has = |cap: u32| effective & (1 << cap) != 0;
    if has(CAP_SYS_ADMIN) || (has(CAP_BPF) && has(CAP_PERFMON)) {
        Ok(())
    } else {
        Err(MissingPrivileges { effective, command })
    }
}
