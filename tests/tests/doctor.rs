//! `backlogd doctor` against situations built for real, one namespace each. The
//! situations run in sequence inside one test: the daemon sees every listener on the
//! host, and the exit-status checks must not see another test's listeners.

use std::{
    io::{BufRead as _, BufReader},
    process::Command,
    time::{Duration, Instant},
};

use backlogd_common::netstat::counter;
use backlogd_tests::{
    Daemon, Netns,
    daemon::binary,
    doctor::{Doctor, evidence, kinds, set},
    kernel::{tcp_ext, wait_for_rise},
    sockets::{Listener, connect_burst, wait_for_queue},
};

/// The tests here check exit statuses that any listener on the host could change: one
/// at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn doctor_names_each_situation_with_its_evidence_and_nothing_false_when_healthy() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let daemon = Daemon::start();

    // Healthy: a listener with room, an application that accepts.
    {
        let ns = Netns::new();
        let l = Listener::open(&ns, "127.0.0.1:0", 128);
        daemon.wait_for_listener(l.inode);
        let clients = connect_burst(&ns, l.addr, 20);
        // Every handshake completed (the kernel's queue holds them all), then drained.
        wait_for_queue(&ns, &l, 20);
        l.socket.set_nonblocking(true).unwrap();
        while l.socket.accept().is_ok() {}
        drop(clients);
        let d = Doctor::run(&daemon, &["--fail-on", "info"]);
        assert_eq!(kinds(&d.about(&ns)), set(&[]), "{:#?}", d.findings);
        assert_eq!(d.status, 0, "all clear exits 0: {:#?}", d.findings);
    }

    // Clamped backlog: asked 511, somaxconn 128.
    {
        let ns = Netns::new();
        ns.sysctl("net.core.somaxconn", "128");
        let l = Listener::open(&ns, "127.0.0.1:0", 511);
        daemon.wait_for_listener(l.inode);
        let d = Doctor::run(&daemon, &[]);
        let found = d.about(&ns);
        assert_eq!(kinds(&found), set(&["backlog_clamped"]), "{found:#?}");
        let ev = evidence(found[0]);
        assert!(
            ev.contains("listen() backlog 511, sk_max_ack_backlog 128"),
            "{ev}"
        );
        assert!(ev.contains("net.core.somaxconn = 128"), "{ev}");
        assert!(
            found[0]["remedy"]
                .as_str()
                .unwrap()
                .contains("somaxconn=511")
        );
        assert_eq!(d.status, 1, "a warning fails the default --fail-on warning");
        // The JSON API serves the same findings.
        let (status, body) = daemon.get("/api/v1/findings");
        assert_eq!(status, 200);
        let api = Doctor {
            findings: serde_json::from_str(&body).expect("findings JSON"),
            status: 0,
        };
        assert_eq!(kinds(&api.about(&ns)), set(&["backlog_clamped"]));
        assert_eq!(api.about(&ns)[0]["evidence"], found[0]["evidence"]);
        assert_eq!(Doctor::run(&daemon, &["--fail-on", "critical"]).status, 0);
    }

    // Slow acceptor: backlog 4, nobody accepts, a burst.
    {
        let ns = Netns::new();
        ns.sysctl("net.ipv4.tcp_syncookies", "0");
        let l = Listener::open(&ns, "127.0.0.1:0", 4);
        daemon.wait_for_listener(l.inode);
        let before = tcp_ext(&ns);
        let clients = connect_burst(&ns, l.addr, 30);
        // The queue full (backlog + 1) and every other client dropped at least once.
        wait_for_queue(&ns, &l, 5);
        wait_for_rise(&ns, counter::LISTEN_DROPS, &before, |rise| rise >= 25);
        drop(clients);
        let d = Doctor::run(&daemon, &[]);
        let found = d.about(&ns);
        assert_eq!(kinds(&found), set(&["accept_queue_overflow"]), "{found:#?}");
        let ev = evidence(found[0]);
        assert!(ev.contains("accept queue peak 5 of capacity 4"), "{ev}");
        assert_eq!(found[0]["severity"], "critical");
    }

    // SYN flood, syncookies off, then on: handshakes never complete.
    for (cookies, kind) in [("0", "syn_queue_overflow"), ("1", "syncookies_sent")] {
        let ns = Netns::new();
        ns.sysctl("net.ipv4.tcp_syncookies", cookies);
        let l = Listener::open(&ns, "127.0.0.1:0", 8);
        daemon.wait_for_listener(l.inode);
        ns.drop_incoming("syn|ack");
        let before = tcp_ext(&ns);
        let clients = connect_burst(&ns, l.addr, 40);
        // 9 requests pending (backlog + 1), the SYN of each of the other 31 clients
        // dropped or answered with a cookie, in the kernel's count.
        let counter = if cookies == "0" {
            counter::REQQ_FULL_DROP
        } else {
            counter::REQQ_FULL_DO_COOKIES
        };
        wait_for_rise(&ns, counter, &before, |rise| rise >= 31);
        drop(clients);
        let d = Doctor::run(&daemon, &[]);
        let found = d.about(&ns);
        assert_eq!(
            kinds(&found),
            set(&[kind]),
            "syncookies={cookies}: {found:#?}"
        );
        let ev = evidence(found[0]);
        assert!(ev.contains("SYN queue peak 9 of limit 8"), "{ev}");
        if cookies == "0" {
            assert!(ev.contains("net.ipv4.tcp_syncookies = 0"), "{ev}");
        }
    }

    // A 4-socket SO_REUSEPORT group with one stalled member.
    {
        let ns = Netns::new();
        ns.sysctl("net.ipv4.tcp_syncookies", "0");
        let first = Listener::open_reuseport(&ns, "127.0.0.1:0", 8);
        let addr = first.addr.to_string();
        let mut members = vec![first];
        for _ in 0..3 {
            members.push(Listener::open_reuseport(&ns, &addr, 8));
        }
        for m in &members {
            daemon.wait_for_listener(m.inode);
            m.socket.set_nonblocking(true).unwrap();
        }
        let mut clients = Vec::new();
        for _ in 0..20 {
            clients.extend(connect_burst(&ns, members[0].addr, 5));
            for m in &members[1..] {
                while m.socket.accept().is_ok() {}
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        for m in &members[1..] {
            while m.socket.accept().is_ok() {}
        }
        let d = Doctor::run(&daemon, &[]);
        let found = d.about(&ns);
        let imbalance: Vec<_> = found
            .iter()
            .filter(|f| f["kind"] == "reuseport_imbalance")
            .collect();
        assert_eq!(imbalance.len(), 1, "{found:#?}");
        let stalled = members[0].inode.to_string();
        assert!(
            imbalance[0]["remedy"]
                .as_str()
                .unwrap()
                .contains(&format!("socket {stalled}")),
            "{imbalance:#?}"
        );
        // The stalled member also overflows; its siblings do not appear.
        assert_eq!(
            kinds(&found),
            set(&["accept_queue_overflow", "reuseport_imbalance"]),
            "{found:#?}"
        );
        drop(clients);
    }

    // tcp_abort_on_overflow=1: reported for the namespace (info while nothing overflowed).
    {
        let ns = Netns::new();
        ns.sysctl("net.ipv4.tcp_abort_on_overflow", "1");
        let l = Listener::open(&ns, "127.0.0.1:0", 16);
        daemon.wait_for_listener(l.inode);
        let d = Doctor::run(&daemon, &["--fail-on", "info"]);
        let found = d.about(&ns);
        assert_eq!(kinds(&found), set(&["abort_on_overflow"]), "{found:#?}");
        assert_eq!(found[0]["severity"], "info");
        assert!(evidence(found[0]).contains("net.ipv4.tcp_abort_on_overflow = 1"));
        assert_eq!(d.status, 1, "--fail-on info counts info findings");
    }
}

#[test]
fn doctor_without_a_daemon_names_the_fix() {
    let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = free.local_addr().unwrap().to_string();
    drop(free);
    let out = Command::new(binary())
        .args(["doctor", "--api", &addr])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no backlogd daemon answers at") && err.contains("--api"),
        "{err}"
    );
}

#[test]
fn doctor_standalone_watches_for_the_duration_without_a_daemon() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let ns = Netns::new();
    ns.sysctl("net.core.somaxconn", "128");
    let duration = Duration::from_secs(5);
    let mut doctor = Command::new(binary())
        .args([
            "doctor",
            "--standalone",
            "--duration",
            &duration.as_secs().to_string(),
            "--json",
            "--fail-on",
            "critical",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("backlogd doctor --standalone");
    // Its window opens once its probes are attached and it serves (it logs "serving
    // metrics on" just before its --duration starts): the listener comes after that.
    let stderr = BufReader::new(doctor.stderr.take().expect("piped stderr"));
    let (lines_tx, lines) = std::sync::mpsc::channel();
    let log = std::thread::spawn(move || {
        let mut all = String::new();
        for line in stderr.lines().map_while(Result::ok) {
            all.push_str(&line);
            all.push('\n');
            let _ = lines_tx.send(line);
        }
        all
    });
    // The limit only catches a hang (the probes attach in about a second here).
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match lines.recv_timeout(left) {
            Ok(line) if line.contains("serving metrics on") => break,
            Ok(_) => {}
            Err(e) => panic!("the standalone doctor never started serving: {e}"),
        }
    }
    let attached = Instant::now();
    let _l = Listener::open(&ns, "127.0.0.1:0", 511);
    let opened = attached.elapsed();
    let out = doctor.wait_with_output().unwrap();
    let log = log.join().unwrap();
    // Its window is --duration from serving on: a listener opened later than that could not
    // be seen, which would be the host's slowness, not the doctor's.
    assert!(
        opened < duration,
        "the listener came {opened:?} after the doctor attached, past its {duration:?} window"
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "only a warning: below --fail-on critical; log:\n{log}"
    );
    let d = Doctor {
        findings: serde_json::from_slice(&out.stdout).expect("JSON"),
        status: 0,
    };
    assert_eq!(
        kinds(&d.about(&ns)),
        set(&["backlog_clamped"]),
        "{:#?}",
        d.findings
    );
}

/// An application that accepts in batches every 50 ms (waits far under 100 ms: it keeps
/// up) behind a 5-slot queue, and a burst of 12 real clients arriving within one batch.
/// Returns the clients (connected when it returns), the accept thread's stop flag and the
/// connections it took.
struct BatchAcceptor {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<Vec<std::net::TcpStream>>>,
}

impl BatchAcceptor {
    fn start(l: &Listener) -> Self {
        let socket: std::net::TcpListener = l.socket.try_clone().expect("dup listener").into();
        socket.set_nonblocking(true).expect("non-blocking listener");
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut taken = Vec::new();
            while !flag.load(std::sync::atomic::Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(50));
                while let Ok((c, _)) = socket.accept() {
                    taken.push(c);
                }
            }
            taken
        });
        Self {
            stop,
            thread: Some(thread),
        }
    }

    fn stop(mut self) -> usize {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread
            .take()
            .expect("running")
            .join()
            .expect("acceptor")
            .len()
    }
}

/// Clients connect all at once to `l`, which a [`BatchAcceptor`] serves; returns each
/// client's SYN retransmissions once every client is accepted.
fn burst_through(ns: &Netns, l: &Listener, clients: usize) -> Vec<u32> {
    let acceptor = BatchAcceptor::start(l);
    let sockets = connect_burst(ns, l.addr, clients);
    // A client dropped once retries its SYN 1 s later and finds room: the batch drained
    // the queue meanwhile.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let states: Vec<(u8, u32)> = sockets
            .iter()
            .map(backlogd_tests::sockets::tcp_state)
            .collect();
        if states
            .iter()
            .all(|(state, _)| *state == 1 /* TCP_ESTABLISHED */)
        {
            std::thread::sleep(Duration::from_millis(200));
            assert_eq!(acceptor.stop(), clients, "every client accepted");
            return states.into_iter().map(|(_, retrans)| retrans).collect();
        }
        assert!(
            Instant::now() < deadline,
            "clients still connecting after 10 s: {states:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Doctor's remedy for an overflowing queue weighs the figures: an application that
/// asked for a 5-slot queue and takes connections within 50 ms is not "accepting too
/// slowly"; doctor sizes the backlog from what was measured (the peak plus the connections
/// that waited for room), and that backlog, tried for real, holds the same burst with no
/// drop at all.
#[test]
fn doctor_sizes_the_backlog_of_an_application_that_keeps_up_and_that_backlog_holds_the_burst() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let daemon = Daemon::start();
    let ns = Netns::new();
    ns.sysctl("net.ipv4.tcp_syncookies", "0");
    const CLIENTS: usize = 12;
    let small = Listener::open(&ns, "127.0.0.1:0", 5);
    daemon.wait_for_listener(small.inode);
    let before = backlogd_tests::kernel::ListenCounters::of(&tcp_ext(&ns));
    let retrans = burst_through(&ns, &small, CLIENTS);
    let first = backlogd_tests::kernel::ListenCounters::of(&tcp_ext(&ns));
    let waited = retrans.iter().filter(|r| **r > 0).count();
    // The situation is what the test is for: the queue overflowed and every dropped
    // client got in on its first retry.
    assert!(
        first.listen_drops > before.listen_drops && waited > 0,
        "the burst overflowed the 5-slot queue: {retrans:?}"
    );
    assert!(retrans.iter().all(|r| *r <= 1), "{retrans:?}");

    let d = Doctor::run(&daemon, &[]);
    let f = d.on("accept_queue_overflow", &ns, &small);
    let remedy = f["remedy"].as_str().expect("remedy");
    assert!(
        remedy.starts_with("the application keeps up"),
        "not an accept loop that cannot keep up: {remedy}"
    );
    // The queue held backlog + 1 = 6 at its peak (it was full at each drop).
    let sized = format!(
        "a backlog of at least {} (the peak of 6 plus the {waited} connections that waited \
         for room after a drop",
        6 + waited
    );
    assert!(remedy.contains(&sized), "{sized}: {remedy}");
    drop(small);

    // The advice, taken: the same burst against the backlog doctor gave.
    let sized = Listener::open(&ns, "127.0.0.1:0", (6 + waited) as i32);
    let retrans = burst_through(&ns, &sized, CLIENTS);
    let second = backlogd_tests::kernel::ListenCounters::of(&tcp_ext(&ns));
    assert_eq!(
        second.listen_drops - first.listen_drops,
        0,
        "the sized backlog dropped nothing"
    );
    assert!(
        retrans.iter().all(|r| *r == 0),
        "no client retried: {retrans:?}"
    );
}
