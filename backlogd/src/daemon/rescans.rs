//! The rescans: every `rescan_interval`, the table reconciled with the kernel's own list
//! of listeners (the scan iterator, or sock_diag in every namespace: see `sampling`), and
//! kernel map entries no listener can claim removed.

use std::{
    collections::HashSet,
    sync::{Arc, Mutex},
    time::Duration,
};

use tokio::sync::watch;

use super::identify::{identify_programs, name_containers};
use crate::{
    kernel_maps::SharedMaps,
    queues::QueueWindows,
    sampling::{self, iterator::LiveScan},
    service::health::Heartbeats,
    state::Shared,
};

/// What a rescan lists the listeners with: the scan iterator, if this kernel has it (a
/// rescan's pass also refreshes the SYN-queue figures in `windows`).
#[derive(Clone)]
pub struct Lister {
    pub iterator: Option<Arc<LiveScan>>,
    pub windows: Arc<Mutex<QueueWindows>>,
}

/// Reconciles the table with the kernel's own list of listeners.
pub async fn rescan(shared: &Arc<Shared>, maps: &SharedMaps, lister: &Lister) {
    let generation = shared.write_listeners().begin_scan();
    let Lister { iterator, windows } = lister.clone();
    let Ok(scan) =
        tokio::task::spawn_blocking(move || sampling::scan(iterator.as_deref(), &windows)).await
    else {
        tracing::warn!("listener scan panicked");
        return;
    };
    shared.note_scanned_netns(scan.netns, scan.sysctls);
    let found = scan.listeners;
    let listed = scan.listed;
    let scanned_owners = scan.owners;
    let unknown: HashSet<u64> = {
        let table = shared.listeners();
        found
            .iter()
            .map(|d| d.inode)
            .filter(|&i| !table.contains(i))
            .collect()
    };
    // Listeners a daemon before this one saw listen() (the kernel keeps their events in a
    // pinned map): as exact as if this daemon had seen them.
    let seen = maps
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .listens_seen(&unknown);
    if !seen.is_empty() {
        let mut table = shared.write_listeners();
        for event in &seen {
            table.restore(event);
        }
    }
    let unknown: HashSet<u64> = unknown
        .into_iter()
        .filter(|ino| !seen.iter().any(|e| e.ino == *ino))
        .collect();
    let owners = match scanned_owners {
        Some(owners) => owners,
        None => tokio::task::spawn_blocking(move || sampling::owners::find(&unknown))
            .await
            .unwrap_or_default(),
    };
    // Listeners the scan did not find in a namespace it listed whose listen() the programs
    // saw with no close since (LISTENS_SEEN, which the close program empties): held by no
    // process (an in-kernel server, an io_uring fixed file, a descriptor in flight), not
    // closed. Kept.
    let missing: HashSet<u64> = {
        let present: HashSet<u64> = found.iter().map(|d| d.inode).collect();
        shared
            .listeners()
            .iter()
            .filter(|l| listed.contains(&l.netns) && !present.contains(&l.inode))
            .map(|l| l.inode)
            .collect()
    };
    let open: HashSet<u64> = maps
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .listens_seen(&missing)
        .iter()
        .map(|e| e.ino)
        .collect();
    let (added, removed) = shared
        .write_listeners()
        .finish_scan(generation, &found, &listed, &owners, &open);
    identify_programs(shared.clone()).await;
    // Every rescan: names come once a runtime answers, and go with their containers.
    name_containers(shared).await;
    if added + removed > 0 {
        tracing::info!(
            added,
            removed,
            listeners = found.len(),
            "rescan reconciled listeners"
        );
    }
}

/// Rescans every `every`, and when the sampler finds a listener the table lacks
/// (`soon`): that one does not move the schedule.
pub async fn rescan_periodically(
    shared: Arc<Shared>,
    maps: SharedMaps,
    lister: Lister,
    mut every: watch::Receiver<Duration>,
    heartbeats: Arc<Heartbeats>,
    soon: Arc<tokio::sync::Notify>,
) {
    // Map keys that had no live listener at the previous rescan.
    let mut orphans: HashSet<u64> = HashSet::new();
    loop {
        let period = *every.borrow_and_update();
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {
                    rescan(&shared, &maps, &lister).await;
                    orphans = remove_orphans(&shared, &maps, orphans);
                    heartbeats.scanned();
                }
                () = soon.notified() => {
                    tracing::debug!("a listener not in the table met a segment: rescanning");
                    rescan(&shared, &maps, &lister).await;
                }
                // A reload changed the interval: start over with the new one.
                changed = every.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    // The watchdog judges the next scan by the new interval, counted
                    // from now, as the schedule is.
                    heartbeats.scanned();
                    break;
                }
            }
        }
    }
}

/// Removes the per-listener map entries that have had no live listener for a whole rescan
/// interval (`previous`: the keys without one at the last rescan); returns the keys without
/// one now, to be judged at the next. The kernel programs never create an entry for a
/// listener that has closed, but one that closes on one CPU while another CPU settles its
/// first segment can race past that check; such an entry would hold a slot of the bounded
/// map for good. A listener alive that long is in the table (its listen() event or a
/// scan), so only entries no listener can claim are removed.
fn remove_orphans(shared: &Shared, maps: &SharedMaps, previous: HashSet<u64>) -> HashSet<u64> {
    let live: HashSet<u64> = shared.listeners().iter().map(|l| l.inode).collect();
    let mut maps = maps.lock().unwrap_or_else(|e| e.into_inner());
    let now: HashSet<u64> = maps
        .keys()
        .into_iter()
        .filter(|k| !live.contains(k))
        .collect();
    let (gone, pending): (HashSet<u64>, HashSet<u64>) =
        now.into_iter().partition(|k| previous.contains(k));
    if !gone.is_empty() {
        let removed = maps.remove(&gone);
        shared
            .orphans_removed
            .fetch_add(removed, std::sync::atomic::Ordering::Relaxed);
        tracing::info!(
            removed,
            "removed kernel map entries of listeners that are gone"
        );
    }
    pending
}
