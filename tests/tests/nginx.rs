//! The operator's classic experiment with real software: nginx (Debian's nginx-light)
//! asks for `listen ... backlog=511`, the namespace's somaxconn is 128; wrk loads it; then
//! somaxconn is raised to 4096 and the run repeated. Also nginx with `reuseport` and four
//! workers. backlogd's figures must equal the kernel's in every run.

use std::{
    os::unix::process::CommandExt as _,
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::Duration,
};

use backlogd_tests::{
    Daemon, Exact, Netns, Scrape,
    kernel::{ListenCounters, closed_interval, tcp_ext},
    prom::DROP_REASONS,
    report,
};

struct Nginx {
    child: Child,
    dir: PathBuf,
}

impl Nginx {
    /// nginx in `ns`, listening on 127.0.0.1:8080 with `backlog=511`.
    fn start(ns: &Netns, workers: u32, reuseport: bool) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "backlogd-nginx-{}-{}",
            std::process::id(),
            ns.inode()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let d = dir.display();
        let conf = format!(
            "worker_processes {workers};\npid {d}/nginx.pid;\nerror_log {d}/error.log;\n\
             events {{ worker_connections 4096; }}\n\
             http {{\n  access_log off;\n  client_body_temp_path {d}; proxy_temp_path {d};\n  \
             fastcgi_temp_path {d}; uwsgi_temp_path {d}; scgi_temp_path {d};\n  \
             server {{ listen 127.0.0.1:8080{} backlog=511; location / {{ return 200 \"ok\\n\"; }} }}\n  \
             server {{ listen 127.0.0.1:8081; location / {{ stub_status; }} }}\n}}\n",
            if reuseport { " reuseport" } else { "" }
        );
        std::fs::write(dir.join("nginx.conf"), conf).unwrap();
        let conf_path = dir.join("nginx.conf");
        let child = ns.run(move || {
            Command::new("nginx")
                .arg("-c")
                .arg(&conf_path)
                .args(["-g", "daemon off;"])
                // Master and workers in one new process group, so Drop can end them all.
                .process_group(0)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("nginx (Debian package nginx-light; `cargo xtask setup` installs it)")
        });
        Self { child, dir }
    }
}

impl Nginx {
    /// Runs wrk against it while its worker is stopped for the first 500 ms: a burst
    /// arriving while the application is busy (a GC pause, a blocking call), so the
    /// accept queue alone must absorb it.
    fn wrk_during_stall(&self, ns: &Netns, connections: u32) -> String {
        let master = self.child.id();
        let workers = Command::new("pgrep")
            .args(["-P", &master.to_string()])
            .output()
            .expect("pgrep");
        let workers: Vec<i32> = String::from_utf8_lossy(&workers.stdout)
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .collect();
        assert!(!workers.is_empty(), "nginx has no workers");
        let signal = |sig| {
            for w in &workers {
                // SAFETY: kill(2) on our own nginx's workers.
                unsafe { libc::kill(*w, sig) };
            }
        };
        signal(libc::SIGSTOP);
        let wrk = ns.run(move || {
            Command::new("wrk")
                .args([
                    "-t2",
                    &format!("-c{connections}"),
                    "-d3s",
                    "http://127.0.0.1:8080/",
                ])
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .expect("wrk (Debian package; `cargo xtask setup` installs it)")
        });
        std::thread::sleep(Duration::from_millis(500));
        signal(libc::SIGCONT);
        let out = wrk.wait_with_output().expect("wrk");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .find(|l| l.contains("Socket errors"))
            .unwrap_or("Socket errors: none")
            .trim()
            .to_owned()
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        // Workers outlive a killed master: end the whole process group.
        // SAFETY: kill(2) on our own child's process group.
        unsafe { libc::kill(-(self.child.id() as i32), libc::SIGKILL) };
        self.child.wait().ok();
        std::fs::remove_dir_all(&self.dir).ok();
    }
}

/// nginx's own count of connections its workers accepted (stub_status on port 8081, which
/// counts the status request itself too).
fn nginx_accepts(ns: &Netns) -> u64 {
    let (status, body) =
        ns.run(|| backlogd_tests::http::get("127.0.0.1:8081".parse().expect("address"), "/"));
    assert_eq!(status, 200, "stub_status: {body}");
    // "Active connections: 1\nserver accepts handled requests\n 5 5 5\n..."
    body.lines()
        .nth(2)
        .and_then(|l| l.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("unexpected stub_status body: {body:?}"))
}

/// wrk's summary line about failed sockets (empty when there were none).
fn wrk(ns: &Netns, connections: u32) -> String {
    let out = ns.command(
        "wrk",
        &[
            "-t2",
            &format!("-c{connections}"),
            "-d3s",
            "http://127.0.0.1:8080/",
        ],
    );
    out.lines()
        .find(|l| l.contains("Socket errors"))
        .unwrap_or("Socket errors: none")
        .trim()
        .to_owned()
}

/// Sockets listening on :8080 in `ns` according to backlogd, after it has seen `count`.
fn nginx_sockets(daemon: &Daemon, ns: &Netns, count: usize) -> Scrape {
    let netns = ns.inode().to_string();
    daemon.wait_for(&format!("{count} nginx sockets"), |s| {
        (s.find(
            "backlogd_listen_backlog_granted",
            &[("netns", &netns), ("port", "8080")],
        )
        .len()
            == count)
            .then(|| s.clone())
    })
}

fn drops_in(scrape: &Scrape, ns: &Netns) -> u64 {
    let netns = ns.inode().to_string();
    DROP_REASONS
        .iter()
        .flat_map(|r| {
            scrape.find(
                "backlogd_listen_drops_total",
                &[("netns", &netns), ("port", "8080"), ("reason", r)],
            )
        })
        .map(|s| s.value as u64)
        .sum()
}

struct Run {
    somaxconn: u32,
    granted: f64,
    client: String,
    kernel: ListenCounters,
    backlogd_drops: u64,
    /// backlogd's client impact for nginx's listener: delayed, abandoned.
    impact: (u64, u64),
}

/// The client-impact horizon of this suite's daemon: wrk's connections all end with its
/// 3 s run, so attempts resolve soon after.
const HORIZON: &str = "5";

/// backlogd's delayed and abandoned connections of nginx's :8080 listener in `ns`, once
/// every attempt is resolved (each completed or past the horizon).
fn impact_in(daemon: &Daemon, ns: &Netns) -> (u64, u64) {
    let netns = ns.inode().to_string();
    let scrape = daemon.attempts_resolved();
    let sum = |metric: &str| -> u64 {
        scrape
            .find(metric, &[("netns", &netns), ("port", "8080")])
            .iter()
            .map(|s| s.value as u64)
            .sum()
    };
    (
        sum("backlogd_listen_connections_delayed_total"),
        sum("backlogd_listen_connections_abandoned_total"),
    )
}

fn run(daemon: &Daemon, somaxconn: u32) -> Run {
    let ns = Netns::new();
    ns.sysctl("net.core.somaxconn", &somaxconn.to_string());
    ns.sysctl("net.ipv4.tcp_syncookies", "0");
    let nginx = Nginx::start(&ns, 1, false);
    let scrape = nginx_sockets(daemon, &ns, 1);
    let labels = [
        ("netns", ns.inode().to_string()),
        ("port", "8080".to_string()),
    ];
    let labels: Vec<(&str, &str)> = labels.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let requested = scrape.value("backlogd_listen_backlog_requested", &labels);
    assert_eq!(
        requested,
        Some(511.0),
        "nginx asked for 511:\n{}",
        scrape.text
    );
    let comm = &scrape.find("backlogd_listen_backlog_granted", &labels)[0].labels["comm"];
    assert_eq!(comm, "nginx");
    let granted = scrape
        .value("backlogd_listen_backlog_granted", &labels)
        .unwrap();

    let before = tcp_ext(&ns);
    // 400 connections fit in a 512-slot accept queue, not in a 129-slot one.
    let client = nginx.wrk_during_stall(&ns, 400);
    let (kernel, scrape) = closed_interval(&ns, &before, || daemon.scrape());
    Run {
        somaxconn,
        granted,
        client,
        kernel,
        backlogd_drops: drops_in(&scrape, &ns),
        impact: impact_in(daemon, &ns),
    }
}

#[test]
fn nginx_backlog_511_clamped_by_somaxconn_128_then_fixed() {
    let daemon = Daemon::start_with(&["--client-impact-horizon", HORIZON]);
    let before = run(&daemon, 128);
    let after = run(&daemon, 4096);
    let mut table = String::from(
        "\nnginx listen(511), wrk -c400 arriving while the worker is busy for 500 ms, before and after raising somaxconn\n",
    );
    table += &format!(
        "  {:<10}{:>9}{:>16}{:>14}{:>16}{:>14}{:>10}{:>11}  client (wrk)\n",
        "somaxconn",
        "granted",
        "ListenOverflows",
        "ListenDrops",
        "backlogd drops",
        "SYN retrans",
        "delayed",
        "abandoned"
    );
    for r in [&before, &after] {
        table += &format!(
            "  {:<10}{:>9}{:>16}{:>14}{:>16}{:>14}{:>10}{:>11}  {}\n",
            r.somaxconn,
            r.granted,
            r.kernel.listen_overflows,
            r.kernel.listen_drops,
            r.backlogd_drops,
            r.kernel.syn_retrans,
            r.impact.0,
            r.impact.1,
            r.client
        );
    }
    table += "  (SYN retrans: the namespace's TCPSynRetrans, wrk's SYN retransmissions. delayed and \
              abandoned: backlogd's, per attempt; the replay suite's nginx scenarios check them \
              client by client)\n";
    report(&table);
    assert_eq!((before.granted, after.granted), (128.0, 511.0));
    let mut exact = Exact::new(&daemon, "nginx's listener on port 8080, in two namespaces");
    for r in [&before, &after] {
        exact
            .evidence(&format!("somaxconn {}: kernel", r.somaxconn), r.kernel)
            .evidence(&format!("somaxconn {}: client", r.somaxconn), &r.client)
            .eq(
                &format!("somaxconn {}: drops vs ListenDrops", r.somaxconn),
                r.backlogd_drops,
                r.kernel.listen_drops,
            );
    }
    exact.verify();
    assert!(
        before.kernel.listen_drops > 0,
        "the clamped run dropped nothing"
    );
    assert_eq!(after.kernel.listen_drops, 0, "the fix did not fix it");
    // Without a drop there is nothing to delay or abandon.
    assert_eq!(after.impact, (0, 0), "client impact without a drop");
}

#[test]
fn nginx_reuseport_four_workers_show_per_socket_and_group_figures() {
    let daemon = Daemon::start();
    let ns = Netns::new();
    ns.sysctl("net.core.somaxconn", "128");
    ns.sysctl("net.ipv4.tcp_syncookies", "0");
    let _nginx = Nginx::start(&ns, 4, true);
    nginx_sockets(&daemon, &ns, 4);
    let before = tcp_ext(&ns);
    let client = wrk(&ns, 1000);
    let (kernel, scrape) = closed_interval(&ns, &before, || daemon.scrape());
    let netns = ns.inode().to_string();
    let group = [("netns", netns.as_str()), ("port", "8080")];

    let members = scrape.find("backlogd_listen_accepted_total", &group);
    assert_eq!(members.len(), 4, "{}", scrape.text);
    let mut table = format!("\nnginx reuseport, 4 workers, wrk -c1000 ({client})\n");
    for m in &members {
        table += &format!(
            "  socket {:>8}  accepted {:>6}\n",
            m.labels["socket"], m.value
        );
        // The kernel spreads connections over the group: every worker's socket accepted.
        assert!(m.value > 0.0, "{m:?}");
    }
    report(&table);
    assert_eq!(
        scrape.value("backlogd_listen_group_listeners", &group),
        Some(4.0)
    );
    let group_accepted = scrape
        .value("backlogd_listen_group_accepted_total", &group)
        .unwrap() as u64;
    // nginx's count covers both its listeners; port 8081 accepted only the status request.
    let accepted_by_nginx = nginx_accepts(&ns) - 1;
    let mut exact = Exact::new(
        &daemon,
        format!("nginx's SO_REUSEPORT group on port 8080 in netns {netns}"),
    );
    exact
        .evidence("kernel TcpExt deltas", kernel)
        .evidence("client (wrk)", &client)
        .eq(
            "group accepted vs nginx's accepts (stub_status)",
            group_accepted,
            accepted_by_nginx,
        )
        .eq(
            "drops vs ListenDrops",
            drops_in(&scrape, &ns),
            kernel.listen_drops,
        );
    exact.verify();
}
