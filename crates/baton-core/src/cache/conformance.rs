//! The cache conformance rules: written once, run by every store that implements
//! [`CacheStore`].
//!
//! A store's test target implements [`Opens`] for its store (the
//! [`CacheHarness`]) and expands
//! [`cache_conformance_tests!`](crate::cache_conformance_tests)
//! (`baton_core::cache_conformance_tests!(my_harness())`), which generates one
//! `#[tokio::test]` per rule. Each rule uses a fresh random namespace.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use tokio::time::{Instant, sleep};

use super::{Cache, CacheStore, FetchError};
use crate::conformance::{Faulty, Opens, fresh_namespace};
use crate::error::{Error, ErrorKind, Result};
use crate::key::StoreKey;
use crate::time::Ttl;

/// What a store's test target provides to the cache rules: the store under test, as
/// [`CacheStore`].
pub type CacheHarness = dyn Opens<dyn CacheStore>;

/// Generates one `#[tokio::test]` per cache rule. `$harness` is an expression that
/// evaluates to a future of a [`CacheHarness`]; it is evaluated once per test.
#[macro_export]
macro_rules! cache_conformance_tests {
    ($harness:expr) => {
        $crate::__conformance_rules!($crate::cache::conformance; $harness;
            set_get_delete,
            values_expire_after_their_ttl,
            set_replaces_and_restarts_the_ttl,
            keys_and_namespaces_are_separate,
            a_value_of_another_type_is_an_error,
            values_keep_every_byte,
            get_or_fetch_collapses_concurrent_fetches,
            a_failed_fetch_lets_the_next_caller_fetch,
            store_faults_are_unavailable_and_fetch_falls_back,
            invalid_input_is_rejected_before_io,
        );
    };
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Profile {
    name: String,
    tags: Vec<String>,
    score: Option<f64>,
}

fn profile(name: &str) -> Profile {
    Profile {
        name: name.to_owned(),
        tags: vec!["a".into(), "ü€😀".into()],
        score: Some(0.5),
    }
}

async fn cache(h: &CacheHarness) -> Cache {
    Cache::with_namespace(h.open().await, fresh_namespace())
}

const MINUTE: Duration = Duration::from_secs(60);

/// A value set is read back whole; deleting it makes it a miss.
pub async fn set_get_delete(h: &CacheHarness) {
    let cache = cache(h).await;
    assert_eq!(cache.get::<Profile>("user:1").await.unwrap(), None);
    cache.set("user:1", &profile("Ada"), MINUTE).await.unwrap();
    assert_eq!(
        cache.get::<Profile>("user:1").await.unwrap(),
        Some(profile("Ada"))
    );
    assert!(
        cache.delete("user:1").await.unwrap(),
        "a live value was deleted"
    );
    assert_eq!(cache.get::<Profile>("user:1").await.unwrap(), None);
    assert!(
        !cache.delete("user:1").await.unwrap(),
        "nothing left to delete"
    );
}

/// A value is a miss once its TTL has run out on the store's clock.
pub async fn values_expire_after_their_ttl(h: &CacheHarness) {
    let cache = cache(h).await;
    let set_at = Instant::now();
    cache
        .set("k", &1u32, Duration::from_millis(1500))
        .await
        .unwrap();
    let read = cache.get::<u32>("k").await.unwrap();
    if set_at.elapsed() < Duration::from_millis(1000) {
        assert_eq!(read, Some(1));
    }
    let limit = Duration::from_secs(30);
    while cache.get::<u32>("k").await.unwrap().is_some() {
        assert!(set_at.elapsed() < limit, "still cached after {limit:?}");
        sleep(Duration::from_millis(50)).await;
    }
    assert!(
        set_at.elapsed() >= Duration::from_millis(1400),
        "expired early"
    );
    assert!(
        !cache.delete("k").await.unwrap(),
        "an expired value is not live"
    );
}

/// Setting again replaces the value and starts its TTL again.
pub async fn set_replaces_and_restarts_the_ttl(h: &CacheHarness) {
    let cache = cache(h).await;
    cache
        .set("k", "first", Duration::from_millis(300))
        .await
        .unwrap();
    cache.set("k", "second", MINUTE).await.unwrap();
    sleep(Duration::from_millis(600)).await;
    assert_eq!(
        cache.get::<String>("k").await.unwrap().as_deref(),
        Some("second")
    );
}

/// The same key in another namespace, and another key, are other values.
pub async fn keys_and_namespaces_are_separate(h: &CacheHarness) {
    let store = h.open().await;
    let a = Cache::with_namespace(Arc::clone(&store), fresh_namespace());
    let b = Cache::with_namespace(store, fresh_namespace());
    a.set("k", &1u32, MINUTE).await.unwrap();
    b.set("k", &2u32, MINUTE).await.unwrap();
    a.set("k2", &3u32, MINUTE).await.unwrap();
    assert_eq!(a.get::<u32>("k").await.unwrap(), Some(1));
    assert_eq!(b.get::<u32>("k").await.unwrap(), Some(2));
    assert_eq!(a.get::<u32>("k2").await.unwrap(), Some(3));
    assert_eq!(b.get::<u32>("k2").await.unwrap(), None);
    assert!(b.delete("k").await.unwrap());
    assert_eq!(a.get::<u32>("k").await.unwrap(), Some(1));
}

/// A stored value that does not deserialize as the type asked for is `Internal`, not a
/// panic, not a default and not a miss.
pub async fn a_value_of_another_type_is_an_error(h: &CacheHarness) {
    let cache = cache(h).await;
    cache.set("k", &profile("Ada"), MINUTE).await.unwrap();
    let err = cache.get::<Vec<u64>>("k").await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Internal, "{err}");
    let fetched = AtomicUsize::new(0);
    let err = cache
        .get_or_fetch("k", MINUTE, || async {
            fetched.fetch_add(1, Ordering::SeqCst);
            Ok::<u64, Error>(7)
        })
        .await
        .unwrap_err();
    assert!(matches!(err, FetchError::Cache(ref e) if e.kind() == ErrorKind::Internal));
    assert_eq!(
        fetched.load(Ordering::SeqCst),
        0,
        "wrong data is not a miss"
    );
    assert_eq!(
        cache.get::<Profile>("k").await.unwrap(),
        Some(profile("Ada")),
        "the value was left alone"
    );
}

/// Unicode, escapes, large values and edge numbers survive the store byte for byte.
pub async fn values_keep_every_byte(h: &CacheHarness) {
    let cache = cache(h).await;
    let mut value = BTreeMap::new();
    value.insert(
        "quote\"back\\slash\u{0}nul".to_owned(),
        "ünïcödé 😀 \n\t".to_owned(),
    );
    value.insert("big".to_owned(), "x".repeat(1024 * 1024));
    cache.set("k", &value, MINUTE).await.unwrap();
    assert_eq!(
        cache.get::<BTreeMap<String, String>>("k").await.unwrap(),
        Some(value)
    );
    cache.set("n", &u64::MAX, MINUTE).await.unwrap();
    assert_eq!(cache.get::<u64>("n").await.unwrap(), Some(u64::MAX));
    cache
        .set("null", &Option::<u8>::None, MINUTE)
        .await
        .unwrap();
    assert_eq!(
        cache.get::<Option<u8>>("null").await.unwrap(),
        Some(None),
        "a cached null is a hit"
    );
}

/// N concurrent callers for one key: one fetch, every caller gets its value.
pub async fn get_or_fetch_collapses_concurrent_fetches(h: &CacheHarness) {
    let cache = cache(h).await;
    let fetches = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..32 {
        let (cache, fetches) = (cache.clone(), Arc::clone(&fetches));
        tasks.push(tokio::spawn(async move {
            cache
                .get_or_fetch("slow", MINUTE, || async move {
                    fetches.fetch_add(1, Ordering::SeqCst);
                    sleep(Duration::from_millis(300)).await;
                    Ok::<_, Error>(profile("fetched"))
                })
                .await
                .map_err(|e| e.to_string())
        }));
    }
    for task in tasks {
        assert_eq!(task.await.unwrap().unwrap(), profile("fetched"));
    }
    assert_eq!(fetches.load(Ordering::SeqCst), 1, "32 callers, one fetch");
    // A separate handle on the same store joins the same flights, and the value is cached.
    let other = Cache::with_namespace(h.open().await, cache.namespace().clone());
    let value: Profile = other
        .get_or_fetch("slow", MINUTE, || async {
            Err::<Profile, _>("must not fetch a cached value")
        })
        .await
        .unwrap();
    assert_eq!(value, profile("fetched"));
}

/// A fetch that fails is that caller's error; the next caller fetches on its own.
pub async fn a_failed_fetch_lets_the_next_caller_fetch(h: &CacheHarness) {
    let cache = cache(h).await;
    let first = cache
        .get_or_fetch("k", MINUTE, || async { Err::<u32, _>("source down") })
        .await;
    assert!(
        matches!(first, Err(FetchError::Fetch("source down"))),
        "{first:?}"
    );
    let second = cache
        .get_or_fetch("k", MINUTE, || async { Ok::<u32, &str>(5) })
        .await
        .unwrap();
    assert_eq!(second, 5);
    assert_eq!(cache.get::<u32>("k").await.unwrap(), Some(5));
}

/// A store fault is `Unavailable` for get, set and delete; `get_or_fetch` counts it as a
/// miss and returns the fetched value.
pub async fn store_faults_are_unavailable_and_fetch_falls_back(h: &CacheHarness) {
    let store = Arc::new(FaultyCacheStore::new(h.open().await));
    let cache = Cache::with_namespace(store.clone(), fresh_namespace());
    cache.set("k", &1u32, MINUTE).await.unwrap();
    store.set_failing(true);
    for err in [
        cache.get::<u32>("k").await.unwrap_err(),
        cache.set("k", &2u32, MINUTE).await.unwrap_err(),
        cache.delete("k").await.unwrap_err(),
    ] {
        assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
        assert!(err.is_retryable());
    }
    let value = cache
        .get_or_fetch("k", MINUTE, || async { Ok::<u32, Error>(9) })
        .await
        .unwrap();
    assert_eq!(value, 9, "the fetch answers while the store is down");
    store.set_failing(false);
    assert_eq!(
        cache.get::<u32>("k").await.unwrap(),
        Some(1),
        "nothing was written"
    );
}

/// Invalid keys and TTLs are rejected without touching the store.
pub async fn invalid_input_is_rejected_before_io(h: &CacheHarness) {
    let store = Arc::new(FaultyCacheStore::new(h.open().await));
    let cache = Cache::with_namespace(store.clone(), fresh_namespace());
    for key in ["", "a\u{7}b"] {
        assert!(cache.get::<u8>(key).await.unwrap_err().is_invalid_input());
        assert!(
            cache
                .set(key, &1, MINUTE)
                .await
                .unwrap_err()
                .is_invalid_input()
        );
        assert!(cache.delete(key).await.unwrap_err().is_invalid_input());
    }
    for ttl in [
        Duration::ZERO,
        Duration::from_millis(9),
        Duration::from_secs(31 * 86_400),
    ] {
        assert!(
            cache
                .set("k", &1, ttl)
                .await
                .unwrap_err()
                .is_invalid_input()
        );
        let err = cache
            .get_or_fetch("k", ttl, || async { Ok::<u8, Error>(1) })
            .await
            .unwrap_err();
        assert!(matches!(err, FetchError::Cache(ref e) if e.is_invalid_input()));
    }
    assert_eq!(store.calls(), 0, "rejected input reached the store");
}

/// A [`CacheStore`] wrapper that counts calls and fails them on demand.
pub type FaultyCacheStore = Faulty<dyn CacheStore>;

#[async_trait]
impl CacheStore for FaultyCacheStore {
    async fn get(&self, key: &StoreKey) -> Result<Option<Vec<u8>>> {
        self.enter()?;
        self.inner.get(key).await
    }

    async fn set(&self, key: &StoreKey, value: Vec<u8>, ttl: Ttl) -> Result<()> {
        self.enter()?;
        self.inner.set(key, value, ttl).await
    }

    async fn delete(&self, key: &StoreKey) -> Result<bool> {
        self.enter()?;
        self.inner.delete(key).await
    }
}
