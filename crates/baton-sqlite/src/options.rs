//! How an SQLite store is opened: [`SqliteOptions`] and [`Synchronous`].
//!
//! Start from [`SqliteOptions::new`] (the defaults suit most uses) and change what you
//! need; the same options can be given in a `sqlite://` URL's query
//! (`?busy_timeout=5s&synchronous=normal&poll_interval=15ms`). Values are checked when the
//! store is opened, before any I/O.

use std::time::Duration;

use baton_core::options::{self, check_range};
use baton_core::{Error, Result};

/// Default of [`SqliteOptions::busy_timeout`].
pub const DEFAULT_BUSY_TIMEOUT: Duration = Duration::from_secs(5);
/// Default of [`SqliteOptions::poll_interval`].
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_millis(15);

const MIN_BUSY_TIMEOUT: Duration = Duration::from_millis(1);
const MAX_BUSY_TIMEOUT: Duration = Duration::from_secs(3600);
const MIN_POLL_INTERVAL: Duration = Duration::from_millis(1);
const MAX_POLL_INTERVAL: Duration = Duration::from_secs(10);

/// The option names a URL query may hold, for error messages.
const KNOWN_OPTIONS: &[&str] = &["busy_timeout", "synchronous", "poll_interval"];

/// When a commit is synced to disk (`PRAGMA synchronous`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum Synchronous {
    /// Sync the write-ahead log on every commit (the default). Every grant that was
    /// answered survives power loss, so fences never repeat.
    #[default]
    Full,
    /// Sync only at checkpoints: commits are cheaper, and survive a crash of any process,
    /// but the last commits may be lost when the host loses power or the kernel crashes.
    /// All holders die with the host then, but fences handed out in the lost commits may be
    /// handed out again: a fenced resource that recorded one of them would reject the next
    /// holders until the fences pass it.
    Normal,
}

impl Synchronous {
    /// The keyword for `PRAGMA synchronous`.
    pub fn as_sql(self) -> &'static str {
        match self {
            Synchronous::Full => "FULL",
            Synchronous::Normal => "NORMAL",
        }
    }

    fn parse(text: &str) -> Result<Self> {
        if text.eq_ignore_ascii_case("full") {
            Ok(Synchronous::Full)
        } else if text.eq_ignore_ascii_case("normal") {
            Ok(Synchronous::Normal)
        } else {
            Err(Error::invalid_input(format!(
                "synchronous={text:?} is not a known mode; use full (the default) or normal"
            )))
        }
    }
}

/// Options of an SQLite store. Every value has a default; see each setter.
///
/// # Examples
/// ```
/// use std::time::Duration;
/// use baton_sqlite::{SqliteOptions, Synchronous};
///
/// let options = SqliteOptions::new()
///     .busy_timeout(Duration::from_secs(10))
///     .synchronous(Synchronous::Normal);
/// assert_eq!(options.get_poll_interval(), Duration::from_millis(15));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use = "options do nothing until passed to SqliteStore::open"]
pub struct SqliteOptions {
    busy_timeout: Duration,
    synchronous: Synchronous,
    poll_interval: Duration,
}

impl Default for SqliteOptions {
    fn default() -> Self {
        SqliteOptions {
            busy_timeout: DEFAULT_BUSY_TIMEOUT,
            synchronous: Synchronous::Full,
            poll_interval: DEFAULT_POLL_INTERVAL,
        }
    }
}

impl SqliteOptions {
    /// The defaults: 5s busy timeout, `synchronous = FULL`, 15ms poll interval.
    pub fn new() -> Self {
        SqliteOptions::default()
    }

    /// How long an operation waits for another process's write transaction before it fails
    /// with `Unavailable` (default 5s; 1ms to 1h). Transactions are a few statements long,
    /// so waiting processes queue rather than fail.
    pub fn busy_timeout(mut self, timeout: Duration) -> Self {
        self.busy_timeout = timeout;
        self
    }

    /// When commits are synced to disk (default [`Synchronous::Full`]).
    pub fn synchronous(mut self, synchronous: Synchronous) -> Self {
        self.synchronous = synchronous;
        self
    }

    /// How often a waiter re-checks a held key where release wake-ups across processes
    /// cannot be set up (default 15ms; 1ms to 10s): the directory beside the file cannot be
    /// made, or its path is too long for a Unix socket address. Otherwise releases wake the
    /// longest waiter at once and nobody polls. Each waiter re-checks at a random 50-100% of
    /// this, so many waiters spread out.
    pub fn poll_interval(mut self, interval: Duration) -> Self {
        self.poll_interval = interval;
        self
    }

    /// The busy timeout.
    pub fn get_busy_timeout(&self) -> Duration {
        self.busy_timeout
    }

    /// The sync mode.
    pub fn get_synchronous(&self) -> Synchronous {
        self.synchronous
    }

    /// The poll interval.
    pub fn get_poll_interval(&self) -> Duration {
        self.poll_interval
    }

    /// Checks every value against its limits.
    ///
    /// # Errors
    /// `InvalidInput` naming the option and its limits.
    pub fn validate(&self) -> Result<()> {
        check_range(
            "busy_timeout",
            self.busy_timeout,
            MIN_BUSY_TIMEOUT,
            MAX_BUSY_TIMEOUT,
        )?;
        check_range(
            "poll_interval",
            self.poll_interval,
            MIN_POLL_INTERVAL,
            MAX_POLL_INTERVAL,
        )
    }

    /// Applies one `name=value` option from a URL query.
    pub(crate) fn set(self, name: &str, value: &str) -> Result<Self> {
        match name {
            "busy_timeout" => Ok(self.busy_timeout(options::duration(name, value)?)),
            "synchronous" => Ok(self.synchronous(Synchronous::parse(value)?)),
            "poll_interval" => Ok(self.poll_interval(options::duration(name, value)?)),
            _ => Err(options::unknown("sqlite://", name, KNOWN_OPTIONS)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid() {
        let options = SqliteOptions::new();
        options.validate().unwrap();
        assert_eq!(options.get_busy_timeout(), DEFAULT_BUSY_TIMEOUT);
        assert_eq!(options.get_synchronous(), Synchronous::Full);
        assert_eq!(options.get_poll_interval(), DEFAULT_POLL_INTERVAL);
    }

    #[test]
    fn limits_are_checked() {
        let zero = SqliteOptions::new()
            .busy_timeout(Duration::ZERO)
            .validate()
            .unwrap_err();
        assert!(zero.is_invalid_input());
        assert!(zero.message().contains("busy_timeout 0ms"), "{zero}");
        let long = SqliteOptions::new()
            .poll_interval(Duration::from_secs(11))
            .validate()
            .unwrap_err();
        assert!(long.message().contains("poll_interval 11s"), "{long}");
        assert!(long.message().contains("between 1ms and 10s"), "{long}");
    }

    #[test]
    fn synchronous_modes() {
        assert_eq!(Synchronous::parse("FULL").unwrap(), Synchronous::Full);
        assert_eq!(Synchronous::parse("normal").unwrap(), Synchronous::Normal);
        let off = Synchronous::parse("off").unwrap_err();
        assert!(off.message().contains("\"off\""), "{off}");
    }
}
