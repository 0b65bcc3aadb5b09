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
        "{:<17} {:<11} {:>6} {:>6}  result",
        "kernel", "mode", "passed", "failed"
    );
    for r in rows {
        let verdict = if r.ok() {
            "PASS".to_owned()
        } else if r.broken.is_empty() {
            "FAIL".to_owned()
        } else {
            format!("FAIL ({})", r.broken.join(", "))
        };
        let _ = writeln!(
            t,
            "{:<17} {:<11} {:>6} {:>6}  {verdict}",
            r.kernel, r.mode, r.passed, r.failed
        );
    }
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
