//! Pinned state (`run --pin-dir`): counts survive a daemon killed with SIGKILL and
//! restarted in the middle of a burst, equal to the kernel's count over the whole
//! interval; state pinned by another build is removed; `backlogd unpin` detaches.

use std::{
    path::Path,
    process::Command,
    time::{Duration, Instant},
};

use backlogd_common::names::{figure, map};
use backlogd_tests::{
    Daemon, Exact, Netns, caps,
    daemon::{ProgramMisses, run_to_end},
    doctor::{Doctor, evidence, kinds, set},
    kernel::{ListenCounters, tcp_ext},
    pins::{PinDir, unpin},
    sockets::{KernelQueue, Listener, connect_burst, fill_accept_queue, kernel_queue},
};

/// The hook mode daemons of this run use, and whether the kernel can pin it; if it cannot,
/// says so loudly: `the_daemon_starts_unpinned_where_the_kernel_cannot_pin` covers it.
fn pinnable(test: &str) -> bool {
    // The mode the run asks for, or the one `auto` picks here, found once.
    static MODE: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    let mode = MODE.get_or_init(|| {
        backlogd_tests::daemon::hook_mode().unwrap_or_else(|| Daemon::start().scrape().hook_mode())
    });
    let can = caps::can_pin(mode);
    if !can {
        backlogd_tests::marks::skip(&format!(
            "{test}: this kernel cannot pin {mode} mode's links (perf-event links need Linux \
             5.15+); the daemon runs unpinned there, which \
             the_daemon_starts_unpinned_where_the_kernel_cannot_pin checks"
        ));
    }
    can
}

/// Kernel link ids of every link pinned below `dir`.
fn pinned_link_ids(dir: &Path) -> Vec<u64> {
    let mut ids = Vec::new();
    for state in std::fs::read_dir(dir).expect("pin dir").flatten() {
        for link in std::fs::read_dir(state.path().join("links"))
            .expect("links dir")
            .flatten()
        {
            let out = Command::new("bpftool")
                .args(["--json", "link", "show", "pinned"])
                .arg(link.path())
                .output()
                .expect("running bpftool");
            let json: serde_json::Value =
                serde_json::from_slice(&out.stdout).expect("bpftool --json output");
            ids.push(json["id"].as_u64().expect("link id"));
        }
    }
    ids
}

fn link_exists(id: u64) -> bool {
    Command::new("bpftool")
        .args(["link", "show", "id", &id.to_string()])
        .output()
        .expect("running bpftool")
        .status
        .success()
}

fn drops(daemon: &Daemon, l: &Listener, reason: &str) -> u64 {
    let inode = l.inode.to_string();
    daemon
        .scrape()
        .value(
            "backlogd_listen_drops_total",
            &[("socket", &inode), ("reason", reason)],
        )
        .unwrap_or_else(|| panic!("no {reason} drops for socket {inode}")) as u64
}

/// Checks a burst against `listener` that ended (no SYN in flight) against the kernel's
/// counts since `since` (TcpExt, and the programs' skipped runs): accept-queue drops vs
/// ListenOverflows, all drops vs ListenDrops and the socket's sk_drops, SYNs received vs
/// those that arrived (the namespace's nft counter). Returns the kernel's counts and the
/// socket's queues.
fn verify_burst(
    daemon: &Daemon,
    ns: &Netns,
    listener: &Listener,
    since: (&std::collections::HashMap<String, u64>, &ProgramMisses),
    interval: &str,
) -> (ListenCounters, KernelQueue) {
    let (before, misses) = since;
    let arrived = ns.incoming_syns();
    let after = tcp_ext(ns);
    let kernel = ListenCounters::delta(before, &after);
    let queue = kernel_queue(ns, listener);
    let by_reason: Vec<(&str, u64)> = [
        "accept_queue_full",
        "syn_queue_full",
        "final_ack_overflow",
        "other",
    ]
    .iter()
    .map(|r| (*r, drops(daemon, listener, r)))
    .collect();
    let overflows = by_reason[0].1;
    let all: u64 = by_reason.iter().map(|(_, n)| n).sum();
    let syns = daemon
        .scrape()
        .value(
            "backlogd_listen_syns_received_total",
            &[("socket", &listener.inode.to_string())],
        )
        .expect("syns received") as u64;
    let mut exact = Exact::listener(daemon, ns, listener);
    exact
        .interval(daemon, misses)
        .evidence("interval", interval)
        .evidence("kernel TcpExt before", ListenCounters::of(before))
        .evidence("kernel TcpExt after", ListenCounters::of(&after))
        .evidence("socket (ss)", &queue)
        .evidence("backlogd drops", &by_reason)
        .eq_fed(
            "accept_queue_full vs ListenOverflows",
            &[figure::DROPS],
            overflows,
            kernel.listen_overflows,
        )
        .eq_fed(
            "all drops vs ListenDrops",
            &[figure::DROPS],
            all,
            kernel.listen_drops,
        )
        .eq_fed("all drops vs sk_drops", &[figure::DROPS], all, queue.drops)
        .eq_fed(
            "SYNs received vs SYNs that arrived (nft counter)",
            &[figure::SYNS_RECEIVED],
            syns,
            arrived,
        );
    exact.verify();
    (kernel, queue)
}

#[test]
fn counts_continue_across_kill_9_and_restart_during_a_burst() {
    if !pinnable("counts_continue_across_kill_9_and_restart_during_a_burst") {
        return;
    }
    let pins = PinDir::new("restart");
    let first = Daemon::start_with(&["--pin-dir", pins.arg()]);
    let ns = Netns::new();
    ns.sysctl("net.ipv4.tcp_syncookies", "0");
    // Backlog 2 and no accept(): three handshakes complete (one at a time, so that none of
    // the burst's SYNs meets a queue that is still filling, see syn_drops.rs), then every
    // SYN overflows at the SYN.
    let listener = Listener::open(&ns, "127.0.0.1:0", 2);
    first.wait_for_listener(listener.inode);
    ns.count_incoming_syns(listener.addr.port());
    let before = tcp_ext(&ns);
    // The pinned programs stay loaded across the restart, so the runs the kernel skipped
    // (kprobe mode: a SYN's softirq landing on a CPU inside one of a daemon's map
    // syscalls) are counted over the whole interval, as in every burst test.
    let misses = first.program_misses();
    let mut clients = fill_accept_queue(&ns, &listener, listener.addr, 3);

    // The burst: 10 new clients every 50 ms for 3 s, each retrying its SYN (1 s, 3 s).
    // The daemon is killed 1 s in and restarted 0.7 s later.
    let start = Instant::now();
    let mut first = Some(first);
    let mut during_downtime = None;
    let mut second = None;
    while start.elapsed() < Duration::from_secs(3) {
        clients.extend(connect_burst(&ns, listener.addr, 10));
        let t = start.elapsed();
        if t >= Duration::from_secs(1)
            && let Some(daemon) = first.take()
        {
            daemon.kill_hard();
            during_downtime = Some(tcp_ext(&ns));
        }
        if t >= Duration::from_millis(1700) && second.is_none() {
            let down = ListenCounters::delta(
                during_downtime.as_ref().expect("killed first"),
                &tcp_ext(&ns),
            );
            eprintln!("while no daemon ran, the kernel counted {down:?}");
            assert!(
                down.listen_overflows > 0,
                "the scenario needs drops while the daemon is down: {down:?}"
            );
            second = Some(Daemon::start_with(&["--pin-dir", pins.arg()]));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let second = second.expect("restarted");
    assert!(
        second.log().contains("adopted the pinned programs"),
        "the second daemon must adopt the pinned state; log:\n{}",
        second.log()
    );
    // Let the last SYN retransmissions happen, then close every client: no more SYNs.
    // (Clients made over 3 s retransmit at any moment, so their own statistics cannot
    // close the interval; the namespace's input counter does.)
    std::thread::sleep(Duration::from_millis(1200));
    drop(clients);
    std::thread::sleep(Duration::from_millis(100));
    second.wait_for_listener(listener.inode);
    let (kernel, queue) = verify_burst(
        &second,
        &ns,
        &listener,
        (&before, &misses),
        "whole burst, across SIGKILL and restart with pins",
    );
    assert!(kernel.listen_overflows >= 100, "{kernel:?}");
    assert_eq!(queue.recv_q, 3, "accept queue full: {queue:?}");

    // `backlogd unpin` detaches what the pins held.
    drop(second);
    let links = pinned_link_ids(pins.path());
    assert!(!links.is_empty(), "no pinned links under {}", pins.arg());
    assert!(
        links.iter().all(|&id| link_exists(id)),
        "pinned links alive"
    );
    unpin(pins.path());
    assert!(!pins.path().exists());
    // The kernel drops a pin's reference when bpffs frees the inode, after an RCU grace
    // period and then from a workqueue (5.10's bpf_free_inode, bpf_link_put in atomic
    // context): a link may outlive the unlink by a moment, never by seconds.
    let deadline = Instant::now() + Duration::from_secs(5);
    let alive = loop {
        let alive: Vec<u64> = links
            .iter()
            .copied()
            .filter(|&id| link_exists(id))
            .collect();
        if alive.is_empty() || Instant::now() > deadline {
            break alive;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(
        alive.is_empty(),
        "links still attached 5 s after unpin: {alive:?}"
    );
}

#[test]
fn a_request_the_previous_daemon_saw_stays_exact_after_a_restart() {
    if !pinnable("a_request_the_previous_daemon_saw_stays_exact_after_a_restart") {
        return;
    }
    let pins = PinDir::new("requests");
    let ns = Netns::new();
    ns.sysctl("net.core.somaxconn", "128");
    let first = Daemon::start_with(&["--pin-dir", pins.arg()]);
    let l = Listener::open(&ns, "127.0.0.1:0", 511);
    first.wait_for_listener(l.inode);
    first.kill_hard();
    // The first daemon read the LISTEN event; for the second the listener is older than
    // itself, and what it asked for comes from the kernel's pinned record of it.
    let second = Daemon::start_with(&["--pin-dir", pins.arg()]);
    let inode = l.inode.to_string();
    assert_eq!(
        second
            .scrape()
            .value("backlogd_listen_backlog_requested", &[("socket", &inode)]),
        Some(511.0)
    );
    let doctor = Doctor::run(&second, &[]);
    let found = doctor.about(&ns);
    assert_eq!(kinds(&found), set(&["backlog_clamped"]), "{found:#?}");
    let ev = evidence(found[0]);
    assert!(
        ev.contains("listen() backlog 511, sk_max_ack_backlog 128"),
        "{ev}"
    );
    // A daemon stopped normally leaves its pins too: the next one knows it as well.
    drop(second);
    let third = Daemon::start_with(&["--pin-dir", pins.arg()]);
    assert_eq!(
        third
            .scrape()
            .value("backlogd_listen_backlog_requested", &[("socket", &inode)]),
        Some(511.0)
    );
}

/// Attempts one daemon counted abandoned (its sweep, not a program, counts them) are still
/// counted by the daemon that adopts its pins, and attempts dropped while no daemon ran
/// are counted by the new one when their horizon passes; its recent figures (doctor's)
/// have only those.
#[test]
fn abandoned_attempts_counted_before_a_restart_stay_counted() {
    if !pinnable("abandoned_attempts_counted_before_a_restart_stay_counted") {
        return;
    }
    let pins = PinDir::new("abandoned");
    let args = ["--pin-dir", pins.arg(), "--client-impact-horizon", "2"];
    let first = Daemon::start_with(&args);
    let ns = Netns::new();
    ns.sysctl("net.ipv4.tcp_syncookies", "0");
    let listener = Listener::open(&ns, "127.0.0.1:0", 1);
    first.wait_for_listener(listener.inode);
    let fillers = fill_accept_queue(&ns, &listener, listener.addr, 2);
    // Three clients whose one SYN is dropped, closed at once: nothing more is sent, and
    // each attempt is abandoned when its 2 s horizon passes.
    let before = tcp_ext(&ns);
    drop(connect_burst(&ns, listener.addr, 3));
    let inode = listener.inode.to_string();
    let abandoned = |d: &Daemon| {
        d.scrape()
            .value(
                "backlogd_listen_connections_abandoned_total",
                &[("socket", &inode)],
            )
            .unwrap_or(0.0) as u64
    };
    first.wait_for("3 abandoned attempts", |s| {
        (s.value(
            "backlogd_listen_connections_abandoned_total",
            &[("socket", &inode)],
        ) == Some(3.0))
        .then_some(())
    });
    // Two more, dropped by the pinned programs while no daemon runs: in flight at the
    // restart, or expired before it; the next daemon's sweeps count them either way.
    drop(first);
    drop(connect_burst(&ns, listener.addr, 2));
    let kernel = ListenCounters::delta(&before, &tcp_ext(&ns));
    let second = Daemon::start_with(&args);
    assert!(
        second.log().contains("adopted the pinned programs"),
        "the second daemon must adopt the pinned state; log:\n{}",
        second.log()
    );
    second.wait_for_listener(listener.inode);
    second.attempts_resolved();
    let mut exact = Exact::listener(&second, &ns, &listener);
    exact
        .evidence("kernel", kernel)
        .eq("SYNs dropped: one per client", kernel.listen_drops, 5)
        .eq(
            "abandoned after the restart vs clients that never connected",
            abandoned(&second),
            5,
        );
    // doctor's recent figures run from the second daemon's start: the 3 the first one
    // counted are not in them, the 2 the second one counted are.
    let doctor = Doctor::run(&second, &[]);
    let finding = doctor.on("accept_queue_overflow", &ns, &listener);
    exact.evidence("doctor's finding", finding);
    let figure = |of: &str, k: &str| finding[of][k].as_u64().unwrap_or(u64::MAX);
    exact
        .eq(
            "doctor: abandoned in all vs clients that never connected",
            figure("client_impact", "abandoned"),
            5,
        )
        .eq(
            "doctor: abandoned since the second daemon started vs the clients it saw expire",
            figure("recent_client_impact", "abandoned"),
            2,
        )
        .eq(
            "doctor: its recent window runs from the second daemon's start",
            u64::from(finding["recent_client_impact"]["since_start"] == true),
            1,
        )
        .eq(
            "doctor's evidence quotes the recent figures",
            u64::from(evidence(finding).contains(
                " s since backlogd started: 0 connections delayed by a drop, 0 of them more \
                 than 0.5 s (a retry); 2 connection attempts never connected",
            )),
            1,
        );
    exact.verify();
    drop(fillers);
}

#[test]
fn state_pinned_by_another_build_is_removed_and_counting_starts_afresh() {
    if !pinnable("state_pinned_by_another_build_is_removed_and_counting_starts_afresh") {
        return;
    }
    let pins = PinDir::new("stale");
    let stale = pins.path().join("000000000000-tracepoint");
    std::fs::create_dir_all(stale.join("maps")).expect("mkdir on bpffs");
    std::fs::create_dir_all(stale.join("complete")).expect("mkdir on bpffs");
    let map_name = format!("stale{}", std::process::id() % 100_000);
    let out = Command::new("bpftool")
        .args(["map", "create"])
        .arg(stale.join("maps").join(map::LISTENER_STATS))
        .args(["type", "array", "key", "4", "value", "4", "entries", "1"])
        .args(["name", &map_name])
        .output()
        .expect("running bpftool");
    assert!(out.status.success(), "bpftool map create: {out:?}");

    let daemon = Daemon::start_with(&["--pin-dir", pins.arg()]);
    assert!(!stale.exists(), "the other build's state is still pinned");
    assert!(
        daemon
            .log()
            .contains("removing pinned state this daemon cannot adopt"),
        "log:\n{}",
        daemon.log()
    );
    let mode = daemon.scrape().hook_mode();
    let ours: Vec<String> = std::fs::read_dir(pins.path())
        .expect("pin dir")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(ours.len(), 1, "{ours:?}");
    assert!(ours[0].ends_with(&format!("-{mode}")), "{ours:?}");
    assert!(pins.path().join(&ours[0]).join("complete").is_dir());
    // The stale map is gone from the kernel, not just from bpffs.
    let maps = Command::new("bpftool")
        .args(["map", "show", "name", &map_name])
        .output()
        .expect("running bpftool");
    assert!(
        !maps.status.success() || maps.stdout.is_empty(),
        "stale map still exists: {}",
        String::from_utf8_lossy(&maps.stdout)
    );
}

#[test]
fn pin_dir_outside_bpffs_is_refused_with_the_fix() {
    let out = run_to_end(&["run", "--listen", "127.0.0.1:0", "--pin-dir", "/tmp"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("/tmp is not on a BPF filesystem") && err.contains("mount -t bpf"),
        "{err}"
    );
}

/// Pinning where the kernel allows it, and where it does not (kprobe mode before 5.15,
/// Debian 11): the shipped config sets pin_dir, and the daemon must start
/// with it anyway, say what it left out, and leave nothing pinned.
#[test]
fn the_daemon_starts_unpinned_where_the_kernel_cannot_pin() {
    let pins = PinDir::new("degrade");
    let unpinned = Daemon::start();
    assert_eq!(unpinned.scrape().value("backlogd_pinned", &[]), Some(0.0));
    let mode = unpinned.scrape().hook_mode();
    drop(unpinned);
    let daemon = Daemon::start_with(&["--pin-dir", pins.arg()]);
    let scrape = daemon.scrape();
    let warned = daemon.log().contains("running unpinned");
    if caps::can_pin(&mode) {
        assert_eq!(scrape.value("backlogd_pinned", &[]), Some(1.0));
        assert!(!warned, "{}", daemon.log());
        assert!(
            !pinned_link_ids(pins.path()).is_empty(),
            "nothing pinned in {mode} mode"
        );
    } else {
        assert_eq!(scrape.value("backlogd_pinned", &[]), Some(0.0));
        assert!(
            warned,
            "no warning that pin_dir was left out: {}",
            daemon.log()
        );
        assert!(
            daemon.log().contains("Linux 5.15"),
            "the warning names the kernel's limit: {}",
            daemon.log()
        );
        assert!(
            pinned_link_ids(pins.path()).is_empty(),
            "links pinned in {mode} mode"
        );
        drop(daemon);
        // The unit's load step hands programs over through pins only: it refuses a mode it
        // cannot pin, and names why, rather than leave the daemon nothing to adopt.
        let load = run_to_end(&[
            "load",
            "--config",
            "/dev/null",
            "--pin-dir",
            pins.arg(),
            "--hook-mode",
            &mode,
        ]);
        let said = String::from_utf8_lossy(&load.stderr);
        assert!(
            !load.status.success() && said.contains("cannot be pinned") && said.contains("5.15"),
            "backlogd load --hook-mode {mode}: {said}"
        );
        assert!(
            pinned_link_ids(pins.path()).is_empty(),
            "the refused load left links pinned"
        );
    }
}

/// The daemon's own CAP_SYS_ADMIN, from its CapEff (bit 21).
fn has_sys_admin(pid: u32) -> bool {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let eff = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .expect("CapEff");
    eff & (1 << 21) != 0
}

/// The runs of the daemon's programs the kernel skipped, as the kernel reports them in
/// its fdinfo (each program once; `None` where the kernel reports none), and as the daemon
/// serves them, read when the kernel's figure held still around the scrape.
fn skipped_runs(daemon: &Daemon) -> (Option<u64>, Option<u64>) {
    for _ in 0..20 {
        let before = daemon.program_misses();
        let served = daemon
            .scrape()
            .value("backlogd_probe_missed_runs_total", &[])
            .map(|v| v as u64);
        let after = daemon.program_misses();
        if before.0 == after.0 {
            let kernel = (!after.0.is_empty()).then(|| after.total());
            return (kernel, served);
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    panic!("the kernel's count of skipped runs moved during each of 20 scrapes");
}

/// The shipped unit grants no CAP_SYS_ADMIN, and without it the kernel's list of programs
/// cannot be walked (`BPF_PROG_GET_NEXT_ID`). A daemon that attached its programs itself
/// knows them without that walk: their skipped runs are served, equal to the kernel's. One
/// that adopted pins has only the walk: it serves no figure rather than a sum over no
/// programs (which read 0 whatever the kernel skipped), and says why. In tracepoint mode
/// whatever the run's mode: the programs are found the same way in every mode, and its
/// links pin on every kernel of the matrix (kprobe mode's need 5.15, and Debian's kernels
/// refuse its perf_event_open without CAP_SYS_ADMIN).
#[test]
fn without_cap_sys_admin_skipped_runs_are_the_kernels_or_not_served() {
    let pins = PinDir::new("no-sys-admin");
    let without = ["setpriv", "--bounding-set", "-sys_admin"];
    let args = ["--pin-dir", pins.arg(), "--hook-mode", "tracepoint"];
    let first = Daemon::start_wrapped(&without, &args);
    assert!(!has_sys_admin(first.pid()), "setpriv left CAP_SYS_ADMIN");
    let (kernel, served) = skipped_runs(&first);
    assert_eq!(
        served,
        kernel,
        "a daemon that loaded its programs: {}",
        first.log()
    );
    drop(first);
    let second = Daemon::start_wrapped(&without, &args);
    second.wait_for_log("adopted the pinned programs");
    let (_, served) = skipped_runs(&second);
    assert_eq!(served, None, "an adopting daemon without CAP_SYS_ADMIN");
    assert!(
        second.log().contains("cannot list the adopted programs"),
        "{}",
        second.log()
    );
}

/// The capabilities the shipped unit gives its daemon: CAP_DAC_READ_SEARCH (2),
/// CAP_SYS_PTRACE (19), CAP_BPF (39); none that loads or attaches.
const RUNTIME_CAPS: &str = "dac_read_search,+sys_ptrace,+bpf";

/// The daemon's uid and CapEff, from its /proc status.
fn uid_and_caps(pid: u32) -> (u32, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(str::trim)
            .unwrap_or_else(|| panic!("no {name} in {status}"))
            .to_owned()
    };
    let uid = field("Uid:")
        .split_whitespace()
        .nth(1)
        .and_then(|u| u.parse().ok())
        .expect("effective uid");
    let eff = u64::from_str_radix(&field("CapEff:"), 16).expect("CapEff");
    (uid, eff)
}

/// `setpriv` as the shipped unit runs the daemon: user nobody, with only the runtime
/// capabilities, in every set that could pass them on.
fn as_the_units_user() -> Vec<String> {
    let caps = format!("-all,+{RUNTIME_CAPS}");
    [
        "setpriv",
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
        &format!("--inh-caps={caps}"),
        &format!("--ambient-caps={caps}"),
        &format!("--bounding-set={caps}"),
    ]
    .map(str::to_owned)
    .to_vec()
}

/// The shipped unit's split: `backlogd load` as root loads, attaches and pins (with the
/// scan iterator's link and the programs beside the state), and the daemon, user nobody
/// with only CAP_BPF, CAP_SYS_PTRACE and CAP_DAC_READ_SEARCH, adopts that. A listener
/// opened before either, alone in a namespace the daemon cannot enter, is found (by the
/// pinned iterator: nothing else reaches that namespace without CAP_SYS_ADMIN), a burst
/// against it is counted exactly, and the runs the kernel skipped are served as the
/// kernel's. A second load keeps the state; a daemon without loading capabilities and no
/// state to adopt refuses to start and names the load step.
#[test]
fn a_load_step_as_root_hands_the_programs_to_a_daemon_without_loading_capabilities() {
    if !pinnable("a_load_step_as_root_hands_the_programs_to_a_daemon_without_loading_capabilities")
    {
        return;
    }
    // Without pin_dir there is nothing to hand the programs over through: refused before
    // anything is loaded.
    let unpinned = run_to_end(&["load", "--config", "/dev/null"]);
    let said = String::from_utf8_lossy(&unpinned.stderr);
    assert!(
        !unpinned.status.success() && said.contains("pin_dir is off"),
        "backlogd load without pin_dir: {said}"
    );
    let pins = PinDir::new("split");
    let ns = Netns::new();
    ns.sysctl("net.ipv4.tcp_syncookies", "0");
    let listener = Listener::open(&ns, "127.0.0.1:0", 2);
    let mode = backlogd_tests::daemon::hook_mode();
    let mut load = vec!["load", "--config", "/dev/null", "--pin-dir", pins.arg()];
    if let Some(mode) = &mode {
        load.extend(["--hook-mode", mode]);
    }
    let loaded = run_to_end(&load);
    let said = String::from_utf8_lossy(&loaded.stderr).into_owned();
    assert!(loaded.status.success(), "backlogd load: {said}");
    assert!(said.contains("loaded, attached and pinned"), "{said}");
    let links = pinned_link_ids(pins.path());
    assert!(!links.is_empty(), "no pinned links: {said}");
    // What the shipped unit's chown does for user backlogd.
    let chown = Command::new("chown")
        .args(["-R", "65534:65534", pins.arg()])
        .status()
        .expect("chown");
    assert!(chown.success());

    let wrapper = as_the_units_user();
    let wrapper: Vec<&str> = wrapper.iter().map(String::as_str).collect();
    let daemon = Daemon::start_wrapped(&wrapper, &["--pin-dir", pins.arg()]);
    daemon.wait_for_log("adopted the pinned programs");
    let (uid, eff) = uid_and_caps(daemon.pid());
    // CAP_BPF is given up where bpf(2) on the maps does not need it.
    let names = (1 << 2) | (1 << 19);
    let want = match caps::daemon_keeps_cap_bpf() {
        Some(true) => names | (1 << 39),
        Some(false) => names,
        None => eff,
    };
    assert_eq!((uid, eff), (65534, want), "the daemon's uid and CapEff");
    daemon.wait_for_listener(listener.inode);
    assert!(
        !daemon.log().contains("no scan iterator"),
        "the pinned iterator was not used: {}",
        daemon.log()
    );

    let before = tcp_ext(&ns);
    ns.count_incoming_syns(listener.addr.port());
    let misses = daemon.program_misses();
    let mut clients = fill_accept_queue(&ns, &listener, listener.addr, 3);
    clients.extend(connect_burst(&ns, listener.addr, 30));
    // Past the first SYN retransmission (1 s), then no more SYNs.
    std::thread::sleep(Duration::from_millis(1300));
    drop(clients);
    std::thread::sleep(Duration::from_millis(100));
    let (kernel, _) = verify_burst(
        &daemon,
        &ns,
        &listener,
        (&before, &misses),
        "a burst against pins a load step made",
    );
    assert!(kernel.listen_overflows >= 30, "{kernel:?}");
    // The programs the load step pinned: the daemon holds each and serves their skipped
    // runs (which their fdinfo reports from 5.12).
    let pinned_programs = std::fs::read_dir(pins.path())
        .expect("pin dir")
        .flatten()
        .flat_map(|state| std::fs::read_dir(state.path().join("programs")).expect("programs"))
        .flatten()
        .filter(|p| p.file_name() != "complete")
        .count();
    assert!(pinned_programs > 0, "no programs pinned: {said}");
    let held = std::fs::read_dir(format!("/proc/{}/fdinfo", daemon.pid()))
        .expect("fdinfo")
        .flatten()
        .filter(|fd| {
            std::fs::read_to_string(fd.path()).is_ok_and(|info| info.contains("\nprog_type:"))
        })
        .count();
    assert_eq!(held, pinned_programs, "programs the daemon holds vs pinned");
    let (kernel_skips, served) = skipped_runs(&daemon);
    assert_eq!(served, kernel_skips, "{}", daemon.log());

    // Loading again (a restart of the unit) keeps the state that is counting.
    let again = run_to_end(&load);
    let said = String::from_utf8_lossy(&again.stderr).into_owned();
    assert!(
        again.status.success() && said.contains("already holds"),
        "{said}"
    );
    assert_eq!(
        pinned_link_ids(pins.path()),
        links,
        "the links were replaced"
    );
    drop(daemon);

    // Nothing to adopt: the daemon without loading capabilities refuses, naming the step.
    let empty = PinDir::new("split-empty");
    std::fs::create_dir_all(empty.path()).expect("pin dir");
    let chown = Command::new("chown")
        .args(["-R", "65534:65534", empty.arg()])
        .status()
        .expect("chown");
    assert!(chown.success());
    let out = Command::new(wrapper[0])
        .args(&wrapper[1..])
        .arg(backlogd_tests::daemon::binary())
        .args(["run", "--config", "/dev/null", "--listen", "127.0.0.1:0"])
        .args(["--pin-dir", empty.arg()])
        .output()
        .expect("setpriv");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && said.contains("`backlogd load`"),
        "status {:?}: {said}",
        out.status
    );

    // Pins not handed over (root's, mode 0700) to a daemon without CAP_DAC_READ_SEARCH:
    // the error names the unit's chown and that capability, not only `sudo`.
    let unreachable = PinDir::new("split-unreachable");
    std::fs::create_dir_all(unreachable.path()).expect("pin dir");
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(unreachable.path(), std::fs::Permissions::from_mode(0o700))
        .expect("chmod");
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .args(["--inh-caps=-all,+bpf", "--ambient-caps=-all,+bpf"])
        .args(["--bounding-set=-all,+bpf"])
        .arg(backlogd_tests::daemon::binary())
        .args(["run", "--config", "/dev/null", "--listen", "127.0.0.1:0"])
        .args(["--pin-dir", unreachable.arg()])
        .output()
        .expect("setpriv");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success()
            && said.contains("cannot use the pin directory")
            && said.contains("chown")
            && said.contains("CAP_DAC_READ_SEARCH"),
        "status {:?}: {said}",
        out.status
    );
}
