//! The in-memory store's cache: values and their expiry in a map behind a mutex.
//!
//! Process-local: each replica has its own. Expiry follows the store's
//! [`Clock`](crate::time::Clock), so `tokio::time::pause` drives it in tests.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use tokio::time::Instant;

use super::store::CacheStore;
use crate::error::Result;
use crate::key::StoreKey;
use crate::memory::MemoryStore;
use crate::time::{Clock, Ttl};

/// How many writes pass between sweeps of expired values.
const SWEEP_EVERY: u64 = 1024;

/// The cache state of a [`MemoryStore`].
#[derive(Debug)]
pub(crate) struct MemoryCache {
    clock: Arc<dyn Clock>,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    values: HashMap<StoreKey, (Vec<u8>, Instant)>,
    writes: u64,
}

impl MemoryCache {
    pub(crate) fn new(clock: Arc<dyn Clock>) -> Self {
        MemoryCache {
            clock,
            state: Mutex::new(State::default()),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[async_trait]
impl CacheStore for MemoryStore {
    async fn get(&self, key: &StoreKey) -> Result<Option<Vec<u8>>> {
        let now = self.cache.clock.now();
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
        let now = self.cache.clock.now();
        let mut state = self.cache.state();
        state.writes += 1;
        if state.writes.is_multiple_of(SWEEP_EVERY) {
            state.values.retain(|_, (_, expires_at)| *expires_at > now);
        }
        state.values.insert(key.clone(), (value, now + ttl.get()));
        Ok(())
    }

    async fn delete(&self, key: &StoreKey) -> Result<bool> {
        let now = self.cache.clock.now();
        let mut state = self.cache.state();
        Ok(state
            .values
            .remove(key)
            .is_some_and(|(_, expires_at)| expires_at > now))
    }
}
