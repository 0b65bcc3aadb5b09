//! The OCI image `cargo xtask image` builds: built twice to the same digest, loaded into
//! podman, started as a container the way xtask/src/image.rs documents (privileged, the
//! host's PID and network namespaces, bpffs and the cgroup hierarchy bound in), and serving
//! /metrics with the host's listeners: one the test held before the container started
//! (found by the startup scan, named by its pid through the host's PID namespace) and one
//! made afterwards in a network namespace of its own (seen by the eBPF hooks). The
//! container, the image and the pins it made are removed at the end, also on failure.

use std::{
    net::SocketAddr,
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use backlogd_tests::{
    Netns, Scrape,
    containers::{podman, podman_ok, text, xtask_image},
    daemon::{binary, hook_mode},
    http,
    sockets::Listener,
    tempdir::TempDir,
};
use socket2::{Domain, Socket, Type};

/// podman and runc must be there: `cargo xtask setup` installs both, and a test that
/// skipped here would prove nothing.
fn require(program: &str) {
    let ok = Command::new(program)
        .arg("--version")
        .output()
        .is_ok_and(|out| out.status.success());
    assert!(
        ok,
        "`{program} --version` does not run: the image test needs podman and runc (Debian \
         packages podman and runc). Fix: run `cargo xtask setup`"
    );
}

/// What `cargo xtask image` printed about one build.
struct Build {
    archive: PathBuf,
    digest: String,
}

/// `cargo xtask image --binary BIN --output ARCHIVE --reference REFERENCE`.
fn build_image(archive: &Path, reference: &str) -> Build {
    let stdout = xtask_image(archive, reference);
    let field = |name: &str| {
        stdout
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .unwrap_or_else(|| panic!("no {name:?} line in:\n{stdout}"))
            .trim()
            .to_owned()
    };
    let build = Build {
        archive: PathBuf::from(field("archive:")),
        digest: field("digest:"),
    };
    assert_eq!(build.archive, archive, "{stdout}");
    assert!(build.digest.starts_with("sha256:"), "{stdout}");
    build
}

/// Removes, when dropped (a failed assertion included), the container, the image and the
/// pins the daemon in the container left under the host's bpffs.
struct Cleanup {
    container: String,
    image: String,
    pin_dir: PathBuf,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        podman(&["rm", "--force", "--time", "2", &self.container]);
        podman(&["rmi", "--force", &self.image]);
        // The pins hold the daemon's links: with the daemon gone, unlinking them detaches
        // its programs.
        std::fs::remove_dir_all(&self.pin_dir).ok();
    }
}

/// `podman logs` of the container (stdout and stderr: the daemon logs to stderr).
fn logs(container: &str) -> String {
    text(&podman(&["logs", container]))
}

/// The address from the daemon's "serving metrics on http://ADDR/metrics" line, once it
/// is there; panics with the log if the container exits or 60 s pass first.
fn wait_serving(container: &str) -> SocketAddr {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let log = logs(container);
        if let Some(addr) = log
            .split("serving metrics on http://")
            .nth(1)
            .and_then(|rest| rest.split('/').next())
            .and_then(|a| a.parse().ok())
        {
            return addr;
        }
        let state = podman_ok(&["inspect", "--format", "{{.State.Status}}", container]);
        let state = String::from_utf8_lossy(&state.stdout).trim().to_owned();
        assert!(
            state == "running" || state == "created",
            "the container is {state} before serving; its log:\n{log}"
        );
        assert!(
            Instant::now() < deadline,
            "the container did not serve within 60 s; its log:\n{log}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Scrapes until `found` holds, for up to 20 s; the last scrape otherwise.
fn scrape_until(addr: SocketAddr, container: &str, found: impl Fn(&Scrape) -> bool) -> Scrape {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (status, body) = http::get(addr, "/metrics");
        assert_eq!(status, 200, "GET /metrics from the container: {body}");
        let scrape = Scrape::parse(&body);
        if found(&scrape) {
            return scrape;
        }
        assert!(
            Instant::now() < deadline,
            "the expected series did not appear within 20 s; last scrape:\n{}\nlog:\n{}",
            scrape.text,
            logs(container)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// This process's hard limit of `resource`.
fn hard_limit(resource: libc::__rlimit_resource_t) -> u64 {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit fills the struct it is given.
    assert_eq!(
        unsafe { libc::getrlimit(resource, &mut limit) },
        0,
        "getrlimit"
    );
    limit.rlim_max
}

#[test]
fn the_image_is_reproducible_and_serves_the_hosts_listeners_from_a_container() {
    require("podman");
    require("runc");
    let pid = std::process::id();
    let reference = format!("localhost/backlogd-image-test:{pid}");
    let container = format!("backlogd-image-test-{pid}");
    let pin_dir = PathBuf::from(format!("/sys/fs/bpf/backlogd-image-test-{pid}"));
    let cleanup = Cleanup {
        container: container.clone(),
        image: reference.clone(),
        pin_dir: pin_dir.clone(),
    };

    // Two builds of the same binary: the same bytes, so the same image digest.
    let dir = TempDir::new("image");
    let first = build_image(&dir.path().join("first.tar"), &reference);
    let second = build_image(&dir.path().join("second.tar"), &reference);
    assert_eq!(first.digest, second.digest, "two builds, two digests");
    let bytes = std::fs::read(&first.archive).unwrap();
    assert!(
        bytes == std::fs::read(&second.archive).unwrap(),
        "two builds with the same digest but different archives"
    );
    backlogd_tests::report(&format!(
        "image: {} bytes, manifest {}\n",
        bytes.len(),
        first.digest
    ));

    let loaded = podman_ok(&["load", "--input", first.archive.to_str().unwrap()]);
    let loaded = String::from_utf8_lossy(&loaded.stdout);
    assert!(loaded.contains(&reference), "podman load said: {loaded}");

    // What podman read from the image: the manifest digest, the entrypoint and command,
    // the metrics port, the labels.
    let inspect = podman_ok(&["image", "inspect", &reference]);
    let inspect: serde_json::Value = serde_json::from_slice(&inspect.stdout).unwrap();
    let image = &inspect[0];
    assert_eq!(image["Digest"], first.digest.as_str(), "{image:#}");
    let config = &image["Config"];
    assert_eq!(
        config["Entrypoint"],
        serde_json::json!(["/usr/bin/backlogd"]),
        "{image:#}"
    );
    assert_eq!(
        config["Cmd"],
        serde_json::json!(["run", "--config", "/etc/backlogd/backlogd.toml"]),
        "{image:#}"
    );
    assert!(
        config["ExposedPorts"].get("9851/tcp").is_some(),
        "{image:#}"
    );
    let version = Command::new(binary()).arg("--version").output().unwrap();
    let version = String::from_utf8_lossy(&version.stdout);
    let version = version.split_whitespace().nth(1).expect("backlogd VERSION");
    let labels = &config["Labels"];
    assert_eq!(labels["org.opencontainers.image.title"], "backlogd");
    assert_eq!(labels["org.opencontainers.image.version"], version);
    assert_eq!(
        labels["org.opencontainers.image.licenses"],
        "MIT OR Apache-2.0"
    );
    assert_eq!(image["Os"], "linux");
    assert_eq!(
        image["Architecture"],
        match std::env::consts::ARCH {
            "x86_64" => "amd64",
            "aarch64" => "arm64",
            other => other,
        }
    );

    // A listener of this process in the host's network namespace, open before the daemon
    // starts: the startup scan must find it.
    let before = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
    before
        .bind(&"127.0.0.1:0".parse::<SocketAddr>().unwrap().into())
        .unwrap();
    before.listen(77).unwrap();
    let before_port = before
        .local_addr()
        .unwrap()
        .as_socket()
        .unwrap()
        .port()
        .to_string();
    let host_netns = std::fs::metadata("/proc/self/ns/net")
        .unwrap()
        .ino()
        .to_string();

    // Why each flag: xtask/src/image.rs. The rlimits: podman's defaults (1048576) exceed the
    // hard limits podman holds on machines whose root lacks CAP_SYS_RESOURCE (the CI
    // machine: nofile 20000; nproc 32768, to which podman lowers its own), and runc then
    // fails to start the container. This process's own nofile limit, and nproc at most
    // 32768, are always allowed.
    let nofile = hard_limit(libc::RLIMIT_NOFILE);
    let nproc = hard_limit(libc::RLIMIT_NPROC).min(32_768);
    let pins = format!("--pin-dir={}", pin_dir.display());
    let mut run = vec![
        "run".to_owned(),
        "--detach".to_owned(),
        format!("--name={container}"),
        "--privileged".to_owned(),
        "--pid=host".to_owned(),
        "--network=host".to_owned(),
        "--cgroupns=host".to_owned(),
        "--volume=/sys/fs/bpf:/sys/fs/bpf".to_owned(),
        "--volume=/sys/fs/cgroup:/sys/fs/cgroup:ro".to_owned(),
        format!("--ulimit=nofile={nofile}:{nofile}"),
        format!("--ulimit=nproc={nproc}:{nproc}"),
        "--env=NO_COLOR=1".to_owned(),
        reference.clone(),
        // The image's own command and config, on a free port and with pins of this test's
        // own (the shipped config's /sys/fs/bpf/backlogd may be a real daemon's).
        "run".to_owned(),
        "--config=/etc/backlogd/backlogd.toml".to_owned(),
        "--listen=127.0.0.1:0".to_owned(),
        pins,
    ];
    if let Some(mode) = hook_mode() {
        run.push(format!("--hook-mode={mode}"));
    }
    podman_ok(&run.iter().map(String::as_str).collect::<Vec<_>>());
    let addr = wait_serving(&container);

    // A listener made after the daemon started, in a network namespace of its own: its
    // listen() reaches the daemon through the eBPF hooks, with the backlog it asked for.
    let ns = Netns::new();
    let after = Listener::open(&ns, "127.0.0.1:0", 33);
    let after_port = after.addr.port().to_string();
    let after_netns = ns.inode().to_string();

    let scrape = scrape_until(addr, &container, |s| {
        !s.find(
            "backlogd_listen_backlog_granted",
            &[("port", &before_port), ("netns", &host_netns)],
        )
        .is_empty()
            && !s
                .find(
                    "backlogd_listen_backlog_requested",
                    &[("port", &after_port), ("netns", &after_netns)],
                )
                .is_empty()
    });
    let granted = scrape.find(
        "backlogd_listen_backlog_granted",
        &[("port", &before_port), ("netns", &host_netns)],
    );
    assert_eq!(granted.len(), 1, "{granted:?}");
    assert_eq!(granted[0].value, 77.0, "{granted:?}");
    assert_eq!(granted[0].labels["address"], "127.0.0.1", "{granted:?}");
    // Named by its owner: the container shares the host's PID namespace.
    assert_eq!(granted[0].labels["pid"], pid.to_string(), "{granted:?}");
    let requested = scrape.value(
        "backlogd_listen_backlog_requested",
        &[("port", &after_port), ("netns", &after_netns)],
    );
    assert_eq!(requested, Some(33.0), "{}", scrape.text);
    assert_eq!(scrape.value("backlogd_pinned", &[]), Some(1.0), "pinned");
    let mode = scrape.hook_mode();
    backlogd_tests::report(&format!(
        "image: the container serves on {addr} in {mode} mode; listener {before_port} \
         (pid {pid}, host netns) and {after_port} (netns {after_netns}) reported\n"
    ));

    // `podman stop` sends SIGTERM: the daemon shuts down cleanly.
    podman_ok(&["stop", "--time", "10", &container]);
    let status = podman_ok(&["inspect", "--format", "{{.State.ExitCode}}", &container]);
    let log = logs(&container);
    assert_eq!(
        String::from_utf8_lossy(&status.stdout).trim(),
        "0",
        "exit status after podman stop; log:\n{log}"
    );
    assert!(log.contains("SIGTERM"), "{log}");
    drop(cleanup);
    let images = podman_ok(&[
        "images",
        "--quiet",
        "--filter",
        &format!("reference={reference}"),
    ]);
    assert!(
        images.stdout.iter().all(u8::is_ascii_whitespace),
        "the image is still there after the cleanup"
    );
}
