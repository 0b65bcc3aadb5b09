//! The processes under measurement (backlogd, bpftrace): start, wait until ready, read
//! their CPU time, memory and BPF programs' run statistics; and a minimal HTTP client.

use std::{
    collections::BTreeMap,
    io::{BufRead as _, BufReader},
    net::SocketAddr,
    path::Path,
    process::{Child, Command, Stdio},
    sync::{Arc, Mutex, OnceLock, mpsc},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

use crate::setup::output;

/// A child process whose output is read line by line on a thread: kept in memory so a
/// failure can be reported with what the process said.
pub struct Watched {
    child: Child,
    pub pid: u32,
    lines: Mutex<mpsc::Receiver<String>>,
    /// Warnings and errors the process printed after it became ready.
    pub complaints: Arc<Mutex<Vec<String>>>,
}

impl Watched {
    /// Starts `cmd` and reads its stderr, and its stdout too if `from_stdout`.
    fn spawn(cmd: &mut Command, from_stdout: bool) -> Result<Self> {
        if from_stdout {
            cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        } else {
            cmd.stdout(Stdio::null()).stderr(Stdio::piped());
        }
        let mut child = cmd.spawn().with_context(|| format!("starting {cmd:?}"))?;
        let (tx, lines) = mpsc::channel();
        let complaints = Arc::new(Mutex::new(Vec::new()));
        let mut readers: Vec<Box<dyn std::io::Read + Send>> =
            vec![Box::new(child.stderr.take().expect("piped stderr"))];
        if let Some(out) = child.stdout.take() {
            readers.push(Box::new(out));
        }
        for r in readers {
            let tx = tx.clone();
            let complaints = Arc::clone(&complaints);
            thread::spawn(move || {
                for line in BufReader::new(r).lines().map_while(|l| l.ok()) {
                    let line = strip_ansi(&line);
                    if line.contains(" WARN ") || line.contains("ERROR") {
                        complaints.lock().expect("lock").push(line.clone());
                    }
                    // The receiver is gone once the process is ready; keep draining.
                    let _ = tx.send(line);
                }
            });
        }
        Ok(Self {
            pid: child.id(),
            child,
            lines: Mutex::new(lines),
            complaints,
        })
    }

    /// Waits for a line satisfying `ready`; Err(what the process said) if it exits first.
    fn wait_for<T>(
        &mut self,
        timeout: Duration,
        mut ready: impl FnMut(&str) -> Option<T>,
    ) -> Result<std::result::Result<T, String>> {
        let deadline = Instant::now() + timeout;
        let mut said = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.lock().expect("lock").recv_timeout(left) {
                Ok(line) => {
                    if let Some(t) = ready(&line) {
                        return Ok(Ok(t));
                    }
                    said.push(line);
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    let status = self.child.wait()?;
                    let last: Vec<&str> = said
                        .iter()
                        .rev()
                        .take(3)
                        .rev()
                        .map(|s| s.as_str())
                        .collect();
                    return Ok(Err(format!("exited ({status}): {}", last.join(" / "))));
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    bail!("not ready after {timeout:?}; it said: {}", said.join("\n"))
                }
            }
        }
    }

    pub fn cpu_seconds(&self) -> Result<f64> {
        cpu_seconds(self.pid)
    }

    pub fn memory(&self) -> Result<Memory> {
        memory(self.pid)
    }

    pub fn prog_stats(&self) -> Result<BTreeMap<u32, ProgStats>> {
        prog_stats(self.pid)
    }

    /// Ends the process with `signal`, then SIGKILL if it has not exited within 10 s.
    pub fn stop(&mut self, signal: i32) {
        // SAFETY: plain syscall; pid is our own child, not yet reaped.
        unsafe { libc::kill(self.pid as i32, signal) };
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.stop(libc::SIGTERM);
        }
    }
}

fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            // CSI sequences end with a letter.
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// A running backlogd, started with the suite's command line
/// ([`backlogd_tests::daemon::run_command`]) but not as the suite's
/// [`backlogd_tests::Daemon`], which panics when the daemon does not start: here a hook
/// mode this kernel refuses is a row of the report, not a failure. The process is watched
/// Settings every daemon of a host run takes (`cargo xtask bench --with KEY=VALUE`), as
/// `KEY=VALUE`; set once, before the first daemon starts.
static SETTINGS: OnceLock<Vec<String>> = OnceLock::new();

/// Gives every daemon this run starts `settings` (`syscall_hook=false`).
pub fn set_daemon_settings(settings: Vec<String>) {
    let _ = SETTINGS.set(settings);
}

/// The settings every daemon of this run takes, `KEY=VALUE` each.
pub fn daemon_settings() -> &'static [String] {
    SETTINGS.get().map_or(&[], Vec::as_slice)
}

/// `mode` as the report names what ran: with this run's settings after slashes
/// (`tracepoint/syscall_hook=false`), as the guest bench names a variant.
pub fn labelled(mode: &str) -> String {
    std::iter::once(mode.to_owned())
        .chain(daemon_settings().iter().cloned())
        .collect::<Vec<_>>()
        .join("/")
}

/// as bpftrace's is ([`Watched`]: CPU, memory, BPF run statistics, warnings it logs).
pub struct Daemon {
    pub proc: Watched,
    pub addr: SocketAddr,
}

impl Daemon {
    /// Starts `backlogd run --hook-mode mode EXTRA...` (the suite's binary, on a free
    /// port, never the host's config) and waits until it serves. Err(the daemon's own
    /// words) when it refuses to start (e.g. a hook mode this kernel lacks).
    pub fn start(mode: &str, extra: &[&str]) -> Result<std::result::Result<Self, String>> {
        let settings = super::guest_loops::settings_flags(daemon_settings());
        let args: Vec<&str> = ["--hook-mode", mode]
            .iter()
            .copied()
            .chain(extra.iter().copied())
            .chain(settings.iter().map(String::as_str))
            .collect();
        let mut cmd = backlogd_tests::daemon::run_command(&args);
        cmd.env("NO_COLOR", "1");
        let mut proc = Watched::spawn(&mut cmd, false)?;
        let ready = proc.wait_for(Duration::from_secs(60), |line| {
            let rest = line.split("serving metrics on http://").nth(1)?;
            rest.split('/').next()?.parse::<SocketAddr>().ok()
        })?;
        Ok(ready.map(|addr| Self { proc, addr }))
    }

    pub fn get(&self, path: &str) -> Result<(Duration, String)> {
        http_get(self.addr, path)
    }
}

/// A running bpftrace script.
pub struct Bpftrace {
    pub proc: Watched,
    /// From exec to every probe attached (parsing, LLVM, loading, attaching).
    pub startup: Duration,
}

/// bpftrace prints this line once every probe is attached when the variable of the same
/// name is set (its own runtime tests' hook; stderr in 0.17, stdout later: both are read).
/// "Attaching N probes..." comes before the attaching, and a SIGINT that arrives during it
/// is lost in 0.17: bpftrace then never exits.
const BPFTRACE_ATTACHED: &str = "__BPFTRACE_NOTIFY_PROBES_ATTACHED";

impl Bpftrace {
    pub fn start(script: &Path) -> Result<std::result::Result<Self, String>> {
        let started = Instant::now();
        let mut proc = Watched::spawn(
            Command::new("bpftrace")
                .arg(script)
                .env(BPFTRACE_ATTACHED, "1"),
            true,
        )?;
        let ready = proc.wait_for(Duration::from_secs(120), |l| {
            (l.trim() == BPFTRACE_ATTACHED).then_some(())
        })?;
        let startup = started.elapsed();
        Ok(ready.map(|()| Self { proc, startup }))
    }
}

/// utime + stime of a process (all its threads, exited ones included).
pub fn cpu_seconds(pid: u32) -> Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the parenthesised comm, which may contain spaces.
    let rest = stat
        .rsplit_once(") ")
        .context("unparsable /proc/PID/stat")?
        .1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of stat(5), i.e. 11 and 12 after comm.
    let ticks: u64 = f[11].parse::<u64>()? + f[12].parse::<u64>()?;
    // SAFETY: plain libc call.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    Ok(ticks as f64 / hz)
}

#[derive(Clone, Copy, Default)]
pub struct Memory {
    /// VmHWM: peak resident set, MiB.
    pub peak_mib: f64,
    /// VmRSS, MiB.
    pub rss_mib: f64,
}

pub fn memory(pid: u32) -> Result<Memory> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let field = |name: &str| -> Result<f64> {
        let line = status
            .lines()
            .find(|l| l.starts_with(name))
            .with_context(|| format!("no {name} in /proc/{pid}/status"))?;
        let kb: f64 = line
            .split_whitespace()
            .nth(1)
            .context("empty status line")?
            .parse()?;
        Ok(kb / 1024.0)
    };
    Ok(Memory {
        peak_mib: field("VmHWM:")?,
        rss_mib: field("VmRSS:")?,
    })
}

/// The kernel's run statistics of one BPF program.
#[derive(Clone, Copy, Default)]
pub struct ProgStats {
    pub run_time_ns: u64,
    pub run_cnt: u64,
    pub recursion_misses: u64,
}

/// Run statistics of every BPF program the process holds an fd of (from
/// /proc/PID/fdinfo, so a program counts once however many fds point at it).
pub fn prog_stats(pid: u32) -> Result<BTreeMap<u32, ProgStats>> {
    let mut progs = BTreeMap::new();
    for entry in std::fs::read_dir(format!("/proc/{pid}/fdinfo"))? {
        // An fd closed between listing and reading is no loss.
        let Ok(text) = std::fs::read_to_string(entry?.path()) else {
            continue;
        };
        let field = |name: &str| -> Option<u64> {
            text.lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.trim().parse().ok())
        };
        // Link fds name a prog_id too, but only program fds carry run_cnt.
        let (Some(id), Some(run_cnt)) = (field("prog_id:"), field("run_cnt:")) else {
            continue;
        };
        progs.insert(
            id as u32,
            ProgStats {
                run_time_ns: field("run_time_ns:").unwrap_or(0),
                run_cnt,
                recursion_misses: field("recursion_misses:").unwrap_or(0),
            },
        );
    }
    Ok(progs)
}

/// Names and types of the loaded BPF programs by id (`bpftool prog show`).
pub fn prog_names() -> Result<BTreeMap<u32, (String, String)>> {
    let json = output(Command::new("bpftool").args(["prog", "show", "--json"]))?;
    let progs: serde_json::Value = serde_json::from_str(&json).context("bpftool's JSON")?;
    Ok(progs
        .as_array()
        .context("bpftool prog show: not an array")?
        .iter()
        .filter_map(|p| {
            let id = p["id"].as_u64()? as u32;
            let name = p["name"].as_str().unwrap_or("?").to_owned();
            let kind = p["type"].as_str().unwrap_or("?").to_owned();
            Some((id, (name, kind)))
        })
        .collect())
}

/// `kernel.bpf_stats_enabled=1` for as long as this lives; the previous value is put back
/// on drop.
pub struct BpfStats {
    previous: String,
}

const BPF_STATS: &str = "/proc/sys/kernel/bpf_stats_enabled";

impl BpfStats {
    pub fn enable() -> Result<Self> {
        let previous = std::fs::read_to_string(BPF_STATS)
            .with_context(|| format!("reading {BPF_STATS}"))?
            .trim()
            .to_owned();
        std::fs::write(BPF_STATS, "1").with_context(|| format!("writing {BPF_STATS}"))?;
        Ok(Self { previous })
    }

    pub fn previous(&self) -> &str {
        &self.previous
    }
}

impl Drop for BpfStats {
    fn drop(&mut self) {
        if let Err(e) = std::fs::write(BPF_STATS, &self.previous) {
            eprintln!("bench: restoring {BPF_STATS} to {}: {e}", self.previous);
        }
    }
}

/// A reply buffer kept between GETs: a fresh one would charge the client's page faults
/// for up to 70 MB (35 on a 10k-listener page, doubled while growing) to the daemon.
static REPLY: Mutex<Vec<u8>> = Mutex::new(Vec::new());

/// GET as a scraper does it (HTTP/1.1, so the page comes chunked as it is rendered;
/// `Connection: close`), read into [`REPLY`]; returns the wall time from connect to the
/// last byte, and the body of a 200, decoded after the clock stops. Not the suite's
/// `http::get`: that reads into a new growing buffer and copies the body twice, which
/// took longer than the daemon's rendering on a 35 MB page (120 against 50 ms).
pub fn http_get(addr: SocketAddr, path: &str) -> Result<(Duration, String)> {
    use std::io::{Read as _, Write as _};

    let mut kept = REPLY.lock().unwrap_or_else(|e| e.into_inner());
    let reply: &mut Vec<u8> = &mut kept;
    // Zeroed before the clock starts; within it, only a page bigger than any before
    // grows the buffer.
    reply.resize(reply.capacity(), 0);
    let start = Instant::now();
    let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5))
        .with_context(|| format!("connect {addr}"))?;
    s.set_read_timeout(Some(Duration::from_secs(20)))?;
    s.write_all(&backlogd_tests::http::get_request(path, None, ""))?;
    let mut len = 0;
    loop {
        if reply.len() - len < 64 * 1024 {
            let more = reply.len().max(1 << 20);
            reply.resize(reply.len() + more, 0);
        }
        let n = s
            .read(&mut reply[len..])
            .with_context(|| format!("GET http://{addr}{path}"))?;
        if n == 0 {
            break;
        }
        len += n;
    }
    let took = start.elapsed();
    let parsed = backlogd_tests::http::Reply::parse(&reply[..len])
        .with_context(|| format!("GET http://{addr}{path}"))?;
    if parsed.status != 200 {
        bail!("GET {path}: status {}", parsed.status);
    }
    let body = parsed
        .complete_body()
        .map_err(|e| anyhow::anyhow!("GET http://{addr}{path}: {e}"))?;
    Ok((
        took,
        String::from_utf8(body).context("a body that is not UTF-8")?,
    ))
}

/// Pids of other backlogd daemons on the machine: their programs run on the same hooks
/// and add to every figure here, so the report says how many there were.
pub fn other_daemons(mine: &[u32]) -> usize {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return 0;
    };
    dir.filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| !mine.contains(pid))
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .map(|c| c.trim() == "backlogd")
                .unwrap_or(false)
        })
        .count()
}
