//! The README's burst plot: one listener's figures in `/api/v1/snapshot`, read every
//! [`EVERY`] from before the burst until after it, drawn against time with plotters' SVG
//! backend (no font crate: an SVG's text is laid out by whatever shows it). The samples go
//! beside the plot as CSV, so every bar and point can be checked against what was served.

use std::{
    fmt::Write as _,
    net::SocketAddr,
    path::Path,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, anyhow, bail};
use backlogd_common::DropReason;
use plotters::prelude::*;

/// How often the sampler reads the snapshot.
pub const EVERY: Duration = Duration::from_millis(100);

/// One read of the listener: cumulative counters, as served.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    /// Seconds from the burst (negative before it): the middle of the request.
    pub t: f64,
    pub syns_received: u64,
    pub drops: [u64; DropReason::COUNT],
    pub accept_depth: u64,
    pub accept_max: u64,
    /// The accept queue's capacity (`granted`).
    pub granted: u64,
}

/// A thread reading `/api/v1/snapshot` every [`EVERY`], from [`Sampler::start`] until
/// [`Sampler::finish`].
pub struct Sampler {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<Vec<(Instant, Result<Sample>)>>,
}

impl Sampler {
    /// Samples the listener on `port` in network namespace `netns`.
    pub fn start(api: SocketAddr, netns: u64, port: u16) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut samples = Vec::new();
            let mut next = Instant::now();
            while !stopped.load(Ordering::Relaxed) {
                let sent = Instant::now();
                let sample = backlogd_tests::http::try_get(api, "/api/v1/snapshot")
                    .map_err(anyhow::Error::from)
                    .and_then(|(status, body)| {
                        if status != 200 {
                            bail!("HTTP {status}: {body}");
                        }
                        parse(&body, netns, port)
                    });
                let got = Instant::now();
                samples.push((sent + (got - sent) / 2, sample));
                next += EVERY;
                let now = Instant::now();
                if next < now {
                    next = now;
                }
                std::thread::sleep(next - now);
            }
            samples
        });
        Self { stop, thread }
    }

    /// Waits until `until` after `burst`, stops, and returns the samples with their time
    /// from `burst`. Fails on a failed read.
    pub fn finish(self, burst: Instant, until: Duration) -> Result<Vec<Sample>> {
        if let Some(wait) = (burst + until).checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        self.stop.store(true, Ordering::Relaxed);
        let samples = self
            .thread
            .join()
            .map_err(|_| anyhow!("the snapshot sampler panicked"))?;
        samples
            .into_iter()
            .map(|(at, sample)| {
                let mut sample = sample.context("sampling /api/v1/snapshot")?;
                sample.t = match at.checked_duration_since(burst) {
                    Some(after) => after.as_secs_f64(),
                    None => -(burst - at).as_secs_f64(),
                };
                Ok(sample)
            })
            .collect()
    }
}

/// The listener on `port` in `netns` from a snapshot's JSON (`t` left at 0).
fn parse(body: &str, netns: u64, port: u16) -> Result<Sample> {
    let snapshot: serde_json::Value = serde_json::from_str(body).context("snapshot JSON")?;
    let listener = snapshot["listeners"]
        .as_array()
        .context("no listeners in the snapshot")?
        .iter()
        .find(|l| l["netns"] == netns && l["port"] == port)
        .with_context(|| format!("no listener on port {port} in netns {netns}"))?;
    let number = |v: &serde_json::Value, what: &str| {
        v.as_u64()
            .with_context(|| format!("{what} is not a number: {v}"))
    };
    let mut drops = [0; DropReason::COUNT];
    for reason in DropReason::ALL {
        drops[reason] = number(&listener["drops"][reason.name()], reason.name())?;
    }
    let queues = &listener["queues"];
    Ok(Sample {
        t: 0.0,
        syns_received: number(&listener["syns_received"], "syns_received")?,
        drops,
        accept_depth: number(&queues["accept_depth"], "queues.accept_depth")?,
        accept_max: number(&queues["accept_max"], "queues.accept_max")?,
        granted: number(&listener["granted"], "granted")?,
    })
}

/// The samples as CSV, one line each, the counters as served (cumulative).
pub fn csv(samples: &[Sample]) -> String {
    let mut out = String::from("seconds_from_burst,syns_received");
    for reason in DropReason::ALL {
        let _ = write!(out, ",drops_{}", reason.name());
    }
    out.push_str(",accept_depth,accept_max,granted\n");
    for s in samples {
        let _ = write!(out, "{:.3},{}", s.t, s.syns_received);
        for n in s.drops {
            let _ = write!(out, ",{n}");
        }
        let _ = writeln!(out, ",{},{},{}", s.accept_depth, s.accept_max, s.granted);
    }
    out
}

/// What one interval between two samples saw: its span and the segments dropped in it,
/// by reason, and the SYNs received.
#[derive(Debug, PartialEq)]
struct Interval {
    from: f64,
    to: f64,
    drops: [u64; DropReason::COUNT],
    syns: u64,
}

fn intervals(samples: &[Sample]) -> Vec<Interval> {
    samples
        .windows(2)
        .map(|w| Interval {
            from: w[0].t,
            to: w[1].t,
            drops: std::array::from_fn(|i| w[1].drops[i].saturating_sub(w[0].drops[i])),
            syns: w[1].syns_received.saturating_sub(w[0].syns_received),
        })
        .collect()
}

/// How each reason is named and coloured in the plot.
fn legend(reason: DropReason) -> (&'static str, RGBColor) {
    match reason {
        DropReason::AcceptQueueFull => ("SYNs dropped: accept queue full", RGBColor(214, 39, 40)),
        DropReason::SynQueueFull => ("SYNs dropped: SYN queue full", RGBColor(255, 127, 14)),
        DropReason::FinalAckOverflow => (
            "final ACKs dropped: accept queue full",
            RGBColor(148, 103, 189),
        ),
        DropReason::Other => ("other listen drops", RGBColor(127, 127, 127)),
    }
}

/// Writes the plot of `samples` to `path`: segments dropped per sample interval by reason
/// (stacked), with the SYNs received in it, above the accept queue's length and capacity.
/// `title` heads it; `asked` is the backlog the server passed to `listen()`.
pub fn plot(samples: &[Sample], title: &str, asked: u32, path: &Path) -> Result<()> {
    let (Some(first), Some(last)) = (samples.first(), samples.last()) else {
        bail!("no samples to plot");
    };
    let granted = last.granted;
    let intervals = intervals(samples);
    let reasons: Vec<DropReason> = DropReason::ALL
        .into_iter()
        .filter(|&r| intervals.iter().any(|i| i.drops[r] > 0))
        .collect();
    let only_syns = reasons
        .iter()
        .all(|r| matches!(r, DropReason::AcceptQueueFull | DropReason::SynQueueFull));
    // Whole half seconds around the samples.
    let x = (first.t * 2.0).floor() / 2.0..(last.t * 2.0).ceil() / 2.0;
    let top = intervals
        .iter()
        .map(|i| i.syns.max(i.drops.iter().sum()))
        .max()
        .unwrap_or(0)
        .max(1) as f64
        * 1.3; // room for the legend
    let peak = samples.iter().map(|s| s.accept_depth).max().unwrap_or(0);
    let queue_top = peak.max(granted) as f64 * 1.2;

    let root = SVGBackend::new(path, (960, 640)).into_drawing_area();
    root.fill(&WHITE).map_err(plotting)?;
    let root = root
        .titled(title, ("sans-serif", 20).into_font().style(FontStyle::Bold))
        .map_err(plotting)?;
    let (upper, lower) = root.split_vertically(330);

    let segments = if only_syns {
        "SYNs"
    } else {
        "SYNs and final ACKs"
    };
    let mut chart = panel(
        &upper,
        &format!(
            "{segments} dropped per sample interval (~{} ms), by reason; a retransmitted SYN counts again",
            EVERY.as_millis()
        ),
        (x.clone(), 0.0..top),
        None,
        "segments per interval",
    )?;
    let mut base = vec![0u64; intervals.len()];
    for &reason in &reasons {
        let (label, colour) = legend(reason);
        let bars: Vec<_> = intervals
            .iter()
            .zip(base.iter_mut())
            .filter(|(i, _)| i.drops[reason] > 0)
            .map(|(i, b)| {
                let from = *b as f64;
                *b += i.drops[reason];
                Rectangle::new([(i.from, from), (i.to, *b as f64)], colour.filled())
            })
            .collect();
        chart
            .draw_series(bars)
            .map_err(plotting)?
            .label(label)
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 14, y + 5)], colour.filled()));
    }
    // The SYNs that arrived, as an outline: the drops' share of them.
    let received = BLACK.mix(0.6).stroke_width(1);
    chart
        .draw_series(
            intervals
                .iter()
                .filter(|i| i.syns > 0)
                .map(|i| Rectangle::new([(i.from, 0.0), (i.to, i.syns as f64)], received)),
        )
        .map_err(plotting)?
        .label("SYNs received (outline)")
        .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 14, y + 5)], received));
    legend_box(&mut chart, SeriesLabelPosition::UpperRight)?;

    let mut chart = panel(
        &lower,
        "Connections on the accept queue",
        (x.clone(), 0.0..queue_top),
        Some("seconds from the burst"),
        "connections",
    )?;
    let depth = RGBColor(31, 119, 180);
    chart
        .draw_series(LineSeries::new(
            samples.iter().map(|s| (s.t, s.accept_depth as f64)),
            depth.stroke_width(2),
        ))
        .map_err(plotting)?
        .label(format!(
            "connections on the accept queue (queues.accept_depth), one point per sample; peak {peak}"
        ))
        .legend(move |(x, y)| PathElement::new([(x, y), (x + 14, y)], depth.stroke_width(2)));
    chart
        .draw_series(
            samples
                .iter()
                .map(|s| Circle::new((s.t, s.accept_depth as f64), 2, depth.filled())),
        )
        .map_err(plotting)?;
    // Over the queue: where the two meet, both show.
    let capacity = RGBColor(214, 39, 40);
    chart
        .draw_series(DashedLineSeries::new(
            [(x.start, granted as f64), (x.end, granted as f64)],
            8,
            5,
            capacity.stroke_width(2),
        ))
        .map_err(plotting)?
        .label(format!(
            "capacity the kernel granted: {granted} (listen() asked for {asked})"
        ))
        .legend(move |(x, y)| PathElement::new([(x, y), (x + 14, y)], capacity.stroke_width(2)));
    legend_box(&mut chart, SeriesLabelPosition::LowerRight)?;
    root.present().map_err(plotting)?;
    Ok(())
}

type Panel<'a> = ChartContext<
    'a,
    SVGBackend<'a>,
    Cartesian2d<plotters::coord::types::RangedCoordf64, plotters::coord::types::RangedCoordf64>,
>;

/// One of the plot's two panels on `area`: its caption, axes (`ranges`: time, and the
/// panel's quantity) and mesh, in the style both share. `x_desc`: the time axis's
/// description, on the lower panel only.
fn panel<'a>(
    area: &DrawingArea<SVGBackend<'a>, plotters::coord::Shift>,
    caption: &str,
    ranges: (std::ops::Range<f64>, std::ops::Range<f64>),
    x_desc: Option<&str>,
    y_desc: &str,
) -> Result<Panel<'a>> {
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 16))
        .margin(8)
        .margin_right(24)
        .x_label_area_size(if x_desc.is_some() { 44 } else { 28 })
        .y_label_area_size(64)
        .build_cartesian_2d(ranges.0, ranges.1)
        .map_err(plotting)?;
    let mut mesh = chart.configure_mesh();
    mesh.disable_x_mesh()
        .light_line_style(TRANSPARENT)
        .x_label_formatter(&|v| format!("{v}"))
        .y_label_formatter(&|v| format!("{v:.0}"))
        .y_desc(y_desc)
        .label_style(("sans-serif", 13))
        .axis_desc_style(("sans-serif", 14));
    if let Some(desc) = x_desc {
        mesh.x_desc(desc);
    }
    mesh.draw().map_err(plotting)?;
    Ok(chart)
}

/// A panel's legend, boxed, at `position`.
fn legend_box(chart: &mut Panel<'_>, position: SeriesLabelPosition) -> Result<()> {
    chart
        .configure_series_labels()
        .position(position)
        .label_font(("sans-serif", 13))
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK.mix(0.4))
        .draw()
        .map_err(plotting)
}

fn plotting(e: impl std::fmt::Display) -> anyhow::Error {
    anyhow!("drawing the burst plot: {e}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(t: f64, syns: u64, full: u64, depth: u64) -> Sample {
        let mut drops = [0; DropReason::COUNT];
        drops[DropReason::AcceptQueueFull] = full;
        Sample {
            t,
            syns_received: syns,
            drops,
            accept_depth: depth,
            accept_max: depth,
            granted: 128,
        }
    }

    #[test]
    fn parses_the_listener_of_the_namespace() {
        let body = r#"{"listeners":[
            {"netns":1,"port":8080,"granted":4096,"syns_received":9,"drops":{},"queues":{}},
            {"netns":7,"port":8080,"granted":128,"syns_received":400,
             "drops":{"accept_queue_full":271,"syn_queue_full":0,"final_ack_overflow":1,"other":0},
             "queues":{"accept_depth":129,"accept_max":129,"syn_max":0,"syn_depth":null}}]}"#;
        let s = parse(body, 7, 8080).unwrap();
        assert_eq!(s.syns_received, 400);
        assert_eq!(s.drops, [271, 0, 1, 0]);
        assert_eq!((s.accept_depth, s.accept_max, s.granted), (129, 129, 128));
        assert!(parse(body, 8, 8080).is_err());
    }

    #[test]
    fn intervals_are_differences_of_the_counters() {
        let samples = [
            sample(-0.1, 0, 0, 0),
            sample(0.0, 400, 271, 129),
            sample(0.1, 400, 271, 129),
        ];
        let i = intervals(&samples);
        assert_eq!(i.len(), 2);
        assert_eq!((i[0].from, i[0].to, i[0].syns), (-0.1, 0.0, 400));
        assert_eq!(i[0].drops[DropReason::AcceptQueueFull], 271);
        assert_eq!(i[1].drops, [0; DropReason::COUNT]);
        let csv = csv(&samples);
        assert!(csv.starts_with("seconds_from_burst,syns_received,drops_accept_queue_full,"));
        assert!(csv.contains("\n0.000,400,271,0,0,0,129,129,128\n"), "{csv}");
    }

    #[test]
    fn plots_to_an_svg() {
        let samples: Vec<Sample> = (0..30)
            .map(|i| {
                let t = -1.0 + f64::from(i) * 0.1;
                if t < 0.0 {
                    sample(t, 0, 0, 0)
                } else {
                    sample(t, 400 + i as u64, 271 + i as u64, 129)
                }
            })
            .collect();
        let dir = std::env::temp_dir().join(format!("xtask-burst-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("burst.svg");
        plot(&samples, "a test", 511, &path).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        for wanted in [
            "SYNs dropped per sample interval",
            "SYNs dropped: accept queue full",
            "Connections on the accept queue",
            "capacity the kernel granted: 128",
            "seconds from the burst",
        ] {
            assert!(svg.contains(wanted), "no {wanted} in the SVG");
        }
    }
}
