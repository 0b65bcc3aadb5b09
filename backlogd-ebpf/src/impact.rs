//! Client impact: which connection attempts a listener dropped a segment of, and what
//! became of them.
//!
//! A dropped SYN costs its client a retransmission 1 s later (then 3, 7, 15 ... s after
//! the first), a dropped final ACK a SYN-ACK retransmission; a client that runs out of
//! retries or patience never connects. The kernel keeps nothing per attempt once it has
//! dropped a segment, so this module does:
//!
//! - [`dropped`]: a window whose counter deltas show a listen drop (`syn::settle`, every
//!   mode) has its source counted (`sources.rs`, as are syncookie-answered SYNs) and
//!   records the segment's attempt in `ATTEMPTS` (netns + client/server addresses
//!   and ports -> initial sequence number, time of the first drop, listener). Nothing runs
//!   here for a segment that was not dropped.
//! - [`completed`]: a connection queued for accept at a final ACK or a syncookie's ACK
//!   (`syn::child_queued`; not Fast Open's queueing at the SYN) whose attempt is in `ATTEMPTS` with the same ISN was delayed: the entry
//!   is removed and the listener's `delayed` and delay histogram counted, and the
//!   attempt's source prefix its `connected` (`sources.rs`). Until a drop is
//!   recorded and for one horizon after the last one, `LAST_DROP` keeps this to one array
//!   load per connection ([`gate_open`]): no call, no hash lookup.
//! - the daemon removes entries older than the horizon and counts them abandoned
//!   (`backlogd/src/impact.rs`). Both sides count only when their own delete succeeded,
//!   so an attempt completing at its horizon is counted once, one way or the other.
//!
//! The map is a preallocated hash, not an LRU: an LRU would evict attempts silently (and
//! before it is full: its free lists are per CPU), turning them into neither delayed nor
//! abandoned. A segment whose attempt finds no room is counted in `ATTEMPTS_UNTRACKED`.

// Keys and values go to the map helpers by reference: passed by value (as clippy would
// have it) each would be copied to the stack once more, and a program has 512 bytes.
#![allow(clippy::needless_borrows_for_generic_args)]

use aya_ebpf::{
    bindings::BPF_NOEXIST,
    helpers::bpf_probe_read_kernel_buf,
    macros::map,
    maps::{Array, HashMap, PerCpuArray},
};
use backlogd_common::{
    ATTEMPTS_ENTRIES, Attempt, AttemptKey, DELAY_BOUNDS_MS, DELAY_BUCKETS, ImpactSettings, cause,
    segment_kind,
};

use crate::{
    kernel::{KPtr, Kmem, Result, errno, offset},
    listener, sources,
};

#[map]
static ATTEMPTS: HashMap<AttemptKey, Attempt> = HashMap::with_max_entries(ATTEMPTS_ENTRIES, 0);

#[map]
static ATTEMPTS_UNTRACKED: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

/// `bpf_ktime_get_ns()` of the newest recorded drop, on any listener; 0: none yet. A
/// per-listener gate would itself be a hash lookup, the cost it is there to save.
#[map]
static LAST_DROP: Array<u64> = Array::with_max_entries(1, 0);

/// Filled in by the daemon at load time; all zeros in the object file.
#[unsafe(no_mangle)]
static CLIENT_IMPACT: ImpactSettings = ImpactSettings { horizon_ns: 0 };

/// How far a final ACK's (or data's) sequence number may lie beyond an attempt's ISN + 1
/// and still belong to it: more than any receive window a request offers, and 1/4096 of
/// the sequence space, the odds that a new attempt's random ISN falls inside by chance.
const ACK_WINDOW: u32 = 1 << 20;

/// `LAST_DROP` is rewritten only when it is older than half this, and the gate stays open
/// this much longer than the horizon.
const GATE_SLACK_NS: u64 = 1_000_000_000;

#[inline(always)]
fn horizon_ns() -> u64 {
    // SAFETY: a valid static; volatile so LLVM cannot fold the object file's zero.
    unsafe { core::ptr::read_volatile(&CLIENT_IMPACT.horizon_ns) }
}

/// Where a settled segment's attempt (addresses and ports) and sequence number come from.
pub(crate) trait Segment: Copy {
    /// Writes every byte of `*key` (uninitialised memory is fine) for the segment of a
    /// listener in netns `net`; returns the segment's sequence number.
    fn identify(self, net: u64, key: *mut AttemptKey) -> Result<u32>;
}

/// A segment still alive (function-hook modes: the hooked call has not returned): read
/// from its headers.
#[derive(Clone, Copy)]
pub(crate) struct Alive<K>(pub(crate) K);

impl<K: Kmem> Segment for Alive<K> {
    #[inline(always)]
    fn identify(self, net: u64, key: *mut AttemptKey) -> Result<u32> {
        segment(net, self.0, key)
    }
}

/// What tracepoint mode's ingress copied of a segment: [`AttemptKey`] without its netns,
/// and the sequence number.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct IngressCopy {
    key: AttemptKey,
    /// The window's skb address: whose copy this is.
    skb: u64,
    seq: u32,
    _pad: u32,
}

// `write_key` writes the key as six words: net, client, server, then ports, version and
// padding.
const _: () = assert!(
    size_of::<AttemptKey>() == 48
        && core::mem::offset_of!(AttemptKey, client) == 8
        && core::mem::offset_of!(AttemptKey, server) == 24
        && core::mem::offset_of!(AttemptKey, client_port) == 40
        && core::mem::offset_of!(AttemptKey, version) == 44
);

/// Writes all of `*key` as six whole words: netns, client, server (addresses as the packet
/// holds them, `[u64; 2]` in native order: IPv4 in the first 4 bytes, the rest zero), then
/// the TCP header's ports, the IP version and padding. Field by field, the byte arrays
/// compile to single-byte stores and calls to a byte-by-byte `memset` subprogram for the
/// zeros: about 200 instructions on every segment that reaches a listener in tracepoint
/// mode, and (with the source key's) ~560 per dropped SYN in the profile at e115708.
#[inline(always)]
fn write_key(
    key: *mut AttemptKey,
    net: u64,
    client: [u64; 2],
    server: [u64; 2],
    ports: [u8; 4],
    version: u8,
) {
    let [a, b, c, d] = ports;
    let words = [
        net,
        client[0],
        client[1],
        server[0],
        server[1],
        u64::from_ne_bytes([a, b, c, d, version, 0, 0, 0]),
    ];
    // SAFETY: `key` points to 48 writable bytes, 8-aligned (an AttemptKey: its first field
    // is a u64); the six words above are its layout (checked at compile time).
    unsafe { core::ptr::write(key.cast::<[u64; 6]>(), words) };
}

impl IngressCopy {
    /// Replaces the copy: addresses as the packet holds them (`[u64; 2]` in native order:
    /// IPv4 in the first 4 bytes, the rest zero), the TCP header's ports, the IP version
    /// and the sequence number.
    #[inline(always)]
    pub(crate) fn set(
        &mut self,
        skb: u64,
        client: [u64; 2],
        server: [u64; 2],
        ports: [u8; 4],
        version: u8,
        seq: u32,
    ) {
        // net: the window's, filled in by `Copied::identify`.
        write_key(&raw mut self.key, 0, client, server, ports, version);
        self.seq = seq;
        self.skb = skb;
    }
}

/// Tracepoint mode: this CPU's open window's segment, copied from the packet at ingress
/// (`syn::listener_ingress`). A window there may be settled after its skb is gone (the
/// next ingress settles a window whose release tracepoint the kernel skipped for
/// recursion), or at the release of another skb that reuses its address, whose headers
/// are not the segment's: the copy is the segment's in every case.
#[map]
static INGRESS_COPY: PerCpuArray<IngressCopy> = PerCpuArray::with_max_entries(1, 0);

/// This CPU's ingress copy, for the ingress to fill.
#[inline(always)]
pub(crate) fn ingress_copy() -> Result<&'static mut IngressCopy> {
    let slot = INGRESS_COPY.get_ptr_mut(0).ok_or(errno::ENOENT)?;
    // SAFETY: this CPU's element, plain integers. Ingress writes it in softirq; a reader
    // interrupted by it checks whose copy it read (`Copied::identify`).
    Ok(unsafe { &mut *slot })
}

/// The segment of this CPU's tracepoint-mode window on skb `.0`, as its ingress copied it.
#[derive(Clone, Copy)]
pub(crate) struct Copied(pub(crate) u64);

impl Segment for Copied {
    #[inline(always)]
    fn identify(self, net: u64, key: *mut AttemptKey) -> Result<u32> {
        let copy = ingress_copy()?;
        // SAFETY: `key` points to a writable AttemptKey (the trait's contract).
        unsafe { core::ptr::write(key, copy.key) };
        let seq = copy.seq;
        // Whose copy, read after the copy itself: a window settled from a release hook in
        // process context (an skb reusing the address of a window whose own release was
        // skipped) can be interrupted by the softirq's ingress, which replaces the copy.
        // Then the segment counts untracked, never under another's attempt.
        if copy.skb != self.0 {
            return Err(errno::ESTALE);
        }
        // SAFETY: as above; the key was written just now.
        unsafe { (*key).net = net };
        Ok(seq)
    }
}

/// The attempt `skb` (a segment from a client, still alive) belongs to, and its sequence
/// number. The IP version comes from the packet, not the listener's family.
#[inline(always)]
fn segment<K: Kmem>(net: u64, skb: K, key: *mut AttemptKey) -> Result<u32> {
    let head = skb.number(offset(|o| &o.skb_head))?;
    let network: u16 = skb.read(offset(|o| &o.skb_network_header))?;
    let transport: u16 = skb.read(offset(|o| &o.skb_transport_header))?;
    let ip = head + u64::from(network);
    let tcp_at = transport.wrapping_sub(network);
    // One read for both headers where the TCP header follows the IP header's fixed part
    // (an IPv4 header without options, an IPv6 header without extension headers): the
    // key's 48 bytes hold an IPv6 header and the first 8 of a TCP header. Read into the
    // key itself, which is rewritten whole below: 48 more bytes of stack would take the
    // programs that call `dropped` past the verifier's 512-byte limit for two frames.
    // Reading past a short IPv4 segment's headers stays inside its skb's buffer (its head
    // holds the TCP header's 20 bytes or more, and skb_shared_info lies past the data).
    // SAFETY: `key` points to 48 writable bytes (the trait's contract); the helper
    // validates the source address and fails instead of faulting.
    let raw = unsafe { &mut *key.cast::<[u8; 48]>() };
    // SAFETY: as above.
    unsafe { bpf_probe_read_kernel_buf(ip as *const u8, raw) }?;
    let at = |i: usize| -> u32 {
        // SAFETY: 4 bytes inside the 48 just read; `i` is a multiple of 4 and the key is
        // 8-aligned.
        unsafe { core::ptr::read(raw.as_ptr().add(i).cast::<u32>()) }
    };
    let version = (at(0) as u8) >> 4;
    let (client, server, fixed) = match version {
        4 => ([u64::from(at(12)), 0], [u64::from(at(16)), 0], 20),
        6 => {
            let word = |i: usize| u64::from(at(i)) | (u64::from(at(i + 4)) << 32);
            ([word(8), word(16)], [word(24), word(32)], 40)
        }
        _ => return Err(errno::EINVAL),
    };
    // Ports, then the sequence number: the first 8 bytes of the TCP header.
    let (ports, seq) = if tcp_at == fixed {
        if fixed == 20 {
            (at(20), at(24))
        } else {
            (at(40), at(44))
        }
    } else {
        let tcp: [u32; 2] = KPtr(head + u64::from(transport)).read(0)?;
        (tcp[0], tcp[1])
    };
    // Every word: `key` may hold the previous segment's (a per-CPU scratch).
    write_key(key, net, client, server, ports.to_ne_bytes(), version);
    Ok(u32::from_be(seq))
}

/// The client address of `key` as the two words [`write_key`] wrote.
#[inline(always)]
fn client_words(key: &AttemptKey) -> [u64; 2] {
    // SAFETY: 16 bytes at offset 8 of an 8-aligned AttemptKey (checked above): aligned
    // words, which a load of bytes would not be.
    unsafe { core::ptr::read((&raw const key.client).cast::<[u64; 2]>()) }
}

/// What a window settled for its segment, packed into one argument of [`dropped`] (a
/// BPF-to-BPF call has five): its kind (bits 0-7), drops (8-35) and syncookies (36-63).
/// A segment's deltas are 0 or 1 in practice; larger ones saturate.
#[derive(Clone, Copy)]
pub(crate) struct Outcome(u64);

impl Outcome {
    const FIELD: u64 = (1 << 28) - 1;

    #[inline(always)]
    pub(crate) fn new(kind: u32, drops: u64, cookies: u64) -> Self {
        Self(u64::from(kind & 0xff) | drops.min(Self::FIELD) << 8 | cookies.min(Self::FIELD) << 36)
    }

    #[inline(always)]
    fn kind(self) -> u32 {
        (self.0 & 0xff) as u32
    }

    #[inline(always)]
    fn drops(self) -> u64 {
        (self.0 >> 8) & Self::FIELD
    }

    #[inline(always)]
    fn cookies(self) -> u64 {
        self.0 >> 36
    }
}

/// This CPU's attempt key, built in a map value rather than on the stack: [`dropped`] is a
/// BPF-to-BPF call below the SYN path's programs, and 5.10's verifier refuses two frames
/// over 512 bytes together.
#[map]
static ATTEMPT_SCRATCH: PerCpuArray<AttemptKey> = PerCpuArray::with_max_entries(1, 0);

/// Listener `sk` (inode `ino`, netns `net`) dropped its segment `seg` (of `outcome`'s
/// kind: SYN or final ACK) or answered it with a syncookie: count the source
/// (`sources.rs`) and, for a drop, record the attempt. 0: the source was counted;
/// otherwise the caller counts the segment's drops and cookies as untracked. A BPF-to-BPF
/// call: its keys and values stay out of the callers' stack frames.
#[inline(never)]
pub(crate) fn dropped<S: Segment>(sk: KPtr, ino: u64, net: u64, seg: S, outcome: Outcome) -> i32 {
    match record(sk, ino, net, seg, outcome) {
        Ok(true) => 0,
        Ok(false) => errno::ENOSPC,
        Err(e) => e,
    }
}

#[inline(always)]
fn record<S: Segment>(sk: KPtr, ino: u64, net: u64, seg: S, outcome: Outcome) -> Result<bool> {
    let scratch = ATTEMPT_SCRATCH.get_ptr_mut(0).ok_or(errno::ENOENT)?;
    let seq = seg.identify(net, scratch)?;
    // SAFETY: this CPU's element, which identify has just written whole; a segment is
    // settled start to finish on one CPU, and settling does not nest (softirq context).
    let key = unsafe { &*scratch };
    let now = listener::now();
    let kind = outcome.kind();
    // The attempt first: its prefix counts it if this drop is its first.
    let attempt = outcome.drops() != 0 && record_drop(sk, ino, key, seq, kind, now);
    Ok(sources::count(
        ino,
        key.version,
        client_words(key),
        kind == segment_kind::SYN,
        outcome.drops(),
        outcome.cookies(),
        attempt,
        now,
    ))
}

/// Records the dropped segment's attempt; true when the drop is the attempt's first (a
/// new entry), false for a later segment of an attempt already recorded or one the map
/// had no room for.
#[inline(always)]
fn record_drop(sk: KPtr, ino: u64, key: &AttemptKey, seq: u32, kind: u32, now: u64) -> bool {
    let (why, isn) = if kind == segment_kind::SYN {
        (cause::SYN_DROP, seq)
    } else {
        // The first segment a client sends after the SYN-ACK (its ACK, or data with it)
        // has sequence number ISN + 1; the first of them dropped creates the entry.
        (cause::FINAL_ACK_OVERFLOW, seq.wrapping_sub(1))
    };
    let fresh = Attempt {
        first_ns: now,
        listener_ino: ino,
        isn,
        cause: why,
        drops: 1,
        _pad: 0,
    };
    // Insert first: nearly every dropped segment is its attempt's first (a retransmission
    // comes a second later), and an insert that finds the key costs less than a lookup
    // before every insert.
    let mut first = true;
    if let Err(e) = ATTEMPTS.insert(key, &fresh, u64::from(BPF_NOEXIST)) {
        let entry = match ATTEMPTS.get_ptr_mut(key) {
            Some(entry) if e == errno::EEXIST => entry,
            // The map is full, or the daemon's sweep removed the entry just now.
            _ => {
                if let Some(lost) = ATTEMPTS_UNTRACKED.get_ptr_mut(0) {
                    // SAFETY: this CPU's counter.
                    unsafe { *lost += 1 };
                }
                return false;
            }
        };
        // SAFETY: a value of the map; only this attempt's segments (processed one at a
        // time, seconds apart) and the daemon's sweep touch it.
        let entry = unsafe { &mut *entry };
        // Later segments of the same attempt: a retransmitted SYN (same ISN), or a
        // segment after the handshake's SYN got through (its ACK, its data: within a
        // receive window of ISN + 1). A final ACK far from the entry's ISN is a new
        // attempt whose SYN was not dropped.
        let same = if kind == segment_kind::SYN {
            entry.cause == cause::SYN_DROP && entry.isn == isn
        } else {
            seq.wrapping_sub(entry.isn.wrapping_add(1)) < ACK_WINDOW
        };
        if same {
            entry.drops = entry.drops.saturating_add(1);
            first = false;
        } else {
            // A new attempt on the 4-tuple (the client bound its port): the one before
            // it never completed. It is counted on this listener, which has the same
            // address and port as the one that dropped it.
            *entry = fresh;
            listener::update(sk, ino, |s| s.abandoned += 1);
        }
    }
    if let Some(last) = LAST_DROP.get_ptr_mut(0) {
        // SAFETY: the single element. Written at most about once per GATE_SLACK_NS / 2,
        // so a drop storm on many CPUs does not bounce its cache line; the gate allows
        // for that staleness. CPUs racing here store times microseconds apart.
        unsafe {
            if now.wrapping_sub(*last) > GATE_SLACK_NS / 2 {
                *last = now;
            }
        }
    }
    first
}

/// Whether a connection queued at `now` can belong to an attempt in `ATTEMPTS`: a drop
/// was recorded within a horizon (and the gate's slack). Until the first drop and for one
/// horizon after the last, this keeps a queued connection to one array load (the caller's
/// clock read is the one it queues with): no call to [`completed`], no hash lookup.
#[inline(always)]
pub(crate) fn gate_open(now: u64) -> bool {
    let last = LAST_DROP.get(0).copied().unwrap_or(0);
    last != 0 && now.wrapping_sub(last) <= horizon_ns() + GATE_SLACK_NS
}

/// Listener `sk` (inode `ino`, netns `net`) queued `child` for accept, on the segment
/// `seg`. If the attempt had a segment dropped, count it delayed. Call it only when
/// [`gate_open`]. A BPF-to-BPF call, as [`dropped`].
#[inline(never)]
pub(crate) fn completed<S: Segment>(sk: KPtr, ino: u64, net: u64, seg: S, child: KPtr) -> i32 {
    match match_completion(sk, ino, net, seg, child) {
        Ok(()) => 0,
        Err(e) => e,
    }
}

#[inline(always)]
fn match_completion<S: Segment>(sk: KPtr, ino: u64, net: u64, seg: S, child: KPtr) -> Result<()> {
    let now = listener::now();
    let horizon = horizon_ns();
    // Not `AttemptKey::default()`: its zeros would be a `memset` call, and identify
    // writes every byte anyway.
    let mut key = core::mem::MaybeUninit::<AttemptKey>::uninit();
    seg.identify(net, key.as_mut_ptr())?;
    // SAFETY: identify wrote every byte of the key.
    let key = unsafe { key.assume_init() };
    // SAFETY: plain integers, copied out at once.
    let Some(entry) = (unsafe { ATTEMPTS.get(&key) }).copied() else {
        return Ok(());
    };
    // A new child's rcv_nxt is its client's ISN + 1 (tcp_create_openreq_child); nothing
    // has advanced it yet where this runs (before the segment's data is queued).
    let rcv_nxt: u32 = child.read(offset(|o| &o.tcp_rcv_nxt))?;
    if entry.isn != rcv_nxt.wrapping_sub(1) {
        return Ok(()); // another attempt on the same 4-tuple: that one ages out
    }
    let waited = now.saturating_sub(entry.first_ns);
    if waited > horizon {
        return Ok(()); // too late: the daemon counts it abandoned at its next sweep
    }
    if ATTEMPTS.remove(&key).is_err() {
        return Ok(()); // the daemon's sweep took it first
    }
    let slot = bucket(waited);
    listener::update(sk, ino, |s| {
        // Constant indices: 5.10's verifier loses the bound of one read from a map value.
        if entry.cause == cause::FINAL_ACK_OVERFLOW {
            s.delayed[cause::FINAL_ACK_OVERFLOW as usize] += 1;
        } else {
            s.delayed[cause::SYN_DROP as usize] += 1;
        }
        s.delay_sum_ns += waited;
        if let Some(b) = s.delay.get_mut(slot) {
            *b += 1;
        }
    });
    // On the prefix of the listener that dropped it (a SO_REUSEPORT member may complete
    // an attempt another member dropped).
    sources::connected(entry.listener_ino, key.version, client_words(&key));
    Ok(())
}

/// Index of the first delay bucket whose bound (`DELAY_BOUNDS_MS`) is at least `ns`.
#[inline(always)]
fn bucket(ns: u64) -> usize {
    let mut i = 0;
    while i < DELAY_BUCKETS {
        if ns <= DELAY_BOUNDS_MS[i] * 1_000_000 {
            return i;
        }
        i += 1;
    }
    DELAY_BUCKETS
}
