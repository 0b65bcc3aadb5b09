//! Whole per-CPU hash maps in a few `BPF_MAP_LOOKUP_BATCH` syscalls (Linux 5.6+) instead
//! of two syscalls per entry (get_next_key + lookup) as aya's `iter()` does.

use std::os::fd::{AsFd as _, AsRawFd as _};

use aya::{
    Pod,
    maps::{IterableMap, MapData, PerCpuHashMap},
};

use crate::loader::syscall;

const BPF_MAP_LOOKUP_BATCH: libc::c_long = 24;
/// Entries per syscall.
const BATCH: u32 = 4096;

/// The BPF_MAP_LOOKUP_BATCH part of `union bpf_attr` (uapi, stable).
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

/// Every entry of `map` with its per-CPU values (one per possible CPU) folded by `fold`:
/// by batch lookups, or entry by entry where the kernel refuses those.
pub fn fold_per_cpu<V: Pod, T>(
    map: &PerCpuHashMap<MapData, u64, V>,
    mut fold: impl FnMut(&[V]) -> T,
) -> Vec<(u64, T)> {
    if let Some(all) = batched(map, &mut fold) {
        return all;
    }
    map.iter()
        .filter_map(Result::ok)
        .map(|(key, per_cpu)| (key, fold(&per_cpu)))
        .collect()
}

fn batched<V: Pod, T>(
    map: &PerCpuHashMap<MapData, u64, V>,
    fold: &mut impl FnMut(&[V]) -> T,
) -> Option<Vec<(u64, T)>> {
    // The kernel copies each CPU's value rounded up to 8 bytes: a type of another size
    // would be misread, so it takes the slow path.
    if !size_of::<V>().is_multiple_of(8) {
        return None;
    }
    let fd = map.map().fd().as_fd().as_raw_fd();
    let cpus = possible_cpus();
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
        // SAFETY: BatchAttr is the command's part of bpf_attr; its pointers are to the
        // token and to buffers of BATCH keys and BATCH * cpus values, all live here.
        let done = match unsafe { syscall::bpf(BPF_MAP_LOOKUP_BATCH, &mut attr) } {
            Ok(_) => false,
            // ENOENT: this batch holds the last entries.
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => true,
            Err(_) => return None,
        };
        let n = attr.count as usize;
        // SAFETY: the kernel wrote `n` entries of `cpus` values each; V is Pod.
        unsafe { values.set_len(n * cpus) };
        for (key, per_cpu) in keys[..n].iter().zip(values.chunks_exact(cpus)) {
            out.push((*key, fold(per_cpu)));
        }
        values.clear();
        if done {
            return Some(out);
        }
        first = false;
    }
}
