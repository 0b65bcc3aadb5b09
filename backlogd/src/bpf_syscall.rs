//! Every bpf(2) command backlogd makes itself, behind safe functions: those aya 0.14 lacks
//! (batch lookups, pinning an fd it does not wrap) or gets wrong on some kernels (cgroup
//! link creation, see `loader/cgroup.rs`). The command numbers and `union bpf_attr` layouts
//! are uapi and stable; nothing else in the daemon calls bpf(2) or knows them.
//!
//! A leaf: it uses nothing of the crate, so both the loader (pinning, cgroup links) and
//! the map reader (`kernel_maps.rs`, batch lookups) stand on it without reaching each
//! other through it.

use std::{
    io,
    os::fd::{AsFd as _, AsRawFd as _, BorrowedFd, FromRawFd as _, OwnedFd},
    path::Path,
};

use aya::Pod;

const BPF_MAP_GET_NEXT_KEY: libc::c_long = 4;
const BPF_OBJ_PIN: libc::c_long = 6;
const BPF_OBJ_GET: libc::c_long = 7;
const BPF_MAP_LOOKUP_BATCH: libc::c_long = 24;
const BPF_LINK_CREATE: libc::c_long = 28;
const BPF_ITER_CREATE: libc::c_long = 33;
const BPF_CGROUP_INET_INGRESS: u32 = 0;
const BPF_TRACE_ITER: u32 = 28;

/// `bpf(cmd, attr, sizeof attr)`: the return value, or the errno as an error.
///
/// # Safety
/// `A` must be the uapi `union bpf_attr` layout `cmd` reads (a prefix of it), and every
/// pointer in it must be valid for what the kernel reads or writes through it.
unsafe fn bpf<A>(cmd: libc::c_long, attr: &mut A) -> io::Result<i64> {
    // SAFETY: the caller's contract above; the kernel reads and may write back `attr`.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            std::ptr::from_mut(attr),
            size_of::<A>() as libc::c_uint,
        )
    };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

/// The prefix of `union bpf_attr` that BPF_LINK_CREATE reads for cgroup links; the
/// kernel treats the omitted tail as zero.
#[repr(C)]
#[derive(Default)]
struct LinkCreateAttr {
    prog_fd: u32,
    target_fd: u32,
    attach_type: u32,
    flags: u32,
    _rest: [u32; 12],
}

/// BPF_LINK_CREATE of a cgroup_skb ingress link of `prog` on `cgroup`: the link fd.
pub fn link_cgroup_ingress(prog: BorrowedFd<'_>, cgroup: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    let mut attr = LinkCreateAttr {
        prog_fd: prog.as_raw_fd() as u32,
        target_fd: cgroup.as_raw_fd() as u32,
        attach_type: BPF_CGROUP_INET_INGRESS,
        ..Default::default()
    };
    // SAFETY: LinkCreateAttr is the BPF_LINK_CREATE prefix of bpf_attr; it holds no
    // pointers.
    let fd = unsafe { bpf(BPF_LINK_CREATE, &mut attr) }?;
    // SAFETY: the kernel just returned this fd and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// BPF_LINK_CREATE of an iterator link of `prog` (an `iter/` tracing program that takes
/// no parameters, such as `task_file`): the link fd, from which
/// [`iter_create`] opens each pass.
pub fn link_iterator(prog: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    let mut attr = LinkCreateAttr {
        prog_fd: prog.as_raw_fd() as u32,
        attach_type: BPF_TRACE_ITER,
        ..Default::default()
    };
    // SAFETY: as in `link_cgroup_ingress`; the zero tail is a NULL `iter_info` of length
    // 0, what an iterator without parameters takes.
    let fd = unsafe { bpf(BPF_LINK_CREATE, &mut attr) }?;
    // SAFETY: the kernel just returned this fd and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// The BPF_ITER_CREATE member of `union bpf_attr`.
#[repr(C)]
struct IterCreateAttr {
    link_fd: u32,
    flags: u32,
}

/// BPF_ITER_CREATE: a new pass of iterator link `link`, as a file whose reads run the
/// program over the kernel's objects. No capability beyond bpf(2) access: the running
/// daemon opens one per scan after it has dropped the loading ones.
pub fn iter_create(link: BorrowedFd<'_>) -> io::Result<std::fs::File> {
    let mut attr = IterCreateAttr {
        link_fd: link.as_raw_fd() as u32,
        flags: 0,
    };
    // SAFETY: IterCreateAttr is the BPF_ITER_CREATE member of bpf_attr; no pointers.
    let fd = unsafe { bpf(BPF_ITER_CREATE, &mut attr) }?;
    // SAFETY: the kernel just returned this fd and nothing else owns it.
    Ok(std::fs::File::from(unsafe {
        OwnedFd::from_raw_fd(fd as i32)
    }))
}

/// The BPF_OBJ_* member of `union bpf_attr`.
#[repr(C)]
struct ObjAttr {
    pathname: u64,
    bpf_fd: u32,
    file_flags: u32,
    path_fd: i32,
    _pad: u32,
}

/// BPF_OBJ_PIN: pins `fd` (a link, map or program) at `path` on bpffs.
pub fn obj_pin(fd: BorrowedFd<'_>, path: &Path) -> io::Result<()> {
    use std::os::unix::ffi::OsStrExt as _;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    let mut attr = ObjAttr {
        pathname: c.as_ptr() as u64,
        bpf_fd: fd.as_raw_fd() as u32,
        file_flags: 0,
        path_fd: 0,
        _pad: 0,
    };
    // SAFETY: ObjAttr is the BPF_OBJ_* member of bpf_attr; its pathname outlives the call.
    unsafe { bpf(BPF_OBJ_PIN, &mut attr) }.map(|_| ())
}

/// BPF_OBJ_GET: opens the object pinned at `path` (a link or program; maps go through
/// aya). Needs read and write access to the pin, and no capability where
/// `kernel.unprivileged_bpf_disabled` gates only loading and map creation (6.1 does; 5.10
/// gates every bpf(2) command: CAP_BPF while it is set).
pub fn obj_get(path: &Path) -> io::Result<OwnedFd> {
    use std::os::unix::ffi::OsStrExt as _;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    let mut attr = ObjAttr {
        pathname: c.as_ptr() as u64,
        bpf_fd: 0,
        file_flags: 0,
        path_fd: 0,
        _pad: 0,
    };
    // SAFETY: as in `obj_pin`.
    let fd = unsafe { bpf(BPF_OBJ_GET, &mut attr) }?;
    // SAFETY: the kernel just returned this fd and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// The BPF_MAP_*_ELEM member of `union bpf_attr`.
#[repr(C)]
struct ElemAttr {
    map_fd: u32,
    _pad: u32,
    key: u64,
    next_key: u64,
    flags: u64,
}

/// Whether this thread may use bpf(2) on `map` as it is now: one BPF_MAP_GET_NEXT_KEY
/// from the start (an empty map's ENOENT is an answer too). A kernel that gates every
/// bpf(2) command refuses it with EPERM.
pub fn map_access_allowed<K: Pod, V: Pod>(
    map: &aya::maps::PerCpuHashMap<aya::maps::MapData, K, V>,
) -> bool {
    use aya::maps::IterableMap as _;
    // aya checked at the map's creation that its keys are `K`s: the kernel writes one.
    let mut next = vec![0u8; size_of::<K>()];
    let mut attr = ElemAttr {
        map_fd: map.map().fd().as_fd().as_raw_fd() as u32,
        _pad: 0,
        key: 0,
        next_key: next.as_mut_ptr() as u64,
        flags: 0,
    };
    // SAFETY: ElemAttr is the BPF_MAP_GET_NEXT_KEY member of bpf_attr; a NULL key asks for
    // the first key, which the kernel writes into `next`, the size of the map's keys.
    match unsafe { bpf(BPF_MAP_GET_NEXT_KEY, &mut attr) } {
        Ok(_) => true,
        Err(e) => e.raw_os_error() == Some(libc::ENOENT),
    }
}

/// The BPF_MAP_LOOKUP_BATCH part of `union bpf_attr`.
#[repr(C)]
#[derive(Default)]
struct BatchAttr {
    in_batch: u64,
    out_batch: u64,
    keys: u64,
    values: u64,
    count: u32,
    map_fd: u32,
    elem_flags: u64,
    flags: u64,
}

/// Where a batched walk of a map stands.
#[derive(Debug, Default)]
pub struct BatchCursor {
    token: u64,
    started: bool,
}

/// One BPF_MAP_LOOKUP_BATCH of a per-CPU hash map with `u64` keys: fills `keys` and
/// `values` (cleared first; `cpus` values per key, as the kernel lays them out) with up
/// to `max` entries after `cursor`. Returns whether these were the map's last entries.
///
/// `V` must be a multiple of 8 bytes: the kernel copies each CPU's value rounded up to 8.
///
/// # Safety
/// `map`'s values must be `V`s, and `cpus` the possible CPUs: the kernel writes `max`
/// keys and `max * cpus` values at its own sizes into buffers sized for these.
pub unsafe fn lookup_batch_per_cpu<V: Pod>(
    map: BorrowedFd<'_>,
    cursor: &mut BatchCursor,
    max: u32,
    cpus: usize,
    keys: &mut Vec<u64>,
    values: &mut Vec<V>,
) -> io::Result<bool> {
    if !size_of::<V>().is_multiple_of(8) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "per-CPU values must be a multiple of 8 bytes for a batch lookup",
        ));
    }
    // SAFETY: the caller's contract above.
    unsafe { lookup_batch_of(map, cursor, max, cpus, keys, values) }
}

/// One BPF_MAP_LOOKUP_BATCH of a (not per-CPU) hash map whose keys are `K` and values `V`:
/// fills `keys` and `values` (cleared first) with up to `max` entries after `cursor`.
/// Returns whether these were the map's last entries.
///
/// # Safety
/// `map`'s key and value sizes must be those of `K` and `V`: the kernel writes `max` of
/// each at its own sizes into buffers sized for these.
pub unsafe fn lookup_batch<K: Pod, V: Pod>(
    map: BorrowedFd<'_>,
    cursor: &mut BatchCursor,
    max: u32,
    keys: &mut Vec<K>,
    values: &mut Vec<V>,
) -> io::Result<bool> {
    // SAFETY: the caller's contract above.
    unsafe { lookup_batch_of(map, cursor, max, 1, keys, values) }
}

/// The batch lookup of both kinds: `per_key` values of `V` per key.
///
/// # Safety
/// `map`'s keys must be `K`s and each key's values `per_key` `V`s (see the callers).
unsafe fn lookup_batch_of<K: Pod, V: Pod>(
    map: BorrowedFd<'_>,
    cursor: &mut BatchCursor,
    max: u32,
    per_key: usize,
    keys: &mut Vec<K>,
    values: &mut Vec<V>,
) -> io::Result<bool> {
    keys.clear();
    keys.reserve(max as usize);
    values.clear();
    values.reserve(max as usize * per_key);
    let mut attr = BatchAttr {
        in_batch: if cursor.started {
            (&raw const cursor.token) as u64
        } else {
            0
        },
        out_batch: (&raw mut cursor.token) as u64,
        keys: keys.as_mut_ptr() as u64,
        values: values.as_mut_ptr() as u64,
        count: max,
        map_fd: map.as_raw_fd() as u32,
        ..BatchAttr::default()
    };
    // SAFETY: BatchAttr is the command's part of bpf_attr; its pointers are to the cursor's
    // token and to buffers with room for `max` keys and `max * per_key` values, all live
    // here.
    let done = match unsafe { bpf(BPF_MAP_LOOKUP_BATCH, &mut attr) } {
        Ok(_) => false,
        // ENOENT: this batch holds the last entries.
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => true,
        Err(e) => return Err(e),
    };
    cursor.started = true;
    let n = (attr.count as usize).min(max as usize);
    // SAFETY: the kernel wrote `n` keys and `n * per_key` values (K and V are Pod, so any
    // bytes are valid), within the reserved capacity.
    unsafe {
        keys.set_len(n);
        values.set_len(n * per_key);
    }
    Ok(done)
}
