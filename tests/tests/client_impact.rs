//! Client impact (what the drops cost the clients), checked against the clients' own
//! sockets and the server's accepted ones: connections delayed by a drop, by cause and by
//! how long; attempts abandoned; attempts the map could not track. The scenario suite
//! (`scenarios`) checks the same figures for every burst it replays; these tests make the
//! cases it does not: a final ACK dropped first, clients that give up, a full map.

use std::{
    collections::HashMap,
    net::SocketAddr,
    os::fd::AsRawFd as _,
    time::{Duration, Instant},
};

use backlogd_common::netstat::counter;
use backlogd_tests::{
    Daemon, Exact, Netns, Scrape,
    doctor::{Doctor, evidence},
    kernel::{ListenCounters, Rise, tcp_ext, wait_for_rise},
    sockets::{Listener, connect_burst, fill_accept_queue, local_port, reset_close, tcp_state},
};
use socket2::{Domain, Socket, Type};

/// The daemons here run with a short horizon, so abandoned attempts are counted soon:
/// longer than the ~7 s the clients of [`giving_up`] retry.
const HORIZON_SECONDS: u64 = 8;

/// One test at a time: every daemon's programs see every namespace's drops, so a test's
/// daemon-wide figures (untracked attempts, a small map filling up) would count the
/// others' clients too.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// `tcpi_state` of a connected socket.
const TCP_ESTABLISHED: u8 = 1;

const DELAY_BOUNDS: [&str; 11] = [
    "0.5", "1.5", "2.5", "3.5", "5.5", "9", "17", "33", "65", "135", "+Inf",
];

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn start(extra: &[&str]) -> Daemon {
    let horizon = HORIZON_SECONDS.to_string();
    let mut args = vec!["--client-impact-horizon", horizon.as_str()];
    args.extend_from_slice(extra);
    // The sweeps' debug lines go into a failure's report.
    Daemon::start_env(&args, &[("BACKLOGD_LOG", "info,backlogd::daemon=debug")])
}

/// The daemon's client-impact figures and its sweeps' log lines, for a report.
fn impact_evidence(exact: &mut Exact, daemon: &Daemon, scrape: &Scrape) {
    let figures: Vec<(String, Option<f64>)> = ["tracked", "sweeps_total", "untracked_total"]
        .iter()
        .map(|f| {
            let name = format!("backlogd_client_impact_{f}");
            let v = scrape.value(&name, &[]);
            (name, v)
        })
        .collect();
    let sweeps: Vec<String> = daemon
        .log()
        .lines()
        .filter(|l| l.contains("client-impact"))
        .map(str::to_owned)
        .collect();
    exact
        .evidence("daemon's client-impact figures", figures)
        .evidence("daemon's sweeps that counted something", sweeps);
}

/// The scrape once the daemon tracks no attempt: each one completed or was counted
/// abandoned at its horizon.
fn resolved(daemon: &Daemon) -> Scrape {
    daemon.attempts_resolved()
}

fn value(scrape: &Scrape, metric: &str, listener: &Listener, extra: &[(&str, &str)]) -> u64 {
    let inode = listener.inode.to_string();
    let mut labels = vec![("socket", inode.as_str())];
    labels.extend_from_slice(extra);
    scrape
        .value(metric, &labels)
        .unwrap_or_else(|| panic!("no {metric} {labels:?}:\n{}", scrape.text)) as u64
}

/// Clients whose SYN-ACKs are held back until the accept queue is full, so their final
/// ACKs are the first segments dropped; the server retransmits its SYN-ACK until the
/// application makes room, and each completes then.
#[test]
fn final_acks_dropped_first_delay_their_connections_until_the_synack_retransmit() {
    let _serial = serial();
    let daemon = start(&[]);
    let ns = Netns::new();
    ns.sysctl("net.ipv4.tcp_syncookies", "0");
    ns.sysctl("net.ipv4.tcp_abort_on_overflow", "0");
    // Backlog 3: the SYN queue takes 3 requests (syncookies off), the accept queue 4.
    let listener = Listener::open(&ns, "127.0.0.1:0", 3);
    daemon.wait_for_listener(listener.inode);
    let to = listener.addr;
    let before = tcp_ext(&ns);

    // Two clients from known ports, whose SYN-ACKs are dropped: their requests wait in
    // the SYN queue, the accept queue still empty.
    const VICTIMS: [u16; 2] = [40001, 40002];
    ns.drop_incoming_to("syn|ack", "40001-40002");
    let started = Instant::now();
    let victims: Vec<Socket> = ns.run(move || {
        VICTIMS
            .iter()
            .map(|&port| {
                let s = Socket::new(Domain::IPV4, Type::STREAM, None).expect("socket()");
                s.set_reuse_address(true).expect("SO_REUSEADDR");
                let from: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
                s.bind(&from.into()).expect("bind a client port");
                s.set_nonblocking(true).expect("non-blocking");
                match s.connect(&to.into()) {
                    Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => {}
                    other => panic!("connect {to}: {other:?}"),
                }
                s
            })
            .collect()
    });
    // Then four more fill the accept queue, one at a time (each passes through the SYN
    // queue's third slot).
    let fillers = fill_accept_queue(&ns, &listener, to, 4);
    ns.stop_dropping();
    // At ~1 s a victim's SYN or the server's SYN-ACK is retransmitted, the victim
    // connects, and its final ACK meets the full queue. Waited for as it happens: every
    // victim connected (its own TCP_INFO) and the namespace's ListenOverflows up by one
    // per victim. (One victim's second final ACK comes with the next SYN-ACK, a second
    // later, never before the other's first.)
    let first_drops = wait_for_rise(&ns, counter::LISTEN_OVERFLOWS, &before, |rise| {
        rise >= VICTIMS.len() as u64 && victims.iter().all(|v| tcp_state(v).0 == TCP_ESTABLISHED)
    });
    // Room now: each victim completes at the server's next SYN-ACK retransmission.
    let accepted = accept_all(&listener, VICTIMS.len() + fillers.len());
    let clients = close(victims, fillers);
    let scrape = resolved(&daemon);
    let kernel = ListenCounters::delta(&before, &tcp_ext(&ns));

    let mut exact = Exact::listener(&daemon, &ns, &listener);
    impact_evidence(&mut exact, &daemon, &scrape);
    exact
        .evidence("victims (port, SYN retransmits)", &clients)
        .evidence(
            "accepted (port, queued after, queued by: s since connect(); SYN-ACK retransmits)",
            timeline(started, &accepted),
        )
        .evidence(
            "first final-ACK drops, the kernel's count (quiet, reached: s; rise)",
            rise_since(started, first_drops),
        )
        .evidence("kernel", kernel);
    // The construction held: no SYN was dropped, only final ACKs.
    exact.eq(
        "final-ACK overflows vs ListenOverflows",
        value(
            &scrape,
            "backlogd_listen_drops_total",
            &listener,
            &[("reason", "final_ack_overflow")],
        ),
        kernel.listen_overflows,
    );
    exact.eq(
        "ListenDrops are all final-ACK overflows",
        kernel.listen_overflows,
        kernel.listen_drops,
    );
    let victims_done = VICTIMS
        .iter()
        .filter(|p| accepted.get(p).is_some_and(|a| a.synack_retrans > 0))
        .count() as u64;
    exact.eq(
        "victims accepted after a SYN-ACK retransmit",
        victims_done,
        VICTIMS.len() as u64,
    );
    let delayed = "backlogd_listen_connections_delayed_total";
    exact.eq(
        "delayed after a final-ACK drop vs victims accepted",
        value(
            &scrape,
            delayed,
            &listener,
            &[("cause", "final_ack_overflow")],
        ),
        victims_done,
    );
    exact.eq(
        "delayed after a SYN drop (none was dropped)",
        value(&scrape, delayed, &listener, &[("cause", "syn_drop")]),
        0,
    );
    exact.eq(
        "abandoned (every victim completed)",
        value(
            &scrape,
            "backlogd_listen_connections_abandoned_total",
            &listener,
            &[],
        ),
        0,
    );
    // Each delay runs from the victim's first dropped final ACK to its connection being
    // queued: the first after the kernel's count last stood still (else after the
    // victims' connect()) and before it had risen by one per victim; the second after the
    // application last found the queue empty and before its accept() returned.
    let first_drop = (first_drops.quiet.unwrap_or(started), first_drops.reached);
    let brackets: Vec<(u16, Option<(f64, f64)>)> = VICTIMS
        .iter()
        .map(|p| (*p, accepted.get(p).and_then(|a| a.delay(first_drop))))
        .collect();
    let truth = judge_delays(&mut exact, &brackets);
    check_buckets(&mut exact, &scrape, &listener, &truth);
    doctor_recent(
        &mut exact,
        &daemon,
        &ns,
        &listener,
        (victims_done, 0),
        &truth,
    );
    exact.verify();
}

/// Clients whose SYNs meet a full accept queue until the application drains it after
/// their first retransmission was dropped too: the SYN and its first retransmission (1 s)
/// are dropped, the next one (2 s on Linux 6.5+, whose clients retry SYNs every second at
/// first; 3 s before) completes. Each is counted under syn_drop, in the bucket up to
/// 2.5 s (3.5 s).
#[test]
fn syn_drops_delay_their_connections_until_a_retransmitted_syn_gets_through() {
    let _serial = serial();
    let daemon = start(&[]);
    let (ns, listener, fillers) = full_listener(&daemon);
    let before = tcp_ext(&ns);
    const CLIENTS: u64 = 4;
    let started = Instant::now();
    let clients = connect_burst(&ns, listener.addr, CLIENTS as usize);
    // Each client's first SYN met the full queue (one ListenDrops each), then its first
    // retransmission: waited for in the kernel's count, then room is made.
    let first_drops = wait_for_rise(&ns, counter::LISTEN_DROPS, &before, |rise| rise >= CLIENTS);
    let retries = wait_for_rise(&ns, counter::LISTEN_DROPS, &before, |rise| {
        rise >= 2 * CLIENTS
    });
    let accepted = accept_all(&listener, clients.len() + fillers.len());
    let seen = close(clients, fillers);
    let scrape = resolved(&daemon);
    let kernel = ListenCounters::delta(&before, &tcp_ext(&ns));

    let mut exact = Exact::listener(&daemon, &ns, &listener);
    impact_evidence(&mut exact, &daemon, &scrape);
    exact
        .evidence("clients (port, SYN retransmits)", &seen)
        .evidence(
            "accepted (port, queued after, queued by: s since connect(); SYN-ACK retransmits)",
            timeline(started, &accepted),
        )
        .evidence(
            "first SYNs dropped, the kernel's count (quiet, reached: s; rise)",
            rise_since(started, first_drops),
        )
        .evidence(
            "first retransmissions dropped, the kernel's count (quiet, reached: s; rise)",
            rise_since(started, retries),
        )
        .evidence("kernel", kernel);
    exact.eq(
        "accept-queue-full drops vs ListenOverflows",
        value(
            &scrape,
            "backlogd_listen_drops_total",
            &listener,
            &[("reason", "accept_queue_full")],
        ),
        kernel.listen_overflows,
    );
    let delayed_truth = seen
        .iter()
        .filter(|(port, retrans)| *retrans > 0 && accepted.contains_key(port))
        .count() as u64;
    exact.eq(
        "clients accepted after a SYN retransmit",
        delayed_truth,
        CLIENTS,
    );
    let delayed = "backlogd_listen_connections_delayed_total";
    exact.eq(
        "delayed after a SYN drop vs those clients",
        value(&scrape, delayed, &listener, &[("cause", "syn_drop")]),
        delayed_truth,
    );
    exact.eq(
        "delayed after a final-ACK drop (none was dropped)",
        value(
            &scrape,
            delayed,
            &listener,
            &[("cause", "final_ack_overflow")],
        ),
        0,
    );
    exact.eq(
        "abandoned (every client completed)",
        value(
            &scrape,
            "backlogd_listen_connections_abandoned_total",
            &listener,
            &[],
        ),
        0,
    );
    // Each delay runs from the client's first SYN, dropped after connect() was called and
    // before the kernel's count had risen by one per client, to its connection being
    // queued, after the application last found the queue empty and before its accept()
    // returned it.
    let brackets: Vec<(u16, Option<(f64, f64)>)> = seen
        .iter()
        .map(|(port, _)| {
            let delay = accepted
                .get(port)
                .and_then(|a| a.delay((started, first_drops.reached)));
            (*port, delay)
        })
        .collect();
    let truth = judge_delays(&mut exact, &brackets);
    check_buckets(&mut exact, &scrape, &listener, &truth);
    doctor_recent(
        &mut exact,
        &daemon,
        &ns,
        &listener,
        (delayed_truth, 0),
        &truth,
    );
    exact.verify();
}

/// What `backlogd doctor` says the listener's drops cost its clients in its recent window:
/// a test's daemon is younger than the window's five minutes, so it runs from the daemon's
/// start and must equal the clients' truth as the totals do, in the JSON and in the
/// evidence line quoting it: delayed and abandoned against the clients, each delay bucket
/// against the clients' brackets (`truth`, from [`judge_delays`]).
fn doctor_recent(
    exact: &mut Exact,
    daemon: &Daemon,
    ns: &Netns,
    listener: &Listener,
    (delayed, abandoned): (u64, u64),
    truth: &[Bucket],
) {
    let doctor = Doctor::run(daemon, &[]);
    let finding = doctor.on("accept_queue_overflow", ns, listener);
    exact.evidence("doctor's finding", finding);
    let recent = &finding["recent_client_impact"];
    let figure = |k: &str| recent[k].as_u64().unwrap_or(u64::MAX);
    exact.eq(
        "doctor: delayed in its recent window vs clients",
        figure("delayed_syn_drop").saturating_add(figure("delayed_final_ack_overflow")),
        delayed,
    );
    exact.eq(
        "doctor: abandoned in its recent window vs clients",
        figure("abandoned"),
        abandoned,
    );
    let window = recent["window_seconds"].as_f64().unwrap_or(0.0);
    exact.eq(
        "doctor: its window runs from the daemon's start (under 300 s)",
        u64::from(recent["since_start"] == true && window > 0.0 && window < 300.0),
        1,
    );
    let buckets = recent["delay"].as_array().cloned().unwrap_or_default();
    let mut cumulative = 0;
    for (i, bucket) in truth.iter().enumerate() {
        cumulative += buckets
            .get(i)
            .and_then(|b| b["count"].as_u64())
            .unwrap_or(u64::MAX / 16);
        // A bucket no bracket decides was failed in judge_delays: nothing to compare here.
        if let Some(below) = bucket.below {
            exact.eq(
                &format!(
                    "doctor: recent delays up to {} s vs the clients' brackets",
                    bucket.le
                ),
                cumulative,
                below,
            );
        }
    }
    let line = format!("s since backlogd started: {delayed} connections delayed by a drop, ");
    let tail = format!("; {abandoned} connection attempts never connected");
    let said = evidence(finding);
    exact.eq(
        "doctor's evidence quotes those figures",
        u64::from(said.contains(&line) && said.contains(&tail)),
        1,
    );
}

/// How long a hang may last before [`accept_all`] gives up: the connections here complete
/// at a client's or the server's retransmission, within seconds; this only catches a hang.
const HANG: Duration = Duration::from_secs(60);

/// One connection as the application accepting it saw it.
#[derive(Debug, Clone, Copy)]
struct Accepted {
    /// Taken just before the last accept() that found the queue empty before this
    /// connection came: it was queued after this. None when the queue was never seen empty
    /// first (it may have been queued before the application looked).
    queued_after: Option<Instant>,
    /// Taken just after the accept() that returned it: it was queued before this.
    queued_by: Instant,
    /// The accepted socket's `tcpi_total_retrans`: its SYN-ACK retransmissions.
    synack_retrans: u32,
}

impl Accepted {
    /// Bounds of its delay (seconds) given bounds of its first dropped segment; None when
    /// the application's view gives no lower bound.
    fn delay(&self, (dropped_after, dropped_by): (Instant, Instant)) -> Option<(f64, f64)> {
        Some((
            seconds_between(dropped_by, self.queued_after?),
            seconds_between(dropped_after, self.queued_by),
        ))
    }
}

/// `to - from` in seconds, negative when `to` is earlier.
fn seconds_between(from: Instant, to: Instant) -> f64 {
    match to.checked_duration_since(from) {
        Some(d) => d.as_secs_f64(),
        None => -from.duration_since(to).as_secs_f64(),
    }
}

/// Accepts until `count` connections came (or [`HANG`] passed), by client port. Between
/// tries it waits in poll() for the listener to become readable, so each connection is
/// accepted as soon as it is queued.
fn accept_all(listener: &Listener, count: usize) -> HashMap<u16, Accepted> {
    listener
        .socket
        .set_nonblocking(true)
        .expect("non-blocking listener");
    let mut accepted = HashMap::new();
    let mut empty_at = None;
    let deadline = Instant::now() + HANG;
    while accepted.len() < count && Instant::now() < deadline {
        let asked = Instant::now();
        match listener.socket.accept() {
            Ok((c, peer)) => {
                let queued_by = Instant::now();
                let port = peer.as_socket().map_or(0, |a| a.port());
                accepted.insert(
                    port,
                    Accepted {
                        queued_after: empty_at,
                        queued_by,
                        synack_retrans: tcp_state(&c).1,
                    },
                );
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                empty_at = Some(asked);
                let mut p = libc::pollfd {
                    fd: listener.socket.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                };
                // SAFETY: one valid pollfd. A timeout only lets the deadline be checked.
                unsafe { libc::poll(&mut p, 1, 100) };
            }
            Err(e) => panic!("accept: {e}"),
        }
    }
    accepted
}

/// The accepted connections by port, in seconds since `t0` (the clients' connect()), for
/// a report: (port, queued after, queued by, SYN-ACK retransmits).
fn timeline(t0: Instant, accepted: &HashMap<u16, Accepted>) -> Vec<(u16, Option<f64>, f64, u32)> {
    let mut a: Vec<_> = accepted
        .iter()
        .map(|(p, a)| {
            (
                *p,
                a.queued_after.map(|t| seconds_between(t0, t)),
                seconds_between(t0, a.queued_by),
                a.synack_retrans,
            )
        })
        .collect();
    a.sort_by_key(|(p, ..)| *p);
    a
}

/// A [`Rise`] in seconds since `t0`, for a report: (quiet, reached, rise).
fn rise_since(t0: Instant, r: Rise) -> (Option<f64>, f64, u64) {
    (
        r.quiet.map(|t| seconds_between(t0, t)),
        seconds_between(t0, r.reached),
        r.rise,
    )
}

/// Each client's port and SYN retransmissions, then every client closed with a RST.
fn close(clients: Vec<Socket>, fillers: Vec<Socket>) -> Vec<(u16, u32)> {
    let seen = clients
        .iter()
        .map(|c| (local_port(c), tcp_state(c).1))
        .collect();
    clients.into_iter().chain(fillers).for_each(reset_close);
    seen
}

/// One delay bucket as the clients' brackets decide it.
struct Bucket {
    le: &'static str,
    /// Delays at or below the bound; None when a bracket straddles it.
    below: Option<u64>,
}

/// The floor of what a delay test must judge: every delayed client's bracket known, and
/// every one of the 11 buckets decided by them. Each bound lies at least 0.5 s from every
/// time a client or a server retries (docs/metrics.md, "The delay buckets"), and a
/// bracket here is as wide as the test's own polling of the kernel's count and of the
/// accept queue (milliseconds). A bound inside a bracket means the harness lost half a
/// second or a delay fell off the retry schedule: either way the run could not judge what
/// it is for, and it fails saying which, instead of checking fewer buckets.
const JUDGED_BUCKETS: usize = DELAY_BOUNDS.len();

/// Checks the floor ([`JUDGED_BUCKETS`]) over `brackets` (client port, delay bounds in
/// seconds, None when unknown) and returns each bucket's truth.
fn judge_delays(exact: &mut Exact, brackets: &[(u16, Option<(f64, f64)>)]) -> Vec<Bucket> {
    backlogd_tests::report(&format!(
        "client delays (port, bracket in s, width in ms): {:?}\n",
        brackets
            .iter()
            .map(|(p, b)| (*p, b.map(|(lo, hi)| (lo, hi, (hi - lo) * 1e3))))
            .collect::<Vec<_>>()
    ));
    exact.evidence("delay brackets (port, s)", brackets);
    let unknown: Vec<u16> = brackets
        .iter()
        .filter(|(_, b)| b.is_none())
        .map(|(p, _)| *p)
        .collect();
    if !unknown.is_empty() {
        exact.evidence(
            "clients without a delay bracket (never accepted, or accepted before the \
             application first found the queue empty)",
            &unknown,
        );
    }
    exact.eq(
        "delayed clients with a bracket (floor: every one)",
        (brackets.len() - unknown.len()) as u64,
        brackets.len() as u64,
    );
    let known: Vec<(u16, (f64, f64))> = brackets
        .iter()
        .filter_map(|(p, b)| Some((*p, (*b)?)))
        .collect();
    let truth: Vec<Bucket> = DELAY_BOUNDS
        .iter()
        .map(|&le| {
            let bound: f64 = le.parse().unwrap_or(f64::INFINITY);
            let straddling: Vec<_> = known
                .iter()
                .filter(|(_, (lo, hi))| *lo < bound && bound <= *hi)
                .collect();
            if !straddling.is_empty() {
                exact.evidence(
                    &format!("bucket le={le} not decidable: brackets straddle it"),
                    &straddling,
                );
                return Bucket { le, below: None };
            }
            let below = known.iter().filter(|(_, (_, hi))| *hi < bound).count() as u64;
            Bucket {
                le,
                below: Some(below),
            }
        })
        .collect();
    exact.eq(
        &format!("delay buckets decided by the brackets (floor: all {JUDGED_BUCKETS})"),
        truth.iter().filter(|b| b.below.is_some()).count() as u64,
        JUDGED_BUCKETS as u64,
    );
    truth
}

/// Each delay bucket the brackets decide must count exactly the brackets below it.
fn check_buckets(exact: &mut Exact, scrape: &Scrape, listener: &Listener, truth: &[Bucket]) {
    for bucket in truth {
        let Some(below) = bucket.below else { continue };
        exact.eq(
            &format!("delays up to {} s vs the clients' brackets", bucket.le),
            value(
                scrape,
                "backlogd_listen_connection_delay_seconds_bucket",
                listener,
                &[("le", bucket.le)],
            ),
            below,
        );
    }
}

/// Clients with one SYN retry (TCP_SYNCNT 1) against a full queue that never drains: each
/// SYN is dropped, connect() fails after ~3 s, and the daemon counts each attempt
/// abandoned when its horizon passes, and never delayed.
#[test]
fn clients_that_give_up_are_counted_abandoned_at_the_horizon() {
    let _serial = serial();
    let daemon = start(&[]);
    let (ns, listener, fillers) = full_listener(&daemon);
    let before = tcp_ext(&ns);
    let clients = giving_up(&ns, listener.addr, 5);
    let timed_out = wait_for_failures(&clients);
    let kernel = ListenCounters::delta(&before, &tcp_ext(&ns));
    let scrape = resolved(&daemon);
    let mut exact = Exact::listener(&daemon, &ns, &listener);
    impact_evidence(&mut exact, &daemon, &scrape);
    exact.evidence("kernel", kernel);
    exact.eq("clients that timed out", timed_out, 5);
    exact.eq(
        "accept-queue-full drops vs ListenOverflows",
        value(
            &scrape,
            "backlogd_listen_drops_total",
            &listener,
            &[("reason", "accept_queue_full")],
        ),
        kernel.listen_overflows,
    );
    // Every SYN the clients sent (first ones and TCPSynRetrans) was dropped.
    exact.eq(
        "SYNs dropped vs SYNs sent",
        kernel.listen_drops,
        5 + kernel.syn_retrans,
    );
    exact.eq(
        "abandoned vs clients that timed out",
        value(
            &scrape,
            "backlogd_listen_connections_abandoned_total",
            &listener,
            &[],
        ),
        timed_out,
    );
    for cause in ["syn_drop", "final_ack_overflow"] {
        exact.eq(
            &format!("delayed ({cause})"),
            value(
                &scrape,
                "backlogd_listen_connections_delayed_total",
                &listener,
                &[("cause", cause)],
            ),
            0,
        );
    }
    // No client connected: every delay bucket's truth is 0.
    let truth = judge_delays(&mut exact, &[]);
    check_buckets(&mut exact, &scrape, &listener, &truth);
    doctor_recent(&mut exact, &daemon, &ns, &listener, (0, timed_out), &truth);
    exact.verify();
    drop(fillers);
}

/// A map with room for 4 attempts and 10 clients whose every SYN is dropped: 4 are tracked
/// (and abandoned), every SYN of the other 6 is counted untracked.
#[test]
fn a_full_attempts_map_counts_the_segments_it_could_not_track() {
    let _serial = serial();
    let daemon = start(&["--client-impact-attempts", "4"]);
    let (ns, listener, fillers) = full_listener(&daemon);
    let before = tcp_ext(&ns);
    let clients = giving_up(&ns, listener.addr, 10);
    let timed_out = wait_for_failures(&clients);
    let kernel = ListenCounters::delta(&before, &tcp_ext(&ns));
    let scrape = resolved(&daemon);
    let mut exact = Exact::listener(&daemon, &ns, &listener);
    impact_evidence(&mut exact, &daemon, &scrape);
    exact.evidence("kernel", kernel);
    exact.eq("clients that timed out", timed_out, 10);
    exact.eq(
        "SYNs dropped vs SYNs sent",
        kernel.listen_drops,
        10 + kernel.syn_retrans,
    );
    // Each client sends as many SYNs as the others (same TCP_SYNCNT, same timers).
    exact.eq(
        "SYNs sent: the same number per client",
        kernel.listen_drops % 10,
        0,
    );
    exact.eq(
        "abandoned: the attempts the map held",
        value(
            &scrape,
            "backlogd_listen_connections_abandoned_total",
            &listener,
            &[],
        ),
        4,
    );
    exact.eq(
        "untracked: every SYN of the other 6",
        scrape
            .value("backlogd_client_impact_untracked_total", &[])
            .expect("backlogd_client_impact_untracked_total") as u64,
        6 * (kernel.listen_drops / 10),
    );
    exact.verify();
    drop(fillers);
}

/// A listener (backlog 1, never accepting) whose accept queue is full: every SYN from
/// now on is dropped.
fn full_listener(daemon: &Daemon) -> (Netns, Listener, Vec<Socket>) {
    let ns = Netns::new();
    ns.sysctl("net.ipv4.tcp_syncookies", "0");
    let listener = Listener::open(&ns, "127.0.0.1:0", 1);
    daemon.wait_for_listener(listener.inode);
    let fillers = fill_accept_queue(&ns, &listener, listener.addr, 2);
    (ns, listener, fillers)
}

/// `n` clients that give up after one SYN retry (TCP_SYNCNT 1; Linux sends a third SYN at
/// 3 s and fails the connect() at ~7 s: the give-up is checked only as a retransmit fires).
fn giving_up(ns: &Netns, to: SocketAddr, n: usize) -> Vec<Socket> {
    ns.run(move || {
        (0..n)
            .map(|_| {
                let s = Socket::new(Domain::IPV4, Type::STREAM, None).expect("socket()");
                let one: libc::c_int = 1;
                // SAFETY: setsockopt reads one c_int.
                let rc = unsafe {
                    libc::setsockopt(
                        s.as_raw_fd(),
                        libc::IPPROTO_TCP,
                        libc::TCP_SYNCNT,
                        (&raw const one).cast(),
                        size_of::<libc::c_int>() as libc::socklen_t,
                    )
                };
                assert_eq!(rc, 0, "TCP_SYNCNT: {}", std::io::Error::last_os_error());
                s.set_nonblocking(true).expect("non-blocking");
                match s.connect(&to.into()) {
                    Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => {}
                    other => panic!("connect {to}: {other:?}"),
                }
                s
            })
            .collect()
    })
}

/// Waits until every client's connect() failed (at ~7 s; [`HANG`] only catches a hang);
/// returns how many failed with ETIMEDOUT.
fn wait_for_failures(clients: &[Socket]) -> u64 {
    let deadline = Instant::now() + HANG;
    // SO_ERROR is read (and cleared) once per client, when its socket has closed.
    let mut errors: Vec<Option<i32>> = vec![None; clients.len()];
    while errors.iter().any(Option::is_none) && Instant::now() < deadline {
        for (c, e) in clients.iter().zip(errors.iter_mut()) {
            const TCP_CLOSE: u8 = 7;
            if e.is_none() && tcp_state(c).0 == TCP_CLOSE {
                *e = Some(
                    c.take_error()
                        .ok()
                        .flatten()
                        .and_then(|e| e.raw_os_error())
                        .unwrap_or(0),
                );
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    errors
        .iter()
        .filter(|e| **e == Some(libc::ETIMEDOUT))
        .count() as u64
}
