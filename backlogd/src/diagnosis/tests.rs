//! `diagnose` is pure: one test per finding kind (named after it), on snapshots built by
//! hand. (The integration suite, tests/tests/doctor.rs, builds each situation for real.)

use backlogd_common::DropReason;

use super::{
    RULES, diagnose,
    finding::{Finding, FindingKind, Severity, subject},
};
use crate::{
    api::{
        ClientImpact, ImpactWindow, ListenerSnapshot, Snapshot,
        fixtures::{NETNS, impact, listener, namespace, owned_by, snapshot},
    },
    programs::{Asks, Known},
    queues::QueueFigures,
};

fn known(program: &str, asks: Asks, source: &str) -> Option<Known> {
    Some(Known {
        program: program.to_owned(),
        asks,
        source: source.to_owned(),
    })
}

fn kinds(found: &[Finding]) -> Vec<&'static str> {
    found.iter().map(|f| f.kind.name()).collect()
}

fn only(found: Vec<Finding>, kind: &str) -> Finding {
    assert_eq!(kinds(&found), [kind], "{found:#?}");
    found.into_iter().next().unwrap()
}

#[test]
fn every_kind_has_one_rule_and_a_test_named_after_it() {
    let here = include_str!("tests.rs");
    for kind in FindingKind::ALL {
        let rules = RULES.iter().filter(|r| r.kind == *kind).count();
        assert_eq!(rules, 1, "{kind}: {rules} rules (one per kind)");
        assert!(
            here.contains(&format!("fn {kind}_")) && here.contains(&format!("\"{kind}\"")),
            "no test for the {kind} finding: add one named `{kind}_...` that asserts \
             diagnose reports \"{kind}\""
        );
    }
    assert_eq!(RULES.len(), FindingKind::ALL.len());
}

#[test]
fn a_kind_is_served_and_printed_as_its_name() {
    for kind in FindingKind::ALL {
        assert_eq!(serde_json::to_value(kind).unwrap(), kind.name());
        assert_eq!(kind.to_string(), kind.name());
    }
}

fn queues(depth: u32, accept_max: u32, syn_max: u32) -> QueueFigures {
    QueueFigures {
        accept_depth: depth,
        accept_max,
        syn_max,
        syn_depth: None,
    }
}

#[test]
fn a_quiet_host_has_no_findings() {
    let listeners = vec![
        listener(1, 80, "nginx", Some(128), 128),
        // Listening before the daemon, at somaxconn, but sshd asks for exactly 128.
        owned_by(
            listener(2, 22, "sshd", None, 128),
            128,
            known("sshd", Asks::Backlog(128), "sshd's default"),
        ),
    ];
    assert!(diagnose(&snapshot(listeners, vec![namespace(NETNS, 128)])).is_empty());
}

#[test]
fn backlog_clamped_names_the_request_the_grant_and_the_namespaces_somaxconn() {
    let l = listener(1, 80, "nginx", Some(511), 128);
    let f = only(
        diagnose(&snapshot(vec![l.clone()], vec![namespace(NETNS, 128)])),
        "backlog_clamped",
    );
    assert_eq!(f.severity, Severity::Warning);
    assert_eq!(f.subject, subject(&l));
    assert_eq!(
        f.summary,
        "nginx asked for backlog 511 on 0.0.0.0:80, the kernel granted 128"
    );
    assert_eq!(
        f.evidence,
        [
            "listen() backlog 511, sk_max_ack_backlog 128".to_owned(),
            format!("net.core.somaxconn = 128 in netns {NETNS}"),
        ]
    );
    assert!(
        f.remedy.contains("sysctl -w net.core.somaxconn=511"),
        "{}",
        f.remedy
    );
    // Without the namespace's sysctls the finding stands and says what is unknown.
    let f = only(diagnose(&snapshot(vec![l], vec![])), "backlog_clamped");
    assert_eq!(
        f.evidence[1],
        format!("net.core.somaxconn of netns {NETNS} unknown")
    );
}

#[test]
fn backlog_clamped_from_what_the_program_asks_for_when_listen_was_not_seen() {
    let l = owned_by(
        listener(1, 80, "nginx", None, 128),
        128,
        known(
            "nginx",
            Asks::Backlog(511),
            "/etc/nginx/nginx.conf:12: listen 80 backlog=511",
        ),
    );
    let f = only(
        diagnose(&snapshot(vec![l], vec![namespace(NETNS, 128)])),
        "backlog_clamped",
    );
    assert_eq!(f.severity, Severity::Warning);
    assert_eq!(
        f.summary,
        "nginx asks for backlog 511 on 0.0.0.0:80, the kernel granted 128"
    );
    assert_eq!(
        f.evidence[0],
        "nginx asks for 511: /etc/nginx/nginx.conf:12: listen 80 backlog=511"
    );
    assert!(
        f.remedy.contains("sysctl -w net.core.somaxconn=511"),
        "{}",
        f.remedy
    );
    assert!(
        f.remedy.contains("`backlog=N` on the `listen` directive"),
        "{}",
        f.remedy
    );
    assert!(f.remedy.contains("restart nginx"), "{}", f.remedy);
}

#[test]
fn a_program_that_asks_for_somaxconn_or_for_no_more_than_granted_is_not_clamped() {
    for program in [
        known("go", Asks::Somaxconn, "go's default"),
        known("systemd", Asks::Somaxconn, "systemd's default"),
        known("sshd", Asks::Backlog(128), "sshd's default"),
        known("memcached", Asks::Backlog(100), "its command line (-b)"),
    ] {
        let l = owned_by(listener(1, 80, "app", None, 128), 128, program.clone());
        assert!(
            diagnose(&snapshot(vec![l], vec![namespace(NETNS, 128)])).is_empty(),
            "{program:?}"
        );
    }
}

#[test]
fn backlog_maybe_clamped_when_granted_equals_somaxconn_and_the_program_is_unknown() {
    let l = owned_by(listener(1, 8080, "app", None, 128), 128, None);
    let f = only(
        diagnose(&snapshot(vec![l], vec![namespace(NETNS, 128)])),
        "backlog_maybe_clamped",
    );
    assert_eq!(f.severity, Severity::Info);
    assert_eq!(
        f.summary,
        "app on 0.0.0.0:8080 was granted 128, net.core.somaxconn: it may have asked for more \
         and been cut"
    );
    assert!(
        f.remedy
            .starts_with("to find out, restart app while backlogd runs"),
        "{}",
        f.remedy
    );
    // A known program whose figure backlogd could not read names its setting.
    let l = owned_by(
        listener(1, 8080, "haproxy", None, 128),
        128,
        known("haproxy", Asks::Configured, "haproxy's default"),
    );
    let f = only(
        diagnose(&snapshot(vec![l], vec![namespace(NETNS, 128)])),
        "backlog_maybe_clamped",
    );
    assert!(
        f.evidence[3].contains("`backlog N` in the frontend"),
        "{f:#?}"
    );
    // Granted less than somaxconn: most likely what it asked for; nothing to say.
    let l = owned_by(listener(1, 8080, "app", None, 64), 128, None);
    assert!(diagnose(&snapshot(vec![l], vec![namespace(NETNS, 128)])).is_empty());
}

#[test]
fn a_clamp_in_a_container_namespace_is_fixed_there_not_on_the_host() {
    const POD: u32 = NETNS + 7;
    let mut l = listener(1, 6379, "redis-server", Some(511), 128);
    l.listener.netns = POD;
    let f = only(
        diagnose(&snapshot(vec![l], vec![namespace(POD, 128)])),
        "backlog_clamped",
    );
    for part in [
        "per network namespace",
        "--sysctl net.core.somaxconn=511",
        "securityContext.sysctls",
        "--allowed-unsafe-sysctls=net.core.somaxconn",
        "restart redis-server",
    ] {
        assert!(f.remedy.contains(part), "{part}: {}", f.remedy);
    }
    assert!(!f.remedy.contains("/etc/sysctl.d"), "{}", f.remedy);
}

#[test]
fn a_clamp_in_a_pod_is_fixed_in_the_pod_spec_and_a_containers_on_its_run() {
    const POD: u32 = NETNS + 7;
    let id = "3f4c2d1e0b9a8f7e6d5c4b3a29181706f5e4d3c2b1a09f8e7d6c5b4a39281706";
    let uid = "0a1b2c3d-4e5f-6789-abcd-ef0123456789";
    let mut l = listener(1, 6379, "redis-server", Some(511), 128);
    l.listener.netns = POD;
    let mut names = crate::names::cgroup::parse(&format!("/kubepods/pod{uid}/{id}"));
    names.pod_name = Some("cache-0".into());
    names.pod_namespace = Some("shop".into());
    l.listener.names = Some(names);
    let clamped = |l: &ListenerSnapshot| {
        only(
            diagnose(&snapshot(vec![l.clone()], vec![namespace(POD, 128)])),
            "backlog_clamped",
        )
        .remedy
    };
    let remedy = clamped(&l);
    for part in [
        "`net.core.somaxconn: \"511\"` to `spec.securityContext.sysctls`",
        "--allowed-unsafe-sysctls=net.core.somaxconn",
        "recreate pod shop/cache-0",
    ] {
        assert!(remedy.contains(part), "{part}: {remedy}");
    }
    for absent in ["--sysctl", "ip netns exec", "/etc/sysctl.d"] {
        assert!(!remedy.contains(absent), "{absent}: {remedy}");
    }
    l.listener.names = Some(crate::names::cgroup::parse(&format!(
        "/system.slice/docker-{id}.scope"
    )));
    let remedy = clamped(&l);
    for part in [
        "`--sysctl net.core.somaxconn=511`",
        "recreate the docker container (redis-server)",
    ] {
        assert!(remedy.contains(part), "{part}: {remedy}");
    }
    assert!(!remedy.contains("securityContext"), "{remedy}");
}

#[test]
fn a_clamp_that_somaxconn_already_allows_asks_only_for_a_restart() {
    let l = listener(1, 80, "nginx", Some(511), 128);
    let f = only(
        diagnose(&snapshot(vec![l], vec![namespace(NETNS, 4096)])),
        "backlog_clamped",
    );
    assert!(
        f.remedy.starts_with(
            "net.core.somaxconn is already 4096 in that namespace, so 511 fits now: restart \
             nginx"
        ),
        "{}",
        f.remedy
    );
}

#[test]
fn a_request_granted_in_full_or_unknown_or_negative_is_not_a_clamp() {
    for requested in [Some(128), Some(64), None, Some(-1)] {
        let l = listener(1, 80, "app", requested, 128);
        assert!(
            diagnose(&snapshot(vec![l], vec![])).is_empty(),
            "{requested:?}"
        );
    }
}

#[test]
fn accept_queue_overflow_counts_drops_at_syn_and_at_the_final_ack() {
    let mut l = listener(1, 8080, "app", Some(8), 8);
    l.drops[DropReason::AcceptQueueFull] = 480;
    l.drops[DropReason::FinalAckOverflow] = 3;
    l.queues = queues(9, 9, 2);
    l.queued = 20;
    l.accepted = 11;
    let f = only(
        diagnose(&snapshot(vec![l], vec![])),
        "accept_queue_overflow",
    );
    assert_eq!(f.severity, Severity::Critical);
    assert_eq!(f.summary, "the accept queue of 0.0.0.0:8080 overflows");
    assert_eq!(
        f.evidence,
        [
            "483 SYNs and final ACKs dropped with the accept queue full (480 SYNs, \
             retransmitted ones included; 3 final ACKs)",
            "accept queue peak 9 of capacity 8 connections (now 9)",
            "11 connections accepted of 20 queued",
        ]
    );
}

#[test]
fn overflow_evidence_never_quotes_a_peak_below_the_capacity_its_drops_exceeded() {
    // The drops are counted since the daemon started; the peak covers its window only.
    let mut l = listener(1, 8080, "app", Some(8), 8);
    l.drops[DropReason::AcceptQueueFull] = 5;
    l.queues = queues(0, 3, 0);
    let f = only(
        diagnose(&snapshot(vec![l], vec![])),
        "accept_queue_overflow",
    );
    assert_eq!(
        f.evidence[1],
        "accept queue above its capacity of 8 connections at those drops (now 0; none \
         above it in the current peak window)"
    );
}

#[test]
fn accept_wait_p99_joins_the_queue_evidence() {
    let mut l = listener(1, 8080, "app", Some(8), 8);
    l.drops[DropReason::AcceptQueueFull] = 1;
    // 99 waits under 1 us, one in the 2^10 us bucket: p99 is the first bucket's bound.
    l.accept_wait.buckets[0].count = 99;
    l.accept_wait.buckets[10].count = 1;
    let f = only(
        diagnose(&snapshot(vec![l.clone()], vec![])),
        "accept_queue_overflow",
    );
    assert_eq!(f.evidence.last().unwrap(), "accept wait p99 <= 1 us");
    // Most waits beyond the last bound: the last bucket says so.
    l.accept_wait.buckets[0].count = 0;
    l.accept_wait.buckets[24].count = 5;
    let f = only(
        diagnose(&snapshot(vec![l], vec![])),
        "accept_queue_overflow",
    );
    assert_eq!(f.evidence.last().unwrap(), "accept wait p99 > 8.4 s");
}

/// A listener that asked for a 5-slot queue and accepts quickly (every wait under 1 us)
/// but met bursts: 40 SYNs dropped at a full accept queue, the peak 6, 30 connections
/// delayed in the last five minutes, 2 in the queue now.
fn quick_but_small() -> ListenerSnapshot {
    let mut l = listener(1, 8080, "app", Some(5), 5);
    l.drops[DropReason::AcceptQueueFull] = 40;
    l.queues = queues(2, 6, 0);
    l.queued = 102;
    l.accepted = 100;
    l.accept_wait.buckets[0].count = 100;
    l.impact = impact(35, 0, &[0, 35], 0);
    l.recent_impact = Some(impact(30, 0, &[0, 30], 0));
    l
}

#[test]
fn a_queue_that_drains_quickly_but_overflows_gets_a_backlog_sized_from_the_figures() {
    let f = only(
        diagnose(&snapshot(
            vec![quick_but_small()],
            vec![namespace(NETNS, 4096)],
        )),
        "accept_queue_overflow",
    );
    assert_eq!(
        f.remedy,
        "the application keeps up (accept wait p99 <= 1 us, the queue not full now) but \
         bursts outgrow the queue: a backlog of at least 36 (the peak of 6 plus the 30 \
         connections that waited for room after a drop in the last five minutes) would have \
         held them; pass it to listen(), raise net.core.somaxconn to at least it (4096 \
         now), and restart app: a socket keeps the backlog it was granted"
    );
}

#[test]
fn an_accept_loop_that_cannot_keep_up_is_named_with_the_figure_that_shows_it() {
    let slow = |edit: fn(&mut ListenerSnapshot)| {
        let mut l = quick_but_small();
        edit(&mut l);
        only(
            diagnose(&snapshot(vec![l], vec![])),
            "accept_queue_overflow",
        )
        .remedy
    };
    let full_now = slow(|l| l.queues.accept_depth = 6);
    assert!(
        full_now.starts_with(
            "the queue is full now (6 of capacity 5): the application accepts too slowly"
        ),
        "{full_now}"
    );
    // 2 of 100 waits in the 2^17 us (~131 ms) bucket: p99 past 100 ms.
    let long_waits = slow(|l| {
        l.accept_wait.buckets[0].count = 98;
        l.accept_wait.buckets[17].count = 2;
    });
    assert!(
        long_waits.starts_with("accept wait p99 <= 131.1 ms: the application accepts too slowly"),
        "{long_waits}"
    );
    let never = slow(|l| l.accepted = 0);
    assert!(never.starts_with("no connection was accepted: "), "{never}");
    let untimed = slow(|l| l.accept_wait.buckets[0].count = 0);
    assert!(
        untimed.starts_with("accept waits are not timed (accept_wait = false)"),
        "{untimed}"
    );
}

/// A daemon that does not see accepts (`syscall_hook = false`) serves zeros for them: the
/// diagnosis says it cannot judge the accept loop, and quotes no "0 accepted" as evidence.
#[test]
fn without_accepts_the_accept_loop_is_not_judged_from_zeros() {
    let mut l = quick_but_small();
    l.accepted = 0;
    l.accept_wait.buckets[0].count = 0;
    let mut blind = snapshot(vec![l], vec![]);
    blind.accepts_counted = false;
    let f = only(diagnose(&blind), "accept_queue_overflow");
    assert!(
        f.remedy.starts_with(
            "accepts are neither counted nor timed (syscall_hook = false), so the figures \
             cannot tell a slow accept loop from bursts; if the loop is the limit: the \
             application accepts too slowly"
        ),
        "{}",
        f.remedy
    );
    assert!(
        f.evidence.contains(
            &"102 connections queued (accepts not counted: syscall_hook = false)".to_owned()
        ),
        "{:?}",
        f.evidence
    );
    assert!(
        !f.evidence.iter().any(|e| e.contains("accepted")),
        "{:?}",
        f.evidence
    );
}

/// 312 connections delayed (300 after a SYN drop, 12 after a final-ACK drop): 22 by up
/// to 0.5 s, 250 by 0.5-1.5 s (a first retry), 40 by more (30 by 2.5-3.5 s, 9 by 5.5-9 s,
/// 1 by 9-17 s); 41 attempts abandoned.
pub fn overflowing_with_impact() -> ListenerSnapshot {
    let mut l = listener(1, 8080, "app", Some(8), 8);
    l.drops[DropReason::AcceptQueueFull] = 480;
    l.drops[DropReason::FinalAckOverflow] = 3;
    l.queues = queues(9, 9, 2);
    l.queued = 20;
    l.accepted = 11;
    l.impact = impact(300, 12, &[22, 250, 0, 30, 0, 9, 1], 41);
    l
}

#[test]
fn accept_queue_overflow_says_how_many_connections_waited_and_how_many_never_connected() {
    let f = only(
        diagnose(&snapshot(vec![overflowing_with_impact()], vec![])),
        "accept_queue_overflow",
    );
    assert_eq!(
        f.evidence,
        [
            "483 SYNs and final ACKs dropped with the accept queue full (480 SYNs, \
             retransmitted ones included; 3 final ACKs)",
            "312 connections reached the accept queue only after this listener dropped a \
             segment of their handshake (300 at SYN, 12 at the final ACK): 290 of them waited \
             more than 0.5 s from their first drop, 40 of them more than 1.5 s",
            "41 connection attempts with a drop never reached the accept queue: abandoned (not \
             queued within client_impact_horizon, or replaced by a new attempt from the same \
             client address and port)",
            "accept queue peak 9 of capacity 8 connections (now 9)",
            "11 connections accepted of 20 queued",
        ]
    );
    // The figures those lines quote, in the JSON output (as the JSON API has them).
    let json = serde_json::to_value(&f).unwrap();
    let figures = &json["client_impact"];
    assert_eq!(figures["delayed_syn_drop"], 300, "{json:#}");
    assert_eq!(figures["delayed_final_ack_overflow"], 12, "{json:#}");
    assert_eq!(figures["abandoned"], 41, "{json:#}");
    let figures: ClientImpact = serde_json::from_value(figures.clone()).unwrap();
    assert_eq!(figures.delayed(), 312);
    assert_eq!(figures.delayed_at_least(0.5), 290);
    assert_eq!(figures.delayed_at_least(1.5), 40);
    // As `backlogd doctor` prints it: `doctor/mod.rs`'s test.
}

/// A snapshot of `l` whose recent figures cover `seconds` (`since_start`: the daemon is
/// younger than the window).
fn with_window(l: &ListenerSnapshot, seconds: f64, since_start: bool) -> Snapshot {
    let mut s = snapshot(vec![l.clone()], vec![]);
    s.impact_window = Some(ImpactWindow {
        window_seconds: seconds,
        since_start,
    });
    s
}

#[test]
fn client_impact_says_first_whether_it_goes_on_in_the_last_five_minutes() {
    // A daemon up longer than the window: "in the last 5.1 min", with its own figures.
    let mut l = overflowing_with_impact();
    l.recent_impact = Some(impact(20, 2, &[1, 15, 0, 6], 4));
    let f = only(
        diagnose(&with_window(&l, 306.0, false)),
        "accept_queue_overflow",
    );
    assert_eq!(
        f.evidence[1],
        "in the last 5.1 min: 22 connections delayed by a drop, 21 of them more than 0.5 s \
         (a retry); 4 connection attempts never connected"
    );
    // The totals follow, unchanged.
    assert!(
        f.evidence[2].starts_with("312 connections reached"),
        "{f:#?}"
    );
    let json = serde_json::to_value(&f).unwrap();
    let r = &json["recent_client_impact"];
    assert_eq!(
        (
            &r["window_seconds"],
            &r["since_start"],
            &r["delayed_syn_drop"],
            &r["delayed_final_ack_overflow"],
            &r["abandoned"]
        ),
        (
            &306.0.into(),
            &false.into(),
            &20.into(),
            &2.into(),
            &4.into()
        ),
        "{json:#}"
    );
    // Younger than the window: since its start.
    l.recent_impact = Some(impact(0, 3, &[3], 0));
    let f = only(
        diagnose(&with_window(&l, 42.4, true)),
        "accept_queue_overflow",
    );
    assert_eq!(
        f.evidence[1],
        "in the 42 s since backlogd started: 3 connections delayed by a drop, 0 of them more \
         than 0.5 s (a retry); 0 connection attempts never connected"
    );
    // Over: said so, so the totals are not read as current; the JSON has every bucket.
    l.recent_impact = None;
    let f = only(
        diagnose(&with_window(&l, 300.0, false)),
        "accept_queue_overflow",
    );
    assert_eq!(
        f.evidence[1],
        "in the last 5.0 min: no connection delayed or abandoned (the figures below count \
         since the listener's counters started)"
    );
    let recent = f.recent_client_impact.expect("recent figures, all zero");
    assert_eq!((recent.impact.delayed(), recent.impact.abandoned), (0, 0));
    assert_eq!(recent.impact.delay.len(), ClientImpact::bounds().len() + 1);
    // No window (an older daemon): no line, none in the JSON.
    let f = only(
        diagnose(&snapshot(vec![l], vec![])),
        "accept_queue_overflow",
    );
    assert!(
        f.evidence[1].starts_with("312 connections reached"),
        "{f:#?}"
    );
    assert!(f.recent_client_impact.is_none());
}

#[test]
fn client_impact_is_said_only_where_there_is_some_and_never_beyond_its_figures() {
    // None: no line, no figures in the JSON.
    let mut l = overflowing_with_impact();
    l.impact = ClientImpact::default();
    let f = only(
        diagnose(&snapshot(vec![l.clone()], vec![])),
        "accept_queue_overflow",
    );
    assert_eq!(f.evidence.len(), 3, "{f:#?}");
    assert!(f.client_impact.is_none());
    assert!(
        serde_json::to_value(&f)
            .unwrap()
            .get("client_impact")
            .is_none()
    );
    // Delays all up to 0.5 s, nothing abandoned: no claim of a longer wait, no
    // abandoned line.
    l.impact = impact(0, 5, &[5], 0);
    let f = only(
        diagnose(&snapshot(vec![l.clone()], vec![])),
        "accept_queue_overflow",
    );
    assert_eq!(
        f.evidence[1],
        "5 connections reached the accept queue only after this listener dropped a segment \
         of their handshake (0 at SYN, 5 at the final ACK): all of them within 0.5 s of \
         their first drop"
    );
    assert_eq!(f.evidence.len(), 4, "{f:#?}");
    // Waits over 0.5 s, none over 1.5 s: the second figure is left out.
    l.impact = impact(7, 0, &[0, 7], 0);
    let f = only(
        diagnose(&snapshot(vec![l.clone()], vec![])),
        "accept_queue_overflow",
    );
    assert!(
        f.evidence[1].ends_with(": 7 of them waited more than 0.5 s from their first drop"),
        "{}",
        f.evidence[1]
    );
    // Abandoned only.
    l.impact = impact(0, 0, &[], 2);
    let f = only(
        diagnose(&snapshot(vec![l], vec![])),
        "accept_queue_overflow",
    );
    assert!(
        f.evidence[1].starts_with("2 connection attempts with a drop never reached"),
        "{f:#?}"
    );
    assert_eq!(f.evidence.len(), 4, "{f:#?}");
}

#[test]
fn syn_queue_overflow_carries_the_listeners_client_impact_too() {
    let mut l = listener(1, 443, "app", Some(16), 16);
    l.drops[DropReason::SynQueueFull] = 40;
    l.queues = queues(0, 0, 16);
    l.impact = impact(25, 0, &[0, 20, 5], 15);
    let mut ns = namespace(NETNS, 4096);
    ns.sysctls.tcp_syncookies = 0;
    let f = only(diagnose(&snapshot(vec![l], vec![ns])), "syn_queue_overflow");
    assert_eq!(
        f.evidence,
        [
            "40 SYNs dropped, retransmitted ones included (TCPReqQFullDrop)",
            "25 connections reached the accept queue only after this listener dropped a \
             segment of their handshake (25 at SYN, 0 at the final ACK): 25 of them waited \
             more than 0.5 s from their first drop, 5 of them more than 1.5 s",
            "15 connection attempts with a drop never reached the accept queue: abandoned (not \
             queued within client_impact_horizon, or replaced by a new attempt from the same \
             client address and port)",
            "SYN queue peak 16 of limit 16 pending handshakes",
            "net.ipv4.tcp_syncookies = 0",
        ]
    );
    assert_eq!(f.client_impact.map(|i| i.abandoned), Some(15));
}

#[test]
fn accept_queue_near_full_from_ninety_percent_of_the_grant_without_drops() {
    let mut l = listener(1, 8080, "app", Some(100), 100);
    l.queues = queues(0, 89, 0);
    assert!(diagnose(&snapshot(vec![l.clone()], vec![])).is_empty());
    l.queues = queues(3, 90, 0);
    let f = only(
        diagnose(&snapshot(vec![l], vec![])),
        "accept_queue_near_full",
    );
    assert_eq!(f.severity, Severity::Warning);
    assert_eq!(
        f.summary,
        "the accept queue of 0.0.0.0:8080 reached 90 of 100 connections"
    );
    assert_eq!(
        f.evidence[0],
        "accept queue peak 90 of capacity 100 connections (now 3)"
    );
}

#[test]
fn syn_queue_overflow_reports_the_namespaces_syncookies_setting() {
    let mut l = listener(1, 443, "app", Some(16), 16);
    l.drops[DropReason::SynQueueFull] = 40;
    l.queues = queues(0, 0, 16);
    let mut ns = namespace(NETNS, 4096);
    ns.sysctls.tcp_syncookies = 0;
    let f = only(diagnose(&snapshot(vec![l], vec![ns])), "syn_queue_overflow");
    assert_eq!(f.severity, Severity::Critical);
    assert_eq!(
        f.evidence,
        [
            "40 SYNs dropped, retransmitted ones included (TCPReqQFullDrop)",
            "SYN queue peak 16 of limit 16 pending handshakes",
            "net.ipv4.tcp_syncookies = 0",
        ]
    );
    assert!(f.remedy.contains("tcp_syncookies=1"), "{}", f.remedy);
}

#[test]
fn syncookies_sent_is_a_warning_with_the_retransmits() {
    let mut l = listener(1, 443, "app", Some(16), 16);
    l.syncookies_sent = 7;
    l.synack_retransmits = 2;
    l.queues = queues(0, 0, 16);
    let f = only(diagnose(&snapshot(vec![l], vec![])), "syncookies_sent");
    assert_eq!(f.severity, Severity::Warning);
    assert_eq!(
        f.evidence,
        [
            "7 SYNs answered with a syncookie (TCPReqQFullDoCookies)",
            "SYN queue peak 16 of limit 16 pending handshakes",
            "2 SYN-ACKs retransmitted",
        ]
    );
}

fn reuseport_group() -> Vec<ListenerSnapshot> {
    (1..=3)
        .map(|inode| listener(inode, 8080, "worker", Some(64), 64))
        .collect()
}

#[test]
fn reuseport_imbalance_names_the_stalled_member_and_lists_every_member() {
    let mut group = reuseport_group();
    group[1].drops[DropReason::AcceptQueueFull] = 12;
    group[1].queues = queues(65, 65, 0);
    let found = diagnose(&snapshot(group.clone(), vec![]));
    // The stalled member also overflows on its own.
    assert_eq!(
        kinds(&found),
        ["accept_queue_overflow", "reuseport_imbalance"]
    );
    let f = &found[1];
    assert_eq!(f.severity, Severity::Critical);
    assert_eq!(f.subject, subject(&group[1]));
    assert_eq!(f.evidence.len(), 3);
    assert_eq!(
        f.evidence[1],
        "socket 2 (worker[102]): queue 65 of 64 connections, 12 SYNs and ACKs dropped, 0 \
         connections accepted"
    );
    assert!(
        f.remedy
            .starts_with("the worker owning socket 2 stopped accepting")
    );
    // Where accepts are not counted, their zeros are not quoted.
    let mut blind = snapshot(group, vec![]);
    blind.accepts_counted = false;
    let found = diagnose(&blind);
    assert_eq!(
        found[1].evidence[1],
        "socket 2 (worker[102]): queue 65 of 64 connections, 12 SYNs and ACKs dropped"
    );
}

#[test]
fn a_group_whose_members_all_struggle_is_not_an_imbalance() {
    let mut group = reuseport_group();
    for m in &mut group {
        m.drops[DropReason::AcceptQueueFull] = 5;
    }
    let found = diagnose(&snapshot(group, vec![]));
    assert!(
        !kinds(&found).contains(&"reuseport_imbalance"),
        "{found:#?}"
    );
    assert_eq!(found.len(), 3);
}

#[test]
fn abort_on_overflow_is_info_until_it_resets_a_handshake() {
    let mut ns = namespace(NETNS, 4096);
    ns.sysctls.tcp_abort_on_overflow = 1;
    let quiet = listener(1, 80, "app", Some(128), 128);
    let f = only(
        diagnose(&snapshot(vec![quiet.clone()], vec![ns.clone()])),
        "abort_on_overflow",
    );
    assert_eq!(f.severity, Severity::Info);
    assert_eq!(f.subject, format!("netns {NETNS}"));
    assert_eq!(
        f.evidence[1],
        "0 final ACKs dropped with the accept queue full, each answered with a RST"
    );

    let mut reset = quiet;
    reset.drops[DropReason::FinalAckOverflow] = 4;
    let found = diagnose(&snapshot(vec![reset], vec![ns]));
    assert_eq!(
        kinds(&found),
        ["accept_queue_overflow", "abort_on_overflow"]
    );
    assert_eq!(found[1].severity, Severity::Warning);
    assert_eq!(
        found[1].evidence[1],
        "4 final ACKs dropped with the accept queue full, each answered with a RST"
    );
}

#[test]
fn findings_come_most_severe_first() {
    let mut clamped_and_cookies = listener(1, 80, "nginx", Some(511), 128);
    clamped_and_cookies.syncookies_sent = 1;
    let mut overflowing = listener(2, 81, "app", Some(8), 8);
    overflowing.drops[DropReason::AcceptQueueFull] = 1;
    let found = diagnose(&snapshot(vec![clamped_and_cookies, overflowing], vec![]));
    assert_eq!(
        kinds(&found),
        [
            "accept_queue_overflow",
            "backlog_clamped",
            "syncookies_sent"
        ]
    );
}

#[test]
fn the_subject_names_the_unit_container_or_pod_of_the_owner() {
    let mut l = listener(1, 80, "nginx", Some(511), 128);
    assert_eq!(subject(&l), "nginx[101] 0.0.0.0:80 (netns 4026531840)");
    l.listener.names = Some(crate::names::cgroup::parse("/system.slice/nginx.service"));
    assert!(
        subject(&l).ends_with(" in nginx.service"),
        "{}",
        subject(&l)
    );
}

/// somaxconn raised after the program listened: granted < somaxconn now, and the program
/// asks for more than it holds. Every kind of known request says it must listen again.
#[test]
fn backlog_clamped_when_somaxconn_was_raised_after_the_program_listened() {
    let diagnose_at = |program, comm: &str, somaxconn| {
        let l = owned_by(listener(1, 80, comm, None, 128), somaxconn, program);
        diagnose(&snapshot(vec![l], vec![namespace(NETNS, somaxconn)]))
    };
    // It asks for somaxconn itself: 128 when it listened, 4096 now.
    for (program, comm) in [
        (known("go", Asks::Somaxconn, "go's default"), "api"),
        (
            known("php-fpm", Asks::Somaxconn, "php-fpm's default"),
            "php-fpm8.2",
        ),
    ] {
        let f = only(diagnose_at(program, comm, 4096), "backlog_clamped");
        assert_eq!(f.severity, Severity::Warning);
        assert_eq!(
            f.summary,
            format!(
                "{comm} asks for net.core.somaxconn on 0.0.0.0:80, 4096 now, and holds the \
                 128 it was granted before it was raised: it must call listen() again to \
                 get 4096"
            )
        );
        assert!(
            f.evidence.iter().any(|e| e.starts_with(
                "net.core.somaxconn is 4096 now, above the 128 granted: it was raised after"
            )),
            "{f:#?}"
        );
        assert!(
            f.remedy.starts_with(&format!(
                "net.core.somaxconn was raised to 4096 after {comm} listened: restart {comm}"
            )),
            "{}",
            f.remedy
        );
    }
    // systemd holds its sockets: the .socket unit is what listens again.
    let f = only(
        diagnose_at(
            known("systemd", Asks::Somaxconn, "systemd's default"),
            "systemd",
            4096,
        ),
        "backlog_clamped",
    );
    assert!(
        f.remedy.contains("then start the .socket unit"),
        "{}",
        f.remedy
    );
    assert!(!f.remedy.contains("restart systemd"), "{}", f.remedy);
    // A fixed figure: the raise shows in the evidence, the remedy is the restart alone;
    // nginx's reload does not listen again.
    let f = only(
        diagnose_at(
            known("nginx", Asks::Backlog(511), "nginx's default"),
            "nginx",
            1024,
        ),
        "backlog_clamped",
    );
    assert!(
        f.evidence
            .iter()
            .any(|e| e.starts_with("net.core.somaxconn is 1024 now, above the 128 granted")),
        "{f:#?}"
    );
    assert!(
        f.remedy.starts_with(
            "net.core.somaxconn is already 1024 in that namespace, so 511 fits now: restart \
             nginx (a reload keeps the listening socket"
        ),
        "{}",
        f.remedy
    );
    // Not raised: nothing for somaxconn's askers, and no raise in a fixed figure's evidence.
    assert!(diagnose_at(known("go", Asks::Somaxconn, ""), "api", 128).is_empty());
    let f = only(
        diagnose_at(known("nginx", Asks::Backlog(511), ""), "nginx", 128),
        "backlog_clamped",
    );
    assert!(!f.evidence.iter().any(|e| e.contains("raised")), "{f:#?}");
}

/// A runtime's default (a JVM's 50) is claimed only where the kernel granted exactly
/// somaxconn; granted less, the code may have asked for that itself.
#[test]
fn backlog_clamped_from_a_runtime_default_only_at_somaxconn() {
    let jvm = known(
        "java",
        Asks::CodeDefault(50),
        "java's default, if its code passes no backlog",
    );
    let at = |granted, somaxconn| {
        let l = owned_by(
            listener(1, 8080, "java", None, granted),
            somaxconn,
            jvm.clone(),
        );
        diagnose(&snapshot(vec![l], vec![namespace(NETNS, somaxconn)]))
    };
    let f = only(at(32, 32), "backlog_clamped");
    assert_eq!(
        f.summary,
        "java asks for backlog 50 (if its code passes none) on 0.0.0.0:8080, the kernel \
         granted 32"
    );
    assert!(
        f.remedy.contains("without one a JVM asks for 50"),
        "{}",
        f.remedy
    );
    assert!(at(32, 4096).is_empty());
    // At somaxconn above 50: the code asked for at least that itself.
    only(at(128, 128), "backlog_maybe_clamped");
}

/// Netty's default is somaxconn, if its code sets no SO_BACKLOG: nothing while it holds
/// somaxconn; once somaxconn is above what it holds, the raise is said as for Go, on
/// that condition, and its remedy is a new JVM (Netty read somaxconn once).
#[test]
fn backlog_clamped_from_a_runtime_somaxconn_said_on_its_condition() {
    let netty = known(
        "netty",
        Asks::CodeSomaxconn,
        "netty's default, if its code passes no backlog",
    );
    let at = |granted, somaxconn| {
        let l = owned_by(
            listener(1, 8080, "java", None, granted),
            somaxconn,
            netty.clone(),
        );
        diagnose(&snapshot(vec![l], vec![namespace(NETNS, somaxconn)]))
    };
    assert!(at(128, 128).is_empty());
    let f = only(at(128, 4096), "backlog_clamped");
    assert_eq!(f.severity, Severity::Warning);
    assert_eq!(
        f.summary,
        "java asks for net.core.somaxconn (if its code passes none) on 0.0.0.0:8080, 4096 \
         now, and holds the 128 it was granted before it was raised: it must call listen() \
         again to get 4096"
    );
    assert!(
        f.evidence.iter().any(|e| e
            == "unless its code passes a backlog of its own, and that is 128, which it then \
                holds in full"),
        "{f:#?}"
    );
    assert!(
        f.remedy.starts_with(
            "net.core.somaxconn was raised to 4096 after java listened: restart the JVM \
             (Netty reads net.core.somaxconn once"
        ),
        "{}",
        f.remedy
    );
    // Go's own somaxconn is not conditional.
    let go = owned_by(
        listener(1, 8080, "api", None, 128),
        4096,
        known("go", Asks::Somaxconn, "go's default"),
    );
    let f = only(
        diagnose(&snapshot(vec![go], vec![namespace(NETNS, 4096)])),
        "backlog_clamped",
    );
    assert!(!f.summary.contains("if its code"), "{}", f.summary);
    assert!(
        !f.evidence.iter().any(|e| e.starts_with("unless")),
        "{f:#?}"
    );
}

/// A listener with `drops` SYNs dropped at a full accept queue, `delayed` of the dropped
/// attempts connected on a retry and `abandoned` never, and sources whose largest prefix
/// holds `top_share`.
fn dropped_by(drops: u64, delayed: u64, abandoned: u64, top_share: f64) -> ListenerSnapshot {
    let mut l = listener(1, 80, "nginx", Some(511), 128);
    l.drops[DropReason::AcceptQueueFull] = drops;
    l.queues = queues(129, 129, 0);
    l.impact = impact(delayed, 0, &[delayed], abandoned);
    l.drop_sources = Some(crate::sources::DropSources {
        prefixes: 3,
        counted: crate::sources::Counts {
            syn_drops: drops,
            ..Default::default()
        },
        top_share,
        top: Some(vec![crate::sources::Source {
            prefix: "192.0.2.0/24".into(),
            counts: crate::sources::Counts {
                syn_drops: (drops as f64 * top_share) as u64,
                // Its part of the attempts, connected as the listener's are.
                attempts: ((delayed + abandoned) as f64 * top_share) as u64,
                connected: (delayed as f64 * top_share) as u64,
                ..Default::default()
            },
            share: top_share,
            last_seen_seconds_ago: 1.0,
        }]),
        ..Default::default()
    });
    l
}

fn of_kind(found: Vec<Finding>, kind: &str) -> Vec<Finding> {
    found
        .into_iter()
        .filter(|f| f.kind.name() == kind)
        .collect()
}

#[test]
fn syn_flood_when_dropped_attempts_almost_never_connect_with_a_rule_for_a_concentrated_source() {
    // 2 of 202 resolved attempts connected: 1%.
    let l = dropped_by(400, 2, 200, 0.8);
    let found = diagnose(&snapshot(vec![l], vec![namespace(NETNS, 4096)]));
    let [f] = &of_kind(found, "syn_flood")[..] else {
        panic!("one syn_flood finding")
    };
    assert_eq!(f.severity, Severity::Critical);
    assert_eq!(
        f.summary,
        "400 SYNs dropped on 0.0.0.0:80, 1.0% of the dropped attempts ever connected: a \
         flood, not clients"
    );
    assert_eq!(
        f.evidence,
        [
            "of 202 connection attempts with a dropped segment that are resolved, 2 connected \
             on a retry (1.0%) and 200 never did",
            "sources since backlogd began counting: 3 prefixes, the largest 192.0.2.0/24 80% \
             of the drops and cookies",
            "dropped attempts that connected on a retry, by prefix since backlogd began \
             counting: 192.0.2.0/24 1 of 161",
            "net.ipv4.tcp_syncookies = 1",
        ]
    );
    assert!(
        f.remedy
            .contains("`nft add rule inet filter input ip saddr 192.0.2.0/24 tcp dport 80 drop`"),
        "{}",
        f.remedy
    );
    // Spread sources: no per-prefix rule.
    let spread = diagnose(&snapshot(vec![dropped_by(400, 2, 200, 0.1)], vec![]));
    let [f] = &of_kind(spread, "syn_flood")[..] else {
        panic!("one syn_flood finding")
    };
    assert!(!f.remedy.contains("nft add rule"), "{}", f.remedy);
    assert!(f.remedy.contains("spread"), "{}", f.remedy);
    // Withheld from this reader: concentrated still, without the address.
    let mut l = dropped_by(400, 2, 200, 0.8);
    if let Some(d) = &mut l.drop_sources {
        d.withhold();
    }
    let withheld = diagnose(&snapshot(vec![l], vec![]));
    let [f] = &of_kind(withheld, "syn_flood")[..] else {
        panic!("one syn_flood finding")
    };
    assert!(
        f.remedy.starts_with("80% comes from one prefix (withheld")
            && !f.remedy.contains("192.0.2"),
        "{}",
        f.remedy
    );
}

#[test]
fn connection_burst_when_most_dropped_attempts_connect_on_a_retry_sized_from_the_figures() {
    let l = dropped_by(120, 90, 10, 0.3);
    let found = diagnose(&snapshot(vec![l], vec![]));
    assert!(of_kind(found.clone(), "syn_flood").is_empty());
    let [f] = &of_kind(found, "connection_burst")[..] else {
        panic!("one connection_burst finding")
    };
    assert_eq!(f.severity, Severity::Warning);
    assert_eq!(
        f.summary,
        "120 drops over 3 prefixes on 0.0.0.0:80, 90% of the dropped attempts connected on \
         a retry: a burst of real clients"
    );
    assert!(
        f.remedy
            .contains("a backlog up to 90 larger than the one they met"),
        "{}",
        f.remedy
    );
}

#[test]
fn no_rule_drops_a_concentrated_prefix_whose_own_attempts_connect() {
    // The listener's attempts almost never connect (a flood), but the largest prefix's
    // do: the flood is elsewhere (spread, spoofed), and that prefix is real clients.
    let mut l = dropped_by(400, 2, 200, 0.8);
    if let Some(top) = l.drop_sources.as_mut().and_then(|d| d.top.as_mut()) {
        top[0].counts.connected = 100;
    }
    let found = diagnose(&snapshot(vec![l], vec![namespace(NETNS, 4096)]));
    let [f] = &of_kind(found, "syn_flood")[..] else {
        panic!("one syn_flood finding")
    };
    assert!(!f.remedy.contains("nft add rule"), "{}", f.remedy);
    assert!(
        f.remedy.starts_with(
            "80% comes from 192.0.2.0/24, but 100 of its 161 dropped attempts connected on a \
             retry: real clients, not to be dropped by a rule; "
        ),
        "{}",
        f.remedy
    );
    // A reader the addresses are withheld from is told the same, without the address.
    let mut l = dropped_by(400, 2, 200, 0.8);
    if let Some(d) = l.drop_sources.as_mut() {
        if let Some(top) = d.top.as_mut() {
            top[0].counts.connected = 100;
        }
        d.withhold();
    }
    let found = diagnose(&snapshot(vec![l], vec![namespace(NETNS, 4096)]));
    let [f] = &of_kind(found, "syn_flood")[..] else {
        panic!("one syn_flood finding")
    };
    assert!(
        f.remedy.starts_with("80% comes from one prefix (withheld from readers not on the host), but its own dropped attempts connect")
            && !f.remedy.contains("nft rule"),
        "{}",
        f.remedy
    );
}

#[test]
fn a_flood_is_described_by_its_last_five_minutes_when_they_have_sources() {
    // Since start 192.0.2.0/24 held 80%; in the window another prefix holds 90%, and
    // prefixes of an earlier flood expired.
    let mut l = dropped_by(400, 2, 200, 0.8);
    if let Some(d) = &mut l.drop_sources {
        d.expired.syn_drops = 50;
        d.recent = Some(Box::new(crate::sources::DropSources {
            prefixes: 2,
            top_share: 0.9,
            top: Some(vec![crate::sources::Source {
                prefix: "198.51.100.0/24".into(),
                counts: crate::sources::Counts {
                    syn_drops: 90,
                    ..Default::default()
                },
                share: 0.9,
                last_seen_seconds_ago: 1.0,
            }]),
            ..Default::default()
        }));
    }
    let found = diagnose(&snapshot(vec![l], vec![namespace(NETNS, 4096)]));
    let [f] = &of_kind(found, "syn_flood")[..] else {
        panic!("one syn_flood finding")
    };
    assert_eq!(
        f.summary,
        "450 SYNs dropped on 0.0.0.0:80, 1.0% of the dropped attempts ever connected: a \
         flood, not clients"
    );
    assert_eq!(
        f.evidence[1],
        "sources in the last 5 min: 2 prefixes, the largest 198.51.100.0/24 90% of the drops \
         and cookies"
    );
    assert!(
        f.remedy
            .contains("ip saddr 198.51.100.0/24 tcp dport 80 drop"),
        "{}",
        f.remedy
    );
}

#[test]
fn neither_verdict_on_too_few_resolved_attempts_or_a_mix() {
    for (delayed, abandoned) in [(2, 10), (30, 70), (0, 0)] {
        let found = diagnose(&snapshot(
            vec![dropped_by(200, delayed, abandoned, 0.9)],
            vec![],
        ));
        assert!(
            of_kind(found.clone(), "syn_flood").is_empty()
                && of_kind(found, "connection_burst").is_empty(),
            "{delayed} delayed, {abandoned} abandoned"
        );
    }
}

/// A listener that answered `mine` SYNs with a syncookie in the window, and a snapshot
/// whose namespace sent `sent` and got back `returned` in it (tcp_syncookies `setting`),
/// over a window of five minutes.
fn cookies(mine: u64, sent: u64, returned: u64, setting: u32) -> Snapshot {
    let mut l = listener(1, 443, "app", Some(16), 16);
    l.syncookies_sent = mine + 5;
    l.queues = queues(0, 0, 16);
    let counts = crate::sources::Counts {
        cookies: mine,
        ..Default::default()
    };
    l.drop_sources = Some(crate::sources::DropSources {
        prefixes: 1,
        counted: crate::sources::Counts {
            cookies: mine + 5,
            ..Default::default()
        },
        recent: Some(Box::new(crate::sources::DropSources {
            prefixes: 1,
            counted: counts,
            ..Default::default()
        })),
        ..Default::default()
    });
    let mut ns = namespace(NETNS, 4096);
    ns.sysctls.tcp_syncookies = setting;
    ns.syncookies = Some(crate::api::Syncookies { sent, returned });
    let mut s = snapshot(vec![l], vec![ns]);
    s.impact_window = Some(ImpactWindow {
        window_seconds: 305.0,
        since_start: false,
    });
    s
}

#[test]
fn syncookies_that_almost_never_come_back_are_a_flood_the_cookies_absorb() {
    // 1 of 400 came back: 0.25%.
    let f = only(diagnose(&cookies(400, 400, 1, 1)), "syncookies_sent");
    assert_eq!(f.severity, Severity::Warning);
    assert_eq!(
        f.summary,
        "SYNs to 0.0.0.0:443 are answered with syncookies, and almost none come back: a SYN \
         flood, which the cookies absorb"
    );
    assert_eq!(
        f.evidence[1],
        "in the last 5 min: 400 SYNs to it answered with a syncookie, 400 in its network \
         namespace; 1 of the namespace's cookies came back (TcpExt SyncookiesRecv: \
         connections a cookie completed), 0.2%"
    );
    assert!(
        f.remedy.contains("a larger backlog only feeds the flood"),
        "{}",
        f.remedy
    );
}

#[test]
fn syncookies_that_come_back_are_clients_the_syn_queue_is_too_small_for() {
    let f = only(diagnose(&cookies(30, 30, 30, 1)), "syncookies_sent");
    assert_eq!(
        f.summary,
        "the SYN queue of 0.0.0.0:443 is too small for its clients: the kernel answers them \
         with syncookies, and they return them"
    );
    assert!(f.remedy.contains("granted backlog, 16"), "{}", f.remedy);
    // Forced cookies: the queue is not the cause.
    let f = only(diagnose(&cookies(30, 30, 30, 2)), "syncookies_sent");
    assert_eq!(
        f.summary,
        "SYNs to 0.0.0.0:443 are answered with syncookies because they are forced, and the \
         clients return them: real clients"
    );
    assert_eq!(
        f.evidence.last().map(String::as_str),
        Some(
            "net.ipv4.tcp_syncookies = 2: every SYN is answered with a cookie, whatever the \
             SYN queue holds"
        )
    );
}

#[test]
fn syncookies_give_no_verdict_when_too_few_a_mix_or_mostly_another_listeners() {
    let generic = "the kernel answers SYNs to 0.0.0.0:443 with syncookies";
    // Too few to judge.
    assert_eq!(
        only(diagnose(&cookies(19, 19, 0, 1)), "syncookies_sent").summary,
        generic
    );
    // A mix: 20% came back.
    assert_eq!(
        only(diagnose(&cookies(100, 100, 20, 1)), "syncookies_sent").summary,
        generic
    );
    // The namespace's cookies are mostly another listener's: its share is not this one's.
    let f = only(diagnose(&cookies(50, 400, 0, 1)), "syncookies_sent");
    assert_eq!(f.summary, generic);
    assert_eq!(
        f.evidence[2],
        "other listeners of the namespace sent cookies too: the share that came back is the \
         namespace's, not this listener's own"
    );
    // From the 90% boundary on, its own.
    assert_ne!(
        only(diagnose(&cookies(360, 400, 0, 1)), "syncookies_sent").summary,
        generic
    );
}
