//! Who is being dropped: each listener's dropped segments and syncookie-answered SYNs,
//! counted per source prefix.
//!
//! [`count`] runs only for a segment a listener dropped or answered with a cookie
//! ([`impact::dropped`](crate::impact::dropped) calls it with the source address it has
//! already read from the headers, and whether the drop was its attempt's first), and
//! [`connected`] only for an attempt with a dropped segment that connected
//! (`impact::completed`), so a handshake that met neither pays nothing here.
//!
//! The source is folded to a prefix (`SOURCE_PREFIXES`: /24 and /48 by default; an
//! IPv4-mapped IPv6 source counts as IPv4) and counted in `DROP_SOURCES`, one entry per
//! listener and prefix. The map is a preallocated hash whose counters are exact for
//! every prefix it holds. A prefix that finds it full is not counted there but in the
//! listener's `untracked_source`, so a listener's prefixes plus its untracked counts
//! always equal its drops and cookies: nothing is lost silently, and the daemon says
//! how much it could not place. (An LRU would evict prefixes silently, and a sketch such
//! as count-min would overcount every prefix a little; exact counts up to a stated
//! capacity are what an operator can check against nft counters.)

// Keys and values go to the map helpers by reference, as in impact.rs.
#![allow(clippy::needless_borrows_for_generic_args)]

use aya_ebpf::{
    bindings::BPF_NOEXIST,
    macros::map,
    maps::{HashMap, PerCpuArray},
};
use backlogd_common::{DROP_SOURCES_ENTRIES, SourceCounts, SourceKey, SourcePrefixes, source};

use crate::kernel::errno;

#[map]
static DROP_SOURCES: HashMap<SourceKey, SourceCounts> =
    HashMap::with_max_entries(DROP_SOURCES_ENTRIES, 0);

/// Filled in by the daemon at load time; all zeros in the object file.
#[unsafe(no_mangle)]
static SOURCE_PREFIXES: SourcePrefixes = SourcePrefixes {
    v4: 0,
    v6: 0,
    _pad: [0; 6],
};

#[inline(always)]
fn prefixes() -> SourcePrefixes {
    // SAFETY: a valid static; volatile so LLVM cannot fold the object file's zeros.
    unsafe { core::ptr::read_volatile(&SOURCE_PREFIXES) }
}

/// This CPU's key and first counts, built in a map value rather than on the stack: the
/// caller (`impact::dropped`) is a BPF-to-BPF call below `syn::settle`, and 5.10's verifier
/// refuses the two frames over 512 bytes together (576 with these on the stack).
#[repr(C)]
struct Scratch {
    key: SourceKey,
    fresh: SourceCounts,
}

#[map]
static SOURCE_SCRATCH: PerCpuArray<Scratch> = PerCpuArray::with_max_entries(1, 0);

/// Counts one segment's `drops` (of a SYN window when `syn`, else a final-ACK one) and
/// `cookies` for the source `client` (IP version `version`, as read from the packet: an
/// `AttemptKey`'s address words) of listener `ino`, at `now`; `attempt`: the drop was its
/// attempt's first. False: not counted (no room for a new prefix), and the caller counts
/// them untracked.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn count(
    ino: u64,
    version: u8,
    client: [u64; 2],
    syn: bool,
    drops: u64,
    cookies: u64,
    attempt: bool,
    now: u64,
) -> bool {
    let Some(scratch) = SOURCE_SCRATCH.get_ptr_mut(0) else {
        return false;
    };
    // SAFETY: this CPU's element; a segment is settled start to finish on one CPU, and
    // settling does not nest (softirq context).
    let Scratch { key, fresh } = unsafe { &mut *scratch };
    prefix_key(key, ino, version, client);
    let (syn_drops, ack_drops, cookies) = if syn {
        (drops, 0, cookies)
    } else {
        (0, drops, 0)
    };
    // Whole words, as the key: `fresh.counts = [0; 3]` and the stores after it were a
    // `memset` call.
    let words = [syn_drops, ack_drops, cookies, now, u64::from(attempt), 0];
    // SAFETY: `fresh` is a SourceCounts, six u64 words in this order (checked below).
    unsafe { core::ptr::write((fresh as *mut SourceCounts).cast::<[u64; 6]>(), words) };
    // Look up first: a prefix aggregates many clients, so most segments find their entry
    // (the inverse of impact.rs's attempts, nearly all new), and a failed insert costs a
    // whole hash insert before the lookup anyway.
    if let Some(entry) = DROP_SOURCES.get_ptr_mut(&*key) {
        add_all(entry, fresh);
        return true;
    }
    match DROP_SOURCES.insert(&*key, &*fresh, u64::from(BPF_NOEXIST)) {
        Ok(()) => true,
        // Another CPU created it between the lookup and the insert.
        Err(e) if e == errno::EEXIST => match DROP_SOURCES.get_ptr_mut(&*key) {
            Some(entry) => {
                add_all(entry, fresh);
                true
            }
            // The daemon removed the entry (its listener closed) just now.
            None => false,
        },
        // E2BIG: the map is full.
        Err(_) => false,
    }
}

/// An attempt from `client` (IP version `version`) that listener `ino` dropped a segment
/// of connected (`impact::completed`): counted on its prefix if the prefix is held. Runs
/// only for such attempts: a handshake that met no drop never gets here.
#[inline(always)]
pub(crate) fn connected(ino: u64, version: u8, client: [u64; 2]) {
    let Some(scratch) = SOURCE_SCRATCH.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: as in `count`: this CPU's element, a completion does not nest.
    let Scratch { key, .. } = unsafe { &mut *scratch };
    prefix_key(key, ino, version, client);
    if let Some(entry) = DROP_SOURCES.get_ptr_mut(&*key) {
        // SAFETY: a value of the map, which other CPUs add to at the same time.
        add_to(unsafe { &mut (*entry).connected }, 1);
    }
}

/// `key` for listener `ino`'s prefix of `client`, at the configured length, written as
/// four whole words: byte arrays filled field by field, and their zeros, compile to calls
/// to a byte-by-byte `memset` subprogram (with the attempt key's, ~560 instructions per
/// dropped SYN in the profile at e115708).
#[inline(always)]
fn prefix_key(key: &mut SourceKey, ino: u64, version: u8, client: [u64; 2]) {
    let settings = prefixes();
    let [w0, w1] = client;
    let tail = w1.to_ne_bytes();
    let (version, prefix) = if version == 6
        && w0 == 0
        && tail[0] == 0
        && tail[1] == 0
        && tail[2] == 0xff
        && tail[3] == 0xff
    {
        // ::ffff:a.b.c.d is an IPv4 client of a dual-stack socket.
        let [.., a, b, c, d] = tail;
        (4, [u64::from_ne_bytes([a, b, c, d, 0, 0, 0, 0]), 0])
    } else {
        (version, client)
    };
    let bits = if version == 4 {
        settings.v4
    } else {
        settings.v6
    };
    let words = [
        ino,
        fold(prefix[0], bits),
        fold(prefix[1], bits.saturating_sub(64)),
        u64::from_ne_bytes([version, bits, 0, 0, 0, 0, 0, 0]),
    ];
    // SAFETY: `key` is a SourceKey, these four words in its layout (checked below).
    unsafe { core::ptr::write((key as *mut SourceKey).cast::<[u64; 4]>(), words) };
}

// `prefix_key` and `count` write the key and the counts as whole words.
const _: () = assert!(
    size_of::<SourceKey>() == 32
        && core::mem::offset_of!(SourceKey, prefix) == 8
        && core::mem::offset_of!(SourceKey, version) == 24
        && core::mem::offset_of!(SourceKey, prefix_len) == 25
        && size_of::<SourceCounts>() == 48
        && core::mem::offset_of!(SourceCounts, counts) == 0
        && source::SYN_DROP == 0
        && source::ACK_DROP == 1
        && source::COOKIE == 2
        && core::mem::offset_of!(SourceCounts, last_ns) == 24
        && core::mem::offset_of!(SourceCounts, attempts) == 32
        && core::mem::offset_of!(SourceCounts, connected) == 40
);

/// Adds `fresh`'s counts to `entry` and stamps its time.
#[inline(always)]
fn add_all(entry: *mut SourceCounts, fresh: &SourceCounts) {
    // SAFETY: a value of the map, which other CPUs add to at the same time: hence the
    // atomic adds.
    unsafe {
        let counts = &mut (*entry).counts;
        add_to(
            &mut counts[source::SYN_DROP],
            fresh.counts[source::SYN_DROP],
        );
        add_to(
            &mut counts[source::ACK_DROP],
            fresh.counts[source::ACK_DROP],
        );
        add_to(&mut counts[source::COOKIE], fresh.counts[source::COOKIE]);
        add_to(&mut (*entry).attempts, fresh.attempts);
        // The newest of racing CPUs' times is not worth a compare-and-swap: the daemon
        // reads it to the second.
        (*entry).last_ns = fresh.last_ns;
    }
}

/// Adds `n` to `at` atomically. The BPF target has no 64-bit atomic read-modify-write in
/// `core`, so the instruction is written out: `lock xadd` without a fetch, which every
/// kernel's verifier accepts on a map value.
#[inline(always)]
fn add_to(at: &mut u64, n: u64) {
    if n != 0 {
        // SAFETY: `at` is a valid, aligned u64 (a field of a map value) for the asm's one
        // store, which touches nothing else.
        unsafe {
            core::arch::asm!(
                "lock *(u64 *)({at} + 0) += {n}",
                at = in(reg) at as *mut u64,
                n = in(reg) n,
                options(nostack),
            );
        }
    }
}

/// `word` (8 address bytes as memory holds them) with every bit past its first `bits`
/// cleared; 64 or more keeps all.
#[inline(always)]
fn fold(word: u64, bits: u8) -> u64 {
    // In big-endian order the address's first bit is the number's highest.
    let mask = u64::MAX
        .checked_shl(64u32.saturating_sub(u32::from(bits)))
        .unwrap_or(0);
    (u64::from_be(word) & mask).to_be()
}
