//! Dropping the capabilities loading needed once the probes are attached.
//!
//! What the running daemon still does, and the capability each needs:
//! - read the BPF maps through fds it already holds (or opens from pins), and open a pass
//!   of the scan iterator: no capability on 6.1, which gates only loading and map creation
//!   behind `kernel.unprivileged_bpf_disabled`, but on 5.10 every bpf(2) command needs
//!   CAP_BPF (Linux 5.8+) or CAP_SYS_ADMIN while it is set (Debian's default);
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
//!   by walking descriptors (no iterator): CAP_DAC_READ_SEARCH.
//!
//! Given up: CAP_PERFMON (loading and attaching are done), CAP_NET_ADMIN (the cgroup_skb
//! program is attached), CAP_SYS_ADMIN where CAP_BPF serves, and everything else root had
//! (CAP_DAC_OVERRIDE, CAP_SETUID, CAP_SYS_MODULE, CAP_NET_RAW, CAP_KILL, ...).
//!
//! Capabilities belong to threads, not processes, and capset(2) changes only the calling
//! thread: this must run before any other thread exists, so that every thread created
//! later inherits the reduced sets.

use caps::{CapSet, Capability, CapsHashSet};

/// How the running daemon finds listeners, which decides what it keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listing {
    /// The scan iterator: no namespace is joined.
    Iterator,
    /// sock_diag inside every namespace: `setns`.
    EachNamespace,
}

/// What the running daemon keeps (see the module comment for why each), of what it was
/// given: `permitted`. CAP_BPF exists from Linux 5.8 and may not have been granted (a pod
/// given CAP_SYS_ADMIN): CAP_SYS_ADMIN stands in for it then. Listing each namespace
/// without CAP_SYS_ADMIN granted (the systemd unit's bounding set has none) keeps CAP_BPF
/// for the maps; the rescans then see the daemon's own namespace only (`sampling::scan`).
pub fn runtime_set(listing: Listing, permitted: &CapsHashSet) -> CapsHashSet {
    let has = |c| permitted.contains(&c);
    let bpf = match listing {
        Listing::Iterator if has(Capability::CAP_BPF) => Capability::CAP_BPF,
        Listing::EachNamespace if !has(Capability::CAP_SYS_ADMIN) => Capability::CAP_BPF,
        _ => Capability::CAP_SYS_ADMIN,
    };
    [
        bpf,
        Capability::CAP_SYS_PTRACE,
        Capability::CAP_DAC_READ_SEARCH,
    ]
    .into_iter()
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
pub fn drop_to_runtime_set(listing: Listing) -> Result<Vec<Capability>, DropError> {
    let threads = std::fs::read_dir("/proc/self/task").map_or(1, |d| d.count());
    if threads > 1 {
        return Err(DropError::Threads { threads });
    }
    let permitted = caps::read(None, CapSet::Permitted)?;
    let keep = runtime_set(listing, &permitted);
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
            runtime_set(Listing::Iterator, &root),
            set(&[
                Capability::CAP_BPF,
                Capability::CAP_SYS_PTRACE,
                Capability::CAP_DAC_READ_SEARCH
            ])
        );
        assert_eq!(
            runtime_set(Listing::EachNamespace, &root),
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
        assert_eq!(runtime_set(Listing::EachNamespace, &unit), kept);
        assert_eq!(runtime_set(Listing::Iterator, &unit), kept);
    }

    #[test]
    fn without_cap_bpf_granted_cap_sys_admin_stands_in_and_nothing_is_added() {
        let pod = set(&[
            Capability::CAP_SYS_ADMIN,
            Capability::CAP_SYS_PTRACE,
            Capability::CAP_NET_ADMIN,
        ]);
        assert_eq!(
            runtime_set(Listing::Iterator, &pod),
            set(&[Capability::CAP_SYS_ADMIN, Capability::CAP_SYS_PTRACE])
        );
    }
}
