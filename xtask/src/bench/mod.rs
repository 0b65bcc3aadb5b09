//! `cargo xtask bench`: what backlogd costs, measured, printed as a markdown report and
//! written to target/bench/results.md. Figures only: nothing here passes or fails on a
//! timing, since the figures depend on the machine and on what else runs on it (the
//! report records both).
//!
//! Sections, in order: per-event cost of every eBPF program in each hook mode (kernel
//! bpf_stats); what every syscall on the host pays (the raw `sys_exit` accept hook and the
//! listen(2) syscall tracepoints); handshake capacity with and without the daemon; the daemon's CPU and memory
//! under SYN load; how long a drop takes to show; scrape cost at scale (listeners and
//! established connections), with `ss`/`nstat` polling beside it; a bpftrace script on
//! the same tracepoints.

mod load;
mod procs;

use std::{
    collections::BTreeMap,
    process::Command,
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, anyhow, bail};

use load::{FullListener, Netns};
use procs::{BpfStats, Bpftrace, Daemon, Memory, Watched};

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

/// The figures the issue sets targets for, filled in by the sections that measure them.
#[derive(Default)]
struct Targets {
    per_syn_ns: Option<f64>,
    per_handshake_ns: Option<f64>,
    capacity: Option<(f64, f64, f64)>,
    cpu_10k: Option<(f64, f64, f64)>,
    /// (listeners, median ms)
    scrape_ms: Option<(usize, f64)>,
    scrape_established_ms: Option<f64>,
    drop_visible_ms: Option<(f64, f64)>,
}

#[derive(Default)]
struct Report {
    md: String,
    targets: Targets,
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

pub use load::hold;

pub fn run(quick: bool) -> Result<()> {
    // SAFETY: plain libc call.
    if unsafe { libc::geteuid() } != 0 {
        bail!("cargo xtask bench loads eBPF programs and makes network namespaces: run it as root");
    }
    let p = if quick { &QUICK } else { &FULL };
    let started = Instant::now();
    let mut r = Report::default();
    machine(&mut r, quick)?;

    let ns = Netns::new("load")?;
    ns.sysctl("net.ipv4.ip_local_port_range", "1024 65535")?;
    section(&mut r, "Per-event cost of the eBPF programs", |r| {
        program_cost(p, &ns, r)
    });
    section(&mut r, "Cost on every syscall", |r| syscall_overhead(p, r));
    section(&mut r, "Connection-rate capacity", |r| capacity(p, &ns, r));
    section(&mut r, "Daemon CPU and memory under SYN load", |r| {
        daemon_cost(p, &ns, r)
    });
    section(&mut r, "From a drop to /metrics and the JSON API", |r| {
        drop_latency(p, &ns, r)
    });
    section(
        &mut r,
        "Scale: listeners and established connections",
        |r| scale(p, r),
    );
    section(&mut r, "bpftrace on the same tracepoints", |r| {
        bpftrace(p, &ns, r)
    });
    drop(ns);
    summary(&mut r);
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

/// Runs one section; a failure is reported in its place and the run goes on.
fn section(r: &mut Report, title: &str, f: impl FnOnce(&mut Report) -> Result<()>) {
    eprintln!("bench: {title} (load {})", loadavg());
    r.line(format!("### {title}\n"));
    r.line(format!(
        "Load average at start: {}; other backlogd daemons running: {}.\n",
        loadavg(),
        procs::other_daemons(&[])
    ));
    if let Err(e) = f(r) {
        eprintln!("bench: {title}: {e:#}");
        r.line(format!("**Failed:** {e:#}\n"));
    }
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
            vec![
                "backlogd".into(),
                format!("{} (release build)", commit.trim()),
            ],
            vec!["date".into(), date.trim().into()],
        ],
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Per-event cost

#[derive(Clone, Copy, PartialEq)]
enum Workload {
    /// Complete handshakes: the listener accepts and closes each connection.
    Handshakes,
    /// SYNs dropped at a listener whose accept queue is full.
    DroppedSyns,
}

impl Workload {
    fn unit(self) -> &'static str {
        match self {
            Self::Handshakes => "handshake",
            Self::DroppedSyns => "dropped SYN",
        }
    }

    fn describe(self) -> &'static str {
        match self {
            Self::Handshakes => {
                "complete handshakes on loopback, each accepted and closed (RST) at once"
            }
            Self::DroppedSyns => {
                "SYNs (non-blocking connect, closed at once) to a listener with backlog 1 \
                 and a full accept queue: every one is dropped as accept_queue_full"
            }
        }
    }
}

/// Per program, per run: (ns per run, runs per event); and per run the events/s and
/// the time of all programs per event.
struct WorkloadCost {
    workload: Workload,
    progs: BTreeMap<u32, Vec<(f64, f64)>>,
    misses: BTreeMap<u32, u64>,
    per_event_ns: Vec<f64>,
    rates: Vec<f64>,
}

fn measure_programs(
    p: &Params,
    ns: &Netns,
    proc: &Watched,
    full: &FullListener,
) -> Result<Vec<WorkloadCost>> {
    let secs = Duration::from_secs_f64(p.cost_secs);
    let mut out = Vec::new();
    for workload in [Workload::Handshakes, Workload::DroppedSyns] {
        let mut wc = WorkloadCost {
            workload,
            progs: BTreeMap::new(),
            misses: BTreeMap::new(),
            per_event_ns: Vec::new(),
            rates: Vec::new(),
        };
        for _ in 0..p.cost_runs {
            let before = proc.prog_stats()?;
            let (events, took) = match workload {
                Workload::Handshakes => load::handshakes(ns, CLIENTS, secs, None)?,
                Workload::DroppedSyns => full.syns(ns, CLIENTS, secs, None)?,
            };
            let after = proc.prog_stats()?;
            let mut total_ns = 0;
            for (id, a) in &after {
                let b = before.get(id).copied().unwrap_or_default();
                let runs = a.run_cnt - b.run_cnt;
                let ns_total = a.run_time_ns - b.run_time_ns;
                total_ns += ns_total;
                let per_run = if runs > 0 {
                    ns_total as f64 / runs as f64
                } else {
                    f64::NAN
                };
                wc.progs
                    .entry(*id)
                    .or_default()
                    .push((per_run, runs as f64 / events.max(1) as f64));
                *wc.misses.entry(*id).or_default() += a.recursion_misses - b.recursion_misses;
            }
            wc.per_event_ns.push(total_ns as f64 / events.max(1) as f64);
            wc.rates.push(events as f64 / took);
        }
        out.push(wc);
    }
    Ok(out)
}

fn render_costs(r: &mut Report, costs: &[WorkloadCost], names: &BTreeMap<u32, (String, String)>) {
    let ids: Vec<u32> = costs
        .iter()
        .flat_map(|c| c.progs.keys().copied())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    let mut headers = vec!["program".to_owned(), "type".to_owned()];
    for c in costs {
        headers.push(format!("ns/run ({}s)", c.workload.unit()));
        headers.push(format!("runs per {}", c.workload.unit()));
    }
    let mut rows = Vec::new();
    for id in ids {
        let (name, kind) = names
            .get(&id)
            .cloned()
            .unwrap_or_else(|| (format!("id {id}"), "?".into()));
        let mut row = vec![format!("`{name}`"), kind];
        for c in costs {
            let runs = c.progs.get(&id).cloned().unwrap_or_default();
            let per_run: Vec<f64> = runs.iter().map(|r| r.0).filter(|v| v.is_finite()).collect();
            let per_event: Vec<f64> = runs.iter().map(|r| r.1).collect();
            row.push(if per_run.is_empty() {
                "not run".into()
            } else {
                format!("{:.0}", median(&per_run))
            });
            row.push(format!("{:.2}", median(&per_event)));
        }
        rows.push(row);
    }
    let mut total = vec!["**all programs, per event**".to_owned(), String::new()];
    for c in costs {
        total.push(format!("**{:.0} ns**", median(&c.per_event_ns)));
        total.push(String::new());
    }
    rows.push(total);
    let headers: Vec<&str> = headers.iter().map(|s| s.as_str()).collect();
    r.table(&headers, &rows);
    for c in costs {
        let misses: u64 = c.misses.values().sum();
        r.line(format!(
            "- {}s: {}; {} run(s), median {:.0} events/s{}; all programs' time per {}: {}.",
            c.workload.unit(),
            c.workload.describe(),
            c.per_event_ns.len(),
            median(&c.rates),
            if misses > 0 {
                format!(", {misses} recursion misses (runs the kernel skipped)")
            } else {
                String::new()
            },
            c.workload.unit(),
            spread(&c.per_event_ns, "ns"),
        ));
    }
    r.line(
        "- A program with well under one run per event ran for the listeners' own setup \
         (listen(), close) or for unrelated traffic; its ns/run is that of those runs.",
    );
    r.line("");
}

fn program_cost(p: &Params, ns: &Netns, r: &mut Report) -> Result<()> {
    let stats = BpfStats::enable()?;
    r.line(format!(
        "Kernel `bpf_stats` (run_time_ns / run_cnt of each program, read from the daemon's \
         /proc/PID/fdinfo), {} run(s) of {} s per workload and mode, median shown; \
         {CLIENTS} client threads. `kernel.bpf_stats_enabled` was {} before and is put back \
         after. The figures include bpf_stats' own two clock reads per run, and runs for \
         any other traffic on the machine during the window (other engineers' test suites \
         run beside this one).\n",
        p.cost_runs,
        p.cost_secs,
        stats.previous()
    ));
    let full = FullListener::new(ns)?;
    for mode in MODES {
        eprintln!("bench: hook mode {mode}");
        match Daemon::start(mode, &[])? {
            Err(why) => r.line(format!(
                "**`--hook-mode {mode}`**: not supported by this kernel: {why}\n"
            )),
            Ok(d) => {
                let costs = measure_programs(p, ns, &d.proc, &full)?;
                let names = procs::prog_names()?;
                r.line(format!("**`--hook-mode {mode}`**\n"));
                render_costs(r, &costs, &names);
                for c in &costs {
                    let v = Some(median(&c.per_event_ns));
                    match c.workload {
                        Workload::DroppedSyns => r.targets.per_syn_ns = r.targets.per_syn_ns.or(v),
                        Workload::Handshakes => {
                            r.targets.per_handshake_ns = r.targets.per_handshake_ns.or(v)
                        }
                    }
                }
            }
        }
    }
    drop(stats);
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Syscalls

/// ns per `getppid()` in a tight loop, best of three runs of `n`.
fn ns_per_syscall(n: usize) -> f64 {
    (0..3)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..n {
                // SAFETY: getppid takes no arguments and cannot fail.
                unsafe { libc::syscall(libc::SYS_getppid) };
            }
            t.elapsed().as_nanos() as f64 / n as f64
        })
        .fold(f64::INFINITY, f64::min)
}

/// Every syscall on the host pays for the syscall tracepoints backlogd enables: the
/// listen(2) ones (a bitmap test per syscall) and, in tracepoint and kprobe modes, the raw
/// `sys_exit` program that sees accept() return (a run per syscall).
fn syscall_overhead(p: &Params, r: &mut Report) -> Result<()> {
    r.line(format!(
        "`getppid()` in a tight loop on one thread, best of 3 runs of {} calls, without \
         backlogd and with it in each mode (measured before and after, to show drift).\n",
        p.syscalls
    ));
    let before = ns_per_syscall(p.syscalls);
    let mut rows = vec![vec![
        "none (before)".to_owned(),
        format!("{before:.1}"),
        String::new(),
    ]];
    for mode in MODES {
        match Daemon::start(mode, &[])? {
            // The reason is quoted in full in the per-event section.
            Err(_) => rows.push(vec![
                (*mode).to_owned(),
                "not supported by this kernel".to_owned(),
                String::new(),
            ]),
            Ok(d) => {
                let with = ns_per_syscall(p.syscalls);
                rows.push(vec![
                    (*mode).to_owned(),
                    format!("{with:.1}"),
                    format!("{:+.1}", with - before),
                ]);
                drop(d);
            }
        }
    }
    let after = ns_per_syscall(p.syscalls);
    rows.push(vec![
        "none (after)".to_owned(),
        format!("{after:.1}"),
        format!("{:+.1}", after - before),
    ]);
    r.table(&["backlogd", "ns per syscall", "vs none"], &rows);
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Capacity

/// Alternating runs without and with what `attach` starts (dropped to detach); returns
/// the table rows and the ratios with/without in percent.
fn capacity_pairs<T>(
    p: &Params,
    ns: &Netns,
    mut attach: impl FnMut() -> Result<T>,
) -> Result<(Vec<Vec<String>>, Vec<f64>)> {
    let secs = Duration::from_secs_f64(p.capacity_secs);
    let mut without = Vec::new();
    // Warm-up: the first run after namespace creation is slower.
    load::handshakes(ns, CLIENTS, secs, None)?;
    let (mut rows, mut pct) = (Vec::new(), Vec::new());
    for i in 0..p.capacity_pairs {
        let mut pair = [0.0; 2];
        // Alternate which half goes first so drift in the machine's load cancels out.
        let order = if i % 2 == 0 {
            [false, true]
        } else {
            [true, false]
        };
        for with in order {
            let attached = if with { Some(attach()?) } else { None };
            let (n, took) = load::handshakes(ns, CLIENTS, secs, None)?;
            pair[usize::from(with)] = n as f64 / took;
            drop(attached);
        }
        let ratio = pair[1] / pair[0] * 100.0;
        pct.push(ratio);
        without.push(pair[0]);
        rows.push(vec![
            format!("{}", i + 1),
            format!("{:.0}", pair[0]),
            format!("{:.0}", pair[1]),
            format!("{ratio:.1}%"),
        ]);
    }
    // The runs without are the same load every time: if they differ much, something else
    // took the CPUs during the section, and the report must say so.
    let drift = max(&without) / min(&without);
    if drift > 1.1 {
        rows.push(vec![
            format!(
                "**note**: the runs without differ by {:.0}%: other work competed for the \
                 CPUs; treat these ratios with care",
                (drift - 1.0) * 100.0
            ),
            String::new(),
            String::new(),
            String::new(),
        ]);
    }
    Ok((rows, pct))
}

fn capacity(p: &Params, ns: &Netns, r: &mut Report) -> Result<()> {
    let mut mode = String::new();
    let (rows, pct) = capacity_pairs(p, ns, || {
        let d = Daemon::start("auto", &[])?.map_err(|e| anyhow!("backlogd did not start: {e}"))?;
        mode = hook_mode(&d).unwrap_or_default();
        // Let the startup scan finish before measuring.
        thread::sleep(Duration::from_millis(500));
        Ok(d)
    })?;
    r.line(format!(
        "Handshakes per second on loopback in a fresh network namespace: one thread accepts \
         and closes, {CLIENTS} threads connect and close (RST), {} s per run, {} pairs \
         alternating without/with backlogd (`--hook-mode auto`: {mode}), order swapped \
         every other pair. bpf_stats as before the benchmark.\n",
        p.capacity_secs, p.capacity_pairs
    ));
    r.table(
        &["pair", "without (handshakes/s)", "with", "with / without"],
        &rows,
    );
    r.line(format!("Ratio with/without: {}.\n", spread(&pct, "%")));
    r.targets.capacity = Some((median(&pct), min(&pct), max(&pct)));
    Ok(())
}

fn hook_mode(d: &Daemon) -> Result<String> {
    let (_, body) = d.get("/api/v1/snapshot")?;
    let v: serde_json::Value = serde_json::from_str(&body)?;
    Ok(v["hook_mode"].as_str().unwrap_or("?").to_owned())
}

// ---------------------------------------------------------------------------------------
// Daemon cost

struct UnderLoad {
    events: u64,
    secs: f64,
    cpu_pct: f64,
    memory: Memory,
}

/// Runs `load` while sampling the process; scrapes /metrics every second if `daemon`.
fn under_load(
    proc: &Watched,
    daemon: Option<&Daemon>,
    load: impl FnOnce() -> Result<(u64, f64)> + Send,
) -> Result<UnderLoad> {
    let cpu0 = proc.cpu_seconds()?;
    let start = Instant::now();
    let (events, secs) = thread::scope(|s| -> Result<(u64, f64)> {
        let worker = s.spawn(load);
        let mut next = Instant::now();
        while !worker.is_finished() {
            if let Some(d) = daemon
                && Instant::now() >= next
            {
                d.get("/metrics")?;
                next += Duration::from_secs(1);
            }
            thread::sleep(Duration::from_millis(20));
        }
        worker.join().map_err(|_| anyhow!("load panicked"))?
    })?;
    let wall = start.elapsed().as_secs_f64();
    let cpu = proc.cpu_seconds()? - cpu0;
    Ok(UnderLoad {
        events,
        secs,
        cpu_pct: cpu / wall * 100.0,
        memory: proc.memory()?,
    })
}

/// The loads of the daemon-cost table: (label, SYN rate, complete handshakes?).
const LOADS: &[(&str, Option<f64>, bool)] = &[
    ("handshakes at ~10k/s", Some(10_000.0), true),
    ("dropped SYNs at ~10k/s", Some(10_000.0), false),
    ("dropped SYNs at ~100k/s", Some(100_000.0), false),
    ("dropped SYNs, unpaced", None, false),
];

fn load_rows(
    p: &Params,
    ns: &Netns,
    proc: &Watched,
    daemon: Option<&Daemon>,
    full: &FullListener,
) -> Result<Vec<(&'static str, UnderLoad)>> {
    let secs = Duration::from_secs_f64(p.load_secs);
    let mut out = vec![(
        "idle",
        under_load(proc, daemon, || {
            thread::sleep(secs);
            Ok((0, p.load_secs))
        })?,
    )];
    for &(label, rate, handshakes) in LOADS {
        let u = under_load(proc, daemon, || {
            if handshakes {
                load::handshakes(ns, CLIENTS, secs, rate)
            } else {
                full.syns(ns, CLIENTS, secs, rate)
            }
        })?;
        out.push((label, u));
    }
    Ok(out)
}

fn render_load_rows(r: &mut Report, rows: &[(&str, UnderLoad)]) {
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|(label, u)| {
            vec![
                label.to_string(),
                format!("{:.0}", u.events as f64 / u.secs),
                format!("{:.2}%", u.cpu_pct),
                format!("{:.1}", u.memory.rss_mib),
                format!("{:.1}", u.memory.peak_mib),
            ]
        })
        .collect();
    r.table(
        &[
            "load",
            "achieved events/s",
            "CPU (% of one core)",
            "RSS MiB",
            "peak RSS MiB (VmHWM)",
        ],
        &rows,
    );
}

fn daemon_cost(p: &Params, ns: &Netns, r: &mut Report) -> Result<()> {
    let d = Daemon::start("auto", &[])?.map_err(|e| anyhow!("backlogd did not start: {e}"))?;
    let full = FullListener::new(ns)?;
    thread::sleep(Duration::from_secs(1));
    let rows = load_rows(p, ns, &d.proc, Some(&d), &full)?;
    r.line(format!(
        "backlogd `--hook-mode auto` ({}), {} s per load, {CLIENTS} client threads, \
         /metrics scraped every second throughout (a 1 s Prometheus, harsher than the usual \
         15 s). CPU is the daemon's utime+stime (/proc/PID/stat) over the wall time: its \
         userspace only; the eBPF programs run in the softirq of whoever sends, and their \
         cost is the previous sections'. \"dropped SYNs\" are bare SYNs to a full accept \
         queue (the drop path); \"handshakes\" complete and are accepted. Resolution: one \
         clock tick (10 ms) per window, i.e. {:.1}% of a core.\n",
        hook_mode(&d)?,
        p.load_secs,
        1.0 / p.load_secs,
    ));
    render_load_rows(r, &rows);
    if let Some((_, u)) = rows.iter().find(|(l, _)| *l == LOADS[0].0) {
        r.targets.cpu_10k = Some((u.cpu_pct, u.memory.rss_mib, u.memory.peak_mib));
    }
    complaints(r, &d.proc);
    Ok(())
}

fn complaints(r: &mut Report, proc: &Watched) {
    let said = proc.complaints.lock().expect("lock");
    if !said.is_empty() {
        r.line(format!(
            "The process logged {} warning(s)/error(s); first: `{}`\n",
            said.len(),
            said[0]
        ));
    }
}

// ---------------------------------------------------------------------------------------
// Drop latency

/// The listener's accept_queue_full drops as /metrics shows them.
fn metrics_drops(d: &Daemon, netns: u64, port: u16) -> Result<f64> {
    let (_, body) = d.get("/metrics")?;
    let (netns, port) = (format!("netns=\"{netns}\""), format!("port=\"{port}\""));
    Ok(body
        .lines()
        .filter(|l| l.starts_with("backlogd_listen_drops_total{"))
        .filter(|l| l.contains("reason=\"accept_queue_full\"") && l.contains(&netns))
        .filter(|l| l.contains(&port))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum())
}

/// The same from /api/v1/snapshot; None while the listener is not there.
fn snapshot_drops(d: &Daemon, netns: u64, port: u16) -> Result<Option<u64>> {
    let (_, body) = d.get("/api/v1/snapshot")?;
    let v: serde_json::Value = serde_json::from_str(&body)?;
    Ok(v["listeners"]
        .as_array()
        .context("snapshot without listeners")?
        .iter()
        .find(|l| l["netns"].as_u64() == Some(netns) && l["port"].as_u64() == Some(port.into()))
        .and_then(|l| l["drops"]["accept_queue_full"].as_u64()))
}

/// Polls `seen` until it is true; the time since `since`, or None after 5 s.
fn poll_until(since: Instant, mut seen: impl FnMut() -> Result<bool>) -> Result<Option<f64>> {
    while since.elapsed() < Duration::from_secs(5) {
        if seen()? {
            return Ok(Some(since.elapsed().as_secs_f64() * 1e3));
        }
    }
    Ok(None)
}

fn drop_latency(p: &Params, ns: &Netns, r: &mut Report) -> Result<()> {
    let d = Daemon::start("auto", &[])?.map_err(|e| anyhow!("backlogd did not start: {e}"))?;
    let full = FullListener::new(ns)?;
    let (netns, port) = (ns.inode()?, full.addr.port());
    let seen = poll_until(Instant::now(), || {
        Ok(snapshot_drops(&d, netns, port)?.is_some())
    })?;
    if seen.is_none() {
        bail!("the listener on port {port} did not appear in /api/v1/snapshot within 5 s");
    }
    let (mut metrics_ms, mut json_ms, mut lost) = (Vec::new(), Vec::new(), 0);
    for i in 0..p.drop_samples {
        let m0 = metrics_drops(&d, netns, port)?;
        let j0 = snapshot_drops(&d, netns, port)?.unwrap_or(0);
        let start = Instant::now();
        ns.scoped(|| {
            let before = load::tcp_ext_here("ListenOverflows")?;
            full.one_syn()?;
            // Loopback delivers the SYN in the sender's softirq: the drop has happened (and
            // is counted) by the time connect() returns; allow a little slack regardless.
            let deadline = Instant::now() + Duration::from_millis(100);
            while load::tcp_ext_here("ListenOverflows")? <= before {
                if Instant::now() > deadline {
                    bail!("the SYN was not dropped (ListenOverflows unchanged)");
                }
            }
            Ok(())
        })?;
        let (m, j) = thread::scope(|s| {
            let m = s.spawn(|| poll_until(start, || Ok(metrics_drops(&d, netns, port)? > m0)));
            let j = s.spawn(|| {
                poll_until(start, || {
                    Ok(snapshot_drops(&d, netns, port)?.unwrap_or(0) > j0)
                })
            });
            (m.join(), j.join())
        });
        let m = m.map_err(|_| anyhow!("poller panicked"))??;
        let j = j.map_err(|_| anyhow!("poller panicked"))??;
        match (m, j) {
            (Some(m), Some(j)) => {
                metrics_ms.push(m);
                json_ms.push(j);
            }
            _ => lost += 1,
        }
        // Spread the samples over the daemon's internal timers' phases.
        thread::sleep(Duration::from_millis(150 + (i as u64 * 97) % 200));
    }
    r.line(format!(
        "{} drops provoked one at a time (one SYN to a backlog-1 listener with a full \
         accept queue; the namespace's TcpExt ListenOverflows confirmed each), then \
         /metrics and /api/v1/snapshot polled back to back by two threads until the \
         listener's `accept_queue_full` count rose. Time from the connect() that caused \
         the drop to the first response showing it (so it includes one request's own \
         time).\n",
        p.drop_samples
    ));
    r.table(
        &["endpoint", "median", "max", "samples"],
        &[
            vec![
                "/metrics".into(),
                format!("{:.1} ms", median(&metrics_ms)),
                format!("{:.1} ms", max(&metrics_ms)),
                format!("{}", metrics_ms.len()),
            ],
            vec![
                "/api/v1/snapshot".into(),
                format!("{:.1} ms", median(&json_ms)),
                format!("{:.1} ms", max(&json_ms)),
                format!("{}", json_ms.len()),
            ],
        ],
    );
    if lost > 0 {
        r.line(format!("{lost} drop(s) did not show within 5 s.\n"));
    }
    if !metrics_ms.is_empty() {
        r.targets.drop_visible_ms = Some((
            max(&metrics_ms).max(max(&json_ms)),
            median(&metrics_ms).max(median(&json_ms)),
        ));
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Scale

struct Scrapes {
    metrics_ms: Vec<f64>,
    metrics_bytes: usize,
    snapshot_ms: Vec<f64>,
    snapshot_bytes: usize,
}

fn scrapes(d: &Daemon, samples: usize) -> Result<Scrapes> {
    let mut s = Scrapes {
        metrics_ms: Vec::new(),
        metrics_bytes: 0,
        snapshot_ms: Vec::new(),
        snapshot_bytes: 0,
    };
    for _ in 0..samples {
        let (took, body) = d.get("/metrics")?;
        s.metrics_ms.push(took.as_secs_f64() * 1e3);
        s.metrics_bytes = body.len();
        let (took, body) = d.get("/api/v1/snapshot")?;
        s.snapshot_ms.push(took.as_secs_f64() * 1e3);
        s.snapshot_bytes = body.len();
    }
    Ok(s)
}

fn gauge(body: &str, name: &str) -> Option<f64> {
    body.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

/// Wall time and CPU (children's rusage) of one poll of `program args` in the namespace.
struct Poll {
    label: &'static str,
    wall_ms: Vec<f64>,
    cpu_ms: Vec<f64>,
    bytes: usize,
}

fn children_cpu_ms() -> f64 {
    // SAFETY: getrusage fills the struct it is given.
    let ru = unsafe {
        let mut ru = std::mem::zeroed::<libc::rusage>();
        libc::getrusage(libc::RUSAGE_CHILDREN, &mut ru);
        ru
    };
    let ms = |t: libc::timeval| t.tv_sec as f64 * 1e3 + t.tv_usec as f64 / 1e3;
    ms(ru.ru_utime) + ms(ru.ru_stime)
}

const POLLS: &[(&str, &str, &[&str])] = &[
    ("`ss -ltn`", "ss", &["-ltn"]),
    ("`nstat -asz` (TcpExt)", "nstat", &["-asz"]),
];

fn polls(ns: &Netns, samples: usize) -> Result<Vec<Poll>> {
    POLLS
        .iter()
        .map(|&(label, program, args)| {
            let mut p = Poll {
                label,
                wall_ms: Vec::new(),
                cpu_ms: Vec::new(),
                bytes: 0,
            };
            for _ in 0..samples {
                let cpu0 = children_cpu_ms();
                let start = Instant::now();
                let out = ns
                    .command(program)
                    .args(args)
                    .output()
                    .with_context(|| format!("running {program}"))?;
                p.wall_ms.push(start.elapsed().as_secs_f64() * 1e3);
                p.cpu_ms.push(children_cpu_ms() - cpu0);
                if !out.status.success() {
                    bail!("{program} {args:?}: {}", out.status);
                }
                p.bytes = out.stdout.len();
            }
            Ok(p)
        })
        .collect()
}

struct ScaleState {
    label: String,
    scrapes: Scrapes,
    idle_cpu_pct: f64,
    memory: Memory,
    polls: Vec<Poll>,
}

fn scale_state(p: &Params, d: &Daemon, ns: &Netns, label: String) -> Result<ScaleState> {
    let scrapes = scrapes(d, p.samples)?;
    let idle = under_load(&d.proc, None, || {
        thread::sleep(Duration::from_secs_f64(p.idle_secs));
        Ok((0, p.idle_secs))
    })?;
    Ok(ScaleState {
        label,
        scrapes,
        idle_cpu_pct: idle.cpu_pct,
        memory: idle.memory,
        polls: polls(ns, p.samples)?,
    })
}

fn scale(p: &Params, r: &mut Report) -> Result<()> {
    let nofile = load::raise_nofile()?;
    if nofile < p.listeners as u64 + 1000 {
        bail!(
            "RLIMIT_NOFILE is {nofile}: too low for {} listeners",
            p.listeners
        );
    }
    let ns = Netns::new("scale")?;
    ns.sysctl("net.core.somaxconn", "65535")?;
    // Ephemeral ports below the listeners' ports.
    ns.sysctl(
        "net.ipv4.ip_local_port_range",
        &format!("1024 {}", SCALE_PORT - 1),
    )?;
    // Rescans every 5 s, so the idle CPU figures include sock_diag scans of this namespace.
    let d = Daemon::start("auto", &["--rescan-interval", "5"])?
        .map_err(|e| anyhow!("backlogd did not start: {e}"))?;
    let base = gauge(&d.get("/metrics")?.1, "backlogd_listeners").unwrap_or(0.0);
    let empty = scale_state(p, &d, &ns, "no listeners in the namespace".into())?;

    let start = Instant::now();
    let listeners = load::many_listeners(&ns, SCALE_PORT, p.listeners)?;
    let created = start.elapsed();
    let want = base + p.listeners as f64;
    let visible = poll_until(start, || {
        thread::sleep(Duration::from_millis(100));
        Ok(gauge(&d.get("/metrics")?.1, "backlogd_listeners").unwrap_or(0.0) >= want)
    })?;
    let (_, snap) = d.get("/api/v1/snapshot")?;
    let events_lost = serde_json::from_str::<serde_json::Value>(&snap)?["events_lost"]
        .as_u64()
        .unwrap_or(0);
    let with_listeners = scale_state(p, &d, &ns, format!("{} listeners", p.listeners))?;

    let start = Instant::now();
    let conns =
        load::Established::new(&ns, ESTABLISHED_PORT, ESTABLISHED_LISTENERS, p.established)?;
    let connected = start.elapsed();
    let established_now = output(ns.command("ss").args(["-Htn", "state", "established"]))?
        .lines()
        .count();
    let with_established = scale_state(
        p,
        &d,
        &ns,
        format!(
            "{} listeners + {} established connections",
            p.listeners, p.established
        ),
    )?;

    r.line(format!(
        "A throwaway namespace; backlogd `--hook-mode auto --rescan-interval 5` (so each \
         idle window includes sock_diag rescans). {} listeners on 127.0.0.1 ports {}.. \
         (created in {:.2} s; all on /metrics {} after the first listen(); {events_lost} \
         ring-buffer events lost), then {} connections to {ESTABLISHED_LISTENERS} more \
         listeners (made in {:.1} s by helper processes holding the client ends, {nofile} fds \
         each at most; the server ends wait in the accept queues, unaccepted; `ss` counts \
         {} established sockets, i.e. both ends). \
         {} GETs of each endpoint per state, one at a time; daemon CPU over {} s idle.\n",
        p.listeners,
        SCALE_PORT,
        created.as_secs_f64(),
        visible.map_or("not within 5 s".into(), |ms| format!("{ms:.0} ms")),
        p.established,
        connected.as_secs_f64(),
        established_now,
        p.samples,
        p.idle_secs,
    ));
    let states = [&empty, &with_listeners, &with_established];
    let rows: Vec<Vec<String>> = states
        .iter()
        .map(|s| {
            vec![
                s.label.clone(),
                format!(
                    "{:.1} / {:.1}",
                    median(&s.scrapes.metrics_ms),
                    p95(&s.scrapes.metrics_ms)
                ),
                format!("{:.2}", s.scrapes.metrics_bytes as f64 / 1e6),
                format!(
                    "{:.1} / {:.1}",
                    median(&s.scrapes.snapshot_ms),
                    p95(&s.scrapes.snapshot_ms)
                ),
                format!("{:.2}", s.scrapes.snapshot_bytes as f64 / 1e6),
                format!("{:.2}%", s.idle_cpu_pct),
                format!("{:.1} / {:.1}", s.memory.rss_mib, s.memory.peak_mib),
            ]
        })
        .collect();
    r.table(
        &[
            "state",
            "/metrics ms median / p95",
            "MB",
            "/api/v1/snapshot ms median / p95",
            "MB",
            "daemon idle CPU",
            "RSS / peak MiB",
        ],
        &rows,
    );
    r.line(format!(
        "The whole host's listeners are exported, not only this namespace's: {base:.0} \
         were there before (other engineers' tests, the system's own).\n"
    ));
    r.targets.scrape_ms = Some((p.listeners, median(&with_listeners.scrapes.metrics_ms)));
    r.targets.scrape_established_ms = Some(median(&with_established.scrapes.metrics_ms));

    r.line("**What a user would poll instead**, in the same namespace and states:\n");
    let mut rows = Vec::new();
    for s in states {
        for poll in &s.polls {
            rows.push(vec![
                poll.label.into(),
                s.label.clone(),
                format!("{:.1} / {:.1}", median(&poll.wall_ms), p95(&poll.wall_ms)),
                format!("{:.1}", median(&poll.cpu_ms)),
                format!("{:.2}", poll.bytes as f64 / 1e6),
            ]);
        }
    }
    r.table(
        &[
            "poll",
            "state",
            "wall ms median / p95",
            "CPU ms",
            "output MB",
        ],
        &rows,
    );
    r.line(
        "What polling cannot tell: `ss -ltn` shows each listener's accept-queue length \
         *now* and its granted backlog, so a burst between two polls is missed and drops \
         are not shown at all (`ss -ltnm`'s `d` is sk_drops, which counts final-ACK \
         overflows twice and also counts segments that were not listen drops); `nstat` \
         has the drop counters only per namespace (ListenOverflows, ListenDrops, \
         TCPReqQFullDrop), with no socket, port or process and no reason split between \
         SYN-time and final-ACK overflow. Neither gives SYNs received per socket, \
         the backlog the application asked for (before the somaxconn clamp), queue \
         peaks, or accept wait. backlogd attributes each of these to the listening \
         socket.\n",
    );
    complaints(r, &d.proc);
    let start = Instant::now();
    drop(conns);
    drop(listeners);
    eprintln!(
        "bench: closed the scale test's sockets in {:.1} s",
        start.elapsed().as_secs_f64()
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------
// bpftrace

/// The counting a user could do with bpftrace on the tracepoints backlogd's tracepoint
/// mode uses. `{overflow}` is the kernel's SKB_DROP_REASON_TCP_LISTEN_OVERFLOW.
const BPFTRACE_SCRIPT: &str = r#"// What bpftrace can count per listener on backlogd's tracepoints.
tracepoint:syscalls:sys_enter_listen { @requested_backlog[pid, comm] = max(args->backlog); }
tracepoint:sock:inet_sock_set_state
/args->protocol == 6 && (args->newstate == 10 || args->oldstate == 10)/
{ @listen_state_changes[args->sport] = count(); }
tracepoint:sock:sk_data_ready
/args->protocol == 6 && ((struct sock *)args->skaddr)->__sk_common.skc_state == 10/
{ @queued[((struct sock *)args->skaddr)->__sk_common.skc_num] = count(); }
tracepoint:skb:kfree_skb /args->reason == {overflow}/ { @final_ack_overflows[args->rx_sk] = count(); }
tracepoint:tcp:tcp_retransmit_synack { @synack_retransmits[args->sport] = count(); }
tracepoint:syscalls:sys_exit_accept4, tracepoint:syscalls:sys_exit_accept
/args->ret >= 0/ { @accepted[pid, comm] = count(); }
"#;

/// SKB_DROP_REASON_TCP_LISTEN_OVERFLOW's value on this kernel, from the tracepoint format.
fn listen_overflow_reason() -> Result<u32> {
    let path = "/sys/kernel/tracing/events/skb/kfree_skb/format";
    let format = std::fs::read_to_string(path).with_context(|| format!("reading {path}"))?;
    format
        .split("{ ")
        .find_map(|e| e.strip_suffix(", \"TCP_LISTEN_OVERFLOW\" }")?.parse().ok())
        .or_else(|| {
            format
                .split('{')
                .filter_map(|e| e.trim().strip_suffix("\"TCP_LISTEN_OVERFLOW\" },"))
                .find_map(|e| e.trim().trim_end_matches(',').trim().parse().ok())
        })
        .with_context(|| format!("no TCP_LISTEN_OVERFLOW in {path}"))
}

fn bpftrace(p: &Params, ns: &Netns, r: &mut Report) -> Result<()> {
    if output(Command::new("sh").args(["-c", "command -v bpftrace"])).is_err() {
        r.line("bpftrace is not installed (`cargo xtask setup` installs it).\n");
        return Ok(());
    }
    let version = output(Command::new("bpftrace").arg("--version"))?;
    let dir = crate::workspace_root().join("target/bench");
    std::fs::create_dir_all(&dir)?;
    let script = dir.join("listeners.bt");
    let text = BPFTRACE_SCRIPT.replace("{overflow}", &listen_overflow_reason()?.to_string());
    std::fs::write(&script, &text)?;
    let stats = BpfStats::enable()?;
    let bt = match Bpftrace::start(&script)? {
        Ok(bt) => bt,
        Err(why) => {
            r.line(format!("{} could not attach: {why}\n", version.trim()));
            return Ok(());
        }
    };
    let startup_cpu = bt.proc.cpu_seconds()?;
    let startup_mem = bt.proc.memory()?;
    let full = FullListener::new(ns)?;
    let costs = measure_programs(p, ns, &bt.proc, &full)?;
    let names = procs::prog_names()?;
    drop(stats);
    let rows = load_rows(p, ns, &bt.proc, None, &full)?;
    r.line(format!(
        "{} with this script (`target/bench/listeners.bt`), measured the same way as \
         backlogd above:\n\n```\n{}```\n",
        version.trim(),
        text
    ));
    r.line(format!(
        "Startup (parse, LLVM, load, attach): {:.2} s wall, {:.2} s CPU, {:.1} MiB peak \
         RSS.\n",
        bt.startup.as_secs_f64(),
        startup_cpu,
        startup_mem.peak_mib
    ));
    render_costs(r, &costs, &names);
    r.line("bpftrace's own process under the same loads as the daemon (its maps are printed only at exit, so nothing reads them meanwhile):\n");
    render_load_rows(r, &rows);
    r.line(
        "What it cannot count: SYNs received and SYN-time drops per listener (accept \
         queue full, SYN queue full) and syncookies. The kernel has no tracepoint in \
         `tcp_conn_request`; a SYN it drops is freed through `consume_skb` with no reason, \
         so only the per-CPU MIB delta across the segment's processing (backlogd's \
         cgroup_skb ingress + tp_btf release programs) attributes it to a socket, and \
         bpftrace can attach neither cgroup_skb programs nor read per-CPU MIBs. Without \
         fentry/kprobes (this kernel has neither) there is no other hook. It also keeps no \
         queue peaks or accept-wait histogram, and does not know listeners opened before \
         it started.\n",
    );
    complaints(r, &bt.proc);
    drop(bt);

    let (rows, pct) = capacity_pairs(p, ns, || {
        Bpftrace::start(&script)?.map_err(|e| anyhow!("bpftrace did not start: {e}"))
    })?;
    r.line("Connection-rate capacity with this script attached, measured as for backlogd:\n");
    r.table(
        &[
            "pair",
            "without (handshakes/s)",
            "with bpftrace",
            "with / without",
        ],
        &rows,
    );
    r.line(format!("Ratio with/without: {}.\n", spread(&pct, "%")));
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Summary

fn summary(r: &mut Report) {
    let t = &r.targets;
    let mut rows = Vec::new();
    let verdict = |ok: bool| if ok { "met" } else { "**not met**" };
    let missing = || vec!["not measured".to_owned(), String::new()];
    let mut row = |target: &str, cells: Vec<String>| {
        let mut v = vec![target.to_owned()];
        v.extend(cells);
        rows.push(v);
    };
    row(
        "per-SYN program cost < 150 ns median",
        t.per_syn_ns.map_or_else(missing, |ns| {
            vec![
                format!(
                    "{ns:.0} ns per dropped SYN{}",
                    t.per_handshake_ns
                        .map(|h| format!(" ({h:.0} ns per complete handshake)"))
                        .unwrap_or_default()
                ),
                verdict(ns < 150.0).into(),
            ]
        }),
    );
    row(
        "capacity with backlogd >= 97% of without",
        t.capacity.map_or_else(missing, |(m, lo, hi)| {
            vec![
                format!("{m:.1}% median (range {lo:.1}-{hi:.1}%)"),
                verdict(m >= 97.0).into(),
            ]
        }),
    );
    row(
        "daemon < 1% of one core and < 30 MiB RSS at 10k SYN/s",
        t.cpu_10k.map_or_else(missing, |(cpu, rss, peak)| {
            vec![
                format!("{cpu:.2}% CPU at 10k handshakes/s, {rss:.1} MiB RSS ({peak:.1} MiB peak)"),
                verdict(cpu < 1.0 && peak < 30.0).into(),
            ]
        }),
    );
    row(
        "scrape < 50 ms with 10k listeners",
        t.scrape_ms.map_or_else(missing, |(n, ms)| {
            vec![
                format!(
                    "{ms:.1} ms median with {n} listeners{}",
                    t.scrape_established_ms
                        .map(|e| format!(" ({e:.1} ms with the established connections too)"))
                        .unwrap_or_default()
                ),
                verdict(ms < 50.0).into(),
            ]
        }),
    );
    row(
        "drop visible within 1 s",
        t.drop_visible_ms.map_or_else(missing, |(worst, med)| {
            vec![
                format!("{med:.1} ms median, {worst:.1} ms worst"),
                verdict(worst < 1000.0).into(),
            ]
        }),
    );
    r.line("### Against the issue's targets\n");
    r.table(&["target", "measured", ""], &rows);
}

// ---------------------------------------------------------------------------------------
// Statistics

fn sorted(v: &[f64]) -> Vec<f64> {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v
}

fn median(v: &[f64]) -> f64 {
    let s = sorted(v);
    match s.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => s[n / 2],
        n => (s[n / 2 - 1] + s[n / 2]) / 2.0,
    }
}

fn p95(v: &[f64]) -> f64 {
    let s = sorted(v);
    if s.is_empty() {
        return f64::NAN;
    }
    s[((s.len() as f64 * 0.95).ceil() as usize).clamp(1, s.len()) - 1]
}

fn min(v: &[f64]) -> f64 {
    v.iter().copied().fold(f64::NAN, f64::min)
}

fn max(v: &[f64]) -> f64 {
    v.iter().copied().fold(f64::NAN, f64::max)
}

fn spread(v: &[f64], unit: &str) -> String {
    if v.len() < 2 {
        return format!("{:.1} {unit}", median(v));
    }
    format!(
        "median {:.1} {unit}, range {:.1}-{:.1} over {} runs",
        median(v),
        min(v),
        max(v),
        v.len()
    )
}
