//! SIGHUP: reloadable settings applied, the old config kept when the new one is bad.

use std::{
    net::{SocketAddr, TcpStream},
    os::{fd::AsRawFd as _, unix::fs::MetadataExt as _},
    time::{Duration, Instant},
};

use backlogd_common::netstat::counter;
use backlogd_tests::{
    Daemon, Netns, Scrape,
    http::{Reply, basic, exchange, get_request},
    kernel::{netns_family, tcp_ext},
    sockets::Listener,
    tempdir::TempDir,
};
use socket2::{Domain, Socket, Type};

use crate::support::*;

/// SIGHUP, then waits for the daemon's RELOADING=1 and READY=1: the reload is done.
fn reload(daemon: &Daemon, notify: &NotifySocket) {
    daemon.signal(libc::SIGHUP);
    let seen = notify.recv_until("READY=1", Duration::from_secs(10));
    assert!(
        seen.iter().any(|m| m.lines().any(|l| l == "RELOADING=1")),
        "no RELOADING=1 before READY=1: {seen:?}"
    );
}

/// A listener in `ns` whose `listen()` was called by a thread that has exited since: the
/// daemon learns of the listener from the event, but the event's thread no longer leads
/// into the namespace, so the namespace's own TcpExt counters can be read only once a
/// sock_diag scan finds another task in it (the namespace's helper thread).
fn listen_from_a_thread_gone_since(ns: &Netns) -> (Socket, SocketAddr, u64) {
    let socket = ns.run(|| {
        std::thread::spawn(|| {
            let s = Socket::new(Domain::IPV4, Type::STREAM, None).expect("socket()");
            let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
            s.bind(&any.into()).expect("bind");
            s.listen(16).expect("listen()");
            s
        })
        .join()
        .expect("listening thread")
    });
    let addr = socket.local_addr().unwrap().as_socket().unwrap();
    let inode = std::fs::metadata(format!("/proc/self/fd/{}", socket.as_raw_fd()))
        .unwrap()
        .ino();
    (socket, addr, inode)
}

#[test]
fn sighup_applies_reloadable_settings_and_keeps_the_old_config_when_the_new_is_bad() {
    let dir = TempDir::new("reload");
    let web = dir.write(
        "web.yml",
        &format!("basic_auth_users:\n  prometheus: {HASH}\n"),
    );
    let bad_web = dir.write(
        "bad-web.yml",
        "basic_auth_users:\n  prometheus: not-a-hash\n",
    );
    let good = basic("prometheus", "scrape-secret");
    let port = free_port();
    let other = free_port();
    let config = |listen: u16, log: &str, rescan: u64, hwm: u64, http: &str| {
        format!(
            "listen = \"127.0.0.1:{listen}\"\nlog = \"{log}\"\nrescan_interval = {rescan}\n\
             hwm_window = {hwm}\n{http}"
        )
    };
    let file = dir.write("backlogd.toml", &config(port, "info", 600, 600, ""));
    let notify = NotifySocket::bind("reload");
    let daemon = Daemon::start_env(
        &["--config", file.to_str().unwrap()],
        &[("NOTIFY_SOCKET", &notify.name)],
    );
    assert_eq!(daemon.addr.port(), port, "listen from the file");
    notify.recv_until("READY=1", Duration::from_secs(30));
    let addr = daemon.addr;
    // A 12 KiB request head: within the default max_header_bytes (16384), over 8192.
    let padded = |auth: Option<&str>| {
        get_request(
            "/metrics",
            auth,
            &format!("X-Pad: {}\r\n", "a".repeat(12 * 1024)),
        )
    };
    let r = exchange(addr, &padded(None)).unwrap();
    assert_eq!(
        r.status, 200,
        "12 KiB head under the default limit: {}",
        r.head
    );
    assert_eq!(get_as(addr, "/metrics", None).status, 200, "no auth yet");

    // What shows the other reloadable settings. hwm_window: an accept-queue peak of 6,
    // drained, stays in backlogd_listen_accept_queue_max_length for the window (600 s).
    let ns = Netns::new();
    let netns = ns.inode().to_string();
    let (listener, listener_addr, inode) = listen_from_a_thread_gone_since(&ns);
    daemon.wait_for_listener(inode);
    let socket = inode.to_string();
    let queue = |s: &Scrape| {
        (
            s.value(
                "backlogd_listen_accept_queue_length",
                &[("socket", &socket)],
            ),
            s.value(
                "backlogd_listen_accept_queue_max_length",
                &[("socket", &socket)],
            ),
        )
    };
    let clients: Vec<TcpStream> = ns.run(move || {
        (0..6)
            .map(|_| TcpStream::connect(listener_addr).expect("connect"))
            .collect()
    });
    daemon.wait_for("6 connections queued", |s| {
        (queue(s) == (Some(6.0), Some(6.0))).then_some(())
    });
    for _ in 0..6 {
        listener.accept().expect("accept");
    }
    daemon.wait_for("the queue drained", |s| {
        (queue(s) == (Some(0.0), Some(6.0))).then_some(())
    });
    // Several one-second samples later the peak is still reported...
    std::thread::sleep(Duration::from_millis(2500));
    let before = daemon.scrape();
    assert_eq!(
        queue(&before),
        (Some(0.0), Some(6.0)),
        "(length, peak) with hwm_window = 600"
    );
    // ... and rescan_interval: the namespace's TcpExt counters are not exported, since the
    // thread that called listen() is gone and no scan (every 600 s) has found another.
    assert!(
        before
            .find(
                "backlogd_netns_listen_overflows_total",
                &[("netns", &netns)]
            )
            .is_empty(),
        "netns {netns} counters exported before any rescan:\n{}",
        before.text
    );
    assert_eq!(log_lines(&daemon, "configuration reloaded"), 0);

    // Reload: everything reloadable changes, and the listen address (which is not).
    std::fs::write(
        &file,
        config(
            other,
            "warn",
            1,
            1,
            &format!(
                "[http]\nmax_header_bytes = 8192\nweb_config_file = \"{}\"\n",
                web.display()
            ),
        ),
    )
    .unwrap();
    reload(&daemon, &notify);
    let warned = daemon.wait_for_log("`listen` changed");
    assert!(warned.contains("restart"), "{warned}");
    // [http], for new connections: the users of the web config, the smaller head limit.
    let none = get_as(addr, "/metrics", None);
    assert_eq!(none.status, 401, "{none:?}");
    assert_eq!(
        none.header("www-authenticate"),
        Some("Basic realm=\"backlogd\""),
        "{none:?}"
    );
    let r = exchange(addr, &padded(Some(&good))).unwrap();
    assert_eq!(
        r.status, 431,
        "12 KiB head over max_header_bytes = 8192: {}",
        r.head
    );
    assert!(scrape_as(addr, &good).text.contains("backlogd_hook_mode"));
    // The listen address needs a restart: still the old port, nothing on the new one.
    let refused = TcpStream::connect(("127.0.0.1", other))
        .expect_err("the new listen address must not be served before a restart");
    assert_eq!(refused.kind(), std::io::ErrorKind::ConnectionRefused);
    // hwm_window = 1: the peak ages out within seconds.
    eventually(
        "the drained peak leaving the 1 s window",
        Duration::from_secs(15),
        || (queue(&scrape_as(addr, &good)) == (Some(0.0), Some(0.0))).then_some(()),
    );
    // rescan_interval = 1: a scan finds the namespace's helper thread, and the namespace's
    // counters appear, equal to the kernel's.
    let exported = eventually(
        "the namespace's counters after a rescan",
        Duration::from_secs(15),
        || {
            scrape_as(addr, &good).value(
                netns_family(counter::LISTEN_OVERFLOWS),
                &[("netns", &netns)],
            )
        },
    );
    assert_eq!(exported, tcp_ext(&ns)[counter::LISTEN_OVERFLOWS] as f64);
    // log = "warn": this reload's own "configuration reloaded" line (info) was filtered out.
    assert_eq!(
        log_lines(&daemon, "configuration reloaded"),
        0,
        "info line logged with log = \"warn\":\n{}",
        daemon.log()
    );
    drop(clients);

    // A bad file: the error names the key and line, and the running config stays whole.
    let kept = |after: &str| {
        let none = get_as(addr, "/metrics", None);
        assert_eq!(none.status, 401, "auth off after {after}: {none:?}");
        let r = exchange(addr, &padded(Some(&good))).unwrap();
        assert_eq!(
            r.status, 431,
            "head limit changed after {after}: {}",
            r.head
        );
        assert!(scrape_as(addr, &good).text.contains("backlogd_hook_mode"));
    };
    std::fs::write(&file, "rescan_interval = 2\nlisten_adress = \"x\"\n").unwrap();
    reload(&daemon, &notify);
    let failed = wait_for_nth(&daemon, "config reload failed", 1);
    assert!(
        failed.contains("keeping the running configuration"),
        "{failed}"
    );
    // The parse error's later lines (the key, the caret) may still be on their way.
    assert!(failed.contains("line 2"), "{failed}");
    wait_for_nth(&daemon, "listen_adress", 1);
    kept("a file with an unknown key");
    // A good file naming a bad web config: nothing of it is applied (not the log filter,
    // not the head limit, not turning auth off).
    std::fs::write(
        &file,
        config(
            port,
            "info",
            2,
            600,
            &format!(
                "[http]\nmax_header_bytes = 65536\nweb_config_file = \"{}\"\n",
                bad_web.display()
            ),
        ),
    )
    .unwrap();
    reload(&daemon, &notify);
    let failed = wait_for_nth(&daemon, "config reload failed", 2);
    assert!(
        failed.contains("keeping the running configuration")
            && failed.contains("basic_auth_users.prometheus"),
        "{failed}"
    );
    kept("a file naming a bad web config");
    // Still log = "warn": a good reload that leaves it so logs no info line (it would if
    // the bad file's log = "info" had been applied); its head limit is back to 16384.
    std::fs::write(
        &file,
        config(
            port,
            "warn",
            1,
            1,
            &format!("[http]\nweb_config_file = \"{}\"\n", web.display()),
        ),
    )
    .unwrap();
    reload(&daemon, &notify);
    let r = exchange(addr, &padded(Some(&good))).unwrap();
    assert_eq!(
        r.status, 200,
        "12 KiB head, max_header_bytes 16384 again: {}",
        r.head
    );
    assert_eq!(
        log_lines(&daemon, "configuration reloaded"),
        0,
        "{}",
        daemon.log()
    );
    // log = "info" again: the reload says so, and starts from the running config (the
    // rescan interval is 1, not the bad files' 2).
    std::fs::write(
        &file,
        config(
            port,
            "info",
            7,
            1,
            &format!("[http]\nweb_config_file = \"{}\"\n", web.display()),
        ),
    )
    .unwrap();
    reload(&daemon, &notify);
    let line = wait_for_nth(&daemon, "configuration reloaded", 1);
    for change in ["log \"warn\" -> \"info\"", "rescan_interval 1 -> 7"] {
        assert!(line.contains(change), "{change} missing: {line}");
    }
    assert!(
        !line.contains("hwm_window"),
        "hwm_window did not change: {line}"
    );
}

/// accept_wait_buckets applies on SIGHUP: the exported buckets change at once, each the
/// exact cumulative count of the API's (all 24) buckets; a bound that is not the kernel's
/// is refused and the running buckets are kept.
#[test]
fn sighup_changes_the_exported_accept_wait_buckets() {
    let dir = TempDir::new("reload-accept-wait");
    let file = dir.write("backlogd.toml", "listen = \"127.0.0.1:0\"\n");
    let notify = NotifySocket::bind("reload-accept-wait");
    let daemon = Daemon::start_env(
        &["--config", file.to_str().unwrap()],
        &[("NOTIFY_SOCKET", &notify.name)],
    );
    notify.recv_until("READY=1", Duration::from_secs(30));
    let ns = Netns::new();
    let listener = Listener::open(&ns, "127.0.0.1:0", 16);
    daemon.wait_for_listener(listener.inode);
    let addr = listener.addr;
    let clients: Vec<TcpStream> = ns.run(move || {
        (0..3)
            .map(|_| TcpStream::connect(addr).expect("connect"))
            .collect()
    });
    // Every wait is at least 20 ms: over the first kernel bound (1 µs), far under the last.
    std::thread::sleep(Duration::from_millis(20));
    for _ in 0..3 {
        listener.socket.accept().expect("accept");
    }
    let socket = listener.inode.to_string();
    // Every mode sees the enqueues (a regression that loses them, or the metric, fails
    // here instead of passing without a wait to compare).
    assert_eq!(
        daemon
            .scrape()
            .value("backlogd_listen_queued_total", &[("socket", &socket)]),
        Some(3.0),
        "the three connections accepted above were queued first"
    );
    // The API's cumulative counts at every kernel bound (`le` as /metrics writes it).
    let me = daemon.api_listener(listener.inode);
    let mut api: Vec<(String, u64)> = Vec::new();
    let mut seen = 0;
    for b in me["accept_wait"]["buckets"].as_array().expect("buckets") {
        seen += b["count"].as_u64().expect("count");
        let le = b["le"]
            .as_f64()
            .map_or("+Inf".to_owned(), |le| le.to_string());
        api.push((le, seen));
    }
    let at = |le: &str| -> u64 {
        api.iter()
            .find(|(l, _)| l == le)
            .unwrap_or_else(|| panic!("no API bucket le={le}: {api:?}"))
            .1
    };
    assert_eq!(api.len(), 25, "{api:?}");
    assert_eq!(at("0.000001"), 0, "no wait under 1 µs");
    assert_eq!(at("8.388608"), 3, "every wait under 8.4 s");
    assert_eq!(at("+Inf"), 3);
    let exported = |daemon: &Daemon| -> Vec<(String, u64)> {
        daemon
            .scrape()
            .find(
                "backlogd_listen_accept_wait_seconds_bucket",
                &[("socket", &socket)],
            )
            .iter()
            .map(|s| (s.labels["le"].clone(), s.value as u64))
            .collect()
    };
    let want = |les: &[&str]| -> Vec<(String, u64)> {
        les.iter().map(|le| ((*le).to_owned(), at(le))).collect()
    };
    assert_eq!(
        exported(&daemon),
        want(&["0.001024", "1.048576", "+Inf"]),
        "the default buckets"
    );

    std::fs::write(
        &file,
        "listen = \"127.0.0.1:0\"\naccept_wait_buckets = [8.388608, 0.000001]\n",
    )
    .unwrap();
    reload(&daemon, &notify);
    let line = wait_for_nth(&daemon, "configuration reloaded", 1);
    assert!(
        line.contains("accept_wait_buckets [0.001024, 1.048576] -> [0.000001, 8.388608]"),
        "{line}"
    );
    assert_eq!(
        exported(&daemon),
        want(&["0.000001", "8.388608", "+Inf"]),
        "after the reload"
    );

    // Not a kernel bound: refused, the running buckets kept.
    std::fs::write(
        &file,
        "listen = \"127.0.0.1:0\"\naccept_wait_buckets = [0.5]\n",
    )
    .unwrap();
    reload(&daemon, &notify);
    // The error is one event over several lines, and the log is read line by line as the
    // daemon writes: wait for the line that names the cause, not only the first one.
    let failed = wait_for_nth(&daemon, "config reload failed", 1);
    assert!(
        failed.contains("keeping the running configuration"),
        "{failed}"
    );
    wait_for_nth(
        &daemon,
        "0.5 is not one of the kernel's accept-wait bucket bounds",
        1,
    );
    assert_eq!(
        exported(&daemon),
        want(&["0.000001", "8.388608", "+Inf"]),
        "after the refused reload"
    );

    std::fs::write(
        &file,
        "listen = \"127.0.0.1:0\"\naccept_wait_buckets = \"all\"\n",
    )
    .unwrap();
    reload(&daemon, &notify);
    let line = wait_for_nth(&daemon, "configuration reloaded", 2);
    assert!(
        line.contains("accept_wait_buckets [0.000001, 8.388608] -> all"),
        "{line}"
    );
    assert_eq!(exported(&daemon), api, "every bucket");
    drop(clients);
}

/// Waits for the `n`th log line containing `needle`.
fn wait_for_nth(daemon: &Daemon, needle: &str, n: usize) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let log = daemon.log();
        if let Some(line) = log.lines().filter(|l| l.contains(needle)).nth(n - 1) {
            return line.to_owned();
        }
        assert!(
            Instant::now() < deadline,
            "no {n}th line containing {needle:?}; log:\n{log}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Number of log lines containing `needle` so far.
fn log_lines(daemon: &Daemon, needle: &str) -> usize {
    daemon.log().lines().filter(|l| l.contains(needle)).count()
}

fn get_as(addr: SocketAddr, path: &str, auth: Option<&str>) -> Reply {
    exchange(addr, &get_request(path, auth, ""))
        .unwrap_or_else(|e| panic!("GET http://{addr}{path}: {e}"))
}

/// A complete `/metrics` scrape with credentials.
fn scrape_as(addr: SocketAddr, auth: &str) -> Scrape {
    let reply = get_as(addr, "/metrics", Some(auth));
    assert_eq!(reply.status, 200, "{reply:?}");
    Scrape::parse(&reply.complete_text())
}
