//! The cache conformance rules against the in-memory store.

use std::sync::Arc;

use async_trait::async_trait;
use baton_core::cache::conformance::CacheHarness;
use baton_core::{CacheStore, MemoryStore};

struct MemoryHarness {
    store: Arc<MemoryStore>,
}

async fn memory() -> MemoryHarness {
    MemoryHarness {
        store: Arc::new(MemoryStore::new()),
    }
}

#[async_trait]
impl CacheHarness for MemoryHarness {
    async fn open(&self) -> Arc<dyn CacheStore> {
        self.store.clone()
    }
}

baton_core::cache_conformance_tests!(memory());
