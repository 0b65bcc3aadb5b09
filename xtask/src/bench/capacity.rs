//! Handshake capacity with and without the daemon, in alternating pairs.

use super::*;

/// Alternating runs of `measure` (a rate) without and with what `attach` starts (dropped
/// to detach); returns the table rows and the ratios with/without in percent. The caller
/// warms up first.
pub(super) fn alternating_pairs<T>(
    p: &Params,
    mut attach: impl FnMut() -> Result<T>,
    mut measure: impl FnMut() -> Result<f64>,
) -> Result<Pairs> {
    let (mut without, mut with_rates) = (Vec::new(), Vec::new());
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
            pair[usize::from(with)] = measure()?;
            drop(attached);
        }
        let ratio = pair[1] / pair[0] * 100.0;
        pct.push(ratio);
        without.push(pair[0]);
        with_rates.push(pair[1]);
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
    Ok(Pairs {
        rows,
        pct,
        without,
        with: with_rates,
    })
}

/// What [`alternating_pairs`] measured: its table's rows, each pair's with/without ratio
/// (percent) and each rate without and with.
pub(super) struct Pairs {
    rows: Vec<Vec<String>>,
    pct: Vec<f64>,
    without: Vec<f64>,
    with: Vec<f64>,
}

/// The median, lowest and highest with/without ratio, in percent, the median rates
/// without (the idle baseline) and with, and how many pairs.
#[derive(Clone, Copy, Debug)]
pub(super) struct Ratio {
    pub(super) median: f64,
    pub(super) lo: f64,
    pub(super) hi: f64,
    pub(super) without: f64,
    pub(super) with: f64,
    pub(super) pairs: usize,
}

/// Prints [`alternating_pairs`]' table (`without`: the rate's column header, `with`: the
/// other's) and its ratio line; returns the ratio's spread.
pub(super) fn report_pairs(r: &mut Report, without: &str, with: &str, pairs: Pairs) -> Ratio {
    r.table(&["pair", without, with, "with / without"], &pairs.rows);
    r.line(format!(
        "Ratio with/without: {}.\n",
        spread(&pairs.pct, "%")
    ));
    Ratio {
        median: median(&pairs.pct),
        lo: min(&pairs.pct),
        hi: max(&pairs.pct),
        without: median(&pairs.without),
        with: median(&pairs.with),
        pairs: pairs.pct.len(),
    }
}

/// [`alternating_pairs`] of the in-process handshake loop.
pub(super) fn capacity_pairs<T>(
    p: &Params,
    ns: &Netns,
    attach: impl FnMut() -> Result<T>,
) -> Result<Pairs> {
    let secs = Duration::from_secs_f64(p.capacity_secs);
    // Warm-up: the first run after namespace creation is slower.
    load::handshakes(ns, CLIENTS, secs, None)?;
    alternating_pairs(p, attach, || {
        let (n, took) = load::handshakes(ns, CLIENTS, secs, None)?;
        Ok(n as f64 / took)
    })
}

/// A daemon in `--hook-mode auto`, serving, its startup scan done; its mode into `mode`.
pub(super) fn auto_daemon(mode: &mut String) -> Result<Daemon> {
    let d = Daemon::start("auto", &[])?.map_err(|e| anyhow!("backlogd did not start: {e}"))?;
    *mode = procs::labelled(&hook_mode(&d).unwrap_or_default());
    // Let the startup scan finish before measuring.
    thread::sleep(Duration::from_millis(500));
    Ok(d)
}

pub(super) fn capacity(p: &Params, ns: &Netns, r: &mut Report) -> Result<()> {
    let mut mode = String::new();
    let pairs = capacity_pairs(p, ns, || auto_daemon(&mut mode))?;
    r.line(format!(
        "Handshakes per second on loopback in a fresh network namespace: one thread accepts \
         and closes, {CLIENTS} threads connect and close (RST), {} s per run, {} pairs \
         alternating without/with backlogd (`--hook-mode auto`: {mode}), order swapped \
         every other pair. bpf_stats as before the benchmark.\n",
        p.capacity_secs, p.capacity_pairs
    ));
    r.targets.capacity = Some(report_pairs(r, "without (handshakes/s)", "with", pairs));
    Ok(())
}

pub(super) fn hook_mode(d: &Daemon) -> Result<String> {
    let (_, body) = d.get("/api/v1/snapshot")?;
    let v: serde_json::Value = serde_json::from_str(&body)?;
    Ok(v["hook_mode"].as_str().unwrap_or("?").to_owned())
}
