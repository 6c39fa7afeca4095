//! [`MonoTime`]: a `CLOCK_MONOTONIC` reading comparable across the processes of one host.
//!
//! `std::time::Instant` (and tokio's, which wraps it) reads `CLOCK_MONOTONIC` on Linux but
//! cannot be serialized or compared across processes. A `MonoTime` is the same clock as
//! plain nanoseconds, so events recorded by several processes on one host can be merged
//! into one history and ordered. Convert the `Instant`s baton hands out (a guard's
//! `valid_until`) with [`MonoTime::from_instant`].
//!
//! Not meaningful under `tokio::time::pause`: a paused tokio clock is not the host's clock.

use std::fmt;
use std::ops::{Add, Sub};
use std::time::{Duration, Instant};

use nix::time::{ClockId, clock_gettime};
use serde::{Deserialize, Serialize};

/// Nanoseconds on the host's `CLOCK_MONOTONIC`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct MonoTime(u64);

impl MonoTime {
    /// The current reading.
    ///
    /// # Panics
    /// If the host has no monotonic clock (it always has one on Linux).
    pub fn now() -> Self {
        let ts = clock_gettime(ClockId::CLOCK_MONOTONIC).expect("CLOCK_MONOTONIC is readable");
        MonoTime(ts.tv_sec() as u64 * 1_000_000_000 + ts.tv_nsec() as u64)
    }

    /// A reading from raw nanoseconds (for hand-made histories).
    pub const fn from_nanos(nanos: u64) -> Self {
        MonoTime(nanos)
    }

    /// The raw nanoseconds.
    pub const fn as_nanos(self) -> u64 {
        self.0
    }

    /// The reading of the same moment as `instant` (std's or, via `into_std`, tokio's).
    ///
    /// `Instant` reads the same clock but hides its value, so the conversion brackets one
    /// `Instant::now()` between two readings and counts from the first: the result is never
    /// later than the true reading, and earlier by at most the bracket (a few microseconds;
    /// a bracket stretched by preemption is retried). For a `valid_until` that errs on the
    /// safe side: a believed window is never made longer than it was.
    pub fn from_instant(instant: Instant) -> Self {
        let mut best: Option<(Duration, MonoTime, Instant)> = None;
        for _ in 0..8 {
            let before = MonoTime::now();
            let now_instant = Instant::now();
            let bracket = MonoTime::now().saturating_since(before);
            if best.is_none_or(|(b, _, _)| bracket < b) {
                best = Some((bracket, before, now_instant));
            }
            if bracket < Duration::from_micros(20) {
                break;
            }
        }
        let (_, before, now_instant) = best.expect("at least one reading");
        if instant >= now_instant {
            before + (instant - now_instant)
        } else {
            before - (now_instant - instant)
        }
    }

    /// How long after `earlier` this is; zero when it is not after.
    pub fn saturating_since(self, earlier: MonoTime) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }
}

impl Add<Duration> for MonoTime {
    type Output = MonoTime;

    fn add(self, rhs: Duration) -> MonoTime {
        MonoTime(self.0.saturating_add(rhs.as_nanos() as u64))
    }
}

impl Sub<Duration> for MonoTime {
    type Output = MonoTime;

    fn sub(self, rhs: Duration) -> MonoTime {
        MonoTime(self.0.saturating_sub(rhs.as_nanos() as u64))
    }
}

impl fmt::Display for MonoTime {
    /// Seconds since boot with microseconds, e.g. `1234.567890s`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}.{:06}s",
            self.0 / 1_000_000_000,
            (self.0 % 1_000_000_000) / 1_000
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readings_move_forward_and_match_instants() {
        let a = MonoTime::now();
        let instant = Instant::now();
        std::thread::sleep(Duration::from_millis(2));
        let b = MonoTime::now();
        assert!(b > a);
        assert!(b.saturating_since(a) >= Duration::from_millis(2));
        let converted = MonoTime::from_instant(instant);
        assert!(
            converted >= a - Duration::from_millis(1) && converted <= b,
            "{converted} not in [{a}, {b}]"
        );
        let future = MonoTime::from_instant(instant + Duration::from_secs(10));
        assert!(future.saturating_since(converted) >= Duration::from_millis(9_999));
    }

    #[test]
    fn serializes_as_a_number() {
        let t = MonoTime::from_nanos(1_500_000_000);
        assert_eq!(serde_json::to_string(&t).unwrap(), "1500000000");
        assert_eq!(t.to_string(), "1.500000s");
    }
}
