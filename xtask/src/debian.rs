//! Debian packages from a suite the host's apt sources do not list (bullseye's kernels for
//! the matrix), looked up and downloaded with a private apt configuration under the cache,
//! so the host's own packages never come from another suite. The archive is the one the
//! host's sources already name; only the suite differs.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail};

use crate::setup::output;

/// apt for one Debian suite, with its own sources, lists and cache in `dir`.
pub struct SuiteApt {
    dir: PathBuf,
    suite: String,
}

impl SuiteApt {
    /// Sets up (once) and refreshes the private configuration for `suite` in `dir`.
    pub fn new(suite: &str, dir: &Path) -> Result<Self> {
        let apt = Self {
            dir: dir.to_owned(),
            suite: suite.to_owned(),
        };
        for sub in ["lists/partial", "cache/archives/partial"] {
            std::fs::create_dir_all(dir.join(sub))?;
        }
        let sources = sources_for(suite)?;
        std::fs::write(dir.join("sources.list"), sources)?;
        let status = Command::new("apt-get")
            .args(apt.options())
            .args(["-q", "update"])
            .status()
            .context("starting apt-get")?;
        if !status.success() {
            bail!(
                "apt-get update for Debian {suite} failed ({status}); its packages cannot be \
                 fetched. Fix: check that the host reaches the Debian archive its own apt \
                 sources name"
            );
        }
        Ok(apt)
    }

    fn options(&self) -> Vec<String> {
        let d = self.dir.display();
        vec![
            "-o".into(),
            format!("Dir::Etc::SourceList={d}/sources.list"),
            "-o".into(),
            "Dir::Etc::SourceParts=/dev/null".into(),
            "-o".into(),
            format!("Dir::State::Lists={d}/lists"),
            "-o".into(),
            format!("Dir::Cache={d}/cache"),
        ]
    }

    /// `apt-cache ARGS` on this suite's index.
    pub fn cache(&self, args: &[&str]) -> Result<String> {
        output(Command::new("apt-cache").args(self.options()).args(args))
    }

    /// `apt-get download package` into `into`.
    pub fn download(&self, package: &str, into: &Path) -> Result<()> {
        let status = Command::new("apt-get")
            .args(self.options())
            .args(["download", package])
            .current_dir(into)
            .status()
            .context("starting apt-get download")?;
        if !status.success() {
            bail!(
                "could not download {package} from Debian {} (`apt-get download` failed: \
                 {status})",
                self.suite
            );
        }
        Ok(())
    }
}

/// The host's Debian suite (`VERSION_CODENAME`, e.g. bookworm).
pub fn host_suite() -> Result<String> {
    let os = std::fs::read_to_string("/etc/os-release").context("/etc/os-release")?;
    os.lines()
        .find_map(|l| l.strip_prefix("VERSION_CODENAME="))
        .map(|c| c.trim_matches('"').to_owned())
        .context("no VERSION_CODENAME in /etc/os-release")
}

/// A sources.list for `suite`: every archive the host's apt uses for its own Debian suite
/// (`apt-cache policy`: main, -updates, -security), with the suite name replaced.
pub fn sources_for(suite: &str) -> Result<String> {
    let host = host_suite()?;
    let policy = output(Command::new("apt-cache").arg("policy"))?;
    let lines = sources_from_policy(&policy, &host, suite);
    if lines.is_empty() {
        bail!(
            "the host's apt sources name no Debian archive for {host} (`apt-cache policy`), so \
             Debian {suite} cannot be reached the same way"
        );
    }
    Ok(lines.join("\n") + "\n")
}

/// From `apt-cache policy` lines such as ` 500 URI bookworm-security/main amd64 Packages`,
/// one `deb` line per archive and suite of `host`'s, renamed to `suite`.
fn sources_from_policy(policy: &str, host: &str, suite: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for line in policy.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        let [_, uri, dist, ..] = words.as_slice() else {
            continue;
        };
        let Some((dist, component)) = dist.split_once('/') else {
            continue;
        };
        if !uri.contains("://") || component != "main" {
            continue;
        }
        let Some(rest) = dist.strip_prefix(host) else {
            continue;
        };
        if !(rest.is_empty() || rest.starts_with('-')) {
            continue;
        }
        // sid and the backports suites have no -updates or -security of their own.
        if !rest.is_empty() && (suite == "sid" || suite.ends_with("-backports")) {
            continue;
        }
        let deb = format!(
            "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] {uri} {suite}{rest} main"
        );
        if !out.contains(&deb) {
            out.push(deb);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hosts_archives_are_renamed_to_the_wanted_suite() {
        let policy = "Package files:\n 100 /var/lib/dpkg/status\n     release a=now\n \
                      500 http://archive.example/debian-security bookworm-security/main amd64 Packages\n \
                      500 http://archive.example/debian bookworm-updates/main amd64 Packages\n \
                      500 http://archive.example/debian bookworm/main amd64 Packages\n \
                      500 https://other.example/apt cloud-sdk-bookworm/main amd64 Packages\n";
        let lines = sources_from_policy(policy, "bookworm", "bullseye");
        assert_eq!(lines.len(), 3, "{lines:?}");
        assert!(
            lines[0].ends_with("http://archive.example/debian-security bullseye-security main")
        );
        assert!(lines[1].ends_with("http://archive.example/debian bullseye-updates main"));
        assert!(lines[2].ends_with("http://archive.example/debian bullseye main"));
        for suite in ["sid", "trixie-backports"] {
            let lines = sources_from_policy(policy, "bookworm", suite);
            assert_eq!(lines.len(), 1, "{lines:?}");
            assert!(lines[0].ends_with(&format!("http://archive.example/debian {suite} main")));
        }
    }
}
