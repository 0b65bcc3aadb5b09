//! Medians, percentiles and spreads of samples.

pub(super) fn sorted(v: &[f64]) -> Vec<f64> {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v
}

pub(super) fn median(v: &[f64]) -> f64 {
    let s = sorted(v);
    match s.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => s[n / 2],
        n => (s[n / 2 - 1] + s[n / 2]) / 2.0,
    }
}

pub(super) fn p95(v: &[f64]) -> f64 {
    let s = sorted(v);
    if s.is_empty() {
        return f64::NAN;
    }
    s[((s.len() as f64 * 0.95).ceil() as usize).clamp(1, s.len()) - 1]
}

pub(super) fn min(v: &[f64]) -> f64 {
    v.iter().copied().fold(f64::NAN, f64::min)
}

pub(super) fn max(v: &[f64]) -> f64 {
    v.iter().copied().fold(f64::NAN, f64::max)
}

pub(super) fn spread(v: &[f64], unit: &str) -> String {
    if v.len() < 2 {
        return format!("{:.1} {unit}", median(v));
    }
    format!(
        "median {:.1} {unit}, range {:.1}-{:.1} over {} runs",
        median(v),
        min(v),
        max(v),
        v.len()
    )
}
