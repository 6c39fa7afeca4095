//! What the log hands back: a [`Record`] anyone may read, and the [`Attempt`] that only the
//! acquiring call receives and that alone may finalize the record.

use std::fmt;
use std::time::Duration;

use tokio::time::Instant;

use crate::holder::Holder;
use crate::key::StoreKey;
use crate::time::Ttl;

use super::scope::Scope;

/// Where a record stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Status {
    /// An attempt owns the record and has not finalized it: the side effect may be running,
    /// may have run, or its owner may have died. Duplicates must not run it.
    Pending,
    /// The owner finalized it as done. Duplicates must not run it again.
    Completed,
    /// The owner finalized it as failed. A later attempt may run it again, but only when it
    /// asks to ([`AcquireOptions::retry_failed`](super::AcquireOptions::retry_failed)).
    Failed,
}

impl Status {
    /// `pending`, `completed` or `failed`: how stores write it.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Pending => "pending",
            Status::Completed => "completed",
            Status::Failed => "failed",
        }
    }

    /// Reads what [`Status::as_str`] wrote.
    pub fn parse(text: &str) -> Option<Status> {
        match text {
            "pending" => Some(Status::Pending),
            "completed" => Some(Status::Completed),
            "failed" => Some(Status::Failed),
            _ => None,
        }
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How an attempt ended, as given to [`finalize`](super::IdempotencyLog::finalize).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// The side effect happened (or was decided not to happen, for good).
    Completed,
    /// The side effect did not happen; a later attempt that asks may try again.
    Failed,
}

impl Outcome {
    /// The status a finalized record gets.
    pub fn status(self) -> Status {
        match self {
            Outcome::Completed => Status::Completed,
            Outcome::Failed => Status::Failed,
        }
    }
}

/// A record as the store holds it, readable by anyone: a duplicate's view.
///
/// It carries no right to change the record; only the [`Attempt`] returned by the acquiring
/// call does.
#[derive(Clone, PartialEq, Eq)]
pub struct Record {
    pub(crate) scope: Scope,
    pub(crate) status: Status,
    pub(crate) attempt: u32,
    pub(crate) fingerprint: Option<String>,
    pub(crate) metadata: Vec<u8>,
    pub(crate) expires_in: Duration,
    pub(crate) lease_remaining: Duration,
}

impl Record {
    /// The scope.
    pub fn scope(&self) -> &Scope {
        &self.scope
    }

    /// Where the record stands.
    pub fn status(&self) -> Status {
        self.status
    }

    /// Which attempt owns (or finalized) the record: 1 for the first, one more for each
    /// takeover or retry. Attempt numbers restart at 1 once a record expires.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// The fingerprint the owning attempt gave, if any.
    pub fn fingerprint(&self) -> Option<&str> {
        self.fingerprint.as_deref()
    }

    /// Whether `fingerprint` is the one the record was acquired with (both absent counts as
    /// equal). A duplicate whose fingerprint differs is a *different request* reusing the
    /// key, which a caller should reject rather than treat as a retry.
    pub fn fingerprint_matches(&self, fingerprint: Option<&str>) -> bool {
        self.fingerprint.as_deref() == fingerprint
    }

    /// The metadata given to `finalize` (empty while pending).
    pub fn metadata(&self) -> &[u8] {
        &self.metadata
    }

    /// The metadata, taken out of the record.
    pub fn into_metadata(self) -> Vec<u8> {
        self.metadata
    }

    /// Time until the record expires, on the store's clock, when it was read.
    pub fn expires_in(&self) -> Duration {
        self.expires_in
    }

    /// For a pending record, the time left on its owner's lease when it was read (zero once
    /// it lapsed: the next acquire may take it over). Zero for finalized records.
    pub fn lease_remaining(&self) -> Duration {
        self.lease_remaining
    }
}

impl fmt::Debug for Record {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Record")
            .field("scope", &self.scope)
            .field("status", &self.status)
            .field("attempt", &self.attempt)
            .field("fingerprint", &self.fingerprint)
            .field("metadata_bytes", &self.metadata.len())
            .field("expires_in", &self.expires_in)
            .field("lease_remaining", &self.lease_remaining)
            .finish()
    }
}

/// Why an [`Attempt`] was handed a record that existed before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Takeover {
    /// The record was pending and its owner's lease had lapsed (the owner crashed, hung, or
    /// lost the store): the side effect may already have happened once. This is the
    /// documented at-least-once window; it emits
    /// [`baton.idempotency.takeover`](crate::telemetry::events::IDEMPOTENCY_TAKEOVER).
    LeaseLapsed,
    /// The record was finalized as failed and the caller asked to retry failures.
    RetryFailed,
}

/// The right to run the side effect once and to finalize the record: only the acquiring
/// call receives it.
///
/// Finalize it with [`IdempotencyLog::finalize`](super::IdempotencyLog::finalize) when the
/// side effect is done (or failed). An attempt that is never finalized leaves the record
/// pending: duplicates keep answering "in progress" until the attempt's lease lapses, and
/// then the next acquire takes over and runs the side effect again. Keep the lease alive
/// with [`IdempotencyLog::keep_alive`](super::IdempotencyLog::keep_alive) (or
/// [`IdempotencyLog::renew`](super::IdempotencyLog::renew) by hand) while the work runs
/// longer than the lease.
///
/// Ownership is per attempt, not per process: the attempt holds a fresh random 128-bit
/// token, and every finalize or renew is checked against the token the store holds, so an
/// attempt that was taken over (a zombie) can never finalize the newer attempt's record.
#[must_use = "finalize the attempt; until then duplicates see the record pending, and once its lease lapses another attempt takes over"]
pub struct Attempt {
    pub(crate) record: Record,
    pub(crate) key: StoreKey,
    pub(crate) token: Holder,
    pub(crate) lease: Ttl,
    pub(crate) takeover: Option<Takeover>,
    /// The instant before the acquire that granted the lease was sent.
    pub(crate) granted_at: Instant,
}

impl Attempt {
    /// The record as this attempt acquired it (status [`Status::Pending`]).
    pub fn record(&self) -> &Record {
        &self.record
    }

    /// The scope.
    pub fn scope(&self) -> &Scope {
        &self.record.scope
    }

    /// This attempt's number: 1 for the first, more after takeovers and retries. Strictly
    /// increasing while the record lives, so it can fence what the attempt writes.
    pub fn number(&self) -> u32 {
        self.record.attempt
    }

    /// `Some` when this attempt took over an earlier one (see [`Takeover`]).
    pub fn takeover(&self) -> Option<Takeover> {
        self.takeover
    }

    /// The lease this attempt was granted (and that [`renew`](super::IdempotencyLog::renew)
    /// restarts).
    pub fn lease(&self) -> Duration {
        self.lease.get()
    }
}

impl fmt::Debug for Attempt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The token is the attempt's capability; it is not printed.
        f.debug_struct("Attempt")
            .field("record", &self.record)
            .field("lease", &self.lease)
            .field("takeover", &self.takeover)
            .finish_non_exhaustive()
    }
}

/// The answer of [`IdempotencyLog::try_acquire`](super::IdempotencyLog::try_acquire).
#[derive(Debug)]
#[must_use = "an Acquired attempt must run the side effect and be finalized; a Duplicate must not run it"]
pub enum Acquire {
    /// This call owns the record: run the side effect, then finalize.
    Acquired(Attempt),
    /// Another attempt owns or finalized the record: do not run the side effect. Look at
    /// [`Record::status`] (and [`Record::fingerprint_matches`]) to answer the caller.
    Duplicate(Record),
}

impl Acquire {
    /// Whether this call acquired the record.
    pub fn is_acquired(&self) -> bool {
        matches!(self, Acquire::Acquired(_))
    }
}

/// The answer of [`IdempotencyLog::finalize`](super::IdempotencyLog::finalize).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Finalize {
    /// The record is finalized, as it now stands. Finalizing again with the same attempt
    /// answers the same (the first finalize wins; later ones change nothing).
    Finalized(Record),
    /// The attempt no longer owns the record: a later attempt took it over, or the record
    /// expired. Nothing was changed. Emits
    /// [`baton.idempotency.not_owner`](crate::telemetry::events::IDEMPOTENCY_NOT_OWNER).
    NotOwner,
}
