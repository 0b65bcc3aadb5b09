//! `/metrics`: rendered from the live tables and the kernel maps at scrape time, so there
//! are no copies to keep in sync and closed listeners cannot leave stale series. Every
//! metric here is documented in docs/metrics.md.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    os::fd::{AsFd as _, AsRawFd as _},
    sync::{Arc, Mutex},
};

use aya::{
    maps::{Array, MapData, PerCpuArray, PerCpuHashMap},
    programs::ProgramFd,
};
use backlogd_common::{ACCEPT_WAIT_BUCKETS, ListenerStats, QueueState, map_full};
use serde::{Deserialize, Serialize};

use super::text::{Exposition, HistogramNames, Kind, LabelSet};
use crate::{
    daemon::Shared,
    listeners::Listener,
    loader::modes::{HookMode, KernelSupport},
    queues::{QueueFigures, QueueWindows, merge},
    sampling::tcpext::{self, ListenSysctls},
};

/// The eBPF maps read at scrape time (and by the queue sampler).
pub struct KernelMaps {
    /// Per-CPU count of lifecycle events the ring buffer had no room for.
    pub events_lost: PerCpuArray<MapData, u64>,
    /// Per-listener SYN-path and accept counters, per CPU, keyed by socket inode.
    pub listener_stats: PerCpuHashMap<MapData, u64, ListenerStats>,
    /// Per-CPU count of counter updates that found the listener map full.
    pub listener_stats_full: PerCpuArray<MapData, u64>,
    /// Queue depths and not-yet-sampled maxima, per CPU, keyed by socket inode.
    pub listener_queues: PerCpuHashMap<MapData, u64, QueueState>,
    /// Sampling epoch the kernel tags queue maxima with.
    pub queue_epoch: Array<MapData, u32>,
    /// backlogd's attached programs, for the runs the kernel skipped.
    pub programs: Vec<ProgramFd>,
}

impl KernelMaps {
    /// Keys of the per-listener maps (socket inodes).
    pub fn keys(&self) -> HashSet<u64> {
        let stats = self.listener_stats.keys().filter_map(Result::ok);
        stats
            .chain(self.listener_queues.keys().filter_map(Result::ok))
            .collect()
    }

    /// Per-listener counter updates lost to a full map, summed over CPUs.
    pub fn stats_full(&self) -> u64 {
        sum_at(
            &self.listener_stats_full,
            map_full::STATS,
            "LISTENER_STATS_FULL",
        )
    }

    /// Per-listener queue observations lost to a full map, summed over CPUs.
    pub fn queues_full(&self) -> u64 {
        sum_at(
            &self.listener_stats_full,
            map_full::QUEUES,
            "LISTENER_STATS_FULL",
        )
    }

    /// Removes `inodes` from the per-listener maps; returns how many entries went.
    pub fn remove(&mut self, inodes: &HashSet<u64>) -> u64 {
        let mut removed = 0;
        for ino in inodes {
            removed += u64::from(self.listener_stats.remove(ino).is_ok());
            removed += u64::from(self.listener_queues.remove(ino).is_ok());
        }
        removed
    }
}

/// Runs of `programs` the kernel skipped (`recursion_misses` in their fdinfo); `None` when
/// this kernel does not report it.
fn missed_runs(programs: &[ProgramFd]) -> Option<u64> {
    let mut total = None;
    for prog in programs {
        let info =
            std::fs::read_to_string(format!("/proc/self/fdinfo/{}", prog.as_fd().as_raw_fd()))
                .ok()?;
        let misses = info
            .lines()
            .find_map(|l| l.strip_prefix("recursion_misses:"))
            .and_then(|n| n.trim().parse::<u64>().ok())?;
        *total.get_or_insert(0) += misses;
    }
    total
}

pub type SharedMaps = Arc<Mutex<KernelMaps>>;

pub struct Metrics {
    shared: Arc<Shared>,
    maps: SharedMaps,
    windows: Arc<Mutex<QueueWindows>>,
    mode: HookMode,
    kernel: KernelSupport,
    /// Queued counts and accept waits are only exported when enqueue events are seen.
    enqueue_events: bool,
    retired: Mutex<Retired>,
}

/// Group (netns, address, port) and process (pid, comm).
type GroupKey = (u32, std::net::IpAddr, u16);
type ProcessKey = (u32, String);

/// What closed members contributed to the group and process counters, so those
/// `_total`s never go down when a member closes (a decrease reads as a counter reset to
/// `rate()`: a spike the size of the whole counter). A member counts with the figures the
/// last render saw; anything it counted after that and before closing is not in the sums.
#[derive(Default)]
struct Retired {
    /// Every listener of the last render, with its aggregates and figures.
    last: HashMap<u64, (GroupKey, ProcessKey, ListenerStats)>,
    groups: HashMap<GroupKey, ListenerStats>,
    processes: HashMap<ProcessKey, ListenerStats>,
}

impl Retired {
    /// Takes this render's members (`now`; figures `None` when the kernel has no entry
    /// for the listener), retires the members of the last render that are gone, and
    /// forgets aggregates that have no member left (their series end). A member without
    /// figures keeps its last ones: a closing listener's kernel entry goes a moment before
    /// its close event reaches the table, and its counts must not vanish in between.
    fn update(&mut self, now: HashMap<u64, (GroupKey, ProcessKey, Option<ListenerStats>)>) {
        let now: HashMap<u64, (GroupKey, ProcessKey, ListenerStats)> = now
            .into_iter()
            .map(|(inode, (group, process, stats))| {
                let stats = stats
                    .or_else(|| self.last.get(&inode).map(|(_, _, s)| *s))
                    .unwrap_or_default();
                (inode, (group, process, stats))
            })
            .collect();
        for (inode, (group, process, stats)) in self.last.drain() {
            if !now.contains_key(&inode) {
                self.groups.entry(group).or_default().add(&stats);
                self.processes.entry(process).or_default().add(&stats);
            }
        }
        if !self.groups.is_empty() || !self.processes.is_empty() {
            let groups: HashSet<&GroupKey> = now.values().map(|(g, _, _)| g).collect();
            let processes: HashSet<&ProcessKey> = now.values().map(|(_, p, _)| p).collect();
            self.groups.retain(|g, _| groups.contains(g));
            self.processes.retain(|p, _| processes.contains(p));
        }
        self.last = now;
    }
}

fn sum(map: &PerCpuArray<MapData, u64>, name: &str) -> u64 {
    sum_at(map, 0, name)
}

fn sum_at(map: &PerCpuArray<MapData, u64>, index: u32, name: &str) -> u64 {
    map.get(&index, 0)
        .map(|per_cpu| per_cpu.iter().sum())
        .unwrap_or_else(|e| {
            tracing::warn!(error = %e, map = name, "reading map");
            0
        })
}

/// Per-listener counters summed over CPUs.
fn listener_stats(map: &PerCpuHashMap<MapData, u64, ListenerStats>) -> HashMap<u64, ListenerStats> {
    super::batch::fold_per_cpu(map, |per_cpu| {
        let mut total = ListenerStats::default();
        per_cpu.iter().for_each(|s| total.add(s));
        total
    })
    .into_iter()
    .collect()
}

struct Gathered {
    events_lost: u64,
    stats_full: u64,
    stats: HashMap<u64, ListenerStats>,
    queues: HashMap<u64, QueueFigures>,
}

/// `GET /api/v1/snapshot`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Snapshot {
    pub version: String,
    pub hook_mode: String,
    pub kernel: KernelSupport,
    pub events_lost: u64,
    pub stats_full: u64,
    pub listeners: Vec<ListenerSnapshot>,
    /// Listen sysctls of each namespace that has listeners.
    pub namespaces: Vec<NamespaceSnapshot>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NamespaceSnapshot {
    pub netns: u32,
    #[serde(flatten)]
    pub sysctls: ListenSysctls,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ListenerSnapshot {
    #[serde(flatten)]
    pub listener: Listener,
    pub syns_received: u64,
    pub drops: Drops,
    pub syncookies_sent: u64,
    pub synack_retransmits: u64,
    pub queued: u64,
    pub accepted: u64,
    pub queues: QueueFigures,
    pub accept_wait: AcceptWait,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Drops {
    pub accept_queue_full: u64,
    pub syn_queue_full: u64,
    pub final_ack_overflow: u64,
    pub other: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AcceptWait {
    pub count: u64,
    pub sum_seconds: f64,
    /// Per-bucket (not cumulative) counts; `le` in seconds, null for the last bucket.
    pub buckets: Vec<Bucket>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Bucket {
    pub le: Option<f64>,
    pub count: u64,
}

impl AcceptWait {
    /// Upper bound (seconds; infinite for the last bucket) below which fraction `q` of
    /// the waits fall, for per-bucket `counts` over these buckets (e.g. the increase over
    /// an interval). None without waits.
    pub fn quantile(&self, counts: &[u64], q: f64) -> Option<f64> {
        let total: u64 = counts.iter().sum();
        if total == 0 {
            return None;
        }
        let mut seen = 0;
        for (c, b) in counts.iter().zip(&self.buckets) {
            seen += c;
            if seen as f64 >= q * total as f64 {
                return Some(b.le.unwrap_or(f64::INFINITY));
            }
        }
        None
    }
}

/// Reads one counter of a listener.
type Field = fn(&ListenerStats) -> u64;

/// Drop reasons, as the `reason` label says them, and where each count lives.
const DROP_REASONS: [(&str, Field); 4] = [
    ("accept_queue_full", |s| s.drop_accept_queue_full),
    ("syn_queue_full", |s| s.drop_syn_queue_full),
    ("final_ack_overflow", |s| s.drop_final_ack_overflow),
    ("other", |s| s.drop_other),
];

const COUNTERS: [(&str, &str, Field); 5] = [
    (
        "backlogd_listen_syns_received_total",
        "SYNs (without ACK) that reached this listener, retransmitted ones included.",
        |s| s.syns,
    ),
    (
        "backlogd_listen_syncookies_sent_total",
        "SYNs answered with a syncookie because the SYN queue was full (the listener's \
         share of TcpExt TCPReqQFullDoCookies).",
        |s| s.syncookies,
    ),
    (
        "backlogd_listen_synack_retransmits_total",
        "SYN-ACKs retransmitted for this listener's pending connections.",
        |s| s.synack_retransmits,
    ),
    (
        "backlogd_listen_queued_total",
        "Connections whose handshake completed and that were put on the accept queue.",
        |s| s.queued,
    ),
    (
        "backlogd_listen_accepted_total",
        "Connections taken off the accept queue by accept()/accept4().",
        |s| s.accepted,
    ),
];

/// Upper bounds of the accept-wait buckets in seconds: 2^i microseconds.
fn accept_wait_bounds() -> [f64; ACCEPT_WAIT_BUCKETS] {
    std::array::from_fn(|i| (1u64 << i) as f64 / 1e6)
}

impl Metrics {
    pub fn new(
        shared: Arc<Shared>,
        maps: SharedMaps,
        windows: Arc<Mutex<QueueWindows>>,
        mode: HookMode,
        kernel: KernelSupport,
        enqueue_events: bool,
    ) -> Self {
        Self {
            shared,
            maps,
            windows,
            mode,
            kernel,
            enqueue_events,
            retired: Mutex::default(),
        }
    }

    /// Reads the kernel maps and the high-water-mark windows once.
    fn gather(&self) -> Gathered {
        let epoch = self
            .windows
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .epoch();
        let (events_lost, stats_full, stats, queue_states) = {
            let maps = self.maps.lock().unwrap_or_else(|e| e.into_inner());
            let queue_states: HashMap<u64, QueueState> =
                super::batch::fold_per_cpu(&maps.listener_queues, |per_cpu| merge(per_cpu, epoch))
                    .into_iter()
                    .collect();
            (
                sum(&maps.events_lost, "LISTENER_EVENTS_LOST"),
                maps.stats_full(),
                listener_stats(&maps.listener_stats),
                queue_states,
            )
        };
        let queues = {
            let windows = self.windows.lock().unwrap_or_else(|e| e.into_inner());
            self.shared
                .listeners()
                .iter()
                .map(|l| {
                    let current = queue_states.get(&l.inode).copied();
                    (l.inode, windows.figures(l.inode, current))
                })
                .collect()
        };
        Gathered {
            events_lost,
            stats_full,
            stats,
            queues,
        }
    }

    /// Everything `/metrics` shows per listener, for the JSON API (`backlogd top`).
    pub fn snapshot(&self) -> Snapshot {
        let Gathered {
            events_lost,
            stats_full,
            stats,
            queues,
        } = self.gather();
        let bounds = accept_wait_bounds();
        let mut listeners: Vec<ListenerSnapshot> = self
            .shared
            .listeners()
            .iter()
            .map(|l| {
                let s = stats.get(&l.inode).copied().unwrap_or_default();
                ListenerSnapshot {
                    listener: l.clone(),
                    syns_received: s.syns,
                    drops: Drops {
                        accept_queue_full: s.drop_accept_queue_full,
                        syn_queue_full: s.drop_syn_queue_full,
                        final_ack_overflow: s.drop_final_ack_overflow,
                        other: s.drop_other,
                    },
                    syncookies_sent: s.syncookies,
                    synack_retransmits: s.synack_retransmits,
                    queued: s.queued,
                    accepted: s.accepted,
                    queues: queues.get(&l.inode).copied().unwrap_or_default(),
                    accept_wait: AcceptWait {
                        count: s.accept_wait.iter().sum(),
                        sum_seconds: s.accept_wait_sum_ns as f64 / 1e9,
                        buckets: bounds
                            .iter()
                            .copied()
                            .map(Some)
                            .chain([None])
                            .zip(s.accept_wait)
                            .map(|(le, count)| Bucket { le, count })
                            .collect(),
                    },
                }
            })
            .collect();
        listeners.sort_by_key(|l| (l.listener.netns, l.listener.port, l.listener.inode));
        let namespaces = self
            .shared
            .netns_sysctls()
            .into_iter()
            .map(|(netns, sysctls)| NamespaceSnapshot { netns, sysctls })
            .collect();
        Snapshot {
            namespaces,
            version: env!("CARGO_PKG_VERSION").to_owned(),
            hook_mode: self.mode.name().to_owned(),
            kernel: self.kernel,
            events_lost,
            stats_full,
            listeners,
        }
    }

    /// Renders the page into `sink` in chunks (see [`Exposition::streamed`]).
    pub fn render_streamed(&self, sink: super::text::Sink<'_>) {
        let mut e = Exposition::streamed(sink);
        self.render_into(&mut e);
        e.finish();
    }

    fn render_into(&self, e: &mut Exposition<'_>) {
        let Gathered {
            events_lost,
            stats_full,
            stats,
            queues,
        } = self.gather();

        // Before taking the table's read guard: netns_counters() takes it too, and a second
        // read lock on one thread deadlocks with a writer (the event loop) waiting between.
        let namespaces = self.shared.netns_counters();
        // A copy, so the event loop is not held off the table while the text is written.
        let listeners: Vec<Listener> = self.shared.listeners().iter().cloned().collect();
        let rows: Vec<([String; 6], LabelSet, &Listener)> = listeners
            .iter()
            .map(|l| {
                let values = label_values(l);
                let set = LabelSet::new(&labels(&values));
                (values, set, l)
            })
            .collect();
        // The group and process sums need the retired-counters lock: rendered first, into
        // memory (a few lines per group and process), so that no lock is held while a
        // slow client takes the streamed page.
        let aggregated = {
            let mut retired = self.retired.lock().unwrap_or_else(|e| e.into_inner());
            let mut a = Exposition::with_capacity(4096);
            aggregates(&mut a, &rows, &stats, &queues, &mut retired);
            a.finish()
        };

        e.family(
            "backlogd_listen_backlog_requested",
            Kind::Gauge,
            "Backlog the application passed to listen(2) on this socket (absent for \
             listeners already listening when backlogd started).",
        );
        for (_, set, l) in &rows {
            if let Some(requested) = l.requested {
                e.sample_with("backlogd_listen_backlog_requested", set, &[], requested);
            }
        }
        e.family(
            "backlogd_listen_backlog_granted",
            Kind::Gauge,
            "Accept-queue capacity the kernel granted (sk_max_ack_backlog): the requested \
             backlog clamped to net.core.somaxconn of the socket's network namespace. It is \
             also the SYN queue's limit.",
        );
        for (_, set, l) in &rows {
            e.sample_with("backlogd_listen_backlog_granted", set, &[], l.granted);
        }

        // A listener no SYN has reached yet has no map entry: its counters are zero.
        let zero = ListenerStats::default();
        let counters = |l: &Listener| stats.get(&l.inode).unwrap_or(&zero);
        for (name, help, value) in COUNTERS {
            if name == "backlogd_listen_queued_total" && !self.enqueue_events {
                continue;
            }
            e.family(name, Kind::Counter, help);
            for (_, set, l) in &rows {
                e.sample_with(name, set, &[], value(counters(l)));
            }
        }
        e.family(
            "backlogd_listen_drops_total",
            Kind::Counter,
            "Connections this listener dropped, by reason: accept_queue_full (SYN dropped, \
             accept queue full: ListenOverflows), syn_queue_full (SYN dropped, SYN queue full \
             with syncookies off: TCPReqQFullDrop), final_ack_overflow (handshake's final ACK \
             found the accept queue full: ListenOverflows), other (rest of ListenDrops).",
        );
        let reasons =
            DROP_REASONS.map(|(reason, count)| (format!(",reason=\"{reason}\"}} "), count));
        for (_, set, l) in &rows {
            for (suffix, count) in &reasons {
                e.sample_suffix(
                    "backlogd_listen_drops_total",
                    set,
                    suffix,
                    count(counters(l)),
                );
            }
        }

        let no_queue = QueueFigures::default();
        let queue = |l: &Listener| *queues.get(&l.inode).unwrap_or(&no_queue);
        for (name, help, value) in [
            (
                "backlogd_listen_accept_queue_length",
                "Connections waiting for accept() (sk_ack_backlog), as last observed when a \
                 SYN arrived or a connection was queued or accepted.",
                (|q: QueueFigures| q.accept_depth) as fn(QueueFigures) -> u32,
            ),
            (
                "backlogd_listen_accept_queue_max_length",
                "Highest accept-queue length over the last --hwm-window seconds. The queue \
                 is full above backlogd_listen_backlog_granted.",
                |q| q.accept_max,
            ),
            (
                "backlogd_listen_syn_queue_max_length",
                "Highest SYN-queue length (pending handshakes) over the last --hwm-window \
                 seconds. The SYN queue is full above backlogd_listen_backlog_granted.",
                |q| q.syn_max,
            ),
        ] {
            e.family(name, Kind::Gauge, help);
            for (_, set, l) in &rows {
                e.sample_with(name, set, &[], value(queue(l)));
            }
        }

        if self.enqueue_events {
            e.family(
                "backlogd_listen_accept_wait_seconds",
                Kind::Histogram,
                "Time accepted connections waited on the accept queue, from handshake \
                 completion to accept() returning.",
            );
            let names =
                HistogramNames::new("backlogd_listen_accept_wait_seconds", &accept_wait_bounds());
            for (_, set, l) in &rows {
                let s = counters(l);
                e.histogram(
                    &names,
                    set,
                    &s.accept_wait,
                    s.accept_wait_sum_ns as f64 / 1e9,
                );
            }
        }

        e.rendered(&aggregated);

        netns_counters(e, &namespaces);

        e.family(
            "backlogd_listeners",
            Kind::Gauge,
            "Listening TCP sockets backlogd is tracking.",
        );
        e.sample("backlogd_listeners", &[], listeners.len());
        drop(rows);
        drop(listeners);

        e.family(
            "backlogd_listener_events_lost_total",
            Kind::Counter,
            "Listener lifecycle events dropped because the kernel ring buffer was full.",
        );
        e.sample("backlogd_listener_events_lost_total", &[], events_lost);
        e.family(
            "backlogd_listener_stats_full_total",
            Kind::Counter,
            "Per-listener counter updates lost because the kernel map of listeners was full.",
        );
        e.sample("backlogd_listener_stats_full_total", &[], stats_full);
        // One look at the maps for both figures read outside `gather`.
        let (queues_full, missed) = {
            let maps = self.maps.lock().unwrap_or_else(|e| e.into_inner());
            (maps.queues_full(), missed_runs(&maps.programs))
        };
        e.family(
            "backlogd_listener_queue_observations_lost_total",
            Kind::Counter,
            "Accept/SYN queue observations lost because the kernel map of listeners' queues \
             was full.",
        );
        e.sample(
            "backlogd_listener_queue_observations_lost_total",
            &[],
            queues_full,
        );
        e.family(
            "backlogd_listener_map_orphans_removed_total",
            Kind::Counter,
            "Kernel map entries of listeners that were gone, removed by the rescans.",
        );
        e.sample(
            "backlogd_listener_map_orphans_removed_total",
            &[],
            self.shared
                .orphans_removed
                .load(std::sync::atomic::Ordering::Relaxed),
        );
        if let Some(missed) = missed {
            e.family(
                "backlogd_probe_missed_runs_total",
                Kind::Counter,
                "Runs of backlogd's eBPF programs the kernel skipped to avoid recursion \
                 (another BPF program or a BPF map syscall was running on the CPU; kprobe \
                 and tracepoint programs are counted since Linux 6.7). Non-zero: counts of \
                 that interval may be short.",
            );
            e.sample("backlogd_probe_missed_runs_total", &[], missed);
        }

        e.family(
            "backlogd_hook_mode",
            Kind::Gauge,
            "1 for the hook mode the SYN path runs in (fentry, kprobe or tracepoint).",
        );
        e.sample("backlogd_hook_mode", &[("mode", self.mode.name())], 1);
        e.family(
            "backlogd_kernel_hook_supported",
            Kind::Gauge,
            "1 if the running kernel supports the hook mechanism (probed at startup).",
        );
        e.sample(
            "backlogd_kernel_hook_supported",
            &[("mode", "fentry")],
            u8::from(self.kernel.fentry),
        );
        e.sample(
            "backlogd_kernel_hook_supported",
            &[("mode", "kprobe")],
            u8::from(self.kernel.kprobe),
        );
        e.sample(
            "backlogd_kernel_hook_supported",
            &[("mode", "tracepoint")],
            1,
        );

        e.family(
            "backlogd_build_info",
            Kind::Gauge,
            "Always 1; the labels describe the running backlogd build.",
        );
        e.sample(
            "backlogd_build_info",
            &[("version", env!("CARGO_PKG_VERSION"))],
            1,
        );
    }
}

/// The namespaces' own TcpExt counters, next to backlogd's per-socket figures.
fn netns_counters(e: &mut Exposition, namespaces: &[(u32, HashMap<String, u64>)]) {
    for (counter, metric) in tcpext::COUNTERS.iter().zip([
        "backlogd_netns_listen_overflows_total",
        "backlogd_netns_listen_drops_total",
        "backlogd_netns_reqq_full_drops_total",
        "backlogd_netns_reqq_full_do_cookies_total",
        "backlogd_netns_syn_retransmits_total",
    ]) {
        e.family(
            metric,
            Kind::Counter,
            &format!(
                "The network namespace's own TcpExt {counter} counter (/proc/net/netstat), \
                 for every namespace with listeners."
            ),
        );
        for (netns, values) in namespaces {
            if let Some(v) = values.get(*counter) {
                e.sample(metric, &[("netns", &netns.to_string())], v);
            }
        }
    }
}

/// Per SO_REUSEPORT group (sockets sharing netns, address and port; a lone listener is a
/// group of one) and per owning process: sums of the per-socket figures, so a stalled
/// member or worker stands out against its siblings.
fn aggregates(
    e: &mut Exposition,
    rows: &[([String; 6], LabelSet, &Listener)],
    stats: &HashMap<u64, ListenerStats>,
    queues: &HashMap<u64, QueueFigures>,
    retired: &mut Retired,
) {
    retired.update(
        rows.iter()
            .map(|(_, _, l)| {
                let group = (l.netns, l.addr, l.port);
                let process = (l.pid, l.comm.clone());
                let figures = stats.get(&l.inode).copied();
                (l.inode, (group, process, figures))
            })
            .collect(),
    );
    #[derive(Default)]
    struct Sum {
        sockets: u64,
        stats: ListenerStats,
        accept_depth: u64,
    }
    // Keyed by typed values (no per-listener allocation); each aggregate's label set is
    // rendered once, when it is first seen.
    let mut groups: BTreeMap<GroupKey, (LabelSet, Sum)> = BTreeMap::new();
    let mut processes: BTreeMap<(u32, &str), (LabelSet, Sum)> = BTreeMap::new();
    for (v, _, l) in rows {
        let group = groups.entry((l.netns, l.addr, l.port)).or_insert_with(|| {
            (
                LabelSet::new(&[("netns", &v[0]), ("address", &v[1]), ("port", &v[2])]),
                Sum::default(),
            )
        });
        let mine = retired.last.get(&l.inode).map(|(_, _, s)| s);
        let depth = u64::from(queues.get(&l.inode).map_or(0, |q| q.accept_depth));
        let sum = &mut group.1;
        sum.sockets += 1;
        if let Some(s) = mine {
            sum.stats.add(s);
        }
        sum.accept_depth += depth;
        let process = processes
            .entry((l.pid, l.comm.as_str()))
            .or_insert_with(|| {
                (
                    LabelSet::new(&[("pid", &v[4]), ("comm", &v[5])]),
                    Sum::default(),
                )
            });
        process.1.sockets += 1;
        if let Some(s) = mine {
            process.1.stats.add(s);
        }
        process.1.accept_depth += depth;
    }
    if !retired.groups.is_empty() {
        for (key, (_, sum)) in &mut groups {
            if let Some(gone) = retired.groups.get(key) {
                sum.stats.add(gone);
            }
        }
    }
    if !retired.processes.is_empty() {
        for ((pid, comm), (_, sum)) in &mut processes {
            if let Some(gone) = retired.processes.get(&(*pid, (*comm).to_owned())) {
                sum.stats.add(gone);
            }
        }
    }
    let reasons = DROP_REASONS.map(|(reason, field)| (format!(",reason=\"{reason}\"}} "), field));
    let groups: Vec<&(LabelSet, Sum)> = groups.values().collect();
    let processes: Vec<&(LabelSet, Sum)> = processes.values().collect();
    for (prefix, what, sums) in [
        (
            "backlogd_listen_group",
            "SO_REUSEPORT group (listeners sharing netns, address and port)",
            &groups,
        ),
        ("backlogd_process", "process", &processes),
    ] {
        type SumField = fn(&Sum) -> u64;
        let families: [(&str, Kind, String, SumField); 4] = [
            (
                "listeners",
                Kind::Gauge,
                format!("Listening sockets of the {what}."),
                |s| s.sockets,
            ),
            (
                "accept_queue_length",
                Kind::Gauge,
                format!("Connections waiting for accept() on the listening sockets of the {what}."),
                |s| s.accept_depth,
            ),
            (
                "syns_received_total",
                Kind::Counter,
                format!("SYNs that reached the listening sockets of the {what}."),
                |s| s.stats.syns,
            ),
            (
                "accepted_total",
                Kind::Counter,
                format!("Connections accepted from the listening sockets of the {what}."),
                |s| s.stats.accepted,
            ),
        ];
        for (suffix, kind, help, value) in families {
            let name = format!("{prefix}_{suffix}");
            e.family(&name, kind, &help);
            for (set, sum) in sums.iter().copied() {
                e.sample_with(&name, set, &[], value(sum));
            }
        }
        let name = format!("{prefix}_drops_total");
        e.family(
            &name,
            Kind::Counter,
            &format!(
                "Connections dropped by the listening sockets of the {what}, by reason (as in \
                 backlogd_listen_drops_total)."
            ),
        );
        for (set, sum) in sums.iter().copied() {
            for (suffix, field) in &reasons {
                e.sample_suffix(&name, set, suffix, field(&sum.stats));
            }
        }
    }
}

const LABELS: [&str; 6] = ["netns", "address", "port", "socket", "pid", "comm"];

fn label_values(l: &Listener) -> [String; 6] {
    [
        l.netns.to_string(),
        l.addr.to_string(),
        l.port.to_string(),
        l.inode.to_string(),
        l.pid.to_string(),
        l.comm.clone(),
    ]
}

fn labels(values: &[String; 6]) -> [(&'static str, &str); 6] {
    std::array::from_fn(|i| (LABELS[i], values[i].as_str()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(group: &str, drops: u64) -> (GroupKey, ProcessKey, Option<ListenerStats>) {
        let stats = ListenerStats {
            drop_accept_queue_full: drops,
            ..ListenerStats::default()
        };
        (
            (1, "127.0.0.1".parse().unwrap(), group.parse().unwrap()),
            (9, "nginx".into()),
            Some(stats),
        )
    }

    #[test]
    fn a_closed_member_keeps_its_counts_even_if_its_kernel_entry_went_first() {
        let mut r = Retired::default();
        r.update(HashMap::from([(1, member("80", 90)), (2, member("80", 5))]));
        // The kernel entry of 1 is gone, its close event not yet applied.
        let mut gone_entry = member("80", 0);
        gone_entry.2 = None;
        r.update(HashMap::from([(1, gone_entry), (2, member("80", 5))]));
        assert_eq!(r.last[&1].2.drop_accept_queue_full, 90);
        // Then it leaves the table: the group keeps its 90.
        r.update(HashMap::from([(2, member("80", 6))]));
        let group = (1, "127.0.0.1".parse().unwrap(), 80);
        assert_eq!(r.groups[&group].drop_accept_queue_full, 90);
        let process = (9, "nginx".to_owned());
        assert_eq!(r.processes[&process].drop_accept_queue_full, 90);
        // The last member goes too: the aggregates end.
        r.update(HashMap::new());
        assert!(r.groups.is_empty() && r.processes.is_empty());
    }
}
