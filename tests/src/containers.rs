//! podman as the container suites run it (podman.rs, image.rs, kubernetes.rs): one place
//! for the flags this kind of host needs.

use std::process::{Command, Output, Stdio};

/// `podman ARGS` with runc and cgroupfs (the suites' hosts run no systemd as PID 1, which
/// podman's defaults, crun under the systemd cgroup manager, expect), stdin closed; the
/// caller judges the outcome.
pub fn podman(args: &[&str]) -> Output {
    Command::new("podman")
        .args(["--runtime", "runc", "--cgroup-manager", "cgroupfs"])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("running podman")
}

/// [`podman`], failing the test with podman's own output unless it succeeded.
#[track_caller]
pub fn podman_ok(args: &[&str]) -> Output {
    let out = podman(args);
    assert!(
        out.status.success(),
        "podman {} failed ({}):\n{}{}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}
