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
    /// The sysusers.d entry of the daemon's user.
    pub sysusers: PathBuf,
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
    // The unit's User=: /etc, the administrator's place, for an install outside a package.
    let sysusers = under(&layout.root, Path::new("/etc/sysusers.d/backlogd.conf"));
    write_file(
        &sysusers,
        &std::fs::read(workspace.join("deploy/sysusers/backlogd.conf"))?,
        0o644,
    )?;

    let config_dest = under(&layout.root, Path::new("/etc/backlogd/backlogd.toml"));
    let config_written = !config_dest.exists();
    if config_written {
        let text = std::fs::read(workspace.join("deploy/config/backlogd.toml"))?;
        write_file(&config_dest, &text, 0o644)?;
    }
    Ok(Installed {
        binary: dest,
        unit: unit_dest,
        sysusers,
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
/// Builds the Debian package with cargo-deb (backlogd's `[package.metadata.deb]`: binary,
/// config as conffile, unit enabled but not started, maintainer scripts, changelog,
/// copyright) from the release binary `binary`, after writing what the package installs
/// that the sources do not hold as is: the unit with ExecStart at /usr/bin, the manual
/// pages and the shell completions (generated from the clap command line by the binary
/// itself). Then lintian: any tag it prints (overrides are documented in
/// deploy/debian/lintian-overrides) fails the build.
pub fn deb(workspace: &Path, binary: &Path) -> Result<PathBuf> {
    let assets = workspace.join("target/debian-assets");
    if assets.exists() {
        std::fs::remove_dir_all(&assets)?;
    }
    let unit = std::fs::read_to_string(workspace.join("deploy/systemd/backlogd.service"))?
        .replace("/usr/local/bin/backlogd", "/usr/bin/backlogd");
    write_file(
        &assets.join("systemd/backlogd.service"),
        unit.as_bytes(),
        0o644,
    )?;
    super::run(
        Command::new(binary)
            .args(["generate-docs", "--out"])
            .arg(&assets),
    )?;
    let out_dir = workspace.join("target/debian");
    std::fs::create_dir_all(&out_dir)?;
    let built = super::setup::output(
        Command::new("cargo")
            .args(["deb", "--package", "backlogd", "--no-build", "--output"])
            .arg(&out_dir)
            .current_dir(workspace),
    )
    .context("cargo deb (`cargo xtask setup` installs cargo-deb)")?;
    let deb = PathBuf::from(
        built
            .lines()
            .rev()
            .find(|l| l.trim_end().ends_with(".deb"))
            .context("cargo deb named no .deb")?
            .trim(),
    );
    lintian(&deb)?;
    Ok(deb)
}

/// lintian on the package: it must print nothing (its overrides say why each is one).
fn lintian(deb: &Path) -> Result<()> {
    let out = Command::new("lintian")
        .args(["--fail-on", "none"])
        .arg(deb)
        .output()
        .context("starting lintian (Debian package lintian; `cargo xtask setup` installs it)")?;
    let tags: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .chain(String::from_utf8_lossy(&out.stderr).lines())
        .filter(|l| !l.contains("running with root privileges"))
        .map(str::to_owned)
        .filter(|l| !l.trim().is_empty())
        .collect();
    if !out.status.success() || !tags.is_empty() {
        bail!(
            "lintian on {} ({}):\n{}\nFix the package, or add an override with its reason \
             to deploy/debian/lintian-overrides",
            deb.display(),
            out.status,
            tags.join("\n")
        );
    }
    eprintln!("xtask: lintian: {} is clean", deb.display());
    Ok(())
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
