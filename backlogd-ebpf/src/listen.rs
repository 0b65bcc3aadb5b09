//! Listener lifecycle: who listens where, with which backlog asked for and granted.
//!
//! `listen(2)` clamps the backlog to `net.core.somaxconn` of the socket's netns before the
//! protocol code stores it in `sk_max_ack_backlog`, so only the syscall's arguments show
//! what the application asked for, and only its return what it got: [`listened`] runs at
//! the syscall's return, from the `sys_exit` tracepoint (tp_btf) in tracepoint and kprobe modes
//! (`syscall.rs`) and an fexit on the syscall itself in fentry mode
//! (`fentry::listen_syscall_exit`), both reading the arguments from the saved user
//! registers. A repeated `listen()` on a listener emits a new LISTEN event with the new
//! figures.
//!
//! A listener going away ([`listener_closed`]) shows up in fentry mode as
//! `inet_csk_listen_stop`'s entry (`fentry::listen_stop_enter`), in the other modes as
//! `inet_sock_set_state` LISTEN -> CLOSE, taken as a raw tracepoint (it fires in process
//! context on every connect() and close(); a classic tracepoint program there would make
//! the kernel skip kprobe programs of SYNs arriving meanwhile, see `kprobe.rs`).

use aya_ebpf::{
    helpers::{bpf_get_current_comm, bpf_get_current_pid_tgid},
    macros::{map, raw_tracepoint},
    maps::{LruHashMap, PerCpuArray, RingBuf},
    programs::RawTracePointContext,
};
use backlogd_common::{
    AF_INET, AF_INET6, IPPROTO_TCP, LISTENER_EVENTS_BYTES, LISTENER_STATS_ENTRIES, ListenerEvent,
    TCP_LISTEN, event_kind,
};

use crate::kernel::{KPtr, Result, offset, socket_of_fd};

// include/net/tcp_states.h, part of the tracepoint ABI like TCP_LISTEN.
const TCP_ESTABLISHED: u32 = 1;
const TCP_SYN_RECV: u32 = 3;
const TCP_CLOSE: u32 = 7;

#[map]
static LISTENER_EVENTS: RingBuf = RingBuf::with_byte_size(LISTENER_EVENTS_BYTES, 0);

/// Events that did not fit in `LISTENER_EVENTS`; the daemon exports the sum and rescans.
#[map]
static LISTENER_EVENTS_LOST: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

/// The last LISTEN event of every live listener, by socket inode (sized by the daemon's
/// `max_listeners`), removed when it closes. Pinned with the other maps, so a restarted
/// daemon still knows what each listener asked for and who asked, though the events
/// themselves were read by the daemon before it. LRU: past `max_listeners` the oldest is
/// forgotten, and that listener's request is unknown again.
#[map]
static LISTENS_SEEN: LruHashMap<u64, ListenerEvent> =
    LruHashMap::with_max_entries(LISTENER_STATS_ENTRIES, 0);

/// listen(2) returned `ret` in the current thread; `regs` are the caller's saved user
/// registers, which still hold the arguments.
#[inline(always)]
pub(crate) fn returned(regs: KPtr, ret: i64) -> Result<()> {
    let fd: u64 = regs.read(offset(|o| &o.regs_arg0))?;
    let backlog: u64 = regs.read(offset(|o| &o.regs_arg1))?;
    // The syscall takes an int: its low 32 bits.
    listened(fd, backlog as i32, ret)
}

/// listen(`fd`, `requested`) returned `ret` in the current thread: a TCP listener's
/// LISTEN event, with what it asked for and what it got.
#[inline(always)]
fn listened(fd: u64, requested: i32, ret: i64) -> Result<()> {
    if ret != 0 {
        return Ok(());
    }
    let id = bpf_get_current_pid_tgid();
    let socket = socket_of_fd(fd)?;
    let sk = socket.deref(offset(|o| &o.socket_sk))?;
    let family: u16 = sk.read(offset(|o| &o.sk_family))?;
    if family != AF_INET && family != AF_INET6 {
        return Ok(());
    }
    let protocol: u16 = sk.read(offset(|o| &o.sk_protocol))?;
    let state: u8 = sk.read(offset(|o| &o.sk_state))?;
    if protocol != IPPROTO_TCP || u32::from(state) != TCP_LISTEN {
        return Ok(());
    }

    let mut addr = [0u8; 16];
    if family == AF_INET {
        let v4: [u8; 4] = sk.read(offset(|o| &o.sk_rcv_saddr))?;
        addr[..4].copy_from_slice(&v4);
    } else {
        addr = sk.read(offset(|o| &o.sk_v6_rcv_saddr))?;
    }
    let event = ListenerEvent {
        kind: event_kind::LISTEN,
        family,
        port: sk.read(offset(|o| &o.sk_num))?,
        sk: sk.0,
        ino: socket.read(offset(|o| &o.socket_ino))?,
        netns: netns_inum(sk)?,
        tgid: (id >> 32) as u32,
        pid: id as u32,
        requested,
        granted: sk.read(offset(|o| &o.sk_max_ack_backlog))?,
        _pad: 0,
        addr,
        comm: bpf_get_current_comm().unwrap_or_default(),
    };
    emit(&event);
    let _ = LISTENS_SEEN.insert(event.ino, event, 0);
    Ok(())
}

/// `TP_PROTO(const struct sock *sk, const int oldstate, const int newstate)`. kprobe and
/// tracepoint modes.
#[raw_tracepoint(tracepoint = "inet_sock_set_state")]
pub fn listener_state(ctx: RawTracePointContext) -> u32 {
    let sk = KPtr(ctx.arg(0));
    let oldstate: u64 = ctx.arg(1);
    let newstate: u64 = ctx.arg(2);
    let _ = match (oldstate as u32, newstate as u32) {
        // A listener leaves LISTEN only for CLOSE. LISTEN -> SYN_RECV is a child being
        // cloned from its listener (`inet_csk_clone_lock`): not a listener going away.
        (TCP_LISTEN, TCP_CLOSE) => listener_closed(sk),
        (TCP_LISTEN, TCP_SYN_RECV) if is_tcp(sk) => crate::syn::child_cloned(sk),
        (TCP_SYN_RECV, TCP_ESTABLISHED) if is_tcp(sk) => crate::syn::handshake_completed(sk),
        _ => Ok(()),
    };
    0
}

/// The tracepoint fires for SCTP and MPTCP sockets too (its record has a protocol field).
#[inline(always)]
fn is_tcp(sk: KPtr) -> bool {
    sk.read::<u16>(offset(|o| &o.sk_protocol)) == Ok(IPPROTO_TCP)
}

/// Listener `sk` is closing: its entries go, and the daemon hears of it.
pub(crate) fn listener_closed(sk: KPtr) -> Result<()> {
    if sk.is_null() || !is_tcp(sk) {
        return Ok(());
    }
    // A listener still has its struct socket when it leaves LISTEN (tcp_close orphans it
    // only afterwards); if not, ino stays 0 and the daemon's rescan removes the entry.
    let ino = sk
        .deref(offset(|o| &o.sk_socket))
        .and_then(|socket| socket.read(offset(|o| &o.socket_ino)))
        .unwrap_or(0);
    crate::listener::forget(ino);
    let _ = LISTENS_SEEN.remove(ino);
    emit(&ListenerEvent {
        kind: event_kind::CLOSE,
        sk: sk.0,
        ino,
        ..ListenerEvent::default()
    });
    Ok(())
}

#[inline(always)]
fn netns_inum(sk: KPtr) -> Result<u32> {
    sk.deref(offset(|o| &o.sk_net))?
        .read(offset(|o| &o.net_inum))
}

#[inline(always)]
fn emit(event: &ListenerEvent) {
    if LISTENER_EVENTS.output::<ListenerEvent>(event, 0).is_err()
        && let Some(lost) = LISTENER_EVENTS_LOST.get_ptr_mut(0)
    {
        // SAFETY: per-CPU slot, and programs do not migrate CPUs mid-run.
        unsafe { *lost += 1 };
    }
}
