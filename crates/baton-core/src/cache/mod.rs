//! A TTL-bounded key/value cache shared by replicas, with typed JSON values.
//!
//! Use a [`Cache`] for data that is read often, written rarely and tolerant of bounded
//! staleness: lookups that are expensive to compute (an organisation's ancestry for 60 s),
//! third-party tokens, configuration. Do not cache a value that is a correctness boundary
//! (read the source of truth), and do not use the cache for compare-and-set (use a lock, a
//! lease or an idempotency record).
//!
//! ## Behavior
//! - **A miss is fine, stale is fine, wrong is not.** Keys are qualified
//!   `<namespace>:cache:<key>`, so applications and primitives sharing a store never read
//!   each other's values. A stored value that does not deserialize as the type asked for is
//!   an error (`Internal`, and
//!   [`baton.cache.undecodable`](crate::telemetry::events::CACHE_UNDECODABLE)), never a
//!   panic and never a default.
//! - **Fail fast.** A store fault is an `Unavailable` error the caller may treat as a miss,
//!   with [`baton.cache.unavailable`](crate::telemetry::events::CACHE_UNAVAILABLE);
//!   [`Cache::get_or_fetch`] does exactly that: it falls back to the fetch.
//! - **One fetch per key per process.** Concurrent [`Cache::get_or_fetch`] calls for one key
//!   on one store wait for the first caller's fetch instead of each fetching (see `flight`).
//!   Across processes each replica may fetch once.
//! - Values are JSON (serde), at most [`MAX_VALUE_BYTES`]; TTLs are validated [`Ttl`]s.

mod flight;
mod memory;
mod store;

#[cfg(feature = "conformance")]
pub mod conformance;

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;

pub(crate) use memory::MemoryCache;
pub use store::CacheStore;

use crate::error::{Error, ErrorKind, Result};
use crate::key::{Key, KeyKind, Namespace, StoreKey};
use crate::telemetry::{self, events};
use crate::time::Ttl;
use flight::Ticket;

/// Largest value, in bytes of JSON.
pub const MAX_VALUE_BYTES: usize = 16 * 1024 * 1024;

/// Why [`Cache::get_or_fetch`] returned no value.
#[derive(Debug)]
#[non_exhaustive]
pub enum FetchError<E> {
    /// The fetch failed; its error is passed through unchanged.
    Fetch(E),
    /// The cache refused the call: invalid input (before any I/O), a cached value that does
    /// not deserialize as `T`, or a fetched value that does not serialize. Store faults are
    /// not reported here: they count as a miss.
    Cache(Error),
}

impl<E: fmt::Display> fmt::Display for FetchError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FetchError::Fetch(e) => write!(f, "fetch failed: {e}"),
            FetchError::Cache(e) => fmt::Display::fmt(e, f),
        }
    }
}

/// An error for any fetch error that prints, `std::error::Error` or not (`anyhow::Error`,
/// `eyre::Report` and `Box<dyn Error>` are not), so `?` turns a `FetchError<anyhow::Error>`
/// into an `anyhow::Error` or a `Box<dyn Error>`.
///
/// The fetch error's message is part of this error's own message (`fetch failed: ...`), so
/// it is not repeated as a `source`; [`FetchError::into_fetch`] hands it back for its own
/// chain. A cache error is the source of a `Cache` variant.
impl<E: fmt::Debug + fmt::Display> std::error::Error for FetchError<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            FetchError::Fetch(_) => None,
            FetchError::Cache(e) => Some(e),
        }
    }
}

impl<E> FetchError<E> {
    /// The fetch's own error, when the fetch failed.
    pub fn into_fetch(self) -> Option<E> {
        match self {
            FetchError::Fetch(e) => Some(e),
            FetchError::Cache(_) => None,
        }
    }
}

/// The cache client over one store. Cheap to clone; share one per process.
///
/// # Examples
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::{sync::Arc, time::Duration};
/// use baton_core::{Cache, MemoryStore};
///
/// #[derive(serde::Serialize, serde::Deserialize)]
/// struct Profile { name: String }
///
/// let cache = Cache::new(Arc::new(MemoryStore::new()));
/// let profile: Profile = cache
///     .get_or_fetch("user:42:profile", Duration::from_secs(60), || async {
///         // The source of truth; runs once per key per process while the value is cached.
///         Ok::<_, std::io::Error>(Profile { name: "Ada".into() })
///     })
///     .await?;
/// assert_eq!(profile.name, "Ada");
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct Cache {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    store: Arc<dyn CacheStore>,
    namespace: Namespace,
}

impl Cache {
    /// A cache in the default namespace.
    pub fn new(store: Arc<dyn CacheStore>) -> Self {
        Cache::with_namespace(store, Namespace::default())
    }

    /// A cache in `namespace`.
    pub fn with_namespace(store: Arc<dyn CacheStore>, namespace: Namespace) -> Self {
        Cache {
            inner: Arc::new(Inner { store, namespace }),
        }
    }

    /// The namespace keys are qualified with.
    pub fn namespace(&self) -> &Namespace {
        &self.inner.namespace
    }

    fn qualify(&self, key: &str) -> Result<StoreKey> {
        Ok(self
            .inner
            .namespace
            .qualify(KeyKind::Cache, &Key::new(key)?))
    }

    /// The value of `key`, if one is cached and live.
    ///
    /// # Errors
    /// - `InvalidInput` for an invalid key, before any I/O;
    /// - `Unavailable` when the store faulted: the caller may treat it as a miss;
    /// - `Internal` when the cached value does not deserialize as `T`.
    pub async fn get<T: DeserializeOwned>(&self, key: &str) -> Result<Option<T>> {
        let key = self.qualify(key)?;
        match self.read(&key).await? {
            Some(bytes) => decode(&key, &bytes).map(Some),
            None => Ok(None),
        }
    }

    /// Caches `value` under `key` for `ttl`, replacing what was there.
    ///
    /// # Errors
    /// - `InvalidInput` for an invalid key or TTL, a value that does not serialize to JSON,
    ///   or JSON longer than [`MAX_VALUE_BYTES`], before any I/O;
    /// - `Unavailable` when the store faulted (the old value may remain until its TTL).
    pub async fn set<T: Serialize + ?Sized>(
        &self,
        key: &str,
        value: &T,
        ttl: Duration,
    ) -> Result<()> {
        let key = self.qualify(key)?;
        let ttl = Ttl::new(ttl)?;
        let bytes = encode(&key, value)?;
        self.write(&key, bytes, ttl).await
    }

    /// Removes `key`'s value; `true` when a live value was removed.
    ///
    /// # Errors
    /// `InvalidInput` for an invalid key; `Unavailable` when the store faulted (the value
    /// may remain until its TTL).
    pub async fn delete(&self, key: &str) -> Result<bool> {
        let key = self.qualify(key)?;
        self.inner.store.delete(&key).await.inspect_err(|e| {
            unavailable(&key, "delete", e);
        })
    }

    /// The cached value of `key`, or the value `fetch` produces, cached for `ttl`.
    ///
    /// Concurrent calls for the same key on the same store, in this process, wait for one
    /// fetch instead of each fetching. When the store is unavailable the call counts it as
    /// a miss: it fetches, returns the value and does not try to cache it (emitting
    /// [`baton.cache.unavailable`](crate::telemetry::events::CACHE_UNAVAILABLE)).
    ///
    /// # Errors
    /// [`FetchError::Fetch`] when `fetch` failed (the next waiting caller then fetches on
    /// its own); [`FetchError::Cache`] for invalid input (before any I/O), a cached value
    /// that does not deserialize as `T`, or a fetched value that does not serialize.
    ///
    /// # Cancel safety
    /// Dropping the future while it fetches lets the next waiting caller fetch instead.
    pub async fn get_or_fetch<T, E, F, Fut>(
        &self,
        key: &str,
        ttl: Duration,
        fetch: F,
    ) -> Result<T, FetchError<E>>
    where
        T: Serialize + DeserializeOwned,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let key = self.qualify(key).map_err(FetchError::Cache)?;
        let ttl = Ttl::new(ttl).map_err(FetchError::Cache)?;
        let store_id = Arc::as_ptr(&self.inner.store) as *const () as usize;
        let ticket = Ticket::join(store_id, &key);
        let mut slot = ticket.flight().slot.lock().await;
        if let Some(bytes) = slot.as_deref() {
            return decode(&key, bytes).map_err(FetchError::Cache);
        }
        let store_up = match self.read(&key).await {
            Ok(Some(bytes)) => {
                let value = decode(&key, &bytes).map_err(FetchError::Cache)?;
                *slot = Some(bytes);
                return Ok(value);
            }
            Ok(None) => true,
            Err(e) if e.kind() == ErrorKind::Unavailable => false,
            Err(e) => return Err(FetchError::Cache(e)),
        };
        let value = fetch().await.map_err(FetchError::Fetch)?;
        let bytes = encode(&key, &value).map_err(FetchError::Cache)?;
        if store_up {
            // A value that could not be cached is still the right answer.
            let _ = self.write(&key, bytes.clone(), ttl).await;
        }
        *slot = Some(bytes);
        Ok(value)
    }

    async fn read(&self, key: &StoreKey) -> Result<Option<Vec<u8>>> {
        self.inner.store.get(key).await.inspect_err(|e| {
            unavailable(key, "get", e);
        })
    }

    async fn write(&self, key: &StoreKey, bytes: Vec<u8>, ttl: Ttl) -> Result<()> {
        self.inner
            .store
            .set(key, bytes, ttl)
            .await
            .inspect_err(|e| {
                unavailable(key, "set", e);
            })
    }
}

fn unavailable(key: &StoreKey, what: &str, error: &Error) {
    telemetry::emit(
        &events::CACHE_UNAVAILABLE,
        Some(key.as_str()),
        format_args!("cache {what} failed; callers treat it as a miss: {error}"),
    );
}

fn encode<T: Serialize + ?Sized>(key: &StoreKey, value: &T) -> Result<Vec<u8>> {
    let bytes = serde_json::to_vec(value).map_err(|e| {
        Error::invalid_input(format!(
            "the value for cache key {:?} does not serialize to JSON: {e}",
            key.user_key()
        ))
    })?;
    if bytes.len() > MAX_VALUE_BYTES {
        return Err(Error::invalid_input(format!(
            "the value for cache key {:?} is {} bytes of JSON; the limit is {MAX_VALUE_BYTES} bytes",
            key.user_key(),
            bytes.len()
        )));
    }
    Ok(bytes)
}

fn decode<T: DeserializeOwned>(key: &StoreKey, bytes: &[u8]) -> Result<T> {
    serde_json::from_slice(bytes).map_err(|e| {
        telemetry::emit(
            &events::CACHE_UNDECODABLE,
            Some(key.as_str()),
            format_args!(
                "the cached value does not deserialize as {}: {e}",
                std::any::type_name::<T>()
            ),
        );
        Error::internal(format!(
            "the cached value of {:?} does not deserialize as {}: {e}; another writer stores a different type under this key",
            key.user_key(),
            std::any::type_name::<T>()
        ))
        .with_source(e)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::MemoryStore;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[tokio::test(start_paused = true)]
    async fn values_round_trip_and_expire() {
        let cache = Cache::new(Arc::new(MemoryStore::new()));
        cache
            .set("k", &vec![1, 2, 3], Duration::from_secs(1))
            .await
            .unwrap();
        assert_eq!(
            cache.get::<Vec<u8>>("k").await.unwrap(),
            Some(vec![1, 2, 3])
        );
        tokio::time::advance(Duration::from_millis(1001)).await;
        assert_eq!(cache.get::<Vec<u8>>("k").await.unwrap(), None);
    }

    #[tokio::test]
    async fn a_value_of_another_type_is_an_error() {
        let cache = Cache::new(Arc::new(MemoryStore::new()));
        cache
            .set("k", "text", Duration::from_secs(5))
            .await
            .unwrap();
        let err = cache.get::<u64>("k").await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Internal);
        assert!(
            err.message().contains("does not deserialize as u64"),
            "{err}"
        );
        let fetches = AtomicUsize::new(0);
        let err = cache
            .get_or_fetch("k", Duration::from_secs(5), || async {
                fetches.fetch_add(1, Ordering::SeqCst);
                Ok::<u64, std::io::Error>(1)
            })
            .await
            .unwrap_err();
        assert!(matches!(err, FetchError::Cache(_)), "{err:?}");
        assert_eq!(fetches.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn invalid_input_and_oversized_values() {
        let cache = Cache::new(Arc::new(MemoryStore::new()));
        assert!(cache.get::<u8>("").await.unwrap_err().is_invalid_input());
        let ttl = Duration::from_millis(5);
        assert!(
            cache
                .set("k", &1, ttl)
                .await
                .unwrap_err()
                .is_invalid_input()
        );
        let big = "x".repeat(MAX_VALUE_BYTES);
        let err = cache
            .set("k", &big, Duration::from_secs(1))
            .await
            .unwrap_err();
        assert!(err.message().contains("the limit is"), "{err}");
        let mut odd = std::collections::HashMap::new();
        odd.insert(vec![1u8], 1u8);
        let err = cache
            .set("k", &odd, Duration::from_secs(1))
            .await
            .unwrap_err();
        assert!(err.message().contains("does not serialize"), "{err}");
    }
}
