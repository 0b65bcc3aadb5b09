//! Idempotent bootstrap: nightly rust-src, a bpf-linker built against nightly's own LLVM,
//! and the Debian packages the integration suite drives. Each step checks first and does
//! nothing when the machine already has it.

use std::{path::PathBuf, process::Command};

use anyhow::{Context as _, Result, bail};

/// Debian packages the build or the tests run: `ip`/`ss` (iproute2), `setpriv`
/// (util-linux), `prometheus` and `promtool`, `nft` (nftables: tests hold handshakes
/// open), `bpftool`, `nginx` and `wrk` (the real-world experiment), `tmux` (the terminal view's
/// test), `systemd-analyze` (systemd: the unit's verify and security score), `openssl` and
/// `curl` (the TLS test); for the kernel matrix: qemu, a static busybox, cpio for the initramfs, and kmod
/// (depmod/modprobe resolve the guest's module dependencies) and xz-utils (Debian's modules
/// are .ko.xz); `bpftrace` (the benchmark's comparison with a hand-written script, and the
/// stress suite's other tracer); procps (`pgrep` finds nginx's workers); `iperf3` (the
/// stress suite's background traffic); redis-server, memcached, apache2 and haproxy (servers
/// started before the daemon, whose backlog requests backlogd must know: tests/tests/day_one.rs);
/// mmdebstrap and e2fsprogs (`mke2fs -d`) build the systemd guest's root file system;
/// lintian checks the Debian package `cargo xtask deb` builds, and dpkg-dev's
/// dpkg-shlibdeps gives cargo-deb its shared-library Depends; linux-libc-dev's UAPI
/// headers go into the kernel matrix's guests (bpftrace compiles against them on 5.10);
/// podman with runc (crun refuses this machine kind's hybrid cgroup layout) runs the
/// containers whose listeners backlogd must name, and the image `cargo xtask image` builds.
const DEBIAN_PACKAGES: &[&str] = &[
    "iproute2",
    "util-linux",
    "prometheus",
    "nftables",
    "bpftool",
    "nginx-light",
    "wrk",
    "tmux",
    "systemd",
    "openssl",
    "curl",
    "qemu-system-x86",
    "busybox-static",
    "cpio",
    "kmod",
    "xz-utils",
    "bpftrace",
    "procps",
    "apache2-utils",
    "iperf3",
    "redis-server",
    "memcached",
    "apache2",
    "haproxy",
    "mmdebstrap",
    "e2fsprogs",
    "lintian",
    "dpkg-dev",
    "linux-libc-dev",
    "podman",
    "runc",
    "containernetworking-plugins",
];

/// cargo-deb builds the Debian package from backlogd's `[package.metadata.deb]`.
const CARGO_DEB_VERSION: &str = "3.8.0";

const BPF_LINKER_VERSION: &str = "0.13.0";

pub fn run() -> Result<()> {
    rust_src()?;
    bpf_linker()?;
    cargo_deb()?;
    debian_packages()?;
    eprintln!("xtask: setup complete");
    Ok(())
}

pub(crate) fn output(cmd: &mut Command) -> Result<String> {
    let out = cmd.output().with_context(|| format!("starting {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed: {}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8(out.stdout)?)
}

fn nightly_sysroot() -> Result<PathBuf> {
    let print = || output(Command::new("rustc").args(["+nightly", "--print", "sysroot"]));
    let sysroot = match print() {
        Ok(sysroot) => sysroot,
        // A fresh machine may have only stable: the eBPF build needs nightly.
        Err(_) => {
            super::run(Command::new("rustup").args([
                "toolchain",
                "install",
                "nightly",
                "--profile",
                "minimal",
                "--component",
                "rust-src,clippy,rustfmt",
            ]))
            .context(
                "installing the nightly Rust toolchain (needed for the eBPF object) failed; \
                 install it with `rustup toolchain install nightly`",
            )?;
            print()?
        }
    };
    Ok(PathBuf::from(sysroot.trim()))
}

fn rust_src() -> Result<()> {
    let core = nightly_sysroot()?.join("lib/rustlib/src/rust/library/core");
    if core.exists() {
        return Ok(());
    }
    super::run(Command::new("rustup").args([
        "component",
        "add",
        "rust-src",
        "--toolchain",
        "nightly",
    ]))
}

/// LLVM major version of the nightly rustc, e.g. 22.
fn nightly_llvm_major() -> Result<u32> {
    let vv = output(Command::new("rustc").args(["+nightly", "-vV"]))?;
    let version = vv
        .lines()
        .find_map(|l| l.strip_prefix("LLVM version: "))
        .context("`rustc +nightly -vV` printed no LLVM version")?;
    version
        .split('.')
        .next()
        .and_then(|m| m.parse().ok())
        .with_context(|| format!("unparsable LLVM version {version:?}"))
}

/// bpf-linker must read the bitcode nightly rustc writes, so it has to link the very
/// libLLVM that ships in nightly's sysroot. `ldd` tells which one an installed copy uses.
fn bpf_linker() -> Result<()> {
    let major = nightly_llvm_major()?;
    let sysroot = nightly_sysroot()?;
    let wanted = format!("libLLVM.so.{major}.");
    if let Ok(path) = output(Command::new("sh").args(["-c", "command -v bpf-linker"]))
        && let Ok(ldd) = output(Command::new("ldd").arg(path.trim()))
        && ldd
            .lines()
            .any(|l| l.contains(&wanted) && !l.contains("not found"))
    {
        return Ok(());
    }
    // The LLVM build script looks for an unversioned libLLVM.so under LLVM_PREFIX.
    let versioned = std::fs::read_dir(sysroot.join("lib"))?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .find(|n| n.starts_with(&wanted))
        .with_context(|| format!("no {wanted}* in {}/lib", sysroot.display()))?;
    let link = sysroot.join("lib/libLLVM.so");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(&versioned, &link)
        .with_context(|| format!("linking {} -> {versioned}", link.display()))?;
    super::run(
        Command::new("cargo")
            .args([
                "install",
                "--locked",
                "--force",
                "bpf-linker",
                "--version",
                BPF_LINKER_VERSION,
                "--no-default-features",
                "--features",
                &format!("llvm-{major}"),
            ])
            .env("LLVM_PREFIX", &sysroot),
    )
}

fn cargo_deb() -> Result<()> {
    if output(Command::new("cargo").args(["deb", "--version"]))
        .is_ok_and(|v| v.contains(CARGO_DEB_VERSION))
    {
        return Ok(());
    }
    super::run(Command::new("cargo").args([
        "install",
        "--locked",
        "cargo-deb",
        "--version",
        CARGO_DEB_VERSION,
    ]))
}

fn debian_packages() -> Result<()> {
    let missing: Vec<&str> = DEBIAN_PACKAGES
        .iter()
        .copied()
        .filter(|p| {
            !Command::new("dpkg-query")
                .args(["-W", "-f=${Status}", p])
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).contains("install ok installed"))
                .unwrap_or(false)
        })
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    super::run(Command::new("apt-get").arg("update"))?;
    super::run(
        Command::new("apt-get")
            .args(["install", "-y", "--no-install-recommends"])
            .args(&missing)
            .env("DEBIAN_FRONTEND", "noninteractive"),
    )
}
