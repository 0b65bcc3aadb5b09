//! Connection-burst scenarios as data (`tests/scenarios/*.toml`), replayed with real
//! handshakes in a fresh network namespace and compared three ways: what the clients saw,
//! what the kernel counted, what backlogd exported. Adding a scenario is adding a file.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    fmt::Write as _,
    path::Path,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use serde::Deserialize;
use socket2::Socket;

use backlogd_common::netstat::counter;

use crate::{
    Daemon, Netns, Scrape,
    kernel::{ListenCounters, tcp_ext},
    prom::DROP_REASONS,
    sockets::{
        KernelQueue, Listener, connect_each, created_window, kernel_queue, local_port,
        pending_request_peers, reset_close, tcp_state,
    },
};

/// The client-impact horizon the scenario suite runs its daemon with (seconds): longer
/// than any scenario's first drop to its clients' close (checked), short enough to wait
/// for at the end of each scenario.
pub const HORIZON_SECONDS: u64 = 5;

/// The daemon arguments a scenario run needs.
pub fn daemon_args() -> [String; 2] {
    [
        "--client-impact-horizon".to_owned(),
        HORIZON_SECONDS.to_string(),
    ]
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    pub description: String,
    /// Namespace sysctls, e.g. `"net.core.somaxconn" = 128`.
    #[serde(default)]
    pub sysctl: BTreeMap<String, toml::Value>,
    pub listener: ListenerSpec,
    #[serde(default)]
    pub burst: Vec<Burst>,
    /// How long clients keep retrying after the last burst before they give up (ms).
    #[serde(default = "default_hold_ms")]
    pub hold_ms: u64,
    /// What the scenario must provoke, so that it cannot silently test nothing.
    #[serde(default)]
    pub expect: Expect,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListenerSpec {
    #[serde(default = "default_address")]
    pub address: String,
    pub backlog: i32,
    /// Sockets in the SO_REUSEPORT group (1: a plain listener).
    #[serde(default = "one")]
    pub reuseport: usize,
    /// `never`, `fast` (as fast as possible) or `rate` (`accept_per_second` per member).
    #[serde(default = "default_accept")]
    pub accept: String,
    #[serde(default)]
    pub accept_per_second: u32,
    /// Group members that never accept (a stalled worker).
    #[serde(default)]
    pub stalled: Vec<usize>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Burst {
    pub connections: usize,
    /// Pacing; absent: all at once.
    pub per_second: Option<u32>,
    #[serde(default = "one")]
    pub repeats: usize,
    #[serde(default)]
    pub pause_ms: u64,
    /// The clients never see SYN-ACKs (the sources of a SYN flood).
    #[serde(default)]
    pub drop_synack: bool,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Expect {
    /// Minimum drops per reason (the scenario's purpose, not the evidence: the evidence is
    /// equality with the kernel).
    #[serde(default)]
    pub min_drops: BTreeMap<String, u64>,
    #[serde(default)]
    pub min_syncookies: u64,
    /// At most this many drops of any reason (e.g. 0 after the fix).
    pub max_drops: Option<u64>,
    /// backlog granted per socket.
    pub granted: Option<u64>,
}

fn default_hold_ms() -> u64 {
    1500
}
fn default_address() -> String {
    "127.0.0.1".into()
}
fn default_accept() -> String {
    "never".into()
}
fn one() -> usize {
    1
}

impl Scenario {
    pub fn load(path: &Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let s: Scenario = toml::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        if !["never", "fast", "rate"].contains(&s.listener.accept.as_str()) {
            return Err(format!(
                "{}: listener.accept must be never, fast or rate",
                path.display()
            ));
        }
        Ok(s)
    }
}

/// What the clients saw.
#[derive(Debug, Default)]
pub struct Clients {
    pub connections: u64,
    pub completed: u64,
    pub refused: u64,
    pub pending: u64,
    pub syns_sent: u64,
}

/// Runs a scenario against `daemon`; returns the printed table, or the table and the
/// mismatches.
pub fn run(name: &str, s: &Scenario, daemon: &Daemon) -> Result<String, String> {
    let ns = Netns::new();
    for (k, v) in &s.sysctl {
        let v = match v {
            toml::Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        ns.sysctl(k, &v);
    }
    let bind = if s.listener.address.contains(':') {
        format!("[{}]:0", s.listener.address)
    } else {
        format!("{}:0", s.listener.address)
    };
    let mut members = vec![if s.listener.reuseport > 1 {
        Listener::open_reuseport(&ns, &bind, s.listener.backlog)
    } else {
        Listener::open(&ns, &bind, s.listener.backlog)
    }];
    let group_addr = members[0].addr.to_string();
    for _ in 1..s.listener.reuseport {
        members.push(Listener::open_reuseport(
            &ns,
            &group_addr,
            s.listener.backlog,
        ));
    }
    for m in &members {
        daemon.wait_for_listener(m.inode);
    }

    let stop = Arc::new(AtomicBool::new(false));
    let accepted: Arc<Mutex<Vec<Accepted>>> = Arc::default();
    let workers: Vec<_> = members
        .iter()
        .enumerate()
        .filter(|(i, _)| s.listener.accept != "never" && !s.listener.stalled.contains(i))
        .map(|(_, m)| {
            let socket = m.socket.try_clone().expect("dup listener");
            accept_loop(socket, &s.listener, stop.clone(), accepted.clone())
        })
        .collect();

    if s.burst.iter().any(|b| b.drop_synack) {
        ns.drop_incoming("syn|ack");
    }
    let before = tcp_ext(&ns);
    let target = members[0].addr;
    let mut sockets: Vec<Socket> = Vec::new();
    // Each client's connect() call: when it began and returned, by local port.
    let mut windows: HashMap<u16, (Instant, Instant)> = HashMap::new();
    let mut connect = |n: usize| {
        for c in connect_each(&ns, target, n) {
            windows.insert(local_port(&c.socket), (c.called, c.returned));
            sockets.push(c.socket);
        }
    };
    let first_connect = Instant::now();
    for b in &s.burst {
        for r in 0..b.repeats {
            match b.per_second {
                None => connect(b.connections),
                Some(rate) => {
                    // Chunks every 10 ms.
                    let chunk = (rate as usize / 100).max(1);
                    let mut left = b.connections;
                    while left > 0 {
                        let n = chunk.min(left);
                        connect(n);
                        left -= n;
                        std::thread::sleep(Duration::from_millis(10));
                    }
                }
            }
            if r + 1 < b.repeats {
                std::thread::sleep(Duration::from_millis(b.pause_ms));
            }
        }
    }
    std::thread::sleep(Duration::from_millis(s.hold_ms));
    // No SYN reaches the listener from now on: the clients' states taken here stay true.
    ns.drop_incoming_to("syn", &target.port().to_string());
    let clients = client_outcomes(&sockets);
    let views: Vec<ClientRecord> = sockets
        .iter()
        .map(|c| {
            let (state, retrans) = tcp_state(c);
            let port = local_port(c);
            ClientRecord {
                port,
                state,
                retrans,
                connect: windows[&port],
            }
        })
        .collect();
    let requests = pending_request_peers(&ns, target.port());
    // A RST, not a FIN: a client whose final ACK was dropped would otherwise complete
    // its handshake later with the FIN, after the clients' truth is taken.
    sockets.into_iter().for_each(reset_close);
    let closed = Instant::now();
    std::thread::sleep(Duration::from_millis(100));
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.join().expect("accept worker");
    }
    let kernel = ListenCounters::delta(&before, &tcp_ext(&ns));
    let queues: Vec<KernelQueue> = members.iter().map(|m| kernel_queue(&ns, m)).collect();
    // The accept queues' lengths now are a scan pass's: one after the workers stopped.
    let scrape = daemon.scrape_after(Instant::now());
    let by_app = accepted.lock().unwrap().len() as u64;

    // Client impact: every connection the kernel queued is accepted (the workers', then
    // what is left on the queues), and every attempt with a drop is resolved by the
    // daemon (completed, or past the horizon) before the figures are read.
    let span = closed - first_connect;
    assert!(
        span < Duration::from_secs(HORIZON_SECONDS) - Duration::from_millis(500),
        "scenario {name} ran {span:?} from its first connect() to its clients' close: \
         raise scenario::HORIZON_SECONDS above that, or a completion could be counted \
         abandoned"
    );
    let deadline = Instant::now() + Duration::from_secs(HORIZON_SECONDS + 10);
    let sweeps = |s: &Scrape| s.value("backlogd_client_impact_sweeps_total", &[]);
    let since = sweeps(&scrape).expect("backlogd_client_impact_sweeps_total");
    let after = loop {
        drain(&members, &accepted);
        let scrape = daemon.scrape();
        // A sweep that began after the clients' close found no attempt left.
        if sweeps(&scrape).is_some_and(|n| crate::daemon::began_after(n, since))
            && scrape.value("backlogd_client_impact_tracked", &[]) == Some(0.0)
        {
            // Anything it counted delayed before the attempts ran out is queued by now.
            drain(&members, &accepted);
            break scrape;
        }
        assert!(
            Instant::now() < deadline,
            "scenario {name}: backlogd still tracks attempts {} s after the horizon",
            HORIZON_SECONDS + 10
        );
        std::thread::sleep(Duration::from_millis(250));
    };
    let synack_free = !s.burst.iter().any(|b| b.drop_synack);
    let truth = impact_truth(
        &views,
        &accepted.lock().unwrap(),
        (!synack_free).then_some(&requests),
        &kernel,
    );
    compare(
        name, s, &members, &clients, &kernel, &queues, &scrape, by_app, &truth, &after,
    )
    .map_err(|report| {
        // What the daemon's own client-impact figures and sweeps said, for a mismatch
        // there (the suite runs its daemon with the sweeps' debug lines on).
        let figures: Vec<String> = ["tracked", "sweeps_total", "untracked_total"]
            .iter()
            .map(|f| {
                let name = format!("backlogd_client_impact_{f}");
                format!("{name} {:?}", after.value(&name, &[]))
            })
            .collect();
        let log = daemon.log();
        let sweeps: Vec<&str> = log
            .lines()
            .filter(|l| l.contains("client-impact"))
            .collect();
        format!(
            "{report}  daemon: {} (since {since}); its sweeps that counted:\n    {}\n",
            figures.join(", "),
            sweeps.join("\n    ")
        )
    })
}

/// A connection the server accepted: the client's port, when the kernel created (and
/// queued) it, from the accepted socket's TCP_INFO, and its `tcpi_total_retrans` (its
/// SYN-ACK retransmissions: it sends nothing else).
#[derive(Debug, Clone, Copy)]
struct Accepted {
    port: u16,
    created: (Instant, Instant),
    retrans: u32,
}

/// One client as it stood when the scenario ended (before its close).
struct ClientRecord {
    port: u16,
    state: u8,
    retrans: u32,
    /// When its connect() call began and returned.
    connect: (Instant, Instant),
}

fn accepted_record(socket: &Socket, peer: &socket2::SockAddr) -> Accepted {
    Accepted {
        port: peer.as_socket().map_or(0, |a| a.port()),
        created: created_window(socket),
        retrans: tcp_state(socket).1,
    }
}

/// How much later than its connect() returned the kernel may process a client's first
/// segment (or, for a final ACK, the first SYN-ACK's answer). On loopback both happen
/// inside the connect() call (the softirq runs as the SYN is sent), unless a burst has
/// pushed the softirq work to ksoftirqd on a loaded guest. It only widens a client's
/// bracket downwards: the delay buckets lie at least 0.5 s from every retry time, so a
/// wider bracket leaves a bucket unjudged (counted, with a floor) rather than judged wrong.
const FIRST_SEGMENT_LATENESS: Duration = Duration::from_millis(300);

/// The interval a delayed client's delay (its first dropped segment to its connection
/// being queued) lies in, in seconds: the drop came after its connect() was called and at
/// most [`FIRST_SEGMENT_LATENESS`] after it returned; the queueing is when the kernel
/// created the accepted connection.
fn bracket(c: &ClientRecord, a: &Accepted) -> (f64, f64) {
    let (called, returned) = c.connect;
    let (created_lo, created_hi) = a.created;
    let latest_drop = returned + FIRST_SEGMENT_LATENESS;
    let lo = created_lo
        .saturating_duration_since(latest_drop)
        .as_secs_f64();
    let hi = created_hi.saturating_duration_since(called).as_secs_f64();
    (lo, hi)
}

/// Accepts whatever the members' queues hold.
fn drain(members: &[Listener], accepted: &Mutex<Vec<Accepted>>) {
    for m in members {
        m.socket
            .set_nonblocking(true)
            .expect("non-blocking listener");
        while let Ok((c, peer)) = m.socket.accept() {
            accepted.lock().unwrap().push(accepted_record(&c, &peer));
        }
    }
}

/// What the clients paid, from their side and the server's accepted sockets.
#[derive(Debug, Default)]
pub struct ImpactTruth {
    /// Accepted after at least one SYN retransmission of theirs.
    pub delayed_syn_drop: u64,
    /// Accepted with no SYN retransmission but a retransmitted SYN-ACK (their final ACK
    /// was dropped: on loopback nothing else loses a segment).
    pub delayed_final_ack_overflow: u64,
    /// Never queued although a segment of theirs was dropped.
    pub abandoned: u64,
    /// Per delayed client, the interval its delay (first drop -> queued) lies in, s.
    pub brackets: Vec<(f64, f64)>,
    /// Clients connected on their side but never queued: their RST at close ended a
    /// pending request (each one a listener `sk_drops`).
    pub reset_requests: u64,
    /// Why the truth could not be told, if it could not.
    pub unknown: Option<String>,
}

/// `requests`: with SYN-ACKs dropped, the client ports that had a request pending at the
/// server when the clients closed.
fn impact_truth(
    clients: &[ClientRecord],
    accepted: &[Accepted],
    requests: Option<&HashSet<u16>>,
    kernel: &ListenCounters,
) -> ImpactTruth {
    const SYN_SENT: u8 = 2;
    const CLOSE: u8 = 7;
    let by_port: HashMap<u16, &Accepted> = accepted.iter().map(|a| (a.port, a)).collect();
    let mut t = ImpactTruth::default();
    for c in clients {
        match by_port.get(&c.port) {
            // A retransmitted SYN: its first SYN was dropped (on loopback nothing else
            // loses a segment).
            Some(a) if c.retrans > 0 => {
                t.delayed_syn_drop += 1;
                t.brackets.push(bracket(c, a));
            }
            // No SYN retransmitted but the SYN-ACK was: its final ACK was dropped.
            Some(a) if a.retrans > 0 => {
                t.delayed_final_ack_overflow += 1;
                t.brackets.push(bracket(c, a));
            }
            Some(_) => {}
            None => {
                if c.state != SYN_SENT && c.state != CLOSE {
                    t.reset_requests += 1;
                }
                match requests {
                    None => t.abandoned += 1,
                    // SYN-ACKs never reach the clients: a client with a pending request
                    // had its first SYN taken (its later ones were answered from the
                    // SYN queue); one without had every SYN dropped, unless a syncookie
                    // answered it (no request either).
                    Some(requests) => {
                        if kernel.reqq_full_do_cookies > 0 && kernel.listen_drops > 0 {
                            t.unknown = Some(
                                "SYN-ACKs dropped with both syncookies and drops: which \
                                 clients had a drop cannot be told"
                                    .into(),
                            );
                        } else if kernel.listen_drops > 0
                            && c.state == SYN_SENT
                            && !requests.contains(&c.port)
                        {
                            t.abandoned += 1;
                        }
                    }
                }
            }
        }
    }
    t
}

fn accept_loop(
    socket: Socket,
    spec: &ListenerSpec,
    stop: Arc<AtomicBool>,
    accepted: Arc<Mutex<Vec<Accepted>>>,
) -> std::thread::JoinHandle<()> {
    socket.set_nonblocking(true).expect("non-blocking listener");
    let pause = (spec.accept == "rate")
        .then(|| Duration::from_secs_f64(1.0 / f64::from(spec.accept_per_second.max(1))));
    std::thread::spawn(move || {
        while !stop.load(Ordering::Relaxed) {
            match socket.accept() {
                Ok((c, peer)) => {
                    accepted.lock().unwrap().push(accepted_record(&c, &peer));
                    if let Some(p) = pause {
                        std::thread::sleep(p);
                    }
                }
                Err(_) => std::thread::sleep(Duration::from_micros(200)),
            }
        }
    })
}

/// How many of the 11 delay buckets a scenario may leave unjudged: each client's bracket
/// is narrower than the 1 s between two bounds, and its delays cluster at one or two
/// retry times.
const MAX_UNJUDGED_BUCKETS: usize = 2;

const TCP_SYN_SENT: u8 = 2;
const TCP_CLOSE: u8 = 7;

/// Client impact, from the scrape taken once every attempt was resolved: delayed by
/// cause and abandoned exactly; each delay bucket whose bound lies outside every delayed
/// client's bracket exactly (the others cannot be told from the clients' side).
/// Rows of (label, the clients' truth, backlogd), and the mismatches.
type ImpactRows = (Vec<(String, Option<u64>, Option<u64>)>, Vec<String>);

fn impact_rows(members: &[Listener], truth: &ImpactTruth, after: &Scrape) -> ImpactRows {
    let (mut rows, mut bad) = (Vec::new(), Vec::new());
    if let Some(why) = &truth.unknown {
        bad.push(format!("client impact: {why}"));
        return (rows, bad);
    }
    let mut row = |label: String, client: u64, ours: u64| {
        if client != ours {
            bad.push(format!(
                "{}: clients {client}, backlogd {ours}",
                label.trim()
            ));
        }
        rows.push((label, Some(client), Some(ours)));
    };
    // Served only for listeners that dropped something: absent is zero only then.
    let value = |metric: &str, extra: &[(&str, &str)]| -> u64 {
        members
            .iter()
            .map(|m| {
                let inode = m.inode.to_string();
                let mut labels = vec![("socket", inode.as_str())];
                labels.extend_from_slice(extra);
                after.value(metric, &labels).map_or_else(
                    || {
                        let dropped: f64 = DROP_REASONS
                            .iter()
                            .filter_map(|r| {
                                after.value(
                                    "backlogd_listen_drops_total",
                                    &[("socket", inode.as_str()), ("reason", r)],
                                )
                            })
                            .sum();
                        assert!(
                            dropped == 0.0,
                            "no {metric} {labels:?} for a listener with drops"
                        );
                        0
                    },
                    |v| v as u64,
                )
            })
            .sum()
    };
    let delayed = "backlogd_listen_connections_delayed_total";
    row(
        "delayed after a SYN drop".into(),
        truth.delayed_syn_drop,
        value(delayed, &[("cause", "syn_drop")]),
    );
    row(
        "delayed after a final-ACK drop".into(),
        truth.delayed_final_ack_overflow,
        value(delayed, &[("cause", "final_ack_overflow")]),
    );
    row(
        "abandoned after a drop".into(),
        truth.abandoned,
        value("backlogd_listen_connections_abandoned_total", &[]),
    );
    // An SO_REUSEPORT group's sums: the same clients, whichever member took each.
    if members.len() > 1 {
        let inode = members[0].inode.to_string();
        let netns = after
            .find("backlogd_listen_syns_received_total", &[("socket", &inode)])
            .first()
            .map(|s| s.labels["netns"].clone())
            .expect("the first member's series");
        let port = members[0].addr.port().to_string();
        let group = |metric: &str, extra: &[(&str, &str)]| -> u64 {
            let mut labels = vec![("netns", netns.as_str()), ("port", port.as_str())];
            labels.extend_from_slice(extra);
            after
                .value(metric, &labels)
                .unwrap_or_else(|| panic!("no {metric} {labels:?}")) as u64
        };
        let delayed = "backlogd_listen_group_connections_delayed_total";
        row(
            "group: delayed, SYN drop".into(),
            truth.delayed_syn_drop,
            group(delayed, &[("cause", "syn_drop")]),
        );
        row(
            "group: delayed, final-ACK drop".into(),
            truth.delayed_final_ack_overflow,
            group(delayed, &[("cause", "final_ack_overflow")]),
        );
        row(
            "group: abandoned".into(),
            truth.abandoned,
            group("backlogd_listen_group_connections_abandoned_total", &[]),
        );
    }
    let histogram = "backlogd_listen_connection_delay_seconds_bucket";
    let mut unchecked = Vec::new();
    for le in [
        "0.5", "1.5", "2.5", "3.5", "5.5", "9", "17", "33", "65", "135", "+Inf",
    ] {
        let bound: f64 = le.parse().unwrap_or(f64::INFINITY);
        if truth
            .brackets
            .iter()
            .any(|&(lo, hi)| lo < bound && bound <= hi)
        {
            unchecked.push(le);
            continue;
        }
        let below = truth.brackets.iter().filter(|&&(_, hi)| hi < bound).count() as u64;
        row(
            format!("  delayed < {le} s"),
            below,
            value(histogram, &[("le", le)]),
        );
    }
    if !unchecked.is_empty() {
        rows.push((
            format!("  delay buckets {} not checked", unchecked.join(", ")),
            None,
            None,
        ));
    }
    // A bracket holds a bound only when a delay lies within its width of a bucket bound,
    // and the bounds lie at least 0.5 s from every retry time: a run that could judge
    // fewer buckets than this says so instead of passing on what is left.
    if unchecked.len() > MAX_UNJUDGED_BUCKETS {
        bad.push(format!(
            "only {} of 11 delay buckets could be judged (unjudged: {}; at most \
             {MAX_UNJUDGED_BUCKETS} may be): the clients' brackets are too wide",
            11 - unchecked.len(),
            unchecked.join(", ")
        ));
    }
    if after
        .value("backlogd_client_impact_untracked_total", &[])
        .is_none_or(|v| v > 0.0)
    {
        bad.push("attempts went untracked (the map was full), or the count is missing".into());
    }
    (rows, bad)
}

fn client_outcomes(sockets: &[Socket]) -> Clients {
    let mut c = Clients {
        connections: sockets.len() as u64,
        ..Clients::default()
    };
    for s in sockets {
        let (state, retrans) = crate::sockets::tcp_state(s);
        c.syns_sent += 1 + u64::from(retrans);
        match state {
            TCP_SYN_SENT => c.pending += 1, // would have timed out
            TCP_CLOSE => c.refused += 1,    // reset by the server
            // ESTABLISHED, or already closing because the application accepted and
            // closed it.
            _ => c.completed += 1,
        }
    }
    c
}

#[allow(clippy::too_many_arguments)]
fn compare(
    name: &str,
    s: &Scenario,
    members: &[Listener],
    clients: &Clients,
    kernel: &ListenCounters,
    queues: &[KernelQueue],
    scrape: &Scrape,
    accepted: u64,
    truth: &ImpactTruth,
    after: &Scrape,
) -> Result<String, String> {
    let mut bad = Vec::new();
    let mut table = String::new();
    let get = |metric: &str, m: &Listener, extra: &[(&str, &str)]| -> u64 {
        let inode = m.inode.to_string();
        let mut labels = vec![("socket", inode.as_str())];
        labels.extend_from_slice(extra);
        // A missing series is a defect, not a zero.
        scrape
            .value(metric, &labels)
            .unwrap_or_else(|| panic!("scenario {name}: no {metric} {labels:?}")) as u64
    };
    let sum = |metric: &str, extra: &[(&str, &str)]| -> u64 {
        members.iter().map(|m| get(metric, m, extra)).sum()
    };
    let drops = |reason: &str| sum("backlogd_listen_drops_total", &[("reason", reason)]);
    let all_drops: u64 = DROP_REASONS.iter().map(|r| drops(r)).sum();

    let synack_free = !s.burst.iter().any(|b| b.drop_synack);
    // Each reason from the kernel's own figures, so the per-reason rows and the
    // scenario's expectations are judged against the kernel, not against backlogd.
    let by_reason = match kernel_reasons(kernel, queues, truth, synack_free) {
        Ok(r) => Some(r),
        Err(why) => {
            bad.push(format!(
                "the kernel's drops by reason cannot be told: {why}"
            ));
            None
        }
    };
    let _ = writeln!(table, "scenario {name}: {}", s.description);
    let _ = writeln!(
        table,
        "  {:<34}{:>10}{:>10}{:>10}",
        "", "clients", "kernel", "backlogd"
    );
    let mut row = |label: &str, client: Option<u64>, k: Option<u64>, ours: Option<u64>| {
        let f = |v: Option<u64>| v.map_or(String::new(), |v| v.to_string());
        let _ = writeln!(
            table,
            "  {label:<34}{:>10}{:>10}{:>10}",
            f(client),
            f(k),
            f(ours)
        );
        if let (Some(k), Some(o)) = (k, ours)
            && k != o
        {
            bad.push(format!("{label}: kernel {k}, backlogd {o}"));
        }
    };
    row("connections", Some(clients.connections), None, None);
    row("  completed", Some(clients.completed), None, None);
    row("  refused (reset)", Some(clients.refused), None, None);
    row(
        "  pending when abandoned",
        Some(clients.pending),
        None,
        None,
    );
    // The "kernel" column of this row is the application's own count of the accept()
    // calls that returned a connection (its workers stopped before the scrape).
    row(
        "accepted by the application",
        None,
        Some(accepted),
        Some(sum("backlogd_listen_accepted_total", &[])),
    );
    row(
        "SYNs sent / received",
        Some(clients.syns_sent),
        Some(clients.syns_sent),
        Some(sum("backlogd_listen_syns_received_total", &[])),
    );
    row(
        counter::LISTEN_OVERFLOWS,
        None,
        Some(kernel.listen_overflows),
        Some(drops("accept_queue_full") + drops("final_ack_overflow")),
    );
    row(
        counter::LISTEN_DROPS,
        None,
        Some(kernel.listen_drops),
        Some(all_drops),
    );
    row(
        counter::REQQ_FULL_DROP,
        None,
        Some(kernel.reqq_full_drop),
        Some(drops("syn_queue_full")),
    );
    row(
        counter::REQQ_FULL_DO_COOKIES,
        None,
        Some(kernel.reqq_full_do_cookies),
        Some(sum("backlogd_listen_syncookies_sent_total", &[])),
    );
    for (i, reason) in DROP_REASONS.iter().enumerate() {
        row(
            &format!("  drops: {reason}"),
            None,
            by_reason.map(|r| r[i]),
            Some(drops(reason)),
        );
    }
    // Kernel and ours, summed over the group where sk_drops is compared per group.
    let mut group_sk_drops = (0, 0);
    for (i, (m, q)) in members.iter().zip(queues).enumerate() {
        let tag = format!("socket {i} (ino {})", m.inode);
        // The "kernel" column here is the argument the scenario passed to listen().
        row(
            &format!("{tag} requested"),
            None,
            Some(u64::try_from(s.listener.backlog).unwrap_or(0)),
            Some(get("backlogd_listen_backlog_requested", m, &[])),
        );
        row(
            &format!("{tag} granted"),
            None,
            Some(q.send_q),
            Some(get("backlogd_listen_backlog_granted", m, &[])),
        );
        row(
            &format!("{tag} accept queue"),
            None,
            Some(q.recv_q),
            Some(get("backlogd_listen_accept_queue_length", m, &[])),
        );
        if synack_free {
            // sk_drops counts a final-ACK overflow twice (docs/metrics.md); with SYN-ACKs
            // lost it also counts retransmitted SYNs answered from the SYN queue.
            // The clients' RSTs that ended pending requests are sk_drops too: added
            // per listener when there is one, else to the group's sum (which member held
            // a request cannot be told).
            let resets = if members.len() == 1 {
                truth.reset_requests
            } else {
                0
            };
            let ours: u64 = DROP_REASONS
                .iter()
                .map(|r| get("backlogd_listen_drops_total", m, &[("reason", r)]))
                .sum::<u64>()
                + get(
                    "backlogd_listen_drops_total",
                    m,
                    &[("reason", "final_ack_overflow")],
                )
                + resets;
            if members.len() == 1 || truth.reset_requests == 0 {
                row(&format!("{tag} sk_drops"), None, Some(q.drops), Some(ours));
            } else {
                group_sk_drops.0 += q.drops;
                group_sk_drops.1 += ours;
            }
        }
    }
    if group_sk_drops != (0, 0) {
        row(
            "group sk_drops (with the clients' RSTs)",
            None,
            Some(group_sk_drops.0),
            Some(group_sk_drops.1 + truth.reset_requests),
        );
    }
    let (impact, impact_bad) = impact_rows(members, truth, after);
    for (label, client, ours) in impact {
        row(&label, client, None, ours);
    }

    // The scenario must have provoked what it is about, by the kernel's count.
    for (reason, min) in &s.expect.min_drops {
        let Some(i) = DROP_REASONS.iter().position(|r| r == reason) else {
            bad.push(format!("expect.min_drops: no drop reason {reason:?}"));
            continue;
        };
        let kernels = by_reason.map_or(0, |r| r[i]);
        if kernels < *min {
            bad.push(format!(
                "expected at least {min} {reason} drops, the kernel counted {kernels}"
            ));
        }
    }
    if let Some(max) = s.expect.max_drops
        && kernel.listen_drops > max
    {
        bad.push(format!(
            "expected at most {max} drops, the kernel counted {}",
            kernel.listen_drops
        ));
    }
    if kernel.reqq_full_do_cookies < s.expect.min_syncookies {
        bad.push(format!(
            "expected at least {} syncookies",
            s.expect.min_syncookies
        ));
    }
    if let Some(g) = s.expect.granted
        && queues.iter().any(|q| q.send_q != g)
    {
        bad.push(format!("expected granted backlog {g}"));
    }
    bad.extend(impact_bad);
    let _ = writeln!(
        table,
        "  result: {}",
        if bad.is_empty() { "ok" } else { "MISMATCH" }
    );
    if bad.is_empty() {
        Ok(table)
    } else {
        Err(format!("{table}  {}\n", bad.join("\n  ")))
    }
}

/// The namespace's drops by backlogd's reasons (accept queue full, SYN queue full, final-ACK
/// overflow, other), from the kernel's counters alone: TcpExt splits ListenOverflows from
/// TCPReqQFullDrop and the rest of ListenDrops, but not a SYN-time overflow from a
/// final-ACK one. The listeners' `sk_drops` do: each final-ACK overflow adds 2 there
/// (docs/metrics.md), every other drop 1, a client's RST ending a pending request 1. With
/// SYN-ACKs dropped by the scenario's nft rule no client ever sends a final ACK, so none
/// overflows; `sk_drops` then also counts retransmitted SYNs answered from the SYN queue,
/// and is not needed.
fn kernel_reasons(
    kernel: &ListenCounters,
    queues: &[KernelQueue],
    truth: &ImpactTruth,
    synack_free: bool,
) -> Result<[u64; 4], String> {
    let final_ack = if synack_free {
        let sk_drops: u64 = queues.iter().map(|q| q.drops).sum();
        sk_drops
            .checked_sub(kernel.listen_drops + truth.reset_requests)
            .ok_or_else(|| {
                format!(
                    "sk_drops {sk_drops} < ListenDrops {} + {} reset requests",
                    kernel.listen_drops, truth.reset_requests
                )
            })?
    } else {
        0
    };
    let accept_queue_full = kernel
        .listen_overflows
        .checked_sub(final_ack)
        .ok_or_else(|| {
            format!(
                "ListenOverflows {} < final-ACK overflows {final_ack} (from sk_drops)",
                kernel.listen_overflows
            )
        })?;
    let other = kernel
        .listen_drops
        .checked_sub(kernel.listen_overflows + kernel.reqq_full_drop)
        .ok_or_else(|| format!("ListenDrops < ListenOverflows + TCPReqQFullDrop: {kernel:?}"))?;
    Ok([accept_queue_full, kernel.reqq_full_drop, final_ack, other])
}
