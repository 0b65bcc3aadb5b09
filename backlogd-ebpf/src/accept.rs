//! The accept queue: connections queued for accept(), taken by accept(), how long they
//! waited, and queue depths.
//!
//! Every mode records a child's enqueue time under the child's address ([`enqueued`]);
//! the accept hooks find the child accept() returned and the wait is the difference.
//! Tracepoint mode learns of the enqueue from the child's state changes inside the
//! listener's segment window (`syn::child_cloned`, `syn::handshake_completed`), fentry and
//! kprobe modes from `tcp_check_req`'s return (`syn::call_exit`). accept()/accept4() exit
//! finds the child behind the returned fd. (io_uring accepts do not pass these syscalls
//! and are not counted as accepted in tracepoint and kprobe modes.)
//!
//! The accept() syscall hooks differ by mode, each the cheapest that keeps the mode exact:
//! - tracepoint mode: the classic `syscalls:sys_{enter,exit}_accept{,4}` tracepoints. They
//!   cost other syscalls a bitmap test, and nothing else this mode attaches is subject to
//!   the per-CPU guard they hold (see below).
//! - kprobe mode: the raw `sys_exit` tracepoint, whose saved registers still hold the
//!   listener fd. A classic tracepoint program holds the per-CPU guard (`bpf_prog_active`)
//!   that makes the kernel skip any kprobe firing meanwhile on that CPU, so a SYN
//!   delivered on the exit of an interrupt that arrived inside an accept() probe would go
//!   unseen by the SYN kprobes. A raw tracepoint program does not take that guard; the
//!   price is one run at the exit of every syscall on the host (BENCHMARKS.md has the
//!   figure).
//! - fentry mode: [`accepted`] from `inet_csk_accept`'s return, which also sees io_uring
//!   accepts.

use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_ktime_get_ns},
    macros::{map, raw_tracepoint, tracepoint},
    maps::LruHashMap,
    programs::{RawTracePointContext, TracePointContext},
};
use backlogd_common::ACCEPT_WAIT_BUCKETS;

use crate::{
    kernel::{
        KPtr, Result, is_tcp_listener, number, offset, socket_inode, socket_of_fd, take_pending,
        tp_field,
    },
    listener,
};

/// Enqueue time (ns) of children still on an accept queue, by child `struct sock *`.
#[map]
static QUEUED_AT: LruHashMap<u64, u64> = LruHashMap::with_max_entries(65536, 0);

/// accept() fd parked between syscall entry and exit, by thread (tracepoint mode).
#[map]
static PENDING_ACCEPT: LruHashMap<u64, u64> = LruHashMap::with_max_entries(4096, 0);

/// `child` (when known) was appended to listener `sk`'s accept queue just now.
#[inline(always)]
pub(crate) fn enqueued(sk: KPtr, child: Option<KPtr>) -> Result<()> {
    let ino = socket_inode(sk)?;
    if let Some(child) = child {
        // SAFETY: the helper takes no arguments.
        let now = unsafe { bpf_ktime_get_ns() };
        let _ = QUEUED_AT.insert(child.0, now, 0);
    }
    listener::update(sk, ino, |s| s.queued += 1);
    listener::observe_queues(sk, ino)
}

#[tracepoint]
pub fn accept_enter(ctx: TracePointContext) -> u32 {
    if let Ok(fd) = tp_field::<u64>(&ctx, offset(|o| &o.tp_accept_fd)) {
        let _ = PENDING_ACCEPT.insert(bpf_get_current_pid_tgid(), fd, 0);
    }
    0
}

#[tracepoint]
pub fn accept_exit(ctx: TracePointContext) -> u32 {
    let _ = try_accept_exit(&ctx);
    0
}

fn try_accept_exit(ctx: &TracePointContext) -> Result<()> {
    let Some(fd) = take_pending(&PENDING_ACCEPT) else {
        return Ok(());
    };
    let ret: i64 = tp_field(ctx, offset(|o| &o.tp_exit_ret))?;
    if ret < 0 {
        return Ok(());
    }
    accept_returned(fd, ret as u64)
}

/// `TP_PROTO(struct pt_regs *regs, long ret)`, at the exit of every syscall (kprobe mode).
#[raw_tracepoint(tracepoint = "sys_exit")]
pub fn accept_sys_exit(ctx: RawTracePointContext) -> u32 {
    let _ = try_accept_sys_exit(KPtr(ctx.arg(0)), ctx.arg(1));
    0
}

fn try_accept_sys_exit(regs: KPtr, ret: i64) -> Result<()> {
    if ret < 0 {
        return Ok(());
    }
    let nr: u32 = regs.read(offset(|o| &o.regs_syscall_nr))?;
    if nr != number(|o| &o.nr_accept4) && nr != number(|o| &o.nr_accept) {
        return Ok(());
    }
    accept_returned(regs.read(offset(|o| &o.regs_arg0))?, ret as u64)
}

/// accept() on listener fd `fd` returned fd `child`.
#[inline(always)]
fn accept_returned(fd: u64, child: u64) -> Result<()> {
    let listener = socket_of_fd(fd)?.deref(offset(|o| &o.socket_sk))?;
    let child = socket_of_fd(child)?.deref(offset(|o| &o.socket_sk))?;
    accepted(listener, child)
}

/// `accept()` on `listener` returned `child`.
#[inline(always)]
pub(crate) fn accepted(listener: KPtr, child: KPtr) -> Result<()> {
    if !is_tcp_listener(listener)? {
        return Ok(());
    }
    let ino = socket_inode(listener)?;
    // SAFETY: the helper takes no arguments.
    let now = unsafe { bpf_ktime_get_ns() };
    // SAFETY: a plain u64 value.
    let waited = (unsafe { QUEUED_AT.get(child.0) }).map(|&t| now.saturating_sub(t));
    let _ = QUEUED_AT.remove(child.0);
    listener::update(listener, ino, |s| {
        s.accepted += 1;
        if let Some(ns) = waited {
            s.accept_wait_sum_ns += ns;
            let slot = bucket(ns / 1000);
            if let Some(b) = s.accept_wait.get_mut(slot) {
                *b += 1;
            }
        }
    });
    listener::observe_queues(listener, ino)
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
