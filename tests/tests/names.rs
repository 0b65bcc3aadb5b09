//! Names operators use for a listener's owner (issue 21): the systemd unit, the container
//! and the Kubernetes pod, read from the owning process's cgroup. A real server (Debian's
//! memcached) listens from cgroups laid out the way systemd, podman and the kubelet lay
//! theirs out, all below one cgroup of the test's own so that nothing of the host's tree is
//! touched; backlogd's info series and JSON API must name each.

use std::{
    path::Path,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use backlogd_tests::{Daemon, Netns, cgroups::Tree, sockets::listening_inode, tools};

const CONTAINER_ID: &str = "5e0c2d1e0b9a8f7e6d5c4b3a29181706f5e4d3c2b1a09f8e7d6c5b4a39281706";
const POD_UID: &str = "0a1b2c3d-4e5f-6789-abcd-ef0123456789";

/// memcached on 127.0.0.1:`port` in `ns`, moved into `cgroup` before it starts (the shell
/// writes its own pid to cgroup.procs, then becomes memcached).
struct Server(Child);

impl Server {
    fn start(ns: &Netns, cgroup: &Path, port: u16) -> Self {
        let script = format!(
            "echo $$ > {}/cgroup.procs && exec memcached -u nobody -l 127.0.0.1 -p {port} -U 0",
            cgroup.display()
        );
        let child = ns.run(move || {
            Command::new("sh")
                .args(["-c", &script])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::inherit())
                .spawn()
                .expect("starting sh")
        });
        Self(child)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The socket inode of the listener on `port` in `ns` (`ss -e` `ino:`), once it listens.
fn listener_inode(ns: &Netns, port: u16) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(ino) = listening_inode(ns, port) {
            return ino;
        }
        assert!(
            Instant::now() < deadline,
            "memcached not listening on {port}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn units_containers_and_pods_name_their_listeners() {
    const TEST: &str = "units_containers_and_pods_name_their_listeners";
    if !tools::available(TEST, "memcached", &["-h"], "memcached") {
        return;
    }
    let daemon = Daemon::start();
    let tree = Tree::new("names");
    let pod_slice = format!("kubepods-besteffort-pod{}.slice", POD_UID.replace('-', "_"));
    let cases: [(String, &[(&str, &str)]); 3] = [
        (
            "system.slice/backlogd-web.service".to_owned(),
            &[("unit", "backlogd-web.service")],
        ),
        (
            format!("machine.slice/libpod-{CONTAINER_ID}.scope/container"),
            &[
                ("container_runtime", "podman"),
                ("container_id", CONTAINER_ID),
            ],
        ),
        (
            format!(
                "kubepods.slice/kubepods-besteffort.slice/{pod_slice}/\
                 cri-containerd-{CONTAINER_ID}.scope"
            ),
            &[
                ("container_runtime", "containerd"),
                ("container_id", CONTAINER_ID),
                ("pod_uid", POD_UID),
            ],
        ),
    ];
    let mut servers = Vec::new();
    for (i, (path, expected)) in cases.iter().enumerate() {
        let ns = Netns::new();
        let port = 11311 + i as u16;
        let server = Server::start(&ns, &tree.cgroup(path), port);
        let inode = listener_inode(&ns, port);
        let socket = inode.to_string();
        let mut want: Vec<(&str, &str)> = vec![("socket", &socket)];
        want.extend_from_slice(expected);
        daemon.wait_for(&format!("owner names of {path}"), |s| {
            (s.value("backlogd_listener_owner_info", &want) == Some(1.0)).then_some(())
        });
        // The JSON API carries the same names.
        let (status, json) = daemon.get("/api/v1/listeners");
        assert_eq!(status, 200);
        let listeners: serde_json::Value = serde_json::from_str(&json).expect("JSON");
        let names = listeners
            .as_array()
            .expect("a list")
            .iter()
            .find(|l| l["inode"] == inode)
            .map(|l| l["names"].clone())
            .unwrap_or_else(|| panic!("listener {inode} not in {json}"));
        for (label, value) in *expected {
            let field = match *label {
                "unit" => &names["unit"],
                "container_runtime" => &names["container"]["runtime"],
                "container_id" => &names["container"]["id"],
                "pod_uid" => &names["pod_uid"],
                other => panic!("no API field for {other}"),
            };
            assert_eq!(field, value, "{label} of {path}: {names}");
        }
        servers.push((server, ns, port));
    }
    // top names the owner in its OWNER column (pod, container, or unit).
    let top = backlogd_tests::top::Top::once(&daemon);
    for ((_, _, port), owner) in servers.iter().zip([
        "backlogd-web.service".to_owned(),
        format!("podman container {}", &CONTAINER_ID[..12]),
        format!(
            "pod {POD_UID}, containerd container {}",
            &CONTAINER_ID[..12]
        ),
    ]) {
        let row = top.row(format!("127.0.0.1:{port}"));
        assert!(row.trim_end().ends_with(&owner), "{row}");
    }
    // A listener whose process sits in no unit, container or pod (this test's, in the
    // root cgroup here) still has its info series, with only `socket`: a join on socket
    // keeps it.
    let plain = Netns::new();
    let listener = backlogd_tests::sockets::Listener::open(&plain, "127.0.0.1:0", 16);
    daemon.wait_for_listener(listener.inode);
    let socket = listener.inode.to_string();
    let own_cgroup = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    let scrape = daemon.scrape();
    let series = scrape.find("backlogd_listener_owner_info", &[("socket", &socket)]);
    assert_eq!(series.len(), 1, "{series:?}");
    if own_cgroup.lines().any(|l| l == "0::/") {
        let labels: Vec<&String> = series[0].labels.keys().collect();
        assert_eq!(labels, ["socket"], "{series:?}");
    }
    drop(servers);
}

/// A network namespace made with `ip netns add NAME` is named on the page and in the API.
#[test]
fn a_named_network_namespace_is_named() {
    use std::os::unix::fs::MetadataExt as _;
    const TEST: &str = "a_named_network_namespace_is_named";
    if !tools::available(TEST, "memcached", &["-h"], "memcached") {
        return;
    }
    let name = format!("backlogd-test-names-{}", std::process::id());
    let ip = |args: &[&str]| {
        let out = Command::new("ip").args(args).output().expect("running ip");
        assert!(out.status.success(), "ip {args:?}: {out:?}");
    };
    ip(&["netns", "add", &name]);
    struct Named(String);
    impl Drop for Named {
        fn drop(&mut self) {
            let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
        }
    }
    let _named = Named(name.clone());
    let netns = std::fs::metadata(format!("/run/netns/{name}"))
        .expect("the namespace's bind mount")
        .ino()
        .to_string();
    let daemon = Daemon::start();
    // Killed however the test ends: a panic must not leave it running (it would hold the
    // test run's stderr, and any lock the run holds, open).
    struct Killed(std::process::Child);
    impl Drop for Killed {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let _server = Killed(
        Command::new("ip")
            .args([
                "netns",
                "exec",
                &name,
                "memcached",
                "-u",
                "nobody",
                "-l",
                "127.0.0.1",
            ])
            .args(["-p", "11330", "-U", "0"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .expect("starting memcached"),
    );
    daemon.wait_for(&format!("the name of namespace {netns}"), |s| {
        (s.value("backlogd_netns_info", &[("netns", &netns), ("name", &name)]) == Some(1.0))
            .then_some(())
    });
    let (status, json) = daemon.get("/api/v1/snapshot");
    assert_eq!(status, 200);
    let snapshot: serde_json::Value = serde_json::from_str(&json).expect("JSON");
    let ns = snapshot["namespaces"]
        .as_array()
        .expect("namespaces")
        .iter()
        .find(|n| n["netns"].as_u64().is_some_and(|n| n.to_string() == netns))
        .unwrap_or_else(|| panic!("namespace {netns} not in {json}"));
    assert_eq!(ns["name"], name.as_str(), "{ns}");
}
