//! Whole per-CPU hash maps in a few `BPF_MAP_LOOKUP_BATCH` syscalls (Linux 5.6+) instead
//! of two syscalls per entry (get_next_key + lookup) as aya's `iter()` does.

use std::os::fd::{AsFd as _, AsRawFd as _};

use aya::Pod;
use aya::maps::{IterableMap, MapData, PerCpuHashMap};

const BPF_MAP_LOOKUP_BATCH: libc::c_long = 24;
/// Entries per syscall.
const BATCH: u32 = 4096;

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

fn possible_cpus() -> usize {
    static N: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *N.get_or_init(|| aya::util::nr_cpus().unwrap_or(1))
}

/// Every entry of `map` with its per-CPU values folded by `fold` (one call per entry,
/// with the entry's values, one per possible CPU). `None` when the kernel refuses batch
/// lookups (the caller falls back to iterating).
pub fn fold_per_cpu<V: Pod, T>(
    map: &PerCpuHashMap<MapData, u64, V>,
    mut fold: impl FnMut(u64, &[V]) -> T,
) -> Option<Vec<(u64, T)>> {
    let fd = map.map().fd().as_fd().as_raw_fd();
    let cpus = possible_cpus();
    // The kernel copies each CPU's value rounded up to 8 bytes: a type of another size
    // would be misread, so it takes the slow path.
    if !std::mem::size_of::<V>().is_multiple_of(8) {
        return None;
    }
    let mut keys = vec![0u64; BATCH as usize];
    let mut values: Vec<V> = Vec::with_capacity(BATCH as usize * cpus);
    let mut out = Vec::new();
    let mut token = 0u64;
    let mut first = true;
    loop {
        let mut attr = BatchAttr {
            in_batch: if first { 0 } else { (&raw const token) as u64 },
            out_batch: (&raw mut token) as u64,
            keys: keys.as_mut_ptr() as u64,
            values: values.as_mut_ptr() as u64,
            count: BATCH,
            map_fd: fd as u32,
            ..BatchAttr::default()
        };
        // SAFETY: attr points at buffers of BATCH keys and BATCH * cpus values.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                BPF_MAP_LOOKUP_BATCH,
                &raw mut attr,
                std::mem::size_of::<BatchAttr>(),
            )
        };
        let err = (rc < 0).then(std::io::Error::last_os_error);
        let done = match &err {
            None => false,
            Some(e) if e.raw_os_error() == Some(libc::ENOENT) => true,
            Some(_) => return None,
        };
        let n = attr.count as usize;
        // SAFETY: the kernel wrote `n` entries of `cpus` values each.
        unsafe { values.set_len(n * cpus) };
        for (i, key) in keys[..n].iter().enumerate() {
            out.push((*key, fold(*key, &values[i * cpus..(i + 1) * cpus])));
        }
        // SAFETY: V is Pod; forget the copies before the next batch overwrites them.
        unsafe { values.set_len(0) };
        if done {
            return Some(out);
        }
        first = false;
    }
}
