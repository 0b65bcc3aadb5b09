//! Which process holds a socket: `/proc/PID/fd/*` links to `socket:[INODE]`.

use std::collections::{HashMap, HashSet};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    pub pid: u32,
    pub comm: String,
}

/// Owners of the given socket inodes (the first process found for each). Walks every
/// fd on the host, so it is only used for listeners no event told us about.
pub fn find(inodes: &HashSet<u64>) -> HashMap<u64, Owner> {
    let mut found = HashMap::new();
    if inodes.is_empty() {
        return found;
    }
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return found;
    };
    for proc_entry in procs.flatten() {
        let Some(pid) = proc_entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(proc_entry.path().join("fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            let Ok(target) = std::fs::read_link(fd.path()) else {
                continue;
            };
            let Some(inode) = target
                .to_str()
                .and_then(|t| t.strip_prefix("socket:["))
                .and_then(|t| t.strip_suffix(']'))
                .and_then(|t| t.parse::<u64>().ok())
            else {
                continue;
            };
            if inodes.contains(&inode) && !found.contains_key(&inode) {
                let comm = std::fs::read_to_string(proc_entry.path().join("comm"))
                    .map(|c| c.trim_end().to_owned())
                    .unwrap_or_default();
                found.insert(inode, Owner { pid, comm });
            }
        }
        if found.len() == inodes.len() {
            break;
        }
    }
    found
}
