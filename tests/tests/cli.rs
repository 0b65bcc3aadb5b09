//! The daemon's command line, HTTP surface and its errors, run as real processes.

use std::{process::Command, process::Output};

use backlogd_tests::{
    Daemon, Netns, caps,
    daemon::{binary, run_to_end},
    pins::PinDir,
    sockets::Listener,
    tempdir::TempDir,
};

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn run_help_documents_the_flags() {
    let out = run_to_end(&["run", "--help"]);
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for flag in ["--listen", "--btf", "--log"] {
        assert!(help.contains(flag), "{flag} missing from:\n{help}");
    }
}

#[test]
fn unprivileged_user_is_told_what_privileges_are_needed() {
    let out = as_nobody(&["run", "--listen", "127.0.0.1:0"]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(err.contains("needs root"), "{err}");
    assert!(
        err.contains("CAP_BPF") && err.contains("CAP_PERFMON"),
        "{err}"
    );
    assert!(err.contains("`sudo backlogd run`"), "{err}");
    // The load step's own fix names the load step.
    let out = as_nobody(&["load", "--listen", "127.0.0.1:0"]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(err.contains("`sudo backlogd load`"), "{err}");
}

/// backlogd with `args` as nobody: setpriv changes the uid away from 0, which clears the
/// effective capabilities.
fn as_nobody(args: &[&str]) -> std::process::Output {
    Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(binary())
        .args(args)
        .output()
        .expect("running setpriv (util-linux)")
}

#[test]
fn missing_btf_names_the_kernel_option_and_the_flag() {
    let out = run_to_end(&[
        "run",
        "--listen",
        "127.0.0.1:0",
        "--btf",
        "/nonexistent/vmlinux",
    ]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(err.contains("CONFIG_DEBUG_INFO_BTF"), "{err}");
    assert!(err.contains("--btf FILE"), "{err}");
}

#[test]
fn garbage_btf_is_rejected_with_the_path() {
    let path = std::env::temp_dir().join(format!("backlogd-bad-btf-{}", std::process::id()));
    std::fs::write(&path, b"not BTF at all").unwrap();
    let out = run_to_end(&[
        "run",
        "--listen",
        "127.0.0.1:0",
        "--btf",
        path.to_str().unwrap(),
    ]);
    std::fs::remove_file(&path).ok();
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("cannot read BTF from") && err.contains(path.to_str().unwrap()),
        "{err}"
    );
}

#[test]
fn address_in_use_names_the_fix() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let out = run_to_end(&["run", "--listen", &addr]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("already in use") && err.contains("--listen"),
        "{err}"
    );
}

#[test]
fn exposition_passes_promtool_and_unknown_paths_are_404() {
    let daemon = Daemon::start();
    let ns = Netns::new();
    ns.sysctl("net.core.somaxconn", "128");
    let listener = Listener::open(&ns, "127.0.0.1:0", 511);
    let inode = listener.inode.to_string();
    let scrape = daemon.wait_for("a listener series", |s| {
        (!s.find("backlogd_listen_backlog_granted", &[("socket", &inode)])
            .is_empty())
        .then(|| s.clone())
    });

    let mut promtool = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("promtool (Debian package prometheus; `cargo xtask setup` installs it)");
    use std::io::Write as _;
    promtool
        .stdin
        .take()
        .unwrap()
        .write_all(scrape.text.as_bytes())
        .unwrap();
    let out = promtool.wait_with_output().unwrap();
    assert!(
        out.status.success() && out.stdout.is_empty() && out.stderr.is_empty(),
        "promtool check metrics: {}\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    assert_eq!(daemon.get("/healthz"), (200, "ok\n".to_string()));
    assert_eq!(daemon.get("/nope").0, 404);
    let (status, json) = daemon.get("/api/v1/listeners");
    assert_eq!(status, 200);
    assert!(json.contains(&format!("\"inode\":{inode}")), "{json}");
}

/// Whether BPF trampolines work here, from the daemon's API (the fact behind the fentry
/// probe).
fn bpf_tracing_loads() -> bool {
    let daemon = Daemon::start_with(&["--hook-mode", "tracepoint"]);
    let (status, json) = daemon.get("/api/v1/snapshot");
    assert_eq!(status, 200, "{json}");
    let v: serde_json::Value = serde_json::from_str(&json).expect("API JSON");
    v["kernel"]["trampolines"]
        .as_bool()
        .unwrap_or_else(|| panic!("no kernel.trampolines in the API: {json}"))
}

/// Which of fentry and kprobe this kernel allows, as backlogd reports it.
fn kernel_support() -> [(&'static str, bool); 2] {
    let daemon = Daemon::start_with(&["--hook-mode", "tracepoint"]);
    let scrape = daemon.scrape();
    ["fentry", "kprobe"].map(|mode| {
        let v = scrape.value("backlogd_kernel_hook_supported", &[("mode", mode)]);
        (
            mode,
            v.unwrap_or_else(|| panic!("no support figure for {mode}")) == 1.0,
        )
    })
}

#[test]
fn hook_mode_the_kernel_lacks_is_refused_with_the_fix() {
    let mut refused = 0;
    for (mode, supported) in kernel_support() {
        if supported {
            continue; // it starts: the drop and queue suites run in that mode
        }
        let out = run_to_end(&["run", "--listen", "127.0.0.1:0", "--hook-mode", mode]);
        assert!(!out.status.success(), "--hook-mode {mode} started");
        let err = stderr(&out);
        assert!(
            err.contains(&format!("--hook-mode {mode}")) && err.contains("--hook-mode auto"),
            "{err}"
        );
        // fentry mode needs trampolines and nothing newer: a kernel that has them runs it
        // whatever its version (5.5 to 5.16 have no bpf_get_func_ret, which its fexit
        // programs do without), so a refusal is for lacking them, and says so.
        if mode == "fentry" {
            assert!(
                !bpf_tracing_loads(),
                "fentry refused where trampolines work: {err}"
            );
            assert!(err.contains("trampoline"), "{err}");
        }
        refused += 1;
    }
    if refused == 0 {
        // The matrix does not run this test on kernels that allow every mode (the plan
        // says so); anywhere else a kernel that refuses nothing is a skip, judged.
        backlogd_tests::marks::skip("this kernel allows every hook mode: nothing to refuse");
    }
}

#[test]
fn hook_mode_in_use_and_kernel_support_are_exported() {
    let support = kernel_support();
    let kprobe_pmu = std::path::Path::new("/sys/bus/event_source/devices/kprobe").exists();
    assert_eq!(support[1], ("kprobe", kprobe_pmu));
    // In the kernel matrix, the capability table says what this Debian kernel can do.
    if let Some(stated) = caps::stated() {
        assert_eq!(
            support,
            [("fentry", stated.fentry), ("kprobe", stated.kprobe)],
            "backlogd's probe vs the matrix's capability table"
        );
    }
    // auto: the best mode the kernel allows.
    let best = match support {
        [(_, true), _] => "fentry",
        [_, (_, true)] => "kprobe",
        _ => "tracepoint",
    };
    let daemon = Daemon::start_with(&["--hook-mode", "auto"]);
    let scrape = daemon.scrape();
    assert_eq!(
        scrape.value("backlogd_hook_mode", &[("mode", best)]),
        Some(1.0)
    );
    // The choice is logged too.
    assert!(
        daemon.log().contains(&format!("mode=\"{best}\"")),
        "{}",
        daemon.log()
    );
}

/// The packaged configuration (deploy/config/backlogd.toml: `pin_dir` set, everything else
/// at its default, `auto` hook mode) starts on every kernel of the matrix, pinned where the
/// kernel can pin the chosen mode and otherwise unpinned with a warning. Only its pin
/// directory is swapped for a test's own, so no test touches a production daemon's pins.
#[test]
fn hook_mode_auto_starts_with_the_shipped_config_and_says_what_it_left_out() {
    let pins = PinDir::new("shipped");
    let shipped = include_str!("../../deploy/config/backlogd.toml");
    let line = "pin_dir = \"/sys/fs/bpf/backlogd\"";
    assert!(
        shipped.contains(line),
        "the shipped config no longer sets {line}"
    );
    let dir = TempDir::new("shipped-config");
    let config = dir.write(
        "backlogd.toml",
        &shipped.replace(line, &format!("pin_dir = \"{}\"", pins.arg())),
    );
    let config = config.to_str().expect("UTF-8 path");
    let daemon = Daemon::start_with(&[
        "--config",
        config,
        "--listen",
        "127.0.0.1:0",
        "--hook-mode",
        "auto",
    ]);
    let scrape = daemon.scrape();
    let mode = scrape.hook_mode();
    let pinned = caps::can_pin(&mode);
    assert_eq!(
        scrape.value("backlogd_pinned", &[]),
        Some(f64::from(u8::from(pinned))),
        "{mode} mode; {}",
        daemon.log()
    );
    assert_eq!(
        daemon.log().contains("running unpinned"),
        !pinned,
        "{}",
        daemon.log()
    );
}

/// Under systemd, stderr is the journal stream named by `JOURNAL_STREAM` (its dev:inode):
/// lines then carry an sd-daemon priority prefix and no colour codes, so journald files a
/// warning as a warning and an error as an error (the PID-1 guest checks it under real
/// systemd). A file stands in for the stream here.
#[test]
fn log_lines_on_the_journal_stream_carry_priorities_and_no_colour() {
    use std::os::unix::fs::MetadataExt as _;
    let dir = TempDir::new("journal-stream");
    let path = dir.write("stderr", "");
    let meta = std::fs::metadata(&path).unwrap();
    // A daemon that logs a line, then fails (its pin directory is not on bpffs).
    let not_bpffs = dir.path().join("pins");
    let failing = |journal_stream: &str| {
        let mut cmd = Command::new(binary());
        cmd.args(["run", "--config", "/dev/null", "--listen", "127.0.0.1:0"])
            .arg("--pin-dir")
            .arg(&not_bpffs)
            .env("JOURNAL_STREAM", journal_stream);
        cmd
    };
    let out = failing(&format!("{}:{}", meta.dev(), meta.ino()))
        .stderr(std::fs::File::options().append(true).open(&path).unwrap())
        .output()
        .expect("running backlogd");
    assert!(!out.status.success());
    let log = std::fs::read_to_string(&path).unwrap();
    assert!(
        !log.contains('\x1b'),
        "colour codes on the journal stream: {log:?}"
    );
    let lines: Vec<&str> = log.lines().collect();
    assert!(
        lines[0].starts_with("<6>") && lines[0].contains("configuration"),
        "{log}"
    );
    let last = lines.last().unwrap();
    assert!(
        last.starts_with("<3>backlogd: error:") && last.contains("not on a BPF filesystem"),
        "{log}"
    );
    // Not the journal (the variable names another stream): a terminal's format.
    let other = failing("1:1").output().expect("running backlogd");
    let text = stderr(&other);
    assert!(
        !text.contains("<6>") && !text.contains("<3>") && text.contains("INFO"),
        "{text}"
    );
}
