//! `cargo xtask vm`: the kernel matrix. Boots Debian's cloud kernels under qemu (TCG: the
//! CI machine cannot nest KVM) with an initramfs holding backlogd, the hook-mode
//! integration suites and the tools they drive, runs the suites once per hook mode inside
//! the guest, and prints a pass/fail table per kernel x mode.
//!
//! The guest runs the same assertions as the host: backlogd's figures must equal the
//! guest kernel's own counters. That is where struct offsets of 6.1 and 6.12 (resolved
//! from their BTF at load time) and the fentry/kprobe programs are proven.

use std::{
    collections::BTreeSet,
    fmt::Write as _,
    io::{BufRead as _, BufReader},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

use crate::setup::output;

mod console;

pub(crate) use self::console::{LOCKUPS_PANIC, qemu, wait_for_qemu};
mod image;
mod kernels;
pub(crate) mod plan;
mod report;

// The guest bench (`bench/guest.rs`) boots the matrix's kernels with the matrix's initramfs.
pub(crate) use self::{
    console::guest_crash,
    image::{Payload, build_initramfs},
    kernels::{KERNELS, fetch_kernel},
};

use self::{console::*, image::*, kernels::*, plan::*, report::*};

pub const MODES: &[&str] = &["fentry", "kprobe", "tracepoint"];

/// Labels of every kernel `cargo xtask vm --kernel` knows.
#[cfg(test)]
pub fn kernel_labels() -> impl Iterator<Item = &'static str> {
    KERNELS.iter().map(|k| k.label)
}

/// A guest that has not powered off by then is killed and its rows fail.
const GUEST_TIMEOUT: Duration = Duration::from_secs(30 * 60);

pub(crate) const MARK: &str = "@@backlogd-vm";

pub struct Options {
    /// Kernel labels to boot (all when empty).
    pub kernels: Vec<String>,
    /// Hook modes to run (all when empty).
    pub modes: Vec<String>,
    /// Suites to run (all of [`GUEST_SUITES`] when empty).
    pub suites: Vec<String>,
    /// Runs of each suite per boot (flaky-test hunting); 1 when 0.
    pub repeat: u32,
    /// `cargo xtask test`'s plan: leave out what [`plan::CI_SUITE_KERNELS`] says, saying
    /// so in the table.
    pub ci: bool,
    /// When the whole matrix must be over (`cargo xtask test`: CI's limit, less a margin).
    /// Boots are cut short to end by then; a kernel with too little time left is not
    /// booted. Either way its rows fail, saying so.
    pub deadline: Option<Instant>,
}

/// A kernel is not booted with less time than this left before the deadline: a boot
/// alone takes a minute under TCG, and a row cut short proves nothing either way.
const MIN_BOOT_TIME: Duration = Duration::from_secs(4 * 60);

/// One kernel x mode cell of the table.
struct Row {
    kernel: String,
    mode: String,
    passed: u64,
    failed: u64,
    /// Suites that did not report a result (crashed, timed out, or failed to start).
    broken: Vec<String>,
    /// Per `suite::test`: (runs that finished, runs that passed).
    tests: std::collections::BTreeMap<String, (u32, u32)>,
    /// What the tests marked (skips, not-exact checks), in console order.
    marks: Vec<crate::marks::Mark>,
    /// Taint flags the kernel gained during a suite: (suite, flags), e.g. a WARN (`W`).
    tainted: Vec<(String, String)>,
    /// Guest seconds of each suite run that ended: (suite, secs).
    durations: Vec<(String, u64)>,
}

impl Row {
    /// The row's marks judged against the expected lists.
    fn judged(&self) -> crate::marks::Judged {
        let ran: Vec<String> = self.tests.keys().cloned().collect();
        crate::marks::judge(&self.kernel, &self.mode, &self.marks, &ran)
    }

    /// Passes that checked: libtest's passes less the skips.
    fn checked(&self) -> u64 {
        let skips = self
            .marks
            .iter()
            .filter(|m| m.kind == crate::marks::Kind::Skip)
            .count() as u64;
        self.passed.saturating_sub(skips)
    }

    fn ok(&self) -> bool {
        self.failed == 0
            && self.broken.is_empty()
            && self.tainted.is_empty()
            && self.checked() > 0
            && self.judged().ok()
    }
}

pub fn run(opts: &Options) -> Result<()> {
    let modes: Vec<&str> = if opts.modes.is_empty() {
        MODES.to_vec()
    } else {
        opts.modes.iter().map(String::as_str).collect()
    };
    for m in &modes {
        if !MODES.contains(m) {
            bail!(
                "unknown hook mode {m:?}; the modes are {}",
                MODES.join(", ")
            );
        }
    }
    let kernels: Vec<&KernelSpec> = KERNELS
        .iter()
        .filter(|k| {
            if opts.kernels.is_empty() {
                k.default
            } else {
                opts.kernels.iter().any(|l| l == k.label)
            }
        })
        .collect();
    if kernels.is_empty() {
        let known: Vec<_> = KERNELS.iter().map(|k| k.label).collect();
        bail!(
            "no such kernel {:?}; known: {}",
            opts.kernels,
            known.join(", ")
        );
    }
    for s in &opts.suites {
        if !GUEST_SUITES.iter().any(|(n, _)| n == s) {
            let known: Vec<_> = GUEST_SUITES.iter().map(|(n, _)| *n).collect();
            bail!(
                "unknown suite {s:?}; the guest suites are {}",
                known.join(", ")
            );
        }
    }
    let all_suites: Vec<(&str, Option<&str>)> = GUEST_SUITES
        .iter()
        .filter(|(n, _)| opts.suites.is_empty() || opts.suites.iter().any(|s| s == n))
        .copied()
        .collect();
    let payload = build_payload()?;
    let mut rows = Vec::new();
    let mut excerpts = String::new();
    let mut crashes = Vec::new();
    let mut notes = Vec::new();
    let mut out_of_time = Vec::new();
    // Boots begun again after the TCG text-poke crash (`is_tcg_text_poke`).
    let mut retried = 0;
    let started = Instant::now();
    for spec in kernels {
        let kernel = fetch_kernel(spec)?;
        let work = crate::workspace_root().join("target/vm").join(spec.label);
        let mut runs = Vec::new();
        // The modes this kernel runs (CI leaves some out): one table row each.
        let mut kernel_modes = Vec::new();
        for mode in &modes {
            let cell = plan::cell(spec, mode, &all_suites, opts.ci);
            if let Some(why) = cell.ci_mode_left_out {
                notes.push(format!(
                    "{} x {mode}: NOT RUN by `cargo xtask test` ({why}); `cargo xtask vm` \
                     runs it",
                    spec.label
                ));
                continue;
            }
            kernel_modes.push(*mode);
            if !cell.runs_mode {
                notes.push(format!(
                    "{} x {mode}: refused by backlogd on this kernel, as the capability \
                     table expects; the row is cli[hook_mode], which proves the refusal, \
                     its cause and auto's choice",
                    spec.label
                ));
            }
            for (suite, why) in &cell.ci_left_out {
                notes.push(format!(
                    "{} x {mode}: suite {suite} NOT RUN by `cargo xtask test` ({why}); \
                     `cargo xtask vm` runs it",
                    spec.label
                ));
            }
            for (suite, test, why) in &cell.not_run {
                notes.push(format!(
                    "{} x {mode}: {suite}::{test} not run: {why}",
                    spec.label
                ));
            }
            let skips: Vec<(&str, &str)> = cell.not_run.iter().map(|(s, t, _)| (*s, *t)).collect();
            runs.extend(suite_runs(mode, &cell.suites, opts.repeat.max(1), &skips));
        }
        let caps = format!("export BACKLOGD_KERNEL_CAPS=\"{}\"\n", spec.caps.env());
        // Runs finished in earlier boots, and their console output.
        let mut done = 0;
        let mut transcript = String::new();
        // Runs a kernel never got to because the time budget ran out.
        let mut unrun: &[String] = &[];
        for boot_no in 0..=GUEST_CRASH_REBOOTS {
            let left = opts
                .deadline
                .map(|d| d.saturating_duration_since(Instant::now()));
            if left.is_some_and(|left| left < MIN_BOOT_TIME) {
                out_of_time.push(format!(
                    "{}: {} of its {} runs NOT RUN: the matrix's time budget ran out \
                     before this kernel's boot {} ({} s left); `cargo xtask vm --kernel {}` \
                     runs them",
                    spec.label,
                    runs.len() - done,
                    runs.len(),
                    boot_no + 1,
                    left.unwrap_or_default().as_secs(),
                    spec.label
                ));
                unrun = &runs[done..];
                break;
            }
            let limit = left.map_or(GUEST_TIMEOUT, |left| left.min(GUEST_TIMEOUT));
            let initrd = build_initramfs(
                &work,
                &kernel,
                &payload,
                &(caps.clone() + &runs[done..].concat()),
            )?;
            let log = work.join(match boot_no {
                0 => "console.log".to_owned(),
                n => format!("console-{n}.log"),
            });
            eprintln!(
                "xtask vm: booting {} ({}) under qemu TCG; console log: {}",
                spec.label,
                kernel.package,
                log.display()
            );
            let started = Instant::now();
            let outcome = boot(&kernel, &initrd, &log, limit);
            let console = std::fs::read_to_string(&log).unwrap_or_default();
            let crash = guest_crash(&console);
            let (finished, output) = finished_runs(&console);
            let during = runs
                .get(done + finished)
                .map_or("after the last suite", |r| r.trim_end());
            if outcome.is_err() && started.elapsed() >= limit && crash.is_none() {
                let cut = if limit < GUEST_TIMEOUT {
                    format!(
                        "cut short at {} s by the matrix's time budget (a guest gets {} s \
                         otherwise)",
                        limit.as_secs(),
                        GUEST_TIMEOUT.as_secs()
                    )
                } else {
                    format!("killed at the guest's {} s limit", limit.as_secs())
                };
                out_of_time.push(format!(
                    "{}: boot {} was {cut} during `{during}`; {} later runs did not run",
                    spec.label,
                    boot_no + 1,
                    runs.len().saturating_sub(done + finished + 1)
                ));
                // The run it was in has no end; the ones after it fail their rows too.
                unrun = runs.get(done + finished + 1..).unwrap_or_default();
            }
            eprintln!(
                "xtask vm: {} finished in {:.0} s{}",
                spec.label,
                started.elapsed().as_secs_f64(),
                match &outcome {
                    Ok(()) => String::new(),
                    Err(e) => format!(": {e:#}"),
                }
            );
            let Some(crash) = crash else {
                transcript.push_str(&console);
                break;
            };
            eprintln!(
                "xtask vm: THE GUEST KERNEL CRASHED on {} during `{during}`:\n{crash}",
                spec.label
            );
            transcript.push_str(output);
            done += finished;
            let first_line = crash.lines().next().unwrap_or("").trim().to_owned();
            // Only the emulation's own text-patching crash is retried; anything else the
            // guest kernel did (a lockup, a stall, a GPF, a BUG, another Oops) fails the
            // row, with the rest of this kernel's runs not run.
            if is_tcg_text_poke(&crash) && boot_no < GUEST_CRASH_REBOOTS && done < runs.len() {
                retried += 1;
                crashes.push(format!(
                    "{}: the guest kernel died of QEMU TCG's text patching during `{during}` \
                     ({first_line}, kernel log in the CI log above); that run and the rest \
                     ran again in a fresh boot",
                    spec.label,
                ));
                continue;
            }
            let what = if is_lockup(&crash) {
                "LOCKED UP"
            } else if is_tcg_text_poke(&crash) {
                "CRASHED (TCG text poke, out of reboots)"
            } else {
                "CRASHED"
            };
            crashes.push(format!(
                "{}: THE GUEST KERNEL {what} during `{during}` ({first_line}, kernel log in \
                 the CI log above); the rest of this kernel's runs did not run",
                spec.label,
            ));
            transcript.push_str(&console[output.len()..]);
            // The run that crashed has a begin and no end; the ones after it never began.
            unrun = runs.get(done + 1..).unwrap_or_default();
            break;
        }
        let mut kernel_rows = parse_console(spec.label, &transcript, &kernel_modes);
        mark_unrun(&mut kernel_rows, unrun);
        rows.extend(kernel_rows);
        excerpts.push_str(&failure_excerpts(spec.label, &transcript));
    }
    // The failing suites' own output, so a CI log says what failed without the console
    // logs (which stay on the CI machine).
    eprint!("{excerpts}");
    let mut table = render_table(&rows, &all_suites, opts.repeat);
    for crash in &crashes {
        let _ = writeln!(table, "GUEST CRASH: {crash}");
    }
    let _ = writeln!(
        table,
        "guest boots begun again after QEMU TCG's text-poke crash (the only crash retried): \
         {retried}"
    );
    for what in &out_of_time {
        let _ = writeln!(table, "OUT OF TIME: {what}");
    }
    for note in &notes {
        let _ = writeln!(table, "NOTE: {note}");
    }
    println!("{table}");
    // For docs/testing.md (`cargo xtask vm --plan --write-docs` copies it there).
    let summary = format!(
        "{}\n\n```\n{}```\n",
        plan::run_header(started.elapsed(), opts),
        table
    );
    let path = crate::workspace_root().join(plan::LAST_RUN);
    if let Err(e) = std::fs::write(&path, summary) {
        eprintln!("xtask vm: could not write {}: {e}", path.display());
    }
    let failed: Vec<String> = rows
        .iter()
        .filter(|r| !r.ok())
        .map(|r| format!("{} x {}", r.kernel, r.mode))
        .collect();
    if !failed.is_empty() {
        bail!(
            "kernel matrix: {} failed (console logs under target/vm/)",
            failed.join(", ")
        );
    }
    Ok(())
}
