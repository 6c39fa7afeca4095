//! The idempotency conformance rules against the in-memory store.

use std::sync::Arc;

use async_trait::async_trait;
use baton_core::MemoryStore;
use baton_core::idempotency::IdempotencyStore;
use baton_core::idempotency::conformance::IdempotencyHarness;

struct MemoryHarness {
    store: Arc<MemoryStore>,
}

async fn memory() -> MemoryHarness {
    MemoryHarness {
        store: Arc::new(MemoryStore::new()),
    }
}

#[async_trait]
impl IdempotencyHarness for MemoryHarness {
    async fn open(&self) -> Arc<dyn IdempotencyStore> {
        self.store.clone()
    }

    async fn reopen(&self) -> Option<Arc<dyn IdempotencyStore>> {
        None
    }
}

baton_core::idempotency_conformance_tests!(memory());
