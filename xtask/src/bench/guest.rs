//! `cargo xtask bench --guest KERNEL`: every hook mode's cost measured the same way, in
//! instructions (issue 37). Boots one of the kernel matrix's Debian kernels (its fetch
//! and initramfs, `crate::vm`) under qemu with `-icount shift=0,sleep=off -accel
//! tcg,thread=single -smp 1`: one guest nanosecond per guest instruction, free of the
//! host's noise. In one boot, per mode, the guest side (`guest_loops.rs`, this xtask
//! binary built for release and copied in) times whole loops of real syscalls on real
//! sockets without and with backlogd, then takes bpf_stats and a profile; this side
//! parses its console and prints the per-mode table (`cost_table.rs`), written to
//! target/bench/guest-KERNEL.md.
//!
//! A bench, not a test: nothing fails on a figure; the verdicts are printed beside them.

use std::{
    io::{BufRead as _, BufReader},
    path::PathBuf,
    process::Stdio,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
};

use super::{
    cost_table::{self, Event, Line},
    guest_loops, *,
};
use crate::vm;

pub struct Options {
    pub kernel: String,
    /// Hook modes (all when empty).
    pub modes: Vec<String>,
    /// Runs with backlogd per mode; each has a run without on either side.
    pub pairs: usize,
    pub quick: bool,
}

/// A guest that prints nothing of its own within this has hung while booting (Debian's
/// 6.1 with `-smp 2` under icount hangs bringing up the second CPU).
const BOOT_LIMIT: Duration = Duration::from_secs(10 * 60);

/// The whole boot's limit: about 20 minutes per mode were seen on a 2-CPU machine.
const GUEST_LIMIT: Duration = Duration::from_secs(3 * 60 * 60);

/// What the figures leave out, printed with every table.
const NOT_CAPTURED: &str = "What these figures do not capture: the guest's clock counts \
    instructions, not time. Cache and TLB misses, branch mispredictions, pipeline stalls \
    and contention between CPUs (cache-line bouncing of shared maps, lock waits) cost \
    nothing here; a program that touches more memory costs more on a real CPU than its \
    instruction count says. One vCPU: the client, the server and the daemon share it, and \
    softirq work runs inline. The whole-loop ratios include everything backlogd adds: its \
    programs, the trampolines (fentry), the kprobe dispatch (kprobe), the slow syscall path \
    a `sys_exit` program forces on every syscall (kprobe, tracepoint), and the daemon's own \
    periodic work (the syscall-free loop's ratio); bpf_stats' run times (a run of its own, \
    with its two clock reads per program run) cover only the programs' bodies.";

pub fn run(opts: &Options) -> Result<()> {
    // SAFETY: plain libc call.
    if unsafe { libc::geteuid() } != 0 {
        bail!(
            "cargo xtask bench --guest runs qemu and builds an initramfs as root: run it as root"
        );
    }
    let modes: Vec<&str> = if opts.modes.is_empty() {
        MODES.to_vec()
    } else {
        opts.modes.iter().map(String::as_str).collect()
    };
    if let Some(m) = modes
        .iter()
        .find(|m| !MODES.contains(&guest_loops::hook_mode_of(m)))
    {
        bail!(
            "--mode {m}: no such hook mode. Fix: one of {}, optionally with daemon \
             settings after a slash (fentry/accept_wait=false)",
            MODES.join(", ")
        );
    }
    crate::cargo(&["build", "--release", "--package", "backlogd"])?;
    // What was built, now: the tree may change while the guest runs (a long bench).
    let built = described_commit();
    crate::cargo(&["build", "--release", "--package", "xtask"])?;
    if opts.kernel == "host" {
        return on_host(opts, &modes, &built);
    }
    let Some(spec) = vm::KERNELS.iter().find(|k| k.label == opts.kernel) else {
        let known: Vec<&str> = vm::KERNELS.iter().map(|k| k.label).collect();
        bail!(
            "--guest {}: no such kernel. Fix: one of {}, or host",
            opts.kernel,
            known.join(", ")
        );
    };
    let kernel = vm::fetch_kernel(spec)?;
    let root = crate::workspace_root();
    // The payload's "suites" land in /backlogd/tests/ with their shared libraries:
    // guest_loops.rs expects xtask and perf there.
    let mut suites = vec![("xtask".to_owned(), root.join("target/release/xtask"))];
    let perf = PathBuf::from("/usr/bin/perf");
    let mut notes = Vec::new();
    if perf.exists() {
        suites.push(("perf".to_owned(), perf));
    } else {
        notes.push(
            "no profile: perf is not installed on the host (Debian package linux-perf)".to_owned(),
        );
    }
    let payload = vm::Payload {
        backlogd: root.join("target/release/backlogd"),
        suites,
    };
    let runs = 2 * opts.pairs.max(1) + 1;
    let mut script = String::new();
    for mode in &modes {
        if !spec.caps.runs(guest_loops::hook_mode_of(mode)) {
            notes.push(format!(
                "{mode}: not run: {} cannot run it (the kernel matrix's capability table)",
                spec.label
            ));
            continue;
        }
        script.push_str(&guest_commands(mode, runs, opts.quick));
    }
    let work = root.join("target/bench/guest").join(spec.label);
    let initrd = vm::build_initramfs(&work, &kernel, &payload, &script)?;
    let log = work.join("console.log");
    eprintln!(
        "bench: booting {} ({}) under qemu -icount shift=0,sleep=off, 1 vCPU; console log: {}",
        spec.label,
        kernel.package,
        log.display()
    );
    let started = Instant::now();
    let booted = boot(&kernel.vmlinuz, &initrd, &log);
    let console = std::fs::read_to_string(&log).unwrap_or_default();
    if let Some(crash) = vm::guest_crash(&console) {
        notes.push(format!("THE GUEST KERNEL CRASHED:\n```\n{crash}\n```"));
    }
    if let Err(e) = &booted {
        notes.push(format!("the guest did not finish: {e:#}"));
    }
    let lines = cost_table::parse_console(&console);
    let clock = format!(
        "backlogd {built} on Debian's {} under `qemu-system-x86_64 -icount \
         shift=0,sleep=off -accel tcg,thread=single -cpu max -smp 1` (the guest's clock counts \
         its instructions, user and kernel)",
        kernel.package
    );
    write_report(opts, &clock, &lines, &notes, started.elapsed())?;
    booted
}

/// `--guest host`: the guest side run here, mode after mode, in real time (in a network
/// namespace of its own; `guest_loops::in_guest`).
fn on_host(opts: &Options, modes: &[&str], built: &str) -> Result<()> {
    let started = Instant::now();
    let runs = 2 * opts.pairs.max(1) + 1;
    let mut console = String::new();
    for mode in modes {
        eprintln!("bench: {mode} mode on this host");
        let mut cmd = Command::new(crate::workspace_root().join("target/release/xtask"));
        cmd.args([
            "bench",
            "--in-guest",
            mode,
            "--runs",
            &runs.to_string(),
            "--on-host",
        ]);
        if opts.quick {
            cmd.arg("--quick");
        }
        let out = cmd
            .stderr(Stdio::inherit())
            .output()
            .context("starting target/release/xtask")?;
        console.push_str(&String::from_utf8_lossy(&out.stdout));
        if !out.status.success() {
            console.push_str(
                &Line::Note {
                    mode: (*mode).to_owned(),
                    text: format!("the loops stopped: {}", out.status),
                }
                .render(),
            );
            console.push('\n');
        }
    }
    let lines = cost_table::parse_console(&console);
    let clock = format!(
        "backlogd {built} on this host (kernel {}), in a network namespace of its own; \
         the clock is real time (ns), with whatever else ran on the machine",
        std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .unwrap_or_default()
            .trim()
    );
    write_report(opts, &clock, &lines, &[], started.elapsed())
}

/// Renders the report, prints it and writes it to target/bench/guest-KERNEL.md.
fn write_report(
    opts: &Options,
    clock: &str,
    lines: &[Line],
    notes: &[String],
    took: Duration,
) -> Result<()> {
    let md = report(opts, clock, lines, notes, took);
    let path = crate::workspace_root().join(format!("target/bench/guest-{}.md", opts.kernel));
    std::fs::write(&path, &md).with_context(|| format!("writing {}", path.display()))?;
    println!("{md}");
    eprintln!("bench: written to {}", path.display());
    Ok(())
}

/// The init script's lines for one mode: the guest side between the matrix's markers.
fn guest_commands(mode: &str, runs: usize, quick: bool) -> String {
    format!(
        "echo \"{mark} begin mode={mode} suite=cost\"\n\
         /backlogd/tests/xtask bench --in-guest {mode} --runs {runs}{} 2>&1\n\
         echo \"{mark} end mode={mode} suite=cost rc=$?\"\n",
        if quick { " --quick" } else { "" },
        mark = vm::MARK,
    )
}

/// qemu with the guest's clock counting instructions: `-icount shift=0` (one ns per
/// instruction), `sleep=off` (an idle guest's clock jumps to its next timer instead of
/// waiting in real time), which needs single-threaded TCG; Debian's 6.1 boots so with one
/// vCPU only.
fn qemu_icount(vmlinuz: &std::path::Path, initrd: &std::path::Path) -> Command {
    let mut cmd = Command::new("qemu-system-x86_64");
    cmd.args([
        "-icount",
        "shift=0,sleep=off",
        "-accel",
        "tcg,thread=single",
        "-cpu",
        "max",
        "-smp",
        "1",
        "-m",
        "3072",
        "-nographic",
        "-no-reboot",
        "-nic",
        "none",
    ])
    .arg("-kernel")
    .arg(vmlinuz)
    .arg("-initrd")
    .arg(initrd)
    .arg("-append")
    .arg(format!(
        "console=ttyS0 panic=-1 quiet loglevel=3 mitigations=off {}",
        vm::LOCKUPS_PANIC
    ));
    cmd
}

/// Boots and waits for the guest to power off; the console goes to `log`, the matrix's
/// markers to stderr as progress.
fn boot(vmlinuz: &std::path::Path, initrd: &std::path::Path, log: &std::path::Path) -> Result<()> {
    let log_file = std::fs::File::create(log)?;
    let mut child = qemu_icount(vmlinuz, initrd)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(log_file.try_clone()?)
        .spawn()
        .context("starting qemu-system-x86_64 (Debian package qemu-system-x86)")?;
    let stdout = child.stdout.take().expect("piped");
    let booted = Arc::new(AtomicBool::new(false));
    let seen = Arc::clone(&booted);
    let started = Instant::now();
    let reader = thread::spawn(move || -> std::io::Result<()> {
        use std::io::Write as _;
        let mut log_file = log_file;
        let last = Event::ALL[Event::ALL.len() - 1];
        for line in BufReader::new(stdout).lines() {
            let line = line?;
            let at = started.elapsed().as_secs();
            if let Some(i) = line.find(vm::MARK) {
                seen.store(true, Ordering::Relaxed);
                eprintln!("bench: {at} s: {}", line[i..].trim_end());
            } else if let Some(Line::Loop {
                mode, run, event, ..
            }) = Line::parse(&line)
                && event == last
            {
                eprintln!("bench: {at} s: {mode}: run {run} done");
            }
            writeln!(log_file, "{line}")?;
        }
        Ok(())
    });
    // The kernel not reaching its init within BOOT_LIMIT: a hang (`-smp 2` under -icount
    // hangs bringing up the second CPU), reported with the console's last lines.
    let hung = || {
        if booted.load(Ordering::Relaxed) || started.elapsed() <= BOOT_LIMIT {
            return None;
        }
        let last = std::fs::read_to_string(log).unwrap_or_default();
        let tail: Vec<&str> = last.lines().rev().take(5).collect();
        Some(format!(
            "the kernel did not boot to its init within {} s under -icount with one vCPU \
             (killed); last console lines: {}",
            BOOT_LIMIT.as_secs(),
            tail.into_iter().rev().collect::<Vec<_>>().join(" / ")
        ))
    };
    vm::wait_for_qemu(&mut child, reader, started + GUEST_LIMIT, GUEST_LIMIT, hung)
}

/// The checkout's commit, `-dirty` with uncommitted changes.
fn described_commit() -> String {
    output(
        Command::new("git")
            .args(["describe", "--always", "--dirty"])
            .current_dir(crate::workspace_root()),
    )
    .unwrap_or_default()
    .trim()
    .to_owned()
}

/// `clock`: what ran where, and which commit's build.
fn report(opts: &Options, clock: &str, lines: &[Line], notes: &[String], took: Duration) -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, m)| m.trim().to_owned())
        })
        .unwrap_or_default();
    let date = output(Command::new("date").args(["-u", "+%Y-%m-%d %H:%M UTC"])).unwrap_or_default();
    let host = opts.kernel == "host";
    let mut md = format!(
        "## `cargo xtask bench --guest {}{}` results\n\n\
         {}; host CPU {cpu}; {date}; {} pairs per mode. Runs \
         alternate without and with backlogd (a daemon started for each run with; its \
         programs attached and running, its process stopped with SIGSTOP during each timed \
         loop but the syscall-free one, so its once-a-second work does not land in a loop at \
         random; that loop measures it). Each run with is divided by the mean of the runs \
         without on either side; A/A: each run without divided by the one before it. Every \
         loop starts after {} s of idle guest time. The whole boot took {:.0} s.\n\n",
        opts.kernel,
        if opts.quick { " --quick" } else { "" },
        clock,
        opts.pairs,
        guest_loops::SETTLE.as_secs_f64(),
        took.as_secs_f64()
    );
    let costs = cost_table::costs(lines);
    md.push_str(&cost_table::render(
        &costs
            .iter()
            .map(|c| cost_table::guest_row(c, host))
            .collect::<Vec<_>>(),
    ));
    md.push_str(
        "\nPer event: instructions (guest ns), median over the runs; added: with minus \
         without; of which BPF programs: bpf_stats' run time per event in a run of its own \
         (bpf_stats off for the ratio runs). Events, one loop iteration each:\n\n",
    );
    for e in Event::ALL {
        md.push_str(&format!(
            "- {} ({} per run{}): {}.\n",
            e.label(),
            e.count(opts.quick),
            match e {
                Event::Spin => " iterations",
                _ => "",
            },
            e.describe()
        ));
    }
    md.push_str(&format!("\n{NOT_CAPTURED}\n"));
    let failed = cost_table::failed_checks(lines);
    for f in &failed {
        md.push_str(&format!("\n**CHECK FAILED:** {f}\n"));
    }
    for note in notes {
        md.push_str(&format!("\n**Note:** {note}\n"));
    }
    for line in lines {
        if let Line::Note { mode, text } = line {
            md.push_str(&format!("\n**{mode}:** {text}\n"));
        }
    }
    // Every mode that ran, variants (`fentry/accept_wait=false`) included, in table order.
    let mut ran: Vec<&str> = Vec::new();
    for c in &costs {
        if !ran.contains(&c.mode.as_str()) {
            ran.push(&c.mode);
        }
    }
    for &mode in &ran {
        let progs = cost_table::render_programs(lines, &costs, mode);
        if !progs.is_empty() {
            md.push_str(&format!(
                "\n### bpf_stats per program, {mode} mode (runs per event x instructions \
                 per run = per event)\n\n{progs}"
            ));
        }
    }
    for &mode in &ran {
        let profile = cost_table::render_profile(lines, &costs, mode, 12);
        if !profile.is_empty() {
            md.push_str(&format!(
                "\n### Profile, {mode} mode\n\n`perf record -a -e cpu-clock -c {period}` in \
                 the guest (a sample every {period} instructions), switched on for each \
                 timed loop only (perf's control fifos), `net.core.bpf_jit_kallsyms=1`; each \
                 loop once without backlogd and once with it (its daemon paused, as in the \
                 ratio runs). Each profile is scaled to the instructions per event the ratio \
                 runs measured (a sample stands for less than {period}: the sampling \
                 interrupt's own instructions pass on the clock, never in a sample); a \
                 symbol's figure is uncertain by about the square root of its samples.\n{profile}",
                period = guest_loops::PROFILE_PERIOD
            ));
        }
    }
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_init_script_runs_the_guest_side_between_the_matrix_markers() {
        let s = guest_commands("kprobe", 11, true);
        assert!(s.starts_with(&format!(
            "echo \"{} begin mode=kprobe suite=cost\"",
            vm::MARK
        )));
        assert!(s.contains("/backlogd/tests/xtask bench --in-guest kprobe --runs 11 --quick 2>&1"));
        assert!(s.trim_end().ends_with("suite=cost rc=$?\""));
    }
}
