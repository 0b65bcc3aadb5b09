//! Namespace sysctls that change what a full queue does.

use backlogd_common::DropReason;

use super::{
    finding::{Finding, FindingKind, Severity},
    rule::Context,
};

/// `abort_on_overflow`: net.ipv4.tcp_abort_on_overflow=1 turning overflows into resets.
pub fn abort_on_overflow(cx: &Context<'_>) -> Vec<Finding> {
    let snapshot = cx.snapshot;
    let mut out = Vec::new();
    for n in &snapshot.namespaces {
        if n.sysctls.tcp_abort_on_overflow == 0 {
            continue;
        }
        let resets: u64 = snapshot
            .listeners
            .iter()
            .filter(|l| l.listener.netns == n.netns)
            .map(|l| l.drops[DropReason::FinalAckOverflow])
            .sum();
        out.push(Finding {
            severity: if resets > 0 {
                Severity::Warning
            } else {
                Severity::Info
            },
            kind: FindingKind::AbortOnOverflow,
            subject: format!("netns {}", n.netns),
            summary: "net.ipv4.tcp_abort_on_overflow=1 turns accept-queue overflows into \
                resets"
                .to_owned(),
            evidence: vec![
                format!(
                    "net.ipv4.tcp_abort_on_overflow = {}",
                    n.sysctls.tcp_abort_on_overflow
                ),
                format!(
                    "{resets} final ACKs dropped with the accept queue full, each answered \
                     with a RST"
                ),
            ],
            remedy: "set it back to 0 (`sysctl -w net.ipv4.tcp_abort_on_overflow=0`): with 0 \
                the kernel retries the handshake when the queue has room again; with 1 \
                clients get ECONNRESET on a burst the queue would have absorbed a moment later"
                .to_owned(),
            client_impact: None,
            recent_client_impact: None,
        });
    }
    out
}
