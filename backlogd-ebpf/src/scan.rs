//! The kernel's own view of its listeners, read in one pass: an `iter/task_file`
//! iterator visits every open file of every task (in the reader's PID namespace, all
//! network namespaces) and writes one [`ScannedListener`] per TCP listener it meets,
//! with the queue lengths as they are at that instant. It is the only place the SYN
//! queue's current length (`icsk_accept_queue.qlen`) can be read without an event: the
//! hooks see it only when a segment or an accept() passes, and a request timing out
//! changes it silently.
//!
//! A separate object (built as its own binary) holding none of the hooks' state: the
//! daemon loads it beside whatever the hook mode loaded, or beside programs it adopted
//! from pins. It shares `kernel.rs` (the offsets the daemon fills in from BTF) with the
//! hooks.
//!
//! Two programs, the same records: [`listeners`] asks the kernel for a file's socket
//! (`bpf_sock_from_file`, Linux 5.11+), which comes back typed, so the fields of its
//! `struct sock` are direct loads (a listener's in6_addr and SYN-queue length stay probe
//! reads); most files of a busy host are established sockets, and for
//! each of those the pass then costs a helper call and two loads instead of three probe
//! reads. [`listeners_probed`] is for 5.10, which lacks the helper: a socket is
//! `file->private_data` once the file's inode says it is one, read through probe reads.
//! The daemon loads the first and falls back to the second.
//!
//! A file may hold an MPTCP socket (Go 1.24 and later listen with MPTCP by default): its
//! TCP listener, the one SYNs reach, is the MPTCP socket's first subflow, a kernel socket
//! with no file of its own; the record is that subflow's, under its socket's inode (the
//! file's from Linux 5.12, which grafts the subflow onto the MPTCP socket; its own before).

#![no_std]
#![no_main]

// The hooks' helpers this program does not use (laundering, per-CPU areas) come along.
#[allow(dead_code)]
#[path = "kernel.rs"]
mod kernel;

use aya_ebpf::helpers::{bpf_seq_write, generated::bpf_sock_from_file};
use backlogd_common::{AF_INET6, IPPROTO_MPTCP, ScannedListener};

use crate::kernel::{BtfPtr, KPtr, Kmem, Result, errno, is_tcp_listener, offset};

/// `struct bpf_iter_meta`: only `seq` is read.
#[repr(C)]
struct IterMeta {
    seq: *mut aya_ebpf::bindings::seq_file,
}

/// `struct bpf_iter__task_file`, the context the kernel passes (a fixed layout: each
/// member one 8-byte slot).
#[repr(C)]
struct TaskFileCtx {
    meta: *const IterMeta,
    task: *const u8,
    fd: u64,
    file: *const u8,
}

/// `S_IFMT` and `S_IFSOCK` of `i_mode`.
const S_IFMT: u16 = 0o170_000;
const S_IFSOCK: u16 = 0o140_000;

/// The context's members; `None` for the last call of a pass, which has no task and no
/// file.
#[inline(always)]
fn members(ctx: *mut TaskFileCtx) -> Option<(*const IterMeta, BtfPtr, *const u8)> {
    // SAFETY: the kernel passes a valid context; the verifier checks every access to it.
    let (meta, task, file) = unsafe {
        (
            core::ptr::read_volatile(&(*ctx).meta),
            core::ptr::read_volatile(&(*ctx).task),
            core::ptr::read_volatile(&(*ctx).file),
        )
    };
    if task.is_null() || file.is_null() {
        return None;
    }
    Some((meta, BtfPtr::new(task), file))
}

/// Linux 5.11+: the file's socket from the kernel, typed.
#[unsafe(no_mangle)]
#[unsafe(link_section = "iter/task_file")]
fn listeners(ctx: *mut TaskFileCtx) -> i32 {
    let Some((meta, task, file)) = members(ctx) else {
        return 0;
    };
    // SAFETY: the verifier checks the argument is the kernel's `struct file *`; the
    // helper returns NULL for a file that is not a socket.
    let socket = unsafe { bpf_sock_from_file(file as *mut _) };
    if socket.is_null() {
        return 0;
    }
    if let Ok(sk) = BtfPtr::new(socket as *const u8).deref(offset(|o| &o.socket_sk)) {
        write_socket(meta, task, BtfPtr::new(file), sk);
    }
    // 0 moves on to the next file; anything else would stop or repeat the pass.
    0
}

/// Writes the record of the listener behind socket `sk` of `file`, if there is one: `sk`
/// itself, or an MPTCP socket's TCP listener.
#[inline(always)]
fn write_socket<K: Kmem>(meta: *const IterMeta, task: BtfPtr, file: BtfPtr, sk: K) {
    match sk.read::<u16>(offset(|o| &o.sk_protocol)) {
        Ok(IPPROTO_MPTCP) => {
            // The subflow's own socket inode, as the hooks key it: the file's from Linux
            // 5.12 (the subflow is grafted onto the MPTCP socket), its own kernel
            // socket's before.
            if let Ok(first) = mptcp_first(sk)
                && let Ok(ino) = first.socket_inode()
            {
                write(meta, record(task, ino, first));
            }
        }
        Ok(_) => {
            if let Ok(ino) = file
                .deref(offset(|o| &o.file_inode))
                .and_then(|inode| inode.read(offset(|o| &o.inode_ino)))
            {
                write(meta, record(task, ino, sk));
            }
        }
        Err(_) => {}
    }
}

/// The first subflow of MPTCP socket `msk`: a listening MPTCP socket's TCP listener,
/// which the SYN path and the listen events see.
#[inline(always)]
fn mptcp_first<K: Kmem>(msk: K) -> Result<KPtr> {
    let first = offset(|o| &o.mptcp_first);
    if first != 0 {
        return msk.probed().deref(first);
    }
    let subflow = offset(|o| &o.mptcp_subflow);
    if subflow == 0 {
        return Err(errno::ENOENT);
    }
    msk.probed().deref(subflow)?.deref(offset(|o| &o.socket_sk))
}

/// Linux 5.10: a socket's file by its inode's type, the socket by probe reads.
#[unsafe(no_mangle)]
#[unsafe(link_section = "iter/task_file")]
fn listeners_probed(ctx: *mut TaskFileCtx) -> i32 {
    let Some((meta, task, file)) = members(ctx) else {
        return 0;
    };
    let file = BtfPtr::new(file);
    if let Ok(Some(sk)) = socket_probed(file) {
        write_socket(meta, task, file, sk);
    }
    0
}

/// The `struct sock *` of `file` if it is a socket's, read without the helper.
#[inline(always)]
fn socket_probed(file: BtfPtr) -> Result<Option<kernel::KPtr>> {
    // Typed all the way to the inode: direct loads, the cheap test every file takes.
    let inode = file.deref(offset(|o| &o.file_inode))?;
    let mode: u16 = inode.read(offset(|o| &o.inode_mode))?;
    if mode & S_IFMT != S_IFSOCK {
        return Ok(None);
    }
    // `private_data` is a `void *`: the socket from here on is read through the helper.
    let socket = file.probed().deref(offset(|o| &o.file_private_data))?;
    Ok(Some(socket.deref(offset(|o| &o.socket_sk))?))
}

/// Writes `found` to the pass's output, if it is a listener.
#[inline(always)]
fn write(meta: *const IterMeta, found: Result<Option<ScannedListener>>) {
    let Ok(Some(found)) = found else {
        return;
    };
    // SAFETY: `meta` is the kernel's, valid for this call; `found` lives on the stack for
    // the helper's call, every byte of it written.
    unsafe {
        let seq = core::ptr::read_volatile(&(*meta).seq);
        bpf_seq_write(
            seq,
            core::ptr::addr_of!(found).cast(),
            core::mem::size_of::<ScannedListener>() as u32,
        );
    }
}

/// The record of socket `sk` (read through `K`, socket inode `ino`), held by `task`, or
/// `None` if it is not a TCP listener.
#[inline(always)]
fn record<K: Kmem>(task: BtfPtr, ino: u64, sk: K) -> Result<Option<ScannedListener>> {
    if !is_tcp_listener(sk)? {
        return Ok(None);
    }
    let family: u16 = sk.read(offset(|o| &o.sk_family))?;
    // Listeners only, so probe reads: an in6_addr is no single load.
    let mut addr = [0u8; 16];
    if family == AF_INET6 {
        addr = sk.probed().read(offset(|o| &o.sk_v6_rcv_saddr))?;
    } else {
        let v4: u32 = sk.read(offset(|o| &o.sk_rcv_saddr))?;
        addr[..4].copy_from_slice(&v4.to_ne_bytes());
    }
    let net = sk.deref(offset(|o| &o.sk_net))?;
    Ok(Some(ScannedListener {
        somaxconn: net.read(offset(|o| &o.net_somaxconn))?,
        max_syn_backlog: net.read(offset(|o| &o.net_max_syn_backlog))?,
        syncookies: net.read(offset(|o| &o.net_syncookies))?,
        abort_on_overflow: net.read(offset(|o| &o.net_abort_on_overflow))?,
        _pad: [0; 6],
        ino,
        netns: net.read(offset(|o| &o.net_inum))?,
        tgid: task.read(offset(|o| &o.task_tgid))?,
        accept_queue: sk.read(offset(|o| &o.sk_ack_backlog))?,
        accept_capacity: sk.read(offset(|o| &o.sk_max_ack_backlog))?,
        // In `struct inet_connection_sock`, past the `struct sock` a typed pointer
        // allows.
        syn_queue: sk.probed().read(offset(|o| &o.icsk_syn_qlen))?,
        family,
        port: sk.read(offset(|o| &o.sk_num))?,
        addr,
    }))
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    // A reachable panic makes the verifier reject the program; this is never called.
    loop {}
}

// bpf_probe_read_kernel and bpf_seq_write are GPL-only.
#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
