//! The kernel's view of backlogd's BPF objects, through bpftool (Debian package).

use std::{collections::HashSet, process::Command};

/// `bpftool --json ARGS`.
pub fn bpftool(args: &[&str]) -> serde_json::Value {
    let out = Command::new("bpftool")
        .arg("--json")
        .args(args)
        .output()
        .expect("running bpftool");
    assert!(out.status.success(), "bpftool {args:?}: {out:?}");
    serde_json::from_slice(&out.stdout).expect("bpftool JSON")
}

/// The `field` (`map_id`, `prog_id`) of each of process `pid`'s fds that has one, sorted and
/// without repeats (a program shows in its own fd and in its links').
pub fn fd_object_ids(pid: u32, field: &str) -> Vec<String> {
    let prefix = format!("{field}:");
    let mut ids: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fdinfo"))
        .expect("fdinfo")
        .flatten()
        .filter_map(|fd| std::fs::read_to_string(fd.path()).ok())
        .filter_map(|info| {
            info.lines()
                .find_map(|l| l.strip_prefix(&prefix))
                .map(|id| id.trim().to_owned())
        })
        .collect();
    ids.sort();
    ids.dedup();
    ids
}

/// ID of process `pid`'s map named `name` (the kernel keeps 15 characters of a name).
pub fn map_of(pid: u32, name: &str) -> String {
    fd_object_ids(pid, "map_id")
        .into_iter()
        .find(|id| bpftool(&["map", "show", "id", id])["name"] == name)
        .unwrap_or_else(|| panic!("process {pid} holds no map {name}"))
}

/// Socket inodes that are keys of process `pid`'s maps named `names`.
pub fn inodes_in_maps(pid: u32, names: &[&str]) -> HashSet<u64> {
    let mut keys = HashSet::new();
    for name in names {
        let id = map_of(pid, name);
        for entry in bpftool(&["map", "dump", "id", &id])
            .as_array()
            .expect("map dump")
        {
            keys.insert(key_u64(&entry["key"]));
        }
    }
    keys
}

/// A u64 key as bpftool prints it: hex bytes (little endian) or a number (with BTF).
fn key_u64(key: &serde_json::Value) -> u64 {
    if let Some(n) = key.as_u64() {
        return n;
    }
    let bytes: Vec<u8> = key
        .as_array()
        .unwrap_or_else(|| panic!("unexpected key {key}"))
        .iter()
        .map(|b| {
            u8::from_str_radix(b.as_str().expect("hex byte").trim_start_matches("0x"), 16)
                .expect("hex byte")
        })
        .collect();
    u64::from_le_bytes(bytes.try_into().expect("8-byte key"))
}
