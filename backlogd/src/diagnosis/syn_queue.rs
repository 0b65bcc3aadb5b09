//! The SYN queue: SYNs dropped because it was full with syncookies off, and syncookies
//! sent because it was full.

use backlogd_common::DropReason;

use super::{
    finding::{Finding, FindingKind, Severity, subject},
    impact::client_impact,
    rule::Context,
};
use crate::api::ListenerSnapshot;

/// `syn_queue_overflow`: SYNs dropped, the SYN queue full and syncookies off.
pub fn overflow(l: &ListenerSnapshot, cx: &Context<'_>) -> Option<Finding> {
    if l.drops[DropReason::SynQueueFull] == 0 {
        return None;
    }
    let impact = client_impact(l, cx.snapshot.impact_window);
    Some(Finding {
        severity: Severity::Critical,
        kind: FindingKind::SynQueueOverflow,
        subject: subject(l),
        summary: format!(
            "SYNs to {} are dropped because the SYN queue is full and syncookies \
             are off",
            l.listener.endpoint()
        ),
        evidence: [format!(
            "{} SYNs dropped, retransmitted ones included (TCPReqQFullDrop)",
            l.drops[DropReason::SynQueueFull]
        )]
        .into_iter()
        .chain(impact.iter().flat_map(|i| i.lines.iter().cloned()))
        .chain([
            syn_queue_peak(l),
            match cx.namespace(l) {
                Some(n) => {
                    format!("net.ipv4.tcp_syncookies = {}", n.sysctls.tcp_syncookies)
                }
                None => "net.ipv4.tcp_syncookies unknown".to_owned(),
            },
        ])
        .collect(),
        remedy: "enable syncookies (`sysctl -w net.ipv4.tcp_syncookies=1`, persist in \
            /etc/sysctl.d), and if the handshakes are legitimate raise the listen \
            backlog: the SYN queue's limit is the granted backlog"
            .to_owned(),
        client_impact: impact.as_ref().map(|i| i.total.clone()),
        recent_client_impact: impact.as_ref().and_then(|i| i.recent.clone()),
    })
}

/// `syncookies_sent`: the kernel answered SYNs with syncookies.
pub fn syncookies(l: &ListenerSnapshot, _: &Context<'_>) -> Option<Finding> {
    if l.syncookies_sent == 0 {
        return None;
    }
    Some(Finding {
        severity: Severity::Warning,
        kind: FindingKind::SyncookiesSent,
        subject: subject(l),
        summary: format!(
            "the kernel answers SYNs to {} with syncookies",
            l.listener.endpoint()
        ),
        evidence: vec![
            format!(
                "{} SYNs answered with a syncookie (TCPReqQFullDoCookies)",
                l.syncookies_sent
            ),
            syn_queue_peak(l),
            format!("{} SYN-ACKs retransmitted", l.synack_retransmits),
        ],
        remedy: "either a SYN flood (many SYNs never completed: look at the sources), \
            or a SYN queue too small for the legitimate handshake rate: raise the \
            listen backlog (and net.core.somaxconn)"
            .to_owned(),
        client_impact: None,
        recent_client_impact: None,
    })
}

/// The SYN queue's peak: pending handshakes (request sockets), one per connection
/// attempt; and its length now where a scan pass read it.
fn syn_queue_peak(l: &ListenerSnapshot) -> String {
    let now = l
        .queues
        .syn_depth
        .map(|n| format!(" ({n} now)"))
        .unwrap_or_default();
    format!(
        "SYN queue peak {} of limit {} pending handshakes{now}",
        l.queues.syn_max, l.listener.granted
    )
}
