//! [`Backoff`]: how long a failed item waits before its next attempt.
//!
//! Exponential with a cap and jitter by default (1 s, 2 s, 4 s, … up to 5 minutes, each
//! jittered by baton's one rule, to between half and all of it) so that items failing
//! together do not come back together. The schedule is a [`retry::Backoff`] underneath.

use std::time::Duration;

use crate::error::{Error, Result};
use crate::retry;
use crate::time::format_duration;

use super::options::MAX_DELAY;

/// The delay before the next attempt of a failed item.
///
/// # Examples
/// ```
/// use std::time::Duration;
/// use baton_core::work::Backoff;
///
/// let backoff = Backoff::exponential(Duration::from_secs(1), Duration::from_secs(60)).without_jitter();
/// assert_eq!(backoff.delay(1), Duration::from_secs(1));
/// assert_eq!(backoff.delay(3), Duration::from_secs(4));
/// assert_eq!(backoff.delay(30), Duration::from_secs(60));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub struct Backoff {
    schedule: retry::Backoff,
}

impl Backoff {
    /// `base` after the first failed attempt, doubling after each further one, never more
    /// than `cap`; with jitter.
    pub const fn exponential(base: Duration, cap: Duration) -> Self {
        Backoff {
            schedule: retry::Backoff::new(base, cap),
        }
    }

    /// The same delay after every failed attempt (zero: retry at once); without jitter.
    pub const fn fixed(delay: Duration) -> Self {
        Backoff {
            schedule: retry::Backoff::new(delay, delay).without_jitter(),
        }
    }

    /// The same, but every delay exactly as computed (for tests and tight schedules).
    pub const fn without_jitter(mut self) -> Self {
        self.schedule = self.schedule.without_jitter();
        self
    }

    /// The delay after the first failed attempt.
    pub fn base(&self) -> Duration {
        self.schedule.initial()
    }

    /// The longest delay.
    pub fn cap(&self) -> Duration {
        self.schedule.cap()
    }

    /// The delay after failed attempt number `attempt` (from 1): `base · 2^(attempt-1)`, at
    /// most `cap`, scaled by a random factor in [0.5, 1.0] when jittered.
    pub fn delay(&self, attempt: u32) -> Duration {
        self.schedule.delay(attempt.saturating_sub(1))
    }

    /// Checks that `base <= cap <= 30 days`.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidInput`](crate::ErrorKind::InvalidInput) naming the values.
    pub fn validate(&self) -> Result<()> {
        if self.base() > self.cap() {
            return Err(Error::invalid_input(format!(
                "backoff base {} is above its cap {}",
                format_duration(self.base()),
                format_duration(self.cap())
            )));
        }
        if self.cap() > MAX_DELAY {
            return Err(Error::invalid_input(format!(
                "backoff cap {} is above the maximum of {}",
                format_duration(self.cap()),
                format_duration(MAX_DELAY)
            )));
        }
        Ok(())
    }
}

impl Default for Backoff {
    /// 1 s, doubling up to 5 minutes, with jitter.
    fn default() -> Self {
        Backoff::exponential(Duration::from_secs(1), Duration::from_secs(300))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_up_to_the_cap() {
        let b = Backoff::default().without_jitter();
        let secs: Vec<u64> = (1..=11).map(|a| b.delay(a).as_secs()).collect();
        assert_eq!(secs, [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300]);
        assert_eq!(b.delay(0), Duration::from_secs(1));
        assert_eq!(b.delay(u32::MAX), Duration::from_secs(300));
        assert_eq!(Backoff::fixed(Duration::ZERO).delay(7), Duration::ZERO);
    }

    #[test]
    fn jitter_stays_within_half_and_whole() {
        let b = Backoff::exponential(Duration::from_secs(10), Duration::from_secs(10));
        let seen: Vec<Duration> = (0..200).map(|_| b.delay(3)).collect();
        assert!(
            seen.iter()
                .all(|d| *d >= Duration::from_secs(5) && *d <= Duration::from_secs(10))
        );
        assert!(seen.iter().any(|d| *d != seen[0]), "jitter varies");
    }

    #[test]
    fn validation() {
        assert!(Backoff::default().validate().is_ok());
        let e = Backoff::exponential(Duration::from_secs(2), Duration::from_secs(1))
            .validate()
            .unwrap_err();
        assert!(e.message().contains("base 2s is above its cap 1s"), "{e}");
        assert!(
            Backoff::fixed(MAX_DELAY + Duration::from_secs(1))
                .validate()
                .is_err()
        );
    }
}
