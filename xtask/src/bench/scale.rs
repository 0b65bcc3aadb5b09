//! Scrape cost at scale (listeners and established connections), with `ss`/`nstat`
//! polling beside it.

use super::*;

pub(super) struct Scrapes {
    pub(super) metrics_ms: Vec<f64>,
    pub(super) metrics_bytes: usize,
    /// Samples on the page.
    pub(super) metrics_series: usize,
    pub(super) snapshot_ms: Vec<f64>,
    pub(super) snapshot_bytes: usize,
    /// Wall time of the daemon's scan passes (the SYN queues' lengths now), one per
    /// scrape as the page reported its last; empty where the kernel has no such pass.
    pub(super) scan_ms: Vec<f64>,
}

pub(super) fn scrapes(d: &Daemon, samples: usize) -> Result<Scrapes> {
    let mut s = Scrapes {
        metrics_ms: Vec::new(),
        metrics_bytes: 0,
        metrics_series: 0,
        snapshot_ms: Vec::new(),
        snapshot_bytes: 0,
        scan_ms: Vec::new(),
    };
    for _ in 0..samples {
        // A second since the last read: this GET pays for a scan pass (the SYN queues'
        // lengths now) as a scrape every 15 s does, and the snapshot after it shares it.
        thread::sleep(Duration::from_millis(1000));
        let (took, body) = d.get("/metrics")?;
        s.metrics_ms.push(took.as_secs_f64() * 1e3);
        s.metrics_bytes = body.len();
        s.scan_ms.extend(
            gauge(&body, "backlogd_syn_queue_read_duration_seconds").map(|secs| secs * 1e3),
        );
        s.metrics_series = body
            .lines()
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .count();
        let (took, body) = d.get("/api/v1/snapshot")?;
        s.snapshot_ms.push(took.as_secs_f64() * 1e3);
        s.snapshot_bytes = body.len();
    }
    Ok(s)
}

/// An unlabelled sample of a /metrics page. Not the suite's `backlogd_tests::Scrape`: the
/// visibility poll below times a page every 100 ms (13 MB with `--quick`'s 2000 listeners),
/// and parsing all of it takes about 0.3 s in xtask's debug build, against 5 ms for this
/// line scan.
pub(super) fn gauge(body: &str, name: &str) -> Option<f64> {
    body.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

/// Wall time and CPU (children's rusage) of one poll of `program args` in the namespace.
pub(super) struct Poll {
    pub(super) label: &'static str,
    pub(super) wall_ms: Vec<f64>,
    pub(super) cpu_ms: Vec<f64>,
    pub(super) bytes: usize,
}

pub(super) fn children_cpu_ms() -> f64 {
    // SAFETY: getrusage fills the struct it is given.
    let ru = unsafe {
        let mut ru = std::mem::zeroed::<libc::rusage>();
        libc::getrusage(libc::RUSAGE_CHILDREN, &mut ru);
        ru
    };
    let ms = |t: libc::timeval| t.tv_sec as f64 * 1e3 + t.tv_usec as f64 / 1e3;
    ms(ru.ru_utime) + ms(ru.ru_stime)
}

pub(super) const POLLS: &[(&str, &str, &[&str])] = &[
    ("`ss -ltn`", "ss", &["-ltn"]),
    ("`nstat -asz` (TcpExt)", "nstat", &["-asz"]),
];

pub(super) fn polls(ns: &Netns, samples: usize) -> Result<Vec<Poll>> {
    POLLS
        .iter()
        .map(|&(label, program, args)| {
            let mut p = Poll {
                label,
                wall_ms: Vec::new(),
                cpu_ms: Vec::new(),
                bytes: 0,
            };
            for _ in 0..samples {
                let cpu0 = children_cpu_ms();
                let start = Instant::now();
                let out = ns
                    .command(program)
                    .args(args)
                    .output()
                    .with_context(|| format!("running {program}"))?;
                p.wall_ms.push(start.elapsed().as_secs_f64() * 1e3);
                p.cpu_ms.push(children_cpu_ms() - cpu0);
                if !out.status.success() {
                    bail!("{program} {args:?}: {}", out.status);
                }
                p.bytes = out.stdout.len();
            }
            Ok(p)
        })
        .collect()
}

pub(super) struct ScaleState {
    pub(super) label: String,
    pub(super) scrapes: Scrapes,
    pub(super) idle_cpu_pct: f64,
    pub(super) memory: Memory,
    pub(super) polls: Vec<Poll>,
}

pub(super) fn scale_state(p: &Params, d: &Daemon, ns: &Netns, label: String) -> Result<ScaleState> {
    let scrapes = scrapes(d, p.samples)?;
    let idle = under_load(&d.proc, None, || {
        thread::sleep(Duration::from_secs_f64(p.idle_secs));
        Ok((0, p.idle_secs))
    })?;
    Ok(ScaleState {
        label,
        scrapes,
        idle_cpu_pct: idle.cpu_pct,
        memory: idle.memory,
        polls: polls(ns, p.samples)?,
    })
}

pub(super) fn scale(p: &Params, r: &mut Report) -> Result<()> {
    let nofile = load::raise_nofile()?;
    if nofile < p.listeners as u64 + 1000 {
        bail!(
            "RLIMIT_NOFILE is {nofile}: too low for {} listeners",
            p.listeners
        );
    }
    let ns = Netns::new()?;
    ns.sysctl("net.core.somaxconn", "65535");
    // Ephemeral ports below the listeners' ports.
    ns.sysctl(
        "net.ipv4.ip_local_port_range",
        &format!("1024 {}", SCALE_PORT - 1),
    );
    // Rescans every 5 s, so the idle CPU figures include sock_diag scans of this namespace.
    let d = Daemon::start("auto", &["--rescan-interval", "5"])?
        .map_err(|e| anyhow!("backlogd did not start: {e}"))?;
    let base = gauge(&d.get("/metrics")?.1, "backlogd_listeners").unwrap_or(0.0);
    let empty = scale_state(p, &d, &ns, "no listeners in the namespace".into())?;

    let start = Instant::now();
    let listeners = load::many_listeners(&ns, SCALE_PORT, p.listeners)?;
    let created = start.elapsed();
    let want = base + p.listeners as f64;
    let visible = poll_until(start, || {
        thread::sleep(Duration::from_millis(100));
        Ok(gauge(&d.get("/metrics")?.1, "backlogd_listeners").unwrap_or(0.0) >= want)
    })?;
    let (_, snap) = d.get("/api/v1/snapshot")?;
    let events_lost = serde_json::from_str::<serde_json::Value>(&snap)?["events_lost"]
        .as_u64()
        .unwrap_or(0);
    let with_listeners = scale_state(p, &d, &ns, format!("{} listeners", p.listeners))?;

    let start = Instant::now();
    let conns =
        load::Established::new(&ns, ESTABLISHED_PORT, ESTABLISHED_LISTENERS, p.established)?;
    let connected = start.elapsed();
    let established_now = output(ns.command("ss").args(["-Htn", "state", "established"]))?
        .lines()
        .count();
    let with_established = scale_state(
        p,
        &d,
        &ns,
        format!(
            "{} listeners + {} established connections",
            p.listeners, p.established
        ),
    )?;

    r.line(format!(
        "A throwaway namespace; backlogd `--hook-mode auto --rescan-interval 5` (so each \
         idle window includes sock_diag rescans). {} listeners on 127.0.0.1 ports {}.. \
         (created in {:.2} s; all on /metrics {} after the first listen(); {events_lost} \
         ring-buffer events lost), then {} connections to {ESTABLISHED_LISTENERS} more \
         listeners (made in {:.1} s by helper processes holding the client ends, {nofile} fds \
         each at most; the server ends wait in the accept queues, unaccepted; `ss` counts \
         {} established sockets, i.e. both ends). \
         {} GETs of each endpoint per state, one at a time; daemon CPU over {} s idle.\n",
        p.listeners,
        SCALE_PORT,
        created.as_secs_f64(),
        visible.map_or("not within 5 s".into(), |ms| format!("{ms:.0} ms")),
        p.established,
        connected.as_secs_f64(),
        established_now,
        p.samples,
        p.idle_secs,
    ));
    let states = [&empty, &with_listeners, &with_established];
    let rows: Vec<Vec<String>> = states
        .iter()
        .map(|s| {
            vec![
                s.label.clone(),
                format!(
                    "{:.1} / {:.1}",
                    median(&s.scrapes.metrics_ms),
                    p95(&s.scrapes.metrics_ms)
                ),
                format!("{:.2}", s.scrapes.metrics_bytes as f64 / 1e6),
                format!(
                    "{:.1} / {:.1}",
                    median(&s.scrapes.snapshot_ms),
                    p95(&s.scrapes.snapshot_ms)
                ),
                format!("{:.2}", s.scrapes.snapshot_bytes as f64 / 1e6),
                if s.scrapes.scan_ms.is_empty() {
                    "-".to_owned()
                } else {
                    format!(
                        "{:.2} / {:.2}",
                        median(&s.scrapes.scan_ms),
                        p95(&s.scrapes.scan_ms)
                    )
                },
                format!("{:.2}%", s.idle_cpu_pct),
                format!("{:.1} / {:.1}", s.memory.rss_mib, s.memory.peak_mib),
            ]
        })
        .collect();
    r.table(
        &[
            "state",
            "/metrics ms median / p95",
            "MB",
            "/api/v1/snapshot ms median / p95",
            "MB",
            "scan pass ms median / p95",
            "daemon idle CPU",
            "RSS / peak MiB",
        ],
        &rows,
    );
    r.line(format!(
        "The whole host's listeners are exported, not only this namespace's: {base:.0} \
         were there before (other engineers' tests, the system's own).\n"
    ));
    r.targets.scrape_ms = Some((p.listeners, median(&with_listeners.scrapes.metrics_ms)));
    r.targets.scrape_established_ms =
        Some((p.established, median(&with_established.scrapes.metrics_ms)));
    r.targets.ss_poll_ms = with_listeners
        .polls
        .iter()
        .find(|poll| poll.label.starts_with("`ss"))
        .map(|poll| median(&poll.wall_ms));
    // The page with the listeners less the page without: their own families and the
    // group and process series they bring (plus the few of the helper process and the
    // namespace, 0.001 per listener).
    r.targets.series_per_listener = Some(
        (with_listeners.scrapes.metrics_series - empty.scrapes.metrics_series) as f64
            / p.listeners as f64,
    );

    r.line("**What a user would poll instead**, in the same namespace and states:\n");
    let mut rows = Vec::new();
    for s in states {
        for poll in &s.polls {
            rows.push(vec![
                poll.label.into(),
                s.label.clone(),
                format!("{:.1} / {:.1}", median(&poll.wall_ms), p95(&poll.wall_ms)),
                format!("{:.1}", median(&poll.cpu_ms)),
                format!("{:.2}", poll.bytes as f64 / 1e6),
            ]);
        }
    }
    r.table(
        &[
            "poll",
            "state",
            "wall ms median / p95",
            "CPU ms",
            "output MB",
        ],
        &rows,
    );
    r.line(
        "What polling cannot tell: `ss -ltn` shows each listener's accept-queue length \
         *now* and its granted backlog, so a burst between two polls is missed and drops \
         are not shown at all (`ss -ltnm`'s `d` is sk_drops, which counts final-ACK \
         overflows twice and also counts segments that were not listen drops); `nstat` \
         has the drop counters only per namespace (ListenOverflows, ListenDrops, \
         TCPReqQFullDrop), with no socket, port or process and no reason split between \
         SYN-time and final-ACK overflow. Neither gives SYNs received per socket, \
         the backlog the application asked for (before the somaxconn clamp), queue \
         peaks, or accept wait. backlogd attributes each of these to the listening \
         socket.\n",
    );
    complaints(r, &d.proc);
    let start = Instant::now();
    drop(conns);
    drop(listeners);
    eprintln!(
        "bench: closed the scale test's sockets in {:.1} s",
        start.elapsed().as_secs_f64()
    );
    Ok(())
}
