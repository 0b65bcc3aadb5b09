//! Loading the eBPF object and attaching its programs: the orchestration. Which hooks
//! each mode uses is policy (`hooks.rs`, with mode choice and fallbacks in `modes.rs`);
//! how a program is attached or pinned is plumbing (`attach.rs`, `pins.rs`, `cgroup.rs`;
//! every raw bpf(2) call is in `crate::bpf_syscall`, a leaf that `kernel_maps.rs` uses too).

mod attach;
pub mod btf;
mod cgroup;
mod error;
pub mod hooks;
pub mod modes;
pub mod pins;
pub mod privileges;
pub mod scan;
mod trampoline;

use std::{
    os::fd::{AsFd as _, OwnedFd},
    path::{Path, PathBuf},
};

use aya::{
    Ebpf, EbpfLoader,
    maps::{Array, MapData, PerCpuHashMap, RingBuf},
};
use backlogd_common::{
    ImpactSettings, ListenerStats, SourcePrefixes,
    names::map::{self, DAEMON},
};

pub use self::error::LoadError;
use self::error::error_chain;
use self::{
    attach::{typed, typed_map},
    btf::{BtfError, KernelBtf},
    cgroup::CgroupAttachment,
    hooks::Hook,
    modes::{HookMode, HookModeArg, KernelSupport},
    pins::{Found, PinDir, PinError},
};
use crate::kernel_maps::KernelMaps;

/// The object aya-build produced from backlogd-ebpf for this build.
static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/backlogd"));

#[derive(Debug, Clone)]
pub struct LoadOptions {
    /// Where to read the kernel's BTF from.
    pub btf: PathBuf,
    pub hook_mode: HookModeArg,
    /// Pin links and maps here and adopt what a previous daemon of this build pinned
    /// (see `pins.rs`); `None` detaches everything when the daemon exits.
    pub pin_dir: Option<PathBuf>,
    /// Capacity of the per-listener maps (LISTENER_STATS, LISTENER_QUEUES).
    pub max_listeners: u32,
    /// Client-impact horizon, baked into the programs.
    pub impact: ImpactSettings,
    /// Capacity of the ATTEMPTS map.
    pub attempts: u32,
    /// Time accept waits (`accept_wait`), baked into the programs.
    pub accept_wait: bool,
    /// Attach the per-syscall program where the mode has one (`syscall_hook`).
    pub syscall_hook: bool,
    /// Prefix lengths dropped segments' sources are counted at, baked into the programs.
    pub source_prefixes: SourcePrefixes,
    /// Capacity of the DROP_SOURCES map.
    pub drop_sources: u32,
    /// The load step (`backlogd load`): the state must be pinned, with the scan iterator
    /// and the programs beside it, for a daemon without loading capabilities to adopt.
    pub hand_over: bool,
}

/// Loaded and attached programs plus the maps userspace reads.
pub struct Probes {
    /// Owns the programs and their links: dropping it detaches everything that is not
    /// pinned. `None` when the programs were adopted from pins.
    _ebpf: Option<Ebpf>,
    pub listener_events: RingBuf<MapData>,
    pub maps: KernelMaps,
    _cgroup_ingress: Option<CgroupAttachment>,
    pub mode: HookMode,
    pub kernel: KernelSupport,
    /// The programs were already attached and counting: adopted from pinned state.
    pub adopted: bool,
    /// The kernel state is pinned under pin_dir: it survives a restart of the daemon.
    pub pinned: bool,
    /// The scan iterator, or why this kernel cannot have it.
    pub scan: Result<scan::ScanIterator, String>,
}

/// The programs this process attached (`hooks`), with the kernel's names for them: from
/// its own object, and `BPF_OBJ_GET_INFO_BY_FD`, which needs no capability.
fn attached_programs(ebpf: &Ebpf, hooks: &[Hook]) -> Vec<(OwnedFd, String)> {
    hooks
        .iter()
        .filter_map(|h| {
            let program = ebpf.program(h.program())?;
            let fd = program.fd().ok()?.as_fd().try_clone_to_owned().ok()?;
            let name = program.info().ok()?.name_as_str()?.to_owned();
            Some((fd, name))
        })
        .collect()
}

/// The adopted programs: those the load step pinned beside the state, or else those that
/// use `stats` (backlogd's own), found by walking every loaded program:
/// `BPF_PROG_GET_NEXT_ID` needs CAP_SYS_ADMIN, which the shipped unit's daemon does not
/// hold. `None` without either: then the runs the kernel skipped are not served, rather
/// than served as a sum over no programs.
fn counting_programs(
    pins: &PinDir,
    mode: HookMode,
    stats: &PerCpuHashMap<MapData, u64, ListenerStats>,
) -> Option<Vec<(OwnedFd, String)>> {
    match pins.open_programs(mode) {
        Some(Ok(pinned)) => return Some(pinned),
        Some(Err(e)) => tracing::warn!(
            error = %e,
            "cannot open the pinned programs; looking for them among the kernel's"
        ),
        None => {}
    }
    use aya::maps::IterableMap as _;
    let id = stats.map().info().ok()?.id();
    let mut found = Vec::new();
    for p in aya::programs::loaded_programs() {
        let p = match p {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(
                    error = %e,
                    "cannot list the adopted programs (walking the kernel's programs needs \
                     CAP_SYS_ADMIN, and no load step pinned them): \
                     backlogd_probe_missed_runs_total is not served until they are loaded \
                     again (`backlogd unpin`, then a restart)"
                );
                return None;
            }
        };
        if p.map_ids()
            .ok()
            .flatten()
            .is_some_and(|ids| ids.contains(&id))
            && let (Ok(fd), Some(name)) = (p.fd(), p.name_as_str())
            && let Ok(fd) = fd.as_fd().try_clone_to_owned()
        {
            found.push((fd, name.to_owned()));
        }
    }
    Some(found)
}

pub fn load(opts: &LoadOptions) -> Result<Probes, LoadError> {
    // Without the loading capabilities a daemon can still adopt what a load step pinned
    // (the shipped unit's split): decided once the pins are surveyed.
    let privileged = privileges::check(if opts.hand_over { "load" } else { "run" });
    if opts.hand_over {
        privileged.clone()?;
        if opts.pin_dir.is_none() {
            return Err(LoadError::HandOverUnpinned);
        }
    }
    warn_if_realtime();
    // Each parse of the kernel's BTF takes tens of MiB: never hold two at once. The
    // btf-rs parse is only needed for the offsets and the kernel's features.
    let (facts, offsets) = {
        let btf = KernelBtf::open(&opts.btf)?;
        let mut offsets = btf.kernel_offsets()?;
        offsets.ret_slot = hooks::FEXIT_RETURNS.map(|f| btf.fexit_ret_slot(f));
        (
            modes::BtfFacts::of(&btf, opts.btf == Path::new(btf::KERNEL_BTF)),
            offsets,
        )
    };
    let kernel = KernelSupport::probe(facts);
    // EbpfLoader::new() parses /sys/kernel/btf/vmlinux itself: drop that parse at once and
    // let the loader use ours (which honours --btf) instead.
    let accept_wait = u32::from(opts.accept_wait);
    let mut loader = EbpfLoader::new();
    loader.btf(None);
    let kernel_btf = aya::Btf::parse_file(&opts.btf, aya::Endianness::default()).map_err(|e| {
        BtfError::Unreadable {
            path: opts.btf.clone(),
            reason: e.to_string(),
        }
    })?;
    // The scan object first, while the loader holds only what both objects share: the
    // hooks' own globals must exist in what it loads.
    loader
        .btf(Some(&kernel_btf))
        .override_global(map::OFFSETS, &offsets, true);
    let reads_sysctls = btf::reads_listen_sysctls(&offsets);
    let scan = match &privileged {
        Ok(()) => scan::ScanIterator::load(&mut loader, &kernel_btf, reads_sysctls)
            .map_err(|e| error_chain(&e)),
        // Replaced by the pinned one when the state is adopted.
        Err(_) => Err(String::new()),
    };
    let pins = match &opts.pin_dir {
        // The maps' capacity is part of what a pinned state is: a daemon configured for
        // another one does not adopt it.
        Some(dir) => Some(
            PinDir::open(
                dir,
                pins::build_id(
                    &[
                        EBPF_OBJECT,
                        &opts.max_listeners.to_le_bytes(),
                        &opts.impact.horizon_ns.to_le_bytes(),
                        &opts.attempts.to_le_bytes(),
                        &[u8::from(opts.accept_wait)],
                        // A state pinned with the other choice has the other set of links.
                        &[u8::from(opts.syscall_hook)],
                        &[opts.source_prefixes.v4, opts.source_prefixes.v6],
                        &opts.drop_sources.to_le_bytes(),
                    ]
                    .concat(),
                ),
            )
            .map_err(|e| unprivileged_or(&privileged, dir, e))?,
        ),
        None => None,
    };
    let found = match (&pins, &opts.pin_dir) {
        (Some(pins), Some(dir)) => pins
            .survey(opts.hook_mode)
            .map_err(|e| unprivileged_or(&privileged, dir, e))?,
        _ => Found::Empty,
    };
    if let Some(pins) = &pins
        && let Found::Adoptable(mode) = found
    {
        match adopt(pins, mode) {
            Ok(mut probes) => {
                probes.kernel = kernel;
                probes.scan = match privileged {
                    Ok(()) => scan,
                    Err(_) => {
                        // The trampoline probe loads a program, so here it failed for
                        // want of capabilities: the load step's finding stands.
                        let works = pins.trampolines_recorded(mode);
                        probes.kernel.trampolines = works;
                        probes.kernel.fentry = works;
                        let path = pins.scan_path(mode);
                        scan::ScanIterator::from_pin(&path, reads_sysctls).map_err(|e| {
                            format!(
                                "this process cannot load one (no CAP_BPF and CAP_PERFMON), \
                                 and none is pinned at {} ({e}): the load step (`backlogd \
                                 load`) pins it",
                                path.display()
                            )
                        })
                    }
                };
                if opts.hand_over {
                    hand_over(pins, &probes)?;
                }
                return Ok(probes);
            }
            // Without the capabilities to load afresh, the state stays for a daemon
            // that can adopt it.
            Err(e) if privileged.is_err() => return Err(e),
            Err(e) => {
                tracing::warn!(
                    error = %error_chain(&e),
                    "cannot adopt the pinned state; removing it and loading afresh \
                     (counters restart from zero)"
                );
                pins.clear()?;
            }
        }
    }
    if let Err(missing) = privileged {
        return Err(match &opts.pin_dir {
            Some(dir) => LoadError::NothingToAdopt {
                dir: dir.clone(),
                effective: missing.effective,
            },
            None => missing.into(),
        });
    }
    let mode = modes::choose(opts.hook_mode, kernel)?;
    tracing::debug!(?offsets, "kernel layout resolved");
    loader
        .override_global(map::CLIENT_IMPACT, &opts.impact, true)
        .override_global(map::ACCEPT_WAIT, &accept_wait, true)
        .override_global(map::SOURCE_PREFIXES, &opts.source_prefixes, true)
        .map_max_entries(map::ATTEMPTS, opts.attempts)
        .map_max_entries(map::DROP_SOURCES, opts.drop_sources)
        .map_max_entries(map::LISTENER_STATS, opts.max_listeners)
        .map_max_entries(map::LISTENER_QUEUES, opts.max_listeners)
        .map_max_entries(map::LISTENS_SEEN, opts.max_listeners)
        .map_max_entries(map::ABANDONED, opts.max_listeners);

    let attempts = modes::attempts(opts.hook_mode, mode, kernel);
    let mut attempts = attempts.iter().peekable();
    loop {
        let mode = *attempts.next().expect("at least the chosen mode");
        let pins = pins.as_ref().filter(|_| {
            let can = kernel.can_pin(mode);
            if !can && !opts.hand_over {
                tracing::warn!(
                    pin_dir = %opts.pin_dir.as_deref().unwrap_or(Path::new("")).display(),
                    "pin_dir is set, but this kernel cannot pin {} mode's links (pinning \
                     kprobe links needs Linux 5.15+): running unpinned, so \
                     counters restart from zero when the daemon restarts and drops during \
                     a restart are not counted",
                    mode.name()
                );
            }
            can
        });
        let loaded = match pins {
            None if opts.hand_over => Err(LoadError::HandOverUnpinnable { mode: mode.name() }),
            _ => load_mode(mode, opts.syscall_hook, &mut loader, &kernel_btf, pins),
        };
        match loaded {
            Ok(mut probes) => {
                probes.kernel = kernel;
                probes.pinned = pins.is_some();
                probes.scan = scan;
                if let Some(pins) = pins.filter(|_| opts.hand_over) {
                    hand_over(pins, &probes)?;
                }
                return Ok(probes);
            }
            Err(e) if attempts.peek().is_some() => {
                let next = attempts.peek().map_or("", |m| m.name());
                tracing::warn!(
                    error = %error_chain(&e),
                    "hook mode {} failed on this kernel; falling back to {next}",
                    mode.name()
                );
            }
            Err(e) => return Err(e),
        }
    }
}

/// A pin directory this process cannot use. Without the loading capabilities either, it
/// is a user who left out `sudo` (the directory is root's) or a unit's daemon the pins
/// were not handed to: the error names both.
fn unprivileged_or(
    privileged: &Result<(), privileges::MissingPrivileges>,
    dir: &Path,
    e: PinError,
) -> LoadError {
    match privileged {
        Err(missing) => LoadError::PinsOutOfReach {
            dir: dir.to_owned(),
            effective: missing.effective,
            source: Box::new(e),
        },
        Ok(()) => e.into(),
    }
}

/// Every mode attributes a segment's counter deltas to it on the assumption that a
/// listener segment is processed start to finish on one CPU without another segment's
/// processing interleaving (softirq context). PREEMPT_RT kernels run softirqs in
/// preemptible threads, so that no longer holds.
fn warn_if_realtime() {
    let realtime = std::fs::read_to_string("/sys/kernel/realtime").is_ok_and(|v| v.trim() == "1");
    if realtime {
        tracing::warn!(
            "this is a PREEMPT_RT kernel: softirqs are preemptible threads here, so two \
             listener segments can interleave on one CPU and drops may be counted twice \
             or against the wrong listener or reason. backlogd is not verified on \
             PREEMPT_RT; compare with the backlogd_netns_* counters"
        );
    }
}

/// `backlogd unpin`: removes pinned state, detaching its programs.
pub fn unpin(dir: &std::path::Path) -> anyhow::Result<()> {
    if !dir.exists() {
        println!("nothing pinned at {}", dir.display());
        return Ok(());
    }
    PinDir::open(dir, String::new())?.clear()?;
    std::fs::remove_dir(dir)
        .map_err(|e| anyhow::anyhow!("cannot remove {}: {e}", dir.display()))?;
    println!("removed {} (its programs are detached)", dir.display());
    Ok(())
}

/// Leaves beside the pinned state what a daemon without loading capabilities cannot make
/// itself: the scan iterator's link (replaced, so it is this load's) and the programs
/// (kept where pinned before: they are the state's own).
fn hand_over(pins: &PinDir, probes: &Probes) -> Result<(), LoadError> {
    pins.record_trampolines(probes.mode, probes.kernel.trampolines)?;
    let path = pins.scan_path(probes.mode);
    match &probes.scan {
        Ok(scan) => scan
            .pin(&path)
            .map_err(|source| PinError::Io { path, source })?,
        Err(reason) => {
            // An earlier load's iterator may be another build's: never leave it.
            match std::fs::remove_file(&path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    return Err(PinError::Io { path, source: e }.into());
                }
                _ => {}
            }
            tracing::warn!(
                reason,
                "no scan iterator to hand over: the daemon will not have one either"
            );
        }
    }
    match &probes.maps.programs {
        Some(programs) if !programs.is_empty() => pins.pin_programs(probes.mode, programs)?,
        _ => tracing::warn!(
            "the programs were not found, so none is pinned: the daemon will not serve \
             backlogd_probe_missed_runs_total"
        ),
    }
    Ok(())
}

/// Takes over the programs a previous daemon of this build left pinned in `mode`: they
/// have been counting all along, so nothing is loaded or attached.
fn adopt(pins: &PinDir, mode: HookMode) -> Result<Probes, LoadError> {
    let [
        events,
        events_lost,
        stats,
        stats_full,
        queues,
        epoch,
        seen,
        attempts,
        untracked,
        abandoned,
        sources,
    ] = DAEMON.map(|name| pins.open_map(mode, name).map(|map| (name, map)));
    let listener_stats = typed(stats?)?;
    let probes = Probes {
        _ebpf: None,
        listener_events: typed(events?)?,
        maps: KernelMaps {
            events_lost: typed(events_lost?)?,
            programs: counting_programs(pins, mode, &listener_stats),
            listener_stats,
            listener_stats_full: typed(stats_full?)?,
            listener_queues: typed(queues?)?,
            queue_epoch: start_epochs(typed(epoch?)?)?,
            listens_seen: typed(seen?)?,
            attempts: typed(attempts?)?,
            attempts_untracked: typed(untracked?)?,
            abandoned: typed(abandoned?)?,
            drop_sources: typed(sources?)?,
            expired_pending: Default::default(),
            tracked: 0,
            sweeps: 0,
        },
        _cgroup_ingress: None,
        mode,
        kernel: KernelSupport::default(),
        adopted: true,
        pinned: true,
        scan: Err(String::new()),
    };
    tracing::info!(
        mode = mode.name(),
        state = %pins.map_path(mode, "").display(),
        "adopted the pinned programs and maps of a previous backlogd: counters continue"
    );
    Ok(probes)
}

/// Publishes the first sampling epoch (see `queues.rs`); the daemon's sampler starts
/// from it too.
fn start_epochs(mut epoch: Array<MapData, u32>) -> Result<Array<MapData, u32>, LoadError> {
    epoch
        .set(0, crate::queues::FIRST_EPOCH, 0)
        .map_err(|source| LoadError::MapType {
            name: map::QUEUE_EPOCH,
            source,
        })?;
    Ok(epoch)
}

/// Loads the object and attaches `mode`'s programs, pinning them when `pins` is set; on
/// error everything attached so far is detached again (dropping `Ebpf` releases its
/// links, dropping the unfinished `Pinning` removes its pins).
fn load_mode(
    mode: HookMode,
    syscall_hook: bool,
    loader: &mut EbpfLoader<'_>,
    kernel_btf: &aya::Btf,
    pins: Option<&PinDir>,
) -> Result<Probes, LoadError> {
    let mut ebpf = loader.load(EBPF_OBJECT)?;
    let mut pinning = pins.map(|p| p.begin(mode)).transpose()?;
    let pinning = &mut pinning;
    let queue_epoch = start_epochs(typed_map(&mut ebpf, map::QUEUE_EPOCH, pinning)?)?;
    let mut cgroup_ingress = None;
    let hooks = hooks::for_mode(mode, syscall_hook);
    for hook in &hooks {
        if let Some(attachment) = attach::attach(&mut ebpf, kernel_btf, hook, pinning)? {
            cgroup_ingress = Some(attachment);
        }
        tracing::debug!(program = hook.program(), ?hook, "attached");
    }
    let listener_events = typed_map(&mut ebpf, map::LISTENER_EVENTS, pinning)?;
    let events_lost = typed_map(&mut ebpf, map::LISTENER_EVENTS_LOST, pinning)?;
    let listener_stats = typed_map(&mut ebpf, map::LISTENER_STATS, pinning)?;
    let listener_stats_full = typed_map(&mut ebpf, map::LISTENER_STATS_FULL, pinning)?;
    let listener_queues = typed_map(&mut ebpf, map::LISTENER_QUEUES, pinning)?;
    let listens_seen = typed_map(&mut ebpf, map::LISTENS_SEEN, pinning)?;
    let attempts = typed_map(&mut ebpf, map::ATTEMPTS, pinning)?;
    let attempts_untracked = typed_map(&mut ebpf, map::ATTEMPTS_UNTRACKED, pinning)?;
    let abandoned = typed_map(&mut ebpf, map::ABANDONED, pinning)?;
    let drop_sources = typed_map(&mut ebpf, map::DROP_SOURCES, pinning)?;
    if let Some(pinning) = pinning.take() {
        pinning.complete()?;
    }
    Ok(Probes {
        maps: KernelMaps {
            programs: Some(attached_programs(&ebpf, &hooks)),
            events_lost,
            listener_stats,
            listener_stats_full,
            listener_queues,
            queue_epoch,
            listens_seen,
            attempts,
            attempts_untracked,
            abandoned,
            drop_sources,
            expired_pending: Default::default(),
            tracked: 0,
            sweeps: 0,
        },
        adopted: false,
        pinned: false,
        scan: Err(String::new()),
        mode,
        kernel: KernelSupport::default(),
        _ebpf: Some(ebpf),
        listener_events,
        _cgroup_ingress: cgroup_ingress,
    })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use backlogd_common::names::program;

    use super::*;

    /// The names the daemon uses must be the object's: a rename on either side fails here,
    /// not in a load on a production host.
    #[test]
    fn the_shared_names_are_the_objects_maps_and_programs() {
        let object = aya_obj::Object::parse(EBPF_OBJECT).expect("the built eBPF object parses");
        let programs: BTreeSet<&str> = object.programs.keys().map(String::as_str).collect();
        let named: BTreeSet<&str> = program::ALL.into_iter().collect();
        assert_eq!(
            programs, named,
            "programs of the object vs names::program::ALL"
        );
        let maps: BTreeSet<&str> = object.maps.keys().map(String::as_str).collect();
        for name in DAEMON {
            assert!(
                maps.contains(name),
                "map {name} is not in the object: {maps:?}"
            );
        }
    }
}
