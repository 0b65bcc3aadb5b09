//! Who is being dropped: a flood told from a burst by what the dropped attempts did, with
//! the sources (`crate::sources`) to say where they came from.
//!
//! Concentration alone cannot tell them apart: a flood with random spoofed sources is as
//! spread as a crowd of real clients. What differs is the attempts: a real client
//! retransmits its SYN and connects once there is room (client impact counts it delayed),
//! a flood's SYNs are never retried to completion (abandoned at the horizon). So the rules
//! judge by the share of the resolved dropped attempts that connected, and quote the
//! sources for the remedy.

use super::{
    finding::{Finding, FindingKind, Severity, subject},
    impact::client_impact,
    rule::Context,
};
use crate::{api::ListenerSnapshot, sources::DropSources};

/// Fewest resolved attempts (delayed + abandoned) worth a verdict.
const MIN_RESOLVED: u64 = 20;
/// At most this share of the resolved attempts connected: a flood.
const FLOOD_AT_MOST: f64 = crate::sources::FLOOD_CONNECTED_AT_MOST;
/// At least this share connected on a retry: a burst of real clients.
const BURST_AT_LEAST: f64 = 0.5;
/// From this share on, the largest prefix is worth a rule of its own.
const CONCENTRATED: f64 = 0.5;

/// The dropped attempts' verdict figures: (resolved, connected share).
fn resolved(l: &ListenerSnapshot) -> Option<(u64, f64)> {
    let delayed = l.impact.delayed();
    let resolved = delayed + l.impact.abandoned;
    (resolved >= MIN_RESOLVED).then(|| (resolved, delayed as f64 / resolved as f64))
}

/// The figures a finding quotes: the recent window's when it has prefixes (what is going
/// on now, and where an nft rule would act), else those since counting began; with words
/// for which.
fn current(d: &DropSources) -> (&DropSources, &'static str) {
    match d.recent.as_deref() {
        Some(r) if r.prefixes > 0 => (r, "in the last 5 min"),
        _ => (d, "since backlogd began counting"),
    }
}

/// "sources in the last 5 min: 1,800 prefixes, the largest 192.0.2.0/24 41% of ...", from
/// what the reader may see.
fn sources_line(d: &DropSources) -> String {
    let (d, when) = current(d);
    let unsourced = d.untracked.total() + d.expired.total();
    let lower = if unsourced > 0 {
        format!(
            " (at least: {} drops and cookies are under no prefix, {} of them of prefixes \
             expired)",
            unsourced,
            d.expired.total()
        )
    } else {
        String::new()
    };
    format!(
        "sources {when}: {} prefixes{lower}, the largest {} of the drops and cookies",
        d.prefixes,
        d.largest().unwrap_or_else(|| "none".to_owned())
    )
}

/// "by prefix, dropped attempts that connected: 192.0.2.0/24 0 of 4000, ...": the
/// largest prefixes' own verdicts, for a flood mixed with real clients.
fn prefixes_line(d: &DropSources) -> Option<String> {
    let (d, when) = current(d);
    let top = d.top.as_ref()?;
    let each: Vec<String> = top
        .iter()
        .filter(|s| s.counts.attempts > 0)
        .take(3)
        .map(|s| {
            format!(
                "{} {} of {}",
                s.prefix, s.counts.connected, s.counts.attempts
            )
        })
        .collect();
    (!each.is_empty()).then(|| {
        format!(
            "dropped attempts that connected on a retry, by prefix {when}: {}",
            each.join(", ")
        )
    })
}

fn connected_line(l: &ListenerSnapshot, resolved: u64, share: f64) -> String {
    format!(
        "of {resolved} connection attempts with a dropped segment that are resolved, {} \
         connected on a retry ({:.1}%) and {} never did",
        l.impact.delayed(),
        share * 100.0,
        l.impact.abandoned
    )
}

/// `syn_flood`: the dropped attempts almost never connect.
pub fn flood(l: &ListenerSnapshot, cx: &Context<'_>) -> Option<Finding> {
    let d = l.drop_sources.as_ref()?;
    let (resolved, share) = resolved(l)?;
    if share > FLOOD_AT_MOST {
        return None;
    }
    let syncookies = cx.namespace(l).map(|n| n.sysctls.tcp_syncookies);
    let mut remedy = String::new();
    let (now, _) = current(d);
    let largest = now.top.as_ref().and_then(|t| t.first());
    match largest {
        // Its own attempts connect: a rule would drop real clients with the flood.
        Some(s) if s.share >= CONCENTRATED && s.counts.connect() => {
            remedy.push_str(&format!(
                "{:.0}% comes from {}, but {} of its {} dropped attempts connected on a \
                 retry: real clients, not to be dropped by a rule; ",
                s.share * 100.0,
                s.prefix,
                s.counts.connected,
                s.counts.attempts
            ));
        }
        Some(s) if s.share >= CONCENTRATED => {
            let family = if s.prefix.contains(':') { "ip6" } else { "ip" };
            remedy.push_str(&format!(
                "{:.0}% comes from {}: drop it before it reaches the listener, e.g. `nft add \
                 rule inet filter input {family} saddr {} tcp dport {} drop` (in a chain \
                 hooked at input); ",
                s.share * 100.0,
                s.prefix,
                s.prefix,
                l.listener.port
            ));
        }
        None if now.withheld && now.top_share >= CONCENTRATED && now.largest_connects => remedy
            .push_str(&format!(
                "{:.0}% comes from one prefix (withheld from readers not on the host), but its \
                 own dropped attempts connect on a retry: real clients, not to be dropped by a \
                 rule; ",
                now.top_share * 100.0
            )),
        None if now.withheld && now.top_share >= CONCENTRATED => remedy.push_str(&format!(
            "{:.0}% comes from one prefix (withheld from readers not on the host: read it \
             there) and can be dropped before it reaches the listener with an nft rule; ",
            now.top_share * 100.0
        )),
        _ => remedy
            .push_str("the sources are spread (or spoofed): a per-prefix rule will not hold it; "),
    }
    remedy.push_str(match syncookies {
        Some(0) => {
            "turn syncookies on (`sysctl -w net.ipv4.tcp_syncookies=1`, persist in \
             /etc/sysctl.d) so a full SYN queue answers with cookies instead of dropping \
             real clients with the flood; a larger backlog only feeds the flood"
        }
        Some(_) => {
            "syncookies are on, so a full SYN queue costs real clients nothing; rate-limit \
             new connections per source upstream (nft meter, a load balancer) if the flood \
             fills the accept queue; a larger backlog only feeds the flood"
        }
        None => {
            "check net.ipv4.tcp_syncookies in the listener's namespace (backlogd has not read \
             it): 1 answers a full SYN queue with cookies instead of dropping real clients \
             with the flood; rate-limit new connections per source upstream if the flood \
             fills the accept queue; a larger backlog only feeds the flood"
        }
    });
    let impact = client_impact(l, cx.snapshot.impact_window);
    Some(Finding {
        severity: Severity::Critical,
        kind: FindingKind::SynFlood,
        subject: subject(l),
        summary: format!(
            "{} SYNs dropped on {}, {:.1}% of the dropped attempts ever connected: a \
             flood, not clients",
            d.all().syn_drops,
            l.listener.endpoint(),
            share * 100.0
        ),
        evidence: vec![connected_line(l, resolved, share), sources_line(d)]
            .into_iter()
            .chain(prefixes_line(d))
            .chain([match syncookies {
                Some(v) => format!("net.ipv4.tcp_syncookies = {v}"),
                None => "net.ipv4.tcp_syncookies unknown".to_owned(),
            }])
            .collect(),
        remedy,
        client_impact: impact.as_ref().map(|i| i.total.clone()),
        recent_client_impact: impact.as_ref().and_then(|i| i.recent.clone()),
    })
}

/// `connection_burst`: most dropped attempts connected on a retry: real clients arriving
/// faster than the listener takes them.
pub fn burst(l: &ListenerSnapshot, cx: &Context<'_>) -> Option<Finding> {
    let d = l.drop_sources.as_ref()?;
    let (resolved, share) = resolved(l)?;
    if share < BURST_AT_LEAST {
        return None;
    }
    let delayed = l.impact.delayed();
    let granted = l.listener.granted;
    let impact = client_impact(l, cx.snapshot.impact_window);
    Some(Finding {
        severity: Severity::Warning,
        kind: FindingKind::ConnectionBurst,
        subject: subject(l),
        summary: format!(
            "{} drops over {}{} prefixes on {}, {:.0}% of the dropped attempts connected \
             on a retry: a burst of real clients",
            d.all().drops(),
            // Expired prefixes are no longer told apart.
            if d.expired.total() > 0 {
                "at least "
            } else {
                ""
            },
            d.prefixes,
            l.listener.endpoint(),
            share * 100.0
        ),
        evidence: vec![connected_line(l, resolved, share), sources_line(d)]
            .into_iter()
            .chain(prefixes_line(d))
            .chain([format!(
                "accept queue peak {} in the window; granted backlog now {granted} (the queue \
                 is full at {})",
                l.queues.accept_max,
                u64::from(granted) + 1
            )])
            .collect(),
        remedy: format!(
            "these clients waited a retransmission (1 s or more) for room: each of the \
             {delayed} delayed connections needed a slot the queue did not have, so a \
             backlog up to {delayed} larger than the one they met (listen() and \
             net.core.somaxconn) would have held them had they all arrived at once, less if \
             spread; if the accept queue stays full between bursts, the accept loop is the \
             limit, not the queue: accept until EAGAIN, add workers (SO_REUSEPORT)"
        ),
        client_impact: impact.as_ref().map(|i| i.total.clone()),
        recent_client_impact: impact.as_ref().and_then(|i| i.recent.clone()),
    })
}
