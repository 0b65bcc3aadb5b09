//! A Kubernetes pod run by containerd's CRI plugin, as the kubelet runs one (issue 21): a
//! pod sandbox on a CNI bridge, and in the pod's network namespace a container whose
//! listener's accept queue overflows. Its series are named by pod, namespace and container
//! (from the OCI bundle's annotations, which the CRI plugin writes), the drops stay exactly
//! equal to the pod namespace's TcpExt, and the listener's series and its info series
//! vanish when the pod is removed.
//!
//! Everything is the test's own: a containerd with its own config, root, state, runc root
//! and socket under a temp dir, and a CNI conf dir with a bridge conflist (host-local IPAM
//! with its own data dir, no masquerading, no gateway: nothing is routed to or from the
//! pod); Debian's plugins in `/usr/lib/cni`. Outside the temp dir, as on a node: the
//! shims' sockets (containerd 1.6's fixed `/run/containerd/s`), the pod's netns bind mount
//! (`/var/run/netns/cni-UUID`), CNI's result cache (`/var/lib/cni/results`), the pod's
//! cgroups and the bridge; all removed at the end, also when the test fails or containerd
//! dies. No registry is reachable, so the two images are
//! OCI archives the test builds and imports with `ctr`: the sandbox's pause image is
//! busybox-static sleeping, the app image a root of symlinks into /usr, which the
//! container's CRI `mounts` bind read-only from the host, so python3 runs the server.
//!
//! The CRI client (tests/cri/cri.py) is Python on Debian's python3-grpcio and
//! python3-protobuf, with the message classes protoc makes at test time from the
//! k8s.io/cri-api Go module's api.proto (the same proto the kubelet is built on). That
//! route was chosen over the `k8s-cri` crate (tonic, prost and their build script:
//! minutes of compiling on this suite's two CPUs for four calls) and over a Go helper
//! (grpc-go's compile, plus a go.mod to keep): every piece is a Debian package but the
//! proto, and the client is sixty lines that map a JSON request to any CRI method.
//!
//! containerd here: runc through `io.containerd.runc.v2` with cgroupfs
//! (`SystemdCgroup = false`: PID 1 is no systemd), the pod's cgroup parent as the kubelet's
//! cgroupfs driver names it (`/kubepods/besteffort/pod<UID>`), and
//! `restrict_oom_score_adj` (the sandbox container's oom_score_adj of -998 is refused
//! where the test runs without CAP_SYS_RESOURCE, as runc's `nsexec` reported:
//! "failed to update /proc/self/oom_score_adj: Permission denied").
//!
//! The listener belongs to the container (its process calls `listen()`); the test takes
//! a duplicate of it with pidfd_getfd(2) so the suite's exact burst and its kernel
//! readings (sock_diag by inode, TcpExt of the namespace) run unchanged in the pod's
//! namespace, joined with [`Netns::join`].
//!
//! The harness (containerd, its pods and containers, the images, the CRI client's
//! messages) is tests/src/containers/cri.rs and oci.rs.

use std::{
    path::Path,
    process::Command,
    time::{Duration, Instant},
};

use backlogd_tests::{
    Daemon, Netns, Scrape,
    containers::{
        cri::{Containerd, PYTHON, Pod, container_pid, containers_listener, cri_messages, uuid},
        oci::{app_image, pause_image},
    },
    figures::accept_queue_full_burst,
    kernel::{DROP_COUNTERS, exact_netns_counters},
    tempdir::TempDir,
    tools,
};
use serde_json::Value;

const POD: &str = "web-0";
const NAMESPACE: &str = "shop";
const CONTAINER: &str = "listener";
const PORT: u16 = 8080;

/// The listener in the container: backlog 4, never accepts.
const SERVER: &str = "import socket, time\n\
                      s = socket.socket()\n\
                      s.bind(('127.0.0.1', 8080))\n\
                      s.listen(4)\n\
                      time.sleep(1e9)\n";

/// The owner info series of `socket`, printed for the report.
fn owner_series(scrape: &Scrape, socket: &str) -> String {
    format!(
        "{:?}",
        scrape.find("backlogd_listener_owner_info", &[("socket", socket)])
    )
}

/// Waits up to `secs` for `f` to hold on a scrape; on a timeout returns the failure (with
/// the owner series seen last) instead of panicking, so that one run reports every check.
fn wait_soft(
    daemon: &Daemon,
    secs: u64,
    socket: &str,
    what: &str,
    f: impl Fn(&Scrape) -> bool,
) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let scrape = daemon.scrape();
        if f(&scrape) {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!(
                "{what}: not within {secs} s; owner info of socket {socket}: {}",
                owner_series(&scrape, socket)
            ));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn a_containerd_pods_listener_is_named_exact_and_gone_with_its_pod() {
    const TEST: &str = "a_containerd_pods_listener_is_named_exact_and_gone_with_its_pod";
    if !tools::available(TEST, "containerd", &["--version"], "containerd")
        || !tools::available(TEST, "ctr", &["--version"], "containerd")
        || !tools::available(TEST, "runc", &["--version"], "runc")
        || !tools::available(
            TEST,
            "test",
            &[
                "-x",
                "/usr/lib/cni/bridge",
                "-a",
                "-x",
                "/usr/lib/cni/host-local",
            ],
            "containernetworking-plugins",
        )
        || !tools::available(TEST, "protoc", &["--version"], "protobuf-compiler")
        || !tools::available(
            TEST,
            PYTHON,
            &["-c", "import grpc, google.protobuf"],
            "python3-grpcio and python3-protobuf",
        )
        || !tools::available(TEST, "go", &["version"], "golang-go (or a Go toolchain)")
        || !tools::available(TEST, "busybox", &["true"], "busybox-static")
    {
        return;
    }
    // The pause image holds /bin/busybox alone: it must be the static build.
    let ldd = Command::new("ldd").arg("/bin/busybox").output();
    assert!(
        !ldd.is_ok_and(|o| o.status.success()),
        "{TEST}: /bin/busybox is dynamically linked; the pause image needs busybox-static"
    );

    let dir = TempDir::new("cri");
    let messages = cri_messages(dir.path());
    let pause = pause_image(dir.path());
    let app = app_image(dir.path());
    let containerd = Containerd::start(dir.path(), messages);
    containerd.import(&pause);
    containerd.import(&app);
    containerd.wait_ready();

    // Rescans every second: the names come at the first rescan after the listener is
    // seen, and the series go at the first after the pod is.
    let daemon = Daemon::start_with(&["--rescan-interval", "1"]);
    let uid = uuid();
    let mut pod = Pod::run(&containerd, POD, NAMESPACE, &uid, &dir.path().join("logs"));
    let id = pod.start_container(CONTAINER, &[PYTHON, "-c", SERVER]);
    let pid = container_pid(&containerd, &id);
    let ns = Netns::join(format!("/proc/{pid}/ns/net"));
    let listener = containers_listener(&ns, &pod, CONTAINER, pid, PORT);
    let syncookies = ns.run(|| std::fs::read_to_string("/proc/sys/net/ipv4/tcp_syncookies"));
    assert_eq!(
        syncookies.expect("reading tcp_syncookies").trim(),
        "0",
        "the pod's sysctl"
    );
    daemon.wait_for_listener(listener.inode);
    let socket = listener.inode.to_string();
    let mut failures: Vec<String> = Vec::new();
    let mut soft = |result: Result<(), String>| {
        if let Err(e) = result {
            backlogd_tests::report(&format!("{TEST}: FAILED: {e}\n"));
            failures.push(e);
        }
    };

    // What the cgroup path says (`/kubepods/besteffort/pod<UID>/<ID>`): the container's id
    // and the pod's UID.
    let by_cgroup = [
        ("socket", socket.as_str()),
        ("container_id", id.as_str()),
        ("pod_uid", uid.as_str()),
    ];
    daemon.wait_for(
        "the container's id and the pod's UID on the info series",
        |s| {
            s.value("backlogd_listener_owner_info", &by_cgroup)
                .map(|_| ())
        },
    );
    backlogd_tests::report(&format!(
        "{TEST}: container {id} (pid {pid}) of pod {uid}: {}\n",
        owner_series(&daemon.scrape(), &socket)
    ));
    soft(wait_soft(
        &daemon,
        10,
        &socket,
        "container_runtime=\"containerd\" (the process's monitor is containerd's shim)",
        |s| {
            s.value(
                "backlogd_listener_owner_info",
                &[("socket", &socket), ("container_runtime", "containerd")],
            ) == Some(1.0)
        },
    ));
    let named = [
        ("socket", socket.as_str()),
        ("container_id", id.as_str()),
        ("pod_uid", uid.as_str()),
        ("container_name", CONTAINER),
        ("pod", POD),
        ("pod_namespace", NAMESPACE),
    ];
    soft(wait_soft(
        &daemon,
        10,
        &socket,
        "container_name, pod and pod_namespace from the bundle's annotations",
        |s| s.value("backlogd_listener_owner_info", &named) == Some(1.0),
    ));

    // The burst, in the pod's namespace: every drop backlogd counts is one the namespace's
    // TcpExt counts, and every SYN the clients sent is one it saw.
    let burst = accept_queue_full_burst(&daemon, &ns, &listener, listener.addr);
    backlogd_tests::report(&format!(
        "{TEST}: backlogd {:?}\n  pod namespace's TcpExt deltas {:?}\n  clients {:?}\n",
        burst.ours, burst.kernel, burst.clients
    ));
    let mut exact = burst.exact;
    // The pod namespace's own counters, exported alongside and read at scrape time.
    exact_netns_counters(&mut exact, &burst.scrape, &ns, &DROP_COUNTERS);
    exact.verify();

    // The pod's namespace is named as CNI's bind mount names it (`/var/run/netns/cni-...`).
    let netns = ns.inode().to_string();
    let netns_name = Path::new(pod.netns.as_deref().unwrap_or_default())
        .file_name()
        .and_then(|n| n.to_str())
        .expect("a netns path")
        .to_owned();
    soft(wait_soft(
        &daemon,
        10,
        &socket,
        &format!("backlogd_netns_info{{netns=\"{netns}\", name=\"{netns_name}\"}}"),
        |s| {
            s.value(
                "backlogd_netns_info",
                &[("netns", &netns), ("name", &netns_name)],
            ) == Some(1.0)
        },
    ));

    let (status, body) = daemon.get("/api/v1/listeners");
    assert_eq!(status, 200);
    let listeners: Value = serde_json::from_str(&body).expect("JSON");
    let ours = listeners
        .as_array()
        .expect("a list")
        .iter()
        .find(|l| l["inode"] == listener.inode)
        .unwrap_or_else(|| panic!("listener {} not in {body}", listener.inode))
        .clone();
    let names = &ours["names"];
    soft(
        (names["container"]["id"] == id.as_str()
            && names["pod_uid"] == uid.as_str()
            && names["container"]["name"] == CONTAINER
            && names["pod_name"] == POD
            && names["pod_namespace"] == NAMESPACE)
            .then_some(())
            .ok_or_else(|| format!("the API's names: {names}")),
    );

    // `top` and `doctor` name the pod and the container.
    let owner = format!("pod {NAMESPACE}/{POD}, containerd container {CONTAINER}");
    let top = backlogd_tests::top::Top::once(&daemon);
    let row = top.row(listener.addr).to_owned();
    soft(
        row.trim_end()
            .ends_with(&owner)
            .then_some(())
            .ok_or_else(|| format!("top's row does not end with {owner:?}: {row}")),
    );
    let doctor = daemon.cli(&["doctor"]);
    let subject = doctor
        .lines()
        .find(|l| l.contains(&format!("{} (netns", listener.addr)))
        .unwrap_or_else(|| panic!("doctor has no finding on {}:\n{doctor}", listener.addr))
        .to_owned();
    soft(
        subject
            .trim_end()
            .ends_with(&format!(" in {owner}"))
            .then_some(())
            .ok_or_else(|| {
                format!("doctor's subject does not end with \" in {owner}\": {subject}")
            }),
    );

    // The pod goes as the kubelet removes it: the listener closes with its container, and
    // its series and its info series go.
    drop(listener);
    drop(ns);
    pod.remove();
    daemon.wait_for("the removed pod's listener to vanish from /metrics", |s| {
        let label = format!("socket=\"{socket}\"");
        (!s.text.lines().any(|l| l.contains(&label))).then_some(())
    });

    assert!(
        failures.is_empty(),
        "{} check(s) failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
