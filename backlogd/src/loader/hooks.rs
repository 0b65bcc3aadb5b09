//! Policy: which program goes on which hook in each mode, as data. The loader attaches
//! [`for_mode`]'s list in order (`attach.rs` knows how); why each hook was chosen is in
//! the eBPF crate's module docs and docs/hook-modes.md.
//!
//! SYN-ACK retransmits use a tracepoint every kernel has, in every mode:
//! `tcp_retransmit_synack` as a raw tracepoint. listen(2), listeners closing, the SYN path
//! and the accept queue depend on the mode:
//! - fentry: fentry/fexit on tcp_conn_request, tcp_check_req, tcp_get_cookie_sock,
//!   tcp_req_err, inet_csk_reqsk_queue_add and inet_csk_accept, an fexit on the listen(2)
//!   syscall itself, and an fentry on inet_csk_listen_stop for a listener closing: no
//!   syscall tracepoint, so other syscalls keep the kernel's fast path, and no program on
//!   `inet_sock_set_state`, which fires six times per handshake;
//! - kprobe: kprobes/kretprobes on the same functions, listen(2) and accept() at the
//!   `sys_exit` tracepoint (tp_btf), listeners closing at `inet_sock_set_state` (raw
//!   tracepoint: a kprobe on inet_csk_listen_stop would be subject to `bpf_prog_active`);
//! - tracepoint: a cgroup_skb ingress program on the cgroup v2 root plus skb-release
//!   tp_btf hooks (backlogd-ebpf/src/syn.rs), listen(2) and accept() at the `sys_exit`
//!   tracepoint (tp_btf); the enqueue and listeners closing come from `inet_sock_set_state`
//!   (raw tracepoint), the enqueue inside the listener's window.
//!
//! No classic tracepoint: a classic-tracepoint or kprobe program is skipped whenever the
//! kernel's per-CPU guard `bpf_prog_active` is held on its CPU, by another such program or
//! by any task inside a bpf() map syscall (backlogd's own reads too) that was preempted
//! there (see backlogd-ebpf/src/syscall.rs). Raw tracepoint, tp_btf, fentry and cgroup
//! programs are not subject to it. kprobes remain only where kprobe mode has nothing
//! else, and their skips are counted (Linux 6.7+) and exported.

use backlogd_common::{fexit_ret, names::program as p};

use super::modes::HookMode;

/// One program on one hook.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hook {
    RawTracepoint {
        program: &'static str,
        tracepoint: &'static str,
    },
    /// A BTF-typed tracepoint (`tp_btf/function`).
    BtfTracepoint {
        program: &'static str,
        function: &'static str,
    },
    Fentry {
        program: &'static str,
        function: &'static str,
    },
    Fexit {
        program: &'static str,
        function: &'static str,
    },
    /// A kprobe or kretprobe program (the object says which) on each function.
    Kprobe {
        program: &'static str,
        functions: &'static [&'static str],
    },
    /// A cgroup_skb ingress program on the cgroup v2 root, through a BPF link.
    CgroupIngress { program: &'static str },
}

impl Hook {
    pub fn program(&self) -> &'static str {
        match *self {
            Hook::RawTracepoint { program, .. }
            | Hook::BtfTracepoint { program, .. }
            | Hook::Fentry { program, .. }
            | Hook::Fexit { program, .. }
            | Hook::Kprobe { program, .. }
            | Hook::CgroupIngress { program } => program,
        }
    }
}

/// Every mode: SYN-ACK retransmits.
const COMMON: &[Hook] = &[Hook::RawTracepoint {
    program: p::SYNACK_RETRANSMIT,
    tracepoint: "tcp_retransmit_synack",
}];

/// kprobe and tracepoint modes: TCP state changes (listeners closing; in tracepoint mode
/// also the enqueue, `syn::child_cloned` / `syn::handshake_completed`).
const STATE_CHANGES: &[Hook] = &[Hook::RawTracepoint {
    program: p::LISTENER_STATE,
    tracepoint: "inet_sock_set_state",
}];

/// listen(2), accept() and accept4() returning, in kprobe and tracepoint modes: the
/// `sys_exit` tracepoint as tp_btf, at the price of a run per syscall
/// (backlogd-ebpf/src/syscall.rs).
const SYSCALLS: &[Hook] = &[Hook::BtfTracepoint {
    program: p::SYSCALL_EXIT,
    function: "sys_exit",
}];

/// The listen(2) syscall's entry point on this architecture (`SYSCALL_DEFINE2(listen)`'s
/// wrapper, called through the syscall table).
#[cfg(target_arch = "x86_64")]
const LISTEN_SYSCALL: &str = "__x64_sys_listen";
#[cfg(target_arch = "aarch64")]
const LISTEN_SYSCALL: &str = "__arm64_sys_listen";

/// The functions whose return value fentry mode's fexit programs read, by
/// [`fexit_ret`] index: the loader looks up where each one's return value sits on this
/// kernel (after its arguments, whose number changes between kernels) in its BTF.
pub const FEXIT_RETURNS: [&str; fexit_ret::COUNT] = {
    let mut f = [""; fexit_ret::COUNT];
    f[fexit_ret::CHECK_REQ] = "tcp_check_req";
    f[fexit_ret::COOKIE_SOCK] = "tcp_get_cookie_sock";
    f[fexit_ret::REQSK_QUEUE_ADD] = "inet_csk_reqsk_queue_add";
    f[fexit_ret::INET_CSK_ACCEPT] = "inet_csk_accept";
    f[fexit_ret::LISTEN] = LISTEN_SYSCALL;
    f
};

const FENTRY: &[Hook] = &[
    Hook::Fexit {
        program: p::LISTEN_SYSCALL_EXIT,
        function: LISTEN_SYSCALL,
    },
    Hook::Fentry {
        program: p::CONN_REQUEST_ENTER,
        function: "tcp_conn_request",
    },
    Hook::Fexit {
        program: p::CONN_REQUEST_EXIT,
        function: "tcp_conn_request",
    },
    Hook::Fentry {
        program: p::CHECK_REQ_ENTER,
        function: "tcp_check_req",
    },
    Hook::Fexit {
        program: p::CHECK_REQ_EXIT,
        function: "tcp_check_req",
    },
    Hook::Fentry {
        program: p::COOKIE_SOCK_ENTER,
        function: "tcp_get_cookie_sock",
    },
    Hook::Fexit {
        program: p::COOKIE_SOCK_EXIT,
        function: "tcp_get_cookie_sock",
    },
    Hook::Fentry {
        program: p::REQ_ERR_ENTER,
        function: "tcp_req_err",
    },
    Hook::Fexit {
        program: p::REQ_ERR_EXIT,
        function: "tcp_req_err",
    },
    Hook::Fexit {
        program: p::REQSK_QUEUE_ADD_EXIT,
        function: "inet_csk_reqsk_queue_add",
    },
    Hook::Fexit {
        program: p::INET_CSK_ACCEPT_EXIT,
        function: "inet_csk_accept",
    },
    Hook::Fentry {
        program: p::LISTEN_STOP_ENTER,
        function: "inet_csk_listen_stop",
    },
];

const KPROBE: &[Hook] = &[
    Hook::Kprobe {
        program: p::CONN_REQUEST_KPROBE,
        functions: &["tcp_conn_request"],
    },
    Hook::Kprobe {
        program: p::CONN_REQUEST_KRETPROBE,
        functions: &["tcp_conn_request"],
    },
    Hook::Kprobe {
        program: p::CHECK_REQ_KPROBE,
        functions: &["tcp_check_req"],
    },
    Hook::Kprobe {
        program: p::FINAL_ACK_KPROBE,
        functions: &["tcp_check_req", "tcp_get_cookie_sock"],
    },
    Hook::Kprobe {
        program: p::FINAL_ACK_KRETPROBE,
        functions: &["tcp_check_req", "tcp_get_cookie_sock"],
    },
    Hook::Kprobe {
        program: p::REQ_ERR_KPROBE,
        functions: &["tcp_req_err"],
    },
    Hook::Kprobe {
        program: p::REQ_ERR_KRETPROBE,
        functions: &["tcp_req_err"],
    },
    Hook::Kprobe {
        program: p::REQSK_QUEUE_ADD_KPROBE,
        functions: &["inet_csk_reqsk_queue_add"],
    },
    Hook::Kprobe {
        program: p::REQSK_QUEUE_ADD_KRETPROBE,
        functions: &["inet_csk_reqsk_queue_add"],
    },
];

/// Tracepoint mode's SYN path. The skb-release hooks first: an ingress stash is only
/// useful once they run.
const TRACEPOINT_SYN: &[Hook] = &[
    Hook::BtfTracepoint {
        program: p::SYN_CONSUMED,
        function: "consume_skb",
    },
    Hook::BtfTracepoint {
        program: p::SYN_FREED,
        function: "kfree_skb",
    },
    Hook::CgroupIngress {
        program: p::LISTENER_INGRESS,
    },
];

/// The hooks of `mode`, in attach order; `syscalls`: with [`SYSCALLS`] where the mode has
/// them (`syscall_hook`: the operator may trade accepts, accept waits and listen()'s
/// request for every other syscall's fast path).
pub fn for_mode(mode: HookMode, syscalls: bool) -> Vec<Hook> {
    let mut hooks = COMMON.to_vec();
    let syscalls = if syscalls { SYSCALLS } else { &[] };
    match mode {
        HookMode::Fentry => hooks.extend_from_slice(FENTRY),
        HookMode::Kprobe => {
            hooks.extend_from_slice(STATE_CHANGES);
            hooks.extend_from_slice(syscalls);
            hooks.extend_from_slice(KPROBE);
        }
        HookMode::Tracepoint => {
            hooks.extend_from_slice(STATE_CHANGES);
            hooks.extend_from_slice(syscalls);
            hooks.extend_from_slice(TRACEPOINT_SYN);
        }
    }
    hooks
}

/// Whether `mode`, with `syscall_hook` as configured, sees accept() return: fentry mode
/// always (`inet_csk_accept`), the others only through [`SYSCALLS`].
pub fn sees_accepts(mode: HookMode, syscall_hook: bool) -> bool {
    for_mode(mode, syscall_hook)
        .iter()
        .any(|h| matches!(h.program(), p::SYSCALL_EXIT | p::INET_CSK_ACCEPT_EXIT))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    #[test]
    fn every_program_has_a_hook_in_some_mode_and_none_twice_in_one() {
        let mut used = BTreeSet::new();
        for mode in [HookMode::Fentry, HookMode::Kprobe, HookMode::Tracepoint] {
            let hooks = for_mode(mode, true);
            let programs: BTreeSet<&str> = hooks.iter().map(Hook::program).collect();
            assert_eq!(
                programs.len(),
                hooks.len(),
                "{mode:?}: a program listed twice"
            );
            used.extend(programs);
        }
        let all: BTreeSet<&str> = p::ALL.into_iter().collect();
        assert_eq!(
            used, all,
            "programs of the object without a hook, or hooks without one"
        );
    }

    /// Each program that reads a return value gets the slot of the function it is attached
    /// to, not another's.
    #[test]
    fn the_return_slots_are_looked_up_for_the_functions_those_programs_trace() {
        let traced = |program: &str| {
            for_mode(HookMode::Fentry, true)
                .into_iter()
                .find_map(|h| match h {
                    Hook::Fexit {
                        program: q,
                        function,
                    } if q == program => Some(function),
                    _ => None,
                })
                .unwrap_or_else(|| panic!("no fexit hook for {program}"))
        };
        for (which, program) in [
            (fexit_ret::CHECK_REQ, p::CHECK_REQ_EXIT),
            (fexit_ret::COOKIE_SOCK, p::COOKIE_SOCK_EXIT),
            (fexit_ret::REQSK_QUEUE_ADD, p::REQSK_QUEUE_ADD_EXIT),
            (fexit_ret::INET_CSK_ACCEPT, p::INET_CSK_ACCEPT_EXIT),
            (fexit_ret::LISTEN, p::LISTEN_SYSCALL_EXIT),
        ] {
            assert_eq!(FEXIT_RETURNS[which], traced(program), "{program}");
        }
    }

    #[test]
    fn tracepoint_mode_attaches_its_ingress_last() {
        let hooks = for_mode(HookMode::Tracepoint, true);
        assert_eq!(hooks.last().map(Hook::program), Some(p::LISTENER_INGRESS));
    }

    /// Without the syscall hook, only the per-syscall program goes: every other figure
    /// keeps its hooks, and fentry mode, which has no such program, is unchanged.
    #[test]
    fn without_the_syscall_hook_only_the_per_syscall_program_goes() {
        for mode in [HookMode::Fentry, HookMode::Kprobe, HookMode::Tracepoint] {
            let with = for_mode(mode, true);
            let without = for_mode(mode, false);
            let gone: Vec<&str> = with
                .iter()
                .filter(|h| !without.contains(h))
                .map(Hook::program)
                .collect();
            let expected: &[&str] = match mode {
                HookMode::Fentry => &[],
                _ => &[p::SYSCALL_EXIT],
            };
            assert_eq!(gone, expected, "{mode:?}");
            assert!(without.iter().all(|h| with.contains(h)), "{mode:?}");
            assert_eq!(sees_accepts(mode, false), mode == HookMode::Fentry);
            assert!(sees_accepts(mode, true));
        }
    }
}
