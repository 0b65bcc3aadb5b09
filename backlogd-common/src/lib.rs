//! Types shared by the eBPF programs (`backlogd-ebpf`) and the daemon (`backlogd`).
//!
//! Everything here crosses the kernel/user boundary byte for byte: `#[repr(C)]`, explicit
//! padding, integers only (no `bool`, `Option` or enums with data).
#![no_std]

pub mod names;
pub mod netstat;

/// `TCP_LISTEN` from `include/net/tcp_states.h`; part of the tracepoint ABI.
pub const TCP_LISTEN: u32 = 10;
pub const IPPROTO_TCP: u16 = 6;
/// Multipath TCP: a listener's file holds an MPTCP socket whose TCP listener (the one the
/// SYN path sees) is its first subflow, a kernel socket of its own.
pub const IPPROTO_MPTCP: u16 = 262;
pub const AF_INET: u16 = 2;
pub const AF_INET6: u16 = 10;

/// Ring buffer for listener lifecycle events. Lifecycle events are rare (one per
/// `listen()`/close), so 256 KiB holds thousands of them between two reads.
pub const LISTENER_EVENTS_BYTES: u32 = 256 * 1024;

/// Default capacity of the per-listener maps (the daemon's `max_listeners` sets it at
/// load time); an update that finds a map full is counted in `LISTENER_STATS_FULL` and
/// logged by the daemon.
pub const LISTENER_STATS_ENTRIES: u32 = 16384;

/// Why a listener dropped a connection: listen drops split the way the kernel's own
/// counters split them, so that the sums over a namespace's listeners equal its TcpExt
/// deltas. The one list of drop reasons: it indexes [`ListenerStats::drops`] (and every
/// per-reason array of the daemon), and its [`name`](Self::name) is the `reason` label
/// of the drop metrics and the key in the JSON API's `drops`.
///
/// It never crosses the kernel boundary itself: the programs index the counters with its
/// constant values, as they would with a field.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DropReason {
    /// SYN dropped because the accept queue was full (TcpExt ListenOverflows at SYN).
    AcceptQueueFull,
    /// SYN dropped because the SYN queue was full and syncookies were off
    /// (TcpExt TCPReqQFullDrop).
    SynQueueFull,
    /// Final ACK of the handshake found the accept queue full (TcpExt ListenOverflows in
    /// syn_recv_sock): the connection is not created.
    FinalAckOverflow,
    /// Any other listen drop (TcpExt ListenDrops not covered above).
    Other,
}

impl DropReason {
    pub const COUNT: usize = 4;
    /// Every reason, in index order.
    pub const ALL: [DropReason; DropReason::COUNT] = [
        DropReason::AcceptQueueFull,
        DropReason::SynQueueFull,
        DropReason::FinalAckOverflow,
        DropReason::Other,
    ];

    pub const fn name(self) -> &'static str {
        match self {
            DropReason::AcceptQueueFull => "accept_queue_full",
            DropReason::SynQueueFull => "syn_queue_full",
            DropReason::FinalAckOverflow => "final_ack_overflow",
            DropReason::Other => "other",
        }
    }
}

/// Per-reason figures, indexed by reason: `stats.drops[DropReason::Other]`.
impl<T> core::ops::Index<DropReason> for [T; DropReason::COUNT] {
    type Output = T;

    #[inline(always)]
    fn index(&self, reason: DropReason) -> &T {
        &self[reason as usize]
    }
}

impl<T> core::ops::IndexMut<DropReason> for [T; DropReason::COUNT] {
    #[inline(always)]
    fn index_mut(&mut self, reason: DropReason) -> &mut T {
        &mut self[reason as usize]
    }
}

/// Per-listener SYN-path counters, keyed by socket inode; one copy per CPU (the daemon
/// sums them).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ListenerStats {
    /// SYNs that reached the listener (pure SYN, no ACK): those not counted in
    /// [`QueueState::syns`]; the daemon adds the two.
    pub syns: u64,
    /// Listen drops by [`DropReason`]. The four counters the struct had as fields until
    /// the reasons became one enum, at the same offsets (see the layout check below).
    pub drops: [u64; DropReason::COUNT],
    /// SYN answered with a syncookie (TcpExt TCPReqQFullDoCookies).
    pub syncookies: u64,
    /// SYN-ACKs retransmitted for this listener's pending connections.
    pub synack_retransmits: u64,
    /// Connections put on the accept queue (handshake complete): those not counted in
    /// [`QueueState::queued`]; the daemon adds the two.
    pub queued: u64,
    /// Connections taken off the accept queue by accept()/accept4().
    pub accepted: u64,
    /// Sum of accept-queue waits of accepted connections, nanoseconds.
    pub accept_wait_sum_ns: u64,
    /// Accept-queue waits: `accept_wait[i]` counts waits below `2^i` microseconds
    /// (i < ACCEPT_WAIT_BUCKETS); the last slot counts longer ones.
    pub accept_wait: [u64; ACCEPT_WAIT_BUCKETS + 1],
    /// Connections queued for accept after at least one listen drop of their attempt
    /// (same client 4-tuple and initial sequence number), by the cause of the attempt's
    /// first drop ([`cause`]).
    pub delayed: [u64; cause::COUNT],
    /// Sum of those connections' delays (first dropped segment seen -> queued), ns.
    pub delay_sum_ns: u64,
    /// Their delays: `delay[i]` counts delays up to `DELAY_BOUNDS_MS[i]` ms; the last slot
    /// counts longer ones.
    pub delay: [u64; DELAY_BUCKETS + 1],
    /// Attempts with a drop that a new attempt on the same 4-tuple replaced before they
    /// completed (the daemon counts the others, at the horizon).
    pub abandoned: u64,
    /// Listen drops, and SYNs answered with a syncookie, not counted under a source prefix
    /// in DROP_SOURCES: the map had no room for a new prefix, or the segment was gone
    /// before its source could be read. Each listener's prefixes plus these equal its drops
    /// and syncookies exactly.
    pub untracked_source: [u64; source::COUNT],
}

// The layout the programs, the daemon and maps pinned by an older daemon share: `drops`
// replaced four u64 fields in the same place (offsets 8 to 40), so nothing moved.
const _: () = {
    let mut i = 0;
    while i < DropReason::COUNT {
        assert!(
            DropReason::ALL[i] as usize == i,
            "DropReason::ALL is in index order"
        );
        i += 1;
    }
    assert!(core::mem::offset_of!(ListenerStats, drops) == 8);
    assert!(core::mem::offset_of!(ListenerStats, syncookies) == 40);
    assert!(core::mem::size_of::<ListenerStats>() == 424);
};

impl ListenerStats {
    /// Adds another CPU's counters.
    pub fn add(&mut self, o: &Self) {
        self.syns += o.syns;
        for (a, b) in self.drops.iter_mut().zip(o.drops.iter()) {
            *a += b;
        }
        self.syncookies += o.syncookies;
        self.synack_retransmits += o.synack_retransmits;
        self.queued += o.queued;
        self.accepted += o.accepted;
        self.accept_wait_sum_ns += o.accept_wait_sum_ns;
        for (a, b) in self.accept_wait.iter_mut().zip(o.accept_wait.iter()) {
            *a += b;
        }
        for (a, b) in self.delayed.iter_mut().zip(o.delayed.iter()) {
            *a += b;
        }
        self.delay_sum_ns += o.delay_sum_ns;
        for (a, b) in self.delay.iter_mut().zip(o.delay.iter()) {
            *a += b;
        }
        self.abandoned += o.abandoned;
        for (a, b) in self
            .untracked_source
            .iter_mut()
            .zip(o.untracked_source.iter())
        {
            *a += b;
        }
    }
}

/// What a source prefix is counted for: index of [`SourceCounts::counts`] and
/// [`ListenerStats::untracked_source`].
pub mod source {
    /// A SYN the listener dropped (any reason).
    pub const SYN_DROP: usize = 0;
    /// A final ACK (or other segment after the SYN) the listener dropped.
    pub const ACK_DROP: usize = 1;
    /// A SYN answered with a syncookie.
    pub const COOKIE: usize = 2;
    pub const COUNT: usize = 3;
}

/// Capacity of the DROP_SOURCES map by default (`drop_source_entries` sets it at load
/// time).
pub const DROP_SOURCES_ENTRIES: u32 = 16384;

/// A listener's dropped or cookie-answered segments from one source prefix: the key of the
/// DROP_SOURCES map.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SourceKey {
    /// Socket inode of the listener.
    pub listener_ino: u64,
    /// The source address with every bit past `prefix_len` cleared, network byte order;
    /// IPv4 (and IPv4-mapped IPv6) in the first four bytes.
    pub prefix: [u8; 16],
    /// 4 or 6; [`SourceKey::EXPIRED`] in the one entry per listener that holds the counts
    /// of its expired prefixes (written by the daemon only).
    pub version: u8,
    /// Bits of `prefix` kept.
    pub prefix_len: u8,
    pub _pad: [u8; 6],
}

impl SourceKey {
    /// `version` of a listener's expired-prefixes entry: the daemon removes a prefix its
    /// retention after its newest segment and adds its counts to this entry, so the
    /// listener's entries still add up to its drops and syncookies.
    pub const EXPIRED: u8 = 0;

    /// The expired-prefixes entry of listener `listener_ino`.
    pub fn expired(listener_ino: u64) -> Self {
        Self {
            listener_ino,
            version: Self::EXPIRED,
            ..Self::default()
        }
    }
}

/// Counts of one [`SourceKey`], updated with atomic adds (a shared map, not per CPU: a
/// prefix per CPU would multiply the kernel memory by the CPU count).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SourceCounts {
    /// By [`source`] index.
    pub counts: [u64; source::COUNT],
    /// `bpf_ktime_get_ns()` (CLOCK_MONOTONIC) of the newest segment counted.
    pub last_ns: u64,
    /// Connection attempts from the prefix that had a segment dropped, each once (at its
    /// first drop), among those client impact tracks (`ATTEMPTS`).
    pub attempts: u64,
    /// Of those, attempts that connected within `client_impact_horizon` of their first
    /// drop, while the prefix was held (a completion after the prefix expired is not
    /// counted here).
    pub connected: u64,
}

/// The prefix lengths sources are folded to, injected as the read-only global
/// `SOURCE_PREFIXES` at load time.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SourcePrefixes {
    /// 0 to 32.
    pub v4: u8,
    /// 0 to 128.
    pub v6: u8,
    pub _pad: [u8; 6],
}

/// Why a connection attempt was delayed: the kind of the first segment of it a listener
/// dropped. Index of [`ListenerStats::delayed`].
pub mod cause {
    /// A SYN was dropped; the client retransmits it after 1 s, then 2, 4, ... s more.
    pub const SYN_DROP: u32 = 0;
    /// The final ACK of the handshake was dropped (accept queue full); the server
    /// retransmits its SYN-ACK, the client its ACK or first data.
    pub const FINAL_ACK_OVERFLOW: u32 = 1;
    pub const COUNT: usize = 2;
}

/// Finite buckets of the connection-delay histogram.
pub const DELAY_BUCKETS: usize = 10;

/// Upper bounds of the connection-delay buckets, ms: halfway between the times clients
/// retry. Linux clients retransmit a dropped SYN 1, 3, 7, 15, 31 and 63 s after the first
/// (doubling), or since 6.5 (`tcp_syn_linear_timeouts`, 4 by default) 1, 2, 3, 4, 5, then
/// 7, 11, 19, 35 and 67 s; a server retransmits a SYN-ACK 1, 3, 7, 15 and 31 s after the
/// first. Each of those lands at least 0.5 s from a bound (4 and 5 s share a bucket), so
/// the bucket says which retry let the connection through. Powers of two of µs, as the
/// accept-wait buckets use, would put the 2 s and 4 s retries within 0.1-0.2 s of a bound.
pub const DELAY_BOUNDS_MS: [u64; DELAY_BUCKETS] = [
    500, 1500, 2500, 3500, 5500, 9000, 17000, 33000, 65000, 135000,
];

/// Capacity of the ATTEMPTS map by default (the daemon's `client_impact_attempts` sets
/// it at load time).
pub const ATTEMPTS_ENTRIES: u32 = 16384;

/// One connection attempt a listener dropped a segment of, by client and server address:
/// the key of the ATTEMPTS map. Built from the segment's IP header (a dual-stack listener
/// receives IPv4 segments, so the socket's family does not say which).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct AttemptKey {
    /// `struct net *` of the listener: the same addresses in two namespaces are two
    /// attempts.
    pub net: u64,
    /// Client (source) address, network byte order; IPv4 in the first four bytes.
    pub client: [u8; 16],
    /// Server (destination) address, likewise.
    pub server: [u8; 16],
    /// Ports, network byte order as in the TCP header.
    pub client_port: [u8; 2],
    pub server_port: [u8; 2],
    /// IP version of the segment: 4 or 6.
    pub version: u8,
    pub _pad: [u8; 3],
}

/// What is known of an attempt with a dropped segment, until it completes (the programs
/// remove it and count it delayed) or its horizon passes (the daemon removes it and
/// counts it abandoned).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Attempt {
    /// `bpf_ktime_get_ns()` (CLOCK_MONOTONIC) of the first dropped segment.
    pub first_ns: u64,
    /// Socket inode of the listener that first dropped it.
    pub listener_ino: u64,
    /// The client's initial sequence number: a SYN's sequence number, or a final ACK's
    /// minus one.
    pub isn: u32,
    /// [`cause`] of the first drop.
    pub cause: u32,
    /// Segments of the attempt dropped so far.
    pub drops: u32,
    pub _pad: u32,
}

/// Settings of the client-impact accounting, injected as the read-only global
/// `CLIENT_IMPACT` at load time.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ImpactSettings {
    /// How long after its first drop an attempt may still complete, ns: a later completion
    /// is not matched (the daemon counts the attempt abandoned at the horizon).
    pub horizon_ns: u64,
}

/// Finite buckets of the accept-wait histogram: 1 µs, 2 µs, ... 2^23 µs (8.4 s).
pub const ACCEPT_WAIT_BUCKETS: usize = 24;

/// Queue depths of one listener as one CPU last observed them (at a SYN, when a
/// connection is queued, when one is accepted), and the SYNs and queued connections
/// counted with those observations. Per CPU, so concurrent observers never
/// lose each other's maxima; the daemon merges the CPUs (see `backlogd/src/queues.rs`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueueState {
    /// `sk_ack_backlog`: connections waiting for accept().
    pub accept_depth: u32,
    /// Highest `sk_ack_backlog` this CPU saw during sampling epoch `epoch`.
    pub accept_hwm: u32,
    /// Highest SYN-queue length (`icsk_accept_queue.qlen`) during `epoch`.
    pub syn_hwm: u32,
    /// The [`QUEUE_EPOCH`](index.html) value the maxima belong to; 0: never observed.
    pub epoch: u32,
    /// `bpf_ktime_get_ns()` of this CPU's last observation: the newest is the current depth.
    pub observed_ns: u64,
    /// SYNs counted here rather than in `ListenerStats::syns`: those with no drop, no
    /// syncookie and an observation of their own (nearly all). The daemon adds the two.
    /// Counted with the observation, so such a SYN costs one map lookup instead of two.
    pub syns: u64,
    /// Connections queued for accept counted here rather than in
    /// `ListenerStats::queued`, likewise (every one whose observation found or created its entry).
    pub queued: u64,
}

/// What the cgroup_skb ingress program saw of a segment reaching a listener, held per
/// CPU until the same skb is freed in the same softirq.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SynStash {
    /// `struct sock *` of the listener.
    pub sk: u64,
    /// `struct sk_buff *` of the segment; 0 when the slot is empty.
    pub skb: u64,
    /// `struct net *` of the listener.
    pub net: u64,
    /// Listener socket inode.
    pub ino: u64,
    /// Tracepoint mode, final-ACK window: `struct sock *` of the child the listener cloned
    /// for this segment, queued for accept when its handshake completes; 0 if none yet.
    pub child: u64,
    /// [`segment_kind`].
    pub kind: u32,
    /// Tracepoint mode: non-zero once a child queued in this window had the queues
    /// observed, so the window's settle need not observe them again.
    pub observed: u32,
    /// Address of this CPU's copy of the netns's `linux_mib` counters: the window closes on
    /// the CPU it opened on, so the exit reads the counters without finding them again.
    pub mib_at: u64,
    /// The netns's per-CPU pointer to those counters (`net->mib.net_statistics`), which
    /// with the CPU decides `mib_at`: the next window of this kind on this CPU whose netns
    /// has the same pointer takes `mib_at` from here instead of working it out again.
    pub mib_ptr: u64,
    /// This CPU's values of the netns MIB counters in [`mib`] order, before processing.
    pub mib: [u64; 4],
}

/// Slots of the LISTENER_STATS_FULL per-CPU array: what a full per-listener map lost.
pub mod map_full {
    /// Counter updates (LISTENER_STATS had no room for the listener).
    pub const STATS: u32 = 0;
    /// Queue observations (LISTENER_QUEUES had no room for the listener).
    pub const QUEUES: u32 = 1;
    pub const COUNT: u32 = 2;
}

/// Segment kinds in a [`SynStash`].
pub mod segment_kind {
    pub const SYN: u32 = 1;
    /// An ACK handled at the listener: the final ACK of a handshake (or a syncookie ACK).
    pub const ACK: u32 = 2;
    /// Anything else that can make the kernel drop for a listener: in tracepoint mode a
    /// segment that is neither (RST, IPv6 with extension headers); in fentry and kprobe
    /// modes an ICMP error for a pending request (`tcp_req_err`).
    pub const OTHER: u32 = 3;
}

/// Order of the netns MIB counters in [`SynStash::mib`] and [`KernelOffsets::mib_index`].
pub mod mib {
    pub const LISTEN_OVERFLOWS: usize = 0;
    pub const LISTEN_DROPS: usize = 1;
    pub const REQQ_FULL_DROP: usize = 2;
    pub const REQQ_FULL_DO_COOKIES: usize = 3;
    pub const COUNT: usize = 4;
}

/// The fexit programs that read the return value of the function they trace, as indices
/// of [`KernelOffsets::ret_slot`].
pub mod fexit_ret {
    /// `tcp_check_req`
    pub const CHECK_REQ: usize = 0;
    /// `tcp_get_cookie_sock`
    pub const COOKIE_SOCK: usize = 1;
    /// `inet_csk_reqsk_queue_add`
    pub const REQSK_QUEUE_ADD: usize = 2;
    /// `inet_csk_accept`
    pub const INET_CSK_ACCEPT: usize = 3;
    /// The listen(2) syscall's entry point (`__x64_sys_listen`)
    pub const LISTEN: usize = 4;
    pub const COUNT: usize = 5;
    /// The last context slot the programs can read the return value from: a BPF
    /// trampoline passes at most 12 argument slots (`MAX_BPF_FUNC_ARGS`; 6 before 6.6).
    pub const MAX_SLOT: u32 = 12;
}

/// Kind of a [`ListenerEvent`].
pub mod event_kind {
    /// A successful `listen(2)` on a TCP socket: first listen or a repeated one that
    /// changed the backlog.
    pub const LISTEN: u32 = 1;
    /// A listener left the LISTEN state (close, shutdown). Carries `sk` and `ino`.
    pub const CLOSE: u32 = 2;
}

/// A listener appeared, changed its backlog, or went away.
///
/// `ino` (the socket inode) is the identity of a listener while it lives, the same key
/// sock_diag reports; a CLOSE event carries only `kind`, `sk` and `ino`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ListenerEvent {
    pub kind: u32,
    /// `AF_INET` or `AF_INET6`.
    pub family: u16,
    /// Local port, host byte order.
    pub port: u16,
    pub sk: u64,
    /// Inode number of the socket (what `ss -e` prints as `ino:`).
    pub ino: u64,
    /// Inode number of the socket's network namespace (`/proc/PID/ns/net`).
    pub netns: u32,
    /// Process id (thread group id) that called `listen()`.
    pub tgid: u32,
    /// Thread id that called `listen()`.
    pub pid: u32,
    /// Backlog argument passed to `listen()`, as the application passed it.
    pub requested: i32,
    /// `sk_max_ack_backlog` after `listen()` returned: what the kernel granted.
    pub granted: u32,
    pub _pad: u32,
    /// Local address, network byte order; IPv4 in the first four bytes.
    pub addr: [u8; 16],
    /// `comm` of the thread that called `listen()`, NUL padded.
    pub comm: [u8; 16],
}

/// Field offsets the eBPF programs need, resolved by the daemon at load time from the
/// running kernel's BTF, and injected as the read-only global `OFFSETS`. Never compiled in: layouts differ between
/// kernels.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelOffsets {
    // task_struct -> files -> fdt -> fd[] -> file -> private_data (struct socket) -> sk
    pub task_files: u32,
    pub files_fdt: u32,
    pub fdtable_fd: u32,
    pub file_private_data: u32,
    pub socket_sk: u32,
    /// `struct sock` -> its `struct socket`.
    pub sk_socket: u32,
    /// `offsetof(struct socket_alloc, vfs_inode) + offsetof(struct inode, i_ino)`: the
    /// socket inode sits right after `struct socket` in one allocation.
    pub socket_ino: u32,
    // struct sock (incl. its embedded sock_common)
    pub sk_family: u32,
    pub sk_state: u32,
    pub sk_num: u32,
    pub sk_rcv_saddr: u32,
    pub sk_v6_rcv_saddr: u32,
    pub sk_net: u32,
    pub sk_protocol: u32,
    pub sk_max_ack_backlog: u32,
    /// `offsetof(struct net, ns) + offsetof(struct ns_common, inum)`
    pub net_inum: u32,
    pub sk_ack_backlog: u32,
    /// `struct sock` -> `struct net`'s per-CPU `struct linux_mib *`:
    /// `offsetof(struct net, mib) + offsetof(struct netns_mib, net_statistics)`.
    pub net_mib_stats: u32,
    /// Byte offsets in `struct linux_mib` of the counters in [`mib`] order
    /// (enum linux_mib_field values from BTF, times 8).
    pub mib_index: [u32; 4],
    /// `offsetof(struct bpf_array, pptrs)`: with it a per-CPU array map reveals this
    /// CPU's per-CPU area offset (kallsyms has no `__per_cpu_offset` on every kernel).
    pub bpf_array_pptrs: u32,
    /// `offsetof(struct inet_connection_sock, icsk_accept_queue)` +
    /// `offsetof(struct request_sock_queue, qlen)`: the SYN queue length.
    pub icsk_syn_qlen: u32,
    /// `offsetof(struct request_sock, rsk_listener)`: the listener a request belongs to.
    pub request_sock_listener: u32,
    /// `offsetof(struct sk_buff, head)` and `transport_header`: the TCP header of a
    /// segment is at `head + transport_header`.
    pub skb_head: u32,
    pub skb_transport_header: u32,
    /// `struct pt_regs` at the `sys_exit` tracepoint (tp_btf) and in the listen(2) syscall
    /// wrapper (fentry): the syscall number (low 32 bits
    /// of x86-64 `orig_ax`, arm64 `syscallno`) and the first argument (x86-64 `di`,
    /// arm64 `orig_x0`: `x0` already holds the return value).
    pub regs_syscall_nr: u32,
    pub regs_arg0: u32,
    /// The second argument in the `struct pt_regs` a syscall wrapper receives (x86-64 `si`,
    /// arm64 `regs[1]`): listen(2)'s backlog.
    pub regs_arg1: u32,
    /// This architecture's numbers of accept(2), accept4(2) and listen(2).
    pub nr_accept: u32,
    pub nr_accept4: u32,
    pub nr_listen: u32,
    /// Where a syscall shows it is a 32-bit (compat) one, whose number is from another
    /// table: the u32 at `compat_flags` of the current task (`compat_in_regs` 0: x86-64's
    /// `thread_info.status`, bit `TS_COMPAT`) or of the saved user registers (1: arm64's
    /// `pstate`, bit `PSR_MODE32_BIT`), tested against `compat_mask`.
    pub compat_flags: u32,
    pub compat_in_regs: u32,
    pub compat_mask: u32,
    /// `offsetof(struct sk_buff, network_header)`: the IP header is at `head +
    /// network_header`.
    pub skb_network_header: u32,
    /// `offsetof(struct tcp_sock, rcv_nxt)`: a new child's is its client's ISN + 1.
    pub tcp_rcv_nxt: u32,
    /// `offsetof(struct tcp_sock, rcvq_space.time)` (a u64 of µs): stamped when a child's
    /// handshake completes, read at accept() for how long it waited.
    pub tcp_rcvq_time: u32,
    /// `struct socket`'s `file`, `struct file`'s `f_inode`, `struct inode`'s `i_ino`: the
    /// socket inode by direct loads (fentry mode), where `socket_ino` lies outside the
    /// `struct socket` the verifier knows.
    pub socket_file: u32,
    pub file_inode: u32,
    pub inode_ino: u32,
    /// `TCP_SKB_CB(skb)->tcp_flags`: `struct sk_buff`'s `cb` plus `struct tcp_skb_cb`'s
    /// `tcp_flags`, which `tcp_v{4,6}_rcv` fill in before `tcp_check_req`.
    pub skb_tcp_flags: u32,
    /// `struct inode`'s `i_mode` (a u16): the scan tells a socket's file by `S_IFSOCK`.
    pub inode_mode: u32,
    /// `struct task_struct`'s `tgid`: the process holding a listener the scan found.
    pub task_tgid: u32,
    /// `struct net`'s listen sysctls (`core.sysctl_somaxconn`, `ipv4.sysctl_max_syn_backlog`:
    /// ints; `ipv4.sysctl_tcp_syncookies`, `ipv4.sysctl_tcp_abort_on_overflow`: ints on
    /// older kernels, u8 on newer ones, read as their first byte, which holds the value
    /// (0-2) on little-endian machines).
    pub net_somaxconn: u32,
    pub net_max_syn_backlog: u32,
    pub net_syncookies: u32,
    pub net_abort_on_overflow: u32,
    /// An MPTCP listener's TCP listener: `struct mptcp_sock`'s `first` (a `struct sock *`),
    /// or before it, `subflow` (a `struct socket *`); 0 where the kernel has neither (no
    /// MPTCP). Go 1.24+ listens with MPTCP by default.
    pub mptcp_first: u32,
    pub mptcp_subflow: u32,
    /// fexit programs: the u64 slot of the context that holds the traced function's
    /// return value, by [`fexit_ret`] index. A trampoline passes the function's arguments
    /// first and its return value next, and the number of arguments differs between
    /// kernels; 0 where this kernel has no such function (no argument count is 0).
    pub ret_slot: [u32; fexit_ret::COUNT],
}

/// One TCP listener as the scan iterator (`backlogd-ebpf/src/scan.rs`) found it, read
/// from the kernel's socket at the moment of the pass: one record per file descriptor
/// that holds it (a listener shared by several processes comes once per holder).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ScannedListener {
    /// Socket inode, the key every other map uses.
    pub ino: u64,
    /// `net->ns.inum` of the listener's network namespace.
    pub netns: u32,
    /// Process (thread group) holding the descriptor.
    pub tgid: u32,
    /// `sk_ack_backlog`: connections waiting for accept().
    pub accept_queue: u32,
    /// `sk_max_ack_backlog`: the backlog the kernel granted.
    pub accept_capacity: u32,
    /// `icsk_accept_queue.qlen`: requests waiting for their handshake's final ACK.
    pub syn_queue: u32,
    /// `AF_INET` or `AF_INET6`.
    pub family: u16,
    /// Local port, host byte order.
    pub port: u16,
    /// Local address: 4 bytes and zeros for IPv4, 16 for IPv6.
    pub addr: [u8; 16],
    /// The listen sysctls of the listener's network namespace, from its `struct net`
    /// (what `/proc/sys/net` shows a task inside it): `net.core.somaxconn`,
    /// `net.ipv4.tcp_max_syn_backlog`, `net.ipv4.tcp_syncookies` and
    /// `net.ipv4.tcp_abort_on_overflow`. Read here, a rescan needs to join no namespace.
    pub somaxconn: u32,
    pub max_syn_backlog: u32,
    pub syncookies: u8,
    pub abort_on_overflow: u8,
    pub _pad: [u8; 6],
}

#[cfg(feature = "user")]
mod user {
    // SAFETY: as below.
    unsafe impl aya::Pod for super::ScannedListener {}
    // SAFETY: plain-old-data: repr(C), integer fields only, explicit padding.
    unsafe impl aya::Pod for super::ListenerEvent {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::KernelOffsets {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::ListenerStats {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::SynStash {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::QueueState {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::AttemptKey {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::Attempt {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::ImpactSettings {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::SourceKey {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::SourceCounts {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::SourcePrefixes {}
}
