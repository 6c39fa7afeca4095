//! The in-memory store's broadcast: an in-process bus.
//!
//! Messages reach the subscriptions made through the same [`MemoryStore`] in this process,
//! and no other. There is no connection to lose, so there are no gaps; a slow subscriber
//! still lags (its buffer is bounded).

use std::sync::Arc;

use async_trait::async_trait;

use super::delivery::Fanout;
use super::store::{BroadcastStore, RawSubscription};
use crate::error::Result;
use crate::key::StoreKey;
use crate::memory::MemoryStore;

/// The broadcast state of a [`MemoryStore`].
#[derive(Debug, Default)]
pub(crate) struct MemoryBus {
    fanout: Arc<Fanout>,
}

#[async_trait]
impl BroadcastStore for MemoryStore {
    async fn publish(&self, channel: &StoreKey, payload: Vec<u8>) -> Result<()> {
        self.bus.fanout.deliver(channel.as_str(), &payload);
        Ok(())
    }

    async fn subscribe(&self, channel: &StoreKey, capacity: usize) -> Result<RawSubscription> {
        Ok(self.bus.fanout.subscribe(channel.as_str(), capacity).0)
    }
}
