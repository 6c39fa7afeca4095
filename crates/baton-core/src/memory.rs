//! The in-memory store: exact-key, process-local, TTL-honouring.
//!
//! Use it in tests, and in a single-process tool that needs no persistence. It excludes
//! only tasks of *this* process: the first grant made through a store emits
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

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use tokio::time::Instant;

use crate::error::Result;
use crate::fence::Fence;
use crate::holder::Holder;
use crate::key::StoreKey;
use crate::signals::ReleaseHub;
use crate::store::{Claim, HolderInfo, LeaseStore, Release, Renewal, Wakeups};
use crate::telemetry::{self, events};
use crate::time::{Clock, SystemClock, Ttl};

/// How many operations pass between sweeps of expired entries.
const SWEEP_EVERY: u64 = 1024;

/// A process-local [`LeaseStore`].
#[derive(Debug)]
pub struct MemoryStore {
    state: Mutex<State>,
    clock: Arc<dyn Clock>,
    hub: Arc<ReleaseHub>,
    warned: AtomicBool,
    /// Rate limits, cache and broadcast bus: see their modules' `memory.rs`.
    pub(crate) limits: crate::limit::MemoryLimits,
    pub(crate) cache: crate::cache::MemoryCache,
    pub(crate) bus: crate::broadcast::MemoryBus,
}

#[derive(Debug, Default)]
struct State {
    grants: HashMap<StoreKey, Grant>,
    last_fence: u64,
    ops: u64,
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
        self.ops += 1;
        if self.ops.is_multiple_of(SWEEP_EVERY) {
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
            limits: crate::limit::MemoryLimits::new(Arc::clone(&clock)),
            cache: crate::cache::MemoryCache::new(Arc::clone(&clock)),
            bus: crate::broadcast::MemoryBus::default(),
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

    fn warn_once(&self, key: &StoreKey) {
        if !self.warned.swap(true, Ordering::Relaxed) {
            telemetry::emit(
                &events::STORE_PROCESS_LOCAL,
                Some(key.as_str()),
                format_args!(
                    "the in-memory store excludes only within this process; use sqlite://, redis:// or postgres:// to exclude across processes"
                ),
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
            self.warn_once(key);
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
