//! The TcpExt section of `/proc/net/netstat`, read the same way by the daemon (which
//! exports each namespace's counters beside its own), the integration suite and the
//! benchmarks (which compare backlogd's figures with them). The file is pairs of lines, a
//! header of names then the values, each starting with its section's name.

/// TcpExt counters by the names `/proc/net/netstat` gives them: the ones backlogd exports
/// per namespace ([`EXPORTED`]) and the suite compares its figures with.
pub mod counter {
    /// Connections the accept queue had no room for (and SYNs refused for a full one).
    pub const LISTEN_OVERFLOWS: &str = "ListenOverflows";
    /// Every drop of a segment for a listener (overflows included).
    pub const LISTEN_DROPS: &str = "ListenDrops";
    /// SYNs dropped for a full SYN queue, syncookies off.
    pub const REQQ_FULL_DROP: &str = "TCPReqQFullDrop";
    /// SYNs answered with a syncookie for a full SYN queue.
    pub const REQQ_FULL_DO_COOKIES: &str = "TCPReqQFullDoCookies";
    /// SYN and SYN-ACK retransmissions.
    pub const SYN_RETRANS: &str = "TCPSynRetrans";
    /// ACKs that returned a valid syncookie.
    pub const SYNCOOKIES_RECV: &str = "SyncookiesRecv";
}

/// The TcpExt counters backlogd exports for every namespace with listeners
/// (`backlogd_netns_*`), in the order it serves them.
pub const EXPORTED: [&str; 6] = [
    counter::LISTEN_OVERFLOWS,
    counter::LISTEN_DROPS,
    counter::REQQ_FULL_DROP,
    counter::REQQ_FULL_DO_COOKIES,
    counter::SYN_RETRANS,
    counter::SYNCOOKIES_RECV,
];

/// The `(name, value)` pairs of the TcpExt section of `netstat` (the text of
/// `/proc/net/netstat`), or None if the text has no TcpExt section. A value that is not a
/// number is skipped.
pub fn tcp_ext(netstat: &str) -> Option<impl Iterator<Item = (&str, u64)>> {
    let mut lines = netstat.lines();
    while let Some(names) = lines.next() {
        let values = lines.next()?;
        if let (Some(names), Some(values)) = (
            names.strip_prefix("TcpExt:"),
            values.strip_prefix("TcpExt:"),
        ) {
            return Some(
                names
                    .split_whitespace()
                    .zip(values.split_whitespace())
                    .filter_map(|(k, v)| Some((k, v.parse().ok()?))),
            );
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_tcpext_and_skips_other_sections() {
        let text = "IpExt: InNoRoutes\nIpExt: 1\n\
                    TcpExt: SyncookiesSent ListenOverflows ListenDrops\nTcpExt: 3 75 80\n\
                    MPTcpExt: MPCapableSYNRX\nMPTcpExt: 9\n";
        let mut pairs = tcp_ext(text).unwrap();
        assert_eq!(pairs.next(), Some(("SyncookiesSent", 3)));
        assert_eq!(pairs.next(), Some(("ListenOverflows", 75)));
        assert_eq!(pairs.next(), Some(("ListenDrops", 80)));
        assert_eq!(pairs.next(), None);
    }

    #[test]
    fn no_tcpext_section_is_none() {
        assert!(tcp_ext("IpExt: InNoRoutes\nIpExt: 1\n").is_none());
        assert!(tcp_ext("TcpExt: ListenOverflows\n").is_none());
    }
}
