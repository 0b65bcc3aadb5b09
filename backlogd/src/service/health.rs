//! What a systemd watchdog ping vouches for. A ping from a task of its own would only prove
//! that the async runtime runs; the daemon is alive when its periodic work still finishes:
//! the queue sampler (every second, under the maps and windows locks every scrape takes)
//! and the sock_diag rescans (under the listener table's write lock the event loop takes).
//! A deadlock or a hung scan stops the pings, and systemd restarts the daemon.

use std::{
    sync::atomic::{AtomicU64, Ordering},
    time::{Duration, Instant},
};

/// The sampler ticks every second; this much silence is a hang, not a slow tick.
const SAMPLER_SLACK: Duration = Duration::from_secs(10);
/// A rescan may take a while with thousands of namespaces; this much past its interval is
/// a hang.
const RESCAN_SLACK: Duration = Duration::from_secs(30);

/// When each periodic job last finished, in milliseconds since `start`.
pub struct Heartbeats {
    start: Instant,
    sampled: AtomicU64,
    scanned: AtomicU64,
}

impl Heartbeats {
    /// Both jobs count as just done: the first rescan ran before serving began.
    pub fn new() -> Self {
        Self {
            start: Instant::now(),
            sampled: AtomicU64::new(0),
            scanned: AtomicU64::new(0),
        }
    }

    pub fn sampled(&self) {
        self.sampled.store(self.now(), Ordering::Relaxed);
    }

    pub fn scanned(&self) {
        self.scanned.store(self.now(), Ordering::Relaxed);
    }

    fn now(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// What has made no progress for too long, given the rescan interval in force.
    pub fn stalled(&self, rescan_interval: Duration) -> Option<String> {
        self.stalled_at(self.now(), rescan_interval)
    }

    fn stalled_at(&self, now: u64, rescan_interval: Duration) -> Option<String> {
        let since =
            |at: &AtomicU64| Duration::from_millis(now.saturating_sub(at.load(Ordering::Relaxed)));
        let sampled = since(&self.sampled);
        let scanned = since(&self.scanned);
        let mut stalled = Vec::new();
        if sampled > SAMPLER_SLACK {
            stalled.push(format!(
                "the queue sampler (every 1 s) last finished {sampled:?} ago"
            ));
        }
        if scanned > rescan_interval + RESCAN_SLACK {
            stalled.push(format!(
                "the sock_diag rescan (every {rescan_interval:?}) last finished {scanned:?} ago"
            ));
        }
        (!stalled.is_empty()).then(|| stalled.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_that_stops_finishing_is_named_and_one_that_catches_up_is_not() {
        let h = Heartbeats::new();
        let every = Duration::from_secs(30);
        assert_eq!(h.stalled_at(9_000, every), None);
        let late = h.stalled_at(11_000, every).expect("sampler silent 11 s");
        assert!(
            late.contains("queue sampler") && !late.contains("rescan"),
            "{late}"
        );
        h.sampled.store(60_000, Ordering::Relaxed);
        assert_eq!(
            h.stalled_at(60_000, every),
            None,
            "rescan 60 s ago is within 30 + 30"
        );
        let late = h.stalled_at(61_000, every).expect("rescan silent 61 s");
        assert!(
            late.contains("rescan (every 30s)") && !late.contains("sampler"),
            "{late}"
        );
        h.scanned.store(61_000, Ordering::Relaxed);
        assert_eq!(h.stalled_at(61_000, every), None);
    }
}
