//! The pass/fail tables of a matrix run.

use super::*;

pub(super) fn render_table(rows: &[Row], suites: &[(&str, Option<&str>)], repeat: u32) -> String {
    let mut t = String::from("kernel matrix (qemu TCG, suites: ");
    t.push_str(
        &suites
            .iter()
            .map(|(s, f)| match f {
                Some(f) => format!("{s}[{f}]"),
                None => (*s).to_owned(),
            })
            .collect::<Vec<_>>()
            .join(" "),
    );
    if repeat > 1 {
        let _ = write!(t, ", each run {repeat} times");
    }
    t.push_str(")\n");
    let _ = writeln!(
        t,
        "{:<17} {:<11} {:>7} {:>7} {:>9} {:>6}  result",
        "kernel", "mode", "checked", "skipped", "not exact", "failed"
    );
    let mut details = String::new();
    for r in rows {
        let judged = r.judged();
        let mut why: Vec<String> = r.broken.clone();
        why.extend(
            r.tainted
                .iter()
                .map(|(suite, flags)| format!("kernel tainted {flags} during {suite}")),
        );
        if !judged.unexpected.is_empty() {
            why.push(format!("{} unexpected skips", judged.unexpected.len()));
        }
        if !judged.missing.is_empty() {
            why.push(format!(
                "{} expected skips did not happen",
                judged.missing.len()
            ));
        }
        if r.checked() == 0 && r.failed == 0 {
            why.push("nothing checked".into());
        }
        let verdict = if r.ok() {
            "PASS".to_owned()
        } else if why.is_empty() {
            "FAIL".to_owned()
        } else {
            format!("FAIL ({})", why.join(", "))
        };
        let _ = writeln!(
            t,
            "{:<17} {:<11} {:>7} {:>7} {:>9} {:>6}  {verdict}",
            r.kernel,
            r.mode,
            r.checked(),
            judged.skipped.len() + judged.unexpected.len(),
            judged.not_exact.len(),
            r.failed
        );
        details.push_str(&judged.describe(&format!("{} x {}", r.kernel, r.mode)));
    }
    t.push_str(&details);
    t.push_str(&over_budget(rows));
    t.push_str(&per_test_table(rows, repeat));
    t
}

/// Passed/finished runs of every test in every kernel x mode cell: all of them when suites
/// were repeated (flaky-test hunting), else only the tests that failed somewhere.
pub(super) fn per_test_table(rows: &[Row], repeat: u32) -> String {
    let mut tests: Vec<&String> = rows.iter().flat_map(|r| r.tests.keys()).collect();
    tests.sort();
    tests.dedup();
    let flaky = |test: &String| {
        rows.iter()
            .any(|r| r.tests.get(test).is_some_and(|(n, ok)| n != ok))
    };
    if repeat <= 1 {
        tests.retain(|t| flaky(t));
    }
    if tests.is_empty() {
        return String::new();
    }
    let mut t =
        String::from("\nper test, passed/finished runs (a failure is a mismatch or an error):\n");
    let width = tests.iter().map(|n| n.len()).max().unwrap_or(0);
    let _ = write!(t, "{:<width$}", "test");
    for r in rows {
        let _ = write!(t, "  {:>22}", format!("{} {}", r.kernel, r.mode));
    }
    t.push('\n');
    for test in tests {
        let _ = write!(t, "{test:<width$}");
        for r in rows {
            let cell = r
                .tests
                .get(test)
                .map_or("-".to_owned(), |(n, ok)| format!("{ok}/{n}"));
            let _ = write!(t, "  {cell:>22}");
        }
        t.push('\n');
    }
    t
}

/// The suite runs that took longer than their budget (plan.rs), and the longest run of
/// each suite: how close the matrix came to its time.
pub(super) fn over_budget(rows: &[Row]) -> String {
    let mut out = String::new();
    let mut longest: std::collections::BTreeMap<&str, (u64, String)> = Default::default();
    for r in rows {
        for (suite, secs) in &r.durations {
            let budget = plan::budget_secs(suite);
            if budget.is_some_and(|b| *secs > b) {
                let _ = writeln!(
                    out,
                    "OVER BUDGET: {} x {}: {suite} took {secs} s (budget {} s, \
                     xtask/src/vm/plan.rs)",
                    r.kernel,
                    r.mode,
                    budget.unwrap_or_default()
                );
            }
            let entry = longest.entry(suite).or_default();
            if *secs >= entry.0 {
                *entry = (*secs, format!("{} x {}", r.kernel, r.mode));
            }
        }
    }
    if !longest.is_empty() {
        let list: Vec<String> = longest
            .iter()
            .map(|(suite, (secs, cell))| {
                format!(
                    "{suite} {secs} s ({cell}; budget {})",
                    plan::budget_secs(suite).map_or("none".into(), |b| format!("{b} s"))
                )
            })
            .collect();
        let _ = writeln!(
            out,
            "longest run per suite, guest seconds: {}",
            list.join(", ")
        );
    }
    out
}
