//! [`AcquireOptions`]: the record's TTL, the owner's lease, the request fingerprint, and
//! whether failed records may be retried.

use std::time::Duration;

use crate::error::{Error, Result};
use crate::key::check_text;
use crate::time::{Ttl, format_duration};

/// The owner's lease when none is given (capped at the record's TTL): how long a pending
/// record whose owner stopped renewing it blocks duplicates before one of them takes over.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);
/// Longest fingerprint, in bytes of UTF-8 (a hex SHA-256 is 64).
pub const MAX_FINGERPRINT_BYTES: usize = 256;
/// Most metadata one record stores, in bytes.
pub const MAX_METADATA_BYTES: usize = 1024 * 1024;

/// How to acquire a record: how long it lives, how long its owner's lease lasts, the
/// request's fingerprint, and whether a failed record may be run again.
///
/// Choose the **TTL** as the window in which duplicates must be caught (hours or days for
/// webhooks and payment retries). Choose the **lease** a little longer than the side effect
/// normally takes (or renew it while it runs): it is how long a crashed owner blocks
/// duplicates, and a lease shorter than the work lets a duplicate take over a *live* owner
/// and run the side effect a second time.
///
/// # Examples
/// ```
/// use std::time::Duration;
/// use baton_core::idempotency::AcquireOptions;
///
/// let options = AcquireOptions::new(Duration::from_secs(24 * 3600))
///     .lease(Duration::from_secs(30))
///     .fingerprint("sha256:9f2c...")
///     .retry_failed(true);
/// assert!(options.validate().is_ok());
/// assert!(AcquireOptions::new(Duration::from_secs(5)).lease(Duration::from_secs(6)).validate().is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use = "options do nothing until passed to try_acquire_with"]
pub struct AcquireOptions {
    ttl: Duration,
    lease: Option<Duration>,
    fingerprint: Option<String>,
    retry_failed: bool,
}

/// [`AcquireOptions`] after validation.
#[derive(Debug, Clone)]
pub(crate) struct ValidOptions {
    pub(crate) ttl: Ttl,
    pub(crate) lease: Ttl,
    pub(crate) fingerprint: Option<String>,
    pub(crate) retry_failed: bool,
}

impl AcquireOptions {
    /// A record living `ttl`, with the default lease (30 s, or `ttl` if shorter), no
    /// fingerprint, and failed records not retried.
    pub fn new(ttl: Duration) -> Self {
        AcquireOptions {
            ttl,
            lease: None,
            fingerprint: None,
            retry_failed: false,
        }
    }

    /// The owner's lease: at least 10 ms and at most the TTL.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = Some(lease);
        self
    }

    /// A fingerprint of the request (a hash of its parameters). A record is only taken over
    /// or retried by an attempt with the same fingerprint, and duplicates can tell a retry
    /// from a different request reusing the key ([`Record::fingerprint_matches`]).
    ///
    /// [`Record::fingerprint_matches`]: super::Record::fingerprint_matches
    pub fn fingerprint(mut self, fingerprint: impl Into<String>) -> Self {
        self.fingerprint = Some(fingerprint.into());
        self
    }

    /// Whether a record finalized as [`Failed`](super::Status::Failed) may be acquired again
    /// (by an attempt with the same fingerprint). Off by default.
    pub fn retry_failed(mut self, retry: bool) -> Self {
        self.retry_failed = retry;
        self
    }

    /// Checks the options without any I/O.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidInput`](crate::ErrorKind::InvalidInput) naming the rule broken.
    pub fn validate(&self) -> Result<()> {
        self.checked().map(|_| ())
    }

    pub(crate) fn checked(&self) -> Result<ValidOptions> {
        let ttl = Ttl::new(self.ttl)?;
        let lease = match self.lease {
            Some(lease) => {
                let lease = Ttl::new(lease)
                    .map_err(|e| Error::invalid_input(format!("lease: {}", e.message())))?;
                if lease > ttl {
                    return Err(Error::invalid_input(format!(
                        "lease {} is longer than the record's ttl {}; a record must outlive its owner's lease",
                        format_duration(lease.get()),
                        format_duration(ttl.get())
                    )));
                }
                lease
            }
            None => ttl.min(Ttl::new(DEFAULT_LEASE)?),
        };
        if let Some(fingerprint) = &self.fingerprint {
            check_text("fingerprint", fingerprint, MAX_FINGERPRINT_BYTES)?;
        }
        Ok(ValidOptions {
            ttl,
            lease,
            fingerprint: self.fingerprint.clone(),
            retry_failed: self.retry_failed,
        })
    }
}

/// Checks metadata against [`MAX_METADATA_BYTES`].
pub(crate) fn check_metadata(metadata: &[u8]) -> Result<()> {
    if metadata.len() > MAX_METADATA_BYTES {
        return Err(Error::invalid_input(format!(
            "metadata is {} bytes; the limit is {MAX_METADATA_BYTES} bytes",
            metadata.len()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_limits() {
        let day = Duration::from_secs(86_400);
        let v = AcquireOptions::new(day).checked().unwrap();
        assert_eq!(v.lease.get(), DEFAULT_LEASE);
        assert!(!v.retry_failed);
        let short = AcquireOptions::new(Duration::from_secs(2))
            .checked()
            .unwrap();
        assert_eq!(
            short.lease.get(),
            Duration::from_secs(2),
            "lease capped at ttl"
        );
        let e = AcquireOptions::new(Duration::from_secs(1))
            .lease(Duration::from_secs(2))
            .validate()
            .unwrap_err();
        assert!(e.message().contains("longer than the record's ttl"), "{e}");
        let e = AcquireOptions::new(day)
            .lease(Duration::ZERO)
            .validate()
            .unwrap_err();
        assert!(e.message().starts_with("lease: "), "{e}");
        assert!(AcquireOptions::new(Duration::ZERO).validate().is_err());
        assert!(AcquireOptions::new(day).fingerprint("").validate().is_err());
        assert!(
            AcquireOptions::new(day)
                .fingerprint("f".repeat(257))
                .validate()
                .is_err()
        );
        assert!(
            AcquireOptions::new(day)
                .fingerprint("f".repeat(256))
                .validate()
                .is_ok()
        );
    }

    #[test]
    fn metadata_limit() {
        assert!(check_metadata(&vec![0; MAX_METADATA_BYTES]).is_ok());
        let e = check_metadata(&vec![0; MAX_METADATA_BYTES + 1]).unwrap_err();
        assert!(e.is_invalid_input());
    }
}
