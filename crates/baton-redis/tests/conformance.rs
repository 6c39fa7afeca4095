//! The conformance suite against the Redis store, each test on its own private redis-server.
//!
//! `reopen` is a new `RedisStore` (new connections) on the same server; `evict` deletes the
//! grant and its fence counter with a raw connection, as an operator in `redis-cli` would.

mod common;

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use baton_core::StoreKey;
use baton_core::conformance::Harness;
use baton_core::store::LeaseStore;
use baton_redis::RedisStore;
use baton_testkit::redis::RedisServer;

struct RedisHarness {
    server: RedisServer,
    store: Mutex<Option<Arc<RedisStore>>>,
}

async fn redis() -> RedisHarness {
    RedisHarness {
        server: common::server().await,
        store: Mutex::new(None),
    }
}

#[async_trait]
impl Harness for RedisHarness {
    async fn open(&self) -> Arc<dyn LeaseStore> {
        let existing = self.store.lock().unwrap().clone();
        match existing {
            Some(store) => store,
            None => {
                let store = Arc::new(common::store(&self.server).await);
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
        let store = Arc::new(common::store(&self.server).await);
        *self.store.lock().unwrap() = Some(store.clone());
        store
    }

    async fn evict(&self, key: &StoreKey) {
        let grant = format!("{{{}}}", key.as_str());
        let counter = format!("{grant}:fence");
        let mut conn = common::raw(&self.server.url()).await;
        let deleted: i64 = redis::cmd("DEL")
            .arg(&grant)
            .arg(&counter)
            .query_async(&mut conn)
            .await
            .expect("operator DEL");
        assert!(deleted >= 1, "nothing to evict at {grant}");
    }
}

baton_core::conformance_tests!(redis());
