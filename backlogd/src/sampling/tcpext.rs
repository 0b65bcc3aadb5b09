//! A network namespace's own TcpExt counters, exported next to backlogd's per-socket
//! figures so that anyone can cross-check them.

use std::{
    collections::HashMap,
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
};

/// TcpExt counters backlogd exports, as `/proc/net/netstat` names them.
pub const COUNTERS: [&str; 5] = [
    "ListenOverflows",
    "ListenDrops",
    "TCPReqQFullDrop",
    "TCPReqQFullDoCookies",
    "TCPSynRetrans",
];

/// Where a namespace's counters can be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// A task in the namespace: `/proc/PID/task/TID/net/netstat`, no namespace switch.
    Task { pid: u32, tid: u32 },
    /// A namespace file (`/run/netns/NAME`): read from a thread that joins it.
    File(PathBuf),
}

impl Source {
    /// The source a `/proc/PID/task/TID/ns/net` or bind-mount path found by a scan gives.
    pub fn from_ns_path(path: &Path) -> Self {
        let parts: Vec<&str> = path.iter().filter_map(|p| p.to_str()).collect();
        match parts.as_slice() {
            ["/", "proc", pid, "task", tid, "ns", "net"] => match (pid.parse(), tid.parse()) {
                (Ok(pid), Ok(tid)) => Source::Task { pid, tid },
                _ => Source::File(path.to_owned()),
            },
            _ => Source::File(path.to_owned()),
        }
    }

    /// The namespace's counters, or None if the source no longer leads to `netns`.
    pub fn read(&self, netns: u32) -> Option<HashMap<String, u64>> {
        match self {
            Source::Task { pid, tid } => {
                let task = PathBuf::from(format!("/proc/{pid}/task/{tid}"));
                // The task may have exited, its pid been reused, or it may have moved.
                let ino = std::fs::metadata(task.join("ns/net")).ok()?.ino();
                if ino != u64::from(netns) {
                    return None;
                }
                parse(&std::fs::read_to_string(task.join("net/netstat")).ok()?)
            }
            Source::File(path) => {
                if std::fs::metadata(path).ok()?.ino() != u64::from(netns) {
                    return None;
                }
                super::netns::run_in(path, || {
                    std::fs::read_to_string("/proc/thread-self/net/netstat")
                })
                .ok()?
                .ok()
                .and_then(|text| parse(&text))
            }
        }
    }
}

/// Listen-related sysctls of a namespace (they are per namespace).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ListenSysctls {
    pub somaxconn: u32,
    pub tcp_max_syn_backlog: u32,
    pub tcp_syncookies: u32,
    pub tcp_abort_on_overflow: u32,
}

impl Source {
    /// The namespace path to join for reading its `/proc/sys/net`.
    fn ns_path(&self) -> PathBuf {
        match self {
            Source::Task { pid, tid } => format!("/proc/{pid}/task/{tid}/ns/net").into(),
            Source::File(path) => path.clone(),
        }
    }

    /// The namespace's listen sysctls, read from a thread that joins it (`/proc/sys/net`
    /// always shows the reader's namespace).
    pub fn sysctls(&self, netns: u32) -> Option<ListenSysctls> {
        let path = self.ns_path();
        if std::fs::metadata(&path).ok()?.ino() != u64::from(netns) {
            return None;
        }
        super::netns::run_in(&path, || {
            let read = |key: &str| -> std::io::Result<u32> {
                std::fs::read_to_string(format!("/proc/sys/{}", key.replace('.', "/")))?
                    .trim()
                    .parse()
                    .map_err(std::io::Error::other)
            };
            Ok(ListenSysctls {
                somaxconn: read("net.core.somaxconn")?,
                tcp_max_syn_backlog: read("net.ipv4.tcp_max_syn_backlog")?,
                tcp_syncookies: read("net.ipv4.tcp_syncookies")?,
                tcp_abort_on_overflow: read("net.ipv4.tcp_abort_on_overflow")?,
            })
        })
        .ok()?
        .ok()
    }
}

/// The TcpExt section of `/proc/net/netstat` (a header line of names, then values).
pub fn parse(netstat: &str) -> Option<HashMap<String, u64>> {
    let mut lines = netstat.lines();
    while let Some(names) = lines.next() {
        let values = lines.next()?;
        if let (Some(names), Some(values)) = (
            names.strip_prefix("TcpExt:"),
            values.strip_prefix("TcpExt:"),
        ) {
            return Some(
                names
                    .split_whitespace()
                    .zip(values.split_whitespace())
                    .filter_map(|(k, v)| Some((k.to_owned(), v.parse().ok()?)))
                    .collect(),
            );
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_tcpext_and_skips_ipext() {
        let text = "TcpExt: SyncookiesSent ListenOverflows ListenDrops\nTcpExt: 3 75 80\n\
                    IpExt: InNoRoutes\nIpExt: 1\n";
        let m = parse(text).unwrap();
        assert_eq!((m["ListenOverflows"], m["ListenDrops"]), (75, 80));
        assert!(!m.contains_key("InNoRoutes"));
    }

    #[test]
    fn task_paths_become_task_sources() {
        assert_eq!(
            Source::from_ns_path(Path::new("/proc/12/task/34/ns/net")),
            Source::Task { pid: 12, tid: 34 }
        );
        assert_eq!(
            Source::from_ns_path(Path::new("/run/netns/blue")),
            Source::File("/run/netns/blue".into())
        );
    }

    #[test]
    fn own_namespace_reads_like_proc_net() {
        let me = std::process::id();
        let ns = std::fs::metadata(format!("/proc/{me}/task/{me}/ns/net"))
            .unwrap()
            .ino() as u32;
        let read = Source::Task { pid: me, tid: me }.read(ns).unwrap();
        assert!(read.contains_key("ListenOverflows"));
        assert_eq!(
            Source::Task { pid: me, tid: me }.read(ns.wrapping_add(1)),
            None
        );
    }
}
