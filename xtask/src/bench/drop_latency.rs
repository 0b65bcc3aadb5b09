//! How long a drop takes to show on /metrics and in the JSON API.

use super::*;

/// The listener's accept_queue_full drops as /metrics shows them. A scan of the matching
/// lines, not the suite's `backlogd_tests::Scrape`: the time to see a drop (a few ms)
/// includes this, and parsing every sample of the page (every listener on the host, the
/// other engineers' tests' included) takes 0.5 ms per 20 kB in xtask's debug build.
pub(super) fn metrics_drops(d: &Daemon, netns: u64, port: u16) -> Result<f64> {
    let (_, body) = d.get("/metrics")?;
    let (netns, port) = (format!("netns=\"{netns}\""), format!("port=\"{port}\""));
    Ok(body
        .lines()
        .filter(|l| l.starts_with("backlogd_listen_drops_total{"))
        .filter(|l| l.contains("reason=\"accept_queue_full\"") && l.contains(&netns))
        .filter(|l| l.contains(&port))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum())
}

/// The same from /api/v1/snapshot; None while the listener is not there.
pub(super) fn snapshot_drops(d: &Daemon, netns: u64, port: u16) -> Result<Option<u64>> {
    let (_, body) = d.get("/api/v1/snapshot")?;
    let v: serde_json::Value = serde_json::from_str(&body)?;
    Ok(v["listeners"]
        .as_array()
        .context("snapshot without listeners")?
        .iter()
        .find(|l| l["netns"].as_u64() == Some(netns) && l["port"].as_u64() == Some(port.into()))
        .and_then(|l| l["drops"]["accept_queue_full"].as_u64()))
}

/// Polls `seen` until it is true; the time since `since`, or None after 5 s.
pub(super) fn poll_until(
    since: Instant,
    mut seen: impl FnMut() -> Result<bool>,
) -> Result<Option<f64>> {
    while since.elapsed() < Duration::from_secs(5) {
        if seen()? {
            return Ok(Some(since.elapsed().as_secs_f64() * 1e3));
        }
    }
    Ok(None)
}

pub(super) fn drop_latency(p: &Params, ns: &Netns, r: &mut Report) -> Result<()> {
    let d = Daemon::start("auto", &[])?.map_err(|e| anyhow!("backlogd did not start: {e}"))?;
    let full = FullListener::new(ns)?;
    let (netns, port) = (ns.inode(), full.addr.port());
    let seen = poll_until(Instant::now(), || {
        Ok(snapshot_drops(&d, netns, port)?.is_some())
    })?;
    if seen.is_none() {
        bail!("the listener on port {port} did not appear in /api/v1/snapshot within 5 s");
    }
    let (mut metrics_ms, mut json_ms, mut lost) = (Vec::new(), Vec::new(), 0);
    for i in 0..p.drop_samples {
        let m0 = metrics_drops(&d, netns, port)?;
        let j0 = snapshot_drops(&d, netns, port)?.unwrap_or(0);
        let start = Instant::now();
        ns.scoped(|| {
            let before = load::tcp_ext_here("ListenOverflows")?;
            full.one_syn()?;
            // Loopback delivers the SYN in the sender's softirq: the drop has happened (and
            // is counted) by the time connect() returns; allow a little slack regardless.
            let deadline = Instant::now() + Duration::from_millis(100);
            while load::tcp_ext_here("ListenOverflows")? <= before {
                if Instant::now() > deadline {
                    bail!("the SYN was not dropped (ListenOverflows unchanged)");
                }
            }
            Ok(())
        })?;
        let (m, j) = thread::scope(|s| {
            let m = s.spawn(|| poll_until(start, || Ok(metrics_drops(&d, netns, port)? > m0)));
            let j = s.spawn(|| {
                poll_until(start, || {
                    Ok(snapshot_drops(&d, netns, port)?.unwrap_or(0) > j0)
                })
            });
            (m.join(), j.join())
        });
        let m = m.map_err(|_| anyhow!("poller panicked"))??;
        let j = j.map_err(|_| anyhow!("poller panicked"))??;
        match (m, j) {
            (Some(m), Some(j)) => {
                metrics_ms.push(m);
                json_ms.push(j);
            }
            _ => lost += 1,
        }
        // Spread the samples over the daemon's internal timers' phases.
        thread::sleep(Duration::from_millis(150 + (i as u64 * 97) % 200));
    }
    r.line(format!(
        "{} drops provoked one at a time (one SYN to a backlog-1 listener with a full \
         accept queue; the namespace's TcpExt ListenOverflows confirmed each), then \
         /metrics and /api/v1/snapshot polled back to back by two threads until the \
         listener's `accept_queue_full` count rose. Time from the connect() that caused \
         the drop to the first response showing it (so it includes one request's own \
         time).\n",
        p.drop_samples
    ));
    r.table(
        &["endpoint", "median", "max", "samples"],
        &[
            vec![
                "/metrics".into(),
                format!("{:.1} ms", median(&metrics_ms)),
                format!("{:.1} ms", max(&metrics_ms)),
                format!("{}", metrics_ms.len()),
            ],
            vec![
                "/api/v1/snapshot".into(),
                format!("{:.1} ms", median(&json_ms)),
                format!("{:.1} ms", max(&json_ms)),
                format!("{}", json_ms.len()),
            ],
        ],
    );
    if lost > 0 {
        r.line(format!("{lost} drop(s) did not show within 5 s.\n"));
    }
    if !metrics_ms.is_empty() {
        r.targets.drop_visible_ms = Some((
            max(&metrics_ms).max(max(&json_ms)),
            median(&metrics_ms).max(median(&json_ms)),
        ));
    }
    Ok(())
}
