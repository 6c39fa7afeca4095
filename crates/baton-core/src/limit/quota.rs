//! [`Quota`]: a validated "at most `max` units in any window of length `window`".
//!
//! A quota is checked before any I/O, so a typo (`--window 0s`, `--max 0`) fails loudly
//! instead of creating a limiter that admits nothing or everything.

use std::fmt;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::time::format_duration;

/// Shortest window a quota may have.
pub const MIN_WINDOW: Duration = Duration::from_millis(10);
/// Longest window a quota may have.
pub const MAX_WINDOW: Duration = Duration::from_secs(30 * 24 * 3600);

/// At most [`max`](Quota::max) units in any window of length [`window`](Quota::window).
///
/// `max` is at least 1; `window` is between [`MIN_WINDOW`] and [`MAX_WINDOW`], counted in
/// whole microseconds.
///
/// # Examples
/// ```
/// use std::time::Duration;
/// use baton_core::limit::Quota;
///
/// let quota = Quota::new(60, Duration::from_secs(1))?; // 60 requests per second, per key
/// assert_eq!(quota.max(), 60);
/// assert!(Quota::new(0, Duration::from_secs(1)).is_err());
/// # Ok::<(), baton_core::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Quota {
    max: u32,
    window: Duration,
}

impl Quota {
    /// Validates `max` and `window`.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidInput`](crate::ErrorKind::InvalidInput) naming the rule broken.
    pub fn new(max: u32, window: Duration) -> Result<Self> {
        if max == 0 {
            return Err(Error::invalid_input(
                "max is 0; a quota admits at least 1 unit per window",
            ));
        }
        if window < MIN_WINDOW {
            return Err(Error::invalid_input(format!(
                "window {} is below the minimum of {}",
                format_duration(window),
                format_duration(MIN_WINDOW)
            )));
        }
        if window > MAX_WINDOW {
            return Err(Error::invalid_input(format!(
                "window {} is above the maximum of {}",
                format_duration(window),
                format_duration(MAX_WINDOW)
            )));
        }
        Ok(Quota {
            max,
            window: Duration::from_micros(window.as_micros() as u64),
        })
    }

    /// Most units admitted in any window.
    pub fn max(self) -> u32 {
        self.max
    }

    /// The window's length.
    pub fn window(self) -> Duration {
        self.window
    }

    /// The window in microseconds, the unit every store computes in.
    pub fn window_us(self) -> u64 {
        self.window.as_micros() as u64
    }

    /// Checks that `cost` units can ever be admitted under this quota.
    ///
    /// # Errors
    /// `InvalidInput` when `cost` is 0. A cost above `max` is not an error of this function:
    /// see [`Quota::admits`].
    pub(crate) fn check_cost(self, cost: u32) -> Result<()> {
        if cost == 0 {
            return Err(Error::invalid_input("cost is 0; acquire at least 1 unit"));
        }
        Ok(())
    }

    /// Whether a request of `cost` units can ever be admitted (`cost <= max`).
    pub fn admits(self, cost: u32) -> bool {
        cost <= self.max
    }
}

impl fmt::Display for Quota {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} per {}", self.max, format_duration(self.window))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits() {
        assert!(Quota::new(1, MIN_WINDOW).is_ok());
        assert!(Quota::new(u32::MAX, MAX_WINDOW).is_ok());
        let zero = Quota::new(0, Duration::from_secs(1)).unwrap_err();
        assert!(zero.is_invalid_input());
        assert!(zero.message().contains("max is 0"), "{zero}");
        let short = Quota::new(5, Duration::from_millis(9)).unwrap_err();
        assert!(
            short.message().contains("below the minimum of 10ms"),
            "{short}"
        );
        let long = Quota::new(5, MAX_WINDOW + Duration::from_millis(1)).unwrap_err();
        assert!(
            long.message().contains("above the maximum of 30d"),
            "{long}"
        );
        let q = Quota::new(60, Duration::from_secs(1)).unwrap();
        assert_eq!(q.to_string(), "60 per 1s");
        assert_eq!(q.window_us(), 1_000_000);
        assert!(q.admits(60) && !q.admits(61));
        assert!(q.check_cost(0).is_err());
        assert!(q.check_cost(61).is_ok());
    }
}
