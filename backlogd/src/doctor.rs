//! `backlogd doctor`: reads the running daemon's snapshot and says what to change (the
//! findings are `crate::diagnosis`'s; this command prints them).

use crate::{
    api::Snapshot,
    client::Api,
    diagnosis::{
        diagnose,
        finding::{Finding, Severity},
    },
};

pub struct DoctorOptions {
    pub api: Api,
    pub json: bool,
    pub fail_on: Severity,
}

/// Prints the findings; returns whether one is at or above `fail_on`.
pub fn run(opts: &DoctorOptions) -> anyhow::Result<bool> {
    let snapshot = opts.api.snapshot()?;
    let found = diagnose(&snapshot);
    if opts.json {
        println!("{}", serde_json::to_string_pretty(&found)?);
    } else {
        print!("{}", render(&snapshot, &found));
    }
    Ok(found.iter().any(|f| f.severity >= opts.fail_on))
}

fn render(snapshot: &Snapshot, found: &[Finding]) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    if found.is_empty() {
        let _ = writeln!(
            out,
            "all clear: {} listeners in {} network namespaces, nothing to fix",
            snapshot.listeners.len(),
            snapshot.namespaces.len()
        );
        return out;
    }
    for f in found {
        let severity = match f.severity {
            Severity::Critical => "CRITICAL",
            Severity::Warning => "WARNING",
            Severity::Info => "INFO",
        };
        let _ = writeln!(out, "{severity} {} — {}", f.kind, f.subject);
        let _ = writeln!(out, "  {}", f.summary);
        for e in &f.evidence {
            let _ = writeln!(out, "  evidence: {e}");
        }
        let _ = writeln!(out, "  fix: {}\n", f.remedy);
    }
    out
}

#[cfg(test)]
mod tests {
    use crate::{
        api::fixtures::snapshot,
        diagnosis::{diagnose, tests::overflowing_with_impact},
    };

    #[test]
    fn the_text_quotes_each_evidence_line_of_a_finding() {
        let snapshot = snapshot(vec![overflowing_with_impact()], vec![]);
        let text = super::render(&snapshot, &diagnose(&snapshot));
        assert!(
            text.contains(
                "\n  evidence: 312 connections reached the accept queue only after this \
                 listener dropped a segment of their handshake (300 at SYN, 12 at the final \
                 ACK): 290 of them waited more than 0.5 s from their first drop, 40 of them \
                 more than 1.5 s\n"
            ),
            "{text}"
        );
    }
}
