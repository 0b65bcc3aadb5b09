//! The names operators use for a listener's owner (issue 21): the systemd unit, the
//! container and the Kubernetes pod, from the owning process's cgroup (looked up off the
//! event loop with the program, `daemon/identify.rs`, once per listener owner);
//! the names only the container runtime knows, from its API (`runtime.rs`), or without
//! one from the container's monitor process (`bundle.rs`: containerd's and CRI-O's OCI
//! bundles, podman's conmon command line) or dockerd's own record; and a network
//! namespace's name, where it has one (`netns.rs`).

pub mod bundle;
pub mod cgroup;
pub mod netns;
pub mod runtime;

pub use cgroup::CgroupNames;

/// What `pid`'s cgroup says; None once it has exited, or on a host without cgroup v2.
pub fn of_process(pid: u32) -> Option<CgroupNames> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    cgroup::from_proc_file(&text)
}
