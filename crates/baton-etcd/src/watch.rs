//! Wake-ups on etcd: a watch on each key that a waiter of this process waits for.
//!
//! When a claim answers `Held`, the store makes sure a watch runs on that key from the
//! revision just after the one the claim read. The waiter subscribed
//! to the store's [`ReleaseHub`] before its claim, so every delete after the claim's read —
//! a release by any process, or the cluster expiring the holder's lease — reaches it: etcd
//! replays the events from that revision even when the watch is set up a little later.
//!
//! ## Behavior
//! - A watch lives while some waiter of this process waits for its key (checked after each
//!   event and every [`IDLE_CHECK`]), and stops with the store.
//! - A watch that fails (its member died, the start revision was compacted, the cluster
//!   cancelled it) wakes the key's waiters, which claim again: a `Held` answer starts a new
//!   watch, a fault is the lock policy's to ride out. No delete is missed in between,
//!   because the new watch starts after the new claim's read.
//! - Every waiting process watches for itself, so a release wakes one waiter per process
//!   that waits for the key, not one waiter in the cluster (etcd's own lock recipe waits on
//!   its predecessor's key instead; baton does not yet).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use baton_core::signals::ReleaseHub;
use baton_core::{CancellationToken, StoreKey};
use etcd_client::{WatchClient, WatchFilterType, WatchOptions};

/// How often a watch with no events checks whether anybody still waits for its key.
pub const IDLE_CHECK: Duration = Duration::from_secs(1);

/// What a watch covers.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Range {
    /// The waited key itself (a lock's or lease's grant).
    Key,
    /// The permits of the waited key (a semaphore's), the keys under its prefix.
    Permits,
}

/// The watches of one store.
#[derive(Debug, Default)]
struct Active {
    keys: HashMap<StoreKey, u64>,
    last: u64,
}

impl Active {
    /// Forgets watch `id` of `key`, unless a newer watch took its place.
    fn remove(&mut self, key: &StoreKey, id: u64) {
        if self.keys.get(key) == Some(&id) {
            self.keys.remove(key);
        }
    }
}

pub(crate) struct Watches {
    client: WatchClient,
    hub: Arc<ReleaseHub>,
    /// The keys watched now, each with its watch's number.
    active: Mutex<Active>,
    stopped: CancellationToken,
}

impl std::fmt::Debug for Watches {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watches")
            .field("keys", &self.active().keys.len())
            .finish_non_exhaustive()
    }
}

impl Watches {
    pub(crate) fn new(client: WatchClient, hub: Arc<ReleaseHub>) -> Arc<Watches> {
        Arc::new(Watches {
            client,
            hub,
            active: Mutex::new(Active::default()),
            stopped: CancellationToken::new(),
        })
    }

    fn active(&self) -> MutexGuard<'_, Active> {
        self.active.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Makes sure `key` is watched for deletes from `revision` on (a watch already running
    /// started earlier, so it sees them too). Must be called within a Tokio runtime.
    pub(crate) fn ensure(self: &Arc<Self>, key: &StoreKey, revision: i64) {
        self.ensure_range(key, Range::Key, revision);
    }

    /// Makes sure `range` is watched for deletes from `revision` on, waking the waiters for
    /// `key` (a semaphore's key, whose permits are the keys under its prefix).
    pub(crate) fn ensure_range(self: &Arc<Self>, key: &StoreKey, range: Range, revision: i64) {
        if self.stopped.is_cancelled() {
            return;
        }
        let id = {
            let mut active = self.active();
            if active.keys.contains_key(key) {
                return;
            }
            active.last += 1;
            let id = active.last;
            active.keys.insert(key.clone(), id);
            id
        };
        let watches = Arc::clone(self);
        let key = key.clone();
        tokio::spawn(async move {
            tokio::select! {
                () = watches.run(&key, range, id, revision) => {}
                () = watches.stopped.cancelled() => {}
            }
            watches.active().remove(&key, id);
            // Waiters re-check: a watch that ended for any reason may have missed a delete.
            watches.hub.notify(&key);
        });
    }

    /// Stops every watch.
    pub(crate) fn stop(&self) {
        self.stopped.cancel();
    }

    /// Watches `range` from `revision`, waking the waiters for `key`, until nobody waits for
    /// it or the watch fails.
    async fn run(&self, key: &StoreKey, range: Range, id: u64, revision: i64) {
        let options = WatchOptions::new()
            .with_start_revision(revision)
            .with_filters([WatchFilterType::NoPut]);
        let (watched, options) = match range {
            Range::Key => (key.as_str().to_owned(), options),
            Range::Permits => (crate::permits::prefix(key), options.with_prefix()),
        };
        let mut client = self.client.clone();
        let Ok(mut stream) = client.watch(watched, Some(options)).await else {
            return;
        };
        loop {
            match tokio::time::timeout(IDLE_CHECK, stream.message()).await {
                Ok(Ok(Some(answer))) => {
                    if answer.canceled() {
                        return;
                    }
                    if !answer.events().is_empty() {
                        self.hub.notify(key);
                    }
                }
                // The stream ended or failed.
                Ok(Ok(None) | Err(_)) => return,
                Err(_idle) => {}
            }
            // Leave only while holding the map's lock, so that a claim that finds this
            // watch running never relies on one that is leaving.
            let mut active = self.active();
            if !self.hub.has_waiters(key) {
                active.remove(key, id);
                return;
            }
        }
    }
}
