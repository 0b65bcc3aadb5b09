//! The guest side of `cargo xtask bench --guest` (`guest.rs` boots it): runs inside the
//! qemu guest, one invocation per hook mode, and prints [`cost_table::Line`]s on the
//! console.
//!
//! Under `-icount shift=0,sleep=off` the guest's clock advances one nanosecond per
//! instruction the guest executes, user and kernel alike, so a loop timed by
//! `CLOCK_MONOTONIC` counts the instructions of its events: real syscalls on real sockets,
//! the kernel's own code paths, backlogd's programs and whatever dispatches them
//! (trampolines, kprobes, the slow syscall path), and any other task that ran meanwhile
//! (backlogd's daemon). A run is one loop per [`Event`]; runs alternate without and with
//! a daemon in the mode under test (runs 0, 2, 4 ... without), each daemon started for
//! its run and stopped after it. During a loop of a run with, the daemon's process is
//! stopped ([`Paused`]): its programs run, its periodic work waits, so each loop's figure
//! is the per-event cost; the syscall-free loop runs with the daemon running and gives
//! that periodic work's share of a busy CPU. Then one run with `kernel.bpf_stats_enabled` gives each
//! program's runs and run time per event, and, where perf works in the guest, one run
//! under `perf record -a` names the hot spots.

use std::{
    net::{SocketAddr, UdpSocket},
    os::{fd::AsRawFd as _, unix::process::ExitStatusExt as _},
    path::Path,
};

use super::{
    cost_table::{Event, Line},
    *,
};

/// Where `guest.rs` puts perf (Debian's linux-perf) in the guest: its payload's "perf".
const GUEST_PERF: &str = "/backlogd/tests/perf";

/// perf on a host (`--guest host`).
const HOST_PERF: &str = "/usr/bin/perf";

/// The perf this run uses: the guest's copy, or the host's own.
static PERF_BIN: std::sync::OnceLock<&'static str> = std::sync::OnceLock::new();

fn perf_bin() -> &'static str {
    PERF_BIN.get().copied().unwrap_or(GUEST_PERF)
}

/// Guest-clock ns between samples of the profile (under icount: instructions). The
/// kernel's floor for its hrtimer-driven software events (`cpu-clock`) is 10 us.
pub(super) const PROFILE_PERIOD: u64 = 10_000;

/// (kernel counter, moves the loop made, moves the kernel counted).
type Checks = Vec<(String, u64, u64)>;

/// The guest's instruction clock.
fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: plain syscall (vDSO) with a valid pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// A syscall's return value, or the errno it failed with and what it was.
fn check(rc: i32, what: &str) -> Result<i32> {
    if rc < 0 {
        return Err(std::io::Error::last_os_error()).with_context(|| what.to_owned());
    }
    Ok(rc)
}

fn sockaddr(addr: SocketAddr) -> Result<libc::sockaddr_in> {
    let SocketAddr::V4(v4) = addr else {
        bail!("{addr}: the loops use IPv4 on loopback");
    };
    Ok(libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: v4.port().to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(*v4.ip()).to_be(),
        },
        sin_zero: [0; 8],
    })
}

fn connect(fd: i32, sa: &libc::sockaddr_in) -> i32 {
    // SAFETY: a valid sockaddr_in of the size given.
    unsafe {
        libc::connect(
            fd,
            std::ptr::from_ref(sa).cast(),
            size_of::<libc::sockaddr_in>() as libc::socklen_t,
        )
    }
}

/// What the loops need beyond the guest's own network namespace.
struct Fixtures {
    /// A netns with tcp_syncookies 0 and nft dropping SYN-ACKs on arrival, so requests
    /// stay in a listener's SYN queue; only the SYN-queue loop runs in it (nft's hook
    /// would otherwise be on every other loop's path).
    synq: Netns,
}

impl Fixtures {
    fn new() -> Result<Self> {
        let synq = Netns::new()?;
        synq.sysctl("net.ipv4.tcp_syncookies", "0");
        synq.drop_incoming("syn|ack");
        Ok(Self { synq })
    }

    /// One loop of `n` events, in this thread's netns (the SYN-queue loop in `synq`):
    /// the guest-clock ns of the loop alone, and the kernel counters that prove it.
    fn run(&self, event: Event, n: u64) -> Result<(u64, Checks)> {
        match event {
            Event::Spin => spin(n).map(|ns| (ns, Vec::new())),
            Event::Getppid => getppid(n).map(|ns| (ns, Vec::new())),
            Event::Udp => udp(n).map(|ns| (ns, Vec::new())),
            Event::Handshake | Event::HandshakeAfterDrops => {
                handshakes(n).map(|ns| (ns, Vec::new()))
            }
            Event::AcceptQueueFull => accept_queue_full(n),
            Event::SynQueueFull => self.synq.scoped(|| syn_queue_full(n)),
        }
    }
}

/// The timed part of a loop: the guest clock around `f`, and the profiler (when one is
/// recording) switched on for exactly that part.
fn timed(f: impl FnOnce() -> Result<()>) -> Result<u64> {
    Perf::switch(true)?;
    let t = now_ns();
    let done = f();
    let ns = now_ns() - t;
    Perf::switch(false)?;
    done.map(|()| ns)
}

fn spin(n: u64) -> Result<u64> {
    timed(|| {
        let mut acc: u64 = 1;
        for i in 0..n {
            acc = std::hint::black_box(acc.wrapping_mul(31).wrapping_add(i));
        }
        std::hint::black_box(acc);
        Ok(())
    })
}

fn getppid(n: u64) -> Result<u64> {
    timed(|| {
        for _ in 0..n {
            // SAFETY: takes no arguments, cannot fail; glibc does not cache it.
            std::hint::black_box(unsafe { libc::getppid() });
        }
        Ok(())
    })
}

fn udp(n: u64) -> Result<u64> {
    let a = UdpSocket::bind("127.0.0.1:0")?;
    let b = UdpSocket::bind("127.0.0.1:0")?;
    a.connect(b.local_addr()?)?;
    b.connect(a.local_addr()?)?;
    let (fa, fb) = (a.as_raw_fd(), b.as_raw_fd());
    let out = [7u8; 64];
    let mut buf = [0u8; 64];
    timed(|| {
        for _ in 0..n {
            // SAFETY: valid fds and buffers of the lengths given.
            let sent = unsafe { libc::send(fa, out.as_ptr().cast(), out.len(), 0) };
            // SAFETY: as above. Loopback delivers inside send(): the datagram is there.
            let got = unsafe { libc::recv(fb, buf.as_mut_ptr().cast(), buf.len(), 0) };
            if sent != 64 || got != 64 {
                bail!(
                    "UDP loop: send returned {sent}, recv {got}: {}",
                    std::io::Error::last_os_error()
                );
            }
        }
        Ok(())
    })
}

fn handshakes(n: u64) -> Result<u64> {
    let listener = load::listen_here(0, 4096)?;
    let sa = sockaddr(load::local_addr(&listener)?)?;
    let lfd = listener.as_raw_fd();
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    timed(|| {
        for _ in 0..n {
            // SAFETY: plain syscalls on fds this loop owns, with valid pointers and sizes.
            unsafe {
                let c = check(libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0), "socket")?;
                check(connect(c, &sa), "connect to the handshake listener")?;
                let a = check(
                    libc::accept4(lfd, std::ptr::null_mut(), std::ptr::null_mut(), 0),
                    "accept4",
                )?;
                // RST instead of FIN: no TIME_WAIT, so the loop never runs out of ports.
                check(
                    libc::setsockopt(
                        c,
                        libc::SOL_SOCKET,
                        libc::SO_LINGER,
                        std::ptr::from_ref(&linger).cast(),
                        size_of::<libc::linger>() as libc::socklen_t,
                    ),
                    "SO_LINGER",
                )?;
                libc::close(c);
                libc::close(a);
            }
        }
        Ok(())
    })
}

/// SYNs from non-blocking connects closed at once (SYN_SENT closes without sending
/// anything), to `sa`; each connect must say EINPROGRESS.
fn bare_syns(sa: &libc::sockaddr_in, n: u64) -> Result<()> {
    for _ in 0..n {
        // SAFETY: plain syscalls on an fd this loop owns.
        unsafe {
            let c = check(
                libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_NONBLOCK, 0),
                "socket",
            )?;
            if connect(c, sa) == 0
                || std::io::Error::last_os_error().raw_os_error() != Some(libc::EINPROGRESS)
            {
                bail!(
                    "a bare SYN's connect did not say EINPROGRESS: {}",
                    std::io::Error::last_os_error()
                );
            }
            libc::close(c);
        }
    }
    Ok(())
}

/// Bare SYNs to a listener with backlog 1 whose accept queue holds two connections
/// nobody accepts: every SYN is dropped (ListenOverflows).
fn accept_queue_full(n: u64) -> Result<(u64, Checks)> {
    let listener = load::listen_here(0, 1)?;
    let addr = load::local_addr(&listener)?;
    let queued: Vec<std::net::TcpStream> = (0..2)
        .map(|_| std::net::TcpStream::connect(addr))
        .collect::<std::io::Result<_>>()?;
    let before = load::tcp_ext_here("ListenOverflows")?;
    let sa = sockaddr(addr)?;
    let ns = timed(|| bare_syns(&sa, n))?;
    let got = load::tcp_ext_here("ListenOverflows")? - before;
    drop(queued);
    Ok((ns, vec![("ListenOverflows".into(), n, got)]))
}

/// First local port of the SYN-queue fillers, below the ephemeral range (32768 up).
const FILLER_PORT: u16 = 20_000;

/// Bare SYNs to a listener with backlog 8 whose SYN queue is full of requests whose
/// SYN-ACKs nft drops (in the `synq` netns): every SYN is dropped (TCPReqQFullDrop). The
/// listener is new each run, so its requests never reach their SYN-ACK timeouts.
fn syn_queue_full(n: u64) -> Result<(u64, Checks)> {
    let listener = load::listen_here(0, 8)?;
    let sa = sockaddr(load::local_addr(&listener)?)?;
    // Fill until the kernel drops a SYN for a full SYN queue. The fillers come from
    // ports below the ephemeral range: a loop SYN from a closed filler's port (connect()
    // may reuse it) finds that filler's request, whose ISN is not its own, so the kernel
    // resets the request (TcpExt EmbryonicRsts) and the next loop SYN takes the freed slot:
    // two SYNs not dropped per collision (2-10 of 5000 per run with ephemeral fillers,
    // reproduced on the host; 0 with these).
    let start = load::tcp_ext_here("TCPReqQFullDrop")?;
    let mut port = FILLER_PORT;
    while load::tcp_ext_here("TCPReqQFullDrop")? == start {
        if port == FILLER_PORT + 64 {
            bail!("64 SYNs whose SYN-ACKs were dropped did not fill a SYN queue of backlog 8");
        }
        let filler = socket2::Socket::new(
            socket2::Domain::IPV4,
            socket2::Type::STREAM,
            Some(socket2::Protocol::TCP),
        )?;
        filler.set_reuse_address(true)?;
        filler.bind(&SocketAddr::from(([127, 0, 0, 1], port)).into())?;
        filler.set_nonblocking(true)?;
        match filler.connect(&load::local_addr(&listener)?.into()) {
            Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => {}
            other => bail!("a filler SYN's connect did not say EINPROGRESS: {other:?}"),
        }
        port += 1;
    }
    let before = load::tcp_ext_here("TCPReqQFullDrop")?;
    let resets = load::tcp_ext_here("EmbryonicRsts")?;
    let ns = timed(|| bare_syns(&sa, n))?;
    let got = load::tcp_ext_here("TCPReqQFullDrop")? - before;
    // A filler's request reset by a loop SYN: the cause if TCPReqQFullDrop falls short.
    let reset = load::tcp_ext_here("EmbryonicRsts")? - resets;
    drop(listener);
    Ok((
        ns,
        vec![
            ("TCPReqQFullDrop".into(), n, got),
            ("EmbryonicRsts".into(), 0, reset),
        ],
    ))
}

fn say(line: Line) {
    println!("{}", line.render());
}

fn note(mode: &str, text: String) {
    say(Line::Note {
        mode: mode.into(),
        text,
    });
}

/// The hook mode of a `--mode` value: `fentry`, or a variant of it with settings
/// (`fentry/accept_wait=false`), which the bench measures as a mode of its own.
pub(super) fn hook_mode_of(mode: &str) -> &str {
    mode.split('/').next().unwrap_or(mode)
}

/// The daemon flags of a variant's settings: `accept_wait=false` is `--accept-wait false`.
fn variant_flags(mode: &str) -> Vec<String> {
    let settings: Vec<String> = mode.split('/').skip(1).map(str::to_owned).collect();
    settings_flags(&settings)
}

/// The daemon flags of `KEY=VALUE` settings (a bare `KEY` is `KEY=true`).
pub(super) fn settings_flags(settings: &[String]) -> Vec<String> {
    settings
        .iter()
        .flat_map(|setting| {
            let (key, value) = setting.split_once('=').unwrap_or((setting, "true"));
            [format!("--{}", key.replace('_', "-")), value.to_owned()]
        })
        .collect()
}

/// A daemon in `mode` (with a variant's settings), its startup done; None (said on the
/// console) if it refused.
fn daemon(mode: &str) -> Result<Option<Daemon>> {
    let flags = variant_flags(mode);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    match Daemon::start(hook_mode_of(mode), &flags)? {
        Ok(d) => {
            // Its startup scan and first samples; idle guest time costs no host time.
            thread::sleep(Duration::from_secs(2));
            Ok(Some(d))
        }
        Err(why) => {
            note(mode, format!("backlogd refused --hook-mode {mode}: {why}"));
            Ok(None)
        }
    }
}

/// Idle guest time before each loop: timers, RCU callbacks and a running daemon's
/// periodic work settle outside the loop (with `sleep=off` idle time costs no host time).
pub(super) const SETTLE: Duration = Duration::from_millis(1500);

/// The daemon's process stopped (SIGSTOP) for as long as this lives, resumed on drop:
/// its programs stay attached and run, its own periodic work (samples every second,
/// sweeps of the attempts map) waits, so it does not land in a loop at random. The
/// syscall-free loop runs with the daemon running and measures that work instead.
struct Paused(u32);

impl Paused {
    fn new(pid: u32) -> Result<Self> {
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(pid as i32, libc::SIGSTOP) };
        // Stopped once every thread is ('T' in /proc/PID/task/*/stat).
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let all_stopped = std::fs::read_dir(format!("/proc/{pid}/task"))?
                .filter_map(|t| t.ok())
                .all(|t| {
                    std::fs::read_to_string(t.path().join("stat")).is_ok_and(|st| {
                        st.rsplit_once(") ")
                            .is_some_and(|(_, rest)| rest.starts_with('T'))
                    })
                });
            if all_stopped {
                return Ok(Self(pid));
            }
            if Instant::now() > deadline {
                bail!("the daemon (pid {pid}) did not stop within 10 s of SIGSTOP");
            }
            thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Paused {
    fn drop(&mut self) {
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(self.0 as i32, libc::SIGCONT) };
    }
}

/// A sysctl set for as long as this lives, put back on drop.
struct Sysctl {
    path: &'static str,
    previous: String,
}

impl Sysctl {
    fn set(path: &'static str, value: &str) -> Result<Self> {
        let previous = std::fs::read_to_string(path).with_context(|| format!("reading {path}"))?;
        std::fs::write(path, value).with_context(|| format!("writing {path}"))?;
        Ok(Self { path, previous })
    }
}

impl Drop for Sysctl {
    fn drop(&mut self) {
        let _ = std::fs::write(self.path, self.previous.trim());
    }
}

/// Everything the guest measures in `mode`: `runs` runs alternating without / with (run
/// 0 without, so there is one more without than with), then bpf_stats, then a profile.
/// `on_host`: run here instead of in a guest (`--guest host`): in a network namespace of
/// its own (loopback only, so nothing touches the host's), with the host's perf; the
/// clock is then real time.
pub fn in_guest(mode: &str, runs: usize, quick: bool, on_host: bool) -> Result<()> {
    if on_host {
        let _ = PERF_BIN.set(HOST_PERF);
        // The whole process (and the daemons it starts) in a fresh namespace: every
        // thread made from here on inherits it.
        // SAFETY: plain syscall; the process has one thread so far.
        check(
            unsafe { libc::unshare(libc::CLONE_NEWNET) },
            "unshare(CLONE_NEWNET)",
        )?;
        crate::run(Command::new("ip").args(["link", "set", "lo", "up"]))?;
    }
    let fixtures = Fixtures::new()?;
    let n = |e: Event| e.count(quick);
    // Warm-up: the first loops after boot fault pages in and grow slabs.
    for event in Event::ALL {
        fixtures.run(event, n(event) / 10)?;
    }
    for run in 0..runs {
        let with = run % 2 == 1;
        let d = if with {
            match daemon(mode)? {
                Some(d) => Some(d),
                None => return Ok(()),
            }
        } else {
            None
        };
        for event in Event::ALL {
            thread::sleep(SETTLE);
            let paused = match &d {
                Some(d) if event != Event::Spin => Some(Paused::new(d.proc.pid)?),
                _ => None,
            };
            let (ns, checks) = fixtures.run(event, n(event))?;
            drop(paused);
            say(Line::Loop {
                mode: mode.into(),
                run,
                with,
                event,
                n: n(event),
                ns,
            });
            for (what, expected, got) in checks {
                say(Line::Check {
                    mode: mode.into(),
                    event,
                    what,
                    expected,
                    got,
                });
            }
        }
        if let Some(d) = d {
            if let Ok(complaints) = d.proc.complaints.lock()
                && !complaints.is_empty()
            {
                note(mode, format!("the daemon said: {}", complaints.join(" / ")));
            }
            drop(d);
            // Its programs are freed after it exits (RCU, deferred work).
            thread::sleep(Duration::from_secs(1));
        }
    }
    program_stats(mode, &fixtures, quick)?;
    profile(mode, &fixtures, quick)
}

/// One run with bpf_stats on: each program's runs and run time per loop.
fn program_stats(mode: &str, fixtures: &Fixtures, quick: bool) -> Result<()> {
    let stats = BpfStats::enable()?;
    let Some(d) = daemon(mode)? else {
        return Ok(());
    };
    let names = procs::prog_names()?;
    for event in Event::ALL {
        let n = event.count(quick);
        let before = d.proc.prog_stats()?;
        fixtures.run(event, n)?;
        let after = d.proc.prog_stats()?;
        for (id, a) in &after {
            let b = before.get(id).copied().unwrap_or_default();
            if a.run_cnt == b.run_cnt {
                continue;
            }
            say(Line::Prog {
                mode: mode.into(),
                event,
                n,
                name: names
                    .get(id)
                    .map_or_else(|| format!("id{id}"), |p| p.0.clone()),
                runs: a.run_cnt - b.run_cnt,
                run_ns: a.run_time_ns - b.run_time_ns,
            });
        }
    }
    drop(d);
    drop(stats);
    Ok(())
}

/// `perf record -a -e cpu-clock` (a sample every [`PROFILE_PERIOD`] instructions),
/// started with its events off and switched on by [`timed`] for the timed part of a loop
/// only (perf's control fifos), so the loop's setup, idle time and perf's own start and
/// end are not sampled.
struct Perf {
    child: std::process::Child,
    ctl: std::fs::File,
    ack: std::fs::File,
    data: String,
}

/// The profiler [`timed`] switches, while one records.
static PERF: std::sync::Mutex<Option<Perf>> = std::sync::Mutex::new(None);

impl Perf {
    fn start(data: &str) -> Result<()> {
        let (ctl_path, ack_path) = ("/tmp/perf-ctl.fifo", "/tmp/perf-ack.fifo");
        for fifo in [ctl_path, ack_path] {
            let _ = std::fs::remove_file(fifo);
            let c = std::ffi::CString::new(fifo)?;
            // SAFETY: a valid C string.
            check(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, "mkfifo")?;
        }
        // Read-write opens of a fifo do not wait for the other end.
        let open = |p: &str| std::fs::OpenOptions::new().read(true).write(true).open(p);
        let (ctl, ack) = (open(ctl_path)?, open(ack_path)?);
        let child = Command::new(perf_bin())
            .args(["record", "-a", "-e", "cpu-clock", "-c"])
            .arg(PROFILE_PERIOD.to_string())
            // Events off until enabled; a buffer big enough that perf need not wake to
            // drain it during a loop.
            .args(["-D", "-1", "-m", "2048", "-o", data])
            .arg(format!("--control=fifo:{ctl_path},{ack_path}"))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .context("starting perf record")?;
        *PERF.lock().unwrap_or_else(|e| e.into_inner()) = Some(Perf {
            child,
            ctl,
            ack,
            data: data.to_owned(),
        });
        // perf says nothing once it is ready; ask it something and wait for the answer.
        Self::switch(false)
    }

    /// Events on or off, if a profiler is recording; waits for perf's ack.
    fn switch(on: bool) -> Result<()> {
        use std::io::{Read as _, Write as _};
        let mut perf = PERF.lock().unwrap_or_else(|e| e.into_inner());
        let Some(perf) = perf.as_mut() else {
            return Ok(());
        };
        perf.ctl
            .write_all(if on { b"enable\n" } else { b"disable\n" })?;
        let mut ack = [0u8; 5];
        perf.ack
            .read_exact(&mut ack)
            .context("waiting for perf's ack")?;
        Ok(())
    }

    /// Stops the recording; (samples, symbol) of its report.
    fn finish() -> Result<Vec<(u64, String)>> {
        let Some(perf) = PERF.lock().unwrap_or_else(|e| e.into_inner()).take() else {
            bail!("no perf recording");
        };
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(perf.child.id() as i32, libc::SIGINT) };
        let out = perf.child.wait_with_output()?;
        // perf record ends a SIGINT run by raising the signal again once its data is out.
        if !(out.status.success() || out.status.signal() == Some(libc::SIGINT)) {
            bail!(
                "perf record failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).replace('\n', " / ")
            );
        }
        let report = output(Command::new(perf_bin()).args([
            "report",
            "-i",
            &perf.data,
            "--stdio",
            "--no-children",
            "--sort",
            "sym",
            "-n",
            "--percent-limit",
            "0",
        ]))?;
        let _ = std::fs::remove_file(&perf.data);
        Ok(report_symbols(&report))
    }
}

/// A profile of each loop, once without backlogd and once with it (its daemon paused
/// during the loop, as in the ratio runs): what each symbol takes per event, and so where
/// the instructions backlogd adds go. `net.core.bpf_jit_kallsyms=1` gives the JITed
/// programs their names.
fn profile(mode: &str, fixtures: &Fixtures, quick: bool) -> Result<()> {
    if !Path::new(perf_bin()).exists() {
        note(
            mode,
            format!(
                "no profile: no {} (Debian package linux-perf on the host)",
                perf_bin()
            ),
        );
        return Ok(());
    }
    const KALLSYMS: &str = "/proc/sys/net/core/bpf_jit_kallsyms";
    if !Path::new(KALLSYMS).exists() {
        note(
            mode,
            format!("no profile: this kernel has no {KALLSYMS} to name the JITed programs by"),
        );
        return Ok(());
    }
    let _kallsyms = Sysctl::set(KALLSYMS, "1")?;
    for with in [false, true] {
        let d = if with {
            match daemon(mode)? {
                Some(d) => Some(d),
                None => return Ok(()),
            }
        } else {
            None
        };
        for event in Event::ALL.into_iter().filter(|e| *e != Event::Spin) {
            let n = event.count(quick);
            thread::sleep(SETTLE);
            Perf::start(&format!("/tmp/perf-{}.data", event.name()))?;
            let paused = d.as_ref().map(|d| Paused::new(d.proc.pid)).transpose()?;
            let ran = fixtures.run(event, n);
            drop(paused);
            let symbols = Perf::finish()?;
            ran?;
            for (samples, sym) in symbols {
                say(Line::Profile {
                    mode: mode.into(),
                    with,
                    event,
                    n,
                    period: PROFILE_PERIOD,
                    samples,
                    sym,
                });
            }
        }
    }
    Ok(())
}

/// (samples, symbol) of each line of `perf report --stdio -n --sort sym`:
/// `    12.34%          1234  [k] bpf_prog_5a5b..._conn_request_enter`.
pub(super) fn report_symbols(report: &str) -> Vec<(u64, String)> {
    report
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .filter_map(|l| {
            let mut words = l.split_whitespace();
            words.next()?.strip_suffix('%')?;
            let samples = words.next()?.parse().ok()?;
            let _space = words.next()?; // [k] or [.]
            let sym: Vec<&str> = words.collect();
            (!sym.is_empty()).then(|| (samples, sym.join("_")))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_variant_is_its_hook_mode_with_daemon_flags() {
        assert_eq!(hook_mode_of("fentry/accept_wait=false"), "fentry");
        assert_eq!(hook_mode_of("kprobe"), "kprobe");
        assert_eq!(
            variant_flags("fentry/accept_wait=false"),
            ["--accept-wait", "false"]
        );
        assert!(variant_flags("tracepoint").is_empty());
    }

    use super::*;

    #[test]
    fn perf_report_lines_become_symbols() {
        let report = "# To display the perf.data header info, please use --header.\n\
                      #\n# Samples: 12K of event 'cpu-clock'\n\
                      # Overhead       Samples  Symbol\n\
                      # ........  ............  ......\n#\n\
                      \x20   12.34%          1234  [k] bpf_prog_5a5b_conn_request_enter\n\
                      \x20    0.50%            50  [.] main\n\
                      \x20    0.10%            10  [k] 0xffffffffc0001234\n\n";
        assert_eq!(
            report_symbols(report),
            [
                (1234, "bpf_prog_5a5b_conn_request_enter".to_owned()),
                (50, "main".to_owned()),
                (10, "0xffffffffc0001234".to_owned()),
            ]
        );
    }
}
