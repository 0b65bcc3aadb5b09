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
/// [`required`], else prints a SKIPPED banner straight to stderr (not captured by libtest)
/// and returns false, so the caller returns at once.
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
    crate::report(&format!(
        "\n!!!!!!!! SKIPPED {test}: {need}. This test proved nothing; under `cargo xtask test` \
         it fails instead.\n\n"
    ));
    false
}
