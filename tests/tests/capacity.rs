//! The per-listener kernel maps driven past their capacity for real (`--max-listeners`).
//! Alone in its own test binary: every daemon's programs see every listener on the host, so
//! a test running beside it would take slots of its map.

use std::time::Duration;

use backlogd_common::names::figure;
use backlogd_tests::{
    Daemon, Exact, Netns, Scrape,
    kernel::{ListenCounters, tcp_ext},
    sockets::{Listener, connect_burst, fill_accept_queue},
};

const CAPACITY: usize = 4;

fn stats_full(scrape: &Scrape) -> u64 {
    scrape
        .value("backlogd_listener_stats_full_total", &[])
        .unwrap_or_else(|| panic!("no backlogd_listener_stats_full_total in:\n{}", scrape.text))
        as u64
}

fn syns(scrape: &Scrape, l: &Listener) -> Option<u64> {
    scrape
        .value(
            "backlogd_listen_syns_received_total",
            &[("socket", &l.inode.to_string())],
        )
        .map(|v| v as u64)
}

/// With room for 4 listeners: the daemon's own HTTP listener (scraped first) and three
/// test listeners (a connection each, accepted) take the slots; a fifth listener's SYNs are then dropped by a full accept
/// queue. Each of its SYNs is one counter update the map could not take (queue
/// observations are counted apart), and
/// `backlogd_listener_stats_full_total` must grow by exactly the SYNs that arrived for it
/// (the namespace's nft counter), while the listeners in the map stay exact and the log
/// says it once.
#[test]
fn a_full_listener_map_counts_exactly_the_updates_it_could_not_hold() {
    let daemon = Daemon::start_with(&["--max-listeners", &CAPACITY.to_string()]);
    let first = daemon.scrape();
    assert_eq!(stats_full(&first), 0, "nothing lost before the test");
    let ns = Netns::new();
    ns.sysctl("net.ipv4.tcp_syncookies", "0");
    let held: Vec<Listener> = (1..CAPACITY)
        .map(|_| Listener::open(&ns, "127.0.0.1:0", 8))
        .collect();
    for l in &held {
        daemon.wait_for_listener(l.inode);
        drop(connect_burst(&ns, l.addr, 1));
    }
    daemon.wait_for("the held listeners' SYNs to be counted", |s| {
        held.iter().all(|l| syns(s, l) == Some(1)).then_some(())
    });
    // A SYN that met no drop is counted in the listener's queue entry, not its counters
    // (a map of its own, as large): the accept of its connection is what takes each held
    // listener's slot in the counters.
    let accepted: Vec<_> = held
        .iter()
        .map(|l| {
            l.socket
                .accept()
                .expect("accept a held listener's connection")
        })
        .collect();
    daemon.wait_for("the held listeners' accepts to be counted", |s| {
        held.iter()
            .all(|l| {
                s.value(
                    "backlogd_listen_accepted_total",
                    &[("socket", &l.inode.to_string())],
                ) == Some(1.0)
            })
            .then_some(())
    });
    drop(accepted);

    // The listener the map has no room for: its queue is filled (those updates are lost
    // too, how many depends on the hook mode), then the measured interval is a burst
    // whose every SYN is dropped at the SYN.
    let outside = Listener::open(&ns, "127.0.0.1:0", 1);
    daemon.wait_for_listener(outside.inode);
    ns.count_incoming_syns(outside.addr.port());
    let mut clients = fill_accept_queue(&ns, &outside, outside.addr, 2);
    std::thread::sleep(Duration::from_millis(100));
    let start = daemon.program_misses();
    let before = (
        stats_full(&daemon.scrape()),
        ns.incoming_syns(),
        tcp_ext(&ns),
    );
    clients.extend(connect_burst(&ns, outside.addr, 10));
    // Long enough for the first SYN retransmissions (1 s) to be dropped too.
    std::thread::sleep(Duration::from_millis(1500));
    drop(clients);
    std::thread::sleep(Duration::from_millis(100));
    let after = (ns.incoming_syns(), tcp_ext(&ns));
    let scrape = daemon.scrape();
    let kernel = ListenCounters::delta(&before.2, &after.1);
    let arrived = after.0 - before.1;

    // The scenario did what it is for: every SYN of the burst was dropped.
    assert!(arrived >= 20, "{arrived} SYNs arrived");
    assert_eq!(kernel.listen_overflows, arrived, "{kernel:?}");

    let mut exact = Exact::listener(&daemon, &ns, &outside);
    exact.interval(&daemon, &start);
    exact
        .evidence("kernel TcpExt deltas", kernel)
        .evidence("SYNs that arrived (nft)", arrived)
        .evidence(
            "backlogd_listener_stats_full_total before, after",
            (before.0, stats_full(&scrape)),
        )
        .evidence(
            "queue observations lost (not judged: a final ACK's window of the fill may be \
             settled at a later segment on its CPU)",
            scrape.value("backlogd_listener_queue_observations_lost_total", &[]),
        )
        .eq_fed(
            "updates lost to the full map vs SYNs that arrived for the listener outside it",
            &[figure::MAP_FULL],
            stats_full(&scrape) - before.0,
            arrived,
        )
        .eq(
            "SYNs counted for the listener outside the map",
            syns(&scrape, &outside).unwrap_or(0),
            0,
        );
    for (i, l) in held.iter().enumerate() {
        exact.eq(
            &format!("SYNs of held listener {i}"),
            syns(&scrape, l).unwrap_or(0),
            1,
        );
    }
    let said = daemon
        .log()
        .lines()
        .filter(|l| l.contains("kernel maps of listeners are full"))
        .count();
    exact.eq("log lines saying the map is full", said as u64, 1);
    exact.verify();
}
