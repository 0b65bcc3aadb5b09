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
mod report;

// The guest bench (`bench/guest.rs`) boots the matrix's kernels with the matrix's initramfs.
pub(crate) use self::{
    console::guest_crash,
    image::{Payload, build_initramfs},
    kernels::{KERNELS, fetch_kernel},
};

use self::{console::*, image::*, kernels::*, report::*};

pub const MODES: &[&str] = &["fentry", "kprobe", "tracepoint"];

/// Integration suites that exercise the hook modes, with an optional test-name filter.
/// (The exporter, nginx, Prometheus and terminal suites do not depend on the mode and run
/// on the host.)
const GUEST_SUITES: &[(&str, Option<&str>)] = &[
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
];

/// What runs in a mode the kernel cannot run: the refusal test.
const REFUSAL_SUITE: &[(&str, Option<&str>)] = &[("cli", Some("hook_mode"))];

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
    /// Leave out the tests in [`CI_SKIPS`] (`cargo xtask test`), saying so in the table.
    pub ci: bool,
    /// When the whole matrix must be over (`cargo xtask test`: CI's limit, less a margin).
    /// Boots are cut short to end by then; a kernel with too little time left is not
    /// booted. Either way its rows fail, saying so.
    pub deadline: Option<Instant>,
}

/// A kernel is not booted with less time than this left before the deadline: a boot
/// alone takes a minute under TCG, and a row cut short proves nothing either way.
const MIN_BOOT_TIME: Duration = Duration::from_secs(4 * 60);

/// Tests `cargo xtask test` leaves out of the matrix, each with the reason; `cargo xtask
/// vm` runs them. (kernel, mode, suite, test, reason). Empty: the one that was here
/// (reuseport on 6.1 in kprobe mode, see backlogd-ebpf/src/kprobe.rs) is fixed.
const CI_SKIPS: &[(&str, &str, &str, &str, &str)] = &[];

/// Suites `cargo xtask test` runs only on some kernels, to keep CI well inside its 90
/// minutes: (suite, kernels, reason). `cargo xtask vm` runs them everywhere.
const CI_SUITE_KERNELS: &[(&str, &[&str], &str)] = &[
    (
        "stress",
        &["debian-5.10", "trixie-backports"],
        "the heaviest suite; CI runs it on the oldest and the newest kernel until it has been \
         green on every kernel there",
    ),
    (
        "client_impact",
        &["debian-5.10", "trixie-backports"],
        "its tests wait out real SYN retries and a horizon (about 40 s per mode); CI runs it \
         on the oldest and the newest kernel",
    ),
];

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
}

impl Row {
    fn ok(&self) -> bool {
        self.failed == 0 && self.broken.is_empty() && self.passed > 0
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
    for spec in kernels {
        let suites: Vec<(&str, Option<&str>)> = all_suites
            .iter()
            .filter(|(suite, _)| {
                let left_out = CI_SUITE_KERNELS
                    .iter()
                    .find(|(s, on, _)| opts.ci && s == suite && !on.contains(&spec.label));
                if let Some((s, on, why)) = left_out {
                    notes.push(format!(
                        "{} x every mode: suite {s} NOT RUN by `cargo xtask test` ({why}: {}); \
                         `cargo xtask vm` runs it",
                        spec.label,
                        on.join(", ")
                    ));
                }
                left_out.is_none()
            })
            .copied()
            .collect();
        let kernel = fetch_kernel(spec)?;
        let work = crate::workspace_root().join("target/vm").join(spec.label);
        let skips: Vec<(&str, &str, &str)> = CI_SKIPS
            .iter()
            .filter(|s| opts.ci && s.0 == spec.label)
            .map(|s| (s.1, s.2, s.3))
            .collect();
        // A mode the kernel cannot run gets the test that proves backlogd refuses it
        // (and what `auto` picks instead), not suites that need a daemon in that mode.
        let mut runs = Vec::new();
        for mode in &modes {
            let suites: &[(&str, Option<&str>)] = if spec.caps.runs(mode) {
                &suites
            } else {
                notes.push(format!(
                    "{} x {mode}: refused by backlogd on this kernel, as the capability \
                     table expects; the row is cli[hook_mode], which proves the refusal, \
                     its cause and auto's choice",
                    spec.label
                ));
                REFUSAL_SUITE
            };
            runs.extend(suite_runs(&[mode], suites, opts.repeat.max(1), &skips));
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
            // A lockup or stall is what backlogd must never cause: it fails the row, and the
            // rest is not run again (unlike a crash of the emulation's own text patching).
            if is_lockup(&crash) {
                crashes.push(format!(
                    "{}: THE GUEST KERNEL LOCKED UP during `{during}` ({}, kernel log in the \
                     CI log above); the rest of this kernel's runs did not run",
                    spec.label,
                    crash.lines().next().unwrap_or("").trim()
                ));
                transcript.push_str(&console[output.len()..]);
                break;
            }
            if boot_no < GUEST_CRASH_REBOOTS && done < runs.len() {
                crashes.push(format!(
                    "{}: the guest kernel crashed during `{during}` ({}, kernel log in the \
                     CI log above); that run and the rest ran again in a fresh boot",
                    spec.label,
                    crash.lines().next().unwrap_or("").trim()
                ));
            } else {
                transcript.push_str(&console[output.len()..]);
                break;
            }
        }
        let mut kernel_rows = parse_console(spec.label, &transcript, &modes);
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
    for what in &out_of_time {
        let _ = writeln!(table, "OUT OF TIME: {what}");
    }
    for note in &notes {
        let _ = writeln!(table, "NOTE: {note}");
    }
    for (kernel, mode, suite, test, why) in CI_SKIPS.iter().filter(|_| opts.ci) {
        let _ = writeln!(
            table,
            "NOT RUN here: {kernel} x {mode}: {suite}::{test}: {why}. `cargo xtask vm` runs it."
        );
    }
    println!("{table}");
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
