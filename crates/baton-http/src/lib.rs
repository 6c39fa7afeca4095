//! HTTP `Idempotency-Key` support for tower and axum, on baton's idempotency log.
//!
//! A client that retries a `POST /charges` after a timeout must not charge the card twice.
//! With [`IdempotencyLayer`] on the route, a request carrying an `Idempotency-Key` header
//! runs once per key; its response is stored and replayed to every retry (marked
//! `Idempotent-Replayed: true`), across every replica that shares the store.
//!
//! ```no_run
//! # async fn charge() -> &'static str { "" }
//! # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use axum::{Router, routing::post};
//! use baton_http::IdempotencyLayer;
//!
//! let baton = baton::connect(&baton::store::default_url()?).await?;
//! let app: Router = Router::new()
//!     .route("/charges", post(charge))
//!     .layer(IdempotencyLayer::builder(baton.idempotency()?).require_key(true).build()?);
//! # let _ = app; Ok(()) }
//! ```
//!
//! - [`IdempotencyLayer`]: the layer, its builder and every setting, with the
//!   behaviour of each case (retry, in-flight retry, reused key, store fault).
//! - [`IdempotentRequest`]: what the handler finds in its request extensions.
//! - [`IdempotentBody`]: the response body type of the wrapped service.
//!
//! The user guide page is `docs/http.md`; the example service is
//! `cargo run -p baton-http --example payments -- --listen 127.0.0.1:3000`.
//!
//! ## How it is built
//! On the idempotency log alone, not on a lock plus a cache: the record *is* the lock (one
//! atomic insert decides which request runs) and the response is stored in the same
//! record, so there is no window between "ran" and "stored" in which a duplicate on
//! another replica finds nothing and runs again. The owner's lease (renewed while the
//! request runs) replaces the lock's TTL; its lapse after a crash is the one documented
//! at-least-once window.

#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

mod body;
mod fingerprint;
mod layer;
mod reply;
mod service;
mod stored;

pub use body::{BoxError, IdempotentBody};
pub use layer::{
    DEFAULT_HEADER, DEFAULT_IN_FLIGHT_WAIT, DEFAULT_LEASE, DEFAULT_MAX_REQUEST_BODY,
    DEFAULT_MAX_RESPONSE_BODY, DEFAULT_REPLAYED_HEADER, DEFAULT_TTL, IdempotencyLayer,
    IdempotencyLayerBuilder, MAX_IN_FLIGHT_WAIT, NOT_REPLAY_SAFE, StoreFaultPolicy,
};
pub use reply::BODY_OMITTED_HEADER;
pub use service::{IdempotencyService, IdempotentRequest, ResponseFuture};
