//! Containers as the container suites run them (podman.rs, image.rs, kubernetes.rs,
//! cri.rs): podman with the flags this kind of host needs, what podman made removed when
//! dropped, a root file system borrowed from the host, the image `cargo xtask image`
//! builds, Go modules from the module cache, and containerd's CRI plugin ([`cri`]) with
//! the OCI archives it imports ([`oci`]).

pub mod cri;
pub mod oci;

use std::{
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
};

/// The flags every podman command of the suite gets: runc and cgroupfs (the suites' hosts
/// run no systemd as PID 1, which podman's defaults, crun under the systemd cgroup
/// manager, expect).
const PODMAN_FLAGS: [&str; 4] = ["--runtime", "runc", "--cgroup-manager", "cgroupfs"];

/// `podman` with the suite's flags ([`PODMAN_FLAGS`]) and nothing else: for a caller that
/// sets more on the command (fds to pass, a service to spawn) before it runs.
pub fn podman_command() -> Command {
    let mut command = Command::new("podman");
    command.args(PODMAN_FLAGS);
    command
}

/// `podman ARGS` with runc and cgroupfs ([`podman_command`]), stdin closed; the caller
/// judges the outcome.
pub fn podman(args: &[&str]) -> Output {
    podman_command()
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

/// What podman made for the test, removed when dropped (even when the test fails).
pub enum Podman {
    Image(String),
    Container(String),
}

impl Drop for Podman {
    fn drop(&mut self) {
        let _ = match self {
            // Not --force: that would also remove containers of the same image id (a
            // reproducible build of the same binary is the same image) that are not ours.
            Podman::Image(name) => podman(&["rmi", name]),
            Podman::Container(name) => podman(&["rm", "--force", "--time", "0", name]),
        };
    }
}

/// stdout then stderr of `out`, as text.
pub fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// A root file system at `root` of symlinks into /usr (merged-/usr Debian), for a
/// container that has the host's /usr mounted in (read-only) and runs its programs.
pub fn usr_rootfs(root: &Path) {
    for d in ["usr", "proc", "sys", "dev", "etc", "tmp"] {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
    for (link, target) in [
        ("bin", "usr/bin"),
        ("sbin", "usr/sbin"),
        ("lib", "usr/lib"),
        ("lib64", "usr/lib64"),
    ] {
        std::os::unix::fs::symlink(target, root.join(link)).unwrap();
    }
}

/// The workspace the suite belongs to (tests/ is one of its members).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ lives in the workspace")
        .to_path_buf()
}

/// `cargo xtask image --binary BIN --output ARCHIVE --reference REFERENCE` for the binary
/// under test ([`crate::daemon::binary`]): its stdout, once it succeeded (else the test
/// fails with its output).
pub fn xtask_image(archive: &Path, reference: &str) -> String {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let out = Command::new(cargo)
        .args(["xtask", "image", "--binary"])
        .arg(crate::daemon::binary())
        .arg("--output")
        .arg(archive)
        .args(["--reference", reference])
        .current_dir(workspace_root())
        .output()
        .expect("starting cargo xtask image");
    assert!(
        out.status.success(),
        "cargo xtask image failed ({}):\n{}",
        out.status,
        text(&out)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The directory of Go module `module` (`path@version`) as `go mod download -json` names
/// it, run in `cwd`; from the module cache alone when `offline` (`GOPROXY=off`), else
/// downloaded if missing. Err says what is missing: the Go toolchain, or the module.
pub fn go_module(module: &str, cwd: &Path, offline: bool) -> Result<PathBuf, String> {
    let mut go = Command::new("go");
    go.args(["mod", "download", "-json", module])
        .env("GOFLAGS", "-mod=mod")
        .current_dir(cwd);
    if offline {
        go.env("GOPROXY", "off");
    }
    let out = go
        .output()
        .map_err(|e| format!("`go` (the Go toolchain): {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{module} in the Go module cache (`go mod download -json {module}`): {}",
            text(&out)
        ));
    }
    let info: serde_json::Value = serde_json::from_slice(&out.stdout).expect("go's JSON");
    Ok(PathBuf::from(info["Dir"].as_str().expect("a Dir")))
}
