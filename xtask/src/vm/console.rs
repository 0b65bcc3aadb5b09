//! Booting a guest under qemu and reading its console: the runs it finished, crashes and
//! lockups, failure excerpts.

use super::*;

/// How often a kernel is booted again after its guest kernel died of the emulation's own
/// text patching ([`is_tcg_text_poke`]); every other crash fails the row at once. Three:
/// trixie's 6.12 crashed so twice in a row on this machine kind (kprobe syn_drops, then
/// tracepoint syn_drops), which one reboot could not absorb.
pub(super) const GUEST_CRASH_REBOOTS: usize = 3;

/// Whether a guest crash is the one QEMU's multi-threaded TCG is known to cause, which says
/// nothing about the suites: `Oops: int3` (an int3 that `text_poke_bp` left behind while a
/// tracepoint or trampoline was switched on, still executed by the other vCPU; seen in
/// `syscall_exit_to_user_mode_prepare` and in the kernel's own text patching). Only this is
/// retried (in a fresh boot, from the run that crashed); a lockup, a stall, a general
/// protection fault, a BUG or any other Oops fails its row with the kernel's report.
pub(super) fn is_tcg_text_poke(crash: &str) -> bool {
    crash.lines().next().is_some_and(is_int3_oops)
}

/// The first line of an int3 Oops: `Oops: int3: 0000 [#1] PREEMPT SMP NOPTI` (6.x) or
/// `int3: 0000 [#1] SMP NOPTI` (5.10 prints no `Oops:`).
fn is_int3_oops(line: &str) -> bool {
    line.contains("int3: ") && line.contains(" [#")
}

/// Whether a guest crash report is a soft lockup or an RCU stall (the kernel hung).
pub(super) fn is_lockup(crash: &str) -> bool {
    crash.contains("soft lockup")
        || crash.contains("rcu_sched self-detected stall")
        || crash.contains("rcu_preempt self-detected stall")
        || crash.contains("RCU Stall")
}

/// The kernel's own report if the guest kernel crashed: from the first oops or BUG line
/// to the panic line (at most 160 lines: a lockup prints every CPU's backtrace).
pub(crate) fn guest_crash(console: &str) -> Option<String> {
    let lines: Vec<&str> = console.lines().map(|l| l.trim_end_matches('\r')).collect();
    let panic = lines
        .iter()
        .position(|l| l.contains("Kernel panic - not syncing"))?;
    let start = lines[..panic]
        .iter()
        .position(|l| {
            is_int3_oops(l)
                || [
                    "Oops:",
                    "BUG:",
                    "general protection fault",
                    "------------[ cut here ]",
                    "self-detected stall",
                    "detected stalls on CPUs",
                ]
                .iter()
                .any(|m| l.contains(m))
        })
        .unwrap_or(panic);
    let end = (panic + 1).min(start + 160);
    Some(lines[start..end].join("\n"))
}

/// The number of suite runs that ended in `console`, and the console up to the last end.
pub(super) fn finished_runs(console: &str) -> (usize, &str) {
    let marker = format!("{MARK} end ");
    let mut count = 0;
    let mut upto = 0;
    let mut pos = 0;
    for line in console.split_inclusive('\n') {
        pos += line.len();
        if line.contains(&marker) {
            count += 1;
            upto = pos;
        }
    }
    (count, &console[..upto])
}

/// Each suite run that ended with a non-zero status, tainted the kernel, or never ended,
/// with its output (a tainting run's includes the kernel log the guest printed for it).
pub(super) fn failure_excerpts(kernel: &str, console: &str) -> String {
    let mut out = String::new();
    let mut current: Option<(String, Vec<&str>)> = None;
    for line in console.lines() {
        let line = line.trim_end_matches('\r');
        if let Some(rest) = line.split(&format!("{MARK} begin ")).nth(1) {
            current = Some((rest.trim().to_owned(), Vec::new()));
        } else if let Some(rest) = line.split(&format!("{MARK} end ")).nth(1) {
            if let Some((what, lines)) = current.take() {
                let tainted = lines
                    .iter()
                    .any(|l| l.contains(&format!("{MARK} tainted ")));
                if !rest.trim_end().ends_with("rc=0") || tainted {
                    let _ = writeln!(out, "---- {kernel} {what}: {}", rest.trim());
                    for l in lines {
                        let _ = writeln!(out, "{l}");
                    }
                }
            }
        } else if let Some((_, lines)) = current.as_mut() {
            lines.push(line);
        }
    }
    if let Some((what, lines)) = current {
        let _ = writeln!(
            out,
            "---- {kernel} {what}: no end (guest died or timed out)"
        );
        for l in lines.iter().rev().take(200).rev() {
            let _ = writeln!(out, "{l}");
        }
    }
    out
}

/// Kernel command line of every guest: a soft lockup or an RCU stall panics it (so it
/// ends at once, and the panic's report names it) with every CPU's backtrace.
pub(crate) const LOCKUPS_PANIC: &str =
    "softlockup_panic=1 softlockup_all_cpu_backtrace=1 sysctl.kernel.panic_on_rcu_stall=1";

/// Kernel command line of the matrix's guests: an Oops panics, so it ends the boot and is
/// judged (retried only if [`is_tcg_text_poke`]) instead of leaving a half-dead kernel
/// behind. A WARN does not panic; the taint flags read after each suite catch it
/// (`tainted` lines, see image.rs).
pub(crate) const OOPS_PANIC: &str = "oops=panic";

/// qemu for a 2-vCPU TCG guest (no KVM here) with `memory_mib`, no network, no display,
/// booting `vmlinuz` with `initrd`; the caller adds disks and the command line.
pub(crate) fn qemu(memory_mib: u32, vmlinuz: &Path, initrd: &Path) -> Command {
    let mut cmd = Command::new("qemu-system-x86_64");
    cmd.args([
        "-accel",
        "tcg,thread=multi",
        "-cpu",
        "max",
        "-smp",
        "2",
        "-m",
    ])
    .arg(memory_mib.to_string())
    .args(["-nographic", "-no-reboot", "-nic", "none"])
    .arg("-kernel")
    .arg(vmlinuz)
    .arg("-initrd")
    .arg(initrd);
    cmd
}

/// Boots the kernel with the initramfs; the serial console goes to `log`. The guest is
/// killed if it has not powered off after `limit`.
pub(super) fn boot(kernel: &Kernel, initrd: &Path, log: &Path, limit: Duration) -> Result<()> {
    let log_file = std::fs::File::create(log)?;
    let mut child = qemu(3072, &kernel.vmlinuz, initrd)
        .arg("-append")
        .arg(format!(
            "console=ttyS0 panic=-1 quiet loglevel=3 mitigations=off {LOCKUPS_PANIC} {OOPS_PANIC}"
        ))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(log_file.try_clone()?)
        .spawn()
        .context("starting qemu-system-x86_64 (Debian package qemu-system-x86)")?;
    let stdout = child.stdout.take().expect("piped");
    let deadline = Instant::now() + limit;
    let reader = std::thread::spawn(move || -> std::io::Result<()> {
        use std::io::Write as _;
        let mut log_file = log_file;
        for line in BufReader::new(stdout).lines() {
            let line = line?;
            // Progress in the CI log: one line per suite.
            if let Some(at) = line.find(MARK)
                && [" end ", " kernel ", " slow ", " stuck "]
                    .iter()
                    .any(|w| line.contains(w))
            {
                eprintln!("xtask vm: {}", line[at..].trim_end());
            }
            writeln!(log_file, "{line}")?;
        }
        Ok(())
    });
    wait_for_qemu(&mut child, reader, deadline, limit, || None)
}

/// Waits for qemu to exit (the guest powers off), killing it at `deadline` or as soon as
/// `hung` names a reason (checked every 200 ms; the error is that reason); `reader` is the
/// thread copying its console, joined either way.
pub(crate) fn wait_for_qemu(
    child: &mut std::process::Child,
    reader: std::thread::JoinHandle<std::io::Result<()>>,
    deadline: Instant,
    limit: Duration,
    hung: impl Fn() -> Option<String>,
) -> Result<()> {
    loop {
        if let Some(status) = child.try_wait()? {
            let _ = reader.join();
            if !status.success() {
                bail!("qemu exited with {status}");
            }
            return Ok(());
        }
        let why = hung();
        if why.is_some() || Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            let _ = reader.join();
            bail!(
                "{}",
                why.unwrap_or_else(|| format!(
                    "the guest did not power off within {} s and was killed",
                    limit.as_secs()
                ))
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Rows for every mode requested, from the markers and `test result:` lines on the console.
pub(super) fn parse_console(kernel: &str, console: &str, modes: &[&str]) -> Vec<Row> {
    let mut rows: Vec<Row> = modes
        .iter()
        .map(|m| Row {
            kernel: kernel.to_owned(),
            mode: (*m).to_owned(),
            passed: 0,
            failed: 0,
            broken: Vec::new(),
            tests: Default::default(),
            marks: Vec::new(),
            tainted: Vec::new(),
            durations: Vec::new(),
        })
        .collect();
    let mut current: Option<(usize, String, bool)> = None; // (row, suite, saw a result)
    // The run's tests (`test NAME ... `) and the names listed under its last `failures:`.
    let mut started: Vec<String> = Vec::new();
    let mut failed: Vec<String> = Vec::new();
    let mut in_failures = false;
    for line in console.lines() {
        let line = line.trim_end_matches('\r');
        if let Some(mark) = crate::marks::Mark::parse(line) {
            if let Some((i, _, _)) = current.as_ref() {
                rows[*i].marks.push(mark);
            }
            continue;
        }
        if let Some(rest) = line.split(&format!("{MARK} tainted ")).nth(1) {
            // `mode=X suite=Y flags=LETTERS`: flags the kernel gained during that run.
            let (mode, suite) = fields(rest);
            let flags = rest
                .split_whitespace()
                .find_map(|w| w.strip_prefix("flags="))
                .unwrap_or("?")
                .to_owned();
            if let Some(row) = rows.iter_mut().find(|r| r.mode == mode) {
                row.tainted.push((suite, flags));
            }
            continue;
        }
        if let Some(rest) = line.split(&format!("{MARK} begin ")).nth(1) {
            let (mode, suite) = fields(rest);
            current = rows
                .iter()
                .position(|r| r.mode == mode)
                .map(|i| (i, suite, false));
            (started, failed, in_failures) = (Vec::new(), Vec::new(), false);
        } else if let Some(rest) = line.split(&format!("{MARK} end ")).nth(1) {
            if let Some((i, suite, saw)) = current.take() {
                let rc_ok = rest.trim_end().ends_with("rc=0");
                if let Some(secs) = rest
                    .split_whitespace()
                    .find_map(|w| w.strip_prefix("secs="))
                    .and_then(|s| s.parse().ok())
                {
                    rows[i].durations.push((suite.clone(), secs));
                }
                if !saw || (!rc_ok && rows[i].failed == 0) {
                    rows[i].broken.push(suite);
                }
            }
        } else if let Some(rest) = line.strip_prefix("test result: ")
            && let Some((i, suite, saw)) = current.as_mut()
        {
            *saw = true;
            let counts = crate::TestCounts::parse(rest);
            rows[*i].passed += counts.passed;
            rows[*i].failed += counts.failed;
            // Only a run that reached its result line counts, per test.
            for test in started.drain(..) {
                let tally = rows[*i]
                    .tests
                    .entry(format!("{suite}::{test}"))
                    .or_default();
                tally.0 += 1;
                if !failed.contains(&test) {
                    tally.1 += 1;
                }
            }
        } else if line == "failures:" {
            // libtest prints the header twice: before the failures' output and before the
            // list of their names; the last one wins.
            (in_failures, failed) = (true, Vec::new());
        } else if in_failures && let Some(name) = line.strip_prefix("    ") {
            failed.push(name.trim().to_owned());
        } else if let Some(rest) = line.strip_prefix("test ")
            && let Some((name, _)) = rest.split_once(" ... ")
            && current.is_some()
        {
            in_failures = false;
            started.push(name.to_owned());
        }
    }
    if let Some((i, suite, _)) = current {
        rows[i]
            .broken
            .push(format!("{suite} (no end: guest died or timed out)"));
    }
    for row in &mut rows {
        let ran = console.contains(&format!("{MARK} begin mode={} ", row.mode));
        if !ran {
            row.broken.push("never ran".into());
        }
    }
    rows
}

/// Fails the rows of the runs (`run_suite MODE SUITE ...` lines) the time budget left
/// out: a row whose finished runs all passed is still not a pass when some never ran.
pub(super) fn mark_unrun(rows: &mut [Row], unrun: &[String]) {
    for row in rows {
        let prefix = format!("run_suite {} ", row.mode);
        let missing = unrun.iter().filter(|r| r.starts_with(&prefix)).count();
        if missing > 0 {
            row.broken
                .push(format!("{missing} runs not run: time budget"));
        }
    }
}

/// `mode=X suite=Y` -> (X, Y).
pub(super) fn fields(rest: &str) -> (String, String) {
    let get = |key: &str| {
        rest.split_whitespace()
            .find_map(|w| w.strip_prefix(key))
            .unwrap_or("")
            .to_owned()
    };
    (get("mode="), get("suite="))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn console_markers_become_rows() {
        let console = format!(
            "noise\n{MARK} begin mode=fentry suite=syn_drops\n\
             test result: ok. 6 passed; 0 failed; 0 ignored\n\
             {MARK} end mode=fentry suite=syn_drops rc=0\n\
             {MARK} begin mode=kprobe suite=syn_drops\n\
             test result: FAILED. 4 passed; 2 failed; 0 ignored\n\
             {MARK} end mode=kprobe suite=syn_drops rc=101\n\
             {MARK} begin mode=tracepoint suite=syn_drops\n\
             thread panicked\n"
        );
        let rows = parse_console("k", &console, &["fentry", "kprobe", "tracepoint"]);
        assert!(rows[0].ok());
        assert_eq!((rows[1].passed, rows[1].failed), (4, 2));
        assert!(!rows[1].ok() && rows[1].broken.is_empty());
        assert!(!rows[2].ok());
        assert_eq!(rows[2].broken.len(), 1, "{:?}", rows[2].broken);
    }

    #[test]
    fn repeated_runs_are_tallied_per_test() {
        let run = |failing: bool| {
            format!(
                "{MARK} begin mode=fentry suite=syn_drops\n\
                 running 2 tests\n\
                 test a ... REPORT written by the test\n\
                 ok\n\
                 test b ... {}\n\
                 {}\
                 test result: {}\n\
                 {MARK} end mode=fentry suite=syn_drops rc={}\n",
                if failing { "FAILED" } else { "ok" },
                if failing {
                    "\nfailures:\n\n---- b stdout ----\nleft 1\n\nfailures:\n    b\n\n"
                } else {
                    ""
                },
                if failing {
                    "FAILED. 1 passed; 1 failed; 0 ignored"
                } else {
                    "ok. 2 passed; 0 failed; 0 ignored"
                },
                if failing { 101 } else { 0 },
            )
        };
        let console = format!("{}{}{}", run(false), run(true), run(false));
        let rows = parse_console("k", &console, &["fentry"]);
        assert_eq!(rows[0].tests["syn_drops::a"], (3, 3));
        assert_eq!(rows[0].tests["syn_drops::b"], (3, 2));
        let table = per_test_table(&rows, 3);
        assert!(
            table.contains("syn_drops::a") && table.contains("3/3"),
            "{table}"
        );
        assert!(
            table.contains("syn_drops::b") && table.contains("2/3"),
            "{table}"
        );
        // A single pass lists only what failed.
        let once = per_test_table(&rows, 1);
        assert!(
            !once.contains("syn_drops::a") && once.contains("2/3"),
            "{once}"
        );
    }

    #[test]
    fn a_soft_lockup_is_a_crash_that_is_not_retried() {
        let console = format!(
            "{MARK} begin mode=kprobe suite=syn_drops\n\
             test accept_queue_full ... [  301.2] watchdog: BUG: soft lockup - CPU#1 stuck for 22s! [syn_drops-6a:412]\n\
             [  301.3] RIP: 0010:queued_spin_lock_slowpath+0x40/0x1a0\n\
             [  301.9] Kernel panic - not syncing: softlockup: hung tasks\n"
        );
        let crash = guest_crash(&console).expect("a crash");
        assert!(
            crash.starts_with("[  301.2] watchdog: BUG: soft lockup")
                || crash.contains("watchdog: BUG: soft lockup"),
            "{crash}"
        );
        assert!(is_lockup(&crash));
        let stall = "[ 99.0] rcu: INFO: rcu_sched self-detected stall on CPU\n[ 99.1] Kernel panic - not syncing: RCU Stall\n";
        assert!(is_lockup(&guest_crash(stall).expect("a stall")));
        let int3 = "[ 90.1] Oops: int3: 0000 [#1] PREEMPT SMP NOPTI\n[ 90.3] Kernel panic - not syncing: Fatal exception in interrupt\n";
        assert!(!is_lockup(&guest_crash(int3).expect("an oops")));
    }

    #[test]
    fn only_the_tcg_text_poke_crash_is_retried() {
        let int3 = "[ 90.1] Oops: int3: 0000 [#1] PREEMPT SMP NOPTI\n[ 90.3] Kernel panic - not syncing: Fatal exception in interrupt\n";
        assert!(is_tcg_text_poke(&guest_crash(int3).expect("a crash")));
        // 5.10 prints no "Oops:" before the trap's name.
        let old = "test x ... [ 50.0] int3: 0000 [#1] SMP NOPTI\n[ 50.2] Kernel panic - not syncing: Fatal exception\n";
        assert!(is_tcg_text_poke(&guest_crash(old).expect("a crash")));
        for other in [
            "[ 9.0] general protection fault, probably for non-canonical address 0xdead: 0000 [#1] SMP\n[ 9.1] Kernel panic - not syncing: Fatal exception\n",
            "[ 9.0] BUG: kernel NULL pointer dereference, address: 0000000000000008\n[ 9.1] Oops: 0000 [#1] SMP\n[ 9.2] Kernel panic - not syncing: Fatal exception in interrupt\n",
            "[ 9.0] ------------[ cut here ]------------\n[ 9.0] WARNING: CPU: 1 PID: 7 at net/ipv4/tcp_input.c:1 x\n[ 9.1] Kernel panic - not syncing: kernel: panic_on_warn set ...\n",
            "[ 9.0] watchdog: BUG: soft lockup - CPU#1 stuck for 22s! [x:1]\n[ 9.9] Kernel panic - not syncing: softlockup: hung tasks\n",
        ] {
            let crash = guest_crash(other).expect("a crash");
            assert!(!is_tcg_text_poke(&crash), "{crash}");
        }
    }

    #[test]
    fn a_warn_during_a_suite_fails_its_row() {
        let console = format!(
            "{MARK} begin mode=fentry suite=syn_drops\n\
             test result: ok. 6 passed; 0 failed; 0 ignored\n\
             {MARK} tainted mode=fentry suite=syn_drops flags=W\n\
             kernel log: WARNING: CPU: 0 PID: 1 at kernel/bpf/x.c:1\n\
             {MARK} end mode=fentry suite=syn_drops rc=0\n"
        );
        let rows = parse_console("k", &console, &["fentry"]);
        assert_eq!(rows[0].tainted, [("syn_drops".to_owned(), "W".to_owned())]);
        assert!(!rows[0].ok());
        // Its output is in the excerpts although the suite passed.
        let excerpt = failure_excerpts("k", &console);
        assert!(excerpt.contains("kernel log: WARNING"), "{excerpt}");
    }

    #[test]
    fn skips_are_judged_and_not_counted_as_checked() {
        let console = |kernel_skip: &str| {
            format!(
                "{MARK} begin mode=fentry suite=syn_drops\n\
                 test a ... \n\
                 {}\n\
                 ok\n\
                 test b ... ok\n\
                 test result: ok. 2 passed; 0 failed; 0 ignored\n\
                 {MARK} end mode=fentry suite=syn_drops rc=0\n",
                kernel_skip
            )
        };
        let skipped = console(&format!(
            "{} skip suite=syn_drops test=a: cannot check here",
            crate::marks::MARK
        ));
        let rows = parse_console("debian-6.1", &skipped, &["fentry"]);
        assert_eq!(rows[0].checked(), 1);
        assert!(!rows[0].ok(), "an unlisted skip must fail the cell");
        let clean = parse_console("debian-6.1", &console(""), &["fentry"]);
        assert!(clean[0].ok());
        assert_eq!(clean[0].checked(), 2);
    }

    #[test]
    fn not_exact_marks_show_in_the_table() {
        let console = format!(
            "{MARK} begin mode=kprobe suite=syn_drops\n\
             {} not-exact suite=syn_drops test=a: 1 of 7 checks short by 1 (kernel-counted skips 2)\n\
             test result: ok. 2 passed; 0 failed; 0 ignored\n\
             {MARK} end mode=kprobe suite=syn_drops rc=0\n",
            crate::marks::MARK
        );
        let rows = parse_console("trixie", &console, &["kprobe"]);
        assert!(rows[0].ok());
        let table = render_table(&rows, &[("syn_drops", None)], 1);
        assert!(
            table.contains("NOT EXACT: trixie x kprobe: syn_drops::a"),
            "{table}"
        );
    }

    #[test]
    fn a_mode_that_never_ran_fails() {
        let rows = parse_console("k", "", &["fentry"]);
        assert!(!rows[0].ok());
        assert_eq!(rows[0].broken, ["never ran"]);
    }

    #[test]
    fn a_crashed_boot_keeps_its_finished_runs_and_names_the_crash() {
        let console = format!(
            "{MARK} begin mode=fentry suite=cli\n\
             test result: ok. 2 passed; 0 failed; 0 ignored\n\
             {MARK} end mode=fentry suite=cli rc=0\n\
             {MARK} begin mode=fentry suite=pinning\n\
             test counts ... [   90.1] Oops: int3: 0000 [#1] PREEMPT SMP NOPTI\n\
             [   90.2] RIP: 0010:syscall_exit_to_user_mode_prepare+0xe1/0x170\n\
             [   90.3] Kernel panic - not syncing: Fatal exception in interrupt\n"
        );
        let crash = guest_crash(&console).expect("a crash");
        assert!(crash.contains("Oops: int3") && crash.ends_with("Fatal exception in interrupt"));
        let (finished, output) = finished_runs(&console);
        assert_eq!(finished, 1);
        assert!(output.ends_with("suite=cli rc=0\n"), "{output}");
        // The rerun's console, appended, completes the table.
        let rerun = format!(
            "{MARK} begin mode=fentry suite=pinning\n\
             test result: ok. 3 passed; 0 failed; 0 ignored\n\
             {MARK} end mode=fentry suite=pinning rc=0\n"
        );
        let rows = parse_console("k", &format!("{output}{rerun}"), &["fentry"]);
        assert!(rows[0].ok(), "{:?}", rows[0].broken);
        assert_eq!(rows[0].passed, 5);
        assert_eq!(guest_crash(&rerun), None);
    }

    #[test]
    fn runs_the_budget_left_out_fail_their_mode_only() {
        // A crash, then no time for the boot that would have run the rest: the finished
        // fentry runs passed, but fentry's pinning and all of kprobe never ran.
        let console = format!(
            "{MARK} begin mode=fentry suite=cli\n\
             test result: ok. 2 passed; 0 failed; 0 ignored\n\
             {MARK} end mode=fentry suite=cli rc=0\n\
             {MARK} begin mode=tracepoint suite=cli\n\
             test result: ok. 2 passed; 0 failed; 0 ignored\n\
             {MARK} end mode=tracepoint suite=cli rc=0\n"
        );
        let mut rows = parse_console("k", &console, &["fentry", "kprobe", "tracepoint"]);
        assert!(rows[0].ok());
        let unrun = suite_runs("fentry", &[("pinning", None)], 1, &[]);
        mark_unrun(&mut rows, &unrun);
        assert!(!rows[0].ok());
        assert_eq!(rows[0].broken, ["1 runs not run: time budget"]);
        assert!(!rows[1].ok());
        assert!(rows[2].ok(), "{:?}", rows[2].broken);
    }
}
