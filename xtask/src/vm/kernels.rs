//! Debian's kernels: which ones, fetched (from other suites through a private apt) and cached.

use super::*;

/// A Debian kernel package family; the newest package in the apt index is used.
pub(super) struct KernelSpec {
    pub(super) label: &'static str,
    /// Package name = prefix + a number + suffix.
    pub(super) prefix: &'static str,
    pub(super) suffix: &'static str,
    /// A Debian suite other than the host's to fetch it from (see `debian.rs`).
    pub(super) suite: Option<&'static str>,
    /// In the matrix when no `--kernel` is given (`cargo xtask test`).
    pub(super) default: bool,
}

pub(super) const KERNELS: &[KernelSpec] = &[
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

/// An unpacked kernel package.
pub(super) struct Kernel {
    pub(super) package: String,
    /// `uname -r` of the kernel, e.g. `6.1.0-40-cloud-amd64`.
    pub(super) release: String,
    pub(super) root: PathBuf,
    pub(super) vmlinuz: PathBuf,
}

/// Downloaded kernels live outside the checkout so clean checkouts on one machine share
/// them: `$XDG_CACHE_HOME/backlogd/kernels`, else `~/.cache/backlogd/kernels`.
pub(super) fn cache_dir() -> PathBuf {
    std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| PathBuf::from("/var/cache"))
        .join("backlogd/kernels")
}

/// The newest package of `spec` in the apt index.
pub(super) fn newest_package(
    spec: &KernelSpec,
    apt: Option<&crate::debian::SuiteApt>,
) -> Result<String> {
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

pub(super) fn fetch_kernel(spec: &KernelSpec) -> Result<Kernel> {
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
            crate::run(Command::new("apt-get").arg("update"))?;
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
        crate::run(Command::new("dpkg").arg("-x").arg(&deb).arg(&partial))?;
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

pub(super) fn find_vmlinuz(root: &Path) -> Result<PathBuf> {
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

/// Module files to insmod, dependencies first, for the kernel's own modules.dep.
pub(super) fn module_load_order(kernel: &Kernel) -> Result<Vec<PathBuf>> {
    // Debian's packages leave modules.dep to depmod in postinst.
    crate::run(
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
pub(super) fn decompress_module(src: &Path, dst: &Path) -> Result<()> {
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
