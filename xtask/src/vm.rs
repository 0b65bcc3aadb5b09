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

/// A Debian kernel package family; the newest package in the apt index is used.
struct KernelSpec {
    label: &'static str,
    /// Package name = prefix + a number + suffix.
    prefix: &'static str,
    suffix: &'static str,
    /// A Debian suite other than the host's to fetch it from (see `debian.rs`).
    suite: Option<&'static str>,
    /// In the matrix when no `--kernel` is given (`cargo xtask test`).
    default: bool,
}

const KERNELS: &[KernelSpec] = &[
    KernelSpec {
        label: "debian-6.1",
        prefix: "linux-image-6.1.0-",
        suffix: "-cloud-amd64",
        suite: None,
        default: true,
    },
    KernelSpec {
        label: "debian-6.12",
        prefix: "linux-image-6.12.",
        suffix: "+deb12-cloud-amd64",
        suite: None,
        default: true,
    },
    // Debian 11's kernel: kprobe mode soft-locked it (issue 20); opt-in until that is
    // settled, so a lockup cannot cost CI its time limit.
    KernelSpec {
        label: "debian-5.10",
        prefix: "linux-image-5.10.0-",
        suffix: "-cloud-amd64",
        suite: Some("bullseye"),
        default: false,
    },
];

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
    ("stress", None),
];

/// Host tools the suites run, copied into the guest with their shared libraries.
/// (bpftrace and iperf3: the stress suite's other tracer and background traffic.)
const GUEST_TOOLS: &[&str] = &[
    "ip", "ss", "nft", "bpftool", "setpriv", "bpftrace", "iperf3",
];

/// Kernel modules the suites need: nf_tables for `Netns::drop_incoming`, nft_reject_inet
/// for `Netns::reject_outgoing_synacks`; tcp_diag (and inet_diag) for sock_diag, which
/// backlogd's scans and `ss` use. (A production host's modprobe autoloads them; the guest
/// has no modprobe.)
const GUEST_MODULES: &[&str] = &["nf_tables", "nft_reject_inet", "tcp_diag"];

/// A guest that has not powered off by then is killed and its rows fail.
const GUEST_TIMEOUT: Duration = Duration::from_secs(30 * 60);

const MARK: &str = "@@backlogd-vm";

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
}

/// Tests `cargo xtask test` leaves out of the matrix, each with the reason; `cargo xtask
/// vm` runs them. (kernel, mode, suite, test, reason). Empty: the one that was here
/// (reuseport on 6.1 in kprobe mode, see backlogd-ebpf/src/kprobe.rs) is fixed.
const CI_SKIPS: &[(&str, &str, &str, &str, &str)] = &[];

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
    let suites: Vec<(&str, Option<&str>)> = GUEST_SUITES
        .iter()
        .filter(|(n, _)| opts.suites.is_empty() || opts.suites.iter().any(|s| s == n))
        .copied()
        .collect();
    let payload = build_payload()?;
    let mut rows = Vec::new();
    let mut excerpts = String::new();
    let mut crashes = Vec::new();
    for spec in kernels {
        let kernel = fetch_kernel(spec)?;
        let work = super::workspace_root().join("target/vm").join(spec.label);
        let skips: Vec<(&str, &str, &str)> = CI_SKIPS
            .iter()
            .filter(|s| opts.ci && s.0 == spec.label)
            .map(|s| (s.1, s.2, s.3))
            .collect();
        let runs = suite_runs(&modes, &suites, opts.repeat.max(1), &skips);
        // Runs finished in earlier boots, and their console output.
        let mut done = 0;
        let mut transcript = String::new();
        for boot_no in 0..=GUEST_CRASH_REBOOTS {
            let initrd = build_initramfs(&work, &kernel, &payload, &runs[done..].concat())?;
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
            let outcome = boot(&kernel, &initrd, &log);
            let console = std::fs::read_to_string(&log).unwrap_or_default();
            eprintln!(
                "xtask vm: {} finished in {:.0} s{}",
                spec.label,
                started.elapsed().as_secs_f64(),
                match &outcome {
                    Ok(()) => String::new(),
                    Err(e) => format!(": {e:#}"),
                }
            );
            let Some(crash) = guest_crash(&console) else {
                transcript.push_str(&console);
                break;
            };
            let (finished, output) = finished_runs(&console);
            let during = runs
                .get(done + finished)
                .map_or("after the last suite", |r| r.trim_end());
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
        rows.extend(parse_console(spec.label, &transcript, &modes));
        excerpts.push_str(&failure_excerpts(spec.label, &transcript));
    }
    // The failing suites' own output, so a CI log says what failed without the console
    // logs (which stay on the CI machine).
    eprint!("{excerpts}");
    let mut table = render_table(&rows, &suites, opts.repeat);
    for crash in &crashes {
        let _ = writeln!(table, "GUEST CRASH: {crash}");
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

/// What goes into every guest: backlogd and the suites' test executables.
struct Payload {
    backlogd: PathBuf,
    suites: Vec<(String, PathBuf)>,
}

fn build_payload() -> Result<Payload> {
    super::cargo(&["build", "--release", "--package", "backlogd"])?;
    let mut cmd = Command::new("cargo");
    cmd.args([
        "test",
        "--release",
        "--package",
        "backlogd-tests",
        "--no-run",
        "--message-format=json",
    ]);
    for (suite, _) in GUEST_SUITES {
        cmd.args(["--test", suite]);
    }
    let out = cmd
        .current_dir(super::workspace_root())
        .stderr(Stdio::inherit())
        .output()
        .context("building the integration suites")?;
    if !out.status.success() {
        bail!("building the integration suites failed: {}", out.status);
    }
    let mut suites = Vec::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if msg["reason"] != "compiler-artifact" || msg["target"]["kind"][0] != "test" {
            continue;
        }
        if let (Some(name), Some(exe)) =
            (msg["target"]["name"].as_str(), msg["executable"].as_str())
        {
            suites.push((name.to_owned(), PathBuf::from(exe)));
        }
    }
    for (suite, _) in GUEST_SUITES {
        if !suites.iter().any(|(n, _)| n == suite) {
            bail!("cargo built no executable for integration suite `{suite}`");
        }
    }
    Ok(Payload {
        backlogd: super::workspace_root().join("target/release/backlogd"),
        suites,
    })
}

/// An unpacked kernel package.
struct Kernel {
    package: String,
    /// `uname -r` of the kernel, e.g. `6.1.0-40-cloud-amd64`.
    release: String,
    root: PathBuf,
    vmlinuz: PathBuf,
}

/// Downloaded kernels live outside the checkout so clean checkouts on one machine share
/// them: `$XDG_CACHE_HOME/backlogd/kernels`, else `~/.cache/backlogd/kernels`.
fn cache_dir() -> PathBuf {
    std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| PathBuf::from("/var/cache"))
        .join("backlogd/kernels")
}

/// The newest package of `spec` in the apt index.
fn newest_package(spec: &KernelSpec, apt: Option<&crate::debian::SuiteApt>) -> Result<String> {
    let names = match apt {
        Some(apt) => apt.pkgnames(spec.prefix)?,
        None => output(Command::new("apt-cache").args(["pkgnames", spec.prefix]))?,
    };
    names
        .lines()
        .filter_map(|n| {
            let mid = n.strip_prefix(spec.prefix)?.strip_suffix(spec.suffix)?;
            Some((mid.parse::<u64>().ok()?, n.to_owned()))
        })
        .max()
        .map(|(_, n)| n)
        .with_context(|| {
            format!(
                "no Debian kernel package {}<N>{} in the apt index. Fix: `apt-get update` \
                 (bookworm and bookworm-security must be in the sources)",
                spec.prefix, spec.suffix
            )
        })
}

fn fetch_kernel(spec: &KernelSpec) -> Result<Kernel> {
    let apt = match spec.suite {
        Some(suite) => Some(crate::debian::SuiteApt::new(
            suite,
            &cache_dir().join("apt").join(suite),
        )?),
        None => None,
    };
    let package = match newest_package(spec, apt.as_ref()) {
        Ok(p) => p,
        Err(_) if apt.is_none() => {
            super::run(Command::new("apt-get").arg("update"))?;
            newest_package(spec, None)?
        }
        Err(e) => return Err(e),
    };
    let root = cache_dir().join(&package);
    if find_vmlinuz(&root).is_err() {
        let download = cache_dir().join("download");
        let _ = std::fs::remove_dir_all(&download);
        std::fs::create_dir_all(&download)?;
        match &apt {
            Some(apt) => apt.download(&package, &download)?,
            None => {
                let status = Command::new("apt-get")
                    .args(["download", &package])
                    .current_dir(&download)
                    .status()
                    .context("starting apt-get download")?;
                if !status.success() {
                    bail!(
                        "could not download Debian kernel package {package} (`apt-get \
                         download {package}` failed: {status}); the kernel matrix needs it"
                    );
                }
            }
        }
        let deb = std::fs::read_dir(&download)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .find(|p| p.extension().is_some_and(|e| e == "deb"))
            .with_context(|| format!("apt-get download {package} left no .deb"))?;
        let partial = root.with_extension("partial");
        let _ = std::fs::remove_dir_all(&partial);
        super::run(Command::new("dpkg").arg("-x").arg(&deb).arg(&partial))?;
        let _ = std::fs::remove_dir_all(&root);
        std::fs::rename(&partial, &root)?;
        let _ = std::fs::remove_dir_all(&download);
    }
    let vmlinuz = find_vmlinuz(&root)?;
    let release = vmlinuz
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.strip_prefix("vmlinuz-"))
        .context("vmlinuz name")?
        .to_owned();
    Ok(Kernel {
        package,
        release,
        root,
        vmlinuz,
    })
}

fn find_vmlinuz(root: &Path) -> Result<PathBuf> {
    std::fs::read_dir(root.join("boot"))
        .with_context(|| format!("{} has no boot/", root.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("vmlinuz-"))
        })
        .with_context(|| format!("no boot/vmlinuz-* in {}", root.display()))
}

/// Stages the guest's root file system under `work/root` and packs it as a newc cpio.
fn build_initramfs(work: &Path, kernel: &Kernel, payload: &Payload, runs: &str) -> Result<PathBuf> {
    let root = work.join("root");
    let _ = std::fs::remove_dir_all(&root);
    for dir in [
        "bin",
        "sbin",
        "dev",
        "proc",
        "sys",
        "tmp",
        "run",
        "etc",
        "backlogd/tests",
    ] {
        std::fs::create_dir_all(root.join(dir))?;
    }
    copy_file(Path::new("/bin/busybox"), &root.join("bin/busybox"))
        .context("busybox-static is required for the guest (Debian package busybox-static)")?;
    for f in ["/etc/protocols", "/etc/services"] {
        if Path::new(f).exists() {
            copy_file(Path::new(f), &root.join(&f[1..]))?;
        }
    }
    std::fs::write(root.join("etc/passwd"), "root:x:0:0:root:/:/bin/sh\n")?;
    std::fs::write(root.join("etc/group"), "root:x:0:\n")?;

    let mut binaries = vec![(payload.backlogd.clone(), PathBuf::from("backlogd/backlogd"))];
    for (suite, exe) in &payload.suites {
        binaries.push((exe.clone(), PathBuf::from("backlogd/tests").join(suite)));
    }
    for tool in GUEST_TOOLS {
        let path = output(Command::new("sh").args(["-c", &format!("command -v {tool}")]))
            .with_context(|| format!("host tool `{tool}` not found (run `cargo xtask setup`)"))?;
        let path = PathBuf::from(path.trim());
        let canonical = path.canonicalize()?;
        binaries.push((canonical, path.strip_prefix("/")?.to_path_buf()));
    }
    let mut libs = BTreeSet::new();
    for (src, dst) in &binaries {
        copy_file(src, &root.join(dst))?;
        libs.extend(shared_libraries(src)?);
    }
    for lib in &libs {
        copy_file(&lib.canonicalize()?, &root.join(lib.strip_prefix("/")?))?;
    }

    let modules = module_load_order(kernel)?;
    let mut insmods = String::new();
    for (i, module) in modules.iter().enumerate() {
        let dst = format!("modules/{i:02}.ko");
        decompress_module(module, &root.join(&dst))?;
        writeln!(
            insmods,
            "insmod /{dst} || echo \"{MARK} insmod {} failed\"",
            module.display()
        )?;
    }

    let init = INIT_TEMPLATE
        .replace("@MARK@", MARK)
        .replace("@RELEASE@", &kernel.release)
        .replace("@INSMODS@", &insmods)
        .replace("@RUNS@", runs);
    let init_path = root.join("init");
    std::fs::write(&init_path, init)?;
    set_executable(&init_path)?;

    let cpio = work.join("initramfs.cpio");
    let status = Command::new("sh")
        .args([
            "-c",
            "find . -print0 | cpio --null --quiet -o -H newc -R 0:0 > \"$0\"",
        ])
        .arg(&cpio)
        .current_dir(&root)
        .status()
        .context("starting cpio (Debian package cpio)")?;
    if !status.success() {
        bail!("packing the initramfs with cpio failed: {status}");
    }
    Ok(cpio)
}

/// The guest's /init: mounts what backlogd and the suites need, loads modules, runs every
/// suite per mode with markers the host parses, and powers off.
const INIT_TEMPLATE: &str = r#"#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/ TMPDIR=/tmp
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mount -t tmpfs tmp /tmp
mount -t tracefs tracefs /sys/kernel/tracing
mount -t bpf bpf /sys/fs/bpf
mount -t cgroup2 cgroup2 /sys/fs/cgroup
ip link set lo up
@INSMODS@
echo "@MARK@ kernel $(uname -r) expected @RELEASE@ cpus $(nproc)"
export BACKLOGD_BIN=/backlogd/backlogd RUST_BACKTRACE=1 NO_COLOR=1
run_suite() {
    mode=$1 suite=$2
    shift 2
    echo "@MARK@ begin mode=$mode suite=$suite"
    BACKLOGD_HOOK_MODE=$mode /backlogd/tests/$suite --test-threads=1 "$@" 2>&1
    echo "@MARK@ end mode=$mode suite=$suite rc=$?"
}
@RUNS@
echo "@MARK@ done"
poweroff -f
"#;

/// The init script's `run_suite` lines: every suite in every mode, `repeat` times, less the
/// skipped tests of (mode, suite, test).
fn suite_runs(
    modes: &[&str],
    suites: &[(&str, Option<&str>)],
    repeat: u32,
    skips: &[(&str, &str, &str)],
) -> Vec<String> {
    let mut runs = Vec::new();
    for mode in modes {
        for (suite, filter) in suites {
            let mut args = filter.unwrap_or("").to_owned();
            for (_, _, test) in skips.iter().filter(|s| s.0 == *mode && s.1 == *suite) {
                args.push_str(&format!(" --skip {test}"));
            }
            for _ in 0..repeat {
                runs.push(format!("run_suite {mode} {suite} {args}\n"));
            }
        }
    }
    runs
}

/// How often a kernel is booted again after its guest kernel crashed. Under TCG a guest
/// kernel has been seen to die of its own text patching (`Oops: int3` in
/// syscall_exit_to_user_mode_prepare while a tracepoint was switched on: an int3 left
/// behind by text_poke_bp still executed on the other vCPU), which says nothing about
/// the suites; the crash is still printed and listed under the table.
const GUEST_CRASH_REBOOTS: usize = 1;

/// Whether a guest crash report is a soft lockup or an RCU stall (the kernel hung).
fn is_lockup(crash: &str) -> bool {
    crash.contains("soft lockup")
        || crash.contains("rcu_sched self-detected stall")
        || crash.contains("rcu_preempt self-detected stall")
        || crash.contains("RCU Stall")
}

/// The kernel's own report if the guest kernel crashed: from the first oops or BUG line
/// to the panic line (at most 160 lines: a lockup prints every CPU's backtrace).
fn guest_crash(console: &str) -> Option<String> {
    let lines: Vec<&str> = console.lines().map(|l| l.trim_end_matches('\r')).collect();
    let panic = lines
        .iter()
        .position(|l| l.contains("Kernel panic - not syncing"))?;
    let start = lines[..panic]
        .iter()
        .position(|l| {
            [
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
fn finished_runs(console: &str) -> (usize, &str) {
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

/// Each suite run that ended with a non-zero status (or never ended), with its output.
fn failure_excerpts(kernel: &str, console: &str) -> String {
    let mut out = String::new();
    let mut current: Option<(String, Vec<&str>)> = None;
    for line in console.lines() {
        let line = line.trim_end_matches('\r');
        if let Some(rest) = line.split(&format!("{MARK} begin ")).nth(1) {
            current = Some((rest.trim().to_owned(), Vec::new()));
        } else if let Some(rest) = line.split(&format!("{MARK} end ")).nth(1) {
            if let Some((what, lines)) = current.take()
                && !rest.trim_end().ends_with("rc=0")
            {
                let _ = writeln!(out, "---- {kernel} {what}: {}", rest.trim());
                for l in lines {
                    let _ = writeln!(out, "{l}");
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

/// Boots the kernel with the initramfs; the serial console goes to `log`.
fn boot(kernel: &Kernel, initrd: &Path, log: &Path) -> Result<()> {
    let log_file = std::fs::File::create(log)?;
    let mut child = Command::new("qemu-system-x86_64")
        .args([
            "-accel",
            "tcg,thread=multi",
            "-cpu",
            "max",
            "-smp",
            "2",
            "-m",
            "3072",
        ])
        .args(["-nographic", "-no-reboot", "-nic", "none"])
        .arg("-kernel")
        .arg(&kernel.vmlinuz)
        .arg("-initrd")
        .arg(initrd)
        .args([
            "-append",
            // A soft lockup or an RCU stall panics the guest (so it ends at once, and the
            // panic's report names it) with every CPU's backtrace.
            "console=ttyS0 panic=-1 quiet loglevel=3 mitigations=off softlockup_panic=1 \
             softlockup_all_cpu_backtrace=1 sysctl.kernel.panic_on_rcu_stall=1",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(log_file.try_clone()?)
        .spawn()
        .context("starting qemu-system-x86_64 (Debian package qemu-system-x86)")?;
    let stdout = child.stdout.take().expect("piped");
    let deadline = Instant::now() + GUEST_TIMEOUT;
    let reader = std::thread::spawn(move || -> std::io::Result<()> {
        use std::io::Write as _;
        let mut log_file = log_file;
        for line in BufReader::new(stdout).lines() {
            let line = line?;
            // Progress in the CI log: one line per suite.
            if let Some(at) = line.find(MARK)
                && (line.contains(" end ") || line.contains(" kernel "))
            {
                eprintln!("xtask vm: {}", line[at..].trim_end());
            }
            writeln!(log_file, "{line}")?;
        }
        Ok(())
    });
    loop {
        if let Some(status) = child.try_wait()? {
            let _ = reader.join();
            if !status.success() {
                bail!("qemu exited with {status}");
            }
            return Ok(());
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            let _ = reader.join();
            bail!(
                "the guest did not finish within {} s and was killed",
                GUEST_TIMEOUT.as_secs()
            );
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Rows for every mode requested, from the markers and `test result:` lines on the console.
fn parse_console(kernel: &str, console: &str, modes: &[&str]) -> Vec<Row> {
    let mut rows: Vec<Row> = modes
        .iter()
        .map(|m| Row {
            kernel: kernel.to_owned(),
            mode: (*m).to_owned(),
            passed: 0,
            failed: 0,
            broken: Vec::new(),
            tests: Default::default(),
        })
        .collect();
    let mut current: Option<(usize, String, bool)> = None; // (row, suite, saw a result)
    // The run's tests (`test NAME ... `) and the names listed under its last `failures:`.
    let mut started: Vec<String> = Vec::new();
    let mut failed: Vec<String> = Vec::new();
    let mut in_failures = false;
    for line in console.lines() {
        let line = line.trim_end_matches('\r');
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

/// `mode=X suite=Y` -> (X, Y).
fn fields(rest: &str) -> (String, String) {
    let get = |key: &str| {
        rest.split_whitespace()
            .find_map(|w| w.strip_prefix(key))
            .unwrap_or("")
            .to_owned()
    };
    (get("mode="), get("suite="))
}

fn render_table(rows: &[Row], suites: &[(&str, Option<&str>)], repeat: u32) -> String {
    let mut t = String::from("kernel matrix (qemu TCG, suites: ");
    t.push_str(
        &suites
            .iter()
            .map(|(s, f)| match f {
                Some(f) => format!("{s}[{f}]"),
                None => (*s).to_owned(),
            })
            .collect::<Vec<_>>()
            .join(" "),
    );
    if repeat > 1 {
        let _ = write!(t, ", each run {repeat} times");
    }
    t.push_str(")\n");
    let _ = writeln!(
        t,
        "{:<14} {:<11} {:>6} {:>6}  result",
        "kernel", "mode", "passed", "failed"
    );
    for r in rows {
        let verdict = if r.ok() {
            "PASS".to_owned()
        } else if r.broken.is_empty() {
            "FAIL".to_owned()
        } else {
            format!("FAIL ({})", r.broken.join(", "))
        };
        let _ = writeln!(
            t,
            "{:<14} {:<11} {:>6} {:>6}  {verdict}",
            r.kernel, r.mode, r.passed, r.failed
        );
    }
    t.push_str(&per_test_table(rows, repeat));
    t
}

/// Passed/finished runs of every test in every kernel x mode cell: all of them when suites
/// were repeated (flaky-test hunting), else only the tests that failed somewhere.
fn per_test_table(rows: &[Row], repeat: u32) -> String {
    let mut tests: Vec<&String> = rows.iter().flat_map(|r| r.tests.keys()).collect();
    tests.sort();
    tests.dedup();
    let flaky = |test: &String| {
        rows.iter()
            .any(|r| r.tests.get(test).is_some_and(|(n, ok)| n != ok))
    };
    if repeat <= 1 {
        tests.retain(|t| flaky(t));
    }
    if tests.is_empty() {
        return String::new();
    }
    let mut t =
        String::from("\nper test, passed/finished runs (a failure is a mismatch or an error):\n");
    let width = tests.iter().map(|n| n.len()).max().unwrap_or(0);
    let _ = write!(t, "{:<width$}", "test");
    for r in rows {
        let _ = write!(t, "  {:>22}", format!("{} {}", r.kernel, r.mode));
    }
    t.push('\n');
    for test in tests {
        let _ = write!(t, "{test:<width$}");
        for r in rows {
            let cell = r
                .tests
                .get(test)
                .map_or("-".to_owned(), |(n, ok)| format!("{ok}/{n}"));
            let _ = write!(t, "  {cell:>22}");
        }
        t.push('\n');
    }
    t
}

/// Shared libraries `binary` loads (ldd), the dynamic loader included.
fn shared_libraries(binary: &Path) -> Result<Vec<PathBuf>> {
    let out = Command::new("ldd").arg(binary).output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    if text.contains("not a dynamic executable") || !out.status.success() {
        return Ok(Vec::new());
    }
    let mut libs = Vec::new();
    for line in text.lines() {
        if line.contains("not found") {
            bail!("{}: {}", binary.display(), line.trim());
        }
        let path = line
            .split("=>")
            .nth(1)
            .unwrap_or(line)
            .split_whitespace()
            .next()
            .unwrap_or("");
        if path.starts_with('/') {
            libs.push(PathBuf::from(path));
        }
    }
    Ok(libs)
}

/// Module files to insmod, dependencies first, for the kernel's own modules.dep.
fn module_load_order(kernel: &Kernel) -> Result<Vec<PathBuf>> {
    // Debian's packages leave modules.dep to depmod in postinst.
    super::run(
        Command::new("depmod")
            .arg("-b")
            .arg(&kernel.root)
            .arg(&kernel.release),
    )
    .context("depmod (Debian package kmod)")?;
    let mut order: Vec<PathBuf> = Vec::new();
    for module in GUEST_MODULES {
        let deps = output(Command::new("modprobe").arg("-d").arg(&kernel.root).args([
            "-S",
            &kernel.release,
            "--show-depends",
            module,
        ]))?;
        for line in deps.lines() {
            // "insmod /path/to/x.ko[.xz] " or "builtin x"
            if let Some(path) = line.strip_prefix("insmod ") {
                let path = PathBuf::from(path.trim());
                if !order.contains(&path) {
                    order.push(path);
                }
            }
        }
    }
    Ok(order)
}

/// Copies a module, decompressed (busybox insmod passes the file to init_module as is).
fn decompress_module(src: &Path, dst: &Path) -> Result<()> {
    if let Some(parent) = dst.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let name = src.to_string_lossy();
    let tool = if name.ends_with(".xz") {
        Some("xz")
    } else if name.ends_with(".zst") {
        Some("zstd")
    } else if name.ends_with(".gz") {
        Some("gzip")
    } else {
        None
    };
    match tool {
        None => copy_file(src, dst),
        Some(tool) => {
            let out = std::fs::File::create(dst)?;
            let status = Command::new(tool)
                .arg("-dc")
                .arg(src)
                .stdout(out)
                .status()
                .with_context(|| format!("starting {tool}"))?;
            if !status.success() {
                bail!("{tool} -dc {} failed: {status}", src.display());
            }
            Ok(())
        }
    }
}

fn copy_file(src: &Path, dst: &Path) -> Result<()> {
    if let Some(parent) = dst.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::copy(src, dst)
        .with_context(|| format!("copying {} to {}", src.display(), dst.display()))?;
    Ok(())
}

fn set_executable(path: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))?;
    Ok(())
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
}
