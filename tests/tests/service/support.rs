//! What several service topics use: a free port, a notify socket, retrying until a
//! condition holds, the bcrypt hash of the test password, slowloris clients.

use std::{
    io::{Read as _, Write as _},
    net::{SocketAddr, TcpListener, TcpStream},
    os::{linux::net::SocketAddrExt as _, unix::net::UnixDatagram},
    path::{Path, PathBuf},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

pub(crate) fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The shipped systemd unit.
pub(crate) fn unit_file() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/systemd/backlogd.service")
}

/// A time setting of the shipped unit (`TimeoutStopSec=10s`): where a bound is the
/// feature, the test holds the daemon to the unit's own value, not a copy of it.
pub(crate) fn unit_seconds(key: &str) -> Duration {
    let unit = std::fs::read_to_string(unit_file()).expect("the shipped unit");
    let value = unit
        .lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
        .unwrap_or_else(|| panic!("no {key}= in {}", unit_file().display()));
    let secs = value
        .trim()
        .strip_suffix('s')
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{key}={value}: not whole seconds (`10s`)"));
    Duration::from_secs(secs)
}

/// A `[http]` setting as the daemon takes it with `flags` (`backlogd check-config
/// --config /dev/null FLAGS`): the value a test's bound must be, read from the daemon
/// rather than typed a second time.
pub(crate) fn http_setting(flags: &[&str], key: &str) -> u64 {
    let out = backlogd_tests::daemon::run_to_end(
        &[&["check-config", "--config", "/dev/null"], flags].concat(),
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "check-config {flags:?}: {out:?}");
    let table: toml::Table = text.parse().unwrap_or_else(|e| panic!("{e}: {text}"));
    table["http"][key]
        .as_integer()
        .and_then(|n| u64::try_from(n).ok())
        .unwrap_or_else(|| panic!("no http.{key} in:\n{text}"))
}

/// [`http_setting`] for a setting in seconds.
pub(crate) fn http_seconds(flags: &[&str], key: &str) -> Duration {
    Duration::from_secs(http_setting(flags, key))
}

/// How long a test waits for an event (a reply, an exit, a close) before calling it a
/// hang: never a bound on how fast backlogd is.
pub(crate) const HANG: Duration = Duration::from_secs(60);

/// Waits until the daemon listening on `addr` has accepted every connection made to it
/// (its accept queue, `ss` Recv-Q, empty) and holds at least `n` (server-side ESTABLISHED
/// sockets on its port).
pub(crate) fn accepted_by_daemon(addr: SocketAddr, n: usize) {
    let port = addr.port();
    eventually("the daemon accepting its clients", HANG, || {
        let ss = |args: &[&str]| {
            let out = std::process::Command::new("ss")
                .args(args)
                .output()
                .expect("ss (iproute2)");
            String::from_utf8_lossy(&out.stdout).into_owned()
        };
        let filter = format!("sport = :{port}");
        let queued: u64 = ss(&["-Hltn", &filter])
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()?;
        let open = ss(&["-Htn", "state", "established", &filter])
            .lines()
            .count();
        (queued == 0 && open >= n).then_some(())
    });
}

/// A notify socket in the abstract namespace, as `systemd-notify`-compatible supervisors
/// bind it (`@name` in NOTIFY_SOCKET).
pub(crate) struct NotifySocket {
    socket: UnixDatagram,
    pub(crate) name: String,
}

impl NotifySocket {
    pub(crate) fn bind(tag: &str) -> Self {
        let name = format!("backlogd-test-{tag}-{}", std::process::id());
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let socket = UnixDatagram::bind_addr(&addr).unwrap();
        Self {
            socket,
            name: format!("@{name}"),
        }
    }

    /// The next datagram, or None after `limit`.
    pub(crate) fn recv(&self, limit: Duration) -> Option<String> {
        self.socket.set_read_timeout(Some(limit)).unwrap();
        let mut buf = [0u8; 4096];
        let n = self.socket.recv(&mut buf).ok()?;
        Some(String::from_utf8_lossy(&buf[..n]).into_owned())
    }

    /// Datagrams until one contains `line` (which is returned last).
    pub(crate) fn recv_until(&self, line: &str, limit: Duration) -> Vec<String> {
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

/// Calls `f` every 100 ms until it returns `Some`, for up to `limit`.
#[track_caller]
pub(crate) fn eventually<T>(what: &str, limit: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "no {what} within {limit:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// bcrypt of `scrape-secret` (`htpasswd -nbBC 10 prometheus scrape-secret`).
pub(crate) const HASH: &str = "$2y$10$qonUAlC6be2t0qfORsmUle0X.EzSnnCOAc8b05c1rnpV9iK2OeUtK";

/// What a slowloris client saw.
#[derive(Debug)]
pub(crate) struct Slow {
    /// From just before connect() until the server closed the connection; None if it was
    /// still open when the client gave up or was stopped.
    pub(crate) closed_after: Option<Duration>,
    /// Bytes of the never-ending request head it sent.
    pub(crate) sent: usize,
    /// What the server sent back.
    pub(crate) reply: Vec<u8>,
}

/// A slowloris client: sends a request head that never ends, one byte every 200 ms,
/// watching for the server to close the connection, until it does, `give_up` after
/// connecting, or `stop`.
pub(crate) fn slowloris(
    addr: SocketAddr,
    give_up: Duration,
    stop: Arc<AtomicBool>,
) -> JoinHandle<Slow> {
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
