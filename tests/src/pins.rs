//! Pin directories for tests of `--pin-dir`: on bpffs, each its own, unpinned when done.

use std::path::{Path, PathBuf};

use crate::daemon::run_to_end;

/// A fresh directory on bpffs (mounted if the host has none), unpinned and removed again
/// when dropped so that no test leaves programs attached.
pub struct PinDir(PathBuf);

impl PinDir {
    pub fn new(name: &str) -> Self {
        crate::tools::ensure_mounted("bpf", "/sys/fs/bpf");
        let dir = PathBuf::from(format!(
            "/sys/fs/bpf/backlogd-test-{}-{name}",
            std::process::id()
        ));
        if dir.exists() {
            unpin(&dir);
        }
        Self(dir)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    pub fn arg(&self) -> &str {
        self.0.to_str().expect("UTF-8 path")
    }
}

impl Drop for PinDir {
    fn drop(&mut self) {
        if self.0.exists() {
            let _ = run_to_end(&["unpin", "--pin-dir", self.arg()]);
        }
    }
}

/// `backlogd unpin --pin-dir DIR`, which must succeed.
pub fn unpin(dir: &Path) {
    let out = run_to_end(&["unpin", "--pin-dir", dir.to_str().expect("UTF-8 path")]);
    assert!(out.status.success(), "backlogd unpin: {out:?}");
}
