//! Loading the eBPF object and attaching its programs.
//!
//! Listener lifecycle (this module's programs so far) uses tracepoints every kernel has;
//! the hook-mode choice for the SYN path (fentry, kprobe, tracepoint) builds on this.

pub mod btf;
pub mod privileges;
pub mod tracefs;

use std::path::PathBuf;

use aya::{
    Ebpf, EbpfLoader,
    maps::{MapData, PerCpuArray, RingBuf},
    programs::{ProgramError, TracePoint},
};
use backlogd_common::KernelOffsets;

use self::{
    btf::{BtfError, KernelBtf},
    privileges::MissingPrivileges,
    tracefs::{Format, TracefsError},
};

/// The object aya-build produced from backlogd-ebpf for this build.
static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/backlogd"));

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error(transparent)]
    Privileges(#[from] MissingPrivileges),
    #[error(transparent)]
    Btf(#[from] BtfError),
    #[error(transparent)]
    Tracefs(#[from] TracefsError),
    #[error("loading backlogd's eBPF object into the kernel failed")]
    Ebpf(#[from] aya::EbpfError),
    #[error("eBPF program `{program}` could not be loaded or attached to {hook}")]
    Program {
        program: &'static str,
        hook: String,
        #[source]
        source: ProgramError,
    },
    #[error("eBPF object is missing map `{0}` (build mismatch)")]
    Map(&'static str),
    #[error("map `{name}` has an unexpected type")]
    MapType {
        name: &'static str,
        #[source]
        source: aya::maps::MapError,
    },
}

#[derive(Debug, Clone)]
pub struct LoadOptions {
    /// Where to read the kernel's BTF from.
    pub btf: PathBuf,
}

/// Loaded and attached programs plus the maps userspace reads.
pub struct Probes {
    /// Owns the programs and their links: dropping it detaches everything.
    _ebpf: Ebpf,
    pub listener_events: RingBuf<MapData>,
    pub listener_events_lost: PerCpuArray<MapData, u64>,
}

/// Tracepoints used for the listener lifecycle: (program, category, tracepoint).
const LIFECYCLE: [(&str, &str, &str); 3] = [
    ("listen_enter", "syscalls", "sys_enter_listen"),
    ("listen_exit", "syscalls", "sys_exit_listen"),
    ("listener_state", "sock", "inet_sock_set_state"),
];

pub fn load(opts: &LoadOptions) -> Result<Probes, LoadError> {
    privileges::check()?;
    let btf = KernelBtf::open(&opts.btf)?;
    let mut offsets = btf.kernel_offsets()?;
    tracepoint_offsets(&mut offsets)?;
    tracing::debug!(?offsets, "kernel layout resolved");

    let mut ebpf = EbpfLoader::new()
        .override_global("OFFSETS", &offsets, true)
        .load(EBPF_OBJECT)?;
    for (program, category, name) in LIFECYCLE {
        attach_tracepoint(&mut ebpf, program, category, name)?;
    }
    let listener_events =
        RingBuf::try_from(take_map(&mut ebpf, "LISTENER_EVENTS")?).map_err(|source| {
            LoadError::MapType {
                name: "LISTENER_EVENTS",
                source,
            }
        })?;
    let listener_events_lost = PerCpuArray::try_from(take_map(&mut ebpf, "LISTENER_EVENTS_LOST")?)
        .map_err(|source| LoadError::MapType {
            name: "LISTENER_EVENTS_LOST",
            source,
        })?;
    Ok(Probes {
        _ebpf: ebpf,
        listener_events,
        listener_events_lost,
    })
}

fn tracepoint_offsets(o: &mut KernelOffsets) -> Result<(), TracefsError> {
    let tracing = tracefs::tracing_dir()?;
    let enter = Format::read(&tracing, "syscalls", "sys_enter_listen")?;
    o.tp_listen_fd = enter.offset("fd")?;
    o.tp_listen_backlog = enter.offset("backlog")?;
    o.tp_exit_ret = Format::read(&tracing, "syscalls", "sys_exit_listen")?.offset("ret")?;
    let state = Format::read(&tracing, "sock", "inet_sock_set_state")?;
    o.tp_state_skaddr = state.offset("skaddr")?;
    o.tp_state_oldstate = state.offset("oldstate")?;
    o.tp_state_newstate = state.offset("newstate")?;
    o.tp_state_protocol = state.offset("protocol")?;
    Ok(())
}

fn attach_tracepoint(
    ebpf: &mut Ebpf,
    program: &'static str,
    category: &str,
    name: &str,
) -> Result<(), LoadError> {
    let err = |source| LoadError::Program {
        program,
        hook: format!("tracepoint {category}:{name}"),
        source,
    };
    let prog: &mut TracePoint = ebpf
        .program_mut(program)
        .ok_or(LoadError::Map(program))?
        .try_into()
        .map_err(err)?;
    prog.load().map_err(err)?;
    prog.attach(category, name).map_err(err)?;
    Ok(())
}

fn take_map(ebpf: &mut Ebpf, name: &'static str) -> Result<aya::maps::Map, LoadError> {
    ebpf.take_map(name).ok_or(LoadError::Map(name))
}
