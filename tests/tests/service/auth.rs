//! Basic auth and TLS from a Prometheus web-config file, and wrong passwords at volume.

use std::{
    io::Write as _,
    net::{SocketAddr, TcpStream},
    process::Command,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    thread::JoinHandle,
    time::Duration,
};

use backlogd_tests::{
    Daemon,
    http::{self, basic, exchange, get_request, raw, read_one_response},
    tempdir::TempDir,
    tools,
};

use crate::support::*;

fn get_with_auth(addr: SocketAddr, auth: Option<&str>) -> String {
    use std::fmt::Write as _;
    let mut req = String::from("GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n");
    if let Some(a) = auth {
        let _ = write!(req, "Authorization: Basic {a}\r\n");
    }
    req.push_str("\r\n");
    raw(addr, req.as_bytes())
}

#[test]
fn basic_auth_from_a_web_config_file_rejects_and_accepts() {
    let dir = TempDir::new("auth");
    let web = dir.write(
        "web.yml",
        &format!("basic_auth_users:\n  prometheus: {HASH}\n"),
    );
    let daemon = Daemon::start_with(&["--web-config-file", web.to_str().unwrap()]);
    let good = basic("prometheus", "scrape-secret");
    let wrong = basic("prometheus", "wrong");
    let stranger = basic("nobody", "scrape-secret");
    let none = get_with_auth(daemon.addr, None);
    assert!(none.starts_with("HTTP/1.1 401"), "{none}");
    assert!(none.contains("www-authenticate: Basic"), "{none}");
    for bad in [wrong.as_str(), stranger.as_str(), "!!notbase64"] {
        let r = get_with_auth(daemon.addr, Some(bad));
        assert!(r.starts_with("HTTP/1.1 401"), "{bad}: {r}");
    }
    let ok = get_with_auth(daemon.addr, Some(&good));
    assert!(
        ok.starts_with("HTTP/1.1 200") && ok.contains("backlogd_hook_mode"),
        "{ok}"
    );
}

/// An attacker with a wrong password: keeps a connection alive and sends request after
/// request on it, 5 ms apart, reconnecting whenever the server closes it. Counts answers
/// by status (401s, anything else) and connections.
fn wrong_password_client(
    addr: SocketAddr,
    auth: String,
    stop: Arc<AtomicBool>,
    counts: Arc<[AtomicU64; 3]>,
) -> JoinHandle<()> {
    std::thread::spawn(move || {
        let request =
            format!("GET /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: Basic {auth}\r\n\r\n");
        while !stop.load(Ordering::Relaxed) {
            let Ok(mut s) = TcpStream::connect(addr) else {
                std::thread::sleep(Duration::from_millis(5));
                continue;
            };
            counts[2].fetch_add(1, Ordering::Relaxed);
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            while !stop.load(Ordering::Relaxed) {
                if s.write_all(request.as_bytes()).is_err() {
                    break;
                }
                match read_one_response(&mut s) {
                    Ok(401) => counts[0].fetch_add(1, Ordering::Relaxed),
                    Ok(_) => counts[1].fetch_add(1, Ordering::Relaxed),
                    Err(_) => break,
                };
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    })
}

/// One scrape attempt on a new connection: "200" (with the whole exposition), another
/// status, or what went wrong.
fn scrape_attempt(addr: SocketAddr, auth: &str) -> String {
    match exchange(addr, &get_request("/metrics", Some(auth), "")) {
        Ok(r) if r.status == 200 => {
            let body = match r.complete_body() {
                Ok(body) => body,
                Err(e) => return format!("200 {e}"),
            };
            let text = String::from_utf8_lossy(&body);
            assert!(text.contains("backlogd_build_info"), "{text}");
            "200".into()
        }
        Ok(r) => r.status.to_string(),
        Err(e) => format!("failed: {e}"),
    }
}

#[test]
fn wrong_passwords_cannot_take_every_slot_or_lock_out_a_scraper_with_the_right_one() {
    const MAX: usize = 8;
    const ATTACKERS: usize = 3 * MAX;
    let dir = TempDir::new("auth-flood");
    // Two users with the same password: their credentials are remembered separately.
    let web = dir.write(
        "web.yml",
        &format!("basic_auth_users:\n  prometheus: {HASH}\n  grafana: {HASH}\n"),
    );
    let daemon = Daemon::start_with(&[
        "--web-config-file",
        web.to_str().unwrap(),
        "--http-max-connections",
        "8",
    ]);
    let addr = daemon.addr;
    let prometheus = basic("prometheus", "scrape-secret");
    let grafana = basic("grafana", "scrape-secret");
    // prometheus scrapes before the flood: its credentials are checked and remembered.
    assert_eq!(scrape_attempt(addr, &prometheus), "200");

    let stop = Arc::new(AtomicBool::new(false));
    let counts: Arc<[AtomicU64; 3]> = Arc::new(Default::default());
    let attackers: Vec<_> = (0..ATTACKERS)
        .map(|i| {
            let user = if i % 2 == 0 { "prometheus" } else { "grafana" };
            wrong_password_client(
                addr,
                basic(user, &format!("guess-{i}")),
                stop.clone(),
                counts.clone(),
            )
        })
        .collect();
    // The flood at full force before the scrapers try: 100 wrong passwords answered, and
    // more connections made than the limit has slots. (Waited for: how fast it gets there
    // is the machine's, not a property of backlogd.)
    eventually("the flood answered 100 times past the limit", HANG, || {
        let answered = counts[0].load(Ordering::Relaxed);
        let connections = counts[2].load(Ordering::Relaxed);
        (answered >= 100 && connections > ATTACKERS as u64).then_some(())
    });

    // Under the flood, the scraper whose credentials were remembered: every scrape.
    let remembered: Vec<String> = (0..10)
        .map(|_| {
            let outcome = scrape_attempt(addr, &prometheus);
            std::thread::sleep(Duration::from_millis(300));
            outcome
        })
        .collect();
    // And one whose credentials were never checked (a new scraper, or any scraper after a
    // restart or a reload, which start with nothing remembered): it must get in within 20
    // attempts 500 ms apart, and from then on every time.
    let mut fresh = Vec::new();
    while fresh.len() < 20 && fresh.last().is_none_or(|o| o != "200") {
        if !fresh.is_empty() {
            std::thread::sleep(Duration::from_millis(500));
        }
        fresh.push(scrape_attempt(addr, &grafana));
    }
    let after: Vec<String> = (0..5).map(|_| scrape_attempt(addr, &grafana)).collect();
    stop.store(true, Ordering::Relaxed);
    for a in attackers {
        a.join().unwrap();
    }
    let [unauthorized, other, connections] = counts.as_ref();
    let (unauthorized, other, connections) = (
        unauthorized.load(Ordering::Relaxed),
        other.load(Ordering::Relaxed),
        connections.load(Ordering::Relaxed),
    );
    eprintln!(
        "{ATTACKERS} wrong-password clients (limit {MAX}): {unauthorized} answered 401, \
         {other} otherwise, over {connections} connections; remembered scraper: \
         {remembered:?}; new scraper: {fresh:?} then {after:?}"
    );
    assert_eq!(other, 0, "a wrong password was answered other than 401");
    assert!(
        connections > ATTACKERS as u64,
        "the flood never hit the limit ({connections} connections)"
    );
    assert!(
        remembered.iter().all(|o| o == "200"),
        "the remembered scraper under the flood: {remembered:?}"
    );
    assert_eq!(
        fresh.last().map(String::as_str),
        Some("200"),
        "a scraper with the right password, never checked before, under a flood of wrong \
         ones: {fresh:?}"
    );
    assert!(
        after.iter().all(|o| o == "200"),
        "after its first success: {after:?}"
    );
}

#[test]
fn tls_from_a_web_config_file() {
    let test = "tls_from_a_web_config_file";
    if !tools::available(test, "openssl", &["version"], "openssl")
        || !tools::available(test, "curl", &["--version"], "curl")
    {
        return;
    }
    let dir = TempDir::new("tls");
    let made = Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=localhost",
            "-keyout",
        ])
        .arg(dir.path().join("key.pem"))
        .arg("-out")
        .arg(dir.path().join("cert.pem"))
        .output()
        .unwrap();
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    let web = dir.write(
        "web.yml",
        "tls_server_config:\n  cert_file: cert.pem\n  key_file: key.pem\n",
    );
    let daemon = Daemon::start_with(&["--web-config-file", web.to_str().unwrap()]);
    let serving = daemon.wait_for_log("serving metrics on");
    assert!(
        serving.contains("https://") && serving.contains("TLS on"),
        "{serving}"
    );
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "5", "--cacert"])
        .arg(dir.path().join("cert.pem"))
        .arg(format!("https://localhost:{}/metrics", daemon.addr.port()))
        .output()
        .unwrap();
    let body = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && body.contains("backlogd_hook_mode"),
        "curl: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Plain HTTP to the TLS port gets no metrics.
    assert!(http::try_get(daemon.addr, "/metrics").map_or(true, |(s, _)| s != 200));
}
