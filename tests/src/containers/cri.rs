//! containerd's CRI plugin as a kubelet drives it (tests/tests/cri.rs, issue 21): a
//! containerd of the test's own (config, root, state, runc root and socket under a temp
//! dir, a CNI conf dir with a bridge conflist), pod sandboxes on that bridge and containers
//! in them, all removed when dropped, also when the test fails or containerd dies.
//!
//! The CRI client (tests/cri/cri.py) is Python on Debian's python3-grpcio and
//! python3-protobuf, with the message classes protoc makes at test time ([`cri_messages`])
//! from the k8s.io/cri-api Go module's api.proto.

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

use serde_json::{Value, json};

use crate::{
    Netns,
    sockets::{Listener, listening_inode},
};

/// The CRI API version whose api.proto the client is made from (runtime.v1, which
/// containerd 1.6 serves; newer fields are unknown to it and ignored).
pub const CRI_API: &str = "k8s.io/cri-api@v0.28.4";
pub const PYTHON: &str = "/usr/bin/python3";
pub const PAUSE_IMAGE: &str = "backlogd.test/pause:1";
pub const APP_IMAGE: &str = "backlogd.test/listener:1";
/// The CNI bridge on the host (at most 15 bytes), deleted at the end.
const BRIDGE: &str = "backlogd-cri0";

/// The test's containerd, stopped when dropped with everything it started: pods
/// (StopPodSandbox, RemovePodSandbox: containers, CNI DEL, netns), tasks, shims, runc
/// containers and mounts under its directory; its log is printed when the test fails.
pub struct Containerd {
    child: Child,
    dir: PathBuf,
    socket: PathBuf,
    /// Where api_pb2.py is.
    messages: PathBuf,
}

impl Containerd {
    /// containerd with its config, state and CNI conf under `dir`, once it answers;
    /// `messages` is where [`cri_messages`] put the CRI client's message classes.
    pub fn start(dir: &Path, messages: PathBuf) -> Self {
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

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("containerd.log")).unwrap_or_default()
    }

    pub fn ctr(&self, args: &[&str]) -> Output {
        Command::new("ctr")
            .arg("--address")
            .arg(&self.socket)
            .args(["--namespace", "k8s.io"])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("running ctr")
    }

    pub fn import(&self, archive: &Path) {
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
    pub fn try_cri(&self, method: &str, request: &Value) -> Result<Value, String> {
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
    pub fn cri(&self, method: &str, request: &Value) -> Value {
        self.try_cri(method, request).unwrap_or_else(|e| {
            panic!(
                "CRI {method} {request}: {e}\ncontainerd's log (tail):\n{}",
                tail(&self.log(), 40)
            )
        })
    }

    /// Waits until the CRI plugin says the runtime and the network (the CNI conf) are
    /// ready, as the kubelet does before it runs pods.
    pub fn wait_ready(&self) {
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
            crate::report(&format!(
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
pub struct Pod<'a> {
    containerd: &'a Containerd,
    id: String,
    uid: String,
    config: Value,
    /// The sandbox's network namespace (`/var/run/netns/cni-UUID`, the bind mount the CRI
    /// plugin makes for CNI).
    pub netns: Option<String>,
    /// Where the CRI plugin writes its containers' logs (`NAME.log`).
    log_dir: PathBuf,
    removed: bool,
}

impl<'a> Pod<'a> {
    /// RunPodSandbox of pod `name` in namespace `namespace` with UID `uid`, its containers'
    /// logs in `log_dir`, as the kubelet runs a BestEffort pod (cgroupfs driver) with
    /// syncookies off in its network namespace.
    pub fn run(
        containerd: &'a Containerd,
        name: &str,
        namespace: &str,
        uid: &str,
        log_dir: &Path,
    ) -> Self {
        std::fs::create_dir_all(log_dir).unwrap();
        let config = json!({
            "metadata": { "name": name, "namespace": namespace, "uid": uid, "attempt": 0 },
            "hostname": name,
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
            log_dir: log_dir.to_owned(),
            removed: false,
        };
        pod.netns = Some(pod.netns_path());
        pod
    }

    /// Creates and starts container `name` of the app image ([`APP_IMAGE`], the host's
    /// /usr bound read-only) running `command`; its id. Its log is [`Pod::log`]`(name)`.
    pub fn start_container(&self, name: &str, command: &[&str]) -> String {
        let config = json!({
            "metadata": { "name": name, "attempt": 0 },
            "image": { "image": APP_IMAGE },
            "command": command,
            "log_path": format!("{name}.log"),
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

    /// The log of container `name` (empty if there is none yet).
    pub fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.log_dir.join(format!("{name}.log"))).unwrap_or_default()
    }

    /// Stops and removes the pod, as the kubelet does.
    pub fn remove(&mut self) {
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
pub fn container_pid(containerd: &Containerd, id: &str) -> u32 {
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

/// The listener on `port` of container `name` of `pod`, whose process is `pid` and whose
/// network namespace `ns` is, as a [`Listener`] holding a duplicate of the container
/// process's own socket (pidfd_getfd), once it listens.
pub fn containers_listener(ns: &Netns, pod: &Pod, name: &str, pid: u32, port: u16) -> Listener {
    let deadline = Instant::now() + Duration::from_secs(60);
    let inode: u64 = loop {
        if let Some(ino) = listening_inode(ns, port) {
            break ino;
        }
        assert!(
            Instant::now() < deadline,
            "the container's process {pid} does not listen on port {port} within 60 s; \
             its log:\n{}",
            pod.log(name)
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
pub fn cri_messages(dir: &Path) -> PathBuf {
    let module = super::go_module(CRI_API, dir, false).unwrap_or_else(|e| {
        panic!("`go mod download {CRI_API}` (which `cargo xtask setup` runs): {e}")
    });
    let proto = module.join("pkg/apis/runtime/v1/api.proto");
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

/// A random UUID (the kernel's), for a pod's UID.
pub fn uuid() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/uuid")
        .expect("reading a random UUID")
        .trim()
        .to_owned()
}
