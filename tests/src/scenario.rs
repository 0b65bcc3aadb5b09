//! Connection-burst scenarios as data (`tests/scenarios/*.toml`), replayed with real
//! handshakes in a fresh network namespace and compared three ways: what the clients saw,
//! what the kernel counted, what backlogd exported. Adding a scenario is adding a file.

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    path::Path,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::Duration,
};

use serde::Deserialize;
use socket2::Socket;

use crate::{
    Daemon, Netns, Scrape,
    kernel::{ListenCounters, tcp_ext},
    prom::DROP_REASONS,
    sockets::{KernelQueue, Listener, connect_burst, kernel_queue},
};

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
    let accepted = Arc::new(AtomicU64::new(0));
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
    for b in &s.burst {
        for r in 0..b.repeats {
            match b.per_second {
                None => sockets.extend(connect_burst(&ns, target, b.connections)),
                Some(rate) => {
                    // Chunks every 10 ms.
                    let chunk = (rate as usize / 100).max(1);
                    let mut left = b.connections;
                    while left > 0 {
                        let n = chunk.min(left);
                        sockets.extend(connect_burst(&ns, target, n));
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
    let clients = client_outcomes(&sockets);
    drop(sockets);
    std::thread::sleep(Duration::from_millis(100));
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.join().expect("accept worker");
    }
    let kernel = ListenCounters::delta(&before, &tcp_ext(&ns));
    let queues: Vec<KernelQueue> = members.iter().map(|m| kernel_queue(&ns, m)).collect();
    let scrape = daemon.scrape();
    compare(
        name,
        s,
        &members,
        &clients,
        &kernel,
        &queues,
        &scrape,
        accepted.load(Ordering::Relaxed),
    )
}

fn accept_loop(
    socket: Socket,
    spec: &ListenerSpec,
    stop: Arc<AtomicBool>,
    accepted: Arc<AtomicU64>,
) -> std::thread::JoinHandle<()> {
    socket.set_nonblocking(true).expect("non-blocking listener");
    let pause = (spec.accept == "rate")
        .then(|| Duration::from_secs_f64(1.0 / f64::from(spec.accept_per_second.max(1))));
    std::thread::spawn(move || {
        while !stop.load(Ordering::Relaxed) {
            match socket.accept() {
                Ok(_) => {
                    accepted.fetch_add(1, Ordering::Relaxed);
                    if let Some(p) = pause {
                        std::thread::sleep(p);
                    }
                }
                Err(_) => std::thread::sleep(Duration::from_micros(200)),
            }
        }
    })
}

const TCP_SYN_SENT: u8 = 2;
const TCP_CLOSE: u8 = 7;

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
    row(
        "accepted by the application",
        Some(accepted),
        None,
        Some(sum("backlogd_listen_accepted_total", &[])),
    );
    row(
        "SYNs sent / received",
        Some(clients.syns_sent),
        Some(clients.syns_sent),
        Some(sum("backlogd_listen_syns_received_total", &[])),
    );
    row(
        "ListenOverflows",
        None,
        Some(kernel.listen_overflows),
        Some(drops("accept_queue_full") + drops("final_ack_overflow")),
    );
    row(
        "ListenDrops",
        None,
        Some(kernel.listen_drops),
        Some(all_drops),
    );
    row(
        "TCPReqQFullDrop",
        None,
        Some(kernel.reqq_full_drop),
        Some(drops("syn_queue_full")),
    );
    row(
        "TCPReqQFullDoCookies",
        None,
        Some(kernel.reqq_full_do_cookies),
        Some(sum("backlogd_listen_syncookies_sent_total", &[])),
    );
    for reason in DROP_REASONS {
        row(
            &format!("  drops: {reason}"),
            None,
            None,
            Some(drops(reason)),
        );
    }
    let synack_free = !s.burst.iter().any(|b| b.drop_synack);
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
            let ours: u64 = DROP_REASONS
                .iter()
                .map(|r| get("backlogd_listen_drops_total", m, &[("reason", r)]))
                .sum::<u64>()
                + get(
                    "backlogd_listen_drops_total",
                    m,
                    &[("reason", "final_ack_overflow")],
                );
            row(&format!("{tag} sk_drops"), None, Some(q.drops), Some(ours));
        }
    }
    // The scenario must have provoked what it is about.
    for (reason, min) in &s.expect.min_drops {
        if drops(reason) < *min {
            bad.push(format!(
                "expected at least {min} {reason} drops, got {}",
                drops(reason)
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
