//! The cache on the SQLite store: the conformance rules on a temporary file, and values
//! shared by stores on one file.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use baton_core::cache::conformance::CacheHarness;
use baton_core::conformance::fresh_namespace;
use baton_core::{Cache, CacheStore};
use baton_sqlite::{SqliteOptions, SqliteStore};
use tokio::sync::OnceCell;

struct SqliteHarness {
    path: PathBuf,
    store: OnceCell<Arc<SqliteStore>>,
    _dir: tempfile::TempDir,
}

async fn sqlite() -> SqliteHarness {
    let dir = tempfile::tempdir().expect("temp dir");
    SqliteHarness {
        path: dir.path().join("baton.db"),
        store: OnceCell::new(),
        _dir: dir,
    }
}

#[async_trait]
impl CacheHarness for SqliteHarness {
    async fn open(&self) -> Arc<dyn CacheStore> {
        self.store
            .get_or_init(|| async {
                Arc::new(
                    SqliteStore::open(&self.path, SqliteOptions::new())
                        .await
                        .expect("open the store"),
                )
            })
            .await
            .clone()
    }
}

baton_core::cache_conformance_tests!(sqlite());

/// A value set through one store is read through another on the same file, also after the
/// first is closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn values_are_shared_through_the_file() {
    let harness = sqlite().await;
    let namespace = fresh_namespace();
    let writer = SqliteStore::open(&harness.path, SqliteOptions::new())
        .await
        .unwrap();
    Cache::with_namespace(Arc::new(writer), namespace.clone())
        .set("k", &vec!["a", "b"], Duration::from_secs(60))
        .await
        .unwrap();
    let reader = SqliteStore::open(&harness.path, SqliteOptions::new())
        .await
        .unwrap();
    let cache = Cache::with_namespace(Arc::new(reader), namespace);
    assert_eq!(
        cache.get::<Vec<String>>("k").await.unwrap(),
        Some(vec!["a".to_owned(), "b".to_owned()])
    );
}
