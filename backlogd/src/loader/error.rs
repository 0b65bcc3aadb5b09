//! Why loading failed, each with what to do about it.

use aya::programs::ProgramError;

use super::{
    btf::BtfError, modes::ModeError, pins::PinError, privileges::MissingPrivileges,
    tracefs::TracefsError,
};

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error(transparent)]
    Privileges(#[from] MissingPrivileges),
    #[error(transparent)]
    Btf(#[from] BtfError),
    #[error(transparent)]
    Tracefs(#[from] TracefsError),
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
