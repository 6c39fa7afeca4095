//! [`Item`]: one claimed work item, and what settling it answers ([`Failure`],
//! [`Renewal`](crate::Renewal), [`Settle`](super::Settle)).
//!
//! An item is owned by the claim that returned it until another claim takes it. Only the
//! owner can complete, fail, extend or release it; a claimer that lost it (a zombie whose
//! lease lapsed and was claimed again) is told `NotOwner` and changes nothing.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::error::Result;
use crate::holder::Holder;
use crate::key::StoreKey;
use crate::lock::grant::now;
use crate::store::Renewal;
use crate::telemetry::{self, events};

use super::options::error_text;
use super::queue::QueueInner;
use super::store::{ClaimedItem, FailPlan, ItemId, ItemRef, Settle};

/// The answer of [`Item::fail`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// The item will be claimed again after this backoff.
    Retrying {
        /// The backoff before the next attempt.
        after: Duration,
    },
    /// That was its last attempt (or it was failed permanently): it is dead-lettered.
    DeadLettered,
    /// The claim no longer owns the item (another claim took it); nothing changed.
    NotOwner,
}

/// One claimed item: its payload and attempt, and the claim's token.
///
/// Settle it exactly once: [`complete`](Item::complete) when the work is done,
/// [`fail`](Item::fail) when it failed (retried after a backoff, or dead-lettered after its
/// last attempt), [`release`](Item::release) to hand it back untried. While the work runs
/// longer than a third of the lease, [`extend`](Item::extend) it.
///
/// ## Behavior
/// - Dropping an item without settling it does no I/O: the item is claimed again once its
///   lease lapses, and that counts as an attempt (so a payload that crashes its handler is
///   dead-lettered after its attempts rather than retried forever).
/// - Every answer tells a zombie apart: `NotOwner` means another claim owns the item now,
///   and emits [`baton.work.lease_lost`](crate::telemetry::events::WORK_LEASE_LOST).
/// - A store fault is an `Unavailable` error, never `NotOwner`; the item is then claimed
///   again after its lease (at least once).
#[must_use = "an item stays claimed until completed, failed or released; dropped, it is claimed again when its lease lapses"]
pub struct Item {
    queue: Arc<QueueInner>,
    token: Holder,
    data: ClaimedItem,
    valid_until: Mutex<Instant>,
}

impl fmt::Debug for Item {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Item")
            .field("queue", &self.queue.key)
            .field("item", &self.data)
            .field("valid_until", &self.valid_until())
            .finish()
    }
}

impl Item {
    pub(crate) fn new(
        queue: Arc<QueueInner>,
        token: Holder,
        data: ClaimedItem,
        valid_until: Instant,
    ) -> Self {
        Item {
            queue,
            token,
            data,
            valid_until: Mutex::new(valid_until),
        }
    }

    /// The item's id.
    pub fn id(&self) -> ItemId {
        self.data.id
    }

    /// The payload, as enqueued.
    pub fn payload(&self) -> &[u8] {
        &self.data.payload
    }

    /// This claim's attempt number, from 1.
    pub fn attempt(&self) -> u32 {
        self.data.attempt
    }

    /// The attempts the item gets.
    pub fn max_attempts(&self) -> u32 {
        self.data.max_attempts
    }

    /// Whether a failure of this attempt dead-letters the item.
    pub fn is_last_attempt(&self) -> bool {
        self.data.attempt >= self.data.max_attempts
    }

    /// The de-duplication id it was enqueued with, if any.
    pub fn dedup_id(&self) -> Option<&str> {
        self.data.dedup_id.as_deref()
    }

    /// The error of the previous attempt; empty on the first.
    pub fn last_error(&self) -> &str {
        &self.data.last_error
    }

    /// The claim's token (shared by the items of one claim).
    pub fn token(&self) -> &Holder {
        &self.token
    }

    /// Until when (monotonic, measured from before the claim or extension was sent) the
    /// item is surely this claim's. After it, another claim may take it.
    pub fn valid_until(&self) -> Instant {
        *self.valid_until.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The qualified key of the item's queue.
    pub(crate) fn queue_key(&self) -> &StoreKey {
        &self.queue.key
    }

    pub(crate) fn data(&self) -> &ClaimedItem {
        &self.data
    }

    /// Deletes the item: the work is done. Its de-duplication id stays remembered for its
    /// window.
    ///
    /// # Errors
    /// `Unavailable` when the store faulted; the item is claimed again after its lease.
    pub async fn complete(self) -> Result<Settle> {
        self.try_complete().await
    }

    pub(crate) async fn try_complete(&self) -> Result<Settle> {
        let q = &self.queue;
        let answer = q
            .store
            .complete(ItemRef::new(&q.key, self.data.id, &self.token))
            .await
            .map_err(|e| q.fault("complete", e))?;
        match answer {
            Settle::Settled => telemetry::emit(
                &events::WORK_COMPLETED,
                Some(q.key.as_str()),
                format_args!(
                    "item {} completed (attempt {})",
                    self.data.id, self.data.attempt
                ),
            ),
            Settle::NotOwner => self.lost("complete"),
        }
        Ok(answer)
    }

    /// Records a failed attempt with its error text (cut to
    /// [`MAX_ERROR_BYTES`](super::MAX_ERROR_BYTES)): retried after the queue's backoff, or
    /// dead-lettered when this was the last attempt.
    ///
    /// # Errors
    /// `Unavailable` when the store faulted; the item is claimed again after its lease.
    pub async fn fail(self, error: impl fmt::Display) -> Result<Failure> {
        self.try_fail(&error_text(&error), false).await
    }

    /// Dead-letters the item at once, whatever its attempt: for an error no retry can fix
    /// (a malformed payload).
    ///
    /// # Errors
    /// `Unavailable` when the store faulted.
    pub async fn dead_letter(self, error: impl fmt::Display) -> Result<Failure> {
        self.try_fail(&error_text(&error), true).await
    }

    pub(crate) async fn try_fail(&self, error: &str, permanent: bool) -> Result<Failure> {
        let q = &self.queue;
        let plan = if permanent || self.is_last_attempt() {
            FailPlan::DeadLetter
        } else {
            FailPlan::Retry {
                after: q.options.backoff.delay(self.data.attempt),
            }
        };
        let answer = q
            .store
            .fail(ItemRef::new(&q.key, self.data.id, &self.token), plan, error)
            .await
            .map_err(|e| q.fault("fail", e))?;
        let id = self.data.id;
        let (attempt, max) = (self.data.attempt, self.data.max_attempts);
        Ok(match (answer, plan) {
            (Settle::NotOwner, _) => {
                self.lost("fail");
                Failure::NotOwner
            }
            (Settle::Settled, FailPlan::Retry { after }) => {
                telemetry::emit(
                    &events::WORK_FAILED,
                    Some(q.key.as_str()),
                    format_args!(
                        "item {id} attempt {attempt} of {max} failed, retrying in {}ms: {error}",
                        after.as_millis()
                    ),
                );
                Failure::Retrying { after }
            }
            (Settle::Settled, FailPlan::DeadLetter) => {
                telemetry::emit(
                    &events::WORK_DEAD_LETTERED,
                    Some(q.key.as_str()),
                    format_args!(
                        "item {id} dead-lettered after attempt {attempt} of {max}: {error}"
                    ),
                );
                Failure::DeadLettered
            }
        })
    }

    /// Restarts the lease: the item is this claim's for another full lease from now.
    ///
    /// # Errors
    /// `Unavailable` when the store faulted (the lease runs on; try again before
    /// [`valid_until`](Item::valid_until)).
    pub async fn extend(&self) -> Result<Renewal> {
        let q = &self.queue;
        let sent = now();
        let answer = q
            .store
            .extend(
                ItemRef::new(&q.key, self.data.id, &self.token),
                q.options.lease,
            )
            .await
            .map_err(|e| q.fault("extend", e))?;
        Ok(match answer {
            Renewal::Renewed => {
                *self.valid_until.lock().unwrap_or_else(|p| p.into_inner()) =
                    sent + q.options.lease.get();
                Renewal::Renewed
            }
            Renewal::NotHeld => {
                self.lost("extend");
                Renewal::NotHeld
            }
        })
    }

    /// Hands the item back untried: claimable again at once, and the attempt not counted.
    ///
    /// # Errors
    /// `Unavailable` when the store faulted; the item is claimed again after its lease.
    pub async fn release(self) -> Result<Settle> {
        self.try_release().await
    }

    pub(crate) async fn try_release(&self) -> Result<Settle> {
        let q = &self.queue;
        let answer = q
            .store
            .release(ItemRef::new(&q.key, self.data.id, &self.token))
            .await
            .map_err(|e| q.fault("release", e))?;
        if answer == Settle::NotOwner {
            self.lost("release");
        }
        Ok(answer)
    }

    fn lost(&self, call: &str) {
        telemetry::emit(
            &events::WORK_LEASE_LOST,
            Some(self.queue.key.as_str()),
            format_args!(
                "{call} of item {} (attempt {}) answered not-owner: another claim took it",
                self.data.id, self.data.attempt
            ),
        );
    }
}
