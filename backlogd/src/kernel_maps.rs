//! The eBPF maps the daemon reads (at scrape time and by the queue sampler), and every
//! read of them: per-CPU values summed or merged here, so the exporters see plain
//! per-listener figures.

use std::{
    collections::{HashMap, HashSet},
    os::fd::{AsFd as _, AsRawFd as _, BorrowedFd, OwnedFd},
    sync::{Arc, Mutex},
    time::Instant,
};

use aya::{
    Pod,
    maps::{Array, HashMap as BpfHashMap, IterableMap as _, MapData, PerCpuArray, PerCpuHashMap},
};
use backlogd_common::{
    Attempt, AttemptKey, ListenerEvent, ListenerStats, QueueState, SourceCounts, SourceKey,
    map_full, names::map,
};

use crate::{
    bpf_syscall::{self as syscall, BatchCursor},
    queues::{QueueWindows, merge},
};

/// The maps userspace reads (the ring buffer of listener events aside: the event loop
/// owns it).
pub struct KernelMaps {
    /// Per-CPU count of lifecycle events the ring buffer had no room for.
    pub events_lost: PerCpuArray<MapData, u64>,
    /// Per-listener SYN-path and accept counters, per CPU, keyed by socket inode.
    pub listener_stats: PerCpuHashMap<MapData, u64, ListenerStats>,
    /// Per-CPU count of updates that found a per-listener map full, by `map_full` slot.
    pub listener_stats_full: PerCpuArray<MapData, u64>,
    /// Queue depths and not-yet-sampled maxima, per CPU, keyed by socket inode.
    pub listener_queues: PerCpuHashMap<MapData, u64, QueueState>,
    /// Sampling epoch the kernel tags queue maxima with.
    pub queue_epoch: Array<MapData, u32>,
    /// The last LISTEN event of every live listener, by socket inode: what a listener
    /// older than this daemon asked for, if a daemon before it (with pins) saw it.
    pub listens_seen: BpfHashMap<MapData, u64, ListenerEvent>,
    /// backlogd's attached programs and the kernel's names for them, for the runs the
    /// kernel skipped; `None` where this process cannot find them (pins adopted without
    /// the programs pinned beside them and without CAP_SYS_ADMIN, see
    /// `loader::counting_programs`).
    pub programs: Option<Vec<(OwnedFd, String)>>,
    /// Connection attempts with a dropped segment, not yet completed (`impact.rs` in the
    /// eBPF crate).
    pub attempts: BpfHashMap<MapData, AttemptKey, Attempt>,
    /// Per-CPU count of dropped segments whose attempt the map had no room for.
    pub attempts_untracked: PerCpuArray<MapData, u64>,
    /// Attempts the daemon found past the horizon, by listener inode (pinned with the
    /// others, so the counts survive a restart): added to the programs' own `abandoned`
    /// counts (attempts a new one on the same 4-tuple replaced).
    pub abandoned: BpfHashMap<MapData, u64, u64>,
    /// Dropped and cookie-answered segments per listener and source prefix
    /// (`sources.rs` in the eBPF crate).
    pub drop_sources: BpfHashMap<MapData, SourceKey, SourceCounts>,
    /// Expired counts removed from `drop_sources` whose listener's expired entry could not
    /// be written (the map full), by listener inode: written at the next expiry pass, read
    /// as part of that entry until then.
    pub expired_pending: HashMap<u64, SourceCounts>,
    /// Attempts in the map as of the last sweep.
    pub tracked: u64,
    /// Sweeps so far: `tracked` is as of the last one.
    pub sweeps: u64,
}

/// What a sweep of the attempts map found.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Sweep {
    /// Attempts still within their horizon after the sweep.
    pub tracked: u64,
    /// Attempts past their horizon this sweep removed (counted abandoned if their listener
    /// is still open).
    pub abandoned: u64,
    /// Of those, attempts of listeners that have closed (not counted).
    pub gone: u64,
}

pub type SharedMaps = Arc<Mutex<KernelMaps>>;

impl KernelMaps {
    /// Keys of the per-listener maps (socket inodes).
    pub fn keys(&self) -> HashSet<u64> {
        let stats = self.listener_stats.keys().filter_map(Result::ok);
        stats
            .chain(self.listener_queues.keys().filter_map(Result::ok))
            .chain(self.listens_seen.keys().filter_map(Result::ok))
            .chain(self.abandoned.keys().filter_map(Result::ok))
            // The programs never remove a closed listener's prefixes: its inode stays a
            // key here until the rescans find it orphaned and remove() takes them.
            .chain(
                self.drop_sources
                    .keys()
                    .filter_map(Result::ok)
                    .map(|k| k.listener_ino),
            )
            .collect()
    }

    /// The LISTEN events the kernel kept for `inodes` (see `listens_seen`).
    pub fn listens_seen(&self, inodes: &HashSet<u64>) -> Vec<ListenerEvent> {
        inodes
            .iter()
            .filter_map(|ino| self.listens_seen.get(ino, 0).ok())
            .collect()
    }

    /// Lifecycle events lost to a full ring buffer, summed over CPUs.
    pub fn events_lost(&self) -> u64 {
        sum_at(&self.events_lost, 0, map::LISTENER_EVENTS_LOST)
    }

    /// Per-listener counter updates lost to a full map, summed over CPUs.
    pub fn stats_full(&self) -> u64 {
        sum_at(
            &self.listener_stats_full,
            map_full::STATS,
            map::LISTENER_STATS_FULL,
        )
    }

    /// Per-listener queue observations lost to a full map, summed over CPUs.
    pub fn queues_full(&self) -> u64 {
        sum_at(
            &self.listener_stats_full,
            map_full::QUEUES,
            map::LISTENER_STATS_FULL,
        )
    }

    /// Per-listener counters summed over CPUs, with the SYNs and queued connections the
    /// programs count beside the queues (`QueueState::syns`, `queued`) and the abandoned
    /// attempts this daemon counted, and each listener's queue state merged over CPUs for
    /// sampling epoch `epoch`: one walk of each map. A listener with only a queue entry (its
    /// SYNs and connections so far all counted there) has a row of counters too.
    pub fn listener_stats_and_queues<M: FromIterator<(u64, ListenerStats)>>(
        &self,
        epoch: u32,
    ) -> (M, Vec<(u64, QueueState)>) {
        let queues = fold_per_cpu(&self.listener_queues, |per_cpu| {
            let hot = per_cpu.iter().fold((0, 0), |(syns, queued), q| {
                (syns + q.syns, queued + q.queued)
            });
            (merge(per_cpu, epoch), hot)
        });
        let mut all = self.counters();
        for (ino, (_, (syns, queued))) in &queues {
            // A queue entry that counted nothing (only accepts observed it) adds no row.
            if syns | queued == 0 && !all.contains_key(ino) {
                continue;
            }
            let stats = all.entry(*ino).or_default();
            stats.syns += syns;
            stats.queued += queued;
        }
        (
            all.into_iter().collect(),
            queues.into_iter().map(|(ino, (q, _))| (ino, q)).collect(),
        )
    }

    /// The counters of `LISTENER_STATS` alone, summed over CPUs, with the abandoned
    /// attempts: every figure but the SYNs and queued connections counted beside the
    /// queues, so without a walk of the queue map (the recent figures' records need none
    /// of those two).
    pub fn counters(&self) -> HashMap<u64, ListenerStats> {
        // Entries only for listeners with abandoned attempts: few.
        let abandoned: HashMap<u64, u64> = self.abandoned.iter().filter_map(Result::ok).collect();
        fold_per_cpu(&self.listener_stats, |per_cpu| {
            let mut total = ListenerStats::default();
            per_cpu.iter().for_each(|s| total.add(s));
            total
        })
        .into_iter()
        .map(|(ino, mut stats)| {
            stats.abandoned += abandoned.get(&ino).copied().unwrap_or(0);
            (ino, stats)
        })
        .collect()
    }

    /// Dropped segments whose attempt the attempts map had no room for, summed over CPUs.
    pub fn attempts_untracked(&self) -> u64 {
        sum_at(&self.attempts_untracked, 0, map::ATTEMPTS_UNTRACKED)
    }

    /// Moves the kernel's queue maxima of the epoch that ends now into `windows`, then
    /// starts the next epoch (see `queues.rs`).
    pub fn sample_queues(&mut self, windows: &mut QueueWindows, now: Instant) {
        let epoch = windows.epoch();
        let entries = fold_per_cpu(&self.listener_queues, |per_cpu| merge(per_cpu, epoch));
        windows.record_all(entries, now);
        let next = windows.next_epoch();
        match self.queue_epoch.set(0, next, 0) {
            Ok(()) => windows.advanced_to(next),
            Err(e) => tracing::warn!(error = %e, "cannot advance the queue sampling epoch"),
        }
    }

    /// Every listener's source prefixes, as the kernel counted them so far, and its expired
    /// entry (`SourceKey::EXPIRED`).
    pub fn drop_sources(&self) -> Vec<(SourceKey, SourceCounts)> {
        let mut entries: Vec<(SourceKey, SourceCounts)> =
            self.drop_sources.iter().filter_map(Result::ok).collect();
        for (ino, pending) in &self.expired_pending {
            let key = SourceKey::expired(*ino);
            match entries.iter_mut().find(|(k, _)| *k == key) {
                Some((_, c)) => add_counts(c, pending),
                None => entries.push((key, *pending)),
            }
        }
        entries
    }

    /// Forgets every source prefix whose newest segment is `retention_ns` or more before
    /// `now_ns` (client addresses are kept no longer), adding its counts to its listener's
    /// expired entry, so the listener's entries still add up to its drops and syncookies.
    /// Returns how many prefixes went.
    ///
    /// The one miscount it allows: the programs add to an entry through a pointer they
    /// looked up, without the map's lock, and a removed element of a preallocated map is
    /// reused at once. So a segment from a prefix silent for `retention_ns` that is counted
    /// in the microseconds between the read of its entry here and its removal is lost, or
    /// lands on whatever prefix took the element next. Each entry is read again (and its
    /// age checked again) just before it is removed, to keep that gap to one syscall.
    pub fn expire_drop_sources(&mut self, now_ns: u64, retention_ns: u64) -> u64 {
        let mut stale: HashMap<u64, Vec<SourceKey>> = HashMap::new();
        for (key, counts) in self.drop_sources.iter().filter_map(Result::ok) {
            if key.version != SourceKey::EXPIRED
                && now_ns.saturating_sub(counts.last_ns) >= retention_ns
            {
                stale.entry(key.listener_ino).or_default().push(key);
            }
        }
        let mut removed = 0;
        let listeners: HashSet<u64> = stale
            .keys()
            .chain(self.expired_pending.keys())
            .copied()
            .collect();
        for ino in listeners {
            let mut gone = self.expired_pending.remove(&ino).unwrap_or_default();
            for key in stale.remove(&ino).unwrap_or_default() {
                // Read again: it may have had a segment since the scan above.
                let Ok(counts) = self.drop_sources.get(&key, 0) else {
                    continue;
                };
                if now_ns.saturating_sub(counts.last_ns) < retention_ns {
                    continue;
                }
                if self.drop_sources.remove(&key).is_ok() {
                    add_counts(&mut gone, &counts);
                    removed += 1;
                }
            }
            let key = SourceKey::expired(ino);
            let mut expired = self.drop_sources.get(&key, 0).unwrap_or_default();
            add_counts(&mut expired, &gone);
            expired.last_ns = expired.last_ns.max(now_ns);
            if let Err(e) = self.drop_sources.insert(key, expired, 0) {
                // Only a new entry can fail (the map full, the programs having taken the
                // slots just freed): the counts wait here for the next pass.
                tracing::warn!(
                    listener = ino,
                    error = %e,
                    "the expired counts of a listener's drop sources found the map full: held \
                     in memory until the next pass (a restart before then loses them, and the \
                     listener's sources then add up to less than its drops)"
                );
                self.expired_pending.insert(ino, gone);
            }
        }
        removed
    }

    /// Removes `inodes` from the per-listener maps; returns how many entries went.
    pub fn remove(&mut self, inodes: &HashSet<u64>) -> u64 {
        let mut removed = 0;
        for ino in inodes {
            removed += u64::from(self.listener_stats.remove(ino).is_ok());
            removed += u64::from(self.listener_queues.remove(ino).is_ok());
            removed += u64::from(self.listens_seen.remove(ino).is_ok());
            let _ = self.abandoned.remove(ino);
        }
        // A closed listener's prefixes free their slots for the listeners still open.
        if !inodes.is_empty() {
            let gone: Vec<SourceKey> = self
                .drop_sources
                .keys()
                .filter_map(Result::ok)
                .filter(|k| inodes.contains(&k.listener_ino))
                .collect();
            for key in gone {
                let _ = self.drop_sources.remove(&key);
            }
            self.expired_pending.retain(|ino, _| !inodes.contains(ino));
        }
        removed
    }

    /// Runs of each of backlogd's programs the kernel skipped (`recursion_misses` in their
    /// fdinfo), by the kernel's name for the program; `None` when this kernel does not
    /// report it, or the programs are not known (a sum of none would read as no skips).
    pub fn missed_runs(&self) -> Option<Vec<(&str, u64)>> {
        self.programs
            .as_ref()?
            .iter()
            .map(|(prog, name)| {
                let info = std::fs::read_to_string(format!(
                    "/proc/self/fdinfo/{}",
                    prog.as_fd().as_raw_fd()
                ))
                .ok()?;
                let misses = info
                    .lines()
                    .find_map(|l| l.strip_prefix("recursion_misses:"))
                    .and_then(|n| n.trim().parse::<u64>().ok())?;
                Some((name.as_str(), misses))
            })
            .collect()
    }
}

/// Attempts a sweep removes per hold of the maps' lock: under a flood a sweep removes up
/// to client_impact_attempts of them, two syscalls each, and a scrape waits for no more
/// than this many.
const SWEEP_CHUNK: usize = 256;

/// Removes the attempts whose first drop is more than `horizon_ns` old (the programs'
/// clock, CLOCK_MONOTONIC) and counts each abandoned on its listener. An attempt is
/// counted only if this delete removed it: a program that matched its completion at the
/// same moment removed it first and counted it delayed instead.
///
/// Blocking (syscalls, and the maps' lock in short holds): call it off the async workers.
/// The counts and `tracked` change in one hold at the end, so a scrape sees a sweep's
/// figures whole or not at all.
pub fn sweep_attempts(maps: &SharedMaps, horizon_ns: u64) -> Sweep {
    let lock = || maps.lock().unwrap_or_else(|e| e.into_inner());
    let now = monotonic_ns();
    let mut sweep = Sweep::default();
    // The whole map is read without the lock, through a duplicate of its fd: a scrape
    // need not wait for a read of up to client_impact_attempts entries. The pass keeps
    // the expired attempts and counts the live ones.
    let mut pass: (Vec<(AttemptKey, Attempt)>, u64) = (Vec::new(), 0);
    let see = |pass: &mut (Vec<_>, u64), key: AttemptKey, attempt: Attempt| {
        if now.saturating_sub(attempt.first_ns) > horizon_ns {
            pass.0.push((key, attempt));
        } else {
            pass.1 += 1;
        }
    };
    let fd = lock().attempts.map().fd().as_fd().try_clone_to_owned();
    let batched = fd.is_ok_and(|fd| for_each_batched(fd.as_fd(), |k, a| see(&mut pass, k, a)));
    if !batched {
        // The kernel refused a batch (perhaps midway): entry by entry, from the start.
        pass = (Vec::new(), 0);
        for (key, attempt) in lock().attempts.iter().filter_map(Result::ok) {
            see(&mut pass, key, attempt);
        }
    }
    let (expired, live) = pass;
    sweep.tracked = live;
    let mut removed: HashMap<u64, u64> = HashMap::new();
    for chunk in expired.chunks(SWEEP_CHUNK) {
        let mut maps = lock();
        for (key, attempt) in chunk {
            // A new attempt on the 4-tuple may have replaced this one since the pass read
            // it (the program counted the old one abandoned then): leave the new one, in
            // flight. (Gone: a completion took it.)
            match maps.attempts.get(key, 0) {
                // The same attempt, perhaps with a segment more dropped since.
                Ok(current)
                    if (
                        current.first_ns,
                        current.isn,
                        current.cause,
                        current.listener_ino,
                    ) == (
                        attempt.first_ns,
                        attempt.isn,
                        attempt.cause,
                        attempt.listener_ino,
                    ) => {}
                Ok(_) => {
                    sweep.tracked += 1;
                    continue;
                }
                Err(_) => continue,
            }
            if maps.attempts.remove(key).is_ok() {
                *removed.entry(attempt.listener_ino).or_default() += 1;
            }
        }
    }
    let mut maps = lock();
    for (ino, n) in removed {
        sweep.abandoned += n;
        // A listener that has closed is gone from the figures with its counters. (Its
        // counter entry is the test: an attempt exists only after a drop, and every drop
        // is counted there, never in the queue entry.)
        if maps.listener_stats.get(&ino, 0).is_err() {
            sweep.gone += n;
            continue;
        }
        let count = maps.abandoned.get(&ino, 0).unwrap_or(0);
        if let Err(e) = maps.abandoned.insert(ino, count + n, 0) {
            tracing::warn!(error = %e, listener = ino, "cannot count abandoned attempts");
        }
    }
    maps.tracked = sweep.tracked;
    maps.sweeps += 1;
    sweep
}

/// Calls `f` with every entry of the attempts map `map` (a duplicate of its fd), read in a
/// few batch lookups; false where the kernel refuses them (`f` may have seen some entries).
fn for_each_batched(map: BorrowedFd<'_>, mut f: impl FnMut(AttemptKey, Attempt)) -> bool {
    let (mut keys, mut values) = (Vec::new(), Vec::new());
    let mut cursor = BatchCursor::default();
    loop {
        // SAFETY: `map` is the attempts map, whose keys and values are AttemptKey and
        // Attempt (checked when the loader typed it).
        let batch =
            unsafe { syscall::lookup_batch(map, &mut cursor, BATCH, &mut keys, &mut values) };
        let Ok(done) = batch else {
            return false;
        };
        for (key, attempt) in keys.iter().zip(&values) {
            f(*key, *attempt);
        }
        if done {
            return true;
        }
    }
}

/// Adds `more`'s counts to `to`'s, keeping the newer segment time.
fn add_counts(to: &mut SourceCounts, more: &SourceCounts) {
    for (a, b) in to.counts.iter_mut().zip(&more.counts) {
        *a += b;
    }
    to.attempts += more.attempts;
    to.connected += more.connected;
    to.last_ns = to.last_ns.max(more.last_ns);
}

/// CLOCK_MONOTONIC in ns: the clock of `bpf_ktime_get_ns()`.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec into `ts`.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64) * 1_000_000_000 + ts.tv_nsec as u64
}

fn sum_at(map: &PerCpuArray<MapData, u64>, index: u32, name: &str) -> u64 {
    map.get(&index, 0)
        .map(|per_cpu| per_cpu.iter().sum())
        .unwrap_or_else(|e| {
            tracing::warn!(error = %e, map = name, "reading map");
            0
        })
}

/// Entries per batch lookup.
const BATCH: u32 = 4096;

fn possible_cpus() -> usize {
    static N: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *N.get_or_init(|| aya::util::nr_cpus().unwrap_or(1))
}

/// Every entry of `map` with its per-CPU values (one per possible CPU) folded by `fold`:
/// in a few `BPF_MAP_LOOKUP_BATCH` syscalls (Linux 5.6+) instead of two per entry
/// (get_next_key + lookup) as aya's `iter()` does, or entry by entry where the kernel
/// refuses batches.
fn fold_per_cpu<V: Pod, T>(
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
    let fd = map.map().fd().as_fd();
    let cpus = possible_cpus();
    let (mut keys, mut values) = (Vec::new(), Vec::new());
    let mut cursor = BatchCursor::default();
    let mut out = Vec::new();
    loop {
        // SAFETY: `fd` is `map`'s, typed u64 -> V per CPU when it was loaded; `cpus` is
        // the possible CPUs, as the kernel counts them.
        let batch = unsafe {
            syscall::lookup_batch_per_cpu(fd, &mut cursor, BATCH, cpus, &mut keys, &mut values)
        };
        let done = batch.ok()?;
        for (key, per_cpu) in keys.iter().zip(values.chunks_exact(cpus)) {
            out.push((*key, fold(per_cpu)));
        }
        if done {
            return Some(out);
        }
    }
}
