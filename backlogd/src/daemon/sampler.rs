//! The queue sampler: every second the kernel's queue maxima into the high-water-mark
//! windows, every few seconds the attempts past the client-impact horizon counted
//! abandoned, about every 10 s the source prefixes past their retention expired and the
//! client-impact and drop-source counters recorded for the recent figures.
//! What it writes is the daemon's live state (`crate::state`), which the exporters read.

use std::{
    collections::HashSet,
    sync::{Arc, Mutex},
    time::Duration,
};

use crate::{
    kernel_maps::{self, SharedMaps},
    queues::QueueWindows,
    service::health::Heartbeats,
    sources,
    state::{Shared, recent},
};

/// What the recent figures are recorded from, and into.
#[derive(Clone)]
pub struct Recorder {
    pub maps: SharedMaps,
    pub shared: Arc<Shared>,
    pub history: Arc<Mutex<recent::Histories>>,
    /// `drop_source_retention`, in nanoseconds.
    pub retention_ns: u64,
}

/// Expires the source prefixes past their retention, then records every listener's
/// client-impact counters and drop sources, and every listening namespace's syncookies,
/// for the recent figures, at one instant.
pub fn record_recent(r: &Recorder) {
    let Recorder {
        maps,
        shared,
        history,
        retention_ns,
    } = r;
    let (stats, sources): (Vec<_>, _) = {
        let mut maps = maps.lock().unwrap_or_else(|e| e.into_inner());
        let expired = maps.expire_drop_sources(kernel_maps::monotonic_ns(), *retention_ns);
        if expired > 0 {
            tracing::debug!(expired, "source prefixes past their retention");
        }
        // A Vec: the history looks nothing up by inode here, so no table is worth building.
        (maps.counters().into_iter().collect(), maps.drop_sources())
    };
    // Every namespace with listeners, not only those whose listeners sent cookies: a
    // namespace's counters count since it was created (the host's since boot), so the
    // window needs its value before its first cookie. One small /proc read a namespace.
    let cookies: Vec<(u32, recent::Cookies)> = shared
        .netns_counters()
        .into_iter()
        .map(|(ns, c)| (ns, recent::cookies_of(&c)))
        .collect();
    let now = std::time::Instant::now();
    let mut history = history.lock().unwrap_or_else(|e| e.into_inner());
    history.cookies.record(now, cookies);
    history
        .impact
        .record(now, stats.iter().map(|(k, v)| (*k, recent::Counts::of(v))));
    history.sources.record(
        now,
        sources
            .into_iter()
            .map(|(k, c)| (k, sources::tally_of(&c)))
            .chain(
                stats
                    .iter()
                    .map(|(ino, s)| (sources::untracked_key(*ino), sources::untracked_tally(s))),
            ),
    );
}

/// Every second, moves the kernel's queue maxima into the high-water-mark windows; every
/// [`sweep_every`] seconds, counts the connection attempts past the client-impact horizon
/// abandoned; about every [`recent::EVERY`], expires source prefixes past their retention
/// and records the recent figures.
pub async fn sample_queues(
    maps: SharedMaps,
    windows: Arc<Mutex<QueueWindows>>,
    recent: Recorder,
    heartbeats: Arc<Heartbeats>,
    max_listeners: u64,
    horizon_ns: u64,
    rescan_soon: Arc<tokio::sync::Notify>,
) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut full_reported = false;
    let sweep_every = sweep_every(horizon_ns);
    let mut ticks: u64 = 0;
    let mut asked = HashSet::new();
    loop {
        tick.tick().await;
        ticks += 1;
        let observed: Vec<u64> = {
            let mut maps = maps.lock().unwrap_or_else(|e| e.into_inner());
            let mut windows = windows.lock().unwrap_or_else(|e| e.into_inner());
            maps.sample_queues(&mut windows, std::time::Instant::now());
            // Once per run: a full map loses updates continuously while it stays full.
            if !full_reported && maps.stats_full() + maps.queues_full() > 0 {
                full_reported = true;
                tracing::warn!(
                    max_listeners,
                    "the kernel maps of listeners are full: counter updates and queue \
                     observations of listeners beyond {max_listeners} are lost (counted in \
                     backlogd_listener_stats_full_total and \
                     backlogd_listener_queue_observations_lost_total; said once). Fix: raise \
                     max_listeners (`--max-listeners`) and restart"
                );
            }
            windows.observed().collect()
        };
        // Outside the maps' and windows' locks, which the scrapes wait on.
        if strangers(&observed, &recent.shared, &mut asked) {
            rescan_soon.notify_one();
        }
        if ticks.is_multiple_of(sweep_every) {
            let maps = maps.clone();
            let swept =
                tokio::task::spawn_blocking(move || kernel_maps::sweep_attempts(&maps, horizon_ns))
                    .await
                    .unwrap_or_else(|e| {
                        tracing::error!(error = %e, "the sweep of the attempts map failed");
                        Default::default()
                    });
            if swept.abandoned > 0 {
                tracing::debug!(
                    abandoned = swept.abandoned,
                    of_closed_listeners = swept.gone,
                    tracked = swept.tracked,
                    "connection attempts past the client-impact horizon"
                );
            }
        }
        // By the clock, not by ticks: a sweep may hold the loop up.
        if recent
            .history
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .impact
            .due(std::time::Instant::now())
        {
            record_recent(&recent);
        }
        heartbeats.sampled();
    }
}

/// Whether the kernel side observed the queues of a listener the table does not hold,
/// one not asked about before (`asked`, which forgets listeners once listed or gone): a
/// listener whose listen() no program saw (`syscall_hook = false`, or a lost event) is
/// then listed by a rescan within a second of its first segment, not at the next
/// scheduled one. A listener that closed leaves the windows with its map entries, so it
/// asks at most once.
fn strangers(observed: &[u64], shared: &Shared, asked: &mut HashSet<u64>) -> bool {
    let table = shared.listeners();
    let unknown: HashSet<u64> = observed
        .iter()
        .copied()
        .filter(|i| !table.contains(*i))
        .collect();
    let new = unknown.iter().any(|i| !asked.contains(i));
    *asked = unknown;
    new
}

/// Seconds between sweeps of the attempts map: a sweep reads every tracked attempt (up to
/// client_impact_attempts of them under a SYN flood) and removes the expired ones, two
/// syscalls each, so not every second with the default 130 s horizon; an abandoned attempt
/// is counted within horizon / 26 (at most 5 s) of its horizon passing.
fn sweep_every(horizon_ns: u64) -> u64 {
    (horizon_ns / 1_000_000_000 / 26).clamp(1, 5)
}
