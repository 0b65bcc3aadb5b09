//! The accept queue: depth, peak, queued/accepted counts and accept wait, against the
//! kernel's queue (sock_diag Recv-Q) and the application's own accept() calls.

use std::time::{Duration, Instant};

use backlogd_tests::{
    Daemon, Exact, Netns, Scrape,
    sockets::{Listener, kernel_queue},
};

fn value(scrape: &Scrape, name: &str, l: &Listener) -> f64 {
    scrape
        .value(name, &[("socket", &l.inode.to_string())])
        .unwrap_or_else(|| panic!("no {name} for socket {} in:\n{}", l.inode, scrape.text))
}

#[test]
fn slow_acceptor_depth_peak_counts_and_wait_match_kernel_and_application() {
    let daemon = Daemon::start();
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
    std::thread::sleep(Duration::from_millis(20));
    let peak = kernel_queue(&ns, &listener).recv_q;
    assert_eq!(peak, 12, "kernel accept queue at the peak");

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
    let scrape = daemon.scrape();
    drop(clients);

    assert_eq!(queue.recv_q, 7, "7 connections left after 5 accepts");
    let v = |name| value(&scrape, name, &listener) as u64;
    let mut exact = Exact::listener(&daemon, &ns, &listener);
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
    let enqueue_events = scrape
        .value("backlogd_listen_queued_total", &[("socket", &socket)])
        .is_some();
    if !enqueue_events {
        // Tracepoint mode on a kernel without sock:sk_data_ready (Linux < 6.x, e.g. Debian
        // 6.1): queued and accept waits are documented as not reported. Check that they
        // are absent rather than wrong, and that the daemon said why.
        assert!(
            scrape
                .find(
                    "backlogd_listen_accept_wait_seconds_count",
                    &[("socket", &socket)]
                )
                .is_empty(),
            "accept waits reported without enqueue events"
        );
        exact.verify();
        assert!(
            daemon.log().contains("no sock:sk_data_ready"),
            "{}",
            daemon.log()
        );
        eprintln!(
            "SKIPPED queued and accept-wait checks: this kernel has no sock:sk_data_ready \
             tracepoint, so {} mode does not report them (documented)",
            scrape.hook_mode()
        );
        return;
    }
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
    // Each bucket holds the waits whose whole bracket is at or below its bound; a bound
    // inside a bracket cannot be decided.
    let le = |bound: &str| {
        scrape
            .value(
                "backlogd_listen_accept_wait_seconds_bucket",
                &[("socket", &socket), ("le", bound)],
            )
            .unwrap_or_else(|| panic!("no bucket le={bound}"))
    };
    let mut checked = 0;
    for bound in [
        "0.016384", "0.032768", "0.065536", "0.131072", "0.262144", "0.524288",
    ] {
        let b: f64 = bound.parse().expect("bound");
        if app_waits.iter().any(|(wl, wh)| (*wl..=*wh).contains(&b)) {
            eprintln!("NOT CHECKED: bucket le={bound} lies inside an application bracket");
            continue;
        }
        let expected = app_waits.iter().filter(|(_, wh)| *wh <= b).count() as u64;
        exact.eq(
            &format!("accept waits at or below {bound} s vs the application's"),
            le(bound) as u64,
            expected,
        );
        checked += 1;
    }
    assert!(checked >= 4, "too few buckets decidable: {app_waits:?}");
    exact.verify();

    // The JSON API (what `backlogd top` reads) carries the same figures.
    let (status, body) = daemon.get("/api/v1/snapshot");
    assert_eq!(status, 200, "{body}");
    let snapshot: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    let mode = snapshot["hook_mode"].as_str().expect("hook_mode");
    assert_eq!(
        scrape.value("backlogd_hook_mode", &[("mode", mode)]),
        Some(1.0)
    );
    let me = snapshot["listeners"]
        .as_array()
        .expect("listeners")
        .iter()
        .find(|l| l["inode"] == listener.inode)
        .unwrap_or_else(|| panic!("listener {} not in {body}", listener.inode));
    assert_eq!(me["queued"], 12);
    assert_eq!(me["accepted"], 5);
    assert_eq!(me["queues"]["accept_depth"], 7);
    assert_eq!(me["queues"]["accept_max"], 12);
    assert_eq!(me["accept_wait"]["count"], 5);
    assert_eq!(me["granted"], 64);
    assert_eq!(me["drops"]["accept_queue_full"], 0);
}
