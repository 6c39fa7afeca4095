//! The in-memory store's cache: values and their expiry in a map behind a mutex.
//!
//! Process-local: each replica has its own. Expiry follows the store's
//! [`Clock`](crate::time::Clock), so `tokio::time::pause` drives it in tests.

use std::collections::HashMap;
use std::sync::Mutex;

use async_trait::async_trait;
use tokio::time::Instant;

use super::store::CacheStore;
use crate::error::Result;
use crate::key::StoreKey;
use crate::memory::{MemoryStore, Sweep};
use crate::time::Ttl;

/// The cache state of a [`MemoryStore`].
#[derive(Debug, Default)]
pub(crate) struct MemoryCache {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    values: HashMap<StoreKey, (Vec<u8>, Instant)>,
    sweep: Sweep,
}

impl MemoryCache {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[async_trait]
impl CacheStore for MemoryStore {
    async fn get(&self, key: &StoreKey) -> Result<Option<Vec<u8>>> {
        let now = self.clock.now();
        let mut state = self.cache.state();
        match state.values.get(key) {
            Some((value, expires_at)) if *expires_at > now => Ok(Some(value.clone())),
            Some(_) => {
                state.values.remove(key);
                Ok(None)
            }
            None => Ok(None),
        }
    }

    async fn set(&self, key: &StoreKey, value: Vec<u8>, ttl: Ttl) -> Result<()> {
        let now = self.clock.now();
        let mut state = self.cache.state();
        if state.sweep.due() {
            state.values.retain(|_, (_, expires_at)| *expires_at > now);
        }
        state.values.insert(key.clone(), (value, now + ttl.get()));
        Ok(())
    }

    async fn delete(&self, key: &StoreKey) -> Result<bool> {
        let now = self.clock.now();
        let mut state = self.cache.state();
        Ok(state
            .values
            .remove(key)
            .is_some_and(|(_, expires_at)| expires_at > now))
    }
}
