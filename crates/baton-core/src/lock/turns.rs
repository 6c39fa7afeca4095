//! Per-key FIFO queues of the waiters in this process.
//!
//! Only the waiter at the head of a key's queue talks to the store; the others wait their
//! turn locally. A release therefore wakes one waiter per process instead of a herd, and
//! tokio's fair mutex makes the order first come, first served.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::{Mutex as AsyncMutex, OwnedMutexGuard};

use crate::key::StoreKey;

#[derive(Debug, Default)]
pub(super) struct Turns {
    queues: Mutex<HashMap<StoreKey, Arc<AsyncMutex<()>>>>,
}

/// The head position of one key's queue; dropping it lets the next waiter in.
pub(super) struct Turn<'a> {
    guard: Option<OwnedMutexGuard<()>>,
    turns: &'a Turns,
    key: StoreKey,
}

impl Turns {
    pub(super) async fn take(&self, key: &StoreKey) -> Turn<'_> {
        let queue = {
            let mut queues = self.queues.lock().unwrap_or_else(|p| p.into_inner());
            Arc::clone(queues.entry(key.clone()).or_default())
        };
        // If this future is dropped while queued, the Arc is dropped with it; the entry is
        // cleaned up by the next Turn that leaves.
        let guard = queue.lock_owned().await;
        Turn {
            guard: Some(guard),
            turns: self,
            key: key.clone(),
        }
    }
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        drop(self.guard.take());
        let mut queues = self.turns.queues.lock().unwrap_or_else(|p| p.into_inner());
        // Only the map holds the queue: nobody is waiting, forget it.
        if queues
            .get(&self.key)
            .is_some_and(|q| Arc::strong_count(q) == 1)
        {
            queues.remove(&self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn queue_entries_are_forgotten_when_idle() {
        let turns = Turns::default();
        let key = StoreKey::from_stored("ns:lock:a".into());
        {
            let _t = turns.take(&key).await;
            assert_eq!(turns.queues.lock().unwrap().len(), 1);
        }
        assert!(turns.queues.lock().unwrap().is_empty());
    }
}
