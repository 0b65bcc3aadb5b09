//! Requested vs granted backlog per listener, checked against the kernel's own view.

use backlogd_tests::{
    Daemon, Exact, Netns, Scrape, kernel,
    netns::THREAD_NAME,
    sockets::{self, Listener, kernel_queue},
};

const REQUESTED: &str = "backlogd_listen_backlog_requested";
const GRANTED: &str = "backlogd_listen_backlog_granted";

/// The single series of `metric` for this listener, found by socket inode.
fn series(scrape: &Scrape, metric: &str, l: &Listener) -> Option<f64> {
    scrape.value(metric, &[("socket", &l.inode.to_string())])
}

/// backlogd's requested backlog against what the application passed to listen() (`None`:
/// backlogd cannot know it and must not report one), and its granted backlog against the
/// kernel's (sock_diag's Send-Q of a listener is `sk_max_ack_backlog`).
fn check_backlog(daemon: &Daemon, ns: &Netns, l: &Listener, scrape: &Scrape, asked: Option<u64>) {
    let queue = kernel_queue(ns, l);
    let mut exact = Exact::listener(daemon, ns, l);
    exact.evidence("socket (ss)", &queue).eq(
        "granted backlog vs Send-Q",
        series(scrape, GRANTED, l).map_or(u64::MAX, |v| v as u64),
        queue.send_q,
    );
    match asked {
        Some(asked) => exact.eq(
            "requested backlog vs the application's listen()",
            series(scrape, REQUESTED, l).map_or(u64::MAX, |v| v as u64),
            asked,
        ),
        None => exact.eq(
            "requested backlog series (none: listen() predates the daemon)",
            scrape
                .find(REQUESTED, &[("socket", &l.inode.to_string())])
                .len() as u64,
            0,
        ),
    };
    exact.verify();
}

#[test]
fn clamped_backlog_shows_asked_511_granted_128_then_vanishes_on_close() {
    let daemon = Daemon::shared();
    let ns = Netns::new();
    ns.sysctl("net.core.somaxconn", "128");
    let listener = Listener::open(&ns, "127.0.0.1:0", 511);

    let scrape = daemon.wait_for("the listener's series", |s| {
        series(s, GRANTED, &listener).map(|_| s.clone())
    });
    let labels = [
        ("netns", ns.inode().to_string()),
        ("address", "127.0.0.1".to_string()),
        ("port", listener.addr.port().to_string()),
        ("socket", listener.inode.to_string()),
        ("pid", std::process::id().to_string()),
        ("comm", THREAD_NAME.to_string()),
    ];
    let labels: Vec<(&str, &str)> = labels.iter().map(|(k, v)| (*k, v.as_str())).collect();
    assert_eq!(
        scrape.value(REQUESTED, &labels),
        Some(511.0),
        "{}",
        scrape.text
    );
    assert_eq!(
        scrape.value(GRANTED, &labels),
        Some(128.0),
        "{}",
        scrape.text
    );
    // Exactly that socket: nothing else in this namespace is reported.
    let in_ns = scrape.find(GRANTED, &[("netns", &ns.inode().to_string())]);
    assert_eq!(in_ns.len(), 1, "{in_ns:#?}");
    // The kernel agrees.
    assert_eq!(kernel_queue(&ns, &listener).send_q, 128);
    check_backlog(daemon, &ns, &listener, &scrape, Some(511));

    let inode = listener.inode.to_string();
    drop(listener);
    daemon.wait_for("the closed listener's series to disappear", |s| {
        (s.find(REQUESTED, &[("socket", &inode)]).is_empty()
            && s.find(GRANTED, &[("socket", &inode)]).is_empty())
        .then_some(())
    });
}

#[test]
fn raised_somaxconn_grants_the_full_backlog_on_ipv6() {
    let daemon = Daemon::shared();
    let ns = Netns::new();
    ns.sysctl("net.core.somaxconn", "4096");
    let listener = Listener::open(&ns, "[::1]:0", 511);
    let scrape = daemon.wait_for("the listener's series", |s| {
        series(s, GRANTED, &listener).map(|_| s.clone())
    });
    assert_eq!(series(&scrape, GRANTED, &listener), Some(511.0));
    assert_eq!(
        scrape.find(GRANTED, &[("socket", &listener.inode.to_string())])[0].labels["address"],
        "::1"
    );
    check_backlog(daemon, &ns, &listener, &scrape, Some(511));
}

#[test]
fn repeated_listen_updates_requested_and_granted() {
    let daemon = Daemon::shared();
    let ns = Netns::new();
    ns.sysctl("net.core.somaxconn", "128");
    let listener = Listener::open(&ns, "127.0.0.1:0", 511);
    daemon.wait_for("the first listen()", |s| series(s, GRANTED, &listener));

    listener.relisten(64);
    let granted = daemon.wait_for("the second listen()", |s| {
        series(s, REQUESTED, &listener)
            .filter(|&r| r == 64.0)
            .and_then(|_| series(s, GRANTED, &listener))
    });
    assert_eq!(granted, 64.0);
    check_backlog(daemon, &ns, &listener, &daemon.scrape(), Some(64));
}

#[test]
fn same_port_in_two_namespaces_is_two_series_with_their_own_clamp() {
    let daemon = Daemon::shared();
    let (small, large) = (Netns::new(), Netns::new());
    small.sysctl("net.core.somaxconn", "100");
    large.sysctl("net.core.somaxconn", "1000");
    let a = Listener::open(&small, "127.0.0.1:8080", 511);
    let b = Listener::open(&large, "127.0.0.1:8080", 511);
    let scrape = daemon.wait_for("both listeners", |s| {
        (series(s, GRANTED, &a).is_some() && series(s, GRANTED, &b).is_some()).then(|| s.clone())
    });
    let port = [("port", "8080")];
    let small_ns = small.inode().to_string();
    let large_ns = large.inode().to_string();
    assert_eq!(
        scrape.value(GRANTED, &[port[0], ("netns", small_ns.as_str())]),
        Some(100.0)
    );
    assert_eq!(
        scrape.value(GRANTED, &[port[0], ("netns", large_ns.as_str())]),
        Some(511.0)
    );
    check_backlog(daemon, &small, &a, &scrape, Some(511));
    check_backlog(daemon, &large, &b, &scrape, Some(511));
}

#[test]
fn listener_that_predates_the_daemon_is_found_by_the_startup_scan() {
    let ns = Netns::new();
    ns.sysctl("net.core.somaxconn", "128");
    let listener = Listener::open(&ns, "127.0.0.1:0", 511);
    // The daemon scans every namespace before it reports that it is serving, so the first
    // scrape already has the listener.
    let daemon = Daemon::start();
    let scrape = daemon.scrape();
    let inode = listener.inode.to_string();
    let found = scrape.find(GRANTED, &[("socket", &inode)]);
    assert_eq!(found.len(), 1, "{}", scrape.text);
    let s = found[0];
    assert_eq!(s.value, 128.0);
    assert_eq!(s.labels["netns"], ns.inode().to_string());
    assert_eq!(s.labels["port"], listener.addr.port().to_string());
    assert_eq!(s.labels["pid"], std::process::id().to_string());
    // What the application asked for was said before backlogd was there to see it.
    check_backlog(&daemon, &ns, &listener, &scrape, None);

    drop(listener);
    daemon.wait_for("the closed listener's series to disappear", |s| {
        s.find(GRANTED, &[("socket", &inode)])
            .is_empty()
            .then_some(())
    });
}

/// Listeners open before the daemon in three namespaces, each with its own listen
/// sysctls, one of which is deleted while the daemon runs: the startup scan finds each
/// with its namespace, owner and the namespace's sysctls exactly as the kernel has them,
/// counts their SYNs, serves each namespace's TcpExt counters equal to the kernel's, and
/// forgets the deleted namespace. All of it with the running daemon's capabilities, which
/// hold no CAP_SYS_ADMIN where the scan iterator lists the listeners: no namespace is
/// joined.
#[test]
fn listeners_in_three_namespaces_open_before_the_daemon_are_found_with_their_sysctls() {
    // (somaxconn, tcp_max_syn_backlog, tcp_syncookies, tcp_abort_on_overflow)
    let settings = [
        (100u64, 300u64, 0u64, 1u64),
        (200, 400, 2, 0),
        (4, 500, 1, 0),
    ];
    let namespaces: Vec<Netns> = settings
        .iter()
        .map(|&(somaxconn, syn_backlog, cookies, abort)| {
            let ns = Netns::new();
            ns.sysctl("net.core.somaxconn", &somaxconn.to_string());
            ns.sysctl("net.ipv4.tcp_max_syn_backlog", &syn_backlog.to_string());
            ns.sysctl("net.ipv4.tcp_syncookies", &cookies.to_string());
            ns.sysctl("net.ipv4.tcp_abort_on_overflow", &abort.to_string());
            ns
        })
        .collect();
    let mut listeners: Vec<Option<Listener>> = namespaces
        .iter()
        .map(|ns| Some(Listener::open(ns, "127.0.0.1:0", 511)))
        .collect();
    let daemon = Daemon::start();
    let scrape = daemon.scrape();
    let me = std::process::id().to_string();
    let comm = std::fs::read_to_string("/proc/self/comm").unwrap();
    let snapshot = daemon.api_snapshot();
    for ((ns, l), &(somaxconn, syn_backlog, cookies, abort)) in
        namespaces.iter().zip(&listeners).zip(&settings)
    {
        let l = l.as_ref().unwrap();
        let found = scrape.find(GRANTED, &[("socket", &l.inode.to_string())]);
        assert_eq!(found.len(), 1, "{}", scrape.text);
        let labels = &found[0].labels;
        assert_eq!(labels["netns"], ns.inode().to_string(), "{labels:?}");
        assert_eq!(labels["port"], l.addr.port().to_string(), "{labels:?}");
        assert_eq!(labels["pid"], me, "owner: {labels:?}");
        assert_eq!(labels["comm"], comm.trim_end(), "{labels:?}");
        check_backlog(&daemon, ns, l, &scrape, None);
        let namespace = snapshot["namespaces"]
            .as_array()
            .unwrap()
            .iter()
            .find(|n| n["netns"].as_u64() == Some(ns.inode()))
            .unwrap_or_else(|| panic!("namespace {} not in the API: {snapshot}", ns.inode()));
        let read = |key: &str| namespace[key].as_u64().unwrap_or(u64::MAX);
        assert_eq!(
            [
                read("somaxconn"),
                read("tcp_max_syn_backlog"),
                read("tcp_syncookies"),
                read("tcp_abort_on_overflow")
            ],
            [somaxconn, syn_backlog, cookies, abort],
            "{namespace}"
        );
    }

    // Counted: the third namespace's accept queue holds 5 (somaxconn 4, and a full queue
    // is one past the backlog), the next 3 clients' SYNs are dropped.
    let clients: Vec<_> = namespaces
        .iter()
        .zip(&listeners)
        .map(|(ns, l)| {
            let l = l.as_ref().unwrap();
            sockets::fill_accept_queue(ns, l, l.addr, 5)
        })
        .collect();
    let (ns, l) = (&namespaces[2], listeners[2].as_ref().unwrap());
    let dropped = sockets::connect_burst(ns, l.addr, 3);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while kernel::tcp_ext(ns)["ListenOverflows"] < 3 {
        assert!(
            std::time::Instant::now() < deadline,
            "the third namespace dropped no 3 SYNs: {:?}",
            kernel::tcp_ext(ns)
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    // Closed, the clients retransmit no more SYNs: the counters hold still from here.
    drop(dropped);
    let overflows = kernel::tcp_ext(ns)["ListenOverflows"];
    let scrape = daemon.wait_for("the third namespace's drops", |s| {
        let seen = s.value(
            "backlogd_netns_listen_overflows_total",
            &[("netns", &ns.inode().to_string())],
        )?;
        (seen as u64 >= overflows).then(|| s.clone())
    });
    for (ns, l) in namespaces.iter().zip(&listeners) {
        let l = l.as_ref().unwrap();
        let tcp_ext = kernel::tcp_ext(ns);
        let inode = ns.inode().to_string();
        for (metric, counter) in [
            ("backlogd_netns_listen_overflows_total", "ListenOverflows"),
            ("backlogd_netns_listen_drops_total", "ListenDrops"),
        ] {
            assert_eq!(
                scrape.value(metric, &[("netns", &inode)]).map(|v| v as u64),
                Some(tcp_ext[counter]),
                "{metric} of namespace {inode}"
            );
        }
        let socket = l.inode.to_string();
        assert_eq!(
            scrape
                .value(
                    "backlogd_listen_syns_received_total",
                    &[("socket", &socket)]
                )
                .map(|v| v as u64),
            Some(
                5 + if ns.inode() == namespaces[2].inode() {
                    overflows
                } else {
                    0
                }
            ),
            "SYNs of listener {socket} (ListenOverflows {})",
            tcp_ext["ListenOverflows"]
        );
    }

    // The second namespace goes: its listener closes, nothing holds it any more.
    let namespaces_gone = namespaces[1].inode();
    let gone = namespaces_gone.to_string();
    let inode = listeners[1].as_ref().unwrap().inode.to_string();
    drop(clients);
    listeners[1] = None;
    let mut namespaces = namespaces;
    drop(namespaces.remove(1));
    daemon.wait_for("the deleted namespace's series to go", |s| {
        (s.find(GRANTED, &[("socket", &inode)]).is_empty()
            && s.find("backlogd_netns_listen_overflows_total", &[("netns", &gone)])
                .is_empty())
        .then_some(())
    });
    let snapshot = daemon.api_snapshot();
    assert!(
        !snapshot["namespaces"]
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n["netns"].as_u64() == Some(namespaces_gone)),
        "{snapshot}"
    );

    // With what the running daemon kept: no CAP_SYS_ADMIN where the iterator lists.
    let status = std::fs::read_to_string(format!("/proc/{}/status", daemon.pid())).unwrap();
    let effective = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .map(|hex| u64::from_str_radix(hex.trim(), 16).unwrap())
        .unwrap();
    const CAP_SYS_ADMIN: u64 = 1 << 21;
    let log = daemon.log();
    assert!(
        log.contains("listing=Iterator"),
        "the daemon did not list listeners with the scan iterator:\n{log}"
    );
    assert_eq!(
        effective & CAP_SYS_ADMIN,
        0,
        "CapEff {effective:#x}:\n{log}"
    );
}

/// An MPTCP listener (what Go 1.24 and later open by default) open before the daemon: its
/// file holds the MPTCP socket, and its TCP listener, the one SYNs reach, is a subflow
/// with no file of its own. The startup scan finds it by that subflow, as sock_diag would,
/// with its owner, granted backlog and SYN queue now.
#[test]
fn an_mptcp_listener_open_before_the_daemon_is_found_with_its_syn_queue_now() {
    use std::os::{fd::AsRawFd as _, unix::fs::MetadataExt as _};

    use socket2::{Domain, Protocol, Socket, Type};
    const IPPROTO_MPTCP: i32 = 262;
    let ns = Netns::new();
    let socket = ns.run(|| {
        Socket::new(
            Domain::IPV4,
            Type::STREAM,
            Some(Protocol::from(IPPROTO_MPTCP)),
        )
    });
    let socket = match socket {
        Ok(s) => s,
        Err(e) => {
            backlogd_tests::marks::skip(&format!(
                "this kernel makes no MPTCP socket ({e}; CONFIG_MPTCP or net.mptcp.enabled)"
            ));
            return;
        }
    };
    let addr: std::net::SocketAddr = "127.0.0.1:0".parse().unwrap();
    socket.bind(&addr.into()).expect("bind");
    socket.listen(64).expect("listen()");
    let port = socket.local_addr().unwrap().as_socket().unwrap().port();
    let inode = std::fs::metadata(format!("/proc/self/fd/{}", socket.as_raw_fd()))
        .unwrap()
        .ino()
        .to_string();
    let daemon = Daemon::start();
    let scrape = daemon.scrape();
    let found = scrape.find(GRANTED, &[("socket", &inode)]);
    assert_eq!(
        found.len(),
        1,
        "no MPTCP listener {inode}:\n{}",
        scrape.text
    );
    let labels = &found[0].labels;
    assert_eq!(found[0].value, 64.0, "{labels:?}");
    assert_eq!(labels["port"], port.to_string(), "{labels:?}");
    assert_eq!(labels["netns"], ns.inode().to_string(), "{labels:?}");
    assert_eq!(labels["pid"], std::process::id().to_string(), "{labels:?}");
    assert_eq!(
        scrape.value(
            "backlogd_listen_syn_queue_length",
            &[("socket", inode.as_str())]
        ),
        Some(0.0),
        "the scan pass read no SYN queue of the MPTCP listener:\n{}",
        scrape.text
    );
    // The hooks count its SYNs under the same socket: one client, one SYN.
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let _client = sockets::connect_burst(&ns, addr, 1);
    daemon.wait_for("the MPTCP listener's SYN", |s| {
        (s.value(
            "backlogd_listen_syns_received_total",
            &[("socket", inode.as_str())],
        ) == Some(1.0))
        .then_some(())
    });
}

/// A 32-bit (compat) syscall is no native one, whatever its number: ia32's getegid is
/// number 50, x86-64's listen. Made through `int 0x80` from this 64-bit process (the
/// kernel runs it as an ia32 syscall) with `rdi` holding a listener's fd and `rsi` a
/// backlog, it returns 0 as root, and a program matching the number alone would take it
/// for listen(fd, 4242) on that listener.
#[cfg(target_arch = "x86_64")]
#[test]
fn a_compat_syscall_with_the_number_of_listen_is_not_a_listen() {
    use std::os::fd::AsRawFd as _;
    const IA32_GETEGID: i64 = 50;
    assert_eq!(
        IA32_GETEGID,
        libc::SYS_listen,
        "the numbers this test relies on"
    );
    let daemon = Daemon::start();
    let ns = Netns::new();
    ns.sysctl("net.core.somaxconn", "128");
    let listener = Listener::open(&ns, "127.0.0.1:0", 511);
    daemon.wait_for("the listener", |s| series(s, GRANTED, &listener));

    let fd = listener.socket.as_raw_fd() as u64;
    let ret: i64;
    // SAFETY: ia32 getegid takes no arguments and changes nothing; rdi and rsi are only
    // there to be misread. int 0x80 clobbers nothing but rax (r8-r11 are zeroed by the
    // kernel's ia32 entry on some versions: declared clobbered).
    unsafe {
        std::arch::asm!(
            "int 0x80",
            inlateout("rax") IA32_GETEGID => ret,
            in("rdi") fd,
            in("rsi") 4242u64,
            lateout("r8") _, lateout("r9") _, lateout("r10") _, lateout("r11") _,
        );
    }
    if ret != 0 {
        backlogd_tests::marks::skip(&format!(
            "int 0x80 getegid returned {ret} (not 0: no IA32 emulation, or not root)"
        ));
        return;
    }
    // A LISTEN event of a later listen() is read after any the syscall above caused.
    let marker = Listener::open(&ns, "127.0.0.1:0", 7);
    daemon.wait_for("a later listen()", |s| series(s, REQUESTED, &marker));
    check_backlog(&daemon, &ns, &listener, &daemon.scrape(), Some(511));
}
