//! Debian's kernels: which ones, fetched (from other suites through a private apt) and cached.

use super::*;

/// Which package of a suite is the kernel.
pub(super) enum Pick {
    /// The newest `prefix<N>suffix` package in the apt index.
    Newest {
        prefix: &'static str,
        suffix: &'static str,
    },
    /// The one the suite's `linux-image-cloud-amd64` depends on: what a Debian host of that
    /// suite runs after `apt upgrade`, whatever its version is today.
    Meta,
    /// One package by name (an older build kept for a bug's sake).
    Exact(&'static str),
}

/// What a kernel can do, as facts about its version (features are not backported to
/// Debian's stable kernels). The guest suites compare backlogd's own probe with this, so
/// a wrong probe fails there; `cargo xtask vm` runs only the refusal check in a mode the
/// kernel cannot run.
#[derive(Clone, Copy)]
pub(crate) struct Caps {
    /// fentry mode: BPF trampolines (5.5; x86-64). The fexit programs read return values
    /// from their context, so 5.5 to 5.16 (no `bpf_get_func_ret`) run it too.
    pub(super) fentry: bool,
    pub(super) kprobe: bool,
    /// Pinnable kprobe links (BPF_LINK_TYPE_PERF_EVENT, 5.15): only kprobe mode needs them.
    pub(super) perf_link_pinning: bool,
}

impl Caps {
    const ALL: Caps = Caps {
        fentry: true,
        kprobe: true,
        perf_link_pinning: true,
    };

    /// `BACKLOGD_KERNEL_CAPS` for the guest suites (`backlogd_tests::kernel_caps`).
    pub(super) fn env(self) -> String {
        let yes = |b: bool| if b { "yes" } else { "no" };
        format!(
            "fentry={} kprobe={} perf_link_pinning={}",
            yes(self.fentry),
            yes(self.kprobe),
            yes(self.perf_link_pinning)
        )
    }

    /// Whether backlogd can run `mode` here; if not, the guest runs only the refusal test.
    pub(crate) fn runs(self, mode: &str) -> bool {
        match mode {
            "fentry" => self.fentry,
            "kprobe" => self.kprobe,
            _ => true,
        }
    }
}

/// A Debian kernel of the matrix.
pub(crate) struct KernelSpec {
    pub(crate) label: &'static str,
    pub(super) pick: Pick,
    /// A Debian suite other than the host's to fetch it from (see `debian.rs`).
    pub(super) suite: Option<&'static str>,
    /// In the matrix when no `--kernel` is given (`cargo xtask test`).
    pub(super) default: bool,
    pub(crate) caps: Caps,
}

/// From the oldest Debian kernel still supported to the newest Debian ships. `cargo xtask
/// test` boots the `default` ones (about 8 minutes each under TCG, in CI's 90): one per
/// upstream series a Debian release runs, plus the newest. The others are the same series
/// as one in CI (bookworm's 6.12 is trixie's) or older than the newest (sid's kernel lags
/// trixie-backports' now and then): `cargo xtask vm --kernel LABEL` runs them.
pub(crate) const KERNELS: &[KernelSpec] = &[
    // Debian 11 (bullseye, LTS): trampolines without `bpf_get_func_ret` or a recursion
    // guard (5.12), no pinnable perf-event links (kprobe mode runs unpinned). The one
    // kernel Debian ships that proves fentry mode on 5.5-5.16 (5.15 takes the same path).
    KernelSpec {
        label: "debian-5.10",
        pick: Pick::Newest {
            prefix: "linux-image-5.10.0-",
            suffix: "-cloud-amd64",
        },
        suite: Some("bullseye"),
        default: true,
        caps: Caps {
            fentry: true,
            kprobe: true,
            perf_link_pinning: false,
        },
    },
    // The build on which kprobe mode soft-locked twice (issue 20), for reproducing it.
    KernelSpec {
        label: "debian-5.10.0-32",
        pick: Pick::Exact("linux-image-5.10.0-32-cloud-amd64"),
        suite: Some("bullseye"),
        default: false,
        caps: Caps {
            fentry: true,
            kprobe: true,
            perf_link_pinning: false,
        },
    },
    KernelSpec {
        label: "debian-6.1",
        pick: Pick::Newest {
            prefix: "linux-image-6.1.0-",
            suffix: "-cloud-amd64",
        },
        suite: None,
        default: true,
        caps: Caps::ALL,
    },
    KernelSpec {
        label: "debian-6.12",
        pick: Pick::Newest {
            prefix: "linux-image-6.12.",
            suffix: "+deb12-cloud-amd64",
        },
        suite: None,
        default: false,
        caps: Caps::ALL,
    },
    KernelSpec {
        label: "trixie",
        pick: Pick::Meta,
        suite: Some("trixie"),
        default: true,
        caps: Caps::ALL,
    },
    KernelSpec {
        label: "trixie-backports",
        pick: Pick::Meta,
        suite: Some("trixie-backports"),
        default: true,
        caps: Caps::ALL,
    },
    KernelSpec {
        label: "sid",
        pick: Pick::Meta,
        suite: Some("sid"),
        default: false,
        caps: Caps::ALL,
    },
];

/// An unpacked kernel package.
pub(crate) struct Kernel {
    pub(crate) package: String,
    /// `uname -r` of the kernel, e.g. `6.1.0-40-cloud-amd64`.
    pub(super) release: String,
    pub(super) root: PathBuf,
    pub(crate) vmlinuz: PathBuf,
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

/// apt-cache, for the host's suite or a private one.
fn apt_cache(apt: Option<&crate::debian::SuiteApt>, args: &[&str]) -> Result<String> {
    match apt {
        Some(apt) => apt.cache(args),
        None => output(Command::new("apt-cache").args(args)),
    }
}

/// The kernel's image package in the apt index.
fn image_package(spec: &KernelSpec, apt: Option<&crate::debian::SuiteApt>) -> Result<String> {
    match spec.pick {
        Pick::Newest { prefix, suffix } => {
            let names = apt_cache(apt, &["pkgnames", prefix])?;
            newest_of(&names, prefix, suffix).with_context(|| {
                format!(
                    "no Debian kernel package {prefix}<N>{suffix} in the apt index. Fix: \
                     `apt-get update` (bookworm and bookworm-security must be in the sources)"
                )
            })
        }
        Pick::Exact(name) => Ok(name.to_owned()),
        Pick::Meta => {
            let depends = apt_cache(apt, &["depends", META_PACKAGE])?;
            image_of_meta(&depends).with_context(|| {
                format!(
                    "{META_PACKAGE} of Debian {} depends on no linux-image package:\n{depends}",
                    spec.suite.unwrap_or("(host)")
                )
            })
        }
    }
}

const META_PACKAGE: &str = "linux-image-cloud-amd64";

fn newest_of(names: &str, prefix: &str, suffix: &str) -> Option<String> {
    names
        .lines()
        .filter_map(|n| {
            let mid = n.strip_prefix(prefix)?.strip_suffix(suffix)?;
            Some((mid.parse::<u64>().ok()?, n.to_owned()))
        })
        .max()
        .map(|(_, n)| n)
}

/// From `apt-cache depends linux-image-cloud-amd64`: `  Depends: linux-image-X-cloud-amd64`.
fn image_of_meta(depends: &str) -> Option<String> {
    depends.lines().find_map(|l| {
        let name = l.trim().strip_prefix("Depends: ")?.trim();
        (name.starts_with("linux-image-") && name != META_PACKAGE).then(|| name.to_owned())
    })
}

/// The packages that hold the kernel and its modules. Up to 6.12 the image package holds
/// both; newer Debian kernels split them into `linux-binary-X` (vmlinuz under
/// /usr/lib/modules) and `linux-modules-X`, which the image package depends on. A
/// dependency no package of that name provides is the signed variant; its `-unsigned`
/// twin holds the same kernel.
fn kernel_packages(image: &str, apt: Option<&crate::debian::SuiteApt>) -> Result<Vec<String>> {
    let depends = apt_cache(apt, &["depends", image])?;
    let mut packages = vec![image.to_owned()];
    for line in depends.lines() {
        let Some(name) = line.trim().strip_prefix("Depends: ") else {
            continue;
        };
        let name = name.trim();
        if !(name.starts_with("linux-binary-") || name.starts_with("linux-modules-")) {
            continue;
        }
        let real = if apt_cache(apt, &["show", name]).is_ok_and(|s| !s.trim().is_empty()) {
            name.to_owned()
        } else if let Some(rest) = name.strip_prefix("linux-binary-") {
            format!("linux-binary-unsigned-{rest}")
        } else {
            bail!("no package provides {name}, which {image} depends on");
        };
        if !packages.contains(&real) {
            packages.push(real);
        }
    }
    Ok(packages)
}

pub(crate) fn fetch_kernel(spec: &KernelSpec) -> Result<Kernel> {
    let apt = match spec.suite {
        Some(suite) => Some(crate::debian::SuiteApt::new(
            suite,
            &cache_dir().join("apt").join(suite),
        )?),
        None => None,
    };
    let package = match image_package(spec, apt.as_ref()) {
        Ok(p) => p,
        Err(_) if apt.is_none() => {
            crate::run(Command::new("apt-get").arg("update"))?;
            image_package(spec, None)?
        }
        Err(e) => return Err(e),
    };
    let root = cache_dir().join(&package);
    if find_vmlinuz(&root).is_err() {
        let download = cache_dir().join("download");
        let _ = std::fs::remove_dir_all(&download);
        std::fs::create_dir_all(&download)?;
        for p in kernel_packages(&package, apt.as_ref())? {
            match &apt {
                Some(apt) => apt.download(&p, &download)?,
                None => {
                    let status = Command::new("apt-get")
                        .args(["download", &p])
                        .current_dir(&download)
                        .status()
                        .context("starting apt-get download")?;
                    if !status.success() {
                        bail!(
                            "could not download Debian kernel package {p} (`apt-get \
                             download {p}` failed: {status}); the kernel matrix needs it"
                        );
                    }
                }
            }
        }
        let partial = cache_dir().join(format!("{package}.partial"));
        let _ = std::fs::remove_dir_all(&partial);
        for deb in std::fs::read_dir(&download)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|e| e == "deb"))
        {
            crate::run(Command::new("dpkg").arg("-x").arg(&deb).arg(&partial))?;
        }
        // depmod and modprobe -d look under lib/modules; split packages use usr/lib.
        if !partial.join("lib").exists() && partial.join("usr/lib/modules").exists() {
            std::os::unix::fs::symlink("usr/lib", partial.join("lib"))?;
        }
        let _ = std::fs::remove_dir_all(&root);
        std::fs::rename(&partial, &root)?;
        let _ = std::fs::remove_dir_all(&download);
    }
    let (release, vmlinuz) = find_vmlinuz(&root)?;
    Ok(Kernel {
        package,
        release,
        root,
        vmlinuz,
    })
}

/// The kernel image and its release: `boot/vmlinuz-REL`, or `usr/lib/modules/REL/vmlinuz`
/// in the split packages.
pub(super) fn find_vmlinuz(root: &Path) -> Result<(String, PathBuf)> {
    let entries = |dir: PathBuf| {
        std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .filter_map(|e| e.ok().map(|e| e.path()))
    };
    for path in entries(root.join("boot")) {
        if let Some(release) = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_prefix("vmlinuz-"))
        {
            return Ok((release.to_owned(), path));
        }
    }
    for dir in entries(root.join("usr/lib/modules")) {
        let vmlinuz = dir.join("vmlinuz");
        if let (true, Some(release)) = (vmlinuz.exists(), dir.file_name().and_then(|n| n.to_str()))
        {
            return Ok((release.to_owned(), vmlinuz));
        }
    }
    bail!(
        "no boot/vmlinuz-* or usr/lib/modules/*/vmlinuz in {}",
        root.display()
    )
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
    let wanted = GUEST_MODULES
        .iter()
        .map(|m| (m, true))
        .chain(BUILTIN_LATER_MODULES.iter().map(|m| (m, false)));
    for (module, required) in wanted {
        let deps = match output(Command::new("modprobe").arg("-d").arg(&kernel.root).args([
            "-S",
            &kernel.release,
            "--show-depends",
            module,
        ])) {
            Ok(deps) => deps,
            Err(_) if !required => continue,
            Err(e) => return Err(e),
        };
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_newest_numbered_package_and_the_meta_packages_image_are_found() {
        let names = "linux-image-6.1.0-9-cloud-amd64\nlinux-image-6.1.0-41-cloud-amd64\n\
                     linux-image-6.1.0-41-cloud-amd64-dbg\nlinux-image-6.1.0-10-amd64\n";
        assert_eq!(
            newest_of(names, "linux-image-6.1.0-", "-cloud-amd64").as_deref(),
            Some("linux-image-6.1.0-41-cloud-amd64")
        );
        let depends = "linux-image-cloud-amd64\n  Depends: linux-base-cloud-amd64\n  \
                       Depends: linux-image-7.3.4+deb13-cloud-amd64\n  Depends: \
                       linux-modules-cloud-amd64\n";
        assert_eq!(
            image_of_meta(depends).as_deref(),
            Some("linux-image-7.3.4+deb13-cloud-amd64")
        );
    }

    #[test]
    fn capabilities_reach_the_guest_as_words() {
        let old = KERNELS.iter().find(|k| k.label == "debian-5.10").unwrap();
        assert_eq!(old.caps.env(), "fentry=yes kprobe=yes perf_link_pinning=no");
        assert!(old.caps.runs("fentry") && old.caps.runs("tracepoint"));
        let refused = Caps {
            fentry: false,
            ..Caps::ALL
        };
        assert!(!refused.runs("fentry") && refused.runs("kprobe"));
    }
}
