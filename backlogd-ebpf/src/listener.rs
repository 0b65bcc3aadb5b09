//! Per-listener state the daemon reads: counters (`LISTENER_STATS`), queue depths and
//! high-water marks (`LISTENER_QUEUES`), and the updates lost to a full map. The SYN path
//! ([`crate::syn`]) and the accept queue ([`crate::accept`]) both write here; neither
//! touches the other's maps.

use aya_ebpf::{
    helpers::bpf_ktime_get_ns,
    macros::map,
    maps::{Array, HashMap, PerCpuArray, PerCpuHashMap},
};
use backlogd_common::{LISTENER_STATS_ENTRIES, ListenerStats, QueueState, map_full};

use crate::kernel::{KPtr, Kmem, Result, errno, is_listener_with_inode, offset};

#[map]
static LISTENER_STATS: PerCpuHashMap<u64, ListenerStats> =
    PerCpuHashMap::with_max_entries(LISTENER_STATS_ENTRIES, 0);

/// Updates that found a per-listener map full, by `map_full` slot; the daemon exports and
/// logs them.
#[map]
static LISTENER_STATS_FULL: PerCpuArray<u64> = PerCpuArray::with_max_entries(map_full::COUNT, 0);

/// Queue depths per listener inode, per CPU.
#[map]
static LISTENER_QUEUES: PerCpuHashMap<u64, QueueState> =
    PerCpuHashMap::with_max_entries(LISTENER_STATS_ENTRIES, 0);

/// Connection attempts the daemon found past the client-impact horizon, by listener
/// inode: written by the daemon alone (a per-CPU counter it cannot add to safely), kept
/// here so that a pinned state carries them across a daemon restart like every other
/// count. The programs only remove a closed listener's entry.
#[map]
static ABANDONED: HashMap<u64, u64> = HashMap::with_max_entries(LISTENER_STATS_ENTRIES, 0);

/// Zeroed counters to create an entry from, never written: a 400-byte `ListenerStats`
/// on the stack would leave callers too little of the 512 bytes they have.
#[map]
static ZERO_STATS: PerCpuArray<ListenerStats> = PerCpuArray::with_max_entries(1, 0);

/// Sampling epoch, advanced by the daemon each time it takes the maxima. A CPU's entry
/// from an older epoch restarts its maxima, so the daemon never writes the entries (a
/// read-then-reset from userspace would race with the programs and lose a peak).
#[map]
static QUEUE_EPOCH: Array<u32> = Array::with_max_entries(1, 0);

/// Applies `f` to this CPU's counters of listener `ino` (socket `sk`), creating the entry
/// on the listener's first event.
#[inline(always)]
pub(crate) fn update(sk: KPtr, ino: u64, f: impl FnOnce(&mut ListenerStats)) {
    let ptr = match LISTENER_STATS.get_ptr_mut(ino) {
        Some(p) => p,
        None => {
            // A window settled after its listener closed (on another CPU, or at a later
            // ingress) must not re-create the entry the close removed: nothing would
            // ever remove it again.
            if !is_listener_with_inode(sk, ino) {
                return;
            }
            let Some(zero) = ZERO_STATS.get_ptr(0) else {
                return;
            };
            // SAFETY: this CPU's element of ZERO_STATS, which nothing writes. By
            // reference: by value it would be copied to the stack, the point of the map.
            #[allow(clippy::needless_borrows_for_generic_args)]
            let created = LISTENER_STATS.insert(ino, unsafe { &*zero }, 0);
            if created.is_err() {
                count_map_full(map_full::STATS);
                return;
            }
            match LISTENER_STATS.get_ptr_mut(ino) {
                Some(p) => p,
                None => return,
            }
        }
    };
    // SAFETY: this CPU's copy of the listener's counters; no other CPU writes it.
    f(unsafe { &mut *ptr });
}

/// An update of a per-listener map that could not create the listener's entry (the map
/// holds `max_listeners` entries); `slot`: which map (`map_full`).
#[inline(always)]
fn count_map_full(slot: u32) {
    if let Some(full) = LISTENER_STATS_FULL.get_ptr_mut(slot) {
        // SAFETY: this CPU's counter.
        unsafe { *full += 1 };
    }
}

/// `bpf_ktime_get_ns()`: read once per program run and handed down.
#[inline(always)]
pub(crate) fn now() -> u64 {
    // SAFETY: the helper takes no arguments.
    unsafe { bpf_ktime_get_ns() }
}

/// Records the listener's current queue lengths (`now`: the clock) and raises its
/// high-water marks.
#[inline(always)]
pub(crate) fn observe_queues<K: Kmem>(sk: K, ino: u64, now: u64) {
    // Nothing to count, so nothing for a caller to do when it fails. (Only the
    // discriminant of a `Result` may be looked at here: matching its error code made LLVM
    // load the code on the `Ok` path too, from a stack slot nothing wrote, which 5.10's
    // verifier refuses: "invalid read from stack".)
    let _ = observe_counting(sk, ino, now, Hot::default());
}

/// Counts that an observation carries into the listener's queue entry (`QueueState::syns`
/// and `queued`), for the events that observe the queues anyway: one per-listener map
/// lookup per event instead of two (the counters and the queues are two maps because
/// the daemon reads the queues every second and the counters, 424 bytes a CPU, rarely).
#[derive(Default, Clone, Copy)]
pub(crate) struct Hot {
    pub(crate) syns: u64,
    pub(crate) queued: u64,
}

/// [`observe_queues`], adding `hot` to the entry's counters. `Ok` only if they were
/// added; otherwise (a read failed, no entry could be created: `ENOENT` for a listener
/// that has closed) the caller counts them with [`update`], which gives up in the same
/// cases and counts a full map.
#[inline(always)]
pub(crate) fn observe_counting<K: Kmem>(sk: K, ino: u64, now: u64, hot: Hot) -> Result<()> {
    let accept: u32 = sk.read(offset(|o| &o.sk_ack_backlog))?;
    let syn: u32 = sk.syn_qlen()?;
    let epoch = QUEUE_EPOCH.get(0).copied().unwrap_or(0);
    match LISTENER_QUEUES.get_ptr_mut(ino) {
        Some(q) => {
            // SAFETY: this CPU's copy of the entry; no other CPU writes it.
            let q = unsafe { &mut *q };
            if q.epoch == epoch {
                q.accept_hwm = q.accept_hwm.max(accept);
                q.syn_hwm = q.syn_hwm.max(syn);
            } else {
                q.accept_hwm = accept;
                q.syn_hwm = syn;
                q.epoch = epoch;
            }
            q.accept_depth = accept;
            q.observed_ns = now;
            q.syns += hot.syns;
            q.queued += hot.queued;
        }
        None => {
            // As in `update`: no entry for a listener that has closed.
            if !is_listener_with_inode(sk.probed(), ino) {
                return Err(errno::ENOENT);
            }
            let state = QueueState {
                accept_depth: accept,
                accept_hwm: accept,
                syn_hwm: syn,
                epoch,
                observed_ns: now,
                syns: hot.syns,
                queued: hot.queued,
            };
            if LISTENER_QUEUES.insert(ino, state, 0).is_err() {
                count_map_full(map_full::QUEUES);
                return Err(errno::ENOSPC);
            }
        }
    }
    Ok(())
}

/// A closed listener's entries go with it: the maps stay bounded by live listeners.
#[inline(always)]
pub(crate) fn forget(ino: u64) {
    let _ = LISTENER_STATS.remove(ino);
    let _ = LISTENER_QUEUES.remove(ino);
    let _ = ABANDONED.remove(ino);
}
