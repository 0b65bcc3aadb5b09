//! Plumbing: loading one program of the object and attaching it to a [`Hook`], pinning
//! its links when the load is pinning, and taking typed maps out of the object.

use std::os::fd::AsFd as _;

use aya::{
    Ebpf,
    maps::Map,
    programs::{
        BtfTracePoint, CgroupSkb, FEntry, FExit, KProbe, ProgramError, RawTracePoint, links::FdLink,
    },
};

use super::{
    cgroup::CgroupAttachment,
    error::LoadError,
    hooks::Hook,
    pins::{PinError, Pinning},
};

/// Loads `hook`'s program and attaches it; a cgroup attachment is returned (it lives as
/// long as its fd), every other link stays with the program or its pin.
pub fn attach(
    ebpf: &mut Ebpf,
    btf: &aya::Btf,
    hook: &Hook,
    pinning: &mut Option<Pinning>,
) -> Result<Option<CgroupAttachment>, LoadError> {
    match *hook {
        Hook::RawTracepoint {
            program,
            tracepoint,
        } => raw_tracepoint(ebpf, program, tracepoint, pinning)?,
        Hook::BtfTracepoint { program, function } => {
            btf_tracepoint(ebpf, btf, program, function, pinning)?;
        }
        Hook::Fentry { program, function } => {
            fentry(ebpf, btf, program, function, false, pinning)?;
        }
        Hook::Fexit { program, function } => fentry(ebpf, btf, program, function, true, pinning)?,
        Hook::Kprobe { program, functions } => kprobe(ebpf, program, functions, pinning)?,
        Hook::CgroupIngress { program } => {
            let ingress = cgroup_ingress(ebpf, program)?;
            if let Some(pinning) = pinning {
                pinning.raw_link(program, ingress.fd())?;
            }
            return Ok(Some(ingress));
        }
    }
    Ok(None)
}

/// The root of the cgroup v2 hierarchy: its mount point (`/sys/fs/cgroup` on unified
/// systems, `/sys/fs/cgroup/unified` on hybrid ones). In a cgroup namespace of its own (a
/// container; a pod on cgroup v2), the daemon's mount shows only its own cgroup, where the
/// program would see only that container's sockets. With the host's PID namespace (PID 1 is
/// the host's init), `/proc/1/root` reaches the host's mount; otherwise loading stops with
/// the fix instead of counting a fraction of the host.
fn cgroup2_root() -> Result<String, LoadError> {
    let first_cgroup2 = |mounts: &str| {
        mounts.lines().find_map(|l| {
            let mut f = l.split_whitespace();
            let (_, dir, fstype) = (f.next()?, f.next()?, f.next()?);
            (fstype == "cgroup2").then(|| dir.to_owned())
        })
    };
    // Every cgroup but the hierarchy's root has a cgroup.type file.
    let is_root = |dir: &str| {
        let dir = std::path::Path::new(dir);
        dir.join("cgroup.procs").exists() && !dir.join("cgroup.type").exists()
    };
    let own = first_cgroup2(&std::fs::read_to_string("/proc/self/mounts").unwrap_or_default())
        .ok_or(LoadError::NoCgroup2)?;
    if is_root(&own) {
        return Ok(own);
    }
    let host = first_cgroup2(&std::fs::read_to_string("/proc/1/mounts").unwrap_or_default())
        .map(|dir| format!("/proc/1/root{dir}"));
    match host {
        Some(host) if is_root(&host) => {
            tracing::info!(
                own = %own,
                "this cgroup v2 mount is not the hierarchy's root (a cgroup namespace of \
                 its own, as in a container); attaching at the host's: {host}"
            );
            Ok(host)
        }
        _ => Err(LoadError::CgroupNamespace { mount: own }),
    }
}

/// cgroup_skb programs on the root run for every socket in every cgroup below it.
/// Attached through a BPF link (see `cgroup.rs`): other programs on the cgroup keep
/// working, and the kernel detaches ours when the daemon exits, however it exits.
fn cgroup_ingress(ebpf: &mut Ebpf, program: &'static str) -> Result<CgroupAttachment, LoadError> {
    let path = cgroup2_root()?;
    let cgroup = std::fs::File::open(&path).map_err(|source| LoadError::CgroupRoot {
        path: path.clone(),
        source,
    })?;
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
        .ok_or(LoadError::MissingProgram(name))?
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

fn raw_tracepoint(
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

fn kprobe(
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

fn btf_tracepoint(
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

fn fentry(
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
pub fn typed_map<T>(
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

pub fn typed<T>((name, map): (&'static str, Map)) -> Result<T, LoadError>
where
    T: TryFrom<Map, Error = aya::maps::MapError>,
{
    T::try_from(map).map_err(|source| LoadError::MapType { name, source })
}
