//! Helpers shared by the store crates' fault tests: bounded waiting, and capture of the
//! telemetry events baton emits, so a test can assert that a degradation was reported.
//!
//! Every wait is a poll with a generous deadline ([`PATIENCE`]), so tests hold on a loaded
//! machine; a test fails instead of hanging.

use std::future::Future;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use baton_core::telemetry::Event;
use tokio::time::Instant;
use tracing::field::{Field, Visit};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};

/// How long any one step of a test may take before the test fails instead of hanging.
pub const PATIENCE: Duration = Duration::from_secs(60);

/// Runs blocking work (starting, stopping a server) off the runtime's threads.
pub async fn blocking<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(work)
        .await
        .expect("blocking work panicked")
}

/// Awaits `future`, failing the test after [`PATIENCE`] instead of hanging.
#[track_caller]
pub fn within<F: Future>(what: &str, future: F) -> impl Future<Output = F::Output> {
    let what = what.to_owned();
    let caller = std::panic::Location::caller();
    async move {
        match tokio::time::timeout(PATIENCE, future).await {
            Ok(output) => output,
            Err(_) => panic!("{caller}: {what} did not finish within {PATIENCE:?}"),
        }
    }
}

/// Calls `attempt` until it answers `Some`, every 50 ms, for up to [`PATIENCE`].
pub async fn eventually<T, F, Fut>(what: &str, mut attempt: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + PATIENCE;
    loop {
        if let Some(value) = attempt().await {
            return value;
        }
        assert!(
            Instant::now() < deadline,
            "{what} did not happen within {PATIENCE:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// One telemetry event as the capturing subscriber saw it.
#[derive(Debug, Clone)]
pub struct Captured {
    /// The registered key.
    pub event: String,
    /// The qualified store key, empty when the event is about no key.
    pub key: String,
    /// The human-readable detail.
    pub message: String,
}

fn captured_events() -> &'static Mutex<Vec<Captured>> {
    static EVENTS: OnceLock<Mutex<Vec<Captured>>> = OnceLock::new();
    EVENTS.get_or_init(|| Mutex::new(Vec::new()))
}

/// Installs, once per test binary, a global `tracing` subscriber that records every baton
/// event (anything with an `event` field). Call it before the code under test runs.
pub fn capture_events() {
    static INSTALLED: OnceLock<()> = OnceLock::new();
    INSTALLED.get_or_init(|| {
        let subscriber = tracing_subscriber::registry().with(Capture);
        tracing::subscriber::set_global_default(subscriber)
            .expect("no other global subscriber in these tests");
    });
}

/// The captured events of `event` that `matches`.
pub fn events(event: &Event, matches: impl Fn(&Captured) -> bool) -> Vec<Captured> {
    captured_events()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .filter(|c| c.event == event.key && matches(c))
        .cloned()
        .collect()
}

/// Waits until an event of `event` that `matches` has been captured; returns it.
pub async fn wait_for_event(event: &Event, matches: impl Fn(&Captured) -> bool) -> Captured {
    eventually(&format!("event {}", event.key), || {
        let found = events(event, &matches).into_iter().next();
        async move { found }
    })
    .await
}

struct Capture;

impl<S: tracing::Subscriber> Layer<S> for Capture {
    fn on_event(&self, event: &tracing::Event<'_>, _ctx: Context<'_, S>) {
        let mut fields = Fields::default();
        event.record(&mut fields);
        if let Some(name) = fields.event {
            captured_events()
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(Captured {
                    event: name,
                    key: fields.key.unwrap_or_default(),
                    message: fields.message.unwrap_or_default(),
                });
        }
    }
}

#[derive(Default)]
struct Fields {
    event: Option<String>,
    key: Option<String>,
    message: Option<String>,
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        match field.name() {
            "event" => self.event = Some(value.to_owned()),
            "key" => self.key = Some(value.to_owned()),
            _ => {}
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        match field.name() {
            "message" => self.message = Some(format!("{value:?}")),
            "event" => self.event = Some(format!("{value:?}").trim_matches('"').to_owned()),
            "key" => self.key = Some(format!("{value:?}").trim_matches('"').to_owned()),
            _ => {}
        }
    }
}
