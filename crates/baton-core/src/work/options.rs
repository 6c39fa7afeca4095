//! [`QueueOptions`] (a queue's lease, attempts, backoff and de-duplication window),
//! [`EnqueueOptions`] (one item's de-duplication id, delay and overrides), and the limits
//! every input is checked against before any I/O.

use std::time::Duration;

use crate::error::{Error, Result};
use crate::key::check_text;
use crate::time::{Ttl, format_duration};

use super::backoff::Backoff;

/// Longest queue name, in bytes of UTF-8.
pub const MAX_QUEUE_NAME_BYTES: usize = 200;
/// Largest payload of one item, in bytes.
pub const MAX_PAYLOAD_BYTES: usize = 1024 * 1024;
/// Most items one claim or one `enqueue_many` call takes.
pub const MAX_BATCH: u32 = 1000;
/// Longest delay of an item (and longest backoff).
pub const MAX_DELAY: Duration = Duration::from_secs(30 * 86_400);
/// Longest de-duplication id, in bytes of UTF-8.
pub const MAX_DEDUP_ID_BYTES: usize = 256;
/// Most attempts an item may be given.
pub const MAX_ATTEMPTS_LIMIT: u32 = 1000;
/// Longest error text stored with a failed item; longer texts are cut at a character
/// boundary (an error is never a reason to lose the failure).
pub const MAX_ERROR_BYTES: usize = 4096;

/// The lease of a claim when none is given: how long a claimer owns an item without
/// extending it, and so how long a crashed worker's item waits before it is claimed again.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);
/// The number of claims after which a failure dead-letters an item, when none is given.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 5;
/// How long a de-duplication id is remembered, when no window is given.
pub const DEFAULT_DEDUP_WINDOW: Duration = Duration::from_secs(24 * 3600);

/// How a [`Queue`](super::Queue) treats its items: the lease of each claim, the attempts an
/// item gets, the backoff between attempts, and how long de-duplication ids are remembered.
///
/// # Examples
/// ```
/// use std::time::Duration;
/// use baton_core::work::{Backoff, QueueOptions};
///
/// let options = QueueOptions::new()
///     .lease(Duration::from_secs(60))
///     .max_attempts(10)
///     .backoff(Backoff::exponential(Duration::from_secs(5), Duration::from_secs(600)))
///     .dedup_window(Duration::from_secs(3600));
/// assert!(options.validate().is_ok());
/// assert!(QueueOptions::new().max_attempts(0).validate().is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use = "options do nothing until given to Queue::with_options"]
pub struct QueueOptions {
    lease: Duration,
    max_attempts: u32,
    backoff: Backoff,
    dedup_window: Duration,
}

impl QueueOptions {
    /// The defaults: lease 30 s, 5 attempts, backoff 1 s doubling up to 5 minutes with
    /// jitter, de-duplication window 24 h.
    pub fn new() -> Self {
        QueueOptions {
            lease: DEFAULT_LEASE,
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            backoff: Backoff::default(),
            dedup_window: DEFAULT_DEDUP_WINDOW,
        }
    }

    /// How long a claimer owns an item without extending it (10 ms to 30 days). A
    /// [`Worker`](super::Worker) extends it every third of it while the handler runs.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// The number of claims after which a failure dead-letters an item (1 to
    /// [`MAX_ATTEMPTS_LIMIT`]); an item may override it.
    pub fn max_attempts(mut self, max_attempts: u32) -> Self {
        self.max_attempts = max_attempts;
        self
    }

    /// The delay before the next attempt of a failed item.
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// How long a de-duplication id is remembered (10 ms to 30 days); an item may override
    /// it.
    pub fn dedup_window(mut self, window: Duration) -> Self {
        self.dedup_window = window;
        self
    }

    /// Checks every rule.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidInput`](crate::ErrorKind::InvalidInput) naming the field and limit.
    pub fn validate(&self) -> Result<()> {
        self.checked().map(|_| ())
    }

    pub(crate) fn checked(&self) -> Result<ValidQueueOptions> {
        let lease = Ttl::new(self.lease).map_err(|e| rename(e, "ttl", "lease"))?;
        check_attempts(self.max_attempts)?;
        self.backoff.validate()?;
        let dedup_window =
            Ttl::new(self.dedup_window).map_err(|e| rename(e, "ttl", "dedup window"))?;
        Ok(ValidQueueOptions {
            lease,
            max_attempts: self.max_attempts,
            backoff: self.backoff,
            dedup_window,
        })
    }
}

impl Default for QueueOptions {
    fn default() -> Self {
        QueueOptions::new()
    }
}

/// [`QueueOptions`] after validation.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ValidQueueOptions {
    pub(crate) lease: Ttl,
    pub(crate) max_attempts: u32,
    pub(crate) backoff: Backoff,
    pub(crate) dedup_window: Ttl,
}

/// How to enqueue one item: an optional de-duplication id, a delay, and overrides of the
/// queue's window and attempts. The default is none of these.
///
/// # Examples
/// ```
/// use std::time::Duration;
/// use baton_core::work::EnqueueOptions;
///
/// let options = EnqueueOptions::new()
///     .dedup_id("invoice-1042")
///     .delay(Duration::from_secs(30))
///     .max_attempts(3);
/// assert!(options.validate().is_ok());
/// assert!(EnqueueOptions::new().dedup_id("").validate().is_err());
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[must_use = "options do nothing until given to enqueue"]
pub struct EnqueueOptions {
    dedup_id: Option<String>,
    delay: Duration,
    dedup_window: Option<Duration>,
    max_attempts: Option<u32>,
}

impl EnqueueOptions {
    /// No de-duplication, no delay, the queue's window and attempts.
    pub fn new() -> Self {
        EnqueueOptions::default()
    }

    /// Shorthand for `EnqueueOptions::new().dedup_id(id)`.
    pub fn dedup(id: impl Into<String>) -> Self {
        EnqueueOptions::new().dedup_id(id)
    }

    /// The de-duplication id (non-empty, at most [`MAX_DEDUP_ID_BYTES`], no control
    /// characters): another item with this id within the window is not added.
    pub fn dedup_id(mut self, id: impl Into<String>) -> Self {
        self.dedup_id = Some(id.into());
        self
    }

    /// How long after now the item becomes claimable (at most [`MAX_DELAY`]).
    pub fn delay(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }

    /// How long this item's de-duplication id is remembered, instead of the queue's window.
    pub fn dedup_window(mut self, window: Duration) -> Self {
        self.dedup_window = Some(window);
        self
    }

    /// This item's attempts, instead of the queue's.
    pub fn max_attempts(mut self, max_attempts: u32) -> Self {
        self.max_attempts = Some(max_attempts);
        self
    }

    /// Checks every rule that does not depend on the queue.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidInput`](crate::ErrorKind::InvalidInput) naming the field and limit.
    pub fn validate(&self) -> Result<()> {
        if let Some(id) = &self.dedup_id {
            check_text("dedup id", id, MAX_DEDUP_ID_BYTES)?;
        }
        if self.delay > MAX_DELAY {
            return Err(Error::invalid_input(format!(
                "delay {} is above the maximum of {}",
                format_duration(self.delay),
                format_duration(MAX_DELAY)
            )));
        }
        if let Some(window) = self.dedup_window {
            Ttl::new(window).map_err(|e| rename(e, "ttl", "dedup window"))?;
        }
        if let Some(n) = self.max_attempts {
            check_attempts(n)?;
        }
        Ok(())
    }

    /// The item as a store takes it, with the queue's defaults filled in.
    pub(crate) fn resolve<'a>(
        &'a self,
        payload: &'a [u8],
        queue: &ValidQueueOptions,
    ) -> Result<super::store::NewItem<'a>> {
        check_payload(payload)?;
        self.validate()?;
        let window = match self.dedup_window {
            Some(w) => Ttl::new(w)?,
            None => queue.dedup_window,
        };
        Ok(super::store::NewItem {
            payload,
            dedup: self.dedup_id.as_deref().map(|id| (id, window)),
            delay: Duration::from_millis(self.delay.as_millis() as u64),
            max_attempts: self.max_attempts.unwrap_or(queue.max_attempts),
        })
    }
}

pub(crate) fn check_payload(payload: &[u8]) -> Result<()> {
    if payload.len() > MAX_PAYLOAD_BYTES {
        return Err(Error::invalid_input(format!(
            "payload is {} bytes long; the limit is {MAX_PAYLOAD_BYTES} bytes (1 MiB): store large data elsewhere and enqueue its reference",
            payload.len()
        )));
    }
    Ok(())
}

pub(crate) fn check_batch(field: &str, n: usize) -> Result<()> {
    if n == 0 || n > MAX_BATCH as usize {
        return Err(Error::invalid_input(format!(
            "{field} is {n}; it must be from 1 to {MAX_BATCH}"
        )));
    }
    Ok(())
}

fn check_attempts(n: u32) -> Result<()> {
    if n == 0 || n > MAX_ATTEMPTS_LIMIT {
        return Err(Error::invalid_input(format!(
            "max_attempts is {n}; it must be from 1 to {MAX_ATTEMPTS_LIMIT}"
        )));
    }
    Ok(())
}

/// Cuts an error text to [`MAX_ERROR_BYTES`] at a character boundary.
pub(crate) fn error_text(error: &dyn std::fmt::Display) -> String {
    let mut text = error.to_string();
    if text.len() > MAX_ERROR_BYTES {
        let mut cut = MAX_ERROR_BYTES - '…'.len_utf8();
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
        text.push('…');
    }
    text
}

/// Re-words a [`Ttl`] error for the field it was about.
fn rename(error: Error, from: &str, to: &str) -> Error {
    Error::new(error.kind(), error.message().replacen(from, to, 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_options_name_the_field_and_limit() {
        assert!(QueueOptions::new().validate().is_ok());
        let e = QueueOptions::new()
            .lease(Duration::from_millis(5))
            .validate()
            .unwrap_err();
        assert!(
            e.message()
                .contains("lease 5ms is below the minimum of 10ms"),
            "{e}"
        );
        let e = QueueOptions::new()
            .max_attempts(1001)
            .validate()
            .unwrap_err();
        assert!(e.message().contains("max_attempts is 1001"), "{e}");
        let e = QueueOptions::new()
            .dedup_window(Duration::ZERO)
            .validate()
            .unwrap_err();
        assert!(e.message().contains("dedup window 0"), "{e}");
    }

    #[test]
    fn enqueue_options_name_the_field_and_limit() {
        let e = EnqueueOptions::dedup("x".repeat(257))
            .validate()
            .unwrap_err();
        assert!(e.message().contains("dedup id is 257 bytes"), "{e}");
        let e = EnqueueOptions::dedup("a\tb").validate().unwrap_err();
        assert!(e.message().contains("control character"), "{e}");
        let e = EnqueueOptions::new()
            .delay(MAX_DELAY + Duration::from_millis(1))
            .validate()
            .unwrap_err();
        assert!(e.message().contains("delay"), "{e}");
        assert!(EnqueueOptions::new().delay(MAX_DELAY).validate().is_ok());
        let queue = QueueOptions::new().checked().unwrap();
        let big = vec![0; MAX_PAYLOAD_BYTES + 1];
        let e = EnqueueOptions::new().resolve(&big, &queue).unwrap_err();
        assert!(e.message().contains("1048577 bytes"), "{e}");
        let options = EnqueueOptions::dedup("d");
        let item = options.resolve(b"p", &queue).unwrap();
        assert_eq!(item.dedup.unwrap().1.get(), DEFAULT_DEDUP_WINDOW);
        assert_eq!(item.max_attempts, DEFAULT_MAX_ATTEMPTS);
    }

    #[test]
    fn long_errors_are_cut_at_a_character_boundary() {
        let text = error_text(&"€".repeat(2000));
        assert!(
            text.len() <= MAX_ERROR_BYTES && text.ends_with('…'),
            "{}",
            text.len()
        );
        assert_eq!(error_text(&"short"), "short");
    }
}
