//! Helpers of the Redis fault tests: stores on private servers, captured telemetry, and
//! bounded waiting.
//!
//! Every wait here is a poll with a generous deadline, so the tests hold on a loaded 2-core
//! machine; the only time bounds asserted are the ones the contract states (a call fails
//! within its configured timeout, a lost signal fires by `valid_until`), each with slack.

#![allow(dead_code, unreachable_pub)]

use std::future::Future;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use baton_core::telemetry::Event;
use baton_core::{Key, KeyKind, Namespace, StoreKey};
use baton_redis::RedisStore;
use tokio::time::Instant;
use tracing::field::{Field, Visit};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};

/// The timeouts of the stores under test (connect, and response): short, so faults show
/// quickly, but far above a loaded machine's round trip.
pub const STORE_TIMEOUT: Duration = Duration::from_secs(1);

/// The longest a store call may take by its options: a reconnect plus a request.
pub const CALL_DEADLINE: Duration = Duration::from_secs(2);

/// What a loaded machine may add to a deadline the contract states.
pub const SLACK: Duration = Duration::from_secs(5);

/// How long any one step of a test may take before the test fails instead of hanging.
pub const PATIENCE: Duration = Duration::from_secs(60);

/// `url` with the test timeouts in its query.
pub fn with_timeouts(url: &str) -> String {
    let ms = STORE_TIMEOUT.as_millis();
    format!("{url}?connect_timeout={ms}ms&response_timeout={ms}ms")
}

/// A store on `url` (a bare `redis://host:port`), with the test timeouts.
pub async fn connect(url: &str) -> Arc<RedisStore> {
    Arc::new(
        RedisStore::connect(&with_timeouts(url))
            .await
            .unwrap_or_else(|e| panic!("connect to {url}: {e}")),
    )
}

/// A namespace no other test uses, so tests may share a server.
pub fn namespace() -> Namespace {
    baton_core::conformance::fresh_namespace()
}

/// The qualified key of lock `key` in `ns`.
pub fn lock_key(ns: &Namespace, key: &str) -> StoreKey {
    ns.qualify(KeyKind::Lock, &Key::new(key).expect("a valid key"))
}

/// Runs blocking work (starting, killing, pausing a server) off the runtime's threads.
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
    /// The registered key (`baton.lock.release_faulted`).
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
            .expect("no other global subscriber in the fault tests");
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
    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
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
            "message" => self.message = Some(value.to_owned()),
            _ => {}
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.message = Some(format!("{value:?}"));
        }
    }
}
