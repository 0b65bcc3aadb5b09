//! Client impact over the last five minutes, for `doctor`: "312 connections waited and 41
//! never connected in the last 5 min" tells an operator whether the damage is going on
//! now, which the counters since start (a daemon up for weeks) cannot. Prometheus users
//! have `increase(...[5m])`; the JSON API's clients have no history but this one.
//!
//! Every [`EVERY`] the daemon's sampler records each listener's cumulative client-impact
//! counters; a snapshot subtracts the newest record at least [`WINDOW`] old (the oldest,
//! from the daemon's start, while it is younger). Only listeners with some impact are
//! recorded: a host with 10k quiet listeners keeps nothing.

use std::{
    collections::VecDeque,
    time::{Duration, Instant},
};

use backlogd_common::{DELAY_BUCKETS, ListenerStats, cause};

use crate::api::{ClientImpact, RecentImpact};

/// By socket inode: kernel-made keys, a fast hash suits (as the scrape's `ByInode`).
type ByInode<V> = foldhash::HashMap<u64, V>;

/// How far back the recent figures reach.
pub const WINDOW: Duration = Duration::from_secs(300);

/// How often the sampler records: the window a snapshot reports is WINDOW to
/// WINDOW + EVERY long.
pub const EVERY: Duration = Duration::from_secs(10);

/// A listener's cumulative client-impact counters (those of [`ListenerStats`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    pub delayed: [u64; cause::COUNT],
    pub delay: [u64; DELAY_BUCKETS + 1],
    pub delay_sum_ns: u64,
    pub abandoned: u64,
}

impl Counts {
    pub fn of(s: &ListenerStats) -> Self {
        Self {
            delayed: s.delayed,
            delay: s.delay,
            delay_sum_ns: s.delay_sum_ns,
            abandoned: s.abandoned,
        }
    }

    fn is_zero(&self) -> bool {
        *self == Self::default()
    }

    fn fields(&self) -> impl Iterator<Item = u64> + '_ {
        self.delayed
            .iter()
            .chain(&self.delay)
            .chain([&self.delay_sum_ns, &self.abandoned])
            .copied()
    }

    /// What was counted after `base`. The counters only grow: one below its base belongs
    /// to a new listener that took a closed one's inode, and all of its counts are recent.
    fn since(&self, base: &Self) -> Self {
        if self
            .fields()
            .zip(base.fields())
            .any(|(now, then)| now < then)
        {
            return *self;
        }
        Self {
            delayed: std::array::from_fn(|i| self.delayed[i] - base.delayed[i]),
            delay: std::array::from_fn(|i| self.delay[i] - base.delay[i]),
            delay_sum_ns: self.delay_sum_ns - base.delay_sum_ns,
            abandoned: self.abandoned - base.abandoned,
        }
    }
}

/// The records of the last [`WINDOW`] (and the one just before it).
#[derive(Debug, Default)]
pub struct ImpactHistory {
    records: VecDeque<(Instant, ByInode<Counts>)>,
}

impl ImpactHistory {
    /// Records the cumulative counters of every listener in `stats` as of `now`, and forgets
    /// the records no snapshot after `now` subtracts.
    pub fn record<'a>(
        &mut self,
        now: Instant,
        stats: impl IntoIterator<Item = (u64, &'a ListenerStats)>,
    ) {
        let counts = stats
            .into_iter()
            .map(|(inode, s)| (inode, Counts::of(s)))
            .filter(|(_, c)| !c.is_zero())
            .collect();
        self.records.push_back((now, counts));
        // The newest record at least WINDOW old is the one subtracted: those before it
        // are not needed again.
        while self
            .records
            .get(1)
            .is_some_and(|(at, _)| now.saturating_duration_since(*at) >= WINDOW)
        {
            self.records.pop_front();
        }
    }

    /// The record a snapshot at `now` subtracts: the newest at least WINDOW old, else the
    /// oldest. None before the first record.
    fn base(&self, now: Instant) -> Option<&(Instant, ByInode<Counts>)> {
        self.records
            .iter()
            .rev()
            .find(|(at, _)| now.saturating_duration_since(*at) >= WINDOW)
            .or_else(|| self.records.front())
    }

    /// A reader of the recent figures as of `now`.
    pub fn at(&self, now: Instant) -> Recent<'_> {
        Recent {
            base: self.base(now),
            now,
        }
    }
}

/// The recent figures as of one instant.
pub struct Recent<'a> {
    base: Option<&'a (Instant, ByInode<Counts>)>,
    now: Instant,
}

impl Recent<'_> {
    /// What listener `inode`, whose counters are now `current`, cost its clients since the
    /// base record. Nothing (a zero window) before the first record.
    pub fn of(&self, inode: u64, current: &ListenerStats) -> RecentImpact {
        let Some((at, counts)) = self.base else {
            return RecentImpact::default();
        };
        let base = counts.get(&inode).copied().unwrap_or_default();
        let c = Counts::of(current).since(&base);
        RecentImpact {
            window_seconds: self.now.saturating_duration_since(*at).as_secs_f64(),
            impact: ClientImpact::of(c.delayed, c.delay, c.delay_sum_ns, c.abandoned),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(syn_drop: u64, abandoned: u64) -> ListenerStats {
        let mut s = ListenerStats::default();
        s.delayed[cause::SYN_DROP as usize] = syn_drop;
        // All in the bucket up to 1.5 s, each 1 s.
        s.delay[1] = syn_drop;
        s.delay_sum_ns = syn_drop * 1_000_000_000;
        s.abandoned = abandoned;
        s
    }

    fn figures(r: &RecentImpact) -> (u64, u64, u64, f64) {
        (
            r.impact.delayed_syn_drop,
            r.impact.delay.get(1).map_or(0, |b| b.count),
            r.impact.abandoned,
            r.window_seconds,
        )
    }

    #[test]
    fn before_any_record_the_window_is_empty() {
        let h = ImpactHistory::default();
        let r = h.at(Instant::now()).of(7, &stats(3, 1));
        assert_eq!(figures(&r), (0, 0, 0, 0.0));
    }

    #[test]
    fn a_young_daemon_subtracts_what_was_counted_at_its_start() {
        let t0 = Instant::now();
        let mut h = ImpactHistory::default();
        // Pinned maps: listener 7 had figures before this daemon started.
        h.record(t0, [(7, &stats(2, 1))]);
        h.record(t0 + EVERY, [(7, &stats(5, 1)), (8, &stats(4, 0))]);
        let now = t0 + Duration::from_secs(25);
        let recent = h.at(now);
        assert_eq!(figures(&recent.of(7, &stats(6, 3))), (4, 4, 2, 25.0));
        // Not in the start's record: it had nothing then.
        assert_eq!(figures(&recent.of(8, &stats(4, 0))), (4, 4, 0, 25.0));
    }

    #[test]
    fn the_window_slides_and_keeps_only_what_it_subtracts() {
        let t0 = Instant::now();
        let mut h = ImpactHistory::default();
        // A record every EVERY for 10 minutes; listener 7 gains one delayed connection
        // per record.
        let records = 2 * WINDOW.as_secs() / EVERY.as_secs();
        for i in 0..=records {
            h.record(t0 + EVERY * i as u32, [(7, &stats(i, 0))]);
        }
        let last = t0 + EVERY * records as u32;
        // The base is the record exactly WINDOW old: the last WINDOW / EVERY increments.
        let per_window = WINDOW.as_secs() / EVERY.as_secs();
        assert_eq!(
            figures(&h.at(last).of(7, &stats(records, 0))),
            (per_window, per_window, 0, WINDOW.as_secs_f64())
        );
        // Kept: that base and the records after it.
        assert_eq!(h.records.len() as u64, per_window + 1);
        // Between records the base stays until the next one is WINDOW old.
        let later = last + EVERY / 2;
        assert_eq!(
            figures(&h.at(later).of(7, &stats(records, 0))),
            (
                per_window,
                per_window,
                0,
                (WINDOW + EVERY / 2).as_secs_f64()
            )
        );
    }

    #[test]
    fn quiet_listeners_are_not_recorded_and_a_reused_inode_starts_over() {
        let t0 = Instant::now();
        let mut h = ImpactHistory::default();
        h.record(t0, [(7, &stats(9, 2)), (8, &ListenerStats::default())]);
        assert_eq!(
            h.records[0].1.len(),
            1,
            "the quiet listener 8 takes no room"
        );
        // Inode 7 closed and a new listener took it: its counters restarted below the
        // base. It shows all it has, not a wrapped (or clamped) subtraction.
        let r = h.at(t0 + EVERY).of(7, &stats(1, 0));
        assert_eq!(figures(&r), (1, 1, 0, EVERY.as_secs_f64()));
    }
}
