//! Rate limits: at most `max` units per key in any window of length `window`, shared by
//! every process on the store.
//!
//! Use a [`RateLimiter`] for a per-key budget that all replicas draw from: a per-tenant
//! ceiling on a third-party API (60 requests per second), a per-user quota (5 verification
//! emails per day). Do not use it for backpressure on internal traffic (that is a queue),
//! nor for per-instance limits that need no coordination (use an in-process limiter such as
//! `governor`).
//!
//! ## Behavior
//! - **Exact**: no window of length `window` ever holds more than `max` admitted units, at
//!   window edges too (see [`window`] for the algorithm and why it is not GCRA). Each
//!   decision is one atomic step on the store's clock.
//! - **"Not now" and "never" differ**: a request that does not fit now is a [`Decision`]
//!   with `allowed == false` and a `retry_after`; a cost above `max` can never fit and is
//!   [`LimitError::InsufficientCapacity`], before any I/O.
//! - **Fails closed**: when the store cannot be reached nothing is admitted; the call fails
//!   with [`LimitError::Unavailable`] and emits
//!   [`baton.limit.unavailable`](crate::telemetry::events::LIMIT_UNAVAILABLE).
//! - Bad input (an empty key, `max` 0, a window out of range, cost 0) is rejected before any
//!   I/O.
//! - Use one quota per key: the log is kept per key, and a different `window` for the same
//!   key reads the same admissions through a different window.

pub mod quota;
pub mod window;

mod memory;
mod store;

#[cfg(feature = "conformance")]
pub mod conformance;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::sleep_until;

pub(crate) use memory::MemoryLimits;
pub use quota::{MAX_WINDOW, MIN_WINDOW, Quota};
pub use store::{Decision, RateStore};

use crate::error::{Error, ErrorKind, Result};
use crate::key::{Key, KeyKind, Namespace, StoreKey};
use crate::lock::grant::now;
use crate::retry::jitter;
use crate::telemetry::{self, events};
use crate::time::{WaitTime, format_duration};

/// Why [`RateLimiter::try_acquire`] or [`RateLimiter::acquire`] did not answer with a
/// [`Decision`].
#[derive(Debug)]
#[non_exhaustive]
pub enum LimitError {
    /// The cost is above `max`: it can **never** be admitted, however long the caller
    /// waits. Not retryable. (governor's `InsufficientCapacity`.)
    InsufficientCapacity {
        /// The units asked for.
        cost: u32,
        /// The quota's `max`.
        max: u32,
    },
    /// [`RateLimiter::acquire`] only: the units did not fit before the wait ended, or the
    /// store said they cannot fit before it ends. Retryable after `retry_after`.
    Denied {
        /// How long until the units fit, from the last decision.
        retry_after: Duration,
        /// Units that could be admitted at the last decision.
        remaining: u32,
    },
    /// The input was rejected before any I/O.
    InvalidInput(Error),
    /// The store could not be reached; nothing was admitted (emits
    /// [`baton.limit.unavailable`](crate::telemetry::events::LIMIT_UNAVAILABLE)).
    Unavailable(Error),
}

impl LimitError {
    /// Whether the same call may succeed later (`Denied`, `Unavailable`).
    pub fn is_retryable(&self) -> bool {
        matches!(self, LimitError::Denied { .. } | LimitError::Unavailable(_))
    }

    fn from_error(error: Error) -> Self {
        match error.kind() {
            ErrorKind::InvalidInput => LimitError::InvalidInput(error),
            _ => LimitError::Unavailable(error),
        }
    }
}

impl fmt::Display for LimitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LimitError::InsufficientCapacity { cost, max } => write!(
                f,
                "a cost of {cost} can never be admitted: the quota allows at most {max} per window"
            ),
            LimitError::Denied { retry_after, .. } => write!(
                f,
                "rate limited: retry after {}",
                format_duration(*retry_after)
            ),
            LimitError::InvalidInput(e) | LimitError::Unavailable(e) => fmt::Display::fmt(e, f),
        }
    }
}

impl std::error::Error for LimitError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            LimitError::InvalidInput(e) | LimitError::Unavailable(e) => Some(e),
            _ => None,
        }
    }
}

impl From<Error> for LimitError {
    fn from(error: Error) -> Self {
        LimitError::from_error(error)
    }
}

impl From<LimitError> for Error {
    /// `InsufficientCapacity` becomes `InvalidInput`, `Denied` becomes `Timeout`.
    fn from(error: LimitError) -> Self {
        match error {
            LimitError::InvalidInput(e) | LimitError::Unavailable(e) => e,
            other @ LimitError::InsufficientCapacity { .. } => {
                Error::invalid_input(other.to_string())
            }
            other @ LimitError::Denied { .. } => Error::new(ErrorKind::Timeout, other.to_string()),
        }
    }
}

/// The rate-limit client over one store, bound to one [`Quota`]. Cheap to clone; share one
/// per process and quota.
///
/// The quota is bound once, at construction (as `governor` binds it), so a call names only
/// the key and the cost: `max` and `window` cannot be swapped with the cost or with each
/// other at a call site. For another quota on the same store use
/// [`RateLimiter::with_quota`]; keep to one quota per key.
///
/// # Examples
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::{sync::Arc, time::Duration};
/// use baton_core::{MemoryStore, RateLimiter};
///
/// use baton_core::Quota;
///
/// // At most 60 calls per second per tenant, across every replica on the store.
/// let quota = Quota::new(60, Duration::from_secs(1))?;
/// let limiter = RateLimiter::new(Arc::new(MemoryStore::new()), quota);
/// let decision = limiter.try_acquire("servicetitan:org-42", 1).await?;
/// if !decision.allowed {
///     // Answer 429 with Retry-After: decision.retry_after.
/// }
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct RateLimiter {
    inner: Arc<Inner>,
    quota: Quota,
}

#[derive(Debug)]
struct Inner {
    store: Arc<dyn RateStore>,
    namespace: Namespace,
}

impl RateLimiter {
    /// Rate limits of `quota` in the default namespace.
    pub fn new(store: Arc<dyn RateStore>, quota: Quota) -> Self {
        RateLimiter::with_namespace(store, Namespace::default(), quota)
    }

    /// Rate limits of `quota` in `namespace`.
    pub fn with_namespace(store: Arc<dyn RateStore>, namespace: Namespace, quota: Quota) -> Self {
        RateLimiter {
            inner: Arc::new(Inner { store, namespace }),
            quota,
        }
    }

    /// This limiter's store and namespace with another quota (a cheap clone).
    pub fn with_quota(&self, quota: Quota) -> Self {
        RateLimiter {
            inner: Arc::clone(&self.inner),
            quota,
        }
    }

    /// The quota calls are measured against.
    pub fn quota(&self) -> Quota {
        self.quota
    }

    /// The namespace keys are qualified with.
    pub fn namespace(&self) -> &Namespace {
        &self.inner.namespace
    }

    /// Admits `n` units of `key` if they fit in the limiter's quota, without waiting. A
    /// denial is `Ok` with `allowed == false`.
    ///
    /// # Errors
    /// - [`LimitError::InsufficientCapacity`] when `n` is above the quota's `max`
    ///   ("never"), before any I/O;
    /// - [`LimitError::InvalidInput`] for an invalid key or `n == 0`, before any I/O;
    /// - [`LimitError::Unavailable`] when the store faulted: nothing was admitted.
    ///
    /// # Cancel safety
    /// Dropping the future while the step is in flight may count the units without the
    /// caller using them: the limiter only gets stricter.
    pub async fn try_acquire(&self, key: &str, n: u32) -> Result<Decision, LimitError> {
        let (key, quota) = self.check(key, n)?;
        self.step(&key, n, quota).await
    }

    /// Admits `n` units of `key`, waiting up to `wait` for them to fit. `wait` zero is one
    /// attempt. Returns as soon as the store says the units cannot fit before `wait` ends,
    /// rather than sleeping through a wait that cannot succeed.
    ///
    /// # Errors
    /// As [`RateLimiter::try_acquire`], plus [`LimitError::Denied`] when the units did not
    /// fit in time, and `InvalidInput` for a wait above [`MAX_WAIT`](crate::time::MAX_WAIT).
    ///
    /// # Cancel safety
    /// As [`RateLimiter::try_acquire`].
    pub async fn acquire(&self, key: &str, n: u32, wait: Duration) -> Result<Decision, LimitError> {
        let (key, quota) = self.check(key, n)?;
        let wait = WaitTime::new(wait).map_err(LimitError::InvalidInput)?;
        let deadline = now() + wait.get();
        loop {
            let decision = self.step(&key, n, quota).await?;
            if decision.allowed {
                return Ok(decision);
            }
            let at = now();
            let fits_at = at + decision.retry_after;
            if fits_at > deadline {
                return Err(LimitError::Denied {
                    retry_after: decision.retry_after,
                    remaining: decision.remaining,
                });
            }
            // A little jitter, so waiters in many processes do not all retry at once.
            let spread = jitter((decision.retry_after / 8).min(Duration::from_millis(20)));
            sleep_until((fits_at + spread).min(deadline)).await;
        }
    }

    /// Validates everything before any I/O.
    fn check(&self, key: &str, n: u32) -> Result<(StoreKey, Quota), LimitError> {
        let key = Key::new(key).map_err(LimitError::InvalidInput)?;
        let quota = self.quota;
        quota.check_cost(n).map_err(LimitError::InvalidInput)?;
        if !quota.admits(n) {
            return Err(LimitError::InsufficientCapacity {
                cost: n,
                max: quota.max(),
            });
        }
        Ok((self.inner.namespace.qualify(KeyKind::Limit, &key), quota))
    }

    async fn step(&self, key: &StoreKey, n: u32, quota: Quota) -> Result<Decision, LimitError> {
        match self.inner.store.admit(key, n, quota).await {
            Ok(decision) => Ok(decision),
            Err(error) => {
                telemetry::emit(
                    &events::LIMIT_UNAVAILABLE,
                    Some(key.as_str()),
                    format_args!("rate limit check failed closed (nothing admitted): {error}"),
                );
                Err(LimitError::from_error(error))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::MemoryStore;

    fn limiter() -> RateLimiter {
        RateLimiter::new(
            Arc::new(MemoryStore::new()),
            quota(1, Duration::from_secs(1)),
        )
    }

    fn quota(max: u32, window: Duration) -> Quota {
        Quota::new(max, window).unwrap()
    }

    #[tokio::test]
    async fn never_is_not_not_now() {
        let limiter = limiter();
        let err = limiter
            .with_quota(quota(10, Duration::from_secs(1)))
            .try_acquire("k", 11)
            .await
            .unwrap_err();
        assert!(
            matches!(err, LimitError::InsufficientCapacity { cost: 11, max: 10 }),
            "{err:?}"
        );
        assert!(!err.is_retryable());
        assert!(err.to_string().contains("never"), "{err}");
        assert_eq!(Error::from(err).kind(), ErrorKind::InvalidInput);
        let d = limiter
            .with_quota(quota(10, Duration::from_secs(1)))
            .try_acquire("k", 10)
            .await
            .unwrap();
        assert!(d.allowed);
        let d = limiter
            .with_quota(quota(10, Duration::from_secs(1)))
            .try_acquire("k", 1)
            .await
            .unwrap();
        assert!(!d.allowed);
        assert!(d.retry_after > Duration::ZERO);
    }

    #[tokio::test]
    async fn invalid_input() {
        let limiter = limiter();
        for (key, n) in [("", 1), ("k", 0)] {
            let err = limiter.try_acquire(key, n).await.unwrap_err();
            assert!(matches!(err, LimitError::InvalidInput(_)), "{err:?}");
        }
        for (max, window) in [(0, Duration::from_secs(1)), (1, Duration::ZERO)] {
            assert!(Quota::new(max, window).unwrap_err().is_invalid_input());
        }
        let err = limiter
            .acquire("k", 1, Duration::from_secs(25 * 3600))
            .await
            .unwrap_err();
        assert!(matches!(err, LimitError::InvalidInput(_)), "{err:?}");
    }

    /// The quota is bound once: `with_quota` is a view of the same store and namespace.
    #[tokio::test]
    async fn the_quota_is_bound_at_construction() {
        let store = Arc::new(MemoryStore::new());
        let five = RateLimiter::new(store, quota(5, Duration::from_secs(60)));
        assert_eq!(five.quota(), quota(5, Duration::from_secs(60)));
        assert!(five.try_acquire("k", 5).await.unwrap().allowed);
        assert!(!five.try_acquire("k", 1).await.unwrap().allowed);
        let ten = five.with_quota(quota(10, Duration::from_secs(60)));
        let d = ten.try_acquire("k", 5).await.unwrap();
        assert!(
            d.allowed && d.remaining == 0,
            "same budget, larger quota: {d:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn acquire_waits_for_room_and_gives_up_early() {
        let limiter = limiter();
        let window = Duration::from_secs(1);
        assert!(
            limiter
                .with_quota(quota(2, window))
                .try_acquire("k", 2)
                .await
                .unwrap()
                .allowed
        );
        let started = now();
        let d = limiter
            .with_quota(quota(2, window))
            .acquire("k", 1, Duration::from_secs(5))
            .await
            .unwrap();
        assert!(d.allowed);
        let waited = now() - started;
        assert!(waited >= Duration::from_millis(999), "{waited:?}");
        assert!(waited <= Duration::from_millis(1200), "{waited:?}");
        // One unit is in the window for another second: a 100ms wait cannot succeed, and
        // acquire says so at once.
        let started = now();
        let err = limiter
            .with_quota(quota(2, window))
            .acquire("k", 2, Duration::from_millis(100))
            .await
            .unwrap_err();
        assert_eq!(now(), started, "did not sleep through a hopeless wait");
        assert!(
            matches!(err, LimitError::Denied { retry_after, remaining: 1 } if retry_after > Duration::from_millis(900)),
            "{err:?}"
        );
        assert!(err.is_retryable());
    }
}
