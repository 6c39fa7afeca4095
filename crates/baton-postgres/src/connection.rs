//! The pool and the one way every statement is run: within the call deadline, retried on a
//! new connection when the pooled one had broken, and behind a transaction pooler unnamed,
//! in a transaction of its own ([`Exec`]).

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use baton_core::store::Renewal;
use baton_core::telemetry::{self, events};
use baton_core::{Error, Result, prefix_upper_bound};
use futures_util::future::BoxFuture;
use futures_util::stream::BoxStream;
use futures_util::{StreamExt, TryStreamExt};
use sqlx::postgres::{PgArguments, PgPoolOptions, PgQueryResult, PgRow, PgStatement, PgTypeInfo};
use sqlx::query::Query;
use sqlx::{Connection, Either, Execute, Executor, PgPool, Postgres};
use tokio::time::timeout;

use crate::error::{exhausted, is_broken_connection, sql_error, timed_out};
use crate::options::{Pooler, PostgresOptions};
use crate::url::Target;

/// A store's pool, the server it talks to (redacted) and its options. Cheap to clone.
#[derive(Debug, Clone)]
pub(crate) struct Db {
    pub(crate) pool: PgPool,
    pub(crate) server: String,
    pub(crate) options: PostgresOptions,
    abandoned: Arc<Abandoned>,
}

/// Where a statement of the store runs: [`Db::exec`].
///
/// On a direct connection (or a session pooler) it is the pool: each statement is prepared
/// once per connection, named, cached, and run in one round trip. Behind a transaction
/// pooler no session state may outlive a transaction, and the driver's statement cache is
/// session state: a named statement prepared on one server connection is missing on the
/// next, or exists there under another client's name (`prepared statement "sqlx_s_1"
/// already exists`). And the driver prepares even an unnamed statement in a round trip of
/// its own, ended by a `Sync` after which the pooler may hand the next message (the `Bind`)
/// to another server connection. So there each statement runs unnamed (never cached)
/// inside a transaction of its own, which keeps one server connection from `BEGIN` to
/// `COMMIT`: four round trips instead of one.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Exec<'a> {
    pool: &'a PgPool,
    pooled: bool,
}

impl<'a> Exec<'a> {
    /// The executor of `pool`'s statements; `unnamed` behind a transaction pooler.
    pub(crate) fn new(pool: &'a PgPool, unnamed: bool) -> Self {
        Exec {
            pool,
            pooled: unnamed,
        }
    }
}

/// A statement run unnamed: never prepared under a name, never cached.
struct Unnamed<E>(E);

impl<'q, E: Execute<'q, Postgres>> Execute<'q, Postgres> for Unnamed<E> {
    fn sql(&self) -> &'q str {
        self.0.sql()
    }

    fn statement(&self) -> Option<&PgStatement<'q>> {
        None
    }

    fn take_arguments(
        &mut self,
    ) -> std::result::Result<Option<sqlx::postgres::PgArguments>, sqlx::error::BoxDynError> {
        self.0.take_arguments()
    }

    fn persistent(&self) -> bool {
        false
    }
}

impl<'c> Executor<'c> for Exec<'c> {
    type Database = Postgres;

    fn fetch_many<'e, 'q: 'e, E>(
        self,
        query: E,
    ) -> BoxStream<'e, std::result::Result<Either<PgQueryResult, PgRow>, sqlx::Error>>
    where
        'c: 'e,
        E: 'q + Execute<'q, Postgres>,
    {
        if !self.pooled {
            return self.pool.fetch_many(query);
        }
        let pool = self.pool;
        futures_util::stream::once(async move {
            let mut tx = pool.begin().await?;
            let all: Vec<_> = (&mut *tx).fetch_many(Unnamed(query)).try_collect().await?;
            tx.commit().await?;
            Ok::<_, sqlx::Error>(futures_util::stream::iter(all.into_iter().map(Ok)))
        })
        .try_flatten()
        .boxed()
    }

    fn fetch_optional<'e, 'q: 'e, E>(
        self,
        query: E,
    ) -> BoxFuture<'e, std::result::Result<Option<PgRow>, sqlx::Error>>
    where
        'c: 'e,
        E: 'q + Execute<'q, Postgres>,
    {
        if !self.pooled {
            return self.pool.fetch_optional(query);
        }
        let pool = self.pool;
        Box::pin(async move {
            let mut tx = pool.begin().await?;
            let row = (&mut *tx).fetch_optional(Unnamed(query)).await?;
            tx.commit().await?;
            Ok(row)
        })
    }

    fn prepare_with<'e, 'q: 'e>(
        self,
        sql: &'q str,
        parameters: &'e [PgTypeInfo],
    ) -> BoxFuture<'e, std::result::Result<PgStatement<'q>, sqlx::Error>>
    where
        'c: 'e,
    {
        self.pool.prepare_with(sql, parameters)
    }

    fn describe<'e, 'q: 'e>(
        self,
        sql: &'q str,
    ) -> BoxFuture<'e, std::result::Result<sqlx::Describe<Postgres>, sqlx::Error>>
    where
        'c: 'e,
    {
        self.pool.describe(sql)
    }
}

/// How long after a statement was abandoned the connections going back to the pool are
/// checked with a bounded ping. The abandoned statement's own connection goes back at once
/// (its guard is dropped with the statement), so this only has to cover a busy runtime.
const RELEASE_CHECK_WINDOW: Duration = Duration::from_secs(10);

/// When a statement was last abandoned mid-flight: its deadline passed, or the caller
/// dropped the call. Its connection goes back to the pool without the answer, possibly on a
/// path that died without a word, and the pool's own check of a returned connection (an
/// unbounded ping, in sqlx 0.8) would then wait forever while holding the connection's
/// slot; with every slot held so, the store would stay unavailable although the server
/// takes new connections. So for a while after an abandonment, returned connections are
/// first pinged within the response timeout, and closed if they do not answer.
#[derive(Debug)]
struct Abandoned {
    epoch: Instant,
    /// Milliseconds since `epoch` of the last abandonment, plus one; 0 for never.
    last: AtomicU64,
}

impl Abandoned {
    fn new() -> Self {
        Abandoned {
            epoch: Instant::now(),
            last: AtomicU64::new(0),
        }
    }

    fn now(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX - 1) + 1
    }

    fn mark(&self) {
        self.last.store(self.now(), Ordering::Relaxed);
    }

    fn recent(&self) -> bool {
        let last = self.last.load(Ordering::Relaxed);
        last != 0 && self.now() - last <= RELEASE_CHECK_WINDOW.as_millis() as u64
    }
}

/// Marks an abandonment when dropped before [`InFlight::done`].
struct InFlight<'a>(Option<&'a Abandoned>);

impl InFlight<'_> {
    fn done(mut self) {
        self.0 = None;
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if let Some(abandoned) = self.0 {
            abandoned.mark();
        }
    }
}

impl Db {
    /// A pool that connects on first use. Connections are not tested before each use (that
    /// would double every round trip): a connection that broke while idle fails its
    /// statement at once, and [`Db::call`] tries again on another.
    pub(crate) fn new(target: &Target, options: PostgresOptions) -> Self {
        let abandoned = Arc::new(Abandoned::new());
        let check = Arc::clone(&abandoned);
        let within = options.get_response_timeout();
        let server = target.redacted.clone();
        let pool = PgPoolOptions::new()
            .max_connections(options.get_max_connections())
            .min_connections(0)
            .acquire_timeout(options.get_connect_timeout())
            .test_before_acquire(false)
            .after_release(move |conn, _| {
                let recent = check.recent();
                let server = server.clone();
                Box::pin(async move {
                    if !recent || matches!(timeout(within, conn.ping()).await, Ok(Ok(()))) {
                        return Ok(true);
                    }
                    telemetry::emit(
                        &events::STORE_CONNECTION_REPLACED,
                        None,
                        format_args!(
                            "a pooled connection to postgres at {server} did not answer within response_timeout after a statement on it was abandoned; it is closed, and the pool opens a new one when needed"
                        ),
                    );
                    // Closes the connection instead of pooling it.
                    Ok(false)
                })
            })
            .connect_lazy_with(target.connect.clone());
        Db {
            pool,
            server: target.redacted.clone(),
            options,
            abandoned,
        }
    }

    /// The executor of the store's statements: see [`Exec`].
    pub(crate) fn exec(&self) -> Exec<'_> {
        Exec::new(&self.pool, self.unnamed())
    }

    /// Whether statements must not be named or cached: behind a transaction pooler.
    pub(crate) fn unnamed(&self) -> bool {
        self.options.get_pooler() == Pooler::Transaction
    }

    /// `e` as the error of `what`, with the cause of a connection that could not be had
    /// within `connect_timeout` found out where the pool cannot tell it: every connection
    /// of the pool was busy ("connection pool exhausted"), or a new one failed, in which case
    /// one more attempt, within `budget`, shows why ("server refused: too many
    /// connections", "connection refused", ...).
    pub(crate) async fn explain(&self, e: sqlx::Error, what: &str, budget: Duration) -> Error {
        if !matches!(e, sqlx::Error::PoolTimedOut) {
            return sql_error(e, what, &self.server);
        }
        let max = self.options.get_max_connections();
        if self.pool.size() >= max && self.pool.num_idle() == 0 {
            return exhausted(what, &self.server, max, self.options.get_connect_timeout());
        }
        let connect = self.pool.connect_options();
        match timeout(budget, sqlx::PgConnection::connect_with(&connect)).await {
            Ok(Err(cause)) => sql_error(cause, what, &self.server),
            Ok(Ok(conn)) => {
                let _ = timeout(budget, conn.close()).await;
                sql_error(e, what, &self.server)
            }
            Err(_) => sql_error(e, what, &self.server),
        }
    }

    /// Runs `attempt` and returns its answer within `connect_timeout + response_timeout`.
    ///
    /// An attempt that failed because its connection was broken (the server restarted, the
    /// connection was terminated) is tried again on another connection, as often as the
    /// pool has connections that may be stale, within the same deadline. A broken attempt
    /// may or may not have run on the server: the later answer is taken only if
    /// `trust_retry` says it means the same either way (always, for idempotent statements);
    /// otherwise the first error stands.
    pub(crate) async fn call<T, F, Fut>(
        &self,
        what: impl Fn() -> String,
        attempt: F,
        trust_retry: impl Fn(&T) -> bool,
    ) -> Result<T>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<T, sqlx::Error>>,
    {
        let deadline = self.options.call_deadline();
        let started = Instant::now();
        let tries = self.options.get_max_connections() + 1;
        let attempts = async {
            let first = match attempt().await {
                Err(e) if is_broken_connection(&e) => e,
                answer => return answer,
            };
            let mut last = None;
            for _ in 0..tries {
                match attempt().await {
                    Ok(answer) if trust_retry(&answer) => return Ok(answer),
                    Ok(_) => return Err(first),
                    Err(e) if is_broken_connection(&e) => last = Some(e),
                    Err(e) => return Err(e),
                }
            }
            Err(last.unwrap_or(first))
        };
        // Declared after `attempts`, so dropped before it: an abandoned statement is marked
        // before its connection goes back to the pool.
        let mut attempts = std::pin::pin!(attempts);
        let in_flight = InFlight(Some(&self.abandoned));
        let answer = timeout(deadline, attempts.as_mut()).await;
        if answer.is_ok() {
            in_flight.done();
        }
        match answer {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(e)) => {
                let left = deadline.saturating_sub(started.elapsed());
                Err(self.explain(e, &what(), left).await)
            }
            Err(_) => Err(timed_out(&what(), &self.server, deadline)),
        }
    }

    /// Runs one conditional UPDATE that renews the caller's own row (a grant, an item's or a
    /// record's lease) and answers whether it did. A rerun after a broken connection is
    /// trusted: a first run that renewed left the row the caller's, so the rerun renews it
    /// again and answers the same.
    pub(crate) async fn renew<'q>(
        &self,
        what: impl Fn() -> String,
        statement: impl Fn() -> Query<'q, Postgres, PgArguments>,
    ) -> Result<Renewal> {
        let changed = self
            .call(
                what,
                || async { Ok(statement().execute(self.exec()).await?.rows_affected()) },
                |_| true,
            )
            .await?;
        Ok(if changed == 1 {
            Renewal::Renewed
        } else {
            Renewal::NotHeld
        })
    }

    /// Runs the read-only `statement` over the names that start with `prefix` (`$1` the
    /// prefix, `$2` its exclusive upper bound, or NULL when it has none) and converts each
    /// row with `row`; a row that does not convert is reported as the call's error.
    pub(crate) async fn by_prefix<T>(
        &self,
        what: impl Fn() -> String,
        statement: &'static str,
        prefix: &str,
        row: impl Fn(&PgRow) -> Result<T, sqlx::Error>,
    ) -> Result<Vec<T>> {
        let upper = prefix_upper_bound(prefix);
        let rows = self
            .call(
                &what,
                || {
                    sqlx::query(statement)
                        .bind(prefix)
                        .bind(upper.as_deref())
                        .fetch_all(self.exec())
                },
                |_| true,
            )
            .await?;
        rows.iter()
            .map(row)
            .collect::<Result<_, _>>()
            .map_err(|e| sql_error(e, &what(), &self.server))
    }
}
