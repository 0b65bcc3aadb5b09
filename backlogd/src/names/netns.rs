//! Names of network namespaces: `ip netns add NAME` (and the CNI plugins containerd and
//! podman use) keep a bind mount of the namespace at /run/netns/NAME. A file there that is
//! no longer a mount of a namespace (left after a crash) is not a name.

use std::{collections::HashMap, os::unix::fs::MetadataExt as _, path::Path};

const DIR: &str = "/run/netns";

/// Namespace inode -> name, for every named namespace.
pub fn named() -> HashMap<u32, String> {
    // A namespace file's device is nsfs's; a stale file's is the tmpfs's.
    let Ok(nsfs) = std::fs::metadata("/proc/self/ns/net").map(|m| m.dev()) else {
        return HashMap::new();
    };
    named_in(Path::new(DIR), nsfs)
}

fn named_in(dir: &Path, nsfs: u64) -> HashMap<u32, String> {
    let mut out = HashMap::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let Ok(meta) = std::fs::metadata(entry.path()) else {
            continue;
        };
        let file_name = entry.file_name();
        let (Ok(inode), Some(name)) = (u32::try_from(meta.ino()), file_name.to_str()) else {
            continue;
        };
        if meta.dev() == nsfs {
            // Two names for one namespace: the first in directory order, consistently.
            out.entry(inode).or_insert_with(|| name.to_owned());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A plain file in the directory (what `ip netns` leaves when the mount is gone) is not
    /// a name; nsfs files are checked by the integration suite (tests/tests/names.rs).
    #[test]
    fn files_that_are_not_namespaces_are_not_names() {
        let dir = std::env::temp_dir().join(format!("backlogd-netns-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("stale"), b"").unwrap();
        let nsfs = std::fs::metadata("/proc/self/ns/net").unwrap().dev();
        assert!(named_in(&dir, nsfs).is_empty());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
