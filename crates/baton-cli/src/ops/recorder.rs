//! A small `metrics` recorder that renders the Prometheus text format, for
//! `baton serve-metrics`.
//!
//! Counters, gauges and histograms (fixed buckets, [`BUCKETS`]) are kept in memory, every
//! series under the Prometheus name of its key ([`baton::telemetry::prometheus_name`]: dots
//! become underscores), counters with the `_total` suffix. It is about 300 lines instead of
//! `metrics-exporter-prometheus` and its dependency tree, and it renders exactly the names
//! `baton alerts` writes rules for.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use baton::telemetry::prometheus_name;
use metrics::{
    Counter, CounterFn, Gauge, GaugeFn, Histogram, HistogramFn, Key, KeyName, Metadata,
    SharedString, Unit,
};

/// Upper bounds (seconds) of the histogram buckets: lock waits and holds range from a
/// millisecond to an hour.
pub(crate) const BUCKETS: [f64; 18] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    300.0, 900.0, 3600.0,
];

/// The recorder; clone it to keep a handle for rendering after installing it.
#[derive(Debug, Clone, Default)]
pub(crate) struct PrometheusRecorder {
    state: Arc<State>,
}

#[derive(Debug, Default)]
struct State {
    families: Mutex<BTreeMap<String, Family>>,
    help: Mutex<BTreeMap<String, String>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Counter,
    Gauge,
    Histogram,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }

    /// The Prometheus name of a metric of this kind named `key`.
    fn name(self, key: &str) -> String {
        let name = sanitize(&prometheus_name(key));
        if self == Kind::Counter && !name.ends_with("_total") {
            format!("{name}_total")
        } else {
            name
        }
    }
}

type Labels = Vec<(String, String)>;

#[derive(Debug)]
struct Family {
    kind: Kind,
    series: BTreeMap<Labels, Series>,
}

#[derive(Debug, Clone)]
enum Series {
    Counter(Arc<CounterCell>),
    Gauge(Arc<GaugeCell>),
    Histogram(Arc<HistogramCell>),
}

#[derive(Debug, Default)]
struct CounterCell(AtomicU64);

impl CounterFn for CounterCell {
    fn increment(&self, value: u64) {
        self.0.fetch_add(value, Ordering::Relaxed);
    }

    fn absolute(&self, value: u64) {
        self.0.fetch_max(value, Ordering::Relaxed);
    }
}

/// An `f64` kept as its bits.
#[derive(Debug, Default)]
struct GaugeCell(AtomicU64);

impl GaugeCell {
    fn update(&self, f: impl Fn(f64) -> f64) {
        let _ = self
            .0
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |bits| {
                Some(f(f64::from_bits(bits)).to_bits())
            });
    }

    fn get(&self) -> f64 {
        f64::from_bits(self.0.load(Ordering::Relaxed))
    }
}

impl GaugeFn for GaugeCell {
    fn increment(&self, value: f64) {
        self.update(|v| v + value);
    }

    fn decrement(&self, value: f64) {
        self.update(|v| v - value);
    }

    fn set(&self, value: f64) {
        self.0.store(value.to_bits(), Ordering::Relaxed);
    }
}

#[derive(Debug, Default)]
struct HistogramCell(Mutex<HistogramData>);

#[derive(Debug, Default, Clone)]
struct HistogramData {
    /// Observations per bucket (not cumulative); the last is `+Inf`.
    counts: [u64; BUCKETS.len() + 1],
    sum: f64,
    count: u64,
}

impl HistogramFn for HistogramCell {
    fn record(&self, value: f64) {
        let mut data = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let bucket = BUCKETS
            .iter()
            .position(|bound| value <= *bound)
            .unwrap_or(BUCKETS.len());
        data.counts[bucket] += 1;
        data.sum += value;
        data.count += 1;
    }
}

impl PrometheusRecorder {
    /// A recorder with nothing registered.
    pub(crate) fn new() -> Self {
        PrometheusRecorder::default()
    }

    fn series(&self, kind: Kind, key: &Key) -> Option<Series> {
        let name = kind.name(key.name());
        let mut labels: Labels = key
            .labels()
            .map(|l| (sanitize(l.key()), l.value().to_owned()))
            .collect();
        labels.sort();
        let mut families = self
            .state
            .families
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let family = families.entry(name).or_insert_with(|| Family {
            kind,
            series: BTreeMap::new(),
        });
        if family.kind != kind {
            // The same name as two kinds: keep the first, drop the second's updates.
            return None;
        }
        let series = family.series.entry(labels).or_insert_with(|| match kind {
            Kind::Counter => Series::Counter(Arc::default()),
            Kind::Gauge => Series::Gauge(Arc::default()),
            Kind::Histogram => Series::Histogram(Arc::default()),
        });
        Some(series.clone())
    }

    fn describe(&self, kind: Kind, key: &KeyName, description: SharedString) {
        self.state
            .help
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(kind.name(key.as_str()), description.into_owned());
    }

    /// Everything recorded, in the Prometheus text format (version 0.0.4).
    pub(crate) fn render(&self) -> String {
        let help = self
            .state
            .help
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let families = self
            .state
            .families
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let mut out = String::new();
        for (name, family) in families.iter() {
            write_header(
                &mut out,
                name,
                family.kind.as_str(),
                help.get(name).map(String::as_str),
            );
            for (labels, series) in &family.series {
                match series {
                    Series::Counter(cell) => {
                        write_sample(
                            &mut out,
                            name,
                            labels,
                            None,
                            cell.0.load(Ordering::Relaxed) as f64,
                        );
                    }
                    Series::Gauge(cell) => write_sample(&mut out, name, labels, None, cell.get()),
                    Series::Histogram(cell) => {
                        let data = cell
                            .0
                            .lock()
                            .unwrap_or_else(PoisonError::into_inner)
                            .clone();
                        let bucket = format!("{name}_bucket");
                        let mut cumulative = 0;
                        for (i, count) in data.counts.iter().enumerate() {
                            cumulative += count;
                            let le = BUCKETS
                                .get(i)
                                .map_or_else(|| "+Inf".to_owned(), |b| number(*b));
                            write_sample(&mut out, &bucket, labels, Some(&le), cumulative as f64);
                        }
                        write_sample(&mut out, &format!("{name}_sum"), labels, None, data.sum);
                        write_sample(
                            &mut out,
                            &format!("{name}_count"),
                            labels,
                            None,
                            data.count as f64,
                        );
                    }
                }
            }
        }
        out
    }
}

impl metrics::Recorder for PrometheusRecorder {
    fn describe_counter(&self, key: KeyName, _unit: Option<Unit>, description: SharedString) {
        self.describe(Kind::Counter, &key, description);
    }

    fn describe_gauge(&self, key: KeyName, _unit: Option<Unit>, description: SharedString) {
        self.describe(Kind::Gauge, &key, description);
    }

    fn describe_histogram(&self, key: KeyName, _unit: Option<Unit>, description: SharedString) {
        self.describe(Kind::Histogram, &key, description);
    }

    fn register_counter(&self, key: &Key, _metadata: &Metadata<'_>) -> Counter {
        match self.series(Kind::Counter, key) {
            Some(Series::Counter(cell)) => Counter::from_arc(cell),
            _ => Counter::noop(),
        }
    }

    fn register_gauge(&self, key: &Key, _metadata: &Metadata<'_>) -> Gauge {
        match self.series(Kind::Gauge, key) {
            Some(Series::Gauge(cell)) => Gauge::from_arc(cell),
            _ => Gauge::noop(),
        }
    }

    fn register_histogram(&self, key: &Key, _metadata: &Metadata<'_>) -> Histogram {
        match self.series(Kind::Histogram, key) {
            Some(Series::Histogram(cell)) => Histogram::from_arc(cell),
            _ => Histogram::noop(),
        }
    }
}

/// `# HELP` (when there is help) and `# TYPE` lines.
pub(crate) fn write_header(out: &mut String, name: &str, kind: &str, help: Option<&str>) {
    if let Some(help) = help {
        let help = help.replace('\\', "\\\\").replace('\n', "\\n");
        let _ = writeln!(out, "# HELP {name} {help}");
    }
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// One sample line: `name{labels,le="0.5"} value`.
pub(crate) fn write_sample(
    out: &mut String,
    name: &str,
    labels: &[(String, String)],
    le: Option<&str>,
    value: f64,
) {
    out.push_str(name);
    let le = le.map(|le| ("le".to_owned(), le.to_owned()));
    let all: Vec<&(String, String)> = labels.iter().chain(le.as_ref()).collect();
    if !all.is_empty() {
        out.push('{');
        for (i, (key, value)) in all.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            let value = value
                .replace('\\', "\\\\")
                .replace('"', "\\\"")
                .replace('\n', "\\n");
            let _ = write!(out, "{key}=\"{value}\"");
        }
        out.push('}');
    }
    let _ = writeln!(out, " {}", number(value));
}

/// A sample value as Prometheus writes it (`+Inf`, `-Inf`, `NaN`, else the shortest
/// decimal).
pub(crate) fn number(value: f64) -> String {
    if value.is_nan() {
        "NaN".to_owned()
    } else if value.is_infinite() {
        if value > 0.0 { "+Inf" } else { "-Inf" }.to_owned()
    } else {
        value.to_string()
    }
}

/// A valid Prometheus metric or label name: `[a-zA-Z_:][a-zA-Z0-9_:]*`.
fn sanitize(name: &str) -> String {
    name.chars()
        .enumerate()
        .map(|(i, c)| {
            if c.is_ascii_alphabetic() || c == '_' || c == ':' || (i > 0 && c.is_ascii_digit()) {
                c
            } else {
                '_'
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use baton::telemetry::{self, LOCK_WAIT_SECONDS, REGISTRY};

    #[test]
    fn renders_counters_gauges_and_histograms() {
        let recorder = PrometheusRecorder::new();
        metrics::with_local_recorder(&recorder, || {
            telemetry::describe_metrics();
            metrics::counter!(REGISTRY[0].key).increment(2);
            metrics::gauge!("doctor.test-gauge", "ns" => "a\"b").set(1.5);
            metrics::histogram!(LOCK_WAIT_SECONDS, "outcome" => "acquired").record(0.3);
            metrics::histogram!(LOCK_WAIT_SECONDS, "outcome" => "acquired").record(7.0);
        });
        let text = recorder.render();
        let first = REGISTRY[0].prometheus_counter();
        assert!(
            text.contains(&format!("# TYPE {first} counter\n{first} 2\n")),
            "{text}"
        );
        // Every registered event is there from the start, at zero.
        for event in &REGISTRY[1..] {
            let name = event.prometheus_counter();
            assert!(
                text.contains(&format!("\n{name} 0\n")),
                "{name} missing:\n{text}"
            );
            assert!(
                text.contains(&format!("# HELP {name} ")),
                "{name} has no help"
            );
        }
        assert!(
            text.contains("doctor_test_gauge{ns=\"a\\\"b\"} 1.5\n"),
            "{text}"
        );
        assert!(
            text.contains("# TYPE baton_lock_wait_seconds histogram\n"),
            "{text}"
        );
        assert!(
            text.contains("baton_lock_wait_seconds_bucket{outcome=\"acquired\",le=\"0.25\"} 0\n"),
            "{text}"
        );
        assert!(
            text.contains("baton_lock_wait_seconds_bucket{outcome=\"acquired\",le=\"0.5\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("baton_lock_wait_seconds_bucket{outcome=\"acquired\",le=\"+Inf\"} 2\n"),
            "{text}"
        );
        assert!(
            text.contains("baton_lock_wait_seconds_sum{outcome=\"acquired\"} 7.3\n"),
            "{text}"
        );
        assert!(
            text.contains("baton_lock_wait_seconds_count{outcome=\"acquired\"} 2\n"),
            "{text}"
        );
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let name = line.split(['{', ' ']).next().unwrap_or_default();
            assert!(!name.contains('.'), "a dot in {line}");
        }
    }

    #[test]
    fn numbers_and_names() {
        assert_eq!(number(f64::INFINITY), "+Inf");
        assert_eq!(number(f64::NAN), "NaN");
        assert_eq!(number(2.0), "2");
        assert_eq!(number(0.001), "0.001");
        assert_eq!(sanitize("9a-b.c"), "_a_b_c");
        assert_eq!(
            Kind::Counter.name("baton.lock.lost"),
            "baton_lock_lost_total"
        );
        assert_eq!(Kind::Gauge.name("app.queue.depth"), "app_queue_depth");
    }
}
