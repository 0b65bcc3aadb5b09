//! Per-listener families: backlogs, SYN-path counters, drops by reason, queue lengths and
//! the accept-wait histogram.

use backlogd_common::{DELAY_BUCKETS, ListenerStats};

use super::rows::{Row, label_suffixes, reason_suffixes};
use crate::{
    api::{AcceptWait, ClientImpact},
    config::AcceptWaitBuckets,
    exporter::{
        catalogue::{CAUSE, DELAY_CAUSES, Metric, PREFIX},
        figures::Figures,
        text::{Exposition, HistogramNames},
    },
    queues::QueueFigures,
    sources::DropSources,
};

/// Reads one counter of a listener.
type Field = fn(&ListenerStats) -> u64;

const COUNTERS: [(Metric, Field); 5] = [
    (Metric::ListenSynsReceived, |s| s.syns),
    (Metric::ListenSyncookiesSent, |s| s.syncookies),
    (Metric::ListenSynackRetransmits, |s| s.synack_retransmits),
    (Metric::ListenQueued, |s| s.queued),
    (Metric::ListenAccepted, |s| s.accepted),
];

/// Reads one queue figure of a listener.
type QueueField = fn(QueueFigures) -> u32;

const QUEUES: [(Metric, QueueField); 3] = [
    (Metric::ListenAcceptQueueLength, |q| q.accept_depth),
    (Metric::ListenAcceptQueueMaxLength, |q| q.accept_max),
    (Metric::ListenSynQueueMaxLength, |q| q.syn_max),
];

/// `accepts`: the programs see accept() return (else `syscall_hook = false` in a mode
/// that needs it, and accepts are not served: a zero would read as an application that
/// accepts nothing). `accept_wait`: the accept-wait bounds to export; `None`: waits are
/// not timed, and the family is not served. `top_sources`: how many of each
/// listener's largest source prefixes get a series (`drop_source_top_series`, 0: none).
pub fn render(
    e: &mut Exposition<'_>,
    rows: &[Row<'_>],
    figures: &Figures,
    accepts: bool,
    accept_wait: Option<&AcceptWaitBuckets>,
    top_sources: usize,
) {
    owners(e, rows);
    Metric::ListenBacklogRequested.open(e);
    for r in rows {
        if let Some(requested) = r.listener.requested {
            e.sample_with(
                Metric::ListenBacklogRequested.name(),
                &r.set,
                &[],
                requested,
            );
        }
    }
    Metric::ListenBacklogGranted.open(e);
    for r in rows {
        e.sample_with(
            Metric::ListenBacklogGranted.name(),
            &r.set,
            &[],
            r.listener.granted,
        );
    }

    // A listener no SYN has reached yet has no map entry: its counters are zero. Looked
    // up once per listener, not once per family.
    let zero = ListenerStats::default();
    let no_queue = QueueFigures::default();
    let stats = &figures.stats;
    let found: Vec<(&ListenerStats, QueueFigures)> = rows
        .iter()
        .map(|r| {
            let inode = r.listener.inode;
            (
                stats.get(&inode).unwrap_or(&zero),
                *figures.queues.get(&inode).unwrap_or(&no_queue),
            )
        })
        .collect();
    for (metric, value) in COUNTERS {
        if metric == Metric::ListenAccepted && !accepts {
            continue;
        }
        metric.open(e);
        for (r, (s, _)) in rows.iter().zip(&found) {
            e.sample_with(metric.name(), &r.set, &[], value(s));
        }
    }
    Metric::ListenDrops.open(e);
    let reasons = reason_suffixes();
    for (r, (s, _)) in rows.iter().zip(&found) {
        for (suffix, count) in reasons.iter().zip(s.drops) {
            e.sample_suffix(Metric::ListenDrops.name(), &r.set, suffix, count);
        }
    }

    for (metric, value) in QUEUES {
        metric.open(e);
        for (r, (_, q)) in rows.iter().zip(&found) {
            e.sample_with(metric.name(), &r.set, &[], value(*q));
        }
    }
    // Only what a scan pass read: a listener it did not find has no length now.
    let metric = Metric::ListenSynQueueLength;
    metric.open(e);
    for (r, (_, q)) in rows.iter().zip(&found) {
        if let Some(now) = q.syn_depth {
            e.sample_with(metric.name(), &r.set, &[], now);
        }
    }

    impact(e, rows, &found);
    sources(e, rows, figures, top_sources);

    let Some(accept_wait) = accept_wait else {
        return;
    };
    let metric = Metric::ListenAcceptWaitSeconds;
    metric.open(e);
    // Only the configured bounds; each exported bucket sums the kernel's below it.
    let names = HistogramNames::merged(metric.name(), &AcceptWait::bounds(), accept_wait.indices());
    for (r, (s, _)) in rows.iter().zip(&found) {
        e.histogram(
            &names,
            &r.set,
            &s.accept_wait,
            s.accept_wait_sum_ns as f64 / 1e9,
        );
    }
}

/// What the clients of listeners that dropped a segment paid (delayed, by how much, and
/// abandoned). A listener that never dropped (nor completed a dropped attempt) has
/// nothing to say here: its 16 series would be zeros, so they appear with its first drop.
fn impact(e: &mut Exposition<'_>, rows: &[Row<'_>], found: &[(&ListenerStats, QueueFigures)]) {
    let dropped: Vec<(&Row<'_>, &ListenerStats)> = rows
        .iter()
        .zip(found)
        // A SO_REUSEPORT member can complete an attempt another member dropped.
        .filter(|(_, (s, _))| {
            s.drops.iter().any(|&d| d > 0) || s.delayed.iter().any(|&d| d > 0) || s.abandoned > 0
        })
        .map(|(r, (s, _))| (r, *s))
        .collect();
    Metric::ListenConnectionsDelayed.open(e);
    let causes = label_suffixes(CAUSE, DELAY_CAUSES);
    for (r, s) in &dropped {
        for (suffix, count) in causes.iter().zip(s.delayed) {
            e.sample_suffix(
                Metric::ListenConnectionsDelayed.name(),
                &r.set,
                suffix,
                count,
            );
        }
    }
    let metric = Metric::ListenConnectionDelaySeconds;
    metric.open(e);
    let names = HistogramNames::merged(
        metric.name(),
        &ClientImpact::bounds(),
        &std::array::from_fn::<usize, DELAY_BUCKETS, _>(|i| i),
    );
    for (r, s) in &dropped {
        e.histogram(&names, &r.set, &s.delay, s.delay_sum_ns as f64 / 1e9);
    }
    Metric::ListenConnectionsAbandoned.open(e);
    for (r, s) in &dropped {
        e.sample_with(
            Metric::ListenConnectionsAbandoned.name(),
            &r.set,
            &[],
            s.abandoned,
        );
    }
}

/// Who each listener dropped: distinct source prefixes and the largest one's share in the
/// last five minutes (gauges: what is going on now), and what no prefix holds. Like the
/// client-impact families, they appear with a listener's first drop or syncookie: a quiet
/// listener's would be zeros.
fn sources(e: &mut Exposition<'_>, rows: &[Row<'_>], figures: &Figures, top_sources: usize) {
    let counted: Vec<(&Row<'_>, Option<&DropSources>, &ListenerStats)> = rows
        .iter()
        .filter_map(|r| {
            let s = figures.stats.get(&r.listener.inode)?;
            let recent = figures
                .sources
                .get(&r.listener.inode)
                .map(|d| d.recent.as_deref().unwrap_or(d));
            (s.drops.iter().any(|&d| d > 0) || s.syncookies > 0).then_some((r, recent, s))
        })
        .collect();
    Metric::ListenDropSourcePrefixes.open(e);
    for (r, d, _) in &counted {
        e.sample_with(
            Metric::ListenDropSourcePrefixes.name(),
            &r.set,
            &[],
            d.map_or(0, |d| d.prefixes),
        );
    }
    Metric::ListenDropSourceTopShare.open(e);
    for (r, d, _) in &counted {
        e.sample_with(
            Metric::ListenDropSourceTopShare.name(),
            &r.set,
            &[],
            d.map_or(0.0, |d| d.top_share),
        );
    }
    // Opt-in: the prefix label holds client addresses, and every scraper reads it.
    if top_sources > 0 {
        Metric::ListenDropSourceRecentSegments.open(e);
        for (r, d, _) in &counted {
            let top = d.and_then(|d| d.top.as_deref()).unwrap_or_default();
            for source in top.iter().take(top_sources) {
                e.sample_with(
                    Metric::ListenDropSourceRecentSegments.name(),
                    &r.set,
                    &[(PREFIX, &source.prefix)],
                    source.counts.total(),
                );
            }
        }
    }
    Metric::ListenDropSourcesUntracked.open(e);
    for (r, _, s) in &counted {
        e.sample_with(
            Metric::ListenDropSourcesUntracked.name(),
            &r.set,
            &[],
            s.untracked_source.iter().sum::<u64>(),
        );
    }
}

/// One info series per listener, with the names its owner's cgroup and container runtime
/// give (none but `socket` where they give none, so a join on `socket` never loses a
/// listener): an info
/// metric rather than labels on every series, so the per-listener families keep their
/// label sets and a container's series do not change identity when it is named.
fn owners(e: &mut Exposition<'_>, rows: &[Row<'_>]) {
    Metric::ListenerOwnerInfo.open(e);
    let mut ints = itoa::Buffer::new();
    for r in rows {
        let n = r.listener.names.as_ref();
        let container = n.and_then(|n| n.container.as_ref());
        let values: [&str; 8] = [
            ints.format(r.listener.inode),
            n.and_then(|n| n.unit.as_deref()).unwrap_or(""),
            container.map_or("", |c| c.runtime.as_str()),
            container.map_or("", |c| c.id.as_str()),
            container.and_then(|c| c.name.as_deref()).unwrap_or(""),
            n.and_then(|n| n.pod_uid.as_deref()).unwrap_or(""),
            n.and_then(|n| n.pod_name.as_deref()).unwrap_or(""),
            n.and_then(|n| n.pod_namespace.as_deref()).unwrap_or(""),
        ];
        // An empty label is an absent one to Prometheus: leave it out.
        let labels: Vec<(&str, &str)> = Metric::ListenerOwnerInfo
            .labelled(values)
            .into_iter()
            .filter(|(_, v)| !v.is_empty())
            .collect();
        e.sample(Metric::ListenerOwnerInfo.name(), &labels, 1);
    }
}
