//! What the client-impact sweep costs scrapes while a flood's attempts expire.

use super::*;

/// Attempts map of the section's daemon: larger than the default, so the flood's attempts
/// make a sweep worth measuring.
const ATTEMPTS: &str = "131072";
/// Horizon of the section's daemon, seconds: short, so the flood's attempts expire soon.
const HORIZON: u64 = 10;
/// Listeners flooded (distinct destination ports: one gives at most the namespace's
/// ephemeral range of distinct tuples).
const LISTENERS: usize = 4;

/// One scrape: seconds since the flood began, its time in ms, the tracked gauge it showed.
type Sample = (f64, f64, Option<f64>);

/// `backlogd_client_impact_tracked` on a page.
fn tracked(page: &str) -> Option<f64> {
    page.lines()
        .find_map(|l| l.strip_prefix("backlogd_client_impact_tracked "))
        .and_then(|v| v.trim().parse().ok())
}

pub(super) fn sweep_cost(p: &Params, ns: &Netns, r: &mut Report) -> Result<()> {
    let horizon = HORIZON.to_string();
    let d = Daemon::start(
        "auto",
        &[
            "--client-impact-attempts",
            ATTEMPTS,
            "--client-impact-horizon",
            &horizon,
        ],
    )?
    .map_err(|e| anyhow!("backlogd did not start: {e}"))?;
    let fulls = (0..LISTENERS)
        .map(|_| FullListener::new(ns))
        .collect::<Result<Vec<_>>>()?;
    let mut syns = 0;
    let flood = Instant::now();
    for full in &fulls {
        syns += full
            .syns(
                ns,
                CLIENTS,
                Duration::from_secs_f64(p.load_secs / LISTENERS as f64),
                None,
            )?
            .0;
    }
    let flood_secs = flood.elapsed().as_secs_f64();
    // Scrape every 20 ms until every attempt has expired and been swept (tracked 0),
    // or the horizon plus 15 s have passed.
    let mut samples: Vec<Sample> = Vec::new();
    let deadline = flood + Duration::from_secs(HORIZON + 15);
    let mut peak = 0.0f64;
    while Instant::now() < deadline {
        let at = flood.elapsed().as_secs_f64();
        let (took, page) = d.get("/metrics")?;
        let t = tracked(&page);
        peak = peak.max(t.unwrap_or(0.0));
        samples.push((at, took.as_secs_f64() * 1e3, t));
        if at > HORIZON as f64 + 2.0 && t == Some(0.0) {
            break;
        }
        thread::sleep(Duration::from_millis(20));
    }
    // The sweeps that removed attempts: from the first page with fewer tracked than an
    // earlier one (the gauge is as of the last sweep: it rises while the sweeps find the
    // flood's attempts, then falls as they expire) to the first with none.
    let mut seen = 0.0f64;
    let first_drop = samples.iter().position(|s| {
        let t = s.2.unwrap_or(0.0);
        let fell = seen > 0.0 && t < seen;
        seen = seen.max(t);
        fell
    });
    let swept = first_drop.and_then(|i| {
        samples[i..]
            .iter()
            .position(|s| s.2 == Some(0.0))
            .map(|j| (i, i + j))
    });
    let row = |label: &str, v: &[f64]| -> Vec<String> {
        vec![
            label.to_owned(),
            format!("{}", v.len()),
            format!("{:.1} ms", median(v)),
            format!("{:.1} ms", p95(v)),
            format!("{:.1} ms", max(v)),
            format!("{}", v.iter().filter(|&&ms| ms > 50.0).count()),
        ]
    };
    let all: Vec<f64> = samples.iter().map(|s| s.1).collect();
    let mut rows = vec![row("every scrape", &all)];
    let window = match swept {
        Some((from, to)) => {
            let from = from.saturating_sub(50);
            let (during, other): (Vec<_>, Vec<_>) = samples
                .iter()
                .enumerate()
                .partition(|(i, _)| (from..=to).contains(i));
            let ms = |v: Vec<(usize, &Sample)>| -> Vec<f64> {
                v.into_iter().map(|(_, s)| s.1).collect()
            };
            rows.push(row("while attempts expired", &ms(during)));
            rows.push(row("the others", &ms(other)));
            format!(
                "the expiry: {:.1}-{:.1} s after the flood began",
                samples[from].0, samples[to].0
            )
        }
        None => "no expiry seen (the map never emptied within the horizon plus 15 s)".into(),
    };
    r.line(format!(
        "{syns} SYNs in {flood_secs:.1} s to {LISTENERS} listeners with full accept queues \
         (fresh client ports: each a new attempt), daemon with client_impact_attempts \
         {ATTEMPTS} and a {HORIZON} s horizon (a sweep every second); peak \
         backlogd_client_impact_tracked {peak:.0}; /metrics fetched every 20 ms until the \
         attempts had expired and been swept ({window}). \"while attempts expired\": from \
         about a second before the first sweep that removed some to the page that showed \
         none left.\n"
    ));
    r.table(
        &["scrapes", "count", "median", "p95", "max", "over 50 ms"],
        &rows,
    );
    Ok(())
}
