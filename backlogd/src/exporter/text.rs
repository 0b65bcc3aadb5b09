//! Prometheus text exposition format 0.0.4.
//!
//! Why not `prometheus-client`: it writes OpenMetrics-style families (`# TYPE x counter`
//! followed by an `x_total` sample), which `promtool check metrics` and the Prometheus text
//! parser read as a family with no samples plus an untyped one. The 0.0.4 format is what
//! every scraper accepts without negotiation, and it is a few lines to write.

use std::fmt::{Display, Write as _};

pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

#[derive(Debug, Clone, Copy)]
pub enum Kind {
    Counter,
    Gauge,
}

#[derive(Debug, Default)]
pub struct Exposition {
    out: String,
}

impl Exposition {
    pub fn with_capacity(bytes: usize) -> Self {
        Self {
            out: String::with_capacity(bytes),
        }
    }

    /// Starts a metric family. Counter names must end in `_total`.
    pub fn family(&mut self, name: &str, kind: Kind, help: &str) {
        debug_assert!(matches!(kind, Kind::Gauge) || name.ends_with("_total"));
        let kind = match kind {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
        };
        let _ = writeln!(self.out, "# HELP {name} {}", escape(help, false));
        let _ = writeln!(self.out, "# TYPE {name} {kind}");
    }

    pub fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: impl Display) {
        self.out.push_str(name);
        if !labels.is_empty() {
            self.out.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    self.out.push(',');
                }
                let _ = write!(self.out, "{k}=\"{}\"", escape(v, true));
            }
            self.out.push('}');
        }
        let _ = writeln!(self.out, " {value}");
    }

    pub fn finish(self) -> String {
        self.out
    }
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
}
