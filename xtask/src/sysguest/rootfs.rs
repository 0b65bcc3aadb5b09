//! The guest's root file system: Debian packages installed by mmdebstrap (its own cloud
//! kernel and initramfs-tools' initrd included, so the guest boots like a Debian VM does),
//! packed into an ext4 image, cached by what went into it.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail};

use super::Options;

/// The guest's packages. systemd-sysv makes systemd PID 1; python3 runs the checks (http,
/// json: more than python3-minimal has); iproute2 makes the drop test's namespace; bpftool
/// lists programs after the removal; kmod lets the kernel autoload modules (tcp_diag for
/// sock_diag); initramfs-tools builds the initrd the kernel package's postinst asks for;
/// procps has /bin/kill, which the unit's ExecReload runs (the package does not depend on
/// it: check 8 says so; here so that a package that does can install without a network).
/// No udev: devtmpfs names the disks, and nothing waits for device units.
const PACKAGES: &[&str] = &[
    "systemd",
    "systemd-sysv",
    "kmod",
    "iproute2",
    "python3",
    "bpftool",
    "initramfs-tools",
    "procps",
];

/// The kernel booted unless `--kernel-package` names another.
pub(super) const DEFAULT_KERNEL_PACKAGE: &str = "linux-image-cloud-amd64";

/// Bump when the customization below changes: it is part of the cache key.
const LAYOUT: u32 = 1;

/// Units that would only cost boot time or write to the console the host parses.
const MASKED: &[&str] = &[
    "serial-getty@ttyS0.service",
    "getty.target",
    "getty-static.service",
    "apt-daily.timer",
    "apt-daily-upgrade.timer",
    "e2scrub_all.timer",
    "e2scrub_reap.service",
    "fstrim.timer",
];

/// What a boot needs from the cache.
pub(super) struct Rootfs {
    pub(super) image: PathBuf,
    pub(super) vmlinuz: PathBuf,
    pub(super) initrd: PathBuf,
    /// Whether this run built it (else it came from the cache).
    pub(super) built: bool,
}

/// `$XDG_CACHE_HOME/backlogd/systemd-guest` (else `~/.cache/...`), beside the kernel
/// matrix's kernels, so clean checkouts on one machine share it.
fn cache_dir() -> PathBuf {
    std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| PathBuf::from("/var/cache"))
        .join("backlogd/systemd-guest")
}

/// FNV-1a: a stable digest for the cache key (std's hasher may change between releases).
fn fnv1a(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The apt sources, the package list and the runner unit: what decides the image.
/// The guest runs the host's Debian suite, from the archives the host's own apt sources
/// name (no archive address is written down here: see `debian.rs`).
fn recipe(opts: &Options, runner: &str) -> Result<(String, Vec<String>, Vec<String>, String)> {
    let suite = crate::debian::host_suite()?;
    let mut sources: Vec<String> = crate::debian::sources_for(&suite)?
        .lines()
        .map(str::to_owned)
        .collect();
    if let Some(extra) = &opts.extra_suite {
        // Another suite's packages only where the main suite has none of that name (its
        // versions are older): how bullseye's 5.10 kernel gets into a bookworm guest.
        sources.extend(
            crate::debian::sources_for(extra)?
                .lines()
                .map(str::to_owned),
        );
    }
    let mut packages: Vec<String> = PACKAGES.iter().map(|p| (*p).to_owned()).collect();
    packages.push(
        opts.kernel_package
            .clone()
            .unwrap_or_else(|| DEFAULT_KERNEL_PACKAGE.to_owned()),
    );
    let key = format!(
        "layout {LAYOUT}\nsources {sources:?}\npackages {packages:?}\nmasked {MASKED:?}\n\
         runner {runner}"
    );
    Ok((suite, sources, packages, key))
}

/// The cached image for `opts`, built with mmdebstrap if absent (about 30 s with a
/// reachable mirror).
pub(super) fn ensure(opts: &Options, runner: &str) -> Result<Rootfs> {
    let (suite, sources, packages, key) = recipe(opts, runner)?;
    let dir = cache_dir().join(format!("rootfs-{:016x}", fnv1a(&key)));
    let done = |built| -> Result<Rootfs> {
        Ok(Rootfs {
            image: dir.join("rootfs.ext4"),
            vmlinuz: dir.join("vmlinuz"),
            initrd: dir.join("initrd.img"),
            built,
        })
    };
    if dir.join("complete").exists() {
        return done(false);
    }
    // Two runs at once (a test run and a hand-run guest) would build into the same partial
    // directory and delete each other's work: the second waits, then finds the image.
    std::fs::create_dir_all(cache_dir())?;
    let lock = std::fs::File::create(cache_dir().join("build.lock"))?;
    // SAFETY: flock on a file descriptor this function owns; released when `lock` drops.
    if unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&lock), libc::LOCK_EX) } != 0 {
        return Err(std::io::Error::last_os_error()).context("locking the guest image cache");
    }
    if dir.join("complete").exists() {
        return done(false);
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!(
            "building the systemd guest's root file system needs root (mmdebstrap \
             --mode=root, device nodes, ownership). Fix: run `cargo xtask systemd-guest` as \
             root"
        );
    }
    let partial = dir.with_extension("partial");
    let _ = std::fs::remove_dir_all(&partial);
    std::fs::create_dir_all(&partial).with_context(|| format!("creating {}", partial.display()))?;
    let root = partial.join("root");
    eprintln!(
        "xtask systemd-guest: building the guest's root file system with mmdebstrap \
         ({suite}, {}) into {}",
        packages.join(","),
        partial.display()
    );
    crate::run(
        Command::new("mmdebstrap")
            .args(["--mode=root", "--variant=minbase", "--quiet"])
            .arg(format!("--include={}", packages.join(",")))
            .arg(&suite)
            .arg(&root)
            .args(&sources),
    )
    .context(
        "mmdebstrap could not build the guest's root file system. Fix: `apt-get install \
         mmdebstrap` (`cargo xtask setup` does), and make sure the Debian mirror \
         named by the host's apt sources is reachable",
    )?;
    customize(&root, runner)?;
    let boot = root.join("boot");
    let vmlinuz = newest(&boot, "vmlinuz-")?;
    let release = vmlinuz
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.strip_prefix("vmlinuz-"))
        .context("vmlinuz name")?
        .to_owned();
    let initrd = boot.join(format!("initrd.img-{release}"));
    if !initrd.exists() {
        bail!(
            "the kernel package left no {} (initramfs-tools should have built it in its \
             postinst); the guest cannot mount its root without it",
            initrd.display()
        );
    }
    std::fs::copy(&vmlinuz, partial.join("vmlinuz"))?;
    std::fs::copy(&initrd, partial.join("initrd.img"))?;
    // Sparse: a 2 GiB file holding about 450 MB; room for the package and the journal.
    crate::run(
        Command::new("mke2fs")
            .args(["-q", "-t", "ext4", "-L", "sgroot", "-d"])
            .arg(&root)
            .arg(partial.join("rootfs.ext4"))
            .arg("2G"),
    )
    .context("packing the root file system (mke2fs from e2fsprogs)")?;
    std::fs::remove_dir_all(&root)?;
    std::fs::write(partial.join("complete"), format!("kernel {release}\n{key}"))?;
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::rename(&partial, &dir)
        .with_context(|| format!("renaming {} to {}", partial.display(), dir.display()))?;
    done(true)
}

/// The kernel release in the cached image (for the log).
pub(super) fn kernel_release(rootfs: &Rootfs) -> String {
    let dir = rootfs.image.parent().unwrap_or(Path::new("."));
    std::fs::read_to_string(dir.join("complete"))
        .ok()
        .and_then(|c| {
            c.lines()
                .next()
                .map(|l| l.trim_start_matches("kernel ").to_owned())
        })
        .unwrap_or_default()
}

fn newest(dir: &Path, prefix: &str) -> Result<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(prefix))
        })
        .collect();
    found.sort();
    found
        .pop()
        .with_context(|| format!("no {prefix}* in {}", dir.display()))
}

/// The runner unit enabled, units that would cost time masked, a host name.
fn customize(root: &Path, runner: &str) -> Result<()> {
    let units = root.join("etc/systemd/system");
    std::fs::write(units.join("backlogd-sg-runner.service"), runner)?;
    let wants = units.join("multi-user.target.wants");
    std::fs::create_dir_all(&wants)?;
    std::os::unix::fs::symlink(
        "/etc/systemd/system/backlogd-sg-runner.service",
        wants.join("backlogd-sg-runner.service"),
    )?;
    for unit in MASKED {
        let link = units.join(unit);
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink("/dev/null", &link)
            .with_context(|| format!("masking {unit}"))?;
    }
    std::fs::write(root.join("etc/hostname"), "backlogd-guest\n")?;
    std::fs::create_dir_all(root.join("mnt/payload"))?;
    Ok(())
}
