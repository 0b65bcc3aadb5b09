//! Dropping the capabilities loading needed once the probes are attached.
//!
//! What the running daemon still does, and the capability each needs:
//! - read the BPF maps through fds it already holds (or opens from pins), and open a pass
//!   of the scan iterator: no capability on 6.1, which gates only loading and map creation
//!   behind `kernel.unprivileged_bpf_disabled`, but on 5.10 every bpf(2) command needs
//!   CAP_BPF (Linux 5.8+) or CAP_SYS_ADMIN while it is set (Debian's default). Which of
//!   the two the running kernel does is found by trying ([`bpf_access`]);
//! - find the listeners that were open before it started, and repair the table. With the
//!   scan iterator (`sampling`), that needs nothing more: one pass reads every listener
//!   with its namespace, owner and namespace sysctls. Without it (a kernel that refused
//!   it, or a daemon in a PID namespace of its own, where the iterator sees only that
//!   namespace's tasks), `setns(CLONE_NEWNET)` into every network namespace for sock_diag
//!   and the sysctls: CAP_SYS_ADMIN, which then also covers bpf(2);
//! - read what identifies a listener's program and container through `/proc/PID` of
//!   processes of other users, or that are not dumpable (nginx workers after setuid), or
//!   that hold capabilities the daemon gave up (any root service): their `exe`, `environ`,
//!   `root` and `cwd` (a container's files, its runtime's socket), and their `ns/net`
//!   (which namespace a task's counters are): CAP_SYS_PTRACE (ptrace access mode);
//! - read those programs' configuration files, which need not be readable by root without
//!   privilege (Redis's is 0640 redis:redis), and list `/proc/PID/fd` when owners are found
//!   by walking descriptors (no iterator): CAP_DAC_READ_SEARCH. As the systemd unit's user
//!   `backlogd`, it also passes /sys/fs/bpf to the pins (systemd mounts bpffs 0700).
//!
//! Given up: CAP_PERFMON (loading and attaching are done), CAP_NET_ADMIN (the cgroup_skb
//! program is attached), CAP_SYS_ADMIN where CAP_BPF serves, CAP_BPF itself where bpf(2)
//! on held objects is not gated, and everything else root had
//! (CAP_DAC_OVERRIDE, CAP_SETUID, CAP_SYS_MODULE, CAP_NET_RAW, CAP_KILL, ...).
//!
//! Capabilities belong to threads, not processes, and capset(2) changes only the calling
//! thread: this must run before any other thread exists, so that every thread created
//! later inherits the reduced sets.

use caps::{CapSet, Capability, CapsHashSet};

/// Whether bpf(2) on the objects the daemon already holds (its maps, the iterator's link)
/// needs CAP_BPF on this kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BpfAccess {
    /// Every bpf(2) command needs it while `kernel.unprivileged_bpf_disabled` is set
    /// (5.10), or that cannot be ruled out.
    Gated,
    /// Only loading and map creation need it (6.1).
    Open,
}

/// Finds out by asking the kernel: one bpf(2) call on `map` with CAP_BPF and
/// CAP_SYS_ADMIN lowered from this thread's effective set, then raised
/// again. With `kernel.unprivileged_bpf_disabled` at 0 the call passes on every kernel,
/// and an administrator may set it to 2 later, which on 5.10 gates every command: so
/// then, and when the sysctl cannot be read, the answer is `Gated`.
pub fn bpf_access<K: aya::Pod, V: aya::Pod>(
    map: &aya::maps::PerCpuHashMap<aya::maps::MapData, K, V>,
) -> Result<BpfAccess, DropError> {
    let sysctl = std::fs::read_to_string("/proc/sys/kernel/unprivileged_bpf_disabled");
    if !sysctl.is_ok_and(|v| matches!(v.trim(), "1" | "2")) {
        return Ok(BpfAccess::Gated);
    }
    let effective = caps::read(None, CapSet::Effective)?;
    let lowered: Vec<Capability> = [Capability::CAP_BPF, Capability::CAP_SYS_ADMIN]
        .into_iter()
        .filter(|c| effective.contains(c))
        .collect();
    for &cap in &lowered {
        caps::drop(None, CapSet::Effective, cap)?;
    }
    let open = crate::bpf_syscall::map_access_allowed(map);
    for &cap in &lowered {
        caps::raise(None, CapSet::Effective, cap)?;
    }
    Ok(if open {
        BpfAccess::Open
    } else {
        BpfAccess::Gated
    })
}

/// How the running daemon finds listeners, which decides what it keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listing {
    /// The scan iterator: no namespace is joined.
    Iterator,
    /// sock_diag inside every namespace: `setns`.
    EachNamespace,
}

/// What the running daemon keeps (see the module comment for why each), of what it was
/// given: `permitted`. CAP_BPF only where `bpf` is gated; CAP_BPF exists from Linux 5.8
/// and may not have been granted (a pod given CAP_SYS_ADMIN): CAP_SYS_ADMIN stands in for
/// it then. Listing each namespace keeps CAP_SYS_ADMIN for setns where granted; where not
/// (the systemd unit's bounding set has none) the rescans see the daemon's own namespace
/// only (`sampling::scan`).
pub fn runtime_set(listing: Listing, bpf: BpfAccess, permitted: &CapsHashSet) -> CapsHashSet {
    let has = |c| permitted.contains(&c);
    let gated = bpf == BpfAccess::Gated;
    let privilege = match listing {
        Listing::EachNamespace if has(Capability::CAP_SYS_ADMIN) => Some(Capability::CAP_SYS_ADMIN),
        _ if !gated => None,
        _ if has(Capability::CAP_BPF) => Some(Capability::CAP_BPF),
        _ => Some(Capability::CAP_SYS_ADMIN),
    };
    privilege
        .into_iter()
        .chain([Capability::CAP_SYS_PTRACE, Capability::CAP_DAC_READ_SEARCH])
        .filter(|c| permitted.contains(c))
        .collect()
}

#[derive(Debug, thiserror::Error)]
pub enum DropError {
    #[error(
        "cannot drop capabilities: {0}. Fix: report this; as a stopgap set `drop_privileges = \
         false` and run backlogd with a capability bounding set of CAP_BPF CAP_PERFMON \
         CAP_NET_ADMIN CAP_SYS_PTRACE CAP_DAC_READ_SEARCH (CAP_SYS_ADMIN instead of the first \
         three before Linux 5.8)"
    )]
    Caps(#[from] caps::errors::CapsError),
    #[error(
        "cannot drop capabilities: {threads} threads exist and capabilities are per thread, \
         so the others would keep theirs (a bug: drop them before starting the runtime)"
    )]
    Threads { threads: usize },
    #[error(
        "cannot set no_new_privs: {0}. Fix: report this (prctl(PR_SET_NO_NEW_PRIVS) never fails on Linux 3.5+)"
    )]
    NoNewPrivs(std::io::Error),
}

/// Reduces this (only) thread's permitted and effective sets to [`runtime_set`], clears
/// the inheritable and ambient sets, and returns what was kept. So that nothing given up
/// comes back through execve(2) (root regains every capability in its bounding set
/// there), the bounding set is cut to the same (while CAP_SETPCAP is still held) and
/// no_new_privs is set.
pub fn drop_to_runtime_set(listing: Listing, bpf: BpfAccess) -> Result<Vec<Capability>, DropError> {
    let threads = std::fs::read_dir("/proc/self/task").map_or(1, |d| d.count());
    if threads > 1 {
        return Err(DropError::Threads { threads });
    }
    let permitted = caps::read(None, CapSet::Permitted)?;
    let keep = runtime_set(listing, bpf, &permitted);
    if caps::has_cap(None, CapSet::Effective, Capability::CAP_SETPCAP)? {
        for cap in caps::read(None, CapSet::Bounding)? {
            if !keep.contains(&cap) {
                caps::drop(None, CapSet::Bounding, cap)?;
            }
        }
    }
    // SAFETY: prctl(PR_SET_NO_NEW_PRIVS) takes plain integer arguments and affects only
    // this thread (and threads it creates later).
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err(DropError::NoNewPrivs(std::io::Error::last_os_error()));
    }
    // Ambient first: it must stay a subset of permitted and inheritable.
    caps::clear(None, CapSet::Ambient)?;
    caps::clear(None, CapSet::Inheritable)?;
    caps::set(None, CapSet::Effective, &keep)?;
    caps::set(None, CapSet::Permitted, &keep)?;
    let mut kept: Vec<Capability> = keep.into_iter().collect();
    kept.sort_by_key(|c| c.index());
    Ok(kept)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(caps: &[Capability]) -> CapsHashSet {
        caps.iter().copied().collect()
    }

    #[test]
    fn the_iterator_needs_no_setns_so_cap_bpf_replaces_cap_sys_admin() {
        let root = caps::all();
        assert_eq!(
            runtime_set(Listing::Iterator, BpfAccess::Gated, &root),
            set(&[
                Capability::CAP_BPF,
                Capability::CAP_SYS_PTRACE,
                Capability::CAP_DAC_READ_SEARCH
            ])
        );
        assert_eq!(
            runtime_set(Listing::EachNamespace, BpfAccess::Gated, &root),
            set(&[
                Capability::CAP_SYS_ADMIN,
                Capability::CAP_SYS_PTRACE,
                Capability::CAP_DAC_READ_SEARCH
            ])
        );
    }

    #[test]
    fn each_namespace_without_cap_sys_admin_granted_keeps_cap_bpf_for_the_maps() {
        let unit = set(&[
            Capability::CAP_BPF,
            Capability::CAP_PERFMON,
            Capability::CAP_NET_ADMIN,
            Capability::CAP_SYS_PTRACE,
            Capability::CAP_DAC_READ_SEARCH,
        ]);
        let kept = set(&[
            Capability::CAP_BPF,
            Capability::CAP_SYS_PTRACE,
            Capability::CAP_DAC_READ_SEARCH,
        ]);
        assert_eq!(
            runtime_set(Listing::EachNamespace, BpfAccess::Gated, &unit),
            kept
        );
        assert_eq!(
            runtime_set(Listing::Iterator, BpfAccess::Gated, &unit),
            kept
        );
    }

    #[test]
    fn without_cap_bpf_granted_cap_sys_admin_stands_in_and_nothing_is_added() {
        let pod = set(&[
            Capability::CAP_SYS_ADMIN,
            Capability::CAP_SYS_PTRACE,
            Capability::CAP_NET_ADMIN,
        ]);
        assert_eq!(
            runtime_set(Listing::Iterator, BpfAccess::Gated, &pod),
            set(&[Capability::CAP_SYS_ADMIN, Capability::CAP_SYS_PTRACE])
        );
    }

    #[test]
    fn where_bpf_is_not_gated_neither_cap_bpf_nor_cap_sys_admin_stays_for_the_maps() {
        let names = set(&[Capability::CAP_SYS_PTRACE, Capability::CAP_DAC_READ_SEARCH]);
        for given in [
            caps::all(),
            set(&[
                Capability::CAP_BPF,
                Capability::CAP_SYS_PTRACE,
                Capability::CAP_DAC_READ_SEARCH,
            ]),
        ] {
            assert_eq!(
                runtime_set(Listing::Iterator, BpfAccess::Open, &given),
                names
            );
        }
        // setns still needs CAP_SYS_ADMIN where the namespaces are listed one by one.
        let mut with_setns = names.clone();
        with_setns.insert(Capability::CAP_SYS_ADMIN);
        assert_eq!(
            runtime_set(Listing::EachNamespace, BpfAccess::Open, &caps::all()),
            with_setns
        );
    }
}
