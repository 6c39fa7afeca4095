//! [`Store`]: what one store offers, as one trait.
//!
//! Every store implements [`LeaseStore`] (locks and leases are baton's core). The other
//! capabilities — rate limits, the cache, broadcast, idempotency records, claimable work — are
//! each an atom trait of their own ([`RateStore`], [`CacheStore`], [`BroadcastStore`],
//! [`IdempotencyStore`], [`WorkStore`]), and [`Store`] is how a store says which of them it
//! offers: one method per capability, handing out the store as that trait object, or the
//! `Unsupported` error that names the store and the stores that do offer it.
//!
//! The facade (`baton::Baton`) holds an `Arc<dyn Store>` and asks it once per client it
//! builds, so a missing capability is refused when the client is built, never at call time,
//! and adding a store means one `impl Store` in its crate, not a case in the facade.

use std::any::Any;
use std::sync::Arc;

use crate::broadcast::BroadcastStore;
use crate::cache::CacheStore;
use crate::error::{Error, Result};
use crate::idempotency::IdempotencyStore;
use crate::limit::RateStore;
use crate::semaphore::SemaphoreStore;
use crate::store::LeaseStore;
use crate::work::WorkStore;

/// A capability beyond locks and leases that a store may offer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Capability {
    /// Rate limits ([`RateStore`]).
    RateLimits,
    /// The cache ([`CacheStore`]).
    Cache,
    /// Broadcast ([`BroadcastStore`]).
    Broadcast,
    /// Idempotency records ([`IdempotencyStore`]).
    Idempotency,
    /// Claimable work: queues, schedules, migration records ([`WorkStore`]).
    Work,
    /// Semaphores ([`SemaphoreStore`]).
    Semaphores,
}

impl Capability {
    /// What a store without this capability lacks, as a verb phrase ("keeps no cache").
    fn lacks(self) -> &'static str {
        match self {
            Capability::RateLimits => "keeps no rate limits",
            Capability::Cache => "keeps no cache",
            Capability::Broadcast => "cannot broadcast",
            Capability::Idempotency => "keeps no idempotency records",
            Capability::Work => {
                "keeps no claimable work (queues, schedules, migrations need rows that one statement claims)"
            }
            Capability::Semaphores => "keeps no semaphores",
        }
    }

    /// The stores baton ships that offer this capability, as advice.
    fn offered_by(self) -> &'static str {
        match self {
            Capability::RateLimits => "connect with memory://, sqlite://, redis:// or postgres://",
            Capability::Cache | Capability::Idempotency => {
                "connect with memory://, sqlite://, redis://, postgres:// or etcd://"
            }
            Capability::Broadcast => {
                "use redis:// (every process on the server), postgres:// (every process on the database) or memory:// (this process only)"
            }
            Capability::Work => {
                "connect with sqlite:// or postgres:// (or memory:// within one process)"
            }
            Capability::Semaphores => {
                "use redis://, postgres://, sqlite:// (the processes of one host) or memory:// (within one process)"
            }
        }
    }

    /// The `Unsupported` error of the store named `store` (as [`Store::name`] says it), which
    /// does not offer this capability, for the reason `why` when the store has one of its
    /// own. The message names the stores that do offer it.
    ///
    /// # Examples
    /// ```
    /// use baton_core::store::Capability;
    ///
    /// let e = Capability::Cache.unsupported("custom", None);
    /// assert_eq!(
    ///     e.message(),
    ///     "the custom store keeps no cache; connect with memory://, sqlite://, redis://, postgres:// or etcd://"
    /// );
    /// ```
    pub fn unsupported(self, store: &str, why: Option<&str>) -> Error {
        let (lacks, offered_by) = (self.lacks(), self.offered_by());
        Error::unsupported(match why {
            Some(why) => format!("the {store} store {lacks}: {why}; {offered_by}"),
            None => format!("the {store} store {lacks}; {offered_by}"),
        })
    }
}

/// A store: its lease atoms plus the capabilities it offers, one method each.
///
/// Each capability method takes the store by `Arc` and hands it back as that capability's
/// atom trait object, or answers `Unsupported` (use [`Capability::unsupported`], which names
/// the store and the stores that do offer it; pass a reason when the store has one, such as
/// a setting it was opened with). The defaults answer `Unsupported`, so a store overrides
/// exactly the capabilities it offers:
///
/// ```
/// # use std::sync::Arc;
/// # use baton_core::store::{Store, Capability};
/// # use baton_core::cache::CacheStore;
/// # use baton_core::Result;
/// # #[derive(Debug)] struct MyStore(baton_core::MemoryStore);
/// # #[async_trait::async_trait]
/// # impl baton_core::store::LeaseStore for MyStore {
/// #     async fn claim(&self, k: &baton_core::StoreKey, r: baton_core::store::LeaseRequest<'_>) -> Result<baton_core::store::Claim> { self.0.claim(k, r).await }
/// #     async fn renew(&self, k: &baton_core::StoreKey, h: &baton_core::Holder, t: baton_core::Ttl) -> Result<baton_core::store::Renewal> { self.0.renew(k, h, t).await }
/// #     async fn release(&self, k: &baton_core::StoreKey, h: &baton_core::Holder) -> Result<baton_core::store::Release> { self.0.release(k, h).await }
/// #     async fn inspect(&self, k: &baton_core::StoreKey) -> Result<Option<baton_core::HolderInfo>> { self.0.inspect(k).await }
/// #     async fn list(&self, p: &str, l: usize) -> Result<Vec<baton_core::HolderInfo>> { self.0.list(p, l).await }
/// #     fn wakeups(&self) -> baton_core::store::Wakeups { self.0.wakeups() }
/// # }
/// // A store of locks and leases only: every other capability is refused, naming it.
/// impl Store for MyStore {
///     fn name(&self) -> &'static str {
///         "my"
///     }
/// }
///
/// let store: Arc<dyn Store> = Arc::new(MyStore(baton_core::MemoryStore::new()));
/// let e = store.cache_store().unwrap_err();
/// assert!(e.message().starts_with("the my store keeps no cache"));
/// ```
///
/// `Store` requires [`Any`], so the facade can hand back the concrete store
/// (`baton.store_as::<SqliteStore>()`) for what only one store has (its `prune`, its
/// doctor facts) without a `match` over stores.
pub trait Store: LeaseStore + Any {
    /// The store's name in messages: `"memory"`, `"SQLite"`, `"Redis"`, `"PostgreSQL"`.
    fn name(&self) -> &'static str;

    /// Rate limits on this store.
    ///
    /// # Errors
    /// `Unsupported` when the store keeps none (the default).
    fn rate_store(self: Arc<Self>) -> Result<Arc<dyn RateStore>> {
        Err(Capability::RateLimits.unsupported(self.name(), None))
    }

    /// The cache of this store.
    ///
    /// # Errors
    /// `Unsupported` when the store keeps none (the default).
    fn cache_store(self: Arc<Self>) -> Result<Arc<dyn CacheStore>> {
        Err(Capability::Cache.unsupported(self.name(), None))
    }

    /// Broadcast over this store.
    ///
    /// # Errors
    /// `Unsupported` when the store cannot push messages to other processes (the default).
    fn broadcast_store(self: Arc<Self>) -> Result<Arc<dyn BroadcastStore>> {
        Err(Capability::Broadcast.unsupported(self.name(), None))
    }

    /// Idempotency records on this store.
    ///
    /// # Errors
    /// `Unsupported` when the store keeps none (the default).
    fn idempotency_store(self: Arc<Self>) -> Result<Arc<dyn IdempotencyStore>> {
        Err(Capability::Idempotency.unsupported(self.name(), None))
    }

    /// Claimable work (queues, schedules, migration records) on this store.
    ///
    /// # Errors
    /// `Unsupported` when the store keeps none (the default).
    fn work_store(self: Arc<Self>) -> Result<Arc<dyn WorkStore>> {
        Err(Capability::Work.unsupported(self.name(), None))
    }

    /// Semaphores on this store.
    ///
    /// # Errors
    /// `Unsupported` when the store keeps none (the default).
    fn semaphore_store(self: Arc<Self>) -> Result<Arc<dyn SemaphoreStore>> {
        Err(Capability::Semaphores.unsupported(self.name(), None))
    }
}

/// Writes, inside an `impl Store` block, the capability methods that hand back the store
/// itself: `offers!(cache_store, work_store)` for a store that implements [`CacheStore`] and
/// [`WorkStore`]. A capability the store offers only sometimes (a setting it was opened
/// with) is written out by hand, to return [`Capability::unsupported`] with the reason.
///
/// ```
/// # use std::sync::Arc;
/// # use baton_core::{MemoryStore, store::Store};
/// // What the in-memory store writes:
/// // impl Store for MemoryStore {
/// //     fn name(&self) -> &'static str { "memory" }
/// //     baton_core::offers!(rate_store, cache_store, broadcast_store, idempotency_store, work_store);
/// // }
/// let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
/// assert!(store.clone().cache_store().is_ok() && store.work_store().is_ok());
/// ```
#[macro_export]
macro_rules! offers {
    ($($method:ident),+ $(,)?) => {$($crate::__offer!($method);)+};
}

/// One method of [`offers!`].
#[doc(hidden)]
#[macro_export]
macro_rules! __offer {
    (rate_store) => { $crate::__offer!(@ rate_store, $crate::limit::RateStore); };
    (cache_store) => { $crate::__offer!(@ cache_store, $crate::cache::CacheStore); };
    (broadcast_store) => { $crate::__offer!(@ broadcast_store, $crate::broadcast::BroadcastStore); };
    (idempotency_store) => { $crate::__offer!(@ idempotency_store, $crate::idempotency::IdempotencyStore); };
    (work_store) => { $crate::__offer!(@ work_store, $crate::work::WorkStore); };
    (semaphore_store) => { $crate::__offer!(@ semaphore_store, $crate::semaphore::SemaphoreStore); };
    (@ $method:ident, $capability:path) => {
        fn $method(self: ::std::sync::Arc<Self>) -> $crate::Result<::std::sync::Arc<dyn $capability>> {
            Ok(self)
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::MemoryStore;

    #[test]
    fn messages_name_the_store_the_reason_and_the_stores_that_offer_it() {
        let e = Capability::Broadcast.unsupported("SQLite", Some("it has no push"));
        assert_eq!(e.kind(), crate::ErrorKind::Unsupported);
        for part in [
            "the SQLite store cannot broadcast: it has no push;",
            "redis://",
            "postgres://",
            "memory://",
        ] {
            assert!(e.message().contains(part), "{part}: {e}");
        }
        let e = Capability::Work.unsupported("Redis", None);
        assert!(
            e.message()
                .starts_with("the Redis store keeps no claimable work"),
            "{e}"
        );
        assert!(
            e.message().contains("sqlite://") && e.message().contains("postgres://"),
            "{e}"
        );
    }

    #[test]
    fn the_memory_store_offers_every_capability() {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        assert_eq!(store.name(), "memory");
        assert!(store.clone().rate_store().is_ok());
        assert!(store.clone().cache_store().is_ok());
        assert!(store.clone().broadcast_store().is_ok());
        assert!(store.clone().idempotency_store().is_ok());
        assert!(store.clone().work_store().is_ok());
        let any: Arc<dyn Any + Send + Sync> = store;
        assert!(any.downcast::<MemoryStore>().is_ok());
    }
}
