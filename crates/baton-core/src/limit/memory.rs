//! The in-memory store's rate limits: one [`SlidingLog`] per key, behind a mutex.
//!
//! Process-local like the rest of [`MemoryStore`]: replicas do not share budgets. The first
//! decision emits [`baton.store.process_local`](crate::telemetry::events::STORE_PROCESS_LOCAL)
//! once per store, as the first lock grant does.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use tokio::time::Instant;

use super::quota::Quota;
use super::store::{Decision, RateStore};
use super::window::SlidingLog;
use crate::error::Result;
use crate::key::StoreKey;
use crate::memory::MemoryStore;
use crate::telemetry::{self, events};
use crate::time::Clock;

/// How many decisions pass between sweeps of forgotten keys.
const SWEEP_EVERY: u64 = 1024;

/// The rate-limit state of a [`MemoryStore`].
#[derive(Debug)]
pub(crate) struct MemoryLimits {
    clock: Arc<dyn Clock>,
    epoch: Instant,
    state: Mutex<State>,
    warned: AtomicBool,
}

#[derive(Debug, Default)]
struct State {
    /// Each key's log and when it may be forgotten (µs since `epoch`).
    logs: HashMap<StoreKey, (SlidingLog, u64)>,
    decisions: u64,
}

impl MemoryLimits {
    pub(crate) fn new(clock: Arc<dyn Clock>) -> Self {
        MemoryLimits {
            epoch: clock.now(),
            clock,
            state: Mutex::new(State::default()),
            warned: AtomicBool::new(false),
        }
    }

    fn admit(&self, key: &StoreKey, cost: u32, quota: Quota) -> Decision {
        let now = self
            .clock
            .now()
            .saturating_duration_since(self.epoch)
            .as_micros() as u64;
        let decision = {
            let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
            state.decisions += 1;
            if state.decisions.is_multiple_of(SWEEP_EVERY) {
                state.logs.retain(|_, (_, forget_at)| *forget_at > now);
            }
            let (log, forget_at) = state.logs.entry(key.clone()).or_default();
            let decision = log.admit(now, cost, quota);
            *forget_at = log.forgettable_at(quota.window_us()).unwrap_or(now);
            decision
        };
        if !self.warned.swap(true, Ordering::Relaxed) {
            telemetry::emit(
                &events::STORE_PROCESS_LOCAL,
                Some(key.as_str()),
                format_args!(
                    "the in-memory store limits rates only within this process; use sqlite://, redis:// or postgres:// to share a budget across processes"
                ),
            );
        }
        decision
    }
}

#[async_trait]
impl RateStore for MemoryStore {
    async fn admit(&self, key: &StoreKey, cost: u32, quota: Quota) -> Result<Decision> {
        Ok(self.limits.admit(key, cost, quota))
    }
}
