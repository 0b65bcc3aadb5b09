//! fentry/fexit mode: BPF trampolines on the kernel functions that decide a listener's
//! fate. The cheapest hooks, with per-program recursion protection from Linux 5.12 (a hook
//! is never skipped because another tracing program is running). Before 5.12 there is no
//! guard and no miss counter, and only `tcp_check_req`'s programs can run nested in
//! themselves, harmlessly (docs/metrics.md, "Limits of each mode", has the analysis).
//! Needs BPF trampolines (5.5+; backlogd's ring buffer needs 5.8) and nothing newer: the
//! fexit programs read the traced function's return value from their context ([`ret`]),
//! not with `bpf_get_func_ret` (5.17+).
//!
//! - `tcp_conn_request` entry/return: SYNs, SYN-path drops by reason, syncookies
//!   ([`syn::call_enter`] / [`syn::call_exit`]).
//! - `tcp_check_req` and `tcp_get_cookie_sock` entry/return: overflow at the final ACK of
//!   a handshake (regular and syncookie); retransmitted SYNs for pending requests.
//!   (Not `tcp_v{4,6}_syn_recv_sock` itself: Debian's 6.1 refuses a trampoline on it with
//!   ENOTSUPP; its two callers bracket it.)
//! - `tcp_req_err` entry/return: an ICMP error that removed a pending request, a listen
//!   drop outside any segment (reason "other").
//! - the final-ACK functions' return, and `inet_csk_reqsk_queue_add`'s for Fast Open: a
//!   connection queued for accept.
//! - `inet_csk_accept` return: a connection accepted, and how long it waited.
//! - `inet_csk_listen_stop` entry: a listener closing ([`listen::listener_closed`]).
//! - the listen(2) syscall's return (`__x64_sys_listen`): the backlog asked for and the one
//!   granted. An fexit there, not the `sys_exit` tracepoint the other modes use: any
//!   syscall tracepoint sends every syscall of every task through the kernel's slow path
//!   (and that one runs a program per syscall).

use core::{arch::asm, ffi::c_void};

use aya_ebpf::{
    EbpfContext as _,
    helpers::bpf_probe_read_kernel,
    macros::{fentry, fexit},
    programs::{FEntryContext, FExitContext},
};
use backlogd_common::{
    fexit_ret,
    segment_kind::{ACK, OTHER, SYN},
};

use crate::{
    accept,
    kernel::{BtfPtr, KPtr, Result, errno, launder, ret_slot},
    listen, syn,
};

/// Argument `n` of the traced function as a plain address (a scalar), for the accounting
/// code shared with kprobe mode, whose arguments are untyped: it reads through
/// `bpf_probe_read_kernel` and keys maps by address.
#[inline(always)]
fn arg_ptr(arg: *const u8) -> Result<KPtr> {
    let p = KPtr(launder(arg)?);
    if p.is_null() {
        Err(errno::EFAULT)
    } else {
        Ok(p)
    }
}

/// The return value of the function the fexit program `which` ([`fexit_ret`]) traces.
///
/// A trampoline hands an fexit program the function's arguments as u64 slots, then its
/// return value, so the value's slot is the number of argument slots, which differs
/// between kernels (`tcp_check_req` takes 5 arguments on 5.10 and 6 on 6.18,
/// `inet_csk_accept` 4 before 6.10 and 2 since): the loader puts this kernel's count,
/// from its BTF, in `OFFSETS.ret_slot`. The verifier accepts a context load only at an
/// offset written in the instruction itself; a load through the context pointer plus an
/// offset computed from that count is refused ("dereference of modified ctx ptr"). So
/// each possible slot has a load of its own, and since the global is a frozen read-only
/// map the verifier knows the value and walks only the branch it selects. (Linux 5.17's
/// `bpf_get_func_ret` would do the same with a helper call; reading the slot is one path
/// for every kernel with trampolines.)
#[inline(always)]
fn ret(ctx: &FExitContext, which: usize) -> Result<u64> {
    let c = ctx.as_ptr();
    Ok(match ret_slot(which) {
        1 => ctx_slot::<1>(c),
        2 => ctx_slot::<2>(c),
        3 => ctx_slot::<3>(c),
        4 => ctx_slot::<4>(c),
        5 => ctx_slot::<5>(c),
        6 => ctx_slot::<6>(c),
        7 => ctx_slot::<7>(c),
        8 => ctx_slot::<8>(c),
        9 => ctx_slot::<9>(c),
        10 => ctx_slot::<10>(c),
        11 => ctx_slot::<11>(c),
        fexit_ret::MAX_SLOT => ctx_slot::<{ fexit_ret::MAX_SLOT as usize }>(c),
        _ => return Err(errno::EINVAL),
    })
}

/// The u64 in slot `N` of a tracing program's context, loaded in one instruction with the
/// offset as its immediate. Inline assembly, because LLVM may otherwise merge the loads
/// of [`ret`]'s branches into one load through a computed pointer, which the verifier
/// refuses. A pointer-typed slot comes back as the verifier's typed pointer: launder it
/// before using it as a number.
#[inline(always)]
fn ctx_slot<const N: usize>(ctx: *mut c_void) -> u64 {
    let value: u64;
    // SAFETY: reads the context the kernel passed to this program; the verifier checks
    // the slot against the traced function's BTF and refuses the program if it is not
    // one of its arguments or its return value.
    unsafe {
        asm!(
            "{value} = *(u64 *)({ctx} + {offset})",
            value = out(reg) value,
            ctx = in(reg) ctx,
            offset = const N * 8,
            options(readonly, nostack, preserves_flags),
        );
    }
    value
}

/// Argument `n` of the traced function as the verifier types it (a `BtfPtr`), for the
/// hot path: shared code reads its fields by direct load.
#[inline(always)]
fn arg_btf(arg: *const u8) -> Result<BtfPtr> {
    if arg.is_null() {
        Err(errno::EFAULT)
    } else {
        Ok(BtfPtr::new(arg))
    }
}

/// The listener (argument `sk`, `struct sock *`) and the segment (the argument after it,
/// `struct sk_buff *`) of a SYN-path function, typed.
#[inline(always)]
fn listener_and_skb(ctx: &FExitContext, sk: usize) -> Result<(BtfPtr, BtfPtr)> {
    Ok((arg_btf(ctx.arg(sk))?, arg_btf(ctx.arg(sk + 1))?))
}

/// A pointer-typed return value as a plain address (see [`arg_ptr`]); NULL is `0`.
#[inline(always)]
fn ret_ptr(ctx: &FExitContext, which: usize) -> Result<u64> {
    let p = ret(ctx, which)?;
    if p == 0 {
        Ok(0)
    } else {
        launder(p as *const u8)
    }
}

/// `int tcp_conn_request(rsk_ops, af_ops, struct sock *sk, struct sk_buff *skb)`
#[fentry(function = "tcp_conn_request")]
pub fn conn_request_enter(ctx: FEntryContext) -> i32 {
    let _ = arg_btf(ctx.arg(2)).and_then(|sk| syn::call_enter(sk, ctx.arg(3), SYN));
    0
}

#[fexit(function = "tcp_conn_request")]
pub fn conn_request_exit(ctx: FExitContext) -> i32 {
    let _ =
        listener_and_skb(&ctx, 2).and_then(|(sk, skb)| syn::call_exit_with(SYN, 0, |_| (sk, skb)));
    0
}

/// `struct sock *tcp_check_req(struct sock *sk, struct sk_buff *skb, ...)`: a segment for
/// a pending request of listener `sk`. The final ACK's overflow (in `syn_recv_sock` or at
/// `listen_overflow:`) happens inside; a SYN here is a retransmission, counted as received.
#[fentry(function = "tcp_check_req")]
pub fn check_req_enter(ctx: FEntryContext) -> i32 {
    let _ = check_req(&ctx);
    0
}

fn check_req(ctx: &FEntryContext) -> Result<()> {
    let (sk, skb) = (arg_btf(ctx.arg(0))?, arg_btf(ctx.arg(1))?);
    if !syn::is_listening(sk)? {
        return Ok(()); // a Fast Open child's own segment
    }
    let _ = syn::pending_request_segment_listener(sk, skb);
    syn::call_enter_listener(sk, skb.addr(), ACK)
}

/// Returns the child once `inet_csk_complete_hashdance` queued it for accept. The child
/// stays as the verifier types it, not laundered (about 30 guest instructions a
/// handshake): the window code only compares it with the listener's address and reads
/// it through the helper, both allowed on a typed pointer.
#[fexit(function = "tcp_check_req")]
pub fn check_req_exit(ctx: FExitContext) -> i32 {
    let _ = ret(&ctx, fexit_ret::CHECK_REQ).and_then(|child| {
        let (sk, skb) = listener_and_skb(&ctx, 0)?;
        syn::call_exit_with(ACK, child, |_| (sk, skb))
    });
    0
}

/// `struct sock *tcp_get_cookie_sock(struct sock *sk, struct sk_buff *skb, ...)`: the ACK
/// of a syncookie handshake creates its child here, where it can overflow, too.
#[fentry(function = "tcp_get_cookie_sock")]
pub fn cookie_sock_enter(ctx: FEntryContext) -> i32 {
    let _ = arg_btf(ctx.arg(0)).and_then(|sk| syn::call_enter(sk, ctx.arg(1), ACK));
    0
}

/// Returns the child once it is on the accept queue.
#[fexit(function = "tcp_get_cookie_sock")]
pub fn cookie_sock_exit(ctx: FExitContext) -> i32 {
    let _ = ret(&ctx, fexit_ret::COOKIE_SOCK).and_then(|child| {
        let (sk, skb) = listener_and_skb(&ctx, 0)?;
        syn::call_exit_with(ACK, child, |_| (sk, skb))
    });
    0
}

/// `void tcp_req_err(struct sock *sk, u32 seq, bool abort)`: `sk` is the request.
#[fentry(function = "tcp_req_err")]
pub fn req_err_enter(ctx: FEntryContext) -> i32 {
    let _ = arg_ptr(ctx.arg(0)).and_then(syn::request_error_enter);
    0
}

#[fexit(function = "tcp_req_err")]
pub fn req_err_exit(_ctx: FExitContext) -> i32 {
    let _ = syn::call_exit(OTHER, 0);
    0
}

/// `struct sock *inet_csk_reqsk_queue_add(struct sock *sk, struct request_sock *req,
/// struct sock *child)`: returns `child` once it is on the accept queue, NULL when the
/// listener was closing. Counted here only for TCP Fast Open (called from
/// `tcp_conn_request`): the final-ACK and syncookie paths are counted at their callers'
/// return, because the compiler inlines this function into `inet_csk_complete_hashdance`
/// and a hook on it never sees those calls.
#[fexit(function = "inet_csk_reqsk_queue_add")]
pub fn reqsk_queue_add_exit(ctx: FExitContext) -> i32 {
    let _ = try_reqsk_queue_add_exit(&ctx);
    0
}

fn try_reqsk_queue_add_exit(ctx: &FExitContext) -> Result<()> {
    let child = ret_ptr(ctx, fexit_ret::REQSK_QUEUE_ADD)?;
    let Some((sk, ino)) = syn::in_conn_request() else {
        return Ok(());
    };
    if child == 0 {
        return Ok(());
    }
    accept::enqueued(sk, ino);
    Ok(())
}

/// `struct sock *inet_csk_accept(struct sock *sk, ...)`: the accepted child or NULL. (The
/// other arguments changed in 6.10; only the first and the return value are used.)
#[fexit(function = "inet_csk_accept")]
pub fn inet_csk_accept_exit(ctx: FExitContext) -> i32 {
    let _ = try_accept_exit(&ctx);
    0
}

fn try_accept_exit(ctx: &FExitContext) -> Result<()> {
    // Typed as the verifier types the return value (`struct sock *`), not laundered: the
    // accept wait's stamp is read from it by direct load (`Kmem::read_tcp`).
    let child = ret(ctx, fexit_ret::INET_CSK_ACCEPT)?;
    if child == 0 {
        return Ok(());
    }
    accept::accepted(arg_btf(ctx.arg(0))?, BtfPtr::new(child as *const u8))
}

/// `void inet_csk_listen_stop(struct sock *sk)`: a listener closing. Every way out of
/// LISTEN passes here (`__tcp_close`, `tcp_disconnect` for shutdown(SHUT_RD) and
/// connect(AF_UNSPEC), `tcp_abort` for `ss -K`), after the state became CLOSE and while
/// the socket still has its `struct socket`. The one LISTEN -> CLOSE it misses, a
/// listen(2) whose port binding failed, never produced a LISTEN event. The other modes
/// take `inet_sock_set_state` instead, which runs six times per handshake.
#[fentry(function = "inet_csk_listen_stop")]
pub fn listen_stop_enter(ctx: FEntryContext) -> i32 {
    let _ = arg_ptr(ctx.arg(0)).and_then(listen::listener_closed);
    0
}

/// `long __x64_sys_listen(const struct pt_regs *regs)` (arm64: `__arm64_sys_listen`): the
/// syscall's entry point, called through the syscall table from another compilation unit,
/// so never inlined (unlike `__sys_listen`). The user's registers hold its arguments
/// still at return.
#[fexit(function = "__x64_sys_listen")]
pub fn listen_syscall_exit(ctx: FExitContext) -> i32 {
    let _ = try_listen_syscall_exit(&ctx);
    0
}

fn try_listen_syscall_exit(ctx: &FExitContext) -> Result<()> {
    let ret = ret(ctx, fexit_ret::LISTEN)? as i64;
    listen::returned(untyped_arg0(ctx)?, ret)
}

/// The traced function's first argument as a plain address, read from the context with
/// `bpf_probe_read_kernel` rather than the verifier's typed context load. For an argument
/// whose type the kernel's BTF does not complete: Debian 11's 5.10 describes
/// `__x64_sys_listen`'s `const struct pt_regs *` as a pointer to a forward declaration,
/// and its verifier refuses every context load of such an argument ("func
/// '__x64_sys_listen' arg0 type FWD is not a struct", EACCES). The registers are only
/// ever read through the helper, so the address is all the program needs. (The context
/// is on the trampoline's stack; the helper reads it as any kernel memory.)
#[inline(always)]
fn untyped_arg0(ctx: &FExitContext) -> Result<KPtr> {
    // SAFETY: bpf_probe_read_kernel validates the source and fails instead of faulting.
    let p = KPtr(unsafe { bpf_probe_read_kernel(ctx.as_ptr().cast::<u64>()) }?);
    if p.is_null() {
        Err(errno::EFAULT)
    } else {
        Ok(p)
    }
}
