//! Who is being dropped: each listener's dropped and syncookie-answered segments by source
//! prefix, as the kernel counted them in DROP_SOURCES (`backlogd-ebpf/src/sources.rs`),
//! summarised per listener for the JSON API and `/metrics`.
//!
//! The kernel's counts are exact for every prefix that holds a slot of the map; what found
//! no slot is in the listener's `untracked_source` counters. The daemon forgets a prefix
//! `drop_source_retention` after its newest segment (`KernelMaps::expire_drop_sources`),
//! adding its counts to the listener's expired entry. So for every listener the prefixes,
//! the expired and the untracked counts add up to its drops and syncookies.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use backlogd_common::{ListenerStats, SourceCounts, SourceKey, source};
use serde::{Deserialize, Serialize};

/// By listener inode: the exporters' `ByInode`, spelled out so this module (which the API
/// types use) does not depend on the exporters.
type ByInode<V> = foldhash::HashMap<u64, V>;

/// Most prefixes per listener the JSON API lists, most drops and cookies first.
pub const TOP: usize = 10;

/// At most this share of a flood's dropped attempts connect (spoofed sources never do):
/// doctor's line between a flood and real clients, for a listener and for a prefix.
pub const FLOOD_CONNECTED_AT_MOST: f64 = 0.05;

/// Segments of one prefix (or untracked), by what happened to them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counts {
    /// SYNs dropped (any reason).
    pub syn_drops: u64,
    /// Final ACKs (or other segments after the SYN) dropped.
    pub final_ack_drops: u64,
    /// SYNs answered with a syncookie.
    pub cookies: u64,
    /// Connection attempts with a dropped segment, each once (client impact's: none for
    /// untracked drops, whose prefix is unknown).
    #[serde(default)]
    pub attempts: u64,
    /// Of those, attempts that connected on a retry within `client_impact_horizon`.
    #[serde(default)]
    pub connected: u64,
}

impl Counts {
    pub fn of(t: &Tally) -> Self {
        Self {
            syn_drops: t[source::SYN_DROP],
            final_ack_drops: t[source::ACK_DROP],
            cookies: t[source::COOKIE],
            attempts: t[ATTEMPTS],
            connected: t[CONNECTED],
        }
    }

    /// Whether these attempts connect more often than a flood's (more than
    /// [`FLOOD_CONNECTED_AT_MOST`] of them): real clients, whom no rule should drop.
    pub fn connect(&self) -> bool {
        self.connected as f64 > FLOOD_CONNECTED_AT_MOST * self.attempts as f64
    }

    fn add(&mut self, other: &Self) {
        self.syn_drops += other.syn_drops;
        self.final_ack_drops += other.final_ack_drops;
        self.cookies += other.cookies;
        self.attempts += other.attempts;
        self.connected += other.connected;
    }

    pub fn drops(&self) -> u64 {
        self.syn_drops + self.final_ack_drops
    }

    pub fn total(&self) -> u64 {
        self.drops() + self.cookies
    }
}

/// One source prefix of a listener.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Source {
    /// The prefix at the configured length (`drop_source_prefix_v4` / `_v6`), e.g.
    /// `192.0.2.0/24`; never a longer one.
    pub prefix: String,
    #[serde(flatten)]
    pub counts: Counts,
    /// Its part of the drops and cookies the listener's prefixes hold, 0 to 1.
    pub share: f64,
    /// Seconds since its newest segment was counted.
    pub last_seen_seconds_ago: f64,
}

/// A listener's drops and syncookies by source, since the kernel began counting them
/// (the daemon's start, or a pinned state it adopted).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DropSources {
    /// Distinct prefixes counted: exact, each holds a slot of the kernel's map.
    pub prefixes: u64,
    /// Segments counted under a prefix, summed.
    pub counted: Counts,
    /// Segments of prefixes forgotten `drop_source_retention` after their newest segment
    /// (client addresses are kept no longer): counted, no longer by prefix.
    #[serde(default)]
    pub expired: Counts,
    /// Segments no prefix holds: the map was full when their prefix was new, or the
    /// segment was gone before its source was read. `counted`, `expired` and `untracked`
    /// add up to every drop and cookie of the listener.
    pub untracked: Counts,
    /// The largest prefix's share (0 when none).
    pub top_share: f64,
    /// The prefixes with the most drops and cookies, up to [`TOP`]; absent when the
    /// addresses are withheld from the reader (`withheld`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top: Option<Vec<Source>>,
    /// True when `top` was left out because the reader is not on this host and
    /// `drop_source_addresses_remote` is off: client addresses are personal data.
    #[serde(default)]
    pub withheld: bool,
    /// With `withheld`: whether the largest prefix's own dropped attempts connect
    /// ([`Counts::connect`]), so a finding made from the withheld view writes no rule
    /// against it either.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub largest_connects: bool,
    /// The same figures over the snapshot's `impact_window` (the last five minutes):
    /// `prefixes` those with a segment in it. Absent before the daemon's first record and
    /// from older daemons.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recent: Option<Box<DropSources>>,
}

impl DropSources {
    /// Leaves out the addresses (see `withheld`).
    pub fn withhold(&mut self) {
        if let Some(top) = self.top.take() {
            self.withheld = true;
            self.largest_connects = top.first().is_some_and(|s| s.counts.connect());
        }
        if let Some(recent) = &mut self.recent {
            recent.withhold();
        }
    }

    /// Every drop and cookie: under a prefix, expired or untracked.
    pub fn all(&self) -> Counts {
        let mut all = self.counted;
        all.add(&self.expired);
        all.add(&self.untracked);
        all
    }

    /// The largest prefix and its share, "192.0.2.0/24 41%", or its share alone when the
    /// addresses are withheld; None without prefixes.
    pub fn largest(&self) -> Option<String> {
        match self.top.as_ref().and_then(|t| t.first()) {
            Some(s) => Some(format!("{} {:.0}%", s.prefix, s.share * 100.0)),
            None if self.withheld && self.prefixes > 0 => Some(format!(
                "{:.0}% (its address withheld from readers not on the host)",
                self.top_share * 100.0
            )),
            None => None,
        }
    }

    fn is_empty(&self) -> bool {
        self.prefixes == 0 && self.expired.total() == 0 && self.untracked.total() == 0
    }
}

/// One key's counts by [`source`] index, then its attempts and connected ones
/// ([`ATTEMPTS`], [`CONNECTED`]): what the recent figures' history records.
pub type Tally = [u64; source::COUNT + 2];
pub const ATTEMPTS: usize = source::COUNT;
pub const CONNECTED: usize = source::COUNT + 1;

/// An entry's [`Tally`].
pub fn tally_of(c: &SourceCounts) -> Tally {
    let [syn, ack, cookie] = c.counts;
    [syn, ack, cookie, c.attempts, c.connected]
}

/// A listener's untracked counts as a [`Tally`] (no attempts: no prefix to count them on).
pub fn untracked_tally(s: &ListenerStats) -> Tally {
    let [syn, ack, cookie] = s.untracked_source;
    [syn, ack, cookie, 0, 0]
}

/// The history's key for a listener's untracked counts (the kernel keeps them in the
/// listener's counters, not in DROP_SOURCES): a version no map entry has.
pub fn untracked_key(listener_ino: u64) -> SourceKey {
    SourceKey {
        listener_ino,
        version: u8::MAX,
        ..SourceKey::default()
    }
}

/// What each key of the history counted over the recent window, given its counts now.
pub type Since<'a> = &'a dyn Fn(&SourceKey, &Tally) -> Tally;

/// The recent window, as [`summarise`] needs it.
#[derive(Clone, Copy)]
pub struct Window<'a> {
    pub since: Since<'a>,
    /// Per listener: the counts, at the window's start, of its prefixes expired since. All
    /// of an expired prefix's counts went to the expired entry, those from before the
    /// window too, which the window's expired counts must not include.
    pub expired_before: &'a ByInode<Tally>,
}

/// `key`'s prefix as text: `192.0.2.0/24`, `2001:db8::/48`.
pub fn prefix_text(key: &SourceKey) -> String {
    let addr = if key.version == 4 {
        let [a, b, c, d, ..] = key.prefix;
        IpAddr::V4(Ipv4Addr::new(a, b, c, d))
    } else {
        IpAddr::V6(Ipv6Addr::from(key.prefix))
    };
    format!("{addr}/{}", key.prefix_len)
}

/// One listener's entries of the map, apart.
#[derive(Default)]
struct Entries {
    /// Each prefix's key, counts and newest segment time.
    prefixes: Vec<(SourceKey, Tally, u64)>,
    expired: Tally,
}

/// Every listener's sources from one read of the map (`entries`) and of its counters
/// (`stats`, for the untracked counts), `now_ns` being the programs' clock
/// (CLOCK_MONOTONIC) at the read, with the recent window's figures where `recent` gives
/// them. A listener with neither prefixes nor expired nor untracked counts is absent.
pub fn summarise(
    entries: Vec<(SourceKey, SourceCounts)>,
    stats: &ByInode<ListenerStats>,
    now_ns: u64,
    recent: Option<Window<'_>>,
) -> ByInode<DropSources> {
    let mut by_listener: ByInode<Entries> = ByInode::default();
    for (key, counts) in entries {
        let e = by_listener.entry(key.listener_ino).or_default();
        if key.version == SourceKey::EXPIRED {
            e.expired = tally_of(&counts);
        } else {
            e.prefixes.push((key, tally_of(&counts), counts.last_ns));
        }
    }
    for (ino, s) in stats {
        if s.untracked_source.iter().any(|&n| n > 0) {
            by_listener.entry(*ino).or_default();
        }
    }
    by_listener
        .into_iter()
        .filter_map(|(ino, e)| {
            let untracked = stats.get(&ino).map_or([0; 5], untracked_tally);
            let mut all = tally(&e.prefixes, e.expired, untracked, now_ns);
            if all.is_empty() {
                return None;
            }
            all.recent = recent.map(
                |Window {
                     since,
                     expired_before,
                 }| {
                    let prefixes: Vec<_> = e
                        .prefixes
                        .iter()
                        .map(|(k, t, last)| (*k, since(k, t), *last))
                        // Quiet in the window: not one of its prefixes. (Only a drop or a
                        // cookie counts: a completion alone is not a segment from it.)
                        .filter(|(_, t, _)| Counts::of(t).total() > 0)
                        .collect();
                    let before = expired_before.get(&ino).copied().unwrap_or_default();
                    let expired = since(&SourceKey::expired(ino), &e.expired);
                    Box::new(tally(
                        &prefixes,
                        std::array::from_fn(|i| expired[i].saturating_sub(before[i])),
                        since(&untracked_key(ino), &untracked),
                        now_ns,
                    ))
                },
            );
            Some((ino, all))
        })
        .collect()
}

/// One listener's figures from its prefixes and its expired and untracked counts.
fn tally(
    prefixes: &[(SourceKey, Tally, u64)],
    expired: Tally,
    untracked: Tally,
    now_ns: u64,
) -> DropSources {
    let mut prefixes: Vec<(&SourceKey, Counts, u64)> = prefixes
        .iter()
        .map(|(k, t, last)| (k, Counts::of(t), *last))
        .collect();
    let total: u64 = prefixes.iter().map(|(_, c, _)| c.total()).sum();
    // Most first; equal counts by prefix, so the order is stable between reads.
    prefixes.sort_by(|(ka, a, _), (kb, b, _)| {
        b.total()
            .cmp(&a.total())
            .then_with(|| (ka.version, ka.prefix).cmp(&(kb.version, kb.prefix)))
    });
    let share = |n: u64| {
        if total == 0 {
            0.0
        } else {
            n as f64 / total as f64
        }
    };
    let mut counted = Counts::default();
    for (_, c, _) in &prefixes {
        counted.add(c);
    }
    DropSources {
        prefixes: prefixes.len() as u64,
        counted,
        expired: Counts::of(&expired),
        untracked: Counts::of(&untracked),
        top_share: prefixes.first().map_or(0.0, |(_, c, _)| share(c.total())),
        top: Some(
            prefixes
                .iter()
                .take(TOP)
                .map(|(k, counts, last)| Source {
                    prefix: prefix_text(k),
                    counts: *counts,
                    share: share(counts.total()),
                    last_seen_seconds_ago: now_ns.saturating_sub(*last) as f64 / 1e9,
                })
                .collect(),
        ),
        withheld: false,
        largest_connects: false,
        recent: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(ino: u64, version: u8, prefix: [u8; 16], len: u8) -> SourceKey {
        SourceKey {
            listener_ino: ino,
            prefix,
            version,
            prefix_len: len,
            _pad: [0; 6],
        }
    }

    fn v4(a: u8, b: u8, c: u8) -> [u8; 16] {
        let mut p = [0; 16];
        p[..3].copy_from_slice(&[a, b, c]);
        p
    }

    fn counts(syn: u64, ack: u64, cookies: u64, last_ns: u64) -> SourceCounts {
        SourceCounts {
            counts: [syn, ack, cookies],
            last_ns,
            ..SourceCounts::default()
        }
    }

    #[test]
    fn prefixes_are_written_at_their_length() {
        assert_eq!(prefix_text(&key(1, 4, v4(192, 0, 2), 24)), "192.0.2.0/24");
        let mut six = [0u8; 16];
        six[..6].copy_from_slice(&[0x20, 0x01, 0x0d, 0xb8, 0, 7]);
        assert_eq!(prefix_text(&key(1, 6, six, 48)), "2001:db8:7::/48");
    }

    #[test]
    fn each_listener_gets_its_prefixes_most_first_with_shares_and_untracked() {
        let mut stats = ByInode::default();
        let untracked = |untracked_source| ListenerStats {
            untracked_source,
            ..ListenerStats::default()
        };
        stats.insert(7, untracked([2, 0, 1]));
        // A listener with untracked counts only, and one with nothing at all.
        stats.insert(8, untracked([0, 3, 0]));
        stats.insert(9, ListenerStats::default());
        let now = 10_000_000_000;
        let got = summarise(
            vec![
                (
                    key(7, 4, v4(10, 0, 1), 24),
                    counts(1, 0, 0, now - 1_000_000_000),
                ),
                (key(7, 4, v4(10, 0, 2), 24), counts(5, 1, 0, now)),
                (key(7, 4, v4(10, 0, 3), 24), counts(0, 0, 3, now)),
            ],
            &stats,
            now,
            None,
        );
        let l = &got[&7];
        assert_eq!(l.prefixes, 3);
        assert_eq!(
            l.counted,
            Counts {
                syn_drops: 6,
                final_ack_drops: 1,
                cookies: 3,
                ..Counts::default()
            }
        );
        assert_eq!(
            l.untracked,
            Counts {
                syn_drops: 2,
                final_ack_drops: 0,
                cookies: 1,
                ..Counts::default()
            }
        );
        let top = l.top.as_ref().unwrap();
        let order: Vec<&str> = top.iter().map(|s| s.prefix.as_str()).collect();
        assert_eq!(order, ["10.0.2.0/24", "10.0.3.0/24", "10.0.1.0/24"]);
        assert_eq!(l.top_share, 0.6);
        assert_eq!(top[2].share, 0.1);
        assert_eq!(top[2].last_seen_seconds_ago, 1.0);
        assert_eq!(got[&8].prefixes, 0);
        assert_eq!(got[&8].untracked.final_ack_drops, 3);
        assert!(!got.contains_key(&9));
    }

    #[test]
    fn withholding_drops_the_addresses_and_says_so() {
        let mut d = DropSources {
            prefixes: 1,
            top: Some(vec![]),
            ..DropSources::default()
        };
        d.withhold();
        assert!(d.top.is_none() && d.withheld);
        let json = serde_json::to_value(&d).unwrap();
        assert!(json.get("top").is_none());
    }

    #[test]
    fn the_api_lists_at_most_top_prefixes() {
        let entries = (0..TOP as u8 + 5)
            .map(|i| {
                (
                    key(1, 4, v4(10, 0, i), 24),
                    counts(u64::from(i) + 1, 0, 0, 0),
                )
            })
            .collect();
        let got = summarise(entries, &ByInode::default(), 0, None);
        assert_eq!(got[&1].prefixes, TOP as u64 + 5);
        assert_eq!(got[&1].top.as_ref().unwrap().len(), TOP);
    }

    #[test]
    fn expired_counts_are_apart_from_the_prefixes_and_the_window_subtracts_its_bases() {
        let mut stats = ByInode::default();
        stats.insert(
            7,
            ListenerStats {
                untracked_source: [4, 0, 0],
                ..ListenerStats::default()
            },
        );
        let entries = vec![
            (key(7, 4, v4(10, 0, 1), 24), counts(10, 0, 0, 5)),
            (key(7, 4, v4(10, 0, 2), 24), counts(3, 0, 2, 5)),
            (SourceKey::expired(7), counts(6, 1, 0, 5)),
            // A listener whose every prefix expired.
            (SourceKey::expired(8), counts(2, 0, 0, 5)),
        ];
        // The window's bases: 10.0.1.0/24 had 9 then, 10.0.2.0/24 was not there yet,
        // the expired entry had 6 SYN drops, the untracked counts 1.
        let since = |k: &SourceKey, now: &Tally| -> Tally {
            let base: Tally = match (k.version, k.prefix[2], k.listener_ino) {
                (4, 1, 7) => [9, 0, 0, 0, 0],
                (SourceKey::EXPIRED, _, 7) => [6, 0, 0, 0, 0],
                (u8::MAX, _, 7) => [1, 0, 0, 0, 0],
                _ => [0; 5],
            };
            std::array::from_fn(|i| now[i] - base[i])
        };
        let before = ByInode::default();
        let window = Window {
            since: &since,
            expired_before: &before,
        };
        let got = summarise(entries, &stats, 10, Some(window));
        let l = &got[&7];
        assert_eq!((l.prefixes, l.counted.total()), (2, 15));
        assert_eq!((l.expired.syn_drops, l.expired.final_ack_drops), (6, 1));
        assert_eq!(l.untracked.syn_drops, 4);
        let r = l.recent.as_ref().unwrap();
        assert_eq!((r.prefixes, r.counted.total()), (2, 6));
        let order: Vec<(&str, u64)> = r
            .top
            .as_ref()
            .unwrap()
            .iter()
            .map(|s| (s.prefix.as_str(), s.counts.total()))
            .collect();
        assert_eq!(order, [("10.0.2.0/24", 5), ("10.0.1.0/24", 1)]);
        assert_eq!(
            (
                r.expired.final_ack_drops,
                r.expired.syn_drops,
                r.untracked.syn_drops
            ),
            (1, 0, 3)
        );
        let gone = &got[&8];
        assert_eq!((gone.prefixes, gone.expired.syn_drops), (0, 2));
        assert_eq!(gone.recent.as_ref().unwrap().expired.syn_drops, 2);
        // A prefix quiet over the window is not among the recent ones.
        let quiet =
            |k: &SourceKey, now: &Tally| -> Tally { if k.prefix[2] == 1 { [0; 5] } else { *now } };
        let mut stats = ByInode::default();
        stats.insert(7, ListenerStats::default());
        let got = summarise(
            vec![
                (key(7, 4, v4(10, 0, 1), 24), counts(10, 0, 0, 5)),
                (key(7, 4, v4(10, 0, 2), 24), counts(1, 0, 0, 5)),
            ],
            &stats,
            10,
            Some(Window {
                since: &quiet,
                expired_before: &before,
            }),
        );
        let r = got[&7].recent.as_ref().unwrap();
        assert_eq!((r.prefixes, r.top_share), (1, 1.0));
    }
}
