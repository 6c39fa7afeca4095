//! The broadcast conformance rules against the in-memory store (an in-process bus).

use std::sync::Arc;

use async_trait::async_trait;
use baton_core::broadcast::conformance::BroadcastHarness;
use baton_core::{BroadcastStore, MemoryStore};

struct MemoryHarness {
    store: Arc<MemoryStore>,
}

async fn memory() -> MemoryHarness {
    MemoryHarness {
        store: Arc::new(MemoryStore::new()),
    }
}

#[async_trait]
impl BroadcastHarness for MemoryHarness {
    async fn open(&self) -> Arc<dyn BroadcastStore> {
        self.store.clone()
    }
}

baton_core::broadcast_conformance_tests!(memory());
