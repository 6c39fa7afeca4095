//! [`IdempotencyService`]: what the layer wraps around a service, and the path of one
//! request through it.

use std::fmt;
use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use baton_core::idempotency::{
    Acquire, AcquireOptions, Attempt, AttemptKeepAlive, Finalize, MAX_METADATA_BYTES, Outcome,
    Record, Scope, Status, Takeover,
};
use baton_core::retry::Backoff;
use baton_core::telemetry::{self, events};
use baton_core::{CancellationToken, WaitForCancellationFutureOwned};
use bytes::{Bytes, BytesMut};
use http::request::Parts;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body::Body;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use tokio::time::{Instant, sleep};
use tower_service::Service;

use crate::body::{BoxError, IdempotentBody};
use crate::fingerprint::fingerprint;
use crate::layer::{Config, StoreFaultPolicy};
use crate::reply::{self, problem, retry_later};
use crate::stored::StoredResponse;

/// What the handler of a guarded request finds in its request extensions.
///
/// Pass [`attempt`](Self::attempt) on where a repeat must be detected (as a fence, or in
/// the idempotency key you give a payment provider: `format!("{key}:{attempt}")` would
/// defeat it, so give the provider the key itself and log the attempt).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdempotentRequest {
    /// The request's idempotency key.
    pub key: String,
    /// Which attempt of this key this is: 1, or more after a takeover or a retry of a
    /// failure.
    pub attempt: u32,
    /// `Some` when an earlier attempt of this key may have run (a takeover after its
    /// server died) or failed.
    pub takeover: Option<Takeover>,
    /// The attempt's lost signal, from the keep-alive of its lease.
    lost: CancellationToken,
}

impl IdempotentRequest {
    /// Resolves when this attempt is known or presumed to have lost its record (another
    /// attempt took it over after the lease lapsed): the response will not be stored, and a
    /// retry may run the request again. An owned future: await it, or use it as a
    /// `tokio::select!` branch to stop work no longer owned.
    pub fn lost(&self) -> WaitForCancellationFutureOwned {
        self.lost.clone().cancelled_owned()
    }

    /// The lost signal as a token (cancelling it changes nothing for the attempt).
    pub fn lost_token(&self) -> CancellationToken {
        self.lost.child_token()
    }

    /// Whether the lost signal has fired.
    pub fn is_lost(&self) -> bool {
        self.lost.is_cancelled()
    }
}

/// The service an [`IdempotencyLayer`](crate::IdempotencyLayer) makes: see there for what
/// it does.
#[derive(Clone)]
pub struct IdempotencyService<S> {
    inner: S,
    config: Arc<Config>,
}

impl<S> IdempotencyService<S> {
    pub(crate) fn new(inner: S, config: Arc<Config>) -> Self {
        IdempotencyService { inner, config }
    }
}

impl<S: fmt::Debug> fmt::Debug for IdempotencyService<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyService")
            .field("inner", &self.inner)
            .field("config", &self.config)
            .finish()
    }
}

/// The future of [`IdempotencyService::call`].
pub type ResponseFuture<B, E> =
    Pin<Box<dyn Future<Output = Result<Response<IdempotentBody<B>>, E>> + Send + 'static>>;

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for IdempotencyService<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqBody: Body + From<Bytes> + Send + 'static,
    ReqBody::Data: Send,
    ReqBody::Error: Into<BoxError>,
    ResBody: Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    type Response = Response<IdempotentBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<ResBody, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        // The clone takes our place; the instance that was made ready goes with the request.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        let config = Arc::clone(&self.config);
        Box::pin(handle(inner, config, request))
    }
}

/// Response<Bytes> (the layer's own answers and replays) as the service's response.
fn own<B>(response: Response<Bytes>) -> Response<IdempotentBody<B>> {
    response.map(IdempotentBody::buffered)
}

async fn passthrough<S, ReqBody, ResBody>(
    mut inner: S,
    request: Request<ReqBody>,
) -> Result<Response<IdempotentBody<ResBody>>, S::Error>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
{
    Ok(inner.call(request).await?.map(IdempotentBody::inner))
}

/// One request, from its key to its answer.
async fn handle<S, ReqBody, ResBody>(
    inner: S,
    config: Arc<Config>,
    request: Request<ReqBody>,
) -> Result<Response<IdempotentBody<ResBody>>, S::Error>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqBody: Body + From<Bytes> + Send + 'static,
    ReqBody::Error: Into<BoxError>,
    ResBody: Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    if !config.methods.contains(request.method()) {
        return passthrough(inner, request).await;
    }
    let header = &config.header_label;
    let key = match request.headers().get(&config.header) {
        None if config.required => {
            return Ok(own(problem(
                StatusCode::BAD_REQUEST,
                "idempotency_key_missing",
                &format!(
                    "this endpoint requires an {header} header: a unique key per operation (a UUID), sent again unchanged with every retry of that operation"
                ),
            )));
        }
        None => return passthrough(inner, request).await,
        Some(value) => match value.to_str() {
            Ok(key) if crate::layer::is_visible_ascii(key) => key.to_owned(),
            _ => {
                return Ok(own(problem(
                    StatusCode::BAD_REQUEST,
                    "idempotency_key_invalid",
                    &format!(
                        "the {header} header must be visible ASCII text, without spaces or control characters (a UUID, say)"
                    ),
                )));
            }
        },
    };
    if let Err(e) = Scope::new("org", "domain", key.as_str()) {
        return Ok(own(problem(
            StatusCode::BAD_REQUEST,
            "idempotency_key_invalid",
            &format!("the {header} header is not a valid key: {}", e.message()),
        )));
    }
    let (parts, body) = request.into_parts();
    let org = (config.org)(&parts);
    let scope = match Scope::new(org, config.domain.as_str(), key.as_str()) {
        Ok(scope) => scope,
        Err(e) => {
            return Ok(own(problem(
                StatusCode::INTERNAL_SERVER_ERROR,
                "idempotency_misconfigured",
                &format!(
                    "the server's idempotency partition for this request is invalid ({}); this is a server configuration error",
                    e.message()
                ),
            )));
        }
    };
    let body = match Limited::new(body, config.max_request_body).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(e) if e.downcast_ref::<LengthLimitError>().is_some() => {
            return Ok(own(problem(
                StatusCode::PAYLOAD_TOO_LARGE,
                "request_too_large",
                &format!(
                    "a request with an {header} header may carry at most {} bytes of body",
                    config.max_request_body
                ),
            )));
        }
        Err(e) => {
            return Ok(own(problem(
                StatusCode::BAD_REQUEST,
                "request_body_unreadable",
                &format!("the request body could not be read: {e}"),
            )));
        }
    };
    let fingerprint = fingerprint(&parts, &body);
    // From here on the request runs on its own task, detached from this future: a client
    // that hangs up must not stop it half-way (after its acquire, or after its side effect
    // and before its response is stored).
    let keyed = tokio::spawn(keyed(
        inner,
        config,
        Keyed {
            parts,
            body,
            key,
            scope,
            fingerprint,
        },
    ));
    match keyed.await {
        Ok(result) => result,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(_) => Ok(own(problem(
            StatusCode::SERVICE_UNAVAILABLE,
            "shutting_down",
            "the server is shutting down",
        ))),
    }
}

/// A guarded request with a valid key, its body read.
struct Keyed {
    parts: Parts,
    body: Bytes,
    key: String,
    scope: Scope,
    fingerprint: String,
}

/// Acquires the request's record and runs it, or answers it as a duplicate, or applies the
/// store fault policy.
async fn keyed<S, ReqBody, ResBody>(
    inner: S,
    config: Arc<Config>,
    request: Keyed,
) -> Result<Response<IdempotentBody<ResBody>>, S::Error>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    ReqBody: From<Bytes>,
    ResBody: Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    let Keyed {
        mut parts,
        body,
        key,
        scope,
        fingerprint,
    } = request;
    let options = config.acquire_options(&fingerprint);
    let attempt = match config.log.try_acquire_with(&scope, &options).await {
        Ok(Acquire::Acquired(attempt)) => attempt,
        Ok(Acquire::Duplicate(record)) => {
            match settle(&config, &scope, &options, &fingerprint, record).await {
                Next::Reply(response) => return Ok(own(response)),
                Next::Run(attempt) => attempt,
            }
        }
        Err(error) if error.is_invalid_input() => {
            return Ok(own(problem(
                StatusCode::BAD_REQUEST,
                "idempotency_key_invalid",
                error.message(),
            )));
        }
        Err(error) => {
            return match config.on_store_fault {
                StoreFaultPolicy::FailOpen => {
                    telemetry::emit(
                        &events::HTTP_IDEMPOTENCY_UNGUARDED,
                        Some(&scope.to_string()),
                        format_args!(
                            "{} {} ran unguarded: {error}",
                            parts.method,
                            parts.uri.path()
                        ),
                    );
                    let request = Request::from_parts(parts, ReqBody::from(body));
                    passthrough(inner, request).await
                }
                StoreFaultPolicy::FailClosed => {
                    telemetry::emit(
                        &events::HTTP_IDEMPOTENCY_REFUSED,
                        Some(&scope.to_string()),
                        format_args!("{} {} refused: {error}", parts.method, parts.uri.path()),
                    );
                    Ok(own(retry_later(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "idempotency_unavailable",
                        "the idempotency store cannot be reached, so the request was not run; retry it later with the same key",
                        config.retry_after,
                    )))
                }
            };
        }
    };
    let keeper = config.log.keep_alive(&attempt);
    parts.extensions.insert(IdempotentRequest {
        key,
        attempt: attempt.number(),
        takeover: attempt.takeover(),
        lost: keeper.lost_token(),
    });
    let request = Request::from_parts(parts, ReqBody::from(body));
    guarded(inner, config, attempt, keeper, request).await
}

/// What a duplicate gets.
enum Next {
    /// This answer.
    Reply(Response<Bytes>),
    /// To run the request after all: the record was taken over while waiting.
    Run(Attempt),
}

/// Answers a duplicate from `record`, waiting (re-checking the store) while the first
/// request is still running.
async fn settle(
    config: &Config,
    scope: &Scope,
    options: &AcquireOptions,
    fingerprint: &str,
    mut record: Record,
) -> Next {
    let deadline = Instant::now() + config.in_flight_wait;
    let mut pause = Duration::from_millis(20);
    loop {
        if !record.fingerprint_matches(Some(fingerprint)) {
            return Next::Reply(problem(
                StatusCode::UNPROCESSABLE_ENTITY,
                "idempotency_key_reused",
                &format!(
                    "the {} {:?} was already used for a different request (method, path or body differ); use a new key for a new operation",
                    config.header_label,
                    scope.key()
                ),
            ));
        }
        if record.status() != Status::Pending {
            return Next::Reply(reply::replay(record.metadata(), &config.replayed_header));
        }
        let now = Instant::now();
        if now >= deadline {
            return Next::Reply(in_flight(config));
        }
        sleep(pause.min(deadline - now)).await;
        pause = (pause * 2).min(Duration::from_millis(200));
        match config.log.try_acquire_with(scope, options).await {
            Ok(Acquire::Acquired(attempt)) => return Next::Run(attempt),
            Ok(Acquire::Duplicate(seen)) => record = seen,
            // The first request is known to be running: running this one unguarded would
            // very likely run it twice, so the fault policy does not apply here.
            Err(_) => return Next::Reply(in_flight(config)),
        }
    }
}

fn in_flight(config: &Config) -> Response<Bytes> {
    retry_later(
        StatusCode::CONFLICT,
        "idempotency_key_in_use",
        &format!(
            "a request with this {} is still being processed; retry after a moment to get its response",
            config.header_label
        ),
        config.retry_after,
    )
}

/// The guarded section: runs the request, stores its response, answers it.
async fn guarded<S, ReqBody, ResBody>(
    mut inner: S,
    config: Arc<Config>,
    attempt: Attempt,
    keeper: AttemptKeepAlive,
    request: Request<ReqBody>,
) -> Result<Response<IdempotentBody<ResBody>>, S::Error>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    ResBody: Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    let attempt = Arc::new(attempt);
    let unfinished = Unfinished {
        config: Some(Arc::clone(&config)),
        attempt: Arc::clone(&attempt),
    };
    let answer = poll_fn(|cx| inner.poll_ready(cx)).await;
    let answer = match answer {
        Ok(()) => inner.call(request).await,
        Err(e) => Err(e),
    };
    let response = match answer {
        Ok(response) => response,
        Err(error) => {
            unfinished.disarm();
            record(config, attempt, keeper, Outcome::Failed, Vec::new()).await;
            return Err(error);
        }
    };
    let (parts, body) = response.into_parts();
    let (body, stored) = match read_prefix(Box::pin(body), config.max_response_body).await {
        Read::Whole(bytes) => (IdempotentBody::buffered(bytes.clone()), Some(Some(bytes))),
        Read::TooLarge(prefix, rest) => (IdempotentBody::prefixed(prefix, rest), Some(None)),
        Read::Failed(prefix, error) => (IdempotentBody::failed(prefix, error), None),
    };
    unfinished.disarm();
    let (outcome, metadata) = match stored {
        Some(body) => (
            outcome_of(parts.status),
            encode(&config, parts.status, &parts.headers, body),
        ),
        None => (Outcome::Failed, Vec::new()),
    };
    record(config, attempt, keeper, outcome, metadata).await;
    Ok(Response::from_parts(parts, body))
}

/// Failures that a retry may repeat: server errors, and the client errors that mean the
/// request was not processed (timeout, too early, too many requests).
fn outcome_of(status: StatusCode) -> Outcome {
    let not_processed = [
        StatusCode::REQUEST_TIMEOUT,
        StatusCode::TOO_EARLY,
        StatusCode::TOO_MANY_REQUESTS,
    ];
    if status.is_server_error() || not_processed.contains(&status) {
        Outcome::Failed
    } else {
        Outcome::Completed
    }
}

/// The stored form of a response, within the log's metadata limit (dropping the body, then
/// the headers, when they do not fit).
fn encode(
    config: &Config,
    status: StatusCode,
    headers: &HeaderMap,
    body: Option<Bytes>,
) -> Vec<u8> {
    let mut stored = StoredResponse {
        status,
        headers: headers
            .iter()
            .filter(|(name, _)| config.stores_header(name))
            .map(|(name, value)| (name.clone(), value.clone()))
            .collect(),
        body,
    };
    let mut encoded = stored.encode();
    if encoded.len() > MAX_METADATA_BYTES {
        stored.body = None;
        encoded = stored.encode();
    }
    if encoded.len() > MAX_METADATA_BYTES {
        stored.headers.clear();
        encoded = stored.encode();
    }
    encoded
}

/// Finalizes the attempt: once now, and when the store faulted, again in the background
/// (with the lease still renewed) until one lease has passed. A response that could not be
/// recorded is counted.
async fn record(
    config: Arc<Config>,
    attempt: Arc<Attempt>,
    keeper: AttemptKeepAlive,
    outcome: Outcome,
    metadata: Vec<u8>,
) {
    if finalize_once(&config, &attempt, outcome, &metadata).await {
        return;
    }
    tokio::spawn(async move {
        let _keeper = keeper;
        let deadline = Instant::now() + config.lease;
        let mut pauses = FINALIZE_BACKOFF.attempts();
        while Instant::now() < deadline {
            sleep(pauses.next_delay()).await;
            if finalize_once(&config, &attempt, outcome, &metadata).await {
                return;
            }
        }
        telemetry::emit(
            &events::HTTP_IDEMPOTENCY_NOT_RECORDED,
            Some(&attempt.scope().to_string()),
            format_args!(
                "the response of attempt {} could not be stored before its lease ran out; a retry may run the request again",
                attempt.number()
            ),
        );
    });
}

/// One finalize; `true` when nothing more can be done (stored, or not ours any more).
async fn finalize_once(
    config: &Config,
    attempt: &Attempt,
    outcome: Outcome,
    metadata: &[u8],
) -> bool {
    match config.log.finalize(attempt, outcome, metadata).await {
        Ok(Finalize::Finalized(_)) => true,
        Ok(Finalize::NotOwner) => {
            telemetry::emit(
                &events::HTTP_IDEMPOTENCY_NOT_RECORDED,
                Some(&attempt.scope().to_string()),
                format_args!(
                    "attempt {} ran but another attempt had taken its record over (its lease lapsed); the request may have run twice",
                    attempt.number()
                ),
            );
            true
        }
        Err(_) => false,
    }
}

/// How much of a response body was read.
enum Read<B> {
    /// All of it, within the limit.
    Whole(Bytes),
    /// More than the limit: what was read, and the rest.
    TooLarge(Bytes, Pin<Box<B>>),
    /// The body failed after these bytes.
    Failed(Bytes, BoxError),
}

async fn read_prefix<B>(mut body: Pin<Box<B>>, limit: usize) -> Read<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let mut read = BytesMut::new();
    loop {
        let frame = poll_fn(|cx| body.as_mut().poll_frame(cx)).await;
        match frame {
            None => return Read::Whole(read.freeze()),
            Some(Err(e)) => return Read::Failed(read.freeze(), e.into()),
            Some(Ok(frame)) => {
                // Trailers of a stored response are not kept.
                if let Ok(data) = frame.into_data() {
                    read.extend_from_slice(&data);
                    if read.len() > limit {
                        return Read::TooLarge(read.freeze(), body);
                    }
                }
            }
        }
    }
}

/// The waits between the background tries of a finalize that faulted.
const FINALIZE_BACKOFF: Backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(2));

/// Marks the record failed, in the background, if the guarded section unwinds (the
/// handler panicked) before it was finalized; so that a retry need not wait for the lease.
struct Unfinished {
    config: Option<Arc<Config>>,
    attempt: Arc<Attempt>,
}

impl Unfinished {
    fn disarm(mut self) {
        self.config = None;
    }
}

impl Drop for Unfinished {
    fn drop(&mut self) {
        let Some(config) = self.config.take() else {
            return;
        };
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let attempt = Arc::clone(&self.attempt);
            runtime.spawn(async move {
                let _ = config.log.finalize(&attempt, Outcome::Failed, b"").await;
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcomes() {
        for (status, outcome) in [
            (200, Outcome::Completed),
            (201, Outcome::Completed),
            (302, Outcome::Completed),
            (400, Outcome::Completed),
            (404, Outcome::Completed),
            (409, Outcome::Completed),
            (408, Outcome::Failed),
            (425, Outcome::Failed),
            (429, Outcome::Failed),
            (500, Outcome::Failed),
            (503, Outcome::Failed),
        ] {
            assert_eq!(
                outcome_of(StatusCode::from_u16(status).unwrap()),
                outcome,
                "{status}"
            );
        }
    }
}
