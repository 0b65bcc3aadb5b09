//! The accept queue: depth, peak, queued/accepted counts and accept wait, against the
//! kernel's queue (sock_diag Recv-Q) and the application's own accept() calls; and the
//! SYN queue's length now, against the SYN-RECV requests the kernel lists.

use std::{
    io::Write,
    time::{Duration, Instant},
};

use backlogd_tests::{
    Daemon, Exact, Netns, Scrape,
    bpf::{bpftool, fd_object_ids},
    caps::release_at_least,
    daemon::run_to_end,
    kernel::{tcp_ext, wait_for_rise},
    sockets::{Listener, connect_burst, kernel_queue, pending_request_peers, wait_for_queue},
    tempdir::TempDir,
};

/// The histogram's `le` bounds /metrics exports by default (`accept_wait_buckets`).
const DEFAULT_BOUNDS: [&str; 2] = ["0.001024", "1.048576"];

/// Every bound of the kernel's buckets, 2^i µs (`accept_wait_buckets = "all"`).
const ALL_BOUNDS: [&str; 24] = [
    "0.000001", "0.000002", "0.000004", "0.000008", "0.000016", "0.000032", "0.000064", "0.000128",
    "0.000256", "0.000512", "0.001024", "0.002048", "0.004096", "0.008192", "0.016384", "0.032768",
    "0.065536", "0.131072", "0.262144", "0.524288", "1.048576", "2.097152", "4.194304", "8.388608",
];

fn value(scrape: &Scrape, name: &str, l: &Listener) -> f64 {
    scrape
        .value(name, &[("socket", &l.inode.to_string())])
        .unwrap_or_else(|| panic!("no {name} for socket {} in:\n{}", l.inode, scrape.text))
}

/// The listener's accept waits from the JSON API, cumulative at each of the kernel's 24
/// bounds: `(bound, waits at or below it)`, and the total. The API always has every
/// bucket, whatever /metrics exports.
fn api_cumulative(me: &serde_json::Value) -> (Vec<(f64, u64)>, u64) {
    let buckets = me["accept_wait"]["buckets"].as_array().expect("buckets");
    assert_eq!(buckets.len(), 25, "24 bounds and the rest: {buckets:?}");
    let mut cumulative = Vec::new();
    let mut seen = 0;
    for (i, b) in buckets.iter().enumerate() {
        seen += b["count"].as_u64().expect("count");
        match b["le"].as_f64() {
            Some(le) => {
                assert_eq!(le, ALL_BOUNDS[i].parse::<f64>().unwrap(), "bucket {i}");
                cumulative.push((le, seen));
            }
            None => assert_eq!(i, 24, "only the last bucket is unbounded"),
        }
    }
    (cumulative, seen)
}

/// The slow-acceptor scenario against `daemon`, whose /metrics exports the accept-wait
/// buckets `exported` (and `+Inf`).
fn slow_acceptor(daemon: &Daemon, exported: &[&str]) {
    let ns = Netns::new();
    let listener = Listener::open(&ns, "127.0.0.1:0", 64);
    daemon.wait_for_listener(listener.inode);

    // 12 handshakes complete; nobody accepts yet.
    let addr = listener.addr;
    // Each connection's handshake completes inside its connect() on loopback, so the kernel
    // queued it between the instants before and after that connect().
    let clients: Vec<(std::net::TcpStream, Instant, Instant)> = ns.run(move || {
        (0..12)
            .map(|_| {
                let before = Instant::now();
                let stream = std::net::TcpStream::connect(addr).expect("connect");
                (stream, before, Instant::now())
            })
            .collect()
    });
    // Each connect() returned once the client had the SYN-ACK; the server queues the
    // connection at the final ACK, a moment later: waited for in the kernel's queue.
    let peak = wait_for_queue(&ns, &listener, 12).recv_q;
    // Data before accept(), 40 ms after the handshakes: the kernel's stamp that times
    // each wait (the child's `rcvq_space.time`) must not move with it. A wait timed from
    // the data would fall 40 ms short of every application bracket below.
    std::thread::sleep(Duration::from_millis(40));
    for (stream, _, _) in &clients {
        (&*stream)
            .write_all(&[0u8; 65536])
            .expect("data before accept");
    }

    // The application accepts 5, 30 ms apart; the queue is FIFO, so the i-th accept takes
    // the i-th connection. Each wait the kernel saw lies between the shortest and the
    // longest the application's clocks allow: (accept called - connect returned) and
    // (accept returned - connect called). Under emulation these brackets are a few ms wide
    // and a single point estimate is not good enough.
    let mut app_waits: Vec<(f64, f64)> = Vec::new();
    for (_, connect_called, connect_returned) in clients.iter().take(5) {
        std::thread::sleep(Duration::from_millis(30));
        let accept_called = Instant::now();
        listener.socket.accept().expect("accept");
        app_waits.push((
            (accept_called - *connect_returned).as_secs_f64(),
            connect_called.elapsed().as_secs_f64(),
        ));
    }
    let queue = kernel_queue(&ns, &listener);
    // The length now is a scan pass's: one after the accepts.
    let scrape = daemon.scrape_after(Instant::now());
    // The JSON API (what `backlogd top` and doctor read) with every kernel bucket.
    let me = daemon.api_listener(listener.inode);
    drop(clients);

    assert_eq!(queue.recv_q, 7, "7 connections left after 5 accepts");
    let v = |name| value(&scrape, name, &listener) as u64;
    let mut exact = Exact::listener(daemon, &ns, &listener);
    exact
        .evidence("socket (ss) after 5 accepts", &queue)
        .evidence("application accept waits (min, max) s", &app_waits)
        .eq(
            "accept queue length vs Recv-Q",
            v("backlogd_listen_accept_queue_length"),
            queue.recv_q,
        )
        .eq(
            "accept queue peak vs Recv-Q before accepting",
            v("backlogd_listen_accept_queue_max_length"),
            peak,
        )
        .eq(
            "accepted vs the application's accept() calls",
            v("backlogd_listen_accepted_total"),
            5,
        );
    let socket = listener.inode.to_string();
    exact
        .eq(
            "queued vs the clients' completed handshakes",
            v("backlogd_listen_queued_total"),
            12,
        )
        .eq(
            "queued - accepted vs Recv-Q",
            v("backlogd_listen_queued_total") - v("backlogd_listen_accepted_total"),
            queue.recv_q,
        )
        .eq(
            "accept waits vs the application's accept() calls",
            v("backlogd_listen_accept_wait_seconds_count"),
            5,
        );
    // Timing, not counting: the sum lies within the sum of the brackets.
    let measured = value(
        &scrape,
        "backlogd_listen_accept_wait_seconds_sum",
        &listener,
    );
    let (lo, hi): (f64, f64) = app_waits
        .iter()
        .fold((0.0, 0.0), |(l, h), (wl, wh)| (l + wl, h + wh));
    assert!(
        (lo..=hi).contains(&measured),
        "accept wait sum: backlogd {measured} s, application between {lo} and {hi} s \
         (per connection: {app_waits:?})"
    );
    // Each kernel bucket (the API's, all 24) holds the waits whose whole bracket is at or
    // below its bound; a bound inside a bracket cannot be decided.
    let (api, api_total) = api_cumulative(&me);
    exact.eq("API accept waits vs the application's", api_total, 5);
    let at = |bound: &str| {
        let b: f64 = bound.parse().expect("bound");
        api.iter()
            .find(|(le, _)| *le == b)
            .unwrap_or_else(|| panic!("no API bucket le={bound}: {api:?}"))
            .1
    };
    // Floor: 4 of these 6 bounds decided. The waits are 30, 60, ... 150 ms plus one shift
    // common to all (the connects to the first accept), each bracket a few ms wide: only
    // 32.8, 65.5 and 131 ms can fall inside one, and no shift puts all three inside.
    let mut checked = 0;
    for bound in &ALL_BOUNDS[14..20] {
        let b: f64 = bound.parse().expect("bound");
        if app_waits.iter().any(|(wl, wh)| (*wl..=*wh).contains(&b)) {
            exact.evidence(
                &format!("API bucket le={bound}"),
                "inside an application bracket: not decidable",
            );
            continue;
        }
        let expected = app_waits.iter().filter(|(_, wh)| *wh <= b).count() as u64;
        exact.eq(
            &format!("API accept waits at or below {bound} s vs the application's"),
            at(bound),
            expected,
        );
        checked += 1;
    }
    assert!(checked >= 4, "too few buckets decidable: {app_waits:?}");
    // /metrics exports exactly the configured bounds and +Inf, each the API's cumulative
    // count at that bound: merged, never interpolated.
    let scraped: Vec<(String, u64)> = scrape
        .find(
            "backlogd_listen_accept_wait_seconds_bucket",
            &[("socket", &socket)],
        )
        .iter()
        .map(|s| (s.labels["le"].clone(), s.value as u64))
        .collect();
    let les: Vec<&str> = scraped.iter().map(|(le, _)| le.as_str()).collect();
    let mut want: Vec<&str> = exported.to_vec();
    want.push("+Inf");
    assert_eq!(les, want, "exported buckets");
    // Each exported bucket against the application's own brackets where they decide its
    // bound (+Inf: every accept); a bound inside a bracket can only be held to the API's
    // bucket, a consistency check of backlogd with itself, labelled so: the API's buckets
    // are judged against the application's at every decidable bound above.
    for (le, count) in &scraped {
        match le.parse::<f64>().ok().filter(|b| b.is_finite()) {
            None => exact.eq(
                "exported bucket le=+Inf vs the application's accept() calls",
                *count,
                app_waits.len() as u64,
            ),
            Some(b) if !app_waits.iter().any(|(wl, wh)| (*wl..=*wh).contains(&b)) => exact.eq(
                &format!("exported bucket le={le} vs the application's waits"),
                *count,
                app_waits.iter().filter(|(_, wh)| *wh <= b).count() as u64,
            ),
            Some(_) => exact.eq(
                &format!(
                    "consistency, not the kernel: exported bucket le={le} (inside an \
                     application bracket) vs the API's cumulative count"
                ),
                *count,
                at(le),
            ),
        };
    }
    exact.verify();

    // The JSON API carries the same figures.
    let snapshot = daemon.api_snapshot();
    let mode = snapshot["hook_mode"].as_str().expect("hook_mode");
    assert_eq!(
        scrape.value("backlogd_hook_mode", &[("mode", mode)]),
        Some(1.0)
    );
    assert_eq!(me["queued"], 12);
    assert_eq!(me["accepted"], 5);
    assert_eq!(me["queues"]["accept_depth"], 7);
    assert_eq!(me["queues"]["accept_max"], 12);
    assert_eq!(me["accept_wait"]["count"], 5);
    assert_eq!(me["granted"], 64);
    assert_eq!(me["drops"]["accept_queue_full"], 0);
}

#[test]
fn slow_acceptor_depth_peak_counts_and_wait_match_kernel_and_application() {
    slow_acceptor(Daemon::shared(), &DEFAULT_BOUNDS);
}

/// `accept_wait_buckets = "all"` in the config file: every kernel bucket is exported,
/// each equal to the API's.
#[test]
fn accept_wait_buckets_all_exports_every_kernel_bucket() {
    let dir = TempDir::new("accept-wait-all");
    let config = dir.write(
        "backlogd.toml",
        "listen = \"127.0.0.1:0\"\naccept_wait_buckets = \"all\"\n",
    );
    let daemon = Daemon::start_with(&["--config", config.to_str().expect("UTF-8 path")]);
    slow_acceptor(&daemon, &ALL_BOUNDS);
}

/// A bound that is not one of the kernel's is refused, in the file (check-config, run)
/// and on the command line, with the allowed values listed.
#[test]
fn accept_wait_bound_not_a_kernel_bound_is_refused_with_the_allowed_values() {
    let allowed = ALL_BOUNDS.join(", ");
    let dir = TempDir::new("accept-wait-bad");
    let config = dir.write("backlogd.toml", "accept_wait_buckets = [0.001024, 0.5]\n");
    let config = config.to_str().expect("UTF-8 path");
    for args in [
        vec!["check-config", "--config", config],
        vec!["run", "--config", config],
        vec![
            "run",
            "--config",
            "/dev/null",
            "--listen",
            "127.0.0.1:0",
            "--accept-wait-buckets",
            "0.001024,0.5",
        ],
    ] {
        let out = run_to_end(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        // 2: the exit status of every error (and of clap's usage errors).
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(
            stderr.contains("0.5 is not one of the kernel's accept-wait bucket bounds"),
            "{args:?}: {stderr}"
        );
        assert!(
            stderr.contains(&format!("Fix: use bounds from {allowed}, or \"all\"")),
            "{args:?}: {stderr}"
        );
    }
}

/// TCP Fast Open: the kernel creates the child at the SYN (data in the SYN, no cookie
/// needed in this namespace) and queues it for accept inside `tcp_conn_request`, before
/// any final ACK. Each mode must count it queued exactly once: not again when its
/// handshake completes on the child itself.
#[test]
fn fast_open_children_are_queued_once_at_the_syn() {
    const CLIENTS: usize = 6;
    let daemon = Daemon::shared();
    let ns = Netns::new();
    // Client and server enabled, no cookie asked or needed, no TCP_FASTOPEN option
    // needed on the listener (TFO_CLIENT_ENABLE | TFO_SERVER_ENABLE |
    // TFO_CLIENT_NO_COOKIE | TFO_SERVER_COOKIE_NOT_REQD | TFO_SERVER_WO_SOCKOPT1).
    ns.sysctl(
        "net.ipv4.tcp_fastopen",
        &(0x1 | 0x2 | 0x4 | 0x200 | 0x400).to_string(),
    );
    let listener = Listener::open(&ns, "127.0.0.1:0", 64);
    daemon.wait_for_listener(listener.inode);
    let before = tcp_ext(&ns);
    let addr = listener.addr;
    let clients: Vec<socket2::Socket> = ns.run(move || {
        (0..CLIENTS)
            .map(|_| {
                let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
                    .expect("client socket()");
                // sendto(MSG_FASTOPEN) connects with the data in the SYN.
                s.send_to_with_flags(b"hello", &addr.into(), libc::MSG_FASTOPEN)
                    .expect("sendto(MSG_FASTOPEN)");
                s
            })
            .collect()
    });
    // The kernel created a child at each SYN; the clients' final ACKs then complete the
    // handshakes on the children, which must not count them queued again: waited for
    // until no child of the listener is left in SYN-RECV.
    let passive = wait_for_rise(&ns, "TCPFastOpenPassive", &before, |rise| {
        rise >= CLIENTS as u64 && pending_request_peers(&ns, addr.port()).is_empty()
    })
    .rise;
    assert_eq!(
        passive, CLIENTS as u64,
        "the kernel created a child at the SYN for every client (TcpExt TCPFastOpenPassive)"
    );
    for _ in 0..2 {
        listener.socket.accept().expect("accept");
    }
    let queue = kernel_queue(&ns, &listener);
    let scrape = daemon.scrape();
    drop(clients);
    let v = |name| value(&scrape, name, &listener) as u64;
    let mut exact = Exact::listener(daemon, &ns, &listener);
    exact
        .evidence("socket (ss) after 2 accepts", &queue)
        .eq(
            "queued vs the kernel's Fast Open children (TCPFastOpenPassive)",
            v("backlogd_listen_queued_total"),
            passive,
        )
        .eq(
            "accepted vs the application's accept() calls",
            v("backlogd_listen_accepted_total"),
            2,
        )
        .eq(
            "queued - accepted vs Recv-Q",
            v("backlogd_listen_queued_total").saturating_sub(v("backlogd_listen_accepted_total")),
            queue.recv_q,
        )
        .eq(
            "accept waits vs the application's accept() calls",
            v("backlogd_listen_accept_wait_seconds_count"),
            2,
        )
        .eq(
            "SYNs received vs the clients",
            v("backlogd_listen_syns_received_total"),
            CLIENTS as u64,
        );
    exact.verify();
}

/// The SYN queue's length now: requests held at their final ACK (every pure ACK and data
/// segment to the namespace dropped), read by the scan pass, against the SYN-RECV
/// requests `ss` lists for the port, as the queue grows through `held`; then, the drops
/// lifted and each client's first data completing its handshake, 0.
fn syn_queue_now(daemon: &Daemon, bind: &str, held: &[usize]) {
    let ns = Netns::new();
    // The held requests must outlive the test: SYN-ACK retransmits for minutes.
    ns.sysctl("net.ipv4.tcp_synack_retries", "10");
    let listener = Listener::open(&ns, bind, 64);
    daemon.wait_for_listener(listener.inode);
    let port = listener.addr.port();
    let socket = listener.inode.to_string();
    let syn_now = |scrape: &Scrape| {
        scrape
            .value("backlogd_listen_syn_queue_length", &[("socket", &socket)])
            .unwrap_or_else(|| panic!("no SYN queue length for {socket}:\n{}", scrape.text))
            as u64
    };
    ns.drop_incoming("ack");
    let mut clients = Vec::new();
    let mut exact = Exact::listener(daemon, &ns, &listener);
    for &n in held {
        clients.extend(connect_burst(&ns, listener.addr, n - clients.len()));
        let deadline = Instant::now() + Duration::from_secs(10);
        while pending_request_peers(&ns, port).len() != n {
            assert!(Instant::now() < deadline, "{n} requests never pending");
            std::thread::sleep(Duration::from_millis(10));
        }
        let counted = Instant::now();
        let scrape = daemon.scrape_after(counted);
        // Nothing completes or times out meanwhile: the kernel still lists n after.
        let after = pending_request_peers(&ns, port).len();
        exact
            .evidence(
                &format!("SYN-RECV requests (ss) before and after, {n} held"),
                (n, after),
            )
            .eq(
                &format!("SYN queue now vs SYN-RECV requests, {n} held"),
                syn_now(&scrape),
                after as u64,
            );
    }
    ns.stop_dropping();
    for c in &clients {
        c.send(b"x").expect("a client's first data");
    }
    let queue = wait_for_queue(&ns, &listener, clients.len() as u64);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !pending_request_peers(&ns, port).is_empty() {
        assert!(Instant::now() < deadline, "requests still pending");
        std::thread::sleep(Duration::from_millis(10));
    }
    let scrape = daemon.scrape_after(Instant::now());
    exact
        .evidence("accept queue once the handshakes completed", &queue)
        .eq(
            "SYN queue now vs SYN-RECV requests, all completed",
            syn_now(&scrape),
            pending_request_peers(&ns, port).len() as u64,
        )
        .eq(
            "SYN queue peak vs the most requests held",
            value(&scrape, "backlogd_listen_syn_queue_max_length", &listener) as u64,
            clients.len() as u64,
        );
    drop(clients);
    exact.verify();
}

/// IPv4 at three lengths, then IPv6 at one (the pass reads the queue the same for both;
/// each step waits up to a second for a fresh pass), against one daemon (a daemon start
/// costs seconds in the matrix's emulated guests).
#[test]
fn syn_queue_length_now_equals_the_syn_recv_requests() {
    let daemon = Daemon::shared();
    // The typed iterator wherever the kernel has bpf_sock_from_file (5.11), the one by
    // probe reads only where it has not: a refusal of the first elsewhere would go
    // unseen behind the fallback.
    let loaded: Vec<String> = fd_object_ids(daemon.pid(), "prog_id")
        .iter()
        .filter_map(|id| {
            Some(
                bpftool(&["prog", "show", "id", id])["name"]
                    .as_str()?
                    .to_owned(),
            )
        })
        .filter(|name| name.starts_with("listeners"))
        .collect();
    let expected = if release_at_least(5, 11) {
        "listeners"
    } else {
        "listeners_probed"
    };
    // The kernel keeps 15 characters of a program's name; bpftool prints the whole one
    // where BTF has it (5.10 does): compare 15.
    let short = |n: &str| n[..n.len().min(15)].to_owned();
    assert_eq!(
        loaded.iter().map(|n| short(n)).collect::<Vec<_>>(),
        [short(expected)],
        "the scan iterator loaded: {loaded:?}"
    );
    syn_queue_now(daemon, "127.0.0.1:0", &[1, 5, 20]);
    syn_queue_now(daemon, "[::1]:0", &[7]);
}

/// Twelve clients whose handshakes completed onto `listener`'s accept queue, held open.
fn twelve_queued(ns: &Netns, listener: &Listener) -> Vec<std::net::TcpStream> {
    let addr = listener.addr;
    let clients = ns.run(move || {
        (0..12)
            .map(|_| std::net::TcpStream::connect(addr).expect("connect"))
            .collect()
    });
    wait_for_queue(ns, listener, 12);
    clients
}

/// `accept_wait = false`: no accept-wait histogram is served, and the queue's counts
/// stay exact.
#[test]
fn without_accept_wait_timing_nothing_is_timed_and_the_counts_stay_exact() {
    let daemon = Daemon::start_with(&["--accept-wait", "false"]);
    let ns = Netns::new();
    let listener = Listener::open(&ns, "127.0.0.1:0", 64);
    daemon.wait_for_listener(listener.inode);
    let clients = twelve_queued(&ns, &listener);
    for _ in 0..5 {
        listener.socket.accept().expect("accept");
    }
    let queue = kernel_queue(&ns, &listener);
    let scrape = daemon.scrape_after(Instant::now());
    let me = daemon.api_listener(listener.inode);
    drop(clients);
    let v = |name| value(&scrape, name, &listener) as u64;
    let mut exact = Exact::listener(&daemon, &ns, &listener);
    exact
        .evidence("socket (ss) after 5 accepts", &queue)
        .eq(
            "queued vs the clients' completed handshakes",
            v("backlogd_listen_queued_total"),
            12,
        )
        .eq(
            "accepted vs the application's accept() calls",
            v("backlogd_listen_accepted_total"),
            5,
        )
        .eq(
            "accept queue length vs Recv-Q",
            v("backlogd_listen_accept_queue_length"),
            queue.recv_q,
        )
        .eq(
            "accept waits in the API",
            me["accept_wait"]["count"].as_u64().expect("count"),
            0,
        );
    let served: Vec<_> = scrape
        .text
        .lines()
        .filter(|l| l.contains("backlogd_listen_accept_wait_seconds"))
        .collect();
    exact.evidence("accept-wait lines on /metrics", &served).eq(
        "accept-wait lines on /metrics",
        served.len() as u64,
        0,
    );
    exact.verify();
}

/// `syscall_hook = false`: tracepoint and kprobe modes run no program per syscall, so
/// accepts, accept waits and listen()'s request are not served, and a listener opened
/// after the daemon is listed by the rescan its first segments ask for (the scheduled
/// one is 30 s away); every other figure stays exact. fentry mode has no per-syscall
/// program, and there the setting changes nothing.
#[test]
fn without_the_syscall_hook_no_program_runs_per_syscall_and_the_rest_stays_exact() {
    let daemon = Daemon::start_with(&["--syscall-hook", "false", "--rescan-interval", "30"]);
    let fentry = daemon.scrape().hook_mode() == "fentry";
    let programs: Vec<&str> = fd_object_ids(daemon.pid(), "prog_id")
        .iter()
        .flat_map(|id| backlogd_tests::daemon::program_names(id.parse().expect("prog id")))
        .collect();
    assert!(
        !programs.contains(&backlogd_common::names::program::SYSCALL_EXIT),
        "the per-syscall program is loaded: {programs:?}"
    );
    // Opened after the daemon's first scan: outside fentry mode no program sees its
    // listen(), and its first handshakes make the sampler ask for a rescan (wait_for_listener
    // allows 10 s).
    let ns = Netns::new();
    let listener = Listener::open(&ns, "127.0.0.1:0", 64);
    let clients = twelve_queued(&ns, &listener);
    daemon.wait_for_listener(listener.inode);
    for _ in 0..5 {
        listener.socket.accept().expect("accept");
    }
    let queue = kernel_queue(&ns, &listener);
    // The length now is a scan pass's: one after the accepts.
    let scrape = daemon.scrape_after(Instant::now());
    let snapshot = daemon.api_snapshot();
    let me = daemon.api_listener(listener.inode);
    drop(clients);
    let socket = listener.inode.to_string();
    let served = |name: &str| scrape.value(name, &[("socket", &socket)]);
    let v =
        |name: &str| served(name).unwrap_or_else(|| panic!("no {name}:\n{}", scrape.text)) as u64;
    let mut exact = Exact::listener(&daemon, &ns, &listener);
    exact
        .evidence("socket (ss) after 5 accepts", &queue)
        .eq(
            "queued vs the clients' completed handshakes",
            v("backlogd_listen_queued_total"),
            12,
        )
        .eq(
            "SYNs received vs the clients' connects",
            v("backlogd_listen_syns_received_total"),
            12,
        )
        .eq(
            "accept queue length vs Recv-Q",
            v("backlogd_listen_accept_queue_length"),
            queue.recv_q,
        )
        .eq(
            "granted backlog vs Send-Q",
            v("backlogd_listen_backlog_granted"),
            queue.send_q,
        );
    let accepted_lines = scrape
        .text
        .lines()
        .filter(|l| l.contains("accepted_total") || l.contains("accept_wait_seconds"))
        .count() as u64;
    exact.evidence("the API's accepts_counted", &snapshot["accepts_counted"]);
    if fentry {
        // inet_csk_accept's return: nothing per syscall to give up.
        exact
            .eq(
                "accepted vs the application's accept() calls (fentry)",
                v("backlogd_listen_accepted_total"),
                5,
            )
            .eq(
                "accept waits timed (fentry)",
                me["accept_wait"]["count"].as_u64().expect("count"),
                5,
            )
            .eq(
                "requested backlog (fentry's listen fexit)",
                v("backlogd_listen_backlog_requested"),
                64,
            )
            .eq(
                "the API's accepts_counted (fentry)",
                u64::from(snapshot["accepts_counted"] == true),
                1,
            );
    } else {
        exact
            .eq(
                "lines of accepted counters and accept-wait histograms on /metrics",
                accepted_lines,
                0,
            )
            .eq(
                "requested backlog series (no listen() seen)",
                u64::from(served("backlogd_listen_backlog_requested").is_some()),
                0,
            )
            .eq(
                "the API's accepts_counted",
                u64::from(snapshot["accepts_counted"] == false),
                1,
            );
    }
    exact.verify();
}
