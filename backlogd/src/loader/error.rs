//! Why loading failed, each with what to do about it.

use aya::programs::ProgramError;

use super::{btf::BtfError, modes::ModeError, pins::PinError, privileges::MissingPrivileges};

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error(transparent)]
    Privileges(#[from] MissingPrivileges),
    #[error(
        "this process cannot load eBPF programs (effective capabilities {effective:#x}) and \
         {dir} holds no complete pinned state of this build and configuration to adopt. \
         Under the shipped unit, `backlogd load` (its ExecStartPre=) loads and pins that \
         state before the daemon starts: its lines in `journalctl -u backlogd` say why it \
         did not. Fix: check the ExecStartPre= lines (`systemctl cat backlogd`) and that \
         they and ExecStart= use one config file; outside the unit, run `sudo backlogd run`"
    )]
    NothingToAdopt {
        dir: std::path::PathBuf,
        effective: u64,
    },
    #[error(
        "this process cannot load eBPF programs (effective capabilities {effective:#x}) and \
         cannot use the pin directory {dir} to adopt what a load step pinned there. Fix: \
         outside the systemd unit, run it as root (`sudo backlogd run`); under the unit, \
         check that its chown (ExecStartPre=) names pin_dir and that the daemon keeps \
         CAP_DAC_READ_SEARCH, which it needs to pass /sys/fs/bpf (systemd mounts bpffs \
         with mode 0700)"
    )]
    PinsOutOfReach {
        dir: std::path::PathBuf,
        effective: u64,
        #[source]
        source: Box<PinError>,
    },
    #[error(
        "`backlogd load` hands the programs over through pins, and pin_dir is off. Fix: set \
         pin_dir (the shipped unit uses /sys/fs/bpf/backlogd)"
    )]
    HandOverUnpinned,
    #[error(
        "{mode} mode's links cannot be pinned on this kernel (perf-event links need Linux \
         5.15+), so `backlogd load` cannot hand them to the daemon. Fix: leave hook_mode = \
         \"auto\" (the load step then picks tracepoint mode, whose links pin), or run \
         kprobe mode outside the shipped unit (`sudo backlogd run`, unpinned on this \
         kernel)"
    )]
    HandOverUnpinnable { mode: &'static str },
    #[error(transparent)]
    Btf(#[from] BtfError),
    #[error(transparent)]
    Mode(#[from] ModeError),
    #[error(transparent)]
    Pin(#[from] PinError),
    #[error("loading backlogd's eBPF object into the kernel failed")]
    Ebpf(#[from] aya::EbpfError),
    #[error("eBPF program `{program}` could not be loaded or attached to {hook}")]
    Program {
        program: &'static str,
        hook: String,
        #[source]
        source: ProgramError,
    },
    #[error("attaching to {hook} failed")]
    Attach {
        hook: String,
        #[source]
        source: std::io::Error,
    },
    #[error("eBPF object is missing map `{0}` (build mismatch)")]
    Map(&'static str),
    #[error("eBPF object is missing program `{0}` (build mismatch)")]
    MissingProgram(&'static str),
    #[error(
        "no cgroup v2 hierarchy is mounted: backlogd's SYN accounting attaches a cgroup_skb \
         program at its root. Fix: `mount -t cgroup2 none /sys/fs/cgroup` (or boot with \
         systemd's unified or hybrid cgroup hierarchy)"
    )]
    NoCgroup2,
    #[error(
        "the cgroup v2 mount {mount} is not the hierarchy's root: backlogd runs in a cgroup \
         namespace of its own (a container), where tracepoint mode's cgroup_skb program \
         would see only this container's sockets, and the host's mount is out of reach \
         (/proc/1/root: not the host's PID namespace, or no CAP_SYS_PTRACE). Fix: run it in \
         the host's cgroup namespace (docker/podman --cgroupns=host) or PID namespace \
         (Kubernetes hostPID: true, with CAP_SYS_PTRACE), or use --hook-mode fentry or \
         kprobe where the kernel has them"
    )]
    CgroupNamespace { mount: String },
    #[error("cannot open the cgroup v2 root {path}: {source}")]
    CgroupRoot {
        path: String,
        source: std::io::Error,
    },
    #[error("map `{name}` has an unexpected type")]
    MapType {
        name: &'static str,
        #[source]
        source: aya::maps::MapError,
    },
}

/// `e` and its sources, `: `-separated, for a log line.
pub(super) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        s.push_str(": ");
        s.push_str(&cause.to_string());
        source = cause.source();
    }
    s
}
