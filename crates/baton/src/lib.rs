//! baton: cluster coordination for services that run as several replicas.
//!
//! Locks, leases and the primitives built on them, over the stores teams already run. Pick a
//! store by URL with [`connect`]:
//!
//! | URL | store |
//! |---|---|
//! | `memory://` | process-local, for tests (warns once that it excludes only within the process) |
//! | `sqlite:///path/to/file.db` | embedded, one file, safe across the processes of one host |
//! | `redis://[user:password@]host[:port][/db]`, `rediss://...` | a Redis server (TLS with `rediss://`) shared by replicas on many hosts |
//! | `redis+sentinel://[user:password@]host:port[,host:port...]/MASTER_NAME[/db]`, `rediss+sentinel://...` | the Redis primary that Sentinel names, followed across failovers |
//! | `redis+cluster://[user:password@]host:port[,host:port...]`, `rediss+cluster://...` | a Redis Cluster, discovered from its seed nodes: every primitive of one Redis server, over sharded pub/sub (see `docs/redis.md`, "Cluster") |
//! | `postgres://[user[:password]@]host[:port]/database[?sslmode=require]`, `postgresql://...` | a PostgreSQL database shared by replicas on many hosts (tables, `LISTEN`/`NOTIFY`) |
//! | `etcd://[user:password@]host[:port][,host[:port]...]` | an etcd cluster (feature `etcd`, off by default): locks, leases, semaphores, reader-writer locks, elections and broadcast; grants survive the loss of any one member, fenced by etcd revisions |
//!
//! Every lock is best-effort, as every lease-based lock is: a holder paused past its TTL
//! loses the lock without knowing it. baton gives you what you need to stay correct anyway:
//! a [`Fence`] on every grant, a lost signal and a monotonic `valid_until` on every guard.
//!
//! Beside locks and leases: [`Baton::rate_limiter`], [`Baton::cache`], [`Baton::broadcast`],
//! [`Baton::idempotency`], and claimable work on the SQL stores — [`Baton::queue`],
//! [`Baton::scheduler`], [`Baton::migrations`] (module [`work`]).
//!
//! # Where things are
//! - At the root: [`Baton`] and the two ways to open one from a URL ([`connect`],
//!   [`connect_with`]); [`Error`], [`ErrorKind`], [`Result`]; [`Fence`]; the inputs every call
//!   takes ([`Key`], [`Namespace`], [`Ttl`]).
//! - One module per primitive with its types and limits: [`lock`], [`lease`], [`limit`],
//!   [`cache`], [`broadcast`], [`idempotency`], [`work`].
//! - [`store`]: the store interface (what a store implements, the [`store::Store`] trait of
//!   capabilities, [`store::MemoryStore`] and the concrete stores), for tests, wrappers and
//!   new stores. [`Baton::from_store`] opens a `Baton` over a store value.
//! - [`doctor`], [`telemetry`], [`time`]: health checks, the event registry, durations.
//!
//! # Examples
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use baton::lock::LockOptions;
//!
//! let baton = baton::connect("memory://").await?;
//! let options = LockOptions::new(Duration::from_secs(30)).wait(Duration::from_secs(5));
//! let charged = baton
//!     .locks()
//!     .with_lock("charge:order-42", &options, |lock| async move {
//!         // Pass lock.fence() to the payment record so a stale holder's write is rejected.
//!         lock.fence()
//!     })
//!     .await?;
//! # let _ = charged;
//! # Ok(()) }
//! ```

#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

use std::any::Any;
use std::sync::{Arc, OnceLock};

pub use baton_core::{
    CancellationToken, Error, ErrorKind, Fence, Key, Namespace, Result, Ttl,
    WaitForCancellationFutureOwned, telemetry, time,
};

pub mod broadcast;
pub mod cache;
pub mod doctor;
pub mod election;
pub mod idempotency;
pub mod lease;
pub mod limit;
pub mod lock;
pub mod rwlock;
pub mod semaphore;
pub mod store;
pub mod work;

use broadcast::Broadcast;
use lease::Leases;
use lock::Locks;
use store::Store;

/// A connection to one store, with the clients of every primitive in one namespace.
///
/// Cheap to clone: clones share the store, the clients and the broadcast publisher.
/// Primitives beyond locks and leases are handed out by methods that ask the store's
/// [`Store`] capabilities when the client is built (`Unsupported` then, never at call time).
#[derive(Debug, Clone)]
pub struct Baton {
    store: Arc<dyn Store>,
    namespace: Namespace,
    locks: Locks,
    leases: Leases,
    /// This connection's one broadcast publisher, made at the first [`Baton::broadcast`].
    broadcast: Arc<OnceLock<Broadcast>>,
}

impl Baton {
    /// A `Baton` over a store value: one baton made ([`store::MemoryStore`],
    /// [`store::SqliteStore`]...) or one of your own (for example a wrapper that injects
    /// faults), qualifying every key with `namespace`. Its capabilities are the store's.
    ///
    /// # Examples
    /// ```
    /// use std::sync::Arc;
    /// use baton::store::MemoryStore;
    ///
    /// let store = Arc::new(MemoryStore::new());
    /// let baton = baton::Baton::from_store(store, baton::Namespace::default());
    /// assert!(baton.cache().is_ok());
    /// assert!(baton.store_as::<MemoryStore>().is_some());
    /// ```
    pub fn from_store<S: Store>(store: Arc<S>, namespace: Namespace) -> Self {
        Baton::from_dyn_store(store, namespace)
    }

    fn from_dyn_store(store: Arc<dyn Store>, namespace: Namespace) -> Self {
        let leases: Arc<dyn store::LeaseStore> = store.clone();
        Baton {
            locks: Locks::with_namespace(Arc::clone(&leases), namespace.clone()),
            leases: Leases::with_namespace(leases, namespace.clone()),
            store,
            namespace,
            broadcast: Arc::new(OnceLock::new()),
        }
    }

    /// The lock client.
    pub fn locks(&self) -> &Locks {
        &self.locks
    }

    /// The lease client.
    pub fn leases(&self) -> &Leases {
        &self.leases
    }

    /// The store behind this connection.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// The store behind this connection as the concrete type `S`, for what only one store
    /// has (`SqliteStore::prune`, `RedisStore::server_info`...); `None` when it is another.
    ///
    /// # Examples
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> baton::Result<()> {
    /// use baton::store::{MemoryStore, SqliteStore};
    ///
    /// let baton = baton::connect("memory://").await?;
    /// assert!(baton.store_as::<MemoryStore>().is_some());
    /// assert!(baton.store_as::<SqliteStore>().is_none());
    /// # Ok(()) }
    /// ```
    pub fn store_as<S: Store>(&self) -> Option<Arc<S>> {
        let any: Arc<dyn Any + Send + Sync> = self.store.clone();
        any.downcast::<S>().ok()
    }

    /// The namespace every key is qualified with.
    pub fn namespace(&self) -> &Namespace {
        &self.namespace
    }
}

/// Opens the store named by `url` in the default namespace.
///
/// # Errors
/// `InvalidInput` for a malformed URL or an unknown scheme (naming the schemes baton knows);
/// `Unsupported` for a known scheme this build was compiled without; `Unavailable` when the
/// store cannot be opened.
pub async fn connect(url: &str) -> Result<Baton> {
    connect_with(url, Namespace::default()).await
}

/// Opens the store named by `url`, qualifying every key with `namespace`.
///
/// # Errors
/// As [`connect`].
pub async fn connect_with(url: &str, namespace: Namespace) -> Result<Baton> {
    Ok(Baton::from_dyn_store(store::open(url).await?, namespace))
}

/// What the unit tests of this crate share.
#[cfg(test)]
mod testing {
    use std::sync::Arc;

    use async_trait::async_trait;
    use baton_core::{Holder, StoreKey};

    use crate::store::{
        Claim, HolderInfo, LeaseRequest, LeaseStore, MemoryStore, Release, Renewal, Store, Wakeups,
    };
    use crate::{Baton, Namespace, Result, Ttl};

    /// A store of your own that offers locks and leases only (over a memory store).
    #[derive(Debug, Default)]
    struct LocksOnly(MemoryStore);

    #[async_trait]
    impl LeaseStore for LocksOnly {
        async fn claim(&self, k: &StoreKey, request: LeaseRequest<'_>) -> Result<Claim> {
            self.0.claim(k, request).await
        }
        async fn renew(&self, k: &StoreKey, h: &Holder, ttl: Ttl) -> Result<Renewal> {
            self.0.renew(k, h, ttl).await
        }
        async fn release(&self, k: &StoreKey, h: &Holder) -> Result<Release> {
            self.0.release(k, h).await
        }
        async fn inspect(&self, k: &StoreKey) -> Result<Option<HolderInfo>> {
            self.0.inspect(k).await
        }
        async fn list(&self, prefix: &str, limit: usize) -> Result<Vec<HolderInfo>> {
            self.0.list(prefix, limit).await
        }
        fn wakeups(&self) -> Wakeups {
            self.0.wakeups()
        }
    }

    impl Store for LocksOnly {
        fn name(&self) -> &'static str {
            "custom"
        }
    }

    /// A `Baton` over [`LocksOnly`].
    pub(crate) fn locks_only() -> Baton {
        Baton::from_store(Arc::new(LocksOnly::default()), Namespace::default())
    }
}

/// The guide's Rust snippets, compiled by `cargo test --doc` so that the guide cannot drift
/// from the API: every ```` ```rust ```` block of README.md and docs/*.md is a doctest
/// (snippets that need a server are `no_run`, still compiled).
#[cfg(doctest)]
mod guide {
    #[doc = include_str!("../../../README.md")]
    mod readme {}
    #[doc = include_str!("../../../docs/broadcast.md")]
    mod broadcast {}
    #[doc = include_str!("../../../docs/cache.md")]
    mod cache {}
    #[doc = include_str!("../../../docs/elections.md")]
    mod elections {}
    #[doc = include_str!("../../../docs/etcd.md")]
    mod etcd {}
    #[doc = include_str!("../../../docs/http.md")]
    mod http {}
    #[doc = include_str!("../../../docs/idempotency.md")]
    mod idempotency {}
    #[doc = include_str!("../../../docs/locks-and-leases.md")]
    mod locks_and_leases {}
    #[doc = include_str!("../../../docs/memory.md")]
    mod memory {}
    #[doc = include_str!("../../../docs/operations.md")]
    mod operations {}
    #[doc = include_str!("../../../docs/postgres.md")]
    mod postgres {}
    #[doc = include_str!("../../../docs/rate-limits.md")]
    mod rate_limits {}
    #[doc = include_str!("../../../docs/redis.md")]
    mod redis {}
    #[doc = include_str!("../../../docs/semaphores.md")]
    mod semaphores {}
    #[doc = include_str!("../../../docs/rwlocks.md")]
    mod rwlocks {}
    #[doc = include_str!("../../../docs/sqlite.md")]
    mod sqlite {}
    #[doc = include_str!("../../../docs/work.md")]
    mod work {}
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The public handles of every primitive, store and of baton-http can move across tasks
    /// and threads.
    #[test]
    #[cfg(all(feature = "redis", feature = "postgres"))]
    fn public_handles_are_send_sync_static() {
        use std::sync::Arc;

        fn bounds<T: Send + Sync + 'static>() {}
        bounds::<baton_core::Locks>();
        bounds::<baton_core::Leases>();
        bounds::<baton_core::LockGuard>();
        bounds::<baton_core::LockHandle>();
        bounds::<baton_core::LeaseKeepAlive>();
        bounds::<baton_core::MemoryStore>();
        bounds::<baton_core::AcquireError>();
        bounds::<baton_core::Error>();
        bounds::<Arc<dyn baton_core::store::LeaseStore>>();
        bounds::<baton_core::cache::Cache>();
        bounds::<baton_core::cache::FetchError<std::io::Error>>();
        bounds::<Arc<dyn baton_core::store::CacheStore>>();
        bounds::<baton_core::work::Queue>();
        bounds::<baton_core::work::Item>();
        bounds::<baton_core::work::Job>();
        bounds::<baton_core::work::Worker>();
        bounds::<baton_core::work::Scheduler>();
        bounds::<baton_core::work::Migrations>();
        bounds::<baton_core::work::MigrationContext>();
        bounds::<baton_core::work::CronSpec>();
        bounds::<Arc<dyn baton_core::store::WorkStore>>();
        bounds::<baton_core::idempotency::IdempotencyLog>();
        bounds::<baton_core::idempotency::Attempt>();
        bounds::<baton_core::idempotency::Record>();
        bounds::<baton_core::idempotency::Acquire>();
        bounds::<Arc<dyn baton_core::store::IdempotencyStore>>();
        bounds::<baton_core::broadcast::Broadcast>();
        bounds::<baton_core::broadcast::Subscription<String>>();
        bounds::<baton_core::broadcast::Event<String>>();
        bounds::<Arc<dyn baton_core::store::BroadcastStore>>();
        bounds::<baton_core::broadcast::delivery::Fanout>();
        bounds::<baton_core::limit::RateLimiter>();
        bounds::<baton_core::limit::LimitError>();
        bounds::<baton_core::limit::Decision>();
        bounds::<Arc<dyn baton_core::store::RateStore>>();
        bounds::<baton_sqlite::SqliteStore>();
        bounds::<baton_sqlite::SqliteOptions>();
        bounds::<baton_redis::RedisStore>();
        bounds::<baton_redis::RedisOptions>();
        bounds::<baton_redis::ServerInfo>();
        bounds::<baton_postgres::PostgresStore>();
        bounds::<baton_postgres::PostgresOptions>();
        bounds::<baton_postgres::TableLeases>();
        bounds::<baton_postgres::TableLeaseColumns>();
        bounds::<baton_http::IdempotencyLayer>();
        bounds::<baton_http::IdempotencyService<()>>();
        bounds::<baton_http::IdempotentRequest>();
    }

    #[tokio::test]
    async fn unknown_and_malformed_urls_are_invalid_input() {
        for url in ["mysql://x", "nonsense", "", "memory://extra"] {
            let err = connect(url).await.unwrap_err();
            assert_eq!(err.kind(), ErrorKind::InvalidInput, "{url}: {err}");
        }
        let err = connect("mysql://x").await.unwrap_err();
        assert!(err.message().contains("\"mysql\""), "{err}");
        assert!(err.message().contains("sqlite://"), "{err}");
    }

    #[tokio::test]
    async fn memory_url_opens() {
        let baton = connect("memory://").await.unwrap();
        assert_eq!(baton.namespace().as_str(), "baton");
        assert_eq!(baton.store().name(), "memory");
    }

    #[tokio::test]
    async fn the_concrete_store_is_reached_by_type() {
        let dir = tempfile::tempdir().unwrap();
        let baton = connect(&format!("sqlite://{}/s.db", dir.path().display()))
            .await
            .unwrap();
        let sqlite = baton
            .store_as::<store::SqliteStore>()
            .expect("an SQLite store");
        assert_eq!(sqlite.prune().await.unwrap(), 0);
        assert!(baton.store_as::<store::MemoryStore>().is_none());
        let memory = Arc::new(store::MemoryStore::new());
        let baton = Baton::from_store(Arc::clone(&memory), Namespace::default());
        assert!(Arc::ptr_eq(
            &baton.store_as::<store::MemoryStore>().unwrap(),
            &memory
        ));
    }
}
