//! What several service topics use: a free port, a notify socket, retrying until a
//! condition holds, the bcrypt hash of the test password, slowloris clients.

use std::{
    io::{Read as _, Write as _},
    net::{SocketAddr, TcpListener, TcpStream},
    os::{linux::net::SocketAddrExt as _, unix::net::UnixDatagram},
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
