//! How a PostgreSQL store connects and waits: [`PostgresOptions`].
//!
//! Start from [`PostgresOptions::new`] (the defaults suit most uses) and change what you
//! need; the same options can be given in a `postgres://` URL's query
//! (`?connect_timeout=5s&response_timeout=2s&max_connections=10&listen=on&poll_interval=200ms&durable_grants=on&pooler=transaction&listen_url=...`),
//! beside the connection parameters PostgreSQL itself knows (`sslmode`, `application_name`,
//! ...). Values are checked when the store is opened, before any I/O.

use std::time::Duration;

use baton_core::options::{self, check_count, check_range, switch};
use baton_core::{Error, Result};

/// Default of [`PostgresOptions::connect_timeout`].
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Default of [`PostgresOptions::response_timeout`].
pub const DEFAULT_RESPONSE_TIMEOUT: Duration = Duration::from_secs(2);
/// Default of [`PostgresOptions::max_connections`].
pub const DEFAULT_MAX_CONNECTIONS: u32 = 10;
/// Default of [`PostgresOptions::poll_interval`].
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_millis(200);

const MIN_TIMEOUT: Duration = Duration::from_millis(1);
const MAX_TIMEOUT: Duration = Duration::from_secs(300);
const MIN_POLL_INTERVAL: Duration = Duration::from_millis(1);
const MAX_POLL_INTERVAL: Duration = Duration::from_secs(10);
const MAX_CONNECTIONS_LIMIT: u32 = 1000;

/// The option names a URL query may hold besides PostgreSQL's own, for error messages.
pub(crate) const KNOWN_OPTIONS: &[&str] = &[
    "connect_timeout",
    "response_timeout",
    "max_connections",
    "listen",
    "poll_interval",
    "durable_grants",
    "pooler",
    "listen_url",
];

/// What stands between the store and the database server, as far as the store must know.
///
/// Set it with [`PostgresOptions::pooler`] or `pooler=` in the URL (`none`, `session`,
/// `transaction`). `baton doctor` tells which one a URL leads to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Pooler {
    /// A direct connection, or a proxy that gives each client a server connection of its own
    /// for the whole session (PgBouncer `pool_mode = session`): the default. Statements are
    /// prepared once per connection and cached.
    #[default]
    None,
    /// A pooler that keeps one server connection per client session (PgBouncer
    /// `pool_mode = session`). The store behaves as with [`Pooler::None`]; the name only
    /// records the deployment.
    Session,
    /// A pooler that hands a server connection to a client for one transaction only
    /// (PgBouncer `pool_mode = transaction`, PgCat, Supavisor in transaction mode): no
    /// session state survives between transactions, so every statement runs unnamed
    /// (never cached) inside a transaction of its own (`BEGIN`, the statement, `COMMIT`),
    /// and `LISTEN` goes to [`listen_url`](PostgresOptions::listen_url) or is replaced by
    /// polling. See `docs/postgres.md`, "Poolers", for what it costs.
    Transaction,
}

impl Pooler {
    fn parse(value: &str) -> Result<Self> {
        match value.to_ascii_lowercase().as_str() {
            "none" | "off" => Ok(Pooler::None),
            "session" => Ok(Pooler::Session),
            "transaction" => Ok(Pooler::Transaction),
            _ => Err(Error::invalid_input(format!(
                "pooler={value:?} is not one of none, session, transaction"
            ))),
        }
    }
}

/// Options of a PostgreSQL store. Every value has a default; see each setter.
///
/// # Examples
/// ```
/// use std::time::Duration;
/// use baton_postgres::PostgresOptions;
///
/// let options = PostgresOptions::new()
///     .response_timeout(Duration::from_millis(500))
///     .max_connections(4);
/// assert_eq!(options.get_connect_timeout(), Duration::from_secs(5));
/// assert!(options.get_listen());
/// ```
#[derive(Clone, PartialEq, Eq)]
#[must_use = "options do nothing until passed to PostgresStore::open"]
pub struct PostgresOptions {
    connect_timeout: Duration,
    response_timeout: Duration,
    max_connections: u32,
    listen: bool,
    listen_on_demand: bool,
    poll_interval: Duration,
    durable_grants: bool,
    pooler: Pooler,
    listen_url: Option<String>,
}

impl std::fmt::Debug for PostgresOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresOptions")
            .field("connect_timeout", &self.connect_timeout)
            .field("response_timeout", &self.response_timeout)
            .field("max_connections", &self.max_connections)
            .field("listen", &self.listen)
            .field("listen_on_demand", &self.listen_on_demand)
            .field("poll_interval", &self.poll_interval)
            .field("durable_grants", &self.durable_grants)
            .field("pooler", &self.pooler)
            .field(
                "listen_url",
                &self.listen_url.as_deref().map(baton_core::redact_url),
            )
            .finish()
    }
}

impl Default for PostgresOptions {
    fn default() -> Self {
        PostgresOptions {
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            response_timeout: DEFAULT_RESPONSE_TIMEOUT,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            listen: true,
            listen_on_demand: false,
            poll_interval: DEFAULT_POLL_INTERVAL,
            durable_grants: true,
            pooler: Pooler::None,
            listen_url: None,
        }
    }
}

impl PostgresOptions {
    /// The defaults: 5s connect timeout, 2s response timeout, 10 connections, LISTEN on,
    /// 200ms poll interval, durable grants.
    pub fn new() -> Self {
        PostgresOptions::default()
    }

    /// How long a call may wait for a connection: a free one from the pool, or a new one
    /// (TCP, TLS, authentication) (default 5s; 1ms to 5m). In a URL a bare number is
    /// seconds, as libpq reads it (`connect_timeout=10`).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// How long a statement may wait for its answer before the call fails with
    /// `Unavailable` (default 2s; 1ms to 5m). A call never takes longer than
    /// `connect_timeout + response_timeout`. Keep it well below your lock TTLs: a renewal
    /// that waits longer than the TTL cannot save the grant.
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.response_timeout = timeout;
        self
    }

    /// The most connections the store's pool opens (default 10; 1 to 1000). The LISTEN
    /// connection, when there is one, is one more of its own. A call that finds every
    /// connection busy waits up to `connect_timeout` for one, then fails with `Unavailable`
    /// ("connection pool exhausted"). `baton doctor` compares it with the server's
    /// `max_connections`; the `baton` CLI opens its store with 1.
    pub fn max_connections(mut self, max: u32) -> Self {
        self.max_connections = max;
        self
    }

    /// Whether the store keeps a connection that `LISTEN`s for releases (default on). Off,
    /// waiters re-check every [`poll_interval`](Self::poll_interval) instead of waking at a
    /// release. Behind a transaction pooler ([`Pooler::Transaction`]) `LISTEN` goes to
    /// [`listen_url`](Self::listen_url); without one the store polls, and says so once with
    /// `baton.postgres.listen_unavailable` unless `listen` is off.
    pub fn listen(mut self, listen: bool) -> Self {
        self.listen = listen;
        self
    }

    /// Whether the LISTEN connection opens only when a waiter first waits on this store,
    /// instead of when it connects (default off; in a URL, `listen=on-demand`). A process
    /// that never waits, such as a `baton` command that does not wait for a lock, then opens
    /// no connection beyond its pool; the first wait polls at
    /// [`poll_interval`](Self::poll_interval) until the connection listens, and a failing
    /// LISTEN is retried in the background instead of failing connect.
    pub fn listen_on_demand(mut self, on_demand: bool) -> Self {
        self.listen_on_demand = on_demand;
        self
    }

    /// Whether the LISTEN connection waits for the first waiter.
    pub fn get_listen_on_demand(&self) -> bool {
        self.listen_on_demand
    }

    /// How often a waiter re-checks a held key while there is no LISTEN connection (it is
    /// off, or lost and reconnecting) (default 200ms; 1ms to 10s). Each waiter re-checks at
    /// a random 50-100% of this, so many waiters spread out.
    pub fn poll_interval(mut self, interval: Duration) -> Self {
        self.poll_interval = interval;
        self
    }

    /// Whether a lock or lease claim and a renewal wait for their commit to reach the disk
    /// before they answer (default on).
    ///
    /// **On** (the default), an answered grant and its fence survive a crash of the database
    /// server, as every committed row does (`synchronous_commit` as the server sets it). A
    /// handoff then costs one WAL flush: the new holder's claim. Releases never wait for the
    /// disk either way: a release lost in a crash only keeps the key held until its TTL.
    ///
    /// **Off** turns `synchronous_commit` off for the transaction of each claim and renewal of
    /// [`PostgresStore`](crate::PostgresStore) (not for rate limits, the cache, the
    /// idempotency log or [`TableLeases`](crate::TableLeases)), so no handoff waits for the
    /// disk. The risk, and only after the database server itself crashes (not a restart, not a
    /// client or network fault): the grants and renewals answered in the last moments before
    /// the crash, up to three times `wal_writer_delay` (600ms by default), may be lost. A lost
    /// grant lets another holder take the key while the first still works, possibly with the
    /// **same fence** (the fence sequence can lose its advance too), so neither exclusion nor
    /// fencing holds across that crash; a lost renewal leaves the earlier expiry, so the key may be
    /// taken before its holder's `valid_until`. Use it only where a database crash is rare
    /// and a doubled critical section then is acceptable. See `docs/postgres.md`, "Durability
    /// of each statement".
    pub fn durable_grants(mut self, durable: bool) -> Self {
        self.durable_grants = durable;
        self
    }

    /// What stands between the store and the server (default [`Pooler::None`]). With
    /// [`Pooler::Transaction`] nothing depends on session state: every statement runs
    /// unnamed inside a transaction of its own, which costs three more round trips per call
    /// (see `docs/postgres.md`, "Poolers").
    pub fn pooler(mut self, pooler: Pooler) -> Self {
        self.pooler = pooler;
        self
    }

    /// A `postgres://` URL for the LISTEN connection only, e.g. straight to the server behind
    /// a transaction pooler, where `LISTEN` cannot work (default none: LISTEN goes to the
    /// store's own URL). It may carry PostgreSQL's parameters but not baton's options, and
    /// no password (so that no message shows one): without a user it takes the user and
    /// password of the store's URL; otherwise the password comes from `PGPASSWORD` or
    /// `~/.pgpass`. In a store URL, percent-encode it: `listen_url=postgres%3A%2F%2Fdb%3A5432%2Fapp`.
    pub fn listen_url(mut self, url: impl Into<String>) -> Self {
        self.listen_url = Some(url.into());
        self
    }

    /// The pooler.
    pub fn get_pooler(&self) -> Pooler {
        self.pooler
    }

    /// The LISTEN URL, if one was given.
    pub fn get_listen_url(&self) -> Option<&str> {
        self.listen_url.as_deref()
    }

    /// The connect timeout.
    pub fn get_connect_timeout(&self) -> Duration {
        self.connect_timeout
    }

    /// The response timeout.
    pub fn get_response_timeout(&self) -> Duration {
        self.response_timeout
    }

    /// The pool size.
    pub fn get_max_connections(&self) -> u32 {
        self.max_connections
    }

    /// Whether a LISTEN connection is kept.
    pub fn get_listen(&self) -> bool {
        self.listen
    }

    /// The poll interval.
    pub fn get_poll_interval(&self) -> Duration {
        self.poll_interval
    }

    /// Whether claims and renewals wait for their commit to reach the disk.
    pub fn get_durable_grants(&self) -> bool {
        self.durable_grants
    }

    /// The longest any one store call may take: waiting for a connection plus a statement.
    pub(crate) fn call_deadline(&self) -> Duration {
        self.connect_timeout + self.response_timeout
    }

    /// Sets the option `name` from its URL text. `None` when `name` is not one of baton's.
    pub(crate) fn set(self, name: &str, value: &str) -> Option<Result<Self>> {
        Some(match name {
            "connect_timeout" => parse_libpq_timeout(name, value).map(|t| self.connect_timeout(t)),
            "response_timeout" => options::duration(name, value).map(|t| self.response_timeout(t)),
            "max_connections" => options::number(name, value).map(|max| self.max_connections(max)),
            "listen" if value.eq_ignore_ascii_case("on-demand") => {
                Ok(self.listen(true).listen_on_demand(true))
            }
            "listen" => switch(name, value)
                .map_err(|_| {
                    Error::invalid_input(format!(
                        "listen={value:?} is not one of on, off, on-demand"
                    ))
                })
                .map(|on| self.listen(on).listen_on_demand(false)),
            "durable_grants" => switch(name, value).map(|on| self.durable_grants(on)),
            "pooler" => Pooler::parse(value).map(|p| self.pooler(p)),
            "listen_url" => Ok(self.listen_url(value)),
            "poll_interval" => options::duration(name, value).map(|t| self.poll_interval(t)),
            _ => return None,
        })
    }

    /// Checks every value against its range.
    ///
    /// # Errors
    /// `InvalidInput` naming the option and its range.
    pub fn validate(&self) -> Result<()> {
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
        check_range(
            "poll_interval",
            self.poll_interval,
            MIN_POLL_INTERVAL,
            MAX_POLL_INTERVAL,
        )?;
        check_count(
            "max_connections",
            self.max_connections,
            1,
            MAX_CONNECTIONS_LIMIT,
        )
    }
}

/// libpq's `connect_timeout` is whole seconds; baton's durations carry a unit. Both are read.
fn parse_libpq_timeout(name: &str, value: &str) -> Result<Duration> {
    match value.parse::<u64>() {
        Ok(seconds) => Ok(Duration::from_secs(seconds)),
        Err(_) => options::duration(name, value),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(options: PostgresOptions, name: &str, value: &str) -> Result<PostgresOptions> {
        options.set(name, value).expect("a baton option")
    }

    #[test]
    fn defaults_and_setters() {
        let options = PostgresOptions::new();
        options.validate().unwrap();
        assert_eq!(options.call_deadline(), Duration::from_secs(7));
        let options = set(options, "connect_timeout", "250ms").unwrap();
        let options = set(options, "response_timeout", "1s").unwrap();
        let options = set(options, "max_connections", "3").unwrap();
        let demand = set(options.clone(), "listen", "on-demand").unwrap();
        assert!(demand.get_listen() && demand.get_listen_on_demand());
        let options = set(options, "listen", "off").unwrap();
        let options = set(options, "poll_interval", "50ms").unwrap();
        assert_eq!(options.get_pooler(), Pooler::None);
        let options = set(options, "pooler", "Transaction").unwrap();
        assert_eq!(options.get_pooler(), Pooler::Transaction);
        let options = set(options, "listen_url", "postgres://db:5432/app").unwrap();
        assert_eq!(options.get_listen_url(), Some("postgres://db:5432/app"));
        assert!(options.get_durable_grants(), "durable by default");
        let options = set(options, "durable_grants", "OFF").unwrap();
        assert!(!options.get_durable_grants());
        assert_eq!(options.get_connect_timeout(), Duration::from_millis(250));
        assert_eq!(options.get_response_timeout(), Duration::from_secs(1));
        assert_eq!(options.get_max_connections(), 3);
        assert!(!options.get_listen());
        assert_eq!(options.get_poll_interval(), Duration::from_millis(50));
        options.validate().unwrap();
        let libpq = set(PostgresOptions::new(), "connect_timeout", "10").unwrap();
        assert_eq!(libpq.get_connect_timeout(), Duration::from_secs(10));
        assert!(PostgresOptions::new().set("sslmode", "require").is_none());
    }

    #[test]
    fn bad_values_name_the_option() {
        let e = set(PostgresOptions::new(), "response_timeout", "5").unwrap_err();
        assert!(e.message().contains("response_timeout"), "{e}");
        let e = set(PostgresOptions::new(), "listen", "maybe").unwrap_err();
        assert!(e.message().contains("listen"), "{e}");
        let e = set(PostgresOptions::new(), "pooler", "statement").unwrap_err();
        assert!(e.message().contains("pooler=\"statement\""), "{e}");
        let e = set(PostgresOptions::new(), "durable_grants", "sometimes").unwrap_err();
        assert!(e.message().contains("durable_grants=\"sometimes\""), "{e}");
        let e = set(PostgresOptions::new(), "max_connections", "-1").unwrap_err();
        assert!(e.message().contains("max_connections"), "{e}");
        let e = PostgresOptions::new()
            .max_connections(0)
            .validate()
            .unwrap_err();
        assert!(e.message().contains("between 1 and 1000"), "{e}");
        let e = PostgresOptions::new()
            .connect_timeout(Duration::ZERO)
            .validate()
            .unwrap_err();
        assert!(e.message().contains("connect_timeout 0ms"), "{e}");
        let e = PostgresOptions::new()
            .poll_interval(Duration::from_secs(11))
            .validate()
            .unwrap_err();
        assert!(e.message().contains("poll_interval 11s"), "{e}");
    }
}
