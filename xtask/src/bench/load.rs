//! Load generators and the throwaway network namespace they run in.
//!
//! Everything runs in a namespace made for the benchmark, so its sysctls (port range,
//! somaxconn), its 100k sockets and its TIME_WAITs never touch the host or the other
//! engineers' tests running beside it; the kernel frees them all with the namespace.

use std::{
    fs::File,
    io::{BufRead as _, BufReader, Write as _},
    net::{Ipv4Addr, SocketAddr, SocketAddrV4},
    os::{fd::AsRawFd as _, unix::process::CommandExt as _},
    process::{Child, Command, Stdio},
    sync::atomic::{AtomicBool, Ordering},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, anyhow, bail};
use socket2::{Domain, Protocol, Socket, Type};

/// The suite's namespace ([`backlogd_tests::Netns`]: unshared by its helper thread,
/// loopback up, freed by the kernel when the last socket in it closes, so nothing is left
/// behind even when the benchmark is killed), plus an fd of it: the benchmark's load
/// threads (on borrowed closures, many at once, where the suite runs `'static` jobs on its
/// one thread) and the processes it polls with (`ss`, `nstat`, the connection holders) join
/// it with setns(2).
pub struct Netns {
    suite: backlogd_tests::Netns,
    file: File,
}

impl Netns {
    /// A fresh namespace with loopback up. (The suite's constructor panics if it cannot
    /// make one; `bench::section` reports a panic as the section's failure.)
    pub fn new() -> Result<Self> {
        let suite = backlogd_tests::Netns::new();
        let file = suite
            .run(|| File::open("/proc/thread-self/ns/net"))
            .context("opening the benchmark's network namespace")?;
        Ok(Self { suite, file })
    }

    /// Inode of the namespace, as backlogd's `netns` label shows it.
    pub fn inode(&self) -> u64 {
        self.suite.inode()
    }

    /// Moves the calling thread into the namespace.
    pub fn enter(&self) -> Result<()> {
        // SAFETY: plain syscall on a valid fd; affects only the calling thread.
        if unsafe { libc::setns(self.file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            return Err(std::io::Error::last_os_error())
                .context("setns into the benchmark's network namespace");
        }
        Ok(())
    }

    /// Runs `f` on a fresh thread inside the namespace (sockets it creates belong there).
    pub fn scoped<R: Send>(&self, f: impl FnOnce() -> Result<R> + Send) -> Result<R> {
        thread::scope(|s| {
            s.spawn(|| {
                self.enter()?;
                f()
            })
            .join()
            .map_err(|_| anyhow!("a thread in the benchmark's network namespace panicked"))?
        })
    }

    /// Sets a namespaced sysctl, e.g. `net.core.somaxconn` (the suite's; panics on failure).
    pub fn sysctl(&self, key: &str, value: &str) {
        self.suite.sysctl(key, value);
    }

    /// Drops segments with exactly TCP `flags` (e.g. `"syn|ack"`) as they arrive in the
    /// namespace (the suite's nft rule): handshakes stay pending on the listener's side.
    pub fn drop_incoming(&self, flags: &str) {
        self.suite.drop_incoming(flags);
    }

    /// A command that runs inside the namespace (joined with setns(2) before exec, without
    /// `ip netns exec`'s mount setup, so polling it costs what polling costs on a host).
    pub fn command(&self, program: &str) -> Command {
        let fd = self.file.as_raw_fd();
        let mut cmd = Command::new(program);
        // SAFETY: setns is async-signal-safe; the fd stays open in the parent.
        unsafe {
            cmd.pre_exec(move || {
                if libc::setns(fd, libc::CLONE_NEWNET) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        cmd
    }
}

/// A TcpExt counter of the calling thread's namespace, with the parser the daemon and the
/// suite use. (The suite's `backlogd_tests::kernel::tcp_ext` reads it on the namespace's
/// helper thread; the drop-latency loop polls from the thread that sent the SYN.)
pub fn tcp_ext_here(field: &str) -> Result<u64> {
    let text = std::fs::read_to_string("/proc/thread-self/net/netstat")?;
    backlogd_common::netstat::tcp_ext(&text)
        .and_then(|mut pairs| pairs.find(|(name, _)| *name == field))
        .map(|(_, value)| value)
        .with_context(|| format!("no TcpExt {field} in /proc/thread-self/net/netstat"))
}

fn tcp_socket() -> Result<Socket> {
    Ok(Socket::new(
        Domain::IPV4,
        Type::STREAM,
        Some(Protocol::TCP),
    )?)
}

/// A listener on 127.0.0.1 of the calling thread's namespace (`port` 0: any free one).
pub fn listen_here(port: u16, backlog: i32) -> Result<Socket> {
    let s = tcp_socket()?;
    s.set_reuse_address(true)?;
    let addr = SocketAddrV4::new(Ipv4Addr::LOCALHOST, port);
    s.bind(&addr.into())
        .with_context(|| format!("binding {addr}"))?;
    s.listen(backlog)?;
    Ok(s)
}

pub fn local_addr(s: &Socket) -> Result<SocketAddr> {
    s.local_addr()?
        .as_socket()
        .context("listener has no inet address")
}

/// One complete handshake, then an abortive close: RST instead of FIN leaves no
/// TIME_WAIT, so a loop can run for as long as it likes without exhausting ports.
fn handshake(addr: SocketAddr) -> Result<()> {
    let s = tcp_socket()?;
    s.connect(&addr.into())
        .with_context(|| format!("connecting to {addr}"))?;
    s.set_linger(Some(Duration::ZERO))?;
    Ok(())
}

/// A bare SYN: a non-blocking connect() closed at once. Aimed at a listener whose accept
/// queue is full, each one is dropped at the SYN (TcpExt ListenOverflows).
fn syn(addr: SocketAddr) -> Result<()> {
    let s = tcp_socket()?;
    s.set_nonblocking(true)?;
    match s.connect(&addr.into()) {
        Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => Ok(()),
        Err(e) => Err(e).with_context(|| format!("connecting to {addr}")),
        Ok(()) => Ok(()),
    }
}

/// Sleeps until `done` items are due at `rate` per second; false once `duration` is over.
fn pace(start: Instant, duration: Duration, rate: Option<f64>, done: u64) -> bool {
    loop {
        let elapsed = start.elapsed();
        if elapsed >= duration {
            return false;
        }
        match rate {
            Some(r) if done as f64 >= r * elapsed.as_secs_f64() => {
                thread::sleep(Duration::from_micros(200))
            }
            _ => return true,
        }
    }
}

/// Client threads in the namespace each running `one` against `addr` for `duration`
/// (at `rate` per second in total, or as fast as they can); returns (count, seconds).
fn clients(
    ns: &Netns,
    threads: usize,
    duration: Duration,
    rate: Option<f64>,
    addr: SocketAddr,
    one: fn(SocketAddr) -> Result<()>,
) -> Result<(u64, f64)> {
    let per_thread = rate.map(|r| r / threads as f64);
    let start = Instant::now();
    let total = thread::scope(|s| -> Result<u64> {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(move || -> Result<u64> {
                    ns.enter()?;
                    let mut n = 0;
                    while pace(start, duration, per_thread, n) {
                        one(addr)?;
                        n += 1;
                    }
                    Ok(n)
                })
            })
            .collect();
        let mut total = 0;
        for w in workers {
            total += w.join().map_err(|_| anyhow!("load thread panicked"))??;
        }
        Ok(total)
    })?;
    Ok((total, start.elapsed().as_secs_f64()))
}

/// Completed handshakes against a listener that accepts and closes each connection at
/// once (one accepting thread, `threads` connecting ones). Returns (handshakes, seconds).
pub fn handshakes(
    ns: &Netns,
    threads: usize,
    duration: Duration,
    rate: Option<f64>,
) -> Result<(u64, f64)> {
    let listener = ns.scoped(|| listen_here(0, 4096))?;
    let addr = local_addr(&listener)?;
    let stop = AtomicBool::new(false);
    thread::scope(|s| {
        let acceptor = s.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                let _ = listener.accept();
            }
        });
        let result = clients(ns, threads, duration, rate, addr, handshake);
        stop.store(true, Ordering::Relaxed);
        // Wakes the acceptor blocked in accept().
        let woke = ns.scoped(|| handshake(addr));
        acceptor
            .join()
            .map_err(|_| anyhow!("accept thread panicked"))?;
        woke?;
        result
    })
}

/// A listener with backlog 1 and a full accept queue (two completed connections nobody
/// accepts): every further SYN is dropped as `accept_queue_full`. Keep the returned
/// sockets alive as long as the listener is needed.
pub struct FullListener {
    pub addr: SocketAddr,
    _sockets: Vec<Socket>,
}

impl FullListener {
    pub fn new(ns: &Netns) -> Result<Self> {
        ns.scoped(|| {
            let listener = listen_here(0, 1)?;
            let addr = local_addr(&listener)?;
            let mut sockets = vec![listener];
            for _ in 0..2 {
                let c = tcp_socket()?;
                c.connect(&addr.into())?;
                sockets.push(c);
            }
            Ok(Self {
                addr,
                _sockets: sockets,
            })
        })
    }

    /// Sends SYNs from `threads` threads for `duration` (at `rate` per second in total, or
    /// as fast as they can). Returns (SYNs, seconds).
    pub fn syns(
        &self,
        ns: &Netns,
        threads: usize,
        duration: Duration,
        rate: Option<f64>,
    ) -> Result<(u64, f64)> {
        clients(ns, threads, duration, rate, self.addr, syn)
    }

    /// One SYN from the calling thread (which must be in the namespace).
    pub fn one_syn(&self) -> Result<()> {
        syn(self.addr)
    }
}

/// `count` listeners on consecutive ports from `first_port`, backlog 16.
pub fn many_listeners(ns: &Netns, first_port: u16, count: usize) -> Result<Vec<Socket>> {
    ns.scoped(|| {
        (0..count)
            .map(|i| listen_here(first_port + i as u16, 16))
            .collect()
    })
}

/// Established connections held open: listeners in this process, the client ends in
/// helper processes (`cargo xtask bench --hold`), the server ends left in the listeners'
/// accept queues. Both are needed because the hard RLIMIT_NOFILE may be low and not
/// raisable (no CAP_SYS_RESOURCE in a container): a queued connection needs no fd.
pub struct Established {
    _listeners: Vec<Socket>,
    helpers: Vec<Child>,
}

impl Established {
    /// `count` connections spread over `ports` listeners from `first_port` (so no
    /// destination needs more ephemeral ports than the namespace's range has).
    pub fn new(ns: &Netns, first_port: u16, ports: u16, count: usize) -> Result<Self> {
        let listeners: Vec<Socket> = ns.scoped(|| {
            (0..ports)
                .map(|p| listen_here(first_port + p, 65535))
                .collect()
        })?;
        let per_helper = (nofile_limit()? as usize).saturating_sub(64).max(1000);
        let exe = std::env::current_exe().context("locating the xtask binary")?;
        let mut held = Self {
            _listeners: listeners,
            helpers: Vec::new(),
        };
        let mut left = count;
        while left > 0 {
            let n = left.min(per_helper);
            left -= n;
            let child = ns
                .command(exe.to_str().context("non-UTF-8 path")?)
                .args(["bench", "--hold", &format!("{n},{first_port},{ports}")])
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .context("starting a connection-holding helper")?;
            held.helpers.push(child);
        }
        for child in &mut held.helpers {
            let mut line = String::new();
            BufReader::new(child.stdout.as_mut().expect("piped stdout")).read_line(&mut line)?;
            if line.trim() != "ready" {
                bail!("a connection-holding helper failed (see its error above)");
            }
        }
        Ok(held)
    }
}

impl Drop for Established {
    fn drop(&mut self) {
        for child in &mut self.helpers {
            // Closing stdin tells the helper to exit.
            drop(child.stdin.take());
        }
        for child in &mut self.helpers {
            let _ = child.wait();
        }
    }
}

/// The helper: `count` connections to `ports` listeners from `first_port` on 127.0.0.1,
/// "ready" on stdout, then held until stdin closes.
pub fn hold(spec: &str) -> Result<()> {
    let parsed: Vec<usize> = spec
        .split(',')
        .map(|v| v.parse())
        .collect::<Result<_, _>>()
        .with_context(|| format!("--hold {spec:?}: want COUNT,FIRST_PORT,PORTS"))?;
    let [count, first, ports] = parsed[..] else {
        bail!("--hold {spec:?}: want COUNT,FIRST_PORT,PORTS");
    };
    raise_nofile()?;
    let mut held = Vec::with_capacity(count);
    for i in 0..count {
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, (first + i % ports) as u16));
        let c = tcp_socket()?;
        c.connect(&addr.into())
            .with_context(|| format!("connection {i} to {addr}"))?;
        held.push(c);
    }
    println!("ready");
    std::io::stdout().flush()?;
    std::io::copy(&mut std::io::stdin(), &mut std::io::sink())?;
    Ok(())
}

fn nofile_limit() -> Result<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: plain syscall with a valid pointer.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err(std::io::Error::last_os_error()).context("getrlimit(RLIMIT_NOFILE)");
    }
    Ok(lim.rlim_max)
}

/// Raises the soft RLIMIT_NOFILE to the hard one (raising the hard one needs
/// CAP_SYS_RESOURCE, which a container may lack). Returns the new limit.
pub fn raise_nofile() -> Result<u64> {
    let max = nofile_limit()?;
    let lim = libc::rlimit {
        rlim_cur: max,
        rlim_max: max,
    };
    // SAFETY: plain syscall with a valid pointer.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) } != 0 {
        return Err(std::io::Error::last_os_error()).context("raising RLIMIT_NOFILE");
    }
    Ok(max)
}
