//! backlogd as a service, each test with a real daemon process: systemd readiness and
//! watchdog over a notify socket the test binds, capabilities after readiness, SIGHUP
//! reload, SIGTERM exit time, the config file and check-config, the HTTP endpoint's
//! behaviour with abusive clients, basic auth and TLS, and the shipped systemd unit.

use std::{
    io::{Read as _, Write as _},
    net::{SocketAddr, TcpListener, TcpStream},
    os::{
        fd::AsRawFd as _,
        linux::net::SocketAddrExt as _,
        unix::{fs::MetadataExt as _, net::UnixDatagram},
    },
    path::{Path, PathBuf},
    process::Command,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
        mpsc,
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use backlogd_tests::{
    Daemon, Netns, Scrape,
    daemon::{binary, run_to_end},
    http::{self, Reply, basic, exchange, get_request, raw, read_one_response},
    kernel::tcp_ext,
    sockets::Listener,
    tempdir::TempDir,
    tools,
};
use socket2::{Domain, Socket, Type};

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A notify socket in the abstract namespace, as `systemd-notify`-compatible supervisors
/// bind it (`@name` in NOTIFY_SOCKET).
struct NotifySocket {
    socket: UnixDatagram,
    name: String,
}

impl NotifySocket {
    fn bind(tag: &str) -> Self {
        let name = format!("backlogd-test-{tag}-{}", std::process::id());
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let socket = UnixDatagram::bind_addr(&addr).unwrap();
        Self {
            socket,
            name: format!("@{name}"),
        }
    }

    /// The next datagram, or None after `limit`.
    fn recv(&self, limit: Duration) -> Option<String> {
        self.socket.set_read_timeout(Some(limit)).unwrap();
        let mut buf = [0u8; 4096];
        let n = self.socket.recv(&mut buf).ok()?;
        Some(String::from_utf8_lossy(&buf[..n]).into_owned())
    }

    /// Datagrams until one contains `line` (which is returned last).
    fn recv_until(&self, line: &str, limit: Duration) -> Vec<String> {
        let deadline = Instant::now() + limit;
        let mut seen = Vec::new();
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            let Some(msg) = self.recv(left) else { break };
            let done = msg.lines().any(|l| l == line);
            seen.push(msg);
            if done {
                return seen;
            }
        }
        panic!("no {line:?} within {limit:?}; received: {seen:?}");
    }
}

/// The capability sets of one thread (`/proc/PID/task/TID/status`).
#[derive(Debug)]
struct ThreadCaps {
    tid: String,
    inheritable: u64,
    permitted: u64,
    effective: u64,
    bounding: u64,
    ambient: u64,
    no_new_privs: bool,
}

/// Capability sets of every thread of `pid`.
fn thread_caps(pid: u32) -> Vec<ThreadCaps> {
    let dir = format!("/proc/{pid}/task");
    std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{dir}: {e}"))
        .flatten()
        .map(|t| {
            let path = t.path().join("status");
            let status = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            let field = |name: &str| {
                status
                    .lines()
                    .find_map(|l| l.strip_prefix(name))
                    .map(str::trim)
                    .unwrap_or_else(|| panic!("no {name} in {}:\n{status}", path.display()))
                    .to_owned()
            };
            let hex = |name: &str| u64::from_str_radix(&field(name), 16).unwrap();
            ThreadCaps {
                tid: t.file_name().to_string_lossy().into_owned(),
                inheritable: hex("CapInh:"),
                permitted: hex("CapPrm:"),
                effective: hex("CapEff:"),
                bounding: hex("CapBnd:"),
                ambient: hex("CapAmb:"),
                no_new_privs: field("NoNewPrivs:") == "1",
            }
        })
        .collect()
}

const CAP_DAC_READ_SEARCH: u64 = 1 << 2;
const CAP_SYS_PTRACE: u64 = 1 << 19;
const CAP_SYS_ADMIN: u64 = 1 << 21;
/// What the running daemon keeps (backlogd/src/service/caps.rs `KEEP`).
const KEEP: u64 = CAP_SYS_ADMIN | CAP_SYS_PTRACE | CAP_DAC_READ_SEARCH;

/// Asserts that every thread of the daemon `pid` holds exactly what the daemon says it
/// keeps once the probes are attached: permitted and effective sets of `KEEP`, empty
/// inheritable and ambient sets. Returns the threads.
#[track_caller]
fn assert_runtime_caps(pid: u32) -> Vec<ThreadCaps> {
    let threads = thread_caps(pid);
    // The main thread, two runtime workers, and the blocking pool once it has run a scan.
    assert!(
        threads.len() >= 3,
        "only {} threads: {threads:?}",
        threads.len()
    );
    for t in &threads {
        assert_eq!(
            (t.permitted, t.effective, t.inheritable, t.ambient),
            (KEEP, KEEP, 0, 0),
            "thread {} (CapPrm, CapEff, CapInh, CapAmb), want ({KEEP:#x}, {KEEP:#x}, 0, 0): \
             {t:x?}",
            t.tid
        );
    }
    threads
}

/// Asserts that no thread can get back what the daemon gave up. The daemon stays uid 0,
/// and execve(2) gives a root process every capability of its bounding set: so the
/// bounding set must be `KEEP` too, unless no_new_privs is set (then an execve can gain
/// nothing).
#[track_caller]
fn assert_no_way_back(threads: &[ThreadCaps]) {
    for t in threads {
        assert!(
            t.bounding == KEEP || t.no_new_privs,
            "thread {}: CapBnd {:#x} still holds {:#x} beyond what the daemon keeps, and \
             NoNewPrivs is 0: the daemon runs as uid 0, so an execve(2) from it regains every \
             capability of the bounding set. Want CapBnd {KEEP:#x} (PR_CAPBSET_DROP before \
             giving up CAP_SETPCAP) or no_new_privs: {t:x?}",
            t.tid,
            t.bounding,
            t.bounding & !KEEP
        );
    }
}

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

/// Waits for the `n`th log line containing `needle`.
fn wait_for_nth(daemon: &Daemon, needle: &str, n: usize) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let log = daemon.log();
        if let Some(line) = log.lines().filter(|l| l.contains(needle)).nth(n - 1) {
            return line.to_owned();
        }
        assert!(
            Instant::now() < deadline,
            "no {n}th line containing {needle:?}; log:\n{log}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Number of log lines containing `needle` so far.
fn log_lines(daemon: &Daemon, needle: &str) -> usize {
    daemon.log().lines().filter(|l| l.contains(needle)).count()
}

/// Calls `f` every 100 ms until it returns `Some`, for up to `limit`.
#[track_caller]
fn eventually<T>(what: &str, limit: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "no {what} within {limit:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn get_as(addr: SocketAddr, path: &str, auth: Option<&str>) -> Reply {
    exchange(addr, &get_request(path, auth, ""))
        .unwrap_or_else(|e| panic!("GET http://{addr}{path}: {e}"))
}

/// A complete `/metrics` scrape with credentials.
fn scrape_as(addr: SocketAddr, auth: &str) -> Scrape {
    let reply = get_as(addr, "/metrics", Some(auth));
    assert_eq!(reply.status, 200, "{reply:?}");
    Scrape::parse(&reply.complete_text())
}

/// SIGHUP, then waits for the daemon's RELOADING=1 and READY=1: the reload is done.
fn reload(daemon: &Daemon, notify: &NotifySocket) {
    daemon.signal(libc::SIGHUP);
    let seen = notify.recv_until("READY=1", Duration::from_secs(10));
    assert!(
        seen.iter().any(|m| m.lines().any(|l| l == "RELOADING=1")),
        "no RELOADING=1 before READY=1: {seen:?}"
    );
}

/// A listener in `ns` whose `listen()` was called by a thread that has exited since: the
/// daemon learns of the listener from the event, but the event's thread no longer leads
/// into the namespace, so the namespace's own TcpExt counters can be read only once a
/// sock_diag scan finds another task in it (the namespace's helper thread).
fn listen_from_a_thread_gone_since(ns: &Netns) -> (Socket, SocketAddr, u64) {
    let socket = ns.run(|| {
        std::thread::spawn(|| {
            let s = Socket::new(Domain::IPV4, Type::STREAM, None).expect("socket()");
            let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
            s.bind(&any.into()).expect("bind");
            s.listen(16).expect("listen()");
            s
        })
        .join()
        .expect("listening thread")
    });
    let addr = socket.local_addr().unwrap().as_socket().unwrap();
    let inode = std::fs::metadata(format!("/proc/self/fd/{}", socket.as_raw_fd()))
        .unwrap()
        .ino();
    (socket, addr, inode)
}

/// bcrypt of `scrape-secret` (`htpasswd -nbBC 10 prometheus scrape-secret`).
const HASH: &str = "$2y$10$qonUAlC6be2t0qfORsmUle0X.EzSnnCOAc8b05c1rnpV9iK2OeUtK";

#[test]
fn sighup_applies_reloadable_settings_and_keeps_the_old_config_when_the_new_is_bad() {
    let dir = TempDir::new("reload");
    let web = dir.write(
        "web.yml",
        &format!("basic_auth_users:\n  prometheus: {HASH}\n"),
    );
    let bad_web = dir.write(
        "bad-web.yml",
        "basic_auth_users:\n  prometheus: not-a-hash\n",
    );
    let good = basic("prometheus", "scrape-secret");
    let port = free_port();
    let other = free_port();
    let config = |listen: u16, log: &str, rescan: u64, hwm: u64, http: &str| {
        format!(
            "listen = \"127.0.0.1:{listen}\"\nlog = \"{log}\"\nrescan_interval = {rescan}\n\
             hwm_window = {hwm}\n{http}"
        )
    };
    let file = dir.write("backlogd.toml", &config(port, "info", 600, 600, ""));
    let notify = NotifySocket::bind("reload");
    let daemon = Daemon::start_env(
        &["--config", file.to_str().unwrap()],
        &[("NOTIFY_SOCKET", &notify.name)],
    );
    assert_eq!(daemon.addr.port(), port, "listen from the file");
    notify.recv_until("READY=1", Duration::from_secs(30));
    let addr = daemon.addr;
    // A 12 KiB request head: within the default max_header_bytes (16384), over 8192.
    let padded = |auth: Option<&str>| {
        get_request(
            "/metrics",
            auth,
            &format!("X-Pad: {}\r\n", "a".repeat(12 * 1024)),
        )
    };
    let r = exchange(addr, &padded(None)).unwrap();
    assert_eq!(
        r.status, 200,
        "12 KiB head under the default limit: {}",
        r.head
    );
    assert_eq!(get_as(addr, "/metrics", None).status, 200, "no auth yet");

    // What shows the other reloadable settings. hwm_window: an accept-queue peak of 6,
    // drained, stays in backlogd_listen_accept_queue_max_length for the window (600 s).
    let ns = Netns::new();
    let netns = ns.inode().to_string();
    let (listener, listener_addr, inode) = listen_from_a_thread_gone_since(&ns);
    daemon.wait_for_listener(inode);
    let socket = inode.to_string();
    let queue = |s: &Scrape| {
        (
            s.value(
                "backlogd_listen_accept_queue_length",
                &[("socket", &socket)],
            ),
            s.value(
                "backlogd_listen_accept_queue_max_length",
                &[("socket", &socket)],
            ),
        )
    };
    let clients: Vec<TcpStream> = ns.run(move || {
        (0..6)
            .map(|_| TcpStream::connect(listener_addr).expect("connect"))
            .collect()
    });
    daemon.wait_for("6 connections queued", |s| {
        (queue(s) == (Some(6.0), Some(6.0))).then_some(())
    });
    for _ in 0..6 {
        listener.accept().expect("accept");
    }
    daemon.wait_for("the queue drained", |s| {
        (queue(s) == (Some(0.0), Some(6.0))).then_some(())
    });
    // Several one-second samples later the peak is still reported...
    std::thread::sleep(Duration::from_millis(2500));
    let before = daemon.scrape();
    assert_eq!(
        queue(&before),
        (Some(0.0), Some(6.0)),
        "(length, peak) with hwm_window = 600"
    );
    // ... and rescan_interval: the namespace's TcpExt counters are not exported, since the
    // thread that called listen() is gone and no scan (every 600 s) has found another.
    assert!(
        before
            .find(
                "backlogd_netns_listen_overflows_total",
                &[("netns", &netns)]
            )
            .is_empty(),
        "netns {netns} counters exported before any rescan:\n{}",
        before.text
    );
    assert_eq!(log_lines(&daemon, "configuration reloaded"), 0);

    // Reload: everything reloadable changes, and the listen address (which is not).
    std::fs::write(
        &file,
        config(
            other,
            "warn",
            1,
            1,
            &format!(
                "[http]\nmax_header_bytes = 8192\nweb_config_file = \"{}\"\n",
                web.display()
            ),
        ),
    )
    .unwrap();
    reload(&daemon, &notify);
    let warned = daemon.wait_for_log("`listen` changed");
    assert!(warned.contains("restart"), "{warned}");
    // [http], for new connections: the users of the web config, the smaller head limit.
    let none = get_as(addr, "/metrics", None);
    assert_eq!(none.status, 401, "{none:?}");
    assert_eq!(
        none.header("www-authenticate"),
        Some("Basic realm=\"backlogd\""),
        "{none:?}"
    );
    let r = exchange(addr, &padded(Some(&good))).unwrap();
    assert_eq!(
        r.status, 431,
        "12 KiB head over max_header_bytes = 8192: {}",
        r.head
    );
    assert!(scrape_as(addr, &good).text.contains("backlogd_hook_mode"));
    // The listen address needs a restart: still the old port, nothing on the new one.
    let refused = TcpStream::connect(("127.0.0.1", other))
        .expect_err("the new listen address must not be served before a restart");
    assert_eq!(refused.kind(), std::io::ErrorKind::ConnectionRefused);
    // hwm_window = 1: the peak ages out within seconds.
    eventually(
        "the drained peak leaving the 1 s window",
        Duration::from_secs(15),
        || (queue(&scrape_as(addr, &good)) == (Some(0.0), Some(0.0))).then_some(()),
    );
    // rescan_interval = 1: a scan finds the namespace's helper thread, and the namespace's
    // counters appear, equal to the kernel's.
    let exported = eventually(
        "the namespace's counters after a rescan",
        Duration::from_secs(15),
        || {
            scrape_as(addr, &good).value(
                "backlogd_netns_listen_overflows_total",
                &[("netns", &netns)],
            )
        },
    );
    assert_eq!(exported, tcp_ext(&ns)["ListenOverflows"] as f64);
    // log = "warn": this reload's own "configuration reloaded" line (info) was filtered out.
    assert_eq!(
        log_lines(&daemon, "configuration reloaded"),
        0,
        "info line logged with log = \"warn\":\n{}",
        daemon.log()
    );
    drop(clients);

    // A bad file: the error names the key and line, and the running config stays whole.
    let kept = |after: &str| {
        let none = get_as(addr, "/metrics", None);
        assert_eq!(none.status, 401, "auth off after {after}: {none:?}");
        let r = exchange(addr, &padded(Some(&good))).unwrap();
        assert_eq!(
            r.status, 431,
            "head limit changed after {after}: {}",
            r.head
        );
        assert!(scrape_as(addr, &good).text.contains("backlogd_hook_mode"));
    };
    std::fs::write(&file, "rescan_interval = 2\nlisten_adress = \"x\"\n").unwrap();
    reload(&daemon, &notify);
    let failed = wait_for_nth(&daemon, "config reload failed", 1);
    assert!(
        failed.contains("keeping the running configuration"),
        "{failed}"
    );
    let log = daemon.log();
    assert!(
        log.contains("listen_adress") && log.contains("line 2"),
        "{log}"
    );
    kept("a file with an unknown key");
    // A good file naming a bad web config: nothing of it is applied (not the log filter,
    // not the head limit, not turning auth off).
    std::fs::write(
        &file,
        config(
            port,
            "info",
            2,
            600,
            &format!(
                "[http]\nmax_header_bytes = 65536\nweb_config_file = \"{}\"\n",
                bad_web.display()
            ),
        ),
    )
    .unwrap();
    reload(&daemon, &notify);
    let failed = wait_for_nth(&daemon, "config reload failed", 2);
    assert!(
        failed.contains("keeping the running configuration")
            && failed.contains("basic_auth_users.prometheus"),
        "{failed}"
    );
    kept("a file naming a bad web config");
    // Still log = "warn": a good reload that leaves it so logs no info line (it would if
    // the bad file's log = "info" had been applied); its head limit is back to 16384.
    std::fs::write(
        &file,
        config(
            port,
            "warn",
            1,
            1,
            &format!("[http]\nweb_config_file = \"{}\"\n", web.display()),
        ),
    )
    .unwrap();
    reload(&daemon, &notify);
    let r = exchange(addr, &padded(Some(&good))).unwrap();
    assert_eq!(
        r.status, 200,
        "12 KiB head, max_header_bytes 16384 again: {}",
        r.head
    );
    assert_eq!(
        log_lines(&daemon, "configuration reloaded"),
        0,
        "{}",
        daemon.log()
    );
    // log = "info" again: the reload says so, and starts from the running config (the
    // rescan interval is 1, not the bad files' 2).
    std::fs::write(
        &file,
        config(
            port,
            "info",
            7,
            1,
            &format!("[http]\nweb_config_file = \"{}\"\n", web.display()),
        ),
    )
    .unwrap();
    reload(&daemon, &notify);
    let line = wait_for_nth(&daemon, "configuration reloaded", 1);
    for change in ["log \"warn\" -> \"info\"", "rescan_interval 1 -> 7"] {
        assert!(line.contains(change), "{change} missing: {line}");
    }
    assert!(
        !line.contains("hwm_window"),
        "hwm_window did not change: {line}"
    );
}

/// What a slowloris client saw.
#[derive(Debug)]
struct Slow {
    /// From just before connect() until the server closed the connection; None if it was
    /// still open when the client gave up or was stopped.
    closed_after: Option<Duration>,
    /// Bytes of the never-ending request head it sent.
    sent: usize,
    /// What the server sent back.
    reply: Vec<u8>,
}

/// A slowloris client: sends a request head that never ends, one byte every 200 ms,
/// watching for the server to close the connection, until it does, `give_up` after
/// connecting, or `stop`.
fn slowloris(addr: SocketAddr, give_up: Duration, stop: Arc<AtomicBool>) -> JoinHandle<Slow> {
    std::thread::spawn(move || {
        // Before connect(): the server cannot have accepted the connection earlier.
        let start = Instant::now();
        let mut s = TcpStream::connect(addr).expect("slowloris connect");
        s.set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        let mut out = Slow {
            closed_after: None,
            sent: 0,
            reply: Vec::new(),
        };
        let head = b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
        for b in head.iter().cycle() {
            if stop.load(Ordering::Relaxed) || start.elapsed() > give_up {
                return out;
            }
            if s.write_all(&[*b]).is_err() {
                out.closed_after = Some(start.elapsed());
                return out;
            }
            out.sent += 1;
            // Up to 200 ms until the next byte, returning at once if the server closes.
            let mut buf = [0u8; 1024];
            match s.read(&mut buf) {
                Ok(0) => {
                    out.closed_after = Some(start.elapsed());
                    return out;
                }
                Ok(n) => out.reply.extend_from_slice(&buf[..n]),
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) => {}
                Err(_) => {
                    out.closed_after = Some(start.elapsed());
                    return out;
                }
            }
        }
        unreachable!("cycle() never ends")
    })
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

/// Times a well-behaved scrape; panics if it fails.
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

#[test]
fn malformed_oversized_slow_and_flooding_clients_leave_metrics_answering() {
    let daemon = Daemon::start_with(&[
        "--http-max-connections",
        "32",
        "--http-read-header-timeout",
        "2",
    ]);
    let addr = daemon.addr;
    let bound = Duration::from_secs(3);

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
    assert!(timed_scrape(addr) < bound);

    // Slowloris: more slow connections than the limit, each trickling a head for longer
    // than the header timeout. Past the limit each new connection closes an older idle
    // one; the others are cut at the header timeout: none outlives it.
    let timeout = Duration::from_secs(2);
    let give_up = timeout + Duration::from_secs(10);
    let never = Arc::new(AtomicBool::new(false));
    let slow: Vec<_> = (0..64)
        .map(|_| slowloris(addr, give_up, never.clone()))
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    let mut worst = Duration::ZERO;
    for _ in 0..10 {
        worst = worst.max(timed_scrape(addr));
        std::thread::sleep(Duration::from_millis(300));
    }
    let slow: Vec<Slow> = slow.into_iter().map(|t| t.join().unwrap()).collect();
    eprintln!("slowloris (64 connections, limit 32): worst of 10 scrapes {worst:?}");
    assert!(worst < bound, "scrape took {worst:?} under slowloris");
    for (i, r) in slow.iter().enumerate() {
        let closed = r
            .closed_after
            .unwrap_or_else(|| panic!("slowloris {i} still open after {give_up:?}: {r:?}"));
        assert!(
            closed <= timeout + Duration::from_secs(3) && r.reply.is_empty(),
            "slowloris {i} (header timeout {timeout:?}): {r:?}"
        );
    }
    let evicted = slow
        .iter()
        .filter(|r| r.closed_after.is_some_and(|c| c < timeout))
        .count();
    assert!(
        evicted >= 64 - 32,
        "64 slowloris with a limit of 32, only {evicted} closed before the header timeout"
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
        "flood ({} idle connections, limit 32): worst of 10 scrapes {worst:?}",
        flood.len()
    );
    assert!(
        worst < bound,
        "scrape took {worst:?} under a connection flood"
    );
    drop(flood);
    assert!(timed_scrape(addr) < bound);
}

#[test]
fn slowloris_clients_are_cut_at_the_header_timeout_while_metrics_answers() {
    let timeout = Duration::from_secs(2);
    let daemon = Daemon::start_with(&[
        "--http-read-header-timeout",
        "2",
        "--http-max-connections",
        "64",
    ]);
    let addr = daemon.addr;
    // Fewer than the limit, so that no eviction closes them: only the header timeout can.
    // They trickle a byte every 200 ms, far more often than the idle timeout (60 s).
    let give_up = timeout + Duration::from_secs(10);
    let never = Arc::new(AtomicBool::new(false));
    let slow: Vec<_> = (0..16)
        .map(|_| slowloris(addr, give_up, never.clone()))
        .collect();
    let mut scrapes = Vec::new();
    let start = Instant::now();
    while !slow.iter().all(|t| t.is_finished()) && start.elapsed() < give_up {
        scrapes.push(timed_scrape(addr));
        std::thread::sleep(Duration::from_millis(200));
    }
    let slow: Vec<Slow> = slow.into_iter().map(|t| t.join().unwrap()).collect();
    let closed: Vec<Duration> = slow
        .iter()
        .enumerate()
        .map(|(i, r)| {
            r.closed_after
                .unwrap_or_else(|| panic!("slowloris {i} still open after {give_up:?}: {r:?}"))
        })
        .collect();
    eprintln!(
        "16 slowloris, header timeout {timeout:?}: closed after {:?} to {:?}; {} scrapes \
         meanwhile, worst {:?}",
        closed.iter().min().unwrap(),
        closed.iter().max().unwrap(),
        scrapes.len(),
        scrapes.iter().max().unwrap()
    );
    for (i, (r, closed)) in slow.iter().zip(&closed).enumerate() {
        // Not before the deadline (the clock started before connect()), and not long
        // after it; nothing sent back; bytes were trickling until the cut.
        assert!(
            *closed >= timeout && *closed <= timeout + Duration::from_secs(3),
            "slowloris {i} closed after {closed:?}, header timeout {timeout:?}: {r:?}"
        );
        assert!(r.reply.is_empty(), "slowloris {i}: {r:?}");
        assert!(r.sent >= 5, "slowloris {i} sent {} bytes: {r:?}", r.sent);
    }
    // A well-behaved client was answered all along (timed_scrape asserts each answer).
    assert!(scrapes.len() >= 2, "{} scrapes", scrapes.len());
    assert!(
        scrapes.iter().all(|t| *t < Duration::from_secs(3)),
        "scrape times under slowloris: {scrapes:?}"
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
    const LISTENERS: usize = 600;
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
    // Each flood connection past the limit closes one connection: wait until the server
    // has taken them all in.
    eventually(
        "the server closing connections past the limit",
        Duration::from_secs(10),
        || (flood.iter().filter(|s| closed_by_server(s)).count() >= FLOOD - MAX).then_some(()),
    );
    std::thread::sleep(Duration::from_millis(500));
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

fn get_with_auth(addr: SocketAddr, auth: Option<&str>) -> String {
    use std::fmt::Write as _;
    let mut req = String::from("GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n");
    if let Some(a) = auth {
        let _ = write!(req, "Authorization: Basic {a}\r\n");
    }
    req.push_str("\r\n");
    raw(addr, req.as_bytes())
}

#[test]
fn basic_auth_from_a_web_config_file_rejects_and_accepts() {
    let dir = TempDir::new("auth");
    let web = dir.write(
        "web.yml",
        &format!("basic_auth_users:\n  prometheus: {HASH}\n"),
    );
    let daemon = Daemon::start_with(&["--web-config-file", web.to_str().unwrap()]);
    let good = basic("prometheus", "scrape-secret");
    let wrong = basic("prometheus", "wrong");
    let stranger = basic("nobody", "scrape-secret");
    let none = get_with_auth(daemon.addr, None);
    assert!(none.starts_with("HTTP/1.1 401"), "{none}");
    assert!(none.contains("www-authenticate: Basic"), "{none}");
    for bad in [wrong.as_str(), stranger.as_str(), "!!notbase64"] {
        let r = get_with_auth(daemon.addr, Some(bad));
        assert!(r.starts_with("HTTP/1.1 401"), "{bad}: {r}");
    }
    let ok = get_with_auth(daemon.addr, Some(&good));
    assert!(
        ok.starts_with("HTTP/1.1 200") && ok.contains("backlogd_hook_mode"),
        "{ok}"
    );
}

/// An attacker with a wrong password: keeps a connection alive and sends request after
/// request on it, 5 ms apart, reconnecting whenever the server closes it. Counts answers
/// by status (401s, anything else) and connections.
fn wrong_password_client(
    addr: SocketAddr,
    auth: String,
    stop: Arc<AtomicBool>,
    counts: Arc<[AtomicU64; 3]>,
) -> JoinHandle<()> {
    std::thread::spawn(move || {
        let request =
            format!("GET /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: Basic {auth}\r\n\r\n");
        while !stop.load(Ordering::Relaxed) {
            let Ok(mut s) = TcpStream::connect(addr) else {
                std::thread::sleep(Duration::from_millis(5));
                continue;
            };
            counts[2].fetch_add(1, Ordering::Relaxed);
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            while !stop.load(Ordering::Relaxed) {
                if s.write_all(request.as_bytes()).is_err() {
                    break;
                }
                match read_one_response(&mut s) {
                    Ok(401) => counts[0].fetch_add(1, Ordering::Relaxed),
                    Ok(_) => counts[1].fetch_add(1, Ordering::Relaxed),
                    Err(_) => break,
                };
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    })
}

/// One scrape attempt on a new connection: "200" (with the whole exposition), another
/// status, or what went wrong.
fn scrape_attempt(addr: SocketAddr, auth: &str) -> String {
    match exchange(addr, &get_request("/metrics", Some(auth), "")) {
        Ok(r) if r.status == 200 => {
            let body = match r.complete_body() {
                Ok(body) => body,
                Err(e) => return format!("200 {e}"),
            };
            let text = String::from_utf8_lossy(&body);
            assert!(text.contains("backlogd_build_info"), "{text}");
            "200".into()
        }
        Ok(r) => r.status.to_string(),
        Err(e) => format!("failed: {e}"),
    }
}

#[test]
fn wrong_passwords_cannot_take_every_slot_or_lock_out_a_scraper_with_the_right_one() {
    const MAX: usize = 8;
    const ATTACKERS: usize = 3 * MAX;
    let dir = TempDir::new("auth-flood");
    // Two users with the same password: their credentials are remembered separately.
    let web = dir.write(
        "web.yml",
        &format!("basic_auth_users:\n  prometheus: {HASH}\n  grafana: {HASH}\n"),
    );
    let daemon = Daemon::start_with(&[
        "--web-config-file",
        web.to_str().unwrap(),
        "--http-max-connections",
        "8",
    ]);
    let addr = daemon.addr;
    let prometheus = basic("prometheus", "scrape-secret");
    let grafana = basic("grafana", "scrape-secret");
    // prometheus scrapes before the flood: its credentials are checked and remembered.
    assert_eq!(scrape_attempt(addr, &prometheus), "200");

    let stop = Arc::new(AtomicBool::new(false));
    let counts: Arc<[AtomicU64; 3]> = Arc::new(Default::default());
    let attackers: Vec<_> = (0..ATTACKERS)
        .map(|i| {
            let user = if i % 2 == 0 { "prometheus" } else { "grafana" };
            wrong_password_client(
                addr,
                basic(user, &format!("guess-{i}")),
                stop.clone(),
                counts.clone(),
            )
        })
        .collect();
    std::thread::sleep(Duration::from_secs(1));
    let answered = counts[0].load(Ordering::Relaxed);
    assert!(
        answered >= 100,
        "the flood got only {answered} answers in 1 s"
    );

    // Under the flood, the scraper whose credentials were remembered: every scrape.
    let remembered: Vec<String> = (0..10)
        .map(|_| {
            let outcome = scrape_attempt(addr, &prometheus);
            std::thread::sleep(Duration::from_millis(300));
            outcome
        })
        .collect();
    // And one whose credentials were never checked (a new scraper, or any scraper after a
    // restart or a reload, which start with nothing remembered): it must get in within 20
    // attempts 500 ms apart, and from then on every time.
    let mut fresh = Vec::new();
    while fresh.len() < 20 && fresh.last().is_none_or(|o| o != "200") {
        if !fresh.is_empty() {
            std::thread::sleep(Duration::from_millis(500));
        }
        fresh.push(scrape_attempt(addr, &grafana));
    }
    let after: Vec<String> = (0..5).map(|_| scrape_attempt(addr, &grafana)).collect();
    stop.store(true, Ordering::Relaxed);
    for a in attackers {
        a.join().unwrap();
    }
    let [unauthorized, other, connections] = counts.as_ref();
    let (unauthorized, other, connections) = (
        unauthorized.load(Ordering::Relaxed),
        other.load(Ordering::Relaxed),
        connections.load(Ordering::Relaxed),
    );
    eprintln!(
        "{ATTACKERS} wrong-password clients (limit {MAX}): {unauthorized} answered 401, \
         {other} otherwise, over {connections} connections; remembered scraper: \
         {remembered:?}; new scraper: {fresh:?} then {after:?}"
    );
    assert_eq!(other, 0, "a wrong password was answered other than 401");
    assert!(
        connections > ATTACKERS as u64,
        "the flood never hit the limit ({connections} connections)"
    );
    assert!(
        remembered.iter().all(|o| o == "200"),
        "the remembered scraper under the flood: {remembered:?}"
    );
    assert_eq!(
        fresh.last().map(String::as_str),
        Some("200"),
        "a scraper with the right password, never checked before, under a flood of wrong \
         ones: {fresh:?}"
    );
    assert!(
        after.iter().all(|o| o == "200"),
        "after its first success: {after:?}"
    );
}

#[test]
fn tls_from_a_web_config_file() {
    let test = "tls_from_a_web_config_file";
    if !tools::available(test, "openssl", &["version"], "openssl")
        || !tools::available(test, "curl", &["--version"], "curl")
    {
        return;
    }
    let dir = TempDir::new("tls");
    let made = Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=localhost",
            "-keyout",
        ])
        .arg(dir.path().join("key.pem"))
        .arg("-out")
        .arg(dir.path().join("cert.pem"))
        .output()
        .unwrap();
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    let web = dir.write(
        "web.yml",
        "tls_server_config:\n  cert_file: cert.pem\n  key_file: key.pem\n",
    );
    let daemon = Daemon::start_with(&["--web-config-file", web.to_str().unwrap()]);
    let serving = daemon.wait_for_log("serving metrics on");
    assert!(
        serving.contains("https://") && serving.contains("TLS on"),
        "{serving}"
    );
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "5", "--cacert"])
        .arg(dir.path().join("cert.pem"))
        .arg(format!("https://localhost:{}/metrics", daemon.addr.port()))
        .output()
        .unwrap();
    let body = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && body.contains("backlogd_hook_mode"),
        "curl: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Plain HTTP to the TLS port gets no metrics.
    assert!(http::try_get(daemon.addr, "/metrics").map_or(true, |(s, _)| s != 200));
}

#[test]
fn check_config_prints_effective_settings_and_rejects_unknown_keys_by_name() {
    let dir = TempDir::new("check");
    let good = dir.write(
        "good.toml",
        "rescan_interval = 5\nhook_mode = \"tracepoint\"\n[http]\nmax_connections = 8\n",
    );
    let out = run_to_end(&[
        "check-config",
        "--config",
        good.to_str().unwrap(),
        "--hwm-window",
        "9",
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for line in [
        "rescan_interval = 5",
        "hwm_window = 9",
        "hook_mode = \"tracepoint\"",
        "max_connections = 8",
        "listen = \"0.0.0.0:9851\"",
    ] {
        assert!(text.contains(line), "{line} missing from:\n{text}");
    }

    let bad = dir.write("bad.toml", "log = \"info\"\n[http]\nmax_conections = 8\n");
    let out = run_to_end(&["check-config", "--config", bad.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    for want in ["max_conections", "line 3", "bad.toml", "max_connections"] {
        assert!(err.contains(want), "{want} missing from:\n{err}");
    }

    let out = run_to_end(&["check-config", "--config", "/nonexistent/backlogd.toml"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/backlogd.toml"));

    let web = dir.write("web.yml", "basic_auth_users:\n  prometheus: not-a-hash\n");
    let out = run_to_end(&["check-config", "--web-config-file", web.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("basic_auth_users.prometheus") && err.contains("bcrypt"),
        "{err}"
    );

    // `run` refuses a bad file before touching the kernel.
    let out = run_to_end(&["run", "--config", bad.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("max_conections"));
}

fn unit_file() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/systemd/backlogd.service")
}

#[test]
fn systemd_analyze_verifies_the_shipped_unit() {
    if !tools::available(
        "systemd_analyze_verifies_the_shipped_unit",
        "systemd-analyze",
        &["--version"],
        "systemd",
    ) {
        return;
    }
    // verify checks that ExecStart's binary exists: point it at the one under test.
    let dir = TempDir::new("unit");
    let unit = std::fs::read_to_string(unit_file())
        .unwrap()
        .replace("/usr/local/bin/backlogd", binary().to_str().unwrap());
    let path = dir.write("backlogd.service", &unit);
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&path)
        .output()
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && said.trim().is_empty(),
        "verify:\n{said}"
    );
    let out = Command::new("systemd-analyze")
        .args(["security", "--offline=yes"])
        .arg(&path)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let score = text
        .lines()
        .find(|l| l.contains("Overall exposure level"))
        .unwrap_or_else(|| panic!("no score in:\n{text}"));
    eprintln!("{score}");
    let value: f64 = score
        .split(':')
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .and_then(|s| s.parse().ok())
        .unwrap();
    assert!(value <= 3.5, "exposure rose to {value}: {score}");
}

/// A child process killed and reaped when dropped.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        self.0.kill().ok();
        self.0.wait().ok();
    }
}

#[test]
fn after_dropping_capabilities_the_daemon_still_sees_other_users_listeners_in_other_namespaces() {
    if !tools::available(
        "after_dropping_capabilities_the_daemon_still_sees_other_users_listeners_in_other_namespaces",
        "busybox",
        &["true"],
        "busybox-static",
    ) {
        return;
    }
    // Listening before the daemon starts, so only the scan (which runs after the drop)
    // can find it: a listener of user nobody, alone in a namespace of its own.
    let port = free_port().to_string();
    let child = Command::new("unshare")
        .args(["--net", "--", "setpriv", "--reuid=65534", "--regid=65534"])
        .args([
            "--clear-groups",
            "--",
            "busybox",
            "httpd",
            "-f",
            "-p",
            &port,
        ])
        .spawn()
        .expect("unshare/setpriv (util-linux)");
    // Killed however the test ends: a panic must not leave it running (it holds the test
    // run's stdout and stderr open).
    let mut child = KillOnDrop(child);
    let pid = child.0.id();
    let hex_port = format!(":{:04X} ", port.parse::<u16>().unwrap());
    let deadline = Instant::now() + Duration::from_secs(5);
    // busybox httpd listens on [::] (tcp6) where IPv6 exists.
    let listening = || {
        ["tcp", "tcp6"].iter().any(|f| {
            std::fs::read_to_string(format!("/proc/{pid}/net/{f}"))
                .unwrap_or_default()
                .lines()
                .any(|l| l.contains(&hex_port) && l.split_whitespace().nth(3) == Some("0A"))
        })
    };
    while !listening() {
        assert!(Instant::now() < deadline, "busybox httpd did not listen");
        std::thread::sleep(Duration::from_millis(20));
    }
    let netns = std::fs::read_link(format!("/proc/{pid}/ns/net")).unwrap();
    let netns = netns
        .to_string_lossy()
        .trim_start_matches("net:[")
        .trim_end_matches(']')
        .to_owned();
    let daemon = Daemon::start();
    // By port and namespace: the port was free in this namespace only, and other
    // namespaces may have a listener on it.
    let labels = daemon.wait_for("the busybox listener", |s| {
        s.find(
            "backlogd_listen_backlog_granted",
            &[("port", &port), ("netns", &netns)],
        )
        .first()
        .map(|sample| sample.labels.clone())
    });
    // Found with only the runtime capabilities: the drop came before the scan that found
    // it, and every thread holds exactly the kept set.
    let threads = assert_runtime_caps(daemon.pid());
    let log = daemon.log();
    let line_of = |needle: &str| {
        log.lines()
            .position(|l| l.contains(needle))
            .unwrap_or_else(|| panic!("no {needle:?} in the log:\n{log}"))
    };
    assert!(
        line_of("dropped every capability") < line_of("sock_diag scan reconciled listeners"),
        "the scan ran before the drop:\n{log}"
    );
    child.0.kill().ok();
    child.0.wait().ok();
    eprintln!(
        "found by a scan with the runtime capabilities in all {} threads",
        threads.len()
    );
    assert_eq!(labels["netns"], netns, "{labels:?}");
    assert_eq!(
        labels["pid"],
        pid.to_string(),
        "owner not found: {labels:?}"
    );
    assert_eq!(labels["comm"], "busybox", "{labels:?}");
    // And what was given up stays given up.
    assert_no_way_back(&threads);
}
