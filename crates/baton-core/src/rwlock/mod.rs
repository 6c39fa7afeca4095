//! Reader-writer locks: any number of readers of one key at a time, or one writer, with
//! writer preference; every grant TTL-bounded and fenced, as a lock's is.
//!
//! Use a reader-writer lock when many replicas may use a resource at once but a change to it
//! must be made alone (readers of a model file and the job that replaces it, report builders
//! and the migration of their tables). When every holder changes the resource, use a
//! [`Locks`] lock; when *how many* hold matters rather than who, a
//! [`Semaphore`](crate::Semaphore).
//!
//! # How it is made
//!
//! A reader-writer lock of key K is policy over two atoms every store already has, so a
//! store needs nothing new for it:
//!
//! - a **gate**: the lock K (of kind [`KeyKind::RwGate`]), taken with the lock policy, and
//! - **permits** of K (of kind [`KeyKind::RwLock`]), taken through the semaphore atom
//!   ([`SemaphoreStore`]) with the same policy: waiting, keep-alive, `lost()` and
//!   `valid_until` are the locks', written once.
//!
//! [`RwLock::read`] takes the gate (waiting as a lock waiter does, in FIFO order), claims a
//! permit out of [`MAX_PERMITS`] and gives the gate back at once: the read guard is that
//! permit, a [`LockGuard`]. [`RwLock::write`] takes the gate and keeps it, then claims a
//! permit out of **one**, which is granted only when no live permit of K remains: it waits,
//! within the same wait, for the readers inside to leave (waking when a permit is released
//! and when the permit that ends soonest ends). The [`WriteGuard`] holds both.
//!
//! # Behavior
//!
//! - **Writer preference.** A waiting writer holds the gate, so readers that come after it
//!   queue behind it: a stream of readers never starves a writer. Readers queued at the gate
//!   before the writer go in before it (the gate is FIFO), so readers never starve behind a
//!   single writer either.
//! - **Fences.** Readers' and writers' permits share one counter per key, so a writer's fence
//!   is larger than every earlier read or write grant's: a resource that rejects smaller
//!   fences rejects a stale writer, and a stale reader's write-back.
//! - **Not re-entrant.** A task that holds a read and asks for a write (or a write and asks
//!   for a read) waits for itself until its wait ends, and gets
//!   [`AcquireError::Contended`]. Release the read first.
//! - **A writer's validity never overlaps a reader's.** A reader claims its permit while it
//!   holds the gate, and keeps the permit only if the gate was still certainly held when the
//!   claim was answered (else it tries again); a writer's permit is granted only when no
//!   permit is live on the store, and each grant's `valid_until` is measured from before its
//!   request, so it ends before the store's expiry. The one overlap on the store is a writer
//!   whose gate was lost while its permit lives on: readers who take the gate then claim out
//!   of [`MAX_PERMITS`] beside that permit. The writer's validity ended with its gate's
//!   `valid_until`, which is before the store expired the gate, so it is no longer entitled
//!   to write: its [`WriteGuard::lost`] fires and its release answers
//!   [`ReleaseOutcome::Expired`](crate::ReleaseOutcome::Expired).
//! - **Long drains.** A writer waiting for readers holds the gate for as long as they take:
//!   give writers keep-alive (or a TTL longer than a read). Without it, a writer still
//!   waiting when its TTL ends loses the gate (reported as `baton.rwlock.lost`, since readers
//!   may enter from then on) and takes it again, behind whoever queued meanwhile, within its
//!   wait.
//! - Telemetry: each read and write records the wait histograms of the gate's acquire and
//!   the permit's, as the locks they are made of.
//! - Lost grants, read or write, are reported as
//!   [`baton.rwlock.lost`](crate::telemetry::events::RWLOCK_LOST).

#[cfg(feature = "conformance")]
pub mod conformance;
mod guard;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

pub use guard::WriteGuard;

use crate::error::Result;
use crate::key::{Key, KeyKind, Namespace};
use crate::lock::grant::now;
use crate::lock::{AcquireError, LockGuard, LockOptions, Locks};
use crate::semaphore::{MAX_PERMITS, SemaphoreStore, permit_locks};
use crate::store::{HolderInfo, LeaseStore};
use crate::telemetry::events;

/// The reader-writer lock of one key.
///
/// # Examples
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::{sync::Arc, time::Duration};
/// use baton_core::{LockOptions, MemoryStore, Namespace, RwLock};
///
/// let store = Arc::new(MemoryStore::new());
/// let model = RwLock::new(store.clone(), store, Namespace::default(), "model")?;
/// let options = LockOptions::new(Duration::from_secs(30));
/// let a = model.read(&options).await?;
/// let b = model.read(&options).await?;
/// assert!(model.try_write(&options).await?.is_none(), "readers are in");
/// let last_read = b.fence();
/// a.release().await;
/// b.release().await;
/// let writer = model.write(&options).await?;
/// assert!(writer.fence() > last_read, "above every earlier grant");
/// assert!(model.try_read(&options).await?.is_none(), "the writer is in");
/// writer.release().await;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct RwLock {
    key: String,
    gate: Locks,
    readers: Locks,
    writers: Locks,
    permits: Arc<dyn SemaphoreStore>,
}

/// Who holds a reader-writer lock: see [`RwLock::holders`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RwHolders {
    /// The gate's holder: the writer (writing, or waiting for readers to leave), or, for a
    /// moment, a reader on its way in.
    pub gate: Option<HolderInfo>,
    /// The live permits, oldest first: each reader's, and the writer's once it writes.
    pub permits: Vec<HolderInfo>,
}

impl RwHolders {
    /// Whether nobody holds or is entering the lock.
    pub fn is_free(&self) -> bool {
        self.gate.is_none() && self.permits.is_empty()
    }
}

impl RwLock {
    /// The reader-writer lock `key`, its gate on `leases` and its permits on `permits` (the
    /// same store's two atoms), its keys qualified with `namespace`.
    ///
    /// # Errors
    /// `InvalidInput` for a bad key.
    pub fn new(
        leases: Arc<dyn LeaseStore>,
        permits: Arc<dyn SemaphoreStore>,
        namespace: Namespace,
        key: &str,
    ) -> Result<RwLock> {
        Key::new(key)?;
        let gate = Locks::of_kind(
            leases,
            namespace.clone(),
            KeyKind::RwGate,
            &events::RWLOCK_LOST,
        );
        let permit_locks = |n| {
            permit_locks(
                Arc::clone(&permits),
                namespace.clone(),
                KeyKind::RwLock,
                n,
                &events::RWLOCK_LOST,
            )
        };
        Ok(RwLock {
            key: key.to_owned(),
            gate,
            readers: permit_locks(MAX_PERMITS),
            writers: permit_locks(1),
            permits,
        })
    }

    /// The lock's key, as given.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// Takes a shared read lock with `options` (TTL, wait, keep-alive), waiting up to the
    /// options' `wait` for a writer (holding or waiting) to be done; a zero wait (the
    /// default) is one attempt. The guard is the reader's permit.
    ///
    /// # Errors
    /// See [`AcquireError`]: `Contended` when a writer held or waited for the whole wait.
    ///
    /// # Cancel safety
    /// As for [`Locks::acquire`]: what an in-flight claim may have taken is given back in
    /// the background.
    pub async fn read(&self, options: &LockOptions) -> Result<LockGuard, AcquireError> {
        let valid = options.checked()?;
        let deadline = now() + valid.wait.get();
        let single = options.clone().wait(Duration::ZERO);
        loop {
            let left = deadline.saturating_duration_since(now());
            let gate = self
                .gate
                .acquire(&self.key, &options.clone().wait(left))
                .await?;
            let permit = self.readers.acquire(&self.key, &single).await;
            // The gate's valid_until is measured from before its claim: if it is still ahead,
            // the store held the gate for this reader when it granted the permit, so no
            // writer could be in.
            let gated = now() < gate.valid_until();
            gate.release().await;
            match permit {
                Ok(permit) if gated => return Ok(permit),
                Ok(permit) => {
                    permit.release().await;
                }
                Err(error) => return Err(error),
            }
            if now() >= deadline {
                return Err(AcquireError::Contended {
                    holder: None,
                    remaining: None,
                });
            }
        }
    }

    /// [`RwLock::read`] with contention as `Ok(None)`.
    ///
    /// # Errors
    /// `InvalidInput` before any I/O for bad options; `Unavailable` when the store faulted.
    pub async fn try_read(&self, options: &LockOptions) -> Result<Option<LockGuard>> {
        optional(self.read(options).await)
    }

    /// Takes the exclusive write lock with `options` (TTL, wait, keep-alive): takes the gate
    /// (so new readers queue behind this writer), then waits, within the same `wait`, for
    /// the readers inside to leave. A zero wait (the default) is one attempt at each.
    ///
    /// # Errors
    /// See [`AcquireError`]: `Contended` when the gate was held, or readers stayed inside,
    /// for the whole wait (the gate is given back then).
    ///
    /// # Cancel safety
    /// As for [`Locks::acquire`]; a gate already taken is released in the background.
    pub async fn write(&self, options: &LockOptions) -> Result<WriteGuard, AcquireError> {
        let valid = options.checked()?;
        let deadline = now() + valid.wait.get();
        loop {
            let left = deadline.saturating_duration_since(now());
            let gate = self
                .gate
                .acquire(&self.key, &options.clone().wait(left))
                .await?;
            let left = deadline.saturating_duration_since(now());
            let drain = options.clone().wait(left);
            let drained = self.writers.acquire(&self.key, &drain);
            tokio::select! {
                biased;
                permit = drained => match permit {
                    Ok(permit) if now() < gate.valid_until() && !gate.is_lost() => {
                        return Ok(WriteGuard::new(gate, permit));
                    }
                    // The gate ended while the readers drained: new readers may be in.
                    Ok(permit) => {
                        permit.release().await;
                        gate.release().await;
                    }
                    Err(error) => {
                        gate.release().await;
                        return Err(error);
                    }
                },
                () = gate.lost() => {
                    gate.release().await;
                }
            }
            if now() >= deadline {
                return Err(AcquireError::Contended {
                    holder: None,
                    remaining: None,
                });
            }
        }
    }

    /// [`RwLock::write`] with contention as `Ok(None)`.
    ///
    /// # Errors
    /// `InvalidInput` before any I/O for bad options; `Unavailable` when the store faulted.
    pub async fn try_write(&self, options: &LockOptions) -> Result<Option<WriteGuard>> {
        optional(self.write(options).await)
    }

    /// Who holds the lock: the gate's holder (a writer, or a reader on its way in) and the
    /// live permits (the readers', and the writer's once it writes). A writer waiting for
    /// readers to leave shows as the gate's holder beside the readers' permits.
    ///
    /// # Errors
    /// `Unavailable` when the store faulted.
    pub async fn holders(&self) -> Result<RwHolders> {
        let key = Key::new(&self.key)?;
        let gate = self.gate.inspect(&self.key).await?;
        let permit_key = self.readers.namespace().qualify(KeyKind::RwLock, &key);
        let permits = self.permits.permits(&permit_key).await?;
        Ok(RwHolders { gate, permits })
    }
}

/// Contention as `Ok(None)`.
/// A reader-writer lock that is held, as [`RwLock::list`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RwLockInfo {
    /// The lock's key, as given (not qualified).
    pub key: String,
    /// The gate's holder: the writer (writing, or waiting for readers to leave), or, for a
    /// moment, a reader on its way in.
    pub gate: Option<HolderInfo>,
    /// The writer's live permit (the one claimed out of one), when a writer is in.
    pub write: Option<HolderInfo>,
    /// The readers' live permits, oldest first.
    pub readers: Vec<HolderInfo>,
}

impl RwLockInfo {
    /// The writer: the gate's holder while a write permit is live. `None` while nobody
    /// writes, also while a writer waits at the gate for the readers to leave.
    pub fn writer(&self) -> Option<&HolderInfo> {
        self.write.as_ref().and(self.gate.as_ref())
    }
}

impl RwLock {
    /// The reader-writer locks of `namespace` whose key starts with `prefix` and that are
    /// held (a gate or a permit is live), in key order, at most `limit` of them: their
    /// gates from `leases` and their permits from `permits`, the stores [`RwLock::new`]
    /// takes. A permit claimed out of one is the writer's (readers claim out of
    /// [`MAX_PERMITS`]); one granted by a baton that did not record its N counts as a
    /// reader's.
    ///
    /// # Errors
    /// `InvalidInput` for a prefix no key could start with; `Unavailable` when a store
    /// faulted.
    pub async fn list(
        leases: &dyn LeaseStore,
        permits: &dyn SemaphoreStore,
        namespace: &Namespace,
        prefix: &str,
        limit: usize,
    ) -> Result<Vec<RwLockInfo>> {
        let gates = leases
            .list(&namespace.qualify_prefix(KeyKind::RwGate, prefix)?, limit)
            .await?;
        let granted = permits
            .list_permits(&namespace.qualify_prefix(KeyKind::RwLock, prefix)?, limit)
            .await?;
        let mut locks: BTreeMap<String, RwLockInfo> = BTreeMap::new();
        for gate in gates {
            let key = gate.key.user_key().to_owned();
            locks.entry(key.clone()).or_insert_with(|| empty(key)).gate = Some(gate);
        }
        for permit in granted {
            let key = permit.grant.key.user_key().to_owned();
            let lock = locks.entry(key.clone()).or_insert_with(|| empty(key));
            if permit.permits == Some(1) {
                lock.write = Some(permit.grant);
            } else {
                lock.readers.push(permit.grant);
            }
        }
        // Each store listed the first `limit` keys it holds: the first `limit` of either
        // are the first `limit` of both.
        Ok(locks.into_values().take(limit).collect())
    }
}

fn empty(key: String) -> RwLockInfo {
    RwLockInfo {
        key,
        gate: None,
        write: None,
        readers: Vec::new(),
    }
}

fn optional<T>(result: Result<T, AcquireError>) -> Result<Option<T>> {
    match result {
        Ok(guard) => Ok(Some(guard)),
        Err(AcquireError::Contended { .. }) => Ok(None),
        Err(AcquireError::Unavailable(e) | AcquireError::InvalidInput(e)) => Err(e),
    }
}
