//! The idempotency store interface: four atoms every store implements.
//!
//! Policy lives once in [`IdempotencyLog`](super::IdempotencyLog) (validation, defaults,
//! telemetry, the public types); a store implements only these atoms, each atomic on the
//! store and deciding time on the store's own clock. The conformance rules (module
//! `idempotency::conformance`, feature `conformance`, macro `idempotency_conformance_tests!`)
//! check every store against the same contract.
//!
//! # Contract
//! - [`acquire`](IdempotencyStore::acquire): when no live record exists for the key (never
//!   written, or expired), insert one: `pending`, owned by the request's attempt token,
//!   attempt 1, with its fingerprint, expiring after `ttl`, the owner's lease ending after
//!   `lease`. When a live record exists and its fingerprint equals the request's, take it
//!   over if it is `pending` and its lease has lapsed, or `failed` and the request asks to
//!   retry failures: owner, fingerprint, lease and expiry as for an insert, attempt number
//!   plus one, metadata emptied. Otherwise change nothing and return the record.
//! - [`renew`](IdempotencyStore::renew): restart the lease of a live `pending` record only if
//!   `owner` owns it. Ownership ends at a takeover, not when the lease lapses: an owner whose
//!   lease lapsed while nobody took over still owns the record.
//! - [`finalize`](IdempotencyStore::finalize): set the status and metadata of a live
//!   `pending` record only if `owner` owns it. A finalize by the owner of an already
//!   finalized record changes nothing and answers `Finalized` with the record as stored (so
//!   a retried finalize is idempotent). Anything else answers `NotOwner` and changes nothing.
//! - [`get`](IdempotencyStore::get): the live record, if any.
//! - Expired records read as absent. Store faults are errors of kind `Unavailable`; they
//!   never look like a duplicate.

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;

use crate::error::Result;
use crate::holder::Holder;
use crate::key::StoreKey;
use crate::store::Renewal;
use crate::time::Ttl;

use super::record::{Outcome, Status};

/// What [`IdempotencyStore::acquire`] is asked to do.
#[derive(Debug, Clone, Copy)]
pub struct AcquireRequest<'a> {
    /// The new attempt's token: a fresh random 128-bit value.
    pub attempt: &'a Holder,
    /// The request's fingerprint; empty when the caller gave none.
    pub fingerprint: &'a str,
    /// How long the record lives after this acquire.
    pub ttl: Ttl,
    /// How long the owner's lease lasts without renewal. Never more than `ttl`.
    pub lease: Ttl,
    /// Whether a `failed` record with the same fingerprint may be taken over.
    pub retry_failed: bool,
}

/// How an attempt ends, as [`IdempotencyStore::finalize`] records it: whose attempt, its
/// outcome, and what the record keeps for later duplicates.
#[derive(Debug, Clone, Copy)]
pub struct AttemptEnd<'a> {
    /// The token of the attempt that owns the record.
    pub owner: &'a Holder,
    /// How the attempt ended.
    pub outcome: Outcome,
    /// What the record stores for later duplicates (a response, a result id).
    pub metadata: &'a [u8],
}

impl<'a> AttemptEnd<'a> {
    /// `owner`'s attempt ends with `outcome`, storing `metadata`.
    pub fn new(owner: &'a Holder, outcome: Outcome, metadata: &'a [u8]) -> Self {
        AttemptEnd {
            owner,
            outcome,
            metadata,
        }
    }
}

/// A record as a store reads it back.
#[derive(Clone, PartialEq, Eq)]
pub struct StoredRecord {
    /// Where it stands.
    pub status: Status,
    /// The token of the attempt that owns (or finalized) it.
    pub owner: Holder,
    /// The owning attempt's number, from 1.
    pub attempt: u32,
    /// The fingerprint it was acquired with; empty for none.
    pub fingerprint: String,
    /// What `finalize` stored; empty while pending.
    pub metadata: Vec<u8>,
    /// Time until the record expires, on the store's clock.
    pub expires_in: Duration,
    /// Time left on the owner's lease, on the store's clock: zero when lapsed, and for
    /// finalized records.
    pub lease_remaining: Duration,
}

impl fmt::Debug for StoredRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoredRecord")
            .field("status", &self.status)
            .field("owner", &self.owner)
            .field("attempt", &self.attempt)
            .field("fingerprint", &self.fingerprint)
            .field("metadata_bytes", &self.metadata.len())
            .field("expires_in", &self.expires_in)
            .field("lease_remaining", &self.lease_remaining)
            .finish()
    }
}

/// The answer of [`IdempotencyStore::acquire`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AcquireAnswer {
    /// The request's attempt owns the record now.
    Acquired {
        /// The record as written.
        record: StoredRecord,
        /// `None` for a new record; otherwise the status of the record that was taken over
        /// (`Pending` with a lapsed lease, or `Failed`).
        previous: Option<Status>,
    },
    /// A live record exists and was left alone.
    Duplicate(StoredRecord),
}

/// The answer of [`IdempotencyStore::finalize`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FinalizeAnswer {
    /// The record is finalized, as stored now.
    Finalized(StoredRecord),
    /// `owner` does not own a live record of the key; nothing changed.
    NotOwner,
}

/// The idempotency atoms of one store. Object safe: a store hands itself out as an
/// `Arc<dyn IdempotencyStore>` from [`Store::idempotency_store`](crate::store::Store::idempotency_store), which the
/// facade asks when a client is built. See the [module documentation](self) for the
/// contract.
#[async_trait]
pub trait IdempotencyStore: Send + Sync + fmt::Debug + 'static {
    /// Inserts a record, takes over a lapsed or (when asked) failed one, or reports the live
    /// record.
    async fn acquire(&self, key: &StoreKey, request: AcquireRequest<'_>) -> Result<AcquireAnswer>;

    /// Restarts the lease of `owner`'s pending record.
    async fn renew(&self, key: &StoreKey, owner: &Holder, lease: Ttl) -> Result<Renewal>;

    /// Finalizes `end.owner`'s pending record with its outcome and metadata.
    async fn finalize(&self, key: &StoreKey, end: AttemptEnd<'_>) -> Result<FinalizeAnswer>;

    /// The live record of `key`, if any.
    async fn get(&self, key: &StoreKey) -> Result<Option<StoredRecord>>;
}
