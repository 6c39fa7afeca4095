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
//! | `postgres://[user[:password]@]host[:port]/database[?sslmode=require]`, `postgresql://...` | a PostgreSQL database shared by replicas on many hosts (tables, `LISTEN`/`NOTIFY`) |
//!
//! Every lock is best-effort, as every lease-based lock is: a holder paused past its TTL
//! loses the lock without knowing it. baton gives you what you need to stay correct anyway:
//! a [`Fence`] on every grant, a lost signal and a monotonic `valid_until` on every guard.
//!
//! Beside locks and leases: [`Baton::rate_limiter`], [`Baton::cache`], [`Baton::broadcast`],
//! [`Baton::idempotency`], and claimable work on the SQL stores — [`Baton::queue`],
//! [`Baton::scheduler`], [`Baton::migrations`] (module [`work`]).
//!
//! # Examples
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use baton::LockOptions;
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

use std::path::PathBuf;
use std::sync::Arc;

pub use baton_core::store::{self, LeaseStore};
pub use baton_core::{
    AcquireError, ClaimResult, DEFAULT_NAMESPACE, Error, ErrorKind, Fence, Holder, HolderInfo,
    KeptClaim, Key, KeyKind, LeaseInfo, LeaseKeepAlive, LeaseOptions, Leases, LockGuard,
    LockHandle, LockOptions, Locks, MAX_HOLD_LIMIT, MAX_HOLDER_BYTES, MAX_KEY_BYTES,
    MAX_LABEL_BYTES, MAX_NAMESPACE_BYTES, MAX_REASON_BYTES, MemoryStore, Namespace, ReleaseOutcome,
    RemoveResult, Renewal, Result, StoreKey, Ttl, WaitTime, check_reason, parse_duration,
    redact_url, stream_key, telemetry, time,
};
pub use baton_core::{CancellationToken, WaitForCancellationFutureOwned};
#[cfg(feature = "postgres")]
pub use baton_postgres::PostgresStore;
#[cfg(feature = "redis")]
pub use baton_redis::RedisStore;
#[cfg(feature = "sqlite")]
pub use baton_sqlite::SqliteStore;

mod backend;
pub mod broadcast;
pub mod cache;
mod companion;
pub mod doctor;
pub mod idempotency;
pub mod limit;
pub mod work;

pub use backend::Backend;
pub use broadcast::Broadcast;
pub use cache::Cache;
pub use idempotency::IdempotencyLog;
pub use limit::RateLimiter;

/// A connection to one store, with the clients of every primitive in one namespace.
///
/// Primitives beyond locks and leases are handed out by methods that check, when the client
/// is built, that the store offers the capability (`Unsupported` otherwise, never at call
/// time).
#[derive(Debug, Clone)]
pub struct Baton {
    backend: Backend,
    namespace: Namespace,
    locks: Locks,
    leases: Leases,
}

impl Baton {
    /// Wraps an already-opened store.
    pub fn from_backend(backend: Backend, namespace: Namespace) -> Self {
        let store = backend.lease_store();
        Baton {
            locks: Locks::with_namespace(Arc::clone(&store), namespace.clone()),
            leases: Leases::with_namespace(store, namespace.clone()),
            backend,
            namespace,
        }
    }

    /// Wraps a lease store of your own (for example a wrapper that injects faults).
    pub fn from_store(store: Arc<dyn LeaseStore>, namespace: Namespace) -> Self {
        Baton::from_backend(Backend::Custom(store), namespace)
    }

    /// The lock client.
    pub fn locks(&self) -> &Locks {
        &self.locks
    }

    /// The lease client.
    pub fn leases(&self) -> &Leases {
        &self.leases
    }

    /// The lease store.
    pub fn store(&self) -> Arc<dyn LeaseStore> {
        self.backend.lease_store()
    }

    /// The concrete store behind this connection.
    pub fn backend(&self) -> &Backend {
        &self.backend
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
    Ok(Baton::from_backend(open_backend(url).await?, namespace))
}

/// Opens the lease store named by `url`.
///
/// # Errors
/// As [`connect`].
pub async fn open_store(url: &str) -> Result<Arc<dyn LeaseStore>> {
    Ok(open_backend(url).await?.lease_store())
}

/// Opens the store named by `url`.
///
/// # Errors
/// As [`connect`].
pub async fn open_backend(url: &str) -> Result<Backend> {
    let Some((scheme, _rest)) = url.split_once("://") else {
        return Err(Error::invalid_input(format!(
            "store URL {:?} has no scheme; expected one of {KNOWN_SCHEMES}",
            redact_url(url)
        )));
    };
    match scheme {
        "memory" => {
            if url != "memory://" {
                return Err(Error::invalid_input(format!(
                    "store URL {:?}: the memory store takes no path or options; use memory://",
                    redact_url(url)
                )));
            }
            Ok(Backend::Memory(Arc::new(MemoryStore::new())))
        }
        #[cfg(feature = "sqlite")]
        "sqlite" => Ok(Backend::Sqlite(Arc::new(SqliteStore::connect(url).await?))),
        #[cfg(not(feature = "sqlite"))]
        "sqlite" => Err(Error::unsupported(
            "this build of baton has no SQLite store; enable the `sqlite` feature",
        )),
        #[cfg(feature = "redis")]
        "redis" | "rediss" | "redis+sentinel" | "rediss+sentinel" => {
            Ok(Backend::Redis(Arc::new(RedisStore::connect(url).await?)))
        }
        #[cfg(not(feature = "redis"))]
        "redis" | "rediss" | "redis+sentinel" | "rediss+sentinel" => Err(Error::unsupported(
            "this build of baton has no Redis store; enable the `redis` feature",
        )),
        #[cfg(feature = "postgres")]
        "postgres" | "postgresql" => Ok(Backend::Postgres(Arc::new(
            PostgresStore::connect(url).await?,
        ))),
        #[cfg(not(feature = "postgres"))]
        "postgres" | "postgresql" => Err(Error::unsupported(
            "this build of baton has no PostgreSQL store; enable the `postgres` feature",
        )),
        other => Err(Error::invalid_input(format!(
            "unknown store URL scheme {:?}; expected one of {KNOWN_SCHEMES}",
            redact_url(other)
        ))),
    }
}

const KNOWN_SCHEMES: &str = "memory://, sqlite://, redis://, rediss://, redis+sentinel://, rediss+sentinel://, postgres://, postgresql://";

/// The default store: an SQLite file under the user's state directory,
/// `$XDG_STATE_HOME/baton/baton.db`, else `~/.local/state/baton/baton.db`.
///
/// # Errors
/// `InvalidInput` when neither `XDG_STATE_HOME` nor `HOME` is set.
pub fn default_store_path() -> Result<PathBuf> {
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

/// [`default_store_path`] as a `sqlite://` URL.
///
/// # Errors
/// As [`default_store_path`].
pub fn default_store_url() -> Result<String> {
    Ok(format!("sqlite://{}", default_store_path()?.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn unknown_and_malformed_urls_are_invalid_input() {
        for url in ["mysql://x", "nonsense", "", "memory://extra"] {
            let err = open_store(url).await.unwrap_err();
            assert_eq!(err.kind(), ErrorKind::InvalidInput, "{url}: {err}");
        }
        let err = open_store("mysql://x").await.unwrap_err();
        assert!(err.message().contains("\"mysql\""), "{err}");
        assert!(err.message().contains("sqlite://"), "{err}");
    }

    #[tokio::test]
    async fn memory_url_opens() {
        let baton = connect("memory://").await.unwrap();
        assert_eq!(baton.namespace().as_str(), "baton");
    }
}
