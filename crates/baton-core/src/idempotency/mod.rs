//! The idempotency log: "don't run this side effect twice for `(org, domain, key)`".
//!
//! - [`IdempotencyLog`]: the client — [`try_acquire`](IdempotencyLog::try_acquire),
//!   [`finalize`](IdempotencyLog::finalize), [`renew`](IdempotencyLog::renew),
//!   [`get`](IdempotencyLog::get). Start here.
//! - [`Scope`]: the validated `(org, domain, key)`; [`AcquireOptions`]: TTL, lease,
//!   fingerprint, retrying failures.
//! - [`Acquire`], [`Attempt`], [`Record`], [`Finalize`], [`Renewal`](crate::Renewal): what the calls answer.
//! - [`store`]: the four atoms a store implements ([`IdempotencyStore`]);
//!   [`MemoryStore`](crate::MemoryStore) is the in-process one.
//!
//! The user guide page is `docs/idempotency.md`; the HTTP `Idempotency-Key` layer built on
//! this log is the `baton-http` crate.

#[cfg(feature = "conformance")]
pub mod conformance;
mod log;
mod memory;
mod options;
mod record;
mod scope;
pub mod store;

pub use log::{AttemptKeepAlive, IdempotencyLog};
pub(crate) use memory::MemoryRecords;
pub use options::{AcquireOptions, DEFAULT_LEASE, MAX_FINGERPRINT_BYTES, MAX_METADATA_BYTES};
pub use record::{Acquire, Attempt, Finalize, Outcome, Record, Status, Takeover};
pub use scope::{MAX_DOMAIN_BYTES, MAX_IDEMPOTENCY_KEY_BYTES, MAX_ORG_BYTES, Scope};
pub use store::IdempotencyStore;
