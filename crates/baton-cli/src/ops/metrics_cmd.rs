//! `baton serve-metrics --listen ADDR`: a Prometheus endpoint at `/metrics`.
//!
//! It serves two kinds of series:
//!
//! - this process's own metrics, through the `metrics` crate and the
//!   [`recorder`](super::recorder): a counter per registered event (all of them, from zero),
//!   and the lock wait and hold histograms. In this process they count what happens to
//!   its own store connection (a Redis push channel lost and restored, an unsafe eviction
//!   policy at connect); applications that embed baton export the same names through
//!   their own recorder.
//! - the store as seen at each scrape, read by listing it: `baton_store_up`,
//!   `baton_store_scrape_seconds`, `baton_store_locks_held` and `baton_store_leases_held`
//!   (labelled with the namespace; counting stops at `--limit`).
//!
//! One scrape lists the store once; scrape it every 15 s or more, not every second, when
//! there are many keys.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use axum::Router;
use axum::extract::State;
use axum::http::header;
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use baton::telemetry;
use clap::Args;

use super::LazyStore;
use super::http;
use super::recorder::{PrometheusRecorder, write_header, write_sample};
use super::{parse_listen, serve_at};
use crate::cli::GlobalArgs;
use crate::exit::{Failure, INTERNAL};

/// Default `--limit`.
const DEFAULT_LIMIT: usize = 10_000;

/// The content type of the Prometheus text format.
const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// `baton serve-metrics`.
#[derive(Debug, Args)]
pub(crate) struct ServeMetricsArgs {
    /// Where to listen: IP:PORT (127.0.0.1:9464; port 0 picks a free one). Bind to
    /// loopback unless Prometheus scrapes from another host.
    #[arg(long, value_name = "ADDR", value_parser = parse_listen)]
    pub(crate) listen: SocketAddr,

    /// Count at most this many locks and this many leases per scrape.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_LIMIT)]
    pub(crate) limit: usize,
}

/// Runs `baton serve-metrics` until SIGINT or SIGTERM.
pub(crate) async fn run(global: &GlobalArgs, args: &ServeMetricsArgs) -> Result<u8, Failure> {
    let recorder = PrometheusRecorder::new();
    metrics::set_global_recorder(recorder.clone()).map_err(|e| {
        Failure::new(
            INTERNAL,
            format!("cannot install the metrics recorder: {e}"),
        )
    })?;
    telemetry::describe_metrics();
    let scrape = Arc::new(Scrape {
        recorder,
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
    let announce = |local| eprintln!("baton serve-metrics: serving http://{local}/metrics");
    serve_at(args.listen, announce, router).await
}

/// What a scrape reads.
struct Scrape {
    recorder: PrometheusRecorder,
    store: LazyStore,
    limit: usize,
}

async fn metrics_text(State(scrape): State<Arc<Scrape>>) -> Response {
    let mut text = scrape.recorder.render();
    text.push_str(&store_section(&scrape.store, scrape.limit).await);
    ([(header::CONTENT_TYPE, PROMETHEUS_TEXT)], text).into_response()
}

/// The series read from the store at this scrape.
async fn store_section(store: &LazyStore, limit: usize) -> String {
    let labels = vec![("namespace".to_owned(), store.namespace().to_owned())];
    let started = Instant::now();
    let counted = async {
        let baton = store.get().await?;
        let locks = baton.locks().list("", limit).await?.len();
        let leases = baton.leases().list("", limit).await?.len();
        Ok::<_, baton::Error>((locks, leases))
    }
    .await;
    let took = started.elapsed().as_secs_f64();
    let mut out = String::new();
    let gauge = |out: &mut String, name: &str, help: &str, value: f64| {
        write_header(out, name, "gauge", Some(help));
        write_sample(out, name, &labels, None, value);
    };
    gauge(
        &mut out,
        "baton_store_up",
        "1 when this scrape could list the store's locks and leases, else 0",
        if counted.is_ok() { 1.0 } else { 0.0 },
    );
    gauge(
        &mut out,
        "baton_store_scrape_seconds",
        "seconds this scrape spent listing the store",
        took,
    );
    match counted {
        Ok((locks, leases)) => {
            gauge(
                &mut out,
                "baton_store_locks_held",
                "locks held in the namespace (counting stops at --limit)",
                locks as f64,
            );
            gauge(
                &mut out,
                "baton_store_leases_held",
                "leases held in the namespace (counting stops at --limit)",
                leases as f64,
            );
        }
        Err(e) => tracing::warn!(error = %e, "listing the store for a scrape failed"),
    }
    out
}
