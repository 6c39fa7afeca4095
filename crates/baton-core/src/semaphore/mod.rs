//! Semaphores: at most N holders of one key at a time, each holding a fenced permit that
//! expires when its holder stops renewing it.
//!
//! Use a semaphore to bound how many replicas do something at once (four report builders,
//! ten connections to a partner's API), not how often they do it: that is a
//! [`RateLimiter`](crate::RateLimiter)'s job. A permit is a lease like a lock's grant: it
//! expires if its holder dies, so a crashed holder never leaks one, and it carries the same
//! guarantees and the same caveats (best effort; a paused holder loses its permit without
//! knowing).
//!
//! A permit is taken with [`LockOptions`] and held as a [`LockGuard`]: the lock policy
//! (waiting, keep-alive, the lost signal, `valid_until`, the release outcome) is written once
//! and drives the store's permit atom ([`SemaphoreStore`]). What differs from a lock:
//!
//! - **Fences** increase per key across all permits, in the order they were granted: a
//!   resource that accepts only its latest writer can use them, but N holders hold at once,
//!   so a fence says which grant came later, not that its holder is alone.
//! - **Changing N**: the number of permits belongs to each client, not to the key. A claim
//!   made with `permits: n` is granted only while fewer than `n` live permits are held, by
//!   any client; lowering N revokes nothing, so until enough permits end, more than the new N
//!   may be held. Give every replica the same N.
//! - **Waiting** wakes on releases, as a lock's waiters do; a waiter also looks again when
//!   the permit that ends soonest ends, so an expired permit is taken without a signal.
//! - **Listing**: each granted permit records the N its claim was made with, so
//!   [`Semaphore::list`] can say, per key, how many hold out of how many: the N of the most
//!   recent grant (the live permit with the largest fence), which is what a status page shows
//!   as `holders/N`.
//! - Lost permits are reported as
//!   [`baton.semaphore.permit_lost`](crate::telemetry::events::SEMAPHORE_PERMIT_LOST).

#[cfg(feature = "conformance")]
pub mod conformance;
pub(crate) mod memory;
mod store;

use std::sync::Arc;

use crate::error::{Error, Result};
use crate::key::{Key, KeyKind, Namespace};
use crate::lock::{AcquireError, LockGuard, LockOptions, Locks};
use crate::store::HolderInfo;
use crate::telemetry::{Event, events};

use store::PermitLocks;
pub use store::{PermitInfo, SemaphoreStore};

/// The most permits one semaphore may have.
pub const MAX_PERMITS: u32 = 10_000;

/// A semaphore of `permits` permits on one key.
///
/// # Examples
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> baton_core::Result<()> {
/// use std::{sync::Arc, time::Duration};
/// use baton_core::{LockOptions, MemoryStore, Namespace, Semaphore};
///
/// let store = Arc::new(MemoryStore::new());
/// let builders = Semaphore::new(store, Namespace::default(), "report-builders", 2)?;
/// let options = LockOptions::new(Duration::from_secs(30));
/// let a = builders.try_acquire(&options).await?.expect("a free permit");
/// let b = builders.try_acquire(&options).await?.expect("another");
/// assert!(builders.try_acquire(&options).await?.is_none(), "both are held");
/// assert!(b.fence() > a.fence());
/// assert_eq!(builders.holders().await?.len(), 2);
/// a.release().await;
/// b.release().await;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct Semaphore {
    key: String,
    permits: u32,
    locks: Locks,
    store: Arc<dyn SemaphoreStore>,
}

impl Semaphore {
    /// The semaphore `key` of `permits` permits on `store`, its key qualified with
    /// `namespace`.
    ///
    /// # Errors
    /// `InvalidInput` for a bad key, or `permits` of 0 or above [`MAX_PERMITS`].
    pub fn new(
        store: Arc<dyn SemaphoreStore>,
        namespace: Namespace,
        key: &str,
        permits: u32,
    ) -> Result<Semaphore> {
        Key::new(key)?;
        check_permits(permits)?;
        let locks = permit_locks(
            Arc::clone(&store),
            namespace,
            KeyKind::Semaphore,
            permits,
            &events::SEMAPHORE_PERMIT_LOST,
        );
        Ok(Semaphore {
            key: key.to_owned(),
            permits,
            locks,
            store,
        })
    }

    /// The semaphore's key, as given.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// How many permits this client lets be held at once.
    pub fn permits(&self) -> u32 {
        self.permits
    }

    /// Takes a permit with `options` (TTL, wait, keep-alive), waiting up to the options'
    /// `wait` for one to be free; a zero wait (the default) is one attempt.
    ///
    /// # Errors
    /// See [`AcquireError`]: `Contended` when every permit was held for the whole wait.
    ///
    /// # Cancel safety
    /// As for [`Locks::acquire`]: a permit an in-flight claim may have taken is given back in
    /// the background.
    pub async fn acquire(&self, options: &LockOptions) -> Result<LockGuard, AcquireError> {
        self.locks.acquire(&self.key, options).await
    }

    /// [`Semaphore::acquire`] with contention as `Ok(None)`.
    ///
    /// # Errors
    /// `InvalidInput` before any I/O for bad options; `Unavailable` when the store faulted.
    pub async fn try_acquire(&self, options: &LockOptions) -> Result<Option<LockGuard>> {
        self.locks.try_acquire(&self.key, options).await
    }

    /// The live permits, oldest first: each holder, its fence and its remaining time.
    ///
    /// # Errors
    /// `Unavailable` when the store faulted.
    pub async fn holders(&self) -> Result<Vec<HolderInfo>> {
        let key = self
            .locks
            .namespace()
            .qualify(KeyKind::Semaphore, &Key::new(&self.key)?);
        self.store.permits(&key).await
    }
}

/// The semaphores that have live permits, as [`Semaphore::list`] reports them.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SemaphoreInfo {
    /// The semaphore's key, as given (not qualified).
    pub key: String,
    /// The N of the most recent grant (the live permit with the largest fence): how many
    /// permits the client that took it allows. `None` when that permit was granted by a
    /// baton that did not record N.
    pub permits: Option<u32>,
    /// The live permits, oldest fence first.
    pub holders: Vec<PermitInfo>,
}

impl Semaphore {
    /// The semaphores of `namespace` whose key starts with `prefix` and that have live
    /// permits, in key order, at most `limit` of them, each with all its live permits.
    ///
    /// # Errors
    /// `InvalidInput` for a prefix no key could start with; `Unavailable` when the store
    /// faulted.
    pub async fn list(
        store: &dyn SemaphoreStore,
        namespace: &Namespace,
        prefix: &str,
        limit: usize,
    ) -> Result<Vec<SemaphoreInfo>> {
        let qualified = namespace.qualify_prefix(KeyKind::Semaphore, prefix)?;
        Ok(group_by_key(store.list_permits(&qualified, limit).await?))
    }
}

/// Permits in key order, grouped by key: each group's N is its most recent grant's.
pub(crate) fn group_by_key(permits: Vec<PermitInfo>) -> Vec<SemaphoreInfo> {
    let mut keys: Vec<SemaphoreInfo> = Vec::new();
    for permit in permits {
        let key = permit.grant.key.user_key();
        match keys.last_mut() {
            Some(last) if last.key == key => last.holders.push(permit),
            _ => keys.push(SemaphoreInfo {
                key: key.to_owned(),
                permits: None,
                holders: vec![permit],
            }),
        }
    }
    for semaphore in &mut keys {
        semaphore.holders.sort_by_key(|p| p.grant.fence);
        semaphore.permits = semaphore.holders.last().and_then(|p| p.permits);
    }
    keys
}

/// The lock policy over the permits of `store`, for keys of `kind`, each claim admitting up
/// to `permits` holders, a lost permit reported as `lost_event`: a semaphore's permits, and
/// a reader-writer lock's.
pub(crate) fn permit_locks(
    store: Arc<dyn SemaphoreStore>,
    namespace: Namespace,
    kind: KeyKind,
    permits: u32,
    lost_event: &'static Event,
) -> Locks {
    Locks::of_kind(
        Arc::new(PermitLocks { store, permits }),
        namespace,
        kind,
        lost_event,
    )
}

/// The rule of a semaphore's number of permits: 1 to [`MAX_PERMITS`].
///
/// # Errors
/// `InvalidInput` naming the limit.
pub fn check_permits(permits: u32) -> Result<()> {
    match permits {
        0 => Err(Error::invalid_input(
            "a semaphore of 0 permits could never be acquired; use 1 or more",
        )),
        n if n > MAX_PERMITS => Err(Error::invalid_input(format!(
            "a semaphore of {n} permits is above the maximum of {MAX_PERMITS}"
        ))),
        _ => Ok(()),
    }
}
