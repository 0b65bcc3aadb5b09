//! `cargo xtask image`: an OCI image of backlogd built from the release binary, with no
//! base image and no registry. The image holds one layer: the binary at /usr/bin/backlogd,
//! exactly the shared libraries `ldd` lists for it (the ELF loader, libc, libgcc_s, ...)
//! at the host's paths, with every symlink on the way to them kept as a symlink (Debian's
//! merged /usr: /lib64 and /lib lead into /usr), the shipped config at
//! /etc/backlogd/backlogd.toml, and an empty /tmp. Nothing else: no shell, no /etc/passwd
//! (the daemon runs as root, uid 0, and looks no user or group up by name), no NSS modules
//! (it resolves no host names: `--listen` takes an address).
//!
//! The archive is an OCI image layout in a tar (`oci-layout`, `index.json`,
//! `blobs/sha256/...`, the `oci-archive:` format of containers/image), which `podman load
//! -i` reads (tested; skopeo and buildah use the same library, but are not installed here).
//! `index.json` names it `localhost/backlogd:VERSION` in its
//! `org.opencontainers.image.ref.name` annotation, where podman takes the name from.
//! Reproducible: every entry is owned by 0:0, has the mtime SOURCE_DATE_EPOCH (default 0,
//! the image's `created` too) and comes in sorted order, and the gzip header carries no
//! name or time, so the same binary and libraries give the same manifest digest.
//!
//! How to run it, and why each flag (tests/tests/image.rs runs exactly this and checks
//! /metrics for the host's listeners; each flag was left out once on the CI machine to see
//! what breaks):
//!
//! ```sh
//! podman --runtime runc run -d --privileged --pid=host --network=host --cgroupns=host \
//!     -v /sys/fs/bpf:/sys/fs/bpf -v /sys/fs/cgroup:/sys/fs/cgroup:ro \
//!     localhost/backlogd:VERSION [run --listen ADDR ...]
//! ```
//!
//! - `--privileged`: loading and attaching eBPF programs needs CAP_BPF, CAP_PERFMON and
//!   CAP_NET_ADMIN, or CAP_SYS_ADMIN (the runtimes' default seccomp profiles allow bpf(2)
//!   only with it), reading other processes' configs CAP_SYS_PTRACE and CAP_DAC_READ_SEARCH;
//!   without it the daemon exits naming the capabilities. It also gives the container a
//!   sysfs with /sys/kernel/btf/vmlinux in it, so BTF needs no mount of its own.
//! - `--pid=host`: the scan iterator sees every process's sockets, so listeners of every
//!   network namespace are found without entering one, and every listener is named by its
//!   owner (pid, comm, unit, container); in a PID namespace of its own the daemon falls
//!   back to sock_diag in every namespace and reports `pid="0"`, `comm=""`.
//! - `--network=host`: /metrics is served in the host's network namespace, where
//!   Prometheus scrapes node exporters (the eBPF hooks see every namespace either way).
//! - `-v /sys/fs/cgroup:/sys/fs/cgroup:ro` and `--cgroupns=host`: tracepoint mode (the
//!   only one the CI machine's kernel allows) attaches a cgroup_skb program at the root of
//!   the cgroup v2 hierarchy. On a hybrid host (cgroup2 at /sys/fs/cgroup/unified, as here)
//!   podman mounts only the v1 controllers in the container, and the daemon exits with "no
//!   cgroup v2 hierarchy is mounted"; the host's /sys/fs/cgroup bound in (recursively, as
//!   podman binds) brings the hierarchy's real root along, and then it works in a private
//!   cgroup namespace too (tried here). Without the bind, podman's own cgroup2 mount in a
//!   private cgroup namespace (its default on a cgroup v2 host) shows only the container's
//!   cgroup, which the daemon refuses (LoadError::CgroupNamespace, whose fix names
//!   `--cgroupns=host`): both are passed so either layout works.
//! - `-v /sys/fs/bpf:/sys/fs/bpf`: the shipped config pins links and counters under
//!   /sys/fs/bpf/backlogd so counts survive a restart of the container; a container's sysfs
//!   has no bpffs mounted there, and without it the daemon exits naming the pin directory
//!   (or drop `pin_dir` from the config).
//! - `--runtime runc` and `--ulimit nofile=N:N --ulimit nproc=M:M`: only on hosts like the
//!   CI machine, whose hybrid cgroup layout crun refuses ("cgroups in hybrid mode not
//!   supported") and whose root lacks CAP_SYS_RESOURCE: podman's default container limits
//!   (nofile and nproc 1048576, which runc sets: strace) exceed the hard limits podman
//!   itself holds (nofile: the caller's; nproc: 32768, to which podman lowers its own),
//!   runc cannot raise them and the container does not start (`error setting rlimit type
//!   6`, NPROC, or 7, NOFILE). N and M at or below
//!   those hard limits work.

use std::{
    collections::{BTreeMap, VecDeque},
    ffi::OsString,
    os::unix::fs::PermissionsExt as _,
    path::{Component, Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail};
use serde_json::json;
use sha2::{Digest as _, Sha256};

/// Where the daemon and its config are in the image.
const BINARY: &str = "usr/bin/backlogd";
const CONFIG: &str = "etc/backlogd/backlogd.toml";
/// The daemon's default `--listen` port.
const METRICS_PORT: u16 = 9851;

pub struct Options {
    /// The backlogd binary to put in the image.
    pub binary: PathBuf,
    /// The archive to write (default target/backlogd-image-VERSION.tar).
    pub output: Option<PathBuf>,
    /// The name `podman load` gives the image (default localhost/backlogd:VERSION).
    pub reference: Option<String>,
}

/// What was built.
pub struct Built {
    pub archive: PathBuf,
    pub reference: String,
    /// `sha256:...` of the image manifest: the image's digest.
    pub manifest_digest: String,
    /// Size of the archive in bytes.
    pub size: u64,
}

/// Builds the archive and prints where it is, its name and digest on stdout.
pub fn run(workspace: &Path, options: &Options) -> Result<Built> {
    let built = build(workspace, options)?;
    println!("archive: {}", built.archive.display());
    println!("reference: {}", built.reference);
    println!("digest: {}", built.manifest_digest);
    println!("size: {} bytes", built.size);
    eprintln!(
        "xtask: load it with `podman load -i {}`; run it as the comment at the top of \
         xtask/src/image.rs says",
        built.archive.display()
    );
    Ok(built)
}

pub fn build(workspace: &Path, options: &Options) -> Result<Built> {
    let binary = &options.binary;
    let version = binary_version(binary)?;
    let epoch = source_date_epoch()?;
    let reference = options
        .reference
        .clone()
        .unwrap_or_else(|| format!("localhost/backlogd:{version}"));
    let archive = options
        .output
        .clone()
        .unwrap_or_else(|| workspace.join(format!("target/backlogd-image-{version}.tar")));

    let mut root = RootFs::default();
    root.insert(BINARY, Entry::File(read(binary)?, 0o755))?;
    for library in shared_libraries(binary)? {
        root.add_host_file(&library)?;
    }
    let config = read(&workspace.join("deploy/config/backlogd.toml"))?;
    root.insert(CONFIG, Entry::File(config, 0o644))?;
    root.insert("tmp", Entry::Dir(0o1777))?;
    let layer = tar_of(root.entries.iter(), epoch)?;
    let diff_id = sha256(&layer);
    let layer_gz = gzip(&layer)?;

    let created = rfc3339(epoch);
    let config = json!({
        "created": created,
        "architecture": architecture()?,
        "os": "linux",
        "config": {
            "Entrypoint": [format!("/{BINARY}")],
            "Cmd": ["run", "--config", format!("/{CONFIG}")],
            "Env": ["PATH=/usr/bin"],
            "WorkingDir": "/",
            "ExposedPorts": { format!("{METRICS_PORT}/tcp"): {} },
            "Labels": {
                "org.opencontainers.image.title": "backlogd",
                "org.opencontainers.image.description":
                    "Per-listener TCP listen-queue observability with eBPF",
                "org.opencontainers.image.version": version,
                "org.opencontainers.image.licenses": env!("CARGO_PKG_LICENSE"),
                "org.opencontainers.image.created": created,
            },
        },
        "rootfs": { "type": "layers", "diff_ids": [diff_id] },
        "history": [{ "created": created, "created_by": "cargo xtask image" }],
    });
    let config = serde_json::to_vec(&config)?;
    let manifest = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": descriptor("application/vnd.oci.image.config.v1+json", &config),
        "layers": [descriptor("application/vnd.oci.image.layer.v1.tar+gzip", &layer_gz)],
    }))?;
    let manifest_digest = sha256(&manifest);
    let index = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": manifest_digest,
            "size": manifest.len(),
            "annotations": { "org.opencontainers.image.ref.name": reference },
        }],
    }))?;

    let mut layout = RootFs::default();
    layout.insert(
        "oci-layout",
        Entry::File(br#"{"imageLayoutVersion":"1.0.0"}"#.to_vec(), 0o644),
    )?;
    layout.insert("index.json", Entry::File(index, 0o644))?;
    for blob in [config, manifest, layer_gz] {
        let name = format!("blobs/sha256/{}", &sha256(&blob)["sha256:".len()..]);
        layout.insert(&name, Entry::File(blob, 0o644))?;
    }
    let tar = tar_of(layout.entries.iter(), epoch)?;
    if let Some(dir) = archive.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let partial = archive.with_extension("tar.partial");
    std::fs::write(&partial, &tar).with_context(|| format!("writing {}", partial.display()))?;
    std::fs::rename(&partial, &archive)
        .with_context(|| format!("renaming {} into place", partial.display()))?;
    Ok(Built {
        archive,
        reference,
        manifest_digest,
        size: tar.len() as u64,
    })
}

/// `backlogd --version` of the binary itself (`backlogd 0.1.0`): the version it is.
fn binary_version(binary: &Path) -> Result<String> {
    if !binary.exists() {
        bail!(
            "{} does not exist. Fix: build it (`cargo build --release -p backlogd`), or drop \
             --binary",
            binary.display()
        );
    }
    let out = super::setup::output(Command::new(binary).arg("--version"))?;
    out.split_whitespace()
        .nth(1)
        .map(str::to_owned)
        .with_context(|| format!("`{} --version` printed {out:?}", binary.display()))
}

/// SOURCE_DATE_EPOCH (reproducible-builds.org), else 0.
fn source_date_epoch() -> Result<u64> {
    match std::env::var("SOURCE_DATE_EPOCH") {
        Ok(value) => value
            .trim()
            .parse()
            .with_context(|| format!("SOURCE_DATE_EPOCH={value:?} is not a number of seconds")),
        Err(_) => Ok(0),
    }
}

/// The OCI (Go) name of the architecture this xtask, and so the binary it built, runs on.
fn architecture() -> Result<&'static str> {
    Ok(match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "riscv64" => "riscv64",
        "powerpc64" => "ppc64le",
        "s390x" => "s390x",
        other => bail!("no OCI architecture name known for {other}"),
    })
}

/// The shared objects `ldd` says the binary loads, the ELF interpreter included, as paths
/// on the host. None for a static binary.
fn shared_libraries(binary: &Path) -> Result<Vec<PathBuf>> {
    let out = Command::new("ldd")
        .arg(binary)
        .output()
        .context("starting ldd (Debian package libc-bin)")?;
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        if text.contains("not a dynamic executable") {
            return Ok(Vec::new());
        }
        bail!("ldd {} failed ({}): {text}", binary.display(), out.status);
    }
    parse_ldd(&text)
}

/// From `ldd` lines such as `libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)` and
/// `/lib64/ld-linux-x86-64.so.2 (0x...)`, the paths; the vDSO has none and is skipped.
fn parse_ldd(text: &str) -> Result<Vec<PathBuf>> {
    let mut paths = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        let path = match line.split_once("=>") {
            Some((name, rest)) => {
                let rest = rest.trim();
                if rest.starts_with("not found") {
                    bail!("ldd: {} not found on this machine", name.trim());
                }
                rest.split_whitespace().next().unwrap_or("")
            }
            None => line.split_whitespace().next().unwrap_or(""),
        };
        if path.starts_with('/') {
            paths.push(PathBuf::from(path));
        }
    }
    Ok(paths)
}

enum Entry {
    Dir(u32),
    File(Vec<u8>, u32),
    Symlink(PathBuf),
}

/// A file tree to write as a tar, keyed by path relative to its root. Parents come before
/// their children in a BTreeMap of paths (paths compare component by component).
#[derive(Default)]
struct RootFs {
    entries: BTreeMap<PathBuf, Entry>,
}

impl RootFs {
    /// Adds `entry` at `path` and a directory at each missing parent.
    fn insert(&mut self, path: impl AsRef<Path>, entry: Entry) -> Result<()> {
        let path = path.as_ref();
        for parent in path.ancestors().skip(1) {
            if parent.as_os_str().is_empty() {
                break;
            }
            match self.entries.get(parent) {
                None => {
                    self.entries.insert(parent.to_owned(), Entry::Dir(0o755));
                }
                Some(Entry::Dir(_)) => {}
                Some(_) => bail!("{} is not a directory in the image", parent.display()),
            }
        }
        match (self.entries.get(path), &entry) {
            (None, _) => {}
            (Some(Entry::Dir(_)), Entry::Dir(_)) => {}
            (Some(Entry::Symlink(old)), Entry::Symlink(new)) if old == new => {}
            (Some(Entry::File(old, _)), Entry::File(new, _)) if old == new => {}
            _ => bail!("{} would be added twice, differently", path.display()),
        }
        self.entries.insert(path.to_owned(), entry);
        Ok(())
    }

    /// Adds the host's file at `path` the way the host reaches it: each symlink on the way
    /// (a parent directory's too) as the same symlink, then the file it leads to.
    fn add_host_file(&mut self, path: &Path) -> Result<()> {
        let mut pending = components(path);
        let mut at = PathBuf::from("/");
        let mut symlinks = 0;
        while let Some(name) = pending.pop_front() {
            if name == ".." {
                at.pop();
                continue;
            }
            let next = at.join(&name);
            let meta = std::fs::symlink_metadata(&next).with_context(|| {
                format!("{} (on the way to {})", next.display(), path.display())
            })?;
            let inside = next.strip_prefix("/")?;
            if meta.file_type().is_symlink() {
                symlinks += 1;
                if symlinks > 40 {
                    bail!("{}: too many levels of symbolic links", path.display());
                }
                let target = std::fs::read_link(&next)?;
                self.insert(inside, Entry::Symlink(target.clone()))?;
                if target.is_absolute() {
                    at = PathBuf::from("/");
                }
                let mut rest = components(&target);
                rest.extend(pending);
                pending = rest;
            } else if meta.is_dir() {
                self.insert(inside, Entry::Dir(0o755))?;
                at = next;
            } else if pending.is_empty() {
                let mode = meta.permissions().mode() & 0o7777;
                return self.insert(inside, Entry::File(read(&next)?, mode));
            } else {
                bail!(
                    "{} is not a directory (in {})",
                    next.display(),
                    path.display()
                );
            }
        }
        bail!("{} is a directory, not a file", path.display())
    }
}

/// The names in `path`, `..` kept as such (resolved against the symlinks before it).
fn components(path: &Path) -> VecDeque<OsString> {
    path.components()
        .filter_map(|c| match c {
            Component::Normal(name) => Some(name.to_owned()),
            Component::ParentDir => Some("..".into()),
            Component::RootDir | Component::CurDir | Component::Prefix(_) => None,
        })
        .collect()
}

/// A tar of `entries` in their order, each owned by 0:0 with mtime `epoch`.
fn tar_of<'a>(
    entries: impl Iterator<Item = (&'a PathBuf, &'a Entry)>,
    epoch: u64,
) -> Result<Vec<u8>> {
    let mut tar = tar::Builder::new(Vec::new());
    for (path, entry) in entries {
        let mut header = tar::Header::new_ustar();
        header.set_uid(0);
        header.set_gid(0);
        header.set_mtime(epoch);
        header.set_size(0);
        match entry {
            Entry::Dir(mode) => {
                header.set_entry_type(tar::EntryType::Directory);
                header.set_mode(*mode);
                tar.append_data(&mut header, path, std::io::empty())?;
            }
            Entry::File(bytes, mode) => {
                header.set_entry_type(tar::EntryType::Regular);
                header.set_mode(*mode);
                header.set_size(bytes.len() as u64);
                tar.append_data(&mut header, path, bytes.as_slice())?;
            }
            Entry::Symlink(target) => {
                header.set_entry_type(tar::EntryType::Symlink);
                header.set_mode(0o777);
                tar.append_link(&mut header, path, target)?;
            }
        }
    }
    Ok(tar.into_inner()?)
}

/// gzip with no file name and mtime 0 in its header.
fn gzip(bytes: &[u8]) -> Result<Vec<u8>> {
    use std::io::Write as _;
    let mut gz = flate2::GzBuilder::new()
        .mtime(0)
        .write(Vec::new(), flate2::Compression::default());
    gz.write_all(bytes)?;
    Ok(gz.finish()?)
}

fn sha256(bytes: &[u8]) -> String {
    let digest = Sha256::digest(bytes);
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

fn descriptor(media_type: &str, blob: &[u8]) -> serde_json::Value {
    json!({ "mediaType": media_type, "digest": sha256(blob), "size": blob.len() })
}

fn read(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).with_context(|| format!("reading {}", path.display()))
}

/// `seconds` since the Unix epoch as an RFC 3339 UTC time (days to civil date: Howard
/// Hinnant's algorithm).
fn rfc3339(seconds: u64) -> String {
    let days = (seconds / 86_400) as i64;
    let secs = seconds % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ldd_output_gives_the_loader_and_every_library() {
        let text = "\tlinux-vdso.so.1 (0x00007ffd5a5f2000)\n\
                    \tlibgcc_s.so.1 => /lib/x86_64-linux-gnu/libgcc_s.so.1 (0x00007f0c1c000000)\n\
                    \tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f0c1be00000)\n\
                    \t/lib64/ld-linux-x86-64.so.2 (0x00007f0c1c4a0000)\n";
        let paths = parse_ldd(text).unwrap();
        assert_eq!(
            paths,
            [
                "/lib/x86_64-linux-gnu/libgcc_s.so.1",
                "/lib/x86_64-linux-gnu/libc.so.6",
                "/lib64/ld-linux-x86-64.so.2"
            ]
            .map(PathBuf::from)
        );
        assert!(parse_ldd("\tlibfoo.so.1 => not found\n").is_err());
    }

    #[test]
    fn times_are_rfc3339() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(1_700_000_000), "2023-11-14T22:13:20Z");
    }

    #[test]
    fn symlinks_on_the_way_to_a_library_are_kept() {
        let dir = std::env::temp_dir().join(format!("xtask-image-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("usr/lib")).unwrap();
        std::fs::write(dir.join("usr/lib/libx.so.1.2"), b"ELF").unwrap();
        std::os::unix::fs::symlink("usr/lib", dir.join("lib")).unwrap();
        std::os::unix::fs::symlink("libx.so.1.2", dir.join("usr/lib/libx.so.1")).unwrap();
        let mut root = RootFs::default();
        root.add_host_file(&dir.join("lib/libx.so.1")).unwrap();
        let inside = dir.strip_prefix("/").unwrap();
        let kinds: Vec<(String, &str)> = root
            .entries
            .iter()
            .filter_map(|(path, entry)| {
                let rel = path.strip_prefix(inside).ok()?.display().to_string();
                let kind = match entry {
                    Entry::Dir(_) => "dir",
                    Entry::File(..) => "file",
                    Entry::Symlink(_) => "symlink",
                };
                Some((rel, kind))
            })
            .collect();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(
            kinds,
            [
                ("", "dir"),
                ("lib", "symlink"),
                ("usr", "dir"),
                ("usr/lib", "dir"),
                ("usr/lib/libx.so.1", "symlink"),
                ("usr/lib/libx.so.1.2", "file"),
            ]
            .map(|(p, k)| (p.to_owned(), k))
        );
    }
}
