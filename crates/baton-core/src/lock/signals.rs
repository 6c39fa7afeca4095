//! Release signals: how a waiter learns that a key may have become free.
//!
//! A [`ReleaseHub`] keeps one generation counter per key that somebody waits on. A waiter
//! [subscribes](ReleaseHub::subscribe) *before* its claim attempt, so a release that lands
//! between the attempt and the wait is never missed. Stores feed the hub: the memory and
//! SQLite stores on their own releases, the Redis store from pub/sub, the PostgreSQL store
//! from LISTEN/NOTIFY. A store that loses its push channel calls
//! [`ReleaseHub::notify_all`] so that waiters re-check rather than sleep through a gap.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;

pub use super::handoffs::{Handed, Handoffs};

use crate::holder::Holder;
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
    /// The holders that wait for each key ([`ReleaseHub::subscribe_as`]), counted.
    waiting: Arc<Mutex<Waiters>>,
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
            _waiting: None,
        }
    }

    /// [`subscribe`](ReleaseHub::subscribe), also recording that `holder` waits for `key`
    /// until the returned waiter is dropped ([`ReleaseHub::is_waiting`]): how a lock's
    /// waiter tells a store that hands released keys to waiting holders that it may be given
    /// this one.
    pub fn subscribe_as(&self, key: &StoreKey, holder: &Holder) -> ReleaseWaiter {
        let mut waiter = self.subscribe(key);
        *self
            .waiting
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(key.clone())
            .or_default()
            .entry(holder.clone())
            .or_default() += 1;
        waiter._waiting = Some(Waiting {
            holders: Arc::clone(&self.waiting),
            key: key.clone(),
            holder: holder.clone(),
        });
        waiter
    }

    /// Whether `holder` waits for `key` now (a waiter from [`ReleaseHub::subscribe_as`] is
    /// alive). Once it is false, the wait it was part of has ended.
    pub fn is_waiting(&self, key: &StoreKey, holder: &Holder) -> bool {
        self.waiting
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(key)
            .is_some_and(|holders| holders.contains_key(holder))
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
    /// The holder this subscription waits as, if any; counted out when it is dropped.
    _waiting: Option<Waiting>,
}

/// The waiting holders of each key, each with its number of live subscriptions.
type Waiters = HashMap<StoreKey, HashMap<Holder, usize>>;

/// A holder's place in [`ReleaseHub`]'s count of waiting holders.
#[derive(Debug)]
struct Waiting {
    holders: Arc<Mutex<Waiters>>,
    key: StoreKey,
    holder: Holder,
}

impl Drop for Waiting {
    fn drop(&mut self) {
        let mut waiters = self.holders.lock().unwrap_or_else(|p| p.into_inner());
        let Some(holders) = waiters.get_mut(&self.key) else {
            return;
        };
        if let Some(count) = holders.get_mut(&self.holder) {
            *count -= 1;
            if *count == 0 {
                holders.remove(&self.holder);
            }
        }
        if holders.is_empty() {
            waiters.remove(&self.key);
        }
    }
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
    fn a_holder_waits_until_its_subscription_is_dropped() {
        let hub = ReleaseHub::new();
        let (a, b) = (Holder::new("a").unwrap(), Holder::new("b").unwrap());
        let first = hub.subscribe_as(&key("k"), &a);
        let second = hub.subscribe_as(&key("k"), &a);
        let plain = hub.subscribe(&key("k"));
        assert!(hub.is_waiting(&key("k"), &a));
        assert!(!hub.is_waiting(&key("k"), &b), "another holder");
        assert!(!hub.is_waiting(&key("j"), &a), "another key");
        drop(first);
        assert!(hub.is_waiting(&key("k"), &a), "one subscription is left");
        drop(second);
        assert!(!hub.is_waiting(&key("k"), &a));
        assert!(
            hub.has_waiters(&key("k")),
            "the plain subscription still waits"
        );
        drop(plain);
        assert!(hub.waiting.lock().unwrap().is_empty());
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
