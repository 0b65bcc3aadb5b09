//! SYN path, tracepoint mode: what happened to each segment that reached a listener.
//!
//! The kernel has no tracepoint inside `tcp_conn_request` or `syn_recv_sock`, but it does
//! count every outcome in per-CPU netns MIB counters (ListenOverflows, ListenDrops,
//! TCPReqQFullDrop, TCPReqQFullDoCookies). A segment is processed start to finish on one
//! CPU inside one softirq, so this CPU's counters before and after tell exactly what the
//! kernel did with *this* segment, regardless of what other CPUs are doing:
//!
//! 1. `listener_ingress` (cgroup_skb, root cgroup) runs from `tcp_filter()` for every
//!    segment delivered to a listener, before `tcp_conn_request`/`tcp_check_req`, and
//!    stashes the skb, the listener and this CPU's counters.
//! 2. `syn_consumed` / `syn_freed` (tp_btf `consume_skb`, `kfree_skb`) fire when that
//!    skb is released at the end of processing; the counter deltas are the outcome.
//! 3. A stash still pending at the next ingress on the CPU is settled there. Nothing else
//!    on this CPU moves these counters without passing ingress first, so the deltas are
//!    still exactly that segment's outcome. This covers skbs released without a
//!    tracepoint (`__kfree_skb`) and release hooks the kernel skipped for recursion.
//!    Which attempt the segment belongs to (for client impact and drop sources) comes
//!    from a copy ingress made of its headers, never from the skb at settle time: the
//!    skb may be gone, or its address reused by another skb whose release settles it.
//!
//! fentry and kprobe modes (programs in `fentry.rs` / `kprobe.rs`) use the same counter
//! deltas with exact boundaries: [`call_enter`] at the entry of `tcp_conn_request` (SYN)
//! or `tcp_check_req` / `tcp_get_cookie_sock` (final ACK) and [`call_exit`] at its return.
//!
//! `synack_retransmit` counts the `tcp_retransmit_synack` tracepoint per listener, as a raw
//! tracepoint: a classic tracepoint program is skipped whenever another classic-tracepoint
//! or kprobe program runs on the CPU (the retransmit timer fires on an interrupt's exit,
//! possibly inside one), a raw tracepoint program is not.

use aya_ebpf::{
    bindings::__sk_buff,
    macros::{btf_tracepoint, cgroup_skb, map, raw_tracepoint},
    maps::PerCpuArray,
    programs::{BtfTracePointContext, RawTracePointContext, SkBuffContext},
};
use backlogd_common::{DropReason, SynStash, TCP_LISTEN, mib, segment_kind, source};

use crate::{
    impact,
    kernel::{
        KPtr, Kmem, Result, cpu_area_offset, errno, launder, offset, offset_at, socket_inode,
    },
    listener,
};

#[map]
static STASH: PerCpuArray<SynStash> = PerCpuArray::with_max_entries(1, 0);

/// Function-hook modes: one open call per segment kind on a CPU, indexed by kind - 1.
/// One element holding all three, so a call finds every window with one lookup.
#[map]
static CALL_STASH: PerCpuArray<[SynStash; 3]> = PerCpuArray::with_max_entries(1, 0);

const TCP_FLAG_SYN: u8 = 0x02;
const TCP_FLAG_RST: u8 = 0x04;
const TCP_FLAG_ACK: u8 = 0x10;
const IPPROTO_TCP: u8 = 6;

#[cgroup_skb]
pub fn listener_ingress(ctx: SkBuffContext) -> i32 {
    let _ = try_listener_ingress(&ctx);
    1 // never drop: backlogd observes, it does not filter
}

fn try_listener_ingress(ctx: &SkBuffContext) -> Result<()> {
    let skb: *mut __sk_buff = ctx.skb.skb;
    // SAFETY: `skb` is the program's context; the verifier rewrites field loads.
    let sk = unsafe { (*skb).__bindgen_anon_2.sk };
    if sk.is_null() {
        return Ok(());
    }
    // SAFETY: non-null socket from the context; rewritten by the verifier.
    let state = unsafe { (*sk).state };
    if state != TCP_LISTEN {
        return Ok(());
    }
    let slot = STASH.get_ptr_mut(0).ok_or(errno::ENOENT)?;
    // The previous segment on this CPU is finished: settle it before anything here can
    // return early, or this segment's counter deltas would land on it. Ingress runs in
    // softirq, so none of our release hooks can interleave with it on this CPU.
    // SAFETY: this CPU's element of STASH.
    let previous = unsafe { *slot };
    if previous.skb != 0 {
        // SAFETY: as above.
        unsafe { (*slot).skb = 0 };
        // Its skb may be freed by now: its ingress copy says whose it was.
        let _ = settle(
            &previous,
            KPtr(previous.sk),
            Some(impact::Copied(previous.skb)),
        );
    }
    // A segment that is neither a SYN nor an ACK (RST, an IPv6 extension header chain)
    // still gets a window, so whatever the kernel drops on its account is counted.
    let skb_addr = launder(skb.cast::<u8>())?;
    let kind = match copy_segment(ctx, skb_addr) {
        Ok(f) if f & (TCP_FLAG_SYN | TCP_FLAG_ACK | TCP_FLAG_RST) == TCP_FLAG_SYN => {
            segment_kind::SYN
        }
        Ok(f) if f & (TCP_FLAG_SYN | TCP_FLAG_ACK | TCP_FLAG_RST) == TCP_FLAG_ACK => {
            segment_kind::ACK
        }
        _ => segment_kind::OTHER,
    };
    let sk = KPtr(launder(sk.cast::<u8>())?);
    let ino = socket_inode(sk)?;
    // No queue observation here: the queues only grow while a segment is processed, and
    // every segment's settle observes them after that (the peak), so the state before it
    // adds nothing.
    let stash = open_window(sk, skb_addr, ino, kind, &previous)?;
    // SAFETY: as above.
    unsafe { *slot = stash };
    Ok(())
}

/// Tracepoint mode: listener processing a segment on this CPU cloned `child` (LISTEN ->
/// SYN_RECV). In a final-ACK window (`tcp_check_req`, `tcp_get_cookie_sock`) the child
/// goes on the accept queue if the handshake completes, which [`handshake_completed`]
/// sees. In a SYN window it is a Fast Open child, put on the accept queue right away by
/// `tcp_conn_request`. These state changes replace a hook on `sk_data_ready`, which runs
/// for every segment or datagram any socket receives.
#[inline(always)]
pub(crate) fn child_cloned(child: KPtr) -> Result<()> {
    let slot = STASH.get_ptr_mut(0).ok_or(errno::ENOENT)?;
    // SAFETY: this CPU's element of STASH; the state change runs inside the window's
    // softirq, which ingress cannot interrupt.
    let stash = unsafe { &mut *slot };
    if stash.skb == 0 {
        return Ok(());
    }
    if stash.kind == segment_kind::SYN {
        stash.observed = 1;
        crate::accept::enqueued(KPtr(stash.sk), stash.ino);
    } else {
        stash.child = child.0;
    }
    Ok(())
}

/// Tracepoint mode: `child` just became ESTABLISHED. If it is the child this CPU's window
/// cloned, the kernel has put it on the listener's accept queue (`tcp_child_process`
/// runs after the queueing): count it and look at the queue now, as the ACK's skb may be
/// released without a tracepoint (`__kfree_skb`), and by the next ingress accept() may
/// already have drained the peak. A Fast Open child completing its handshake later is no
/// window's child, so it is not counted twice.
#[inline(always)]
pub(crate) fn handshake_completed(child: KPtr) -> Result<()> {
    let slot = STASH.get_ptr_mut(0).ok_or(errno::ENOENT)?;
    // SAFETY: as in child_cloned.
    let stash = unsafe { &mut *slot };
    if stash.skb == 0 || stash.child != child.0 {
        return Ok(());
    }
    stash.child = 0;
    stash.observed = 1;
    // This runs inside the segment's processing: its skb is alive, and the ingress copy
    // is its own if the ingress could parse it (a final ACK's window; costs no helper
    // call per header read).
    let (sk, ino, net) = (KPtr(stash.sk), stash.ino, stash.net);
    if stash.kind == segment_kind::ACK {
        child_queued(sk, ino, net, impact::Copied(stash.skb), child)
    } else {
        child_queued(sk, ino, net, impact::Alive(KPtr(stash.skb)), child)
    }
}

/// Listener `sk` (inode `ino`, netns `net`) put `child` on its accept queue, on segment
/// `seg`: client impact's completion, only while its gate is open, and the queue's count,
/// with one clock read for both.
#[inline(always)]
fn child_queued<L: Kmem, S: impact::Segment>(
    sk: L,
    ino: u64,
    net: u64,
    seg: S,
    child: KPtr,
) -> Result<()> {
    let now = listener::now();
    if impact::gate_open(now) {
        let _ = impact::completed(sk.probed(), ino, net, seg, child);
    }
    crate::accept::enqueued_at(sk, ino, now);
    Ok(())
}

/// Function-hook modes: the kernel starts processing `skb` on listener `sk` (`kind` SYN:
/// `tcp_conn_request`; ACK: `tcp_check_req` or `tcp_get_cookie_sock`; OTHER:
/// `tcp_req_err`, with the request as `skb`; none nests in another). Runs in softirq, so
/// calls never interleave on a CPU; a call whose exit hook was missed (kretprobe) is
/// settled at the next call of any kind, with deltas that are still that call's own.
#[inline(always)]
pub(crate) fn call_enter<K: Kmem>(sk: K, skb: u64, kind: u32) -> Result<()> {
    if !is_listening(sk)? {
        return Ok(()); // tcp_check_req on a Fast Open child
    }
    call_enter_listener(sk, skb, kind)
}

/// Whether `sk` is in LISTEN.
#[inline(always)]
pub(crate) fn is_listening<K: Kmem>(sk: K) -> Result<bool> {
    let state: u8 = sk.read(offset(|o| &o.sk_state))?;
    Ok(u32::from(state) == TCP_LISTEN)
}

/// [`call_enter`] for a caller that has seen `sk` in LISTEN.
#[inline(always)]
pub(crate) fn call_enter_listener<K: Kmem>(sk: K, skb: u64, kind: u32) -> Result<()> {
    let windows = call_windows()?;
    // No kind nests in another, so a window still open here, of any kind, is a call
    // that has returned: settle it now, before this call moves the counters.
    for stale in windows.iter_mut() {
        if stale.skb != 0 {
            stale.skb = 0;
            // The call returned long ago: its skb may be freed.
            let _ = settle::<_, impact::Alive<KPtr>>(stale, KPtr(stale.sk), None);
        }
    }
    let slot = window(windows, kind);
    *slot = open_window(sk, skb, socket_inode(sk)?, kind, slot)?;
    Ok(())
}

/// Function-hook modes: the call [`call_enter`] opened for `kind` on this CPU returned
/// `ret`. A final-ACK call that returns a socket other than the listener has put that
/// child on the accept queue (`inet_csk_complete_hashdance` / `tcp_get_cookie_sock`).
#[inline(always)]
pub(crate) fn call_exit(kind: u32, ret: u64) -> Result<()> {
    call_exit_with(kind, ret, |taken| (KPtr(taken.sk), KPtr(taken.skb)))
}

/// [`call_exit`], the listener and the segment as `args` gives them from the window: an
/// fexit program passes its own typed arguments (the call's, so the window's: one call
/// of a kind at a time on a CPU, checked by address), whose fields it reads by direct
/// load.
#[inline(always)]
pub(crate) fn call_exit_with<L: Kmem, K: Kmem>(
    kind: u32,
    ret: u64,
    args: impl FnOnce(&SynStash) -> (L, K),
) -> Result<()> {
    let stash = window(call_windows()?, kind);
    if stash.skb == 0 {
        return Ok(());
    }
    let taken = *stash;
    stash.skb = 0;
    let (sk, skb) = args(&taken);
    if sk.addr() != taken.sk || skb.addr() != taken.skb {
        // Not this call's window: one left open by a call whose exit was missed (its
        // programs were being attached), found by a call that opened none (a Fast Open
        // child's tcp_check_req). That call returned long ago: settled as at the next
        // call's entry, without its skb, and not observed through this call's sockets.
        return settle::<_, impact::Alive<KPtr>>(&taken, KPtr(taken.sk), None);
    }
    // The skb is alive until the caller of the hooked function frees it.
    if kind == segment_kind::ACK && ret != 0 && ret != taken.sk {
        // A call that returns a child made no listen drop, so there are no deltas to
        // read: every drop on this path (`syn_recv_sock`'s overflow and failure exits,
        // a request another CPU completed first, a listener that stopped listening)
        // returns NULL.
        return child_queued(sk, taken.ino, taken.net, impact::Alive(skb), KPtr(ret));
    }
    settle(&taken, sk, Some(impact::Alive(skb)))
}

/// Function-hook modes: an ICMP error arrived for pending request `req`
/// (`tcp_req_err`). A fatal one (host or network unreachable, TTL exceeded, parameter
/// problem) removes the request and counts a listen drop for its listener, outside any
/// segment's window; this opens one for it. Its drops count as reason "other".
#[inline(always)]
pub(crate) fn request_error_enter(req: KPtr) -> Result<()> {
    let listener = req.deref(offset(|o| &o.request_sock_listener))?;
    if listener.is_null() {
        return Err(errno::EFAULT);
    }
    call_enter(listener, req.0, segment_kind::OTHER)
}

/// The listener (address, inode) whose `tcp_conn_request` this CPU is inside, if any
/// (where only a TCP Fast Open SYN queues a child for accept).
#[inline(always)]
pub(crate) fn in_conn_request() -> Option<(KPtr, u64)> {
    let w = window(call_windows().ok()?, segment_kind::SYN);
    (w.skb != 0).then_some((KPtr(w.sk), w.ino))
}

/// Function-hook modes: `tcp_check_req` got a segment for a pending request of listener
/// `sk`. A SYN here is a retransmitted SYN: it never reaches `tcp_conn_request` (the
/// kernel answers it from the SYN queue), but it did reach the listener and counts as
/// received, as in tracepoint mode.
#[inline(always)]
pub(crate) fn pending_request_segment<K: Kmem>(sk: K, skb: K) -> Result<()> {
    if !is_listening(sk)? {
        return Ok(()); // a Fast Open child's own segment
    }
    pending_request_segment_listener(sk, skb)
}

/// [`pending_request_segment`] for a caller that has seen `sk` in LISTEN.
#[inline(always)]
pub(crate) fn pending_request_segment_listener<K: Kmem>(sk: K, skb: K) -> Result<()> {
    // From the control block `tcp_v{4,6}_fill_cb` filled in before this call: one read
    // of the skb instead of three through its header.
    let flags: u8 = skb.read(offset(|o| &o.skb_tcp_flags))?;
    if flags & (TCP_FLAG_SYN | TCP_FLAG_ACK | TCP_FLAG_RST) == TCP_FLAG_SYN {
        listener::update(sk.probed(), socket_inode(sk)?, |s| s.syns += 1);
    }
    Ok(())
}

/// This CPU's function-hook windows.
#[inline(always)]
fn call_windows() -> Result<&'static mut [SynStash; 3]> {
    let slot = CALL_STASH.get_ptr_mut(0).ok_or(errno::ENOENT)?;
    // SAFETY: this CPU's element of CALL_STASH; calls run in softirq and never
    // interleave on a CPU (see call_enter), so no other reference to it is live.
    Ok(unsafe { &mut *slot })
}

/// The window of `kind` (constant indices: the verifier sees fixed offsets).
#[inline(always)]
fn window(windows: &mut [SynStash; 3], kind: u32) -> &mut SynStash {
    let [syn, ack, other] = windows;
    match kind {
        segment_kind::SYN => syn,
        segment_kind::ACK => ack,
        _ => other,
    }
}

/// A window on listener `sk` (inode `ino`) processing `skb`: this CPU's MIB counters now.
/// A SYN counts as received. `last`: the last window of this kind on this CPU, whose
/// counters' address is this one's if its netns's counters are (nearly every window: a
/// host's listeners are in few namespaces); working it out launders the per-CPU pointer
/// and looks up this CPU's area, 30-40 guest instructions a window (measured).
#[inline(always)]
fn open_window<K: Kmem>(sk: K, skb: u64, ino: u64, kind: u32, last: &SynStash) -> Result<SynStash> {
    let net = sk.deref(offset(|o| &o.sk_net))?;
    let field = offset(|o| &o.net_mib_stats);
    let mib_ptr = net.pointer_value(field)?;
    let mib_at = if mib_ptr == last.mib_ptr && last.mib_at != 0 {
        last.mib_at
    } else {
        net.number(field)?.wrapping_add(cpu_area_offset()?)
    };
    let mut stash = SynStash {
        sk: sk.addr(),
        skb,
        net: net.addr(),
        ino,
        child: 0,
        kind,
        observed: 0,
        mib_at,
        mib_ptr,
        mib: [0; mib::COUNT],
    };
    read_mib(KPtr(stash.mib_at), kind, &mut stash.mib)?;
    // The SYN is counted when its window is settled, with its outcome: one map update.
    Ok(stash)
}

/// Copies the segment's addresses, ports and sequence number into this CPU's ingress copy
/// ([`impact::Copied`]: a window may be settled after its skb is gone) and returns its TCP
/// flags. The packet starts at the network header in cgroup_skb; its version, not the
/// socket's family, says which: a dual-stack `[::]` listener receives IPv4 segments. Read
/// in place (direct packet access) rather than a helper call per byte: `tcp_v4_rcv` /
/// `tcp_v6_rcv` pulled the whole TCP header into the linear data before the socket filter
/// runs. Costs about 80 guest instructions per segment that reaches a listener
/// (BENCHMARKS.md), and nothing on any other traffic.
#[inline(always)]
fn copy_segment(ctx: &SkBuffContext, skb_addr: u64) -> Result<u8> {
    let skb: *mut __sk_buff = ctx.skb.skb;
    // SAFETY: the program's context; the verifier rewrites these loads into the linear
    // data's start and end.
    let (data, end) = unsafe { ((*skb).data as usize, (*skb).data_end as usize) };
    // Looked up first: the packet bytes read below then stay in registers instead of
    // being spilled across the helper call.
    let copy = impact::ingress_copy()?;
    let ip: [u8; 20] = packet_bytes(data, end, 0)?;
    let version = ip[0] >> 4;
    let (client, server, tcp) = match version {
        4 => {
            let [.., s0, s1, s2, s3, d0, d1, d2, d3] = ip;
            let word = |a, b, c, d| u64::from_ne_bytes([a, b, c, d, 0, 0, 0, 0]);
            (
                [word(s0, s1, s2, s3), 0],
                [word(d0, d1, d2, d3), 0],
                usize::from(ip[0] & 0x0f) * 4,
            )
        }
        6 if ip[6] == IPPROTO_TCP => {
            let words: [u64; 4] = packet_words(data, end, 8)?;
            ([words[0], words[1]], [words[2], words[3]], 40)
        }
        _ => return Err(errno::EINVAL), // IPv6 extension headers: not worth parsing for a listener
    };
    // Ports, sequence number, acknowledgment, data offset and flags.
    let th: [u8; 16] = packet_bytes(data, end, tcp)?;
    copy.set(
        skb_addr,
        client,
        server,
        [th[0], th[1], th[2], th[3]],
        version,
        u32::from_be_bytes([th[4], th[5], th[6], th[7]]),
    );
    Ok(th[13])
}

/// `N` native-order words of packet bytes at `data + offset` (byte loads: the packet's
/// alignment is not known), if they lie before `end`.
#[inline(always)]
fn packet_words<const N: usize>(data: usize, end: usize, offset: usize) -> Result<[u64; N]> {
    let at = data + offset;
    if at + N * 8 > end {
        return Err(errno::EINVAL);
    }
    // SAFETY: the N * 8 bytes at `at` are inside the packet's linear data, checked just
    // above (and by the verifier); read_unaligned makes no assumption on their alignment.
    Ok(unsafe { core::ptr::read_unaligned(at as *const [u64; N]) })
}

/// `N` packet bytes at `data + offset`, if they lie before `end`.
#[inline(always)]
fn packet_bytes<const N: usize>(data: usize, end: usize, offset: usize) -> Result<[u8; N]> {
    let at = data + offset;
    if at + N > end {
        return Err(errno::EINVAL);
    }
    // SAFETY: the N bytes at `at` are inside the packet's linear data, checked just above
    // (and by the verifier).
    Ok(unsafe { core::ptr::read_unaligned(at as *const [u8; N]) })
}

/// The netns counters backlogd attributes, from this CPU's copy at `here` (a window's
/// `mib_at`).
#[inline(always)]
fn read_mib(here: KPtr, kind: u32, out: &mut [u64; mib::COUNT]) -> Result<()> {
    // Two adjacent pairs of enum linux_mib_field (ListenOverflows, ListenDrops) and
    // (TCPReqQFullDoCookies, TCPReqQFullDrop): two reads instead of four. (The loader
    // checks the adjacency in the kernel's BTF and refuses a kernel without it.)
    let listen: [u64; 2] = here.read(offset_at(|o| &o.mib_index, mib::LISTEN_OVERFLOWS))?;
    out[mib::LISTEN_OVERFLOWS] = listen[0];
    out[mib::LISTEN_DROPS] = listen[1];
    // The TCPReqQFull pair moves only in `tcp_syn_flood_action`, which runs from
    // `tcp_conn_request` alone: a final-ACK window (a pure ACK, which a listener never
    // hands to `tcp_conn_request`) leaves both at zero, at entry and exit alike.
    let reqq: [u64; 2] = if kind != segment_kind::ACK {
        here.read(offset_at(|o| &o.mib_index, mib::REQQ_FULL_DO_COOKIES))?
    } else {
        // Volatile: plain zeros here become a call to a byte-by-byte `memset` subprogram
        // (about 200 instructions per final ACK, seen in the profile).
        // SAFETY: a local, initialised array.
        unsafe { core::ptr::read_volatile(&[0u64; 2]) }
    };
    out[mib::REQQ_FULL_DO_COOKIES] = reqq[0];
    out[mib::REQQ_FULL_DROP] = reqq[1];
    Ok(())
}

#[btf_tracepoint(function = "consume_skb")]
pub fn syn_consumed(ctx: BtfTracePointContext) -> i32 {
    let _ = released(ctx.arg::<u64>(0));
    0
}

#[btf_tracepoint(function = "kfree_skb")]
pub fn syn_freed(ctx: BtfTracePointContext) -> i32 {
    let _ = released(ctx.arg::<u64>(0));
    0
}

/// An skb was released: if it is the stashed one, take the stash and settle it.
#[inline(always)]
fn released(skb: u64) -> Result<()> {
    let slot = STASH.get_ptr_mut(0).ok_or(errno::ENOENT)?;
    // SAFETY: this CPU's element of STASH.
    let stash = unsafe { &mut *slot };
    if skb == 0 || stash.skb != skb {
        return Ok(());
    }
    // Take a copy before clearing: an ingress interrupting us after the clear sees an
    // empty slot and leaves this segment to us.
    let taken = *stash;
    stash.skb = 0;
    // Its ingress copy, not the skb's headers: an skb whose release the kernel skipped
    // for recursion is settled at the next ingress, but until then its address may be
    // reused by another skb, released here in its place.
    settle(&taken, KPtr(taken.sk), Some(impact::Copied(taken.skb)))
}

/// Attributes the counter deltas since `stash` to its listener (`sk`: its address, typed
/// where the caller has it, so its queues are read by direct load). `seg`: where the
/// segment's attempt can be read (its alive skb, or tracepoint mode's ingress copy), if
/// anywhere.
#[inline(always)]
fn settle<L: Kmem, S: impact::Segment>(stash: &SynStash, sk: L, seg: Option<S>) -> Result<()> {
    let mut now = [0u64; mib::COUNT];
    read_mib(KPtr(stash.mib_at), stash.kind, &mut now)?;
    let d = |i: usize| now[i].wrapping_sub(stash.mib[i]);
    let (overflows, drops, qfull, cookies) = (
        d(mib::LISTEN_OVERFLOWS),
        d(mib::LISTEN_DROPS),
        d(mib::REQQ_FULL_DROP),
        d(mib::REQQ_FULL_DO_COOKIES),
    );
    let kind = stash.kind;
    // Only a SYN window's cookie counters can move (see read_mib).
    let cookies = if kind == segment_kind::SYN {
        cookies
    } else {
        0
    };
    // Queue lengths after the segment was processed: a SYN added a request (SYN-queue
    // peak), a final ACK moved a child to the accept queue (accept-queue peak). A dropped
    // segment changed neither queue (whatever filled them was observed when it was
    // processed), so a flood of drops skips this.
    // (Tracepoint mode: unless a child queued in the window had them observed already,
    // after its queueing, which is the last change to the queues the segment makes.)
    if drops | overflows | qfull == 0 && stash.observed == 0 {
        // A SYN that met no drop and no cookie (nearly every SYN) is counted with the
        // observation: its only counter, in the map entry the observation looks up anyway.
        let quiet_syn = kind == segment_kind::SYN && cookies == 0;
        let hot = listener::Hot {
            syns: u64::from(quiet_syn),
            queued: 0,
        };
        let counted = listener::observe_counting(sk, stash.ino, None, hot);
        if quiet_syn && counted {
            return Ok(());
        }
    }
    // The segment's source, for a drop or a cookie: counted per prefix unless the segment
    // is gone (a function-hook window settled at the next call), could not be classified,
    // or its prefix found no room; then counted untracked below, so nothing goes missing.
    let untracked = drops | cookies != 0
        && match seg {
            Some(seg) if kind == segment_kind::SYN || kind == segment_kind::ACK => {
                let outcome = impact::Outcome::new(kind, drops, cookies);
                impact::dropped(KPtr(stash.sk), stash.ino, stash.net, seg, outcome) != 0
            }
            _ => true,
        };
    if kind != segment_kind::SYN && overflows | drops | qfull | cookies == 0 {
        return Ok(());
    }
    listener::update(KPtr(stash.sk), stash.ino, |s| {
        if untracked {
            if kind == segment_kind::SYN {
                s.untracked_source[source::SYN_DROP] += drops;
                s.untracked_source[source::COOKIE] += cookies;
            } else {
                s.untracked_source[source::ACK_DROP] += drops;
            }
        }
        if kind == segment_kind::SYN {
            s.syns += 1;
        }
        // Every listen drop goes through tcp_listendrop (ListenDrops); the specific
        // counters say why. What they do not explain is "other".
        let explained = overflows + qfull;
        match kind {
            segment_kind::SYN => {
                s.drops[DropReason::AcceptQueueFull] += overflows;
                s.drops[DropReason::SynQueueFull] += qfull;
                s.syncookies += cookies;
                s.drops[DropReason::Other] += drops.saturating_sub(explained);
            }
            segment_kind::ACK => {
                s.drops[DropReason::FinalAckOverflow] += overflows;
                s.drops[DropReason::Other] += drops.saturating_sub(explained);
            }
            // A segment we could not classify: its drops are counted, the reason is not.
            _ => s.drops[DropReason::Other] += drops,
        }
    });
    Ok(())
}

/// `TP_PROTO(const struct sock *sk, const struct request_sock *req)`.
#[raw_tracepoint(tracepoint = "tcp_retransmit_synack")]
pub fn synack_retransmit(ctx: RawTracePointContext) -> u32 {
    let _ = try_synack_retransmit(KPtr(ctx.arg(0)));
    0
}

fn try_synack_retransmit(sk: KPtr) -> Result<()> {
    if sk.is_null() {
        return Err(errno::EFAULT);
    }
    let ino = socket_inode(sk)?;
    listener::update(sk, ino, |s| s.synack_retransmits += 1);
    Ok(())
}
