//! The last five minutes, for `doctor` and `top`: "312 connections waited and 41 never
//! connected in the last 5 min" tells an operator whether the damage is going on now, which
//! the counters since start (a daemon up for weeks) cannot. Prometheus users have
//! `increase(...[5m])`; the JSON API's clients have no history but this one. Three
//! histories are kept this way: each listener's client-impact counters, each listener's
//! drops and syncookies by source prefix (`crate::sources`), and each network namespace's
//! syncookies sent and returned (TcpExt, [`Cookies`]).
//!
//! About every [`EVERY`] the daemon's sampler records the time, and each key's cumulative
//! counters where they changed since its last record. A snapshot subtracts each key's
//! counters as of the newest record at least [`WINDOW`] old (the daemon's first, at its
//! start, while it is younger). A key costs nothing until it counts something, then one
//! entry, plus one per record its counters changed at within the window. A key the kernel
//! no longer counts (a closed listener, an expired prefix) gets a zero record and is kept
//! until no snapshot subtracts a value of its: a snapshot then knows it went away after its
//! window began ([`Bases::gone`]), and that a key of that name now is a new one.

use std::{
    collections::VecDeque,
    hash::Hash,
    time::{Duration, Instant},
};

use backlogd_common::{DELAY_BUCKETS, ListenerStats, SourceKey, cause};

pub use crate::api::Syncookies as Cookies;
use crate::{
    api::{ClientImpact, ImpactWindow},
    sources::Tally,
};

/// How far back the recent figures reach.
pub const WINDOW: Duration = Duration::from_secs(300);

/// How often the sampler records: a window is WINDOW to WINDOW + EVERY long (longer only
/// when the sampler was held up).
pub const EVERY: Duration = Duration::from_secs(10);

/// Counters that only grow, as a history records them.
pub trait Cumulative: Copy + Default + PartialEq {
    /// What was counted after `base`. The counters only grow: one below its base belongs
    /// to a new key that took a gone one's place (a closed listener's inode reused, a
    /// forgotten prefix counted again), and all of its counts are recent.
    fn since(&self, base: &Self) -> Self;

    fn is_zero(&self) -> bool {
        *self == Self::default()
    }
}

impl Cumulative for Tally {
    fn since(&self, base: &Self) -> Self {
        if self.iter().zip(base).any(|(now, then)| now < then) {
            return *self;
        }
        std::array::from_fn(|i| self[i] - base[i])
    }
}

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

    fn fields(&self) -> impl Iterator<Item = u64> + '_ {
        self.delayed
            .iter()
            .chain(&self.delay)
            .chain([&self.delay_sum_ns, &self.abandoned])
            .copied()
    }

    fn impact(&self) -> ClientImpact {
        ClientImpact::of(self.delayed, self.delay, self.delay_sum_ns, self.abandoned)
    }
}

impl Cumulative for Counts {
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

/// A network namespace's syncookies as its TcpExt counters give them (absent ones count
/// 0): `TCPReqQFullDoCookies` sent, `SyncookiesRecv` returned.
pub fn cookies_of(tcpext: &std::collections::HashMap<String, u64>) -> Cookies {
    let get = |name: &str| tcpext.get(name).copied().unwrap_or(0);
    Cookies {
        sent: get("TCPReqQFullDoCookies"),
        returned: get("SyncookiesRecv"),
    }
}

impl Cumulative for Cookies {
    fn since(&self, base: &Self) -> Self {
        if self.sent < base.sent || self.returned < base.returned {
            return *self;
        }
        Self {
            sent: self.sent - base.sent,
            returned: self.returned - base.returned,
        }
    }
}

/// One key's counters where they changed, oldest first.
#[derive(Debug)]
struct Changes<C> {
    /// The record that last saw the key in the kernel's counters.
    seen: Option<Instant>,
    points: VecDeque<(Instant, C)>,
}

impl<C> Default for Changes<C> {
    fn default() -> Self {
        Self {
            seen: None,
            points: VecDeque::new(),
        }
    }
}

impl<C: Cumulative> Changes<C> {
    /// The counters as of `at` (the last change at or before it; None before the first),
    /// and whether the key went away after it (a zero record).
    fn at(&self, at: Instant) -> Option<(C, bool)> {
        let base = self
            .points
            .iter()
            .rev()
            .find(|(when, _)| *when <= at)
            .map(|(_, c)| *c)?;
        let gone = self
            .points
            .iter()
            .any(|(when, c)| *when > at && c.is_zero());
        Some((base, gone))
    }
}

/// The records of one kind of counters, by key `K` (kernel-made keys: a fast hash suits,
/// as the scrape's `ByInode` in `exporter/figures.rs`).
#[derive(Debug)]
pub struct History<K, C> {
    /// The daemon's first record.
    start: Option<Instant>,
    /// The records a snapshot after the last one may subtract, oldest first.
    records: VecDeque<Instant>,
    changes: foldhash::HashMap<K, Changes<C>>,
}

impl<K, C> Default for History<K, C> {
    fn default() -> Self {
        Self {
            start: None,
            records: VecDeque::new(),
            changes: foldhash::HashMap::default(),
        }
    }
}

/// Client impact by listener inode.
pub type ImpactHistory = History<u64, Counts>;

/// Drops and syncookies by listener and source prefix (with each listener's expired and
/// untracked counts under their own keys, `crate::sources`).
pub type SourceHistory = History<SourceKey, Tally>;

/// Syncookies by network namespace inode.
pub type CookieHistory = History<u32, Cookies>;

/// The histories, recorded at the same instants, so their windows are one.
#[derive(Debug, Default)]
pub struct Histories {
    pub impact: ImpactHistory,
    pub sources: SourceHistory,
    pub cookies: CookieHistory,
}

impl<K: Hash + Eq + Copy, C: Cumulative> History<K, C> {
    /// Whether a record is due at `now` (EVERY after the last).
    pub fn due(&self, now: Instant) -> bool {
        self.records
            .back()
            .is_none_or(|last| now.saturating_duration_since(*last) >= EVERY)
    }

    /// Records the cumulative counters of every key in `counters` as of `now`, and forgets
    /// what no snapshot after `now` subtracts.
    pub fn record(&mut self, now: Instant, counters: impl IntoIterator<Item = (K, C)>) {
        self.start.get_or_insert(now);
        self.records.push_back(now);
        // Later snapshots subtract the newest record at least WINDOW old, or a newer one:
        // the records before it are not needed again.
        while self
            .records
            .get(1)
            .is_some_and(|at| now.saturating_duration_since(*at) >= WINDOW)
        {
            self.records.pop_front();
        }
        let oldest = self.records[0];
        for (key, counts) in counters {
            if counts.is_zero() && !self.changes.contains_key(&key) {
                continue;
            }
            let changes = self.changes.entry(key).or_default();
            changes.seen = Some(now);
            if changes
                .points
                .back()
                .is_none_or(|(_, last)| *last != counts)
            {
                changes.points.push_back((now, counts));
            }
            // Its value at the oldest record is its last change at or before it.
            while changes.points.get(1).is_some_and(|(at, _)| *at <= oldest) {
                changes.points.pop_front();
            }
        }
        // Gone: a zero record, kept while a snapshot may subtract a value from before it.
        for c in self.changes.values_mut().filter(|c| c.seen != Some(now)) {
            if c.points.back().is_some_and(|(_, last)| !last.is_zero()) {
                c.points.push_back((now, C::default()));
            }
            while c.points.get(1).is_some_and(|(at, _)| *at <= oldest) {
                c.points.pop_front();
            }
        }
        self.changes
            .retain(|_, c| c.seen == Some(now) || c.points.iter().any(|(_, p)| !p.is_zero()));
    }

    /// What a snapshot at `now` subtracts (None before the first record). Copied out, so the
    /// history's lock is held for the keys that counted something only.
    pub fn at(&self, now: Instant) -> Option<Bases<K, C>> {
        let base = self
            .records
            .iter()
            .rev()
            .find(|at| now.saturating_duration_since(**at) >= WINDOW)
            .or_else(|| self.records.front())
            .copied()?;
        Some(Bases {
            window: ImpactWindow {
                window_seconds: now.saturating_duration_since(base).as_secs_f64(),
                since_start: Some(base) == self.start,
            },
            bases: self
                .changes
                .iter()
                .filter_map(|(key, c)| Some((*key, c.at(base)?)))
                .collect(),
        })
    }
}

/// The counters one snapshot subtracts.
#[derive(Debug)]
pub struct Bases<K, C> {
    pub window: ImpactWindow,
    /// Each key's counters at the window's start, and whether it went away since.
    bases: foldhash::HashMap<K, (C, bool)>,
}

impl<K: Hash + Eq, C: Cumulative> Bases<K, C> {
    /// What key `key`, whose counters are now `current`, counted in the window: all of
    /// them if the key went away since the window began (a key of that name now is new).
    pub fn since(&self, key: &K, current: &C) -> C {
        match self.bases.get(key) {
            Some((base, false)) => current.since(base),
            _ => *current,
        }
    }

    /// [`Self::since`] for a key whose counters only ever grow while it lives and that
    /// may miss records (a network namespace whose counters could not be read for a
    /// while): its base stands even if a record missed it; a key that is really new
    /// (a reused namespace inode) starts below its base and counts whole.
    pub fn since_kept(&self, key: &K, current: &C) -> C {
        match self.bases.get(key) {
            Some((base, _)) => current.since(base),
            None => *current,
        }
    }

    /// The keys that went away since the window began, with their counters at its start.
    pub fn gone(&self) -> impl Iterator<Item = (&K, &C)> {
        self.bases
            .iter()
            .filter(|(_, (_, gone))| *gone)
            .map(|(k, (c, _))| (k, c))
    }
}

/// The client-impact counters one snapshot subtracts.
pub type Recent = Bases<u64, Counts>;

impl Recent {
    /// What listener `inode`, whose counters are now `current`, cost its clients in the
    /// window: None when nothing.
    pub fn of(&self, inode: u64, current: &ListenerStats) -> Option<ClientImpact> {
        let recent = self.since(&inode, &Counts::of(current));
        (!recent.is_zero()).then(|| recent.impact())
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

    /// (delayed after a SYN drop, in the 1.5 s bucket, abandoned) in the window.
    fn figures(r: &Recent, inode: u64, now: &ListenerStats) -> (u64, u64, u64) {
        r.of(inode, now).map_or((0, 0, 0), |i| {
            (i.delayed_syn_drop, i.delay[1].count, i.abandoned)
        })
    }

    #[test]
    fn before_any_record_there_is_no_window() {
        assert!(ImpactHistory::default().at(Instant::now()).is_none());
    }

    #[test]
    fn a_young_daemon_subtracts_what_was_counted_at_its_start() {
        let t0 = Instant::now();
        let mut h = ImpactHistory::default();
        // Pinned maps: listener 7 had figures before this daemon started.
        h.record(t0, [(7, Counts::of(&stats(2, 1)))]);
        h.record(
            t0 + EVERY,
            [(7, Counts::of(&stats(5, 1))), (8, Counts::of(&stats(4, 0)))],
        );
        let r = h.at(t0 + Duration::from_secs(25)).unwrap();
        assert_eq!(
            r.window,
            ImpactWindow {
                window_seconds: 25.0,
                since_start: true
            }
        );
        assert_eq!(figures(&r, 7, &stats(6, 3)), (4, 4, 2));
        // Not in the start's record: it had nothing then.
        assert_eq!(figures(&r, 8, &stats(4, 0)), (4, 4, 0));
        // Nothing since: no figures at all.
        assert!(r.of(7, &stats(2, 1)).is_none());
    }

    #[test]
    fn the_window_slides_and_keeps_only_what_it_subtracts() {
        let t0 = Instant::now();
        let mut h = ImpactHistory::default();
        // A record every EVERY for 10 minutes; listener 7 gains one delayed connection
        // per record, listener 9 one at the start only.
        let records = 2 * WINDOW.as_secs() / EVERY.as_secs();
        for i in 0..=records {
            let at = t0 + EVERY * i as u32;
            assert!(h.due(at));
            h.record(
                at,
                [(7, Counts::of(&stats(i, 0))), (9, Counts::of(&stats(1, 0)))],
            );
            assert!(!h.due(at + EVERY / 2));
        }
        let last = t0 + EVERY * records as u32;
        // The base is the record exactly WINDOW old: the last WINDOW / EVERY increments.
        let per_window = WINDOW.as_secs() / EVERY.as_secs();
        let r = h.at(last).unwrap();
        assert_eq!(
            r.window,
            ImpactWindow {
                window_seconds: WINDOW.as_secs_f64(),
                since_start: false
            }
        );
        assert_eq!(
            figures(&r, 7, &stats(records, 0)),
            (per_window, per_window, 0)
        );
        assert_eq!(figures(&r, 9, &stats(1, 0)), (0, 0, 0));
        // Kept: the records from that base on; 7's changes from it on, 9's one change.
        assert_eq!(h.records.len() as u64, per_window + 1);
        assert_eq!(h.changes[&7].points.len() as u64, per_window + 1);
        assert_eq!(h.changes[&9].points.len(), 1);
        // Between records the base stays until the next one is WINDOW old.
        let r = h.at(last + EVERY / 2).unwrap();
        assert_eq!(r.window.window_seconds, (WINDOW + EVERY / 2).as_secs_f64());
        assert_eq!(
            figures(&r, 7, &stats(records, 0)),
            (per_window, per_window, 0)
        );
    }

    #[test]
    fn quiet_and_closed_listeners_take_no_room_and_a_reused_inode_starts_over() {
        let t0 = Instant::now();
        let mut h = ImpactHistory::default();
        h.record(t0, [(7, Counts::of(&stats(9, 2))), (8, Counts::default())]);
        assert_eq!(h.changes.len(), 1, "the quiet listener 8 takes no room");
        // Inode 7 closed and a new listener took it: its counters restarted below the
        // base. It shows all it has, not a wrapped (or clamped) subtraction.
        let r = h.at(t0 + EVERY).unwrap();
        assert_eq!(figures(&r, 7, &stats(1, 0)), (1, 1, 0));
        // Gone from the kernel's counters: a zero record, kept while a window may start
        // before it, then forgotten.
        h.record(t0 + EVERY, [(8, Counts::default())]);
        assert_eq!(h.changes.len(), 1);
        let r = h.at(t0 + WINDOW).unwrap();
        assert_eq!(
            r.gone().count(),
            1,
            "gone since the window's start, the first record"
        );
        assert_eq!(
            figures(&r, 7, &stats(1, 0)),
            (1, 1, 0),
            "a new listener on inode 7"
        );
        for i in 2..=(WINDOW.as_secs() / EVERY.as_secs() + 2) as u32 {
            h.record(t0 + EVERY * i, [(8, Counts::default())]);
        }
        assert!(h.changes.is_empty());
    }

    /// A prefix that expires inside the window: its base stays known, so the window
    /// subtracts it from what its expiry moved into the listener's expired counts.
    #[test]
    fn a_key_gone_inside_the_window_is_reported_with_its_base() {
        let t0 = Instant::now();
        let mut h: History<u32, [u64; 5]> = History::default();
        // Prefix 1 held 10 before the window; 3 more in it; then it expired, its 13 going
        // to the expired key 0.
        h.record(t0, [(1, [10, 0, 0, 0, 0])]);
        h.record(t0 + EVERY, [(1, [13, 0, 0, 0, 0])]);
        h.record(t0 + EVERY * 2, [(0, [13, 0, 0, 0, 0])]);
        let b = h.at(t0 + WINDOW).unwrap();
        assert_eq!(b.gone().collect::<Vec<_>>(), [(&1, &[10, 0, 0, 0, 0])]);
        // The expired key was new in the window: all of its 13 count, less the 10 from
        // before the window, the 3 prefix 1 sent in it.
        assert_eq!(b.since(&0, &[13, 0, 0, 0, 0]), [13, 0, 0, 0, 0]);
        // Prefix 1 again, a new entry: all of it is recent.
        assert_eq!(b.since(&1, &[2, 0, 0, 0, 0]), [2, 0, 0, 0, 0]);
    }
}
