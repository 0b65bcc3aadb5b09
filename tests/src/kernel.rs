//! The kernel's own counters for the same interval backlogd measured.

use std::collections::HashMap;

use crate::Netns;

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
            listen_overflows: d("ListenOverflows"),
            listen_drops: d("ListenDrops"),
            reqq_full_drop: d("TCPReqQFullDrop"),
            reqq_full_do_cookies: d("TCPReqQFullDoCookies"),
            syn_retrans: d("TCPSynRetrans"),
        }
    }
}
