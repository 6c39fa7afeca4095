//! The in-memory store's rate limits: one [`SlidingLog`] per key, behind a mutex.
//!
//! Process-local like the rest of [`MemoryStore`]: replicas do not share budgets. A first
//! decision on a store that has not been used yet emits
//! [`baton.store.process_local`](crate::telemetry::events::STORE_PROCESS_LOCAL), as a first
//! lock grant does.

use std::collections::HashMap;
use std::sync::Mutex;

use async_trait::async_trait;
use tokio::time::Instant;

use super::quota::Quota;
use super::store::{Decision, RateStore};
use super::window::SlidingLog;
use crate::error::Result;
use crate::key::StoreKey;
use crate::memory::{MemoryStore, Sweep};
use crate::time::Clock;

/// What the first decision says about the memory store's reach.
const PROCESS_LOCAL: &str = "the in-memory store limits rates only within this process; use sqlite://, redis:// or postgres:// to share a budget across processes";

/// The rate-limit state of a [`MemoryStore`].
#[derive(Debug)]
pub(crate) struct MemoryLimits {
    /// The instant decisions count their microseconds from.
    epoch: Instant,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// Each key's log and when it may be forgotten (µs since `epoch`).
    logs: HashMap<StoreKey, (SlidingLog, u64)>,
    sweep: Sweep,
}

impl MemoryLimits {
    pub(crate) fn new(clock: &dyn Clock) -> Self {
        MemoryLimits {
            epoch: clock.now(),
            state: Mutex::new(State::default()),
        }
    }

    fn admit(&self, now: Instant, key: &StoreKey, cost: u32, quota: Quota) -> Decision {
        let now = now.saturating_duration_since(self.epoch).as_micros() as u64;
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if state.sweep.due() {
            state.logs.retain(|_, (_, forget_at)| *forget_at > now);
        }
        let (log, forget_at) = state.logs.entry(key.clone()).or_default();
        let decision = log.admit(now, cost, quota);
        *forget_at = log.forgettable_at(quota.window_us()).unwrap_or(now);
        decision
    }
}

#[async_trait]
impl RateStore for MemoryStore {
    async fn admit(&self, key: &StoreKey, cost: u32, quota: Quota) -> Result<Decision> {
        let decision = self.limits.admit(self.clock.now(), key, cost, quota);
        self.warn_once(key, PROCESS_LOCAL);
        Ok(decision)
    }
}
