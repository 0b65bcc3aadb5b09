//! What the kernel matrix runs where: the suites, the kernels, which tests a cell leaves
//! out and why, what may skip, and the time each suite is expected to take. `cargo xtask
//! vm` runs exactly this, and `cargo xtask vm --plan` prints it; docs/testing.md carries the
//! printout, checked by a test against this code.

use super::*;

/// Integration suites that exercise the hook modes, with an optional test-name filter.
/// (The exporter, nginx, Prometheus and terminal suites do not depend on the mode and run
/// on the host.)
pub(super) const GUEST_SUITES: &[(&str, Option<&str>)] = &[
    ("cli", Some("hook_mode")),
    ("listen_backlog", None),
    ("syn_drops", None),
    ("accept_queue", None),
    ("reuseport", None),
    ("lifecycle", None),
    ("pinning", None),
    ("capacity", None),
    ("program_runs", None),
    ("stress", None),
    ("container", None),
    ("client_impact", None),
    ("drop_sources", None),
];

/// What runs in a mode the kernel cannot run: the refusal test.
pub(super) const REFUSAL_SUITE: &[(&str, Option<&str>)] = &[("cli", Some("hook_mode"))];

/// Suites `cargo xtask test` runs only in some cells, to keep the whole run under an hour
/// on the CI machine kind: (suite, kernels, modes, reason). `cargo xtask vm` runs them
/// everywhere, and docs/testing.md records such a run.
pub(crate) const CI_SUITE_KERNELS: &[(&str, &[&str], &[&str], &str)] = &[
    (
        "pinning",
        &["debian-5.10", "trixie-backports"],
        MODES,
        "time: 30-80 guest s per cell. Which links a kernel can pin is what changes between \
         kernels (kprobe mode's perf-event links from 5.15: refused on 5.10, pinned on the \
         newest), and fentry mode's tracing links pin the same way on every kernel from 5.10; \
         so CI runs it on the oldest and the newest kernel and `cargo xtask vm` everywhere",
    ),
    (
        "stress",
        &["debian-5.10", "trixie-backports"],
        MODES,
        "time: up to 110 guest s per mode; with client_impact, on every kernel they add \
         about 15 minutes to a matrix of about 50 (measured, docs/testing.md's last run), so \
         CI runs them on the oldest and the newest kernel and `cargo xtask vm` everywhere",
    ),
    (
        "client_impact",
        &["debian-5.10", "trixie-backports"],
        MODES,
        "time: its tests wait out real SYN retries and a horizon, about 55 guest s per mode; \
         CI runs it on the oldest and the newest kernel and `cargo xtask vm` everywhere",
    ),
    (
        "drop_sources",
        &["debian-5.10", "trixie-backports"],
        &["fentry", "tracepoint"],
        "time: 12 daemons and about 900 handshakes, about 100 guest s per mode (82-110 \
         measured in stop 43 with 10 of them, a 10 s retention waited out among them). It \
         counts where every mode's drops are settled \
         (`syn.rs`, then `impact.rs` and `sources.rs`, one code for every mode); what is \
         kprobe mode's own there, its windows and the calls from kprobes into that code, \
         syn_drops and client_impact check in the kprobe cells. So CI runs it on the oldest \
         and the newest kernel in fentry and tracepoint mode (tracepoint mode reads a \
         segment's source from its own copy made at ingress), not in kprobe mode, and `cargo xtask vm` \
         everywhere",
    ),
];

/// Hook modes `cargo xtask test` runs only on some kernels, for the same reason: (mode,
/// kernels, reason). The rule: every kernel in the mode `auto` picks there (fentry on every
/// Debian kernel); the oldest kernel in every mode; the newest in every mode that traces
/// kernel functions (fentry, kprobe), whose arguments change between kernels. Tracepoint
/// mode's newest kernel is the CI host's own, where the whole host suite runs in it.
/// `cargo xtask vm` runs every cell.
pub(crate) const CI_MODE_KERNELS: &[(&str, &[&str], &str)] = &[
    (
        "kprobe",
        &["debian-5.10", "trixie-backports"],
        "time: a row is about 5 minutes of the matrix. `auto` picks kprobe mode only on \
         kernels without BPF trampolines (none of Debian's x86-64 kernels); it traces the \
         same kernel functions as fentry mode, whose row runs on every kernel. So CI runs it \
         on the oldest and the newest kernel, and `cargo xtask vm` everywhere",
    ),
    (
        "tracepoint",
        &["debian-5.10"],
        "time: a row is about 6 minutes of the matrix, and CI's whole run reached 61 minutes \
         with it on the newest kernel too (stop 41). Tracepoint mode's hooks are tracepoints \
         and cgroup_skb, whose arguments the kernel keeps stable, unlike the functions fentry \
         and kprobe mode trace (tcp_check_req has 5 arguments on 5.10 and 6 on 6.18); the \
         struct fields every mode reads come from BTF and are read in the fentry row of every \
         kernel; and the whole host suite runs in tracepoint mode on the CI kernel (6.18), \
         the newest kernel CI meets in this mode. So CI runs it in the guests on the oldest \
         kernel, and `cargo xtask vm` everywhere",
    ),
];

/// A test that checks nothing on some kernels, so the matrix does not run it there (a test
/// that applies to no cell is not a test): (suite, test, whether it applies to a kernel
/// that can run these modes, why not elsewhere).
pub(super) struct NotApplicable {
    pub suite: &'static str,
    pub test: &'static str,
    pub applies: fn(Caps) -> bool,
    pub why: &'static str,
}

pub(super) const NOT_APPLICABLE: &[NotApplicable] = &[NotApplicable {
    suite: "cli",
    test: "hook_mode_the_kernel_lacks_is_refused_with_the_fix",
    applies: |caps| !(caps.fentry && caps.kprobe),
    why: "the kernel allows every hook mode, so there is nothing to refuse; the test runs \
          on the CI host (no trampolines, no kprobes: both refused) and in the row of any \
          mode a kernel of the table refuses (none since fentry mode runs on 5.10)",
}];

/// Guest seconds one run of a suite is expected to take in one mode, at most, on the CI
/// machine kind under TCG (measured, with room): a run over it is listed under the table
/// as OVER BUDGET, so a suite that grows says so before it costs CI its 90 minutes. It
/// fails nothing (the watchdog's SUITE_STUCK does).
/// (The longest runs of a whole `cargo xtask vm` on this machine kind, with helpers
/// compiling beside it: cli 28 s, listen_backlog 38, syn_drops 108, accept_queue 19,
/// reuseport 15, lifecycle 15, pinning 69, capacity 8, program_runs 13, stress 108,
/// container 6, client_impact 55; each budget is about twice that. accept_queue grew to
/// 44 s on 7.3 with the SYN-queue-now and accept_wait=false tests, #34/#37. drop_sources,
/// new with #35, took 53-60 s on 5.10 alone (121-150 s with a second guest beside it);
/// 94-109 s on 6.1 with its retention test (#35, stop 43), a compile beside it.)
pub(super) const SUITE_BUDGET_SECS: &[(&str, u64)] = &[
    ("cli", 60),
    ("listen_backlog", 80),
    ("syn_drops", 200),
    ("accept_queue", 80),
    ("reuseport", 40),
    ("lifecycle", 40),
    ("pinning", 140),
    ("capacity", 30),
    ("program_runs", 40),
    ("stress", 200),
    ("container", 30),
    ("client_impact", 110),
    ("drop_sources", 180),
];

pub(super) fn budget_secs(suite: &str) -> Option<u64> {
    SUITE_BUDGET_SECS
        .iter()
        .find(|(s, _)| *s == suite)
        .map(|(_, b)| *b)
}

/// What one kernel x mode cell runs.
pub(super) struct Cell {
    /// False: backlogd refuses the mode on this kernel; the cell runs the refusal test.
    pub runs_mode: bool,
    pub suites: Vec<(&'static str, Option<&'static str>)>,
    /// Tests of those suites left out: (suite, test, why).
    pub not_run: Vec<(&'static str, &'static str, &'static str)>,
    /// Suites left out by `cargo xtask test`: (suite, why).
    pub ci_left_out: Vec<(&'static str, &'static str)>,
    /// The whole cell left out by `cargo xtask test` ([`CI_MODE_KERNELS`]): why.
    pub ci_mode_left_out: Option<&'static str>,
}

/// The cell `spec` x `mode`, of the `selected` suites; `ci`: as `cargo xtask test` runs it.
pub(super) fn cell(
    spec: &KernelSpec,
    mode: &str,
    selected: &[(&'static str, Option<&'static str>)],
    ci: bool,
) -> Cell {
    let runs_mode = spec.caps.runs(mode);
    let mut ci_left_out = Vec::new();
    let ci_mode_left_out = CI_MODE_KERNELS
        .iter()
        .find(|(m, on, _)| ci && runs_mode && *m == mode && !on.contains(&spec.label))
        .map(|(_, _, why)| *why);
    let suites: Vec<_> = if ci_mode_left_out.is_some() {
        Vec::new()
    } else if runs_mode {
        selected
            .iter()
            .filter(|(suite, _)| {
                let out = CI_SUITE_KERNELS.iter().find(|(s, on, modes, _)| {
                    ci && s == suite && !(on.contains(&spec.label) && modes.contains(&mode))
                });
                if let Some((s, _, _, why)) = out {
                    ci_left_out.push((*s, *why));
                }
                out.is_none()
            })
            .copied()
            .collect()
    } else {
        REFUSAL_SUITE.to_vec()
    };
    let not_run = NOT_APPLICABLE
        .iter()
        .filter(|n| !(n.applies)(spec.caps) && suites.iter().any(|(s, _)| *s == n.suite))
        .map(|n| (n.suite, n.test, n.why))
        .collect();
    Cell {
        runs_mode,
        suites,
        not_run,
        ci_left_out,
        ci_mode_left_out,
    }
}

/// `cargo xtask vm --plan`: the kernels, what `cargo xtask test` runs on each in each mode,
/// what may skip, and the time budgets.
pub fn render(test_budget_min: u64) -> String {
    let mut t = String::new();
    let _ = writeln!(
        t,
        "Kernels (xtask/src/vm/kernels.rs; CI: booted by `cargo xtask test`, the others by \
         `cargo xtask vm --kernel LABEL`):\n"
    );
    let _ = writeln!(
        t,
        "| label | Debian kernel package | fentry mode | kprobe mode | kprobe links pin | CI |"
    );
    let _ = writeln!(t, "|---|---|---|---|---|---|");
    let yes = |b: bool| if b { "yes" } else { "no" };
    for k in KERNELS {
        let package = match k.pick {
            Pick::Newest { prefix, suffix } => format!("newest `{prefix}N{suffix}`"),
            Pick::Meta => "what `linux-image-cloud-amd64` depends on".to_owned(),
            Pick::Exact(name) => format!("`{name}`"),
        };
        let from = k
            .suite
            .map_or(" (host's suite)".to_owned(), |s| format!(" ({s})"));
        let _ = writeln!(
            t,
            "| {} | {package}{from} | {} | {} | {} | {} |",
            k.label,
            if k.caps.fentry { "yes" } else { "refused" },
            if k.caps.kprobe { "yes" } else { "refused" },
            yes(k.caps.perf_link_pinning),
            yes(k.default),
        );
    }
    let _ = writeln!(
        t,
        "\nSuites per kernel x mode in `cargo xtask test` (every mode: {}):\n",
        MODES.join(", ")
    );
    for k in KERNELS.iter().filter(|k| k.default) {
        // One entry for the modes whose cells are alike.
        let cells: Vec<(&str, String)> = MODES
            .iter()
            .map(|mode| (*mode, describe_cell(&cell(k, mode, GUEST_SUITES, true))))
            .collect();
        let mut done: Vec<&str> = Vec::new();
        for (mode, text) in &cells {
            if done.contains(mode) {
                continue;
            }
            let alike: Vec<&str> = cells
                .iter()
                .filter(|(_, t)| t == text)
                .map(|(m, _)| *m)
                .collect();
            done.extend(&alike);
            let modes = if alike.len() == MODES.len() {
                "every mode".to_owned()
            } else {
                alike.join(", ")
            };
            let _ = write!(t, "- {} x {modes}: {text}", k.label);
        }
    }
    let _ = writeln!(
        t,
        "\nExpected skips (xtask/src/marks.rs; any other skip fails its cell, and a listed one \
         that checked after all does too):\n"
    );
    for e in crate::marks::EXPECTED_SKIPS {
        let _ = writeln!(
            t,
            "- {} x {}: {}: {}",
            e.kernels.join(", "),
            e.modes.join(", "),
            e.test,
            e.reason
        );
    }
    let _ = writeln!(
        t,
        "\nTime: the whole `cargo xtask test` ends its matrix {test_budget_min} minutes after it \
         started (`BACKLOGD_TEST_BUDGET_MIN`); a kernel with less than {} minutes left is not \
         booted; a guest is killed after {} minutes; a suite run still going after {} minutes \
         gets the guest's state printed and is killed after {}. Each suite's expected guest \
         time per run and mode, listed as OVER BUDGET under the table when exceeded:\n",
        MIN_BOOT_TIME.as_secs() / 60,
        GUEST_TIMEOUT.as_secs() / 60,
        SUITE_SLOW.as_secs() / 60,
        SUITE_STUCK.as_secs() / 60,
    );
    let _ = writeln!(t, "| suite | budget (guest s) |\n|---|---|");
    for (suite, secs) in SUITE_BUDGET_SECS {
        let _ = writeln!(t, "| {suite} | {secs} |");
    }
    t
}

pub(crate) const PLAN_BEGIN: &str =
    "<!-- plan: written by `cargo xtask vm --plan --write-docs` -->";
pub(crate) const PLAN_END: &str = "<!-- end of plan -->";

/// The text between `begin` and `end` in `text`.
#[cfg(test)]
pub(crate) fn between<'a>(text: &'a str, begin: &str, end: &str) -> Option<&'a str> {
    let (start, stop) = span(text, begin, end)?;
    Some(&text[start..stop])
}

/// Byte range of the text between `begin` and `end`.
fn span(text: &str, begin: &str, end: &str) -> Option<(usize, usize)> {
    let start = text.find(begin)? + begin.len();
    let stop = start + text[start..].find(end)?;
    Some((start, stop))
}

/// `text` with what lies between `begin` and `end` replaced by `new`.
fn splice(text: &str, begin: &str, end: &str, new: &str) -> Option<String> {
    let (start, stop) = span(text, begin, end)?;
    Some(format!("{}{new}{}", &text[..start], &text[stop..]))
}

/// Where a matrix run leaves its table for docs/testing.md.
pub(super) const LAST_RUN: &str = "target/vm/last-run.md";

pub(crate) const RUN_BEGIN: &str =
    "<!-- last run: copied from target/vm/last-run.md by `cargo xtask vm --plan --write-docs` -->";
pub(crate) const RUN_END: &str = "<!-- end of last run -->";

/// Which run a table is: the commit, the machine, the date, what was run, how long it took.
pub(super) fn run_header(took: Duration, opts: &Options) -> String {
    let git = |args: &[&str]| {
        output(
            Command::new("git")
                .args(args)
                .current_dir(crate::workspace_root()),
        )
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|e| format!("unknown ({e})"))
    };
    let dirty = if git(&["status", "--porcelain", "--untracked-files=no"]).is_empty() {
        ""
    } else {
        " with uncommitted changes"
    };
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|m| m.trim_start_matches([' ', '\t', ':']).to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let what = if opts.ci {
        "`cargo xtask test`'s matrix".to_owned()
    } else {
        let list = |v: &[String], all: &str| {
            if v.is_empty() {
                all.to_owned()
            } else {
                v.join(" ")
            }
        };
        format!(
            "`cargo xtask vm` (kernels: {}; modes: {}; suites: {}; repeat {})",
            list(&opts.kernels, "default"),
            list(&opts.modes, "all"),
            list(&opts.suites, "all"),
            opts.repeat.max(1)
        )
    };
    format!(
        "{what} at {}{dirty}, {}, on {cpus} x {cpu} (host kernel {}): {:.1} minutes",
        git(&["rev-parse", "--short", "HEAD"]),
        git(&["log", "-1", "--format=%cd", "--date=short"]),
        std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .unwrap_or_default()
            .trim(),
        took.as_secs_f64() / 60.0
    )
}

/// Rewrites the plan in docs/testing.md, and the last run's table if a run left one.
pub fn write_docs(test_budget_min: u64) -> Result<()> {
    let path = crate::workspace_root().join("docs/testing.md");
    let docs =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let plan = format!("\n{}\n", render(test_budget_min).trim());
    let Some(mut docs) = splice(&docs, PLAN_BEGIN, PLAN_END, &plan) else {
        bail!(
            "{} has no plan markers ({PLAN_BEGIN} ... {PLAN_END})",
            path.display()
        );
    };
    let last = crate::workspace_root().join(LAST_RUN);
    let last_run = std::fs::read_to_string(&last).ok();
    // A narrowed run (some kernels, modes or suites) would stand in for the whole matrix.
    if let Some(run) = last_run.as_deref().filter(|run| !is_whole_run(run)) {
        eprintln!(
            "xtask: kept docs/testing.md's last run: {} is not a whole matrix run ({})",
            last.display(),
            run.lines().next().unwrap_or("")
        );
    }
    if let Some(run) = last_run.filter(|run| is_whole_run(run)) {
        let run = format!("\n{}\n", run.trim());
        docs = splice(&docs, RUN_BEGIN, RUN_END, &run).with_context(|| {
            format!(
                "{} has no last-run markers ({RUN_BEGIN} ...)",
                path.display()
            )
        })?;
        eprintln!("xtask: copied {} into docs/testing.md", last.display());
    }
    std::fs::write(&path, docs).with_context(|| format!("writing {}", path.display()))
}

/// Whether a run's table (its header line first) is of the whole matrix: `cargo xtask
/// test`'s, or `cargo xtask vm` narrowed to nothing.
fn is_whole_run(run: &str) -> bool {
    run.contains("`cargo xtask test`'s matrix")
        || run.contains("(kernels: default; modes: all; suites: all; repeat 1)")
}

/// A cell's suites and what it leaves out, as the plan lists them (ends with a newline).
fn describe_cell(c: &Cell) -> String {
    let suites: Vec<String> = c
        .suites
        .iter()
        .map(|(s, f)| match f {
            Some(f) => format!("{s}[{f}]"),
            None => (*s).to_owned(),
        })
        .collect();
    let mut t = if let Some(why) = c.ci_mode_left_out {
        format!("left out by CI: {why}\n")
    } else if c.runs_mode {
        format!("{}\n", suites.join(" "))
    } else {
        format!(
            "refused by backlogd on this kernel: {} (proves the refusal, its cause and \
             auto's choice)\n",
            suites.join(" ")
        )
    };
    for (suite, test, why) in &c.not_run {
        let _ = writeln!(t, "  - not run: {suite}::{test}: {why}");
    }
    for (suite, why) in &c.ci_left_out {
        let _ = writeln!(t, "  - left out by CI: {suite}: {why}");
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(label: &str) -> &'static KernelSpec {
        KERNELS.iter().find(|k| k.label == label).expect("a kernel")
    }

    #[test]
    fn the_refusal_test_runs_only_where_something_is_refused() {
        let full = spec("debian-6.1");
        let c = cell(full, "fentry", GUEST_SUITES, true);
        assert!(c.runs_mode);
        assert_eq!(
            c.not_run,
            [(
                "cli",
                "hook_mode_the_kernel_lacks_is_refused_with_the_fix",
                NOT_APPLICABLE[0].why
            )]
        );
        for k in KERNELS.iter().filter(|k| !(k.caps.fentry && k.caps.kprobe)) {
            for mode in MODES {
                assert!(cell(k, mode, GUEST_SUITES, true).not_run.is_empty());
            }
        }
    }

    #[test]
    fn ci_leaves_a_mode_out_only_where_the_plan_says_and_vm_runs_it_everywhere() {
        for (mode, on, _) in CI_MODE_KERNELS {
            for k in KERNELS.iter().filter(|k| k.caps.runs(mode)) {
                let ci = cell(k, mode, GUEST_SUITES, true);
                assert_eq!(ci.ci_mode_left_out.is_some(), !on.contains(&k.label));
                assert_eq!(ci.suites.is_empty(), !on.contains(&k.label));
                let vm = cell(k, mode, GUEST_SUITES, false);
                assert!(vm.ci_mode_left_out.is_none() && !vm.suites.is_empty());
            }
        }
        // fentry, what `auto` picks on every Debian kernel, is never left out.
        assert!(CI_MODE_KERNELS.iter().all(|(m, _, _)| *m != "fentry"));
        // The oldest kernel CI boots runs every mode; the newest, every mode that traces
        // kernel functions (tracepoint mode's newest is the host's kernel, in the host suite).
        for (label, modes) in [
            ("debian-5.10", MODES),
            ("trixie-backports", &["fentry", "kprobe"][..]),
        ] {
            for mode in modes {
                assert!(
                    cell(spec(label), mode, GUEST_SUITES, true)
                        .ci_mode_left_out
                        .is_none()
                );
            }
        }
    }

    #[test]
    fn every_suite_has_a_budget_and_every_budget_a_suite() {
        for (suite, _) in GUEST_SUITES {
            assert!(budget_secs(suite).is_some(), "{suite} has no budget");
        }
        for (suite, _) in SUITE_BUDGET_SECS {
            assert!(
                GUEST_SUITES.iter().any(|(s, _)| s == suite),
                "budget for unknown suite {suite}"
            );
        }
    }

    /// The expected skips of kprobe mode's pinning are exactly the kernels whose
    /// capability table says kprobe links cannot pin.
    #[test]
    fn expected_pinning_skips_follow_the_capability_table() {
        for k in KERNELS {
            let listed = crate::marks::expected(k.label, "kprobe")
                .filter(|e| e.test.starts_with("pinning::"))
                .count();
            let expected = if k.caps.kprobe && !k.caps.perf_link_pinning {
                5
            } else {
                0
            };
            assert_eq!(listed, expected, "{}", k.label);
        }
    }

    /// docs/testing.md's last run is a whole run of this plan: every cell it runs (`cargo
    /// xtask test`'s cells, or all of them for a whole `cargo xtask vm`) has its row (a plan changed since the run recorded there fails here).
    #[test]
    fn the_last_run_recorded_is_a_whole_run_of_this_plan() {
        let docs = std::fs::read_to_string(crate::workspace_root().join("docs/testing.md"))
            .expect("docs/testing.md");
        let block = between(&docs, RUN_BEGIN, RUN_END).expect("the last run's markers");
        let ci = block.contains("`cargo xtask test`'s matrix");
        assert!(
            is_whole_run(block),
            "docs/testing.md's last run is not a whole matrix run: {block}"
        );
        for k in KERNELS.iter().filter(|k| k.default) {
            for mode in MODES {
                // `cargo xtask test` leaves some cells out (CI_MODE_KERNELS): no row.
                if ci && cell(k, mode, GUEST_SUITES, true).ci_mode_left_out.is_some() {
                    continue;
                }
                let row = format!("\n{:<17} {:<11} ", k.label, mode);
                assert!(
                    block.contains(&row),
                    "no row {} x {mode} in docs/testing.md's last run",
                    k.label
                );
            }
        }
    }

    /// docs/testing.md carries the plan as `cargo xtask vm --plan` prints it.
    #[test]
    fn docs_testing_carries_the_plan() {
        let docs = std::fs::read_to_string(crate::workspace_root().join("docs/testing.md"))
            .expect("docs/testing.md");
        let block = between(&docs, PLAN_BEGIN, PLAN_END).expect("the plan's markers");
        assert_eq!(
            block.trim(),
            render(crate::TEST_BUDGET_MIN).trim(),
            "docs/testing.md's plan is not what the code runs: `cargo xtask vm --plan \
             --write-docs` rewrites it"
        );
    }
}
