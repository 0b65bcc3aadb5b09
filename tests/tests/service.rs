//! backlogd as a service, each test with a real daemon process: systemd readiness and
//! watchdog over a notify socket the test binds, capabilities after readiness, SIGHUP
//! reload, SIGTERM exit time, the config file and check-config, the HTTP endpoint's
//! behaviour with abusive clients, basic auth and TLS, and the shipped systemd unit.

use std::{
    io::{Read as _, Write as _},
    net::{SocketAddr, TcpListener, TcpStream},
    os::{linux::net::SocketAddrExt as _, unix::net::UnixDatagram},
    path::{Path, PathBuf},
    process::Command,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use backlogd_tests::{
    Daemon,
    daemon::{binary, http_get, run_to_end, try_http_get},
};

/// A scratch directory removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("backlogd-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }

    fn write(&self, name: &str, text: &str) -> PathBuf {
        let path = self.0.join(name);
        std::fs::write(&path, text).unwrap();
        path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        std::fs::remove_dir_all(&self.0).ok();
    }
}

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

/// Effective capabilities of every thread of `pid`.
fn thread_caps(pid: u32) -> Vec<(String, u64)> {
    let dir = format!("/proc/{pid}/task");
    std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|t| {
            let status = std::fs::read_to_string(t.path().join("status")).unwrap();
            let eff = status
                .lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .map(|h| u64::from_str_radix(h.trim(), 16).unwrap())
                .unwrap();
            (t.file_name().to_string_lossy().into_owned(), eff)
        })
        .collect()
}

const CAP_DAC_READ_SEARCH: u64 = 1 << 2;
const CAP_SYS_PTRACE: u64 = 1 << 19;
const CAP_SYS_ADMIN: u64 = 1 << 21;

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
    let (status, body) = http_get(addr, "/metrics");
    assert_eq!(status, 200);
    assert!(
        body.contains("backlogd_hook_mode"),
        "probes not attached at READY=1: {body}"
    );
    assert!(daemon.log().contains("probes attached"), "{}", daemon.log());

    // Capabilities: only what the running daemon needs, in every thread.
    let want = CAP_SYS_ADMIN | CAP_SYS_PTRACE | CAP_DAC_READ_SEARCH;
    let caps = thread_caps(daemon.pid());
    assert!(!caps.is_empty());
    for (tid, eff) in &caps {
        assert_eq!(*eff, want, "thread {tid} CapEff {eff:#x}, want {want:#x}");
    }
    eprintln!(
        "CapEff of all {} threads after READY=1: {want:#018x} (CAP_DAC_READ_SEARCH, \
         CAP_SYS_PTRACE, CAP_SYS_ADMIN)",
        caps.len()
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

#[test]
fn sighup_applies_reloadable_settings_and_keeps_the_old_config_when_the_new_is_bad() {
    let dir = TempDir::new("reload");
    let port = free_port();
    let file = dir.write(
        "backlogd.toml",
        &format!("listen = \"127.0.0.1:{port}\"\nrescan_interval = 30\nlog = \"info\"\n"),
    );
    let daemon = Daemon::start_with(&["--config", file.to_str().unwrap()]);
    assert_eq!(daemon.addr.port(), port, "listen from the file");

    // Reloadable: the rescan interval and the log filter. Not: the listen address.
    let other = free_port();
    std::fs::write(
        &file,
        format!(
            "listen = \"127.0.0.1:{other}\"\nrescan_interval = 1\nhwm_window = 5\n\
             log = \"backlogd=debug,info\"\n"
        ),
    )
    .unwrap();
    daemon.signal(libc::SIGHUP);
    let line = wait_for_nth(&daemon, "configuration reloaded", 1);
    for change in ["rescan_interval 30 -> 1", "hwm_window 60 -> 5", "log "] {
        assert!(line.contains(change), "{change} missing: {line}");
    }
    let warned = daemon.wait_for_log("`listen` changed");
    assert!(warned.contains("restart"), "{warned}");
    // The new interval and the new filter are in force: debug-level scan lines now come
    // every second.
    std::thread::sleep(Duration::from_millis(2500));
    assert_eq!(daemon.get("/metrics").0, 200, "still on the old port");

    // A bad file: the error names the key and line, the running config stays.
    std::fs::write(&file, "rescan_interval = 2\nlisten_adress = \"x\"\n").unwrap();
    daemon.signal(libc::SIGHUP);
    let failed = daemon.wait_for_log("config reload failed");
    assert!(
        failed.contains("keeping the running configuration"),
        "{failed}"
    );
    let log = daemon.log();
    assert!(
        log.contains("listen_adress") && log.contains("line 2"),
        "{log}"
    );
    assert_eq!(daemon.get("/metrics").0, 200);
    // Once fixed, a reload works again and starts from the running (not the bad) config.
    std::fs::write(
        &file,
        format!("listen = \"127.0.0.1:{port}\"\nrescan_interval = 7\n"),
    )
    .unwrap();
    daemon.signal(libc::SIGHUP);
    let line = wait_for_nth(&daemon, "configuration reloaded", 2);
    assert!(line.contains("rescan_interval 1 -> 7"), "{line}");
}

/// Sends a request head byte by byte, slowly, until `stop` (slowloris).
fn slowloris(addr: SocketAddr, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let Ok(mut s) = TcpStream::connect(addr) else {
            return;
        };
        let head = b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
        for b in head.iter().cycle() {
            if stop.load(Ordering::Relaxed) || s.write_all(&[*b]).is_err() {
                return;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
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
        .map(|_| slowloris(daemon.addr, stop.clone()))
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
    slow.into_iter().for_each(|t| t.join().unwrap());
    let status = status.unwrap_or_else(|| panic!("still running 10 s after SIGTERM"));
    eprintln!(
        "SIGTERM to exit: {took:?} with 1 idle keep-alive, 4 slowloris and 1 non-reading \
         client connected"
    );
    assert!(status.success(), "{status}");
    assert!(took < Duration::from_secs(4), "took {took:?}");
    drop(idle);
}

/// Sends raw bytes and returns what came back (until close or 5 s).
fn raw(addr: SocketAddr, bytes: &[u8]) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let _ = s.write_all(bytes);
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

/// Times a well-behaved scrape; panics if it fails.
fn timed_scrape(addr: SocketAddr) -> Duration {
    let start = Instant::now();
    let (status, body) = try_http_get(addr, "/metrics").unwrap_or_else(|e| panic!("scrape: {e}"));
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

    // Slowloris: more slow connections than the limit, each trickling a header.
    let stop = Arc::new(AtomicBool::new(false));
    let slow: Vec<_> = (0..64).map(|_| slowloris(addr, stop.clone())).collect();
    std::thread::sleep(Duration::from_millis(500));
    let mut worst = Duration::ZERO;
    for _ in 0..10 {
        worst = worst.max(timed_scrape(addr));
        std::thread::sleep(Duration::from_millis(300));
    }
    stop.store(true, Ordering::Relaxed);
    slow.into_iter().for_each(|t| t.join().unwrap());
    eprintln!("slowloris (64 connections, limit 32): worst of 10 scrapes {worst:?}");
    assert!(worst < bound, "scrape took {worst:?} under slowloris");

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

/// bcrypt of `scrape-secret` (`htpasswd -nbBC 10 prometheus scrape-secret`).
const HASH: &str = "$2y$10$qonUAlC6be2t0qfORsmUle0X.EzSnnCOAc8b05c1rnpV9iK2OeUtK";

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
    // base64("prometheus:scrape-secret"), base64("prometheus:wrong"), base64("nobody:scrape-secret")
    let good = "cHJvbWV0aGV1czpzY3JhcGUtc2VjcmV0";
    let wrong = "cHJvbWV0aGV1czp3cm9uZw==";
    let stranger = "bm9ib2R5OnNjcmFwZS1zZWNyZXQ=";
    let none = get_with_auth(daemon.addr, None);
    assert!(none.starts_with("HTTP/1.1 401"), "{none}");
    assert!(none.contains("www-authenticate: Basic"), "{none}");
    for bad in [wrong, stranger, "!!notbase64"] {
        let r = get_with_auth(daemon.addr, Some(bad));
        assert!(r.starts_with("HTTP/1.1 401"), "{bad}: {r}");
    }
    let ok = get_with_auth(daemon.addr, Some(good));
    assert!(
        ok.starts_with("HTTP/1.1 200") && ok.contains("backlogd_hook_mode"),
        "{ok}"
    );
}

#[test]
fn tls_from_a_web_config_file() {
    if Command::new("openssl").arg("version").output().is_err()
        || Command::new("curl").arg("--version").output().is_err()
    {
        eprintln!("SKIPPED: tls_from_a_web_config_file needs the openssl and curl commands");
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
        .arg(dir.0.join("key.pem"))
        .arg("-out")
        .arg(dir.0.join("cert.pem"))
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
        .arg(dir.0.join("cert.pem"))
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
    assert!(try_http_get(daemon.addr, "/metrics").map_or(true, |(s, _)| s != 200));
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
    if Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!(
            "SKIPPED: systemd_analyze_verifies_the_shipped_unit: systemd-analyze is not \
             installed (Debian package `systemd`)"
        );
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

#[test]
fn after_dropping_capabilities_the_daemon_still_sees_other_users_listeners_in_other_namespaces() {
    if Command::new("busybox").arg("true").output().is_err() {
        eprintln!(
            "SKIPPED: needs busybox (Debian busybox-static, installed by `cargo xtask setup`)"
        );
        return;
    }
    // Listening before the daemon starts, so only the scan (which runs after the drop)
    // can find it: a listener of user nobody, alone in a namespace of its own.
    let port = free_port().to_string();
    let mut child = Command::new("unshare")
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
    let pid = child.id();
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
    let labels = daemon.wait_for("the busybox listener", |s| {
        s.find("backlogd_listen_backlog_granted", &[("port", &port)])
            .first()
            .map(|sample| sample.labels.clone())
    });
    child.kill().ok();
    child.wait().ok();
    assert_eq!(labels["netns"], netns, "{labels:?}");
    assert_eq!(
        labels["pid"],
        pid.to_string(),
        "owner not found: {labels:?}"
    );
    assert_eq!(labels["comm"], "busybox", "{labels:?}");
}
