//! Prometheus text exposition format 0.0.4.
//!
//! Why not `prometheus-client`: it writes OpenMetrics-style families (`# TYPE x counter`
//! followed by an `x_total` sample), which `promtool check metrics` and the Prometheus text
//! parser read as a family with no samples plus an untyped one. The 0.0.4 format is what
//! every scraper accepts without negotiation, and it is a few lines to write.

use std::fmt::Write as _;

/// A sample value, written without `core::fmt` for integers (most of a big page).
pub trait SampleValue {
    fn push_to(&self, out: &mut String);
}

macro_rules! int_value {
    ($($t:ty),*) => {$(
        impl SampleValue for $t {
            #[inline]
            fn push_to(&self, out: &mut String) {
                out.push_str(itoa::Buffer::new().format(*self));
            }
        }
    )*};
}
int_value!(u8, u16, u32, u64, usize, i32, i64);

impl SampleValue for f64 {
    fn push_to(&self, out: &mut String) {
        let _ = write!(out, "{self}");
    }
}

impl<T: SampleValue> SampleValue for &T {
    fn push_to(&self, out: &mut String) {
        (*self).push_to(out);
    }
}

pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

#[derive(Debug, Clone, Copy)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

/// Receives the page in chunks, then one empty chunk when the page is complete; returns
/// false when nobody wants the rest (client gone).
pub type Sink<'a> = Box<dyn FnMut(axum::body::Bytes) -> bool + Send + 'a>;

/// Size of the chunks a streamed page is sent in.
const CHUNK: usize = 64 * 1024;
/// Room past [`CHUNK`]: a chunk is sent once a sample takes it past the size.
const CHUNK_ROOM: usize = CHUNK + 8192;
/// Chunk buffers kept for the next ones (the channel to the connection holds 4, hyper one
/// or two): 576 KiB at most between scrapes.
const CHUNKS_KEPT: usize = 8;

/// Buffers of sent chunks, back from the connection. A fresh buffer per chunk cost a page
/// fault per 4 KiB written, since malloc hands freed chunks of this size back to the
/// kernel: ~6000 faults, 10% of the daemon's time, per 10k-listener scrape.
static CHUNK_POOL: std::sync::Mutex<Vec<Vec<u8>>> = std::sync::Mutex::new(Vec::new());

fn chunk_buffer() -> String {
    let recycled = CHUNK_POOL.lock().unwrap_or_else(|e| e.into_inner()).pop();
    // Only empty, valid (cleared) buffers are in the pool.
    recycled.map_or_else(
        || String::with_capacity(CHUNK_ROOM),
        |b| String::from_utf8(b).unwrap_or_default(),
    )
}

/// A sent chunk's text; its buffer goes back to [`CHUNK_POOL`] when the connection is done
/// with it.
struct Recycled(Vec<u8>);

impl AsRef<[u8]> for Recycled {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

impl Drop for Recycled {
    fn drop(&mut self) {
        let mut buf = std::mem::take(&mut self.0);
        if buf.capacity() != CHUNK_ROOM {
            return;
        }
        buf.clear();
        let mut pool = CHUNK_POOL.lock().unwrap_or_else(|e| e.into_inner());
        if pool.len() < CHUNKS_KEPT {
            pool.push(buf);
        }
    }
}

#[derive(Default)]
pub struct Exposition<'a> {
    out: String,
    sink: Option<Sink<'a>>,
    /// The sink refused a chunk: nobody reads the rest.
    gone: bool,
}

impl<'a> Exposition<'a> {
    /// A page handed to `sink` in chunks of about [`CHUNK`] bytes as it is written, so
    /// it is never whole in memory and the client reads while the rest is rendered.
    pub fn streamed(sink: Sink<'a>) -> Self {
        Self {
            out: chunk_buffer(),
            sink: Some(sink),
            gone: false,
        }
    }

    #[inline]
    fn maybe_flush(&mut self) {
        if self.out.len() >= CHUNK && self.sink.is_some() {
            self.flush();
        }
    }

    fn flush(&mut self) {
        let Some(sink) = &mut self.sink else { return };
        if self.out.is_empty() {
            return;
        }
        if self.gone {
            // The client left: the rest is rendered into this one buffer and dropped (the
            // map reads are done; stopping early would need a check on every sample).
            self.out.clear();
            return;
        }
        let chunk = std::mem::replace(&mut self.out, chunk_buffer());
        self.gone = !sink(axum::body::Bytes::from_owner(Recycled(chunk.into_bytes())));
    }

    /// Starts a metric family. Counter names must end in `_total`.
    pub fn family(&mut self, name: &str, kind: Kind, help: &str) {
        debug_assert!(!matches!(kind, Kind::Counter) || name.ends_with("_total"));
        let kind = match kind {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        };
        let _ = writeln!(self.out, "# HELP {name} {}", escape(help, false));
        let _ = writeln!(self.out, "# TYPE {name} {kind}");
    }

    pub fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: impl SampleValue) {
        self.sample_with(name, "", labels, value);
    }

    /// A sample whose labels are `set` followed by `extra`: a listener's labels are
    /// rendered once per scrape, not once for each of its ~40 samples.
    pub fn sample_with(
        &mut self,
        name: &str,
        set: &str,
        extra: &[(&str, &str)],
        value: impl SampleValue,
    ) {
        self.out.push_str(name);
        if !set.is_empty() || !extra.is_empty() {
            self.out.push('{');
            self.out.push_str(set);
            for (i, (k, v)) in extra.iter().enumerate() {
                if i > 0 || !set.is_empty() {
                    self.out.push(',');
                }
                push_label(&mut self.out, k, v);
            }
            self.out.push('}');
        }
        self.out.push(' ');
        value.push_to(&mut self.out);
        self.out.push('\n');
        self.maybe_flush();
    }

    /// `name{set<suffix> value`: `suffix` is pre-rendered extra labels with the closing
    /// brace and space (`,le="0.5"} `), made once per family.
    #[inline]
    pub fn sample_suffix(&mut self, name: &str, set: &str, suffix: &str, value: impl SampleValue) {
        self.out.push_str(name);
        self.out.push('{');
        if set.is_empty() {
            self.out.push_str(&suffix[1..]);
        } else {
            self.out.push_str(set);
            self.out.push_str(suffix);
        }
        value.push_to(&mut self.out);
        self.out.push('\n');
        self.maybe_flush();
    }

    /// One histogram series: cumulative `_bucket{le}` samples from per-bucket counts
    /// (`counts[i]` below `bounds[i]`, the last count above every bound), `_sum`, `_count`.
    /// Where `names` exports only some bounds, each exported bucket is the exact sum of
    /// the counts at or below its bound.
    pub fn histogram(&mut self, names: &HistogramNames, set: &str, counts: &[u64], sum: f64) {
        let mut cumulative = 0u64;
        let mut summed = 0;
        for (le, upto) in &names.les {
            let upto = (*upto).min(counts.len());
            if upto > summed {
                cumulative += counts[summed..upto].iter().sum::<u64>();
                summed = upto;
            }
            self.sample_suffix(&names.bucket, set, le, cumulative);
        }
        let total: u64 = counts.iter().sum();
        self.sample_suffix(&names.bucket, set, ",le=\"+Inf\"} ", total);
        self.sample_with(&names.sum, set, &[], sum);
        self.sample_with(&names.count, set, &[], total);
    }

    /// The page (empty when streamed: the rest goes to the sink).
    pub fn finish(mut self) -> String {
        if self.sink.is_some() {
            self.flush();
            if let Some(sink) = &mut self.sink
                && !self.gone
            {
                // The end: only here is an empty chunk sent (see [`Sink`]).
                sink(axum::body::Bytes::new());
            }
        }
        std::mem::take(&mut self.out)
    }
}

/// Labels rendered once (`k="v",k2="v2"`, escaped) for many samples; a sample takes it
/// as `&str` (or any part of it that is whole labels).
#[derive(Debug, Default, Clone)]
pub struct LabelSet(String);

impl LabelSet {
    #[cfg(test)]
    pub fn new(labels: &[(&str, &str)]) -> Self {
        let mut set = Self::default();
        for (k, v) in labels {
            set.push(k, v);
        }
        set
    }

    /// Adds a label at the end.
    pub fn push(&mut self, k: &str, v: &str) {
        if !self.0.is_empty() {
            self.0.push(',');
        }
        push_label(&mut self.0, k, v);
    }
}

impl std::ops::Deref for LabelSet {
    type Target = str;

    fn deref(&self) -> &str {
        &self.0
    }
}

/// The sample names and `le` values of one histogram family, made once per scrape.
pub struct HistogramNames {
    bucket: String,
    sum: String,
    count: String,
    /// Each exported bucket's `le` suffix, and how many of the per-bucket counts (from
    /// the first) it adds up.
    les: Vec<(String, usize)>,
}

impl HistogramNames {
    /// `bounds`: the buckets' upper bounds, ascending (`+Inf` is added), of which only
    /// those at `exported` (indices into `bounds`, ascending) are exported: the buckets in
    /// between are merged into the next exported one, exactly.
    pub fn merged(name: &str, bounds: &[f64], exported: &[usize]) -> Self {
        debug_assert!(exported.windows(2).all(|w| w[0] < w[1]));
        Self {
            bucket: format!("{name}_bucket"),
            sum: format!("{name}_sum"),
            count: format!("{name}_count"),
            les: exported
                .iter()
                .filter_map(|&i| Some((format!(",le=\"{}\"}} ", bounds.get(i)?), i + 1)))
                .collect(),
        }
    }
}

fn push_label(out: &mut String, k: &str, v: &str) {
    out.push_str(k);
    out.push_str("=\"");
    out.push_str(&escape(v, true));
    out.push('"');
}

fn escape(s: &str, quotes: bool) -> std::borrow::Cow<'_, str> {
    if !s.contains(['\\', '\n', '"']) {
        return s.into();
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '"' if quotes => out.push_str("\\\""),
            c => out.push(c),
        }
    }
    out.into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_samples_and_escaping() {
        let mut e = Exposition::default();
        e.family("x_total", Kind::Counter, "a \\ b\nc");
        e.sample("x_total", &[("comm", "we\"ird\\\n")], 3);
        e.sample("x_total", &[], 1);
        assert_eq!(
            e.finish(),
            "# HELP x_total a \\\\ b\\nc\n# TYPE x_total counter\n\
             x_total{comm=\"we\\\"ird\\\\\\n\"} 3\nx_total 1\n"
        );
    }

    #[test]
    fn histogram_buckets_are_cumulative() {
        let mut e = Exposition::default();
        e.histogram(
            &HistogramNames::merged("h", &[0.5, 1.0], &[0, 1]),
            &LabelSet::new(&[("a", "b")]),
            &[1, 2, 3],
            4.5,
        );
        assert_eq!(
            e.finish(),
            "h_bucket{a=\"b\",le=\"0.5\"} 1\nh_bucket{a=\"b\",le=\"1\"} 3\n\
             h_bucket{a=\"b\",le=\"+Inf\"} 6\nh_sum{a=\"b\"} 4.5\nh_count{a=\"b\"} 6\n"
        );
    }

    #[test]
    fn merged_buckets_are_exact_sums_of_the_buckets_below() {
        // Eight kernel-style buckets (bounds 1..128) and the overflow slot.
        let bounds = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0];
        let counts = [1, 2, 4, 8, 16, 32, 64, 128, 256];
        let render = |exported: &[usize]| {
            let mut e = Exposition::default();
            e.histogram(
                &HistogramNames::merged("h", &bounds, exported),
                &LabelSet::default(),
                &counts,
                2.5,
            );
            e.finish()
        };
        // le=4: buckets 1, 2, 4; le=64: those and 8..64; +Inf and _count: everything.
        assert_eq!(
            render(&[2, 6]),
            "h_bucket{le=\"4\"} 7\nh_bucket{le=\"64\"} 127\nh_bucket{le=\"+Inf\"} 511\n\
             h_sum 2.5\nh_count 511\n"
        );
        // The first and last bounds.
        assert_eq!(
            render(&[0, 7]),
            "h_bucket{le=\"1\"} 1\nh_bucket{le=\"128\"} 255\nh_bucket{le=\"+Inf\"} 511\n\
             h_sum 2.5\nh_count 511\n"
        );
        // No bound: only what does not depend on the buckets.
        assert_eq!(
            render(&[]),
            "h_bucket{le=\"+Inf\"} 511\nh_sum 2.5\nh_count 511\n"
        );
        // Every bound: the unmerged histogram.
        let every: Vec<usize> = (0..bounds.len()).collect();
        assert_eq!(
            render(&every),
            "h_bucket{le=\"1\"} 1\nh_bucket{le=\"2\"} 3\nh_bucket{le=\"4\"} 7\n\
             h_bucket{le=\"8\"} 15\nh_bucket{le=\"16\"} 31\nh_bucket{le=\"32\"} 63\n\
             h_bucket{le=\"64\"} 127\nh_bucket{le=\"128\"} 255\nh_bucket{le=\"+Inf\"} 511\n\
             h_sum 2.5\nh_count 511\n"
        );
    }

    #[test]
    fn merged_accept_wait_buckets_match_the_cumulative_kernel_counts() {
        use crate::{api::AcceptWait, config::AcceptWaitBuckets};
        // One wait in each kernel bucket i, i + 1 of them (and 25 over 8.4 s).
        let counts: Vec<u64> = (1..=25).collect();
        let mut e = Exposition::default();
        e.histogram(
            &HistogramNames::merged(
                "w",
                &AcceptWait::bounds(),
                AcceptWaitBuckets::default().indices(),
            ),
            &LabelSet::default(),
            &counts,
            1.0,
        );
        // le=0.001024 (2^10 us): buckets 0..=10, 1+..+11 = 66; le=1.048576 (2^20 us):
        // 1+..+21 = 231; all 25 slots: 325.
        assert_eq!(
            e.finish(),
            "w_bucket{le=\"0.001024\"} 66\nw_bucket{le=\"1.048576\"} 231\n\
             w_bucket{le=\"+Inf\"} 325\nw_sum 1\nw_count 325\n"
        );
    }
}
