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
        &[
            ("NOTIFY_SOCKET", &notify.name),
            ("WATCHDOG_USEC", WATCHDOG_USEC),
        ],
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
        "all {threads} threads after READY=1: CapPrm = CapEff = {:#018x} \
         (CAP_DAC_READ_SEARCH, CAP_SYS_PTRACE, and CAP_BPF where bpf(2) needs it), \
         CapInh = CapAmb = 0",
        keep(daemon.pid())
    );
    daemon.wait_for_log("dropped every capability");

    // Watchdog: a ping well within every WATCHDOG_USEC (the daemon pings at half of it):
    // each gap between pings is held to the configured value, the one systemd acts on.
    // (The unit's WatchdogSec is 30 s; 2 s here shows several gaps in seconds.)
    let period = Duration::from_micros(WATCHDOG_USEC.parse().unwrap());
    let mut pings = Vec::new();
    let deadline = Instant::now() + HANG;
    while pings.len() < 4 {
        assert!(Instant::now() < deadline, "watchdog pings: {pings:?}");
        if let Some(m) = notify.recv(HANG)
            && m.contains("WATCHDOG=1")
        {
            pings.push(Instant::now());
        }
    }
    let gaps: Vec<Duration> = pings.windows(2).map(|w| w[1] - w[0]).collect();
    eprintln!("watchdog pings {gaps:?} apart, WATCHDOG_USEC {period:?}");
    assert!(
        gaps.iter().all(|g| *g < period),
        "a gap between watchdog pings reached WATCHDOG_USEC ({period:?}): {gaps:?}"
    );

    // SIGHUP: RELOADING=1 (with MONOTONIC_USEC), then READY=1 again.
    daemon.signal(libc::SIGHUP);
    let seen = notify.recv_until("READY=1", Duration::from_secs(10));
    let reloading = seen
        .iter()
        .position(|m| m.contains("RELOADING=1"))
        .unwrap_or_else(|| panic!("no RELOADING=1 before READY=1: {seen:?}"));
    assert!(seen[reloading].contains("MONOTONIC_USEC="), "{seen:?}");

    // SIGTERM: STOPPING=1 and a clean exit, before systemd would kill it.
    let stop = Instant::now();
    daemon.signal(libc::SIGTERM);
    notify.recv_until("STOPPING=1", HANG);
    let status = daemon
        .wait_exit(HANG)
        .unwrap_or_else(|| panic!("still running {HANG:?} after SIGTERM"));
    let took = stop.elapsed();
    assert!(status.success(), "{status}");
    eprintln!("exit {took:?} after SIGTERM");
    let limit = unit_seconds("TimeoutStopSec");
    assert!(
        took < limit,
        "exit {took:?} after SIGTERM: past the unit's TimeoutStopSec ({limit:?})"
    );
}

/// The watchdog period the readiness test gives the daemon, in µs (as systemd sets it).
const WATCHDOG_USEC: &str = "2000000";

/// SIGTERM with clients that would keep a naive server up: open connections get
/// `http.shutdown_timeout` and are then cut, so the daemon exits before systemd's
/// `TimeoutStopSec` (the unit's) runs out and it is killed.
#[test]
fn sigterm_exits_before_the_units_stop_timeout_despite_idle_and_slow_clients() {
    let mut daemon = Daemon::start();
    // A kept-alive client that scraped once and stays connected.
    let mut idle = TcpStream::connect(daemon.addr).unwrap();
    write!(idle, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut buf = [0u8; 512];
    let n = idle.read(&mut buf).unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
    let stop = Arc::new(AtomicBool::new(false));
    let slow: Vec<_> = (0..4)
        .map(|_| slowloris(daemon.addr, HANG, stop.clone()))
        .collect();
    // A client that asks and never reads the answer.
    let mut deaf = TcpStream::connect(daemon.addr).unwrap();
    for _ in 0..50 {
        let _ = write!(deaf, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    }
    // Every one of them served by the daemon before the signal.
    accepted_by_daemon(daemon.addr, 6);

    let start = Instant::now();
    daemon.signal(libc::SIGTERM);
    let status = daemon.wait_exit(HANG);
    let took = start.elapsed();
    stop.store(true, Ordering::Relaxed);
    for t in slow {
        t.join().unwrap();
    }
    let status = status.unwrap_or_else(|| panic!("still running {HANG:?} after SIGTERM"));
    let cut = daemon
        .log()
        .lines()
        .find(|l| l.contains("cutting HTTP connections"))
        .map(str::to_owned);
    eprintln!(
        "SIGTERM to exit: {took:?} with 1 idle keep-alive, 4 slowloris and 1 non-reading \
         client connected; {}",
        cut.as_deref()
            .unwrap_or("every connection ended within http.shutdown_timeout")
    );
    assert!(status.success(), "{status}");
    let limit = unit_seconds("TimeoutStopSec");
    assert!(
        took < limit,
        "exit {took:?} after SIGTERM: past the unit's TimeoutStopSec ({limit:?}), where \
         systemd kills it"
    );
    drop(idle);
}
