//! The accept queue: connections queued for accept(), taken by accept(), how long they
//! waited, and queue depths.
//!
//! A queued connection is counted where the listener puts its child on the accept queue:
//! tracepoint mode learns of it from the child's state changes inside the listener's
//! segment window (`syn::child_cloned`, `syn::handshake_completed`), fentry and kprobe
//! modes from `tcp_check_req`'s return (`syn::call_exit`). The accept hooks: in
//! tracepoint and kprobe modes accept()/accept4() returning, at the `sys_exit`
//! tracepoint (tp_btf, `syscall.rs`), which finds the child behind the returned fd (io_uring
//! accepts do not pass these syscalls and are not counted as accepted in those modes); in
//! fentry mode [`accepted`] from `inet_csk_accept`'s return, which also sees io_uring
//! accepts and runs nothing per other syscall.
//!
//! The wait needs no record of ours per connection: the kernel stamps the child when its
//! handshake completes, and accept() reads the stamp ([`waited`]).
//!
//! An accept does not look at the queues: it only shortens the accept queue (every
//! enqueue's observation raised the peak already), and the daemon takes the queue's
//! length now from the scan pass (`scan.rs`) it runs when read. That observation, with
//! the SYN exit's clock read it needed, was about 270 guest instructions a handshake in
//! fentry mode (BENCHMARKS.md).

use backlogd_common::ACCEPT_WAIT_BUCKETS;

use crate::{
    kernel::{FdTable, KPtr, Kmem, Result, is_tcp_listener, offset, socket_inode},
    listener,
};

/// Whether accept waits are timed: set by the daemon at load (`accept_wait`), 1 in the
/// object. A frozen read-only global, so the verifier sees a constant and drops the
/// branch that is never taken.
#[unsafe(no_mangle)]
static ACCEPT_WAIT: u32 = 1;

#[inline(always)]
fn timing_waits() -> bool {
    // SAFETY: a valid static; volatile keeps LLVM from folding the object file's value.
    unsafe { core::ptr::read_volatile(&ACCEPT_WAIT) != 0 }
}

/// Listener `sk` (inode `ino`) appended a child to its accept queue just now.
#[inline(always)]
pub(crate) fn enqueued(sk: KPtr, ino: u64) {
    enqueued_at(sk, ino, listener::now())
}

/// [`enqueued`] at `now` (the caller's clock read), for a caller that has the listener
/// as a typed pointer (whose queues it reads by direct load) or has read the clock.
#[inline(always)]
pub(crate) fn enqueued_at<K: Kmem>(sk: K, ino: u64, now: u64) {
    let hot = listener::Hot { syns: 0, queued: 1 };
    if !listener::observe_counting(sk, ino, Some(now), hot) {
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
pub(crate) fn accepted<K: Kmem, C: Kmem>(listener: K, child: C) -> Result<()> {
    if !is_tcp_listener(listener)? {
        return Ok(());
    }
    let ino = socket_inode(listener)?;
    let waited = if timing_waits() {
        waited(listener, child, listener::now())
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
    Ok(())
}

/// How long `child`, accepted at `now` from `listener`, waited on the accept queue (ns).
///
/// `tcp_init_buffer_space` stamps a new connection's `rcvq_space.time` with a fresh
/// reading of the socket's clock (`tcp_mstamp`, µs of CLOCK_MONOTONIC, the clock
/// `bpf_ktime_get_ns` reads) when its handshake completes: in `tcp_child_process`, µs
/// after `inet_csk_complete_hashdance` queued it (regular and syncookie children, MPTCP
/// first subflows), or for a Fast Open child at its SYN, µs before `tcp_conn_request`
/// queues it. The stamp moves again only in `tcp_rcv_space_adjust`, which runs when the
/// application reads, so data that arrives before accept() leaves it alone (checked in
/// 5.10, 6.1, 6.12, 6.19 and 7.1's sources). Reading it and the listener's costs two
/// direct loads through `bpf_skc_to_tcp_sock` in fentry mode (typed sockets), two probe
/// reads in the others; the LRU map of enqueue times it replaced cost an insert, a lookup
/// and a delete per connection (about 1,000 instructions per handshake in fentry mode).
///
/// An accept that takes the child in the µs between its queueing and its stamp (an
/// accept loop on another CPU that did not wait for the wakeup, which comes after the
/// stamp) finds the value the child inherited from its listener: 0, or a connection's
/// time if the listener was connected once. Equal to the listener's own, the wait is
/// unknown and not counted, as it was when such an accept beat the enqueue record.
#[inline(always)]
fn waited<K: Kmem, C: Kmem>(listener: K, child: C, now: u64) -> Option<u64> {
    let at = offset(|o| &o.tcp_rcvq_time);
    let stamp_us: u64 = child.read_tcp(at).ok()?;
    let inherited: u64 = listener.read_tcp(at).ok()?;
    (stamp_us != inherited).then(|| now.saturating_sub(stamp_us.wrapping_mul(1000)))
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
