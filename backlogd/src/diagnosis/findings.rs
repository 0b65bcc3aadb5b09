//! From numbers to the fix: findings over a snapshot of every listener and namespace.
//! Pure: the same snapshot always gives the same findings (unit-tested in `tests.rs`, one
//! test per finding kind; the integration tests build each situation for real).

use std::collections::BTreeMap;

use super::finding::{Finding, Severity, subject};
use crate::api::{
    ClientImpact, ImpactWindow, ListenerSnapshot, NamespaceSnapshot, RecentImpact, Snapshot,
};

fn drops(l: &ListenerSnapshot) -> u64 {
    l.drops.accept_queue_full + l.drops.syn_queue_full + l.drops.final_ack_overflow + l.drops.other
}

/// Smallest bucket bound below which `q` of the accept waits fall, in seconds.
fn wait_quantile(l: &ListenerSnapshot, q: f64) -> Option<String> {
    let counts: Vec<u64> = l.accept_wait.buckets.iter().map(|b| b.count).collect();
    l.accept_wait.quantile(&counts, q).map(|le| {
        if le.is_infinite() {
            "> 8.4 s".to_owned()
        } else {
            format!("<= {}", human_seconds(le))
        }
    })
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

/// What a listener's drops cost its clients, as a finding quotes it.
struct Impact {
    total: ClientImpact,
    recent: Option<RecentImpact>,
    lines: Vec<String>,
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
fn client_impact(l: &ListenerSnapshot, recent: Option<ImpactWindow>) -> Option<Impact> {
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
                 (a retry); {a} attempts never connected",
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

pub fn diagnose(snapshot: &Snapshot) -> Vec<Finding> {
    let netns: BTreeMap<u32, &NamespaceSnapshot> =
        snapshot.namespaces.iter().map(|n| (n.netns, n)).collect();
    let mut out = Vec::new();
    for l in &snapshot.listeners {
        let ns = netns.get(&l.listener.netns);
        let granted = l.listener.granted;
        // 1. The somaxconn clamp, seen or known from the program (`backlog.rs`).
        out.extend(super::backlog::finding(l, ns.copied()));
        // 2. Accept queue overflowing, or hovering near full.
        let overflows = l.drops.accept_queue_full + l.drops.final_ack_overflow;
        let peak = l.queues.accept_max;
        // A drop for a full accept queue means it held more than its capacity then; a
        // peak that says otherwise has left the high-water-mark window since, and is not
        // quoted as if it were the peak of those drops.
        let peak_line = if overflows > 0 && peak <= granted {
            format!(
                "accept queue above its capacity {granted} at those drops (now {}; none \
                 above it in the current peak window)",
                l.queues.accept_depth
            )
        } else {
            format!(
                "accept queue peak {peak} of capacity {granted} (now {})",
                l.queues.accept_depth
            )
        };
        let mut queue_evidence = vec![
            peak_line,
            format!("{} accepted of {} queued", l.accepted, l.queued),
        ];
        if let Some(p99) = wait_quantile(l, 0.99) {
            queue_evidence.push(format!("accept wait p99 {p99}"));
        }
        let impact = client_impact(l, snapshot.impact_window);
        let impact_lines = impact.iter().flat_map(|i| i.lines.iter().cloned());
        let accepts_slowly = "the application accepts too slowly for the arrival rate: \
            accept in a loop until EAGAIN, add workers (SO_REUSEPORT), or move work out of \
            the accept path; a larger backlog only hides this and adds latency";
        if overflows > 0 {
            let mut evidence = vec![format!(
                "{overflows} connections dropped with the accept queue full ({} at SYN, {} at \
                 the final ACK)",
                l.drops.accept_queue_full, l.drops.final_ack_overflow
            )];
            evidence.extend(impact_lines.clone());
            evidence.extend(queue_evidence);
            out.push(Finding {
                severity: Severity::Critical,
                kind: "accept_queue_overflow",
                subject: subject(l),
                summary: format!(
                    "the accept queue of {}:{} overflows",
                    l.listener.addr, l.listener.port
                ),
                evidence,
                remedy: accepts_slowly.to_owned(),
                client_impact: impact.as_ref().map(|i| i.total.clone()),
                recent_client_impact: impact.as_ref().and_then(|i| i.recent.clone()),
            });
        } else if granted > 0 && f64::from(peak) >= 0.9 * f64::from(granted) {
            out.push(Finding {
                severity: Severity::Warning,
                kind: "accept_queue_near_full",
                subject: subject(l),
                summary: format!(
                    "the accept queue of {}:{} reached {peak} of {granted}",
                    l.listener.addr, l.listener.port
                ),
                evidence: queue_evidence,
                remedy: accepts_slowly.to_owned(),
                client_impact: None,
                recent_client_impact: None,
            });
        }
        // 3. SYN queue overflow with syncookies off.
        if l.drops.syn_queue_full > 0 {
            out.push(Finding {
                severity: Severity::Critical,
                kind: "syn_queue_overflow",
                subject: subject(l),
                summary: format!(
                    "SYNs to {}:{} are dropped because the SYN queue is full and syncookies \
                     are off",
                    l.listener.addr, l.listener.port
                ),
                evidence: [format!(
                    "{} SYNs dropped (TCPReqQFullDrop)",
                    l.drops.syn_queue_full
                )]
                .into_iter()
                .chain(impact_lines)
                .chain([
                    format!("SYN queue peak {} of limit {granted}", l.queues.syn_max),
                    match ns {
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
            });
        }
        // 4. Syncookies firing.
        if l.syncookies_sent > 0 {
            out.push(Finding {
                severity: Severity::Warning,
                kind: "syncookies_sent",
                subject: subject(l),
                summary: format!(
                    "the kernel answers SYNs to {}:{} with syncookies",
                    l.listener.addr, l.listener.port
                ),
                evidence: vec![
                    format!(
                        "{} syncookies sent (TCPReqQFullDoCookies)",
                        l.syncookies_sent
                    ),
                    format!("SYN queue peak {} of limit {granted}", l.queues.syn_max),
                    format!("{} SYN-ACK retransmits", l.synack_retransmits),
                ],
                remedy: "either a SYN flood (many SYNs never completed: look at the sources), \
                    or a SYN queue too small for the legitimate handshake rate: raise the \
                    listen backlog (and net.core.somaxconn)"
                    .to_owned(),
                client_impact: None,
                recent_client_impact: None,
            });
        }
    }
    // 5. SO_REUSEPORT group imbalance: one member full or dropping while siblings idle.
    let mut groups: BTreeMap<(u32, String, u16), Vec<&ListenerSnapshot>> = BTreeMap::new();
    for l in &snapshot.listeners {
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
                    kind: "reuseport_imbalance",
                    subject: subject(l),
                    summary: format!(
                        "one member of the SO_REUSEPORT group {addr}:{port} (netns {netns}) \
                         is full while its siblings are empty: a stalled worker"
                    ),
                    evidence: members
                        .iter()
                        .map(|m| {
                            format!(
                                "socket {} ({}[{}]): queue {} of {}, {} dropped, {} accepted",
                                m.listener.inode,
                                m.listener.comm,
                                m.listener.pid,
                                m.queues.accept_depth,
                                m.listener.granted,
                                drops(m),
                                m.accepted
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
    // 6. tcp_abort_on_overflow turning overflows into resets.
    for n in &snapshot.namespaces {
        if n.sysctls.tcp_abort_on_overflow == 0 {
            continue;
        }
        let resets: u64 = snapshot
            .listeners
            .iter()
            .filter(|l| l.listener.netns == n.netns)
            .map(|l| l.drops.final_ack_overflow)
            .sum();
        out.push(Finding {
            severity: if resets > 0 {
                Severity::Warning
            } else {
                Severity::Info
            },
            kind: "abort_on_overflow",
            subject: format!("netns {}", n.netns),
            summary: "net.ipv4.tcp_abort_on_overflow=1 turns accept-queue overflows into \
                resets"
                .to_owned(),
            evidence: vec![
                format!(
                    "net.ipv4.tcp_abort_on_overflow = {}",
                    n.sysctls.tcp_abort_on_overflow
                ),
                format!("{resets} final-ACK overflows answered with a RST"),
            ],
            remedy: "set it back to 0 (`sysctl -w net.ipv4.tcp_abort_on_overflow=0`): with 0 \
                the kernel retries the handshake when the queue has room again; with 1 \
                clients get ECONNRESET on a burst the queue would have absorbed a moment later"
                .to_owned(),
            client_impact: None,
            recent_client_impact: None,
        });
    }
    out.sort_by(|a, b| b.severity.cmp(&a.severity).then(a.kind.cmp(b.kind)));
    out
}
