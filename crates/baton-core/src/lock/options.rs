//! Options of one lock acquisition.

use std::time::Duration;

use crate::error::{Error, Result};
use crate::holder::Holder;
use crate::key::check_text;
use crate::time::{Ttl, WaitTime, check_keep_alive, format_duration};

/// Longest `max_hold`.
pub const MAX_HOLD_LIMIT: Duration = Duration::from_secs(365 * 24 * 3600);

/// How to acquire a lock: TTL, how long to wait for a holder, and optional keep-alive.
///
/// Build with [`LockOptions::new`] and the setters; the rules that span fields
/// (keep-alive interval below `ttl / 2`, `max_hold` only with keep-alive) are checked by
/// [`LockOptions::validate`], which every acquire calls before any I/O.
///
/// # Examples
/// ```
/// use std::time::Duration;
/// use baton_core::LockOptions;
///
/// let options = LockOptions::new(Duration::from_secs(30))
///     .wait(Duration::from_secs(5))
///     .keep_alive(Duration::from_secs(10))
///     .max_hold(Duration::from_secs(3600));
/// assert!(options.validate().is_ok());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use = "options do nothing until passed to acquire"]
pub struct LockOptions {
    ttl: Duration,
    wait: Duration,
    keep_alive: Option<Duration>,
    max_hold: Option<Duration>,
    label: Option<String>,
}

/// Longest holder label, in bytes.
pub const MAX_LABEL_BYTES: usize = 200;

/// [`LockOptions`] after validation.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ValidOptions {
    pub(crate) ttl: Ttl,
    pub(crate) wait: WaitTime,
    pub(crate) keep_alive: Option<Duration>,
    pub(crate) max_hold: Option<Duration>,
}

impl LockOptions {
    /// A single attempt with this TTL and no keep-alive.
    pub fn new(ttl: Duration) -> Self {
        LockOptions {
            ttl,
            wait: Duration::ZERO,
            keep_alive: None,
            max_hold: None,
            label: None,
        }
    }

    /// Prefixes each acquisition's random holder token with `label` (for example
    /// `host:pid`), so that `inspect`, `list` and contention reports say *who* holds a lock.
    /// The holder stays unique per acquisition: `<label>/<128-bit random hex>`.
    pub fn holder_label(mut self, label: impl Into<String>) -> Self {
        self.label = Some(label.into());
        self
    }

    /// A fresh holder for one acquisition with these options.
    pub(crate) fn new_holder(&self) -> Holder {
        match &self.label {
            Some(label) => Holder::from_stored(format!("{label}/{}", Holder::random())),
            None => Holder::random(),
        }
    }

    /// How long to wait for the current holder; zero (the default) is one attempt.
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }

    /// Renew the grant every `interval` while the guard lives (must be below `ttl / 2`).
    pub fn keep_alive(mut self, interval: Duration) -> Self {
        self.keep_alive = Some(interval);
        self
    }

    /// Stop renewing after the lock has been held this long, so a stuck holder cannot keep
    /// the lock forever. Requires keep-alive.
    pub fn max_hold(mut self, max_hold: Duration) -> Self {
        self.max_hold = Some(max_hold);
        self
    }

    /// Checks every rule.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidInput`](crate::ErrorKind::InvalidInput) naming the field and limit.
    pub fn validate(&self) -> Result<()> {
        self.checked().map(|_| ())
    }

    pub(crate) fn checked(&self) -> Result<ValidOptions> {
        let ttl = Ttl::new(self.ttl)?;
        let wait = WaitTime::new(self.wait)?;
        if let Some(label) = &self.label {
            check_text("holder label", label, MAX_LABEL_BYTES)?;
        }
        if let Some(interval) = self.keep_alive {
            check_keep_alive(interval, ttl)?;
        }
        if let Some(max_hold) = self.max_hold {
            if self.keep_alive.is_none() {
                return Err(Error::invalid_input(
                    "max_hold is set without keep_alive; without renewals a lock is held for at most its ttl anyway",
                ));
            }
            if max_hold < ttl.get() {
                return Err(Error::invalid_input(format!(
                    "max_hold {} is shorter than ttl {}",
                    format_duration(max_hold),
                    format_duration(ttl.get())
                )));
            }
            if max_hold > MAX_HOLD_LIMIT {
                return Err(Error::invalid_input(format!(
                    "max_hold {} is above the maximum of {}",
                    format_duration(max_hold),
                    format_duration(MAX_HOLD_LIMIT)
                )));
            }
        }
        Ok(ValidOptions {
            ttl,
            wait,
            keep_alive: self.keep_alive,
            max_hold: self.max_hold,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cross_field_rules() {
        let s = Duration::from_secs;
        assert!(LockOptions::new(s(30)).validate().is_ok());
        assert!(
            LockOptions::new(s(30))
                .keep_alive(s(15))
                .validate()
                .is_err()
        );
        assert!(LockOptions::new(s(30)).keep_alive(s(0)).validate().is_err());
        let e = LockOptions::new(s(30))
            .max_hold(s(60))
            .validate()
            .unwrap_err();
        assert!(e.message().contains("without keep_alive"), "{e}");
        let e = LockOptions::new(s(30))
            .keep_alive(s(10))
            .max_hold(s(10))
            .validate()
            .unwrap_err();
        assert!(e.message().contains("shorter than ttl"), "{e}");
        assert!(LockOptions::new(s(30)).wait(s(86_401)).validate().is_err());
        assert!(
            LockOptions::new(Duration::from_millis(5))
                .validate()
                .is_err()
        );
    }
}
