//! One pass of the scan iterator (`loader/scan.rs` loads it): every TCP listener some
//! task holds, in every network namespace, with its queues as they are now. The only
//! source of the SYN queue's current length; see `backlogd-ebpf/src/scan.rs` for what the
//! kernel side reads.
//!
//! It sees what the tasks of the daemon's PID namespace hold: a listener no such task
//! holds (one in a container whose PID namespace the daemon does not share, a socket a
//! process passed on and closed) is not in a pass, and its SYN queue has no current
//! length.

use std::{
    collections::{HashMap, HashSet},
    io::Read as _,
    sync::Mutex,
    time::{Duration, Instant},
};

use backlogd_common::ScannedListener;

use super::tcpext::ListenSysctls;
use crate::{
    loader::scan::ScanIterator,
    queues::{QueueWindows, ScanPass},
};

/// Readers within this long of a pass share it.
pub const MAX_AGE: Duration = Duration::from_secs(1);

/// The pass run when its figures are read, not on a clock: it walks every open file on
/// the host (measured at 0.4-0.8 µs a file, ~50-100 ms with 118k sockets open), which a
/// loop once a second would spend whether anyone looks or not. A scrape every 15 s pays
/// it every 15 s; `top`, refreshing each second, once a second while it is open.
pub struct LiveScan {
    /// The iterator, and when a pass last began (succeeded or not).
    iterator: Mutex<(ScanIterator, Option<Instant>)>,
    /// The listen sysctls of each namespace the last good pass found listeners in.
    sysctls: Mutex<HashMap<u32, ListenSysctls>>,
    /// Namespaces readers wanted that the last pass did not find (their listeners held by
    /// no process it sees): a pass is not run again for them before its time.
    unseen: Mutex<HashSet<u32>>,
    /// The iterator's records carry their namespaces' sysctls
    /// (`ScanIterator::reads_sysctls`): it lists listeners and gives sysctls.
    lists: bool,
}

impl LiveScan {
    pub fn new(iterator: ScanIterator) -> Self {
        Self {
            lists: iterator.reads_sysctls,
            iterator: Mutex::new((iterator, None)),
            sysctls: Mutex::default(),
            unseen: Mutex::default(),
        }
    }

    /// Whether the passes list listeners and read their namespaces' sysctls; without, a
    /// pass gives the SYN queues alone, and rescans list by sock_diag.
    pub fn lists(&self) -> bool {
        self.lists
    }

    /// The listen sysctls of each namespace the last good pass found listeners in, as
    /// that pass read them from the namespaces' `struct net` (none when it cannot).
    pub fn sysctls(&self) -> HashMap<u32, ListenSysctls> {
        self.sysctls
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Makes the SYN-queue lengths in `windows` at most [`MAX_AGE`] old: runs a pass
    /// unless one began since. Blocks for the pass; readers arriving meanwhile wait for it
    /// and share it. A pass that failed counts too: failing passes are not retried by
    /// every reader, and the figures' age shows how old the last good one is.
    ///
    /// `wanted`: the namespaces the reader needs sysctls of (those with listeners). One the
    /// last pass did not find (a listener that appeared since) gets a pass now, whatever
    /// the last one's age; once per namespace, so one whose listeners no process holds
    /// does not make every read run a pass.
    pub fn refresh(&self, windows: &Mutex<QueueWindows>, wanted: &HashSet<u32>) {
        let mut guard = self.iterator.lock().unwrap_or_else(|e| e.into_inner());
        let new_namespace = {
            let known = self.sysctls.lock().unwrap_or_else(|e| e.into_inner());
            let unseen = self.unseen.lock().unwrap_or_else(|e| e.into_inner());
            self.lists
                && wanted
                    .iter()
                    .any(|ns| !known.contains_key(ns) && !unseen.contains(ns))
        };
        // Another reader may have run one while this one waited.
        if guard.1.is_some_and(|at| at.elapsed() < MAX_AGE) && !new_namespace {
            return;
        }
        // The last pass's figures stay, and their age says how old they are.
        match self.pass_recorded(&mut guard, windows) {
            Ok(found) => {
                let seen: HashSet<u32> = found.values().map(|l| l.netns).collect();
                *self.unseen.lock().unwrap_or_else(|e| e.into_inner()) =
                    wanted.difference(&seen).copied().collect();
            }
            Err(e) => {
                tracing::debug!(error = %e, "a scan pass failed");
                // Not again before its time for the same namespaces.
                let known = self.sysctls.lock().unwrap_or_else(|e| e.into_inner());
                *self.unseen.lock().unwrap_or_else(|e| e.into_inner()) = wanted
                    .iter()
                    .filter(|ns| !known.contains_key(ns))
                    .copied()
                    .collect();
            }
        }
    }

    /// A pass of its own (a rescan's: it must see the listeners as they are now, not
    /// share a reader's), whose SYN-queue lengths readers then share like any other.
    pub fn fresh_pass(
        &self,
        windows: &Mutex<QueueWindows>,
    ) -> std::io::Result<HashMap<u64, ScannedListener>> {
        let mut guard = self.iterator.lock().unwrap_or_else(|e| e.into_inner());
        self.pass_recorded(&mut guard, windows)
    }

    fn pass_recorded(
        &self,
        (iterator, began): &mut (ScanIterator, Option<Instant>),
        windows: &Mutex<QueueWindows>,
    ) -> std::io::Result<HashMap<u64, ScannedListener>> {
        let start = Instant::now();
        *began = Some(start);
        let found = pass(iterator)?;
        if self.lists {
            *self.sysctls.lock().unwrap_or_else(|e| e.into_inner()) =
                found.values().map(|l| (l.netns, sysctls(l))).collect();
        }
        let lengths = found
            .iter()
            .map(|(&ino, l)| (ino, (l.syn_queue, l.accept_queue)))
            .collect();
        windows
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .record_scan(
                lengths,
                ScanPass {
                    at: Instant::now(),
                    took: start.elapsed(),
                },
            );
        Ok(found)
    }
}

/// The listen sysctls of `l`'s namespace, as the pass read them.
pub fn sysctls(l: &ScannedListener) -> ListenSysctls {
    ListenSysctls {
        somaxconn: l.somaxconn,
        tcp_max_syn_backlog: l.max_syn_backlog,
        tcp_syncookies: u32::from(l.syncookies),
        tcp_abort_on_overflow: u32::from(l.abort_on_overflow),
    }
}

/// Each listener once, by socket inode (the kernel writes one record per descriptor that
/// holds it: every worker of a pre-forking server), with the lowest process id that holds
/// it (a pre-forking server's parent, as a walk of /proc finds first).
pub fn pass(iterator: &ScanIterator) -> std::io::Result<HashMap<u64, ScannedListener>> {
    let mut file = iterator.open()?;
    let mut bytes = Vec::new();
    let mut chunk = vec![0u8; 64 * 1024];
    loop {
        match file.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => bytes.extend_from_slice(&chunk[..n]),
            // The kernel stops a read() that visited a million objects without writing
            // anything (a host with that many open files and few listeners) with EAGAIN;
            // the next read() goes on from there.
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted
                ) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(parse(&bytes))
}

fn parse(bytes: &[u8]) -> HashMap<u64, ScannedListener> {
    let size = size_of::<ScannedListener>();
    let mut found: HashMap<u64, ScannedListener> = HashMap::new();
    for record in bytes.chunks_exact(size) {
        // SAFETY: `record` holds exactly one ScannedListener's bytes as the kernel
        // wrote them (repr(C), integers only, every bit pattern valid); read
        // unaligned, as a Vec<u8> gives no alignment.
        let l: ScannedListener =
            unsafe { std::ptr::read_unaligned(record.as_ptr().cast::<ScannedListener>()) };
        found
            .entry(l.ino)
            .and_modify(|kept| {
                if l.tgid < kept.tgid {
                    *kept = l;
                }
            })
            .or_insert(l);
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes_of(l: &ScannedListener) -> &[u8] {
        // SAFETY: a repr(C) struct of integers without padding, viewed as its bytes.
        unsafe {
            std::slice::from_raw_parts(
                std::ptr::from_ref(l).cast::<u8>(),
                size_of::<ScannedListener>(),
            )
        }
    }

    #[test]
    fn a_listener_held_twice_is_one_and_a_torn_tail_is_ignored() {
        let a = ScannedListener {
            ino: 7,
            syn_queue: 3,
            tgid: 100,
            ..Default::default()
        };
        let b = ScannedListener {
            ino: 9,
            syn_queue: 0,
            ..Default::default()
        };
        let forked = ScannedListener { tgid: 101, ..a };
        let parent = ScannedListener { tgid: 99, ..a };
        let mut bytes = [
            bytes_of(&a),
            bytes_of(&b),
            bytes_of(&forked),
            bytes_of(&parent),
        ]
        .concat();
        bytes.extend_from_slice(&[1, 2, 3]);
        let found = parse(&bytes);
        assert_eq!(found.len(), 2);
        assert_eq!(found[&7].syn_queue, 3);
        assert_eq!(found[&7].tgid, 99, "the lowest holder is the owner");
        assert_eq!(found[&9], b);
    }
}
