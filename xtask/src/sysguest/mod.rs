//! `cargo xtask systemd-guest`: the packaged service under a real PID-1 systemd.
//!
//! Boots a Debian guest (root file system from Debian packages by mmdebstrap, its own
//! cloud kernel and initrd, systemd as init) under qemu TCG, installs the `.deb` that
//! `cargo xtask deb` builds, and runs `xtask/guest/systemd/check.py`, which proves from
//! systemd's own state (`systemctl show`, the journal) and the kernel's: the unit becomes
//! active only after READY=1, a reload applies a changed setting, the watchdog kills a
//! stopped daemon and it restarts, a SIGKILLed daemon restarts and its counts continue
//! from the pins equal to the kernel's, the hardening is in force in the running process,
//! and removing the package leaves no program attached; and every program the unit runs
//! comes from a package the .deb depends on (or an Essential one). The checks print their evidence
//! on the serial console; this side reads it and fails on any failed or missing check.
//!
//! `cargo xtask test` is to call [`run`] with `Options::default()`.

use std::{
    io::{BufRead as _, BufReader, Write as _},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

mod rootfs;

/// What the guest's lines for the host start with (check.py's MARK).
const MARK: &str = "@@backlogd-systemd";

/// issue 20's checks by number, each of which must report PASS (7: the service starts and
/// says what the kernel made it leave out; 4 then proves what is left); 8: every program
/// the unit runs comes from a package the .deb depends on (or an Essential one); 9 (issue
/// 21): a transient service's listener is named by its unit, an `ip netns` namespace by its
/// name; 10 (issue 31): `.socket` units PID 1 started before the daemon, with and without
/// `Backlog=`, get what systemd asked for and the clamp is named with `Backlog=`.
const CHECKS: &[u32] = &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10];

/// A guest that has not powered off by then is killed: the boot takes about 15 s and the
/// checks about 2 minutes under TCG here; anything near this is a hang.
const GUEST_TIMEOUT: Duration = Duration::from_secs(12 * 60);

#[derive(Default)]
pub struct Options {
    /// Debian kernel package to install in the guest and boot (default
    /// linux-image-cloud-amd64, bookworm's newest 6.1 cloud kernel).
    pub kernel_package: Option<String>,
    /// Another Debian suite whose packages the guest may also take (e.g. `bullseye`, with
    /// `--kernel-package linux-image-5.10.0-32-cloud-amd64`): boots Debian 11's kernel in the
    /// same guest, where check 7 finds fentry mode pinned.
    pub extra_suite: Option<String>,
    /// Install this package instead of building one with `cargo xtask deb`.
    pub deb: Option<PathBuf>,
}

pub fn run(opts: &Options) -> Result<()> {
    let started = Instant::now();
    let work = crate::workspace_root().join("target/systemd-guest");
    std::fs::create_dir_all(&work)?;

    let t = Instant::now();
    let deb = match &opts.deb {
        Some(deb) => deb.clone(),
        None => build_deb()?,
    };
    let deb_secs = t.elapsed().as_secs_f64();

    let guest_dir = crate::workspace_root().join("xtask/guest/systemd");
    let runner = std::fs::read_to_string(guest_dir.join("runner.service"))
        .with_context(|| format!("reading {}", guest_dir.join("runner.service").display()))?;
    let t = Instant::now();
    let rootfs = rootfs::ensure(opts, &runner)?;
    let rootfs_secs = t.elapsed().as_secs_f64();

    let payload = build_payload(&work, &deb, &guest_dir)?;
    let log = work.join("console.log");
    eprintln!(
        "xtask systemd-guest: booting {} (kernel {}, systemd as PID 1) under qemu TCG with \
         {}; console log: {}",
        rootfs.image.display(),
        rootfs::kernel_release(&rootfs),
        deb.display(),
        log.display()
    );
    let t = Instant::now();
    let booted = boot(&rootfs, &payload, &log);
    let guest_secs = t.elapsed().as_secs_f64();
    let console = std::fs::read_to_string(&log).unwrap_or_default();
    let outcome = judge(&console);
    eprintln!(
        "xtask systemd-guest: timings: deb {deb_secs:.0} s, root file system {rootfs_secs:.0} s \
         ({}), guest {guest_secs:.0} s (boot and checks), total {:.0} s",
        if rootfs.built { "built" } else { "cached" },
        started.elapsed().as_secs_f64()
    );
    match (booted, outcome) {
        (Ok(()), Ok(summary)) => {
            println!("{summary}");
            Ok(())
        }
        (booted, outcome) => {
            // The guest's side of the story: from the first line the checks printed, or
            // the whole console when they never started.
            let from = console
                .find(MARK)
                .map_or(0, |at| console[..at].rfind('\n').map_or(0, |nl| nl + 1));
            eprintln!(
                "xtask systemd-guest: console log ({}):\n{}",
                log.display(),
                &console[from..]
            );
            let mut why = Vec::new();
            if let Err(e) = booted {
                why.push(format!("{e:#}"));
            }
            if let Err(e) = outcome {
                why.push(format!("{e:#}"));
            }
            bail!(
                "systemd guest: {} (console log above and in {})",
                why.join("; "),
                log.display()
            )
        }
    }
}

/// `cargo xtask deb` (this same xtask binary, so whatever packaging it has), then the
/// package it wrote.
fn build_deb() -> Result<PathBuf> {
    let since = std::time::SystemTime::now();
    let exe = std::env::current_exe().context("locating the xtask binary")?;
    crate::run(Command::new(exe).arg("deb")).context("`cargo xtask deb` failed")?;
    let dir = crate::workspace_root().join("target/debian");
    let newest = std::fs::read_dir(&dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("backlogd_") && n.ends_with(".deb"))
        })
        .filter_map(|p| Some((std::fs::metadata(&p).ok()?.modified().ok()?, p)))
        .max();
    match newest {
        // A package older than this build is a leftover, not what `deb` just made.
        Some((modified, path)) if modified >= since - Duration::from_secs(2) => Ok(path),
        _ => bail!(
            "`cargo xtask deb` wrote no new target/debian/backlogd_*.deb; the systemd guest \
             installs that package"
        ),
    }
}

/// A small ext4 disk (the guest's /dev/vdb) with the package and the checks.
fn build_payload(work: &Path, deb: &Path, guest_dir: &Path) -> Result<PathBuf> {
    let dir = work.join("payload");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    std::fs::copy(deb, dir.join("backlogd.deb"))
        .with_context(|| format!("copying {}", deb.display()))?;
    for script in ["check.py", "actor.py"] {
        std::fs::copy(guest_dir.join(script), dir.join(script))
            .with_context(|| format!("copying {}", guest_dir.join(script).display()))?;
    }
    let image = work.join("payload.ext4");
    let _ = std::fs::remove_file(&image);
    let size_mib = std::fs::metadata(deb)?.len() / (1 << 20) * 2 + 32;
    crate::run(
        Command::new("mke2fs")
            .args(["-q", "-t", "ext4", "-L", "sgpayload", "-d"])
            .arg(&dir)
            .arg(&image)
            .arg(format!("{size_mib}M")),
    )
    .context("packing the payload disk (mke2fs from e2fsprogs)")?;
    Ok(image)
}

/// Boots the guest; its serial console goes to `log`, and the checks' lines to stderr as
/// they come. The root image is opened with `snapshot=on`: the guest's writes go to a
/// temporary overlay and the cached image stays as built.
fn boot(rootfs: &rootfs::Rootfs, payload: &Path, log: &Path) -> Result<()> {
    let mut log_file = std::fs::File::create(log)?;
    let mut child = crate::vm::qemu(2048, &rootfs.vmlinuz, &rootfs.initrd)
        .arg("-drive")
        .arg(format!(
            "file={},format=raw,if=virtio,snapshot=on",
            rootfs.image.display()
        ))
        .arg("-drive")
        .arg(format!(
            "file={},format=raw,if=virtio,readonly=on",
            payload.display()
        ))
        // systemd prints unit status only for failures; lockups panic as in the matrix.
        .arg("-append")
        .arg(format!(
            "console=ttyS0 root=/dev/vda rw panic=-1 quiet loglevel=4 mitigations=off \
             systemd.show_status=error {}",
            crate::vm::LOCKUPS_PANIC
        ))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting qemu-system-x86_64 (Debian package qemu-system-x86)")?;
    let stdout = child.stdout.take().expect("piped");
    let mut stderr = child.stderr.take().expect("piped");
    let reader = std::thread::spawn(move || -> std::io::Result<()> {
        for line in BufReader::new(stdout).lines() {
            let line = line?;
            if let Some(at) = line.find(MARK) {
                eprintln!("xtask systemd-guest: {}", line[at..].trim_end());
            }
            writeln!(log_file, "{line}")?;
        }
        // qemu's own complaints last.
        std::io::copy(&mut stderr, &mut log_file)?;
        Ok(())
    });
    crate::vm::wait_for_qemu(
        &mut child,
        reader,
        Instant::now() + GUEST_TIMEOUT,
        GUEST_TIMEOUT,
        || None,
    )
}

/// The checks' verdicts from the console: a summary when every check in [`CHECKS`]
/// passed, else an error naming what failed or never reported.
fn judge(console: &str) -> Result<String> {
    if let Some(at) = console.find("Kernel panic - not syncing") {
        let line = console[at..].lines().next().unwrap_or("");
        bail!("the guest kernel panicked: {line}");
    }
    let mut passed = Vec::new();
    let mut failed = Vec::new();
    let mut summary = String::new();
    let mut done = false;
    for line in console.lines() {
        let Some(at) = line.find(MARK) else { continue };
        let rest = line[at + MARK.len()..].trim();
        if let Some(check) = rest.strip_prefix("check ") {
            let mut words = check.split_whitespace();
            let number: Option<u32> = words.next().and_then(|n| n.parse().ok());
            let _name = words.next();
            match (number, words.next()) {
                (Some(n), Some("PASS")) => passed.push(n),
                (Some(_), _) => failed.push(format!("check {check}")),
                _ => failed.push(format!("unparsable: {check}")),
            }
        }
        done |= rest.starts_with("done ");
        // The evidence went to stderr as it came; the summary is the verdicts.
        if rest.starts_with("check ") || rest.starts_with("done ") {
            summary.push_str(rest);
            summary.push('\n');
        }
    }
    let missing: Vec<String> = CHECKS
        .iter()
        .filter(|n| !passed.contains(n))
        .filter(|n| !failed.iter().any(|f| f.starts_with(&format!("check {n} "))))
        .map(|n| format!("check {n} never reported"))
        .collect();
    failed.extend(missing);
    if !done && failed.is_empty() {
        failed.push("the checks never finished (no `done` line)".into());
    }
    if !failed.is_empty() {
        bail!("{}", failed.join("; "));
    }
    Ok(format!("systemd guest: every check passed\n{summary}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_check_must_pass_and_report() {
        let ok = format!(
            "boot noise\n{MARK} check 1 start PASS (3.0 s)\n{MARK} evidence 1: x\n\
             {MARK} check 2 reload PASS (1 s)\n{MARK} check 3 wd PASS (1 s)\n\
             {MARK} check 4 pins PASS (1 s)\n{MARK} check 5 hard PASS (1 s)\n\
             {MARK} check 6 rm PASS (1 s)\n{MARK} check 7 left PASS (1 s)\n\
             {MARK} check 8 deps PASS (1 s)\n{MARK} check 9 names PASS (1 s)\n\
             {MARK} check 10 sockets PASS (1 s)\n{MARK} done passed=10 failed=0\n"
        );
        assert!(judge(&ok).is_ok());
        let failed = ok.replace("check 4 pins PASS", "check 4 pins FAIL");
        let e = judge(&failed).unwrap_err().to_string();
        assert!(e.contains("check 4 pins FAIL"), "{e}");
        let missing = ok.replace(&format!("{MARK} check 6 rm PASS (1 s)\n"), "");
        let e = judge(&missing).unwrap_err().to_string();
        assert!(e.contains("check 6 never reported"), "{e}");
        let unfinished = ok.replace(&format!("{MARK} done passed=10 failed=0\n"), "");
        assert!(judge(&unfinished).is_err());
        let panic = format!("{ok}[ 9.1] Kernel panic - not syncing: softlockup: hung tasks\n");
        assert!(judge(&panic).unwrap_err().to_string().contains("panicked"));
    }
}
