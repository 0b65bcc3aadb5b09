//! Queue high-water marks over a time window.
//!
//! The kernel side raises per-listener maxima as queues grow. Every second the daemon
//! takes those maxima and resets them, keeping one sample per second per listener, so
//! `/metrics` can report the highest queue length over the last `window` however many
//! scrapers there are: a burst that filled a queue for 50 ms stays visible to a 15 s
//! scrape.

use std::{
    collections::{HashMap, VecDeque},
    time::{Duration, Instant},
};

use aya::maps::{HashMap as BpfHashMap, MapData};
use backlogd_common::QueueState;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct QueueFigures {
    /// Connections waiting for accept() as last observed.
    pub accept_depth: u32,
    /// Highest accept-queue length over the window.
    pub accept_max: u32,
    /// Highest SYN-queue length over the window.
    pub syn_max: u32,
}

#[derive(Debug)]
pub struct QueueWindows {
    window: Duration,
    samples: HashMap<u64, VecDeque<(Instant, u32, u32)>>,
}

impl QueueWindows {
    pub fn new(window: Duration) -> Self {
        Self {
            window,
            samples: HashMap::new(),
        }
    }

    /// Takes the kernel's maxima since the last sample and resets them to the current
    /// accept depth (and 0 for the SYN queue, which the next observation raises again).
    pub fn sample(&mut self, map: &mut BpfHashMap<MapData, u64, QueueState>, now: Instant) {
        let entries: Vec<(u64, QueueState)> = map.iter().filter_map(Result::ok).collect();
        let live: std::collections::HashSet<u64> = entries.iter().map(|(k, _)| *k).collect();
        for (ino, state) in entries {
            self.record(ino, state, now);
            let reset = QueueState {
                accept_hwm: state.accept_depth,
                syn_hwm: 0,
                ..state
            };
            // A concurrent kernel update between read and reset loses at most one max.
            let _ = map.insert(ino, reset, 0);
        }
        self.samples.retain(|ino, _| live.contains(ino));
    }

    fn record(&mut self, ino: u64, state: QueueState, now: Instant) {
        let window = self.window;
        let q = self.samples.entry(ino).or_default();
        q.push_back((now, state.accept_hwm, state.syn_hwm));
        while q
            .front()
            .is_some_and(|(t, _, _)| now.duration_since(*t) > window)
        {
            q.pop_front();
        }
    }

    /// Figures for a listener given the kernel's current (not yet sampled) state.
    pub fn figures(&self, ino: u64, current: Option<QueueState>) -> QueueFigures {
        let current = current.unwrap_or_default();
        let (mut accept_max, mut syn_max) = (current.accept_hwm, current.syn_hwm);
        for (_, a, s) in self.samples.get(&ino).into_iter().flatten() {
            accept_max = accept_max.max(*a);
            syn_max = syn_max.max(*s);
        }
        QueueFigures {
            accept_depth: current.accept_depth,
            accept_max,
            syn_max,
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
            _pad: 0,
        };
        w.record(1, peak, t0);
        let quiet = QueueState::default();
        w.record(1, quiet, t0 + Duration::from_secs(10));
        let f = w.figures(1, Some(quiet));
        assert_eq!((f.accept_depth, f.accept_max, f.syn_max), (0, 129, 40));
        w.record(1, quiet, t0 + Duration::from_secs(16));
        assert_eq!(w.figures(1, Some(quiet)).accept_max, 0);
    }

    #[test]
    fn unsampled_kernel_maximum_counts_too() {
        let w = QueueWindows::new(Duration::from_secs(15));
        let now = QueueState {
            accept_depth: 3,
            accept_hwm: 7,
            syn_hwm: 2,
            _pad: 0,
        };
        assert_eq!(
            w.figures(9, Some(now)),
            QueueFigures {
                accept_depth: 3,
                accept_max: 7,
                syn_max: 2
            }
        );
    }
}
