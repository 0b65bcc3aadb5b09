//! Per-listener state the daemon reads: counters (`LISTENER_STATS`), queue depths and
//! high-water marks (`LISTENER_QUEUES`), and the updates lost to a full map. The SYN path
//! ([`crate::syn`]) and the accept queue ([`crate::accept`]) both write here; neither
//! touches the other's maps.

use aya_ebpf::{
    bindings::BPF_NOEXIST,
    helpers::bpf_ktime_get_ns,
    macros::map,
    maps::{Array, HashMap, PerCpuArray, PerCpuHashMap},
};
use backlogd_common::{LISTENER_STATS_ENTRIES, ListenerStats, QueueState, map_full};

use crate::kernel::{KPtr, Kmem, errno, is_listener_with_inode, offset};

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
            // BPF_NOEXIST: a program that interrupted this one on this CPU (a softirq
            // over an accept in process context) may have created the entry and counted
            // into this CPU's slot since the lookup; BPF_ANY would zero that slot again.
            #[allow(clippy::needless_borrows_for_generic_args)]
            let created = LISTENER_STATS.insert(ino, unsafe { &*zero }, u64::from(BPF_NOEXIST));
            if let Err(e) = created
                && e != errno::EEXIST
            {
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

/// Counts that an observation carries into the listener's queue entry (`QueueState::syns`
/// and `queued`), for the events that observe the queues anyway: one per-listener map
/// lookup per event instead of two (the counters and the queues are two maps because
/// the daemon reads the queues every second and the counters, 424 bytes a CPU, rarely).
#[derive(Default, Clone, Copy)]
pub(crate) struct Hot {
    pub(crate) syns: u64,
    pub(crate) queued: u64,
}

/// Raises the listener's high-water marks to its queues' lengths now, adding `hot` to
/// the entry's counters: whether they were added. When not (a read failed, no entry
/// could be created: a listener that has closed, or a full map), the caller counts them
/// with [`update`], which gives up in the same cases and counts a full map.
///
/// `at`: the clock, for an observation that also records the accept queue's length as
/// the one last seen (an enqueue, which reads the clock anyway). The daemon serves that
/// length only where no scan pass reads it. A settled segment's observation (`None`)
/// reads no clock for it: a SYN leaves the accept queue as it was, and a final ACK that
/// queued a child is observed at that enqueue.
#[inline(always)]
pub(crate) fn observe_counting<K: Kmem>(sk: K, ino: u64, at: Option<u64>, hot: Hot) -> bool {
    let (Ok(accept), Ok(syn)) = (sk.read::<u32>(offset(|o| &o.sk_ack_backlog)), sk.syn_qlen())
    else {
        return false;
    };
    let epoch = QUEUE_EPOCH.get(0).copied().unwrap_or(0);
    let seen = Seen {
        accept,
        syn,
        epoch,
        at,
        hot,
    };
    if let Some(q) = LISTENER_QUEUES.get_ptr_mut(ino) {
        // SAFETY: this CPU's copy of the entry; no other CPU writes it.
        seen.add_to(unsafe { &mut *q });
        return true;
    }
    // As in `update`: no entry for a listener that has closed.
    if !is_listener_with_inode(sk.probed(), ino) {
        return false;
    }
    let (accept_depth, observed_ns) = at.map_or((0, 0), |now| (accept, now));
    let state = QueueState {
        accept_depth,
        accept_hwm: accept,
        syn_hwm: syn,
        epoch,
        observed_ns,
        syns: hot.syns,
        queued: hot.queued,
    };
    // BPF_NOEXIST, as in `update`: an interrupting program may have created the entry
    // since the lookup, with counts in this CPU's slot.
    match LISTENER_QUEUES.insert(ino, state, u64::from(BPF_NOEXIST)) {
        Ok(()) => true,
        Err(e) if e == errno::EEXIST => match LISTENER_QUEUES.get_ptr_mut(ino) {
            Some(q) => {
                // SAFETY: as above.
                seen.add_to(unsafe { &mut *q });
                true
            }
            // The listener closed just now and took its entry.
            None => false,
        },
        Err(_) => {
            count_map_full(map_full::QUEUES);
            false
        }
    }
}

/// One observation of a listener's queues, and the counts it carries.
#[derive(Clone, Copy)]
struct Seen {
    accept: u32,
    syn: u32,
    epoch: u32,
    at: Option<u64>,
    hot: Hot,
}

impl Seen {
    #[inline(always)]
    fn add_to(self, q: &mut QueueState) {
        if q.epoch == self.epoch {
            q.accept_hwm = q.accept_hwm.max(self.accept);
            q.syn_hwm = q.syn_hwm.max(self.syn);
        } else {
            q.accept_hwm = self.accept;
            q.syn_hwm = self.syn;
            q.epoch = self.epoch;
        }
        if let Some(now) = self.at {
            q.accept_depth = self.accept;
            q.observed_ns = now;
        }
        q.syns += self.hot.syns;
        q.queued += self.hot.queued;
    }
}

/// A closed listener's entries go with it: the maps stay bounded by live listeners.
#[inline(always)]
pub(crate) fn forget(ino: u64) {
    let _ = LISTENER_STATS.remove(ino);
    let _ = LISTENER_QUEUES.remove(ino);
    let _ = ABANDONED.remove(ino);
}
