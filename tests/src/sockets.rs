//! Listening sockets made with explicit backlogs, and the kernel's view of them.

use std::{
    net::SocketAddr,
    os::{fd::AsRawFd as _, unix::fs::MetadataExt as _},
};

use socket2::{Domain, Socket, Type};

use crate::Netns;

/// The socket inode of the listener on `port` in `ns` (`ss -e`'s `ino:`), if one listens.
pub fn listening_inode(ns: &Netns, port: u16) -> Option<u64> {
    ns.command("ss", &["-Hltne", &format!("sport = :{port}")])
        .split_whitespace()
        .find_map(|w| w.strip_prefix("ino:"))
        .and_then(|i| i.parse().ok())
}

/// A TCP listener created inside a namespace.
pub struct Listener {
    pub socket: Socket,
    pub addr: SocketAddr,
    /// Socket inode, as `ss -e` and backlogd's `socket` label show it.
    pub inode: u64,
}

impl Listener {
    /// `socket(); bind(addr); listen(backlog)` inside `ns`.
    pub fn open(ns: &Netns, addr: &str, backlog: i32) -> Self {
        Self::open_with(ns, addr, backlog, false)
    }

    /// As [`Listener::open`] with SO_REUSEPORT, to form a group on one address and port.
    pub fn open_reuseport(ns: &Netns, addr: &str, backlog: i32) -> Self {
        Self::open_with(ns, addr, backlog, true)
    }

    fn open_with(ns: &Netns, addr: &str, backlog: i32, reuseport: bool) -> Self {
        let addr: SocketAddr = addr.parse().expect("socket address");
        let socket = ns.run(move || {
            let s = Socket::new(Domain::for_address(addr), Type::STREAM, None).expect("socket()");
            if reuseport {
                s.set_reuse_port(true).expect("SO_REUSEPORT");
            }
            s.bind(&addr.into())
                .unwrap_or_else(|e| panic!("bind {addr}: {e}"));
            s.listen(backlog).expect("listen()");
            s
        });
        let addr = socket
            .local_addr()
            .expect("local_addr")
            .as_socket()
            .expect("inet socket");
        let inode = std::fs::metadata(format!("/proc/self/fd/{}", socket.as_raw_fd()))
            .expect("stat socket fd")
            .ino();
        Self {
            socket,
            addr,
            inode,
        }
    }

    /// `listen()` again with another backlog.
    pub fn relisten(&self, backlog: i32) {
        self.socket.listen(backlog).expect("listen() again");
    }
}

/// The kernel's view of one listener through sock_diag: `ss -ltn` prints Recv-Q
/// (`sk_ack_backlog`) and Send-Q (`sk_max_ack_backlog`) for LISTEN sockets.
#[derive(Debug, PartialEq, Eq)]
pub struct KernelQueue {
    pub recv_q: u64,
    pub send_q: u64,
    /// `sk_drops` (`ss -m` skmem `d`).
    pub drops: u64,
}

pub fn kernel_queue(ns: &Netns, listener: &Listener) -> KernelQueue {
    let out = ns.command(
        "ss",
        &["-ltnHem", &format!("sport = :{}", listener.addr.port())],
    );
    let wanted = format!("ino:{}", listener.inode);
    // One record per socket: a line, then tab-indented continuation lines (skmem).
    let mut records: Vec<String> = Vec::new();
    for line in out.lines() {
        match records.last_mut() {
            Some(r) if line.starts_with(char::is_whitespace) => r.push_str(line),
            _ => records.push(line.to_owned()),
        }
    }
    let line = records
        .iter()
        .find(|r| r.split_whitespace().any(|w| w == wanted))
        .unwrap_or_else(|| panic!("ss shows no socket with {wanted}:\n{out}"));
    let cols: Vec<&str> = line.split_whitespace().collect();
    let drops = line
        .split("skmem:(")
        .nth(1)
        .and_then(|m| m.split(')').next())
        .and_then(|m| m.split(',').find_map(|f| f.strip_prefix('d')))
        .unwrap_or_else(|| panic!("no skmem drops in {line:?}"))
        .parse()
        .expect("skmem d");
    KernelQueue {
        recv_q: cols[1].parse().expect("Recv-Q"),
        send_q: cols[2].parse().expect("Send-Q"),
        drops,
    }
}

/// Waits until `listener`'s accept queue holds at least `n` connections (the kernel's
/// Recv-Q); returns the queue then. The limit (60 s) only catches a hang: a handshake on
/// loopback completes within milliseconds of its SYN.
#[track_caller]
pub fn wait_for_queue(ns: &Netns, listener: &Listener, n: u64) -> KernelQueue {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let queue = kernel_queue(ns, listener);
        if queue.recv_q >= n {
            return queue;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the accept queue never held {n} connections: {queue:?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// Non-blocking `connect()`s from inside `ns`: a burst of real handshakes. The sockets
/// are returned so the caller decides how long the clients keep retrying.
pub fn connect_burst(ns: &Netns, to: SocketAddr, count: usize) -> Vec<Socket> {
    connect_each(ns, to, count)
        .into_iter()
        .map(|c| c.socket)
        .collect()
}

/// A client of [`connect_each`] and when its `connect()` call began and returned.
pub struct Connecting {
    pub socket: Socket,
    pub called: std::time::Instant,
    pub returned: std::time::Instant,
}

/// [`connect_burst`], noting when each client's `connect()` was called and returned: its
/// first SYN is sent within that call (and, on loopback, usually processed there too).
pub fn connect_each(ns: &Netns, to: SocketAddr, count: usize) -> Vec<Connecting> {
    ns.run(move || {
        (0..count)
            .map(|_| {
                let s = Socket::new(Domain::for_address(to), Type::STREAM, None)
                    .expect("client socket()");
                s.set_nonblocking(true).expect("non-blocking");
                let called = std::time::Instant::now();
                match s.connect(&to.into()) {
                    Ok(()) => {}
                    Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => {}
                    Err(e) => panic!("connect {to}: {e}"),
                }
                Connecting {
                    socket: s,
                    called,
                    returned: std::time::Instant::now(),
                }
            })
            .collect()
    })
}

/// Connects `count` clients to `to` one at a time, each waiting until the listener's accept
/// queue holds it (`ss` Recv-Q), so no SYN of theirs meets a queue that earlier, still
/// unfinished handshakes are about to fill. (In a burst against an empty queue, SYNs that
/// arrive before the first final ACKs get requests, and those final ACKs then overflow:
/// the kernel's split between accept-queue-full and final-ACK overflows depends on how
/// the softirq batched the burst.) The listener must not accept meanwhile.
pub fn fill_accept_queue(
    ns: &Netns,
    listener: &Listener,
    to: SocketAddr,
    count: usize,
) -> Vec<Socket> {
    let start = kernel_queue(ns, listener).recv_q;
    let mut clients = Vec::with_capacity(count);
    for n in 1..=count as u64 {
        clients.extend(connect_burst(ns, to, 1));
        wait_for_queue(ns, listener, start + n);
    }
    clients
}

/// What a set of clients saw, from their own sockets (`TCP_INFO`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientView {
    pub clients: usize,
    /// Handshake complete on the client's side (ESTABLISHED or later).
    pub connected: usize,
    /// Still in SYN_SENT: every SYN of theirs was dropped so far.
    pub waiting: usize,
    /// SYNs sent, first ones and retransmissions (valid while no data was sent).
    pub syns_sent: u64,
}

pub fn client_view<'a>(clients: impl IntoIterator<Item = &'a Socket>) -> ClientView {
    const TCP_SYN_SENT: u8 = 2;
    let mut view = ClientView {
        clients: 0,
        connected: 0,
        waiting: 0,
        syns_sent: 0,
    };
    for c in clients {
        view.clients += 1;
        let (state, retrans) = tcp_state(c);
        if state == TCP_SYN_SENT {
            view.waiting += 1;
        } else {
            view.connected += 1;
        }
        view.syns_sent += 1 + u64::from(retrans);
    }
    view
}

/// SYNs a client socket has sent: the first plus its retransmissions
/// (`tcpi_total_retrans` while the handshake is pending).
pub fn syns_sent(socket: &Socket) -> u64 {
    1 + u64::from(tcp_state(socket).1)
}

/// `tcpi_state` and `tcpi_total_retrans` of a socket.
pub fn tcp_state(socket: &Socket) -> (u8, u32) {
    let info = tcp_info(socket);
    (info.tcpi_state, info.tcpi_total_retrans)
}

/// The longest jiffy of any Linux kernel (HZ >= 100): TCP_INFO's "ms since" fields count
/// whole jiffies.
pub const JIFFY: std::time::Duration = std::time::Duration::from_millis(10);

/// When the kernel created the accepted connection `socket`, as a window of this
/// process's clock: the child is created, and queued for accept, when the handshake's
/// final ACK is processed, and TCP_INFO's time since the last data received counts from
/// that creation while the connection has received no data (the scenarios' clients send
/// none). Call it right after accept().
pub fn created_window(socket: &Socket) -> (std::time::Instant, std::time::Instant) {
    let before = std::time::Instant::now();
    let info = tcp_info(socket);
    let after = std::time::Instant::now();
    let since = std::time::Duration::from_millis(info.tcpi_last_data_recv.into());
    (before - since - JIFFY, after - since + JIFFY)
}

/// The kernel's TCP_INFO for `socket`.
pub fn tcp_info(socket: &Socket) -> libc::tcp_info {
    // SAFETY: tcp_info is plain integers; all zeroes is a valid value.
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `info`.
    let rc = unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&raw mut info).cast(),
            &mut len,
        )
    };
    assert_eq!(rc, 0, "TCP_INFO: {}", std::io::Error::last_os_error());
    info
}

/// When each client's non-blocking `connect()` completed, from the client's side: a
/// thread polls the registered sockets for writability (what a client waiting in
/// `connect()` or `poll()` would see), every millisecond or sooner.
pub struct ConnectWatch {
    watched: std::sync::Arc<std::sync::Mutex<Vec<Watched>>>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

struct Watched {
    fd: std::os::fd::RawFd,
    port: u16,
    started: std::time::Instant,
    done: Option<std::time::Instant>,
}

/// One client's connect() as [`ConnectWatch`] saw it.
#[derive(Debug, Clone, Copy)]
pub struct ConnectTiming {
    pub started: std::time::Instant,
    /// From `connect()` to the socket being connected (or failed); `None`: still waiting.
    pub took: Option<std::time::Duration>,
}

impl Default for ConnectWatch {
    fn default() -> Self {
        Self::start()
    }
}

impl ConnectWatch {
    pub fn start() -> Self {
        use std::sync::{Arc, Mutex, atomic::AtomicBool};
        let watched: Arc<Mutex<Vec<Watched>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (watched, stop) = (watched.clone(), stop.clone());
            std::thread::spawn(move || watch(&watched, &stop))
        };
        Self {
            watched,
            stop,
            thread: Some(thread),
        }
    }

    /// Watches `sockets`, whose `connect()` was called at `started` (just before).
    pub fn add(&self, sockets: &[Socket], started: std::time::Instant) {
        let mut watched = self.watched.lock().unwrap();
        for s in sockets {
            watched.push(Watched {
                fd: s.as_raw_fd(),
                port: local_port(s),
                started,
                done: None,
            });
        }
    }

    /// Stops watching; each client's timing by its local port. The sockets must still be
    /// open (their descriptors are polled until now).
    pub fn finish(mut self) -> std::collections::HashMap<u16, ConnectTiming> {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            t.join().expect("connect watch thread");
        }
        let mut watched = self.watched.lock().unwrap();
        // A last look, so a connection that completed since the thread's last poll (the
        // caller may have just accepted it) has its time: a little late, never missing.
        let now = std::time::Instant::now();
        for w in watched.iter_mut().filter(|w| w.done.is_none()) {
            let mut p = libc::pollfd {
                fd: w.fd,
                events: libc::POLLOUT,
                revents: 0,
            };
            // SAFETY: one valid pollfd.
            let n = unsafe { libc::poll(&mut p, 1, 0) };
            if n > 0 && p.revents & (libc::POLLOUT | libc::POLLERR | libc::POLLHUP) != 0 {
                w.done = Some(now);
            }
        }
        watched
            .iter()
            .map(|w| {
                (
                    w.port,
                    ConnectTiming {
                        started: w.started,
                        took: w.done.map(|d| d - w.started),
                    },
                )
            })
            .collect()
    }
}

fn watch(watched: &std::sync::Mutex<Vec<Watched>>, stop: &std::sync::atomic::AtomicBool) {
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        let (mut fds, index): (Vec<libc::pollfd>, Vec<usize>) = {
            let watched = watched.lock().unwrap();
            watched
                .iter()
                .enumerate()
                .filter(|(_, w)| w.done.is_none())
                .map(|(i, w)| {
                    (
                        libc::pollfd {
                            fd: w.fd,
                            events: libc::POLLOUT,
                            revents: 0,
                        },
                        i,
                    )
                })
                .unzip()
        };
        if fds.is_empty() {
            std::thread::sleep(std::time::Duration::from_millis(1));
            continue;
        }
        // SAFETY: `fds` is a valid array of `fds.len()` pollfd structs.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 1) };
        if n <= 0 {
            continue;
        }
        let now = std::time::Instant::now();
        let mut watched = watched.lock().unwrap();
        for (p, i) in fds.iter().zip(index) {
            if p.revents & (libc::POLLOUT | libc::POLLERR | libc::POLLHUP) != 0 {
                watched[i].done = Some(now);
            }
        }
    }
}

/// The local port of a client socket.
pub fn local_port(socket: &Socket) -> u16 {
    socket
        .local_addr()
        .ok()
        .and_then(|a| a.as_socket())
        .map_or(0, |a| a.port())
}

/// Closes `socket` with a RST instead of a FIN (SO_LINGER 0): a client whose final ACK
/// the listener dropped then ends its pending request at once, instead of completing the
/// handshake later with its FIN.
pub fn reset_close(socket: Socket) {
    socket
        .set_linger(Some(std::time::Duration::ZERO))
        .expect("SO_LINGER 0");
    drop(socket);
}

/// Client ports of the requests pending (SYN-RECV) in `ns` for local port `port`.
pub fn pending_request_peers(ns: &Netns, port: u16) -> std::collections::HashSet<u16> {
    let filter = format!("sport = :{port}");
    ns.command("ss", &["-Htn", "state", "syn-recv", &filter])
        .lines()
        .filter_map(|line| {
            // Recv-Q Send-Q Local:Port Peer:Port
            let peer = line.split_whitespace().nth(3)?;
            peer.rsplit(':').next()?.parse().ok()
        })
        .collect()
}
