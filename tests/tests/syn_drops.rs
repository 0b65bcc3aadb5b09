//! SYN-path accounting per listener, checked against the kernel for the same interval:
//! the namespace's TcpExt deltas, the socket's own `sk_drops` and queue, and what the
//! clients themselves sent. Each test owns its namespace, so the namespace's counters are
//! this listener's alone.

use std::time::Duration;

use backlogd_tests::{
    Daemon, Netns, Scrape,
    kernel::{ListenCounters, tcp_ext},
    sockets::{Listener, connect_burst, kernel_queue, syns_sent},
};

fn counter(scrape: &Scrape, name: &str, l: &Listener, extra: &[(&str, &str)]) -> u64 {
    let inode = l.inode.to_string();
    let mut labels = vec![("socket", inode.as_str())];
    labels.extend_from_slice(extra);
    scrape
        .value(name, &labels)
        .unwrap_or_else(|| panic!("no {name} {labels:?} in:\n{}", scrape.text)) as u64
}

fn drops(scrape: &Scrape, l: &Listener, reason: &str) -> u64 {
    counter(
        scrape,
        "backlogd_listen_drops_total",
        l,
        &[("reason", reason)],
    )
}

#[test]
fn accept_queue_full_drops_equal_listen_overflows_and_sk_drops() {
    accept_queue_full("127.0.0.1:0");
}

#[test]
fn accept_queue_full_on_ipv6_is_counted_the_same() {
    accept_queue_full("[::1]:0");
}

fn accept_queue_full(bind: &str) {
    let daemon = Daemon::start();
    let ns = Netns::new();
    ns.sysctl("net.ipv4.tcp_syncookies", "0");
    // Backlog 4, never accept(): five handshakes complete (the queue is full only above
    // the backlog), every later SYN is dropped.
    let listener = Listener::open(&ns, bind, 4);
    daemon.wait_for("the listener", |s| {
        (!s.find(
            "backlogd_listen_backlog_granted",
            &[("socket", &listener.inode.to_string())],
        )
        .is_empty())
        .then_some(())
    });

    let before = tcp_ext(&ns);
    let clients = connect_burst(&ns, listener.addr, 30);
    // Long enough for the first SYN retransmission (1 s) to be dropped too.
    std::thread::sleep(Duration::from_millis(1500));
    let sent: u64 = clients.iter().map(syns_sent).sum();
    drop(clients); // no more SYNs: the interval is closed
    std::thread::sleep(Duration::from_millis(100));
    let kernel = ListenCounters::delta(&before, &tcp_ext(&ns));
    let queue = kernel_queue(&ns, &listener);
    let scrape = daemon.scrape();

    // The scenario did what it is for.
    assert!(kernel.listen_overflows >= 25, "{kernel:?}");
    assert_eq!(queue.recv_q, 5, "accept queue holds backlog + 1");

    let accept_full = drops(&scrape, &listener, "accept_queue_full");
    assert_eq!(
        accept_full, kernel.listen_overflows,
        "{kernel:?}\n{}",
        scrape.text
    );
    assert_eq!(drops(&scrape, &listener, "final_ack_overflow"), 0);
    assert_eq!(
        drops(&scrape, &listener, "syn_queue_full"),
        kernel.reqq_full_drop
    );
    assert_eq!(drops(&scrape, &listener, "other"), 0);
    assert_eq!(accept_full, kernel.listen_drops);
    assert_eq!(accept_full, queue.drops, "sk_drops");
    assert_eq!(
        counter(
            &scrape,
            "backlogd_listen_syncookies_sent_total",
            &listener,
            &[]
        ),
        kernel.reqq_full_do_cookies
    );
    // Every SYN the clients sent reached the listener.
    assert_eq!(
        counter(
            &scrape,
            "backlogd_listen_syns_received_total",
            &listener,
            &[]
        ),
        sent
    );
    // The namespace's own counters are exported alongside, read at scrape time.
    let now = tcp_ext(&ns);
    let netns = ns.inode().to_string();
    for (metric, name) in [
        ("backlogd_netns_listen_overflows_total", "ListenOverflows"),
        ("backlogd_netns_listen_drops_total", "ListenDrops"),
        ("backlogd_netns_reqq_full_drops_total", "TCPReqQFullDrop"),
        (
            "backlogd_netns_reqq_full_do_cookies_total",
            "TCPReqQFullDoCookies",
        ),
        ("backlogd_netns_syn_retransmits_total", "TCPSynRetrans"),
    ] {
        assert_eq!(
            scrape.value(metric, &[("netns", &netns)]),
            Some(now[name] as f64),
            "{metric}"
        );
    }
}

/// A burst whose SYN-ACKs never reach the clients: the listener's requests stay in its
/// SYN queue, which fills at `sk_max_ack_backlog` (the backlog) pending requests.
fn syn_queue_burst(syncookies: &str) -> (Daemon, Netns, Listener, ListenCounters, Scrape, u64) {
    let daemon = Daemon::start();
    let ns = Netns::new();
    ns.sysctl("net.ipv4.tcp_syncookies", syncookies);
    ns.sysctl("net.ipv4.tcp_max_syn_backlog", "1024");
    let listener = Listener::open(&ns, "127.0.0.1:0", 8);
    daemon.wait_for("the listener", |s| {
        (!s.find(
            "backlogd_listen_backlog_granted",
            &[("socket", &listener.inode.to_string())],
        )
        .is_empty())
        .then_some(())
    });
    ns.drop_incoming("syn|ack");

    let before = tcp_ext(&ns);
    let clients = connect_burst(&ns, listener.addr, 40);
    std::thread::sleep(Duration::from_millis(1500));
    let sent: u64 = clients.iter().map(syns_sent).sum();
    drop(clients);
    std::thread::sleep(Duration::from_millis(100));
    let kernel = ListenCounters::delta(&before, &tcp_ext(&ns));
    let scrape = daemon.scrape();
    (daemon, ns, listener, kernel, scrape, sent)
}

#[test]
fn syn_queue_full_with_syncookies_off_equals_reqq_full_drop() {
    let (_daemon, _ns, listener, kernel, scrape, sent) = syn_queue_burst("0");
    assert!(kernel.reqq_full_drop >= 30, "{kernel:?}");
    assert_eq!(kernel.reqq_full_do_cookies, 0);

    let syn_full = drops(&scrape, &listener, "syn_queue_full");
    assert_eq!(
        syn_full, kernel.reqq_full_drop,
        "{kernel:?}\n{}",
        scrape.text
    );
    assert_eq!(
        drops(&scrape, &listener, "accept_queue_full"),
        kernel.listen_overflows
    );
    let all: u64 = [
        "accept_queue_full",
        "syn_queue_full",
        "final_ack_overflow",
        "other",
    ]
    .iter()
    .map(|r| drops(&scrape, &listener, r))
    .sum();
    assert_eq!(all, kernel.listen_drops);
    assert_eq!(
        counter(
            &scrape,
            "backlogd_listen_syncookies_sent_total",
            &listener,
            &[]
        ),
        0
    );
    assert_eq!(
        counter(
            &scrape,
            "backlogd_listen_syns_received_total",
            &listener,
            &[]
        ),
        sent
    );
}

#[test]
fn syncookies_sent_equal_reqq_full_do_cookies() {
    let (_daemon, _ns, listener, kernel, scrape, sent) = syn_queue_burst("1");
    assert!(kernel.reqq_full_do_cookies >= 30, "{kernel:?}");

    assert_eq!(
        counter(
            &scrape,
            "backlogd_listen_syncookies_sent_total",
            &listener,
            &[]
        ),
        kernel.reqq_full_do_cookies,
        "{kernel:?}\n{}",
        scrape.text
    );
    assert_eq!(
        drops(&scrape, &listener, "syn_queue_full"),
        kernel.reqq_full_drop
    );
    assert_eq!(
        drops(&scrape, &listener, "accept_queue_full"),
        kernel.listen_overflows
    );
    let all: u64 = [
        "accept_queue_full",
        "syn_queue_full",
        "final_ack_overflow",
        "other",
    ]
    .iter()
    .map(|r| drops(&scrape, &listener, r))
    .sum();
    assert_eq!(all, kernel.listen_drops);
    assert_eq!(
        counter(
            &scrape,
            "backlogd_listen_syns_received_total",
            &listener,
            &[]
        ),
        sent
    );
}

/// Handshakes held at the final ACK, then released together into an accept queue with
/// room for only some of them.
fn final_ack_overflow(abort_on_overflow: &str) {
    let daemon = Daemon::start();
    let ns = Netns::new();
    ns.sysctl("net.ipv4.tcp_syncookies", "0");
    ns.sysctl("net.ipv4.tcp_abort_on_overflow", abort_on_overflow);
    // Backlog 8: the accept queue holds 9, the SYN queue 8 pending requests.
    let listener = Listener::open(&ns, "127.0.0.1:0", 8);
    daemon.wait_for("the listener", |s| {
        (!s.find(
            "backlogd_listen_backlog_granted",
            &[("socket", &listener.inode.to_string())],
        )
        .is_empty())
        .then_some(())
    });
    let before = tcp_ext(&ns);
    let queued = connect_burst(&ns, listener.addr, 5);
    std::thread::sleep(Duration::from_millis(200));
    ns.drop_incoming("ack");
    let held = connect_burst(&ns, listener.addr, 8);
    std::thread::sleep(Duration::from_millis(200));
    ns.stop_dropping();
    // The listener retransmits its SYN-ACKs after 1 s; the clients' ACKs then arrive
    // together: 4 fit, 4 overflow.
    std::thread::sleep(Duration::from_millis(1800));
    let kernel = ListenCounters::delta(&before, &tcp_ext(&ns));
    let queue = kernel_queue(&ns, &listener);
    let scrape = daemon.scrape();
    drop((queued, held));
    eprintln!(
        "final ACK overflow (abort_on_overflow={abort_on_overflow}): kernel {kernel:?}, \
         sk_drops {}, backlogd final_ack_overflow {}",
        queue.drops,
        drops(&scrape, &listener, "final_ack_overflow")
    );

    assert!(kernel.listen_overflows >= 4, "{kernel:?}");
    assert_eq!(queue.recv_q, 9, "accept queue full");
    assert_eq!(
        drops(&scrape, &listener, "final_ack_overflow"),
        kernel.listen_overflows,
        "{kernel:?}\n{}",
        scrape.text
    );
    assert_eq!(drops(&scrape, &listener, "accept_queue_full"), 0);
    assert_eq!(
        drops(&scrape, &listener, "syn_queue_full"),
        kernel.reqq_full_drop
    );
    let all: u64 = [
        "accept_queue_full",
        "syn_queue_full",
        "final_ack_overflow",
        "other",
    ]
    .iter()
    .map(|r| drops(&scrape, &listener, r))
    .sum();
    assert_eq!(all, kernel.listen_drops);
    // The socket's own sk_drops counts a final-ACK overflow twice: tcp_listendrop() in
    // syn_recv_sock, then the discard path of tcp_v4_rcv (docs/metrics.md).
    assert_eq!(
        queue.drops,
        all + drops(&scrape, &listener, "final_ack_overflow"),
        "sk_drops"
    );
    // No client retransmitted a SYN (all got SYN-ACKs): every TCPSynRetrans is ours.
    assert_eq!(
        counter(
            &scrape,
            "backlogd_listen_synack_retransmits_total",
            &listener,
            &[]
        ),
        kernel.syn_retrans
    );
    assert!(kernel.syn_retrans >= 8, "{kernel:?}");
}

#[test]
fn final_ack_overflow_equals_listen_overflows_and_synack_retransmits() {
    final_ack_overflow("0");
}

#[test]
fn final_ack_overflow_with_abort_on_overflow_is_counted_the_same() {
    final_ack_overflow("1");
}
