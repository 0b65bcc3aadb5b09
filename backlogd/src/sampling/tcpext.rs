//! A network namespace's own TcpExt counters, exported next to backlogd's per-socket
//! figures so that anyone can cross-check them.

use std::{
    collections::HashMap,
    fs::File,
    os::unix::fs::{FileExt as _, MetadataExt as _},
    path::{Path, PathBuf},
    sync::Arc,
};

/// TcpExt counters backlogd exports, as `/proc/net/netstat` names them.
pub const COUNTERS: [&str; 6] = backlogd_common::netstat::EXPORTED;

/// Where a namespace's counters can be read without switching namespaces.
#[derive(Debug, Clone)]
pub enum Source {
    /// A task in the namespace: `/proc/PID/task/TID/net/netstat`.
    Task { pid: u32, tid: u32 },
    /// `/proc/thread-self/net/netstat` opened by a thread inside the namespace (one with no
    /// task, only a bind mount such as `/run/netns/NAME`). The open file stays bound to that
    /// namespace, so a scrape re-reads it from the start instead of joining the namespace.
    Netstat(Arc<File>),
}

impl Source {
    /// A task's source, if `path` is `/proc/PID/task/TID/ns/net`.
    pub fn task(path: &Path) -> Option<Self> {
        let parts: Vec<&str> = path.iter().filter_map(|p| p.to_str()).collect();
        match parts.as_slice() {
            ["/", "proc", pid, "task", tid, "ns", "net"] => Some(Source::Task {
                pid: pid.parse().ok()?,
                tid: tid.parse().ok()?,
            }),
            _ => None,
        }
    }

    /// A thread of process `pid` in namespace `netns`: any of them may be in another
    /// (a thread that entered a namespace to open a listener there).
    pub fn thread_of(pid: u32, netns: u32) -> Option<Self> {
        let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
        tasks.flatten().find_map(|task| {
            let tid: u32 = task.file_name().to_str()?.parse().ok()?;
            let ino = std::fs::metadata(task.path().join("ns/net")).ok()?.ino();
            (ino == u64::from(netns)).then_some(Source::Task { pid, tid })
        })
    }

    /// Opens this thread's namespace's netstat for later reads from any thread.
    pub fn open_here() -> std::io::Result<Self> {
        Ok(Source::Netstat(Arc::new(File::open(
            "/proc/thread-self/net/netstat",
        )?)))
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
            Source::Netstat(file) => parse(&read_from_start(file).ok()?),
        }
    }

    /// The namespace's listen sysctls, read from a thread that joins it (`/proc/sys/net`
    /// always shows the reader's namespace). Scans read them in passing; this is for a
    /// namespace known only from a listen event so far.
    pub fn sysctls(&self, netns: u32) -> Option<ListenSysctls> {
        let Source::Task { pid, tid } = self else {
            return None;
        };
        // No setns without CAP_SYS_ADMIN: not a thread spawned to fail at every request.
        if !super::netns::can_join() {
            return None;
        }
        let path = PathBuf::from(format!("/proc/{pid}/task/{tid}/ns/net"));
        if std::fs::metadata(&path).ok()?.ino() != u64::from(netns) {
            return None;
        }
        super::netns::run_in(&path, ListenSysctls::read_here)
            .ok()?
            .ok()
    }
}

/// The whole file, read again from offset 0 (procfs seq files regenerate on each pass).
fn read_from_start(file: &File) -> std::io::Result<String> {
    let mut out = Vec::with_capacity(8192);
    let mut chunk = [0u8; 8192];
    loop {
        let n = file.read_at(&mut chunk, out.len() as u64)?;
        if n == 0 {
            break;
        }
        out.extend_from_slice(&chunk[..n]);
    }
    String::from_utf8(out).map_err(std::io::Error::other)
}

/// Listen-related sysctls of a namespace (they are per namespace).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ListenSysctls {
    pub somaxconn: u32,
    pub tcp_max_syn_backlog: u32,
    pub tcp_syncookies: u32,
    pub tcp_abort_on_overflow: u32,
}

impl ListenSysctls {
    /// The calling thread's namespace's values.
    pub fn read_here() -> std::io::Result<Self> {
        let read = |key: &str| -> std::io::Result<u32> {
            std::fs::read_to_string(format!("/proc/sys/{}", key.replace('.', "/")))?
                .trim()
                .parse()
                .map_err(std::io::Error::other)
        };
        Ok(Self {
            somaxconn: read("net.core.somaxconn")?,
            tcp_max_syn_backlog: read("net.ipv4.tcp_max_syn_backlog")?,
            tcp_syncookies: read("net.ipv4.tcp_syncookies")?,
            tcp_abort_on_overflow: read("net.ipv4.tcp_abort_on_overflow")?,
        })
    }
}

/// The TcpExt counters in the text of a `/proc/net/netstat`.
pub fn parse(netstat: &str) -> Option<HashMap<String, u64>> {
    Some(
        backlogd_common::netstat::tcp_ext(netstat)?
            .map(|(k, v)| (k.to_owned(), v))
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn task_paths_become_task_sources() {
        assert!(matches!(
            Source::task(Path::new("/proc/12/task/34/ns/net")),
            Some(Source::Task { pid: 12, tid: 34 })
        ));
        assert!(Source::task(Path::new("/run/netns/blue")).is_none());
    }

    #[test]
    fn an_open_netstat_reads_fresh_counters_each_time() {
        use std::os::fd::AsRawFd as _;
        let source = Source::open_here().unwrap();
        let me = std::process::id();
        let ns = std::fs::metadata(format!("/proc/{me}/task/{me}/ns/net"))
            .unwrap()
            .ino() as u32;
        let before = source.read(ns).unwrap()["ListenOverflows"];
        // Overflow a loopback listener with a backlog of 0: its accept queue holds one
        // connection, the next SYNs are dropped and counted.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        // SAFETY: listen(2) on a socket this test owns.
        assert_eq!(unsafe { libc::listen(listener.as_raw_fd(), 0) }, 0);
        let addr = listener.local_addr().unwrap();
        let clients: Vec<_> = (0..3)
            .map(|_| std::thread::spawn(move || std::net::TcpStream::connect(addr)))
            .collect();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let mut now = before;
        while now <= before && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(20));
            now = source.read(ns).unwrap()["ListenOverflows"];
        }
        assert!(
            now > before,
            "ListenOverflows stayed {before} in the kept file"
        );
        drop(listener);
        for c in clients {
            let _ = c.join();
        }
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
