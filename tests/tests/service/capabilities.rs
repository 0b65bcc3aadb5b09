//! The capabilities the daemon keeps after readiness, and what it still sees with them.

use std::{
    process::Command,
    time::{Duration, Instant},
};

use backlogd_tests::{Daemon, tools};

use crate::support::*;

/// The capability sets of one thread (`/proc/PID/task/TID/status`).
#[derive(Debug)]
pub(crate) struct ThreadCaps {
    pub(crate) tid: String,
    pub(crate) inheritable: u64,
    pub(crate) permitted: u64,
    pub(crate) effective: u64,
    pub(crate) bounding: u64,
    pub(crate) ambient: u64,
    pub(crate) no_new_privs: bool,
}

/// Capability sets of every thread of `pid`.
pub(crate) fn thread_caps(pid: u32) -> Vec<ThreadCaps> {
    let dir = format!("/proc/{pid}/task");
    std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{dir}: {e}"))
        .flatten()
        .map(|t| {
            let path = t.path().join("status");
            let status = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            let field = |name: &str| {
                status
                    .lines()
                    .find_map(|l| l.strip_prefix(name))
                    .map(str::trim)
                    .unwrap_or_else(|| panic!("no {name} in {}:\n{status}", path.display()))
                    .to_owned()
            };
            let hex = |name: &str| u64::from_str_radix(&field(name), 16).unwrap();
            ThreadCaps {
                tid: t.file_name().to_string_lossy().into_owned(),
                inheritable: hex("CapInh:"),
                permitted: hex("CapPrm:"),
                effective: hex("CapEff:"),
                bounding: hex("CapBnd:"),
                ambient: hex("CapAmb:"),
                no_new_privs: field("NoNewPrivs:") == "1",
            }
        })
        .collect()
}

pub(crate) const CAP_DAC_READ_SEARCH: u64 = 1 << 2;

pub(crate) const CAP_SYS_PTRACE: u64 = 1 << 19;

pub(crate) const CAP_BPF: u64 = 1 << 39;

/// What the running daemon keeps when it finds listeners with the scan iterator, as it
/// does here (every kernel of the matrix loads it, and the daemon runs in the initial PID
/// namespace): backlogd/src/service/caps.rs `runtime_set`. No CAP_SYS_ADMIN: no namespace
/// is joined. CAP_BPF where this kernel gates bpf(2) on the maps behind it
/// (`caps::daemon_keeps_cap_bpf`); where that is not known, what `pid` holds decides
/// between the two, said on stderr.
pub(crate) fn keep(pid: u32) -> u64 {
    let names = CAP_SYS_PTRACE | CAP_DAC_READ_SEARCH;
    let with_bpf = match backlogd_tests::caps::daemon_keeps_cap_bpf() {
        Some(keeps) => keeps,
        None => {
            let held = thread_caps(pid)[0].effective & CAP_BPF != 0;
            eprintln!(
                "this kernel is between 5.10 and 6.1: not known whether bpf(2) on maps \
                 needs CAP_BPF; the daemon kept it: {held}"
            );
            held
        }
    };
    if with_bpf { names | CAP_BPF } else { names }
}

/// Asserts that every thread of the daemon `pid` holds exactly what the daemon says it
/// keeps once the probes are attached: permitted and effective sets of `KEEP`, empty
/// inheritable and ambient sets. Returns the threads.
#[track_caller]
pub(crate) fn assert_runtime_caps(pid: u32) -> Vec<ThreadCaps> {
    let threads = thread_caps(pid);
    let keep = keep(pid);
    // The main thread, two runtime workers, and the blocking pool once it has run a scan.
    assert!(
        threads.len() >= 3,
        "only {} threads: {threads:?}",
        threads.len()
    );
    for t in &threads {
        assert_eq!(
            (t.permitted, t.effective, t.inheritable, t.ambient),
            (keep, keep, 0, 0),
            "thread {} (CapPrm, CapEff, CapInh, CapAmb), want ({keep:#x}, {keep:#x}, 0, 0): \
             {t:x?}",
            t.tid
        );
    }
    threads
}

/// Asserts that no thread can get back what the daemon gave up. The daemon stays uid 0,
/// and execve(2) gives a root process every capability of its bounding set: so the
/// bounding set must be what it kept (its permitted set, `assert_runtime_caps`) too,
/// unless no_new_privs is set (then an execve can gain nothing).
#[track_caller]
pub(crate) fn assert_no_way_back(threads: &[ThreadCaps]) {
    for t in threads {
        let keep = t.permitted;
        assert!(
            t.bounding == keep || t.no_new_privs,
            "thread {}: CapBnd {:#x} still holds {:#x} beyond what the daemon keeps, and \
             NoNewPrivs is 0: the daemon runs as uid 0, so an execve(2) from it regains every \
             capability of the bounding set. Want CapBnd {keep:#x} (PR_CAPBSET_DROP before \
             giving up CAP_SETPCAP) or no_new_privs: {t:x?}",
            t.tid,
            t.bounding,
            t.bounding & !keep
        );
    }
}

#[test]
pub(crate) fn after_dropping_capabilities_the_daemon_still_sees_other_users_listeners_in_other_namespaces()
 {
    if !tools::available(
        "after_dropping_capabilities_the_daemon_still_sees_other_users_listeners_in_other_namespaces",
        "busybox",
        &["true"],
        "busybox-static",
    ) {
        return;
    }
    // Listening before the daemon starts, so only the scan (which runs after the drop)
    // can find it: a listener of user nobody, alone in a namespace of its own.
    let port = free_port().to_string();
    let child = Command::new("unshare")
        .args(["--net", "--", "setpriv", "--reuid=65534", "--regid=65534"])
        .args([
            "--clear-groups",
            "--",
            "busybox",
            "httpd",
            "-f",
            "-p",
            &port,
        ])
        .spawn()
        .expect("unshare/setpriv (util-linux)");
    // Killed however the test ends: a panic must not leave it running (it holds the test
    // run's stdout and stderr open).
    let mut child = KillOnDrop(child);
    let pid = child.0.id();
    let hex_port = format!(":{:04X} ", port.parse::<u16>().unwrap());
    // The limit only catches a hang: busybox starts in milliseconds.
    let deadline = Instant::now() + HANG;
    // busybox httpd listens on [::] (tcp6) where IPv6 exists.
    let listening = || {
        ["tcp", "tcp6"].iter().any(|f| {
            std::fs::read_to_string(format!("/proc/{pid}/net/{f}"))
                .unwrap_or_default()
                .lines()
                .any(|l| l.contains(&hex_port) && l.split_whitespace().nth(3) == Some("0A"))
        })
    };
    while !listening() {
        assert!(Instant::now() < deadline, "busybox httpd did not listen");
        std::thread::sleep(Duration::from_millis(20));
    }
    let netns = std::fs::read_link(format!("/proc/{pid}/ns/net")).unwrap();
    let netns = netns
        .to_string_lossy()
        .trim_start_matches("net:[")
        .trim_end_matches(']')
        .to_owned();
    let daemon = Daemon::start();
    // By port and namespace: the port was free in this namespace only, and other
    // namespaces may have a listener on it.
    let labels = daemon.wait_for("the busybox listener", |s| {
        s.find(
            "backlogd_listen_backlog_granted",
            &[("port", &port), ("netns", &netns)],
        )
        .first()
        .map(|sample| sample.labels.clone())
    });
    // Found with only the runtime capabilities: the drop came before the scan that found
    // it, and every thread holds exactly the kept set.
    let threads = assert_runtime_caps(daemon.pid());
    let log = daemon.log();
    let line_of = |needle: &str| {
        log.lines()
            .position(|l| l.contains(needle))
            .unwrap_or_else(|| panic!("no {needle:?} in the log:\n{log}"))
    };
    assert!(
        line_of("dropped every capability") < line_of("rescan reconciled listeners"),
        "the scan ran before the drop:\n{log}"
    );
    child.0.kill().ok();
    child.0.wait().ok();
    eprintln!(
        "found by a scan with the runtime capabilities in all {} threads",
        threads.len()
    );
    assert_eq!(labels["netns"], netns, "{labels:?}");
    assert_eq!(
        labels["pid"],
        pid.to_string(),
        "owner not found: {labels:?}"
    );
    assert_eq!(labels["comm"], "busybox", "{labels:?}");
    // And what was given up stays given up.
    assert_no_way_back(&threads);
}

/// A child process killed and reaped when dropped.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        self.0.kill().ok();
        self.0.wait().ok();
    }
}
