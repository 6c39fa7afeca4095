//! The layer's behaviour, case by case, on an axum router driven in-process over the
//! memory store (and a store wrapper that injects faults).
//!
//! Handlers that must still be running when a duplicate arrives wait on a gate the test
//! opens, so no case depends on how fast the machine is.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, Method, Request, StatusCode};
use axum::routing::post;
use axum::{Extension, Router};
use baton_core::MemoryStore;
use baton_core::idempotency::conformance::FaultyIdempotencyStore;
use baton_core::idempotency::{Acquire, AcquireOptions, IdempotencyLog, Scope, Status};
use baton_http::{IdempotencyLayer, IdempotencyLayerBuilder, IdempotentRequest, StoreFaultPolicy};
use bytes::Bytes;
use http_body_util::BodyExt;
use sha2::{Digest, Sha256};
use tokio::sync::Semaphore;
use tower_service::Service;

#[derive(Default)]
struct Handlers {
    runs: AtomicUsize,
    gate: Option<Arc<Semaphore>>,
}

impl Handlers {
    /// Handlers whose charges wait on the returned gate (no permits yet).
    fn gated() -> (Arc<Handlers>, Arc<Semaphore>) {
        let gate = Arc::new(Semaphore::new(0));
        let handlers = Arc::new(Handlers {
            gate: Some(gate.clone()),
            ..Handlers::default()
        });
        (handlers, gate)
    }

    /// How many times a handler has started.
    fn runs(&self) -> usize {
        self.runs.load(Ordering::SeqCst)
    }
}

fn router(handlers: Arc<Handlers>, layer: IdempotencyLayer) -> Router {
    Router::new()
        .route("/charges", post(charge).patch(charge).get(count))
        .route("/fail", post(fail))
        .route("/big", post(big))
        .route("/panic", post(panic))
        .layer(layer)
        .with_state(handlers)
}

async fn charge(
    State(h): State<Arc<Handlers>>,
    request: Option<Extension<IdempotentRequest>>,
    body: Bytes,
) -> (StatusCode, [(&'static str, String); 2], String) {
    let n = h.runs.fetch_add(1, Ordering::SeqCst) + 1;
    if let Some(gate) = &h.gate {
        gate.acquire().await.unwrap().forget();
    }
    let attempt = request.map_or(0, |Extension(r)| r.attempt);
    (
        StatusCode::CREATED,
        [
            ("x-run", n.to_string()),
            ("set-cookie", "session=secret".to_owned()),
        ],
        format!(
            "run {n} attempt {attempt} body {}",
            String::from_utf8_lossy(&body)
        ),
    )
}

async fn count(State(h): State<Arc<Handlers>>) -> String {
    h.runs.load(Ordering::SeqCst).to_string()
}

async fn fail(State(h): State<Arc<Handlers>>) -> (StatusCode, String) {
    let n = h.runs.fetch_add(1, Ordering::SeqCst) + 1;
    (StatusCode::SERVICE_UNAVAILABLE, format!("failed run {n}"))
}

async fn big(State(h): State<Arc<Handlers>>) -> Vec<u8> {
    h.runs.fetch_add(1, Ordering::SeqCst);
    vec![b'x'; 100_000]
}

async fn panic(State(h): State<Arc<Handlers>>) -> String {
    h.runs.fetch_add(1, Ordering::SeqCst);
    panic!("the handler panicked on purpose");
}

fn memory_log() -> IdempotencyLog {
    IdempotencyLog::new(Arc::new(MemoryStore::new()))
}

/// The app over a fresh memory log, with the layer `configure` builds.
fn app_with(
    handlers: &Arc<Handlers>,
    configure: impl FnOnce(IdempotencyLayerBuilder) -> IdempotencyLayerBuilder,
) -> Router {
    let layer = configure(IdempotencyLayer::builder(memory_log()));
    router(handlers.clone(), layer.build().unwrap())
}

#[derive(Debug)]
struct Reply {
    status: StatusCode,
    headers: HeaderMap,
    body: String,
}

impl Reply {
    fn replayed(&self) -> bool {
        self.headers
            .get("idempotent-replayed")
            .is_some_and(|v| v == "true")
    }

    /// Asserts the reply is a problem with `status` whose body names `code`.
    fn assert_problem(&self, status: StatusCode, code: &str) {
        assert_eq!(self.status, status, "{}", self.body);
        self.assert_says(code);
    }

    fn assert_says(&self, text: &str) {
        assert!(self.body.contains(text), "{}", self.body);
    }
}

fn request(method: Method, path: &str, key: Option<&str>, body: &str) -> Request<Body> {
    let mut builder = Request::builder().method(method).uri(path);
    if let Some(key) = key {
        builder = builder.header("Idempotency-Key", key);
    }
    builder.body(Body::from(body.to_owned())).unwrap()
}

async fn send(app: &Router, request: Request<Body>) -> Reply {
    let mut app = app.clone();
    std::future::poll_fn(|cx| Service::<Request<Body>>::poll_ready(&mut app, cx))
        .await
        .unwrap();
    let response = app.call(request).await.unwrap();
    let (parts, body) = response.into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    Reply {
        status: parts.status,
        headers: parts.headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    }
}

async fn post_charge(app: &Router, key: &str, body: &str) -> Reply {
    send(app, request(Method::POST, "/charges", Some(key), body)).await
}

/// Sends `request` from a task of its own, so the test can go on while it runs.
fn spawn_send(app: &Router, request: Request<Body>) -> tokio::task::JoinHandle<Reply> {
    let app = app.clone();
    tokio::spawn(async move { send(&app, request).await })
}

fn spawn_post_charge(app: &Router, key: &str, body: &str) -> tokio::task::JoinHandle<Reply> {
    spawn_send(app, request(Method::POST, "/charges", Some(key), body))
}

/// Twenty concurrent retries of one request: it runs once, the others get its response,
/// marked as replayed, without the cookie.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_retries_run_once_and_replay() {
    let handlers = Arc::new(Handlers::default());
    let app = router(handlers.clone(), IdempotencyLayer::new(memory_log()));
    let mut tasks = Vec::new();
    for _ in 0..20 {
        tasks.push(spawn_post_charge(&app, "k-1", "{\"amount\":5}"));
    }
    let mut replies = Vec::new();
    for task in tasks {
        replies.push(task.await.unwrap());
    }
    assert_eq!(handlers.runs(), 1);
    for reply in &replies {
        assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.body);
        assert_eq!(reply.body, "run 1 attempt 1 body {\"amount\":5}");
        assert_eq!(reply.headers["x-run"], "1");
    }
    let replayed: Vec<_> = replies.iter().filter(|r| r.replayed()).collect();
    assert_eq!(replayed.len(), 19, "all but the first are replays");
    for reply in replayed {
        assert!(
            reply.headers.get("set-cookie").is_none(),
            "cookies are not replayed"
        );
        assert_eq!(reply.headers["content-type"], "text/plain; charset=utf-8");
    }
    let later = post_charge(&app, "k-1", "{\"amount\":5}").await;
    assert!(later.replayed());
    assert_eq!(
        send(&app, request(Method::GET, "/charges", None, ""))
            .await
            .body,
        "1"
    );
}

/// A retry that arrives while the first request runs waits, re-checks, and gets its response.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_of_a_running_request_waits_for_its_response() {
    let (handlers, gate) = Handlers::gated();
    let app = app_with(&handlers, |layer| {
        layer.in_flight_wait(Duration::from_secs(60))
    });
    let first = spawn_post_charge(&app, "k", "a");
    wait_for_runs(&handlers, 1).await;
    let retry = spawn_post_charge(&app, "k", "a");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!retry.is_finished(), "the retry waits while the first runs");
    gate.add_permits(1);
    let (first, retry) = (first.await.unwrap(), retry.await.unwrap());
    assert_eq!(
        (first.status, retry.status),
        (StatusCode::CREATED, StatusCode::CREATED)
    );
    assert!(!first.replayed() && retry.replayed());
    assert_eq!(first.body, retry.body);
    assert_eq!(handlers.runs(), 1);
}

/// A retry whose wait runs out while the first request still runs gets 409 with
/// Retry-After, and the first request is not disturbed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_that_waited_in_vain_gets_409_with_retry_after() {
    let (handlers, gate) = Handlers::gated();
    let app = app_with(&handlers, |layer| {
        layer
            .in_flight_wait(Duration::from_millis(100))
            .retry_after(Duration::from_secs(2))
    });
    let first = spawn_post_charge(&app, "k", "a");
    wait_for_runs(&handlers, 1).await;
    let retry = post_charge(&app, "k", "a").await;
    retry.assert_problem(StatusCode::CONFLICT, "idempotency_key_in_use");
    assert_eq!(retry.headers["retry-after"], "2");
    gate.add_permits(1);
    assert_eq!(first.await.unwrap().status, StatusCode::CREATED);
    let after = post_charge(&app, "k", "a").await;
    assert!(after.replayed());
    assert_eq!(handlers.runs(), 1);
}

/// The same key with another body, path or method is a different request: 422.
#[tokio::test]
async fn a_reused_key_with_a_different_request_gets_422() {
    let handlers = Arc::new(Handlers::default());
    let app = router(handlers.clone(), IdempotencyLayer::new(memory_log()));
    assert_eq!(
        post_charge(&app, "k", "a").await.status,
        StatusCode::CREATED
    );
    for request in [
        request(Method::POST, "/charges", Some("k"), "b"),
        request(Method::PATCH, "/charges", Some("k"), "a"),
        request(Method::POST, "/charges?x=1", Some("k"), "a"),
        request(Method::POST, "/fail", Some("k"), "a"),
    ] {
        let reply = send(&app, request).await;
        reply.assert_problem(StatusCode::UNPROCESSABLE_ENTITY, "idempotency_key_reused");
        assert!(
            reply.body.contains("\\\"k\\\""),
            "names the key: {}",
            reply.body
        );
    }
    assert_eq!(handlers.runs(), 1);
}

/// A route that requires a key answers 400 without one; a route that does not runs the
/// request unguarded; other methods pass through; a bad key is 400.
#[tokio::test]
async fn keys_missing_invalid_and_unguarded_methods() {
    let handlers = Arc::new(Handlers::default());
    let required = app_with(&handlers, |layer| layer.require_key(true));
    let reply = send(&required, request(Method::POST, "/charges", None, "a")).await;
    reply.assert_problem(StatusCode::BAD_REQUEST, "idempotency_key_missing");
    reply.assert_says("requires an Idempotency-Key header");
    assert_eq!(handlers.runs(), 0);
    assert_eq!(
        send(&required, request(Method::GET, "/charges", None, ""))
            .await
            .status,
        StatusCode::OK
    );

    let optional = router(handlers.clone(), IdempotencyLayer::new(memory_log()));
    for _ in 0..2 {
        let reply = send(&optional, request(Method::POST, "/charges", None, "a")).await;
        assert_eq!(reply.status, StatusCode::CREATED);
        assert!(!reply.replayed());
    }
    assert_eq!(handlers.runs(), 2, "no key, no protection");

    let long = "k".repeat(256);
    for key in [
        long.as_str(),
        "",
        "bad key with spaces",
        "tab\tkey",
        " leading",
    ] {
        let reply = post_charge(&optional, key, "a").await;
        reply.assert_problem(StatusCode::BAD_REQUEST, "idempotency_key_invalid");
        if key.contains(' ') {
            reply.assert_says("without spaces");
        }
    }
    // Every visible ASCII character is allowed.
    let visible: String = ('!'..='~')
        .filter(|c| *c != '"' && *c != '\\')
        .take(60)
        .collect();
    assert_eq!(
        post_charge(&optional, &visible, "a").await.status,
        StatusCode::CREATED
    );
    let mut non_ascii = request(Method::POST, "/charges", None, "a");
    non_ascii.headers_mut().insert(
        "idempotency-key",
        axum::http::HeaderValue::from_bytes(b"caf\xc3\xa9").unwrap(),
    );
    assert_eq!(
        send(&optional, non_ascii).await.status,
        StatusCode::BAD_REQUEST
    );
    assert_eq!(handlers.runs(), 3);
}

/// A configurable header name, and guarded methods.
#[tokio::test]
async fn header_and_methods_are_configurable() {
    let handlers = Arc::new(Handlers::default());
    let app = app_with(&handlers, |layer| {
        layer.header("X-Request-Key").methods([Method::PATCH])
    });
    let patch = || {
        Request::builder()
            .method(Method::PATCH)
            .uri("/charges")
            .header("x-request-key", "k")
            .body(Body::from("a"))
            .unwrap()
    };
    assert!(!send(&app, patch()).await.replayed());
    assert!(send(&app, patch()).await.replayed());
    for _ in 0..2 {
        let post = Request::builder()
            .method(Method::POST)
            .uri("/charges")
            .header("x-request-key", "k")
            .body(Body::from("a"))
            .unwrap();
        assert!(
            !send(&app, post).await.replayed(),
            "POST is not guarded here"
        );
    }
    assert_eq!(handlers.runs(), 3);
}

/// Server errors are stored as failed: the next retry runs again (by default), or gets the
/// stored failure when retrying failures is off.
#[tokio::test]
async fn failures_are_retried_unless_told_otherwise() {
    let handlers = Arc::new(Handlers::default());
    let app = router(handlers.clone(), IdempotencyLayer::new(memory_log()));
    let fail = || request(Method::POST, "/fail", Some("f"), "");
    assert_eq!(send(&app, fail()).await.body, "failed run 1");
    let again = send(&app, fail()).await;
    assert_eq!(
        (again.status, again.body.as_str()),
        (StatusCode::SERVICE_UNAVAILABLE, "failed run 2")
    );
    assert!(!again.replayed());

    let handlers = Arc::new(Handlers::default());
    let app = app_with(&handlers, |layer| layer.retry_failed(false));
    assert_eq!(send(&app, fail()).await.body, "failed run 1");
    let again = send(&app, fail()).await;
    assert_eq!(
        (again.status, again.body.as_str()),
        (StatusCode::SERVICE_UNAVAILABLE, "failed run 1")
    );
    assert!(again.replayed());
    assert_eq!(handlers.runs(), 1);
}

/// A response over the size limit is sent whole; its replays carry the status and headers
/// with an empty body, marked as omitted.
#[tokio::test]
async fn oversized_responses_are_sent_whole_and_replayed_without_body() {
    let handlers = Arc::new(Handlers::default());
    let app = app_with(&handlers, |layer| layer.max_response_body(1000));
    let big = || request(Method::POST, "/big", Some("b"), "");
    let first = send(&app, big()).await;
    assert_eq!(first.body.len(), 100_000);
    let replay = send(&app, big()).await;
    assert_eq!(replay.status, StatusCode::OK);
    assert!(replay.replayed());
    assert_eq!(replay.headers["idempotent-body-omitted"], "true");
    assert!(replay.body.is_empty());
    assert_eq!(handlers.runs(), 1);
}

/// A request body over the limit cannot be fingerprinted: 413, nothing runs.
#[tokio::test]
async fn oversized_requests_are_refused() {
    let handlers = Arc::new(Handlers::default());
    let app = app_with(&handlers, |layer| layer.max_request_body(10));
    let reply = post_charge(&app, "k", "this body is longer than ten bytes").await;
    assert_eq!(reply.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(handlers.runs(), 0);
}

/// When the store faults, the request runs unguarded and the degradation is counted; with
/// the fail-closed policy it is refused with 503 and Retry-After.
#[tokio::test]
async fn store_faults_run_unguarded_or_fail_closed() {
    let events = Events::capture();
    let faulty = Arc::new(FaultyIdempotencyStore::new(Arc::new(MemoryStore::new())));
    faulty.set_failing(true);
    let log = IdempotencyLog::new(faulty.clone());
    let handlers = Arc::new(Handlers::default());
    let open = router(handlers.clone(), IdempotencyLayer::new(log.clone()));
    let before = events.count("baton.http.idempotency_unguarded", "fault-open");
    for _ in 0..2 {
        let reply = post_charge(&open, "fault-open", "a").await;
        assert_eq!(reply.status, StatusCode::CREATED);
    }
    assert_eq!(handlers.runs(), 2, "fail open: runs, unguarded");
    assert_eq!(
        events.count("baton.http.idempotency_unguarded", "fault-open") - before,
        2
    );

    let closed = router(
        handlers.clone(),
        IdempotencyLayer::builder(log)
            .on_store_fault(StoreFaultPolicy::FailClosed)
            .build()
            .unwrap(),
    );
    let reply = post_charge(&closed, "fault-closed", "a").await;
    reply.assert_problem(StatusCode::SERVICE_UNAVAILABLE, "idempotency_unavailable");
    assert_eq!(reply.headers["retry-after"], "1");
    assert_eq!(handlers.runs(), 2, "fail closed: nothing ran");
    assert_eq!(
        events.count("baton.http.idempotency_refused", "fault-closed"),
        1
    );

    faulty.set_failing(false);
    assert_eq!(
        post_charge(&closed, "fault-closed", "a").await.status,
        StatusCode::CREATED
    );
    assert!(post_charge(&closed, "fault-closed", "a").await.replayed());
}

/// A client that hangs up does not cancel the request half-way: it runs to the end and its
/// response is stored for the retry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_hangs_up_does_not_cancel_the_request() {
    let (handlers, gate) = Handlers::gated();
    let log = memory_log();
    let app = router(handlers.clone(), IdempotencyLayer::new(log.clone()));
    let hung_up = spawn_post_charge(&app, "hang-up", "a");
    wait_for_runs(&handlers, 1).await;
    hung_up.abort();
    let _ = hung_up.await;
    gate.add_permits(1);
    wait_for_record(&log, "hang-up", Status::Completed).await;
    let retry = post_charge(&app, "hang-up", "a").await;
    assert!(retry.replayed());
    assert_eq!(retry.body, "run 1 attempt 1 body a");
}

/// A handler that panics leaves the record failed (not pending until its lease lapses), so
/// the retry runs at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_handler_leaves_a_failed_record() {
    let handlers = Arc::new(Handlers::default());
    let log = memory_log();
    let app = router(handlers.clone(), IdempotencyLayer::new(log.clone()));
    let panic = || request(Method::POST, "/panic", Some("p"), "");
    let panicked = spawn_send(&app, panic());
    assert!(
        panicked.await.unwrap_err().is_panic(),
        "the panic reaches the caller"
    );
    wait_for_record(&log, "p", Status::Failed).await;
    let retry = spawn_send(&app, panic());
    assert!(retry.await.unwrap_err().is_panic());
    assert_eq!(handlers.runs(), 2, "the retry ran at once");
}

/// A retry that finds the request pending on a server that died waits, and once the dead
/// server's lease lapses takes over and runs it, as attempt 2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_takes_over_from_a_dead_server_after_its_lease() {
    let handlers = Arc::new(Handlers::default());
    let log = memory_log();
    // What the dead replica left: a pending record of the same request, with a short lease.
    let scope = Scope::new("default", "http", "orphan").unwrap();
    let options = AcquireOptions::new(Duration::from_secs(3600))
        .lease(Duration::from_millis(200))
        .fingerprint(fingerprint("POST", "/charges", b"a"));
    let Acquire::Acquired(dead) = log.try_acquire_with(&scope, &options).await.unwrap() else {
        panic!("the dead replica acquired first");
    };
    let layer = IdempotencyLayer::builder(log)
        .in_flight_wait(Duration::from_secs(60))
        .build()
        .unwrap();
    let app = router(handlers.clone(), layer);
    let reply = post_charge(&app, "orphan", "a").await;
    assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.body);
    assert_eq!(reply.body, "run 1 attempt 2 body a");
    assert!(!reply.replayed());
    drop(dead);
}

/// The documented fingerprint: SHA-256 over the length-prefixed method, target and body.
fn fingerprint(method: &str, target: &str, body: &[u8]) -> String {
    let mut hash = Sha256::new();
    for part in [method.as_bytes(), target.as_bytes(), body] {
        hash.update((part.len() as u64).to_be_bytes());
        hash.update(part);
    }
    hash.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// Partitions keep callers apart: the same key from two clients runs twice.
#[tokio::test]
async fn partitions_keep_callers_apart() {
    let handlers = Arc::new(Handlers::default());
    let app = app_with(&handlers, |layer| {
        layer.partition_by(|parts| {
            parts
                .headers
                .get("x-client")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("anonymous")
                .to_owned()
        })
    });
    let from = |client: &str| {
        Request::builder()
            .method(Method::POST)
            .uri("/charges")
            .header("idempotency-key", "same")
            .header("x-client", client)
            .body(Body::from("a"))
            .unwrap()
    };
    assert!(!send(&app, from("alice")).await.replayed());
    assert!(!send(&app, from("bob")).await.replayed());
    assert!(send(&app, from("alice")).await.replayed());
    let misconfigured = send(&app, from("a:b")).await;
    misconfigured.assert_problem(
        StatusCode::INTERNAL_SERVER_ERROR,
        "idempotency_misconfigured",
    );
    assert_eq!(handlers.runs(), 2);
}

#[test]
fn the_builder_is_must_use_and_debuggable() {
    let builder: IdempotencyLayerBuilder = IdempotencyLayer::builder(memory_log());
    assert!(format!("{builder:?}").contains("Idempotency-Key"));
}

async fn wait_for_runs(handlers: &Handlers, n: usize) {
    eventually("the handler to start", || async { handlers.runs() >= n }).await;
}

/// Waits until the layer's record of the request with idempotency key `key` has `status`.
async fn wait_for_record(log: &IdempotencyLog, key: &str, status: Status) {
    let scope = Scope::new("default", "http", key).unwrap();
    eventually(
        &format!("the record of {key:?} to be {status:?}"),
        || async {
            log.get(&scope)
                .await
                .unwrap()
                .is_some_and(|r| r.status() == status)
        },
    )
    .await;
}

async fn eventually<F, Fut>(what: &str, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = tokio::time::Instant::now();
    while !cond().await {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "{what} did not happen within 30s"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The telemetry events emitted by this test process, as `(event key, scope key)`.
struct Events;

type Seen = Arc<Mutex<Vec<(String, String)>>>;
static SEEN: OnceLock<Seen> = OnceLock::new();

impl Events {
    fn capture() -> Events {
        use tracing_subscriber::layer::SubscriberExt;
        SEEN.get_or_init(|| {
            let seen = Arc::new(Mutex::new(Vec::new()));
            let subscriber = tracing_subscriber::registry().with(Capture(Arc::clone(&seen)));
            tracing::subscriber::set_global_default(subscriber).expect("one global subscriber");
            seen
        });
        Events
    }

    /// How many `event`s were emitted about a key containing `key`.
    fn count(&self, event: &str, key: &str) -> usize {
        SEEN.get()
            .unwrap()
            .lock()
            .unwrap()
            .iter()
            .filter(|(e, k)| e == event && k.contains(key))
            .count()
    }
}

struct Capture(Seen);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Capture {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        #[derive(Default)]
        struct Fields {
            event: Option<String>,
            key: String,
        }
        impl tracing::field::Visit for Fields {
            fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
                match field.name() {
                    "event" => self.event = Some(value.to_owned()),
                    "key" => self.key = value.to_owned(),
                    _ => {}
                }
            }
            fn record_debug(&mut self, _: &tracing::field::Field, _: &dyn std::fmt::Debug) {}
        }
        let mut fields = Fields::default();
        event.record(&mut fields);
        if let Some(name) = fields.event {
            self.0.lock().unwrap().push((name, fields.key));
        }
    }
}
