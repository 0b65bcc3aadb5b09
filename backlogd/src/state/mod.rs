//! The daemon's live state: what its loops write and the exporters read. Kept apart from
//! the daemon (which runs the loops) and from the exporter (which serves it), so that the
//! readers (`/metrics` and the JSON API, which `top` and `doctor` read) depend on the
//! state, not on the daemon, and the exporter holds nothing the daemon writes.
//!
//! Who writes what:
//! - [`Shared`]: the listener table and how to read each namespace, by the event loop and
//!   the rescans;
//! - [`Live::windows`] (queue high-water marks) and [`Live::recent`] (client impact and
//!   drop sources over the last five minutes, [`recent`]), by the queue sampler;
//! - [`Live::accept_wait_buckets`], by a SIGHUP reload;
//! - [`Live::maps`]: the kernel's maps, which the programs write; the sampler and the
//!   rescans tend them (epochs, expired attempts, orphans) and a scrape reads them.

pub mod recent;

use std::{
    collections::{HashMap, HashSet},
    sync::{Arc, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard},
};

use self::recent::Histories;
use crate::{
    config::AcceptWaitBuckets,
    kernel_maps::SharedMaps,
    listeners::ListenerTable,
    loader::modes::{HookMode, KernelSupport},
    queues::QueueWindows,
    sampling::{iterator::LiveScan, tcpext},
};

/// Everything the exporters read, shared with the daemon's loops; cheap to clone.
#[derive(Clone)]
pub struct Live {
    pub shared: Arc<Shared>,
    pub maps: SharedMaps,
    pub windows: Arc<Mutex<QueueWindows>>,
    pub mode: HookMode,
    pub kernel: KernelSupport,
    /// The kernel state survives a daemon restart (pinned).
    pub pinned: bool,
    /// The accept-wait bounds /metrics exports (`accept_wait_buckets`; SIGHUP replaces
    /// them). The JSON API always has every bucket.
    pub accept_wait_buckets: Arc<RwLock<AcceptWaitBuckets>>,
    /// The programs see accept() return (fentry mode, or `syscall_hook`; fixed at load):
    /// without, accepts are not served.
    pub accepts: bool,
    /// The programs time accept waits (`accept_wait`, and they see accepts; fixed at
    /// load): without, /metrics serves no accept-wait histogram.
    pub accept_wait: bool,
    /// Serve source prefixes to API readers not on this host
    /// (`drop_source_addresses_remote`).
    pub drop_source_addresses_remote: bool,
    /// How many of each listener's largest source prefixes /metrics serves a series of
    /// (`drop_source_top_series`; 0: none).
    pub drop_source_top_series: usize,
    /// Client impact's and drop sources' records for the last five minutes (the sampler
    /// records).
    pub recent: Arc<Mutex<Histories>>,
    /// The scan pass, run by the readers of its figures (`None`: this kernel has none).
    pub scan: Option<Arc<LiveScan>>,
}

impl Live {
    pub fn new(
        shared: Arc<Shared>,
        maps: SharedMaps,
        windows: Arc<Mutex<QueueWindows>>,
        mode: HookMode,
        kernel: KernelSupport,
        pinned: bool,
        scan: Option<Arc<LiveScan>>,
    ) -> Self {
        Self {
            shared,
            maps,
            windows,
            mode,
            kernel,
            pinned,
            accept_wait_buckets: Arc::default(),
            accepts: true,
            accept_wait: true,
            drop_source_addresses_remote: false,
            drop_source_top_series: 0,
            recent: Arc::default(),
            scan,
        }
    }
}

/// The listener table and the namespaces: what the event loop and the rescans write.
#[derive(Debug, Default)]
pub struct Shared {
    listeners: RwLock<ListenerTable>,
    /// How to read each network namespace's TcpExt counters, by netns inode.
    netns_sources: Mutex<HashMap<u32, tcpext::Source>>,
    /// Listen sysctls by netns inode, as of the last scan (or the first API request that
    /// needed a namespace the scan had not seen).
    netns_sysctls: Mutex<HashMap<u32, tcpext::ListenSysctls>>,
    /// Kernel map entries of gone listeners removed by the rescans (see `daemon/rescans.rs`, `remove_orphans`).
    pub orphans_removed: std::sync::atomic::AtomicU64,
    /// Container names from the runtimes' APIs (one pass at a time: a pass that finds
    /// it busy leaves the work to the one running, or to the next rescan).
    pub runtime_names: tokio::sync::Mutex<crate::names::runtime::Resolver>,
}

impl Shared {
    /// The table, read-locked. Never hold one guard while taking another on the same
    /// thread: std's RwLock deadlocks then if a writer is waiting in between.
    pub fn listeners(&self) -> RwLockReadGuard<'_, ListenerTable> {
        // A panic while holding the lock cannot leave the table half-updated (apply is a
        // single insert/remove), so a poisoned lock is still good to read.
        self.listeners.read().unwrap_or_else(|e| e.into_inner())
    }

    pub fn write_listeners(&self) -> RwLockWriteGuard<'_, ListenerTable> {
        self.listeners.write().unwrap_or_else(|e| e.into_inner())
    }

    /// TcpExt counters of every namespace that has listeners. A namespace whose known
    /// source no longer leads to it is skipped until the next scan finds another.
    pub fn netns_counters(&self) -> Vec<(u32, HashMap<String, u64>)> {
        let wanted: HashSet<u32> = self.listeners().iter().map(|l| l.netns).collect();
        let sources = self.netns_sources.lock().unwrap_or_else(|e| e.into_inner());
        let mut out: Vec<(u32, HashMap<String, u64>)> = wanted
            .into_iter()
            .filter_map(|ns| Some((ns, sources.get(&ns)?.read(ns)?)))
            .collect();
        out.sort_by_key(|(ns, _)| *ns);
        out
    }

    /// Listen sysctls of every namespace that has listeners, as of the last scan (they
    /// change rarely; reading them means joining each namespace).
    pub fn netns_sysctls(&self) -> Vec<(u32, tcpext::ListenSysctls)> {
        let wanted: HashSet<u32> = self.listeners().iter().map(|l| l.netns).collect();
        let mut known = self.netns_sysctls.lock().unwrap_or_else(|e| e.into_inner());
        let missing: Vec<u32> = wanted
            .iter()
            .copied()
            .filter(|ns| !known.contains_key(ns))
            .collect();
        if !missing.is_empty() {
            let sources = self.netns_sources.lock().unwrap_or_else(|e| e.into_inner());
            for ns in missing {
                if let Some(s) = sources.get(&ns).and_then(|source| source.sysctls(ns)) {
                    known.insert(ns, s);
                }
            }
        }
        let mut out: Vec<(u32, tcpext::ListenSysctls)> = wanted
            .into_iter()
            .filter_map(|ns| Some((ns, *known.get(&ns)?)))
            .collect();
        out.sort_by_key(|(ns, _)| *ns);
        out
    }

    /// A listen() in `netns`, by a task there. Its cached sysctls are dropped: namespace
    /// inode numbers are reused, so they may be a gone namespace's (read again on demand).
    pub fn note_netns(&self, netns: u32, source: tcpext::Source) {
        self.netns_sources
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(netns, source);
        self.netns_sysctls
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&netns);
    }

    /// Listen sysctls a scan pass read (fresher than a rescan's, and no namespace need be
    /// joined for them), for the namespaces that have listeners.
    pub fn note_sysctls(&self, read: HashMap<u32, tcpext::ListenSysctls>) {
        let in_use: HashSet<u32> = self.listeners().iter().map(|l| l.netns).collect();
        self.netns_sysctls
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend(read.into_iter().filter(|(ns, _)| in_use.contains(ns)));
    }

    /// A rescan's namespaces: its sources replace older ones; sources noted from events
    /// for namespaces the scan did not see stay while listeners live there.
    pub fn note_scanned_netns(
        &self,
        sources: Vec<(u32, tcpext::Source)>,
        sysctls: Vec<(u32, tcpext::ListenSysctls)>,
    ) {
        let in_use: HashSet<u32> = self.listeners().iter().map(|l| l.netns).collect();
        let scanned: HashSet<u32> = sources.iter().map(|(ns, _)| *ns).collect();
        let mut known = self.netns_sources.lock().unwrap_or_else(|e| e.into_inner());
        known.retain(|ns, _| scanned.contains(ns) || in_use.contains(ns));
        known.extend(sources);
        drop(known);
        let mut known = self.netns_sysctls.lock().unwrap_or_else(|e| e.into_inner());
        known.retain(|ns, _| in_use.contains(ns));
        known.extend(sysctls);
    }
}
