//! The error types compose with `?`: an acquire in a function returning `baton_core::Result`,
//! and a cache fetch whose error type is not `std::error::Error` (`anyhow::Error`, or any
//! printable type).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use baton_core::{Cache, ErrorKind, FetchError, LockOptions, Locks, MemoryStore};

async fn held_twice(locks: &Locks) -> baton_core::Result<()> {
    let _first = locks
        .acquire("k", &LockOptions::new(Duration::from_secs(30)))
        .await?;
    let _second = locks
        .acquire("k", &LockOptions::new(Duration::from_secs(30)))
        .await?;
    Ok(())
}

async fn acquire_once(locks: &Locks, key: &str) -> baton_core::Result<()> {
    locks
        .acquire(key, &LockOptions::new(Duration::from_secs(30)))
        .await?
        .release()
        .await;
    Ok(())
}

#[tokio::test]
async fn acquire_errors_convert_into_the_crate_error() {
    let locks = Locks::new(Arc::new(MemoryStore::new()));
    let err = held_twice(&locks).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Timeout, "{err}");
    assert!(err.message().contains("held by"), "{err}");
    let invalid = acquire_once(&locks, "").await.unwrap_err();
    assert_eq!(invalid.kind(), ErrorKind::InvalidInput);
}

/// An error type shaped like `anyhow::Error`: `Debug + Display + Send + Sync`, and no
/// `std::error::Error` implementation.
struct Report(String);

impl fmt::Debug for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Report({:?})", self.0)
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

async fn profile(cache: &Cache) -> Result<String, Box<dyn std::error::Error + Send + Sync>> {
    let name: String = cache
        .get_or_fetch("profile", Duration::from_secs(60), || async {
            Err::<String, _>(Report("the source is down".into()))
        })
        .await?;
    Ok(name)
}

#[tokio::test]
async fn fetch_errors_of_any_printable_type_are_errors() {
    let cache = Cache::new(Arc::new(MemoryStore::new()));
    let err = profile(&cache).await.unwrap_err();
    assert_eq!(err.to_string(), "fetch failed: the source is down");
    let err = cache
        .get_or_fetch::<String, _, _, _>("profile", Duration::from_secs(60), || async {
            Err(Report("again".into()))
        })
        .await
        .unwrap_err();
    assert!(matches!(&err, FetchError::Fetch(Report(m)) if m == "again"));
    assert_eq!(err.into_fetch().map(|r| r.0).as_deref(), Some("again"));
}

/// The newcomer's case itself: a fetch failing with `anyhow::Error`, and `?` into an
/// `anyhow::Result`.
async fn profile_with_anyhow(cache: &Cache) -> anyhow::Result<String> {
    let name: String = cache
        .get_or_fetch("anyhow-profile", Duration::from_secs(60), || async {
            Err::<String, _>(anyhow::anyhow!("the source is down"))
        })
        .await?;
    Ok(name)
}

#[tokio::test]
async fn fetch_errors_of_anyhow_compose_with_question_mark() {
    let cache = Cache::new(Arc::new(MemoryStore::new()));
    let err = profile_with_anyhow(&cache).await.unwrap_err();
    assert_eq!(err.to_string(), "fetch failed: the source is down");
}
