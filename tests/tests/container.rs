//! backlogd in a container: a cgroup namespace of its own (as a pod has on cgroup v2). The
//! cgroup2 mount it sees is its own cgroup, where tracepoint mode's cgroup_skb program
//! would see only that cgroup's sockets. With the host's PID 1 in reach (`hostPID`), it
//! attaches at the host's root and counts every listener exactly; without, tracepoint mode
//! refuses with the fix instead of counting a fraction of the host. (fentry and kprobe
//! modes use no cgroup program.) The kernel matrix runs it where PID 1 is the guest's init.

use std::{path::Path, process::Command};

use backlogd_tests::{
    Daemon, Netns,
    cgroups::{Tree, v2_mount},
    daemon::binary,
    figures::accept_queue_full_burst,
    sockets::Listener,
};

/// `sh -c SCRIPT` that puts itself into `cgroup`, then, as a container runtime does,
/// enters a new cgroup namespace (rooted there) and a mount namespace whose cgroup2 mount
/// shows only that subtree, and becomes the command appended to it.
fn in_own_cgroup_namespace(cgroup: &Path) -> Vec<String> {
    let mount = v2_mount();
    // util-linux's unshare by its path: busybox's sh (the kernel matrix's) would run its
    // own applet, which has no --cgroup.
    let unshare = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|dir| dir.join("unshare"))
        .find(|p| p.exists())
        .expect("unshare (Debian package util-linux)");
    let script = format!(
        "echo $$ > {}/cgroup.procs && exec {} --cgroup --mount sh -c \
         'umount {mount} && mount -t cgroup2 none {mount} && exec \"$0\" \"$@\"' \"$0\" \"$@\"",
        cgroup.display(),
        unshare.display(),
        mount = mount.display()
    );
    vec!["sh".into(), "-c".into(), script]
}

/// Tracepoint mode is the one with a cgroup program, so it is the mode this runs in.
#[test]
fn a_daemon_in_its_own_cgroup_namespace_counts_every_listener_or_refuses() {
    let tree = Tree::new("container");
    let wrapper = in_own_cgroup_namespace(&tree.cgroup("pod"));
    let wrapper: Vec<&str> = wrapper.iter().map(String::as_str).collect();
    let mode = ["--hook-mode", "tracepoint"];
    if std::fs::read_dir("/proc/1/root/").is_err() {
        // This machine's PID 1 is out of reach (as on the CI machine): the refusal.
        let out = Command::new(wrapper[0])
            .args(&wrapper[1..])
            .arg(binary())
            .args(["run", "--config", "/dev/null", "--listen", "127.0.0.1:0"])
            .args(mode)
            .output()
            .expect("running backlogd");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success(),
            "started in a cgroup namespace: {err}"
        );
        assert!(
            err.contains("cgroup namespace of its own")
                && err.contains("--cgroupns=host")
                && err.contains("hostPID"),
            "{err}"
        );
        return;
    }
    let daemon = Daemon::start_wrapped(&wrapper, &mode);
    let own_ns = std::fs::read_link("/proc/self/ns/cgroup").unwrap();
    let daemon_ns = std::fs::read_link(format!("/proc/{}/ns/cgroup", daemon.pid())).unwrap();
    assert_ne!(
        own_ns, daemon_ns,
        "the daemon has no cgroup namespace of its own"
    );
    assert!(
        daemon.log().contains("attaching at the host's"),
        "{}",
        daemon.log()
    );
    // A listener of this test process, outside the daemon's cgroup: exact.
    let ns = Netns::new();
    ns.sysctl("net.ipv4.tcp_syncookies", "0");
    let listener = Listener::open(&ns, "127.0.0.1:0", 4);
    daemon.wait_for_listener(listener.inode);
    accept_queue_full_burst(&daemon, &ns, &listener, listener.addr)
        .exact
        .verify();
}
