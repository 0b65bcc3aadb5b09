//! Idempotent bootstrap, in two sizes. [`build`] (`cargo xtask run`, `install`, `image`):
//! what building and running the daemon needs and nothing else: nightly rust-src and a
//! bpf-linker built against nightly's own LLVM. [`run`] (`cargo xtask test`, `vm`, `bench`,
//! `deb`, `systemd-guest`, `setup`): that, plus the Debian packages the suites drive, with
//! no service of theirs started ([`debian_packages`]), cargo-deb, and the Kubernetes
//! manifests' checkers (kubernetes-validate and check-jsonschema in a Python venv,
//! prometheus-operator's CRDs in the Go module cache). Each step checks first and does
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
/// stress suite's background traffic); redis-server, memcached, apache2, haproxy, nodejs,
/// openssh-server, mariadb-server, postgresql-15, php8.2-fpm, gunicorn,
/// openjdk-17-jdk-headless, tomcat10, jetty9 and libnetty-java (servers started before the
/// daemon, whose backlog requests backlogd must know: tests/tests/day_one.rs, which runs
/// each itself in a namespace of its own, a JVM through the JDK's source launcher, Tomcat
/// and Jetty from a base directory of the test's own, a Netty server it compiles; the
/// three Java packages add 33.9 MB of downloads, 43.3 MB installed, to a bookworm
/// machine that has the rest; no
/// policy-rc.d is set here, so whether the package's own service starts on install is the
/// machine's: this machine kind's image carries a policy-rc.d that denies it);
/// mmdebstrap and e2fsprogs (`mke2fs -d`) build the systemd guest's root file system;
/// lintian checks the Debian package `cargo xtask deb` builds, and dpkg-dev's
/// dpkg-shlibdeps gives cargo-deb its shared-library Depends; linux-libc-dev's UAPI
/// headers go into the kernel matrix's guests (bpftrace compiles against them on 5.10);
/// podman with runc (crun refuses this machine kind's hybrid cgroup layout) runs the
/// containers whose listeners backlogd must name, and the image `cargo xtask image` builds;
/// python3-venv makes the Kubernetes manifests' checkers a venv of their own; containerd
/// (its CRI plugin), python3-grpcio, python3-protobuf and protobuf-compiler run
/// tests/tests/cri.rs's pods and its CRI client.
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
    "nodejs",
    "openssh-server",
    "mariadb-server",
    "postgresql-15",
    "php8.2-fpm",
    "gunicorn",
    "openjdk-17-jdk-headless",
    "tomcat10",
    "jetty9",
    "libnetty-java",
    "mmdebstrap",
    "e2fsprogs",
    "lintian",
    "dpkg-dev",
    "linux-libc-dev",
    "podman",
    "runc",
    "containernetworking-plugins",
    "python3-venv",
    "containerd",
    "python3-grpcio",
    "python3-protobuf",
    "protobuf-compiler",
];

/// cargo-deb builds the Debian package from backlogd's `[package.metadata.deb]`.
const CARGO_DEB_VERSION: &str = "3.8.0";

const BPF_LINKER_VERSION: &str = "0.13.0";

/// What building and running the daemon needs: the eBPF toolchain. No Debian package (the
/// build uses the machine's C compiler for cargo's build scripts; the daemon itself runs
/// without any other program).
pub fn build() -> Result<()> {
    rust_src()?;
    bpf_linker()?;
    eprintln!("xtask: build setup complete");
    Ok(())
}

/// Everything the suites, the kernel matrix and the package need (see the module doc).
pub fn run() -> Result<()> {
    build()?;
    cargo_deb()?;
    debian_packages()?;
    manifest_checkers()?;
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

/// Installs the missing [`DEBIAN_PACKAGES`] without letting any of them start a service:
/// several (apache2, nginx, redis-server, memcached, haproxy, containerd, prometheus...)
/// start one on install on a host with systemd, and apache2's would take port 80. The
/// suites start their own server processes in their own network namespaces. A
/// `policy-rc.d` that refuses every start is in place during the install (Debian's
/// invoke-rc.d and deb-systemd-invoke consult it) and removed after; units the new
/// packages enabled for boot are listed with the command that disables them.
fn debian_packages() -> Result<()> {
    let missing: Vec<&str> = DEBIAN_PACKAGES
        .iter()
        .copied()
        .filter(|p| !installed(p))
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    eprintln!(
        "xtask: installing {} Debian packages the suites drive, with service starts \
         refused (policy-rc.d): {}",
        missing.len(),
        missing.join(" ")
    );
    super::run(Command::new("apt-get").arg("update"))?;
    let policy = PolicyRcD::refuse_starts()?;
    let installed = super::run(
        Command::new("apt-get")
            .args(["install", "-y", "--no-install-recommends"])
            .args(&missing)
            .env("DEBIAN_FRONTEND", "noninteractive"),
    );
    drop(policy);
    installed?;
    let enabled = enabled_units(&missing);
    if !enabled.is_empty() {
        eprintln!(
            "xtask: none of them was started; their packages enabled these units for the \
             next boot: {}. To keep them off: systemctl disable {}",
            enabled.join(" "),
            enabled.join(" ")
        );
    }
    Ok(())
}

fn installed(package: &str) -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", package])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains("install ok installed"))
        .unwrap_or(false)
}

/// `/usr/sbin/policy-rc.d` answering 101 ("action forbidden") for every service action
/// while it lives; an existing one is left alone (its owner decided already).
struct PolicyRcD(Option<PathBuf>);

impl PolicyRcD {
    fn refuse_starts() -> Result<Self> {
        let path = PathBuf::from("/usr/sbin/policy-rc.d");
        if path.exists() {
            eprintln!(
                "xtask: {} exists and decides which services start; left as it is",
                path.display()
            );
            return Ok(Self(None));
        }
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::write(
            &path,
            "#!/bin/sh\n# written by backlogd's `cargo xtask setup` for one apt-get install\nexit 101\n",
        )
        .with_context(|| format!("writing {}", path.display()))?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))?;
        Ok(Self(Some(path)))
    }
}

impl Drop for PolicyRcD {
    fn drop(&mut self) {
        if let Some(path) = &self.0
            && let Err(e) = std::fs::remove_file(path)
        {
            eprintln!(
                "xtask: could not remove {}: {e}; remove it, or no package will start \
                 its service",
                path.display()
            );
        }
    }
}

/// systemd units shipped by `packages` that are enabled (their symlinks under
/// /etc/systemd/system), e.g. `apache2.service`.
fn enabled_units(packages: &[&str]) -> Vec<String> {
    let mut units = Vec::new();
    for p in packages {
        let Ok(files) = output(Command::new("dpkg-query").args(["-L", p])) else {
            continue;
        };
        for f in files.lines() {
            let Some(unit) = f
                .strip_prefix("/lib/systemd/system/")
                .or_else(|| f.strip_prefix("/usr/lib/systemd/system/"))
            else {
                continue;
            };
            if unit.contains('/') || !(unit.ends_with(".service") || unit.ends_with(".socket")) {
                continue;
            }
            let wants = std::fs::read_dir("/etc/systemd/system")
                .into_iter()
                .flatten()
                .flatten()
                .filter(|d| d.file_name().to_string_lossy().ends_with(".wants"))
                .any(|d| d.path().join(unit).exists());
            if wants {
                units.push(unit.to_owned());
            }
        }
    }
    units.sort();
    units.dedup();
    units
}

/// The venv tests/tests/kubernetes.rs runs the manifest checkers from (the same path is
/// spelled there).
fn manifest_venv() -> Result<PathBuf> {
    let home = std::env::var_os("HOME").context("HOME is not set")?;
    Ok(PathBuf::from(home).join(".cache/backlogd/venv"))
}

/// What the venv holds: the two checkers, and jsonschema, whose version decides what both
/// accept. Their other dependencies float: compiled ones (rpds-py, regress) pinned here
/// would have no wheel for the next Debian's Python.
const MANIFEST_CHECKERS: &[&str] = &[
    "kubernetes-validate==1.37.0",
    "check-jsonschema==0.39.0",
    "jsonschema==4.26.0",
];

/// prometheus-operator's module carries its CRDs (example/prometheus-operator-crd/), whose
/// schemas the PodMonitor and ServiceMonitor are checked against. Go's module proxy is how
/// it gets here; the checksum database vouches for it.
const PROMETHEUS_OPERATOR: &str = "github.com/prometheus-operator/prometheus-operator@v0.85.0";
/// The CRI's api.proto, which tests/tests/cri.rs compiles for its client (same version
/// as `CRI_API` in tests/src/containers/cri.rs).
const CRI_API: &str = "k8s.io/cri-api@v0.28.4";

/// kubernetes-validate (the Kubernetes schemas), check-jsonschema (the CRDs' schemas) and
/// the CRDs, for tests/tests/kubernetes.rs. A venv of their own under ~/.cache, not pip
/// --user or the system's site-packages: Debian's Python refuses both (PEP 668), and the
/// pins must not meet whatever else is installed.
fn manifest_checkers() -> Result<()> {
    let venv = manifest_venv()?;
    let stamp = venv.join("backlogd-requirements.txt");
    let wanted = MANIFEST_CHECKERS.join("\n");
    let present = std::fs::read_to_string(&stamp).is_ok_and(|s| s == wanted)
        && ["kubernetes-validate", "check-jsonschema"]
            .iter()
            .all(|tool| output(Command::new(venv.join("bin").join(tool)).arg("--version")).is_ok());
    if !present {
        // Debian's interpreter (python3-venv, above), not whichever python3 PATH finds
        // first: the venv must outlive a pyenv or a virtualenv of the session.
        super::run(
            Command::new("/usr/bin/python3")
                .args(["-m", "venv", "--clear"])
                .arg(&venv),
        )?;
        super::run(
            Command::new(venv.join("bin/pip"))
                .args(["install", "--quiet"])
                .args(MANIFEST_CHECKERS),
        )?;
        std::fs::write(&stamp, &wanted).with_context(|| format!("writing {}", stamp.display()))?;
    }
    go_modules()
}

/// The Go modules whose files the tests read: prometheus-operator's CRDs, the CRI's proto.
fn go_modules() -> Result<()> {
    go_module(PROMETHEUS_OPERATOR)?;
    go_module(CRI_API)
}

/// `module` in the Go module cache (from the proxy when absent).
fn go_module(module: &str) -> Result<()> {
    let download = |proxy: &str| {
        output(
            Command::new("go")
                .args(["mod", "download", "-json", module])
                .env("GOPROXY", proxy)
                .env("GOFLAGS", "-mod=mod")
                // Outside any module: inside one, -mod=mod could rewrite its go.mod.
                .current_dir(std::env::temp_dir()),
        )
    };
    // Already in the module cache: no network.
    if download("off").is_ok() {
        return Ok(());
    }
    if output(Command::new("go").arg("version")).is_err() {
        super::run(Command::new("apt-get").arg("update"))?;
        super::run(
            Command::new("apt-get")
                .args(["install", "-y", "--no-install-recommends", "golang-go"])
                .env("DEBIAN_FRONTEND", "noninteractive"),
        )?;
    }
    // The proxy alone: `direct` would mean a git clone, which this machine cannot reach.
    download("https://proxy.golang.org")
        .map(drop)
        .with_context(|| format!("downloading {module} into the Go module cache"))
}
