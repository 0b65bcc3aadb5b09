//! Every metric family `/metrics` can serve: name, type, help and label names, declared
//! once as data. The page's collectors (`page/`) open each family through its entry here
//! and take their label names from it; a test renders every family and holds each
//! sample's labels to the declaration (`page/tests.rs`), and a test checks docs/metrics.md
//! against this list: every family documented with its type and labels, nothing
//! documented that is not served.

use super::text::{Exposition, Kind};

/// The label delayed-connection counters add, and its values (`backlogd_common::cause`
/// order).
pub const CAUSE: &str = "cause";
pub const DELAY_CAUSES: [&str; 2] = ["syn_drop", "final_ack_overflow"];

/// Labels of every per-listener series.
pub const LISTENER_LABELS: [&str; 6] = ["netns", "address", "port", "socket", "pid", "comm"];
/// Labels of a listener's owner names (joined to its series on `socket`).
pub const OWNER_LABELS: [&str; 8] = [
    "socket",
    "unit",
    "container_runtime",
    "container_id",
    "container_name",
    "pod_uid",
    "pod",
    "pod_namespace",
];
/// The label the opt-in top drop sources add: a source prefix at the configured length.
pub const PREFIX: &str = "prefix";
/// Labels of a SO_REUSEPORT group's series.
pub const GROUP_LABELS: [&str; 3] = ["netns", "address", "port"];
/// Labels of a process's series.
pub const PROCESS_LABELS: [&str; 2] = ["pid", "comm"];
/// The label drop counters add; its values are the names of
/// [`DropReason`](backlogd_common::DropReason), in its order.
pub const REASON: &str = "reason";

/// `base` and then `last`: the label names of a family that adds one label to a set.
const fn and<const N: usize, const M: usize>(
    base: [&'static str; N],
    last: &'static str,
) -> [&'static str; M] {
    assert!(M == N + 1, "one label more than the base");
    let mut out = [""; M];
    let mut i = 0;
    while i < N {
        out[i] = base[i];
        i += 1;
    }
    out[N] = last;
    out
}

const LISTENER_AND_REASON: [&str; 7] = and(LISTENER_LABELS, REASON);
const LISTENER_AND_CAUSE: [&str; 7] = and(LISTENER_LABELS, CAUSE);
const LISTENER_AND_PREFIX: [&str; 7] = and(LISTENER_LABELS, PREFIX);
const GROUP_AND_REASON: [&str; 4] = and(GROUP_LABELS, REASON);
const GROUP_AND_CAUSE: [&str; 4] = and(GROUP_LABELS, CAUSE);
const PROCESS_AND_REASON: [&str; 3] = and(PROCESS_LABELS, REASON);
const PROCESS_AND_CAUSE: [&str; 3] = and(PROCESS_LABELS, CAUSE);

/// Which labels a family's series carry, in order (histograms add `le`). The collectors
/// take their label names from here ([`Metric::labelled`], or the constants above for the
/// label sets rendered once per listener); the docs check reads these too.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Labels {
    None,
    Listener,
    ListenerAndReason,
    ListenerAndCause,
    ListenerAndPrefix,
    Owner,
    Group,
    GroupAndReason,
    GroupAndCause,
    Process,
    ProcessAndReason,
    ProcessAndCause,
    Netns,
    NetnsName,
    Mode,
    Version,
    Figure,
}

impl Labels {
    pub const fn names(self) -> &'static [&'static str] {
        match self {
            Labels::None => &[],
            Labels::Listener => &LISTENER_LABELS,
            Labels::ListenerAndReason => &LISTENER_AND_REASON,
            Labels::ListenerAndCause => &LISTENER_AND_CAUSE,
            Labels::ListenerAndPrefix => &LISTENER_AND_PREFIX,
            Labels::Owner => &OWNER_LABELS,
            Labels::Group => &GROUP_LABELS,
            Labels::GroupAndReason => &GROUP_AND_REASON,
            Labels::GroupAndCause => &GROUP_AND_CAUSE,
            Labels::Process => &PROCESS_LABELS,
            Labels::ProcessAndReason => &PROCESS_AND_REASON,
            Labels::ProcessAndCause => &PROCESS_AND_CAUSE,
            Labels::Netns => &["netns"],
            Labels::NetnsName => &["netns", "name"],
            Labels::Mode => &["mode"],
            Labels::Version => &["version"],
            Labels::Figure => &["figure"],
        }
    }
}

macro_rules! catalogue {
    ($($variant:ident: $name:literal, $kind:ident, $labels:ident, $help:literal;)*) => {
        /// A metric family of the page.
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum Metric {
            $($variant,)*
        }

        impl Metric {
            /// Every family, in page order.
            #[cfg_attr(not(test), expect(dead_code, reason = "read by the docs check"))]
            pub const ALL: &[Metric] = &[$(Metric::$variant,)*];

            pub const fn name(self) -> &'static str {
                match self {
                    $(Metric::$variant => $name,)*
                }
            }

            pub const fn kind(self) -> Kind {
                match self {
                    $(Metric::$variant => Kind::$kind,)*
                }
            }

            pub const fn labels(self) -> Labels {
                match self {
                    $(Metric::$variant => Labels::$labels,)*
                }
            }

            pub const fn help(self) -> &'static str {
                match self {
                    $(Metric::$variant => $help,)*
                }
            }
        }
    };
}

catalogue! {
    ListenerOwnerInfo: "backlogd_listener_owner_info", Gauge, Owner,
        "Always 1: the systemd unit, container (runtime and id) and Kubernetes pod UID of \
         the listening socket's owner, from its cgroup, and the container's name and its \
         pod's name and namespace, from the runtime's API (labels nothing names are left \
         out); one series per listener; join on socket (group_left).";
    ListenBacklogRequested: "backlogd_listen_backlog_requested", Gauge, Listener,
        "Backlog the application passed to listen(2) on this socket (absent for listeners \
         already listening when backlogd started).";
    ListenBacklogGranted: "backlogd_listen_backlog_granted", Gauge, Listener,
        "Accept-queue capacity the kernel granted (sk_max_ack_backlog): the requested \
         backlog clamped to net.core.somaxconn of the socket's network namespace. It is \
         also the SYN queue's limit.";
    ListenSynsReceived: "backlogd_listen_syns_received_total", Counter, Listener,
        "SYNs (without ACK) that reached this listener, retransmitted ones included.";
    ListenSyncookiesSent: "backlogd_listen_syncookies_sent_total", Counter, Listener,
        "SYNs answered with a syncookie because the SYN queue was full (the listener's \
         share of TcpExt TCPReqQFullDoCookies).";
    ListenSynackRetransmits: "backlogd_listen_synack_retransmits_total", Counter, Listener,
        "SYN-ACKs retransmitted for this listener's pending connections.";
    ListenQueued: "backlogd_listen_queued_total", Counter, Listener,
        "Connections whose handshake completed and that were put on the accept queue.";
    ListenAccepted: "backlogd_listen_accepted_total", Counter, Listener,
        "Connections taken off the accept queue by accept()/accept4().";
    ListenDrops: "backlogd_listen_drops_total", Counter, ListenerAndReason,
        "SYNs and final ACKs this listener dropped (segments, not connections: a \
         retransmitted SYN dropped again counts again), by reason: accept_queue_full (SYN \
         dropped, accept queue full: ListenOverflows), syn_queue_full (SYN dropped, SYN \
         queue full with syncookies off: TCPReqQFullDrop), final_ack_overflow (handshake's \
         final ACK found the accept queue full: ListenOverflows), other (rest of \
         ListenDrops).";
    ListenAcceptQueueLength: "backlogd_listen_accept_queue_length", Gauge, Listener,
        "Connections waiting for accept() (sk_ack_backlog) now, read by the same pass as \
         backlogd_listen_syn_queue_length (at most a second old; for a listener that pass \
         does not find, as last seen when a connection was queued).";
    ListenAcceptQueueMaxLength: "backlogd_listen_accept_queue_max_length", Gauge, Listener,
        "Highest accept-queue length over the last --hwm-window seconds. The queue is full \
         above backlogd_listen_backlog_granted.";
    ListenSynQueueMaxLength: "backlogd_listen_syn_queue_max_length", Gauge, Listener,
        "Highest SYN-queue length (pending handshakes) over the last --hwm-window seconds. \
         The SYN queue is full above backlogd_listen_backlog_granted.";
    ListenSynQueueLength: "backlogd_listen_syn_queue_length", Gauge, Listener,
        "Requests waiting for their handshake's final ACK now (icsk_accept_queue.qlen), \
         read from the kernel's socket by a pass over every task's open files when read (a \
         scrape or API request; at most one pass a second, readers within it share it): \
         as old as backlogd_syn_queue_read_age_seconds. Served for the listeners that pass \
         found (held by a process of backlogd's PID namespace).";
    ListenAcceptWaitSeconds: "backlogd_listen_accept_wait_seconds", Histogram, Listener,
        "Time accepted connections waited on the accept queue, from handshake completion \
         to accept() returning.";
    ListenConnectionsDelayed: "backlogd_listen_connections_delayed_total", Counter,
        ListenerAndCause,
        "Connections queued for accept after this listener dropped at least one segment of \
         their attempt (same client address, port and initial sequence number), by the \
         attempt's first drop: syn_drop (the client retransmitted its SYN, 1 s later at \
         the earliest) or final_ack_overflow (the server retransmitted its SYN-ACK). \
         Served for listeners with a drop, a delayed connection or an \
         abandoned attempt.";
    ListenConnectionDelaySeconds: "backlogd_listen_connection_delay_seconds", Histogram,
        Listener,
        "Delay of the connections in backlogd_listen_connections_delayed_total: from their \
         attempt's first dropped segment to the connection being queued for accept. Bounds \
         lie between the times clients and servers retry (SYN: 1, 3, 7, 15 ... s, or 1, 2, \
         3, 4, 5, 7, 11 ... s on Linux 6.5+; SYN-ACK: 1, 3, 7 ... s), so a bucket says \
         which retry got through. Served for \
         listeners with a drop, a delayed connection or an abandoned attempt.";
    ListenConnectionsAbandoned: "backlogd_listen_connections_abandoned_total", Counter,
        Listener,
        "Connection attempts this listener dropped a segment of that were not queued for \
         accept within client_impact_horizon seconds of the first drop (the client gave \
         up or is still retrying), counted when the horizon passes. Served for listeners \
         with a drop, a delayed connection or an abandoned attempt.";
    ListenDropSourcePrefixes: "backlogd_listen_drop_source_prefixes", Gauge, Listener,
        "Distinct source prefixes (drop_source_prefix_v4 / _v6 bits) this listener dropped \
         a segment of or answered with a syncookie in the last five minutes: exact (each \
         holds a slot of the kernel's map until drop_source_retention after its newest \
         segment). Served for listeners with a drop or a syncookie.";
    ListenDropSourceTopShare: "backlogd_listen_drop_source_top_share", Gauge, Listener,
        "Part of this listener's source-counted drops and syncookies of the last five \
         minutes that came from its largest source prefix, 0 to 1: near 1, a few networks; \
         near 0, many (0: none in the window). Served for listeners with a drop or a \
         syncookie.";
    ListenDropSourceRecentSegments: "backlogd_listen_drop_source_recent_segments", Gauge,
        ListenerAndPrefix,
        "SYNs and final ACKs this listener dropped and SYNs it answered with a syncookie \
         from one source prefix in the last five minutes, for its largest prefixes only \
         (drop_source_top_series of them, at most 10). Off by default: the prefix label \
         holds client addresses, served to every scraper.";
    ListenDropSourcesUntracked: "backlogd_listen_drop_sources_untracked_total", Counter,
        Listener,
        "Drops and syncookies of this listener counted under no source prefix: the \
         kernel's map was full (drop_source_entries) when the prefix was new, the segment \
         was gone before its source was read, or the drop was not of a SYN or a final ACK \
         (a pending request removed by an ICMP error). Served for listeners with a drop or \
         a syncookie.";
    GroupListeners: "backlogd_listen_group_listeners", Gauge, Group,
        "Listening sockets of the SO_REUSEPORT group (listeners sharing netns, address and \
         port).";
    GroupAcceptQueueLength: "backlogd_listen_group_accept_queue_length", Gauge, Group,
        "Connections waiting for accept() on the listening sockets of the SO_REUSEPORT \
         group (listeners sharing netns, address and port).";
    GroupSynsReceived: "backlogd_listen_group_syns_received_total", Counter, Group,
        "SYNs that reached the listening sockets of the SO_REUSEPORT group (listeners \
         sharing netns, address and port).";
    GroupAccepted: "backlogd_listen_group_accepted_total", Counter, Group,
        "Connections accepted from the listening sockets of the SO_REUSEPORT group \
         (listeners sharing netns, address and port).";
    GroupDrops: "backlogd_listen_group_drops_total", Counter, GroupAndReason,
        "SYNs and final ACKs dropped by the listening sockets of the SO_REUSEPORT group \
         (listeners sharing netns, address and port), by reason (as in \
         backlogd_listen_drops_total).";
    GroupConnectionsDelayed: "backlogd_listen_group_connections_delayed_total", Counter,
        GroupAndCause,
        "Connections queued for accept by the listening sockets of the SO_REUSEPORT group \
         after a drop on their way, by the cause of the first drop (as in \
         backlogd_listen_connections_delayed_total).";
    GroupConnectionsAbandoned: "backlogd_listen_group_connections_abandoned_total", Counter,
        Group,
        "Connection attempts with a drop the listening sockets of the SO_REUSEPORT group \
         did not queue within client_impact_horizon (as in \
         backlogd_listen_connections_abandoned_total).";
    ProcessListeners: "backlogd_process_listeners", Gauge, Process,
        "Listening sockets of the process.";
    ProcessAcceptQueueLength: "backlogd_process_accept_queue_length", Gauge, Process,
        "Connections waiting for accept() on the listening sockets of the process.";
    ProcessSynsReceived: "backlogd_process_syns_received_total", Counter, Process,
        "SYNs that reached the listening sockets of the process.";
    ProcessAccepted: "backlogd_process_accepted_total", Counter, Process,
        "Connections accepted from the listening sockets of the process.";
    ProcessDrops: "backlogd_process_drops_total", Counter, ProcessAndReason,
        "SYNs and final ACKs dropped by the listening sockets of the process, by reason (as \
         in backlogd_listen_drops_total).";
    ProcessConnectionsDelayed: "backlogd_process_connections_delayed_total", Counter,
        ProcessAndCause,
        "Connections queued for accept by the listening sockets of the process after a \
         drop on their way, by the cause of the first drop (as in \
         backlogd_listen_connections_delayed_total).";
    ProcessConnectionsAbandoned: "backlogd_process_connections_abandoned_total", Counter,
        Process,
        "Connection attempts with a drop the listening sockets of the process did not \
         queue within client_impact_horizon (as in \
         backlogd_listen_connections_abandoned_total).";
    NetnsInfo: "backlogd_netns_info", Gauge, NetnsName,
        "Always 1: the name of a network namespace with listeners, where it has one \
         (/run/netns/NAME: ip netns, CNI); join on netns (group_left).";
    NetnsListenOverflows: "backlogd_netns_listen_overflows_total", Counter, Netns,
        "The network namespace's own TcpExt ListenOverflows counter (/proc/net/netstat), \
         for every namespace with listeners.";
    NetnsListenDrops: "backlogd_netns_listen_drops_total", Counter, Netns,
        "The network namespace's own TcpExt ListenDrops counter (/proc/net/netstat), for \
         every namespace with listeners.";
    NetnsReqqFullDrops: "backlogd_netns_reqq_full_drops_total", Counter, Netns,
        "The network namespace's own TcpExt TCPReqQFullDrop counter (/proc/net/netstat), \
         for every namespace with listeners.";
    NetnsReqqFullDoCookies: "backlogd_netns_reqq_full_do_cookies_total", Counter, Netns,
        "The network namespace's own TcpExt TCPReqQFullDoCookies counter \
         (/proc/net/netstat), for every namespace with listeners.";
    NetnsSynRetransmits: "backlogd_netns_syn_retransmits_total", Counter, Netns,
        "The network namespace's own TcpExt TCPSynRetrans counter (/proc/net/netstat), for \
         every namespace with listeners.";
    NetnsSyncookiesReturned: "backlogd_netns_syncookies_returned_total", Counter, Netns,
        "The network namespace's own TcpExt SyncookiesRecv counter (/proc/net/netstat): \
         ACKs that returned a valid syncookie, each a connection a cookie completed, for \
         every namespace with listeners. Against \
         backlogd_netns_reqq_full_do_cookies_total: real clients return their cookies, a \
         spoofed flood never does.";
    SynQueueReadAge: "backlogd_syn_queue_read_age_seconds", Gauge, None,
        "Seconds since the pass that read backlogd_listen_syn_queue_length (run when read, \
         at most one a second). \
         Absent where the kernel cannot run that pass (BPF iterators need Linux 5.8+).";
    SynQueueReadDuration: "backlogd_syn_queue_read_duration_seconds", Gauge, None,
        "Wall time of that pass: the kernel walking every task's open files (its CPU is \
         the daemon's, as system time).";
    Listeners: "backlogd_listeners", Gauge, None,
        "Listening TCP sockets backlogd is tracking.";
    ListenerEventsLost: "backlogd_listener_events_lost_total", Counter, None,
        "Listener lifecycle events dropped because the kernel ring buffer was full.";
    ListenerStatsFull: "backlogd_listener_stats_full_total", Counter, None,
        "Per-listener counter updates lost because the kernel map of listeners was full.";
    ListenerQueueObservationsLost: "backlogd_listener_queue_observations_lost_total", Counter,
        None,
        "Accept/SYN queue observations lost because the kernel map of listeners' queues \
         was full.";
    ListenerMapOrphansRemoved: "backlogd_listener_map_orphans_removed_total", Counter, None,
        "Kernel map entries of listeners that were gone, removed by the rescans.";
    ClientImpactTracked: "backlogd_client_impact_tracked", Gauge, None,
        "Connection attempts with a dropped segment that are neither completed nor past \
         the horizon yet (entries of the kernel's attempts map, as of the last sweep).";
    ClientImpactSweeps: "backlogd_client_impact_sweeps_total", Counter, None,
        "Sweeps of the kernel's attempts map (every client_impact_horizon / 26 seconds, 1 \
         to 5 s): backlogd_client_impact_tracked is as of the last one, and an attempt past \
         its horizon is counted abandoned by the next.";
    ClientImpactUntracked: "backlogd_client_impact_untracked_total", Counter, None,
        "Dropped segments whose connection attempt the kernel's attempts map had no room \
         for (client_impact_attempts): their attempts are neither delayed nor abandoned in \
         the figures.";
    ProbeMissedRuns: "backlogd_probe_missed_runs_total", Counter, None,
        "Runs of backlogd's eBPF programs the kernel skipped to avoid recursion (another \
         BPF program or a BPF map syscall was running on the CPU; the kernel counts \
         kprobes' skips since Linux 6.7, raw and BTF tracepoints' since 6.2). Non-zero: counts of that interval may be \
         short.";
    FigureMissedRuns: "backlogd_figure_missed_runs_total", Counter, Figure,
        "The runs of backlogd_probe_missed_runs_total by the figure they feed (syns_received, \
         drops, syncookies_sent, synack_retransmits, connections_queued, \
         connections_accepted, accept_wait, listen_backlog, client_impact, \
         listener_map_full; a run may feed several): how many events each figure may lack. \
         Non-zero: that figure may be short by up to this much over the same interval.";
    HookMode: "backlogd_hook_mode", Gauge, Mode,
        "1 for the hook mode the SYN path runs in (fentry, kprobe or tracepoint).";
    KernelHookSupported: "backlogd_kernel_hook_supported", Gauge, Mode,
        "1 if the running kernel supports the hook mechanism (probed at startup).";
    Pinned: "backlogd_pinned", Gauge, None,
        "1 if the kernel-side state is pinned under pin_dir and keeps counting across a \
         daemon restart; 0 without pin_dir, or where the kernel cannot pin the hook mode's \
         links (kprobe mode before Linux 5.15).";
    BuildInfo: "backlogd_build_info", Gauge, Version,
        "Always 1; the labels describe the running backlogd build.";
}

impl Metric {
    /// Writes the family's `# HELP` and `# TYPE` lines; its samples follow.
    pub fn open(self, e: &mut Exposition<'_>) {
        e.family(self.name(), self.kind(), self.help());
    }

    /// `values` under the family's declared label names, in their order: a collector that
    /// labels its samples this way names no label itself.
    pub fn labelled<const N: usize>(self, values: [&str; N]) -> [(&'static str, &str); N] {
        let names = self.labels().names();
        debug_assert_eq!(
            names.len(),
            N,
            "{}: {N} values for the labels {names:?}",
            self.name()
        );
        std::array::from_fn(|i| (names[i], values[i]))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    const DOCS: &str = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/metrics.md"));

    /// What docs/metrics.md says of one family: its type and, where its table has a
    /// labels column, its labels.
    #[derive(Debug, PartialEq)]
    struct Documented {
        kind: String,
        labels: Vec<String>,
    }

    fn backticked(cell: &str) -> Vec<String> {
        cell.split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_owned)
            .collect()
    }

    /// Every table row whose first cell names a `backlogd_` family. Labels come from the
    /// row's `labels` column ("same" = the row above's, "same + `x`" adds x) or, for the
    /// per-listener table that has none, from the "## Labels" table (plus `reason` for a
    /// row that names it).
    fn documented() -> BTreeMap<String, Documented> {
        let mut listener_labels = Vec::new();
        let mut out = BTreeMap::new();
        let mut section = "";
        let mut header: Vec<String> = Vec::new();
        let mut previous_labels: Vec<String> = Vec::new();
        for line in DOCS.lines() {
            if let Some(title) = line.strip_prefix("## ") {
                section = title;
                header.clear();
                continue;
            }
            if !line.starts_with('|') {
                header.clear();
                continue;
            }
            let cells: Vec<&str> = line.trim_matches('|').split('|').map(str::trim).collect();
            if header.is_empty() {
                header = cells.iter().map(|c| (*c).to_owned()).collect();
                continue;
            }
            if cells[0].starts_with("---") {
                continue;
            }
            if section == "Labels" {
                listener_labels.extend(backticked(cells[0]));
                continue;
            }
            let Some(first) = backticked(cells[0]).into_iter().next() else {
                continue;
            };
            if !first.starts_with("backlogd_") {
                continue;
            }
            let name = first.split('{').next().unwrap_or_default().to_owned();
            let labels = match header.iter().position(|h| h == "labels") {
                Some(col) => {
                    let cell = cells[col];
                    let mut labels = if cell.starts_with("same") {
                        previous_labels.clone()
                    } else {
                        Vec::new()
                    };
                    labels.extend(backticked(cell));
                    previous_labels = labels.clone();
                    labels
                }
                None => {
                    let mut labels = listener_labels.clone();
                    if first.contains("reason=") {
                        labels.push(REASON.to_owned());
                    }
                    if first.contains("cause=") {
                        labels.push(CAUSE.to_owned());
                    }
                    if first.contains("prefix=") {
                        labels.push(PREFIX.to_owned());
                    }
                    labels
                }
            };
            let kind = cells[1].to_owned();
            // A family documented over several rows (one per label value) is one family.
            out.entry(name).or_insert(Documented { kind, labels });
        }
        out
    }

    #[test]
    fn docs_describe_exactly_the_families_served() {
        let docs = documented();
        let served: BTreeMap<String, Documented> = Metric::ALL
            .iter()
            .map(|m| {
                let kind = match m.kind() {
                    Kind::Counter => "counter",
                    Kind::Gauge => "gauge",
                    Kind::Histogram => "histogram",
                };
                let documented = Documented {
                    kind: kind.to_owned(),
                    labels: m.labels().names().iter().map(|l| (*l).to_owned()).collect(),
                };
                (m.name().to_owned(), documented)
            })
            .collect();
        let undocumented: Vec<&String> = served.keys().filter(|n| !docs.contains_key(*n)).collect();
        let not_served: Vec<&String> = docs.keys().filter(|n| !served.contains_key(*n)).collect();
        assert!(
            undocumented.is_empty() && not_served.is_empty(),
            "docs/metrics.md and the catalogue differ: served but undocumented {undocumented:?}, \
             documented but not served {not_served:?}"
        );
        for (name, doc) in &docs {
            assert_eq!(
                doc, &served[name],
                "{name}: docs/metrics.md vs the catalogue"
            );
        }
    }

    #[test]
    fn names_follow_prometheus_conventions() {
        for m in Metric::ALL {
            let name = m.name();
            assert!(name.starts_with("backlogd_"), "{name}");
            assert_eq!(
                matches!(m.kind(), Kind::Counter),
                name.ends_with("_total"),
                "{name}: counters and only counters end in _total"
            );
            assert!(!m.help().is_empty() && m.help().ends_with('.'), "{name}");
        }
        let mut names: Vec<&str> = Metric::ALL.iter().map(|m| m.name()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), Metric::ALL.len(), "a family is declared twice");
    }

    #[test]
    fn the_page_opens_families_only_through_the_catalogue() {
        // `Exposition::family` with a literal name would be a family the docs check
        // cannot see.
        for (file, text) in [
            ("page/mod.rs", include_str!("page/mod.rs")),
            ("page/listeners.rs", include_str!("page/listeners.rs")),
            ("page/aggregates.rs", include_str!("page/aggregates.rs")),
            ("page/netns.rs", include_str!("page/netns.rs")),
            ("page/own.rs", include_str!("page/own.rs")),
        ] {
            assert!(!text.contains(".family("), "{file} opens a family by hand");
        }
    }
}
