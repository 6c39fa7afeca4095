//! Every capability of the PostgreSQL store through PgBouncer in transaction pooling mode
//! (`pool_mode = transaction`), where a server connection belongs to a client for one
//! transaction only: the lock and lease conformance rules, the limiter, the cache, the
//! idempotency log and claimable work (queue, scheduler, migrations), each rule in a fresh
//! namespace, on one private pooler in front of the test binary's shared server.
//!
//! Stores are opened with `pooler=transaction` and no `listen_url`, so waiters poll; the
//! wake-ups through a direct `listen_url` have tests of their own in `pooler_limits.rs`.
//! Operator actions (`evict`) go straight to the server, as an operator's `psql` would.

mod common;

mod locks {
    use std::sync::{Arc, Mutex};

    use async_trait::async_trait;
    use baton_core::StoreKey;
    use baton_core::conformance::Harness;
    use baton_core::store::LeaseStore;
    use baton_postgres::PostgresStore;

    use super::common;

    struct PooledHarness {
        store: Mutex<Option<Arc<PostgresStore>>>,
    }

    async fn pooled() -> PooledHarness {
        PooledHarness {
            store: Mutex::new(None),
        }
    }

    #[async_trait]
    impl Harness for PooledHarness {
        async fn open(&self) -> Arc<dyn LeaseStore> {
            let existing = self.store.lock().unwrap().clone();
            match existing {
                Some(store) => store,
                None => {
                    let store = Arc::new(common::pooled().await);
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
            let store = Arc::new(common::pooled().await);
            *self.store.lock().unwrap() = Some(store.clone());
            store
        }

        async fn evict(&self, key: &StoreKey) {
            let mut conn = common::raw(&common::shared().await.url()).await;
            let deleted = sqlx::query("DELETE FROM baton_lease WHERE key = $1")
                .bind(key.as_str())
                .execute(&mut conn)
                .await
                .expect("operator delete")
                .rows_affected();
            assert_eq!(deleted, 1, "nothing to evict at {key}");
        }
    }

    baton_core::conformance_tests!(pooled());
}

mod limit {
    use std::sync::Arc;

    use async_trait::async_trait;
    use baton_core::RateStore;
    use baton_core::limit::conformance::LimitHarness;
    use baton_postgres::PostgresStore;
    use tokio::sync::OnceCell;

    use super::common;

    struct PooledHarness {
        store: OnceCell<Arc<PostgresStore>>,
    }

    async fn pooled() -> PooledHarness {
        PooledHarness {
            store: OnceCell::new(),
        }
    }

    #[async_trait]
    impl LimitHarness for PooledHarness {
        async fn open(&self) -> Arc<dyn RateStore> {
            self.store
                .get_or_init(|| async { Arc::new(common::pooled().await) })
                .await
                .clone()
        }
    }

    baton_core::rate_limit_conformance_tests!(pooled());
}

mod cache {
    use std::sync::Arc;

    use async_trait::async_trait;
    use baton_core::CacheStore;
    use baton_core::cache::conformance::CacheHarness;
    use baton_postgres::PostgresStore;
    use tokio::sync::OnceCell;

    use super::common;

    struct PooledHarness {
        store: OnceCell<Arc<PostgresStore>>,
    }

    async fn pooled() -> PooledHarness {
        PooledHarness {
            store: OnceCell::new(),
        }
    }

    #[async_trait]
    impl CacheHarness for PooledHarness {
        async fn open(&self) -> Arc<dyn CacheStore> {
            self.store
                .get_or_init(|| async { Arc::new(common::pooled().await) })
                .await
                .clone()
        }
    }

    baton_core::cache_conformance_tests!(pooled());
}

mod idempotency {
    use std::sync::{Arc, Mutex};

    use async_trait::async_trait;
    use baton_core::idempotency::IdempotencyStore;
    use baton_core::idempotency::conformance::IdempotencyHarness;
    use baton_postgres::PostgresStore;

    use super::common;

    struct PooledHarness {
        store: Mutex<Option<Arc<PostgresStore>>>,
    }

    async fn pooled() -> PooledHarness {
        PooledHarness {
            store: Mutex::new(None),
        }
    }

    #[async_trait]
    impl IdempotencyHarness for PooledHarness {
        async fn open(&self) -> Arc<dyn IdempotencyStore> {
            let existing = self.store.lock().unwrap().clone();
            match existing {
                Some(store) => store,
                None => {
                    let store = Arc::new(common::pooled().await);
                    self.store.lock().unwrap().get_or_insert(store).clone()
                }
            }
        }

        async fn reopen(&self) -> Option<Arc<dyn IdempotencyStore>> {
            drop(self.store.lock().unwrap().take());
            let store = Arc::new(common::pooled().await);
            *self.store.lock().unwrap() = Some(store.clone());
            Some(store)
        }
    }

    baton_core::idempotency_conformance_tests!(pooled());
}

mod work {
    use std::sync::Arc;

    use async_trait::async_trait;
    use baton_core::work::conformance::WorkHarness;
    use baton_core::work::store::WorkStore;

    use super::common;

    /// Every `open` is a new store (its own pool), as another replica would be.
    struct PooledHarness;

    #[async_trait]
    impl WorkHarness for PooledHarness {
        async fn open(&self) -> Arc<dyn WorkStore> {
            Arc::new(common::pooled().await)
        }
    }

    async fn pooled() -> PooledHarness {
        PooledHarness
    }

    baton_core::work_conformance_tests!(pooled());
}
