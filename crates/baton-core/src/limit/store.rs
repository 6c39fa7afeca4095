//! The rate-limit store interface: one atom, [`RateStore::admit`].
//!
//! Policy lives in [`RateLimiter`](crate::RateLimiter) (validation, the "never" answer for a
//! cost above `max`, waiting, telemetry); a store implements only the step of the
//! [sliding log](super::window), atomically and on its own clock.

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;

use super::quota::Quota;
use crate::error::Result;
use crate::key::StoreKey;

/// The answer of one rate-limit step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "a Decision says whether the request was admitted; check `allowed`"]
pub struct Decision {
    /// Whether the units were admitted (and counted).
    pub allowed: bool,
    /// Units that could still be admitted right now, after this decision.
    pub remaining: u32,
    /// When denied: how long until the requested units fit, if nobody else takes them.
    /// Zero when admitted.
    pub retry_after: Duration,
}

/// The rate-limit atom of one store. Object safe: a store hands itself out as an
/// `Arc<dyn RateStore>` from [`Store::rate_store`](crate::store::Store::rate_store), which the
/// facade asks when a client is built.
///
/// # Contract
/// - `admit` runs one step of [`SlidingLog::admit`](super::window::SlidingLog::admit) for
///   `key`, atomically (no other step of the same key interleaves) and on the store's clock,
///   in one round trip where the store has round trips.
/// - The caller has validated `1 <= cost <= quota.max()`.
/// - Store faults are errors of kind `Unavailable`, and then nothing was admitted, or the
///   admission is lost to the caller (which only ever makes the limiter stricter).
#[async_trait]
pub trait RateStore: Send + Sync + fmt::Debug + 'static {
    /// Admits `cost` units of `key` under `quota`, or says when they would fit.
    async fn admit(&self, key: &StoreKey, cost: u32, quota: Quota) -> Result<Decision>;
}
