//! Locks and leases on the [`MemoryStore`]: one grant per key, expiry on the store's clock,
//! fences from one counter per store seeded from the wall clock in microseconds.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use crate::error::Result;
use crate::fence::Fence;
use crate::holder::Holder;
use crate::key::StoreKey;
use crate::memory::{MemoryStore, Sweep};
use crate::store::{Claim, HolderInfo, LeaseRequest, LeaseStore, Release, Renewal, Wakeups};
use crate::time::Ttl;

/// What the first grant says about the memory store's reach.
const PROCESS_LOCAL: &str = "the in-memory store excludes only within this process; use sqlite://, redis:// or postgres:// to exclude across processes";

/// The grants of one memory store.
#[derive(Debug, Default)]
pub(crate) struct MemoryLeases {
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

impl MemoryLeases {
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
        crate::memory::next_fence(&mut self.last_fence)
    }
}

impl MemoryStore {
    fn state(&self) -> std::sync::MutexGuard<'_, MemoryLeases> {
        self.leases.lock().unwrap_or_else(|p| p.into_inner())
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
}

pub(crate) fn remaining(expires_at: Instant, now: Instant) -> Duration {
    expires_at.saturating_duration_since(now)
}

#[async_trait]
impl LeaseStore for MemoryStore {
    async fn claim(&self, key: &StoreKey, request: LeaseRequest<'_>) -> Result<Claim> {
        let (holder, ttl, reason) = (request.holder, request.ttl, request.reason);
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
