//! What the exporters show, read once per request from the daemon's live state
//! (`crate::state`): the listener table, the kernel maps and the high-water-mark windows,
//! joined per listener. `/metrics` (`page/`) and the JSON snapshot are both made from a
//! [`Figures`], with the last five minutes' client impact and drop sources from the
//! sampler's records (`state/recent.rs`). Nothing here writes the state.

use std::collections::{HashMap, HashSet};

use backlogd_common::{ListenerStats, QueueState};

use crate::{
    api::{self, ListenerSnapshot, NamespaceSnapshot, Snapshot},
    kernel_maps,
    queues::{QueueFigures, ScanPass},
    sources::{self, DropSources},
    state::{
        Live,
        recent::{self, Recent},
    },
};

/// The client-impact sweep's figures (see `kernel_maps.rs`).
#[derive(Debug, Clone, Copy, Default)]
pub struct ImpactFigures {
    pub tracked: u64,
    pub sweeps: u64,
    pub untracked: u64,
}

/// Per-listener figures by socket inode. Kernel-made keys (no adversary picks them), built
/// and probed 10k times per scrape with 10k listeners: a fast hash suits.
pub type ByInode<V> = foldhash::HashMap<u64, V>;

/// The kernel maps' figures as of one read.
pub struct Figures {
    pub events_lost: u64,
    pub stats_full: u64,
    /// Client impact's attempts in flight, sweeps and untracked drops, read in the same
    /// look at the maps as `stats`: a reader that sees no attempt left sees the abandoned
    /// counts of the sweep that said so.
    pub impact: ImpactFigures,
    /// Per-listener counters summed over CPUs, by socket inode.
    pub stats: ByInode<ListenerStats>,
    /// Per-listener queue figures, by socket inode, for every listener of the table.
    pub queues: ByInode<QueueFigures>,
    /// The scan pass that read the SYN queues' lengths now (`syn_depth`).
    pub scan: Option<ScanPass>,
    /// Drops and syncookies by source prefix, for listeners with any.
    pub sources: ByInode<DropSources>,
    /// What the recent client-impact figures subtract (None before the first record).
    pub recent: Option<Recent>,
}

/// Reads the kernel maps and the high-water-mark windows once, after a scan pass if the
/// last is older than a second. Blocks for the pass: call it off the async workers.
pub fn gather(live: &Live) -> Figures {
    if let Some(scan) = &live.scan {
        let wanted: HashSet<u32> = live.shared.listeners().iter().map(|l| l.netns).collect();
        scan.refresh(&live.windows, &wanted);
        // Read from each namespace's `struct net` by the pass: no namespace joined.
        live.shared.note_sysctls(scan.sysctls());
    }
    let epoch = live
        .windows
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .epoch();
    let (events_lost, stats_full, impact, (stats, queue_states), sources) = {
        let maps = live.maps.lock().unwrap_or_else(|e| e.into_inner());
        // Before the counters: the programs add to a prefix before they add to its
        // listener's drops, so read in this order prefixes + untracked never exceed
        // drops + cookies.
        let sources = maps.drop_sources();
        (
            maps.events_lost(),
            maps.stats_full(),
            ImpactFigures {
                tracked: maps.tracked,
                sweeps: maps.sweeps,
                untracked: maps.attempts_untracked(),
            },
            maps.listener_stats_and_queues::<ByInode<_>>(epoch),
            sources,
        )
    };
    let queue_states: ByInode<QueueState> = queue_states.into_iter().collect();
    let (recent, source_bases) = {
        let history = live.recent.lock().unwrap_or_else(|e| e.into_inner());
        let now = std::time::Instant::now();
        (history.impact.at(now), history.sources.at(now))
    };
    let since = |k: &_, c: &_| source_bases.as_ref().map_or(*c, |b| b.since(k, c));
    // Prefixes gone since the window began: expired (their whole counts went to the
    // expired entry), or their listener closed.
    let mut expired_before: ByInode<sources::Tally> = ByInode::default();
    for (key, base) in source_bases.iter().flat_map(|b| b.gone()) {
        if key.version == 4 || key.version == 6 {
            let sum = expired_before.entry(key.listener_ino).or_default();
            for (s, b) in sum.iter_mut().zip(base) {
                *s += b;
            }
        }
    }
    let sources = sources::summarise(
        sources,
        &stats,
        kernel_maps::monotonic_ns(),
        source_bases.is_some().then_some(sources::Window {
            since: &since,
            expired_before: &expired_before,
        }),
    );
    let (queues, scan) = {
        let windows = live.windows.lock().unwrap_or_else(|e| e.into_inner());
        let queues = live
            .shared
            .listeners()
            .iter()
            .map(|l| {
                let current = queue_states.get(&l.inode).copied();
                (
                    l.inode,
                    windows.figures(l.inode, current, l.scanned_queue()),
                )
            })
            .collect();
        (queues, windows.last_scan())
    };
    Figures {
        events_lost,
        stats_full,
        impact,
        stats,
        queues,
        scan,
        sources,
        recent,
    }
}

/// Everything `/metrics` shows per listener, for the JSON API (`backlogd top`).
pub fn snapshot(live: &Live) -> Snapshot {
    let Figures {
        events_lost,
        stats_full,
        stats,
        queues,
        scan,
        mut sources,
        recent,
        ..
    } = gather(live);
    // Before the table is locked: reading a namespace's sysctls or counters may lock it
    // too.
    let sysctls = live.shared.netns_sysctls();
    let cookies = namespace_cookies(live);
    let somaxconn: HashMap<u32, u32> = sysctls.iter().map(|(ns, s)| (*ns, s.somaxconn)).collect();
    let mut listeners: Vec<ListenerSnapshot> = live
        .shared
        .listeners()
        .iter()
        .map(|l| {
            let s = stats.get(&l.inode).copied().unwrap_or_default();
            let mut snapshot = ListenerSnapshot::new(
                l.clone(),
                s,
                queues.get(&l.inode).copied().unwrap_or_default(),
                somaxconn.get(&l.netns).copied(),
            );
            snapshot.recent_impact = recent.as_ref().and_then(|r| r.of(l.inode, &s));
            snapshot.drop_sources = sources.remove(&l.inode);
            snapshot
        })
        .collect();
    listeners.sort_by_key(|l| (l.listener.netns, l.listener.port, l.listener.inode));
    let host = crate::sampling::netns::host();
    let mut names = crate::names::netns::named();
    let namespaces = sysctls
        .into_iter()
        .map(|(netns, sysctls)| NamespaceSnapshot {
            netns,
            host: host == Some(netns),
            name: names.remove(&netns),
            sysctls,
            syncookies: cookies.get(&netns).copied(),
        })
        .collect();
    Snapshot {
        namespaces,
        version: env!("CARGO_PKG_VERSION").to_owned(),
        hook_mode: live.mode.name().to_owned(),
        kernel: api::KernelSupport {
            fentry: live.kernel.fentry,
            kprobe: live.kernel.kprobe,
            trampolines: live.kernel.trampolines,
            perf_link_pinning: live.kernel.perf_link_pinning,
        },
        events_lost,
        stats_full,
        listeners,
        impact_window: recent.map(|r| r.window),
        syn_queue_read_age_seconds: scan.map(|s| s.at.elapsed().as_secs_f64()),
        accepts_counted: live.accepts,
    }
}

/// Each namespace's syncookies over the recent window (the records the impact window's
/// come from), for those that sent or got back any in it.
fn namespace_cookies(live: &Live) -> HashMap<u32, api::Syncookies> {
    let counters = live.shared.netns_counters();
    let bases = live
        .recent
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .cookies
        .at(std::time::Instant::now());
    counters
        .into_iter()
        .filter_map(|(ns, c)| {
            let now = recent::cookies_of(&c);
            let window = bases.as_ref().map_or(now, |b| b.since_kept(&ns, &now));
            (window != api::Syncookies::default()).then_some((ns, window))
        })
        .collect()
}
