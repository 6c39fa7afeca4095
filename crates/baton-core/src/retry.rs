//! Retry timing, written once: an exponential [`Backoff`], the [`Attempts`] of one retry
//! loop over it, one [`jitter`] rule, and [`retry`] for a call retried while it faults.
//!
//! Every retry and reconnect loop of baton uses this module: a lock waiter that meets a store
//! fault, a worker settling an item, the migration coordinator, the Redis and PostgreSQL
//! wake-up and broadcast connections reconnecting, the limiter and the scheduler spreading
//! their waiters, and the queue's retry schedule for failed items
//! ([`work::Backoff`](crate::work::Backoff)).
//!
//! ## The jitter rule
//! A jittered wait is drawn uniformly from **half to all** of the computed wait ("equal
//! jitter"). Waits never grow past what was computed, so an upper bound stays an upper
//! bound, and never shrink below half of it, so a backoff still backs off; processes that
//! failed together come back spread over the second half of the wait rather than in step.

use std::future::Future;
use std::time::Duration;

use rand::Rng;
use tokio::time::sleep;

use crate::error::Result;

/// How a store's long-lived connection (release wake-ups, broadcast subscriptions) reconnects
/// after the first try at once failed: 50 ms, doubling to 2 s, jittered.
pub const RECONNECT: Backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(2));

/// `wait` under the one jitter rule: drawn uniformly from `[wait / 2, wait]`.
///
/// # Examples
/// ```
/// use std::time::Duration;
/// use baton_core::retry::jitter;
///
/// let wait = jitter(Duration::from_millis(100));
/// assert!(wait >= Duration::from_millis(50) && wait <= Duration::from_millis(100));
/// assert_eq!(jitter(Duration::ZERO), Duration::ZERO);
/// ```
pub fn jitter(wait: Duration) -> Duration {
    if wait.is_zero() {
        return wait;
    }
    wait.mul_f64(rand::rng().random_range(0.5..=1.0))
}

/// An exponential backoff: `initial`, doubling after each wait, never above `cap`, each wait
/// jittered by the [rule of this module](self#the-jitter-rule) (unless
/// [`without_jitter`](Backoff::without_jitter)).
///
/// # Examples
/// ```
/// use std::time::Duration;
/// use baton_core::retry::Backoff;
///
/// let backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(1));
/// assert_eq!(backoff.step(0), Duration::from_millis(50));
/// assert_eq!(backoff.step(2), Duration::from_millis(200));
/// assert_eq!(backoff.step(10), Duration::from_secs(1));
/// let wait = backoff.delay(1);
/// assert!(wait >= Duration::from_millis(50) && wait <= Duration::from_millis(100));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub struct Backoff {
    initial: Duration,
    cap: Duration,
    jitter: bool,
}

impl Backoff {
    /// `initial` first, doubling up to `cap`, jittered. A `cap` below `initial` caps every
    /// wait at `cap`.
    pub const fn new(initial: Duration, cap: Duration) -> Self {
        Backoff {
            initial,
            cap,
            jitter: true,
        }
    }

    /// The same, with every wait exactly as computed.
    pub const fn without_jitter(mut self) -> Self {
        self.jitter = false;
        self
    }

    /// The first wait.
    pub const fn initial(&self) -> Duration {
        self.initial
    }

    /// The longest wait.
    pub const fn cap(&self) -> Duration {
        self.cap
    }

    /// Whether waits are jittered.
    pub const fn is_jittered(&self) -> bool {
        self.jitter
    }

    /// Wait number `n` (from 0) before jitter: `initial · 2ⁿ`, at most `cap`.
    pub fn step(&self, n: u32) -> Duration {
        if n > 31 {
            return self.cap.min(self.initial.saturating_mul(u32::MAX));
        }
        self.initial
            .checked_mul(1u32 << n)
            .map_or(self.cap, |d| d.min(self.cap))
    }

    /// Wait number `n` (from 0), jittered when the backoff is.
    pub fn delay(&self, n: u32) -> Duration {
        let step = self.step(n);
        if self.jitter { jitter(step) } else { step }
    }

    /// The attempts of one retry loop over this backoff, from its first wait.
    pub fn attempts(&self) -> Attempts {
        Attempts {
            backoff: *self,
            waited: 0,
        }
    }
}

/// The state of one retry loop over a [`Backoff`]: how many waits it has handed out.
///
/// # Examples
/// ```
/// use std::time::Duration;
/// use baton_core::retry::Backoff;
///
/// let mut attempts = Backoff::new(Duration::from_millis(50), Duration::from_secs(2))
///     .without_jitter()
///     .attempts();
/// assert!(attempts.is_fresh());
/// assert_eq!(attempts.next_delay(), Duration::from_millis(50));
/// assert_eq!(attempts.next_delay(), Duration::from_millis(100));
/// attempts.reset(); // it worked: the next fault starts from the first wait again
/// assert_eq!(attempts.next_delay(), Duration::from_millis(50));
/// ```
#[derive(Debug, Clone)]
pub struct Attempts {
    backoff: Backoff,
    waited: u32,
}

impl Attempts {
    /// The next wait (jittered when the backoff is), counted.
    pub fn next_delay(&mut self) -> Duration {
        let wait = self.backoff.delay(self.waited);
        self.waited = self.waited.saturating_add(1);
        wait
    }

    /// The next wait before jitter, not counted: the longest [`next_delay`] can be.
    ///
    /// [`next_delay`]: Attempts::next_delay
    pub fn peek(&self) -> Duration {
        self.backoff.step(self.waited)
    }

    /// How many waits were handed out since the start or the last [`reset`](Attempts::reset).
    pub fn waited(&self) -> u32 {
        self.waited
    }

    /// Whether no wait was handed out since the start or the last reset.
    pub fn is_fresh(&self) -> bool {
        self.waited == 0
    }

    /// Starts again from the first wait (after a success).
    pub fn reset(&mut self) {
        self.waited = 0;
    }
}

/// Runs `call` up to `tries` times (at least once) while it fails with a retryable error
/// ([`Error::is_retryable`](crate::Error::is_retryable): `Unavailable`, `Timeout`), waiting
/// the backoff's next delay between tries; returns the first success, the first other error,
/// or the last error.
///
/// # Examples
/// ```
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
/// use std::time::Duration;
/// use baton_core::retry::{Backoff, retry};
/// use baton_core::{Error, ErrorKind};
///
/// let mut calls = 0;
/// let answer = retry(Backoff::new(Duration::from_millis(100), Duration::from_secs(2)), 3, || {
///     calls += 1;
///     let n = calls;
///     async move {
///         if n < 3 { Err(Error::new(ErrorKind::Unavailable, "down")) } else { Ok(n) }
///     }
/// })
/// .await;
/// assert_eq!(answer.unwrap(), 3);
/// # }
/// ```
pub async fn retry<T, F, Fut>(backoff: Backoff, tries: u32, mut call: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T>>,
{
    let mut attempts = backoff.attempts();
    let mut tried = 1;
    loop {
        match call().await {
            Err(e) if e.is_retryable() && tried < tries => {
                sleep(attempts.next_delay()).await;
                tried += 1;
            }
            other => return other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::{Error, ErrorKind};

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn steps_double_up_to_the_cap() {
        let b = Backoff::new(50 * MS, 1000 * MS);
        let steps: Vec<u128> = (0..7).map(|n| b.step(n).as_millis()).collect();
        assert_eq!(steps, [50, 100, 200, 400, 800, 1000, 1000]);
        assert_eq!(b.step(31), 1000 * MS);
        assert_eq!(b.step(32), 1000 * MS);
        assert_eq!(b.step(u32::MAX), 1000 * MS);
        assert_eq!(Backoff::new(5 * MS, 2 * MS).step(0), 2 * MS);
        assert_eq!(Backoff::new(Duration::ZERO, MS).delay(4), Duration::ZERO);
    }

    #[test]
    fn jitter_stays_within_half_and_whole_and_varies() {
        let seen: Vec<Duration> = (0..200).map(|_| jitter(100 * MS)).collect();
        assert!(seen.iter().all(|d| *d >= 50 * MS && *d <= 100 * MS));
        assert!(seen.iter().any(|d| *d != seen[0]), "jitter varies");
        let b = Backoff::new(100 * MS, 100 * MS);
        assert!((0..50).all(|_| (50 * MS..=100 * MS).contains(&b.delay(3))));
        assert_eq!(b.without_jitter().delay(3), 100 * MS);
    }

    #[test]
    fn attempts_count_peek_and_reset() {
        let mut a = Backoff::new(10 * MS, 40 * MS).without_jitter().attempts();
        assert!(a.is_fresh());
        assert_eq!(a.peek(), 10 * MS);
        assert_eq!(a.next_delay(), 10 * MS);
        assert_eq!(a.peek(), 20 * MS);
        assert_eq!(a.next_delay(), 20 * MS);
        assert_eq!(a.next_delay(), 40 * MS);
        assert_eq!(a.next_delay(), 40 * MS);
        assert_eq!(a.waited(), 4);
        a.reset();
        assert!(a.is_fresh());
        assert_eq!(a.next_delay(), 10 * MS);
    }

    #[tokio::test(start_paused = true)]
    async fn retry_waits_between_tries_and_stops_at_the_limit() {
        let start = tokio::time::Instant::now();
        let mut calls = 0;
        let answer: Result<()> =
            retry(Backoff::new(100 * MS, MS * 150).without_jitter(), 3, || {
                calls += 1;
                async { Err(Error::new(ErrorKind::Unavailable, "down")) }
            })
            .await;
        assert!(answer.unwrap_err().is_unavailable());
        assert_eq!(calls, 3);
        assert_eq!(start.elapsed(), 250 * MS, "100 ms, then 150 ms (the cap)");
    }

    #[tokio::test(start_paused = true)]
    async fn retry_does_not_retry_what_cannot_succeed() {
        let mut calls = 0;
        let answer: Result<()> = retry(Backoff::new(MS, MS), 5, || {
            calls += 1;
            async { Err(Error::invalid_input("bad")) }
        })
        .await;
        assert!(answer.unwrap_err().is_invalid_input());
        assert_eq!(calls, 1);
    }
}
