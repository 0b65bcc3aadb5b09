//! backlogd's per-listener figures and the identities they must satisfy against the
//! kernel, and the scenario most suites replay: a full accept queue meeting a burst.

use std::{net::SocketAddr, time::Duration};

use backlogd_common::names::figure;

use crate::{
    Daemon, Exact, Netns, Scrape,
    kernel::{ListenCounters, tcp_ext},
    prom::DROP_REASONS,
    sockets::{
        ClientView, KernelQueue, Listener, client_view, connect_burst, fill_accept_queue,
        kernel_queue,
    },
};

/// backlogd's figures for one listener.
#[derive(Debug)]
pub struct Figures {
    pub accept_queue_full: u64,
    pub syn_queue_full: u64,
    pub final_ack_overflow: u64,
    pub other: u64,
    pub syncookies: u64,
    pub syns: u64,
    pub synack_retransmits: u64,
}

impl Figures {
    pub fn of(scrape: &Scrape, l: &Listener) -> Self {
        let inode = l.inode.to_string();
        let get = |name: &str, extra: Option<(&str, &str)>| {
            let mut labels = vec![("socket", inode.as_str())];
            labels.extend(extra);
            scrape
                .value(name, &labels)
                .unwrap_or_else(|| panic!("no {name} {labels:?} in:\n{}", scrape.text))
                as u64
        };
        let drops = |reason| get("backlogd_listen_drops_total", Some(("reason", reason)));
        Self {
            accept_queue_full: drops(DROP_REASONS[0]),
            syn_queue_full: drops(DROP_REASONS[1]),
            final_ack_overflow: drops(DROP_REASONS[2]),
            other: drops(DROP_REASONS[3]),
            syncookies: get("backlogd_listen_syncookies_sent_total", None),
            syns: get("backlogd_listen_syns_received_total", None),
            synack_retransmits: get("backlogd_listen_synack_retransmits_total", None),
        }
    }

    pub fn all_drops(&self) -> u64 {
        self.accept_queue_full + self.syn_queue_full + self.final_ack_overflow + self.other
    }

    /// The identities that must hold between backlogd and the namespace's counters for a
    /// listener alone in its namespace, whatever the scenario (`exact` must have its
    /// interval: see [`Exact::interval`]).
    pub fn check(&self, exact: &mut Exact, kernel: &ListenCounters) {
        exact
            .evidence("backlogd", self)
            .evidence("kernel TcpExt deltas", kernel)
            .eq_fed(
                "accept_queue_full + final_ack_overflow vs ListenOverflows",
                &[figure::DROPS],
                self.accept_queue_full + self.final_ack_overflow,
                kernel.listen_overflows,
            )
            .eq_fed(
                "syn_queue_full vs TCPReqQFullDrop",
                &[figure::DROPS],
                self.syn_queue_full,
                kernel.reqq_full_drop,
            )
            .eq_fed(
                "all drops vs ListenDrops",
                &[figure::DROPS],
                self.all_drops(),
                kernel.listen_drops,
            )
            .eq_fed(
                "syncookies vs TCPReqQFullDoCookies",
                &[figure::SYNCOOKIES],
                self.syncookies,
                kernel.reqq_full_do_cookies,
            );
    }

    /// The socket's own sk_drops, in scenarios where no segment reaches a pending request
    /// without completing it: it counts a final-ACK overflow twice (tcp_listendrop() in
    /// syn_recv_sock, then tcp_v4_rcv's discard path; docs/metrics.md).
    pub fn check_sk_drops(&self, exact: &mut Exact, queue: &KernelQueue) {
        exact.evidence("socket (ss)", queue).eq_fed(
            "all drops + final_ack_overflow vs sk_drops",
            &[figure::DROPS],
            self.all_drops() + self.final_ack_overflow,
            queue.drops,
        );
    }
}

/// What [`accept_queue_full_burst`] saw. `exact` holds every check the scenario implies,
/// not yet verified: callers add their own, then call `verify()`.
pub struct Burst {
    pub ours: Figures,
    pub kernel: ListenCounters,
    pub queue: KernelQueue,
    pub clients: ClientView,
    pub scrape: Scrape,
    pub exact: Exact,
}

/// Clients for the accept queue's room (backlog + 1), one handshake at a time, then 25 more
/// at once against `listener` (which must have backlog 4, syncookies off, and never accept),
/// given 1.5 s for their first SYN retransmission to be dropped too. Every SYN of the burst
/// meets a full queue, so each drop is at the SYN: checks backlogd against the namespace's
/// TcpExt deltas, the socket's sk_drops and queue, and the SYNs the clients sent.
///
/// The queue is filled first because a burst against an empty queue makes the kernel's own
/// split race: SYNs arriving before the first final ACKs get requests, and their final ACKs
/// overflow instead (once on Debian 6.1 under qemu: 24 + 3 final-ACK overflows, which
/// backlogd counted and the kernel's sk_drops confirmed).
pub fn accept_queue_full_burst(
    daemon: &Daemon,
    ns: &Netns,
    listener: &Listener,
    to: SocketAddr,
) -> Burst {
    let before = tcp_ext(ns);
    let start = daemon.program_misses();
    let mut clients = fill_accept_queue(ns, listener, to, 5);
    clients.extend(connect_burst(ns, to, 25));
    std::thread::sleep(Duration::from_millis(1500));
    let view = client_view(&clients);
    drop(clients); // no more SYNs: the interval is closed
    std::thread::sleep(Duration::from_millis(100));
    let after = tcp_ext(ns);
    let kernel = ListenCounters::delta(&before, &after);
    let queue = kernel_queue(ns, listener);
    let scrape = daemon.scrape();
    let ours = Figures::of(&scrape, listener);

    // The scenario did what it is for.
    assert_eq!(queue.recv_q, 5, "accept queue holds backlog + 1: {queue:?}");
    assert_eq!((view.connected, view.waiting), (5, 25), "{view:?}");
    assert!(kernel.listen_overflows >= 25, "{kernel:?}");

    let mut exact = Exact::listener(daemon, ns, listener);
    exact.interval(daemon, &start);
    exact
        .evidence("kernel TcpExt before", ListenCounters::of(&before))
        .evidence("kernel TcpExt after", ListenCounters::of(&after))
        .evidence("clients", view);
    ours.check(&mut exact, &kernel);
    ours.check_sk_drops(&mut exact, &queue);
    exact
        .eq_fed(
            "accept_queue_full vs ListenOverflows",
            &[figure::DROPS],
            ours.accept_queue_full,
            kernel.listen_overflows,
        )
        .eq_fed(
            "SYNs received vs SYNs the clients sent",
            &[figure::SYNS_RECEIVED],
            ours.syns,
            view.syns_sent,
        );
    Burst {
        ours,
        kernel,
        queue,
        clients: view,
        scrape,
        exact,
    }
}
