//! Per-event cost of every eBPF program in each hook mode (kernel bpf_stats).

use super::*;

#[derive(Clone, Copy, PartialEq)]
pub(super) enum Workload {
    /// Complete handshakes: the listener accepts and closes each connection.
    Handshakes,
    /// SYNs dropped at a listener whose accept queue is full.
    DroppedSyns,
    /// Complete handshakes again, right after the dropped SYNs: client impact's gate is
    /// open (a drop within the horizon), so each queued connection looks its attempt up.
    HandshakesAfterDrops,
}

impl Workload {
    fn unit(self) -> &'static str {
        match self {
            Self::Handshakes => "handshake",
            Self::DroppedSyns => "dropped SYN",
            Self::HandshakesAfterDrops => "post-drop handshake",
        }
    }

    fn describe(self) -> &'static str {
        match self {
            Self::Handshakes => {
                "complete handshakes on loopback, each accepted and closed (RST) at once"
            }
            Self::DroppedSyns => {
                "SYNs (non-blocking connect, closed at once) to a listener with backlog 1 \
                 and a full accept queue: every one is dropped as accept_queue_full, and \
                 its attempt recorded for client impact (a new entry each; once the \
                 attempts map is full, a failed insert, counted untracked)"
            }
            Self::HandshakesAfterDrops => {
                "the same handshakes, measured right after the dropped SYNs: client \
                 impact's gate is open for a horizon after a drop on any listener, so each \
                 queued connection costs one lookup in the attempts map (a miss here)"
            }
        }
    }
}

/// Per program, per run: (ns per run, runs per event); and per run the events/s and
/// the time of all programs per event.
pub(super) struct WorkloadCost {
    pub(super) workload: Workload,
    pub(super) progs: BTreeMap<u32, Vec<(f64, f64)>>,
    pub(super) misses: BTreeMap<u32, u64>,
    pub(super) per_event_ns: Vec<f64>,
    pub(super) rates: Vec<f64>,
}

pub(super) fn measure_programs(
    p: &Params,
    ns: &Netns,
    proc: &Watched,
    full: &FullListener,
) -> Result<Vec<WorkloadCost>> {
    let secs = Duration::from_secs_f64(p.cost_secs);
    let mut out = Vec::new();
    for workload in [
        Workload::Handshakes,
        Workload::DroppedSyns,
        Workload::HandshakesAfterDrops,
    ] {
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
                Workload::Handshakes | Workload::HandshakesAfterDrops => {
                    load::handshakes(ns, CLIENTS, secs, None)?
                }
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

pub(super) fn render_costs(
    r: &mut Report,
    costs: &[WorkloadCost],
    names: &BTreeMap<u32, (String, String)>,
) {
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

pub(super) fn program_cost(p: &Params, ns: &Netns, r: &mut Report) -> Result<()> {
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
                if r.targets.per_event_mode.is_none() {
                    r.targets.per_event_mode = Some(mode.to_string());
                }
                for c in &costs {
                    let v = Some(median(&c.per_event_ns));
                    match c.workload {
                        Workload::DroppedSyns => r.targets.per_syn_ns = r.targets.per_syn_ns.or(v),
                        Workload::Handshakes => {
                            r.targets.per_handshake_ns = r.targets.per_handshake_ns.or(v)
                        }
                        Workload::HandshakesAfterDrops => {}
                    }
                }
            }
        }
    }
    drop(stats);
    Ok(())
}
