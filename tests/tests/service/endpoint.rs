//! The HTTP endpoint against abusive clients: unknown paths and methods, malformed and
//! oversized requests, slowloris, floods at the connection limit.

use std::{
    io::{Read as _, Write as _},
    net::{SocketAddr, TcpStream},
    sync::{Arc, atomic::AtomicBool, mpsc},
    time::{Duration, Instant},
};

use backlogd_tests::{
    Daemon, Netns, Scrape,
    http::{self, Reply, raw},
    sockets::Listener,
};
use socket2::{Domain, Socket, Type};

use crate::support::*;

/// Times a well-behaved scrape (a figure for the report, or held to a configured bound);
/// panics if it fails.
fn timed_scrape(addr: SocketAddr) -> Duration {
    let start = Instant::now();
    let (status, body) = http::try_get(addr, "/metrics").unwrap_or_else(|e| panic!("scrape: {e}"));
    assert_eq!(status, 200);
    assert!(body.contains("backlogd_hook_mode"));
    start.elapsed()
}

#[test]
fn only_documented_paths_and_methods_are_served() {
    let daemon = Daemon::start();
    for path in [
        "/",
        "/metrics",
        "/healthz",
        "/api/v1/listeners",
        "/api/v1/snapshot",
    ] {
        assert_eq!(daemon.get(path).0, 200, "{path}");
    }
    assert_eq!(daemon.get("/admin").0, 404);
    assert_eq!(daemon.get("/metrics/../etc/passwd").0, 404);
    let post = raw(
        daemon.addr,
        b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
    );
    assert!(post.starts_with("HTTP/1.1 405"), "{post}");
    let delete = raw(
        daemon.addr,
        b"DELETE /api/v1/listeners HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    assert!(delete.starts_with("HTTP/1.1 405"), "{delete}");
}

/// Abusive clients of every kind, and a scraper meanwhile. A scrape that had to wait for
/// a slot would get one only when the header timeout cut some connection: each is held to
/// answer before the configured `read_header_timeout`, the only bound here that is a
/// feature (the connection limit's eviction); every other wait only catches a hang.
#[test]
fn malformed_oversized_slow_and_flooding_clients_leave_metrics_answering() {
    let flags = [
        "--http-max-connections",
        "32",
        "--http-read-header-timeout",
        "2",
    ];
    let daemon = Daemon::start_with(&flags);
    let addr = daemon.addr;
    let timeout = http_seconds(&flags, "read_header_timeout");
    let max = http_setting(&flags, "max_connections") as usize;

    let garbage = raw(addr, b"\x16\x03\x01\x02\x00GARBAGE\r\n\r\n");
    assert!(
        garbage.is_empty() || garbage.starts_with("HTTP/1.1 400"),
        "{garbage:?}"
    );
    let no_version = raw(addr, b"GET /metrics\r\n\r\n");
    assert!(
        no_version.is_empty() || no_version.starts_with("HTTP/1.1 400"),
        "{no_version:?}"
    );
    let huge = format!(
        "GET /metrics HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n",
        "a".repeat(64 * 1024)
    );
    let oversized = raw(addr, huge.as_bytes());
    assert!(oversized.starts_with("HTTP/1.1 431"), "{oversized:?}");
    eprintln!(
        "malformed: {garbage:?}; oversized head: {}",
        oversized.lines().next().unwrap_or("")
    );
    timed_scrape(addr);

    // Slowloris: more slow connections than the limit, each trickling a head for longer
    // than the header timeout. Past the limit each new connection closes an older idle
    // one; the others are cut at the header timeout: none outlives it.
    let never = Arc::new(AtomicBool::new(false));
    let slow: Vec<_> = (0..64)
        .map(|_| slowloris(addr, HANG, never.clone()))
        .collect();
    // Every one connected and taken in (the evicted ones closed again) before scraping.
    eventually("64 slowloris clients taken in", HANG, || {
        (slow.iter().filter(|t| t.is_finished()).count() >= 64 - max).then_some(())
    });
    let mut worst = Duration::ZERO;
    for _ in 0..10 {
        worst = worst.max(timed_scrape(addr));
    }
    let slow: Vec<Slow> = slow.into_iter().map(|t| t.join().unwrap()).collect();
    eprintln!("slowloris (64 connections, limit {max}): worst of 10 scrapes {worst:?}");
    assert!(
        worst < timeout,
        "a scrape took {worst:?} under slowloris, as long as the header timeout \
         ({timeout:?}) that frees slots without eviction"
    );
    for (i, r) in slow.iter().enumerate() {
        r.closed_after
            .unwrap_or_else(|| panic!("slowloris {i} still open after {HANG:?}: {r:?}"));
        assert!(r.reply.is_empty(), "slowloris {i}: {r:?}");
    }
    // Closed before the header timeout could: evicted by the limit.
    let evicted = slow
        .iter()
        .filter(|r| r.closed_after.is_some_and(|c| c < timeout))
        .count();
    assert!(
        evicted >= 64 - max,
        "64 slowloris with a limit of {max}, only {evicted} closed before the header timeout"
    );

    // Flood: many connections opened at once and left silent.
    let flood: Vec<TcpStream> = (0..400)
        .filter_map(|_| TcpStream::connect_timeout(&addr, Duration::from_secs(1)).ok())
        .collect();
    let mut worst = Duration::ZERO;
    for _ in 0..10 {
        worst = worst.max(timed_scrape(addr));
    }
    eprintln!(
        "flood ({} idle connections, limit {max}): worst of 10 scrapes {worst:?}",
        flood.len()
    );
    assert!(
        worst < timeout,
        "a scrape took {worst:?} under a connection flood, as long as the header timeout \
         ({timeout:?}) that frees slots without eviction"
    );
    drop(flood);
    timed_scrape(addr);
}

/// Slowloris clients below the connection limit: nothing but the header timeout can close
/// them (no eviction; their bytes keep the idle timeout away), and it must, not before
/// its configured value; a scraper is answered meanwhile.
#[test]
fn slowloris_clients_are_cut_at_the_header_timeout_while_metrics_answers() {
    let flags = [
        "--http-read-header-timeout",
        "2",
        "--http-max-connections",
        "64",
    ];
    let daemon = Daemon::start_with(&flags);
    let timeout = http_seconds(&flags, "read_header_timeout");
    let addr = daemon.addr;
    // Fewer than the limit, so that no eviction closes them: only the header timeout can.
    // They trickle a byte every 200 ms, far more often than the idle timeout (60 s).
    let never = Arc::new(AtomicBool::new(false));
    let slow: Vec<_> = (0..16)
        .map(|_| slowloris(addr, HANG, never.clone()))
        .collect();
    // Scrapes while they trickle; those that ended with every slowloris still open count.
    let mut scrapes = Vec::new();
    let mut while_open = 0;
    while !slow.iter().all(|t| t.is_finished()) {
        scrapes.push(timed_scrape(addr));
        if !slow.iter().any(|t| t.is_finished()) {
            while_open += 1;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let slow: Vec<Slow> = slow.into_iter().map(|t| t.join().unwrap()).collect();
    let closed: Vec<Duration> = slow
        .iter()
        .enumerate()
        .map(|(i, r)| {
            r.closed_after
                .unwrap_or_else(|| panic!("slowloris {i} still open after {HANG:?}: {r:?}"))
        })
        .collect();
    eprintln!(
        "16 slowloris, header timeout {timeout:?}: closed after {:?} to {:?}; {} scrapes \
         meanwhile ({while_open} while all were open), worst {:?}",
        closed.iter().min().unwrap(),
        closed.iter().max().unwrap(),
        scrapes.len(),
        scrapes.iter().max().unwrap()
    );
    for (i, (r, closed)) in slow.iter().zip(&closed).enumerate() {
        // Not before the deadline (the clock started before connect()); nothing sent
        // back; bytes were trickling until the cut.
        assert!(
            *closed >= timeout,
            "slowloris {i} closed after {closed:?}, before the header timeout {timeout:?}: \
             {r:?}"
        );
        assert!(r.reply.is_empty(), "slowloris {i}: {r:?}");
        assert!(r.sent >= 5, "slowloris {i} sent {} bytes: {r:?}", r.sent);
    }
    // A well-behaved client was answered while they held their connections
    // (timed_scrape asserts each answer).
    assert!(
        while_open >= 1,
        "no scrape answered while the slowloris clients were all open: {scrapes:?}"
    );
}

/// Whether the server has closed `s` (a connection that never sent anything, so nothing
/// but a close can arrive on it).
fn closed_by_server(s: &TcpStream) -> bool {
    s.set_nonblocking(true).unwrap();
    let mut byte = [0u8; 1];
    let seen = s.peek(&mut byte);
    s.set_nonblocking(false).unwrap();
    match seen {
        Ok(0) => true,
        Ok(_) => panic!("a silent connection was sent data"),
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => false,
        Err(_) => true,
    }
}

#[test]
fn a_large_scrape_read_slowly_is_not_truncated_when_a_flood_hits_the_connection_limit() {
    const MAX: usize = 4;
    const FLOOD: usize = 16;
    // About 3 KB of page each (a 3 MB page): at least 8 times what the slow reader takes
    // before the flood.
    const LISTENERS: usize = 1000;
    // The daemon serves inside a namespace of the test's, so that the namespace's tcp_wmem
    // can cap the send buffer of its connections (below).
    let ns = Netns::new();
    // Generous timeouts: only the connection limit may close anything here.
    let daemon = ns.run(|| {
        Daemon::start_with(&[
            "--http-max-connections",
            "4",
            "--http-read-header-timeout",
            "60",
            "--http-write-timeout",
            "60",
        ])
    });
    let addr = daemon.addr;
    let get = |path: &'static str| ns.run(move || http::get(addr, path));
    // A big scrape: ~40 series for each of 600 listeners.
    let netns = ns.inode().to_string();
    let listeners: Vec<Listener> = (0..LISTENERS)
        .map(|_| Listener::open(&ns, "127.0.0.1:0", 8))
        .collect();
    let inodes: std::collections::HashSet<String> =
        listeners.iter().map(|l| l.inode.to_string()).collect();
    // Ours among the namespace's listeners (the daemon's own socket is one too).
    let ours = |s: &Scrape| {
        s.find("backlogd_listen_backlog_granted", &[("netns", &netns)])
            .iter()
            .filter(|sample| inodes.contains(&sample.labels["socket"]))
            .count()
    };
    eventually(
        "every listener of the namespace in a scrape",
        Duration::from_secs(30),
        || {
            let (status, body) = get("/metrics");
            assert_eq!(status, 200, "{body}");
            (ours(&Scrape::parse(&body)) == LISTENERS).then_some(())
        },
    );

    // From now on the kernel grows a socket's send buffer to 64 KiB at most, so it holds
    // only a sliver of the response and the rest is still the server's to write when the
    // flood comes. (With the host's 4 MiB it could take a scrape of a few MiB whole, and
    // closing the connection would not truncate it.)
    ns.sysctl("net.ipv4.tcp_wmem", "4096 16384 65536");

    // The slow reader: a small receive buffer, reads the first 256 KiB in 4 KiB steps 10 ms
    // apart, then stops until the flood has hit the limit, then reads the rest.
    let (mid_tx, mid_rx) = mpsc::channel();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let slow = ns.run(move || {
        let s = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
        s.set_recv_buffer_size(4096).unwrap();
        s.connect(&addr.into()).expect("slow reader connect");
        TcpStream::from(s)
    });
    let reader = std::thread::spawn(move || -> (Vec<u8>, Option<std::io::Error>) {
        let mut s = slow;
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        let mut told = false;
        loop {
            if !told && got.len() >= 256 * 1024 {
                mid_tx.send(got.len()).unwrap();
                go_rx.recv().unwrap();
                told = true;
            }
            match s.read(&mut buf) {
                Ok(0) => return (got, None),
                Ok(n) => got.extend_from_slice(&buf[..n]),
                Err(e) => return (got, Some(e)),
            }
            if !told {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    });
    let read_before = mid_rx
        .recv_timeout(Duration::from_secs(60))
        .expect("the slow reader got less than 256 KiB");
    // The flood: connections that never send a request, 4 times the limit, held open.
    let flood: Vec<TcpStream> = ns.run(move || {
        (0..FLOOD)
            .map(|_| TcpStream::connect(addr).expect("flood connect"))
            .collect()
    });
    // Each flood connection past the limit closes one connection as the server accepts
    // it: wait until the server has taken them all in (its accept queue, `ss` Recv-Q,
    // empty), so every eviction was decided, and the closes it decided arrived.
    let port = addr.port().to_string();
    eventually("the server taking in the flood", HANG, || {
        let ss = ns.command("ss", &["-Hltn", &format!("sport = :{port}")]);
        let queued: u64 = ss.split_whitespace().nth(1)?.parse().ok()?;
        let closed = flood.iter().filter(|s| closed_by_server(s)).count();
        (queued == 0 && closed >= FLOOD - (MAX - 1)).then_some(())
    });
    go_tx.send(()).unwrap();
    let (got, error) = reader.join().unwrap();
    let closed = flood.iter().filter(|s| closed_by_server(s)).count();

    if let Some(e) = error {
        panic!(
            "the slow reader's connection failed after {} bytes: {e}",
            got.len()
        );
    }
    let reply = Reply::parse(&got).unwrap();
    assert_eq!(reply.status, 200, "{}", reply.head);
    let text = reply.complete_text();
    eprintln!(
        "slow reader: {} bytes of body, {read_before} read before a flood of {FLOOD} \
         connections (limit {MAX}); {closed} flood connections closed",
        text.len()
    );
    // Most of it was still the server's to send when the flood came.
    assert!(text.len() >= 8 * read_before, "only {} bytes", text.len());
    let last = text.lines().last().unwrap_or_default();
    assert!(
        text.ends_with('\n') && last.starts_with("backlogd_build_info{") && last.ends_with(" 1"),
        "the exposition's last line is {last:?}"
    );
    assert_eq!(ours(&Scrape::parse(&text)), LISTENERS);
    // The slow reader kept its slot; the flood connections took turns in the others.
    assert_eq!(
        closed,
        FLOOD - (MAX - 1),
        "flood connections closed by the server (limit {MAX}, 1 slot for the slow reader)"
    );
}
