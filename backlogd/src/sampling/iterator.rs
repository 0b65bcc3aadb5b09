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
    collections::HashMap,
    io::Read as _,
    sync::Mutex,
    time::{Duration, Instant},
};

use backlogd_common::ScannedListener;

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
    iterator: Mutex<ScanIterator>,
}

impl LiveScan {
    pub fn new(iterator: ScanIterator) -> Self {
        Self {
            iterator: Mutex::new(iterator),
        }
    }

    /// Makes the SYN-queue lengths in `windows` at most [`MAX_AGE`] old: runs a pass
    /// unless one ran since. Blocks for the pass; readers arriving meanwhile wait for it
    /// and share it.
    pub fn refresh(&self, windows: &Mutex<QueueWindows>) {
        let fresh = |w: &Mutex<QueueWindows>| {
            w.lock()
                .unwrap_or_else(|e| e.into_inner())
                .last_scan()
                .is_some_and(|p| p.at.elapsed() < MAX_AGE)
        };
        if fresh(windows) {
            return;
        }
        let iterator = self.iterator.lock().unwrap_or_else(|e| e.into_inner());
        // Another reader may have run it while this one waited.
        if fresh(windows) {
            return;
        }
        let start = Instant::now();
        match pass(&iterator) {
            Ok(found) => {
                let syn = found
                    .into_iter()
                    .map(|(ino, l)| (ino, l.syn_queue))
                    .collect();
                windows
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .record_scan(
                        syn,
                        ScanPass {
                            at: Instant::now(),
                            took: start.elapsed(),
                        },
                    );
            }
            // The last pass's figures stay, and their age says how old they are.
            Err(e) => tracing::debug!(error = %e, "a scan pass failed"),
        }
    }
}

/// Each listener once, by socket inode (the kernel writes one record per descriptor that
/// holds it: every worker of a pre-forking server).
pub fn pass(iterator: &ScanIterator) -> std::io::Result<HashMap<u64, ScannedListener>> {
    let mut bytes = Vec::new();
    iterator.open()?.read_to_end(&mut bytes)?;
    Ok(parse(&bytes))
}

fn parse(bytes: &[u8]) -> HashMap<u64, ScannedListener> {
    let size = size_of::<ScannedListener>();
    bytes
        .chunks_exact(size)
        .map(|record| {
            // SAFETY: `record` holds exactly one ScannedListener's bytes as the kernel
            // wrote them (repr(C), integers only, every bit pattern valid); read
            // unaligned, as a Vec<u8> gives no alignment.
            let l: ScannedListener =
                unsafe { std::ptr::read_unaligned(record.as_ptr().cast::<ScannedListener>()) };
            (l.ino, l)
        })
        .collect()
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
        let mut bytes = [bytes_of(&a), bytes_of(&b), bytes_of(&forked)].concat();
        bytes.extend_from_slice(&[1, 2, 3]);
        let found = parse(&bytes);
        assert_eq!(found.len(), 2);
        assert_eq!(found[&7].syn_queue, 3);
        assert_eq!(found[&9], b);
    }
}
