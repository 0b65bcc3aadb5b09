//! SO_REUSEPORT groups: one member full or dropping while its siblings idle.

use std::collections::BTreeMap;

use super::{
    finding::{Finding, FindingKind, Severity, subject},
    rule::Context,
};
use crate::api::ListenerSnapshot;

fn drops(l: &ListenerSnapshot) -> u64 {
    l.drops.total()
}

/// `reuseport_imbalance`: a stalled member of a group whose other members are idle.
pub fn imbalance(cx: &Context<'_>) -> Vec<Finding> {
    let mut out = Vec::new();
    let mut groups: BTreeMap<(u32, String, u16), Vec<&ListenerSnapshot>> = BTreeMap::new();
    for l in &cx.snapshot.listeners {
        let k = (
            l.listener.netns,
            l.listener.addr.to_string(),
            l.listener.port,
        );
        groups.entry(k).or_default().push(l);
    }
    for ((netns, addr, port), members) in &groups {
        if members.len() < 2 {
            continue;
        }
        let stuck =
            |l: &ListenerSnapshot| drops(l) > 0 || l.queues.accept_depth > l.listener.granted;
        let healthy = |l: &ListenerSnapshot| drops(l) == 0 && l.queues.accept_depth == 0;
        let stalled: Vec<&ListenerSnapshot> =
            members.iter().copied().filter(|l| stuck(l)).collect();
        if !stalled.is_empty() && members.iter().any(|l| healthy(l)) {
            for l in stalled {
                out.push(Finding {
                    severity: Severity::Critical,
                    kind: FindingKind::ReuseportImbalance,
                    subject: subject(l),
                    summary: format!(
                        "one member of the SO_REUSEPORT group {addr}:{port} (netns {netns}) \
                         is full while its siblings are empty: a stalled worker"
                    ),
                    evidence: members
                        .iter()
                        .map(|m| {
                            // Zeros where accepts are not counted (syscall_hook = false):
                            // not quoted.
                            let accepted = if cx.snapshot.accepts_counted {
                                format!(", {} connections accepted", m.accepted)
                            } else {
                                String::new()
                            };
                            format!(
                                "socket {} ({}[{}]): queue {} of {} connections, {} SYNs \
                                 and ACKs dropped{accepted}",
                                m.listener.inode,
                                m.listener.comm,
                                m.listener.pid,
                                m.queues.accept_depth,
                                m.listener.granted,
                                drops(m),
                            )
                        })
                        .collect(),
                    remedy: format!(
                        "the worker owning socket {} stopped accepting: the kernel keeps \
                         hashing connections to it. Find out why it is stuck (stack, \
                         blocking call) and restart it; consider a SO_REUSEPORT BPF \
                         program or SO_INCOMING_CPU-aware balancing",
                        l.listener.inode
                    ),
                    client_impact: None,
                    recent_client_impact: None,
                });
            }
        }
    }
    out
}
