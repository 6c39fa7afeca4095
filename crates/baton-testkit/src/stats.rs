//! Small statistics for the benchmarks: medians, ranges, percentiles, fairness, and the
//! formats their reports print.

use std::time::Duration;

/// The median of `values` (the mean of the middle two for an even count).
pub fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len();
    if n == 0 {
        return f64::NAN;
    }
    if n % 2 == 1 {
        sorted[n / 2]
    } else {
        (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
    }
}

/// The smallest and largest of `values` (infinities for none).
pub fn min_max(values: &[f64]) -> (f64, f64) {
    values
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
            (lo.min(*v), hi.max(*v))
        })
}

/// The `q` quantile (0..=1) of sorted `values`, nearest-rank.
pub fn percentile(sorted: &[Duration], q: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

/// Jain's fairness index of `counts`: 1.0 when every contender got the same share,
/// 1/n when one got everything.
pub fn jain(counts: &[u64]) -> f64 {
    let sum: f64 = counts.iter().map(|&c| c as f64).sum();
    let squares: f64 = counts.iter().map(|&c| (c as f64).powi(2)).sum();
    if squares == 0.0 {
        return f64::NAN;
    }
    sum * sum / (counts.len() as f64 * squares)
}

/// `d` in milliseconds with three decimals.
pub fn ms(d: Duration) -> String {
    format!("{:.3}ms", d.as_secs_f64() * 1e3)
}

/// `n` with thousands separators.
pub fn thousands(n: f64) -> String {
    let whole = n.round() as u64;
    let digits = whole.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_ranges_and_quantiles() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
        assert!(median(&[]).is_nan());
        assert_eq!(min_max(&[2.0, -1.0, 5.0]), (-1.0, 5.0));
        let sorted: Vec<Duration> = (1..=10).map(Duration::from_millis).collect();
        assert_eq!(percentile(&sorted, 0.5), Duration::from_millis(5));
        assert_eq!(percentile(&sorted, 0.99), Duration::from_millis(10));
        assert_eq!(percentile(&[], 0.5), Duration::ZERO);
    }

    #[test]
    fn fairness_and_formats() {
        assert_eq!(jain(&[5, 5, 5, 5]), 1.0);
        assert_eq!(jain(&[8, 0, 0, 0]), 0.25);
        assert_eq!(thousands(1_234_567.4), "1,234,567");
        assert_eq!(thousands(999.0), "999");
        assert_eq!(ms(Duration::from_micros(1_500)), "1.500ms");
    }
}

/// A bench binary's command line: `--quick` (or `BATON_BENCH_QUICK=1`) for a short run, and
/// options of the form `--name value`.
#[derive(Debug, Clone)]
pub struct BenchArgs {
    args: Vec<String>,
}

impl BenchArgs {
    /// This process's arguments.
    pub fn from_env() -> BenchArgs {
        BenchArgs {
            args: std::env::args().skip(1).collect(),
        }
    }

    /// Whether a short run is asked for: `--quick`, or `BATON_BENCH_QUICK` set to anything
    /// but empty or `0`.
    pub fn quick(&self) -> bool {
        self.flag("--quick")
            || std::env::var("BATON_BENCH_QUICK").is_ok_and(|v| !v.is_empty() && v != "0")
    }

    /// Whether the flag `name` (`--replica`) is given.
    pub fn flag(&self, name: &str) -> bool {
        self.args.iter().any(|a| a == name)
    }

    /// The value after `name` (`--only redis`), if it is given.
    pub fn value(&self, name: &str) -> Option<String> {
        let at = self.args.iter().position(|a| a == name)?;
        self.args.get(at + 1).cloned()
    }

    /// The arguments after `name`, if it is given (a child process's own command line).
    pub fn after(&self, name: &str) -> Option<&[String]> {
        let at = self.args.iter().position(|a| a == name)?;
        Some(&self.args[at + 1..])
    }
}
