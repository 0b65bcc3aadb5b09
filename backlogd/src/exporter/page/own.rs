//! The daemon's own families: what it tracks, what it lost, how it hooks the kernel.

use crate::{
    exporter::{catalogue::Metric, text::Exposition},
    loader::modes::{HookMode, KernelSupport},
};

/// The daemon's figures of one render.
pub struct Own {
    pub listeners: usize,
    pub events_lost: u64,
    pub stats_full: u64,
    pub queues_full: u64,
    pub orphans_removed: u64,
    pub impact_tracked: u64,
    pub impact_sweeps: u64,
    pub impact_untracked: u64,
    /// Seconds since the scan pass behind the SYN queues' lengths now, and how long it
    /// took; `None`: no pass.
    pub scan: Option<(f64, f64)>,
    /// Runs of the programs the kernel skipped, in all and per figure they feed
    /// (`names::figure`); `None` where the kernel does not report skipped runs.
    pub missed_runs: Option<(u64, Vec<(&'static str, u64)>)>,
    pub mode: HookMode,
    pub kernel: KernelSupport,
    pub pinned: bool,
}

pub fn render(e: &mut Exposition<'_>, own: &Own) {
    for (metric, value) in [
        (Metric::Listeners, own.listeners as u64),
        (Metric::ListenerEventsLost, own.events_lost),
        (Metric::ListenerStatsFull, own.stats_full),
        (Metric::ListenerQueueObservationsLost, own.queues_full),
        (Metric::ListenerMapOrphansRemoved, own.orphans_removed),
        (Metric::ClientImpactTracked, own.impact_tracked),
        (Metric::ClientImpactSweeps, own.impact_sweeps),
        (Metric::ClientImpactUntracked, own.impact_untracked),
    ] {
        metric.open(e);
        e.sample(metric.name(), &[], value);
    }
    if let Some((age, took)) = own.scan {
        for (metric, value) in [
            (Metric::SynQueueReadAge, age),
            (Metric::SynQueueReadDuration, took),
        ] {
            metric.open(e);
            e.sample(metric.name(), &[], value);
        }
    }
    if let Some((missed, by_figure)) = &own.missed_runs {
        Metric::ProbeMissedRuns.open(e);
        e.sample(Metric::ProbeMissedRuns.name(), &[], *missed);
        let metric = Metric::FigureMissedRuns;
        metric.open(e);
        for (figure, n) in by_figure {
            e.sample(metric.name(), &metric.labelled([*figure]), *n);
        }
    }

    let metric = Metric::HookMode;
    metric.open(e);
    e.sample(metric.name(), &metric.labelled([own.mode.name()]), 1);
    let metric = Metric::KernelHookSupported;
    metric.open(e);
    for (mode, supported) in [
        ("fentry", own.kernel.fentry),
        ("kprobe", own.kernel.kprobe),
        ("tracepoint", true),
    ] {
        e.sample(metric.name(), &metric.labelled([mode]), u8::from(supported));
    }

    Metric::Pinned.open(e);
    e.sample(Metric::Pinned.name(), &[], u8::from(own.pinned));

    Metric::BuildInfo.open(e);
    e.sample(
        Metric::BuildInfo.name(),
        &Metric::BuildInfo.labelled([env!("CARGO_PKG_VERSION")]),
        1,
    );
}
