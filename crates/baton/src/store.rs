//! The store interface (SPI): what a store implements, and the stores baton ships.
//!
//! Applications rarely need this module: [`connect`](crate::connect) opens a store by URL.
//! Use it to open a [`Baton`](crate::Baton) over a store value with
//! [`Baton::from_store`](crate::Baton::from_store) (a [`MemoryStore`] in tests, a store with
//! options a URL cannot carry, a wrapper that injects faults), to reach a concrete store
//! with [`Baton::store_as`](crate::Baton::store_as), or to write a store of your own:
//!
//! - [`LeaseStore`]: the lease atoms under locks and leases, which every store implements;
//! - [`Store`]: the capabilities a store offers beyond them, one method each
//!   ([`RateStore`], [`CacheStore`], [`BroadcastStore`], [`IdempotencyStore`],
//!   [`WorkStore`]); a missing one answers `Unsupported` naming the stores that offer it
//!   ([`Capability::unsupported`]).
//!
//! `baton-core`'s feature `conformance` holds the suite every store runs.

use std::path::PathBuf;
use std::sync::Arc;

pub use baton_core::MemoryStore;
pub use baton_core::store::*;
pub use baton_core::{
    DEFAULT_NAMESPACE, KeyKind, MAX_KEY_BYTES, MAX_NAMESPACE_BYTES, StoreKey, redact_url, signals,
};
#[cfg(feature = "etcd")]
pub use baton_etcd::EtcdStore;
#[cfg(feature = "postgres")]
pub use baton_postgres::PostgresStore;
#[cfg(feature = "redis")]
pub use baton_redis::{RedisClusterStore, RedisStore};
#[cfg(feature = "sqlite")]
pub use baton_sqlite::SqliteStore;

use crate::{Error, Result};

/// Opens the store named by `url` (see [`connect`](crate::connect)).
pub(crate) async fn open(url: &str) -> Result<Arc<dyn Store>> {
    Ok(match Engine::of(url)? {
        Engine::Memory => Arc::new(MemoryStore::new()),
        #[cfg(feature = "sqlite")]
        Engine::Sqlite => Arc::new(SqliteStore::connect(url).await?),
        #[cfg(feature = "redis")]
        Engine::Redis => Arc::new(RedisStore::connect(url).await?),
        #[cfg(feature = "redis")]
        Engine::RedisCluster => Arc::new(RedisClusterStore::connect(url).await?),
        #[cfg(feature = "postgres")]
        Engine::Postgres => Arc::new(PostgresStore::connect(url).await?),
        #[cfg(feature = "etcd")]
        Engine::Etcd => Arc::new(EtcdStore::connect(url).await?),
    })
}

/// Checks `url` as [`connect`](crate::connect) reads it (scheme, path or address, options)
/// without opening anything: no file, no connection.
///
/// # Errors
/// As [`connect`](crate::connect), except `Unavailable`: a URL this accepts may still name a
/// store that cannot be opened.
pub fn check_url(url: &str) -> Result<()> {
    match Engine::of(url)? {
        Engine::Memory => Ok(()),
        #[cfg(feature = "sqlite")]
        Engine::Sqlite => SqliteStore::check_url(url),
        #[cfg(feature = "redis")]
        Engine::Redis => RedisStore::check_url(url),
        #[cfg(feature = "redis")]
        Engine::RedisCluster => RedisClusterStore::check_url(url),
        #[cfg(feature = "postgres")]
        Engine::Postgres => PostgresStore::check_url(url),
        #[cfg(feature = "etcd")]
        Engine::Etcd => EtcdStore::check_url(url),
    }
}

/// The store a URL's scheme names, among those this build has.
enum Engine {
    Memory,
    #[cfg(feature = "sqlite")]
    Sqlite,
    #[cfg(feature = "redis")]
    Redis,
    #[cfg(feature = "redis")]
    RedisCluster,
    #[cfg(feature = "postgres")]
    Postgres,
    #[cfg(feature = "etcd")]
    Etcd,
}

impl Engine {
    /// # Errors
    /// `InvalidInput` for a URL without a scheme, an unknown scheme, or `memory://` with a
    /// path; `Unsupported` for a known scheme this build was compiled without.
    fn of(url: &str) -> Result<Engine> {
        let Some((scheme, _rest)) = url.split_once("://") else {
            return Err(Error::invalid_input(format!(
                "store URL {:?} has no scheme; expected one of {KNOWN_SCHEMES}",
                redact_url(url)
            )));
        };
        match scheme {
            "memory" if url == "memory://" => Ok(Engine::Memory),
            "memory" => Err(Error::invalid_input(format!(
                "store URL {:?}: the memory store takes no path or options; use memory://",
                redact_url(url)
            ))),
            #[cfg(feature = "sqlite")]
            "sqlite" => Ok(Engine::Sqlite),
            #[cfg(not(feature = "sqlite"))]
            "sqlite" => Err(Error::unsupported(
                "this build of baton has no SQLite store; enable the `sqlite` feature",
            )),
            #[cfg(feature = "redis")]
            "redis" | "rediss" | "redis+sentinel" | "rediss+sentinel" => Ok(Engine::Redis),
            #[cfg(feature = "redis")]
            "redis+cluster" | "rediss+cluster" => Ok(Engine::RedisCluster),
            #[cfg(not(feature = "redis"))]
            "redis" | "rediss" | "redis+sentinel" | "rediss+sentinel" | "redis+cluster"
            | "rediss+cluster" => Err(Error::unsupported(
                "this build of baton has no Redis store; enable the `redis` feature",
            )),
            #[cfg(feature = "postgres")]
            "postgres" | "postgresql" => Ok(Engine::Postgres),
            #[cfg(not(feature = "postgres"))]
            "postgres" | "postgresql" => Err(Error::unsupported(
                "this build of baton has no PostgreSQL store; enable the `postgres` feature",
            )),
            #[cfg(feature = "etcd")]
            "etcd" | "etcds" => Ok(Engine::Etcd),
            #[cfg(not(feature = "etcd"))]
            "etcd" | "etcds" => Err(Error::unsupported(
                "this build of baton has no etcd store; enable the `etcd` feature",
            )),
            other => Err(Error::invalid_input(format!(
                "unknown store URL scheme {:?}; expected one of {KNOWN_SCHEMES}",
                redact_url(other)
            ))),
        }
    }
}

const KNOWN_SCHEMES: &str = "memory://, sqlite://, redis://, rediss://, redis+sentinel://, rediss+sentinel://, redis+cluster://, rediss+cluster://, postgres://, postgresql://, etcd://";

/// The default store: an SQLite file under the user's state directory,
/// `$XDG_STATE_HOME/baton/baton.db`, else `~/.local/state/baton/baton.db`.
///
/// # Errors
/// `InvalidInput` when neither `XDG_STATE_HOME` nor `HOME` is set.
pub fn default_path() -> Result<PathBuf> {
    let state = match std::env::var_os("XDG_STATE_HOME").filter(|v| !v.is_empty()) {
        Some(dir) => PathBuf::from(dir),
        None => match std::env::var_os("HOME").filter(|v| !v.is_empty()) {
            Some(home) => PathBuf::from(home).join(".local").join("state"),
            None => {
                return Err(Error::invalid_input(
                    "neither XDG_STATE_HOME nor HOME is set, so there is no default store; pass --store or set BATON_STORE",
                ));
            }
        },
    };
    Ok(state.join("baton").join("baton.db"))
}

/// [`default_path`] as a `sqlite://` URL.
///
/// # Errors
/// As [`default_path`].
pub fn default_url() -> Result<String> {
    Ok(format!("sqlite://{}", default_path()?.display()))
}
