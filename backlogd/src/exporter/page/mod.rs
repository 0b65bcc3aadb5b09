//! `/metrics`: rendered from the live tables and the kernel maps at scrape time, so there
//! are no copies to keep in sync and closed listeners cannot leave stale series. One
//! collector per file, each emitting its own families (`catalogue.rs` declares them all):
//! - [`listeners`]: per listening socket;
//! - [`aggregates`]: per SO_REUSEPORT group and per process;
//! - [`netns`]: the namespaces' own TcpExt counters;
//! - [`own`]: the daemon itself.
//!
//! The page reads the daemon's live state (`crate::state`) and writes none of it. Its own
//! memory is [`retired`]: what closed members counted, as the last render served it.

mod aggregates;
mod listeners;
mod netns;
mod own;
mod retired;
mod rows;
#[cfg(test)]
mod tests;

use self::{own::Own, retired::Retired, rows::Row};
use std::sync::{Arc, Mutex};

use super::{
    figures::{self, Figures},
    text::{Exposition, Sink},
};
use crate::{listeners::Listener, state::Live};

/// The `/metrics` page, with what its renders remember: the counts closed members
/// contributed to the group and process counters as the last render served them, so those
/// counters never go down (see [`Retired`]). Each render writes it; the daemon's loops
/// never see it.
#[derive(Default)]
pub struct Page {
    retired: Mutex<Retired>,
}

impl Page {
    /// Renders the page into `sink` in chunks (see [`Exposition::streamed`]).
    pub fn render_streamed(&self, live: &Live, sink: Sink<'_>) {
        let mut e = Exposition::streamed(sink);
        render_into(live, &self.retired, &mut e);
        e.finish();
    }
}

fn render_into(live: &Live, retired: &Mutex<Retired>, e: &mut Exposition<'_>) {
    let figures: Figures = figures::gather(live);

    // Before taking the table's read guard: netns_counters() takes it too, and a second
    // read lock on one thread deadlocks with a writer (the event loop) waiting between.
    let namespaces = live.shared.netns_counters();
    // Taken out of the table, so the event loop is not held off it while the text is
    // written.
    let table: Vec<Arc<Listener>> = live.shared.listeners().shared().cloned().collect();
    let rows: Vec<Row<'_>> = table.iter().map(|l| Row::new(l)).collect();
    let sums = {
        let mut retired = retired.lock().unwrap_or_else(|e| e.into_inner());
        aggregates::sum(&rows, &figures.stats, &figures.queues, &mut retired)
    };

    let accept_wait = live
        .accept_wait_buckets
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    listeners::render(
        e,
        &rows,
        &figures,
        live.accepts,
        live.accept_wait.then_some(&accept_wait),
        live.drop_source_top_series,
    );
    aggregates::render(e, &sums, live.accepts);
    netns::render(e, &namespaces, crate::names::netns::named());

    // One look at the maps for both figures read outside `gather`.
    let (queues_full, missed_runs) = {
        let maps = live.maps.lock().unwrap_or_else(|e| e.into_inner());
        let missed = maps.missed_runs().map(|per_program| {
            let by_figure = backlogd_common::names::figure::missed_runs(&per_program).collect();
            (per_program.iter().map(|(_, n)| n).sum(), by_figure)
        });
        (maps.queues_full(), missed)
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
            scan: figures
                .scan
                .map(|s| (s.at.elapsed().as_secs_f64(), s.took.as_secs_f64())),
            orphans_removed: live
                .shared
                .orphans_removed
                .load(std::sync::atomic::Ordering::Relaxed),
            missed_runs,
            mode: live.mode,
            kernel: live.kernel,
            pinned: live.pinned,
        },
    );
}
