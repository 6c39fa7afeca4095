//! [`PostgresStore`]: the atoms of [`LeaseStore`] as single statements on one PostgreSQL
//! database.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use baton_core::signals::{Handoffs, ReleaseHub};
use baton_core::store::{Claim, HolderInfo, LeaseRequest, LeaseStore, Release, Renewal, Wakeups};
use baton_core::telemetry::{self, events};
use baton_core::time::format_duration;
use baton_core::{Error, Fence, Holder, Result, StoreKey, Ttl, prefix_upper_bound};
use sqlx::Row;
use sqlx::postgres::PgRow;
use tokio::time::timeout;

use crate::connection::Db;
use crate::error::{sql_error, timed_out, unexpected};
use crate::handoff;
use crate::options::{Pooler, PostgresOptions};
use crate::schema::{self, SchemaError};
use crate::sql;
use crate::url::{self, Target};
use crate::wakeups::{Listener, ListenerSpec};

/// How often a claim or release is run again when the key changed between its statement's
/// snapshot and its write (a race with another claimer that the next run settles; each run
/// that races needs the key to change hands during it, so a handful is already rare).
const MAX_RERUNS: usize = 64;

/// A [`LeaseStore`] on one PostgreSQL database.
///
/// Use it when the processes to exclude run on several hosts and PostgreSQL is already part
/// of the deployment: grants are rows, every atom is one statement decided by the database's
/// clock, fences come from a sequence and survive restarts and crashes, and a release wakes
/// the waiters of every process through `LISTEN`/`NOTIFY`. For processes on one host the
/// embedded SQLite store needs no server; for tests, `memory://`.
///
/// Open it with [`PostgresStore::connect`] (a URL, options in the query) or
/// [`PostgresStore::open`] (a URL and [`PostgresOptions`]); most code opens it through
/// `baton::connect("postgres://...")`. To keep stream locks in columns of your own table,
/// see [`TableLeases`](crate::TableLeases).
///
/// ## Behavior
/// - Connecting creates or migrates the schema (versioned, safe when replicas start at the
///   same moment; a schema from a newer baton is refused with `Internal`), then starts the
///   LISTEN connection (see [`crate::wakeups`]).
/// - Each claim, renew and release is one statement ([`crate::sql`]); nothing is held
///   between calls, no session state is used, and no advisory lock is taken, so the pool may
///   sit behind a transaction-pooling proxy (turn `listen` off there).
/// - Expiry is decided by `clock_timestamp()` on the database server, never by `now()` and
///   never by the client's clock.
/// - A claim or renewal answers once its commit is on disk (with the server's
///   `synchronous_commit`), so an answered grant survives a server crash; a release answers,
///   and wakes other processes, without waiting for the disk (a release lost in a crash
///   keeps the key held until its TTL). A handoff therefore costs one WAL flush.
///   [`durable_grants(false)`](PostgresOptions::durable_grants) makes grants skip it too, at
///   the risk stated there.
/// - Fences strictly increase per key across releases, expiry, restarts and crash recovery.
/// - Every call answers within `connect_timeout + response_timeout` or fails with
///   `Unavailable`; a call whose pooled connection had broken (after a server restart) is
///   run again on another, and reconnects by itself.
/// - A release wakes this process's waiters at once and every other process's through
///   `NOTIFY`; while the LISTEN connection is down, waiters poll every
///   [`poll_interval`](PostgresOptions::poll_interval).
///
/// Dropping the store closes its connections.
///
/// # Examples
/// ```no_run
/// # async fn example() -> Result<(), Box<dyn std::error::Error>> {
/// use std::{sync::Arc, time::Duration};
/// use baton_core::{LockOptions, Locks};
/// use baton_postgres::PostgresStore;
///
/// let store = PostgresStore::connect("postgres://app@db.internal/app?sslmode=require").await?;
/// let locks = Locks::new(Arc::new(store));
/// let guard = locks.acquire("nightly-report", &LockOptions::new(Duration::from_secs(30))).await?;
/// // ... work, passing guard.fence() to what you write ...
/// guard.release().await;
/// # Ok(()) }
/// ```
pub struct PostgresStore {
    pub(crate) db: Db,
    pub(crate) hub: Arc<ReleaseHub>,
    /// Whom this store queued for keys, and the grants releases handed to them.
    pub(crate) handoffs: Arc<Handoffs>,
    /// The LISTEN connection: started at connect, or by the first wait with
    /// `listen=on-demand`; never without a `listen_target`.
    listener: OnceLock<Listener>,
    /// Where LISTEN connections go: the store's server, its `listen_url`, or nowhere (listen
    /// off, or a transaction pooler without `listen_url`).
    pub(crate) listen_target: Option<Target>,
    /// The broadcast LISTEN connection, started by the first subscription.
    pub(crate) broadcast: crate::broadcast::HubCell,
    /// Claims made through this store, counted for [`sql::SWEEP`].
    claims: AtomicU64,
}

impl fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresStore")
            .field("server", &self.db.server)
            .field("options", &self.db.options)
            .field("listening", &self.listener.get().map(Listener::is_healthy))
            .finish()
    }
}

impl PostgresStore {
    /// Opens the store named by a `postgres://` or `postgresql://` URL, with PostgreSQL's
    /// parameters (`sslmode`, ...) and baton's options in its query:
    /// `postgres://[user[:password]@]host[:port]/database[?sslmode=require&response_timeout=1s]`.
    ///
    /// # Errors
    /// `InvalidInput` for a malformed URL, parameter or option (before any I/O);
    /// `Unsupported` for an `sslmode` that needs TLS in a build without the `tls` feature;
    /// `Unavailable` when the server cannot be reached, refuses the credentials, or the user
    /// may not create the schema; `Internal` for a schema from a newer baton or a
    /// `baton_lease` table baton did not create.
    pub async fn connect(url: &str) -> Result<Self> {
        let (target, options) = url::parse(url)?;
        PostgresStore::start(target, options).await
    }

    /// Checks `url` as [`connect`](Self::connect) reads it, parameters and options, without
    /// any I/O: how a command line rejects a bad `--store` before it does anything.
    ///
    /// # Errors
    /// `InvalidInput`, as [`connect`](Self::connect) for the same URL.
    pub fn check_url(url: &str) -> Result<()> {
        let (target, options) = url::parse(url)?;
        options.validate()?;
        match options.get_listen_url() {
            Some(listen) => url::parse_listen(listen, &target).map(drop),
            None => Ok(()),
        }
    }

    /// Opens the store at `url` (which may carry PostgreSQL's parameters but not baton's
    /// options) with `options`.
    ///
    /// # Errors
    /// As [`PostgresStore::connect`]; also `InvalidInput` when the URL carries baton's
    /// options.
    pub async fn open(url: &str, options: PostgresOptions) -> Result<Self> {
        let (target, from_url) = url::parse(url)?;
        if from_url != PostgresOptions::new() {
            return Err(Error::invalid_input(format!(
                "store URL {:?} carries baton's options; pass them either in the URL (PostgresStore::connect) or as PostgresOptions, not both",
                target.redacted
            )));
        }
        options.validate()?;
        PostgresStore::start(target, options).await
    }

    async fn start(target: Target, options: PostgresOptions) -> Result<Self> {
        let named = |target: Target| Target {
            connect: match target.connect.get_application_name() {
                Some(_) => target.connect.clone(),
                None => target.connect.clone().application_name("baton"),
            },
            ..target
        };
        let target = named(target);
        let pooled = options.get_pooler() == Pooler::Transaction;
        // Checked before any I/O, as every option.
        let listen_target = match (options.get_listen(), options.get_listen_url()) {
            (false, _) => None,
            (true, Some(url)) => Some(named(url::parse_listen(url, &target)?)),
            (true, None) if pooled => None,
            (true, None) => Some(target.clone()),
        };
        let db = Db::new(&target, options.clone());
        let hub = Arc::new(ReleaseHub::new());
        let handoffs = Arc::new(handoff::new(Arc::clone(&hub), db.clone()));
        // One deadline for everything connecting does: the first connection, the schema (and
        // the wait for its migration lock), and the first LISTEN.
        let deadline = options.call_deadline();
        let started = Instant::now();
        let what = "preparing the schema";
        let left = || deadline.saturating_sub(started.elapsed());
        let preparing = async {
            // Leave the lock wait a quarter of the deadline's end for the migration itself
            // and for the answer to come back.
            let lock_wait = deadline.mul_f64(0.75);
            match schema::prepare(&db.pool, lock_wait).await {
                Ok(()) => Ok(()),
                Err(SchemaError::Sql(e)) => Err(db.explain(e, what, left()).await),
                Err(SchemaError::Refused(why)) => {
                    Err(Error::internal(format!("{}: {why}", db.server)))
                }
                Err(SchemaError::LockHeld) => Err(Error::unavailable(format!(
                    "{}: {what} failed: schema migration lock held by another session for {} (another replica migrating, or a session holding baton's migration lock, advisory lock {}; see pg_locks)",
                    db.server,
                    format_duration(lock_wait),
                    sql::MIGRATION_LOCK
                ))),
            }
        };
        match timeout(deadline, preparing).await {
            Ok(answer) => answer?,
            Err(_) => return Err(timed_out(what, &db.server, deadline)),
        }
        let listener = OnceLock::new();
        match &listen_target {
            Some(_) if options.get_listen_on_demand() => {}
            Some(listen) => {
                let starting = Listener::start(listener_spec(&db, &hub, &handoffs, listen));
                match timeout(left(), starting).await {
                    Ok(started) => {
                        let _ = listener.set(started?);
                    }
                    Err(_) => {
                        return Err(timed_out(
                            &format!("LISTEN {}", sql::CHANNEL),
                            &listen.redacted,
                            deadline,
                        ));
                    }
                }
            }
            None => {}
        }
        if pooled && options.get_listen() && listen_target.is_none() {
            telemetry::emit(
                &events::POSTGRES_LISTEN_UNAVAILABLE,
                None,
                format_args!(
                    "{} is behind a transaction pooler (pooler=transaction), where LISTEN cannot work, and no listen_url is given: waiters re-check every {} instead of waking at a release, and broadcast subscriptions are refused; give listen_url= a direct connection to the server for push wake-ups, or listen=off to say polling is meant",
                    db.server,
                    format_duration(options.get_poll_interval())
                ),
            );
        }
        Ok(PostgresStore {
            db,
            hub,
            handoffs,
            listener,
            listen_target,
            broadcast: Default::default(),
            claims: AtomicU64::new(0),
        })
    }

    /// `url` with `max_connections=1` and `listen=on-demand` added, each when it is a
    /// `postgres://` URL that does not set it (any other text comes back unchanged): how a
    /// program that runs as many short-lived processes, such as the `baton` CLI, keeps to one
    /// connection of the server's per process, and a second only while it waits for a lock
    /// (LISTEN), unless its user asks for more.
    ///
    /// # Examples
    /// ```
    /// use baton_postgres::PostgresStore;
    /// assert_eq!(
    ///     PostgresStore::url_for_short_lived_process("postgres://db/app?sslmode=require"),
    ///     "postgres://db/app?sslmode=require&max_connections=1&listen=on-demand"
    /// );
    /// assert_eq!(
    ///     PostgresStore::url_for_short_lived_process("postgres://db/app?max_connections=4&listen=off"),
    ///     "postgres://db/app?max_connections=4&listen=off"
    /// );
    /// assert_eq!(PostgresStore::url_for_short_lived_process("redis://cache"), "redis://cache");
    /// ```
    #[must_use]
    pub fn url_for_short_lived_process(url: &str) -> String {
        let postgres = url.starts_with("postgres://") || url.starts_with("postgresql://");
        let Ok(parsed) = ::url::Url::parse(url) else {
            return url.to_owned();
        };
        if !postgres || url.contains('#') {
            return url.to_owned();
        }
        let sets = |option: &str| parsed.query_pairs().any(|(name, _)| name == option);
        let mut url = url.to_owned();
        for (option, value) in [("max_connections", "1"), ("listen", "on-demand")] {
            if !sets(option) {
                let sep = if url.contains('?') { '&' } else { '?' };
                url = format!("{url}{sep}{option}={value}");
            }
        }
        url
    }

    /// The options the store was opened with.
    pub fn options(&self) -> &PostgresOptions {
        &self.db.options
    }

    /// Whether the LISTEN connection is listening now (`false` when `listen` is off).
    pub fn is_listening(&self) -> bool {
        self.listener.get().is_some_and(Listener::is_healthy)
    }

    /// Frees `key` whoever holds it, as an operator breaking a stuck lock would; the fence
    /// is kept, and waiters are woken. Its holder learns of it at its next renewal. Returns
    /// whether a live grant was freed.
    ///
    /// # Errors
    /// `Unavailable` or `Internal`, as every operation.
    pub async fn evict(&self, key: &StoreKey) -> Result<bool> {
        let evicted: i64 = self
            .db
            .call(
                || format!("evict of {key}"),
                || {
                    sqlx::query_scalar(sql::EVICT)
                        .bind(key.as_str())
                        .fetch_one(self.db.exec())
                },
                |_| false,
            )
            .await?;
        if evicted > 0 {
            self.hub.notify(key);
        }
        Ok(evicted > 0)
    }

    /// Deletes the rows of keys that have been free for an hour, and returns how many. The
    /// table keeps one row per key ever claimed (so that its fence survives); call this from
    /// a maintenance job when keys are many and short-lived (one per order, say). Fences
    /// stay strictly increasing: a pruned key that is claimed again draws a larger fence.
    ///
    /// # Errors
    /// `Unavailable` or `Internal`, as every operation.
    pub async fn prune(&self) -> Result<u64> {
        self.db
            .call(
                || "prune".to_owned(),
                || async {
                    Ok(sqlx::query(sql::PRUNE)
                        .execute(self.db.exec())
                        .await?
                        .rows_affected())
                },
                |_| true,
            )
            .await
    }

    /// Runs [`sql::SWEEP`] in the background: housekeeping, whose failure costs nothing but
    /// a larger table (the next sweep, or [`PostgresStore::prune`], catches up).
    fn sweep(&self) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let db = self.db.clone();
        runtime.spawn(async move {
            let _ = sqlx::query(sql::SWEEP)
                .bind(sql::SWEEP_LIMIT)
                .execute(db.exec())
                .await;
        });
    }

    /// [`sql::CLAIM`], or [`sql::CLAIM_RELAXED`] when grants need not be durable.
    fn claim_statement(&self) -> &'static str {
        if self.db.options.get_durable_grants() {
            sql::CLAIM
        } else {
            sql::CLAIM_RELAXED
        }
    }

    /// [`sql::RENEW`], or [`sql::RENEW_RELAXED`] when grants need not be durable.
    fn renew_statement(&self) -> &'static str {
        if self.db.options.get_durable_grants() {
            sql::RENEW
        } else {
            sql::RENEW_RELAXED
        }
    }

    fn decode<T>(&self, what: &str, decoded: Result<T, sqlx::Error>) -> Result<T> {
        decoded.map_err(|e| sql_error(e, what, &self.db.server))
    }
}

/// Ends `holder`'s grant of `key` on `db` ([`sql::RELEASE`], or [`sql::RELEASE_RELAXED`]
/// when grants need not be durable), running the statement again while the key changed
/// between its snapshot and its write.
pub(crate) async fn release(db: &Db, key: &StoreKey, holder: &Holder) -> Result<Release> {
    let statement = if db.options.get_durable_grants() {
        sql::RELEASE
    } else {
        sql::RELEASE_RELAXED
    };
    let what = || format!("release of {key}");
    for _ in 0..MAX_RERUNS {
        let row = db
            .call(
                what,
                || {
                    sqlx::query(statement)
                        .bind(key.as_str())
                        .bind(holder.as_str())
                        .fetch_one(db.exec())
                },
                // If the broken attempt released, a retry finds nobody: only an answer that
                // does not depend on it is taken.
                |row| {
                    row.try_get::<i64, _>("removed").is_ok_and(|n| n == 1)
                        || row
                            .try_get::<Option<String>, _>("current")
                            .is_ok_and(|c| c.is_some_and(|c| c != holder.as_str()))
                },
            )
            .await?;
        let decoded = |e| sql_error(e, &what(), &db.server);
        let removed: i64 = row.try_get("removed").map_err(decoded)?;
        let current: Option<String> = row.try_get("current").map_err(decoded)?;
        if removed == 1 {
            return Ok(Release::Removed);
        }
        return Ok(match current {
            Some(by) if by != holder.as_str() => Release::Reclaimed {
                by: Holder::from_stored(by),
            },
            Some(_) => continue,
            None => Release::NoHolder,
        });
    }
    Err(Error::unavailable(format!(
        "{}: {} failed: the key changed hands during each of {MAX_RERUNS} attempts in a row",
        db.server,
        what()
    )))
}

/// The LISTEN connection of a store with pool `db`, hub `hub` and hand-overs `handoffs`, to
/// `target`.
fn listener_spec(
    db: &Db,
    hub: &Arc<ReleaseHub>,
    handoffs: &Arc<Handoffs>,
    target: &Target,
) -> ListenerSpec {
    ListenerSpec {
        connect: target.connect.clone(),
        pool: db.pool.clone(),
        unnamed: db.unnamed(),
        hub: Arc::clone(hub),
        handoffs: Arc::clone(handoffs),
        db: db.clone(),
        options: db.options.clone(),
        server: target.redacted.clone(),
    }
}

fn ttl_millis(ttl: Ttl) -> i64 {
    // At most 30 days: far inside i64.
    ttl.as_millis() as i64
}

fn remaining(micros: i64) -> Duration {
    Duration::from_micros(micros.max(0) as u64)
}

fn fence(raw: i64, what: &str, server: &str) -> Result<Fence> {
    if raw < 1 {
        return Err(unexpected(
            what,
            server,
            format!("a stored fence is {raw}; fences start at 1"),
        ));
    }
    Ok(Fence::new(raw as u64))
}

/// A claim's answer row (see [`sql::CLAIM`]).
struct ClaimRow {
    claimed: bool,
    granted: bool,
    fence: i64,
    holder: Option<String>,
    remaining_us: i64,
}

impl ClaimRow {
    fn read(row: &PgRow) -> Result<Self, sqlx::Error> {
        Ok(ClaimRow {
            claimed: row.try_get("claimed")?,
            granted: row.try_get("granted")?,
            fence: row.try_get("fence")?,
            holder: row.try_get("holder")?,
            remaining_us: row.try_get("remaining_us")?,
        })
    }
}

fn info(row: &PgRow, key: StoreKey) -> Result<(HolderInfo, i64), sqlx::Error> {
    let raw_fence: i64 = row.try_get("fence")?;
    Ok((
        HolderInfo {
            key,
            holder: Holder::from_stored(row.try_get("holder")?),
            fence: Fence::new(raw_fence.max(0) as u64),
            remaining: remaining(row.try_get("remaining_us")?),
            reason: row.try_get("reason")?,
        },
        raw_fence,
    ))
}

impl PostgresStore {
    /// The rows of a listing of the keys that start with `prefix`, as one range read of
    /// their index: `[bounded, open]`, where `bounded` takes `$1` prefix, `$2` its upper
    /// bound ([`prefix_upper_bound`]) and `$3` limit, and `open` (for a prefix that has no
    /// upper bound) `$1` prefix and `$2` limit. No rows for a limit of 0.
    pub(crate) async fn list_by_prefix(
        &self,
        what: impl Fn() -> String,
        [bounded, open]: [&'static str; 2],
        prefix: &str,
        limit: usize,
    ) -> Result<Vec<PgRow>> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let upper = prefix_upper_bound(prefix);
        self.db
            .call(
                what,
                || match &upper {
                    Some(upper) => sqlx::query(bounded)
                        .bind(prefix)
                        .bind(upper.as_str())
                        .bind(limit)
                        .fetch_all(self.db.exec()),
                    None => sqlx::query(open)
                        .bind(prefix)
                        .bind(limit)
                        .fetch_all(self.db.exec()),
                },
                |_| true,
            )
            .await
    }
}

#[async_trait]
impl LeaseStore for PostgresStore {
    async fn claim(&self, key: &StoreKey, request: LeaseRequest<'_>) -> Result<Claim> {
        let (holder, ttl, reason) = (request.holder, request.ttl, request.reason);
        if let Some(handed) = self.handoffs.take(key, holder) {
            // Trusted from memory while at least half its TTL is left; an older one is
            // confirmed by the claim below, which finds the key this holder's and extends it.
            if handed.since.elapsed() < ttl.get() / 2 {
                return Ok(Claim::HandedOver {
                    fence: handed.fence,
                    since: handed.since,
                });
            }
        }
        let pid = handoff::pid(&self.handoffs);
        let queue = pid.is_some() && self.hub.is_waiting(key, holder);
        if queue {
            self.handoffs
                .queueing(key, holder, tokio::time::Instant::now());
        }
        let what = || format!("claim of {key}");
        if self
            .claims
            .fetch_add(1, Ordering::Relaxed)
            .is_multiple_of(sql::SWEEP_EVERY)
        {
            self.sweep();
        }
        for _ in 0..MAX_RERUNS {
            let row = self
                .db
                .call(
                    what,
                    || {
                        sqlx::query(self.claim_statement())
                            .bind(key.as_str())
                            .bind(holder.as_str())
                            .bind(ttl_millis(ttl))
                            .bind(reason)
                            .bind(pid)
                            .bind(queue)
                            .fetch_optional(self.db.exec())
                    },
                    // A claim that ran and was retried comes back as an extension (same
                    // holder): a grant either way.
                    |_| true,
                )
                .await?;
            let Some(row) = row else { continue };
            let row = self.decode(&what(), ClaimRow::read(&row))?;
            if row.claimed {
                self.handoffs.granted(key, holder);
                let fence = fence(row.fence, &what(), &self.db.server)?;
                return Ok(if row.granted {
                    Claim::Granted { fence }
                } else {
                    Claim::Extended { fence }
                });
            }
            match row.holder {
                Some(current) if current != holder.as_str() => {
                    return Ok(Claim::Held {
                        holder: Holder::from_stored(current),
                        remaining: remaining(row.remaining_us),
                    });
                }
                _ => continue,
            }
        }
        Err(Error::unavailable(format!(
            "{}: {} failed: the key changed hands during each of {MAX_RERUNS} attempts in a row",
            self.db.server,
            what()
        )))
    }

    async fn renew(&self, key: &StoreKey, holder: &Holder, ttl: Ttl) -> Result<Renewal> {
        self.db
            .renew(
                || format!("renew of {key}"),
                || {
                    sqlx::query(self.renew_statement())
                        .bind(key.as_str())
                        .bind(holder.as_str())
                        .bind(ttl_millis(ttl))
                },
            )
            .await
    }

    async fn release(&self, key: &StoreKey, holder: &Holder) -> Result<Release> {
        let released = release(&self.db, key, holder).await?;
        if matches!(released, Release::Removed) && !self.is_listening() {
            // The release's NOTIFY reaches this process's waiters too, through the LISTEN
            // connection: only the store whose turn it is wakes. Without one listening, they
            // are told here and keep moving.
            self.hub.notify(key);
        }
        Ok(released)
    }

    async fn inspect(&self, key: &StoreKey) -> Result<Option<HolderInfo>> {
        let what = || format!("inspect of {key}");
        let row = self
            .db
            .call(
                what,
                || {
                    sqlx::query(sql::INSPECT)
                        .bind(key.as_str())
                        .fetch_optional(self.db.exec())
                },
                |_| true,
            )
            .await?;
        let Some(row) = row else { return Ok(None) };
        let (info, raw_fence) = self.decode(&what(), info(&row, key.clone()))?;
        fence(raw_fence, &what(), &self.db.server)?;
        Ok(Some(info))
    }

    async fn list(&self, prefix: &str, limit: usize) -> Result<Vec<HolderInfo>> {
        let what = || format!("list of {prefix}*");
        let rows = self
            .list_by_prefix(what, [sql::LIST, sql::LIST_FROM], prefix, limit)
            .await?;
        rows.iter()
            .map(|row| {
                let key: String = self.decode(&what(), row.try_get("key"))?;
                let (info, raw_fence) =
                    self.decode(&what(), info(row, StoreKey::from_stored(key)))?;
                fence(raw_fence, &what(), &self.db.server)?;
                Ok(info)
            })
            .collect()
    }

    fn wakeups(&self) -> Wakeups {
        if let Some(target) = &self.listen_target
            && self.listener.get().is_none()
            && tokio::runtime::Handle::try_current().is_ok()
        {
            // `listen=on-demand`: the first wait starts the LISTEN connection.
            self.listener.get_or_init(|| {
                Listener::spawn(listener_spec(&self.db, &self.hub, &self.handoffs, target))
            });
        }
        Wakeups {
            hub: Arc::clone(&self.hub),
            poll: (!self.is_listening()).then(|| self.db.options.get_poll_interval()),
        }
    }
}
