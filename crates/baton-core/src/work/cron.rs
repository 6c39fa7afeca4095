//! [`CronSpec`]: a validated cron expression, evaluated in UTC.
//!
//! Five fields (`minute hour day-of-month month day-of-week`), or six with a leading
//! seconds field; names (`MON`, `JAN`), ranges, lists, steps, `L`, `W` and `#`, and the
//! nicknames `@hourly`, `@daily`, `@weekly`, `@monthly`, `@yearly`. Parsing and evaluation
//! are the `croner` crate's; this type fixes the dialect (no year field) and the time zone
//! (UTC, so a tick never repeats or vanishes at a daylight-saving change).

use std::fmt;

use chrono::{DateTime, Utc};
use croner::Cron;
use croner::parser::{CronParser, Seconds, Year};

use crate::error::{Error, Result};
use crate::key::check_text;

/// Longest cron spec, in bytes.
pub const MAX_CRON_SPEC_BYTES: usize = 200;
/// The most missed ticks [`CronSpec::count_after`] counts before it stops.
pub(crate) const COUNT_LIMIT: u64 = 10_000;

/// A validated cron expression, evaluated in UTC.
///
/// # Examples
/// ```
/// use baton_core::work::CronSpec;
///
/// let nightly = CronSpec::parse("0 3 * * *")?;
/// // 2024-01-01T00:00:00Z → 2024-01-01T03:00:00Z
/// assert_eq!(nightly.next_after_ms(1_704_067_200_000)?, 1_704_067_200_000 + 3 * 3_600_000);
/// let every_ten_seconds = CronSpec::parse("*/10 * * * * *")?;
/// assert_eq!(every_ten_seconds.next_after_ms(1_704_067_200_000)?, 1_704_067_210_000);
/// assert!(CronSpec::parse("61 * * * *").is_err());
/// # Ok::<(), baton_core::Error>(())
/// ```
#[derive(Clone)]
pub struct CronSpec {
    text: String,
    cron: Cron,
}

impl fmt::Debug for CronSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.text, f)
    }
}

impl fmt::Display for CronSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl PartialEq for CronSpec {
    fn eq(&self, other: &Self) -> bool {
        self.text == other.text
    }
}

impl Eq for CronSpec {}

impl CronSpec {
    /// Parses `spec`: 5 fields, or 6 with seconds first, or an `@` nickname.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidInput`](crate::ErrorKind::InvalidInput) naming the spec and what
    /// is wrong with it, also for a spec that never fires (`0 0 30 2 *`).
    pub fn parse(spec: &str) -> Result<CronSpec> {
        check_text("cron spec", spec, MAX_CRON_SPEC_BYTES)?;
        let text = spec.trim().to_owned();
        let fields = text.split_whitespace().count();
        if !text.starts_with('@') && fields != 5 && fields != 6 {
            return Err(Error::invalid_input(format!(
                "cron spec {spec:?} has {fields} fields; expected 5 (minute hour day-of-month month day-of-week) or 6 (a seconds field first)"
            )));
        }
        let cron = CronParser::builder()
            .seconds(Seconds::Optional)
            .year(Year::Disallowed)
            .build()
            .parse(&text)
            .map_err(|e| Error::invalid_input(format!("cron spec {spec:?} is invalid: {e}")))?;
        let parsed = CronSpec { text, cron };
        // 2024-01-01T00:00:00Z: a spec that finds no tick within croner's search limit from
        // here (a leap day included) never fires.
        parsed
            .next_after_ms(1_704_067_200_000)
            .map_err(|_| Error::invalid_input(format!("cron spec {spec:?} never fires")))?;
        Ok(parsed)
    }

    /// The spec as given (trimmed).
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The first tick strictly after `after_ms` (unix milliseconds), in unix milliseconds.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidInput`](crate::ErrorKind::InvalidInput) when `after_ms` is out of
    /// range or no tick follows it.
    pub fn next_after_ms(&self, after_ms: i64) -> Result<i64> {
        // Ticks are whole seconds: an instant within a second is after that second's tick.
        let floor = after_ms.div_euclid(1000) * 1000;
        let at = DateTime::<Utc>::from_timestamp_millis(floor)
            .ok_or_else(|| Error::invalid_input(format!("time {after_ms}ms is out of range")))?;
        let next = self.cron.find_next_occurrence(&at, false).map_err(|e| {
            Error::invalid_input(format!(
                "cron spec {:?} has no tick after {at}: {e}",
                self.text
            ))
        })?;
        Ok(next.timestamp_millis())
    }

    /// How many ticks fall in `(after_ms, until_ms]`, counting at most [`COUNT_LIMIT`].
    pub(crate) fn count_after(&self, after_ms: i64, until_ms: i64) -> u64 {
        let mut count = 0;
        let mut at = after_ms;
        while count < COUNT_LIMIT {
            match self.next_after_ms(at) {
                Ok(next) if next <= until_ms => {
                    count += 1;
                    at = next;
                }
                _ => break,
            }
        }
        count
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const JAN_1_2024: i64 = 1_704_067_200_000;

    #[test]
    fn five_and_six_fields() {
        for (spec, after, next) in [
            ("* * * * *", JAN_1_2024, JAN_1_2024 + 60_000),
            ("* * * * *", JAN_1_2024 + 59_999, JAN_1_2024 + 60_000),
            ("* * * * * *", JAN_1_2024, JAN_1_2024 + 1_000),
            ("* * * * * *", JAN_1_2024 + 500, JAN_1_2024 + 1_000),
            ("* * * * * *", JAN_1_2024 - 1, JAN_1_2024),
        ] {
            let spec = CronSpec::parse(spec).unwrap();
            assert_eq!(
                spec.next_after_ms(after).unwrap(),
                next,
                "{spec:?} after {after}"
            );
        }
        let nightly = CronSpec::parse("  0 3 * * MON-FRI ").unwrap();
        assert_eq!(nightly.as_str(), "0 3 * * MON-FRI");
        // 2024-01-01 is a Monday.
        assert_eq!(
            nightly.next_after_ms(JAN_1_2024).unwrap(),
            JAN_1_2024 + 3 * 3_600_000
        );
        assert!(CronSpec::parse("@hourly").is_ok());
    }

    #[test]
    fn bad_specs_say_what_is_wrong() {
        let e = CronSpec::parse("* * *").unwrap_err();
        assert!(e.message().contains("has 3 fields; expected 5"), "{e}");
        let e = CronSpec::parse("* * * * * * *").unwrap_err();
        assert!(e.message().contains("7 fields"), "{e}");
        for bad in ["61 * * * *", "* 25 * * *", "a b c d e", "*/0 * * * *"] {
            let e = CronSpec::parse(bad).unwrap_err();
            assert!(
                e.is_invalid_input() && e.message().contains(bad),
                "{bad}: {e}"
            );
        }
        let e = CronSpec::parse("0 0 30 2 *").unwrap_err();
        assert!(e.message().contains("never fires"), "{e}");
        assert!(CronSpec::parse("").is_err());
        assert!(
            CronSpec::parse("* * * * *\n").is_err(),
            "control characters"
        );
    }

    #[test]
    fn counts_ticks_in_a_span() {
        let second = CronSpec::parse("* * * * * *").unwrap();
        assert_eq!(second.count_after(JAN_1_2024, JAN_1_2024 + 5_000), 5);
        assert_eq!(second.count_after(JAN_1_2024, JAN_1_2024 + 999), 0);
        assert_eq!(
            second.count_after(JAN_1_2024, JAN_1_2024 + 10_000_000_000),
            COUNT_LIMIT
        );
    }
}
