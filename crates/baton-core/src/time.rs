//! Validated durations, the duration parser the CLI uses, and the monotonic clock.
//!
//! A [`Ttl`] is how long a grant survives without renewal; a [`WaitTime`] is how long a
//! caller blocks for a current holder. Both are checked against fixed limits before any I/O
//! so that a typo (`30d` meant as seconds, `0s`) fails loudly instead of creating a lock
//! that expires at once or never.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use crate::error::{Error, Result};

/// Shortest TTL a store accepts.
pub const MIN_TTL: Duration = Duration::from_millis(10);
/// Longest TTL a store accepts.
pub const MAX_TTL: Duration = Duration::from_secs(30 * 24 * 3600);
/// Longest wait for a held key.
pub const MAX_WAIT: Duration = Duration::from_secs(24 * 3600);

/// A validated time-to-live: at least [`MIN_TTL`], at most [`MAX_TTL`], whole milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Ttl(Duration);

impl Ttl {
    /// Validates `ttl`. Sub-millisecond parts are rounded down: stores count milliseconds.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidInput`](crate::ErrorKind::InvalidInput) naming the limit.
    pub fn new(ttl: Duration) -> Result<Self> {
        check_range("ttl", ttl, MIN_TTL, MAX_TTL)?;
        Ok(Ttl(Duration::from_millis(ttl.as_millis() as u64)))
    }

    /// The TTL.
    pub fn get(self) -> Duration {
        self.0
    }

    /// The TTL in whole milliseconds.
    pub fn as_millis(self) -> u64 {
        self.0.as_millis() as u64
    }
}

impl fmt::Display for Ttl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", format_duration(self.0))
    }
}

/// A validated wait: zero (one attempt) up to [`MAX_WAIT`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct WaitTime(Duration);

impl WaitTime {
    /// One attempt, no waiting.
    pub const ZERO: WaitTime = WaitTime(Duration::ZERO);

    /// Validates `wait`.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidInput`](crate::ErrorKind::InvalidInput) when over [`MAX_WAIT`].
    pub fn new(wait: Duration) -> Result<Self> {
        check_range("wait", wait, Duration::ZERO, MAX_WAIT)?;
        Ok(WaitTime(wait))
    }

    /// The wait.
    pub fn get(self) -> Duration {
        self.0
    }

    /// Whether this is a single attempt.
    pub fn is_zero(self) -> bool {
        self.0.is_zero()
    }
}

/// Checks a keep-alive interval against its TTL: more than zero and less than `ttl / 2`, so
/// that one renewal can fail and the next still lands before the grant expires.
///
/// # Errors
/// [`ErrorKind::InvalidInput`](crate::ErrorKind::InvalidInput) naming both values.
pub fn check_keep_alive(interval: Duration, ttl: Ttl) -> Result<()> {
    if interval.is_zero() {
        return Err(Error::invalid_input(
            "keep-alive interval is 0; it must be more than 0 and less than ttl / 2",
        ));
    }
    if interval >= ttl.get() / 2 {
        return Err(Error::invalid_input(format!(
            "keep-alive interval {} is not less than ttl / 2 (ttl {}); a renewal that fails once would let the grant expire",
            format_duration(interval),
            format_duration(ttl.get()),
        )));
    }
    Ok(())
}

fn check_range(field: &str, value: Duration, min: Duration, max: Duration) -> Result<()> {
    if value < min {
        return Err(Error::invalid_input(format!(
            "{field} {} is below the minimum of {}",
            format_duration(value),
            format_duration(min)
        )));
    }
    if value > max {
        return Err(Error::invalid_input(format!(
            "{field} {} is above the maximum of {}",
            format_duration(value),
            format_duration(max)
        )));
    }
    Ok(())
}

/// Parses a duration written as a number and a unit: `500ms`, `30s`, `5m`, `1h`, `2d`.
/// A bare `0` is accepted as zero.
///
/// # Errors
/// [`ErrorKind::InvalidInput`](crate::ErrorKind::InvalidInput) naming the text and the
/// accepted units.
pub fn parse_duration(text: &str) -> Result<Duration> {
    let bad = || {
        Error::invalid_input(format!(
            "duration {text:?} is not a number followed by a unit (ms, s, m, h, d), e.g. 500ms, 30s, 5m, 1h"
        ))
    };
    let text_trimmed = text.trim();
    if text_trimmed == "0" {
        return Ok(Duration::ZERO);
    }
    let split = text_trimmed
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(bad)?;
    let (number, unit) = text_trimmed.split_at(split);
    if number.is_empty() {
        return Err(bad());
    }
    let value: u64 = number.parse().map_err(|_| bad())?;
    let millis_per_unit: u64 = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return Err(bad()),
    };
    let millis = value.checked_mul(millis_per_unit).ok_or_else(|| {
        Error::invalid_input(format!("duration {text:?} is too large to represent"))
    })?;
    Ok(Duration::from_millis(millis))
}

/// Formats a duration the way [`parse_duration`] reads it, choosing the largest exact unit.
pub fn format_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms == 0 && !d.is_zero() {
        return format!("{}us", d.as_micros());
    }
    for (unit, size) in [
        ("d", 86_400_000u128),
        ("h", 3_600_000),
        ("m", 60_000),
        ("s", 1_000),
    ] {
        if ms >= size && ms.is_multiple_of(size) {
            return format!("{}{unit}", ms / size);
        }
    }
    format!("{ms}ms")
}

/// The monotonic clock baton's policy reads. Production uses [`SystemClock`] (tokio's
/// `Instant`, which `tokio::time::pause` controls in tests); [`ManualClock`] is moved by hand.
pub trait Clock: Send + Sync + fmt::Debug + 'static {
    /// The current monotonic instant.
    fn now(&self) -> Instant;
}

/// tokio's monotonic clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Instant {
        Instant::now()
    }
}

/// A clock that only moves when told to, for store-expiry tests.
#[derive(Debug, Clone)]
pub struct ManualClock {
    start: Instant,
    offset_us: Arc<AtomicU64>,
}

impl ManualClock {
    /// A clock standing at the current instant.
    pub fn new() -> Self {
        ManualClock {
            start: Instant::now(),
            offset_us: Arc::new(AtomicU64::new(0)),
        }
    }

    /// Moves the clock forward.
    pub fn advance(&self, by: Duration) {
        self.offset_us
            .fetch_add(by.as_micros() as u64, Ordering::SeqCst);
    }
}

impl Default for ManualClock {
    fn default() -> Self {
        ManualClock::new()
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Instant {
        self.start + Duration::from_micros(self.offset_us.load(Ordering::SeqCst))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttl_limits() {
        assert!(Ttl::new(Duration::from_millis(10)).is_ok());
        let low = Ttl::new(Duration::from_millis(9)).unwrap_err();
        assert!(
            low.message()
                .contains("ttl 9ms is below the minimum of 10ms"),
            "{low}"
        );
        assert!(Ttl::new(Duration::ZERO).is_err());
        assert!(Ttl::new(MAX_TTL).is_ok());
        let high = Ttl::new(MAX_TTL + Duration::from_millis(1)).unwrap_err();
        assert!(high.message().contains("maximum of 30d"), "{high}");
    }

    #[test]
    fn wait_limits() {
        assert!(WaitTime::new(Duration::ZERO).unwrap().is_zero());
        assert!(WaitTime::new(MAX_WAIT).is_ok());
        let e = WaitTime::new(MAX_WAIT + Duration::from_secs(1)).unwrap_err();
        assert!(e.message().contains("wait"), "{e}");
    }

    #[test]
    fn keep_alive_limits() {
        let ttl = Ttl::new(Duration::from_secs(30)).unwrap();
        assert!(check_keep_alive(Duration::from_secs(10), ttl).is_ok());
        assert!(check_keep_alive(Duration::ZERO, ttl).is_err());
        let e = check_keep_alive(Duration::from_secs(15), ttl).unwrap_err();
        assert!(e.message().contains("ttl / 2"), "{e}");
    }

    #[test]
    fn parse_durations() {
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("30s").unwrap(), Duration::from_secs(30));
        assert_eq!(parse_duration("5m").unwrap(), Duration::from_secs(300));
        assert_eq!(parse_duration("1h").unwrap(), Duration::from_secs(3600));
        assert_eq!(parse_duration("2d").unwrap(), Duration::from_secs(172_800));
        assert_eq!(parse_duration("0").unwrap(), Duration::ZERO);
        for bad in [
            "",
            "s",
            "10",
            "1.5s",
            "-1s",
            "10x",
            "ms10",
            "99999999999999999999d",
        ] {
            let e = parse_duration(bad).unwrap_err();
            assert!(e.is_invalid_input(), "{bad}: {e}");
        }
    }

    #[test]
    fn format_round_trips() {
        for text in ["500ms", "30s", "5m", "1h", "2d", "1500ms"] {
            assert_eq!(format_duration(parse_duration(text).unwrap()), text);
        }
    }
}
