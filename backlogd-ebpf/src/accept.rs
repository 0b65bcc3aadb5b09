//! The accept queue: connections queued for accept(), taken by accept(), how long they
//! waited, and queue depths.
//!
//! Every mode records a child's enqueue time under the child's address ([`enqueued`]);
//! the accept hooks find the child accept() returned and the wait is the difference.
//! Tracepoint mode learns of the enqueue from the child's state changes inside the
//! listener's segment window (`syn::child_cloned`, `syn::handshake_completed`), fentry and
//! kprobe modes from `tcp_check_req`'s return (`syn::call_exit`). The accept hooks: in
//! tracepoint and kprobe modes accept()/accept4() returning, at the `sys_exit`
//! tracepoint (tp_btf, `syscall.rs`), which finds the child behind the returned fd (io_uring
//! accepts do not pass these syscalls and are not counted as accepted in those modes); in
//! fentry mode [`accepted`] from `inet_csk_accept`'s return, which also sees io_uring
//! accepts and runs nothing per other syscall.

use aya_ebpf::{macros::map, maps::LruHashMap};
use backlogd_common::ACCEPT_WAIT_BUCKETS;

use crate::{
    kernel::{FdTable, KPtr, Kmem, Result, is_tcp_listener, offset, socket_inode},
    listener,
};

/// Enqueue time (ns) of children still on an accept queue, by child `struct sock *`.
#[map]
static QUEUED_AT: LruHashMap<u64, u64> = LruHashMap::with_max_entries(65536, 0);

/// Whether accept waits are timed: set by the daemon at load (`accept_wait`), 1 in the
/// object. A frozen read-only global, so the verifier sees a constant and drops the
/// branch that is never taken: off, the programs never touch QUEUED_AT, the LRU map's
/// insert being most of an enqueue's cost.
#[unsafe(no_mangle)]
static ACCEPT_WAIT: u32 = 1;

#[inline(always)]
fn timing_waits() -> bool {
    // SAFETY: a valid static; volatile keeps LLVM from folding the object file's value.
    unsafe { core::ptr::read_volatile(&ACCEPT_WAIT) != 0 }
}

/// `child` was appended to the accept queue of listener `sk` (inode `ino`) just now.
#[inline(always)]
pub(crate) fn enqueued(sk: KPtr, ino: u64, child: KPtr) {
    enqueued_at(sk, ino, child, listener::now())
}

/// [`enqueued`] at `now` (the caller's clock read), for a caller that has the listener
/// as a typed pointer (whose queues it reads by direct load) or has read the clock.
#[inline(always)]
pub(crate) fn enqueued_at<K: Kmem>(sk: K, ino: u64, child: KPtr, now: u64) {
    if timing_waits() {
        let _ = QUEUED_AT.insert(child.0, now, 0);
    }
    let hot = listener::Hot { syns: 0, queued: 1 };
    if !listener::observe_counting(sk, ino, now, hot) {
        listener::update(sk.probed(), ino, |s| s.queued += 1);
    }
}

/// accept() on listener fd `fd` returned fd `child`.
#[inline(always)]
pub(crate) fn accept_returned(fd: u64, child: u64) -> Result<()> {
    let files = FdTable::current()?;
    let listener = files.socket(fd)?.deref(offset(|o| &o.socket_sk))?;
    let child = files.socket(child)?.deref(offset(|o| &o.socket_sk))?;
    accepted(listener, child)
}

/// `accept()` on `listener` returned `child`.
#[inline(always)]
pub(crate) fn accepted<K: Kmem>(listener: K, child: KPtr) -> Result<()> {
    if !is_tcp_listener(listener)? {
        return Ok(());
    }
    let ino = socket_inode(listener)?;
    let now = listener::now();
    let waited = if timing_waits() {
        // SAFETY: a plain u64 value.
        let waited = (unsafe { QUEUED_AT.get(child.0) }).map(|&t| now.saturating_sub(t));
        let _ = QUEUED_AT.remove(child.0);
        waited
    } else {
        None
    };
    listener::update(listener.probed(), ino, |s| {
        s.accepted += 1;
        if let Some(ns) = waited {
            s.accept_wait_sum_ns += ns;
            let slot = bucket(ns / 1000);
            if let Some(b) = s.accept_wait.get_mut(slot) {
                *b += 1;
            }
        }
    });
    listener::observe_queues(listener, ino, now);
    Ok(())
}

/// Index of the first bucket whose bound (2^i µs) exceeds `us`.
#[inline(always)]
fn bucket(us: u64) -> usize {
    let bits = (64 - us.leading_zeros()) as usize; // us < 2^bits
    if bits > ACCEPT_WAIT_BUCKETS - 1 {
        ACCEPT_WAIT_BUCKETS
    } else {
        bits
    }
}
