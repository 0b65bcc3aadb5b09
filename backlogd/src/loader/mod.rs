//! Loading the eBPF object and attaching its programs.
//!
//! Listener lifecycle and SYN-ACK retransmits use tracepoints every kernel has, in every
//! mode: the listen(2) syscall tracepoints, and `inet_sock_set_state` and
//! `tcp_retransmit_synack` as raw tracepoints. The SYN path and the accept queue depend on
//! the hook mode (see `modes.rs` and the README's hook-mode matrix):
//! - fentry: fentry/fexit on tcp_conn_request, tcp_check_req, tcp_get_cookie_sock,
//!   tcp_req_err, inet_csk_reqsk_queue_add and inet_csk_accept;
//! - kprobe: kprobes/kretprobes on the same functions, accept() at the raw `sys_exit`
//!   tracepoint;
//! - tracepoint: a cgroup_skb ingress program on the cgroup v2 root plus skb-release
//!   tp_btf hooks (backlogd-ebpf/src/syn.rs), raw `sk_data_ready`, accept() syscall
//!   tracepoints.
//!
//! A classic-tracepoint or kprobe program makes the kernel skip every other such program
//! that fires on its CPU while it runs (see backlogd-ebpf/src/kprobe.rs); raw tracepoint,
//! tp_btf, fentry and cgroup programs do not. So classic tracepoints are used only where
//! nothing of the mode can be skipped because of them: listen(2) (rare) everywhere, and
//! accept() in tracepoint mode.

pub mod btf;
mod cgroup;
pub mod modes;
pub mod pins;
pub mod privileges;
pub mod syscall;
pub mod tracefs;

use std::{os::fd::AsFd as _, path::PathBuf};

use aya::{
    Ebpf, EbpfLoader,
    maps::{Array, Map, MapData, PerCpuArray, PerCpuHashMap, RingBuf},
    programs::{
        BtfTracePoint, CgroupSkb, FEntry, FExit, KProbe, ProgramError, ProgramFd, RawTracePoint,
        TracePoint, links::FdLink,
    },
};
use backlogd_common::{KernelOffsets, ListenerStats, QueueState};

use self::{
    btf::{BtfError, KernelBtf},
    cgroup::CgroupAttachment,
    modes::{HookMode, HookModeArg, KernelSupport, ModeError},
    pins::{Found, PinDir, PinError, Pinning},
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
}

/// Loaded and attached programs plus the maps userspace reads.
pub struct Probes {
    /// Owns the programs and their links: dropping it detaches everything that is not
    /// pinned. `None` when the programs were adopted from pins.
    _ebpf: Option<Ebpf>,
    pub listener_events: RingBuf<MapData>,
    pub listener_events_lost: PerCpuArray<MapData, u64>,
    pub listener_stats: PerCpuHashMap<MapData, u64, ListenerStats>,
    pub listener_stats_full: PerCpuArray<MapData, u64>,
    pub listener_queues: PerCpuHashMap<MapData, u64, QueueState>,
    /// Sampling epoch of the queue maxima (see `queues.rs`).
    pub queue_epoch: Array<MapData, u32>,
    _cgroup_ingress: Option<CgroupAttachment>,
    pub mode: HookMode,
    pub kernel: KernelSupport,
    /// Whether enqueue events (`sk_data_ready`) are seen: queued and accept wait.
    pub enqueue_events: bool,
    /// The programs were already attached and counting: adopted from pinned state.
    pub adopted: bool,
    /// The attached programs that count (those using LISTENER_STATS), for their kernel
    /// statistics.
    pub programs: Vec<ProgramFd>,
}

/// Every loaded program that uses `stats`: backlogd's own, whether this process loaded
/// them or adopted them from pins.
fn counting_programs(stats: &PerCpuHashMap<MapData, u64, ListenerStats>) -> Vec<ProgramFd> {
    use aya::maps::IterableMap as _;
    let Ok(id) = stats.map().info().map(|i| i.id()) else {
        return Vec::new();
    };
    aya::programs::loaded_programs()
        .filter_map(Result::ok)
        .filter(|p| {
            p.map_ids()
                .ok()
                .flatten()
                .is_some_and(|ids| ids.contains(&id))
        })
        .filter_map(|p| p.fd().ok())
        .collect()
}

/// Tracepoints: (program, [(category, tracepoint)]).
type Tracepoints = [(&'static str, &'static [(&'static str, &'static str)])];

/// Every mode: listen(2).
const COMMON_TRACEPOINTS: &Tracepoints = &[
    ("listen_enter", &[("syscalls", "sys_enter_listen")]),
    ("listen_exit", &[("syscalls", "sys_exit_listen")]),
];

/// Every mode: (program, raw tracepoint); listeners closing and SYN-ACK retransmits.
const COMMON_RAW_TRACEPOINTS: &[(&str, &str)] = &[
    ("listener_state", "inet_sock_set_state"),
    ("synack_retransmit", "tcp_retransmit_synack"),
];

/// accept() and accept4() in tracepoint mode.
const ACCEPT_TRACEPOINTS: &Tracepoints = &[
    (
        "accept_enter",
        &[
            ("syscalls", "sys_enter_accept4"),
            ("syscalls", "sys_enter_accept"),
        ],
    ),
    (
        "accept_exit",
        &[
            ("syscalls", "sys_exit_accept4"),
            ("syscalls", "sys_exit_accept"),
        ],
    ),
];

/// accept() and accept4() returning, in kprobe mode: a raw tracepoint, which unlike the
/// classic ones above does not make the kernel skip SYN kprobes while it runs (see
/// backlogd-ebpf/src/accept.rs), at the price of a run per syscall.
const ACCEPT_RAW_TRACEPOINT: (&str, &str) = ("accept_sys_exit", "sys_exit");

/// fentry mode: (program, kernel function, exit hook?).
const FUNCTION_HOOKS_FENTRY: &[(&str, &str, bool)] = &[
    ("conn_request_enter", "tcp_conn_request", false),
    ("conn_request_exit", "tcp_conn_request", true),
    ("check_req_enter", "tcp_check_req", false),
    ("check_req_exit", "tcp_check_req", true),
    ("cookie_sock_enter", "tcp_get_cookie_sock", false),
    ("cookie_sock_exit", "tcp_get_cookie_sock", true),
    ("req_err_enter", "tcp_req_err", false),
    ("req_err_exit", "tcp_req_err", true),
    ("reqsk_queue_add_exit", "inet_csk_reqsk_queue_add", true),
    ("inet_csk_accept_exit", "inet_csk_accept", true),
];

/// kprobe mode: (program, kernel functions). Return probes are the `*_kretprobe` ones.
const FUNCTION_HOOKS_KPROBE: &[(&str, &[&str])] = &[
    ("conn_request_kprobe", &["tcp_conn_request"]),
    ("conn_request_kretprobe", &["tcp_conn_request"]),
    ("check_req_kprobe", &["tcp_check_req"]),
    (
        "final_ack_kprobe",
        &["tcp_check_req", "tcp_get_cookie_sock"],
    ),
    (
        "final_ack_kretprobe",
        &["tcp_check_req", "tcp_get_cookie_sock"],
    ),
    ("req_err_kprobe", &["tcp_req_err"]),
    ("req_err_kretprobe", &["tcp_req_err"]),
    ("reqsk_queue_add_kprobe", &["inet_csk_reqsk_queue_add"]),
    ("reqsk_queue_add_kretprobe", &["inet_csk_reqsk_queue_add"]),
];

pub fn load(opts: &LoadOptions) -> Result<Probes, LoadError> {
    privileges::check()?;
    warn_if_realtime();
    let kernel = KernelSupport::probe();
    let pins = match &opts.pin_dir {
        // The maps' capacity is part of what a pinned state is: a daemon configured for
        // another one does not adopt it.
        Some(dir) => Some(PinDir::open(
            dir,
            pins::build_id(&[EBPF_OBJECT, &opts.max_listeners.to_le_bytes()].concat()),
        )?),
        None => None,
    };
    if let Some(pins) = &pins
        && let Found::Adoptable(mode) = pins.survey(opts.hook_mode)?
    {
        match adopt(pins, mode) {
            Ok(mut probes) => {
                probes.kernel = kernel;
                return Ok(probes);
            }
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
    let mode = modes::choose(opts.hook_mode, kernel)?;
    // Each parse of the kernel's BTF takes tens of MiB: never hold two at once. The
    // btf-rs parse is only needed for the offsets.
    let mut offsets = KernelBtf::open(&opts.btf)?.kernel_offsets()?;
    tracepoint_offsets(&mut offsets)?;
    tracing::debug!(?offsets, "kernel layout resolved");
    // EbpfLoader::new() parses /sys/kernel/btf/vmlinux itself: drop that parse at once and
    // let the loader use ours (which honours --btf) instead.
    let mut loader = EbpfLoader::new();
    loader.btf(None);
    let kernel_btf = aya::Btf::parse_file(&opts.btf, aya::Endianness::default()).map_err(|e| {
        BtfError::Unreadable {
            path: opts.btf.clone(),
            reason: e.to_string(),
        }
    })?;
    loader
        .btf(Some(&kernel_btf))
        .override_global("OFFSETS", &offsets, true)
        .map_max_entries("LISTENER_STATS", opts.max_listeners)
        .map_max_entries("LISTENER_QUEUES", opts.max_listeners);

    let attempts = modes::attempts(opts.hook_mode, mode, kernel);
    let mut attempts = attempts.iter().peekable();
    loop {
        let mode = *attempts.next().expect("at least the chosen mode");
        match load_mode(mode, &mut loader, &kernel_btf, pins.as_ref()) {
            Ok(mut probes) => {
                probes.kernel = kernel;
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

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        s.push_str(": ");
        s.push_str(&cause.to_string());
        source = cause.source();
    }
    s
}

/// Takes over the programs a previous daemon of this build left pinned in `mode`: they
/// have been counting all along, so nothing is loaded or attached.
fn adopt(pins: &PinDir, mode: HookMode) -> Result<Probes, LoadError> {
    let enqueue_events = match mode {
        HookMode::Tracepoint => has_sk_data_ready()?,
        HookMode::Fentry | HookMode::Kprobe => true,
    };
    let [events, events_lost, stats, stats_full, queues, epoch] =
        pins::DAEMON_MAPS.map(|name| pins.open_map(mode, name).map(|map| (name, map)));
    let mut probes = Probes {
        _ebpf: None,
        listener_events: typed(events?)?,
        listener_events_lost: typed(events_lost?)?,
        listener_stats: typed(stats?)?,
        listener_stats_full: typed(stats_full?)?,
        listener_queues: typed(queues?)?,
        queue_epoch: start_epochs(typed(epoch?)?)?,
        _cgroup_ingress: None,
        mode,
        kernel: KernelSupport::default(),
        enqueue_events,
        adopted: true,
        programs: Vec::new(),
    };
    probes.programs = counting_programs(&probes.listener_stats);
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
            name: "QUEUE_EPOCH",
            source,
        })?;
    Ok(epoch)
}

/// Loads the object and attaches `mode`'s programs, pinning them when `pins` is set; on
/// error everything attached so far is detached again (dropping `Ebpf` releases its
/// links, dropping the unfinished `Pinning` removes its pins).
fn load_mode(
    mode: HookMode,
    loader: &mut EbpfLoader<'_>,
    kernel_btf: &aya::Btf,
    pins: Option<&PinDir>,
) -> Result<Probes, LoadError> {
    let mut ebpf = loader.load(EBPF_OBJECT)?;
    let mut pinning = pins.map(|p| p.begin(mode)).transpose()?;
    let pinning = &mut pinning;
    let queue_epoch = start_epochs(typed_map(&mut ebpf, "QUEUE_EPOCH", pinning)?)?;
    for &(program, hooks) in COMMON_TRACEPOINTS {
        attach_tracepoint(&mut ebpf, program, hooks, pinning)?;
    }
    for &(program, tracepoint) in COMMON_RAW_TRACEPOINTS {
        attach_raw_tracepoint(&mut ebpf, program, tracepoint, pinning)?;
    }
    let mut cgroup_ingress = None;
    let enqueue_events = match mode {
        HookMode::Fentry => {
            for &(program, function, exit) in FUNCTION_HOOKS_FENTRY {
                attach_fentry(&mut ebpf, kernel_btf, program, function, exit, pinning)?;
            }
            true
        }
        HookMode::Kprobe => {
            for &(program, functions) in FUNCTION_HOOKS_KPROBE {
                attach_kprobe(&mut ebpf, program, functions, pinning)?;
            }
            let (program, tracepoint) = ACCEPT_RAW_TRACEPOINT;
            attach_raw_tracepoint(&mut ebpf, program, tracepoint, pinning)?;
            true
        }
        HookMode::Tracepoint => {
            for &(program, hooks) in ACCEPT_TRACEPOINTS {
                attach_tracepoint(&mut ebpf, program, hooks, pinning)?;
            }
            let enqueue_events = has_sk_data_ready()?;
            if enqueue_events {
                attach_raw_tracepoint(&mut ebpf, "queued", "sk_data_ready", pinning)?;
            } else {
                tracing::warn!(
                    "this kernel has no sock:sk_data_ready tracepoint: in tracepoint mode, \
                     connections queued for accept and accept-queue wait times are not \
                     reported (other figures are; fentry and kprobe modes report them)"
                );
            }
            // The skb-release hooks first: an ingress stash is only useful once they run.
            // BTF tracepoints have per-program recursion protection (classic tracepoints
            // skip a BPF program whenever any other tracing program is running on the CPU).
            for (program, function) in [("syn_consumed", "consume_skb"), ("syn_freed", "kfree_skb")]
            {
                attach_btf_tracepoint(&mut ebpf, kernel_btf, program, function, pinning)?;
            }
            let ingress = attach_cgroup_ingress(&mut ebpf)?;
            if let Some(pinning) = pinning {
                pinning.raw_link("listener_ingress", ingress.fd())?;
            }
            cgroup_ingress = Some(ingress);
            enqueue_events
        }
    };
    let listener_events = typed_map(&mut ebpf, "LISTENER_EVENTS", pinning)?;
    let listener_events_lost = typed_map(&mut ebpf, "LISTENER_EVENTS_LOST", pinning)?;
    let listener_stats = typed_map(&mut ebpf, "LISTENER_STATS", pinning)?;
    let listener_stats_full = typed_map(&mut ebpf, "LISTENER_STATS_FULL", pinning)?;
    let listener_queues = typed_map(&mut ebpf, "LISTENER_QUEUES", pinning)?;
    if let Some(pinning) = pinning.take() {
        pinning.complete()?;
    }
    Ok(Probes {
        programs: counting_programs(&listener_stats),
        enqueue_events,
        adopted: false,
        mode,
        kernel: KernelSupport::default(),
        listener_queues,
        queue_epoch,
        _ebpf: Some(ebpf),
        listener_events,
        listener_events_lost,
        listener_stats,
        listener_stats_full,
        _cgroup_ingress: cgroup_ingress,
    })
}

fn tracepoint_offsets(o: &mut KernelOffsets) -> Result<(), TracefsError> {
    let tracing = tracefs::tracing_dir()?;
    let enter = Format::read(&tracing, "syscalls", "sys_enter_listen")?;
    o.tp_listen_fd = enter.offset("fd")?;
    o.tp_listen_backlog = enter.offset("backlog")?;
    o.tp_exit_ret = Format::read(&tracing, "syscalls", "sys_exit_listen")?.offset("ret")?;
    o.tp_accept_fd = Format::read(&tracing, "syscalls", "sys_enter_accept4")?.offset("fd")?;
    let accept_fd = Format::read(&tracing, "syscalls", "sys_enter_accept")?.offset("fd")?;
    // One program serves both syscalls; its single offset must fit both records.
    if accept_fd != o.tp_accept_fd {
        return Err(TracefsError::NoField {
            category: "syscalls".into(),
            name: "sys_enter_accept".into(),
            field: format!("fd at offset {} (as in sys_enter_accept4)", o.tp_accept_fd),
            path: "events/syscalls/sys_enter_accept/format".into(),
        });
    }
    Ok(())
}

/// The `sk_data_ready` tracepoint is recent (Linux 6.x); without it, tracepoint mode does
/// not see the enqueue moment (queued, accept wait).
fn has_sk_data_ready() -> Result<bool, TracefsError> {
    match Format::read(&tracefs::tracing_dir()?, "sock", "sk_data_ready") {
        Ok(_) => Ok(true),
        Err(TracefsError::NoTracepoint { .. }) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Mount point of the cgroup v2 hierarchy (`/sys/fs/cgroup` on unified systems,
/// `/sys/fs/cgroup/unified` on hybrid ones).
fn cgroup2_root() -> Result<String, LoadError> {
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    mounts
        .lines()
        .find_map(|l| {
            let mut f = l.split_whitespace();
            let (_, dir, fstype) = (f.next()?, f.next()?, f.next()?);
            (fstype == "cgroup2").then(|| dir.to_owned())
        })
        .ok_or(LoadError::NoCgroup2)
}

/// cgroup_skb programs on the root run for every socket in every cgroup below it.
/// Attached through a BPF link (see `cgroup.rs`): other programs on the cgroup keep
/// working, and the kernel detaches ours when the daemon exits, however it exits.
fn attach_cgroup_ingress(ebpf: &mut Ebpf) -> Result<CgroupAttachment, LoadError> {
    let path = cgroup2_root()?;
    let cgroup = std::fs::File::open(&path).map_err(|source| LoadError::CgroupRoot {
        path: path.clone(),
        source,
    })?;
    let program = "listener_ingress";
    let hook = format!("cgroup_skb/ingress on {path}");
    let prog: &mut CgroupSkb = program_mut(ebpf, program, &hook)?;
    prog.load().map_err(program_error(program, &hook))?;
    let prog_fd = prog
        .fd()
        .map_err(program_error(program, &hook))?
        .as_fd()
        .try_clone_to_owned()
        .map_err(|source| LoadError::Attach {
            hook: hook.clone(),
            source,
        })?;
    CgroupAttachment::attach(cgroup, prog_fd).map_err(|source| LoadError::Attach { hook, source })
}

/// Program `name` of the object as its type `T`; errors name `hook`.
fn program_mut<'a, T>(
    ebpf: &'a mut Ebpf,
    name: &'static str,
    hook: &str,
) -> Result<&'a mut T, LoadError>
where
    &'a mut T: TryFrom<&'a mut aya::programs::Program, Error = ProgramError>,
{
    ebpf.program_mut(name)
        .ok_or(LoadError::Map(name))?
        .try_into()
        .map_err(program_error(name, hook))
}

fn program_error(program: &'static str, hook: &str) -> impl FnOnce(ProgramError) -> LoadError {
    let hook = hook.to_owned();
    move |source| LoadError::Program {
        program,
        hook,
        source,
    }
}

/// Pins the link `take` hands over when the load is pinning; otherwise the link stays
/// with the program (and goes when the daemon exits).
fn pin_link<L, E>(
    pinning: &mut Option<Pinning>,
    program: &'static str,
    hook: &str,
    take: impl FnOnce() -> Result<L, ProgramError>,
) -> Result<(), LoadError>
where
    L: TryInto<FdLink, Error = E>,
    E: std::error::Error + Send + Sync + 'static,
{
    let Some(pinning) = pinning else {
        return Ok(());
    };
    let link = take().map_err(program_error(program, hook))?;
    let link = link.try_into().map_err(|e| PinError::NoLink {
        program: program.to_owned(),
        source: Box::new(e),
    })?;
    Ok(pinning.link(program, link)?)
}

fn attach_tracepoint(
    ebpf: &mut Ebpf,
    program: &'static str,
    hooks: &[(&str, &str)],
    pinning: &mut Option<Pinning>,
) -> Result<(), LoadError> {
    let prog: &mut TracePoint = program_mut(ebpf, program, program)?;
    prog.load().map_err(program_error(program, program))?;
    for (category, name) in hooks {
        let hook = format!("tracepoint {category}:{name}");
        let id = prog
            .attach(category, name)
            .map_err(program_error(program, &hook))?;
        pin_link(pinning, program, &hook, || prog.take_link(id))?;
    }
    Ok(())
}

fn attach_raw_tracepoint(
    ebpf: &mut Ebpf,
    program: &'static str,
    tracepoint: &str,
    pinning: &mut Option<Pinning>,
) -> Result<(), LoadError> {
    let hook = format!("raw tracepoint {tracepoint}");
    let prog: &mut RawTracePoint = program_mut(ebpf, program, &hook)?;
    prog.load().map_err(program_error(program, &hook))?;
    let id = prog
        .attach(tracepoint)
        .map_err(program_error(program, &hook))?;
    pin_link(pinning, program, &hook, || prog.take_link(id))
}

fn attach_kprobe(
    ebpf: &mut Ebpf,
    program: &'static str,
    functions: &[&str],
    pinning: &mut Option<Pinning>,
) -> Result<(), LoadError> {
    let prog: &mut KProbe = program_mut(ebpf, program, program)?;
    prog.load().map_err(program_error(program, program))?;
    for function in functions {
        let hook = format!("kprobe {function}");
        let id = prog
            .attach(function, 0)
            .map_err(program_error(program, &hook))?;
        pin_link(pinning, program, &hook, || prog.take_link(id))?;
    }
    Ok(())
}

fn attach_btf_tracepoint(
    ebpf: &mut Ebpf,
    btf: &aya::Btf,
    program: &'static str,
    function: &str,
    pinning: &mut Option<Pinning>,
) -> Result<(), LoadError> {
    let hook = format!("tp_btf/{function}");
    let prog: &mut BtfTracePoint = program_mut(ebpf, program, &hook)?;
    prog.load(function, btf)
        .map_err(program_error(program, &hook))?;
    let id = prog.attach().map_err(program_error(program, &hook))?;
    pin_link(pinning, program, &hook, || prog.take_link(id))
}

fn attach_fentry(
    ebpf: &mut Ebpf,
    btf: &aya::Btf,
    program: &'static str,
    function: &str,
    exit: bool,
    pinning: &mut Option<Pinning>,
) -> Result<(), LoadError> {
    let hook = format!("{}/{function}", if exit { "fexit" } else { "fentry" });
    let err = || program_error(program, &hook);
    if exit {
        let prog: &mut FExit = program_mut(ebpf, program, &hook)?;
        prog.load(function, btf).map_err(err())?;
        let id = prog.attach().map_err(err())?;
        pin_link(pinning, program, &hook, || prog.take_link(id))
    } else {
        let prog: &mut FEntry = program_mut(ebpf, program, &hook)?;
        prog.load(function, btf).map_err(err())?;
        let id = prog.attach().map_err(err())?;
        pin_link(pinning, program, &hook, || prog.take_link(id))
    }
}

/// Takes map `name` out of the object as the typed map `T`, pinning it first when the
/// load is pinning.
fn typed_map<T>(
    ebpf: &mut Ebpf,
    name: &'static str,
    pinning: &Option<Pinning>,
) -> Result<T, LoadError>
where
    T: TryFrom<Map, Error = aya::maps::MapError>,
{
    let map = ebpf.take_map(name).ok_or(LoadError::Map(name))?;
    if let Some(pinning) = pinning {
        pinning.map(name, &map)?;
    }
    typed((name, map))
}

fn typed<T>((name, map): (&'static str, Map)) -> Result<T, LoadError>
where
    T: TryFrom<Map, Error = aya::maps::MapError>,
{
    T::try_from(map).map_err(|source| LoadError::MapType { name, source })
}
