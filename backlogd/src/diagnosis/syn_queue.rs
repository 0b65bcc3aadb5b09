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

/// Fewest cookies sent in a namespace's window worth a verdict on what they were.
const MIN_COOKIES: u64 = 20;
/// At most this share of a namespace's cookies came back: a flood (spoofed sources never
/// answer a SYN-ACK).
const COOKIE_FLOOD_AT_MOST: f64 = crate::sources::FLOOD_CONNECTED_AT_MOST;
/// At least this share came back: real clients.
const COOKIE_CLIENTS_AT_LEAST: f64 = 0.5;
/// The namespace's figures are the listener's own when it sent at least this share of the
/// namespace's cookies in the window (TcpExt counts per namespace, not per socket).
const OWN_SHARE: f64 = 0.9;

/// What the cookies were, judged by how many came back, as the dropped attempts are
/// (`sources.rs`): a cookie is answered only by a client that got the SYN-ACK, so a flood
/// of spoofed sources returns none and real clients return nearly all.
enum CookieVerdict {
    Flood,
    Clients,
}

/// `l`'s cookies in the window and its namespace's, with the verdict they give (None when
/// too few, a mix, or mostly another listener's).
struct CookieFigures {
    mine: u64,
    sent: u64,
    returned: u64,
    /// Enough cookies for a verdict, but mostly other listeners' of the namespace.
    shared: bool,
    verdict: Option<CookieVerdict>,
}

fn cookie_figures(l: &ListenerSnapshot, cx: &Context<'_>) -> Option<CookieFigures> {
    let ns = cx.namespace(l)?.syncookies?;
    // The listener's cookies over the same window: its sources' recent figures (every
    // cookie has a prefix, an expired one or an untracked entry).
    let mine = l
        .drop_sources
        .as_ref()
        .and_then(|d| d.recent.as_deref())
        .map(|r| r.all().cookies)?;
    let share = (ns.returned as f64 / ns.sent.max(1) as f64).min(1.0);
    let shared = ns.sent >= MIN_COOKIES && (mine as f64) < OWN_SHARE * ns.sent as f64;
    let verdict = if ns.sent < MIN_COOKIES || shared {
        None
    } else if share <= COOKIE_FLOOD_AT_MOST {
        Some(CookieVerdict::Flood)
    } else if share >= COOKIE_CLIENTS_AT_LEAST {
        Some(CookieVerdict::Clients)
    } else {
        None
    };
    Some(CookieFigures {
        mine,
        sent: ns.sent,
        returned: ns.returned,
        shared,
        verdict,
    })
}

/// `syncookies_sent`: the kernel answered SYNs with syncookies; where the namespace's
/// figures settle it, whether a flood or real clients.
pub fn syncookies(l: &ListenerSnapshot, cx: &Context<'_>) -> Option<Finding> {
    if l.syncookies_sent == 0 {
        return None;
    }
    let endpoint = l.listener.endpoint();
    let forced = cx
        .namespace(l)
        .is_some_and(|n| n.sysctls.tcp_syncookies == 2);
    let figures = cookie_figures(l, cx);
    let when = match cx.snapshot.impact_window {
        Some(w) if w.since_start => "since backlogd started",
        _ => "in the last 5 min",
    };
    let mut evidence = vec![format!(
        "{} SYNs answered with a syncookie (TCPReqQFullDoCookies)",
        l.syncookies_sent
    )];
    if let Some(f) = &figures {
        evidence.push(format!(
            "{when}: {} SYNs to it answered with a syncookie, {} in its network namespace; \
             {} of the namespace's cookies came back (TcpExt SyncookiesRecv: connections a \
             cookie completed), {:.1}%",
            f.mine,
            f.sent,
            f.returned,
            100.0 * f.returned as f64 / f.sent.max(1) as f64
        ));
        if f.shared {
            evidence.push(
                "other listeners of the namespace sent cookies too: the share that came back \
                 is the namespace's, not this listener's own"
                    .to_owned(),
            );
        }
    }
    evidence.push(syn_queue_peak(l));
    evidence.push(format!("{} SYN-ACKs retransmitted", l.synack_retransmits));
    if forced {
        evidence.push(
            "net.ipv4.tcp_syncookies = 2: every SYN is answered with a cookie, whatever the \
             SYN queue holds"
                .to_owned(),
        );
    }
    let (summary, remedy) = match figures.as_ref().and_then(|f| f.verdict.as_ref()) {
        Some(CookieVerdict::Flood) => (
            format!(
                "SYNs to {endpoint} are answered with syncookies, and almost none come back: \
                 a SYN flood, which the cookies absorb"
            ),
            "syncookies keep the flood from costing real clients their connections (a \
             connection a cookie makes loses the TCP options the cookie cannot hold when \
             timestamps are off); look at the sources (`backlogd top`, the API's \
             drop_sources) and drop a concentrated prefix upstream or with an nft rule; a \
             larger backlog only feeds the flood"
                .to_owned(),
        ),
        Some(CookieVerdict::Clients) if forced => (
            format!(
                "SYNs to {endpoint} are answered with syncookies because they are forced, and \
                 the clients return them: real clients"
            ),
            "net.ipv4.tcp_syncookies = 2 answers every SYN with a cookie even when the SYN \
             queue has room, so connections lose the TCP options a cookie cannot hold (when \
             timestamps are off); set it to 1 (cookies only when the queue is full) unless \
             this namespace is under attack"
                .to_owned(),
        ),
        Some(CookieVerdict::Clients) => (
            format!(
                "the SYN queue of {endpoint} is too small for its clients: the kernel answers \
                 them with syncookies, and they return them"
            ),
            format!(
                "real clients arrive faster than the SYN queue holds them (its limit is the \
                 granted backlog, {}): raise the listen backlog (and net.core.somaxconn, \
                 net.ipv4.tcp_max_syn_backlog) and restart {}; a connection a cookie makes \
                 loses the TCP options a cookie cannot hold when timestamps are off",
                l.listener.granted, l.listener.comm
            ),
        ),
        None => (
            format!("the kernel answers SYNs to {endpoint} with syncookies"),
            "either a SYN flood (its cookies never come back: look at the sources) or a SYN \
             queue too small for the legitimate handshake rate (they do): raise the listen \
             backlog (and net.core.somaxconn)"
                .to_owned(),
        ),
    };
    Some(Finding {
        severity: Severity::Warning,
        kind: FindingKind::SyncookiesSent,
        subject: subject(l),
        summary,
        evidence,
        remedy,
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
