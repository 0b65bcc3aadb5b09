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

use crate::{Daemon, Netns, sockets::Listener};

/// One scenario's comparisons of backlogd with the kernel. Checks are recorded, then
/// [`Exact::verify`] fails with the whole report if any of them did not hold. Dropping an
/// `Exact` without verifying it is itself a failure: a check that is never judged asserts
/// nothing.
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
}

struct Check {
    what: String,
    ours: u64,
    truth: u64,
    /// Runs of backlogd's programs the kernel skipped during the interval (kprobe mode's
    /// shared recursion guard): a shortfall of at most this many is the kernel's doing,
    /// reported as such, never silent.
    missed: u64,
}

impl Check {
    fn holds(&self) -> bool {
        self.ours == self.truth
            || (self.missed > 0 && self.ours < self.truth && self.truth - self.ours <= self.missed)
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
        }
    }

    /// Checks about one listener in `ns`.
    pub fn listener(daemon: &Daemon, ns: &Netns, listener: &Listener) -> Self {
        Self::new(daemon, describe(ns, listener))
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
        self.eq_unless_missed(what, ours, truth, 0)
    }

    /// As [`Exact::eq`], except that backlogd may be short by at most `missed`: runs of its
    /// programs the kernel itself skipped and counted (`recursion_misses`, kprobe mode
    /// only; tests pass `Daemon::kprobe_skips_since`, which is 0 in the other modes).
    pub fn eq_unless_missed(
        &mut self,
        what: &str,
        ours: u64,
        truth: u64,
        missed: u64,
    ) -> &mut Self {
        self.checks.push(Check {
            what: what.to_owned(),
            ours,
            truth,
            missed,
        });
        self
    }

    /// Fails with the full report unless every check held. Checks tolerated only because
    /// the kernel skipped backlogd's programs are printed as NOT EXACT, loudly.
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
        if self.checks.iter().any(|c| c.ours != c.truth) {
            crate::report(&format!("NOT EXACT (kernel-skipped probes): {report}\n"));
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
                (_, true) => "ok      ",
                (true, false) => "SKIPPED ",
                (false, false) => "MISMATCH",
            };
            let _ = write!(
                out,
                "  {verdict} {}: backlogd {}, truth {}",
                c.what, c.ours, c.truth
            );
            if c.ours != c.truth {
                let _ = write!(out, " ({:+})", c.ours as i128 - c.truth as i128);
            }
            if c.missed > 0 {
                let _ = write!(out, "; {} runs skipped by the kernel", c.missed);
            }
            out.push('\n');
        }
        for (label, value) in &self.evidence {
            let _ = writeln!(out, "{label}: {value}");
        }
        // In every mode: a mismatch beside skipped runs names its cause at once.
        let missed = crate::daemon::missed_runs_of(self.daemon)
            .map_or_else(|e| format!("unknown ({e})"), |n| n.to_string());
        let _ = writeln!(
            out,
            "runs of backlogd's programs the kernel skipped since they were loaded \
             (recursion_misses, counted by Linux 6.7+; read now): {missed}"
        );
        out
    }
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
