//! `cargo xtask install` and `cargo xtask deb`: the release binary, the systemd unit and
//! the default config, into a root directory or a Debian package.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail};

pub struct Layout {
    /// Everything goes under this directory (`/` for a real install).
    pub root: PathBuf,
    /// Where the binary goes under `root`, as `PREFIX/bin/backlogd`.
    pub prefix: PathBuf,
    /// Directory of the systemd unit under `root`.
    pub unit_dir: PathBuf,
}

/// What an install did, for the summary.
pub struct Installed {
    pub binary: PathBuf,
    pub unit: PathBuf,
    pub config: PathBuf,
    pub config_written: bool,
}

fn under(root: &Path, path: &Path) -> PathBuf {
    root.join(path.strip_prefix("/").unwrap_or(path))
}

/// Copies `binary` and writes the unit (its ExecStart pointing at the installed binary)
/// and, only if none exists, the default config.
pub fn install(workspace: &Path, binary: &Path, layout: &Layout) -> Result<Installed> {
    if !binary.exists() {
        bail!(
            "{} does not exist. Fix: build it first (`cargo build --release -p backlogd`), or \
             drop --no-build",
            binary.display()
        );
    }
    let bin_path = layout.prefix.join("bin/backlogd");
    let dest = under(&layout.root, &bin_path);
    write_file(&dest, &std::fs::read(binary)?, 0o755)?;

    let unit_src = workspace.join("deploy/systemd/backlogd.service");
    let unit = std::fs::read_to_string(&unit_src)
        .with_context(|| format!("reading {}", unit_src.display()))?
        .replace(
            "/usr/local/bin/backlogd",
            bin_path.to_str().context("non-UTF-8 prefix")?,
        );
    let unit_dest = under(&layout.root, &layout.unit_dir.join("backlogd.service"));
    write_file(&unit_dest, unit.as_bytes(), 0o644)?;

    let config_dest = under(&layout.root, Path::new("/etc/backlogd/backlogd.toml"));
    let config_written = !config_dest.exists();
    if config_written {
        let text = std::fs::read(workspace.join("deploy/config/backlogd.toml"))?;
        write_file(&config_dest, &text, 0o644)?;
    }
    Ok(Installed {
        binary: dest,
        unit: unit_dest,
        config: config_dest,
        config_written,
    })
}

fn write_file(path: &Path, bytes: &[u8], mode: u32) -> Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = path.parent().context("path without a directory")?;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    // Write beside and rename: replacing a running daemon's binary in place fails with
    // ETXTBSY, and a half-written file must never be what systemd starts.
    let tmp = path.with_extension("xtask-new");
    std::fs::write(&tmp, bytes).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(mode))?;
    std::fs::rename(&tmp, path).with_context(|| format!("installing {}", path.display()))?;
    Ok(())
}

/// Builds `target/debian/backlogd_VERSION_ARCH.deb` from a staged tree.
pub fn deb(workspace: &Path, binary: &Path, version: &str) -> Result<PathBuf> {
    let arch = super::setup::output(Command::new("dpkg").arg("--print-architecture"))?
        .trim()
        .to_owned();
    let name = format!("backlogd_{version}_{arch}");
    let stage = workspace.join("target/debian").join(&name);
    if stage.exists() {
        std::fs::remove_dir_all(&stage)?;
    }
    install(
        workspace,
        binary,
        &Layout {
            root: stage.clone(),
            prefix: "/usr".into(),
            unit_dir: "/lib/systemd/system".into(),
        },
    )?;
    let control = format!(
        "Package: backlogd\nVersion: {version}\nArchitecture: {arch}\nMaintainer: backlogd \
         developers <backlogd@localhost>\nSection: net\nPriority: optional\nDepends: libc6, procps\n\
         Description: per-listener TCP listen-queue observability with eBPF\n backlogd \
         watches every listening TCP socket with eBPF and exports, per socket, the backlog\n \
         requested and granted, SYN and accept-queue drops by reason, as Prometheus metrics.\n"
    );
    write_file(&stage.join("DEBIAN/control"), control.as_bytes(), 0o644)?;
    write_file(
        &stage.join("DEBIAN/conffiles"),
        b"/etc/backlogd/backlogd.toml\n",
        0o644,
    )?;
    // Enabled but not started on install: the operator reviews the config first.
    let postinst = "#!/bin/sh\nset -e\nif [ -d /run/systemd/system ]; then\n  systemctl \
                    daemon-reload >/dev/null || true\n  if [ \"$1\" = configure ] && [ -z \"$2\" ]; \
                    then systemctl enable backlogd.service >/dev/null || true; fi\n  if [ -n \"$2\" ]; \
                    then systemctl try-restart backlogd.service >/dev/null || true; fi\nfi\n";
    write_file(&stage.join("DEBIAN/postinst"), postinst.as_bytes(), 0o755)?;
    // Removing the package also removes the pins, or its programs would stay attached.
    let prerm = "#!/bin/sh\nset -e\nif [ \"$1\" = remove ]; then\n  if [ -d /run/systemd/system ]; \
                 then systemctl disable --now backlogd.service >/dev/null || true; fi\n  \
                 /usr/bin/backlogd unpin >/dev/null || true\nfi\n";
    write_file(&stage.join("DEBIAN/prerm"), prerm.as_bytes(), 0o755)?;
    let deb = workspace.join("target/debian").join(format!("{name}.deb"));
    super::run(
        Command::new("dpkg-deb")
            .args(["--root-owner-group", "--build"])
            .arg(&stage)
            .arg(&deb),
    )?;
    Ok(deb)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn installs_into_a_root_and_keeps_an_existing_config() {
        let workspace = super::super::workspace_root();
        let root = std::env::temp_dir().join(format!("xtask-install-{}", std::process::id()));
        let fake_bin = root.join("backlogd-build");
        std::fs::create_dir_all(&root).unwrap();
        std::fs::write(&fake_bin, b"#!/bin/sh\n").unwrap();
        let layout = Layout {
            root: root.join("sysroot"),
            prefix: "/opt/backlogd".into(),
            unit_dir: "/etc/systemd/system".into(),
        };
        let first = install(&workspace, &fake_bin, &layout).unwrap();
        assert!(first.config_written);
        assert_eq!(first.binary, root.join("sysroot/opt/backlogd/bin/backlogd"));
        let unit = std::fs::read_to_string(&first.unit).unwrap();
        assert!(
            unit.contains("ExecStart=/opt/backlogd/bin/backlogd run"),
            "{unit}"
        );
        std::fs::write(&first.config, "log = \"debug\"\n").unwrap();
        let second = install(&workspace, &fake_bin, &layout).unwrap();
        assert!(!second.config_written);
        assert_eq!(
            std::fs::read_to_string(&second.config).unwrap(),
            "log = \"debug\"\n"
        );
        std::fs::remove_dir_all(&root).unwrap();
    }
}
