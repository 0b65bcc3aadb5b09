//! Who is being dropped: each listener's drops and syncookies by source prefix, checked
//! against nft counters of the SYNs each prefix sent and against the namespace's TcpExt,
//! for the same interval. Clients bind distinct 127.x.y.z sources (every address of
//! 127.0.0.0/8 is local on a namespace's loopback) or, for IPv6, addresses of a prefix the
//! test routes to loopback; traffic stays inside the test's namespace.
//!
//! The capacity test runs alone ([`ALONE`]; the others beside each other): every daemon's
//! programs see every listener on the host, and its map of three slots would take other
//! tests' prefixes.

use std::{
    net::{IpAddr, SocketAddr},
    sync::{RwLock, RwLockReadGuard, RwLockWriteGuard},
    time::Duration,
};

use backlogd_common::{
    names::{figure, map},
    netstat::counter,
};
use backlogd_tests::{
    Daemon, Exact, Netns,
    kernel::{ListenCounters, tcp_ext},
    sockets::{Listener, fill_accept_queue, kernel_queue, tcp_state},
};
use serde_json::Value;
use socket2::{Domain, Socket, Type};

static ALONE: RwLock<()> = RwLock::new(());

/// `tcpi_state` of an established socket.
const TCP_ESTABLISHED: u8 = 1;

/// Held by the capacity test: no other test's drops while it runs.
fn alone() -> RwLockWriteGuard<'static, ()> {
    ALONE.write().unwrap_or_else(|e| e.into_inner())
}

/// Held by every other test: they may run together, never beside the capacity test.
fn shared() -> RwLockReadGuard<'static, ()> {
    ALONE.read().unwrap_or_else(|e| e.into_inner())
}

/// Sources: (prefix as nft and backlogd write it, its first three octets, clients).
/// Unequal sizes, so the order by drops is known.
const V4: [(&str, [u8; 3], u16); 5] = [
    ("127.20.1.0/24", [127, 20, 1], 200),
    ("127.20.2.0/24", [127, 20, 2], 150),
    ("127.20.3.0/24", [127, 20, 3], 100),
    ("127.20.4.0/24", [127, 20, 4], 40),
    ("127.20.5.0/24", [127, 20, 5], 10),
];

/// Non-blocking connects to `to`, one client bound to each of `sources`, from inside `ns`.
fn connect_from(ns: &Netns, to: SocketAddr, sources: Vec<IpAddr>) -> Vec<Socket> {
    ns.run(move || {
        sources
            .into_iter()
            .map(|src| {
                let s = Socket::new(Domain::for_address(to), Type::STREAM, None)
                    .expect("client socket()");
                s.set_nonblocking(true).expect("non-blocking");
                if src.is_ipv6() {
                    // The prefix is routed to loopback, not assigned: bind without it.
                    s.set_freebind_v6(true).expect("IPV6_FREEBIND");
                }
                s.bind(&SocketAddr::new(src, 0).into())
                    .unwrap_or_else(|e| panic!("bind {src}: {e}"));
                match s.connect(&to.into()) {
                    Ok(()) => {}
                    Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => {}
                    Err(e) => panic!("connect {src} -> {to}: {e}"),
                }
                s
            })
            .collect()
    })
}

fn v4_sources(octets: [u8; 3], clients: u16) -> Vec<IpAddr> {
    (1..=clients)
        .map(|host| {
            let host = u8::try_from(host).expect("at most 254 clients a prefix");
            IpAddr::from([octets[0], octets[1], octets[2], host])
        })
        .collect()
}

/// A daemon started with `args`, and a listener with backlog 1 on `addr` in a new
/// namespace (syncookies off) whose accept queue is held full by backlog + 1 connections
/// from the listener's own address (not under any test prefix): every SYN that arrives
/// next is dropped. Destructured by each test, which drops the parts in its own order.
struct FullQueue {
    daemon: Daemon,
    ns: Netns,
    listener: Listener,
    held: Vec<Socket>,
}

fn full_queue(args: &[&str], addr: &str) -> FullQueue {
    let daemon = Daemon::start_with(args);
    let ns = Netns::new();
    ns.sysctl("net.ipv4.tcp_syncookies", "0");
    let listener = Listener::open(&ns, addr, 1);
    daemon.wait_for_listener(listener.inode);
    let held = fill_accept_queue(&ns, &listener, listener.addr, 2);
    FullQueue {
        daemon,
        ns,
        listener,
        held,
    }
}

/// The listener's `drop_sources` in the API, once its prefixes, expired and untracked
/// counts add up to its drops and syncookies in the same snapshot (the programs settle a segment
/// when the kernel is done with it: in tracepoint mode possibly at the next segment).
fn settled_sources(daemon: &Daemon, l: &Listener) -> Value {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let listener = daemon.api_listener(l.inode);
        let d = &listener["drop_sources"];
        let sum = |o: &Value| {
            ["syn_drops", "final_ack_drops", "cookies"]
                .iter()
                .map(|k| o[*k].as_u64().unwrap_or(0))
                .sum::<u64>()
        };
        let drops: u64 = listener["drops"]
            .as_object()
            .map(|o| o.values().filter_map(Value::as_u64).sum())
            .unwrap_or(0);
        let cookies = listener["syncookies_sent"].as_u64().unwrap_or(0);
        if !d.is_null()
            && sum(&d["counted"]) + sum(&d["expired"]) + sum(&d["untracked"]) == drops + cookies
        {
            return d.clone();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "drop_sources never added up to the listener's drops and cookies: {listener:#}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `prefix`'s entry in `sources.top`.
fn prefix<'a>(sources: &'a Value, prefix: &str) -> &'a Value {
    sources["top"]
        .as_array()
        .unwrap_or_else(|| panic!("no top in {sources:#}"))
        .iter()
        .find(|s| s["prefix"] == prefix)
        .unwrap_or_else(|| panic!("{prefix} not among {sources:#}"))
}

fn count(v: &Value, key: &str) -> u64 {
    v[key]
        .as_u64()
        .unwrap_or_else(|| panic!("no {key} in {v:#}"))
}

/// The accept queue held full, so every SYN that arrives is dropped: 500 clients from
/// five /24s. Per prefix, backlogd's SYN drops equal the nft counter of the SYNs that
/// prefix sent (retransmissions included); summed, TcpExt ListenDrops; nothing is
/// untracked; the prefixes come most first with the shares the nft counters give; the
/// Prometheus gauges agree.
#[test]
fn syn_drops_per_source_prefix_equal_the_syns_each_prefix_sent() {
    let _shared = shared();
    let FullQueue {
        daemon,
        ns,
        listener,
        held,
    } = full_queue(&[], "127.0.0.1:0");
    let prefixes: Vec<&str> = V4.iter().map(|(p, _, _)| *p).collect();
    ns.count_incoming_syns_from(listener.addr.port(), &prefixes);
    let before = tcp_ext(&ns);
    let start = daemon.program_misses();
    let mut clients = Vec::new();
    for (_, octets, n) in V4 {
        clients.extend(connect_from(&ns, listener.addr, v4_sources(octets, n)));
    }
    // No more SYNs once the clients are closed: the interval ends here.
    drop(clients);
    std::thread::sleep(Duration::from_millis(100));
    let kernel = ListenCounters::delta(&before, &tcp_ext(&ns));
    let sent = ns.incoming_syns_from();
    let queue = kernel_queue(&ns, &listener);
    let sources = settled_sources(&daemon, &listener);
    let scrape = daemon.scrape();

    // The scenario did what it is for: every SYN met the full queue.
    assert_eq!(queue.recv_q, 2, "accept queue holds backlog + 1: {queue:?}");
    assert_eq!(sent.len(), V4.len(), "one nft counter per prefix: {sent:?}");
    let total: u64 = sent.iter().sum();
    assert!(total >= 500, "every client sent a SYN: {sent:?}");

    let mut exact = Exact::listener(&daemon, &ns, &listener);
    exact.interval(&daemon, &start);
    exact
        .evidence("kernel TcpExt delta", kernel)
        .evidence("nft SYNs per prefix", &sent)
        .evidence("drop_sources", &sources);
    for ((name, _, clients), syns) in V4.iter().zip(&sent) {
        let p = prefix(&sources, name);
        exact.eq_fed(
            &format!("{name}: SYN drops vs the SYNs nft counted from it"),
            &[figure::DROPS],
            count(p, "syn_drops"),
            *syns,
        );
        // Every client's first SYN was dropped, and none connected (closed meanwhile).
        exact.eq_fed(
            &format!("{name}: dropped attempts vs its clients"),
            &[figure::CLIENT_IMPACT],
            count(p, "attempts"),
            u64::from(*clients),
        );
        exact.eq(&format!("{name}: connected"), count(p, "connected"), 0);
        exact.eq(
            &format!("{name}: final-ACK drops"),
            count(p, "final_ack_drops"),
            0,
        );
        exact.eq(&format!("{name}: cookies"), count(p, "cookies"), 0);
    }
    exact
        .eq_fed(
            "SYN drops under a prefix, summed, vs ListenDrops",
            &[figure::DROPS],
            count(&sources["counted"], "syn_drops"),
            kernel.listen_drops,
        )
        .eq_fed(
            "SYN drops vs ListenOverflows (all at a full accept queue)",
            &[figure::DROPS],
            count(&sources["counted"], "syn_drops"),
            kernel.listen_overflows,
        )
        .eq(
            "untracked drops and cookies",
            ["syn_drops", "final_ack_drops", "cookies"]
                .iter()
                .map(|k| count(&sources["untracked"], k))
                .sum(),
            0,
        )
        .eq(
            "distinct prefixes vs prefixes that sent SYNs",
            count(&sources, "prefixes"),
            V4.len() as u64,
        );
    exact.verify();

    // Most first, with each prefix's share of the SYNs nft counted.
    let order: Vec<&str> = sources["top"]
        .as_array()
        .expect("top")
        .iter()
        .map(|s| s["prefix"].as_str().expect("prefix"))
        .collect();
    assert_eq!(order, prefixes, "{sources:#}");
    let share = sent[0] as f64 / total as f64;
    assert_eq!(sources["top_share"].as_f64(), Some(share), "{sources:#}");
    assert_eq!(prefix(&sources, V4[0].0)["share"].as_f64(), Some(share));
    // /metrics says the same, without addresses.
    let socket = listener.inode.to_string();
    let labels = [("socket", socket.as_str())];
    assert_eq!(
        scrape.value("backlogd_listen_drop_source_prefixes", &labels),
        Some(V4.len() as f64),
        "{}",
        scrape.text
    );
    assert_eq!(
        scrape.value("backlogd_listen_drop_source_top_share", &labels),
        Some(share)
    );
    assert_eq!(
        scrape.value("backlogd_listen_drop_sources_untracked_total", &labels),
        Some(0.0)
    );
    assert!(
        !scrape.text.contains("prefix="),
        "no client address in /metrics unless opted in:\n{}",
        scrape.text
    );
    drop(held);
}

/// Opted in with `--drop-source-top-series 2`: /metrics serves a series for each of the
/// listener's two largest prefixes of the last five minutes, equal to the SYNs nft counted
/// from it, and none for the third.
#[test]
fn the_opt_in_series_serve_the_largest_prefixes_exactly_and_no_more() {
    let _shared = shared();
    let FullQueue {
        daemon,
        ns,
        listener,
        held,
    } = full_queue(&["--drop-source-top-series", "2"], "127.0.0.1:0");
    let three = &V4[1..4];
    let prefixes: Vec<&str> = three.iter().map(|(p, _, _)| *p).collect();
    ns.count_incoming_syns_from(listener.addr.port(), &prefixes);
    let start = daemon.program_misses();
    let mut clients = Vec::new();
    for (_, octets, n) in three {
        clients.extend(connect_from(
            &ns,
            listener.addr,
            v4_sources(*octets, *n / 5),
        ));
    }
    drop(clients);
    std::thread::sleep(Duration::from_millis(100));
    let sent = ns.incoming_syns_from();
    let sources = settled_sources(&daemon, &listener);
    let scrape = daemon.scrape();
    let socket = listener.inode.to_string();
    let series = |prefix: &str| {
        scrape.value(
            "backlogd_listen_drop_source_recent_segments",
            &[("socket", &socket), ("prefix", prefix)],
        )
    };
    let mut exact = Exact::listener(&daemon, &ns, &listener);
    exact.interval(&daemon, &start);
    exact
        .evidence("nft SYNs per prefix", &sent)
        .evidence("drop_sources", &sources);
    for ((name, _, _), syns) in three.iter().zip(&sent).take(2) {
        exact.eq_fed(
            &format!("{name}: its series vs the SYNs nft counted from it"),
            &[figure::DROPS],
            series(name).unwrap_or_else(|| panic!("no series for {name}:\n{}", scrape.text)) as u64,
            *syns,
        );
    }
    exact.verify();
    assert_eq!(series(three[2].0), None, "the third prefix has no series");
    assert_eq!(
        scrape
            .text
            .lines()
            .filter(|l| l.starts_with("backlogd_listen_drop_source_recent_segments{"))
            .filter(|l| l.contains(&format!("socket=\"{socket}\"")))
            .count(),
        2
    );
    drop(held);
}

/// With `tcp_syncookies = 2` every SYN is answered with a cookie (TcpExt
/// TCPReqQFullDoCookies): three prefixes' clients complete their handshakes that way, and
/// per prefix the cookies equal the SYNs nft counted from it, with no drop.
#[test]
fn syncookies_per_source_prefix_equal_the_syns_each_prefix_sent() {
    let _shared = shared();
    let daemon = Daemon::start();
    let ns = Netns::new();
    ns.sysctl("net.ipv4.tcp_syncookies", "2");
    // Room for every client on the accept queue: cookies, not drops.
    let listener = Listener::open(&ns, "127.0.0.1:0", 512);
    daemon.wait_for_listener(listener.inode);
    let used = &V4[..3];
    let prefixes: Vec<&str> = used.iter().map(|(p, _, _)| *p).collect();
    ns.count_incoming_syns_from(listener.addr.port(), &prefixes);
    let before = tcp_ext(&ns);
    let start = daemon.program_misses();
    let mut clients = Vec::new();
    for (_, octets, n) in used {
        clients.extend(connect_from(&ns, listener.addr, v4_sources(*octets, n / 4)));
    }
    let expected: u64 = used.iter().map(|(_, _, n)| u64::from(n / 4)).sum();
    let queue = backlogd_tests::sockets::wait_for_queue(&ns, &listener, expected);
    drop(clients);
    std::thread::sleep(Duration::from_millis(100));
    let kernel = ListenCounters::delta(&before, &tcp_ext(&ns));
    let sent = ns.incoming_syns_from();
    let sources = settled_sources(&daemon, &listener);

    assert_eq!(queue.recv_q, expected, "every client connected: {queue:?}");
    assert_eq!(kernel.listen_drops, 0, "{kernel:?}");

    let mut exact = Exact::listener(&daemon, &ns, &listener);
    exact.interval(&daemon, &start);
    exact
        .evidence("kernel TcpExt delta", kernel)
        .evidence("nft SYNs per prefix", &sent)
        .evidence("drop_sources", &sources);
    for ((name, _, _), syns) in used.iter().zip(&sent) {
        let p = prefix(&sources, name);
        exact.eq_fed(
            &format!("{name}: cookies vs the SYNs nft counted from it"),
            &[figure::SYNCOOKIES],
            count(p, "cookies"),
            *syns,
        );
        exact.eq(&format!("{name}: SYN drops"), count(p, "syn_drops"), 0);
    }
    exact
        .eq_fed(
            "cookies under a prefix, summed, vs TCPReqQFullDoCookies",
            &[figure::SYNCOOKIES],
            count(&sources["counted"], "cookies"),
            kernel.reqq_full_do_cookies,
        )
        .eq(
            "untracked cookies",
            count(&sources["untracked"], "cookies"),
            0,
        )
        .eq(
            "distinct prefixes",
            count(&sources, "prefixes"),
            used.len() as u64,
        );
    exact.verify();
}

/// IPv6: a /48 routed to the namespace's loopback, clients bound (freebind) to addresses in
/// two /48s of it and one in a third; per /48, drops equal nft's SYN counts.
#[test]
fn ipv6_sources_are_counted_per_48() {
    let _shared = shared();
    let FullQueue {
        daemon,
        ns,
        listener,
        held,
    } = full_queue(&[], "[::1]:0");
    ns.command(
        "ip",
        &["-6", "route", "add", "local", "fd00:20::/32", "dev", "lo"],
    );
    let groups: [(&str, &str, u16); 3] = [
        ("fd00:20:1::/48", "fd00:20:1:", 30),
        ("fd00:20:2::/48", "fd00:20:2:", 20),
        ("fd00:20:3::/48", "fd00:20:3:", 5),
    ];
    let prefixes: Vec<&str> = groups.iter().map(|(p, _, _)| *p).collect();
    ns.count_incoming_syns_from(listener.addr.port(), &prefixes);
    let before = tcp_ext(&ns);
    let start = daemon.program_misses();
    let mut clients = Vec::new();
    for (_, stem, n) in groups {
        // Distinct /64s inside the /48: folded to the same prefix.
        let sources = (1..=n)
            .map(|i| format!("{stem}{i:x}::1").parse().expect("IPv6 source"))
            .collect();
        clients.extend(connect_from(&ns, listener.addr, sources));
    }
    drop(clients);
    std::thread::sleep(Duration::from_millis(100));
    let kernel = ListenCounters::delta(&before, &tcp_ext(&ns));
    let sent = ns.incoming_syns_from();
    let sources = settled_sources(&daemon, &listener);

    let mut exact = Exact::listener(&daemon, &ns, &listener);
    exact.interval(&daemon, &start);
    exact
        .evidence("kernel TcpExt delta", kernel)
        .evidence("nft SYNs per prefix", &sent)
        .evidence("drop_sources", &sources);
    for ((name, _, _), syns) in groups.iter().zip(&sent) {
        exact.eq_fed(
            &format!("{name}: SYN drops vs the SYNs nft counted from it"),
            &[figure::DROPS],
            count(prefix(&sources, name), "syn_drops"),
            *syns,
        );
    }
    exact
        .eq_fed(
            "SYN drops under a prefix, summed, vs ListenDrops",
            &[figure::DROPS],
            count(&sources["counted"], "syn_drops"),
            kernel.listen_drops,
        )
        .eq(
            "distinct prefixes",
            count(&sources, "prefixes"),
            groups.len() as u64,
        );
    exact.verify();
    drop(held);
}

/// A dual-stack listener (`[::]`) receives IPv4 clients' segments as IPv4 and IPv6
/// clients' as IPv6: each family is folded at its own configured length, here lengths
/// that end inside a byte (IPv4 /20, IPv6 /44), so two /24s fold into one /20 and the next
/// /20 starts a prefix of its own. Per prefix, drops equal the SYNs nft counted from it;
/// summed, ListenDrops; nothing untracked.
#[test]
fn a_dual_stack_listener_folds_each_family_at_its_own_length() {
    let _shared = shared();
    let FullQueue {
        daemon,
        ns,
        listener,
        held,
    } = full_queue(
        &[
            "--drop-source-prefix-v4",
            "20",
            "--drop-source-prefix-v6",
            "44",
        ],
        "[::]:0",
    );
    ns.command(
        "ip",
        &["-6", "route", "add", "local", "fd00:20::/32", "dev", "lo"],
    );
    let port = listener.addr.port();
    let v4: SocketAddr = ([127, 0, 0, 1], port).into();
    let v6: SocketAddr = (std::net::Ipv6Addr::LOCALHOST, port).into();
    let six = |stem: &str, n: u16| -> Vec<IpAddr> {
        (1..=n)
            .map(|i| format!("{stem}{i:x}::1").parse().expect("IPv6 source"))
            .collect()
    };
    // (prefix as backlogd and nft write it, destination, sources): unequal sizes.
    let groups: [(&str, SocketAddr, Vec<IpAddr>); 4] = [
        (
            "127.20.0.0/20",
            v4,
            [v4_sources([127, 20, 1], 20), v4_sources([127, 20, 15], 12)].concat(),
        ),
        ("127.20.16.0/20", v4, v4_sources([127, 20, 16], 9)),
        // fd00:20:0::/44 holds fd00:20:0: to fd00:20:f: (the third group's top 12 bits).
        (
            "fd00:20::/44",
            v6,
            [six("fd00:20:1:", 14), six("fd00:20:f:", 3)].concat(),
        ),
        ("fd00:20:10::/44", v6, six("fd00:20:10:", 6)),
    ];
    let prefixes: Vec<&str> = groups.iter().map(|(p, _, _)| *p).collect();
    ns.count_incoming_syns_from(port, &prefixes);
    let before = tcp_ext(&ns);
    let start = daemon.program_misses();
    let mut clients = Vec::new();
    for (_, to, sources) in &groups {
        clients.extend(connect_from(&ns, *to, sources.clone()));
    }
    drop(clients);
    std::thread::sleep(Duration::from_millis(100));
    let kernel = ListenCounters::delta(&before, &tcp_ext(&ns));
    let sent = ns.incoming_syns_from();
    let sources = settled_sources(&daemon, &listener);

    let mut exact = Exact::listener(&daemon, &ns, &listener);
    exact.interval(&daemon, &start);
    exact
        .evidence("kernel TcpExt delta", kernel)
        .evidence("nft SYNs per prefix", &sent)
        .evidence("drop_sources", &sources);
    for ((name, _, _), syns) in groups.iter().zip(&sent) {
        exact.eq_fed(
            &format!("{name}: SYN drops vs the SYNs nft counted from it"),
            &[figure::DROPS],
            count(prefix(&sources, name), "syn_drops"),
            *syns,
        );
    }
    exact
        .eq_fed(
            "SYN drops under a prefix, summed, vs ListenDrops",
            &[figure::DROPS],
            count(&sources["counted"], "syn_drops"),
            kernel.listen_drops,
        )
        .eq(
            "SYN drops untracked",
            count(&sources["untracked"], "syn_drops"),
            0,
        )
        .eq(
            "distinct prefixes",
            count(&sources, "prefixes"),
            groups.len() as u64,
        );
    exact.verify();
    drop(held);
}

/// With room for three prefixes (`--drop-source-entries 3`), five prefixes' SYNs dropped
/// at a full accept queue: the first three hold slots and stay exact against nft; every
/// drop of the other two is counted untracked, exactly, in the API and on /metrics; held
/// and untracked together equal ListenDrops.
#[test]
fn a_full_source_map_counts_the_rest_untracked_exactly() {
    let _alone = alone();
    let FullQueue {
        daemon,
        ns,
        listener,
        held,
    } = full_queue(&["--drop-source-entries", "3"], "127.0.0.1:0");
    let prefixes: Vec<&str> = V4.iter().map(|(p, _, _)| *p).collect();
    ns.count_incoming_syns_from(listener.addr.port(), &prefixes);
    let before = tcp_ext(&ns);
    let start = daemon.program_misses();
    // One prefix after the other: the first three take the slots.
    let mut clients = Vec::new();
    for (_, octets, n) in V4 {
        clients.extend(connect_from(&ns, listener.addr, v4_sources(octets, n / 5)));
    }
    drop(clients);
    std::thread::sleep(Duration::from_millis(100));
    let kernel = ListenCounters::delta(&before, &tcp_ext(&ns));
    let sent = ns.incoming_syns_from();
    let sources = settled_sources(&daemon, &listener);
    let scrape = daemon.scrape();

    let mut exact = Exact::listener(&daemon, &ns, &listener);
    exact.interval(&daemon, &start);
    exact
        .evidence("kernel TcpExt delta", kernel)
        .evidence("nft SYNs per prefix", &sent)
        .evidence("drop_sources", &sources);
    for ((name, _, _), syns) in V4.iter().zip(&sent).take(3) {
        exact.eq_fed(
            &format!("{name} (holds a slot): SYN drops vs nft"),
            &[figure::DROPS],
            count(prefix(&sources, name), "syn_drops"),
            *syns,
        );
    }
    let untracked_truth: u64 = sent[3..].iter().sum();
    let socket = listener.inode.to_string();
    exact
        .eq("prefixes held", count(&sources, "prefixes"), 3)
        .eq_fed(
            "untracked SYN drops vs the SYNs nft counted from the two prefixes without a slot",
            &[figure::DROPS],
            count(&sources["untracked"], "syn_drops"),
            untracked_truth,
        )
        .eq_fed(
            "backlogd_listen_drop_sources_untracked_total vs the same",
            &[figure::DROPS],
            scrape
                .value(
                    "backlogd_listen_drop_sources_untracked_total",
                    &[("socket", &socket)],
                )
                .unwrap_or_else(|| panic!("no untracked series:\n{}", scrape.text))
                as u64,
            untracked_truth,
        )
        .eq_fed(
            "held plus untracked SYN drops vs ListenDrops",
            &[figure::DROPS],
            count(&sources["counted"], "syn_drops") + count(&sources["untracked"], "syn_drops"),
            kernel.listen_drops,
        );
    exact.verify();
    drop(held);
}

/// Client addresses are personal data: a reader that is not on the daemon's host gets the
/// counts and shares but no prefix, in the snapshot and in doctor's findings alike, unless
/// `--drop-source-addresses-remote true`. The
/// daemon serves inside a test namespace with a second address outside 127.0.0.0/8, so a
/// request from that address is a reader elsewhere, and one from 127.0.0.1 is local.
#[test]
fn source_prefixes_go_only_to_local_readers_unless_opted_in() {
    let _shared = shared();
    let ns = Netns::new();
    ns.sysctl("net.ipv4.tcp_syncookies", "0");
    // An address outside 127.0.0.0/8 (on loopback: kernels here lack dummy interfaces).
    ns.command("ip", &["addr", "add", "10.77.0.1/32", "dev", "lo"]);
    let enter = format!("--net={}", ns.path());
    let listener = Listener::open(&ns, "127.0.0.1:0", 1);
    let held = fill_accept_queue(&ns, &listener, listener.addr, 2);
    for (remote_allowed, expect_top_remote) in [(false, false), (true, true)] {
        let daemon = Daemon::start_wrapped(
            &["nsenter", &enter, "--"],
            &[
                "--listen",
                "0.0.0.0:0",
                "--drop-source-addresses-remote",
                &remote_allowed.to_string(),
                // The flood's attempts abandoned soon: doctor's syn_flood quotes the prefix.
                "--client-impact-horizon",
                "2",
            ],
        );
        let port = daemon.addr.port();
        // 25 spoofed SYNs this daemon sees dropped, from 127.20.1.1 to .25.
        let SocketAddr::V4(target) = listener.addr else {
            unreachable!("an IPv4 listener")
        };
        raw_syns(
            &ns,
            target,
            (1..=25)
                .map(|h| std::net::Ipv4Addr::new(127, 20, 1, h))
                .collect(),
        );
        let get = |from: [u8; 4]| -> Value {
            let to = SocketAddr::from((from, port));
            let inode = listener.inode;
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            loop {
                let (status, body) = ns
                    .run(move || backlogd_tests::http::try_get(to, "/api/v1/snapshot"))
                    .unwrap_or_else(|e| panic!("GET {to}: {e}"));
                assert_eq!(status, 200, "{body}");
                let snapshot: Value = serde_json::from_str(&body).expect("JSON");
                let l = snapshot["listeners"]
                    .as_array()
                    .and_then(|ls| ls.iter().find(|l| l["inode"] == inode).cloned());
                if let Some(d) = l.map(|l| l["drop_sources"].clone())
                    && d["counted"]["syn_drops"] == 25
                {
                    return d;
                }
                assert!(
                    std::time::Instant::now() < deadline,
                    "no drop_sources for {inode} from {to}: {snapshot:#}"
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        };
        let local = get([127, 0, 0, 1]);
        assert_eq!(
            prefix(&local, "127.20.1.0/24")["syn_drops"],
            25,
            "loopback reader: {local:#}"
        );
        assert_eq!(local["withheld"], false);
        let remote = get([10, 77, 0, 1]);
        assert_eq!(remote["prefixes"], 1, "{remote:#}");
        assert_eq!(remote["top_share"], 1.0, "{remote:#}");
        if expect_top_remote {
            assert_eq!(
                prefix(&remote, "127.20.1.0/24")["syn_drops"],
                25,
                "opted in: {remote:#}"
            );
            assert_eq!(remote["withheld"], false);
        } else {
            assert!(remote.get("top").is_none(), "{remote:#}");
            assert_eq!(remote["withheld"], true, "{remote:#}");
        }
        // Doctor's findings quote the prefix too: served by the same rule.
        let findings = |from: [u8; 4]| -> String {
            let to = SocketAddr::from((from, port));
            let deadline = std::time::Instant::now() + Duration::from_secs(15);
            loop {
                let (status, body) = ns
                    .run(move || backlogd_tests::http::try_get(to, "/api/v1/findings"))
                    .unwrap_or_else(|e| panic!("GET {to}: {e}"));
                assert_eq!(status, 200, "{body}");
                if body.contains("\"syn_flood\"") {
                    return body;
                }
                assert!(
                    std::time::Instant::now() < deadline,
                    "no syn_flood finding from {to}: {body}"
                );
                std::thread::sleep(Duration::from_millis(100));
            }
        };
        assert!(findings([127, 0, 0, 1]).contains("127.20.1.0/24"));
        let remote = findings([10, 77, 0, 1]);
        assert_eq!(
            remote.contains("127.20.1.0/24"),
            expect_top_remote,
            "findings served to a reader elsewhere (opted in: {remote_allowed}): {remote}"
        );
    }
    drop(held);
}

/// Listener inodes holding entries of the daemon's DROP_SOURCES map (bpftool's dump: the
/// key formatted from BTF, or its raw bytes, the inode being the first eight).
fn inodes_with_sources(daemon: &Daemon) -> Vec<u64> {
    let id = backlogd_tests::bpf::map_of(daemon.pid(), map::DROP_SOURCES);
    backlogd_tests::bpf::bpftool(&["map", "dump", "id", &id])
        .as_array()
        .expect("map dump")
        .iter()
        .map(|entry| {
            if let Some(ino) = entry["formatted"]["key"]["listener_ino"].as_u64() {
                return ino;
            }
            let bytes: Vec<u8> = entry["key"]
                .as_array()
                .unwrap_or_else(|| panic!("unexpected entry {entry}"))
                .iter()
                .take(8)
                .map(|b| {
                    let hex = b.as_str().expect("hex byte").trim_start_matches("0x");
                    u8::from_str_radix(hex, 16).expect("hex byte")
                })
                .collect();
            u64::from_le_bytes(bytes.try_into().expect("8 key bytes"))
        })
        .collect()
}

/// The programs never remove a prefix; the daemon's rescans remove a closed listener's
/// once no listener has had its inode for a whole interval (`--rescan-interval 1`), so a
/// host whose listeners come and go does not fill the map with the dead ones' prefixes.
#[test]
fn a_closed_listeners_prefixes_are_removed_by_the_rescans() {
    let _shared = shared();
    let FullQueue {
        daemon,
        ns,
        listener,
        held,
    } = full_queue(&["--rescan-interval", "1"], "127.0.0.1:0");
    drop(connect_from(
        &ns,
        listener.addr,
        v4_sources([127, 20, 1], 3),
    ));
    let sources = settled_sources(&daemon, &listener);
    assert_eq!(count(&sources, "prefixes"), 1, "{sources:#}");
    let inode = listener.inode;
    assert!(
        inodes_with_sources(&daemon).contains(&inode),
        "the map holds the listener's prefix"
    );
    drop(held);
    drop(listener);
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    while inodes_with_sources(&daemon).contains(&inode) {
        assert!(
            std::time::Instant::now() < deadline,
            "the closed listener {inode}'s prefixes are still in DROP_SOURCES after 15 s; log:\n{}",
            daemon.log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Client addresses are kept no longer than `drop_source_retention` after a prefix's newest
/// segment. With 10 s: two prefixes' SYN drops are counted exactly (against nft), also in
/// the recent window (a young daemon's window is its whole life); then the daemon removes
/// both prefixes from the API and from the kernel's map, which keeps one entry for the
/// listener, and their counts stay, exactly, as the listener's expired counts, since start
/// and in the window. The gauges of the window go to zero.
///
/// Named to sort first, so its wait overlaps the other tests; it holds the shared lock only
/// while its clients drop (the capacity test must see no other test's drops).
#[test]
fn a_prefix_quiet_for_its_retention_is_forgotten_and_its_counts_stay_as_expired() {
    let shared = shared();
    let FullQueue {
        daemon,
        ns,
        listener,
        held,
    } = full_queue(&["--drop-source-retention", "10"], "127.0.0.1:0");
    let two = &V4[3..];
    let prefixes: Vec<&str> = two.iter().map(|(p, _, _)| *p).collect();
    ns.count_incoming_syns_from(listener.addr.port(), &prefixes);
    let before = tcp_ext(&ns);
    let start = daemon.program_misses();
    let mut clients = Vec::new();
    for (_, octets, n) in two {
        clients.extend(connect_from(&ns, listener.addr, v4_sources(*octets, *n)));
    }
    drop(clients);
    std::thread::sleep(Duration::from_millis(100));
    let kernel = ListenCounters::delta(&before, &tcp_ext(&ns));
    let sent = ns.incoming_syns_from();
    let held_sources = settled_sources(&daemon, &listener);
    let total: u64 = sent.iter().sum();
    // No more drops on this listener: the capacity test may run while this one waits.
    drop(shared);

    // Forgotten within the retention plus the 10 s between expiry passes.
    let deadline = std::time::Instant::now() + Duration::from_secs(40);
    let expired = loop {
        let d = settled_sources(&daemon, &listener);
        if count(&d, "prefixes") == 0 {
            break d;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "prefixes still held 40 s after their last segment with a 10 s retention: {d:#}"
        );
        std::thread::sleep(Duration::from_millis(500));
    };
    let scrape = daemon.scrape();
    let socket = listener.inode.to_string();
    let labels = [("socket", socket.as_str())];
    let map_entries = inodes_with_sources(&daemon)
        .into_iter()
        .filter(|i| *i == listener.inode)
        .count();

    let mut exact = Exact::listener(&daemon, &ns, &listener);
    exact.interval(&daemon, &start);
    exact
        .evidence("kernel TcpExt delta", kernel)
        .evidence("nft SYNs per prefix", &sent)
        .evidence("drop_sources while held", &held_sources)
        .evidence("drop_sources once expired", &expired);
    for ((name, _, _), syns) in two.iter().zip(&sent) {
        exact.eq_fed(
            &format!("{name} while held: SYN drops vs nft"),
            &[figure::DROPS],
            count(prefix(&held_sources, name), "syn_drops"),
            *syns,
        );
        exact.eq_fed(
            &format!("{name} in the recent window while held: SYN drops vs nft"),
            &[figure::DROPS],
            count(prefix(&held_sources["recent"], name), "syn_drops"),
            *syns,
        );
    }
    exact
        .eq_fed(
            "expired SYN drops vs the SYNs nft counted from both prefixes",
            &[figure::DROPS],
            count(&expired["expired"], "syn_drops"),
            total,
        )
        .eq_fed(
            "expired SYN drops vs ListenDrops",
            &[figure::DROPS],
            count(&expired["expired"], "syn_drops"),
            kernel.listen_drops,
        )
        .eq_fed(
            "expired SYN drops in the recent window vs nft",
            &[figure::DROPS],
            count(&expired["recent"]["expired"], "syn_drops"),
            total,
        )
        .eq(
            "counted under a prefix once expired",
            count(&expired["counted"], "syn_drops"),
            0,
        )
        .eq("untracked", count(&expired["untracked"], "syn_drops"), 0)
        .eq(
            "prefixes in the recent window once expired",
            count(&expired["recent"], "prefixes"),
            0,
        )
        .eq(
            "the listener's entries in the kernel's map: its expired entry only",
            map_entries as u64,
            1,
        )
        .eq(
            "backlogd_listen_drop_source_prefixes once expired",
            scrape
                .value("backlogd_listen_drop_source_prefixes", &labels)
                .unwrap_or_else(|| panic!("no prefixes series:\n{}", scrape.text))
                as u64,
            0,
        );
    exact.verify();
    assert_eq!(
        expired["top"].as_array().map(Vec::len),
        Some(0),
        "no address is kept: {expired:#}"
    );
    assert_eq!(
        scrape.value("backlogd_listen_drop_source_top_share", &labels),
        Some(0.0)
    );
    drop(held);
}

/// One TCP SYN from `src` (any address: spoofed) to `to`, IPv4, through a raw socket in
/// `ns`: a flood's segment, never retransmitted and never answered by a client socket.
fn raw_syns(ns: &Netns, to: std::net::SocketAddrV4, sources: Vec<std::net::Ipv4Addr>) {
    ns.run(move || {
        // IPPROTO_RAW: the header is ours (IP_HDRINCL implied).
        let s = Socket::new(
            Domain::IPV4,
            Type::RAW,
            Some(socket2::Protocol::from(libc::IPPROTO_RAW)),
        )
        .expect("raw socket (root)");
        for (i, src) in sources.into_iter().enumerate() {
            let sport = 20000 + i as u16;
            let packet = syn_packet(src, sport, to, 0x1000_0000 + i as u32);
            s.send_to(&packet, &SocketAddr::V4(to).into())
                .unwrap_or_else(|e| panic!("raw SYN from {src}: {e}"));
        }
    });
}

/// IPv6 [`raw_syns`]: the 40-byte header is ours too (IPPROTO_RAW implies IPV6_HDRINCL).
fn raw_syns_v6(ns: &Netns, to: std::net::SocketAddrV6, sources: Vec<std::net::Ipv6Addr>) {
    ns.run(move || {
        let s = Socket::new(
            Domain::IPV6,
            Type::RAW,
            Some(socket2::Protocol::from(libc::IPPROTO_RAW)),
        )
        .expect("raw IPv6 socket (root)");
        for (i, src) in sources.into_iter().enumerate() {
            let sport = 20000 + i as u16;
            let tcp = tcp_syn(&src.octets(), sport, &to.ip().octets(), to.port(), i as u32);
            let mut ip = vec![0x60, 0, 0, 0, 0, 20, 6, 64]; // version 6; payload 20; TCP; hops
            ip.extend(src.octets());
            ip.extend(to.ip().octets());
            // A raw IPv6 socket reads the address's port as the next header: none here.
            let dst = SocketAddr::new(IpAddr::V6(*to.ip()), 0);
            s.send_to(&[ip, tcp].concat(), &dst.into())
                .unwrap_or_else(|e| panic!("raw SYN from {src}: {e}"));
        }
    });
}

/// The Internet checksum of what `words` summed.
fn fold(mut sum: u32) -> u16 {
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

fn words(b: &[u8]) -> u32 {
    b.chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)])))
        .sum()
}

/// A 20-byte TCP SYN from `src` to `dst` (both addresses of one family), with its
/// checksum over the family's pseudo-header.
fn tcp_syn(src: &[u8], sport: u16, dst: &[u8], dport: u16, seq: u32) -> Vec<u8> {
    let mut tcp = Vec::with_capacity(20);
    tcp.extend(sport.to_be_bytes());
    tcp.extend(dport.to_be_bytes());
    tcp.extend(seq.to_be_bytes());
    tcp.extend(0u32.to_be_bytes()); // ack
    tcp.extend([5 << 4, 0x02]); // data offset 5 words; SYN
    tcp.extend(64240u16.to_be_bytes()); // window
    tcp.extend([0, 0, 0, 0]); // checksum, urgent pointer
    // IPv4: addresses, zero, protocol, TCP length; IPv6: addresses, 32-bit length, three
    // zeros, next header. Summed as 16-bit words, both come to the same tail.
    let pseudo = [src, dst, &[0, 6, 0, 20]].concat();
    let sum = fold(words(&pseudo) + words(&tcp));
    tcp[16..18].copy_from_slice(&sum.to_be_bytes());
    tcp
}

/// An IPv4 header and a 20-byte TCP SYN, with both checksums.
fn syn_packet(
    src: std::net::Ipv4Addr,
    sport: u16,
    to: std::net::SocketAddrV4,
    seq: u32,
) -> Vec<u8> {
    let (s, d) = (src.octets(), to.ip().octets());
    let tcp = tcp_syn(&s, sport, &d, to.port(), seq);
    let mut ip = vec![0x45, 0, 0, 40, 0, 0, 0x40, 0, 64, 6, 0, 0];
    ip.extend(s);
    ip.extend(d);
    let sum = fold(words(&ip));
    ip[10..12].copy_from_slice(&sum.to_be_bytes());
    [ip, tcp].concat()
}

/// Waits until `listener`'s abandoned connections reach `n` (a flood's attempts past the
/// horizon, counted by the sweep).
fn wait_abandoned(daemon: &Daemon, listener: &Listener, n: u32) {
    daemon.wait_for(&format!("the flood's {n} attempts abandoned"), |s| {
        let socket = listener.inode.to_string();
        (s.value(
            "backlogd_listen_connections_abandoned_total",
            &[("socket", &socket)],
        ) == Some(f64::from(n)))
        .then_some(())
    });
}

/// A raw-SYN flood's per-prefix figures: nft counted each prefix's `n` SYNs, and each SYN
/// is a dropped attempt of its own (drops and attempts equal nft's count) that never
/// connects.
fn check_flood(exact: &mut Exact, flood: &[(&str, u16)], sent: &[u64], sources: &Value) {
    for ((name, n), syns) in flood.iter().zip(sent) {
        exact.eq("raw SYNs nft counted", *syns, u64::from(*n));
        exact.eq_fed(
            &format!("{name}: SYN drops vs nft"),
            &[figure::DROPS],
            count(prefix(sources, name), "syn_drops"),
            *syns,
        );
        exact.eq_fed(
            &format!("{name}: dropped attempts vs the raw SYNs nft counted"),
            &[figure::CLIENT_IMPACT],
            count(prefix(sources, name), "attempts"),
            *syns,
        );
        exact.eq_fed(
            &format!("{name}: attempts that connected"),
            &[figure::CLIENT_IMPACT],
            count(prefix(sources, name), "connected"),
            0,
        );
    }
}

/// `doctor` tells a flood from a burst by what the dropped attempts did. The flood: raw
/// SYNs spoofing sources in three /24s (50 from one), against a full accept queue, never
/// retried: abandoned at the (short) horizon, so `syn_flood` names the large /24 in an nft
/// rule. The burst: 30 real clients dropped the same way, then the application listens
/// again with room for them, and their SYN retransmissions connect: `connection_burst`.
/// Per prefix, the flood's drops equal nft's SYN counts too.
#[test]
fn doctor_tells_a_spoofed_flood_from_a_burst_of_clients() {
    let _shared = shared();
    let daemon = Daemon::start_with(&["--client-impact-horizon", "2"]);
    let ns = Netns::new();
    ns.sysctl("net.ipv4.tcp_syncookies", "0");
    let flooded = Listener::open(&ns, "127.0.0.1:0", 1);
    let bursty = Listener::open(&ns, "127.0.0.1:0", 1);
    for l in [&flooded, &bursty] {
        daemon.wait_for_listener(l.inode);
    }
    let held_flooded = fill_accept_queue(&ns, &flooded, flooded.addr, 2);
    let held_bursty = fill_accept_queue(&ns, &bursty, bursty.addr, 2);
    let flood: [(&str, [u8; 3], u16); 3] = [
        ("127.30.1.0/24", [127, 30, 1], 50),
        ("127.30.2.0/24", [127, 30, 2], 5),
        ("127.30.3.0/24", [127, 30, 3], 5),
    ];
    let prefixes: Vec<&str> = flood.iter().map(|(p, _, _)| *p).collect();
    ns.count_incoming_syns_from(flooded.addr.port(), &prefixes);
    let start = daemon.program_misses();
    let SocketAddr::V4(target) = flooded.addr else {
        unreachable!("an IPv4 listener")
    };
    for (_, [a, b, c], n) in flood {
        let sources = (1..=n as u8)
            .map(|h| std::net::Ipv4Addr::new(a, b, c, h))
            .collect();
        raw_syns(&ns, target, sources);
    }
    let clients = connect_from(
        &ns,
        bursty.addr,
        (1..=30u8)
            .map(|h| IpAddr::from([127, 40, h % 3 + 1, h]))
            .collect(),
    );
    // Room for the burst: its clients' first retransmission (1 s) connects.
    std::thread::sleep(Duration::from_millis(300));
    bursty.relisten(64);
    let queue = backlogd_tests::sockets::wait_for_queue(&ns, &bursty, 32);
    assert_eq!(
        queue.recv_q, 32,
        "the burst's 30 clients connected: {queue:?}"
    );
    // The flood's attempts pass the 2 s horizon and the sweep counts them abandoned.
    wait_abandoned(&daemon, &flooded, 60);
    let sent = ns.incoming_syns_from();
    let sources = settled_sources(&daemon, &flooded);

    let mut exact = Exact::listener(&daemon, &ns, &flooded);
    exact.interval(&daemon, &start);
    exact
        .evidence("nft SYNs per prefix", &sent)
        .evidence("drop_sources", &sources);
    let raw: Vec<(&str, u16)> = flood.iter().map(|(p, _, n)| (*p, *n)).collect();
    check_flood(&mut exact, &raw, &sent, &sources);
    // The burst: every client's first SYN met the full queue, and each connected on its
    // retry (the kernel's own client sockets say so), 10 per /24.
    let burst = settled_sources(&daemon, &bursty);
    exact.evidence("burst drop_sources", &burst);
    for third in 1..=3u8 {
        let name = format!("127.40.{third}.0/24");
        let established = clients
            .iter()
            .zip(1..=30u8)
            .filter(|(c, h)| h % 3 + 1 == third && tcp_state(c).0 == TCP_ESTABLISHED)
            .count() as u64;
        exact.eq("the prefix's clients, all established", established, 10);
        exact.eq_fed(
            &format!("{name}: dropped attempts vs its clients"),
            &[figure::CLIENT_IMPACT],
            count(prefix(&burst, &name), "attempts"),
            established,
        );
        exact.eq_fed(
            &format!("{name}: attempts that connected vs its established clients"),
            &[figure::CLIENT_IMPACT],
            count(prefix(&burst, &name), "connected"),
            established,
        );
    }
    exact.verify();

    let doctor = backlogd_tests::doctor::Doctor::run(&daemon, &[]);
    let f = doctor.on("syn_flood", &ns, &flooded);
    let text = f.to_string();
    assert!(
        f["summary"]
            .as_str()
            .unwrap()
            .starts_with("60 SYNs dropped on 127.0.0.1:"),
        "{f:#}"
    );
    assert!(
        text.contains("0.0% of the dropped attempts ever connected")
            && text.contains(&format!(
                "nft add rule inet filter input ip saddr 127.30.1.0/24 tcp dport {} drop",
                flooded.addr.port()
            )),
        "{f:#}"
    );
    let b = doctor.on("connection_burst", &ns, &bursty);
    assert!(
        b["summary"].as_str().unwrap().contains("over 3 prefixes")
            && b["summary"]
                .as_str()
                .unwrap()
                .contains("100% of the dropped attempts connected on a retry"),
        "{b:#}"
    );
    // Each verdict only where it belongs.
    let kinds_on = |l: &Listener| -> Vec<String> {
        let port = format!(":{} (netns", l.addr.port());
        doctor
            .about(&ns)
            .into_iter()
            .filter(|f| f["subject"].as_str().unwrap().contains(&port))
            .map(|f| f["kind"].as_str().unwrap().to_owned())
            .collect()
    };
    assert!(!kinds_on(&flooded).contains(&"connection_burst".to_owned()));
    assert!(!kinds_on(&bursty).contains(&"syn_flood".to_owned()));
    drop((held_flooded, held_bursty, clients));
}

/// The namespace `ns`'s `syncookies` in the snapshot, once present.
fn namespace_cookies(daemon: &Daemon, ns: &Netns) -> Value {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let snapshot = daemon.api_snapshot();
        let found = snapshot["namespaces"]
            .as_array()
            .and_then(|all| all.iter().find(|n| n["netns"] == ns.inode()))
            .map(|n| n["syncookies"].clone())
            .filter(|c| !c.is_null());
        if let Some(c) = found {
            return c;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no syncookies for netns {} in {snapshot:#}",
            ns.inode()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Syncookies forced (`tcp_syncookies = 2`) in two namespaces: raw SYNs spoofing two /24s
/// at one listener (their cookies never come back) and 30 real clients at another (each
/// returns its cookie and connects). The namespaces' figures in the API equal their own
/// TcpExt counters, the listeners' cookies the SYNs nft counted; doctor calls the first a
/// flood the cookies absorb and the second real clients, quoting those figures.
#[test]
fn doctor_tells_a_cookie_flood_from_clients_that_return_their_cookies() {
    let _shared = shared();
    let daemon = Daemon::start();
    let flood_ns = Netns::new();
    let clients_ns = Netns::new();
    for ns in [&flood_ns, &clients_ns] {
        ns.sysctl("net.ipv4.tcp_syncookies", "2");
    }
    // Room on both accept queues: cookies, never drops.
    let flooded = Listener::open(&flood_ns, "127.0.0.1:0", 64);
    let served = Listener::open(&clients_ns, "127.0.0.1:0", 64);
    for l in [&flooded, &served] {
        daemon.wait_for_listener(l.inode);
    }
    let flood: [(&str, [u8; 3], u16); 2] = [
        ("127.31.1.0/24", [127, 31, 1], 30),
        ("127.31.2.0/24", [127, 31, 2], 10),
    ];
    let prefixes: Vec<&str> = flood.iter().map(|(p, _, _)| *p).collect();
    flood_ns.count_incoming_syns_from(flooded.addr.port(), &prefixes);
    clients_ns.count_incoming_syns_from(served.addr.port(), &["127.32.0.0/16"]);
    let start = daemon.program_misses();
    let SocketAddr::V4(target) = flooded.addr else {
        unreachable!("an IPv4 listener")
    };
    for (_, [a, b, c], n) in flood {
        let sources = (1..=n as u8)
            .map(|h| std::net::Ipv4Addr::new(a, b, c, h))
            .collect();
        raw_syns(&flood_ns, target, sources);
    }
    let clients = connect_from(
        &clients_ns,
        served.addr,
        (1..=30u8)
            .map(|h| IpAddr::from([127, 32, h % 3 + 1, h]))
            .collect(),
    );
    let queue = backlogd_tests::sockets::wait_for_queue(&clients_ns, &served, 30);
    let flood_sources = settled_sources(&daemon, &flooded);
    let client_sources = settled_sources(&daemon, &served);
    let flood_kernel = tcp_ext(&flood_ns);
    let clients_kernel = tcp_ext(&clients_ns);
    let flood_cookies = namespace_cookies(&daemon, &flood_ns);
    let client_cookies = namespace_cookies(&daemon, &clients_ns);
    let flood_sent = flood_ns.incoming_syns_from();
    let client_sent = clients_ns.incoming_syns_from();

    assert_eq!(queue.recv_q, 30, "every client connected: {queue:?}");
    let mut exact = Exact::listener(&daemon, &flood_ns, &flooded);
    exact.interval(&daemon, &start);
    exact
        .evidence("flood: nft SYNs per prefix", &flood_sent)
        .evidence("flood: drop_sources", &flood_sources)
        .evidence("flood: namespace syncookies", &flood_cookies)
        .evidence("clients: nft SYNs", &client_sent)
        .evidence("clients: drop_sources", &client_sources)
        .evidence("clients: namespace syncookies", &client_cookies);
    // The namespaces were made by this test: their counters count its segments alone.
    for (what, api, kernel) in [
        ("flood", &flood_cookies, &flood_kernel),
        ("clients", &client_cookies, &clients_kernel),
    ] {
        exact
            .eq(
                &format!("{what}: namespace cookies sent vs TCPReqQFullDoCookies"),
                count(api, "sent"),
                kernel[counter::REQQ_FULL_DO_COOKIES],
            )
            .eq(
                &format!("{what}: namespace cookies returned vs SyncookiesRecv"),
                count(api, "returned"),
                kernel[counter::SYNCOOKIES_RECV],
            );
    }
    exact
        .eq(
            "flood: cookies sent vs the raw SYNs nft counted",
            flood_kernel[counter::REQQ_FULL_DO_COOKIES],
            flood_sent.iter().sum(),
        )
        .eq(
            "flood: cookies returned",
            flood_kernel[counter::SYNCOOKIES_RECV],
            0,
        )
        .eq_fed(
            "flood: the listener's cookies vs the namespace's",
            &[figure::SYNCOOKIES],
            count(&flood_sources["counted"], "cookies"),
            flood_kernel[counter::REQQ_FULL_DO_COOKIES],
        )
        .eq(
            "clients: cookies sent vs the SYNs nft counted",
            clients_kernel[counter::REQQ_FULL_DO_COOKIES],
            client_sent[0],
        )
        .eq(
            "clients: cookies returned vs the connected clients",
            clients_kernel[counter::SYNCOOKIES_RECV],
            queue.recv_q,
        )
        .eq_fed(
            "clients: the listener's cookies vs the namespace's",
            &[figure::SYNCOOKIES],
            count(&client_sources["counted"], "cookies"),
            clients_kernel[counter::REQQ_FULL_DO_COOKIES],
        );
    exact.verify();

    let doctor = backlogd_tests::doctor::Doctor::run(&daemon, &[]);
    let f = doctor.on("syncookies_sent", &flood_ns, &flooded);
    let n = flood_kernel[counter::REQQ_FULL_DO_COOKIES];
    assert!(
        f["summary"]
            .as_str()
            .unwrap()
            .ends_with("are answered with syncookies, and almost none come back: a SYN flood, which the cookies absorb"),
        "{f:#}"
    );
    let line = format!(
        "since backlogd started: {n} SYNs to it answered with a syncookie, {n} in its \
         network namespace; 0 of the namespace's cookies came back"
    );
    assert!(f.to_string().contains(&line), "no {line:?} in {f:#}");
    let c = doctor.on("syncookies_sent", &clients_ns, &served);
    let n = clients_kernel[counter::REQQ_FULL_DO_COOKIES];
    let back = clients_kernel[counter::SYNCOOKIES_RECV];
    assert!(
        c["summary"]
            .as_str()
            .unwrap()
            .ends_with("because they are forced, and the clients return them: real clients"),
        "{c:#}"
    );
    let line = format!(
        "since backlogd started: {n} SYNs to it answered with a syncookie, {n} in its \
         network namespace; {back} of the namespace's cookies came back"
    );
    assert!(c.to_string().contains(&line), "no {line:?} in {c:#}");
    drop(clients);
}

/// An IPv6 flood: raw SYNs spoofing sources in two /48s (40 from one) against a full
/// accept queue on `[::1]`, never retried. Per /48, drops and dropped attempts equal the
/// SYNs nft counted, none connects; all are abandoned at the (short) horizon, and
/// `syn_flood` names the large /48 in an `ip6` nft rule.
#[test]
fn doctor_tells_a_spoofed_ipv6_flood() {
    let _shared = shared();
    let FullQueue {
        daemon,
        ns,
        listener,
        held,
    } = full_queue(&["--client-impact-horizon", "2"], "[::1]:0");
    ns.command(
        "ip",
        &["-6", "route", "add", "local", "fd00:30::/32", "dev", "lo"],
    );
    let flood: [(&str, &str, u16); 2] = [
        ("fd00:30:1::/48", "fd00:30:1:", 40),
        ("fd00:30:2::/48", "fd00:30:2:", 5),
    ];
    let prefixes: Vec<&str> = flood.iter().map(|(p, _, _)| *p).collect();
    ns.count_incoming_syns_from(listener.addr.port(), &prefixes);
    let start = daemon.program_misses();
    let SocketAddr::V6(target) = listener.addr else {
        unreachable!("an IPv6 listener")
    };
    for (_, stem, n) in flood {
        let sources = (1..=n)
            .map(|i| format!("{stem}{i:x}::1").parse().expect("IPv6 source"))
            .collect();
        raw_syns_v6(&ns, target, sources);
    }
    wait_abandoned(&daemon, &listener, 45);
    let sent = ns.incoming_syns_from();
    let sources = settled_sources(&daemon, &listener);

    let mut exact = Exact::listener(&daemon, &ns, &listener);
    exact.interval(&daemon, &start);
    exact
        .evidence("nft SYNs per prefix", &sent)
        .evidence("drop_sources", &sources);
    let raw: Vec<(&str, u16)> = flood.iter().map(|(p, _, n)| (*p, *n)).collect();
    check_flood(&mut exact, &raw, &sent, &sources);
    exact.verify();

    let doctor = backlogd_tests::doctor::Doctor::run(&daemon, &[]);
    let f = doctor.on("syn_flood", &ns, &listener);
    let text = f.to_string();
    assert!(
        f["summary"]
            .as_str()
            .unwrap()
            .starts_with("45 SYNs dropped on [::1]:"),
        "{f:#}"
    );
    assert!(
        text.contains("0.0% of the dropped attempts ever connected")
            && text.contains(&format!(
                "nft add rule inet filter input ip6 saddr fd00:30:1::/48 tcp dport {} drop",
                listener.addr.port()
            )),
        "{f:#}"
    );
    drop(held);
}
