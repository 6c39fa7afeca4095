//! The concrete store behind a [`Baton`](crate::Baton).
//!
//! Each capability (locks and leases today; rate limits, caches, broadcasts, idempotency and
//! queues as they land) is handed out by a method of `Baton` that matches on the backend and
//! answers `Unsupported` when the store cannot offer it. A new capability adds one method in
//! its own module of this crate; a new store adds one variant here.

use std::sync::Arc;

use baton_core::MemoryStore;
use baton_core::store::LeaseStore;

/// The store a [`Baton`](crate::Baton) is connected to.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Backend {
    /// `memory://`.
    Memory(Arc<MemoryStore>),
    /// `sqlite://`.
    #[cfg(feature = "sqlite")]
    Sqlite(Arc<baton_sqlite::SqliteStore>),
    /// `redis://` and `rediss://`.
    #[cfg(feature = "redis")]
    Redis(Arc<baton_redis::RedisStore>),
    /// `postgres://` and `postgresql://`.
    #[cfg(feature = "postgres")]
    Postgres(Arc<baton_postgres::PostgresStore>),
    /// A lease store supplied by the caller ([`Baton::from_store`](crate::Baton::from_store)):
    /// it offers locks and leases only.
    Custom(Arc<dyn LeaseStore>),
}

impl Backend {
    /// The lease store (locks and leases), which every backend offers.
    pub fn lease_store(&self) -> Arc<dyn LeaseStore> {
        match self {
            Backend::Memory(store) => store.clone(),
            #[cfg(feature = "sqlite")]
            Backend::Sqlite(store) => store.clone(),
            #[cfg(feature = "redis")]
            Backend::Redis(store) => store.clone(),
            #[cfg(feature = "postgres")]
            Backend::Postgres(store) => store.clone(),
            Backend::Custom(store) => store.clone(),
        }
    }

    /// The URL scheme of the store (`memory`, `sqlite`, `redis`, `postgres`, or `custom`).
    pub fn scheme(&self) -> &'static str {
        match self {
            Backend::Memory(_) => "memory",
            #[cfg(feature = "sqlite")]
            Backend::Sqlite(_) => "sqlite",
            #[cfg(feature = "redis")]
            Backend::Redis(_) => "redis",
            #[cfg(feature = "postgres")]
            Backend::Postgres(_) => "postgres",
            Backend::Custom(_) => "custom",
        }
    }
}
