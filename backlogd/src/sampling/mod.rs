//! Socket sampling: the kernel's own list of listeners, read through sock_diag in every
//! network namespace.
//!
//! Events tell backlogd about listeners as they appear; sampling finds the ones that were
//! already listening when the daemon started, and repairs the table should an event ever
//! be lost.

pub mod iterator;
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
    /// Each namespace's listen sysctls, as of this scan.
    pub sysctls: Vec<(u32, tcpext::ListenSysctls)>,
    /// Namespaces whose listeners were listed: only there can a scan tell that a listener
    /// is gone.
    pub listed: HashSet<u32>,
}

/// Every TCP listener in every network namespace the host has.
pub fn scan() -> Scan {
    let mut all = Vec::new();
    let mut sources = Vec::new();
    let mut sysctls = Vec::new();
    let mut listed = HashSet::new();
    for ns in netns::all() {
        let task = tcpext::Source::task(&ns.path);
        // One trip into the namespace for everything that needs it, so that scrapes and
        // API requests never have to join a namespace.
        let visit = || {
            let found = sock_diag::listeners()?;
            let source = match &task {
                Some(task) => Some(task.clone()),
                None => tcpext::Source::open_here().ok(),
            };
            Ok((found, source, tcpext::ListenSysctls::read_here().ok()))
        };
        match netns::run_in(&ns.path, visit) {
            Ok(Ok((mut found, source, listen_sysctls))) => {
                for l in &mut found {
                    l.netns = ns.inode;
                }
                all.extend(found);
                listed.insert(ns.inode);
                sources.extend(source.map(|s| (ns.inode, s)));
                sysctls.extend(listen_sysctls.map(|s| (ns.inode, s)));
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
        sysctls,
        listed,
    }
}
