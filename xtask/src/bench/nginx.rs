//! Handshake capacity of a real server: nginx answering wrk with `Connection: close`, one
//! handshake per request, in alternating pairs without and with the daemon.

use std::{os::unix::process::CommandExt as _, path::PathBuf};

use super::*;

/// nginx's port inside the benchmark's namespace.
const NGINX_PORT: u16 = 8090;

/// nginx (Debian's) in the namespace with one worker and `backlog=511`; killed with its
/// workers on drop.
struct Nginx {
    child: std::process::Child,
    dir: PathBuf,
}

impl Nginx {
    fn start(ns: &Netns) -> Result<Self> {
        let dir = crate::workspace_root().join("target/bench/nginx");
        std::fs::create_dir_all(&dir)?;
        let d = dir.display();
        let conf = format!(
            "worker_processes 1;\npid {d}/nginx.pid;\nerror_log {d}/error.log;\n\
             events {{ worker_connections 4096; }}\n\
             http {{\n  access_log off;\n  client_body_temp_path {d}; proxy_temp_path {d};\n  \
             fastcgi_temp_path {d}; uwsgi_temp_path {d}; scgi_temp_path {d};\n  \
             server {{ listen 127.0.0.1:{NGINX_PORT} backlog=511; \
             location / {{ return 200 \"ok\\n\"; }} }}\n}}\n"
        );
        let conf_path = dir.join("nginx.conf");
        std::fs::write(&conf_path, conf)?;
        let child = ns
            .command("nginx")
            .arg("-c")
            .arg(&conf_path)
            .args(["-g", "daemon off;"])
            // Master and worker in one new process group, so Drop ends them both.
            .process_group(0)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .context("starting nginx (Debian package nginx-light; `cargo xtask setup`)")?;
        let nginx = Self { child, dir };
        // Serving once it accepts a connection.
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], NGINX_PORT));
        let deadline = Instant::now() + Duration::from_secs(10);
        while ns
            .scoped(|| Ok(std::net::TcpStream::connect(addr)?))
            .is_err()
        {
            if Instant::now() > deadline {
                bail!(
                    "nginx does not answer on 127.0.0.1:{NGINX_PORT}; its log: {}",
                    std::fs::read_to_string(nginx.dir.join("error.log")).unwrap_or_default()
                );
            }
            thread::sleep(Duration::from_millis(100));
        }
        Ok(nginx)
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        // SAFETY: kill(2) on our own child's process group.
        unsafe { libc::kill(-(self.child.id() as i32), libc::SIGKILL) };
        let _ = self.child.wait();
    }
}

/// Requests per second wrk got in `secs` (whole seconds, at least 1: wrk takes no
/// fractions; one thread, 32 connections, a new connection per request), failing if any
/// request failed.
fn wrk(ns: &Netns, secs: f64) -> Result<f64> {
    let out = output(ns.command("wrk").args([
        "-t1",
        "-c32",
        &format!("-d{}s", secs.round().max(1.0) as u64),
        "-H",
        "Connection: close",
        &format!("http://127.0.0.1:{NGINX_PORT}/"),
    ]))?;
    if let Some(errors) = out.lines().find(|l| l.contains("Socket errors")) {
        bail!("wrk: {}", errors.trim());
    }
    out.lines()
        .find_map(|l| l.strip_prefix("Requests/sec:"))
        .and_then(|v| v.trim().parse().ok())
        .with_context(|| format!("no Requests/sec in wrk's output: {out}"))
}

pub(super) fn nginx_capacity(p: &Params, ns: &Netns, r: &mut Report) -> Result<()> {
    for tool in ["nginx", "wrk"] {
        if output(Command::new("sh").args(["-c", &format!("command -v {tool}")])).is_err() {
            r.line(format!(
                "{tool} is not installed (`cargo xtask setup` installs it).\n"
            ));
            return Ok(());
        }
    }
    let _nginx = Nginx::start(ns)?;
    // Warm-up: the first run in a namespace is slower.
    wrk(ns, 1.0)?;
    let mut mode = String::new();
    let pairs = alternating_pairs(p, || auto_daemon(&mut mode), || wrk(ns, p.capacity_secs))?;
    r.line(format!(
        "Debian's nginx (1 worker, `listen ... backlog=511`, `return 200`) in the \
         benchmark's namespace, `wrk -t1 -c32 -H 'Connection: close'`: one handshake per \
         request. {} s per run, {} pairs alternating without/with backlogd \
         (`--hook-mode auto`: {mode}), order swapped every other pair; a run with any \
         socket error fails the section.\n",
        p.capacity_secs, p.capacity_pairs
    ));
    r.targets.nginx = Some(report_pairs(r, "without (requests/s)", "with", pairs));
    r.targets.host_mode = Some(mode);
    Ok(())
}
