//! Dropping the capabilities loading needed once the probes are attached.
//!
//! What the running daemon still does, and the capability each needs:
//! - `setns(CLONE_NEWNET)` into every network namespace for the sock_diag rescans and to
//!   read namespace sysctls: CAP_SYS_ADMIN;
//! - open `/proc/PID/task/TID/ns/net` and list `/proc/PID/fd` of processes of other users
//!   or that are not dumpable (nginx workers after setuid) to find namespaces and socket
//!   owners: CAP_SYS_PTRACE (ptrace access mode) and CAP_DAC_READ_SEARCH (the directories
//!   are mode 0500, owned by the process's user);
//! - read the BPF maps through fds it already holds: no capability on kernels 6.5 and
//!   later, but before 6.5 every bpf(2) command needs CAP_BPF or CAP_SYS_ADMIN while
//!   `kernel.unprivileged_bpf_disabled` is set (Debian's default); CAP_SYS_ADMIN, kept
//!   for setns anyway, covers it.
//!
//! Given up: CAP_BPF and CAP_PERFMON (loading and attaching are done, and CAP_SYS_ADMIN
//! implies both for what is left), CAP_NET_ADMIN (the cgroup_skb program is attached), and
//! everything else root had (CAP_DAC_OVERRIDE, CAP_SETUID, CAP_SYS_MODULE, CAP_NET_RAW,
//! CAP_KILL, ...).
//!
//! Capabilities belong to threads, not processes, and capset(2) changes only the calling
//! thread: this must run before any other thread exists, so that every thread created
//! later inherits the reduced sets.

use caps::{CapSet, Capability, CapsHashSet};

/// What the running daemon keeps (see the module comment for why each).
pub const KEEP: [Capability; 3] = [
    Capability::CAP_SYS_ADMIN,
    Capability::CAP_SYS_PTRACE,
    Capability::CAP_DAC_READ_SEARCH,
];

#[derive(Debug, thiserror::Error)]
pub enum DropError {
    #[error(
        "cannot drop capabilities: {0}. Fix: report this; as a stopgap run backlogd with a \
         capability bounding set of CAP_SYS_ADMIN CAP_SYS_PTRACE CAP_DAC_READ_SEARCH"
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

/// Reduces this (only) thread's permitted and effective sets to `KEEP` (those it has),
/// clears the inheritable and ambient sets, and returns what was kept. So that nothing
/// given up comes back through execve(2) (root regains every capability in its bounding
/// set there), the bounding set is cut to `KEEP` too (while CAP_SETPCAP is still held)
/// and no_new_privs is set.
pub fn drop_to_runtime_set() -> Result<Vec<Capability>, DropError> {
    let threads = std::fs::read_dir("/proc/self/task").map_or(1, |d| d.count());
    if threads > 1 {
        return Err(DropError::Threads { threads });
    }
    let permitted = caps::read(None, CapSet::Permitted)?;
    let keep: CapsHashSet = KEEP
        .iter()
        .copied()
        .filter(|c| permitted.contains(c))
        .collect();
    if caps::has_cap(None, CapSet::Effective, Capability::CAP_SETPCAP)? {
        for cap in caps::read(None, CapSet::Bounding)? {
            if !KEEP.contains(&cap) {
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
