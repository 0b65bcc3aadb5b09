//! Socket sampling: the kernel's own list of listeners, read through sock_diag in every
//! network namespace.
//!
//! Events tell backlogd about listeners as they appear; sampling finds the ones that were
//! already listening when the daemon started, and repairs the table should an event ever
//! be lost.

pub mod netns;
pub mod owners;
pub mod sock_diag;
pub mod tcpext;

use std::collections::HashSet;

pub use sock_diag::DiagListener;

/// What a scan found.
#[derive(Debug, Default)]
pub struct Scan {
    pub listeners: Vec<DiagListener>,
    /// A way to read each namespace's TcpExt counters.
    pub netns: Vec<(u32, tcpext::Source)>,
    /// Namespaces whose listeners were listed: only there can a scan tell that a listener
    /// is gone.
    pub listed: HashSet<u32>,
}

/// Every TCP listener in every network namespace the host has.
pub fn scan() -> Scan {
    let mut all = Vec::new();
    let mut sources = Vec::new();
    let mut listed = HashSet::new();
    for ns in netns::all() {
        sources.push((ns.inode, tcpext::Source::from_ns_path(&ns.path)));
        match netns::run_in(&ns.path, sock_diag::listeners) {
            Ok(Ok(mut found)) => {
                for l in &mut found {
                    l.netns = ns.inode;
                }
                all.extend(found);
                listed.insert(ns.inode);
            }
            // Namespaces come and go while we scan; a vanished one has no listeners.
            Ok(Err(e)) | Err(e) => {
                tracing::debug!(netns = ns.inode, path = %ns.path.display(), error = %e, "skipping netns");
            }
        }
    }
    Scan {
        listeners: all,
        netns: sources,
        listed,
    }
}
