//! How a Redis store connects: [`RedisOptions`].
//!
//! Start from [`RedisOptions::new`] (the defaults suit most uses) and change what you need;
//! the same options can be given in a `redis://` URL's query
//! (`?connect_timeout=1s&response_timeout=500ms`). Values are checked when the store is
//! opened, before any I/O.

use std::time::Duration;

use baton_core::Result;
use baton_core::options::{self, check_count, check_range};

/// Default of [`RedisOptions::connect_timeout`].
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Default of [`RedisOptions::response_timeout`].
pub const DEFAULT_RESPONSE_TIMEOUT: Duration = Duration::from_secs(2);

const MIN_TIMEOUT: Duration = Duration::from_millis(1);
const MAX_TIMEOUT: Duration = Duration::from_secs(300);

/// The option names a URL query may hold, for error messages.
const KNOWN_OPTIONS: &[&str] = &["connect_timeout", "response_timeout", "min_replicas"];

/// The largest [`RedisOptions::min_replicas`].
pub const MAX_MIN_REPLICAS: u32 = 32;

/// Options of a Redis store. Every value has a default; see each setter.
///
/// # Examples
/// ```
/// use std::time::Duration;
/// use baton_redis::RedisOptions;
///
/// let options = RedisOptions::new().response_timeout(Duration::from_millis(500));
/// assert_eq!(options.get_connect_timeout(), Duration::from_secs(2));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use = "options do nothing until passed to RedisStore::open"]
pub struct RedisOptions {
    connect_timeout: Duration,
    response_timeout: Duration,
    min_replicas: u32,
}

impl Default for RedisOptions {
    fn default() -> Self {
        RedisOptions {
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            response_timeout: DEFAULT_RESPONSE_TIMEOUT,
            min_replicas: 0,
        }
    }
}

impl RedisOptions {
    /// The defaults: 2s connect timeout, 2s response timeout.
    pub fn new() -> Self {
        RedisOptions::default()
    }

    /// How long one attempt to open a connection (TCP, TLS, `AUTH`, `SELECT`) may take
    /// before it fails with `Unavailable` (default 2s; 1ms to 5m).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// How long a request may wait for its answer before it fails with `Unavailable`
    /// (default 2s; 1ms to 5m). A call that has to reconnect first may take up to
    /// `connect_timeout + response_timeout`, never longer. Keep it well below your lock
    /// TTLs: a renewal that waits longer than the TTL cannot save the grant.
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.response_timeout = timeout;
        self
    }

    /// How many replicas must confirm each claim, renewal and release (`WAIT`) before the
    /// store acknowledges it (default 0: acknowledged once the primary has it; at most
    /// [`MAX_MIN_REPLICAS`]).
    ///
    /// With 1 or more, a grant that was acknowledged is on a replica too, so a replica
    /// promoted after the primary is lost has it: no second holder is granted across the
    /// failover (unless the primary and every confirming replica fail together, or a
    /// replica confirms a write that it then loses; see `docs/redis.md`, "Replication and
    /// failover"). A claim that the replicas do not confirm within the response timeout is
    /// released (best-effort) and answered `Unavailable`, never granted; a renewal or
    /// release that is not confirmed is `Unavailable` too. Each of these calls waits for the
    /// replicas' acknowledgement on the store's one connection, which carries the store's
    /// other requests behind it: a lost replica makes every call wait out the timeout.
    pub fn min_replicas(mut self, replicas: u32) -> Self {
        self.min_replicas = replicas;
        self
    }

    /// How many replicas must confirm a write.
    pub fn get_min_replicas(&self) -> u32 {
        self.min_replicas
    }

    /// How long `WAIT` waits for the replicas, in milliseconds: half the response timeout,
    /// so that its answer arrives before the request times out.
    pub(crate) fn wait_millis(&self) -> u64 {
        (self.response_timeout.as_millis() as u64 / 2).max(1)
    }

    /// The connect timeout.
    pub fn get_connect_timeout(&self) -> Duration {
        self.connect_timeout
    }

    /// The response timeout.
    pub fn get_response_timeout(&self) -> Duration {
        self.response_timeout
    }

    /// The longest any one store call may take: a reconnect plus a request.
    pub(crate) fn call_deadline(&self) -> Duration {
        self.connect_timeout + self.response_timeout
    }

    /// Sets the option `name` from its URL text.
    pub(crate) fn set(self, name: &str, value: &str) -> Result<Self> {
        match name {
            "connect_timeout" => Ok(self.connect_timeout(options::duration_in(
                name,
                value,
                MIN_TIMEOUT,
                MAX_TIMEOUT,
            )?)),
            "response_timeout" => Ok(self.response_timeout(options::duration_in(
                name,
                value,
                MIN_TIMEOUT,
                MAX_TIMEOUT,
            )?)),
            "min_replicas" => Ok(self.min_replicas(options::number(name, value)?)),
            _ => Err(options::unknown("redis://", name, KNOWN_OPTIONS)),
        }
    }

    /// Checks every value against its range.
    ///
    /// # Errors
    /// `InvalidInput` naming the option and its range.
    pub(crate) fn validate(&self) -> Result<()> {
        check_range(
            "connect_timeout",
            self.connect_timeout,
            MIN_TIMEOUT,
            MAX_TIMEOUT,
        )?;
        check_range(
            "response_timeout",
            self.response_timeout,
            MIN_TIMEOUT,
            MAX_TIMEOUT,
        )?;
        check_count("min_replicas", self.min_replicas, 0, MAX_MIN_REPLICAS)
    }
}

impl baton_core::options::QueryOptions for RedisOptions {
    fn set_option(self, name: &str, value: &str) -> Result<Self> {
        self.set(name, value)
    }

    fn check(&self) -> Result<()> {
        self.validate()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_setters() {
        let options = RedisOptions::new();
        assert_eq!(options.get_connect_timeout(), DEFAULT_CONNECT_TIMEOUT);
        assert_eq!(options.get_response_timeout(), DEFAULT_RESPONSE_TIMEOUT);
        assert_eq!(options.call_deadline(), Duration::from_secs(4));
        let options = options
            .set("connect_timeout", "250ms")
            .unwrap()
            .set("response_timeout", "1s")
            .unwrap();
        assert_eq!(options.get_connect_timeout(), Duration::from_millis(250));
        assert_eq!(options.get_response_timeout(), Duration::from_secs(1));
        assert!(options.validate().is_ok());
    }

    #[test]
    fn bad_values_name_the_option() {
        let e = RedisOptions::new().set("connect_timeout", "5").unwrap_err();
        assert!(e.is_invalid_input());
        assert!(e.message().contains("connect_timeout"), "{e}");
        let e = RedisOptions::new()
            .set("response_timeout", "0")
            .unwrap_err();
        assert!(e.message().contains("out of range"), "{e}");
        let e = RedisOptions::new()
            .set("response_timeout", "6m")
            .unwrap_err();
        assert!(e.message().contains("between 1ms and 5m"), "{e}");
        let e = RedisOptions::new().set("timeout", "1s").unwrap_err();
        assert!(
            e.message().contains("unknown redis:// option \"timeout\""),
            "{e}"
        );
        let e = RedisOptions::new()
            .connect_timeout(Duration::ZERO)
            .validate()
            .unwrap_err();
        assert!(e.message().contains("connect_timeout 0ms"), "{e}");
        let e = RedisOptions::new().set("min_replicas", "one").unwrap_err();
        assert!(
            e.message()
                .contains("min_replicas=\"one\" is not a whole number"),
            "{e}"
        );
        let e = RedisOptions::new().min_replicas(33).validate().unwrap_err();
        assert!(e.message().contains("between 0 and 32"), "{e}");
        let options = RedisOptions::new().set("min_replicas", "2").unwrap();
        assert_eq!(options.get_min_replicas(), 2);
        assert_eq!(options.wait_millis(), 1000);
    }
}
