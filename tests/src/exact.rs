//! Exactness checks that explain themselves.
//!
//! Every figure backlogd reports is compared with the kernel's own for the same interval.
//! A failure that prints only `left: 24, right: 27` cannot be diagnosed after the fact (a
//! CI run on a qemu guest leaves nothing else behind), so every comparison goes through
//! [`Exact`]: it collects every check of one scenario, then fails once with all of them,
//! the subject (listener, namespace), the hook mode, the kernel release, and the evidence
//! the test gathered (the kernel's readings before and after, backlogd's figures, what the
//! clients saw).

use std::fmt::{Debug, Write as _};

use crate::{
    Daemon, Netns,
    daemon::{ProgramMisses, program_names},
    sockets::Listener,
};

/// One scenario's comparisons of backlogd with the kernel. Checks are recorded, then
/// [`Exact::verify`] fails with the whole report if any of them did not hold. Dropping an
/// `Exact` without verifying it is itself a failure: a check that is never judged asserts
/// nothing.
///
/// A check is exact ([`Exact::eq`]) unless the kernel itself reports hiding events from
/// the figure: [`Exact::eq_fed`] allows backlogd to be short by at most the runs the kernel
/// skipped, over this scenario's interval ([`Exact::interval`]), of the programs that feed
/// that figure (`backlogd_common::names::figure`). Never more, never an excess, and
/// nothing where the kernel counts nothing (kprobes before Linux 6.7): there the figure
/// must be exact. A check that held only within that allowance is NOT EXACT: printed, and
/// marked for the matrix's table (tests/src/marks.rs).
#[must_use = "call verify() or the checks are never judged"]
pub struct Exact {
    subject: String,
    mode: String,
    release: String,
    evidence: Vec<(String, String)>,
    checks: Vec<Check>,
    verified: bool,
    /// The daemon's pid, for the runs the kernel skipped, read when the report is made.
    daemon: u32,
    /// Runs the kernel skipped during the interval: (backlogd's possible names for the
    /// program, runs), for programs with any. None until [`Exact::interval`].
    skipped: Option<Vec<(Vec<&'static str>, u64)>>,
}

struct Check {
    what: String,
    ours: u64,
    truth: u64,
    /// The figures `ours` is made of (empty: must be exact).
    figures: Vec<&'static str>,
    /// Runs the kernel skipped, in the interval, of the programs feeding those figures: a
    /// shortfall of at most this many is the kernel's doing.
    allowance: u64,
}

impl Check {
    fn holds(&self) -> bool {
        self.ours == self.truth
            || (self.ours < self.truth && self.truth - self.ours <= self.allowance)
    }
}

impl Exact {
    /// Checks about `subject` (free text), made while `daemon` ran.
    pub fn new(daemon: &Daemon, subject: impl Into<String>) -> Self {
        Self {
            subject: subject.into(),
            mode: daemon
                .try_hook_mode()
                .unwrap_or_else(|| "unknown (no scrape)".into()),
            release: kernel_release(),
            evidence: Vec::new(),
            checks: Vec::new(),
            verified: false,
            daemon: daemon.pid(),
            skipped: None,
        }
    }

    /// Checks about one listener in `ns`.
    pub fn listener(daemon: &Daemon, ns: &Netns, listener: &Listener) -> Self {
        Self::new(daemon, describe(ns, listener))
    }

    /// The scenario's interval began at `start` (a [`Daemon::program_misses`] taken before
    /// its first event) and ends now: the runs the kernel skipped in between, per program,
    /// are what [`Exact::eq_fed`] may allow.
    pub fn interval(&mut self, daemon: &Daemon, start: &ProgramMisses) -> &mut Self {
        let skipped = daemon
            .program_misses()
            .since(start)
            .into_iter()
            .map(|(id, n)| (program_names(id), n))
            .collect();
        self.skipped = Some(skipped);
        self
    }

    /// Evidence printed with the report: the kernel's readings, backlogd's figures, the
    /// clients' view.
    pub fn evidence(&mut self, label: &str, value: impl Debug) -> &mut Self {
        self.evidence.push((label.to_owned(), format!("{value:?}")));
        self
    }

    /// backlogd's `ours` must equal `truth` it is compared with (the kernel's
    /// counters, the sockets' own view, or what the clients or the application saw; `what`
    /// names it).
    pub fn eq(&mut self, what: &str, ours: u64, truth: u64) -> &mut Self {
        self.push(what, ours, truth, Vec::new(), 0)
    }

    /// As [`Exact::eq`] for a figure made of `figures` (`names::figure`): backlogd may be
    /// short by at most the runs the kernel skipped, in the interval, of the programs that
    /// feed them. Needs [`Exact::interval`] first.
    pub fn eq_fed(
        &mut self,
        what: &str,
        figures: &[&'static str],
        ours: u64,
        truth: u64,
    ) -> &mut Self {
        let skipped = self.skipped.as_ref().unwrap_or_else(|| {
            panic!("Exact::eq_fed({what}) without Exact::interval: no interval to allow for")
        });
        let allowance = allowance(skipped, figures);
        self.push(what, ours, truth, figures.to_vec(), allowance)
    }

    fn push(
        &mut self,
        what: &str,
        ours: u64,
        truth: u64,
        figures: Vec<&'static str>,
        allowance: u64,
    ) -> &mut Self {
        self.checks.push(Check {
            what: what.to_owned(),
            ours,
            truth,
            figures,
            allowance,
        });
        self
    }

    /// Fails with the full report unless every check held. Checks that held only within
    /// the kernel-reported skips are printed as NOT EXACT, loudly, and marked.
    pub fn verify(mut self) {
        self.verified = true;
        assert!(
            !self.checks.is_empty(),
            "Exact for {} checked nothing",
            self.subject
        );
        let report = self.report();
        if self.checks.iter().any(|c| !c.holds()) {
            panic!("{report}");
        }
        let short: Vec<&Check> = self.checks.iter().filter(|c| c.ours != c.truth).collect();
        if !short.is_empty() {
            crate::report(&format!("NOT EXACT (kernel-skipped runs): {report}\n"));
            crate::marks::not_exact(&format!(
                "{} of {} checks short within the kernel-reported skipped runs: {}",
                short.len(),
                self.checks.len(),
                short
                    .iter()
                    .map(|c| format!(
                        "{} {} vs {} (allowance {})",
                        c.what, c.ours, c.truth, c.allowance
                    ))
                    .collect::<Vec<_>>()
                    .join("; ")
            ));
        }
    }

    fn report(&self) -> String {
        let bad = self.checks.iter().filter(|c| !c.holds()).count();
        let mut out = format!(
            "backlogd vs the kernel for {}: {} of {} checks failed (hook mode {}, kernel {})\n",
            self.subject,
            bad,
            self.checks.len(),
            self.mode,
            self.release
        );
        for c in &self.checks {
            let verdict = match (c.holds(), c.ours == c.truth) {
                (_, true) => "ok       ",
                (true, false) => "NOT EXACT",
                (false, false) => "MISMATCH ",
            };
            let _ = write!(
                out,
                "  {verdict} {}: backlogd {}, truth {}",
                c.what, c.ours, c.truth
            );
            if c.ours != c.truth {
                let _ = write!(out, " ({:+})", c.ours as i128 - c.truth as i128);
            }
            if !c.figures.is_empty() {
                let _ = write!(
                    out,
                    "; allowance {} (kernel-skipped runs of the programs feeding {})",
                    c.allowance,
                    c.figures.join(", ")
                );
            }
            out.push('\n');
        }
        for (label, value) in &self.evidence {
            let _ = writeln!(out, "{label}: {value}");
        }
        match &self.skipped {
            Some(skipped) if !skipped.is_empty() => {
                let _ = writeln!(
                    out,
                    "runs the kernel skipped in the interval, by program: {skipped:?}"
                );
            }
            Some(_) => {
                let _ = writeln!(out, "runs the kernel skipped in the interval: none");
            }
            None => {}
        }
        // In every mode: a mismatch beside skipped runs names its cause at once.
        let missed = crate::daemon::missed_runs_of(self.daemon)
            .map_or_else(|e| format!("unknown ({e})"), |n| n.to_string());
        let _ = writeln!(
            out,
            "runs of backlogd's programs the kernel skipped since they were loaded \
             (recursion_misses: trampolines from Linux 5.12, kprobes from 6.7; read now): \
             {missed}"
        );
        out
    }
}

/// Runs in `skipped` of programs that feed any of `figures`. A program known only by a
/// truncated name counts if any name it may be feeds them (they all feed the same ones).
fn allowance(skipped: &[(Vec<&'static str>, u64)], figures: &[&'static str]) -> u64 {
    use backlogd_common::names::figure;
    skipped
        .iter()
        .filter(|(names, _)| {
            names
                .iter()
                .any(|p| figures.iter().any(|f| figure::feeds(p, f)))
        })
        .map(|(_, n)| n)
        .sum()
}

impl Drop for Exact {
    fn drop(&mut self) {
        if !self.verified && !std::thread::panicking() {
            panic!(
                "Exact for {} was dropped without verify(): its checks were never judged",
                self.subject
            );
        }
    }
}

/// `listener 127.0.0.1:4242 (socket 123) in netns 4026532..`
pub fn describe(ns: &Netns, listener: &Listener) -> String {
    format!(
        "listener {} (socket {}) in netns {}",
        listener.addr,
        listener.inode,
        ns.inode()
    )
}

/// `uname -r` of the running kernel.
pub fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|e| format!("unknown ({e})"))
}

#[cfg(test)]
mod tests {
    use backlogd_common::names::{figure, program};

    use super::*;

    fn check(ours: u64, truth: u64, allowance: u64) -> Check {
        Check {
            what: "x".into(),
            ours,
            truth,
            figures: vec![figure::DROPS],
            allowance,
        }
    }

    #[test]
    fn only_a_shortfall_within_the_allowance_holds() {
        assert!(check(5, 5, 0).holds());
        assert!(!check(4, 5, 0).holds(), "no allowance: exact");
        assert!(check(3, 5, 2).holds());
        assert!(
            !check(2, 5, 2).holds(),
            "short by more than the kernel skipped"
        );
        assert!(
            !check(6, 5, 2).holds(),
            "an excess is never the kernel's doing"
        );
    }

    #[test]
    fn the_allowance_counts_only_programs_that_feed_the_figure() {
        let skipped = vec![
            (vec![program::SYSCALL_EXIT], 7),
            (vec![program::SYN_CONSUMED], 2),
            (
                vec![
                    program::REQSK_QUEUE_ADD_EXIT,
                    program::REQSK_QUEUE_ADD_KPROBE,
                    program::REQSK_QUEUE_ADD_KRETPROBE,
                ],
                1,
            ),
        ];
        assert_eq!(allowance(&skipped, &[figure::DROPS]), 2);
        assert_eq!(allowance(&skipped, &[figure::ACCEPTED]), 7);
        assert_eq!(allowance(&skipped, &[figure::ACCEPT_WAIT]), 10);
        assert_eq!(allowance(&skipped, &[figure::QUEUED]), 3);
        assert_eq!(allowance(&skipped, &[figure::SYNACK_RETRANSMITS]), 0);
        assert_eq!(allowance(&[], &[figure::DROPS]), 0);
    }
}
