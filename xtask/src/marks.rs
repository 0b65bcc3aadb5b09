//! What the suites report beyond libtest's passed and failed (tests/src/marks.rs writes
//! it): tests that could not check here (skip) and checks that held only within runs the
//! kernel reported skipping (not-exact). A pass is a judged pass: a skip must be on
//! [`EXPECTED_SKIPS`] for its kernel and mode, and a skip listed there must happen, or the
//! cell fails; the tables count both apart from the passes.

use std::fmt::Write as _;

/// The prefix of a mark line (tests/src/marks.rs `MARK`).
pub const MARK: &str = "@@backlogd-mark";

/// The host of `cargo xtask test`, as a "kernel" of the lists below.
pub const HOST: &str = "host";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Skip,
    NotExact,
}

/// One mark line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mark {
    pub kind: Kind,
    /// `suite::test`.
    pub test: String,
    pub text: String,
}

impl Mark {
    /// The mark in `line`, wherever it starts (a test's output may precede it on the line).
    pub fn parse(line: &str) -> Option<Mark> {
        let rest = line.split(MARK).nth(1)?.trim();
        let (kind, rest) = rest.split_once(' ')?;
        let kind = match kind {
            "skip" => Kind::Skip,
            "not-exact" => Kind::NotExact,
            _ => return None,
        };
        let rest = rest.strip_prefix("suite=")?;
        let (suite, rest) = rest.split_once(" test=")?;
        let (test, text) = rest.split_once(": ").unwrap_or((rest, ""));
        Some(Mark {
            kind,
            test: format!("{suite}::{}", test.trim_end_matches(':')),
            text: text.trim().to_owned(),
        })
    }
}

/// A test that cannot check on some kernels in some modes, and why.
pub struct ExpectedSkip {
    /// Kernel labels of xtask/src/vm/kernels.rs, or [`HOST`].
    pub kernels: &'static [&'static str],
    pub modes: &'static [&'static str],
    /// `suite::test` (the test's path within its suite).
    pub test: &'static str,
    pub reason: &'static str,
}

const NO_PERF_LINK_PINNING: &str = "kprobe mode's links are perf-event links, pinnable from \
     Linux 5.15 (not backported to 5.10); the daemon runs unpinned there, which \
     pinning::the_daemon_starts_unpinned_where_the_kernel_cannot_pin checks";

/// The load step hands programs over through pins only, so it refuses what cannot pin.
const NO_PERF_LINK_HAND_OVER: &str = "kprobe mode's links are perf-event links, pinnable \
     from Linux 5.15 (not backported to 5.10), and the load step hands programs over through \
     pins only: it refuses kprobe mode there, which \
     pinning::the_daemon_starts_unpinned_where_the_kernel_cannot_pin checks";

const KERNELS_5_10: &[&str] = &["debian-5.10", "debian-5.10.0-32"];

/// Every skip a green run may contain. Nothing else may skip anywhere; `cargo xtask vm
/// --plan` prints this list.
pub const EXPECTED_SKIPS: &[ExpectedSkip] = &[
    ExpectedSkip {
        kernels: KERNELS_5_10,
        modes: &["kprobe"],
        test: "pinning::counts_continue_across_kill_9_and_restart_during_a_burst",
        reason: NO_PERF_LINK_PINNING,
    },
    ExpectedSkip {
        kernels: KERNELS_5_10,
        modes: &["kprobe"],
        test: "pinning::a_request_the_previous_daemon_saw_stays_exact_after_a_restart",
        reason: NO_PERF_LINK_PINNING,
    },
    ExpectedSkip {
        kernels: KERNELS_5_10,
        modes: &["kprobe"],
        test: "pinning::abandoned_attempts_counted_before_a_restart_stay_counted",
        reason: NO_PERF_LINK_PINNING,
    },
    ExpectedSkip {
        kernels: KERNELS_5_10,
        modes: &["kprobe"],
        test: "pinning::state_pinned_by_another_build_is_removed_and_counting_starts_afresh",
        reason: NO_PERF_LINK_PINNING,
    },
    ExpectedSkip {
        kernels: KERNELS_5_10,
        modes: &["kprobe"],
        test: "pinning::a_load_step_as_root_hands_the_programs_to_a_daemon_without_loading_capabilities",
        reason: NO_PERF_LINK_HAND_OVER,
    },
    ExpectedSkip {
        kernels: KERNELS_5_10,
        modes: &["fentry", "kprobe", "tracepoint"],
        test: "listen_backlog::an_mptcp_listener_open_before_the_daemon_is_found_with_its_syn_queue_now",
        reason: "Debian 11's kernel is built without CONFIG_MPTCP: socket(IPPROTO_MPTCP) \
                 fails with EPROTONOSUPPORT, so no MPTCP listener exists there",
    },
];

/// The expected skips of one cell.
pub fn expected(kernel: &str, mode: &str) -> impl Iterator<Item = &'static ExpectedSkip> {
    let (kernel, mode) = (kernel.to_owned(), mode.to_owned());
    EXPECTED_SKIPS
        .iter()
        .filter(move |e| e.kernels.contains(&kernel.as_str()) && e.modes.contains(&mode.as_str()))
}

/// One cell's marks judged against the lists.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Judged {
    /// Skips on the list: (test, reason).
    pub skipped: Vec<(String, String)>,
    /// Skips not on the list: (test, what the test said).
    pub unexpected: Vec<(String, String)>,
    /// Listed skips of tests that ran and did not skip: the list is wrong.
    pub missing: Vec<String>,
    /// not-exact marks: (test, what).
    pub not_exact: Vec<(String, String)>,
}

impl Judged {
    pub fn ok(&self) -> bool {
        self.unexpected.is_empty() && self.missing.is_empty()
    }

    /// Lines that explain a failing cell (and list its skips and not-exact checks).
    pub fn describe(&self, cell: &str) -> String {
        let mut out = String::new();
        for (test, said) in &self.unexpected {
            let _ = writeln!(
                out,
                "UNEXPECTED SKIP: {cell}: {test}: {said} (not on xtask/src/marks.rs \
                 EXPECTED_SKIPS: a test that did not check is not a pass)"
            );
        }
        for test in &self.missing {
            let _ = writeln!(
                out,
                "EXPECTED SKIP DID NOT HAPPEN: {cell}: {test} ran and checked; remove it \
                 from xtask/src/marks.rs EXPECTED_SKIPS"
            );
        }
        for (test, reason) in &self.skipped {
            let _ = writeln!(out, "SKIPPED (expected): {cell}: {test}: {reason}");
        }
        for (test, what) in &self.not_exact {
            let _ = writeln!(out, "NOT EXACT: {cell}: {test}: {what}");
        }
        out
    }
}

/// Judges the marks of one cell (`kernel` x `mode`); `ran`: every `suite::test` that ran
/// there to its result (a listed skip of a test that did not run is not missing).
pub fn judge(kernel: &str, mode: &str, marks: &[Mark], ran: &[String]) -> Judged {
    let mut judged = Judged::default();
    for mark in marks {
        match mark.kind {
            Kind::NotExact => judged
                .not_exact
                .push((mark.test.clone(), mark.text.clone())),
            Kind::Skip => match expected(kernel, mode).find(|e| e.test == mark.test) {
                Some(e) => judged
                    .skipped
                    .push((mark.test.clone(), e.reason.to_owned())),
                None => judged
                    .unexpected
                    .push((mark.test.clone(), mark.text.clone())),
            },
        }
    }
    for e in expected(kernel, mode) {
        let skipped = marks
            .iter()
            .any(|m| m.kind == Kind::Skip && m.test == e.test);
        if !skipped && ran.iter().any(|t| t == e.test) {
            judged.missing.push(e.test.to_owned());
        }
    }
    judged
}

#[cfg(test)]
mod tests {
    use super::*;

    fn skip(test: &str) -> Mark {
        Mark {
            kind: Kind::Skip,
            test: test.into(),
            text: "why".into(),
        }
    }

    #[test]
    fn mark_lines_are_read_wherever_they_start() {
        let line = format!(
            "test a ... {MARK} skip suite=pinning test=counts_x: kprobe links: not pinnable"
        );
        assert_eq!(
            Mark::parse(&line),
            Some(Mark {
                kind: Kind::Skip,
                test: "pinning::counts_x".into(),
                text: "kprobe links: not pinnable".into()
            })
        );
        let line = format!("{MARK} not-exact suite=service test=reload::x: 1 of 3 checks");
        assert_eq!(Mark::parse(&line).unwrap().test, "service::reload::x");
        assert_eq!(Mark::parse("test a ... ok"), None);
    }

    #[test]
    fn an_unlisted_skip_fails_the_cell() {
        let judged = judge("debian-6.1", "fentry", &[skip("syn_drops::x")], &[]);
        assert!(!judged.ok());
        assert_eq!(judged.unexpected.len(), 1);
        assert!(
            judged
                .describe("debian-6.1 x fentry")
                .contains("UNEXPECTED SKIP")
        );
    }

    #[test]
    fn a_listed_skip_passes_only_where_it_is_listed() {
        let test = "pinning::counts_continue_across_kill_9_and_restart_during_a_burst";
        let judged = judge("debian-5.10", "kprobe", &[skip(test)], &[test.into()]);
        assert!(judged.ok(), "{judged:?}");
        assert_eq!(judged.skipped.len(), 1);
        // The same skip in another mode or on another kernel is not on the list.
        assert!(!judge("debian-5.10", "fentry", &[skip(test)], &[]).ok());
        assert!(!judge("debian-6.1", "kprobe", &[skip(test)], &[]).ok());
        assert!(!judge(HOST, "tracepoint", &[skip(test)], &[]).ok());
    }

    #[test]
    fn a_listed_skip_that_checked_after_all_fails_the_cell() {
        let test = "pinning::counts_continue_across_kill_9_and_restart_during_a_burst";
        let judged = judge("debian-5.10", "kprobe", &[], &[test.into()]);
        assert_eq!(judged.missing, [test]);
        assert!(!judged.ok());
        // Not run at all (a filtered run): nothing is missing.
        assert!(judge("debian-5.10", "kprobe", &[], &[]).ok());
    }

    #[test]
    fn not_exact_marks_are_counted_not_failed() {
        let mark = Mark {
            kind: Kind::NotExact,
            test: "syn_drops::x".into(),
            text: "2 of 7 checks short by at most 3 runs the kernel skipped".into(),
        };
        let judged = judge("trixie", "kprobe", &[mark], &[]);
        assert!(judged.ok());
        assert_eq!(judged.not_exact.len(), 1);
    }

    #[test]
    fn every_listed_kernel_is_a_kernel_of_the_matrix_or_the_host() {
        for e in EXPECTED_SKIPS {
            for k in e.kernels {
                assert!(
                    *k == HOST || crate::vm::kernel_labels().any(|l| l == *k),
                    "{}: unknown kernel {k}",
                    e.test
                );
            }
            for m in e.modes {
                assert!(crate::vm::MODES.contains(m), "{}: unknown mode {m}", e.test);
            }
        }
    }
}
