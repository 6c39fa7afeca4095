//! The claimable-work conformance rules against the in-memory store.

use std::sync::Arc;

use async_trait::async_trait;
use baton_core::MemoryStore;
use baton_core::work::WorkStore;
use baton_core::work::conformance::WorkHarness;

struct MemoryHarness {
    store: Arc<MemoryStore>,
}

async fn memory() -> MemoryHarness {
    MemoryHarness {
        store: Arc::new(MemoryStore::new()),
    }
}

#[async_trait]
impl WorkHarness for MemoryHarness {
    async fn open(&self) -> Arc<dyn WorkStore> {
        self.store.clone()
    }
}

baton_core::work_conformance_tests!(memory());
