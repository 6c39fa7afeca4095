//! [`Queue`]: durable work items with claim-leases, de-duplication, retries and dead
//! letters.
//!
//! Use a queue for work that must happen at least once per item, on any replica: one item
//! per email to send, per invoice to retry, per record a periodic scan found. A claim hands
//! each item to exactly one claimer at a time, for a lease; the claimer completes it, fails
//! it (retried with backoff, dead-lettered after its last attempt) or releases it. A
//! claimer that dies leaves the item to be claimed again when its lease lapses, so handlers
//! must be idempotent — or guarded by the [idempotency log](crate::idempotency).
//!
//! Most services run a [`Worker`](super::Worker) over a queue rather than claiming by hand.
//!
//! ## Behavior
//! - Every input (name, payload, options, batch) is checked before any I/O.
//! - A store fault is an `Unavailable` error and emits
//!   [`baton.work.unavailable`](crate::telemetry::events::WORK_UNAVAILABLE); it never looks
//!   like an empty queue or a duplicate.
//! - An item whose every lease so far lapsed without a result (a handler that crashes its
//!   process) is dead-lettered when a claim finds it past its last attempt, instead of being
//!   handed out again.

use std::sync::Arc;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::holder::Holder;
use crate::key::{Key, KeyKind, Namespace, StoreKey, check_text};
use crate::lock::grant::now;
use crate::telemetry::{self, events};

use super::item::Item;
use super::options::{
    EnqueueOptions, MAX_QUEUE_NAME_BYTES, QueueOptions, ValidQueueOptions, check_batch,
};
use super::store::{
    ClaimRequest, DeadItem, Enqueued, FailPlan, ItemId, ItemRef, QueueStats, QueueStore, Settle,
};

/// The answer of [`Queue::enqueue`] for one item.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Enqueue {
    /// The item was added with this id.
    Added(ItemId),
    /// An item with the same de-duplication id was enqueued within its window, so nothing
    /// was added; the id is that earlier item's (it may have been completed since).
    Duplicate(ItemId),
}

impl Enqueue {
    /// The id of the item added, or of the earlier item that made this a duplicate.
    pub fn id(self) -> ItemId {
        match self {
            Enqueue::Added(id) | Enqueue::Duplicate(id) => id,
        }
    }

    /// Whether an item was added.
    pub fn is_added(self) -> bool {
        matches!(self, Enqueue::Added(_))
    }
}

impl From<Enqueued> for Enqueue {
    fn from(answer: Enqueued) -> Self {
        match answer {
            Enqueued::Added(id) => Enqueue::Added(id),
            Enqueued::Duplicate(id) => Enqueue::Duplicate(id),
        }
    }
}

/// A queue of work items in a store. Cheap to clone; every clone is the same queue.
///
/// # Examples
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), baton_core::Error> {
/// use std::sync::Arc;
/// use baton_core::MemoryStore;
/// use baton_core::work::{EnqueueOptions, Queue};
///
/// let queue = Queue::new(Arc::new(MemoryStore::new()), "emails")?;
/// let first = queue.enqueue(b"to: ada@example.com", EnqueueOptions::dedup("signup-42")).await?;
/// let again = queue.enqueue(b"to: ada@example.com", EnqueueOptions::dedup("signup-42")).await?;
/// assert!(first.is_added() && !again.is_added());
///
/// for item in queue.claim(10).await? {
///     // ... send the email, then:
///     item.complete().await?;
/// }
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct Queue {
    pub(crate) inner: Arc<QueueInner>,
}

#[derive(Debug)]
pub(crate) struct QueueInner {
    pub(crate) store: Arc<dyn QueueStore>,
    pub(crate) key: StoreKey,
    pub(crate) name: String,
    pub(crate) namespace: Namespace,
    pub(crate) options: ValidQueueOptions,
    pub(crate) raw_options: QueueOptions,
}

/// Validates a queue name: a valid [`Key`] of at most [`MAX_QUEUE_NAME_BYTES`].
fn queue_name(name: &str) -> Result<Key> {
    check_text("queue name", name, MAX_QUEUE_NAME_BYTES)?;
    Key::new(name)
}

impl Queue {
    /// The queue `name` in the default namespace, with the default [`QueueOptions`].
    ///
    /// # Errors
    /// `InvalidInput` for an empty name, one over [`MAX_QUEUE_NAME_BYTES`], or one with
    /// control characters.
    pub fn new(store: Arc<dyn QueueStore>, name: &str) -> Result<Queue> {
        Queue::with_namespace(store, Namespace::default(), name)
    }

    /// The queue `name` in `namespace`.
    ///
    /// # Errors
    /// As [`Queue::new`].
    pub fn with_namespace(
        store: Arc<dyn QueueStore>,
        namespace: Namespace,
        name: &str,
    ) -> Result<Queue> {
        let key = namespace.qualify(KeyKind::Queue, &queue_name(name)?);
        let raw_options = QueueOptions::new();
        Ok(Queue {
            inner: Arc::new(QueueInner {
                store,
                key,
                name: name.to_owned(),
                namespace,
                options: raw_options.checked()?,
                raw_options,
            }),
        })
    }

    /// The same queue with other options (for the items this handle enqueues and claims).
    ///
    /// # Errors
    /// `InvalidInput` naming the field and limit, from [`QueueOptions::validate`].
    pub fn with_options(self, options: QueueOptions) -> Result<Queue> {
        let valid = options.checked()?;
        Ok(Queue {
            inner: Arc::new(QueueInner {
                store: Arc::clone(&self.inner.store),
                key: self.inner.key.clone(),
                name: self.inner.name.clone(),
                namespace: self.inner.namespace.clone(),
                options: valid,
                raw_options: options,
            }),
        })
    }

    /// The queue's name, as given.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The qualified key the store sees: `<namespace>:queue:<name>`.
    pub fn key(&self) -> &StoreKey {
        &self.inner.key
    }

    /// The options.
    pub fn options(&self) -> &QueueOptions {
        &self.inner.raw_options
    }

    /// The lease of each claim.
    pub fn lease(&self) -> Duration {
        self.inner.options.lease.get()
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn QueueStore> {
        &self.inner.store
    }

    /// Adds one item, unless its de-duplication id was seen within the window.
    ///
    /// # Errors
    /// `InvalidInput` before any I/O for a payload over
    /// [`MAX_PAYLOAD_BYTES`](super::MAX_PAYLOAD_BYTES) or bad options; `Unavailable` when the
    /// store faulted (the item may or may not have been added: enqueue it again with the same
    /// de-duplication id to be sure it is there once).
    pub async fn enqueue(
        &self,
        payload: impl AsRef<[u8]>,
        options: EnqueueOptions,
    ) -> Result<Enqueue> {
        let item = options.resolve(payload.as_ref(), &self.inner.options)?;
        let answers = self.enqueue_resolved(&[item]).await?;
        answers
            .into_iter()
            .next()
            .ok_or_else(|| Error::internal("the store answered nothing for one enqueued item"))
    }

    /// Adds up to [`MAX_BATCH`](super::MAX_BATCH) items in one transaction, answering each in
    /// order. Duplicates within the batch are answered like duplicates across batches.
    ///
    /// # Errors
    /// As [`Queue::enqueue`]; any invalid item fails the whole batch before any I/O.
    pub async fn enqueue_many<P: AsRef<[u8]>>(
        &self,
        items: &[(P, EnqueueOptions)],
    ) -> Result<Vec<Enqueue>> {
        check_batch("enqueue_many batch", items.len())?;
        let resolved = items
            .iter()
            .map(|(payload, options)| options.resolve(payload.as_ref(), &self.inner.options))
            .collect::<Result<Vec<_>>>()?;
        self.enqueue_resolved(&resolved).await
    }

    pub(crate) async fn enqueue_resolved(
        &self,
        items: &[super::store::NewItem<'_>],
    ) -> Result<Vec<Enqueue>> {
        let answers = self
            .inner
            .store
            .enqueue(&self.inner.key, items)
            .await
            .map_err(|e| self.inner.fault("enqueue", e))?;
        if answers.len() != items.len() {
            return Err(Error::internal(format!(
                "the store answered {} items for a batch of {}",
                answers.len(),
                items.len()
            )));
        }
        Ok(answers.into_iter().map(Enqueue::from).collect())
    }

    /// Claims up to `batch` (1 to [`MAX_BATCH`](super::MAX_BATCH)) items for the queue's
    /// lease: oldest due first. Each [`Item`] must be completed, failed or released; an
    /// empty vector means nothing is claimable now.
    ///
    /// # Errors
    /// `InvalidInput` for a bad batch; `Unavailable` when the store faulted (never an empty
    /// answer).
    ///
    /// # Cancel safety
    /// Dropping the future while the claim is in flight may leave items claimed by nobody
    /// until their lease lapses; they are then claimed again (their attempt counted).
    pub async fn claim(&self, batch: u32) -> Result<Vec<Item>> {
        check_batch("claim batch", batch as usize)?;
        let token = Holder::random();
        let sent = now();
        let claimed = self
            .inner
            .store
            .claim(
                &self.inner.key,
                ClaimRequest {
                    token: &token,
                    batch,
                    lease: self.inner.options.lease,
                },
            )
            .await
            .map_err(|e| self.inner.fault("claim", e))?;
        let valid_until = sent + self.inner.options.lease.get();
        let mut items = Vec::with_capacity(claimed.len());
        for data in claimed {
            if data.attempt > data.max_attempts {
                self.dead_letter_exhausted(&token, data.id, data.attempt, data.max_attempts)
                    .await;
                continue;
            }
            telemetry::emit(
                &events::WORK_CLAIMED,
                Some(self.inner.key.as_str()),
                format_args!("claimed item {} (attempt {})", data.id, data.attempt),
            );
            items.push(Item::new(
                Arc::clone(&self.inner),
                token.clone(),
                data,
                valid_until,
            ));
        }
        Ok(items)
    }

    /// Dead-letters an item claimed past its last attempt: every earlier lease lapsed
    /// without a result.
    async fn dead_letter_exhausted(&self, token: &Holder, id: ItemId, attempt: u32, max: u32) {
        let error = format!(
            "claimed for attempt {attempt} of {max}: the leases of the earlier attempts lapsed without a result (does the handler crash its process?)"
        );
        match self
            .inner
            .store
            .fail(
                ItemRef::new(&self.inner.key, id, token),
                FailPlan::DeadLetter,
                &error,
            )
            .await
        {
            Ok(Settle::Settled) => telemetry::emit(
                &events::WORK_DEAD_LETTERED,
                Some(self.inner.key.as_str()),
                format_args!("item {id} dead-lettered: {error}"),
            ),
            Ok(Settle::NotOwner) => {}
            Err(e) => {
                // Left claimed: the next claim after its lease tries again.
                self.inner.fault("fail", e);
            }
        }
    }

    /// This queue's counts (all zero when it has no items).
    ///
    /// # Errors
    /// `Unavailable` when the store faulted.
    pub async fn stats(&self) -> Result<QueueStats> {
        let all = self
            .inner
            .store
            .stats(self.inner.key.as_str())
            .await
            .map_err(|e| self.inner.fault("stats", e))?;
        Ok(all
            .into_iter()
            .find(|s| s.key == self.inner.key)
            .unwrap_or_else(|| QueueStats::empty(self.inner.key.clone())))
    }

    /// The counts of every queue of `namespace` whose name starts with `prefix` (empty: all),
    /// ordered by name; queues without items are not listed. For `baton queue list`.
    ///
    /// # Errors
    /// `InvalidInput` for a bad prefix; `Unavailable` when the store faulted.
    pub async fn list(
        store: &dyn QueueStore,
        namespace: &Namespace,
        prefix: &str,
    ) -> Result<Vec<QueueStats>> {
        let prefix = namespace.qualify_prefix(KeyKind::Queue, prefix)?;
        store.stats(&prefix).await
    }

    /// Up to `limit` (1 to [`MAX_BATCH`](super::MAX_BATCH)) dead-lettered items, oldest
    /// first.
    ///
    /// # Errors
    /// `InvalidInput` for a bad limit; `Unavailable` when the store faulted.
    pub async fn dead_letters(&self, limit: u32) -> Result<Vec<DeadItem>> {
        check_batch("dead letter limit", limit as usize)?;
        self.inner
            .store
            .dead_letters(&self.inner.key, limit)
            .await
            .map_err(|e| self.inner.fault("dead_letters", e))
    }
}

impl QueueInner {
    /// Reports a store fault of `call` and hands the error back.
    pub(crate) fn fault(&self, call: &str, error: Error) -> Error {
        if error.kind() != crate::ErrorKind::InvalidInput {
            telemetry::emit(
                &events::WORK_UNAVAILABLE,
                Some(self.key.as_str()),
                format_args!("{call} failed: {error}"),
            );
        }
        error
    }
}
