//! [`IdempotencyLayer`] and its builder: which requests are guarded, and how.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use baton_core::idempotency::{AcquireOptions, IdempotencyLog, MAX_METADATA_BYTES, Scope};
use baton_core::time::format_duration;
use baton_core::{Error, Result};
use http::{HeaderName, Method, request::Parts};
use tower_layer::Layer;

use crate::service::IdempotencyService;

/// The request header that carries the key, by default.
pub const DEFAULT_HEADER: &str = "Idempotency-Key";
/// The response header that marks a replay, by default (the value is `true`).
pub const DEFAULT_REPLAYED_HEADER: &str = "Idempotent-Replayed";
/// How long a stored response is kept for retries, by default.
pub const DEFAULT_TTL: Duration = Duration::from_secs(24 * 3600);
/// The running request's lease, by default: how long after its server died a retry may run
/// the request again. It is renewed while the request runs.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);
/// How long a duplicate of a running request waits for its response, by default, before it
/// is answered `409 Conflict`.
pub const DEFAULT_IN_FLIGHT_WAIT: Duration = Duration::from_secs(5);
/// The largest request body read to fingerprint the request, by default.
pub const DEFAULT_MAX_REQUEST_BODY: usize = 1024 * 1024;
/// The largest response body stored for replay, by default.
pub const DEFAULT_MAX_RESPONSE_BODY: usize = 64 * 1024;
/// The longest a duplicate may be made to wait.
pub const MAX_IN_FLIGHT_WAIT: Duration = Duration::from_secs(300);

/// What a request with an idempotency key gets when the store cannot be reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StoreFaultPolicy {
    /// Run the request without protection and count it
    /// ([`baton.http.idempotency_unguarded`](baton_core::telemetry::events::HTTP_IDEMPOTENCY_UNGUARDED)):
    /// a store outage does not become a write outage, at the risk of running a retry twice
    /// during it. The seed filter's policy, and the default.
    #[default]
    FailOpen,
    /// Answer `503 Service Unavailable` with `Retry-After` and count it
    /// ([`baton.http.idempotency_refused`](baton_core::telemetry::events::HTTP_IDEMPOTENCY_REFUSED)):
    /// nothing runs unguarded. For endpoints where a double execution costs more than an
    /// outage (payments).
    FailClosed,
}

/// The partition (the scope's `org`) of a request: who its keys belong to.
type OrgFn = dyn Fn(&Parts) -> String + Send + Sync;

/// Everything a service needs, validated, shared by every clone.
pub(crate) struct Config {
    pub(crate) log: IdempotencyLog,
    pub(crate) header: HeaderName,
    /// The header's name as configured, for messages (`Idempotency-Key`).
    pub(crate) header_label: String,
    pub(crate) replayed_header: HeaderName,
    pub(crate) methods: Vec<Method>,
    pub(crate) required: bool,
    pub(crate) domain: String,
    pub(crate) org: Arc<OrgFn>,
    pub(crate) ttl: Duration,
    pub(crate) lease: Duration,
    pub(crate) in_flight_wait: Duration,
    pub(crate) retry_after: Duration,
    pub(crate) max_request_body: usize,
    pub(crate) max_response_body: usize,
    pub(crate) on_store_fault: StoreFaultPolicy,
    pub(crate) retry_failed: bool,
    pub(crate) not_stored: Vec<HeaderName>,
}

impl Config {
    /// The acquire options of a request with `fingerprint`.
    pub(crate) fn acquire_options(&self, fingerprint: &str) -> AcquireOptions {
        AcquireOptions::new(self.ttl)
            .lease(self.lease)
            .fingerprint(fingerprint)
            .retry_failed(self.retry_failed)
    }

    /// Whether `name` is kept when a response is stored.
    pub(crate) fn stores_header(&self, name: &HeaderName) -> bool {
        !NOT_REPLAY_SAFE.contains(&name.as_str())
            && *name != self.replayed_header
            && !self.not_stored.contains(name)
    }
}

/// Response headers never stored: hop-by-hop headers, headers that describe one
/// transmission (`content-length`, `date`, `age`), and `set-cookie`, which must not be
/// handed out again.
pub const NOT_REPLAY_SAFE: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "transfer-encoding",
    "te",
    "trailer",
    "upgrade",
    "content-length",
    "date",
    "age",
    "set-cookie",
];

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field("log", &self.log)
            .field("header", &self.header)
            .field("methods", &self.methods)
            .field("required", &self.required)
            .field("domain", &self.domain)
            .field("ttl", &self.ttl)
            .field("lease", &self.lease)
            .field("in_flight_wait", &self.in_flight_wait)
            .field("on_store_fault", &self.on_store_fault)
            .finish_non_exhaustive()
    }
}

/// Whether a key header's text is visible ASCII (`!` to `~`): no space, tab or control
/// character, which `HeaderValue::to_str` lets through.
pub(crate) fn is_visible_ascii(key: &str) -> bool {
    key.bytes().all(|b| b.is_ascii_graphic())
}

/// A tower [`Layer`] that makes requests carrying an `Idempotency-Key` run once.
///
/// A request whose method is guarded (POST and PATCH by default) and that carries the key
/// header runs once per `(partition, domain, key)` while its record lives (24 h by
/// default); its response (status, replay-safe headers, body up to 64 KiB by default) is
/// stored in the [`IdempotencyLog`] and replayed to every retry, marked
/// `Idempotent-Replayed: true`. Replicas that share a store share the guarantee.
///
/// ## Behavior
/// - **No key**: the request runs as usual, unless the layer was built with
///   [`require_key`](IdempotencyLayerBuilder::require_key): `400 Bad Request` saying so.
///   A key that is empty, longer than 255 bytes or not visible ASCII: `400`.
/// - **First request**: runs, detached from the client's connection (a client that hangs
///   up does not cancel it half-way); its lease is renewed while it runs; its response is
///   stored before it is sent.
/// - **Retry of a finished request**: the stored response, replayed.
/// - **Retry while the first still runs**: waits up to
///   [`in_flight_wait`](IdempotencyLayerBuilder::in_flight_wait) (5 s) re-checking the
///   store, then `409 Conflict` with `Retry-After`.
/// - **Same key, different request** (method, path and query, or body differ): `422
///   Unprocessable Entity`.
/// - **Server errors** (5xx, and 408, 425, 429): stored as failed; the next retry runs the
///   request again ([`retry_failed`](IdempotencyLayerBuilder::retry_failed), on by default).
/// - **The server running the first request died**: after its lease (30 s) the next retry
///   runs the request again — at-least-once for that window, counted as
///   `baton.idempotency.takeover`.
/// - **Store fault**: see [`StoreFaultPolicy`] (run unguarded by default, or `503`).
/// - Request bodies over [`max_request_body`](IdempotencyLayerBuilder::max_request_body)
///   (1 MiB) are answered `413` when they carry a key: they cannot be fingerprinted.
/// - The handler can read [`IdempotentRequest`](crate::IdempotentRequest) from the request
///   extensions (the attempt number, whether it took over).
///
/// # Examples
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use baton_http::{IdempotencyLayer, StoreFaultPolicy};
///
/// let baton = baton::connect("memory://").await?;
/// let layer = IdempotencyLayer::builder(baton.idempotency()?)
///     .domain("payments")
///     .require_key(true)
///     .on_store_fault(StoreFaultPolicy::FailClosed)
///     .partition_by(|parts| {
///         // who the key belongs to: here, the API client's id
///         parts.headers.get("x-client-id").and_then(|v| v.to_str().ok()).unwrap_or("anonymous").replace(':', "_")
///     })
///     .ttl(Duration::from_secs(24 * 3600))
///     .build()?;
/// // axum: Router::new().route("/charges", post(charge)).layer(layer)
/// # let _ = layer;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct IdempotencyLayer {
    config: Arc<Config>,
}

impl IdempotencyLayer {
    /// A layer with every default: header `Idempotency-Key`, POST and PATCH, key optional,
    /// domain `http`, one partition for all callers, fail open.
    pub fn new(log: IdempotencyLog) -> Self {
        IdempotencyLayer::builder(log)
            .build()
            .expect("the defaults are valid")
    }

    /// A builder starting from the defaults of [`IdempotencyLayer::new`].
    pub fn builder(log: IdempotencyLog) -> IdempotencyLayerBuilder {
        IdempotencyLayerBuilder {
            log,
            header: DEFAULT_HEADER.to_owned(),
            replayed_header: DEFAULT_REPLAYED_HEADER.to_owned(),
            methods: vec![Method::POST, Method::PATCH],
            required: false,
            domain: "http".to_owned(),
            org: Arc::new(|_: &Parts| "default".to_owned()),
            ttl: DEFAULT_TTL,
            lease: DEFAULT_LEASE,
            in_flight_wait: DEFAULT_IN_FLIGHT_WAIT,
            retry_after: Duration::from_secs(1),
            max_request_body: DEFAULT_MAX_REQUEST_BODY,
            max_response_body: DEFAULT_MAX_RESPONSE_BODY,
            on_store_fault: StoreFaultPolicy::FailOpen,
            retry_failed: true,
            not_stored: Vec::new(),
        }
    }
}

impl<S> Layer<S> for IdempotencyLayer {
    type Service = IdempotencyService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        IdempotencyService::new(inner, Arc::clone(&self.config))
    }
}

/// Builds an [`IdempotencyLayer`]; [`build`](Self::build) checks the settings together.
#[must_use = "a builder does nothing until build() is called"]
pub struct IdempotencyLayerBuilder {
    log: IdempotencyLog,
    header: String,
    replayed_header: String,
    methods: Vec<Method>,
    required: bool,
    domain: String,
    org: Arc<OrgFn>,
    ttl: Duration,
    lease: Duration,
    in_flight_wait: Duration,
    retry_after: Duration,
    max_request_body: usize,
    max_response_body: usize,
    on_store_fault: StoreFaultPolicy,
    retry_failed: bool,
    not_stored: Vec<String>,
}

impl fmt::Debug for IdempotencyLayerBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyLayerBuilder")
            .field("header", &self.header)
            .field("methods", &self.methods)
            .field("required", &self.required)
            .field("domain", &self.domain)
            .finish_non_exhaustive()
    }
}

impl IdempotencyLayerBuilder {
    /// The request header carrying the key (`Idempotency-Key`).
    pub fn header(mut self, name: impl Into<String>) -> Self {
        self.header = name.into();
        self
    }

    /// The response header marking a replay (`Idempotent-Replayed`).
    pub fn replayed_header(mut self, name: impl Into<String>) -> Self {
        self.replayed_header = name.into();
        self
    }

    /// The methods that are guarded (POST and PATCH); others pass through untouched.
    pub fn methods(mut self, methods: impl IntoIterator<Item = Method>) -> Self {
        self.methods = methods.into_iter().collect();
        self
    }

    /// Whether a guarded request without the header is refused with `400` (off). Turn it on
    /// for the routes that must never run twice.
    pub fn require_key(mut self, required: bool) -> Self {
        self.required = required;
        self
    }

    /// The scope's domain for this layer's requests (`http`): layers with different domains
    /// never see each other's keys.
    pub fn domain(mut self, domain: impl Into<String>) -> Self {
        self.domain = domain.into();
        self
    }

    /// Who a request's key belongs to (the scope's `org`): two callers using the same key
    /// must not see each other's responses, so in an API with several clients return the
    /// authenticated client, tenant or user. By default every request is in one partition.
    ///
    /// The answer must be a valid scope org (non-empty, at most 120 bytes, no `:` and no
    /// control characters); a request for which it is not is answered `500` (a
    /// misconfiguration, not the client's fault).
    pub fn partition_by(mut self, org: impl Fn(&Parts) -> String + Send + Sync + 'static) -> Self {
        self.org = Arc::new(org);
        self
    }

    /// How long a response is kept for retries (24 h).
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// The running request's lease (30 s, renewed every third of it while it runs): how
    /// long after the server running it died a retry may run it again.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// How long a retry of a running request waits for its response before `409` (5 s; at
    /// most 5 min; zero answers `409` at once).
    pub fn in_flight_wait(mut self, wait: Duration) -> Self {
        self.in_flight_wait = wait;
        self
    }

    /// The `Retry-After` of `409` and `503` answers (1 s; whole seconds, rounded up).
    pub fn retry_after(mut self, after: Duration) -> Self {
        self.retry_after = after;
        self
    }

    /// The largest request body read to fingerprint a guarded request (1 MiB); larger ones
    /// are answered `413`.
    pub fn max_request_body(mut self, bytes: usize) -> Self {
        self.max_request_body = bytes;
        self
    }

    /// The largest response body stored for replay (64 KiB, at most 1 MiB). A larger
    /// response is still sent whole; its replays carry the status and headers with an empty
    /// body and `Idempotent-Body-Omitted: true`.
    pub fn max_response_body(mut self, bytes: usize) -> Self {
        self.max_response_body = bytes;
        self
    }

    /// What to do when the store cannot be reached ([`StoreFaultPolicy::FailOpen`]).
    pub fn on_store_fault(mut self, policy: StoreFaultPolicy) -> Self {
        self.on_store_fault = policy;
        self
    }

    /// Whether a retry of a request that failed (5xx, 408, 425, 429) runs it again (on). Off:
    /// the failed response is replayed like any other.
    pub fn retry_failed(mut self, retry: bool) -> Self {
        self.retry_failed = retry;
        self
    }

    /// A response header never to store and replay, beyond [`NOT_REPLAY_SAFE`].
    pub fn not_stored_header(mut self, name: impl Into<String>) -> Self {
        self.not_stored.push(name.into());
        self
    }

    /// Checks the settings and builds the layer.
    ///
    /// # Errors
    /// `InvalidInput` naming the setting: a header name that is not a valid HTTP header
    /// name, no methods, a domain that is not a valid scope domain, a TTL or lease out of
    /// range or a lease longer than the TTL, a wait over [`MAX_IN_FLIGHT_WAIT`], a zero
    /// `Retry-After`, or a response limit over 1 MiB.
    pub fn build(self) -> Result<IdempotencyLayer> {
        let header_name = |what: &str, name: &str| {
            HeaderName::from_bytes(name.as_bytes()).map_err(|_| {
                Error::invalid_input(format!("{what} {name:?} is not a valid HTTP header name"))
            })
        };
        let header = header_name("header", &self.header)?;
        let replayed_header = header_name("replayed header", &self.replayed_header)?;
        let not_stored = self
            .not_stored
            .iter()
            .map(|n| header_name("not-stored header", n))
            .collect::<Result<Vec<_>>>()?;
        if self.methods.is_empty() {
            return Err(Error::invalid_input(
                "no methods are guarded; name at least one (POST and PATCH by default)",
            ));
        }
        Scope::new("org", self.domain.as_str(), "key")?;
        AcquireOptions::new(self.ttl).lease(self.lease).validate()?;
        if self.in_flight_wait > MAX_IN_FLIGHT_WAIT {
            return Err(Error::invalid_input(format!(
                "in_flight_wait {} is above the maximum of {}; a duplicate holds a connection while it waits",
                format_duration(self.in_flight_wait),
                format_duration(MAX_IN_FLIGHT_WAIT)
            )));
        }
        if self.retry_after.is_zero() {
            return Err(Error::invalid_input(
                "retry_after is 0; it must be at least 1s",
            ));
        }
        if self.max_response_body > MAX_METADATA_BYTES {
            return Err(Error::invalid_input(format!(
                "max_response_body {} is above the idempotency log's limit of {MAX_METADATA_BYTES} bytes",
                self.max_response_body
            )));
        }
        Ok(IdempotencyLayer {
            config: Arc::new(Config {
                log: self.log,
                header,
                header_label: self.header,
                replayed_header,
                methods: self.methods,
                required: self.required,
                domain: self.domain,
                org: self.org,
                ttl: self.ttl,
                lease: self.lease,
                in_flight_wait: self.in_flight_wait,
                retry_after: self.retry_after,
                max_request_body: self.max_request_body,
                max_response_body: self.max_response_body,
                on_store_fault: self.on_store_fault,
                retry_failed: self.retry_failed,
                not_stored,
            }),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use baton_core::MemoryStore;

    fn log() -> IdempotencyLog {
        IdempotencyLog::new(Arc::new(MemoryStore::new()))
    }

    #[test]
    fn settings_are_checked_together() {
        assert!(IdempotencyLayer::builder(log()).build().is_ok());
        let cases: Vec<(IdempotencyLayerBuilder, &str)> = vec![
            (
                IdempotencyLayer::builder(log()).header("bad header"),
                "not a valid HTTP header",
            ),
            (
                IdempotencyLayer::builder(log()).replayed_header(""),
                "not a valid HTTP header",
            ),
            (IdempotencyLayer::builder(log()).methods([]), "no methods"),
            (IdempotencyLayer::builder(log()).domain("a:b"), "':'"),
            (
                IdempotencyLayer::builder(log()).domain(""),
                "domain is empty",
            ),
            (
                IdempotencyLayer::builder(log())
                    .ttl(Duration::from_secs(10))
                    .lease(Duration::from_secs(11)),
                "longer than the record's ttl",
            ),
            (
                IdempotencyLayer::builder(log()).in_flight_wait(Duration::from_secs(301)),
                "in_flight_wait",
            ),
            (
                IdempotencyLayer::builder(log()).retry_after(Duration::ZERO),
                "retry_after",
            ),
            (
                IdempotencyLayer::builder(log()).max_response_body(MAX_METADATA_BYTES + 1),
                "max_response_body",
            ),
        ];
        for (builder, says) in cases {
            let e = builder.build().unwrap_err();
            assert!(e.is_invalid_input(), "{e}");
            assert!(e.message().contains(says), "{e} should say {says}");
        }
    }

    #[test]
    fn replay_safe_headers() {
        let layer = IdempotencyLayer::builder(log())
            .not_stored_header("x-request-id")
            .build()
            .unwrap();
        let config = &layer.config;
        for kept in ["content-type", "location", "etag", "x-charge-id"] {
            assert!(
                config.stores_header(&HeaderName::from_static(kept)),
                "{kept}"
            );
        }
        for dropped in [
            "set-cookie",
            "content-length",
            "date",
            "transfer-encoding",
            "x-request-id",
            "idempotent-replayed",
        ] {
            assert!(
                !config.stores_header(&HeaderName::from_static(dropped)),
                "{dropped}"
            );
        }
    }
}
