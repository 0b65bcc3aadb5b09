//! What the kernel under test can do. In the kernel matrix, `cargo xtask vm` states it per
//! Debian kernel (`BACKLOGD_KERNEL_CAPS`, from its capability table), and the suites compare
//! backlogd's own probe with that statement; on the host, the kernel's version says what
//! is a fact of the version alone.

/// The matrix's statement for this kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caps {
    pub fentry: bool,
    pub kprobe: bool,
    pub perf_link_pinning: bool,
}

/// `BACKLOGD_KERNEL_CAPS="fentry=no kprobe=yes perf_link_pinning=no"`, when set.
pub fn stated() -> Option<Caps> {
    let text = std::env::var("BACKLOGD_KERNEL_CAPS").ok()?;
    Some(parse(&text))
}

fn parse(text: &str) -> Caps {
    let get = |name: &str| {
        text.split_whitespace()
            .find_map(|w| w.strip_prefix(name)?.strip_prefix('='))
            .map(|v| match v {
                "yes" => true,
                "no" => false,
                other => panic!("BACKLOGD_KERNEL_CAPS: {name}={other}: expected yes or no"),
            })
            .unwrap_or_else(|| panic!("BACKLOGD_KERNEL_CAPS={text:?} does not state {name}"))
    };
    Caps {
        fentry: get("fentry"),
        kprobe: get("kprobe"),
        perf_link_pinning: get("perf_link_pinning"),
    }
}

/// Whether the kernel can pin kprobe links (BPF_LINK_TYPE_PERF_EVENT came in
/// Linux 5.15 and was not backported): the matrix's statement, else the running version.
pub fn perf_link_pinning() -> bool {
    stated().map_or_else(|| release_at_least(5, 15), |c| c.perf_link_pinning)
}

/// Whether a daemon in `mode` keeps its kernel state across a restart: only kprobe mode
/// has perf-event links; fentry and tracepoint modes' tracing, raw tracepoint and cgroup
/// links are pinnable on every kernel backlogd runs on (5.7+).
pub fn can_pin(mode: &str) -> bool {
    mode != "kprobe" || perf_link_pinning()
}

/// Whether the running kernel is `major.minor` or newer.
pub fn release_at_least(major: u32, minor: u32) -> bool {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").expect("osrelease");
    let mut parts = release
        .trim()
        .split(|c: char| !c.is_ascii_digit())
        .map(|p| p.parse::<u32>().unwrap_or(0));
    let version = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    version >= (major, minor)
}

/// Whether a daemon that lists listeners with the scan iterator keeps CAP_BPF for bpf(2)
/// on its maps: where the kernel gates every bpf(2) command behind it while
/// `kernel.unprivileged_bpf_disabled` is set (5.10's `kernel/bpf/syscall.c`), or where
/// the sysctl is 0 (nothing gated now, but it may be set later). Not where only loading and
/// map creation are gated (6.1's). `None` between 5.10 and 6.1, where no kernel of the
/// matrix says which. The daemon finds out by trying (`service::caps::bpf_access`); this
/// is the kernels' source, so the two are independent.
pub fn daemon_keeps_cap_bpf() -> Option<bool> {
    let sysctl =
        std::fs::read_to_string("/proc/sys/kernel/unprivileged_bpf_disabled").unwrap_or_default();
    if !matches!(sysctl.trim(), "1" | "2") {
        return Some(true);
    }
    if release_at_least(6, 1) {
        Some(false)
    } else if !release_at_least(5, 11) {
        Some(true)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_matrixs_words_are_read() {
        assert_eq!(
            parse("fentry=no kprobe=yes perf_link_pinning=no"),
            Caps {
                fentry: false,
                kprobe: true,
                perf_link_pinning: false
            }
        );
    }
}
