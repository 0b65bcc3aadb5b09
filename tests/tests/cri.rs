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

use std::{
    fs::File,
    io::Write as _,
    net::SocketAddr,
    os::{
        fd::{FromRawFd as _, OwnedFd},
        unix::fs::MetadataExt as _,
    },
    path::{Path, PathBuf},
    process::{Child, Command, Output, Stdio},
    time::{Duration, Instant},
};

use backlogd_tests::{
    Daemon, Netns, Scrape, figures::accept_queue_full_burst, kernel::tcp_ext, sockets::Listener,
    tempdir::TempDir, tools,
};
use serde_json::{Value, json};

/// The CRI API version whose api.proto the client is made from (runtime.v1, which
/// containerd 1.6 serves; newer fields are unknown to it and ignored).
const CRI_API: &str = "k8s.io/cri-api@v0.28.4";
const PYTHON: &str = "/usr/bin/python3";
const PAUSE_IMAGE: &str = "backlogd.test/pause:1";
const APP_IMAGE: &str = "backlogd.test/listener:1";
/// The CNI bridge on the host (at most 15 bytes), deleted at the end.
const BRIDGE: &str = "backlogd-cri0";
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

/// The test's containerd, stopped when dropped with everything it started: pods
/// (StopPodSandbox, RemovePodSandbox: containers, CNI DEL, netns), tasks, shims, runc
/// containers and mounts under its directory; its log is printed when the test fails.
struct Containerd {
    child: Child,
    dir: PathBuf,
    socket: PathBuf,
    /// Where api_pb2.py is.
    messages: PathBuf,
}

impl Containerd {
    fn start(dir: &Path, messages: PathBuf) -> Self {
        let d = dir.display();
        let cni = dir.join("cni");
        std::fs::create_dir_all(&cni).unwrap();
        let config = format!(
            r#"version = 2
root = "{d}/root"
state = "{d}/state"
disabled_plugins = [
  "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.zfs",
]
[grpc]
  address = "{d}/containerd.sock"
[ttrpc]
  address = "{d}/containerd.sock.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "{d}/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        BinaryName = "runc"
        Root = "{d}/runc"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{d}/cni"
    max_conf_num = 1
"#
        );
        std::fs::write(dir.join("config.toml"), config).unwrap();
        let conflist = json!({
            "cniVersion": "1.0.0",
            "name": "backlogd-test",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": BRIDGE,
                    "isGateway": false,
                    "ipMasq": false,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{ "subnet": "10.223.0.0/24" }]],
                        "dataDir": dir.join("ipam"),
                    },
                },
                { "type": "loopback" },
            ],
        });
        std::fs::write(cni.join("10-backlogd.conflist"), conflist.to_string()).unwrap();

        let log = File::create(dir.join("containerd.log")).unwrap();
        let child = Command::new("containerd")
            .arg("--config")
            .arg(dir.join("config.toml"))
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("starting containerd");
        let mut me = Self {
            child,
            dir: dir.to_owned(),
            socket: dir.join("containerd.sock"),
            messages,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if me.ctr(&["version"]).status.success() {
                break;
            }
            if let Ok(Some(status)) = me.child.try_wait() {
                panic!("containerd exited with {status}:\n{}", me.log());
            }
            assert!(
                Instant::now() < deadline,
                "containerd did not answer within 60 s:\n{}",
                me.log()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        me
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("containerd.log")).unwrap_or_default()
    }

    fn ctr(&self, args: &[&str]) -> Output {
        Command::new("ctr")
            .arg("--address")
            .arg(&self.socket)
            .args(["--namespace", "k8s.io"])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("running ctr")
    }

    fn import(&self, archive: &Path) {
        let out = self.ctr(&["images", "import", archive.to_str().unwrap()]);
        assert!(
            out.status.success(),
            "ctr images import {}: {}",
            archive.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// One CRI call (`method` of the RuntimeService or ImageService), the request and
    /// response as JSON with the proto's field names.
    fn try_cri(&self, method: &str, request: &Value) -> Result<Value, String> {
        let client = Path::new(env!("CARGO_MANIFEST_DIR")).join("cri/cri.py");
        let mut child = Command::new(PYTHON)
            .arg(client)
            .arg(&self.messages)
            .arg(&self.socket)
            .arg(method)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("running {PYTHON}: {e}"))?;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(request.to_string().as_bytes())
            .map_err(|e| e.to_string())?;
        let out = child.wait_with_output().map_err(|e| e.to_string())?;
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).trim().to_owned());
        }
        serde_json::from_slice(&out.stdout)
            .map_err(|e| format!("{method}: {e}: {}", String::from_utf8_lossy(&out.stdout)))
    }

    #[track_caller]
    fn cri(&self, method: &str, request: &Value) -> Value {
        self.try_cri(method, request).unwrap_or_else(|e| {
            panic!(
                "CRI {method} {request}: {e}\ncontainerd's log (tail):\n{}",
                tail(&self.log(), 40)
            )
        })
    }

    /// Waits until the CRI plugin says the runtime and the network (the CNI conf) are
    /// ready, as the kubelet does before it runs pods.
    fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let status = self.cri("Status", &json!({}));
            let conditions = status["status"]["conditions"].as_array().cloned();
            let ready = |kind: &str| {
                conditions
                    .iter()
                    .flatten()
                    .any(|c| c["type"] == kind && c["status"].as_bool() == Some(true))
            };
            if ready("RuntimeReady") && ready("NetworkReady") {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the CRI plugin is not ready within 60 s: {status}\n{}",
                tail(&self.log(), 40)
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }
}

impl Containerd {
    /// What outlives a containerd that did not clean up (it died, or could not answer):
    /// the containers runc still runs under this containerd's runc root, then its shims
    /// (`-address SOCKET`) and their sockets (in containerd 1.6's fixed
    /// `/run/containerd/s`, named in each bundle's `address` file).
    fn sweep(&self) {
        let root = self.dir.join("runc/k8s.io");
        if root.exists() {
            let list = Command::new("runc")
                .arg("--root")
                .arg(&root)
                .args(["list", "--quiet"])
                .output();
            if let Ok(list) = list {
                for id in String::from_utf8_lossy(&list.stdout).split_whitespace() {
                    let _ = Command::new("runc")
                        .arg("--root")
                        .arg(&root)
                        .args(["delete", "--force", id])
                        .output();
                }
            }
        }
        let bundles = self.dir.join("state/io.containerd.runtime.v2.task/k8s.io");
        let shim_sockets: Vec<String> = std::fs::read_dir(bundles)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|b| std::fs::read_to_string(b.path().join("address")).ok())
            .filter_map(|a| a.trim().strip_prefix("unix://").map(str::to_owned))
            .collect();
        let address = self.socket.to_string_lossy().into_owned();
        for pid in processes_with_arg(&address) {
            // SAFETY: plain kill(2).
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        }
        for socket in shim_sockets {
            let _ = std::fs::remove_file(socket);
        }
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        if std::thread::panicking() {
            backlogd_tests::report(&format!(
                "containerd's log (tail):\n{}\n",
                tail(&self.log(), 40)
            ));
        }
        // Pods the test did not remove (it failed first): as the kubelet removes them.
        if let Ok(pods) = self.try_cri("ListPodSandbox", &json!({})) {
            for pod in pods["items"].as_array().into_iter().flatten() {
                let id = json!({ "pod_sandbox_id": pod["id"] });
                let _ = self.try_cri("StopPodSandbox", &id);
                let _ = self.try_cri("RemovePodSandbox", &id);
            }
        }
        let tasks = self.ctr(&["tasks", "ls", "--quiet"]);
        for id in String::from_utf8_lossy(&tasks.stdout).split_whitespace() {
            let _ = self.ctr(&["tasks", "kill", "--all", "--signal", "SIGKILL", id]);
            let _ = self.ctr(&["tasks", "delete", "--force", id]);
        }
        // SAFETY: plain kill(2) of our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(10);
        while matches!(self.child.try_wait(), Ok(None)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.sweep();
        unmount_under(&self.dir);
        let _ = Command::new("ip")
            .args(["link", "delete", BRIDGE])
            .stderr(Stdio::null())
            .status();
    }
}

/// A pod sandbox, stopped and removed when dropped (even when the test fails), with the
/// cgroups the kubelet would have removed.
struct Pod<'a> {
    containerd: &'a Containerd,
    id: String,
    uid: String,
    config: Value,
    /// The sandbox's network namespace (`/var/run/netns/cni-UUID`, the bind mount the CRI
    /// plugin makes for CNI).
    netns: Option<String>,
    removed: bool,
}

impl<'a> Pod<'a> {
    fn run(containerd: &'a Containerd, uid: &str, log_dir: &Path) -> Self {
        std::fs::create_dir_all(log_dir).unwrap();
        let config = json!({
            "metadata": { "name": POD, "namespace": NAMESPACE, "uid": uid, "attempt": 0 },
            "hostname": POD,
            "log_directory": log_dir,
            "labels": { "app": "web" },
            "linux": {
                // The kubelet's cgroupfs driver's parent for a BestEffort pod.
                "cgroup_parent": format!("/kubepods/besteffort/pod{uid}"),
                // A safe sysctl a pod spec may set: the suite's burst needs syncookies off.
                "sysctls": { "net.ipv4.tcp_syncookies": "0" },
                "security_context": {
                    "namespace_options": { "network": "POD", "pid": "CONTAINER", "ipc": "POD" },
                },
            },
        });
        let answer = containerd.cri("RunPodSandbox", &json!({ "config": config }));
        let id = answer["pod_sandbox_id"]
            .as_str()
            .unwrap_or_else(|| panic!("RunPodSandbox answered {answer}"))
            .to_owned();
        let mut pod = Self {
            containerd,
            id,
            uid: uid.to_owned(),
            config,
            netns: None,
            removed: false,
        };
        pod.netns = Some(pod.netns_path());
        pod
    }

    /// Creates and starts the listener's container; its id.
    fn start_listener(&self) -> String {
        let config = json!({
            "metadata": { "name": CONTAINER, "attempt": 0 },
            "image": { "image": APP_IMAGE },
            "command": [PYTHON, "-c", SERVER],
            "log_path": "listener.log",
            "mounts": [{ "container_path": "/usr", "host_path": "/usr", "readonly": true }],
            "linux": {
                "security_context": {
                    "namespace_options": { "network": "POD", "pid": "CONTAINER", "ipc": "POD" },
                },
            },
        });
        let answer = self.containerd.cri(
            "CreateContainer",
            &json!({
                "pod_sandbox_id": self.id,
                "config": config,
                "sandbox_config": self.config,
            }),
        );
        let id = answer["container_id"]
            .as_str()
            .unwrap_or_else(|| panic!("CreateContainer answered {answer}"))
            .to_owned();
        self.containerd
            .cri("StartContainer", &json!({ "container_id": id }));
        id
    }

    /// The sandbox's network namespace, from its runtime spec.
    fn netns_path(&self) -> String {
        let status = self.containerd.cri(
            "PodSandboxStatus",
            &json!({ "pod_sandbox_id": self.id, "verbose": true }),
        );
        let info: Value = serde_json::from_str(status["info"]["info"].as_str().unwrap_or("{}"))
            .unwrap_or_else(|e| panic!("PodSandboxStatus info: {e}: {status}"));
        info["runtimeSpec"]["linux"]["namespaces"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|n| n["type"] == "network")
            .and_then(|n| n["path"].as_str())
            .unwrap_or_else(|| panic!("no network namespace path in the sandbox's spec: {info}"))
            .to_owned()
    }

    fn remove(&mut self) {
        let id = json!({ "pod_sandbox_id": self.id });
        self.containerd.cri("StopPodSandbox", &id);
        self.containerd.cri("RemovePodSandbox", &id);
        self.removed = true;
    }
}

impl Drop for Pod<'_> {
    fn drop(&mut self) {
        let id = json!({ "pod_sandbox_id": self.id });
        let removed = self.removed
            || (self.containerd.try_cri("StopPodSandbox", &id).is_ok()
                && self.containerd.try_cri("RemovePodSandbox", &id).is_ok());
        if !removed {
            // containerd could not (it died): its containers, and what its CRI plugin and
            // CNI leave on the host.
            self.containerd.sweep();
            if let Some(path) = &self.netns
                && let Ok(c) = std::ffi::CString::new(path.as_str())
            {
                // SAFETY: plain syscall on a NUL-terminated path.
                unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
                let _ = std::fs::remove_file(path);
            }
            for result in [
                format!("backlogd-test-{}-eth0", self.id),
                format!("cni-loopback-{}-lo", self.id),
            ] {
                let _ = std::fs::remove_file(Path::new("/var/lib/cni/results").join(result));
            }
        }
        // runc removed the containers' cgroups; the pod's are the kubelet's to remove.
        let mut roots = vec![PathBuf::from("/sys/fs/cgroup")];
        if let Ok(entries) = std::fs::read_dir("/sys/fs/cgroup") {
            roots.extend(entries.flatten().map(|e| e.path()));
        }
        for root in roots {
            for dir in [
                format!("kubepods/besteffort/pod{}", self.uid),
                "kubepods/besteffort".into(),
                "kubepods".into(),
            ] {
                // Only empty directories go: a real kubelet's stay.
                let _ = std::fs::remove_dir(root.join(dir));
            }
        }
    }
}

/// The main process of container `id` (ContainerStatus, verbose: containerd's info).
fn container_pid(containerd: &Containerd, id: &str) -> u32 {
    let status = containerd.cri(
        "ContainerStatus",
        &json!({ "container_id": id, "verbose": true }),
    );
    let state = &status["status"]["state"];
    assert_eq!(state, "CONTAINER_RUNNING", "{status}");
    let info: Value = serde_json::from_str(status["info"]["info"].as_str().unwrap_or("{}"))
        .unwrap_or_else(|e| panic!("ContainerStatus info: {e}: {status}"));
    info["pid"]
        .as_u64()
        .unwrap_or_else(|| panic!("no pid in ContainerStatus info: {info}")) as u32
}

/// The container's listener on 127.0.0.1:PORT, as a [`Listener`] holding a duplicate of
/// the container process's own socket (pidfd_getfd), once it listens.
fn containers_listener(ns: &Netns, containerd: &Containerd, pid: u32) -> Listener {
    let filter = format!("sport = :{PORT}");
    let deadline = Instant::now() + Duration::from_secs(60);
    let inode: u64 = loop {
        let out = ns.command("ss", &["-ltnHe", &filter]);
        if let Some(ino) = out
            .split_whitespace()
            .find_map(|w| w.strip_prefix("ino:"))
            .and_then(|i| i.parse().ok())
        {
            break ino;
        }
        assert!(
            Instant::now() < deadline,
            "the container's process {pid} does not listen on port {PORT} within 60 s; \
             its log:\n{}",
            std::fs::read_to_string(containerd.dir.join("logs/listener.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let target = format!("socket:[{inode}]");
    let fd: i32 = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("reading the container process's fds")
        .flatten()
        .find(|e| std::fs::read_link(e.path()).is_ok_and(|t| t.as_os_str() == target.as_str()))
        .and_then(|e| e.file_name().to_str()?.parse().ok())
        .unwrap_or_else(|| panic!("process {pid} holds no fd for {target}"));
    // SAFETY: plain syscalls; the fds they return are owned here and closed once.
    let socket = unsafe {
        let pidfd = libc::syscall(libc::SYS_pidfd_open, pid as libc::c_int, 0) as i32;
        assert!(
            pidfd >= 0,
            "pidfd_open({pid}): {}",
            std::io::Error::last_os_error()
        );
        let pidfd = OwnedFd::from_raw_fd(pidfd);
        let dup = libc::syscall(
            libc::SYS_pidfd_getfd,
            std::os::fd::AsRawFd::as_raw_fd(&pidfd),
            fd,
            0,
        ) as i32;
        assert!(
            dup >= 0,
            "pidfd_getfd({pid}, {fd}): {}",
            std::io::Error::last_os_error()
        );
        socket2::Socket::from(OwnedFd::from_raw_fd(dup))
    };
    let addr: SocketAddr = socket
        .local_addr()
        .expect("local_addr")
        .as_socket()
        .expect("inet socket");
    let ours = std::fs::metadata(format!(
        "/proc/self/fd/{}",
        std::os::fd::AsRawFd::as_raw_fd(&socket)
    ))
    .expect("stat socket fd")
    .ino();
    assert_eq!(ours, inode, "the duplicate is the container's socket");
    Listener {
        socket,
        addr,
        inode,
    }
}

/// The api.proto of [`CRI_API`] (from the Go module cache, downloaded if missing) compiled
/// by protoc into `dir`, for cri.py. Its gogoproto options (Go code generation only) are
/// left out: neither protoc's Python output nor the wire format has any use for them.
fn cri_messages(dir: &Path) -> PathBuf {
    let out = Command::new("go")
        .args(["mod", "download", "-json", CRI_API])
        .current_dir(dir)
        .env("GOFLAGS", "-mod=mod")
        .output()
        .expect("running go");
    let info: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    let module = info["Dir"].as_str().unwrap_or_else(|| {
        panic!(
            "`go mod download {CRI_API}` (which `cargo xtask setup` runs): {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    let proto = Path::new(module).join("pkg/apis/runtime/v1/api.proto");
    let text = std::fs::read_to_string(&proto)
        .unwrap_or_else(|e| panic!("reading {}: {e}", proto.display()));
    let messages = dir.join("cri-api");
    std::fs::create_dir_all(&messages).unwrap();
    let kept: String = text
        .lines()
        .filter(|l| !l.contains("gogoproto"))
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(messages.join("api.proto"), kept).unwrap();
    let out = Command::new("protoc")
        .arg("-I")
        .arg(&messages)
        .arg(format!("--python_out={}", messages.display()))
        .arg(messages.join("api.proto"))
        .output()
        .expect("running protoc");
    assert!(
        out.status.success(),
        "protoc {}: {}",
        proto.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    messages
}

/// An OCI image archive (`ctr images import` reads it) of one uncompressed layer made
/// from `rootfs`, named `name` (containerd takes the name from the index's
/// `io.containerd.image.name` annotation).
fn oci_archive(dir: &Path, name: &str, rootfs: &Path, config: Value) -> PathBuf {
    let stem = name.replace(['/', ':'], "_");
    let layout = dir.join(format!("{stem}.oci"));
    let blobs = layout.join("blobs/sha256");
    std::fs::create_dir_all(&blobs).unwrap();
    let blob = |bytes: &[u8], media_type: &str| -> (Value, String) {
        let digest = sha256(bytes);
        std::fs::write(blobs.join(&digest), bytes).unwrap();
        (
            json!({
                "mediaType": media_type,
                "digest": format!("sha256:{digest}"),
                "size": bytes.len(),
            }),
            digest,
        )
    };
    let layer = Command::new("tar")
        .args([
            "--sort=name",
            "--owner=0",
            "--group=0",
            "--numeric-owner",
            "--mtime=@0",
            "-C",
        ])
        .arg(rootfs)
        .args(["-cf", "-", "."])
        .output()
        .expect("running tar");
    assert!(
        layer.status.success(),
        "tar: {}",
        String::from_utf8_lossy(&layer.stderr)
    );
    let (layer, diff_id) = blob(&layer.stdout, "application/vnd.oci.image.layer.v1.tar");
    let image_config = json!({
        "architecture": "amd64",
        "os": "linux",
        "config": config,
        "rootfs": { "type": "layers", "diff_ids": [format!("sha256:{diff_id}")] },
    });
    let (config, _) = blob(
        image_config.to_string().as_bytes(),
        "application/vnd.oci.image.config.v1+json",
    );
    let manifest = json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": config,
        "layers": [layer],
    });
    let (mut manifest, _) = blob(
        manifest.to_string().as_bytes(),
        "application/vnd.oci.image.manifest.v1+json",
    );
    manifest["annotations"] = json!({
        "io.containerd.image.name": name,
        "org.opencontainers.image.ref.name": name.rsplit(':').next().unwrap(),
    });
    let index = json!({ "schemaVersion": 2, "manifests": [manifest] });
    std::fs::write(layout.join("index.json"), index.to_string()).unwrap();
    std::fs::write(
        layout.join("oci-layout"),
        r#"{"imageLayoutVersion":"1.0.0"}"#,
    )
    .unwrap();
    let archive = dir.join(format!("{stem}.tar"));
    let out = Command::new("tar")
        .arg("-C")
        .arg(&layout)
        .arg("-cf")
        .arg(&archive)
        .args(["oci-layout", "index.json", "blobs"])
        .output()
        .expect("running tar");
    assert!(
        out.status.success(),
        "tar: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    archive
}

fn sha256(bytes: &[u8]) -> String {
    let mut child = Command::new("sha256sum")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("running sha256sum");
    child.stdin.take().unwrap().write_all(bytes).unwrap();
    let out = child.wait_with_output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .expect("sha256sum's digest")
        .to_owned()
}

/// The pause image: busybox-static sleeping (a static binary: the sandbox container has
/// nothing else). SIGKILL stops it (CRI's StopPodSandbox kills the sandbox container).
fn pause_image(dir: &Path) -> PathBuf {
    let root = dir.join("pause-rootfs");
    std::fs::create_dir_all(root.join("bin")).unwrap();
    std::fs::copy("/bin/busybox", root.join("bin/busybox")).expect("copying /bin/busybox");
    oci_archive(
        dir,
        PAUSE_IMAGE,
        &root,
        json!({ "Entrypoint": ["/bin/busybox", "sleep", "2147483647"] }),
    )
}

/// The app image: a root of symlinks into /usr (merged-/usr Debian), which the
/// container's CRI mount binds from the host.
fn app_image(dir: &Path) -> PathBuf {
    let root = dir.join("app-rootfs");
    for d in ["usr", "proc", "sys", "dev", "etc", "tmp"] {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
    for (link, target) in [
        ("bin", "usr/bin"),
        ("sbin", "usr/sbin"),
        ("lib", "usr/lib"),
        ("lib64", "usr/lib64"),
    ] {
        std::os::unix::fs::symlink(target, root.join(link)).unwrap();
    }
    oci_archive(dir, APP_IMAGE, &root, json!({}))
}

/// Processes with `arg` as one of their arguments.
fn processes_with_arg(arg: &str) -> Vec<u32> {
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    procs
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| c.split(|&b| b == 0).any(|a| a == arg.as_bytes()))
        })
        .collect()
}

/// Lazily unmounts whatever is still mounted under `dir` (rootfs overlays, shm, a
/// sandbox's netns), deepest first, so removing the temp dir never walks into a mount.
fn unmount_under(dir: &Path) {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return;
    };
    let prefix = dir.to_string_lossy().into_owned();
    let mut points: Vec<&str> = info
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|p| p.starts_with(&prefix))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.len()));
    for p in points {
        if let Ok(c) = std::ffi::CString::new(p) {
            // SAFETY: plain syscall on a NUL-terminated path.
            unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
        }
    }
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

fn uuid() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/uuid")
        .expect("reading a random UUID")
        .trim()
        .to_owned()
}

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
    let mut pod = Pod::run(&containerd, &uid, &dir.path().join("logs"));
    let id = pod.start_listener();
    let pid = container_pid(&containerd, &id);
    let ns = Netns::join(format!("/proc/{pid}/ns/net"));
    let listener = containers_listener(&ns, &containerd, pid);
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
    let now = tcp_ext(&ns);
    let netns = ns.inode().to_string();
    for (metric, name) in [
        ("backlogd_netns_listen_overflows_total", "ListenOverflows"),
        ("backlogd_netns_listen_drops_total", "ListenDrops"),
        ("backlogd_netns_reqq_full_drops_total", "TCPReqQFullDrop"),
        (
            "backlogd_netns_reqq_full_do_cookies_total",
            "TCPReqQFullDoCookies",
        ),
    ] {
        let exported = burst
            .scrape
            .value(metric, &[("netns", &netns)])
            .unwrap_or_else(|| panic!("no {metric} for netns {netns}:\n{}", burst.scrape.text));
        exact.eq(&format!("{metric} vs {name}"), exported as u64, now[name]);
    }
    exact.verify();

    // The pod's namespace is named as CNI's bind mount names it (`/var/run/netns/cni-...`).
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
