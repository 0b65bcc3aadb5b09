//! Traffic that never meets a listen queue: small UDP datagrams and small TCP messages
//! over loopback (iperf3 in the benchmark's namespace), in alternating pairs without and
//! with the daemon; then what each of backlogd's programs ran per message, from bpf_stats
//! enabled for that window only (the pairs run with `kernel.bpf_stats_enabled` as it was,
//! since bpf_stats adds two clock reads to every run it measures).

use super::*;

/// A bulk flow over loopback, with the iperf3 arguments that make it.
struct Flow {
    label: &'static str,
    unit: &'static str,
    /// Bytes per message (`-l`): delivered messages = received bytes / this.
    len: u64,
    args: &'static [&'static str],
}

const FLOWS: [Flow; 2] = [
    Flow {
        label: "UDP, 64-byte datagrams",
        unit: "datagram",
        len: 64,
        args: &["-u", "-b", "0"],
    },
    Flow {
        label: "TCP, 128-byte writes, TCP_NODELAY",
        unit: "128-byte write",
        len: 128,
        args: &["-N"],
    },
];

/// iperf3's port inside the benchmark's namespace (no listener of the benchmark uses it).
const IPERF3_PORT: &str = "5201";

/// An iperf3 server in the namespace, killed on drop.
struct Server(std::process::Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Messages per second the receiver got in one run of `flow`.
fn rate(ns: &Netns, flow: &Flow, secs: f64) -> Result<f64> {
    let len = flow.len.to_string();
    let time = format!("{secs}");
    let json = output(
        ns.command("iperf3")
            .args([
                "-c",
                "127.0.0.1",
                "-p",
                IPERF3_PORT,
                "-J",
                "-l",
                &len,
                "-t",
                &time,
            ])
            .args(flow.args),
    )?;
    let v: serde_json::Value = serde_json::from_str(&json).context("iperf3's JSON")?;
    let got = &v["end"]["sum_received"];
    let (Some(bytes), Some(seconds)) = (got["bytes"].as_f64(), got["seconds"].as_f64()) else {
        bail!("no end.sum_received in iperf3's JSON: {json}");
    };
    Ok(bytes / flow.len as f64 / seconds)
}

pub(super) fn bystander(p: &Params, ns: &Netns, r: &mut Report) -> Result<()> {
    if output(Command::new("sh").args(["-c", "command -v iperf3"])).is_err() {
        r.line("iperf3 is not installed (`cargo xtask setup` installs it).\n");
        return Ok(());
    }
    let _server = Server(
        ns.command("iperf3")
            .args(["-s", "-B", "127.0.0.1", "-p", IPERF3_PORT])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .context("starting iperf3 -s")?,
    );
    thread::sleep(Duration::from_millis(300));
    r.line(format!(
        "iperf3 over loopback in the benchmark's namespace, one stream, {} s per run, {} \
         pairs alternating without/with backlogd (`--hook-mode auto`), order swapped every \
         other pair; the rate is what the receiver got. No listen queue is involved beyond \
         iperf3's own control connection.\n",
        p.capacity_secs, p.capacity_pairs
    ));
    let mut auto = String::new();
    for flow in &FLOWS {
        // Warm-up: the first run in a namespace is slower.
        rate(ns, flow, 1.0)?;
        let pairs = alternating_pairs(
            p,
            || auto_daemon(&mut auto),
            || rate(ns, flow, p.capacity_secs),
        )?;
        r.line(format!("**{}** (with: {auto} mode)\n", flow.label));
        let ratio = report_pairs(r, &format!("without ({}s/s)", flow.unit), "with", pairs);
        r.targets.bystander.push((flow.label, ratio));
    }
    r.targets.host_mode = Some(auto.clone());

    let stats = BpfStats::enable()?;
    r.line(format!(
        "What backlogd's programs ran per message, one {} s run of each flow per mode \
         (bpf_stats on for these runs only; its own clock reads are in the figures):\n",
        p.capacity_secs
    ));
    for mode in MODES {
        let d = match Daemon::start(mode, &[])? {
            Ok(d) => d,
            Err(why) => {
                r.line(format!("- `--hook-mode {mode}`: not supported here: {why}"));
                continue;
            }
        };
        thread::sleep(Duration::from_millis(500));
        let names = procs::prog_names()?;
        let mut rows = Vec::new();
        for flow in &FLOWS {
            let before = d.proc.prog_stats()?;
            let started = Instant::now();
            let messages = rate(ns, flow, p.capacity_secs)? * p.capacity_secs;
            let took = started.elapsed();
            let after = d.proc.prog_stats()?;
            let mut total_ns = 0.0;
            for (id, a) in &after {
                let b = before.get(id).copied().unwrap_or_default();
                let runs = (a.run_cnt - b.run_cnt) as f64;
                if runs < messages / 100.0 {
                    continue; // not a per-message program
                }
                let ns_run = (a.run_time_ns - b.run_time_ns) as f64 / runs;
                total_ns += ns_run * runs / messages;
                let (name, kind) = names.get(id).cloned().unwrap_or_default();
                rows.push(vec![
                    flow.label.to_owned(),
                    format!("`{name}`"),
                    kind,
                    format!("{:.2}", runs / messages),
                    format!("{ns_run:.0}"),
                ]);
            }
            if procs::labelled(mode) == auto {
                r.targets.bystander_ns.push((flow.label, total_ns));
            }
            rows.push(vec![
                flow.label.to_owned(),
                "**all, per message**".into(),
                String::new(),
                String::new(),
                format!("**{total_ns:.0} ns** ({:.1} s window)", took.as_secs_f64()),
            ]);
        }
        r.line(format!("**`{}`**\n", procs::labelled(mode)));
        r.table(
            &["flow", "program", "type", "runs per message", "ns/run"],
            &rows,
        );
    }
    drop(stats);
    Ok(())
}
