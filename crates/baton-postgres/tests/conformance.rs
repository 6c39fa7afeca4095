//! The conformance suite against the PostgreSQL store, on one private server per test
//! binary (every rule works in a fresh namespace).
//!
//! `reopen` is a new `PostgresStore` (new pool, new LISTEN connection) on the same
//! database; `evict` deletes the grant's row with a connection of its own, as an operator in
//! `psql` would (the fence sequence keeps the next grant's fence above it).

mod common;

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use baton_core::StoreKey;
use baton_core::conformance::Harness;
use baton_core::store::LeaseStore;
use baton_postgres::PostgresStore;

struct PostgresHarness {
    url: String,
    store: Mutex<Option<Arc<PostgresStore>>>,
}

async fn postgres() -> PostgresHarness {
    PostgresHarness {
        url: common::shared().await.url(),
        store: Mutex::new(None),
    }
}

#[async_trait]
impl Harness for PostgresHarness {
    async fn open(&self) -> Arc<dyn LeaseStore> {
        let existing = self.store.lock().unwrap().clone();
        match existing {
            Some(store) => store,
            None => {
                let store = Arc::new(common::connect(&self.url).await);
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
        let store = Arc::new(common::connect(&self.url).await);
        *self.store.lock().unwrap() = Some(store.clone());
        store
    }

    async fn evict(&self, key: &StoreKey) {
        let mut conn = common::raw(&self.url).await;
        let deleted = sqlx::query("DELETE FROM baton_lease WHERE key = $1")
            .bind(key.as_str())
            .execute(&mut conn)
            .await
            .expect("operator delete")
            .rows_affected();
        assert_eq!(deleted, 1, "nothing to evict at {key}");
    }
}

baton_core::conformance_tests!(postgres());
