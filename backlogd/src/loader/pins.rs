//! Pinned state under bpffs, so a restart or an upgrade loses no counts.
//!
//! With `--pin-dir DIR` the loader pins the links of every attached program and the maps
//! the daemon reads under `DIR/<build>-<mode>/`, then creates `complete/` last. The pins
//! keep the programs attached and counting while no daemon runs (a crash, `kill -9`, a
//! restart). The next daemon of the same build adopts that state instead of loading
//! anything: it opens the pinned maps and carries on, with no gap and no double counting
//! (two generations of programs attached at once would count every SYN twice).
//!
//! `<build>` is a digest of the eBPF object: a daemon built from other eBPF code cannot
//! read the old maps' layout, so it removes the old state (detaching those programs),
//! loads its own and says that counters restarted. A directory without `complete/` is a
//! load that died half-way and is removed the same way.
//!
//! bpffs holds only BPF objects and directories, hence the directory as a marker.
//!
//! The load step (`backlogd load`, the shipped unit's ExecStartPre=) adds what a daemon
//! without loading capabilities cannot make or find itself: `scan`, the scan iterator's
//! link, and `programs/` (with its own `complete/`: bpffs renames nothing), the programs,
//! whose fds give their skipped runs.

use std::{
    io,
    os::fd::{AsFd as _, OwnedFd},
    path::{Path, PathBuf},
};

use aya::{maps::MapData, programs::links::FdLink};
use sha2::{Digest as _, Sha256};

use super::modes::{HookMode, HookModeArg};

/// Beside a state, the scan iterator's link and the programs, pinned by the load step
/// (`backlogd load`) for a daemon that holds no loading capability.
const SCAN: &str = "scan";
const PROGRAMS: &str = "programs";
const TRAMPOLINES: &str = "trampolines-work";

/// `statfs(2)` f_type of a BPF filesystem.
const BPF_FS_MAGIC: i64 = 0xcafe_4a11;

#[derive(Debug, thiserror::Error)]
pub enum PinError {
    #[error(
        "{dir} is not on a BPF filesystem, so nothing can be pinned there. Fix: \
         `mount -t bpf bpf /sys/fs/bpf` and use a directory below it (the shipped \
         unit uses /sys/fs/bpf/backlogd), or run without --pin-dir"
    )]
    NotBpffs { dir: PathBuf },
    #[error(
        "cannot create the pin directory {dir}. Fix: mount bpffs (`mount -t bpf bpf \
         /sys/fs/bpf`) and use a directory below it, or run without --pin-dir"
    )]
    Create {
        dir: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(
        "cannot create the pin directory {dir}: read-only file system. Under systemd, \
         ProtectKernelTunables= (and ProtectSystem=strict) make /sys/fs/bpf read-only, and \
         ReadWritePaths= cannot reopen a directory that does not exist yet. Fix: keep \
         pin_dir = \"/sys/fs/bpf/backlogd\", which the shipped unit's load step creates \
         before the sandbox (ExecStartPre=+backlogd load) and opens (ReadWritePaths=), or \
         name your directory in ReadWritePaths= and in the chown in a drop-in (`systemctl \
         edit backlogd`)"
    )]
    ReadOnly { dir: PathBuf },
    #[error("cannot use the pin directory {path}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot pin {what} at {path}")]
    Pin {
        what: String,
        path: PathBuf,
        #[source]
        source: aya::pin::PinError,
    },
    #[error(
        "cannot pin the link of program {program}: this kernel attaches it without a BPF \
         link (perf-event links need Linux 5.15+). Fix: run without --pin-dir"
    )]
    NoLink {
        program: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("cannot open pinned map {path}")]
    Open {
        path: PathBuf,
        #[source]
        source: aya::maps::MapError,
    },
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> PinError + '_ {
    move |source| PinError::Io {
        path: path.to_owned(),
        source,
    }
}

/// Identifies the eBPF object: its digest, shortened.
pub fn build_id(object: &[u8]) -> String {
    Sha256::digest(object)
        .iter()
        .take(6)
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The pin directory of one daemon build.
#[derive(Debug)]
pub struct PinDir {
    root: PathBuf,
    build: String,
}

/// What a previous daemon left in the pin directory.
#[derive(Debug)]
pub enum Found {
    /// Complete state of this build in `mode`: adopt it.
    Adoptable(HookMode),
    /// Nothing there.
    Empty,
}

impl PinDir {
    /// Checks that `root` is on bpffs (creating it if needed).
    pub fn open(root: &Path, build: String) -> Result<Self, PinError> {
        std::fs::create_dir_all(root).map_err(|source| {
            if source.kind() == io::ErrorKind::ReadOnlyFilesystem {
                PinError::ReadOnly { dir: root.into() }
            } else {
                PinError::Create {
                    dir: root.into(),
                    source,
                }
            }
        })?;
        if !on_bpffs(root).map_err(io_err(root))? {
            return Err(PinError::NotBpffs { dir: root.into() });
        }
        Ok(Self {
            root: root.into(),
            build,
        })
    }

    fn state(&self, mode: HookMode) -> PathBuf {
        self.root.join(format!("{}-{}", self.build, mode.name()))
    }

    pub fn map_path(&self, mode: HookMode, name: &str) -> PathBuf {
        self.state(mode).join("maps").join(name)
    }

    /// Where the load step pins the scan iterator's link beside `mode`'s state, for a
    /// daemon that cannot load it (see `scan.rs`).
    pub fn scan_path(&self, mode: HookMode) -> PathBuf {
        self.state(mode).join(SCAN)
    }

    /// Records beside `mode`'s state that this kernel's BPF trampolines work, as empty
    /// directories: finding out loads a program, which a daemon without loading
    /// capabilities cannot, and would otherwise report no trampolines.
    pub fn record_trampolines(&self, mode: HookMode, works: bool) -> Result<(), PinError> {
        let dir = self.state(mode).join(TRAMPOLINES);
        match (works, dir.is_dir()) {
            (true, false) => std::fs::create_dir(&dir).map_err(io_err(&dir)),
            (false, true) => remove(&dir),
            _ => Ok(()),
        }
    }

    /// Whether the load step found BPF trampolines working (see `record_trampolines`).
    pub fn trampolines_recorded(&self, mode: HookMode) -> bool {
        self.state(mode).join(TRAMPOLINES).is_dir()
    }

    /// Pins `programs` beside `mode`'s state (kept if already there), each as
    /// `NN-<kernel name>`: a daemon without CAP_SYS_ADMIN cannot find them otherwise.
    pub fn pin_programs(
        &self,
        mode: HookMode,
        programs: &[(OwnedFd, String)],
    ) -> Result<(), PinError> {
        let dir = self.state(mode).join(PROGRAMS);
        // bpffs renames nothing: a directory holds every program once it has `complete/`.
        let marker = dir.join("complete");
        if marker.is_dir() {
            return Ok(());
        }
        if dir.exists() {
            remove(&dir)?;
        }
        std::fs::create_dir(&dir).map_err(io_err(&dir))?;
        for (i, (fd, name)) in programs.iter().enumerate() {
            let path = dir.join(format!("{:02}-{name}", i + 1));
            crate::bpf_syscall::obj_pin(fd.as_fd(), &path).map_err(io_err(&path))?;
        }
        std::fs::create_dir(&marker).map_err(io_err(&marker))
    }

    /// The programs a load step pinned beside `mode`'s state with their kernel names;
    /// `None` when none were.
    pub fn open_programs(
        &self,
        mode: HookMode,
    ) -> Option<Result<Vec<(OwnedFd, String)>, PinError>> {
        let dir = self.state(mode).join(PROGRAMS);
        if !dir.join("complete").is_dir() {
            return None;
        }
        let open = || {
            let mut programs = Vec::new();
            for entry in std::fs::read_dir(&dir).map_err(io_err(&dir))? {
                let path = entry.map_err(io_err(&dir))?.path();
                if path.is_dir() {
                    continue;
                }
                let file = path.file_name().unwrap_or_default().to_string_lossy();
                let name = file.split_once('-').map_or(&*file, |(_, n)| n).to_owned();
                let fd = crate::bpf_syscall::obj_get(&path).map_err(io_err(&path))?;
                programs.push((fd, name));
            }
            programs.sort_by(|a, b| a.1.cmp(&b.1));
            Ok(programs)
        };
        Some(open())
    }

    /// Finds state this build can adopt for `wanted`; removes everything else (another
    /// build's, an unfinished load's, another mode's when one was asked for), which
    /// detaches those programs. Logs what it removed and why.
    pub fn survey(&self, wanted: HookModeArg) -> Result<Found, PinError> {
        let mut found = Found::Empty;
        let entries = std::fs::read_dir(&self.root).map_err(io_err(&self.root))?;
        for entry in entries {
            let entry = entry.map_err(io_err(&self.root))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let adoptable = match (&found, self.mode_of(&name)) {
                (Found::Empty, Some(mode)) if entry.path().join("complete").is_dir() => {
                    wanted.allows(mode).then_some(mode)
                }
                _ => None,
            };
            match adoptable {
                Some(mode) => found = Found::Adoptable(mode),
                None => {
                    tracing::warn!(
                        state = %entry.path().display(),
                        build = %self.build,
                        "removing pinned state this daemon cannot adopt (another build, \
                         another hook mode, or a load that never finished): its programs \
                         are detached and its counters restart from zero"
                    );
                    remove(&entry.path())?;
                }
            }
        }
        Ok(found)
    }

    /// `Some(mode)` when `name` is this build's state directory for `mode`.
    fn mode_of(&self, name: &str) -> Option<HookMode> {
        let mode = name.strip_prefix(&self.build)?.strip_prefix('-')?;
        [HookMode::Fentry, HookMode::Kprobe, HookMode::Tracepoint]
            .into_iter()
            .find(|m| m.name() == mode)
    }

    /// Starts pinning a fresh load in `mode`.
    pub fn begin(&self, mode: HookMode) -> Result<Pinning, PinError> {
        let state = self.state(mode);
        if state.exists() {
            remove(&state)?;
        }
        for sub in ["maps", "links"] {
            let dir = state.join(sub);
            std::fs::create_dir_all(&dir).map_err(io_err(&dir))?;
        }
        Ok(Pinning {
            state,
            links: 0,
            completed: false,
        })
    }

    /// Opens this build's pinned map `name` of `mode`.
    pub fn open_map(&self, mode: HookMode, name: &str) -> Result<aya::maps::Map, PinError> {
        let path = self.map_path(mode, name);
        let open = |source| PinError::Open {
            path: path.clone(),
            source,
        };
        aya::maps::Map::from_map_data(MapData::from_pin(&path).map_err(open)?).map_err(open)
    }

    /// Removes all pinned state: the programs are detached once no process holds them.
    pub fn clear(&self) -> Result<(), PinError> {
        let entries = std::fs::read_dir(&self.root).map_err(io_err(&self.root))?;
        for entry in entries {
            remove(&entry.map_err(io_err(&self.root))?.path())?;
        }
        Ok(())
    }
}

/// A load in progress, pinning as it attaches. Dropped without [`Pinning::complete`],
/// it removes what it pinned, detaching those programs.
#[derive(Debug)]
pub struct Pinning {
    state: PathBuf,
    links: usize,
    completed: bool,
}

impl Pinning {
    fn next_link_path(&mut self, program: &str) -> PathBuf {
        self.links += 1;
        self.state
            .join("links")
            .join(format!("{:02}-{program}", self.links))
    }

    pub fn link(&mut self, program: &str, link: FdLink) -> Result<(), PinError> {
        let path = self.next_link_path(program);
        link.pin(&path).map_err(|source| PinError::Pin {
            what: format!("the link of program {program}"),
            path,
            source,
        })?;
        Ok(())
    }

    /// Pins a link the loader created itself (the cgroup one, see `cgroup.rs`).
    pub fn raw_link(
        &mut self,
        program: &str,
        fd: std::os::fd::BorrowedFd<'_>,
    ) -> Result<(), PinError> {
        let path = self.next_link_path(program);
        crate::bpf_syscall::obj_pin(fd, &path).map_err(io_err(&path))
    }

    pub fn map(&self, name: &str, map: &aya::maps::Map) -> Result<(), PinError> {
        let path = self.state.join("maps").join(name);
        map.pin(&path).map_err(|source| PinError::Pin {
            what: format!("map {name}"),
            path,
            source,
        })
    }

    /// Marks the state adoptable: everything is attached and pinned.
    pub fn complete(mut self) -> Result<(), PinError> {
        let marker = self.state.join("complete");
        std::fs::create_dir(&marker).map_err(io_err(&marker))?;
        self.completed = true;
        Ok(())
    }
}

impl Drop for Pinning {
    fn drop(&mut self) {
        if self.completed {
            return;
        }
        if let Err(e) = remove(&self.state) {
            tracing::warn!(error = %e, "cannot remove the pins of a failed load");
        }
    }
}

fn remove(path: &Path) -> Result<(), PinError> {
    std::fs::remove_dir_all(path).map_err(io_err(path))
}

fn on_bpffs(path: &Path) -> io::Result<bool> {
    use std::os::unix::ffi::OsStrExt as _;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    // SAFETY: zeroed statfs is a valid out-parameter; `c` is a valid C string.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::statfs(c.as_ptr(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    #[allow(
        clippy::unnecessary_cast,
        reason = "f_type's width differs by libc target"
    )]
    Ok(st.f_type as i64 == BPF_FS_MAGIC)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn build_id_is_short_stable_hex() {
        assert_eq!(build_id(b"abc"), "ba7816bf8f01");
        assert_ne!(build_id(b"abc"), build_id(b"abd"));
    }
}
