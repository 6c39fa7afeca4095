//! The report of `baton doctor`: a [`Report`] of named [`Check`]s, each with a [`Verdict`],
//! a one-sentence finding and, where something should change, how to change it.
//!
//! Each store crate reads the facts of its own deployment and judges them itself (its
//! `doctor::diagnose(url)` returns a [`Report`]); `baton::doctor::diagnose` picks the store
//! by URL. This module holds what every store's checks share: the report types, how a
//! store that cannot be reached is reported, the round-trip and clock checks of the server
//! stores, and how durations are written.
//!
//! # Examples
//! ```
//! use baton_core::doctor::{Check, Report, Verdict};
//!
//! let report = Report::new(
//!     "example://host",
//!     vec![
//!         Check::ok("connect", "opened in 1.20ms"),
//!         Check::finding("clock", "the server clock is 3.00s ahead", "synchronize the clocks with NTP"),
//!     ],
//! );
//! assert!(!report.is_healthy());
//! assert_eq!(report.findings().map(|c| c.name).collect::<Vec<_>>(), ["clock"]);
//! assert_eq!(report.checks[1].verdict, Verdict::Finding);
//! ```

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::{Error, ErrorKind, Result, redact_url};

/// A server clock further than this from the local one (beyond the measurement's
/// uncertainty) is a finding.
pub const CLOCK_TOLERANCE: Duration = Duration::from_secs(1);

/// What a check concluded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub enum Verdict {
    /// As it should be.
    Ok,
    /// Worth knowing; nothing to fix.
    Note,
    /// Something to fix; the check's `fix` says how.
    Finding,
}

impl Verdict {
    /// `ok`, `note` or `finding`.
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Ok => "ok",
            Verdict::Note => "note",
            Verdict::Finding => "finding",
        }
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One check: what was looked at, what was found, and for findings how to fix it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Check {
    /// What was checked: `connect`, `clock`, `maxmemory-policy`, `persistence`, `file`,
    /// `permissions`, ... (stable; scripts may match on it).
    pub name: &'static str,
    /// The verdict.
    pub verdict: Verdict,
    /// What was found, in one sentence.
    pub detail: String,
    /// How to fix it (every finding has one; some notes do).
    pub fix: Option<String>,
}

impl Check {
    /// A check that found things as they should be.
    pub fn ok(name: &'static str, detail: impl Into<String>) -> Check {
        Check {
            name,
            verdict: Verdict::Ok,
            detail: detail.into(),
            fix: None,
        }
    }

    /// A check that found something worth knowing, with an optional suggestion.
    pub fn note(name: &'static str, detail: impl Into<String>, fix: Option<String>) -> Check {
        Check {
            name,
            verdict: Verdict::Note,
            detail: detail.into(),
            fix,
        }
    }

    /// A check that found something to fix, and how to fix it.
    pub fn finding(name: &'static str, detail: impl Into<String>, fix: impl Into<String>) -> Check {
        Check {
            name,
            verdict: Verdict::Finding,
            detail: detail.into(),
            fix: Some(fix.into()),
        }
    }
}

/// The checks of one store.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Report {
    /// The store, as a URL without its password.
    pub store: String,
    /// Whether the store's server could be reached at all (always, for a local file:
    /// whatever is wrong with it is a finding).
    pub reachable: bool,
    /// Every check, in the order they ran.
    pub checks: Vec<Check>,
}

impl Report {
    /// The report of a store that was reached; `store` is redacted here
    /// ([`redact_url`]).
    pub fn new(store: &str, checks: Vec<Check>) -> Report {
        Report {
            store: redact_url(store),
            reachable: true,
            checks,
        }
    }

    /// The report of a store that could not be reached: one `connect` finding that quotes
    /// `error`.
    pub fn unreachable(store: &str, error: &Error) -> Report {
        Report {
            store: redact_url(store),
            reachable: false,
            checks: vec![Check::finding(
                "connect",
                format!("cannot reach the store: {error}"),
                "check that the server runs and the URL, credentials and network path are right",
            )],
        }
    }

    /// The checks that found something to fix.
    pub fn findings(&self) -> impl Iterator<Item = &Check> {
        self.checks.iter().filter(|c| c.verdict == Verdict::Finding)
    }

    /// No findings (notes are fine).
    pub fn is_healthy(&self) -> bool {
        self.findings().next().is_none()
    }
}

/// What a failure to read a store's facts means for its report: a malformed URL or a
/// capability this build lacks (`InvalidInput`, `Unsupported`) is the caller's error;
/// anything else means the store could not be reached, which is an answer
/// ([`Report::unreachable`]).
///
/// # Errors
/// `error` itself when it is `InvalidInput` or `Unsupported`.
pub fn unreachable(store: &str, error: Error) -> Result<Report> {
    if is_usage(&error) {
        Err(error)
    } else {
        Ok(Report::unreachable(store, &error))
    }
}

/// Whether `error` is about what was asked (`InvalidInput`, `Unsupported`), not about the
/// store's health.
pub fn is_usage(error: &Error) -> bool {
    matches!(
        error.kind(),
        ErrorKind::InvalidInput | ErrorKind::Unsupported
    )
}

/// A duration for reading: `0.42ms`, `12.3ms`, `1.50s`.
pub fn millis(d: Duration) -> String {
    let ms = d.as_secs_f64() * 1000.0;
    if ms < 10.0 {
        format!("{ms:.2}ms")
    } else if ms < 1000.0 {
        format!("{ms:.1}ms")
    } else {
        format!("{:.2}s", d.as_secs_f64())
    }
}

/// The `connect` check of a server store: `opened` (what connecting did, and how long it
/// took), then the fastest, median and slowest of `round_trips`; a finding when the slowest
/// is more than half of `response_timeout`.
pub fn round_trip(opened: String, round_trips: &[Duration], response_timeout: Duration) -> Check {
    let mut sorted = round_trips.to_vec();
    sorted.sort();
    let (Some(min), Some(max)) = (sorted.first(), sorted.last()) else {
        return Check::ok("connect", opened);
    };
    let median = sorted[sorted.len() / 2];
    let detail = format!(
        "{opened}; round trip min {}, median {}, max {} over {}",
        millis(*min),
        millis(median),
        millis(*max),
        sorted.len()
    );
    if *max > response_timeout / 2 {
        Check::finding(
            "connect",
            format!(
                "{detail}: the slowest is more than half the response timeout ({}), so calls may fail with Unavailable",
                millis(response_timeout)
            ),
            "run baton closer to the server, or raise response_timeout in the store URL (?response_timeout=2s)",
        )
    } else {
        Check::ok("connect", detail)
    }
}

/// A server clock's offset for reading (`the server clock is 0.06ms ahead of this host's
/// (± 0.10ms)`), and whether it lies beyond [`CLOCK_TOLERANCE`] plus the measurement's
/// `uncertainty`.
pub fn clock_offset(offset_micros: i64, uncertainty: Duration) -> (String, bool) {
    let magnitude = Duration::from_micros(offset_micros.unsigned_abs());
    let direction = if offset_micros >= 0 {
        "ahead of"
    } else {
        "behind"
    };
    (
        format!(
            "the server clock is {} {direction} this host's (± {})",
            millis(magnitude),
            millis(uncertainty)
        ),
        magnitude > CLOCK_TOLERANCE + uncertainty,
    )
}

/// A server clock's offset from this host's, in microseconds: `server_micros` (since the
/// Unix epoch) read by a request sent at `sent` (this host's wall clock) that took
/// `round_trip`, against the request's midpoint. Half the round trip is how far off it may
/// be.
pub fn clock_offset_micros(server_micros: i64, sent: SystemTime, round_trip: Duration) -> i64 {
    let local = match (sent + round_trip / 2).duration_since(UNIX_EPOCH) {
        Ok(since) => i64::try_from(since.as_micros()).unwrap_or(i64::MAX),
        Err(before) => -i64::try_from(before.duration().as_micros()).unwrap_or(0),
    };
    server_micros.saturating_sub(local)
}

/// The report of a `memory://` store: one finding, since it is process-local.
pub fn memory(store: &str) -> Report {
    Report::new(
        store,
        vec![Check::finding(
            "store",
            "memory:// is process-local: it excludes only within one process, so nothing in another process (this check included) can see its locks",
            "configure a shared store: sqlite:///path/to/file.db for the processes of one host, redis://host for several hosts",
        )],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_well() {
        assert_eq!(millis(Duration::from_micros(420)), "0.42ms");
        assert_eq!(millis(Duration::from_micros(12_340)), "12.3ms");
        assert_eq!(millis(Duration::from_millis(1500)), "1.50s");
    }

    #[test]
    fn reports_are_redacted_and_unreachable_ones_say_why() {
        let report = Report::new("redis://:s3cret@h", vec![Check::ok("connect", "fine")]);
        assert_eq!(report.store, "redis://:***@h");
        assert!(report.reachable && report.is_healthy());
        let report = unreachable("redis://:s3cret@h", Error::unavailable("refused")).unwrap();
        assert_eq!(report.store, "redis://:***@h");
        assert!(!report.reachable && !report.is_healthy());
        assert_eq!(report.checks[0].name, "connect");
        assert!(report.checks[0].detail.ends_with("refused"), "{report:?}");
        for usage in [Error::invalid_input("bad"), Error::unsupported("no tls")] {
            assert!(unreachable("redis://h", usage).is_err());
        }
    }

    #[test]
    fn round_trips_against_the_response_timeout() {
        let ms = Duration::from_millis;
        let fast = round_trip("opened".into(), &[ms(3), ms(1), ms(2)], ms(100));
        assert_eq!(fast.verdict, Verdict::Ok);
        assert_eq!(
            fast.detail,
            "opened; round trip min 1.00ms, median 2.00ms, max 3.00ms over 3"
        );
        let slow = round_trip("opened".into(), &[ms(1), ms(60)], ms(100));
        assert_eq!(slow.verdict, Verdict::Finding, "{slow:?}");
        assert!(
            slow.detail
                .contains("more than half the response timeout (100.0ms)")
        );
        assert_eq!(round_trip("opened".into(), &[], ms(100)).detail, "opened");
    }

    #[test]
    fn clock_offsets_beyond_the_tolerance() {
        let (text, far) = clock_offset(-60, Duration::from_micros(100));
        assert_eq!(
            text,
            "the server clock is 0.06ms behind this host's (± 0.10ms)"
        );
        assert!(!far);
        let (text, far) = clock_offset(1_200_000, Duration::from_millis(100));
        assert!(text.contains("1.20s ahead of"), "{text}");
        assert!(far);
        let (_, far) = clock_offset(1_050_000, Duration::from_millis(100));
        assert!(!far, "within the tolerance plus the uncertainty");
    }

    #[test]
    fn offsets_are_taken_against_the_midpoint() {
        let sent = UNIX_EPOCH + Duration::from_secs(100);
        let rtt = Duration::from_millis(10);
        assert_eq!(clock_offset_micros(100_005_000, sent, rtt), 0);
        assert_eq!(clock_offset_micros(100_000_000, sent, rtt), -5_000);
        assert_eq!(clock_offset_micros(101_005_000, sent, rtt), 1_000_000);
    }

    #[test]
    fn memory_is_a_finding_with_a_fix() {
        let report = memory("memory://");
        assert_eq!(report.findings().count(), 1);
        assert!(report.checks[0].fix.is_some());
    }
}
