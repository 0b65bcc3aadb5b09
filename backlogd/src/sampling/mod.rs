//! Socket sampling: the kernel's own list of listeners.
//!
//! Events tell backlogd about listeners as they appear; sampling finds the ones that were
//! already listening when the daemon started, and repairs the table should an event ever
//! be lost. Two ways, the first wherever it works:
//! - the scan iterator ([`iterator`]): one pass over every task's open files gives each
//!   listener with its namespace, owner and namespace sysctls, with no namespace joined
//!   and no /proc directory walked; plus sock_diag in the daemon's own namespace for the
//!   listeners no process holds there (an in-kernel server's, such as nfsd's);
//! - sock_diag run inside every network namespace (`setns`, CAP_SYS_ADMIN), with owners
//!   from a walk of every process's descriptors: where the iterator cannot see every
//!   task (the daemon in a PID namespace of its own, a pod without hostPID) or could not
//!   be loaded.
pub mod iterator;
pub mod netns;
pub mod owners;
pub mod sock_diag;
pub mod tcpext;

use std::{
    collections::{HashMap, HashSet},
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    os::unix::fs::MetadataExt as _,
    sync::Mutex,
};

use backlogd_common::{AF_INET6, ScannedListener};
pub use sock_diag::DiagListener;

use crate::queues::QueueWindows;

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
    /// The process holding each listener, where the scan itself knows (the iterator's);
    /// `None`: found by walking /proc afterwards, for the listeners that need it.
    pub owners: Option<HashMap<u64, owners::Owner>>,
}

/// Every TCP listener in every network namespace the host has: by the scan iterator
/// `live` where it sees every task, else by sock_diag in each namespace.
pub fn scan(live: Option<&iterator::LiveScan>, windows: &Mutex<QueueWindows>) -> Scan {
    if let Some(live) = live {
        if !live.lists() {
            // Said at warning level once, at load (`btf::listen_sysctl`).
            tracing::debug!(
                "the scan iterator reads no listen sysctls on this kernel; scanning each namespace with sock_diag"
            );
        } else if in_initial_pid_namespace() {
            match live.fresh_pass(windows) {
                Ok(found) => return from_iterator(found),
                Err(e) => {
                    tracing::warn!(error = %e, "scan iterator pass failed; scanning each namespace with sock_diag")
                }
            }
        } else {
            tracing::debug!(
                "in a PID namespace of its own: the iterator sees only its tasks; scanning each namespace with sock_diag"
            );
        }
    }
    if !netns::can_join() {
        // Without CAP_SYS_ADMIN (the systemd unit grants none) no namespace can be
        // joined, the daemon's own included: sock_diag there, which needs none.
        tracing::warn!(
            "the scan iterator cannot list listeners here and setns(2) needs CAP_SYS_ADMIN, \
             which this daemon does not hold: listeners open before it are found in its own \
             network namespace only. Fix: a kernel with BPF iterators (5.8+) and the daemon \
             in the host's PID namespace, or grant CAP_SYS_ADMIN"
        );
        let mut scan = Scan::default();
        own_namespace(&mut scan);
        return scan;
    }
    scan_each_namespace()
}

/// The initial PID namespace has a fixed inode number (`PROC_PID_INIT_INO`).
pub fn in_initial_pid_namespace() -> bool {
    const PROC_PID_INIT_INO: u64 = 0xEFFF_FFFC;
    std::fs::metadata("/proc/self/ns/pid").is_ok_and(|m| m.ino() == PROC_PID_INIT_INO)
}

/// A scan from one iterator pass, plus sock_diag in the daemon's own namespace: a listener
/// no task holds (an in-kernel server's) has no descriptor for the iterator to visit. In
/// another namespace such a listener is not found (none of the servers people run there
/// is one); the namespaces the pass found listeners in count as listed, so a listener
/// whose close was missed is removed, as sock_diag's listing would have it.
fn from_iterator(found: HashMap<u64, ScannedListener>) -> Scan {
    let mut scan = Scan::default();
    let mut owners = HashMap::new();
    // Per namespace: the processes holding its listeners, and its sysctls.
    let mut netns: HashMap<u32, (Vec<u32>, tcpext::ListenSysctls)> = HashMap::new();
    let mut comms: HashMap<u32, String> = HashMap::new();
    for l in found.values() {
        scan.listeners.push(DiagListener {
            netns: l.netns,
            addr: address(l),
            port: l.port,
            inode: l.ino,
            accept_queue: l.accept_queue,
            granted: l.accept_capacity,
            drops: None,
        });
        let (holders, _) = netns
            .entry(l.netns)
            .or_insert_with(|| (Vec::new(), iterator::sysctls(l)));
        if !holders.contains(&l.tgid) {
            holders.push(l.tgid);
        }
        let comm = comms.entry(l.tgid).or_insert_with(|| {
            std::fs::read_to_string(format!("/proc/{}/comm", l.tgid))
                .map(|c| c.trim_end().to_owned())
                .unwrap_or_default()
        });
        owners.insert(
            l.ino,
            owners::Owner {
                pid: l.tgid,
                comm: comm.clone(),
            },
        );
    }
    scan.owners = Some(owners);
    for (ns, (holders, sysctls)) in netns {
        scan.listed.insert(ns);
        // Counters through a thread inside the namespace; a process may hold a listener
        // of a namespace none of its threads is in (one passed to it), so each holder is
        // tried. None inside: the namespace's counters are absent until one is.
        let source = holders
            .iter()
            .find_map(|&tgid| tcpext::Source::thread_of(tgid, ns));
        scan.netns.extend(source.map(|s| (ns, s)));
        scan.sysctls.push((ns, sysctls));
    }
    own_namespace(&mut scan);
    scan
}

/// The daemon's own namespace by sock_diag (no namespace joined, no privilege needed):
/// the listeners there the iterator could not see, its counters and sysctls.
fn own_namespace(scan: &mut Scan) {
    let Ok(own) = std::fs::metadata("/proc/thread-self/ns/net").map(|m| m.ino() as u32) else {
        return;
    };
    match sock_diag::listeners() {
        Ok(found) => {
            let seen: HashSet<u64> = scan.listeners.iter().map(|l| l.inode).collect();
            scan.listeners.extend(
                found
                    .into_iter()
                    .filter(|l| !seen.contains(&l.inode))
                    .map(|l| DiagListener { netns: own, ..l }),
            );
            scan.listed.insert(own);
        }
        Err(e) => tracing::debug!(error = %e, "sock_diag in the daemon's own namespace failed"),
    }
    if !scan.netns.iter().any(|(ns, _)| *ns == own)
        && let Ok(source) = tcpext::Source::open_here()
    {
        scan.netns.push((own, source));
    }
    if !scan.sysctls.iter().any(|(ns, _)| *ns == own)
        && let Ok(sysctls) = tcpext::ListenSysctls::read_here()
    {
        scan.sysctls.push((own, sysctls));
    }
}

/// A scan record's local address.
fn address(l: &ScannedListener) -> IpAddr {
    if l.family == AF_INET6 {
        IpAddr::V6(Ipv6Addr::from(l.addr))
    } else {
        IpAddr::V4(Ipv4Addr::new(l.addr[0], l.addr[1], l.addr[2], l.addr[3]))
    }
}

/// Every TCP listener in every network namespace the host has, by sock_diag inside each.
fn scan_each_namespace() -> Scan {
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
        owners: None,
    }
}
