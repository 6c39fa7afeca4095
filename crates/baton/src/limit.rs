//! Rate limits: [`Baton::rate_limiter`] and the types it hands out (re-exported from
//! `baton-core`).
//!
//! `memory://` limits within the process, `sqlite://` across the processes of one host
//! (table `baton_limit` in the same file), `redis://` across hosts (one script per decision,
//! on the server's clock), `postgres://` across hosts (one statement per decision). See
//! `docs/rate-limits.md`.

use std::sync::Arc;

use crate::{Baton, Result};
pub use baton_core::limit::{
    Decision, LimitError, MAX_WINDOW, MIN_WINDOW, Quota, RateLimiter, RateStore,
};

impl Baton {
    /// The rate limiter of `quota` on this store, in this connection's namespace: at most
    /// `quota.max()` units per key in any window of length `quota.window()`, shared by every
    /// process on the store.
    ///
    /// Cheap: every call hands out a client of the same budgets; keep to one quota per key.
    ///
    /// # Errors
    /// `Unsupported` when the store keeps no rate limits (a store of your own given to
    /// [`Baton::from_store`] that offers none).
    ///
    /// # Examples
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    ///
    /// let baton = baton::connect("memory://").await?;
    /// // At most 60 calls per second per tenant, bound once.
    /// let limiter = baton.rate_limiter(baton::limit::Quota::new(60, Duration::from_secs(1))?)?;
    /// let decision = limiter.try_acquire("st:org-42", 1).await?;
    /// if !decision.allowed {
    ///     println!("429, retry after {:?}", decision.retry_after);
    /// }
    /// # Ok(()) }
    /// ```
    pub fn rate_limiter(&self, quota: Quota) -> Result<RateLimiter> {
        let store = Arc::clone(self.store()).rate_store()?;
        Ok(RateLimiter::with_namespace(
            store,
            self.namespace().clone(),
            quota,
        ))
    }
}
