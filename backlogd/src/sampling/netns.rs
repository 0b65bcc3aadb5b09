//! Finding network namespaces and running code inside one.

use std::{
    collections::HashMap,
    fs::File,
    os::{fd::AsRawFd as _, unix::fs::MetadataExt as _},
    path::{Path, PathBuf},
};

#[derive(Debug, Clone)]
pub struct Netns {
    pub inode: u32,
    /// A path that opens it: `/proc/PID/task/TID/ns/net` or a `/run/netns` bind mount.
    pub path: PathBuf,
}

/// Every network namespace some task is in, plus those kept alive by `ip netns` bind
/// mounts. Threads count: a thread can sit in a namespace its process leader is not in.
pub fn all() -> Vec<Netns> {
    let mut by_inode: HashMap<u64, PathBuf> = HashMap::new();
    let mut add = |path: PathBuf| {
        if let Ok(meta) = std::fs::metadata(&path) {
            by_inode.entry(meta.ino()).or_insert(path);
        }
    };
    if let Ok(run) = std::fs::read_dir("/run/netns") {
        for entry in run.flatten() {
            add(entry.path());
        }
    }
    for pid in numeric_entries(Path::new("/proc")) {
        let tasks = Path::new("/proc").join(&pid).join("task");
        for tid in numeric_entries(&tasks) {
            add(tasks.join(tid).join("ns/net"));
        }
    }
    by_inode
        .into_iter()
        .map(|(inode, path)| Netns {
            inode: inode as u32,
            path,
        })
        .collect()
}

/// The host's network namespace: PID 1's (the daemon's own may be another, e.g. a pod
/// without hostNetwork).
pub fn host() -> Option<u32> {
    std::fs::metadata("/proc/1/ns/net")
        .ok()
        .map(|m| m.ino() as u32)
}

fn numeric_entries(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| e.file_name().into_string().ok())
                .filter(|n| n.bytes().all(|b| b.is_ascii_digit()))
                .collect()
        })
        .unwrap_or_default()
}

/// Whether this thread may setns(2) into other network namespaces (CAP_SYS_ADMIN).
pub fn can_join() -> bool {
    caps::has_cap(
        None,
        caps::CapSet::Effective,
        caps::Capability::CAP_SYS_ADMIN,
    )
    .unwrap_or(false)
}

/// Runs `f` on a fresh thread that has joined the namespace at `path`; the caller's
/// threads never change namespace.
pub fn run_in<T: Send>(
    path: &Path,
    f: impl FnOnce() -> std::io::Result<T> + Send,
) -> std::io::Result<std::io::Result<T>> {
    let file = File::open(path)?;
    std::thread::scope(|s| {
        s.spawn(move || {
            // SAFETY: setns on an open namespace fd; affects only this thread.
            if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(f())
        })
        .join()
        .unwrap_or_else(|_| Err(std::io::Error::other("netns worker panicked")))
    })
}
