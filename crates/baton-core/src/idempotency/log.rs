//! [`IdempotencyLog`]: the policy over an [`IdempotencyStore`]: validation before I/O, the
//! attempt token, the public types, and telemetry.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

use crate::error::{Error, Result};
use crate::holder::Holder;
use crate::keepalive::{self, Events, Lifeline, Plan, RenewAtom};
use crate::key::{Namespace, StoreKey};
use crate::lock::grant::now;
use crate::store::Renewal;
use crate::telemetry::{self, events};
use crate::time::Ttl;

use super::options::{AcquireOptions, check_metadata};
use super::record::{Acquire, Attempt, Finalize, Outcome, Record, Status, Takeover};
use super::scope::Scope;
use super::store::{
    AcquireAnswer, AcquireRequest, AttemptEnd, FinalizeAnswer, IdempotencyStore, StoredRecord,
};

/// "Don't run this side effect twice for `(org, domain, key)`": a log of records, one per
/// [`Scope`], each owned by the attempt that acquired it until that attempt finalizes it.
///
/// Use it at the side effect (a charge, a webhook's effect, a notification), when the gate
/// is "did this already run for this id?". Use a [`Locks`](crate::Locks) lock instead when
/// the gate is "is someone running this *right now*?" (a cron tick), and a
/// [`Leases`](crate::Leases) lease for long-lived ownership.
///
/// ## Behavior
/// - The first [`try_acquire`](Self::try_acquire) of a scope gets [`Acquire::Acquired`];
///   every other call while the record lives gets [`Acquire::Duplicate`] with the record
///   (pending, completed or failed). Exactly one attempt acquires, however many race.
/// - Only the acquiring [`Attempt`] can [`finalize`](Self::finalize) the record, as
///   `Completed` or `Failed` with metadata (a stored response, an id). A stale attempt that
///   was taken over gets [`Finalize::NotOwner`] and changes nothing.
/// - **The crash window is at-least-once, by design.** A pending record whose owner's lease
///   lapsed (the owner crashed, hung or was partitioned away before finalizing) is taken over
///   by the next acquire with the same fingerprint, which runs the side effect again: the
///   first owner may or may not have done it. Keep leases longer than the work (or
///   [`renew`](Self::renew) them) so that only dead owners are taken over, and make the side
///   effect itself tolerate a rare repeat where it can (pass [`Attempt::number`] on as a
///   fence, or an idempotency key to the payment provider).
/// - A `Failed` record is acquired again only when the caller asks
///   ([`AcquireOptions::retry_failed`]).
/// - Records expire after their TTL on the store's clock; an expired scope starts afresh.
/// - Inputs are validated before any I/O. Store faults are errors of kind `Unavailable`
///   (never a duplicate), emitted as
///   [`baton.idempotency.unavailable`](crate::telemetry::events::IDEMPOTENCY_UNAVAILABLE):
///   the caller decides whether to fail closed (skip, risk a miss) or open (run, risk a
///   duplicate).
///
/// # Examples
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), baton_core::Error> {
/// use std::{sync::Arc, time::Duration};
/// use baton_core::MemoryStore;
/// use baton_core::idempotency::{Acquire, IdempotencyLog, Outcome, Scope};
///
/// let log = IdempotencyLog::new(Arc::new(MemoryStore::new()));
/// let scope = Scope::new("org-42", "notifications.new-booking", "booking-1001")?;
/// match log.try_acquire(&scope, Duration::from_secs(7 * 24 * 3600)).await? {
///     Acquire::Acquired(attempt) => {
///         // send the notification, then:
///         log.finalize(&attempt, Outcome::Completed, b"sent").await?;
///     }
///     Acquire::Duplicate(record) => {
///         // already sent (or being sent): do nothing
///         let _ = record.status();
///     }
/// }
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct IdempotencyLog {
    store: Arc<dyn IdempotencyStore>,
    namespace: Namespace,
}

impl IdempotencyLog {
    /// A log in the default namespace.
    pub fn new(store: Arc<dyn IdempotencyStore>) -> Self {
        IdempotencyLog::with_namespace(store, Namespace::default())
    }

    /// A log in `namespace`.
    pub fn with_namespace(store: Arc<dyn IdempotencyStore>, namespace: Namespace) -> Self {
        IdempotencyLog { store, namespace }
    }

    /// The namespace keys are qualified with.
    pub fn namespace(&self) -> &Namespace {
        &self.namespace
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn IdempotencyStore> {
        &self.store
    }

    /// [`try_acquire_with`](Self::try_acquire_with) with a record living `ttl`, the default
    /// lease, no fingerprint, and failed records not retried.
    ///
    /// # Errors
    /// As [`try_acquire_with`](Self::try_acquire_with).
    pub async fn try_acquire(&self, scope: &Scope, ttl: Duration) -> Result<Acquire> {
        self.try_acquire_with(scope, &AcquireOptions::new(ttl))
            .await
    }

    /// One attempt to own `scope`'s record: [`Acquire::Acquired`] when this call owns it now
    /// (a new record, or a takeover), [`Acquire::Duplicate`] otherwise. Never waits.
    ///
    /// # Errors
    /// `InvalidInput` before any I/O for bad options; `Unavailable` when the store faulted
    /// (emits [`baton.idempotency.unavailable`](crate::telemetry::events::IDEMPOTENCY_UNAVAILABLE));
    /// `Internal` when the store answered something that breaks the contract.
    ///
    /// # Cancel safety
    /// Dropping the future while the request is in flight may leave a pending record that
    /// nobody owns: duplicates see it pending until its lease lapses, then one takes it over,
    /// as after a crash.
    pub async fn try_acquire_with(
        &self,
        scope: &Scope,
        options: &AcquireOptions,
    ) -> Result<Acquire> {
        let valid = options.checked()?;
        let key = scope.qualify(&self.namespace);
        let token = Holder::random();
        let request = AcquireRequest {
            attempt: &token,
            fingerprint: valid.fingerprint.as_deref().unwrap_or(""),
            ttl: valid.ttl,
            lease: valid.lease,
            retry_failed: valid.retry_failed,
        };
        let sent = now();
        let answer = self.store.acquire(&key, request).await.map_err(|error| {
            telemetry::emit(
                &events::IDEMPOTENCY_UNAVAILABLE,
                Some(key.as_str()),
                format_args!("acquire failed: {error}"),
            );
            error
        })?;
        match answer {
            AcquireAnswer::Acquired { record, previous } => {
                if record.owner != token || record.status != Status::Pending {
                    return Err(Error::internal(format!(
                        "the store answered Acquired for {key} with a record it did not give this attempt ({record:?})"
                    )));
                }
                let takeover = match previous {
                    None => None,
                    Some(Status::Pending) => {
                        telemetry::emit(
                            &events::IDEMPOTENCY_TAKEOVER,
                            Some(key.as_str()),
                            format_args!(
                                "attempt {} took over a pending record whose owner's lease lapsed; its side effect may run twice",
                                record.attempt
                            ),
                        );
                        Some(Takeover::LeaseLapsed)
                    }
                    Some(Status::Failed) => Some(Takeover::RetryFailed),
                    Some(Status::Completed) => {
                        return Err(Error::internal(format!(
                            "the store took over a completed record of {key}"
                        )));
                    }
                };
                Ok(Acquire::Acquired(Attempt {
                    record: to_record(scope, record),
                    key,
                    token,
                    lease: valid.lease,
                    takeover,
                    granted_at: sent,
                }))
            }
            AcquireAnswer::Duplicate(record) => Ok(Acquire::Duplicate(to_record(scope, record))),
        }
    }

    /// Finalizes `attempt`'s record as `outcome`, storing `metadata` (at most
    /// [`MAX_METADATA_BYTES`](super::MAX_METADATA_BYTES)) for duplicates to read.
    ///
    /// Succeeds even after the attempt's lease lapsed, as long as nobody took the record
    /// over. Calling it again for the same attempt is harmless: it answers the record as the
    /// first finalize left it.
    ///
    /// # Errors
    /// `InvalidInput` before any I/O for oversized metadata; `Unavailable` when the store
    /// faulted (emits [`baton.idempotency.unavailable`](crate::telemetry::events::IDEMPOTENCY_UNAVAILABLE)):
    /// the record stays pending, so retry the finalize.
    pub async fn finalize(
        &self,
        attempt: &Attempt,
        outcome: Outcome,
        metadata: impl AsRef<[u8]>,
    ) -> Result<Finalize> {
        let metadata = metadata.as_ref();
        check_metadata(metadata)?;
        let answer = self
            .store
            .finalize(
                &attempt.key,
                AttemptEnd::new(&attempt.token, outcome, metadata),
            )
            .await
            .map_err(|error| {
                telemetry::emit(
                    &events::IDEMPOTENCY_UNAVAILABLE,
                    Some(attempt.key.as_str()),
                    format_args!("finalize of attempt {} failed: {error}", attempt.number()),
                );
                error
            })?;
        Ok(match answer {
            FinalizeAnswer::Finalized(record) => {
                Finalize::Finalized(to_record(attempt.scope(), record))
            }
            FinalizeAnswer::NotOwner => {
                telemetry::emit(
                    &events::IDEMPOTENCY_NOT_OWNER,
                    Some(attempt.key.as_str()),
                    format_args!(
                        "attempt {} finalized a record it no longer owns (taken over or expired); its outcome was not recorded",
                        attempt.number()
                    ),
                );
                Finalize::NotOwner
            }
        })
    }

    /// Restarts `attempt`'s lease (for [`Attempt::lease`]), so that duplicates keep waiting
    /// while the side effect runs longer than one lease. Renew well within the lease.
    ///
    /// # Errors
    /// `Unavailable` when the store faulted (emits
    /// [`baton.idempotency.unavailable`](crate::telemetry::events::IDEMPOTENCY_UNAVAILABLE)).
    pub async fn renew(&self, attempt: &Attempt) -> Result<Renewal> {
        renew(
            &*self.store,
            &attempt.key,
            &attempt.token,
            attempt.lease,
            attempt.number(),
        )
        .await
    }

    /// Keeps `attempt`'s lease alive with baton's keep-alive engine: renews it every third of
    /// the lease until the handle is stopped or dropped (it never finalizes the attempt).
    ///
    /// ## Behavior
    /// - A renewal that finds the record no longer owned by the attempt (taken over,
    ///   finalized, expired) fires the handle's [`lost`](AttemptKeepAlive::lost) signal at
    ///   once and stops (emits
    ///   [`baton.idempotency.not_owner`](crate::telemetry::events::IDEMPOTENCY_NOT_OWNER)).
    /// - A renewal that faults is retried sooner than the interval (each fault emits
    ///   [`baton.idempotency.unavailable`](crate::telemetry::events::IDEMPOTENCY_UNAVAILABLE));
    ///   when the lease passes without a successful renewal the attempt is presumed taken
    ///   over and `lost` fires.
    /// - [`valid_until`](AttemptKeepAlive::valid_until) is measured from before each request
    ///   was sent, so it never outlasts the store's lease.
    ///
    /// # Examples
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), baton_core::Error> {
    /// use std::{sync::Arc, time::Duration};
    /// use baton_core::MemoryStore;
    /// use baton_core::idempotency::{Acquire, IdempotencyLog, Outcome, Scope};
    /// # async fn charge() {}
    ///
    /// let log = IdempotencyLog::new(Arc::new(MemoryStore::new()));
    /// let scope = Scope::new("org-42", "payments.charge", "order-7")?;
    /// if let Acquire::Acquired(attempt) = log.try_acquire(&scope, Duration::from_secs(3600)).await? {
    ///     let kept = log.keep_alive(&attempt);
    ///     tokio::select! {
    ///         () = charge() => {}
    ///         _ = kept.lost() => return Ok(()), // taken over: do not record our outcome
    ///     }
    ///     kept.stop();
    ///     log.finalize(&attempt, Outcome::Completed, b"charged").await?;
    /// }
    /// # Ok(()) }
    /// ```
    pub fn keep_alive(&self, attempt: &Attempt) -> AttemptKeepAlive {
        let life = Lifeline::new(
            attempt.key.as_str(),
            format!("attempt {}", attempt.number()),
            attempt.granted_at,
            attempt.lease.get(),
        );
        let (store, key, token, lease, number) = (
            Arc::clone(&self.store),
            attempt.key.clone(),
            attempt.token.clone(),
            attempt.lease,
            attempt.number(),
        );
        let renew: RenewAtom = Box::new(move || {
            let (store, key, token) = (Arc::clone(&store), key.clone(), token.clone());
            Box::pin(async move { renew(&*store, &key, &token, lease, number).await })
        });
        // `renew` reports a not-owner answer and a fault itself; a lease that passes
        // without a renewal is reported here.
        let events = Events {
            expired: Some(&events::IDEMPOTENCY_LEASE_LAPSED),
            ..Events::default()
        };
        keepalive::spawn(
            Arc::clone(&life),
            Plan::new(lease.get(), lease.get() / 3, events),
            renew,
        );
        AttemptKeepAlive { life }
    }

    /// The live record of `scope`, if any.
    ///
    /// # Errors
    /// `Unavailable` when the store faulted.
    pub async fn get(&self, scope: &Scope) -> Result<Option<Record>> {
        let key = scope.qualify(&self.namespace);
        Ok(self
            .store
            .get(&key)
            .await?
            .map(|record| to_record(scope, record)))
    }
}

fn to_record(scope: &Scope, stored: StoredRecord) -> Record {
    Record {
        scope: scope.clone(),
        status: stored.status,
        attempt: stored.attempt,
        fingerprint: (!stored.fingerprint.is_empty()).then_some(stored.fingerprint),
        metadata: stored.metadata,
        expires_in: stored.expires_in,
        lease_remaining: if stored.status == Status::Pending {
            stored.lease_remaining
        } else {
            Duration::ZERO
        },
    }
}

/// One renewal of an attempt's lease, reported through telemetry.
async fn renew(
    store: &dyn IdempotencyStore,
    key: &StoreKey,
    token: &Holder,
    lease: Ttl,
    number: u32,
) -> Result<Renewal> {
    let answer = store.renew(key, token, lease).await.map_err(|error| {
        telemetry::emit(
            &events::IDEMPOTENCY_UNAVAILABLE,
            Some(key.as_str()),
            format_args!("renewal of attempt {number} failed: {error}"),
        );
        error
    })?;
    if answer == Renewal::NotHeld {
        telemetry::emit(
            &events::IDEMPOTENCY_NOT_OWNER,
            Some(key.as_str()),
            format_args!(
                "attempt {number} renewed a record it no longer owns (taken over, finalized or expired)"
            ),
        );
    }
    Ok(answer)
}

/// A running keep-alive of an idempotency [`Attempt`]'s lease, from
/// [`IdempotencyLog::keep_alive`]. Stops renewing when stopped or dropped; it never
/// finalizes the attempt.
#[must_use = "dropping the handle stops the keep-alive at once"]
pub struct AttemptKeepAlive {
    life: Arc<Lifeline>,
}

impl AttemptKeepAlive {
    /// Resolves when the attempt is known or presumed to have lost its record (taken over,
    /// finalized elsewhere, or its lease passed without a renewal). An owned future: await
    /// it, or use it as a `tokio::select!` branch.
    pub fn lost(&self) -> WaitForCancellationFutureOwned {
        self.life.lost().clone().cancelled_owned()
    }

    /// The lost signal as a token (a child of the attempt's own: cancelling it changes
    /// nothing for the attempt).
    pub fn lost_token(&self) -> CancellationToken {
        self.life.lost().child_token()
    }

    /// Whether the lost signal has fired.
    pub fn is_lost(&self) -> bool {
        self.life.lost().is_cancelled()
    }

    /// The monotonic deadline of the lease as last renewed.
    pub fn valid_until(&self) -> Instant {
        self.life.valid_until()
    }

    /// Stops renewing.
    pub fn stop(self) {}
}

impl Drop for AttemptKeepAlive {
    fn drop(&mut self) {
        self.life.stop();
    }
}

impl fmt::Debug for AttemptKeepAlive {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AttemptKeepAlive")
            .field("life", &self.life)
            .finish()
    }
}
