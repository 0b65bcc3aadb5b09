//! Queue high-water marks over a time window.
//!
//! The kernel side raises per-listener, per-CPU maxima as queues grow, tagged with the
//! sampling epoch. Every second the daemon takes those maxima and advances the epoch
//! (each CPU restarts its maxima at its next observation), keeping one sample per second
//! per listener, so `/metrics` can report the highest queue length over the last
//! `window` however many scrapers there are: a burst that filled a queue for 50 ms stays
//! visible to a 15 s scrape.
//!
//! The daemon never writes the kernel's entries, so no peak is lost to a race: an
//! observation landing between the daemon's read and its epoch advance is still tagged
//! with the old epoch and is picked up at the next sample (maxima of the previous epoch
//! count too), at the price of a window up to one second longer.

use std::{
    collections::{HashMap, VecDeque},
    time::{Duration, Instant},
};

use backlogd_common::QueueState;

/// The epoch the loader publishes before attaching anything (0 marks a CPU slot that
/// never observed).
pub const FIRST_EPOCH: u32 = 1;

/// One listener's queue state merged over CPUs for sampling epoch `epoch`: the depth the
/// newest observation with one saw (an enqueue's), and the maxima of CPUs that observed
/// during `epoch` or the one before (older maxima belong to samples already taken). The
/// depth is not one of the maxima: with a scan iterator it is stale (no program looks
/// at the queues on accept), and [`QueueWindows`] takes the length now from the pass.
pub fn merge(per_cpu: &[QueueState], epoch: u32) -> QueueState {
    let newest = per_cpu
        .iter()
        .filter(|q| q.observed_ns != 0)
        .max_by_key(|q| q.observed_ns)
        .copied()
        .unwrap_or_default();
    let recent = per_cpu
        .iter()
        .filter(|q| q.epoch != 0 && (q.epoch == epoch || q.epoch.wrapping_add(1) == epoch));
    let mut merged = QueueState {
        accept_depth: newest.accept_depth,
        accept_hwm: 0,
        syn_hwm: 0,
        epoch,
        observed_ns: newest.observed_ns,
        // The counters the programs keep beside the queues are taken with the others
        // (`KernelMaps::listener_stats_and_queues`), not here.
        ..QueueState::default()
    };
    for q in recent {
        merged.accept_hwm = merged.accept_hwm.max(q.accept_hwm);
        merged.syn_hwm = merged.syn_hwm.max(q.syn_hwm);
    }
    merged
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct QueueFigures {
    /// Connections waiting for accept() as last observed.
    pub accept_depth: u32,
    /// Highest accept-queue length over the window.
    pub accept_max: u32,
    /// Highest SYN-queue length over the window: pending handshakes (request sockets).
    pub syn_max: u32,
    /// SYN-queue length now, as the last scan pass read it (see [`QueueWindows::scanned_at`]
    /// for when); `None` where no pass found the listener or none ran.
    #[serde(default)]
    pub syn_depth: Option<u32>,
}

/// When a scan pass ran (its end) and how long it took.
#[derive(Debug, Clone, Copy)]
pub struct ScanPass {
    pub at: Instant,
    pub took: Duration,
}

/// A listener's (SYN-queue, accept-queue) lengths as a scan pass read them.
pub type Lengths = (u32, u32);

#[derive(Debug)]
pub struct QueueWindows {
    window: Duration,
    samples: HashMap<u64, VecDeque<(Instant, u32, u32)>>,
    /// The epoch the kernel side is tagging observations with now.
    epoch: u32,
    /// The last scan pass: when it ran, how long it took, and each listener's SYN-queue
    /// and accept-queue lengths then.
    scan: Option<(ScanPass, HashMap<u64, Lengths>)>,
    /// No program looks at the queues on accept, so the length their last observation
    /// saw (an enqueue's) only grows: a listener's accept-queue length now is the scan
    /// pass's, where it found the listener (every daemon with a scan iterator).
    accept_from_scan: bool,
}

impl QueueWindows {
    pub fn new(window: Duration) -> Self {
        Self {
            window,
            samples: HashMap::new(),
            epoch: FIRST_EPOCH,
            scan: None,
            accept_from_scan: false,
        }
    }

    /// The accept queues' lengths now come from the scan passes (see `accept_from_scan`).
    pub fn take_accept_lengths_from_scans(&mut self) {
        self.accept_from_scan = true;
    }

    /// A scan pass read these SYN-queue and accept-queue lengths (by socket inode). Each
    /// SYN-queue length becomes a sample of its listener at the pass's time, so the
    /// window's peak holds what the passes saw too (for listeners the kernel side has
    /// observed: the others' samples go at the next [`Self::record_all`], and their peak is
    /// the last pass's length). The accept queue's peak is the programs' alone: every
    /// connection that joins it is observed.
    pub fn record_scan(&mut self, lengths: HashMap<u64, Lengths>, pass: ScanPass) {
        for (ino, (syn, accept)) in &lengths {
            if let Some(q) = self.samples.get_mut(ino) {
                let accept = if self.accept_from_scan { *accept } else { 0 };
                q.push_back((pass.at, accept, *syn));
            }
        }
        self.scan = Some((pass, lengths));
    }

    /// The listeners the kernel side has observed the queues of (within the window).
    pub fn observed(&self) -> impl Iterator<Item = u64> + '_ {
        self.samples.keys().copied()
    }

    /// The last scan pass, if one ran.
    pub fn last_scan(&self) -> Option<ScanPass> {
        self.scan.as_ref().map(|(pass, _)| *pass)
    }

    /// Changes the window (config reload); samples older than the new window age out at
    /// the next sample.
    pub fn set_window(&mut self, window: Duration) {
        self.window = window;
    }

    /// The epoch the kernel side tags observations with now, for merging its entries (see
    /// [`merge`]).
    pub fn epoch(&self) -> u32 {
        self.epoch
    }

    /// Takes the kernel's maxima of the epoch that ends now: each listener's entry merged
    /// over CPUs for [`Self::epoch`]. Listeners without an entry leave the windows.
    pub fn record_all(&mut self, entries: Vec<(u64, QueueState)>, now: Instant) {
        let live: std::collections::HashSet<u64> = entries.iter().map(|(k, _)| *k).collect();
        for (ino, state) in entries {
            self.record(ino, state, now);
        }
        self.samples.retain(|ino, _| live.contains(ino));
    }

    /// The epoch to publish next (0 is never used: it marks a CPU slot that never
    /// observed).
    pub fn next_epoch(&self) -> u32 {
        self.epoch.wrapping_add(1).max(1)
    }

    /// The kernel side was told to tag observations with `epoch` from now on.
    pub fn advanced_to(&mut self, epoch: u32) {
        self.epoch = epoch;
    }

    fn record(&mut self, ino: u64, state: QueueState, now: Instant) {
        let window = self.window;
        // The length as the programs last saw it is part of the window where it is the
        // length served (no pass reads this listener's); a pass's length is a sample of
        // its own, taken when the pass ran (`record_scan`).
        let seen = if self.accept_from_scan && self.scanned(ino).is_some() {
            0
        } else {
            state.accept_depth
        };
        let q = self.samples.entry(ino).or_default();
        q.push_back((now, state.accept_hwm.max(seen), state.syn_hwm));
        while q
            .front()
            .is_some_and(|(t, _, _)| now.duration_since(*t) > window)
        {
            q.pop_front();
        }
    }

    /// The last pass's (SYN-queue, accept-queue) lengths of listener `ino`, if it found it.
    fn scanned(&self, ino: u64) -> Option<Lengths> {
        self.scan
            .as_ref()
            .and_then(|(_, lengths)| lengths.get(&ino).copied())
    }

    /// Figures for a listener given the kernel's current (not yet sampled) state, or,
    /// while the kernel side has never observed its queues, the accept-queue length a
    /// rescan saw (`scanned`). Everything that lengthens a queue is observed (a SYN, a
    /// queued handshake), so a queue without an observation is no longer than the scan
    /// saw: one that filled before the daemon started and has met only drops since.
    pub fn figures(
        &self,
        ino: u64,
        current: Option<QueueState>,
        scanned: Option<u32>,
    ) -> QueueFigures {
        let (current, seed) = match current {
            Some(c) => (c, 0),
            None => (QueueState::default(), scanned.unwrap_or(0)),
        };
        let (mut accept_max, mut syn_max) = (current.accept_hwm.max(seed), current.syn_hwm);
        for (_, a, s) in self.samples.get(&ino).into_iter().flatten() {
            accept_max = accept_max.max(*a);
            syn_max = syn_max.max(*s);
        }
        let scanned_now = self.scanned(ino);
        let syn_depth = scanned_now.map(|(syn, _)| syn);
        let accept_depth = match scanned_now {
            Some((_, accept)) if self.accept_from_scan => accept,
            _ => current.accept_depth.max(seed),
        };
        QueueFigures {
            accept_depth,
            // The length now is part of the window.
            accept_max: accept_max.max(accept_depth),
            // A queue the pass saw is part of the window too (one that filled before the
            // daemon started, or between observations by timeouts alone, cannot grow).
            syn_max: syn_max.max(syn_depth.unwrap_or(0)),
            syn_depth,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peak_stays_for_the_window_then_leaves() {
        let mut w = QueueWindows::new(Duration::from_secs(15));
        let t0 = Instant::now();
        let peak = QueueState {
            accept_depth: 0,
            accept_hwm: 129,
            syn_hwm: 40,
            ..Default::default()
        };
        w.record(1, peak, t0);
        let quiet = QueueState::default();
        w.record(1, quiet, t0 + Duration::from_secs(10));
        let f = w.figures(1, Some(quiet), None);
        assert_eq!((f.accept_depth, f.accept_max, f.syn_max), (0, 129, 40));
        w.record(1, quiet, t0 + Duration::from_secs(16));
        assert_eq!(w.figures(1, Some(quiet), None).accept_max, 0);
    }

    #[test]
    fn unsampled_kernel_maximum_counts_too() {
        let w = QueueWindows::new(Duration::from_secs(15));
        let now = QueueState {
            accept_depth: 3,
            accept_hwm: 7,
            syn_hwm: 2,
            ..Default::default()
        };
        assert_eq!(
            w.figures(9, Some(now), None),
            QueueFigures {
                accept_depth: 3,
                accept_max: 7,
                syn_max: 2,
                syn_depth: None,
            }
        );
    }

    #[test]
    fn a_queue_the_kernel_never_observed_is_what_the_scan_saw() {
        let w = QueueWindows::new(Duration::from_secs(15));
        let f = w.figures(1, None, Some(9));
        assert_eq!((f.accept_depth, f.accept_max), (9, 9));
        // Once observed, the kernel's figures are the truth, whatever the last scan saw.
        let observed = QueueState {
            accept_depth: 2,
            accept_hwm: 5,
            observed_ns: 1,
            ..Default::default()
        };
        let f = w.figures(1, Some(observed), Some(9));
        assert_eq!((f.accept_depth, f.accept_max), (2, 5));
        assert_eq!(w.figures(1, None, None), QueueFigures::default());
    }

    #[test]
    fn a_scanned_syn_queue_is_its_length_now_and_part_of_the_window() {
        let mut w = QueueWindows::new(Duration::from_secs(15));
        assert_eq!(w.figures(1, None, None).syn_depth, None, "no pass yet");
        let observed = QueueState {
            syn_hwm: 4,
            observed_ns: 1,
            ..Default::default()
        };
        w.record_scan([(1, (6, 0)), (2, (0, 0))].into_iter().collect(), pass());
        let f = w.figures(1, Some(observed), None);
        assert_eq!((f.syn_depth, f.syn_max), (Some(6), 6));
        assert_eq!(w.figures(2, None, None).syn_depth, Some(0));
        assert_eq!(w.figures(3, None, None).syn_depth, None, "not in the pass");
        assert!(w.last_scan().is_some());
        // Sampled, then a pass: its length stays in the window after the next pass.
        w.record(1, observed, Instant::now());
        w.record_scan([(1, (9, 0))].into_iter().collect(), pass());
        w.record_scan([(1, (0, 0))].into_iter().collect(), pass());
        let f = w.figures(1, Some(observed), None);
        assert_eq!((f.syn_depth, f.syn_max), (Some(0), 9));
    }

    /// Without accepts seen, the last observation's length (at an enqueue) stays high
    /// after accept() drains the queue: the pass's length is the one now. The peak stays
    /// the programs'.
    #[test]
    fn without_accepts_seen_the_accept_queue_length_is_the_passs() {
        let mut w = QueueWindows::new(Duration::from_secs(15));
        let observed = QueueState {
            accept_depth: 12,
            accept_hwm: 12,
            observed_ns: 1,
            ..Default::default()
        };
        w.record_scan([(1, (0, 7))].into_iter().collect(), pass());
        assert_eq!(w.figures(1, Some(observed), None).accept_depth, 12);
        w.take_accept_lengths_from_scans();
        let f = w.figures(1, Some(observed), None);
        assert_eq!((f.accept_depth, f.accept_max), (7, 12));
        assert_eq!(
            w.figures(2, Some(observed), None).accept_depth,
            12,
            "not in the pass"
        );
    }

    fn pass() -> ScanPass {
        ScanPass {
            at: Instant::now(),
            took: Duration::from_millis(1),
        }
    }

    fn cpu(depth: u32, hwm: u32, syn: u32, epoch: u32, at: u64) -> QueueState {
        QueueState {
            accept_depth: depth,
            accept_hwm: hwm,
            syn_hwm: syn,
            epoch,
            observed_ns: at,
            ..QueueState::default()
        }
    }

    #[test]
    fn merge_takes_the_newest_depth_and_recent_maxima_of_every_cpu() {
        let per_cpu = [
            cpu(9, 12, 3, 5, 100), // this epoch, older observation
            cpu(4, 6, 8, 4, 200),  // previous epoch, newest observation
            cpu(0, 0, 0, 0, 0),    // never observed
        ];
        let m = merge(&per_cpu, 5);
        assert_eq!((m.accept_depth, m.accept_hwm, m.syn_hwm), (4, 12, 8));
    }

    #[test]
    fn maxima_of_older_epochs_are_not_merged_again() {
        let per_cpu = [cpu(2, 50, 20, 3, 100)];
        let m = merge(&per_cpu, 5);
        assert_eq!((m.accept_depth, m.accept_hwm, m.syn_hwm), (2, 0, 0));
        // The depth is still the window's where it is the length served.
        let mut w = QueueWindows::new(Duration::from_secs(15));
        w.record(1, m, Instant::now());
        assert_eq!(
            w.figures(1, Some(QueueState::default()), None).accept_max,
            2
        );
    }

    /// With lengths from the passes, a drained queue's stale observation (the last
    /// enqueue's length) leaves the window: the peak is the passes' and the programs'
    /// maxima, not a length the programs saw before accept() drained it.
    #[test]
    fn a_drained_queue_leaves_the_window_when_lengths_come_from_passes() {
        let mut w = QueueWindows::new(Duration::from_secs(15));
        w.take_accept_lengths_from_scans();
        let stale = QueueState {
            accept_depth: 6,
            observed_ns: 1,
            ..Default::default()
        };
        w.record_scan([(1, (0, 0))].into_iter().collect(), pass());
        w.record(1, stale, Instant::now());
        let f = w.figures(1, Some(stale), None);
        assert_eq!((f.accept_depth, f.accept_max), (0, 0));
        // A pass that saw the queue full is a sample of its own.
        w.record_scan([(1, (0, 4))].into_iter().collect(), pass());
        w.record_scan([(1, (0, 0))].into_iter().collect(), pass());
        let f = w.figures(1, Some(stale), None);
        assert_eq!((f.accept_depth, f.accept_max), (0, 4));
    }
}
