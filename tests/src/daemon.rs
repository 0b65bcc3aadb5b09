//! The backlogd binary under test, as a child process.

use std::{
    io::{BufRead as _, BufReader},
    net::SocketAddr,
    path::PathBuf,
    process::{Child, Command, Output, Stdio},
    sync::{Arc, Mutex, OnceLock, mpsc},
    time::{Duration, Instant},
};

use crate::{Scrape, http};

/// Path of the binary under test: `BACKLOGD_BIN` (set by `cargo xtask test`), else the
/// workspace's release build.
pub fn binary() -> PathBuf {
    let path = std::env::var_os("BACKLOGD_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/release/backlogd")
        });
    assert!(
        path.exists(),
        "backlogd binary not found at {}: run the suite with `cargo xtask test`",
        path.display()
    );
    path
}

/// Hook mode every daemon of this run uses: `BACKLOGD_HOOK_MODE` (the qemu kernel matrix
/// runs the suite once per mode), else backlogd's own `auto` choice.
pub fn hook_mode() -> Option<String> {
    std::env::var("BACKLOGD_HOOK_MODE")
        .ok()
        .filter(|m| !m.is_empty())
}

/// `backlogd run EXTRA...` as the suite and the benchmarks start it: on a free loopback
/// port unless `extra` gives `--listen` (or a `--config` file that may), and never with
/// the host's /etc/backlogd/backlogd.toml: with its pin_dir a daemon of another build
/// would clear a production daemon's pins and detach its programs.
pub fn run_command(extra: &[&str]) -> Command {
    let mut command = Command::new(binary());
    command.arg("run");
    if !extra.contains(&"--listen") && !extra.contains(&"--config") {
        command.args(["--listen", "127.0.0.1:0"]);
    }
    if !extra.contains(&"--config") {
        command.args(["--config", "/dev/null"]);
    }
    command.args(extra);
    command
}

/// Runs `backlogd ARGS` to completion (for CLI and error-path tests).
pub fn run_to_end(args: &[&str]) -> Output {
    Command::new(binary())
        .args(args)
        .output()
        .expect("running backlogd")
}

pub struct Daemon {
    child: Child,
    pub addr: SocketAddr,
    log: Arc<Mutex<String>>,
}

impl Daemon {
    /// `backlogd run --listen 127.0.0.1:0`, waiting until it serves.
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    pub fn start_with(extra: &[&str]) -> Self {
        Self::start_env(extra, &[])
    }

    /// `backlogd run` with `extra` arguments (plus `--listen 127.0.0.1:0` unless they
    /// give one or a `--config` file that may) and environment, waiting until it serves.
    pub fn start_env(extra: &[&str], env: &[(&str, &str)]) -> Self {
        let mut command = Self::command(extra);
        command.envs(env.iter().copied());
        Self::spawn(command)
    }

    /// One default daemon (`start()`'s) for the tests of a suite that need nothing else of
    /// theirs: a start costs about 2 s in the kernel matrix's TCG guests, where the 61
    /// daemons of a cell spent 40% of its guest time starting. A test that shares it
    /// judges only its own listener, in a namespace of its own (every daemon sees every
    /// namespace, so a daemon of its own kept nothing of another test's out). What it does
    /// change: a test of the same binary that starts a daemon of its own after the shared
    /// one has two running (each counting everything; neither's figures are the other's).
    /// It lives as long as the test process and is stopped, and waited for, when that
    /// exits (an `atexit` hook: the next suite starts with it gone); if the process dies
    /// without exiting, a death signal set for the thread that started it, which never
    /// ends, stops it (libtest's own threads end with each test, and the signal follows
    /// the thread). A start that fails fails every test that asks, at once.
    pub fn shared() -> &'static Daemon {
        static SHARED: OnceLock<Result<Daemon, String>> = OnceLock::new();
        let started = SHARED.get_or_init(|| {
            let (tx, rx) = mpsc::channel();
            std::thread::spawn(move || {
                let mut command = Self::command(&[]);
                // SAFETY: prctl is async-signal-safe and touches only the child.
                unsafe {
                    std::os::unix::process::CommandExt::pre_exec(&mut command, || {
                        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
                        Ok(())
                    });
                }
                let daemon =
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| Self::spawn(command)))
                        .map_err(|e| {
                            e.downcast_ref::<String>()
                                .cloned()
                                .unwrap_or_else(|| "its start panicked".into())
                        });
                if let Ok(daemon) = &daemon {
                    SHARED_PID.store(daemon.pid() as i32, std::sync::atomic::Ordering::SeqCst);
                    // SAFETY: registers a plain extern "C" function, once.
                    unsafe { libc::atexit(stop_shared) };
                }
                tx.send(daemon).ok();
                loop {
                    std::thread::park();
                }
            });
            rx.recv()
                .unwrap_or_else(|_| Err("its starting thread ended".into()))
        });
        started
            .as_ref()
            .unwrap_or_else(|e| panic!("the suite's shared daemon did not start: {e}"))
    }

    /// The daemon run by `wrapper` (a program and its arguments, to which backlogd's own
    /// command line is appended), e.g. to start it in namespaces of its own.
    pub fn start_wrapped(wrapper: &[&str], extra: &[&str]) -> Self {
        let inner = Self::command(extra);
        let mut command = Command::new(wrapper[0]);
        command
            .args(&wrapper[1..])
            .arg(inner.get_program())
            .args(inner.get_args());
        Self::spawn(command)
    }

    fn command(extra: &[&str]) -> Command {
        let mut command = run_command(extra);
        if let Some(mode) = hook_mode().filter(|_| !extra.contains(&"--hook-mode")) {
            command.args(["--hook-mode", &mode]);
        }
        command
    }

    fn spawn(mut command: Command) -> Self {
        let mut child = command
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .env("NO_COLOR", "1")
            .spawn()
            .expect("starting backlogd");
        let log = Arc::new(Mutex::new(String::new()));
        let (addr_tx, addr_rx) = mpsc::channel();
        let stderr = child.stderr.take().expect("piped stderr");
        let sink = log.clone();
        // The kernel matrix's guests ask for a copy on disk: a suite stuck for minutes
        // gets the daemons' last lines printed by the guest's watchdog (vm/image.rs).
        let mut mirror = std::env::var_os("BACKLOGD_TEST_LOG_DIR").and_then(|dir| {
            std::fs::File::create(
                std::path::Path::new(&dir).join(format!("backlogd-{}.log", child.id())),
            )
            .ok()
        });
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(file) = mirror.as_mut() {
                    use std::io::Write as _;
                    let _ = writeln!(file, "{line}");
                }
                if let Some(addr) = line
                    .split("serving metrics on http")
                    .nth(1)
                    .and_then(|rest| rest.trim_start_matches('s').strip_prefix("://"))
                    .and_then(|rest| rest.split('/').next())
                    .and_then(|a| a.parse::<SocketAddr>().ok())
                {
                    addr_tx.send(addr).ok();
                }
                let mut log = sink.lock().unwrap();
                log.push_str(&line);
                log.push('\n');
            }
        });
        let addr = match addr_rx.recv_timeout(Duration::from_secs(30)) {
            Ok(addr) => addr,
            Err(_) => {
                let status = child.try_wait();
                panic!(
                    "backlogd did not start serving within 30 s (exit: {status:?}); log:\n{}",
                    log.lock().unwrap()
                );
            }
        };
        Self { child, addr, log }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn signal(&self, signal: i32) {
        // SAFETY: plain kill(2) on our own child's pid.
        assert_eq!(
            unsafe { libc::kill(self.child.id() as i32, signal) },
            0,
            "kill"
        );
    }

    /// Waits up to `limit` for the daemon to exit; its status, or None if still running.
    pub fn wait_exit(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + limit;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Waits up to 10 s for a log line containing `needle`; panics with the log otherwise.
    pub fn wait_for_log(&self, needle: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(line) = self.log().lines().find(|l| l.contains(needle)) {
                return line.to_owned();
            }
            if Instant::now() > deadline {
                panic!(
                    "no log line containing {needle:?} within 10 s; log:\n{}",
                    self.log()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGKILL, no chance to clean up.
    pub fn kill_hard(mut self) {
        self.child.kill().expect("SIGKILL");
        self.child.wait().expect("reaping backlogd");
    }

    /// Runs of the daemon's BPF programs the kernel skipped (sum of `recursion_misses` over
    /// its program fds). kprobe and classic-tracepoint programs share a per-CPU guard with
    /// each other and with BPF map syscalls; a skipped run is an event backlogd never saw.
    /// (Kernels count these skips for trampolines from 5.12, for kprobes from 6.7.)
    pub fn missed_runs(&self) -> u64 {
        self.program_misses().total()
    }

    /// Runs of each of the daemon's programs the kernel skipped so far: the start of an
    /// interval for [`crate::Exact::interval`].
    pub fn program_misses(&self) -> ProgramMisses {
        let pid = self.pid();
        ProgramMisses(program_misses_of(pid).unwrap_or_else(|e| panic!("/proc/{pid}/fdinfo: {e}")))
    }

    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// `GET path`, returning (status, body).
    pub fn get(&self, path: &str) -> (u16, String) {
        http::get(self.addr, path)
    }

    /// The listener with socket inode `inode` in `/api/v1/snapshot` (what `top` and
    /// `doctor` read), whole; panics with the snapshot if it is not there.
    pub fn api_listener(&self, inode: u64) -> serde_json::Value {
        let snapshot = self.api_snapshot();
        snapshot["listeners"]
            .as_array()
            .expect("listeners")
            .iter()
            .find(|l| l["inode"] == inode)
            .unwrap_or_else(|| panic!("listener {inode} not in {snapshot}"))
            .clone()
    }

    /// `backlogd ARGS --api ADDR` (a client command against this daemon): its stdout.
    /// A command that printed nothing and failed panics with its stderr (`doctor` exits
    /// non-zero with findings, and prints them).
    pub fn cli(&self, args: &[&str]) -> String {
        let addr = self.addr.to_string();
        let out = run_to_end(&[args, &["--api", &addr]].concat());
        assert!(
            out.status.success() || !out.stdout.is_empty(),
            "backlogd {args:?} failed ({}) and printed nothing: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `/api/v1/snapshot`, parsed.
    pub fn api_snapshot(&self) -> serde_json::Value {
        let (status, body) = self.get("/api/v1/snapshot");
        assert_eq!(status, 200, "{body}");
        serde_json::from_str(&body).expect("snapshot JSON")
    }

    /// The hook mode the daemon reports, or None if it cannot be scraped (for failure
    /// reports, which must not fail themselves).
    pub fn try_hook_mode(&self) -> Option<String> {
        let (status, body) = http::try_get(self.addr, "/metrics").ok()?;
        if status != 200 {
            return None;
        }
        std::panic::catch_unwind(|| Scrape::parse(&body).hook_mode()).ok()
    }

    pub fn scrape(&self) -> Scrape {
        let (status, body) = self.get("/metrics");
        assert_eq!(status, 200, "GET /metrics: {body}");
        Scrape::parse(&body)
    }

    /// Waits for a scrape whose scan pass began after `since` and returns it: the queues'
    /// lengths now (`backlogd_listen_{accept,syn}_queue_length`) are that pass's. The page says
    /// how long ago the pass ended (its age, as it is rendered) and how long it took; both
    /// together, against the time from `since` to the request (less than to the render),
    /// put its start after `since`.
    pub fn scrape_after(&self, since: Instant) -> Scrape {
        loop {
            let before_request = since.elapsed().as_secs_f64();
            let s = self.scrape();
            let age = s.value("backlogd_syn_queue_read_age_seconds", &[]);
            let took = s.value("backlogd_syn_queue_read_duration_seconds", &[]);
            match (age, took) {
                (Some(age), Some(took)) if age + took < before_request => return s,
                (Some(_), Some(_)) => {}
                _ => panic!("no scan pass on the page:\n{}", s.text),
            }
            assert!(
                since.elapsed() < Duration::from_secs(10),
                "no scan pass began within 10 s:\n{}",
                s.text
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits until the daemon reports the listener with socket inode `inode`.
    pub fn wait_for_listener(&self, inode: u64) {
        let inode = inode.to_string();
        self.wait_for(&format!("listener {inode}"), |s| {
            s.value("backlogd_listen_backlog_granted", &[("socket", &inode)])
                .map(|_| ())
        });
    }

    /// Waits until every connection attempt with a drop is resolved (queued for accept, or
    /// past its horizon and counted abandoned): a sweep of the attempts map that began
    /// after this call found none left. Call it after the last drop of interest; returns
    /// that scrape. (The tracked gauge alone is as of the last sweep, which may predate
    /// the drops.) See [`began_after`].
    pub fn attempts_resolved(&self) -> Scrape {
        let sweeps = |s: &Scrape| s.value("backlogd_client_impact_sweeps_total", &[]);
        let since = sweeps(&self.scrape()).expect("backlogd_client_impact_sweeps_total");
        // The suites' horizons are at most 8 s and their sweeps 1 s apart: the attempts
        // still in flight expire, then two sweeps end.
        let within = Duration::from_secs(20);
        self.wait_for_within("every attempt completed or past its horizon", within, |s| {
            (began_after(sweeps(s)?, since)
                && s.value("backlogd_client_impact_tracked", &[]) == Some(0.0))
            .then(|| s.clone())
        })
    }

    /// Scrapes until `f` returns `Some`, for up to 10 s; panics with the last scrape and
    /// the daemon's log otherwise.
    pub fn wait_for<T>(&self, what: &str, f: impl Fn(&Scrape) -> Option<T>) -> T {
        self.wait_for_within(what, Duration::from_secs(10), f)
    }

    /// [`wait_for`](Self::wait_for) for up to `within`.
    pub fn wait_for_within<T>(
        &self,
        what: &str,
        within: Duration,
        f: impl Fn(&Scrape) -> Option<T>,
    ) -> T {
        let deadline = Instant::now() + within;
        loop {
            let scrape = self.scrape();
            if let Some(v) = f(&scrape) {
                return v;
            }
            if Instant::now() > deadline {
                panic!(
                    "timed out waiting for {what}; last scrape:\n{}\nlog:\n{}",
                    scrape.text,
                    self.log()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// The shared daemon's pid, for [`stop_shared`].
static SHARED_PID: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

/// At the test process's exit: the shared daemon stopped as `Drop` stops a test's own.
extern "C" fn stop_shared() {
    let pid = SHARED_PID.load(std::sync::atomic::Ordering::SeqCst);
    if pid > 0 {
        stop(pid);
    }
}

/// SIGTERM to our child `pid`, up to 5 s for it to exit, then SIGKILL; reaped either way.
fn stop(pid: i32) {
    // SAFETY: kill(2) and waitpid(2) on our own child.
    unsafe {
        libc::kill(pid, libc::SIGTERM);
        for _ in 0..250 {
            if libc::waitpid(pid, std::ptr::null_mut(), libc::WNOHANG) != 0 {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        libc::kill(pid, libc::SIGKILL);
        libc::waitpid(pid, std::ptr::null_mut(), 0);
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        stop(self.child.id() as i32);
    }
}

/// Runs of process `pid`'s BPF programs the kernel skipped (`recursion_misses` in their
/// fdinfo; 0 where the kernel does not count them), each program counted once.
pub fn missed_runs_of(pid: u32) -> std::io::Result<u64> {
    Ok(program_misses_of(pid)?.values().sum())
}

/// `recursion_misses` of each of process `pid`'s programs, by program id. The daemon may
/// hold several fds of one program (its own and its links'): each program counts once.
fn program_misses_of(pid: u32) -> std::io::Result<std::collections::BTreeMap<u64, u64>> {
    let field = |info: &str, name: &str| -> Option<u64> {
        info.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|n| n.trim().parse().ok())
    };
    Ok(std::fs::read_dir(format!("/proc/{pid}/fdinfo"))?
        .flatten()
        .filter_map(|fd| std::fs::read_to_string(fd.path()).ok())
        .filter_map(|info| {
            Some((
                field(&info, "prog_id:")?,
                field(&info, "recursion_misses:")?,
            ))
        })
        .collect())
}

/// Skipped runs per program id at one moment (see [`Daemon::program_misses`]).
#[derive(Debug, Clone, Default)]
pub struct ProgramMisses(pub std::collections::BTreeMap<u64, u64>);

impl ProgramMisses {
    pub fn total(&self) -> u64 {
        self.0.values().sum()
    }

    /// The runs skipped since `start`, by program id, where any were.
    pub fn since(&self, start: &ProgramMisses) -> Vec<(u64, u64)> {
        self.0
            .iter()
            .map(|(id, n)| (*id, n.saturating_sub(start.0.get(id).copied().unwrap_or(0))))
            .filter(|(_, n)| *n > 0)
            .collect()
    }
}

/// The names backlogd gives the program with kernel id `id` (`names::program`), from the
/// kernel's own name for it, which keeps 15 characters: several of backlogd's names share
/// those (reqsk_queue_add_exit, _kprobe and _kretprobe), so all that match are returned.
pub fn program_names(id: u64) -> Vec<&'static str> {
    let info = crate::bpf::bpftool(&["prog", "show", "id", &id.to_string()]);
    let kernel = info["name"].as_str().unwrap_or_default().to_owned();
    backlogd_common::names::program::named_by_kernel(&kernel).collect()
}

/// Whether the sweep that made `backlogd_client_impact_sweeps_total` `now` began after a
/// scrape that showed `since`. A sweep reads the attempts map before it publishes its
/// count, so the next one (`since + 1`) may have read it before that scrape; the one after
/// it began once that one had ended, after the scrape.
pub fn began_after(now: f64, since: f64) -> bool {
    now > since + 1.0
}
