//! External programs some tests drive (openssl, curl, systemd-analyze, busybox...), which
//! `cargo xtask setup` installs.
//!
//! A test whose tool is missing may skip, loudly, only where nobody promised the tool: under
//! the project's test command (`cargo xtask test`, which runs `cargo xtask setup` first) a
//! missing tool fails the test, since a skip there would pass a suite that proved nothing.
//! Which run is which:
//!
//! - `BACKLOGD_REQUIRE_TOOLS=1`: tools are required; `BACKLOGD_REQUIRE_TOOLS=0`: a missing
//!   tool skips (for running the suite by hand on a machine without them);
//! - unset: required when `BACKLOGD_BIN` is set, which `cargo xtask test` (and the qemu
//!   guest) set and a plain `cargo test` does not.

use std::process::{Command, Stdio};

/// Whether this run requires every tool a test needs (see the module comment).
pub fn required() -> bool {
    match std::env::var("BACKLOGD_REQUIRE_TOOLS").as_deref() {
        Ok("1") => true,
        Ok("0") => false,
        Ok(other) => panic!("BACKLOGD_REQUIRE_TOOLS={other:?}: set it to 1 or 0"),
        Err(_) => std::env::var_os("BACKLOGD_BIN").is_some(),
    }
}

/// Whether `program probe_args...` runs and succeeds. When it does not: panics if tools are
/// [`required`], else marks the test skipped ([`crate::marks::skip`]) and returns false, so
/// the caller returns at once.
#[must_use]
#[track_caller]
pub fn available(test: &str, program: &str, probe_args: &[&str], package: &str) -> bool {
    let probe = Command::new(program)
        .args(probe_args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    let why = match probe {
        Ok(status) if status.success() => return true,
        Ok(status) => format!("`{program} {}` exited with {status}", probe_args.join(" ")),
        Err(e) => format!("`{program}` cannot be run: {e}"),
    };
    let need = format!(
        "{test} needs `{program}` (Debian package {package}, installed by `cargo xtask setup`): \
         {why}"
    );
    if required() {
        panic!(
            "{need}. This run requires every tool (BACKLOGD_REQUIRE_TOOLS=1, or BACKLOGD_BIN \
             set as by `cargo xtask test`); run `cargo xtask setup`"
        );
    }
    crate::marks::skip(&format!(
        "{need} (under `cargo xtask test` a missing tool fails instead)"
    ));
    false
}

/// Mounts a `fstype` file system at `at` unless one is mounted there: the CI machine kind
/// mounts neither bpffs nor tracefs at boot (../shared/notes/platform.md), and a fresh one
/// has nothing that mounts them. bpffs holds `--pin-dir`; bpftrace finds classic
/// tracepoints through tracefs (without it each tracepoint probe attaches to nothing and
/// counts 0).
pub fn ensure_mounted(fstype: &str, at: &str) {
    // Tests of one binary run in parallel: one mount, not one per test.
    static MOUNTING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = MOUNTING.lock().unwrap_or_else(|e| e.into_inner());
    let mounts = std::fs::read_to_string("/proc/self/mounts").expect("/proc/self/mounts");
    let there = mounts.lines().any(|l| {
        let mut f = l.split(' ').skip(1);
        f.next() == Some(at) && f.next() == Some(fstype)
    });
    if there {
        return;
    }
    eprintln!("mounting {fstype} at {at} (this host had none)");
    let out = Command::new("mount")
        .args(["-t", fstype, fstype, at])
        .output()
        .expect("running mount");
    assert!(
        out.status.success(),
        "mount -t {fstype} {fstype} {at}: {out:?}"
    );
}
