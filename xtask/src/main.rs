//! Project automation: `cargo xtask <command>`.
//!
//! `run` and `test` are the README's two commands; both start with `setup`, which installs
//! what a fresh machine lacks and is a fast no-op on a prepared one.

mod bench;
mod capture;
mod debian;
mod image;
mod install;
mod marks;
mod modgraph;
mod setup;
mod sysguest;
mod vm;

use std::process::Command;

use anyhow::{Context as _, Result, bail};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(about = "backlogd build, run and test automation")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Install the toolchain pieces and Debian packages the build and tests need (no
    /// package's service is started).
    Setup,
    /// Install only what building needs (nightly rust-src, bpf-linker), build (eBPF object
    /// included) and run the daemon in the foreground.
    Run {
        /// Arguments for `backlogd run` (e.g. `-- --listen 127.0.0.1:9851`).
        #[arg(last = true)]
        args: Vec<String>,
    },
    /// Set up, then run formatting and lint checks, unit tests and the integration suite.
    Test {
        /// Only run integration tests whose name contains this filter.
        filter: Option<String>,
    },
    /// Boot Debian kernels under qemu and run the hook-mode suites in each mode.
    Vm {
        /// Kernels to boot (default: those `cargo xtask test` boots): debian-5.10
        /// (bullseye), debian-6.1, trixie, trixie-backports; also debian-6.12 (bookworm's
        /// 6.12) and sid. Other suites' kernels come from the host's Debian archive.
        #[arg(long = "kernel")]
        kernels: Vec<String>,
        /// Hook modes to run: fentry, kprobe, tracepoint (default: all).
        #[arg(long = "mode")]
        modes: Vec<String>,
        /// Suites to run (default: all guest suites).
        #[arg(long = "suite")]
        suites: Vec<String>,
        /// Run each suite this many times per boot (to catch a flaky test).
        #[arg(long, default_value_t = 1)]
        repeat: u32,
        /// Print what `cargo xtask test` runs on which kernel in which mode, what may skip
        /// and the time budgets, and boot nothing.
        #[arg(long)]
        plan: bool,
        /// With --plan: rewrite the plan in docs/testing.md.
        #[arg(long, requires = "plan")]
        write_docs: bool,
    },
    /// Run the daemon against a stalled listener in a network namespace of its own and
    /// write `backlogd top`'s screen (in tmux) and `backlogd doctor`'s output into the
    /// README (as root).
    Capture,
    /// Run rustfmt and clippy (-D warnings) on the host crates and the eBPF crate.
    Lint,
    /// Measure overhead, capacity and scale (as root); prints a markdown report and writes
    /// it to target/bench/results.md. With --guest: every hook mode's cost in instructions,
    /// in a Debian kernel under qemu -icount (target/bench/guest-KERNEL.md).
    Bench {
        /// Shorter runs and a smaller scale (about 1 minute instead of 4).
        #[arg(long)]
        quick: bool,
        /// Run only these sections (repeatable): programs, syscalls, capacity, nginx,
        /// bystander, daemon, drop, scale, bpftrace.
        #[arg(long, value_name = "NAME", conflicts_with = "guest")]
        section: Vec<String>,
        /// Host runs: every daemon the run starts takes this setting (repeatable, as
        /// KEY=VALUE, e.g. `--with syscall_hook=false`); the report names it with the mode.
        #[arg(long = "with", value_name = "KEY=VALUE", conflicts_with = "guest")]
        with: Vec<String>,
        /// Measure in a guest of this kernel of the matrix (debian-6.1, ...) instead of on
        /// the host: per hook mode, loops of handshakes, dropped SYNs, UDP datagrams and
        /// getppid() timed in guest instructions without and with backlogd. `host`: the
        /// same loops on this host, in real time.
        #[arg(long, value_name = "KERNEL")]
        guest: Option<String>,
        /// With --guest: the hook modes to measure (repeatable; default all the kernel runs).
        /// A mode may carry daemon settings after a slash, measured as a mode of its own
        /// beside the plain one: `--mode fentry --mode fentry/accept_wait=false`.
        #[arg(long = "mode", requires = "guest")]
        modes: Vec<String>,
        /// With --guest: runs with backlogd per mode, each between two runs without.
        #[arg(long, requires = "guest", default_value_t = 5)]
        pairs: usize,
        /// Internal: the guest side of --guest, in the guest, for one hook mode.
        #[arg(long, hide = true, value_name = "MODE")]
        in_guest: Option<String>,
        /// Internal: with --in-guest, runs alternating without/with.
        #[arg(long, hide = true, default_value_t = 11)]
        runs: usize,
        /// Internal: with --in-guest, run on this host (`--guest host`).
        #[arg(long, hide = true)]
        on_host: bool,
        /// Internal: hold COUNT connections to PORTS listeners from FIRST_PORT on
        /// 127.0.0.1 until stdin closes (a helper process of the scale test).
        #[arg(long, hide = true, value_name = "COUNT,FIRST_PORT,PORTS")]
        hold: Option<String>,
    },
    /// Build and install the daemon: PREFIX/bin/backlogd, the systemd unit, and
    /// /etc/backlogd/backlogd.toml if it does not exist yet (never overwritten).
    Install {
        /// Installation prefix for the binary.
        #[arg(long, default_value = "/usr/local")]
        prefix: std::path::PathBuf,
        /// Install under this directory instead of / (staging, tests).
        #[arg(long, default_value = "/")]
        root: std::path::PathBuf,
        /// Use the existing target/release/backlogd instead of building.
        #[arg(long)]
        no_build: bool,
    },
    /// Build a Debian package in target/debian/ (binary in /usr/bin, unit in
    /// /lib/systemd/system, config as a conffile).
    Deb,
    /// Build an OCI image archive, target/backlogd-image-VERSION.tar, from the release
    /// binary with no base image (the binary, the shared libraries it loads, the shipped
    /// config), for `podman load -i`; xtask/src/image.rs says how to run it.
    Image {
        /// Put this backlogd binary in the image instead of building target/release/backlogd.
        #[arg(long)]
        binary: Option<std::path::PathBuf>,
        /// Write the archive here instead.
        #[arg(long)]
        output: Option<std::path::PathBuf>,
        /// Name the image this (default localhost/backlogd:VERSION).
        #[arg(long)]
        reference: Option<String>,
    },
    /// Build the .deb, boot a Debian guest with systemd as PID 1 under qemu, install the
    /// package and check the service from systemd's own state (start after READY=1,
    /// reload, watchdog, restart with pins, hardening, removal).
    SystemdGuest {
        /// Debian kernel package to install in the guest and boot (default
        /// linux-image-cloud-amd64).
        #[arg(long)]
        kernel_package: Option<String>,
        /// Another Debian suite the guest may take packages from (e.g. bullseye, for
        /// `--kernel-package linux-image-5.10.0-32-cloud-amd64`).
        #[arg(long)]
        extra_suite: Option<String>,
        /// Install this package instead of building one with `cargo xtask deb`.
        #[arg(long)]
        deb: Option<std::path::PathBuf>,
    },
}

fn main() -> std::process::ExitCode {
    // The error and its causes, without the backtrace anyhow adds under RUST_BACKTRACE:
    // a CI log is read from its tail, and 60 frames of xtask's own stack would fill it.
    match dispatch() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("Error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn dispatch() -> Result<()> {
    let command = Cli::parse().command;
    if !matches!(command, Cmd::Lint | Cmd::Setup) {
        own_target_dir()?;
    }
    match command {
        Cmd::Setup => setup::run(),
        Cmd::Run { args } => {
            setup::build()?;
            cargo(&["build", "--release", "--package", "backlogd"])?;
            let status = Command::new(workspace_root().join("target/release/backlogd"))
                .arg("run")
                .args(args)
                .status()
                .context("starting target/release/backlogd")?;
            if !status.success() {
                bail!("backlogd exited with {status}");
            }
            Ok(())
        }
        Cmd::Test { filter } => {
            let deadline = test_budget()?.map(|budget| std::time::Instant::now() + budget);
            let mut stages = Stages::default();
            stages.time("setup", setup::run)?;
            stages.time("lint", lint)?;
            test(filter.as_deref(), deadline, stages)
        }
        Cmd::Vm {
            plan: true,
            write_docs,
            ..
        } => {
            print!("{}", vm::plan::render(TEST_BUDGET_MIN));
            if write_docs {
                vm::plan::write_docs(TEST_BUDGET_MIN)?;
                eprintln!("xtask: wrote the plan into docs/testing.md");
            }
            Ok(())
        }
        Cmd::Vm {
            kernels,
            modes,
            suites,
            repeat,
            ..
        } => {
            setup::run()?;
            vm::run(&vm::Options {
                kernels,
                modes,
                suites,
                repeat,
                ci: false,
                deadline: None,
            })
        }
        Cmd::Capture => {
            setup::build()?;
            cargo(&["build", "--release", "--package", "backlogd"])?;
            capture::run()
        }
        Cmd::Lint => lint(),
        Cmd::Bench {
            hold: Some(spec), ..
        } => bench::hold(&spec),
        Cmd::Bench {
            in_guest: Some(mode),
            runs,
            quick,
            on_host,
            ..
        } => bench::in_guest(&mode, runs, quick, on_host),
        Cmd::Bench {
            quick,
            guest: Some(kernel),
            modes,
            pairs,
            ..
        } => {
            setup::run()?;
            bench::guest(&bench::GuestOptions {
                kernel,
                modes,
                pairs,
                quick,
            })
        }
        Cmd::Bench {
            quick,
            section,
            with,
            ..
        } => {
            setup::run()?;
            cargo(&["build", "--release", "--package", "backlogd"])?;
            bench::run(quick, &section, &with)
        }
        Cmd::Install {
            prefix,
            root,
            no_build,
        } => {
            if !no_build {
                setup::build()?;
                cargo(&["build", "--release", "--package", "backlogd"])?;
            }
            let done = install::install(
                &workspace_root(),
                &workspace_root().join("target/release/backlogd"),
                &install::Layout {
                    root: root.clone(),
                    prefix,
                    unit_dir: "/etc/systemd/system".into(),
                },
            )?;
            eprintln!("xtask: installed {}", done.binary.display());
            eprintln!("xtask: installed {}", done.unit.display());
            eprintln!("xtask: installed {}", done.sysusers.display());
            if done.config_written {
                eprintln!("xtask: installed {} (defaults)", done.config.display());
            } else {
                eprintln!("xtask: kept the existing {}", done.config.display());
            }
            if root == std::path::Path::new("/") {
                // The unit's daemon runs as this user: create it now, not at the next boot.
                run(Command::new("systemd-sysusers").arg(&done.sysusers))
                    .context("creating the daemon's user (`systemd-sysusers`, from systemd)")?;
                eprintln!(
                    "xtask: next: `backlogd check-config`, then \
                     `systemctl daemon-reload && systemctl enable --now backlogd`"
                );
            }
            Ok(())
        }
        Cmd::Deb => {
            setup::run()?;
            cargo(&["build", "--release", "--package", "backlogd"])?;
            let deb = install::deb(
                &workspace_root(),
                &workspace_root().join("target/release/backlogd"),
            )?;
            run(Command::new("dpkg-deb").arg("--info").arg(&deb))?;
            eprintln!("xtask: built {}", deb.display());
            Ok(())
        }
        Cmd::Image {
            binary,
            output,
            reference,
        } => {
            let binary = match binary {
                Some(binary) => binary,
                None => {
                    setup::build()?;
                    cargo(&["build", "--release", "--package", "backlogd"])?;
                    workspace_root().join("target/release/backlogd")
                }
            };
            image::run(
                &workspace_root(),
                &image::Options {
                    binary,
                    output,
                    reference,
                },
            )
            .map(|_| ())
        }
        Cmd::SystemdGuest {
            kernel_package,
            extra_suite,
            deb,
        } => {
            setup::run()?;
            sysguest::run(&sysguest::Options {
                kernel_package,
                extra_suite,
                deb,
            })
        }
    }
}

/// Refuses a `CARGO_TARGET_DIR` other than the workspace's `target/`: every command but
/// lint and setup builds with cargo (which honours it) and then runs, copies or boots what
/// it finds under the workspace's `target/`, so it would test a stale build; and an xtask
/// binary built in a target directory shared by two checkouts may be the other one's.
fn own_target_dir() -> Result<()> {
    let ours = workspace_root().join("target");
    // Relative to where cargo was started; compared as the filesystem resolves both.
    let resolve = |p: &std::path::Path| {
        let p = std::env::current_dir()
            .map(|d| d.join(p))
            .unwrap_or(p.to_path_buf());
        p.canonicalize().unwrap_or(p)
    };
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) if resolve(std::path::Path::new(&dir)) != resolve(&ours) => bail!(
            "CARGO_TARGET_DIR is {}, but this command reads what it builds from {}: unset \
             CARGO_TARGET_DIR (only `cargo xtask lint` and `setup` work with another target \
             directory)",
            std::path::Path::new(&dir).display(),
            ours.display()
        ),
        _ => Ok(()),
    }
}

fn workspace_root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives one level below the workspace root")
        .to_path_buf()
}

fn cargo(args: &[&str]) -> Result<()> {
    run(Command::new("cargo")
        .args(args)
        .current_dir(workspace_root()))
}

fn run(cmd: &mut Command) -> Result<()> {
    eprintln!("xtask: {cmd:?}");
    let status = cmd.status().with_context(|| format!("starting {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed: {status}");
    }
    Ok(())
}

fn lint() -> Result<()> {
    cargo(&["fmt", "--all", "--", "--check"])?;
    modgraph::check(&workspace_root())?;
    // Host crates and the eBPF crate cannot be linted in one invocation: features would
    // unify across targets.
    cargo(&[
        "clippy",
        "--workspace",
        "--exclude",
        "backlogd-ebpf",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ])?;
    run(Command::new("cargo")
        .args([
            "+nightly",
            "clippy",
            "--package",
            "backlogd-ebpf",
            "--target",
            "bpfel-unknown-none",
            "-Z",
            "build-std=core",
            "--release",
            "--",
            "-D",
            "warnings",
        ])
        .env(
            "CARGO_TARGET_DIR",
            workspace_root().join("target/ebpf-clippy"),
        )
        .current_dir(workspace_root()))
}

/// CI stops a run at 90 minutes and then says only that it timed out. `cargo xtask test`
/// keeps its own clock instead: the kernel matrix (the last and longest part) ends by this
/// budget, counted from the start, and what it could not run fails with its name in the
/// table. `BACKLOGD_TEST_BUDGET_MIN` sets it for slower machines; 0 turns it off.
pub(crate) const TEST_BUDGET_MIN: u64 = 80;

fn test_budget() -> Result<Option<std::time::Duration>> {
    let minutes = match std::env::var("BACKLOGD_TEST_BUDGET_MIN") {
        Ok(v) => v.trim().parse::<u64>().with_context(|| {
            format!("BACKLOGD_TEST_BUDGET_MIN={v:?}: expected whole minutes (0: no budget)")
        })?,
        Err(_) => TEST_BUDGET_MIN,
    };
    Ok((minutes > 0).then(|| std::time::Duration::from_secs(minutes * 60)))
}

/// Wall-clock time of each stage of `cargo xtask test`, printed in its closing line: CI
/// reports only the whole run's time, and the run must stay well under CI's limit.
#[derive(Default)]
struct Stages(Vec<(&'static str, std::time::Duration)>);

impl Stages {
    fn time<T>(&mut self, stage: &'static str, f: impl FnOnce() -> T) -> T {
        let start = std::time::Instant::now();
        let out = f();
        self.0.push((stage, start.elapsed()));
        out
    }
}

impl std::fmt::Display for Stages {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let total: std::time::Duration = self.0.iter().map(|(_, d)| *d).sum();
        write!(f, "time: {:.0} s", total.as_secs_f64())?;
        for (i, (stage, d)) in self.0.iter().enumerate() {
            let sep = if i == 0 { " (" } else { ", " };
            write!(f, "{sep}{stage} {:.0} s", d.as_secs_f64())?;
        }
        if !self.0.is_empty() {
            write!(f, ")")?;
        }
        Ok(())
    }
}

fn test(
    filter: Option<&str>,
    deadline: Option<std::time::Instant>,
    mut stages: Stages,
) -> Result<()> {
    // Unit tests of every host crate, then the integration suite against the release
    // binary the README's run command builds.
    stages.time("build", || {
        cargo(&["build", "--release", "--package", "backlogd"])
    })?;
    let mut totals = TestCounts::default();
    let unit = stages.time("unit tests", || {
        cargo_test(
            Command::new("cargo").args([
                "test",
                "--release",
                "--workspace",
                "--exclude",
                "backlogd-tests",
                "--exclude",
                "backlogd-ebpf",
            ]),
            &mut totals,
        )
    });
    let bin = workspace_root().join("target/release/backlogd");
    // The suites' skip and not-exact marks (tests/src/marks.rs), judged below.
    let mark_log = workspace_root().join("target/test-marks.log");
    match std::fs::remove_file(&mark_log) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(e).with_context(|| format!("removing {}", mark_log.display()));
        }
        _ => {}
    }
    let mut cmd = Command::new("cargo");
    // Setup installed every tool the suite drives: a test that finds one missing fails
    // here instead of skipping (tests/src/tools.rs).
    // --no-fail-fast: a failing suite must not hide the suites after it (cargo stops at
    // the first failing test binary otherwise, and a red run names one cause of several).
    cmd.args([
        "test",
        "--release",
        "--no-fail-fast",
        "--package",
        "backlogd-tests",
    ])
    .env("BACKLOGD_BIN", &bin)
    .env("BACKLOGD_MARK_LOG", &mark_log)
    .env("BACKLOGD_REQUIRE_TOOLS", "1");
    if let Some(filter) = filter {
        cmd.args(["--", filter]);
    }
    let integration = if unit.is_ok() {
        stages.time("host suite", || cargo_test(&mut cmd, &mut totals))
    } else {
        Ok(())
    };
    let marks: Vec<marks::Mark> = std::fs::read_to_string(&mark_log)
        .unwrap_or_default()
        .lines()
        .filter_map(marks::Mark::parse)
        .collect();
    let host = marks::judge(marks::HOST, "tracepoint", &marks, &[]);
    print!("{}", host.describe("host x tracepoint"));
    let host_marks = if host.ok() {
        Ok(())
    } else {
        Err(anyhow::anyhow!(
            "host suite: {} skips not on the expected list",
            host.unexpected.len()
        ))
    };
    // The packaged service under a real PID-1 systemd (qemu, about 2 minutes), then the
    // kernel matrix: the hook modes this kernel lacks, on Debian's kernels from 5.10 to the
    // newest (qemu, about 45 minutes). A filtered run is for iterating on host tests.
    let systemd = if filter.is_none() {
        stages.time("systemd guest", || {
            sysguest::run(&sysguest::Options::default()).map(|()| "passed")
        })
    } else {
        Ok("not run (filtered run)")
    };
    let matrix = if filter.is_none() {
        stages.time("kernel matrix", || {
            vm::run(&vm::Options {
                kernels: Vec::new(),
                modes: Vec::new(),
                suites: Vec::new(),
                repeat: 1,
                ci: true,
                deadline,
            })
            .map(|()| "passed (table above)")
        })
    } else {
        Ok("not run (filtered run)")
    };
    // One closing line for the whole run, so a log reader sees the total at the end, after
    // what the failed host tests printed.
    print!("{}", totals.describe_failures());
    println!(
        "tests (host): {} checked, {} skipped at run time ({} unexpected), {} not exact, \
         {} failed{}, {} ignored; systemd guest: {}; kernel matrix: {}; {}",
        totals
            .passed
            .saturating_sub(host.skipped.len() as u64 + host.unexpected.len() as u64),
        host.skipped.len() + host.unexpected.len(),
        host.unexpected.len(),
        host.not_exact.len(),
        totals.failed,
        totals.failed_names(),
        totals.ignored,
        match &systemd {
            Ok(what) => what,
            Err(_) => "FAILED (its checks above)",
        },
        match &matrix {
            Ok(what) => what,
            Err(_) => "FAILED (table above)",
        },
        stages
    );
    unit.and(integration)
        .and(host_marks)
        .and(systemd.map(|_| ()))
        .and(matrix.map(|_| ()))
}

/// Counts of libtest `test result:` lines, added up.
#[derive(Default)]
struct TestCounts {
    passed: u64,
    failed: u64,
    ignored: u64,
    /// Each failed test's name and what it printed (libtest's `---- NAME stdout ----`
    /// section), repeated at the end of the run: a CI log is often read from its tail.
    failures: Vec<(String, Vec<String>)>,
}

impl TestCounts {
    /// Parses what follows `test result: ` (`ok. 6 passed; 0 failed; 1 ignored; ...`).
    fn parse(rest: &str) -> Self {
        let mut counts = Self::default();
        for part in rest.split(';') {
            let mut words = part.split_whitespace().rev();
            let (Some(what), Some(n)) = (words.next(), words.next()) else {
                continue;
            };
            let n: u64 = n.parse().unwrap_or(0);
            match what {
                "passed" => counts.passed += n,
                "failed" => counts.failed += n,
                "ignored" => counts.ignored += n,
                _ => {}
            }
        }
        counts
    }

    fn add(&mut self, other: Self) {
        self.passed += other.passed;
        self.failed += other.failed;
        self.ignored += other.ignored;
    }

    /// Lines kept of each failure's output: its last ones, where the panic message and the
    /// evidence of a failed exact check are.
    const FAILURE_LINES: usize = 60;

    /// Follows libtest's output line by line, keeping each failed test's own section.
    fn watch(&mut self, line: &str, capturing: &mut bool) {
        if let Some(name) = line
            .strip_prefix("---- ")
            .and_then(|rest| rest.strip_suffix(" stdout ----"))
        {
            self.failures.push((name.to_owned(), Vec::new()));
            *capturing = true;
        } else if line == "failures:" || line.starts_with("test result: ") {
            *capturing = false;
        } else if *capturing && let Some((_, lines)) = self.failures.last_mut() {
            lines.push(line.to_owned());
            if lines.len() > Self::FAILURE_LINES {
                lines.remove(0);
            }
        }
    }

    /// The failed tests' sections again, for the end of the run.
    fn describe_failures(&self) -> String {
        let mut out = String::new();
        for (name, lines) in &self.failures {
            out.push_str(&format!("FAILED host test {name}; its last output:\n"));
            for line in lines {
                out.push_str(&format!("  | {line}\n"));
            }
        }
        out
    }

    /// The failed tests' names, for the closing line.
    fn failed_names(&self) -> String {
        let names: Vec<&str> = self.failures.iter().map(|(n, _)| n.as_str()).collect();
        if names.is_empty() {
            String::new()
        } else {
            format!(" ({})", names.join(", "))
        }
    }
}

/// Runs a `cargo test` command, echoing its output and adding up its `test result:` lines.
fn cargo_test(cmd: &mut Command, totals: &mut TestCounts) -> Result<()> {
    use std::io::BufRead as _;
    cmd.current_dir(workspace_root())
        .stdout(std::process::Stdio::piped());
    eprintln!("xtask: {cmd:?}");
    let mut child = cmd.spawn().with_context(|| format!("starting {cmd:?}"))?;
    let stdout = child.stdout.take().expect("piped stdout");
    let mut capturing = false;
    for line in std::io::BufReader::new(stdout).lines() {
        let line = line?;
        println!("{line}");
        totals.watch(&line, &mut capturing);
        if let Some(rest) = line.strip_prefix("test result: ") {
            totals.add(TestCounts::parse(rest));
        }
    }
    let status = child.wait()?;
    if !status.success() {
        bail!("{cmd:?} failed: {status}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{Stages, TestCounts};

    #[test]
    fn a_failed_tests_own_output_is_kept_for_the_end_of_the_run() {
        let out = "running 2 tests\n\
                   test a ... ok\n\
                   test b_fails ... FAILED\n\
                   \n\
                   failures:\n\
                   \n\
                   ---- b_fails stdout ----\n\
                   NOT EXACT untracked: 12 vs 18\n\
                   thread 'b_fails' panicked at tests/tests/x.rs:1:1\n\
                   \n\
                   failures:\n    b_fails\n\
                   \n\
                   test result: FAILED. 1 passed; 1 failed; 0 ignored\n";
        let mut totals = TestCounts::default();
        let mut capturing = false;
        for line in out.lines() {
            totals.watch(line, &mut capturing);
        }
        assert_eq!(totals.failed_names(), " (b_fails)");
        assert_eq!(
            totals.describe_failures(),
            "FAILED host test b_fails; its last output:\n  \
             | NOT EXACT untracked: 12 vs 18\n  \
             | thread 'b_fails' panicked at tests/tests/x.rs:1:1\n  | \n"
        );
    }

    #[test]
    fn stages_print_the_total_and_each_stage_in_order() {
        let mut stages = Stages::default();
        assert_eq!(stages.to_string(), "time: 0 s");
        stages.0.push(("setup", Duration::from_secs(61)));
        stages
            .0
            .push(("kernel matrix", Duration::from_millis(2_999_600)));
        assert_eq!(
            stages.to_string(),
            "time: 3061 s (setup 61 s, kernel matrix 3000 s)"
        );
    }
}
