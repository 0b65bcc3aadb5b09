//! A real podman container owns a listener whose accept queue overflows (issues 21, 36):
//! its series, its `top` row and doctor's finding name the container by the name podman
//! gave it, read from the command line of its `conmon` while podman's API service is not
//! running (most hosts never start it), then, for a second container, from the API once
//! it runs; and the drops stay exact.
//!
//! The container needs no image (none can be pulled here): `--rootfs` is a directory of
//! symlinks with the host's /usr mounted read-only, and python3 from it runs the server.
//! The test opens the listening socket in a namespace of its own and hands it to the
//! container (`--preserve-fds`), whose process calls `listen()` on it and then holds it
//! without ever accepting: backlogd's owner is the container's process (the last
//! `listen()`), and the test keeps a handle on the same socket for the suite's exact
//! burst and its kernel readings.
//!
//! podman here: runc (crun refuses this machine kind's hybrid cgroup layout), explicit
//! rlimits (podman's defaults exceed the sandbox's hard limits), the cgroupfs manager
//! (`/libpod_parent/libpod-ID`: no systemd as PID 1).

use std::{
    os::fd::AsRawFd as _,
    os::unix::process::CommandExt as _,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use backlogd_tests::{
    Daemon, Netns,
    containers::{Podman, podman_command, podman_ok, usr_rootfs},
    figures::accept_queue_full_burst,
    sockets::Listener,
    tempdir::TempDir,
    tools,
};

const SOCKET: &str = "/run/podman/podman.sock";

/// podman's API service on its rootful socket, unless one already answers there (a host
/// with podman.socket enabled); stopped when dropped.
struct ApiService(Option<Child>);

impl ApiService {
    fn answers() -> bool {
        Command::new("curl")
            .args(["-sf", "--unix-socket", SOCKET, "http://d/_ping"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }

    fn start() -> Self {
        let answers = Self::answers;
        if answers() {
            return Self(None);
        }
        std::fs::create_dir_all("/run/podman").expect("creating /run/podman");
        let child = podman_command()
            .args(["system", "service", "--time=0", &format!("unix://{SOCKET}")])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("starting `podman system service`");
        let mut service = Self(Some(child));
        let deadline = Instant::now() + Duration::from_secs(30);
        while !answers() {
            if let Some(Ok(Some(status))) = service.0.as_mut().map(Child::try_wait) {
                panic!("`podman system service` exited with {status} (its stderr is above)");
            }
            assert!(
                Instant::now() < deadline,
                "podman's API service did not answer on {SOCKET} within 30 s"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        service
    }
}

impl Drop for ApiService {
    fn drop(&mut self) {
        if let Some(child) = &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
            let _ = std::fs::remove_file(SOCKET);
        }
    }
}

#[test]
fn a_podman_container_is_named_in_metrics_top_and_doctor() {
    const TEST: &str = "a_podman_container_is_named_in_metrics_top_and_doctor";
    if !tools::available(TEST, "podman", &["--version"], "podman")
        || !tools::available(TEST, "runc", &["--version"], "runc")
    {
        return;
    }
    let name = format!("backlogd-test-{}", std::process::id());
    let dir = TempDir::new("podman");
    // A root file system of symlinks into /usr, which is mounted in.
    let root = dir.path().join("rootfs");
    usr_rootfs(&root);

    let ns = Netns::new();
    ns.sysctl("net.ipv4.tcp_syncookies", "0");
    let listener = Listener::open(&ns, "127.0.0.1:0", 4);
    // Rescans every second: a name comes at the first rescan after the API answers.
    let daemon = Daemon::start_with(&["--rescan-interval", "1"]);

    // The container's process listens again on the socket it is given (fd 3), as a
    // server restarted with an inherited socket does, then never accepts.
    let server = "import socket, time\n\
                  s = socket.socket(fileno=3)\n\
                  s.listen(4)\n\
                  open('/tmp/listening', 'w').close()\n\
                  time.sleep(1e9)\n";
    let fd = listener.socket.as_raw_fd();
    let mut run = podman_command();
    run.args(["run", "-d"])
        .args(["--name", &name, "--network", "none", "--preserve-fds", "1"])
        .args([
            "--ulimit",
            "nofile=1024:1024",
            "--ulimit",
            "nproc=1024:1024",
        ])
        .args(["-v", "/usr:/usr:ro", "--rootfs"])
        .arg(&root)
        .args(["python3", "-c", server])
        .stdin(Stdio::null());
    // SAFETY: dup2 and fcntl are async-signal-safe; this runs in the child between fork
    // and exec.
    unsafe {
        run.pre_exec(move || {
            // dup2 onto itself keeps close-on-exec: clear it then.
            let ok = if fd == 3 {
                libc::fcntl(3, libc::F_SETFD, 0) >= 0
            } else {
                libc::dup2(fd, 3) >= 0
            };
            if ok {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            }
        });
    }
    let out = run.output().expect("running podman run");
    assert!(
        out.status.success(),
        "podman run: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let id = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let _container = Podman::Container(name.clone());
    assert_eq!(id.len(), 64, "podman run printed {id:?}");

    // The container's listen() is the last: backlogd's owner is its process. With no
    // API service yet, the name comes from conmon's command line, with one line in the
    // log saying so however many rescans there are, and no warning.
    let socket = listener.inode.to_string();
    let want = [
        ("socket", socket.as_str()),
        ("container_runtime", "podman"),
        ("container_id", id.as_str()),
        ("container_name", name.as_str()),
    ];
    let api_was_running = ApiService::answers();
    if api_was_running {
        backlogd_tests::report(&format!(
            "{SOCKET} already answers (the host runs podman's API): the names without the \
             API were not checked by this test"
        ));
    } else {
        daemon.wait_for("the container's name from conmon on the info series", |s| {
            (s.value("backlogd_listener_owner_info", &want) == Some(1.0)).then_some(())
        });
        std::thread::sleep(Duration::from_secs(2));
        let log = daemon.log();
        let without = log.matches("its containers are named without it").count();
        assert_eq!(without, 1, "one line for an absent API:\n{log}");
        assert!(!log.contains("cannot ask the container runtime"), "{log}");
    }

    // With the API: a second container, listening on its own in a namespace of its own, is
    // named by it.
    let _api = ApiService::start();
    let second = format!("{name}-api");
    let server2 = "import socket, time\n\
                   s = socket.socket()\n\
                   s.bind(('127.0.0.1', 0))\n\
                   s.listen(4)\n\
                   time.sleep(1e9)\n";
    let out = podman_ok(&[
        "run",
        "-d",
        "--name",
        &second,
        "--network",
        "none",
        "--ulimit",
        "nofile=1024:1024",
        "--ulimit",
        "nproc=1024:1024",
        "-v",
        "/usr:/usr:ro",
        "--rootfs",
        root.to_str().expect("a UTF-8 path"),
        "python3",
        "-c",
        server2,
    ]);
    let _second = Podman::Container(second.clone());
    let id2 = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    daemon.wait_for("the second container's name from the API", |s| {
        let labels = [
            ("container_id", id2.as_str()),
            ("container_name", second.as_str()),
        ];
        (s.value("backlogd_listener_owner_info", &labels) == Some(1.0)).then_some(())
    });
    if !api_was_running {
        daemon.wait_for_log("the container runtime's API answers; its containers are named by it");
    }

    let burst = accept_queue_full_burst(&daemon, &ns, &listener, listener.addr);
    burst.exact.verify();

    let (status, json) = daemon.get("/api/v1/listeners");
    assert_eq!(status, 200);
    let listeners: serde_json::Value = serde_json::from_str(&json).expect("JSON");
    let ours = listeners
        .as_array()
        .expect("a list")
        .iter()
        .find(|l| l["inode"] == listener.inode)
        .unwrap_or_else(|| panic!("listener {} not in {json}", listener.inode));
    assert_eq!(ours["names"]["container"]["name"], name.as_str(), "{ours}");
    assert_eq!(ours["names"]["container"]["id"], id.as_str(), "{ours}");

    let owner = format!("podman container {name}");
    let top = backlogd_tests::top::Top::once(&daemon);
    let row = top.row(listener.addr);
    assert!(row.trim_end().ends_with(&owner), "{row}");
    let doctor = daemon.cli(&["doctor"]);
    // The subject line: `python3[PID] ADDR (netns N) in podman container NAME`.
    let subject = doctor
        .lines()
        .find(|l| l.contains(&format!("{} (netns", listener.addr)))
        .unwrap_or_else(|| panic!("doctor has no finding on {}:\n{doctor}", listener.addr));
    assert!(
        subject.trim_end().ends_with(&format!(" in {owner}")),
        "{subject}"
    );
}
