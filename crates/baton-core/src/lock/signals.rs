//! Release signals: how a waiter learns that a key may have become free.
//!
//! A [`ReleaseHub`] keeps one generation counter per key that somebody waits on. A waiter
//! [subscribes](ReleaseHub::subscribe) *before* its claim attempt, so a release that lands
//! between the attempt and the wait is never missed. Stores feed the hub: the memory and
//! SQLite stores on their own releases, the Redis store from pub/sub, the PostgreSQL store
//! from LISTEN/NOTIFY. A store that loses its push channel calls
//! [`ReleaseHub::notify_all`] so that waiters re-check rather than sleep through a gap.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::watch;

use crate::key::StoreKey;

/// How long a released key stays reserved for the waiter (store or process) whose turn it
/// is, on stores that queue their waiters across processes (Redis, SQLite). Only that
/// waiter's claims take the key meanwhile; one that does not claim in time (paused,
/// partitioned, killed after it was told) loses its turn.
pub const HANDOFF_RESERVATION: Duration = Duration::from_millis(250);

/// How much later than a reservation's end the waiter next in line looks again, so that
/// on the store that end has passed.
pub const WATCH_SLACK: Duration = Duration::from_millis(10);

/// Per-key release notifications within one process.
#[derive(Debug, Default)]
pub struct ReleaseHub {
    keys: Mutex<HashMap<StoreKey, watch::Sender<u64>>>,
}

impl ReleaseHub {
    /// An empty hub.
    pub fn new() -> Self {
        ReleaseHub::default()
    }

    /// Starts listening for releases of `key`. Only releases after this call wake the
    /// returned waiter.
    pub fn subscribe(&self, key: &StoreKey) -> ReleaseWaiter {
        let mut keys = self.keys.lock().unwrap_or_else(|p| p.into_inner());
        let sender = keys
            .entry(key.clone())
            .or_insert_with(|| watch::channel(0).0);
        ReleaseWaiter {
            receiver: sender.subscribe(),
        }
    }

    /// Signals that `key` may be free. Cheap when nobody waits on it.
    pub fn notify(&self, key: &StoreKey) {
        let mut keys = self.keys.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(sender) = keys.get(key) {
            if sender.receiver_count() == 0 {
                keys.remove(key);
            } else {
                sender.send_modify(|generation| *generation += 1);
            }
        }
    }

    /// Signals every key: used when a push channel was lost and releases may have been missed.
    pub fn notify_all(&self) {
        let mut keys = self.keys.lock().unwrap_or_else(|p| p.into_inner());
        keys.retain(|_, sender| sender.receiver_count() > 0);
        for sender in keys.values() {
            sender.send_modify(|generation| *generation += 1);
        }
    }

    /// Whether anybody in this process waits on `key`.
    pub fn has_waiters(&self, key: &StoreKey) -> bool {
        let keys = self.keys.lock().unwrap_or_else(|p| p.into_inner());
        keys.get(key).is_some_and(|s| s.receiver_count() > 0)
    }

    /// Keys somebody waits on, for stores that subscribe per key.
    pub fn watched_keys(&self) -> Vec<StoreKey> {
        let keys = self.keys.lock().unwrap_or_else(|p| p.into_inner());
        keys.iter()
            .filter(|(_, s)| s.receiver_count() > 0)
            .map(|(k, _)| k.clone())
            .collect()
    }
}

/// One subscription to one key's releases.
#[derive(Debug)]
pub struct ReleaseWaiter {
    receiver: watch::Receiver<u64>,
}

impl ReleaseWaiter {
    /// Resolves at the first release signalled after the subscription (or after the last
    /// time this resolved).
    ///
    /// # Cancel safety
    /// Cancel safe: a signal that arrives while nobody awaits is kept for the next call.
    pub async fn released(&mut self) {
        // The sender lives in the hub for as long as a receiver exists, so `changed` only
        // errors if the hub itself was dropped; then nothing will ever signal, and waiters
        // fall back to their timers.
        if self.receiver.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn key(s: &str) -> StoreKey {
        StoreKey::from_stored(s.to_owned())
    }

    #[tokio::test]
    async fn signal_after_subscribe_is_seen_even_before_awaiting() {
        let hub = ReleaseHub::new();
        let mut waiter = hub.subscribe(&key("a"));
        hub.notify(&key("a"));
        tokio::time::timeout(Duration::from_secs(1), waiter.released())
            .await
            .expect("a release between subscribe and wait must not be missed");
    }

    #[tokio::test(start_paused = true)]
    async fn other_keys_do_not_wake() {
        let hub = ReleaseHub::new();
        let mut waiter = hub.subscribe(&key("a"));
        hub.notify(&key("b"));
        assert!(
            tokio::time::timeout(Duration::from_secs(1), waiter.released())
                .await
                .is_err()
        );
        hub.notify_all();
        tokio::time::timeout(Duration::from_secs(1), waiter.released())
            .await
            .unwrap();
    }

    #[test]
    fn entries_are_dropped_when_nobody_waits() {
        let hub = ReleaseHub::new();
        let waiter = hub.subscribe(&key("a"));
        assert!(hub.has_waiters(&key("a")));
        drop(waiter);
        hub.notify(&key("a"));
        assert!(hub.keys.lock().unwrap().is_empty());
    }
}
