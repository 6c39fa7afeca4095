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

    #[test]
    fn handoffs_count_only_grants_to_another_process() {
        let grant = |process, granted, release_sent| ProcessGrant {
            process,
            granted,
            release_sent,
        };
        let grants = [
            grant(0, 0, 10),
            grant(0, 12, 20),
            grant(1, 25, 30),
            grant(0, 38, 40),
        ];
        assert_eq!(
            handoffs(&grants),
            [Duration::from_nanos(5), Duration::from_nanos(8)]
        );
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

/// One grant of a cross-process bench, as its process recorded it: readings of the host's
/// `CLOCK_MONOTONIC` ([`MonoTime`](crate::MonoTime)), comparable across the processes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessGrant {
    /// Which of the contender processes.
    pub process: usize,
    /// When the grant was taken.
    pub granted: u64,
    /// When its release was sent.
    pub release_sent: u64,
}

/// Runs `processes` contender processes of a cross-process bench, from a common start (after
/// `startup`, for them to start and connect) to a common stop (`run_for` later): each is this
/// bench binary started again with `args` followed by `START STOP OUT` (the two readings and
/// a file in `dir`), and writes one line per grant to OUT, `granted release_sent`, or
/// `failed` for an acquire that failed. Returns the grants in time order, the failures and
/// the run's length in seconds.
///
/// # Panics
/// When a process cannot be started or fails, or a line is malformed.
pub fn run_contender_processes(
    args: &[&str],
    processes: usize,
    startup: Duration,
    run_for: Duration,
    dir: &std::path::Path,
) -> (Vec<ProcessGrant>, usize, f64) {
    use std::io::BufRead;

    let start = crate::MonoTime::now().as_nanos() + startup.as_nanos() as u64;
    let stop = start + run_for.as_nanos() as u64;
    let exe = std::env::current_exe().expect("the bench binary");
    let children: Vec<_> = (0..processes)
        .map(|process| {
            let out = dir.join(format!("grants-{process}"));
            let child = std::process::Command::new(&exe)
                .args(args)
                .arg(start.to_string())
                .arg(stop.to_string())
                .arg(&out)
                .stdin(std::process::Stdio::null())
                .spawn()
                .expect("start a contender process");
            (child, out)
        })
        .collect();
    let (mut grants, mut failures) = (Vec::new(), 0);
    for (process, (mut child, out)) in children.into_iter().enumerate() {
        let status = child.wait().expect("wait for a contender");
        assert!(status.success(), "{args:?}: contender {process}: {status}");
        let file = std::fs::File::open(&out).expect("a contender's grants");
        for line in std::io::BufReader::new(file).lines() {
            let line = line.expect("a line");
            match line.split_once(' ') {
                None if line == "failed" => failures += 1,
                Some((granted, release_sent)) => grants.push(ProcessGrant {
                    process,
                    granted: granted.parse().expect("a reading"),
                    release_sent: release_sent.parse().expect("a reading"),
                }),
                None => panic!("a malformed line {line:?}"),
            }
        }
    }
    grants.sort_by_key(|g| g.granted);
    (
        grants,
        failures,
        Duration::from_nanos(stop - start).as_secs_f64(),
    )
}

/// The hand-offs of `grants` (in time order): for each grant to another process than the
/// one before it, its time minus the time the previous holder sent its release; sorted.
pub fn handoffs(grants: &[ProcessGrant]) -> Vec<Duration> {
    let mut handoffs: Vec<Duration> = grants
        .windows(2)
        .filter(|pair| pair[0].process != pair[1].process)
        .map(|pair| Duration::from_nanos(pair[1].granted.saturating_sub(pair[0].release_sent)))
        .collect();
    handoffs.sort();
    handoffs
}
