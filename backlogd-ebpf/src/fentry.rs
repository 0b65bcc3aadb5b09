//! fentry/fexit mode: BPF trampolines on the kernel functions that decide a listener's
//! fate. The cheapest hooks, with per-program recursion protection (a hook is never
//! skipped because another tracing program is running). Needs BPF trampolines (5.5+) and
//! `bpf_get_func_ret` (5.17+).
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
//! - the listen(2) syscall's return (`__x64_sys_listen`): the backlog asked for and the one
//!   granted. An fexit there, not the `sys_exit` tracepoint the other modes use: any
//!   syscall tracepoint sends every syscall of every task through the kernel's slow path
//!   (and that one runs a program per syscall).

use aya_ebpf::{
    macros::{fentry, fexit},
    programs::{FEntryContext, FExitContext},
};
use backlogd_common::segment_kind::{ACK, OTHER, SYN};

use crate::{
    accept,
    kernel::{KPtr, Result, errno, launder},
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

/// `int tcp_conn_request(rsk_ops, af_ops, struct sock *sk, struct sk_buff *skb)`
#[fentry(function = "tcp_conn_request")]
pub fn conn_request_enter(ctx: FEntryContext) -> i32 {
    let _ = arg_ptr(ctx.arg(2)).and_then(|sk| syn::call_enter(sk, ctx.arg(3), SYN));
    0
}

#[fexit(function = "tcp_conn_request")]
pub fn conn_request_exit(_ctx: FExitContext) -> i32 {
    let _ = syn::call_exit(SYN, 0);
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
    let (sk, skb) = (arg_ptr(ctx.arg(0))?, arg_ptr(ctx.arg(1))?);
    let _ = syn::pending_request_segment(sk, skb);
    syn::call_enter(sk, skb.0, ACK)
}

/// Returns the child once `inet_csk_complete_hashdance` queued it for accept.
#[fexit(function = "tcp_check_req")]
pub fn check_req_exit(ctx: FExitContext) -> i32 {
    let _ = ctx
        .ret::<u64>()
        .and_then(|child| syn::call_exit(ACK, child));
    0
}

/// `struct sock *tcp_get_cookie_sock(struct sock *sk, struct sk_buff *skb, ...)`: the ACK
/// of a syncookie handshake creates its child here, where it can overflow, too.
#[fentry(function = "tcp_get_cookie_sock")]
pub fn cookie_sock_enter(ctx: FEntryContext) -> i32 {
    let _ = arg_ptr(ctx.arg(0)).and_then(|sk| syn::call_enter(sk, ctx.arg(1), ACK));
    0
}

/// Returns the child once it is on the accept queue.
#[fexit(function = "tcp_get_cookie_sock")]
pub fn cookie_sock_exit(ctx: FExitContext) -> i32 {
    let _ = ctx
        .ret::<u64>()
        .and_then(|child| syn::call_exit(ACK, child));
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
    let child: u64 = ctx.ret()?;
    if child == 0 || !syn::in_conn_request() {
        return Ok(());
    }
    accept::enqueued(arg_ptr(ctx.arg(0))?, Some(KPtr(child)))
}

/// `struct sock *inet_csk_accept(struct sock *sk, ...)`: the accepted child or NULL. (The
/// other arguments changed in 6.10; only the first and the return value are used.)
#[fexit(function = "inet_csk_accept")]
pub fn inet_csk_accept_exit(ctx: FExitContext) -> i32 {
    let _ = try_accept_exit(&ctx);
    0
}

fn try_accept_exit(ctx: &FExitContext) -> Result<()> {
    let child: u64 = ctx.ret()?;
    if child == 0 {
        return Ok(());
    }
    accept::accepted(arg_ptr(ctx.arg(0))?, KPtr(child))
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
    listen::returned(arg_ptr(ctx.arg(0))?, ctx.ret()?)
}
