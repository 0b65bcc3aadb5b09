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
    /// Dropped and cookie-answered segments per listener and source prefix.
    pub const DROP_SOURCES: &str = "DROP_SOURCES";

    /// Every map the daemon uses, in the order it pins them.
    pub const DAEMON: [&str; 11] = [
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
        DROP_SOURCES,
    ];

    /// The global the daemon fills with the running kernel's struct offsets.
    pub const OFFSETS: &str = "OFFSETS";
    /// The global with the client-impact settings (`ImpactSettings`).
    pub const CLIENT_IMPACT: &str = "CLIENT_IMPACT";
    /// The global that says whether accept waits are timed (a u32, 0 or 1).
    pub const ACCEPT_WAIT: &str = "ACCEPT_WAIT";
    /// The global with the prefix lengths sources are folded to (`SourcePrefixes`).
    pub const SOURCE_PREFIXES: &str = "SOURCE_PREFIXES";
}

/// Programs, by hook family (`backlogd-ebpf/src/<family>.rs`).
pub mod program {
    // listen.rs: listeners closing in kprobe and tracepoint modes (fentry mode:
    // `LISTEN_STOP_ENTER`).
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
    pub const LISTEN_STOP_ENTER: &str = "listen_stop_enter";
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

    /// The programs the kernel may mean by `kernel`, its name for a program: it keeps 15
    /// characters (`BPF_OBJ_NAME_LEN`), and several names share those (the queue-add
    /// hooks of fentry and kprobe modes), so all that match; all of those feed the same
    /// figures.
    pub fn named_by_kernel(kernel: &str) -> impl Iterator<Item = &'static str> + '_ {
        ALL.into_iter()
            .filter(move |full| *full == kernel || (kernel.len() == 15 && full.starts_with(kernel)))
    }

    /// Every program of the object.
    pub const ALL: [&str; 27] = [
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
        LISTEN_STOP_ENTER,
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

/// backlogd's figures as far as the kernel can hide events from them: each names the
/// programs whose runs feed it, in every mode (a program not loaded in the running mode
/// never runs, so never misses). A run the kernel skipped (`recursion_misses` of that
/// program, which Linux counts for trampolines from 5.12, for kprobes from 6.7) is an event
/// the figure may lack; the daemon exports the skipped runs per figure
/// (`backlogd_figure_missed_runs_total`) and the suite allows a shortfall of at most that
/// many, nowhere else.
pub mod figure {
    use super::program as p;

    /// SYNs received (`backlogd_listen_syns_received_total`).
    pub const SYNS_RECEIVED: &str = "syns_received";
    /// Drops by reason (`backlogd_listen_drops_total`).
    pub const DROPS: &str = "drops";
    /// SYNs answered with a syncookie.
    pub const SYNCOOKIES: &str = "syncookies_sent";
    pub const SYNACK_RETRANSMITS: &str = "synack_retransmits";
    /// Connections queued for accept, and the queue observations made with them.
    pub const QUEUED: &str = "connections_queued";
    /// Connections accepted.
    pub const ACCEPTED: &str = "connections_accepted";
    /// Accept-queue waits (enqueue time to accept).
    pub const ACCEPT_WAIT: &str = "accept_wait";
    /// Backlogs requested and granted.
    pub const BACKLOG: &str = "listen_backlog";
    /// Client impact: attempts with a drop, matched to their completion.
    pub const CLIENT_IMPACT: &str = "client_impact";
    /// Updates that found a per-listener map full.
    pub const MAP_FULL: &str = "listener_map_full";

    /// The SYN path's windows (a missed entry loses the segment's outcome; a missed exit
    /// leaves it to be settled at the next segment on that CPU, too late for a scrape
    /// right after the last one).
    const SYN_WINDOWS: &[&str] = &[
        p::CONN_REQUEST_ENTER,
        p::CONN_REQUEST_EXIT,
        p::CONN_REQUEST_KPROBE,
        p::CONN_REQUEST_KRETPROBE,
        p::LISTENER_INGRESS,
        p::SYN_CONSUMED,
        p::SYN_FREED,
    ];
    const FINAL_ACK_WINDOWS: &[&str] = &[
        p::CHECK_REQ_ENTER,
        p::CHECK_REQ_EXIT,
        p::COOKIE_SOCK_ENTER,
        p::COOKIE_SOCK_EXIT,
        p::FINAL_ACK_KPROBE,
        p::FINAL_ACK_KRETPROBE,
        p::LISTENER_INGRESS,
        p::SYN_CONSUMED,
        p::SYN_FREED,
    ];
    const ERROR_WINDOWS: &[&str] = &[
        p::REQ_ERR_ENTER,
        p::REQ_ERR_EXIT,
        p::REQ_ERR_KPROBE,
        p::REQ_ERR_KRETPROBE,
    ];
    /// Retransmitted SYNs for pending requests (never reach tcp_conn_request).
    const PENDING_SYNS: &[&str] = &[p::CHECK_REQ_ENTER, p::CHECK_REQ_KPROBE];
    /// Enqueues outside the final-ACK windows: Fast Open, and tracepoint mode's state
    /// changes.
    const ENQUEUES: &[&str] = &[
        p::REQSK_QUEUE_ADD_EXIT,
        p::REQSK_QUEUE_ADD_KPROBE,
        p::REQSK_QUEUE_ADD_KRETPROBE,
        p::LISTENER_STATE,
    ];
    const ACCEPTS: &[&str] = &[p::INET_CSK_ACCEPT_EXIT, p::SYSCALL_EXIT];
    const LISTENS: &[&str] = &[
        p::LISTEN_SYSCALL_EXIT,
        p::SYSCALL_EXIT,
        p::LISTENER_STATE,
        p::LISTEN_STOP_ENTER,
    ];

    /// Every figure with the program groups that feed it.
    pub const FED_BY: &[(&str, &[&[&str]])] = &[
        (SYNS_RECEIVED, &[SYN_WINDOWS, PENDING_SYNS]),
        (DROPS, &[SYN_WINDOWS, FINAL_ACK_WINDOWS, ERROR_WINDOWS]),
        (SYNCOOKIES, &[SYN_WINDOWS]),
        (SYNACK_RETRANSMITS, &[&[p::SYNACK_RETRANSMIT]]),
        (QUEUED, &[FINAL_ACK_WINDOWS, SYN_WINDOWS, ENQUEUES]),
        (ACCEPTED, &[ACCEPTS]),
        (
            ACCEPT_WAIT,
            &[ACCEPTS, FINAL_ACK_WINDOWS, SYN_WINDOWS, ENQUEUES],
        ),
        (BACKLOG, &[LISTENS]),
        (CLIENT_IMPACT, &[SYN_WINDOWS, FINAL_ACK_WINDOWS, ENQUEUES]),
        (
            MAP_FULL,
            &[
                SYN_WINDOWS,
                FINAL_ACK_WINDOWS,
                ERROR_WINDOWS,
                PENDING_SYNS,
                ENQUEUES,
                ACCEPTS,
                &[p::SYNACK_RETRANSMIT],
            ],
        ),
    ];

    /// Every figure, in the order the exporter serves them.
    pub fn all() -> impl Iterator<Item = &'static str> {
        FED_BY.iter().map(|(f, _)| *f)
    }

    /// Runs skipped per figure (every figure, in [`all`]'s order), from the runs skipped
    /// per program, by the kernel's name for each program.
    pub fn missed_runs<'a>(
        per_program: &'a [(&'a str, u64)],
    ) -> impl Iterator<Item = (&'static str, u64)> + 'a {
        all().map(move |f| {
            let n = per_program
                .iter()
                .filter(|(kernel, _)| super::program::named_by_kernel(kernel).any(|p| feeds(p, f)))
                .map(|(_, n)| n)
                .sum();
            (f, n)
        })
    }

    /// Whether runs of `program` feed `figure` (false for an unknown figure).
    pub fn feeds(program: &str, figure: &str) -> bool {
        FED_BY
            .iter()
            .filter(|(f, _)| *f == figure)
            .flat_map(|(_, groups)| groups.iter())
            .any(|group| group.contains(&program))
    }
}

#[cfg(test)]
mod tests {
    extern crate std;

    use super::{figure, program};

    /// A program that feeds no figure would have its skipped runs allowed nowhere, and a
    /// figure fed by nothing could never be short: both are slips in the table.
    #[test]
    fn every_program_feeds_a_figure_and_every_figure_has_programs() {
        for p in program::ALL {
            assert!(
                figure::FED_BY.iter().any(|(f, _)| figure::feeds(p, f)),
                "program {p} feeds no figure"
            );
        }
        for (i, (f, groups)) in figure::FED_BY.iter().enumerate() {
            assert!(groups.iter().any(|g| !g.is_empty()), "{f} has no programs");
            assert!(
                figure::FED_BY[..i].iter().all(|(g, _)| g != f),
                "{f} is listed twice"
            );
            for g in *groups {
                for p in *g {
                    assert!(program::ALL.contains(p), "{f}: unknown program {p}");
                }
            }
        }
        assert!(figure::feeds(program::SYN_CONSUMED, figure::DROPS));
        let named = |k: &str| program::named_by_kernel(k).collect::<std::vec::Vec<_>>();
        assert_eq!(named("syn_consumed"), ["syn_consumed"]);
        assert_eq!(
            named("reqsk_queue_add"),
            [
                "reqsk_queue_add_exit",
                "reqsk_queue_add_kprobe",
                "reqsk_queue_add_kretprobe"
            ]
        );
        assert_eq!(named("conn_request_kp"), ["conn_request_kprobe"]);
        assert!(named("not_ours").is_empty());
        let per_figure: std::vec::Vec<(&str, u64)> =
            figure::missed_runs(&[("syscall_exit", 5), ("reqsk_queue_add", 2)]).collect();
        let of = |f: &str| per_figure.iter().find(|(g, _)| *g == f).unwrap().1;
        assert_eq!(of(figure::ACCEPTED), 5);
        assert_eq!(of(figure::QUEUED), 2);
        assert_eq!(of(figure::DROPS), 0);
        assert_eq!(per_figure.len(), figure::FED_BY.len());
        assert!(!figure::feeds(program::SYSCALL_EXIT, figure::DROPS));
        assert!(!figure::feeds(program::SYN_CONSUMED, "no such figure"));
    }
}

/// The scan object (`backlogd-ebpf/src/scan.rs`): a second object without the hooks'
/// maps, so that a daemon that adopted pinned programs, or any hook mode, can load it.
pub mod scan {
    /// Its `iter/task_file` iterators, in the order the daemon tries them: with
    /// `bpf_sock_from_file` (Linux 5.11+), then by probe reads (5.10).
    pub const PROGRAMS: [&str; 2] = ["listeners", "listeners_probed"];
    /// The kernel's iterator it walks with (`bpf_iter_<this>`).
    pub const ITERATOR: &str = "task_file";
}
