//! What the daemon leaves behind in the kernel when it goes away.

use std::{collections::HashSet, process::Command, time::Duration};

use backlogd_common::names::map;
use backlogd_tests::Daemon;

/// IDs of the BPF programs process `pid` holds fds for (`prog_id:` in fdinfo).
fn programs_of(pid: u32) -> HashSet<u64> {
    let dir = format!("/proc/{pid}/fdinfo");
    std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{dir}: {e}"))
        .flatten()
        .filter_map(|fd| std::fs::read_to_string(fd.path()).ok())
        .filter_map(|info| {
            info.lines()
                .find_map(|l| l.strip_prefix("prog_id:"))
                .and_then(|id| id.trim().parse().ok())
        })
        .collect()
}

/// Every program the kernel has loaded, with its type.
fn loaded_programs() -> Vec<(u64, String)> {
    let out = Command::new("bpftool")
        .args(["--json", "prog", "show"])
        .output()
        .expect("bpftool (Debian package; `cargo xtask setup` installs it)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .split("{\"id\":")
        .skip(1)
        .filter_map(|prog| {
            let id = prog.split(',').next()?.parse().ok()?;
            let ty = prog.split("\"type\":\"").nth(1)?.split('"').next()?;
            Some((id, ty.to_owned()))
        })
        .collect()
}

#[test]
fn sigkill_leaves_no_program_attached_or_loaded() {
    let daemon = Daemon::start();
    let mode = daemon.scrape().hook_mode();
    let ours = programs_of(daemon.pid());
    let types: Vec<String> = loaded_programs()
        .into_iter()
        .filter(|(id, _)| ours.contains(id))
        .map(|(_, ty)| ty)
        .collect();
    // What each mode attaches: the cgroup_skb program (the one a non-link attachment would
    // keep alive), trampolines, or kprobes; and in no mode a classic tracepoint, whose
    // runs the kernel skips while any bpf() map syscall on the CPU was preempted
    // (backlogd-ebpf/src/syscall.rs).
    let expected = match mode.as_str() {
        "tracepoint" => "cgroup_skb",
        "fentry" => "tracing",
        "kprobe" => "kprobe",
        other => panic!("unknown hook mode {other}"),
    };
    assert!(
        types.iter().any(|t| t == expected) && !types.iter().any(|t| t == "tracepoint"),
        "backlogd's programs in {mode} mode: {types:?}"
    );

    daemon.kill_hard();
    // Links and programs are released as the dead process's fds are closed (the kernel
    // frees them after an RCU grace period): waited for, the limit only catching a hang.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let left: Vec<u64> = loaded_programs()
            .into_iter()
            .map(|(id, _)| id)
            .filter(|id| ours.contains(id))
            .collect();
        if left.is_empty() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "programs still loaded 60 s after SIGKILL: {left:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `backlogd_probe_missed_runs_total` is the kernel's `recursion_misses` summed over the
/// daemon's counting programs (those using its LISTENER_STATS map), present exactly when
/// the kernel reports that figure; `backlogd_figure_missed_runs_total{figure}` is the same
/// summed over the programs feeding each figure.
#[test]
fn missed_runs_metric_is_the_kernels_recursion_misses() {
    let daemon = Daemon::start();
    let counting = counting_programs(&daemon);
    assert!(
        !counting.is_empty(),
        "no program of the daemon uses LISTENER_STATS"
    );
    // The kernel's count can move while the test reads it (a program interrupted on its
    // CPU by an interrupt that runs it again, under the traffic of the tests running
    // beside this one): a scrape is compared only when the kernel's figure was the same
    // just before and just after it.
    for attempt in 1..=20 {
        let before = kernel_recursion_misses(&daemon, &counting);
        let per_program = daemon.program_misses();
        let scrape = daemon.scrape();
        let ours = scrape
            .value("backlogd_probe_missed_runs_total", &[])
            .map(|v| v as u64);
        let after = kernel_recursion_misses(&daemon, &counting);
        eprintln!("recursion misses: kernel {before:?} then {after:?}, backlogd {ours:?}");
        if before == after && per_program.total() == after.unwrap_or(0) {
            assert_eq!(ours, before);
            if before.is_some() {
                for figure in backlogd_common::names::figure::all() {
                    let kernel: u64 = per_program
                        .0
                        .iter()
                        .filter(|(id, _)| {
                            backlogd_tests::daemon::program_names(**id)
                                .iter()
                                .any(|p| backlogd_common::names::figure::feeds(p, figure))
                        })
                        .map(|(_, n)| n)
                        .sum();
                    assert_eq!(
                        scrape
                            .value("backlogd_figure_missed_runs_total", &[("figure", figure)])
                            .map(|v| v as u64),
                        Some(kernel),
                        "skipped runs feeding {figure}"
                    );
                }
            }
            return;
        }
        assert!(
            attempt < 20,
            "the kernel's count moved during each of 20 scrapes"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The ids of the daemon's programs that use its LISTENER_STATS map.
fn counting_programs(daemon: &Daemon) -> Vec<u64> {
    let json = backlogd_tests::bpf::bpftool;
    let ours = programs_of(daemon.pid());
    json(&["prog", "show"])
        .as_array()
        .expect("program list")
        .iter()
        .filter(|prog| ours.contains(&prog["id"].as_u64().expect("program id")))
        .filter(|prog| {
            prog["map_ids"].as_array().into_iter().flatten().any(|m| {
                let map = json(&["map", "show", "id", &m.to_string()]);
                map["name"].as_str() == Some(map::LISTENER_STATS)
            })
        })
        .map(|prog| prog["id"].as_u64().expect("program id"))
        .collect()
}

/// `recursion_misses` summed over `programs`, as the kernel reports it in the daemon's
/// fdinfo of each; `None` when it does not.
fn kernel_recursion_misses(daemon: &Daemon, programs: &[u64]) -> Option<u64> {
    let infos: Vec<String> = std::fs::read_dir(format!("/proc/{}/fdinfo", daemon.pid()))
        .expect("fdinfo")
        .flatten()
        .filter_map(|fd| std::fs::read_to_string(fd.path()).ok())
        .collect();
    let mut kernel: Option<u64> = None;
    for id in programs {
        let fdinfo = infos
            .iter()
            .find(|info| info.lines().any(|l| l == format!("prog_id:\t{id}")))
            .expect("fdinfo of our program");
        if let Some(misses) = fdinfo
            .lines()
            .find_map(|l| l.strip_prefix("recursion_misses:"))
            .and_then(|n| n.trim().parse::<u64>().ok())
        {
            *kernel.get_or_insert(0) += misses;
        }
    }
    kernel
}
