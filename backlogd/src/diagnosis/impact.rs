//! What a listener's drops cost its clients, as the findings about its drops quote it
//! (`accept_queue.rs`, `syn_queue.rs`).

use crate::api::{ClientImpact, ImpactWindow, ListenerSnapshot, RecentImpact};

/// What a listener's drops cost its clients, as a finding quotes it.
pub struct Impact {
    pub total: ClientImpact,
    pub recent: Option<RecentImpact>,
    pub lines: Vec<String>,
}

/// "in the last 5.1 min", or "in the 42 s since backlogd started" (a daemon younger than
/// the window).
pub fn window(w: &ImpactWindow) -> String {
    if w.since_start {
        format!("in the {:.0} s since backlogd started", w.window_seconds)
    } else {
        format!("in the last {:.1} min", w.window_seconds / 60.0)
    }
}

/// What `l`'s drops cost its clients (all of them, whatever the cause of each drop), for
/// the findings about its drops: the figures, and the evidence lines quoting them. None
/// when no connection was delayed or abandoned. How long they waited is told by the
/// first two delay buckets' bounds (0.5 and 1.5 s: halfway to the first retry, and
/// between the first and the next), the only figures the histogram has. The first line
/// says whether the damage goes on: the figures over the snapshot's recent window `recent`
/// (none from an older daemon).
pub fn client_impact(l: &ListenerSnapshot, recent: Option<ImpactWindow>) -> Option<Impact> {
    let i = &l.impact;
    let [first, second, ..] = ClientImpact::bounds();
    let mut lines = Vec::new();
    let delayed = i.delayed();
    if delayed == 0 && i.abandoned == 0 {
        return None;
    }
    let recent = recent.map(|w| RecentImpact {
        window: w,
        impact: l.recent_impact.clone().unwrap_or_else(ClientImpact::none),
    });
    if let Some(r) = &recent {
        let when = window(&r.window);
        let (d, a) = (r.impact.delayed(), r.impact.abandoned);
        lines.push(if d == 0 && a == 0 {
            format!(
                "{when}: no connection delayed or abandoned (the figures below count since \
                 the listener's counters started)"
            )
        } else {
            format!(
                "{when}: {d} connections delayed by a drop, {} of them more than {first} s \
                 (a retry); {a} connection attempts never connected",
                r.impact.delayed_at_least(first)
            )
        });
    }
    if delayed > 0 {
        let waited = i.delayed_at_least(first);
        let longer = i.delayed_at_least(second);
        let how_long = match (waited, longer) {
            (0, _) => format!("all of them within {first} s of their first drop"),
            (w, 0) => format!("{w} of them waited more than {first} s from their first drop"),
            (w, l) => format!(
                "{w} of them waited more than {first} s from their first drop, {l} of them \
                 more than {second} s"
            ),
        };
        lines.push(format!(
            "{delayed} connections reached the accept queue only after this listener dropped \
             a segment of their handshake ({} at SYN, {} at the final ACK): {how_long}",
            i.delayed_syn_drop, i.delayed_final_ack_overflow
        ));
    }
    if i.abandoned > 0 {
        lines.push(format!(
            "{} connection attempts with a drop never reached the accept queue: abandoned \
             (not queued within client_impact_horizon, or replaced by a new attempt from the \
             same client address and port)",
            i.abandoned
        ));
    }
    Some(Impact {
        total: i.clone(),
        recent,
        lines,
    })
}
