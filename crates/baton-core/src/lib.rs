//! Contracts, validated inputs, the policy layer and the in-memory store of baton.
//!
//! Not for direct use: depend on the `baton` crate, which re-exports this API and adds
//! `baton::connect(url)`. Store crates implement [`store::LeaseStore`], the atom traits of
//! the capabilities they offer, and [`store::Store`] to say which those are, and run the
//! [`conformance`] suite (feature `conformance`).
//!
//! The layers:
//! - inputs: [`Key`], [`Namespace`], [`Holder`], [`Ttl`], [`WaitTime`] — validated before any I/O;
//! - the store interface: [`store`] — small atomic operations, expiry on the store's clock;
//! - policy, written once: [`Locks`], [`Leases`] — waiting, keep-alive, lost signals, guards;
//! - claimable work, written once over [`work::WorkStore`]: [`work`] — queues, workers, a cron
//!   scheduler, fan-out, boot migrations;
//! - [`telemetry`] — the registry of every event baton emits.

#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

pub mod broadcast;
pub mod cache;
mod capability;
#[cfg(feature = "conformance")]
pub mod conformance;
pub mod doctor;
pub mod election;
mod error;
mod fence;
mod holder;
pub mod idempotency;
mod keepalive;
mod key;
mod lease;
pub mod limit;
mod lock;
mod memory;
pub mod options;
mod redact;
pub mod retry;
pub mod rwlock;
pub mod semaphore;
pub mod store;
pub mod telemetry;
pub mod time;
pub mod work;

pub use broadcast::{Broadcast, BroadcastStore, SubscribeOptions, Subscription};
pub use cache::{Cache, CacheStore, FetchError};
pub use election::{Election, Leader, Leadership, Observer};
pub use error::{Error, ErrorKind, Result};
pub use fence::Fence;
pub use holder::{Holder, MAX_HOLDER_BYTES};
pub use key::{
    DEFAULT_NAMESPACE, Key, KeyKind, MAX_KEY_BYTES, MAX_NAMESPACE_BYTES, Namespace, StoreKey,
    prefix_upper_bound,
};
pub use lease::{
    ClaimResult, KeptClaim, LeaseInfo, LeaseKeepAlive, LeaseOptions, Leases, MAX_REASON_BYTES,
    RemoveResult, check_reason, stream_key,
};
pub use limit::{Decision, LimitError, Quota, RateLimiter, RateStore};
pub use lock::signals;
pub use lock::{
    AcquireError, KeepOutcome, LockGuard, LockHandle, LockOptions, Locks, MAX_HOLD_LIMIT,
    MAX_LABEL_BYTES, ReleaseOutcome,
};
pub use memory::MemoryStore;
pub use redact::redact_url;
pub use rwlock::{RwHolders, RwLock, WriteGuard};
pub use semaphore::{Semaphore, SemaphoreStore};
pub use store::{HolderInfo, Renewal};
pub use time::{Ttl, WaitTime, parse_duration};
/// The lost signals of guards and keep-alives, as tokens and as owned futures: re-exported so
/// that callers need no `tokio-util` dependency of their own (of a matching version).
pub use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};
