//! The table of live listening sockets: fed by the kernel's lifecycle events, completed
//! and repaired by socket sampling.

use std::{
    collections::{HashMap, HashSet},
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    sync::Arc,
};

use backlogd_common::{AF_INET, ListenerEvent, event_kind};
use serde::Serialize;

use crate::{
    names::{
        CgroupNames,
        cgroup::{Container, RuntimeNames},
    },
    programs::Known,
    sampling::{DiagListener, owners::Owner},
};

/// One listening socket as the kernel last described it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Listener {
    /// Socket inode (`ss -e` `ino:`); unique among live sockets.
    pub inode: u64,
    /// Network namespace inode (`readlink /proc/PID/ns/net`).
    pub netns: u32,
    pub addr: IpAddr,
    pub port: u16,
    /// Process that called `listen()` last (or, for listeners found by sampling, one
    /// process holding the socket); 0 when none was found.
    pub pid: u32,
    pub comm: String,
    /// Backlog passed to `listen()`; unknown for listeners that were already listening
    /// when backlogd started, until they call `listen()` again.
    pub requested: Option<i32>,
    /// Accept-queue capacity the kernel granted (`sk_max_ack_backlog`).
    pub granted: u32,
    /// The program holding the socket, if it is one backlogd knows (`programs.rs`), and
    /// what it asks `listen()` for: the request when `requested` is unknown.
    #[serde(default)]
    pub program: Option<Known>,
    /// Its owner's systemd unit, container and pod, from the owner's cgroup (`names/`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub names: Option<CgroupNames>,
    /// Whether the owner has been looked up since the entry was made.
    #[serde(skip)]
    identified: bool,
    /// Accept-queue length (`ss` Recv-Q) at the last scan: the queue's figure while the
    /// kernel side has not observed it, e.g. a queue that filled before the daemon started
    /// and has only met drops since (a drop changes no queue, so none is observed).
    #[serde(skip)]
    scanned_queue: Option<u32>,
    /// Scan generation current when the entry was made (see [`ListenerTable::begin_scan`]).
    #[serde(skip)]
    generation: u64,
}

impl Listener {
    /// Address and port as people write them: `[::1]:80` for IPv6, `127.0.0.1:80`.
    pub fn endpoint(&self) -> std::net::SocketAddr {
        std::net::SocketAddr::new(self.addr, self.port)
    }

    /// The accept-queue length the last scan saw (see
    /// [`crate::queues::QueueWindows::figures`]).
    pub fn scanned_queue(&self) -> Option<u32> {
        self.scanned_queue
    }
}

/// Live listeners keyed by socket inode. Shared (`Arc`), so a scrape takes the whole
/// table by reference counts, and a change copies only an entry a scrape still holds.
#[derive(Debug, Default)]
pub struct ListenerTable {
    by_inode: HashMap<u64, Arc<Listener>>,
    generation: u64,
    /// Inodes closed since the current scan began: the scan may still report them.
    closed_during_scan: HashSet<u64>,
}

impl ListenerTable {
    pub fn apply(&mut self, event: &ListenerEvent) {
        match event.kind {
            event_kind::LISTEN => {
                let listener = self.listener_of(event);
                self.by_inode.insert(event.ino, Arc::new(listener));
            }
            event_kind::CLOSE => {
                self.by_inode.remove(&event.ino);
                self.closed_during_scan.insert(event.ino);
            }
            other => tracing::warn!(kind = other, "unknown listener event kind"),
        }
    }

    /// A LISTEN event a daemon before this one saw (kept by the kernel), for a listener
    /// the current scan found and no event of ours announced; ignored if it closed
    /// meanwhile.
    pub fn restore(&mut self, event: &ListenerEvent) {
        if event.kind == event_kind::LISTEN
            && !self.by_inode.contains_key(&event.ino)
            && !self.closed_during_scan.contains(&event.ino)
        {
            let listener = self.listener_of(event);
            self.by_inode.insert(event.ino, Arc::new(listener));
        }
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.by_inode.len()
    }

    pub fn contains(&self, inode: u64) -> bool {
        self.by_inode.contains_key(&inode)
    }

    pub fn iter(&self) -> impl Iterator<Item = &Listener> {
        self.by_inode.values().map(|l| &**l)
    }

    /// The listeners, to keep past the table's lock at the cost of a reference count each.
    pub fn shared(&self) -> impl Iterator<Item = &Arc<Listener>> {
        self.by_inode.values()
    }

    /// Starts a reconciliation with a rescan; returns the scan's generation.
    pub fn begin_scan(&mut self) -> u64 {
        self.generation += 1;
        self.closed_during_scan.clear();
        self.generation
    }

    /// Merges a scan begun with `generation`: adds listeners no event announced (already
    /// listening at startup), drops entries made before the scan that the kernel no longer
    /// lists (a lost close event) in a namespace the scan could list (`listed`: one it
    /// could not enter, or could not find, says nothing about its listeners), unless the
    /// kernel still holds it open (`open`: the listen() the programs saw and no close
    /// since; the scan iterator does not see a listener no process holds). Returns
    /// (added, removed).
    pub fn finish_scan(
        &mut self,
        generation: u64,
        found: &[DiagListener],
        listed: &HashSet<u32>,
        owners: &HashMap<u64, Owner>,
        open: &HashSet<u64>,
    ) -> (usize, usize) {
        let present: HashSet<u64> = found
            .iter()
            .map(|d| d.inode)
            .chain(open.iter().copied())
            .collect();
        let before = self.by_inode.len();
        self.by_inode.retain(|inode, l| {
            l.generation >= generation || present.contains(inode) || !listed.contains(&l.netns)
        });
        let removed = before - self.by_inode.len();
        let mut added = 0;
        for d in found {
            if let Some(known) = self.by_inode.get_mut(&d.inode) {
                if known.scanned_queue != Some(d.accept_queue) {
                    Arc::make_mut(known).scanned_queue = Some(d.accept_queue);
                }
                continue;
            }
            if self.closed_during_scan.contains(&d.inode) {
                continue;
            }
            let owner = owners.get(&d.inode);
            self.by_inode.insert(
                d.inode,
                Arc::new(Listener {
                    inode: d.inode,
                    netns: d.netns,
                    addr: d.addr,
                    port: d.port,
                    pid: owner.map_or(0, |o| o.pid),
                    comm: owner.map(|o| o.comm.clone()).unwrap_or_default(),
                    requested: None,
                    granted: d.granted,
                    program: None,
                    names: None,
                    identified: false,
                    scanned_queue: Some(d.accept_queue),
                    generation,
                }),
            );
            added += 1;
        }
        (added, removed)
    }

    /// Listeners whose owner has not been looked up yet: (inode, pid, port).
    pub fn unidentified(&self) -> Vec<(u64, u32, u16)> {
        self.by_inode
            .values()
            .filter(|l| !l.identified && l.pid != 0)
            .map(|l| (l.inode, l.pid, l.port))
            .collect()
    }

    /// Records what [`crate::programs::identify`] and [`crate::names`] said of the owner
    /// `pid` of `inode`, unless the entry has changed hands since (a new `listen()` on a
    /// reused inode).
    pub fn set_owner(
        &mut self,
        inode: u64,
        pid: u32,
        program: Option<Known>,
        names: Option<CgroupNames>,
    ) {
        if let Some(l) = self.by_inode.get_mut(&inode)
            && l.pid == pid
        {
            let l = Arc::make_mut(l);
            l.program = program;
            l.names = names;
            l.identified = true;
        }
    }

    /// The containers of the listeners' owners, each once, with an owner's pid.
    pub fn containers(&self) -> Vec<(Container, u32)> {
        let mut seen = HashSet::new();
        self.by_inode
            .values()
            .filter_map(|l| {
                let c = l.names.as_ref()?.container.as_ref()?;
                seen.insert(c.id.clone()).then(|| (c.clone(), l.pid))
            })
            .collect()
    }

    /// Gives each listener in a container what its runtime said of it (`names` of the
    /// container id), and takes back what it no longer says.
    pub fn set_runtime_names<'a>(&mut self, names: impl Fn(&str) -> Option<&'a RuntimeNames>) {
        let empty = RuntimeNames::default();
        for l in self.by_inode.values_mut() {
            // Only a container's listeners are written to (copied if a scrape holds them).
            if let Some(id) = l
                .names
                .as_ref()
                .and_then(|n| Some(n.container.as_ref()?.id.clone()))
                && let Some(n) = &mut Arc::make_mut(l).names
            {
                n.add_runtime_names(names(&id).unwrap_or(&empty));
            }
        }
    }

    fn listener_of(&self, e: &ListenerEvent) -> Listener {
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
            requested: Some(e.requested),
            granted: e.granted,
            program: None,
            names: None,
            identified: false,
            scanned_queue: None,
            generation: self.generation,
        }
    }
}

#[cfg(test)]
mod tests {
    use backlogd_common::AF_INET6;

    use super::*;

    fn listen(ino: u64, requested: i32, granted: u32) -> ListenerEvent {
        let mut comm = [0u8; 16];
        comm[..5].copy_from_slice(b"nginx");
        ListenerEvent {
            kind: event_kind::LISTEN,
            family: AF_INET,
            port: 80,
            sk: 0xffff_0000 + ino,
            ino,
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

    fn close(ino: u64) -> ListenerEvent {
        ListenerEvent {
            kind: event_kind::CLOSE,
            ino,
            ..Default::default()
        }
    }

    /// The namespaces of `listen()` and `diag()`, both listed by the scan.
    fn listed() -> HashSet<u32> {
        HashSet::from([7, 4026531840])
    }

    fn diag(inode: u64) -> DiagListener {
        DiagListener {
            netns: 7,
            addr: "0.0.0.0".parse().unwrap(),
            port: 22,
            inode,
            accept_queue: 0,
            granted: 128,
            drops: Some(0),
        }
    }

    #[test]
    fn listen_then_close_leaves_nothing() {
        let mut t = ListenerTable::default();
        t.apply(&listen(1, 511, 128));
        let l = t.iter().next().unwrap();
        assert_eq!(
            (l.addr, l.port, l.comm.as_str(), l.pid, l.requested),
            ("127.0.0.1".parse().unwrap(), 80, "nginx", 42, Some(511))
        );
        t.apply(&close(1));
        assert_eq!(t.len(), 0);
    }

    #[test]
    fn repeated_listen_replaces_the_figures() {
        let mut t = ListenerTable::default();
        t.apply(&listen(1, 511, 128));
        t.apply(&listen(1, 64, 64));
        assert_eq!(t.len(), 1);
        let l = t.iter().next().unwrap();
        assert_eq!((l.requested, l.granted), (Some(64), 64));
    }

    #[test]
    fn ipv6_address_and_negative_backlog() {
        let mut e = listen(7, -1, 4096);
        e.family = AF_INET6;
        e.addr = Ipv6Addr::LOCALHOST.octets();
        let mut t = ListenerTable::default();
        t.apply(&e);
        let l = t.iter().next().unwrap();
        assert_eq!(
            (l.addr, l.requested),
            (IpAddr::V6(Ipv6Addr::LOCALHOST), Some(-1))
        );
    }

    #[test]
    fn a_listen_seen_by_an_earlier_daemon_is_restored_unless_it_closed_meanwhile() {
        let mut t = ListenerTable::default();
        let g = t.begin_scan();
        t.apply(&ListenerEvent {
            kind: event_kind::CLOSE,
            ino: 2,
            ..ListenerEvent::default()
        });
        t.restore(&listen(1, 511, 128));
        t.restore(&listen(2, 64, 64));
        assert_eq!(
            t.finish_scan(
                g,
                &[diag(1), diag(2)],
                &listed(),
                &HashMap::new(),
                &HashSet::new()
            ),
            (0, 0)
        );
        let l = t.iter().find(|l| l.inode == 1).unwrap();
        assert_eq!((l.requested, l.granted), (Some(511), 128));
        assert!(!t.contains(2), "closed during the scan");
        // An entry our own events made is not replaced by an older record.
        t.apply(&listen(3, 1024, 128));
        t.restore(&listen(3, 16, 16));
        assert_eq!(
            t.iter().find(|l| l.inode == 3).unwrap().requested,
            Some(1024)
        );
    }

    #[test]
    fn scan_adds_unknown_listeners_without_a_requested_backlog() {
        let mut t = ListenerTable::default();
        t.apply(&listen(1, 511, 128));
        let g = t.begin_scan();
        let owners = HashMap::from([(
            2,
            Owner {
                pid: 9,
                comm: "sshd".into(),
            },
        )]);
        assert_eq!(
            t.finish_scan(g, &[diag(1), diag(2)], &listed(), &owners, &HashSet::new()),
            (1, 0)
        );
        let sshd = t.iter().find(|l| l.inode == 2).unwrap();
        assert_eq!(
            (sshd.requested, sshd.granted, sshd.pid, sshd.comm.as_str()),
            (None, 128, 9, "sshd")
        );
        // The event-fed entry keeps its requested backlog.
        assert_eq!(
            t.iter().find(|l| l.inode == 1).unwrap().requested,
            Some(511)
        );
    }

    #[test]
    fn scan_keeps_an_unlisted_entry_the_kernel_still_holds_open() {
        let mut t = ListenerTable::default();
        t.apply(&listen(1, 10, 10)); // held by no process: the scan iterator misses it
        t.apply(&listen(3, 10, 10)); // its close event was lost
        let g = t.begin_scan();
        let open = HashSet::from([1]);
        assert_eq!(
            t.finish_scan(g, &[], &listed(), &HashMap::new(), &open),
            (0, 1)
        );
        assert!(t.contains(1) && !t.contains(3));
    }

    #[test]
    fn scan_removes_entries_the_kernel_no_longer_lists_but_not_newer_ones() {
        let mut t = ListenerTable::default();
        t.apply(&listen(1, 10, 10)); // its close event was lost
        let g = t.begin_scan();
        t.apply(&listen(2, 10, 10)); // appeared while the scan ran
        assert_eq!(
            t.finish_scan(g, &[], &listed(), &HashMap::new(), &HashSet::new()),
            (0, 1)
        );
        assert!(!t.contains(1) && t.contains(2));
    }

    #[test]
    fn scan_keeps_listeners_of_namespaces_it_could_not_list() {
        let mut t = ListenerTable::default();
        t.apply(&listen(1, 10, 10));
        let g = t.begin_scan();
        assert_eq!(
            t.finish_scan(g, &[], &HashSet::new(), &HashMap::new(), &HashSet::new()),
            (0, 0)
        );
        assert!(t.contains(1));
    }

    #[test]
    fn scan_does_not_resurrect_a_listener_closed_while_it_ran() {
        let mut t = ListenerTable::default();
        let g = t.begin_scan();
        t.apply(&close(3));
        assert_eq!(
            t.finish_scan(g, &[diag(3)], &listed(), &HashMap::new(), &HashSet::new()),
            (0, 0)
        );
        assert_eq!(t.len(), 0);
    }
}
