//! cgroup trees of a test's own, on the host's cgroup v2 hierarchy.

use std::path::{Path, PathBuf};

/// Where cgroup2 is mounted: /sys/fs/cgroup itself, or /sys/fs/cgroup/unified on a hybrid
/// host (as this CI machine is).
pub fn v2_mount() -> PathBuf {
    let mounts = std::fs::read_to_string("/proc/self/mounts").expect("/proc/self/mounts");
    mounts
        .lines()
        .find_map(|l| {
            let mut words = l.split_whitespace();
            let (_, dir, fs) = (words.next()?, words.next()?, words.next()?);
            (fs == "cgroup2").then(|| PathBuf::from(dir))
        })
        .expect("no cgroup2 mount (backlogd needs one)")
}

/// A cgroup of the test's own under the cgroup v2 root, with the cgroups made below it;
/// removed (bottom-up, once their processes have exited) when dropped.
pub struct Tree(PathBuf);

impl Tree {
    pub fn new(name: &str) -> Self {
        let root = v2_mount().join(format!("backlogd-test-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&root)
            .unwrap_or_else(|e| panic!("creating {} (cgroup v2): {e}", root.display()));
        Self(root)
    }

    /// The cgroup at `path` below the tree's root, made if needed.
    pub fn cgroup(&self, path: &str) -> PathBuf {
        let dir = self.0.join(path);
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
        dir
    }
}

impl Drop for Tree {
    fn drop(&mut self) {
        fn remove(dir: &Path) {
            for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
                if entry.file_type().is_ok_and(|t| t.is_dir()) {
                    remove(&entry.path());
                }
            }
            let _ = std::fs::remove_dir(dir);
        }
        remove(&self.0);
    }
}
