//! The conformance suite against the SQLite store, each test on its own temporary file.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use baton_core::StoreKey;
use baton_core::conformance::Harness;
use baton_core::store::LeaseStore;
use baton_sqlite::{SqliteOptions, SqliteStore};

struct SqliteHarness {
    path: PathBuf,
    store: Mutex<Option<Arc<SqliteStore>>>,
    _dir: tempfile::TempDir,
}

async fn sqlite() -> SqliteHarness {
    let dir = tempfile::tempdir().expect("temp dir");
    SqliteHarness {
        path: dir.path().join("state").join("baton.db"),
        store: Mutex::new(None),
        _dir: dir,
    }
}

impl SqliteHarness {
    async fn open_new(&self) -> Arc<SqliteStore> {
        Arc::new(
            SqliteStore::open(&self.path, SqliteOptions::new())
                .await
                .expect("open the store"),
        )
    }
}

#[async_trait]
impl Harness for SqliteHarness {
    async fn open(&self) -> Arc<dyn LeaseStore> {
        let existing = self.store.lock().unwrap().clone();
        match existing {
            Some(store) => store,
            None => {
                let store = self.open_new().await;
                self.store
                    .lock()
                    .unwrap()
                    .get_or_insert_with(|| store)
                    .clone()
            }
        }
    }

    async fn reopen(&self) -> Arc<dyn LeaseStore> {
        drop(self.store.lock().unwrap().take());
        let store = self.open_new().await;
        *self.store.lock().unwrap() = Some(store.clone());
        store
    }

    /// Deletes the row with a connection of its own, as an operator in the `sqlite3` shell
    /// would.
    async fn evict(&self, key: &StoreKey) {
        let path = self.path.clone();
        let key = key.as_str().to_owned();
        let deleted = tokio::task::spawn_blocking(move || {
            let conn = rusqlite::Connection::open(&path).expect("operator connection");
            conn.busy_timeout(Duration::from_secs(5)).unwrap();
            conn.execute("DELETE FROM baton_grant WHERE key = ?1", [&key])
                .expect("operator delete")
        })
        .await
        .unwrap();
        assert_eq!(deleted, 1, "nothing to evict");
    }
}

baton_core::conformance_tests!(sqlite());
