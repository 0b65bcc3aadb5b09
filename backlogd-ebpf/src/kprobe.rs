//! kprobe mode: the same functions as fentry mode (see `fentry.rs`), for kernels without
//! BPF trampolines. A kretprobe sees no arguments, so what the return needs is parked per
//! CPU at entry (these functions run in softirq and do not sleep).
//!
//! Accepts are counted at the `sys_exit` tracepoint (tp_btf, `syscall.rs`), as in tracepoint
//! mode, not by a
//! kretprobe on `inet_csk_accept`: that function sleeps, and a kretprobe tracks at most
//! max(10, 2 x CPUs) sleeping calls, so a server with many threads blocked in accept()
//! would lose counts.
//!
//! kprobe programs share the kernel's per-CPU recursion guard (`bpf_prog_active`) with
//! classic tracepoint programs and with every bpf() map syscall (which holds it with only
//! migration disabled, so a task preempted there keeps it held): a kprobe that fires
//! meanwhile on that CPU is skipped, and only Linux 6.7+ counts the skip. So nothing else
//! backlogd attaches is a kprobe or a classic tracepoint: accept() and listen() returning
//! (tp_btf `sys_exit`), state changes and SYN-ACK retransmits (raw tracepoints) have
//! per-program guards. (With the accept hooks on `syscalls:sys_*_accept*`, a test with
//! three threads polling accept() lost 3-4 of ~80 drops in 2 of 5 runs on Debian 6.1.)
//! Other tools' kprobes and map syscalls, and the daemon's own map reads, can still cause
//! skips.

use aya_ebpf::{
    macros::{kprobe, kretprobe, map},
    maps::PerCpuArray,
    programs::{ProbeContext, RetProbeContext},
};
use backlogd_common::segment_kind::{ACK, OTHER, SYN};

use crate::{
    accept,
    kernel::{KPtr, Result, errno},
    syn,
};

/// `inet_csk_reqsk_queue_add` in flight on this CPU: (listener, child).
#[map]
static QUEUE_ADD: PerCpuArray<[u64; 2]> = PerCpuArray::with_max_entries(1, 0);

#[inline(always)]
fn arg(ctx: &ProbeContext, n: usize) -> Result<u64> {
    match ctx.arg::<u64>(n) {
        Some(v) if v != 0 => Ok(v),
        _ => Err(errno::EFAULT),
    }
}

#[kprobe]
pub fn conn_request_kprobe(ctx: ProbeContext) -> u32 {
    let _ = arg(&ctx, 2).and_then(|sk| syn::call_enter(KPtr(sk), arg(&ctx, 3)?, SYN));
    0
}

#[kretprobe]
pub fn conn_request_kretprobe(_ctx: RetProbeContext) -> u32 {
    let _ = syn::call_exit(SYN, 0);
    0
}

/// `tcp_check_req` and `tcp_get_cookie_sock`: the final-ACK windows, as in fentry mode.
#[kprobe]
pub fn final_ack_kprobe(ctx: ProbeContext) -> u32 {
    let _ = arg(&ctx, 0).and_then(|sk| syn::call_enter(KPtr(sk), arg(&ctx, 1)?, ACK));
    0
}

/// Return of either final-ACK function: the child if it was queued for accept.
#[kretprobe]
pub fn final_ack_kretprobe(ctx: RetProbeContext) -> u32 {
    let _ = syn::call_exit(ACK, ctx.ret());
    0
}

/// `tcp_check_req` again (its own program: the verifier bounds each program's stack): a
/// SYN for a pending request is a retransmission, counted as received.
#[kprobe]
pub fn check_req_kprobe(ctx: ProbeContext) -> u32 {
    let _ = arg(&ctx, 0).and_then(|sk| syn::pending_request_segment(KPtr(sk), KPtr(arg(&ctx, 1)?)));
    0
}

/// `tcp_req_err`: an ICMP error for a pending request, as in fentry mode.
#[kprobe]
pub fn req_err_kprobe(ctx: ProbeContext) -> u32 {
    let _ = arg(&ctx, 0).and_then(|req| syn::request_error_enter(KPtr(req)));
    0
}

#[kretprobe]
pub fn req_err_kretprobe(_ctx: RetProbeContext) -> u32 {
    let _ = syn::call_exit(OTHER, 0);
    0
}

#[kprobe]
pub fn reqsk_queue_add_kprobe(ctx: ProbeContext) -> u32 {
    if let (Ok(sk), Ok(child), Some(slot)) = (arg(&ctx, 0), arg(&ctx, 2), QUEUE_ADD.get_ptr_mut(0))
    {
        // SAFETY: this CPU's element; the function runs in softirq and does not nest.
        unsafe { *slot = [sk, child] };
    }
    0
}

#[kretprobe]
pub fn reqsk_queue_add_kretprobe(ctx: RetProbeContext) -> u32 {
    let _ = try_reqsk_queue_add_ret(&ctx);
    0
}

fn try_reqsk_queue_add_ret(ctx: &RetProbeContext) -> Result<()> {
    let slot = QUEUE_ADD.get_ptr_mut(0).ok_or(errno::ENOENT)?;
    // SAFETY: this CPU's element.
    let [sk, child] = unsafe { core::mem::take(&mut *slot) };
    let ret: u64 = ctx.ret();
    // Fast Open only, as in fentry mode (see fentry.rs).
    let Some((listener, ino)) = syn::in_conn_request() else {
        return Ok(());
    };
    if sk != listener.0 || ret == 0 || ret != child {
        return Ok(());
    }
    accept::enqueued(listener, ino);
    Ok(())
}
