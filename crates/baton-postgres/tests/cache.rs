//! The cache on the PostgreSQL store (an UNLOGGED table): the conformance rules, on the test
//! binary's shared server, each rule in a namespace of its own.

mod common;

use std::sync::Arc;

use async_trait::async_trait;
use baton_core::CacheStore;
use baton_core::cache::conformance::CacheHarness;
use baton_postgres::PostgresStore;
use tokio::sync::OnceCell;

use common::*;

struct PostgresHarness {
    store: OnceCell<Arc<PostgresStore>>,
}

async fn postgres() -> PostgresHarness {
    PostgresHarness {
        store: OnceCell::new(),
    }
}

#[async_trait]
impl CacheHarness for PostgresHarness {
    async fn open(&self) -> Arc<dyn CacheStore> {
        self.store
            .get_or_init(|| async { Arc::new(connect(&shared().await.url()).await) })
            .await
            .clone()
    }
}

baton_core::cache_conformance_tests!(postgres());
