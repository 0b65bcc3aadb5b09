//! The real consumer: Prometheus (Debian package) scrapes the daemon, and the shipped
//! alerting rules pass their promtool unit tests.

use std::{
    net::{SocketAddr, TcpListener},
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use backlogd_common::netstat::counter;
use backlogd_tests::{
    Daemon, Exact, Netns,
    figures::Figures,
    http,
    kernel::{closed_interval, tcp_ext, wait_for_rise},
    sockets::{Listener, connect_burst},
};

fn deploy_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/prometheus")
}

#[test]
fn shipped_alert_rules_are_valid_and_pass_their_unit_tests() {
    for args in [
        vec!["check", "rules", "backlogd.rules.yml"],
        vec!["test", "rules", "backlogd.rules.test.yml"],
    ] {
        let out = Command::new("promtool")
            .args(&args)
            .current_dir(deploy_dir())
            .output()
            .expect("promtool (Debian package prometheus; `cargo xtask setup` installs it)");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && text.contains("SUCCESS"),
            "promtool {args:?}: {}\n{text}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

struct Prometheus {
    child: Child,
    addr: SocketAddr,
    dir: PathBuf,
}

impl Prometheus {
    fn start(target: SocketAddr) -> Self {
        // Unique per test: several Prometheus servers may run at once.
        let dir = std::env::temp_dir().join(format!(
            "backlogd-prometheus-{}-{}",
            std::process::id(),
            target.port()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let config = dir.join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
                 scrape_configs:\n  - job_name: backlogd\n    static_configs:\n      \
                 - targets: ['{target}']\n"
            ),
        )
        .unwrap();
        // A free port: bind, read it, release it for Prometheus.
        let addr = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("prometheus (Debian package; `cargo xtask setup` installs it)");
        Self { child, addr, dir }
    }

    /// `GET /api/v1/...`, the JSON body.
    fn api(&self, path_and_query: &str) -> serde_json::Value {
        let (status, body) = http::get(self.addr, path_and_query);
        assert_eq!(status, 200, "{path_and_query}: {body}");
        serde_json::from_str(&body).expect("Prometheus JSON")
    }

    /// Polls an instant query until it returns one sample; its value.
    fn wait_for_value(&self, query: &str) -> f64 {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            // Prometheus may not listen yet: connection errors just mean "not yet".
            if let Ok((200, body)) =
                http::try_get(self.addr, &format!("/api/v1/query?query={}", encode(query)))
                && let Ok(v) = serde_json::from_str::<serde_json::Value>(&body)
                && let Some(sample) = v["data"]["result"].as_array().and_then(|r| r.first())
            {
                return sample["value"][1].as_str().unwrap().parse().unwrap();
            }
            assert!(
                Instant::now() < deadline,
                "Prometheus never returned {query}"
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        self.child.kill().ok();
        self.child.wait().ok();
        std::fs::remove_dir_all(&self.dir).ok();
    }
}

fn encode(q: &str) -> String {
    q.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'_' | b'-' | b'.' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[test]
fn a_real_prometheus_scrapes_backlogd_with_the_right_values_and_types() {
    let daemon = Daemon::start();
    let ns = Netns::new();
    ns.sysctl("net.core.somaxconn", "128");
    ns.sysctl("net.ipv4.tcp_syncookies", "0");
    // nginx's classic: listen(511) clamped to 128; then a burst nobody accepts.
    let listener = Listener::open(&ns, "127.0.0.1:0", 511);
    daemon.wait_for_listener(listener.inode);
    let before = tcp_ext(&ns);
    let start = daemon.program_misses();
    let clients = connect_burst(&ns, listener.addr, 200);
    // The accept queue has room for 129: the other 71 clients were dropped, in the
    // kernel's count, before Prometheus looks.
    wait_for_rise(&ns, counter::LISTEN_DROPS, &before, |rise| rise >= 71);
    let socket = listener.inode.to_string();

    let prometheus = Prometheus::start(daemon.addr);
    let sel = format!("{{socket=\"{socket}\"}}");
    assert_eq!(
        prometheus.wait_for_value(&format!("backlogd_listen_backlog_requested{sel}")),
        511.0
    );
    assert_eq!(
        prometheus.wait_for_value(&format!("backlogd_listen_backlog_granted{sel}")),
        128.0
    );
    // The clients are still retrying, so read both sides after they stop: closing them
    // ends the interval. backlogd's figures for it against the kernel's, then what
    // Prometheus stored against backlogd's.
    drop(clients);
    let (kernel, ours) = closed_interval(&ns, &before, || daemon.scrape());
    let mut exact = Exact::listener(&daemon, &ns, &listener);
    exact.interval(&daemon, &start);
    Figures::of(&ours, &listener).check(&mut exact, &kernel);
    exact.verify();
    let want = ours
        .value(
            "backlogd_listen_drops_total",
            &[("socket", &socket), ("reason", "accept_queue_full")],
        )
        .unwrap();
    let query =
        format!("backlogd_listen_drops_total{{socket=\"{socket}\",reason=\"accept_queue_full\"}}");
    let deadline = Instant::now() + Duration::from_secs(30);
    while prometheus.wait_for_value(&query) != want {
        assert!(
            Instant::now() < deadline,
            "Prometheus never caught up to {want}"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    // Types as Prometheus understood them from the exposition.
    for (metric, ty) in [
        ("backlogd_listen_drops_total", "counter"),
        ("backlogd_listen_backlog_granted", "gauge"),
        ("backlogd_listen_accept_wait_seconds", "histogram"),
    ] {
        let meta = prometheus.api(&format!("/api/v1/metadata?metric={metric}"));
        assert_eq!(meta["data"][metric][0]["type"], ty, "{metric}: {meta}");
    }
    // Every label backlogd documents arrives.
    let series = prometheus.api(&format!(
        "/api/v1/series?match[]={}",
        encode(&format!("backlogd_listen_backlog_granted{sel}"))
    ));
    let labels = &series["data"][0];
    for label in ["netns", "address", "port", "socket", "pid", "comm"] {
        assert!(labels.get(label).is_some(), "{label} missing: {labels}");
    }
    assert_eq!(labels["netns"], ns.inode().to_string());
}

/// Every `backlogd_*` name in a PromQL expression.
fn metric_names(expr: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = expr;
    while let Some(i) = rest.find("backlogd_") {
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        names.push(tail[..end].to_owned());
        rest = &tail[end..];
    }
    names
}

#[test]
fn grafana_dashboard_parses_and_every_query_uses_real_metrics() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/grafana/backlogd.json");
    let dashboard: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).expect("dashboard JSON");
    let mut exprs: Vec<String> = dashboard["panels"]
        .as_array()
        .expect("panels")
        .iter()
        .flat_map(|p| p["targets"].as_array().cloned().unwrap_or_default())
        .map(|t| t["expr"].as_str().expect("expr").to_owned())
        .collect();
    exprs.extend(
        dashboard["templating"]["list"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|v| v["definition"].as_str().map(str::to_owned)),
    );
    assert!(exprs.len() >= 10, "{exprs:?}");

    // A daemon with a listener that dropped, so every family has samples.
    let daemon = Daemon::start();
    let ns = Netns::new();
    ns.sysctl("net.ipv4.tcp_syncookies", "0");
    let listener = Listener::open(&ns, "127.0.0.1:0", 2);
    daemon.wait_for_listener(listener.inode);
    let before = tcp_ext(&ns);
    let clients = connect_burst(&ns, listener.addr, 10);
    // The queue holds 3: the other 7 dropped, in the kernel's count.
    wait_for_rise(&ns, counter::LISTEN_DROPS, &before, |rise| rise >= 7);
    drop(clients);
    let scrape = daemon.scrape();
    for expr in &exprs {
        for name in metric_names(expr) {
            assert!(
                scrape.samples.iter().any(|s| s.name == name),
                "dashboard query uses {name}, which backlogd does not export: {expr}"
            );
        }
    }

    // And Prometheus itself accepts every query (with Grafana's variables filled in).
    let prometheus = Prometheus::start(daemon.addr);
    prometheus.wait_for_value("backlogd_listeners");
    for expr in exprs.iter().filter(|e| !e.starts_with("label_values")) {
        let q = expr
            .replace("$__rate_interval", "1m")
            .replace("\"$netns\"", "\".*\"")
            .replace("\"$port\"", "\".*\"")
            .replace("\"$comm\"", "\".*\"")
            .replace("\"$unit\"", "\".*\"")
            .replace("\"$pod_namespace\"", "\".*\"")
            .replace("\"$pod\"", "\".*\"")
            .replace("\"$pod_uid\"", "\".*\"");
        let v = prometheus.api(&format!("/api/v1/query?query={}", encode(&q)));
        assert_eq!(v["status"], "success", "{q}: {v}");
        // The owner join (unit, pod selectors) keeps listeners that have no owner names:
        // this test's own listener has none. (Rates need a second scrape: instant queries.)
        if q.contains("backlogd_listener_owner_info") && !q.contains("rate(") {
            let result = v["data"]["result"].as_array().map_or(0, Vec::len);
            assert!(result > 0, "{q} lost every listener: {v}");
        }
    }
}
