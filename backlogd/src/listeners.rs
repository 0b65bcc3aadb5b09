//! The table of live listening sockets, fed by the kernel's lifecycle events.

use std::{
    collections::HashMap,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
};

use backlogd_common::{AF_INET, ListenerEvent, event_kind};
use serde::Serialize;

/// One listening socket as the kernel last described it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Listener {
    /// Socket inode (`ss -e` `ino:`); unique among live sockets.
    pub inode: u64,
    /// Network namespace inode (`readlink /proc/PID/ns/net`).
    pub netns: u32,
    pub addr: IpAddr,
    pub port: u16,
    /// Process that called `listen()` last.
    pub pid: u32,
    pub comm: String,
    /// Backlog passed to `listen()`.
    pub requested: i32,
    /// Accept-queue capacity the kernel granted (`sk_max_ack_backlog`).
    pub granted: u32,
}

/// Live listeners keyed by the kernel address of their `struct sock`, which is what the
/// close event carries.
#[derive(Debug, Default)]
pub struct ListenerTable {
    by_sk: HashMap<u64, Listener>,
}

impl ListenerTable {
    pub fn apply(&mut self, event: &ListenerEvent) {
        match event.kind {
            event_kind::LISTEN => {
                self.by_sk.insert(event.sk, listener_of(event));
            }
            event_kind::CLOSE => {
                self.by_sk.remove(&event.sk);
            }
            other => tracing::warn!(kind = other, "unknown listener event kind"),
        }
    }

    pub fn len(&self) -> usize {
        self.by_sk.len()
    }

    pub fn iter(&self) -> impl Iterator<Item = &Listener> {
        self.by_sk.values()
    }
}

fn listener_of(e: &ListenerEvent) -> Listener {
    let addr = if e.family == AF_INET {
        IpAddr::V4(Ipv4Addr::new(e.addr[0], e.addr[1], e.addr[2], e.addr[3]))
    } else {
        IpAddr::V6(Ipv6Addr::from(e.addr))
    };
    let comm_len = e.comm.iter().position(|&b| b == 0).unwrap_or(e.comm.len());
    Listener {
        inode: e.ino,
        netns: e.netns,
        addr,
        port: e.port,
        pid: e.tgid,
        comm: String::from_utf8_lossy(&e.comm[..comm_len]).into_owned(),
        requested: e.requested,
        granted: e.granted,
    }
}

#[cfg(test)]
mod tests {
    use backlogd_common::AF_INET6;

    use super::*;

    fn listen(sk: u64, requested: i32, granted: u32) -> ListenerEvent {
        let mut comm = [0u8; 16];
        comm[..5].copy_from_slice(b"nginx");
        ListenerEvent {
            kind: event_kind::LISTEN,
            family: AF_INET,
            port: 80,
            sk,
            ino: sk + 1000,
            netns: 4026531840,
            tgid: 42,
            pid: 43,
            requested,
            granted,
            addr: [127, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            comm,
            ..Default::default()
        }
    }

    #[test]
    fn listen_then_close_leaves_nothing() {
        let mut t = ListenerTable::default();
        t.apply(&listen(1, 511, 128));
        let l = t.iter().next().unwrap();
        assert_eq!(
            (l.addr, l.port, l.comm.as_str(), l.pid),
            ("127.0.0.1".parse().unwrap(), 80, "nginx", 42)
        );
        t.apply(&ListenerEvent {
            kind: event_kind::CLOSE,
            sk: 1,
            ..Default::default()
        });
        assert_eq!(t.len(), 0);
    }

    #[test]
    fn repeated_listen_replaces_the_figures() {
        let mut t = ListenerTable::default();
        t.apply(&listen(1, 511, 128));
        t.apply(&listen(1, 64, 64));
        assert_eq!(t.len(), 1);
        let l = t.iter().next().unwrap();
        assert_eq!((l.requested, l.granted), (64, 64));
    }

    #[test]
    fn ipv6_address_and_negative_backlog() {
        let mut e = listen(7, -1, 4096);
        e.family = AF_INET6;
        e.addr = Ipv6Addr::LOCALHOST.octets();
        let mut t = ListenerTable::default();
        t.apply(&e);
        let l = t.iter().next().unwrap();
        assert_eq!((l.addr, l.requested), (IpAddr::V6(Ipv6Addr::LOCALHOST), -1));
    }
}
