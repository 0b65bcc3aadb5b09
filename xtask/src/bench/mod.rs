//! `cargo xtask bench`: what backlogd costs, measured, printed as a markdown report and
//! written to target/bench/results.md. Figures only: nothing here passes or fails on a
//! timing, since the figures depend on the machine and on what else runs on it (the
//! report records both).
//!
//! Sections, in order: per-event cost of every eBPF program in each hook mode (kernel
//! bpf_stats); what every syscall on the host pays (the tp_btf `sys_exit` program of kprobe
//! and tracepoint modes); handshake capacity with and without the daemon (an
//! in-process loop, then nginx + wrk); traffic that never meets a listen queue (UDP and TCP
//! bulk over loopback); the daemon's CPU and memory under SYN load; how long a drop takes
//! to show; scrapes while a flood's connection attempts expire (the client-impact
//! sweep); scrape cost at scale (listeners and established connections), with `ss`/`nstat`
//! polling beside it; a bpftrace script on the same tracepoints.

mod bpftrace;
mod bystander;
mod capacity;
mod cost_table;
mod daemon_cost;
mod drop_latency;
mod guest;
mod guest_loops;
mod load;
mod nginx;
mod procs;
mod programs;
mod scale;
mod stats;
mod summary;
mod sweep;
mod syscalls;

use std::{
    collections::BTreeMap,
    process::Command,
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, anyhow, bail};

use load::{FullListener, Netns};
use procs::{BpfStats, Bpftrace, Daemon, Memory, Watched};

use self::{
    bpftrace::*, bystander::*, capacity::*, daemon_cost::*, drop_latency::*, nginx::*, programs::*,
    scale::*, stats::*, summary::*, sweep::*, syscalls::*,
};
use crate::setup::output;

/// Hook modes, best first (as `--hook-mode auto` tries them).
const MODES: &[&str] = &["fentry", "kprobe", "tracepoint"];

/// Client threads of every load: the CI machine has 2 CPUs.
const CLIENTS: usize = 2;

struct Params {
    cost_runs: usize,
    cost_secs: f64,
    capacity_pairs: usize,
    capacity_secs: f64,
    load_secs: f64,
    listeners: usize,
    established: usize,
    samples: usize,
    drop_samples: usize,
    idle_secs: f64,
    syscalls: usize,
}

const FULL: Params = Params {
    cost_runs: 3,
    cost_secs: 2.0,
    capacity_pairs: 5,
    capacity_secs: 3.0,
    load_secs: 5.0,
    listeners: 10_000,
    established: 100_000,
    samples: 20,
    drop_samples: 7,
    idle_secs: 10.0,
    syscalls: 5_000_000,
};

const QUICK: Params = Params {
    cost_runs: 1,
    cost_secs: 1.0,
    capacity_pairs: 2,
    capacity_secs: 1.0,
    load_secs: 2.0,
    listeners: 2_000,
    established: 20_000,
    samples: 5,
    drop_samples: 3,
    idle_secs: 5.0,
    syscalls: 1_000_000,
};

/// First port of the scale test's listeners; the namespace's ephemeral range ends below.
const SCALE_PORT: u16 = 33_000;
/// First port of the listeners that hold the established connections.
const ESTABLISHED_PORT: u16 = 60_000;
const ESTABLISHED_LISTENERS: u16 = 8;

/// The figures the issue sets targets for, filled in by the sections that measure them,
/// with what they are compared with (bpftrace, the rates without backlogd, `ss` polling).
#[derive(Default)]
struct Targets {
    per_syn_ns: Option<f64>,
    per_handshake_ns: Option<f64>,
    /// The mode of the two figures above: the best the kernel runs.
    per_event_mode: Option<String>,
    bpftrace_per_syn_ns: Option<f64>,
    bpftrace_per_handshake_ns: Option<f64>,
    capacity: Option<Ratio>,
    bpftrace_capacity: Option<Ratio>,
    /// nginx + wrk requests/s with / without.
    nginx: Option<Ratio>,
    cpu_10k: Option<(f64, f64, f64)>,
    /// (listeners, median ms)
    scrape_ms: Option<(usize, f64)>,
    /// (established connections, median ms)
    scrape_established_ms: Option<(usize, f64)>,
    /// `ss -ltn` in the same namespace with the listeners: what a user would poll.
    ss_poll_ms: Option<f64>,
    series_per_listener: Option<f64>,
    drop_visible_ms: Option<(f64, f64)>,
    /// Per flow of the bystander section: its messages/s with / without.
    bystander: Vec<(&'static str, Ratio)>,
    /// Per flow: BPF ns per message in the mode `auto` picks.
    bystander_ns: Vec<(&'static str, f64)>,
    /// The mode `auto` picked for the real-time pairs (nginx, bystander).
    host_mode: Option<String>,
    /// Per mode: ns per `getppid()` without and with backlogd (syscalls section).
    syscall_ns: Vec<(String, f64, f64)>,
}

#[derive(Default)]
struct Report {
    md: String,
    targets: Targets,
    /// `git describe` of the tree and the date of the run.
    commit: String,
    date: String,
    /// Where in `md` the summary goes: after the machine table.
    summary_at: usize,
    /// The host's CPU model, as /proc/cpuinfo names it.
    cpu: String,
}

impl Report {
    fn line(&mut self, s: impl AsRef<str>) {
        self.md.push_str(s.as_ref());
        self.md.push('\n');
    }

    fn table(&mut self, headers: &[&str], rows: &[Vec<String>]) {
        self.line(format!("| {} |", headers.join(" | ")));
        self.line(format!("|{}", "---|".repeat(headers.len())));
        for row in rows {
            self.line(format!("| {} |", row.join(" | ")));
        }
        self.line("");
    }
}

pub use guest::{Options as GuestOptions, run as guest};
pub use guest_loops::in_guest;
pub use load::hold;

/// The report's sections: (name for `--section`, title).
const SECTIONS: [(&str, &str); 10] = [
    ("programs", "Per-event cost of the eBPF programs"),
    ("syscalls", "Cost on every syscall"),
    ("capacity", "Connection-rate capacity"),
    (
        "nginx",
        "Connection-rate capacity of a real server: nginx and wrk",
    ),
    ("bystander", "Traffic that never meets a listen queue"),
    ("daemon", "Daemon CPU and memory under SYN load"),
    ("drop", "From a drop to /metrics and the JSON API"),
    (
        "sweep",
        "Scrapes while a flood's connection attempts expire (client-impact sweep)",
    ),
    ("scale", "Scale: listeners and established connections"),
    ("bpftrace", "bpftrace on the same tracepoints"),
];

/// `only`: section names to run (all when empty); `with`: settings every daemon takes.
pub fn run(quick: bool, only: &[String], with: &[String]) -> Result<()> {
    // SAFETY: plain libc call.
    if unsafe { libc::geteuid() } != 0 {
        bail!("cargo xtask bench loads eBPF programs and makes network namespaces: run it as root");
    }
    if let Some(unknown) = only.iter().find(|o| !SECTIONS.iter().any(|(n, _)| n == o)) {
        let names: Vec<&str> = SECTIONS.iter().map(|(n, _)| *n).collect();
        bail!(
            "--section {unknown}: no such section. Fix: one of {}",
            names.join(", ")
        );
    }
    if let Some(bad) = with.iter().find(|w| !w.contains('=') || w.starts_with('=')) {
        bail!(
            "--with {bad}: not a setting. Fix: KEY=VALUE, a key of backlogd's config (syscall_hook=false)"
        );
    }
    procs::set_daemon_settings(with.to_vec());
    let p = if quick { &QUICK } else { &FULL };
    let started = Instant::now();
    let mut r = Report::default();
    machine(&mut r, quick)?;

    let ns = Netns::new()?;
    ns.sysctl("net.ipv4.ip_local_port_range", "1024 65535");
    for (name, title) in SECTIONS {
        if !only.is_empty() && !only.iter().any(|o| o == name) {
            continue;
        }
        section(&mut r, title, |r| match name {
            "programs" => program_cost(p, &ns, r),
            "syscalls" => syscall_overhead(p, r),
            "capacity" => capacity(p, &ns, r),
            "nginx" => nginx_capacity(p, &ns, r),
            "bystander" => bystander(p, &ns, r),
            "daemon" => daemon_cost(p, &ns, r),
            "drop" => drop_latency(p, &ns, r),
            "sweep" => sweep_cost(p, &ns, r),
            "scale" => scale(p, r),
            _ => bpftrace(p, &ns, r),
        });
    }
    drop(ns);
    // Only a whole run is the next one's "previous run".
    summary(&mut r, !quick && only.is_empty())?;
    r.line(format!(
        "Whole run: {:.0} s; load average at the end: {}.",
        started.elapsed().as_secs_f64(),
        loadavg()
    ));

    let dir = crate::workspace_root().join("target/bench");
    std::fs::create_dir_all(&dir)?;
    let path = dir.join("results.md");
    std::fs::write(&path, &r.md).with_context(|| format!("writing {}", path.display()))?;
    println!("{}", r.md);
    eprintln!("bench: written to {}", path.display());
    Ok(())
}

/// Runs one section; a failure is reported in its place and the run goes on. A panic
/// counts as a failure: the suite's helpers the benchmark uses (`backlogd_tests`) panic
/// with context instead of returning errors.
fn section(r: &mut Report, title: &str, f: impl FnOnce(&mut Report) -> Result<()>) {
    eprintln!("bench: {title} (load {})", loadavg());
    r.line(format!("### {title}\n"));
    r.line(format!(
        "Load average at start: {}; other backlogd daemons running: {}.\n",
        loadavg(),
        procs::other_daemons(&[])
    ));
    let failure = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(r))) {
        Ok(Ok(())) => return,
        Ok(Err(e)) => format!("{e:#}"),
        Err(panic) => {
            let said = panic
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| panic.downcast_ref::<&str>().copied())
                .unwrap_or("(no message)");
            format!("panicked: {said}")
        }
    };
    eprintln!("bench: {title}: {failure}");
    r.line(format!("**Failed:** {failure}\n"));
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}

fn machine(r: &mut Report, quick: bool) -> Result<()> {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo")?;
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .and_then(|l| l.split_once(':'))
        .map_or("?", |(_, m)| m.trim());
    let cpus = thread::available_parallelism().map_or(0, |n| n.get());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")?;
    let mem_gib = std::fs::read_to_string("/proc/meminfo")?
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0 / 1024.0);
    let commit = output(
        Command::new("git")
            .args(["describe", "--always", "--dirty"])
            .current_dir(crate::workspace_root()),
    )
    .unwrap_or_default();
    let date = output(Command::new("date").args(["-u", "+%Y-%m-%d %H:%M UTC"])).unwrap_or_default();
    // The daemon is the suite's binary (`backlogd_tests::daemon::binary`): the release
    // build `cargo xtask bench` has just made, unless BACKLOGD_BIN names another.
    let backlogd = match std::env::var_os("BACKLOGD_BIN") {
        Some(bin) => format!("`{}` (BACKLOGD_BIN)", std::path::Path::new(&bin).display()),
        None => format!("{} (release build)", commit.trim()),
    };
    r.line(format!(
        "## `cargo xtask bench{}` results\n",
        if quick { " --quick" } else { "" }
    ));
    r.table(
        &["machine", ""],
        &[
            vec!["CPU".into(), format!("{model}, {cpus} CPUs")],
            vec!["memory".into(), format!("{mem_gib:.0} GiB")],
            vec!["kernel".into(), kernel.trim().into()],
            vec!["load average at start".into(), loadavg()],
            vec!["backlogd".into(), backlogd],
            vec![
                "daemon settings".into(),
                if procs::daemon_settings().is_empty() {
                    "defaults".to_owned()
                } else {
                    format!(
                        "`--with {}` (every daemon of the run)",
                        procs::daemon_settings().join(" --with ")
                    )
                },
            ],
            vec!["date".into(), date.trim().into()],
        ],
    );
    r.cpu = format!("{model}, {cpus} CPUs");
    r.commit = commit.trim().into();
    r.date = date.trim().into();
    r.summary_at = r.md.len();
    Ok(())
}
