//! The kernel's own counters for the same interval backlogd measured.

use std::collections::HashMap;

use backlogd_common::netstat::{EXPORTED, counter};

use crate::{Exact, Netns, Scrape};

/// backlogd's family for each TcpExt counter it exports per namespace
/// ([`backlogd_common::netstat::EXPORTED`], in that order).
pub const NETNS_FAMILIES: [(&str, &str); 6] = [
    (EXPORTED[0], "backlogd_netns_listen_overflows_total"),
    (EXPORTED[1], "backlogd_netns_listen_drops_total"),
    (EXPORTED[2], "backlogd_netns_reqq_full_drops_total"),
    (EXPORTED[3], "backlogd_netns_reqq_full_do_cookies_total"),
    (EXPORTED[4], "backlogd_netns_syn_retransmits_total"),
    (EXPORTED[5], "backlogd_netns_syncookies_returned_total"),
];

/// The namespace's drop counters: what backlogd's drops by reason and syncookies add up
/// to ([`ListenCounters`] but for the retransmissions).
pub const DROP_COUNTERS: [&str; 4] = [
    counter::LISTEN_OVERFLOWS,
    counter::LISTEN_DROPS,
    counter::REQQ_FULL_DROP,
    counter::REQQ_FULL_DO_COOKIES,
];

/// The family backlogd exports TcpExt `counter` as, per namespace ([`NETNS_FAMILIES`]).
#[track_caller]
pub fn netns_family(counter: &str) -> &'static str {
    NETNS_FAMILIES
        .iter()
        .find(|(c, _)| *c == counter)
        .map(|(_, family)| *family)
        .unwrap_or_else(|| panic!("backlogd exports no family for TcpExt {counter}"))
}

/// Adds to `exact` each of `counters` as `scrape` exports it for `ns`, against the
/// namespace's TcpExt read now (after the scrape: backlogd reads them at scrape time).
#[track_caller]
pub fn exact_netns_counters(exact: &mut Exact, scrape: &Scrape, ns: &Netns, counters: &[&str]) {
    let now = tcp_ext(ns);
    let netns = ns.inode().to_string();
    let netns = netns.as_str();
    for name in counters {
        let metric = netns_family(name);
        let exported = scrape
            .value(metric, &[("netns", netns)])
            .unwrap_or_else(|| panic!("no {metric} for netns {netns}:\n{}", scrape.text));
        exact.eq(&format!("{metric} vs {name}"), exported as u64, now[*name]);
    }
}

/// TcpExt counters of the namespace (`/proc/thread-self/net/netstat` read on the
/// namespace's thread: `/proc/net` would show the process leader's namespace).
pub fn tcp_ext(ns: &Netns) -> HashMap<String, u64> {
    ns.run(|| {
        let text = std::fs::read_to_string("/proc/thread-self/net/netstat")
            .expect("reading /proc/thread-self/net/netstat");
        backlogd_common::netstat::tcp_ext(&text)
            .expect("no TcpExt section in /proc/thread-self/net/netstat")
            .map(|(k, v)| (k.to_owned(), v))
            .collect()
    })
}

/// The difference of two [`tcp_ext`] snapshots for the counters backlogd attributes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListenCounters {
    pub listen_overflows: u64,
    pub listen_drops: u64,
    pub reqq_full_drop: u64,
    pub reqq_full_do_cookies: u64,
    /// SYN and SYN-ACK retransmissions in the namespace.
    pub syn_retrans: u64,
}

impl ListenCounters {
    /// The counters' values in one [`tcp_ext`] snapshot.
    pub fn of(snapshot: &HashMap<String, u64>) -> Self {
        Self::delta(&HashMap::new(), snapshot)
    }

    pub fn delta(before: &HashMap<String, u64>, after: &HashMap<String, u64>) -> Self {
        let d = |k: &str| after[k] - before.get(k).copied().unwrap_or(0);
        Self {
            listen_overflows: d(counter::LISTEN_OVERFLOWS),
            listen_drops: d(counter::LISTEN_DROPS),
            reqq_full_drop: d(counter::REQQ_FULL_DROP),
            reqq_full_do_cookies: d(counter::REQQ_FULL_DO_COOKIES),
            syn_retrans: d(counter::SYN_RETRANS),
        }
    }
}

/// When a namespace's TcpExt counter rose, as the kernel's own count places it in time:
/// the events it counts happened after `quiet` and the first `rise` of them before
/// `reached`. No wall-clock figure of the test's is in it, only instants at which the
/// counter was read.
#[derive(Debug, Clone, Copy)]
pub struct Rise {
    /// Taken just before the last reading that still showed no rise: the first event
    /// came after it. None when the first reading already showed one.
    pub quiet: Option<std::time::Instant>,
    /// Taken just after the first reading at which `done` held.
    pub reached: std::time::Instant,
    /// The counter's rise over `before` at `reached`.
    pub rise: u64,
}

/// Reads TcpExt `counter` of `ns` about every millisecond until `done(rise over before)`
/// holds. The limit (60 s) only catches a hang: the tests wait here for events the
/// kernel's timers bring within seconds.
#[track_caller]
pub fn wait_for_rise(
    ns: &Netns,
    counter: &str,
    before: &HashMap<String, u64>,
    mut done: impl FnMut(u64) -> bool,
) -> Rise {
    use std::time::{Duration, Instant};
    const HANG: Duration = Duration::from_secs(60);
    let base = before.get(counter).copied().unwrap_or(0);
    let deadline = Instant::now() + HANG;
    let mut quiet = None;
    loop {
        let asked = Instant::now();
        let rise = tcp_ext(ns)[counter] - base;
        let reached = Instant::now();
        if done(rise) {
            return Rise {
                quiet,
                reached,
                rise,
            };
        }
        if rise == 0 {
            quiet = Some(asked);
        }
        assert!(
            reached < deadline,
            "TcpExt {counter} rose by {rise} in {HANG:?}, and the test's condition on it never held"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// backlogd's side of an interval that began at `before`, read by `ours`, with the
/// namespace's counters over the same interval. The counters are read just before and
/// just after `ours`, again until neither reading differs: then no segment the kernel
/// counted landed between backlogd's reading and the kernel's, so both end at the same
/// point. (Segments still in flight when the traffic stopped are waited out this way, not
/// with a sleep.) The limit (60 s) only catches a namespace whose counters never rest.
#[track_caller]
pub fn closed_interval<T>(
    ns: &Netns,
    before: &HashMap<String, u64>,
    mut ours: impl FnMut() -> T,
) -> (ListenCounters, T) {
    use std::time::{Duration, Instant};
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let first = ListenCounters::delta(before, &tcp_ext(ns));
        let read = ours();
        let last = ListenCounters::delta(before, &tcp_ext(ns));
        if first == last {
            return (last, read);
        }
        assert!(
            Instant::now() < deadline,
            "the namespace's counters never rested: {first:?} then {last:?}"
        );
    }
}
