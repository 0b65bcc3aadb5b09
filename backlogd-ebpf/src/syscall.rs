//! accept(), accept4() and listen() returning, in kprobe and tracepoint modes: one tp_btf
//! program at the `sys_exit` tracepoint, whose saved user registers still hold the syscall's
//! number and arguments. (fentry mode hooks `inet_csk_accept` and the listen syscall
//! itself instead, see `fentry.rs`, and runs nothing per other syscall.)
//!
//! Why not the `syscalls:sys_{enter,exit}_{accept,accept4,listen}` tracepoints, which
//! cost other syscalls only a bitmap test: a classic tracepoint program runs under the
//! kernel's per-CPU guard `bpf_prog_active` and is skipped whenever that guard is already
//! held on its CPU. Any bpf() map syscall holds it (`bpf_disable_instrumentation`, with
//! migration disabled but preemption allowed), backlogd's own reads and deletes included:
//! on a preemptible kernel a task preempted inside a map lookup leaves the guard held, and
//! an accept() returning on that CPU meanwhile goes uncounted (the likely cause of a CI
//! run on Debian's 7.3 kernel, tracepoint mode, counting 221 of 222 accepts). The kernel
//! counts such skips only from 6.7 on. A raw (here BTF-typed) tracepoint program has a
//! guard of its own, taken by nothing else. The price is a run at the exit of every syscall on the host (BENCHMARKS.md has the
//! figure), kept small: the tracepoint's arguments are BTF-typed, so the syscall number
//! is one direct load, no helper call, and every other syscall leaves there.

use aya_ebpf::{macros::btf_tracepoint, programs::BtfTracePointContext};

use crate::{
    accept,
    kernel::{BtfPtr, KPtr, Result, current_task, number, offset},
    listen,
};

/// `TP_PROTO(struct pt_regs *regs, long ret)`, at the exit of every syscall.
#[btf_tracepoint(function = "sys_exit")]
pub fn syscall_exit(ctx: BtfTracePointContext) -> i32 {
    let _ = try_syscall_exit(BtfPtr::new(ctx.arg(0)), ctx.arg(1));
    0
}

#[inline(always)]
fn try_syscall_exit(regs: BtfPtr, ret: i64) -> Result<()> {
    if ret < 0 {
        return Ok(());
    }
    let nr: u32 = regs.load(offset(|o| &o.regs_syscall_nr));
    let regs = KPtr(regs.addr());
    if nr == number(|o| &o.nr_accept4) || nr == number(|o| &o.nr_accept) {
        return accept_returned(regs, ret);
    }
    if nr == number(|o| &o.nr_listen) {
        return listen_returned(regs, ret);
    }
    Ok(())
}

// Each path is a function of its own (a BPF-to-BPF call) so that the program's own frame
// stays small: inlined together the two paths' stack slots pass the 512-byte limit, and
// the verifier adds the caller's frame to the callee's (Debian's 5.10 counted "combined
// stack size of 2 calls is 640" with only the listen path apart).

#[inline(never)]
fn accept_returned(regs: KPtr, ret: i64) -> Result<()> {
    if compat(regs)? {
        return Ok(());
    }
    accept::accept_returned(regs.read(offset(|o| &o.regs_arg0))?, ret as u64)
}

#[inline(never)]
fn listen_returned(regs: KPtr, ret: i64) -> Result<()> {
    if compat(regs)? {
        return Ok(());
    }
    listen::returned(regs, ret)
}

/// Whether the syscall returning is a 32-bit (compat) one: its number is from another
/// table (ia32's 50 is getegid, x86-64's listen), its arguments in other registers. Not
/// counted, as the classic syscall tracepoints never reported them either.
#[inline(always)]
fn compat(regs: KPtr) -> Result<bool> {
    let base = if number(|o| &o.compat_in_regs) != 0 {
        regs
    } else {
        current_task()
    };
    let flags: u32 = base.read(offset(|o| &o.compat_flags))?;
    Ok(flags & number(|o| &o.compat_mask) != 0)
}
