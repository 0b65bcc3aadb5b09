//! The daemon's CPU and memory under SYN load.

use super::*;

pub(super) struct UnderLoad {
    pub(super) events: u64,
    pub(super) secs: f64,
    pub(super) cpu_pct: f64,
    pub(super) memory: Memory,
}

/// Runs `load` while sampling the process; scrapes /metrics every second if `daemon`.
pub(super) fn under_load(
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
pub(super) const LOADS: &[(&str, Option<f64>, bool)] = &[
    ("handshakes at ~10k/s", Some(10_000.0), true),
    ("dropped SYNs at ~10k/s", Some(10_000.0), false),
    ("dropped SYNs at ~100k/s", Some(100_000.0), false),
    ("dropped SYNs, unpaced", None, false),
];

pub(super) fn load_rows(
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

pub(super) fn render_load_rows(r: &mut Report, rows: &[(&str, UnderLoad)]) {
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

pub(super) fn daemon_cost(p: &Params, ns: &Netns, r: &mut Report) -> Result<()> {
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

pub(super) fn complaints(r: &mut Report, proc: &Watched) {
    let said = proc.complaints.lock().expect("lock");
    if !said.is_empty() {
        r.line(format!(
            "The process logged {} warning(s)/error(s); first: `{}`\n",
            said.len(),
            said[0]
        ));
    }
}
