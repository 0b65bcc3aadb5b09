//! Names of the eBPF object's maps and programs, as the userspace side refers to them.
//!
//! On the eBPF side a name is the identifier of the `#[map]` static or the program
//! function (aya's macros take it from there); the daemon finds them by these strings.
//! The daemon's unit tests check both lists against the built object, so a rename on
//! either side fails the build's tests instead of a load in production.

/// Maps the daemon opens, pins and reads; the programs hold every other map themselves.
pub mod map {
    /// Ring buffer of listener lifecycle events.
    pub const LISTENER_EVENTS: &str = "LISTENER_EVENTS";
    /// Per-CPU count of events the ring buffer had no room for.
    pub const LISTENER_EVENTS_LOST: &str = "LISTENER_EVENTS_LOST";
    /// Per-listener counters.
    pub const LISTENER_STATS: &str = "LISTENER_STATS";
    /// Per-CPU counts of updates that found a per-listener map full (`map_full` slots).
    pub const LISTENER_STATS_FULL: &str = "LISTENER_STATS_FULL";
    /// Per-listener queue depths and maxima.
    pub const LISTENER_QUEUES: &str = "LISTENER_QUEUES";
    /// Sampling epoch of the queue maxima.
    pub const QUEUE_EPOCH: &str = "QUEUE_EPOCH";
    /// The LISTEN event of every live listener, by socket inode.
    pub const LISTENS_SEEN: &str = "LISTENS_SEEN";
    /// Connection attempts with a dropped segment, not yet completed or abandoned.
    pub const ATTEMPTS: &str = "ATTEMPTS";
    /// Per-CPU count of dropped segments whose attempt ATTEMPTS had no room for.
    pub const ATTEMPTS_UNTRACKED: &str = "ATTEMPTS_UNTRACKED";
    /// Attempts the daemon counted abandoned, by listener inode.
    pub const ABANDONED: &str = "ABANDONED";

    /// Every map the daemon uses, in the order it pins them.
    pub const DAEMON: [&str; 10] = [
        LISTENER_EVENTS,
        LISTENER_EVENTS_LOST,
        LISTENER_STATS,
        LISTENER_STATS_FULL,
        LISTENER_QUEUES,
        QUEUE_EPOCH,
        LISTENS_SEEN,
        ATTEMPTS,
        ATTEMPTS_UNTRACKED,
        ABANDONED,
    ];

    /// The global the daemon fills with the running kernel's struct offsets.
    pub const OFFSETS: &str = "OFFSETS";
    /// The global with the client-impact settings (`ImpactSettings`).
    pub const CLIENT_IMPACT: &str = "CLIENT_IMPACT";
}

/// Programs, by hook family (`backlogd-ebpf/src/<family>.rs`).
pub mod program {
    // listen.rs: every mode.
    pub const LISTENER_STATE: &str = "listener_state";
    // syn.rs: SYN-ACK retransmits (every mode) and tracepoint mode's SYN path.
    pub const SYNACK_RETRANSMIT: &str = "synack_retransmit";
    pub const LISTENER_INGRESS: &str = "listener_ingress";
    pub const SYN_CONSUMED: &str = "syn_consumed";
    pub const SYN_FREED: &str = "syn_freed";
    // syscall.rs: accept() and listen() in kprobe and tracepoint modes.
    pub const SYSCALL_EXIT: &str = "syscall_exit";
    // fentry.rs.
    pub const CONN_REQUEST_ENTER: &str = "conn_request_enter";
    pub const CONN_REQUEST_EXIT: &str = "conn_request_exit";
    pub const CHECK_REQ_ENTER: &str = "check_req_enter";
    pub const CHECK_REQ_EXIT: &str = "check_req_exit";
    pub const COOKIE_SOCK_ENTER: &str = "cookie_sock_enter";
    pub const COOKIE_SOCK_EXIT: &str = "cookie_sock_exit";
    pub const REQ_ERR_ENTER: &str = "req_err_enter";
    pub const REQ_ERR_EXIT: &str = "req_err_exit";
    pub const REQSK_QUEUE_ADD_EXIT: &str = "reqsk_queue_add_exit";
    pub const INET_CSK_ACCEPT_EXIT: &str = "inet_csk_accept_exit";
    pub const LISTEN_SYSCALL_EXIT: &str = "listen_syscall_exit";
    // kprobe.rs.
    pub const CONN_REQUEST_KPROBE: &str = "conn_request_kprobe";
    pub const CONN_REQUEST_KRETPROBE: &str = "conn_request_kretprobe";
    pub const CHECK_REQ_KPROBE: &str = "check_req_kprobe";
    pub const FINAL_ACK_KPROBE: &str = "final_ack_kprobe";
    pub const FINAL_ACK_KRETPROBE: &str = "final_ack_kretprobe";
    pub const REQ_ERR_KPROBE: &str = "req_err_kprobe";
    pub const REQ_ERR_KRETPROBE: &str = "req_err_kretprobe";
    pub const REQSK_QUEUE_ADD_KPROBE: &str = "reqsk_queue_add_kprobe";
    pub const REQSK_QUEUE_ADD_KRETPROBE: &str = "reqsk_queue_add_kretprobe";

    /// Every program of the object.
    pub const ALL: [&str; 26] = [
        LISTENER_STATE,
        SYNACK_RETRANSMIT,
        LISTENER_INGRESS,
        SYN_CONSUMED,
        SYN_FREED,
        SYSCALL_EXIT,
        CONN_REQUEST_ENTER,
        CONN_REQUEST_EXIT,
        CHECK_REQ_ENTER,
        CHECK_REQ_EXIT,
        COOKIE_SOCK_ENTER,
        COOKIE_SOCK_EXIT,
        REQ_ERR_ENTER,
        REQ_ERR_EXIT,
        REQSK_QUEUE_ADD_EXIT,
        INET_CSK_ACCEPT_EXIT,
        LISTEN_SYSCALL_EXIT,
        CONN_REQUEST_KPROBE,
        CONN_REQUEST_KRETPROBE,
        CHECK_REQ_KPROBE,
        FINAL_ACK_KPROBE,
        FINAL_ACK_KRETPROBE,
        REQ_ERR_KPROBE,
        REQ_ERR_KRETPROBE,
        REQSK_QUEUE_ADD_KPROBE,
        REQSK_QUEUE_ADD_KRETPROBE,
    ];
}
