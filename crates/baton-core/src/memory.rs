//! The in-memory store: exact-key, process-local, TTL-honouring.
//!
//! Use it in tests, and in a single-process tool that needs no persistence. One
//! [`MemoryStore`] carries every capability (locks and leases here; rate limits, cache,
//! broadcast, idempotency records and claimable work in their modules' `memory.rs`, each
//! with its state in a field of the store), so every client made from one store sees the
//! same data and another store sees none of it.
//!
//! It coordinates only tasks of *this* process: the first write through a store (a grant, a
//! rate decision, a record, a queued item...) emits
//! [`baton.store.process_local`](crate::telemetry::events::STORE_PROCESS_LOCAL) once, naming
//! the degradation and the fix, so a multi-replica deployment that fell back to it is visible.
//!
//! ## Behavior
//! - Expiry is decided by the store's [`Clock`] (tokio's monotonic clock by default), so
//!   `tokio::time::pause` drives it in tests.
//! - Fences come from one counter per store seeded from the wall clock in microseconds, so
//!   they strictly increase per key, also across a store that is dropped and created again
//!   in the same process (as long as the wall clock does not step back).
//! - Releases wake waiters in this process at once.
//! - Expired entries are dropped when touched, and every capability sweeps its map once in
//!   [`SWEEP_EVERY`] operations.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use tokio::time::Instant;

use crate::broadcast::BroadcastStore;
use crate::cache::CacheStore;
use crate::error::Result;
use crate::fence::Fence;
use crate::holder::Holder;
use crate::idempotency::IdempotencyStore;
use crate::key::StoreKey;
use crate::limit::RateStore;
use crate::signals::ReleaseHub;
use crate::store::{Claim, HolderInfo, LeaseStore, Release, Renewal, Store, Wakeups};
use crate::telemetry::{self, events};
use crate::time::{Clock, SystemClock, Ttl};
use crate::work::WorkStore;

/// What the first grant says about the memory store's reach.
const PROCESS_LOCAL: &str = "the in-memory store excludes only within this process; use sqlite://, redis:// or postgres:// to exclude across processes";

/// How many operations on one capability's map pass between sweeps of its expired entries.
pub(crate) const SWEEP_EVERY: u64 = 1024;

/// The operation counter of one map, saying when it is due for a sweep of expired entries.
#[derive(Debug, Default)]
pub(crate) struct Sweep {
    ops: u64,
}

impl Sweep {
    /// Counts one operation; true once in [`SWEEP_EVERY`].
    pub(crate) fn due(&mut self) -> bool {
        self.ops += 1;
        self.ops.is_multiple_of(SWEEP_EVERY)
    }
}

/// A process-local store offering every capability of baton: the one to use in tests.
///
/// Locks and leases ([`LeaseStore`]), rate limits, the cache, broadcast (an in-process
/// bus), idempotency records and claimable work all live in this value; clone the `Arc` to
/// share them.
#[derive(Debug)]
pub struct MemoryStore {
    state: Mutex<State>,
    pub(crate) clock: Arc<dyn Clock>,
    hub: Arc<ReleaseHub>,
    warned: AtomicBool,
    /// The state of the other capabilities: see their modules' `memory.rs`.
    pub(crate) limits: crate::limit::MemoryLimits,
    pub(crate) cache: crate::cache::MemoryCache,
    pub(crate) bus: crate::broadcast::MemoryBus,
    pub(crate) records: crate::idempotency::MemoryRecords,
    pub(crate) work: crate::work::MemoryWork,
}

#[derive(Debug, Default)]
struct State {
    grants: HashMap<StoreKey, Grant>,
    last_fence: u64,
    sweep: Sweep,
}

#[derive(Debug)]
struct Grant {
    holder: Holder,
    fence: u64,
    expires_at: Instant,
    reason: String,
}

impl State {
    /// The live grant of `key`, dropping it first if it expired.
    fn live(&mut self, key: &StoreKey, now: Instant) -> Option<&mut Grant> {
        if self.sweep.due() {
            self.grants.retain(|_, g| g.expires_at > now);
        }
        if self.grants.get(key).is_some_and(|g| g.expires_at <= now) {
            self.grants.remove(key);
        }
        self.grants.get_mut(key)
    }

    fn next_fence(&mut self) -> u64 {
        let wall_us = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_micros() as u64)
            .unwrap_or(0);
        self.last_fence = (self.last_fence + 1).max(wall_us);
        self.last_fence
    }
}

impl MemoryStore {
    /// A store on tokio's clock.
    pub fn new() -> Self {
        MemoryStore::with_clock(Arc::new(SystemClock))
    }

    /// A store whose expiry follows `clock`.
    pub fn with_clock(clock: Arc<dyn Clock>) -> Self {
        MemoryStore {
            state: Mutex::new(State::default()),
            limits: crate::limit::MemoryLimits::new(clock.as_ref()),
            cache: crate::cache::MemoryCache::default(),
            bus: crate::broadcast::MemoryBus::default(),
            records: crate::idempotency::MemoryRecords::default(),
            work: crate::work::MemoryWork::new(clock.as_ref()),
            clock,
            hub: Arc::new(ReleaseHub::new()),
            warned: AtomicBool::new(false),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Removes the grant of `key` regardless of its holder, as an operator breaking a stuck
    /// lock would. Its holder learns of it at its next renewal. Returns whether a live grant
    /// was removed.
    pub fn evict(&self, key: &StoreKey) -> bool {
        let now = self.clock.now();
        let removed = {
            let mut state = self.state();
            state.live(key, now).is_some() && state.grants.remove(key).is_some()
        };
        if removed {
            self.hub.notify(key);
        }
        removed
    }

    /// Emits [`baton.store.process_local`](events::STORE_PROCESS_LOCAL) with `message` at the
    /// first write through this store, whichever capability makes it; later calls do nothing.
    pub(crate) fn warn_once(&self, key: &StoreKey, message: &str) {
        if !self.warned.swap(true, Ordering::Relaxed) {
            telemetry::emit(
                &events::STORE_PROCESS_LOCAL,
                Some(key.as_str()),
                format_args!("{message}"),
            );
        }
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        MemoryStore::new()
    }
}

fn remaining(expires_at: Instant, now: Instant) -> Duration {
    expires_at.saturating_duration_since(now)
}

#[async_trait]
impl LeaseStore for MemoryStore {
    async fn claim(
        &self,
        key: &StoreKey,
        holder: &Holder,
        ttl: Ttl,
        reason: &str,
    ) -> Result<Claim> {
        let now = self.clock.now();
        let claim = {
            let mut state = self.state();
            match state.live(key, now) {
                Some(grant) if grant.holder == *holder => {
                    grant.expires_at = now + ttl.get();
                    grant.reason = reason.to_owned();
                    Claim::Extended {
                        fence: Fence::new(grant.fence),
                    }
                }
                Some(grant) => Claim::Held {
                    holder: grant.holder.clone(),
                    remaining: remaining(grant.expires_at, now),
                },
                None => {
                    let fence = state.next_fence();
                    state.grants.insert(
                        key.clone(),
                        Grant {
                            holder: holder.clone(),
                            fence,
                            expires_at: now + ttl.get(),
                            reason: reason.to_owned(),
                        },
                    );
                    Claim::Granted {
                        fence: Fence::new(fence),
                    }
                }
            }
        };
        if matches!(claim, Claim::Granted { .. }) {
            self.warn_once(key, PROCESS_LOCAL);
        }
        Ok(claim)
    }

    async fn renew(&self, key: &StoreKey, holder: &Holder, ttl: Ttl) -> Result<Renewal> {
        let now = self.clock.now();
        let mut state = self.state();
        Ok(match state.live(key, now) {
            Some(grant) if grant.holder == *holder => {
                grant.expires_at = now + ttl.get();
                Renewal::Renewed
            }
            _ => Renewal::NotHeld,
        })
    }

    async fn release(&self, key: &StoreKey, holder: &Holder) -> Result<Release> {
        let now = self.clock.now();
        let release = {
            let mut state = self.state();
            match state.live(key, now) {
                Some(grant) if grant.holder == *holder => {
                    state.grants.remove(key);
                    Release::Removed
                }
                Some(grant) => Release::Reclaimed {
                    by: grant.holder.clone(),
                },
                None => Release::NoHolder,
            }
        };
        if release == Release::Removed {
            self.hub.notify(key);
        }
        Ok(release)
    }

    async fn inspect(&self, key: &StoreKey) -> Result<Option<HolderInfo>> {
        let now = self.clock.now();
        let mut state = self.state();
        Ok(state.live(key, now).map(|g| HolderInfo {
            key: key.clone(),
            holder: g.holder.clone(),
            fence: Fence::new(g.fence),
            remaining: remaining(g.expires_at, now),
            reason: g.reason.clone(),
        }))
    }

    async fn list(&self, prefix: &str, limit: usize) -> Result<Vec<HolderInfo>> {
        let now = self.clock.now();
        let state = self.state();
        let mut found: Vec<HolderInfo> = state
            .grants
            .iter()
            .filter(|(k, g)| k.as_str().starts_with(prefix) && g.expires_at > now)
            .map(|(k, g)| HolderInfo {
                key: k.clone(),
                holder: g.holder.clone(),
                fence: Fence::new(g.fence),
                remaining: remaining(g.expires_at, now),
                reason: g.reason.clone(),
            })
            .collect();
        found.sort_by(|a, b| a.key.cmp(&b.key));
        found.truncate(limit);
        Ok(found)
    }

    fn wakeups(&self) -> Wakeups {
        Wakeups {
            hub: Arc::clone(&self.hub),
            poll: None,
        }
    }
}

impl Store for MemoryStore {
    fn name(&self) -> &'static str {
        "memory"
    }

    fn rate_store(self: Arc<Self>) -> Result<Arc<dyn RateStore>> {
        Ok(self)
    }

    fn cache_store(self: Arc<Self>) -> Result<Arc<dyn CacheStore>> {
        Ok(self)
    }

    fn broadcast_store(self: Arc<Self>) -> Result<Arc<dyn BroadcastStore>> {
        Ok(self)
    }

    fn idempotency_store(self: Arc<Self>) -> Result<Arc<dyn IdempotencyStore>> {
        Ok(self)
    }

    fn work_store(self: Arc<Self>) -> Result<Arc<dyn WorkStore>> {
        Ok(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::{Key, KeyKind, Namespace};
    use crate::limit::Quota;

    fn key(kind: KeyKind, name: &str) -> StoreKey {
        Namespace::default().qualify(kind, &Key::new(name).unwrap())
    }

    fn warned_about(key: &StoreKey) -> Vec<String> {
        telemetry::recent_events()
            .into_iter()
            .filter(|e| e.event.key == events::STORE_PROCESS_LOCAL.key && e.key == key.as_str())
            .map(|e| e.detail)
            .collect()
    }

    /// One store warns once, at its first write, whichever capability makes it.
    #[tokio::test]
    async fn the_process_local_warning_is_once_per_store() {
        let tag = Holder::random();
        let rate = key(KeyKind::Limit, &format!("warn-rate-{tag}"));
        let lock = key(KeyKind::Lock, &format!("warn-lock-{tag}"));
        let store = MemoryStore::new();
        let quota = Quota::new(1, Duration::from_secs(1)).unwrap();
        assert!(store.admit(&rate, 1, quota).await.unwrap().allowed);
        let ttl = Ttl::new(Duration::from_secs(1)).unwrap();
        store.claim(&lock, &tag, ttl, "").await.unwrap();
        let said = warned_about(&rate);
        assert_eq!(said.len(), 1, "{said:?}");
        assert!(
            said[0].contains("limits rates only within this process"),
            "{said:?}"
        );
        assert!(warned_about(&lock).is_empty(), "the same store warns once");

        let other = MemoryStore::new();
        let again = key(KeyKind::Lock, &format!("warn-other-{tag}"));
        other.claim(&again, &tag, ttl, "").await.unwrap();
        assert_eq!(warned_about(&again).len(), 1, "another store warns again");
    }
}
