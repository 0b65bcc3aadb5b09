//! `/metrics`: rendered from the live tables and the kernel maps at scrape time, so there
//! are no copies to keep in sync and closed listeners cannot leave stale series. One
//! collector per file, each emitting its own families (`catalogue.rs` declares them all):
//! - [`listeners`]: per listening socket;
//! - [`aggregates`]: per SO_REUSEPORT group and per process;
//! - [`netns`]: the namespaces' own TcpExt counters;
//! - [`own`]: the daemon itself.

mod aggregates;
mod listeners;
mod netns;
mod own;
mod rows;

use self::{own::Own, rows::Row};
use std::sync::Arc;

use super::{
    figures::{Figures, Metrics},
    text::{Exposition, Sink},
};
use crate::listeners::Listener;

/// Renders the page into `sink` in chunks (see [`Exposition::streamed`]).
pub fn render_streamed(metrics: &Metrics, sink: Sink<'_>) {
    let mut e = Exposition::streamed(sink);
    render_into(metrics, &mut e);
    e.finish();
}

fn render_into(metrics: &Metrics, e: &mut Exposition<'_>) {
    let figures: Figures = metrics.gather();

    // Before taking the table's read guard: netns_counters() takes it too, and a second
    // read lock on one thread deadlocks with a writer (the event loop) waiting between.
    let namespaces = metrics.shared.netns_counters();
    // Taken out of the table, so the event loop is not held off it while the text is
    // written.
    let table: Vec<Arc<Listener>> = metrics.shared.listeners().shared().cloned().collect();
    let rows: Vec<Row<'_>> = table.iter().map(|l| Row::new(l)).collect();
    let sums = {
        let mut retired = metrics.retired.lock().unwrap_or_else(|e| e.into_inner());
        aggregates::sum(&rows, &figures.stats, &figures.queues, &mut retired)
    };

    let accept_wait = metrics
        .accept_wait_buckets
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    listeners::render(e, &rows, &figures, &accept_wait);
    aggregates::render(e, &sums);
    netns::render(e, &namespaces);

    // One look at the maps for both figures read outside `gather`.
    let (queues_full, missed_runs) = {
        let maps = metrics.maps.lock().unwrap_or_else(|e| e.into_inner());
        (maps.queues_full(), maps.missed_runs())
    };
    own::render(
        e,
        &Own {
            listeners: rows.len(),
            events_lost: figures.events_lost,
            stats_full: figures.stats_full,
            queues_full,
            impact_tracked: figures.impact.tracked,
            impact_sweeps: figures.impact.sweeps,
            impact_untracked: figures.impact.untracked,
            orphans_removed: metrics
                .shared
                .orphans_removed
                .load(std::sync::atomic::Ordering::Relaxed),
            missed_runs,
            mode: metrics.mode,
            kernel: metrics.kernel,
            pinned: metrics.pinned,
        },
    );
}
