//! `baton serve-metrics --listen ADDR`: a Prometheus endpoint at `/metrics`.
//!
//! It serves two kinds of series:
//!
//! - this process's own metrics, through the `metrics` crate and the recorder of
//!   `metrics-exporter-prometheus` ([`exporter`]): a counter per registered event (all of
//!   them, from zero), and the lock wait and hold histograms. In this process they count
//!   what happens to its own store connection (a Redis push channel lost and restored, an
//!   unsafe eviction policy at connect); applications that embed baton export the same
//!   names through their own recorder, and [`exporter`] is the configuration that gives
//!   them the names `baton alerts` writes rules for.
//! - the store as seen at each scrape, read by listing it: `baton_store_up`,
//!   `baton_store_scrape_seconds`, `baton_store_locks_held` and `baton_store_leases_held`
//!   (labelled with the namespace; counting stops at `--limit`). They are a snapshot, not
//!   this process's history, so each scrape records them into a recorder of its own and
//!   renders that: a count the scrape could not take is absent, never a stale value.
//!
//! One scrape lists the store once; scrape it every 15 s or more, not every second, when
//! there are many keys.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State;
use axum::http::header;
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use baton::telemetry;
use clap::Args;
use metrics_exporter_prometheus::{BuildError, PrometheusBuilder, PrometheusHandle};

use super::LazyStore;
use super::http;
use super::serve_at;
use crate::cli::GlobalArgs;
use crate::exit::{Failure, INTERNAL};

/// Default `--limit`.
const DEFAULT_LIMIT: usize = 10_000;

/// The content type of the Prometheus text format.
const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Upper bounds (seconds) of the histogram buckets: lock waits and holds range from a
/// millisecond to an hour.
pub(crate) const BUCKETS: [f64; 18] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    300.0, 900.0, 3600.0,
];

/// How often histogram samples are folded into their buckets between scrapes, so that a
/// process nobody scrapes does not keep every sample.
const UPKEEP_EVERY: Duration = Duration::from_secs(5);

/// `baton serve-metrics`.
#[derive(Debug, Args)]
pub(crate) struct ServeMetricsArgs {
    /// Where to listen: IP:PORT (127.0.0.1:9464; port 0 picks a free one). Bind to
    /// loopback unless Prometheus scrapes from another host.
    #[arg(long, value_name = "ADDR", value_parser = crate::args::listen)]
    pub(crate) listen: SocketAddr,

    /// Count at most this many locks and this many leases per scrape.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_LIMIT)]
    pub(crate) limit: usize,
}

/// The exporter of baton's metrics under the names `baton alerts` writes rules for: every
/// dot of a key becomes an underscore ([`baton::telemetry::prometheus_name`]), counters take
/// the `_total` suffix (the exporter's recommended naming), and histograms are Prometheus
/// histograms with [`BUCKETS`].
///
/// # Errors
/// Never for these buckets (the exporter refuses an empty list).
pub(crate) fn exporter() -> Result<PrometheusBuilder, BuildError> {
    PrometheusBuilder::new()
        .with_recommended_naming(true)
        .set_buckets(&BUCKETS)
}

/// What a scrape reads.
struct Scrape {
    handle: PrometheusHandle,
    store: LazyStore,
    limit: usize,
}

/// Runs `baton serve-metrics` until SIGINT or SIGTERM.
pub(crate) async fn run(global: &GlobalArgs, args: &ServeMetricsArgs) -> Result<u8, Failure> {
    let cannot_install = |e: BuildError| {
        Failure::new(
            INTERNAL,
            format!("cannot install the metrics recorder: {e}"),
        )
    };
    let handle = exporter()
        .map_err(cannot_install)?
        .install_recorder()
        .map_err(cannot_install)?;
    telemetry::describe_metrics();
    let upkeep = handle.clone();
    tokio::spawn(async move {
        let mut every = tokio::time::interval(UPKEEP_EVERY);
        loop {
            every.tick().await;
            upkeep.run_upkeep();
        }
    });
    let scrape = Arc::new(Scrape {
        handle,
        store: LazyStore::open(global).await?,
        limit: args.limit,
    });
    let router = Router::new()
        .route("/metrics", get(metrics_text))
        .route(
            "/",
            get(|| async {
                Html("<!doctype html><title>baton metrics</title><p><a href=\"/metrics\">/metrics</a></p>\n")
            }),
        )
        .fallback(|| async { http::not_found(&["/metrics"]) })
        .with_state(scrape);
    let announce = |local| say!("baton serve-metrics: serving http://{local}/metrics");
    serve_at(args.listen, announce, router).await
}

async fn metrics_text(State(scrape): State<Arc<Scrape>>) -> Response {
    let mut text = scrape.handle.render();
    text.push_str(&store_section(&scrape.store, scrape.limit).await);
    ([(header::CONTENT_TYPE, PROMETHEUS_TEXT)], text).into_response()
}

/// The series read from the store at this scrape, rendered by a recorder of their own.
async fn store_section(store: &LazyStore, limit: usize) -> String {
    let started = Instant::now();
    let counted = async {
        let baton = store.get().await?;
        let locks = baton.locks().list("", limit).await?.len();
        let leases = baton.leases().list("", limit).await?.len();
        Ok::<_, baton::Error>((locks, leases))
    }
    .await;
    let took = started.elapsed().as_secs_f64();
    if let Err(e) = &counted {
        tracing::warn!(error = %e, "listing the store for a scrape failed");
    }
    let recorder = PrometheusBuilder::new().build_recorder();
    let namespace = store.namespace().to_owned();
    metrics::with_local_recorder(&recorder, || {
        let gauge = |name: &'static str, help: &'static str, value: f64| {
            metrics::describe_gauge!(name, help);
            metrics::gauge!(name, "namespace" => namespace.clone()).set(value);
        };
        gauge(
            "baton_store_up",
            "1 when this scrape could list the store's locks and leases, else 0",
            if counted.is_ok() { 1.0 } else { 0.0 },
        );
        gauge(
            "baton_store_scrape_seconds",
            "seconds this scrape spent listing the store",
            took,
        );
        if let Ok((locks, leases)) = counted {
            gauge(
                "baton_store_locks_held",
                "locks held in the namespace (counting stops at --limit)",
                locks as f64,
            );
            gauge(
                "baton_store_leases_held",
                "leases held in the namespace (counting stops at --limit)",
                leases as f64,
            );
        }
    });
    recorder.handle().render()
}

#[cfg(test)]
mod tests {
    use super::*;
    use baton::telemetry::{LOCK_HOLD_SECONDS, LOCK_WAIT_SECONDS, REGISTRY};

    use crate::ops::alerts;

    /// What the exporter renders after [`telemetry::describe_metrics`], a few events and one
    /// of each histogram.
    fn rendered() -> String {
        let recorder = exporter().unwrap().build_recorder();
        metrics::with_local_recorder(&recorder, || {
            telemetry::describe_metrics();
            metrics::counter!(REGISTRY[0].key).increment(2);
            metrics::histogram!(LOCK_WAIT_SECONDS, "outcome" => "acquired").record(0.3);
            metrics::histogram!(LOCK_WAIT_SECONDS, "outcome" => "acquired").record(7.0);
            metrics::histogram!(LOCK_HOLD_SECONDS).record(0.002);
        });
        recorder.handle().render()
    }

    /// The value of the sample line `series` (name and labels, exactly) in `text`.
    fn sample(text: &str, series: &str) -> Option<f64> {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
            .and_then(|v| v.parse().ok())
    }

    #[test]
    fn every_counter_the_alert_rules_use_is_rendered_with_its_help() {
        let text = rendered();
        let rules = alerts::rules(REGISTRY, "baton", "_total");
        let used: Vec<&str> = rules
            .lines()
            .filter_map(|l| l.trim().strip_prefix("expr: increase(")?.split('[').next())
            .collect();
        assert!(!used.is_empty(), "{rules}");
        for name in &used {
            assert!(
                sample(&text, name).is_some(),
                "{name} is not rendered:\n{text}"
            );
            assert!(
                text.contains(&format!("# TYPE {name} counter\n")),
                "{name}: {text}"
            );
            assert!(
                text.contains(&format!("# HELP {name} ")),
                "{name} has no help"
            );
        }
        // Every registered event, alarmed or not, from zero; the names are the library's.
        for event in REGISTRY {
            let name = event.prometheus_counter();
            let expected = if event.key == REGISTRY[0].key {
                2.0
            } else {
                0.0
            };
            assert_eq!(sample(&text, &name), Some(expected), "{name}:\n{text}");
        }
    }

    #[test]
    fn histograms_keep_their_buckets_and_names() {
        let text = rendered();
        let wait = telemetry::prometheus_name(LOCK_WAIT_SECONDS);
        assert!(
            text.contains(&format!("# TYPE {wait} histogram\n")),
            "{text}"
        );
        assert!(text.contains(&format!("# HELP {wait} ")), "{text}");
        for (le, count) in [("0.25", 0.0), ("0.5", 1.0), ("10", 2.0), ("+Inf", 2.0)] {
            let series = format!("{wait}_bucket{{outcome=\"acquired\",le=\"{le}\"}}");
            assert_eq!(sample(&text, &series), Some(count), "{series}:\n{text}");
        }
        assert_eq!(
            sample(&text, &format!("{wait}_sum{{outcome=\"acquired\"}}")),
            Some(7.3)
        );
        assert_eq!(
            sample(&text, &format!("{wait}_count{{outcome=\"acquired\"}}")),
            Some(2.0)
        );
        let hold = telemetry::prometheus_name(LOCK_HOLD_SECONDS);
        let buckets = text
            .lines()
            .filter(|l| l.starts_with(&format!("{hold}_bucket{{")))
            .count();
        assert_eq!(buckets, BUCKETS.len() + 1, "{text}");
        assert_eq!(
            sample(&text, &format!("{hold}_bucket{{le=\"0.0025\"}}")),
            Some(1.0)
        );
        for line in text
            .lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
        {
            let name = line.split(['{', ' ']).next().unwrap_or_default();
            assert!(!name.contains('.'), "a dot in {line}");
        }
    }
}
