//! systemd readiness, watchdog and stop; SIGTERM exit time with idle and slow clients.

use std::{
    io::{Read as _, Write as _},
    net::{SocketAddr, TcpStream},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use backlogd_tests::{
    Daemon,
    http::{self},
};

use crate::{capabilities::*, support::*};

#[test]
fn readiness_comes_after_attach_and_serving_then_reload_watchdog_and_stop() {
    let notify = NotifySocket::bind("ready");
    let port = free_port();
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let listen = addr.to_string();
    let mut daemon = Daemon::start_env(
        &["--listen", &listen],
        &[("NOTIFY_SOCKET", &notify.name), ("WATCHDOG_USEC", "400000")],
    );
    // Nothing but READY=1 may come first, and at that moment everything must be up.
    let first = notify
        .recv(Duration::from_secs(30))
        .expect("no notification within 30 s");
    assert!(
        first.lines().any(|l| l == "READY=1"),
        "first message: {first:?}"
    );
    let (status, body) = http::get(addr, "/metrics");
    assert_eq!(status, 200);
    assert!(
        body.contains("backlogd_hook_mode"),
        "probes not attached at READY=1: {body}"
    );
    assert!(daemon.log().contains("probes attached"), "{}", daemon.log());

    // Capabilities: only what the running daemon needs, in every thread.
    let threads = assert_runtime_caps(daemon.pid()).len();
    eprintln!(
        "all {threads} threads after READY=1: CapPrm = CapEff = {KEEP:#018x} \
         (CAP_DAC_READ_SEARCH, CAP_SYS_PTRACE, CAP_SYS_ADMIN), CapInh = CapAmb = 0"
    );
    daemon.wait_for_log("dropped every capability");

    // Watchdog at half of WATCHDOG_USEC (400 ms): several pings in 1.5 s.
    let start = Instant::now();
    let mut pings = 0;
    while start.elapsed() < Duration::from_millis(1500) {
        if let Some(m) = notify.recv(Duration::from_millis(500))
            && m.contains("WATCHDOG=1")
        {
            pings += 1;
        }
    }
    assert!((4..=10).contains(&pings), "{pings} watchdog pings in 1.5 s");

    // SIGHUP: RELOADING=1 (with MONOTONIC_USEC), then READY=1 again.
    daemon.signal(libc::SIGHUP);
    let seen = notify.recv_until("READY=1", Duration::from_secs(10));
    let reloading = seen
        .iter()
        .position(|m| m.contains("RELOADING=1"))
        .unwrap_or_else(|| panic!("no RELOADING=1 before READY=1: {seen:?}"));
    assert!(seen[reloading].contains("MONOTONIC_USEC="), "{seen:?}");

    // SIGTERM: STOPPING=1 and a clean exit.
    let stop = Instant::now();
    daemon.signal(libc::SIGTERM);
    notify.recv_until("STOPPING=1", Duration::from_secs(5));
    let status = daemon
        .wait_exit(Duration::from_secs(5))
        .expect("no exit within 5 s of SIGTERM");
    assert!(status.success(), "{status}");
    eprintln!("exit {:?} after SIGTERM", stop.elapsed());
}

#[test]
fn sigterm_exits_within_seconds_despite_idle_and_slow_clients() {
    let mut daemon = Daemon::start();
    // A kept-alive client that scraped once and stays connected.
    let mut idle = TcpStream::connect(daemon.addr).unwrap();
    write!(idle, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut buf = [0u8; 512];
    let n = idle.read(&mut buf).unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
    let stop = Arc::new(AtomicBool::new(false));
    let slow: Vec<_> = (0..4)
        .map(|_| slowloris(daemon.addr, Duration::from_secs(30), stop.clone()))
        .collect();
    // A client that asks and never reads the answer.
    let mut deaf = TcpStream::connect(daemon.addr).unwrap();
    for _ in 0..50 {
        let _ = write!(deaf, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    }
    std::thread::sleep(Duration::from_millis(500));

    let start = Instant::now();
    daemon.signal(libc::SIGTERM);
    let status = daemon.wait_exit(Duration::from_secs(10));
    let took = start.elapsed();
    stop.store(true, Ordering::Relaxed);
    for t in slow {
        t.join().unwrap();
    }
    let status = status.unwrap_or_else(|| panic!("still running 10 s after SIGTERM"));
    eprintln!(
        "SIGTERM to exit: {took:?} with 1 idle keep-alive, 4 slowloris and 1 non-reading \
         client connected"
    );
    assert!(status.success(), "{status}");
    assert!(took < Duration::from_secs(4), "took {took:?}");
    drop(idle);
}
