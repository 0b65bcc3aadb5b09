//! The accept queue: overflowing (SYNs and final ACKs dropped because it was full), or
//! hovering near full without drops yet. Each figure says what it counts: dropped SYNs
//! include clients' retransmissions (a client whose SYN is dropped three times counts
//! three), so they are not connections; what the drops cost in connections is the client
//! impact (`impact.rs`); queue lengths, accepts and enqueues count connections.

use backlogd_common::DropReason;

use super::{
    finding::{Finding, FindingKind, Severity, subject},
    impact::client_impact,
    rule::Context,
};
use crate::api::ListenerSnapshot;

const ACCEPTS_SLOWLY: &str = "the application accepts too slowly for the arrival rate: \
    accept in a loop until EAGAIN, add workers (SO_REUSEPORT), or move work out of the \
    accept path; a larger backlog only hides this and adds latency";

/// An accept-wait p99 from this on: connections sit in the queue because the application
/// takes them slowly, not because a burst outgrew it.
const SLOW_WAIT_P99_SECONDS: f64 = 0.1;

/// What keeps the accept queue full, by the figures: `None` when they show a queue that
/// drains quickly (accept waits short, not full now, connections accepted) and bursts that
/// outgrow it; else why the accept loop is the limit.
fn accept_loop_limit(l: &ListenerSnapshot, cx: &Context<'_>) -> Option<String> {
    let granted = l.listener.granted;
    if l.queues.accept_depth > granted {
        return Some(format!(
            "the queue is full now ({} of capacity {granted})",
            l.queues.accept_depth
        ));
    }
    if !cx.snapshot.accepts_counted {
        return Some(
            "accepts are neither counted nor timed (syscall_hook = false), so the figures \
             cannot tell a slow accept loop from bursts; if the loop is the limit"
                .to_owned(),
        );
    }
    if l.accepted == 0 {
        return Some("no connection was accepted".to_owned());
    }
    match wait_p99(l) {
        None => Some(
            "accept waits are not timed (accept_wait = false), so the figures cannot \
                      tell a slow accept loop from bursts; if the loop is the limit"
                .to_owned(),
        ),
        Some(p99) if p99 >= SLOW_WAIT_P99_SECONDS => {
            Some(format!("accept wait p99 {}", wait_text(p99)))
        }
        Some(_) => None,
    }
}

/// The overflow's remedy, weighed: an accept loop that cannot keep up gets
/// [`ACCEPTS_SLOWLY`]; a queue that drains quickly but overflows in bursts gets a backlog
/// sized from what was measured: the peak plus the connections that waited for room after
/// a drop (in the last five minutes when known), which had all fitted had the queue been
/// that long.
fn overflow_remedy(l: &ListenerSnapshot, cx: &Context<'_>) -> String {
    if let Some(why) = accept_loop_limit(l, cx) {
        return format!("{why}: {ACCEPTS_SLOWLY}");
    }
    let (delayed, when) = match &l.recent_impact {
        Some(r) => (r.delayed(), "in the last five minutes"),
        None => (l.impact.delayed(), "since backlogd started"),
    };
    let peak = l.queues.accept_max.max(l.listener.granted + 1);
    let needed = u64::from(peak) + delayed;
    let somaxconn = cx
        .namespace(l)
        .map(|n| format!(" ({} now)", n.sysctls.somaxconn))
        .unwrap_or_default();
    format!(
        "the application keeps up (accept wait p99 {}, the queue not full now) but bursts \
         outgrow the queue: a backlog of at least {needed} (the peak of {peak} plus the \
         {delayed} connections that waited for room after a drop {when}) would have held \
         them; pass it to listen(), raise net.core.somaxconn to at least it{somaxconn}, and \
         restart {}: a socket keeps the backlog it was granted",
        wait_p99(l).map_or_else(|| "unknown".to_owned(), wait_text),
        l.listener.comm
    )
}

/// SYNs and final ACKs dropped because the accept queue was full (segments, not
/// connections).
fn overflows(l: &ListenerSnapshot) -> u64 {
    l.drops[DropReason::AcceptQueueFull] + l.drops[DropReason::FinalAckOverflow]
}

/// `accept_queue_overflow`: drops with the accept queue full.
pub fn overflow(l: &ListenerSnapshot, cx: &Context<'_>) -> Option<Finding> {
    let overflows = overflows(l);
    if overflows == 0 {
        return None;
    }
    let impact = client_impact(l, cx.snapshot.impact_window);
    let mut evidence = vec![format!(
        "{overflows} SYNs and final ACKs dropped with the accept queue full ({} SYNs, \
         retransmitted ones included; {} final ACKs)",
        l.drops[DropReason::AcceptQueueFull],
        l.drops[DropReason::FinalAckOverflow]
    )];
    evidence.extend(impact.iter().flat_map(|i| i.lines.iter().cloned()));
    evidence.extend(queue_evidence(l, cx));
    Some(Finding {
        severity: Severity::Critical,
        kind: FindingKind::AcceptQueueOverflow,
        subject: subject(l),
        summary: format!("the accept queue of {} overflows", l.listener.endpoint()),
        evidence,
        remedy: overflow_remedy(l, cx),
        client_impact: impact.as_ref().map(|i| i.total.clone()),
        recent_client_impact: impact.as_ref().and_then(|i| i.recent.clone()),
    })
}

/// `accept_queue_near_full`: no drops, but a peak of 90% of the capacity or more.
pub fn near_full(l: &ListenerSnapshot, cx: &Context<'_>) -> Option<Finding> {
    let granted = l.listener.granted;
    let peak = l.queues.accept_max;
    if overflows(l) > 0 || granted == 0 || f64::from(peak) < 0.9 * f64::from(granted) {
        return None;
    }
    Some(Finding {
        severity: Severity::Warning,
        kind: FindingKind::AcceptQueueNearFull,
        subject: subject(l),
        summary: format!(
            "the accept queue of {} reached {peak} of {granted} connections",
            l.listener.endpoint()
        ),
        evidence: queue_evidence(l, cx),
        remedy: ACCEPTS_SLOWLY.to_owned(),
        client_impact: None,
        recent_client_impact: None,
    })
}

/// The queue's peak and depth, what was accepted of what was queued (where accepts are
/// counted), the wait's p99.
fn queue_evidence(l: &ListenerSnapshot, cx: &Context<'_>) -> Vec<String> {
    let granted = l.listener.granted;
    let peak = l.queues.accept_max;
    // A drop for a full accept queue means it held more than its capacity then; a
    // peak that says otherwise has left the high-water-mark window since, and is not
    // quoted as if it were the peak of those drops.
    let peak_line = if overflows(l) > 0 && peak <= granted {
        format!(
            "accept queue above its capacity of {granted} connections at those drops \
             (now {}; none above it in the current peak window)",
            l.queues.accept_depth
        )
    } else {
        format!(
            "accept queue peak {peak} of capacity {granted} connections (now {})",
            l.queues.accept_depth
        )
    };
    let mut evidence = vec![peak_line];
    evidence.push(if cx.snapshot.accepts_counted {
        format!("{} connections accepted of {} queued", l.accepted, l.queued)
    } else {
        format!(
            "{} connections queued (accepts not counted: syscall_hook = false)",
            l.queued
        )
    });
    if let Some(p99) = wait_p99(l) {
        evidence.push(format!("accept wait p99 {}", wait_text(p99)));
    }
    evidence
}

/// Smallest bucket bound below which 99% of the accept waits fall, in seconds (infinite
/// past the last bound); None when no wait was timed.
fn wait_p99(l: &ListenerSnapshot) -> Option<f64> {
    let counts: Vec<u64> = l.accept_wait.buckets.iter().map(|b| b.count).collect();
    l.accept_wait.quantile(&counts, 0.99)
}

/// A bucket bound as the evidence says it.
fn wait_text(le: f64) -> String {
    if le.is_infinite() {
        "> 8.4 s".to_owned()
    } else {
        format!("<= {}", human_seconds(le))
    }
}

fn human_seconds(s: f64) -> String {
    if s < 1e-3 {
        format!("{:.0} us", s * 1e6)
    } else if s < 1.0 {
        format!("{:.1} ms", s * 1e3)
    } else {
        format!("{s:.1} s")
    }
}
