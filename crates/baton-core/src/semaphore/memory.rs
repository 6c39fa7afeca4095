//! Semaphores on the [`MemoryStore`]: the live permits of each key, expiry on the store's
//! clock, fences from one counter per store.

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use tokio::time::Instant;

use super::{PermitInfo, SemaphoreStore};
use crate::error::Result;
use crate::fence::Fence;
use crate::holder::Holder;
use crate::key::StoreKey;
use crate::lease::memory::remaining;
use crate::memory::{MemoryStore, Sweep, next_fence};
use crate::store::{Claim, HolderInfo, LeaseRequest, Release, Renewal, Wakeups};
use crate::time::Ttl;

/// What the first permit says about the memory store's reach.
const PROCESS_LOCAL: &str = "the in-memory store's semaphores bound holders only within this process; use a server store to bound them across processes";

/// The permits of one memory store.
#[derive(Debug, Default)]
pub(crate) struct MemoryPermits {
    keys: HashMap<StoreKey, Vec<Permit>>,
    last_fence: u64,
    sweep: Sweep,
}

#[derive(Debug)]
struct Permit {
    holder: Holder,
    fence: u64,
    expires_at: Instant,
    /// The N of the claim that was granted it.
    permits: u32,
}

impl MemoryPermits {
    /// The live permits of `key`, oldest fence first, with the ended ones dropped; and the
    /// fence counter, borrowed beside them for a claim that grants.
    fn live(&mut self, key: &StoreKey, now: Instant) -> (&mut Vec<Permit>, &mut u64) {
        if self.sweep.due() {
            self.keys.retain(|_, permits| {
                permits.retain(|p| p.expires_at > now);
                !permits.is_empty()
            });
        }
        let permits = self.keys.entry(key.clone()).or_default();
        permits.retain(|p| p.expires_at > now);
        (permits, &mut self.last_fence)
    }
}

fn info(key: &StoreKey, permit: &Permit, now: Instant) -> HolderInfo {
    HolderInfo {
        key: key.clone(),
        holder: permit.holder.clone(),
        fence: Fence::new(permit.fence),
        remaining: remaining(permit.expires_at, now),
        reason: String::new(),
    }
}

impl MemoryStore {
    fn permit_state(&self) -> std::sync::MutexGuard<'_, MemoryPermits> {
        self.permits.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[async_trait]
impl SemaphoreStore for MemoryStore {
    async fn claim_permit(
        &self,
        key: &StoreKey,
        request: LeaseRequest<'_>,
        permits: u32,
    ) -> Result<Claim> {
        let now = self.clock.now();
        let until = now + request.ttl.get();
        let claim = {
            let mut state = self.permit_state();
            let (live, last_fence) = state.live(key, now);
            if let Some(own) = live.iter_mut().find(|p| p.holder == *request.holder) {
                own.expires_at = until;
                Claim::Extended {
                    fence: Fence::new(own.fence),
                }
            } else if live.len() < permits as usize {
                let fence = next_fence(last_fence);
                live.push(Permit {
                    holder: request.holder.clone(),
                    fence,
                    expires_at: until,
                    permits,
                });
                Claim::Granted {
                    fence: Fence::new(fence),
                }
            } else {
                let soonest = live
                    .iter()
                    .min_by_key(|p| p.expires_at)
                    .expect("a full semaphore holds a permit");
                Claim::Held {
                    holder: soonest.holder.clone(),
                    remaining: remaining(soonest.expires_at, now),
                }
            }
        };
        if matches!(claim, Claim::Granted { .. }) {
            self.warn_once(key, PROCESS_LOCAL);
        }
        Ok(claim)
    }

    async fn renew_permit(&self, key: &StoreKey, holder: &Holder, ttl: Ttl) -> Result<Renewal> {
        let now = self.clock.now();
        let mut state = self.permit_state();
        Ok(
            match state
                .live(key, now)
                .0
                .iter_mut()
                .find(|p| p.holder == *holder)
            {
                Some(own) => {
                    own.expires_at = now + ttl.get();
                    Renewal::Renewed
                }
                None => Renewal::NotHeld,
            },
        )
    }

    async fn release_permit(&self, key: &StoreKey, holder: &Holder) -> Result<Release> {
        let now = self.clock.now();
        let removed = {
            let mut state = self.permit_state();
            let (live, _) = state.live(key, now);
            let before = live.len();
            live.retain(|p| p.holder != *holder);
            live.len() < before
        };
        if removed {
            self.hub.notify(key);
            Ok(Release::Removed)
        } else {
            Ok(Release::NoHolder)
        }
    }

    async fn permits(&self, key: &StoreKey) -> Result<Vec<HolderInfo>> {
        let now = self.clock.now();
        let mut state = self.permit_state();
        let (live, _) = state.live(key, now);
        // Permits are pushed in fence order, and only ever removed.
        Ok(live.iter().map(|p| info(key, p, now)).collect())
    }

    async fn list_permits(&self, prefix: &str, limit: usize) -> Result<Vec<PermitInfo>> {
        let now = self.clock.now();
        let mut state = self.permit_state();
        let mut keys: Vec<&StoreKey> = state
            .keys
            .iter()
            .filter(|(key, permits)| {
                key.as_str().starts_with(prefix) && permits.iter().any(|p| p.expires_at > now)
            })
            .map(|(key, _)| key)
            .collect();
        keys.sort();
        keys.truncate(limit);
        let keys: Vec<StoreKey> = keys.into_iter().cloned().collect();
        let mut listed = Vec::new();
        for key in keys {
            let (live, _) = state.live(&key, now);
            listed.extend(live.iter().map(|p| PermitInfo {
                grant: info(&key, p, now),
                permits: Some(p.permits),
            }));
        }
        Ok(listed)
    }

    fn permit_wakeups(&self) -> Wakeups {
        Wakeups {
            hub: Arc::clone(&self.hub),
            poll: None,
        }
    }
}
