//! One pass of the scan iterator (`loader/scan.rs` loads it): every TCP listener some
//! task holds, in every network namespace, with its queues as they are now. The only
//! source of the SYN queue's current length; see `backlogd-ebpf/src/scan.rs` for what the
//! kernel side reads.
//!
//! It sees what the tasks of the daemon's PID namespace hold: a listener no such task
//! holds (one in a container whose PID namespace the daemon does not share, a socket a
//! process passed on and closed) is not in a pass, and its SYN queue has no current
//! length.

use std::{collections::HashMap, io::Read as _};

use backlogd_common::ScannedListener;

use crate::loader::scan::ScanIterator;

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
