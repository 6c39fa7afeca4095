//! The conformance harness every store's tests share: [`Stores`] opens a store on first use,
//! keeps it for every later call, and opens it again on `reopen`; how a store is opened (and
//! how an operator evicts a grant) is the store test's [`Opener`] (and [`Evictor`]).
//!
//! One `Stores` value serves the lease, idempotency, cache, rate-limit and broadcast suites,
//! so a store's test binaries differ only in what their `Opener` reaches (a shared server, a
//! private one, a file).

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use baton_core::StoreKey;
use baton_core::conformance::{Harness, Opens};
use baton_core::idempotency::IdempotencyStore;
use baton_core::idempotency::conformance::IdempotencyHarness;
use baton_core::store::{LeaseStore, Store};
use baton_core::work::WorkStore;
use baton_core::{BroadcastStore, CacheStore, RateStore, SemaphoreStore};

/// How a store's tests open a new store over the same data (new connections, a new handle
/// on the same file).
#[async_trait]
pub trait Opener: Send + Sync + 'static {
    /// The store type opened.
    type Store: Send + Sync + 'static;

    /// A new store over the same data.
    async fn open(&self) -> Self::Store;
}

/// How an operator removes a grant behind its holder's back (a `DEL`, a `DELETE` in a shell
/// of their own), for the lease rules that break a lock.
#[async_trait]
pub trait Evictor: Opener {
    /// Removes `key`'s grant; panics if there was none.
    async fn evict(&self, key: &StoreKey);
}

/// A store opened by `O` on first use and kept until [`Stores::reopen`]: the harness of the
/// conformance suites (every call within one harness sees the same data).
pub struct Stores<O: Opener> {
    /// How the store is opened, and what it reaches (a server kept alive, a temp dir).
    pub opener: O,
    store: Mutex<Option<Arc<O::Store>>>,
}

impl<O: Opener> Stores<O> {
    /// A harness that opens its store with `opener` on first use.
    pub fn new(opener: O) -> Stores<O> {
        Stores {
            opener,
            store: Mutex::new(None),
        }
    }

    /// The kept store, opened now if there is none yet.
    pub async fn current(&self) -> Arc<O::Store> {
        let existing = self.store.lock().unwrap().clone();
        match existing {
            Some(store) => store,
            None => {
                let store = Arc::new(self.opener.open().await);
                self.store
                    .lock()
                    .unwrap()
                    .get_or_insert_with(|| store)
                    .clone()
            }
        }
    }

    /// Closes the kept store and opens a new one over the same data, kept from now on.
    pub async fn reopen(&self) -> Arc<O::Store> {
        drop(self.store.lock().unwrap().take());
        let store = Arc::new(self.opener.open().await);
        *self.store.lock().unwrap() = Some(store.clone());
        store
    }
}

#[async_trait]
impl<O: Evictor> Harness for Stores<O>
where
    O::Store: LeaseStore,
{
    async fn open(&self) -> Arc<dyn LeaseStore> {
        self.current().await
    }

    async fn reopen(&self) -> Arc<dyn LeaseStore> {
        Stores::reopen(self).await
    }

    async fn evict(&self, key: &StoreKey) {
        self.opener.evict(key).await
    }
}

#[async_trait]
impl<O: Opener> IdempotencyHarness for Stores<O>
where
    O::Store: IdempotencyStore,
{
    async fn open(&self) -> Arc<dyn IdempotencyStore> {
        self.current().await
    }

    async fn reopen(&self) -> Option<Arc<dyn IdempotencyStore>> {
        Some(Stores::reopen(self).await)
    }
}

/// One store answering every call, with no durable state to reopen (the in-memory store):
/// the idempotency suite's `reopen` is `None`, and every replica of the work suite shares
/// the one store.
pub struct Kept<S>(Arc<S>);

impl<S> Kept<S> {
    /// A harness answering every call with `store`.
    pub fn new(store: S) -> Kept<S> {
        Kept(Arc::new(store))
    }
}

#[async_trait]
impl<S: IdempotencyStore + 'static> IdempotencyHarness for Kept<S> {
    async fn open(&self) -> Arc<dyn IdempotencyStore> {
        self.0.clone()
    }

    async fn reopen(&self) -> Option<Arc<dyn IdempotencyStore>> {
        None
    }
}

/// The harness of a suite that only opens: the kept store of a [`Stores`] or a [`Kept`].
macro_rules! open_only {
    ($($store:ident),* $(,)?) => {$(
        #[async_trait]
        impl<O: Opener> Opens<dyn $store> for Stores<O>
        where
            O::Store: $store,
        {
            async fn open(&self) -> Arc<dyn $store> {
                self.current().await
            }
        }

        #[async_trait]
        impl<S: $store + 'static> Opens<dyn $store> for Kept<S> {
            async fn open(&self) -> Arc<dyn $store> {
                self.0.clone()
            }
        }
    )*};
}

open_only!(
    LeaseStore,
    CacheStore,
    RateStore,
    BroadcastStore,
    WorkStore,
    SemaphoreStore,
    Store
);
