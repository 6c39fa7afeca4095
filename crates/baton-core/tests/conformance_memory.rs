//! The conformance suite against the in-memory store.

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use baton_core::MemoryStore;
use baton_core::StoreKey;
use baton_core::conformance::Harness;
use baton_core::store::LeaseStore;

struct MemoryHarness {
    store: Mutex<Arc<MemoryStore>>,
}

async fn memory() -> MemoryHarness {
    MemoryHarness {
        store: Mutex::new(Arc::new(MemoryStore::new())),
    }
}

#[async_trait]
impl Harness for MemoryHarness {
    async fn open(&self) -> Arc<dyn LeaseStore> {
        self.store.lock().unwrap().clone()
    }

    async fn reopen(&self) -> Arc<dyn LeaseStore> {
        let fresh = Arc::new(MemoryStore::new());
        *self.store.lock().unwrap() = fresh.clone();
        fresh
    }

    async fn evict(&self, key: &StoreKey) {
        let store = self.store.lock().unwrap().clone();
        assert!(store.evict(key), "nothing to evict at {key}");
    }
}

baton_core::conformance_tests!(memory());
