//! The summary table at the top of the report.

use super::*;

pub(super) fn summary(r: &mut Report) {
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
    // A with/without ratio against its target (percent).
    let ratio = |(m, lo, hi): Ratio, target: f64| {
        vec![
            format!("{m:.1}% median (range {lo:.1}-{hi:.1}%)"),
            verdict(m >= target).into(),
        ]
    };
    row(
        "capacity with backlogd >= 98% of without",
        t.capacity.map_or_else(missing, |c| ratio(c, 98.0)),
    );
    row(
        "nginx + wrk (Connection: close) with backlogd >= 98% of without",
        t.nginx.map_or_else(missing, |n| ratio(n, 98.0)),
    );
    if t.bystander.is_empty() {
        row(
            "traffic that never meets a listen queue >= 99% of without",
            missing(),
        );
    }
    for (flow, b) in &t.bystander {
        row(&format!("{flow}: >= 99% of without"), ratio(*b, 99.0));
    }
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
