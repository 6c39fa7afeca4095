//! The cache on the SQLite store: the conformance rules on a temporary file, and values
//! shared by stores on one file.

mod common;

use std::sync::Arc;
use std::time::Duration;

use baton_core::Cache;
use baton_core::conformance::fresh_namespace;
use baton_sqlite::{SqliteOptions, SqliteStore};

baton_core::cache_conformance_tests!(common::harness());

/// A value set through one store is read through another on the same file, also after the
/// first is closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn values_are_shared_through_the_file() {
    let harness = common::harness().await;
    let namespace = fresh_namespace();
    let writer = SqliteStore::open(&harness.opener.path, SqliteOptions::new())
        .await
        .unwrap();
    Cache::with_namespace(Arc::new(writer), namespace.clone())
        .set("k", &vec!["a", "b"], Duration::from_secs(60))
        .await
        .unwrap();
    let reader = SqliteStore::open(&harness.opener.path, SqliteOptions::new())
        .await
        .unwrap();
    let cache = Cache::with_namespace(Arc::new(reader), namespace);
    assert_eq!(
        cache.get::<Vec<String>>("k").await.unwrap(),
        Some(vec!["a".to_owned(), "b".to_owned()])
    );
}
