//! What `baton doctor` reads about a PostgreSQL server: [`inspect`] returns [`ServerFacts`].
//!
//! These are facts, not verdicts: round-trip times, the server clock against this host's,
//! the version, whether the server is a read-only standby, the baton schema version, and
//! whether a transaction-pooling proxy stands in front. The `baton` facade turns them into
//! findings with fixes.
//!
//! Inspecting opens two connections of its own (not the store's pool) and sends read-only
//! statements, each unprepared (so that a transaction-pooling proxy that cannot keep named
//! prepared statements answers them too). Nothing is created: a database without baton's
//! schema is reported as such.
//!
//! **Transaction pooling.** Two direct connections always have two server backends, and a
//! connection keeps its backend for its whole life. Behind a proxy in transaction mode
//! (PgBouncer's `pool_mode = transaction`, and the like) each transaction borrows whichever
//! backend is idle, so a connection may see its backend change, and two connections may see
//! the same one. [`inspect`] asks `pg_backend_pid()` twice on each of two connections,
//! alternately; either sign is proof. A proxy that happened to hand each connection the same
//! backend every time is not detected (it behaves like session pooling for that moment).

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use baton_core::Result;
use sqlx::{ConnectOptions, Connection};
use tokio::time::timeout;

use crate::error::{sql_error, timed_out};
use crate::sql;
use crate::url;

/// How many `SELECT 1`s measure the round trip.
pub const PINGS: usize = 5;

/// Facts about a PostgreSQL server, as read by [`inspect`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ServerFacts {
    /// The store URL with the password replaced by `***`.
    pub server: String,
    /// The store's response timeout (from the URL, else the default).
    pub response_timeout: Duration,
    /// Whether the store URL asks for `LISTEN`/`NOTIFY` wake-ups (`listen=on`, the default).
    pub listen: bool,
    /// The time of each of [`PINGS`] `SELECT 1`s, in order.
    pub round_trips: Vec<Duration>,
    /// The server clock (`clock_timestamp()`) minus this host's, in microseconds, against
    /// the midpoint of the request.
    pub clock_offset_micros: i64,
    /// Half the round trip of that request: how far off the offset may be.
    pub clock_uncertainty: Duration,
    /// `server_version`.
    pub version: String,
    /// `pg_is_in_recovery()`: a standby, which refuses writes.
    pub in_recovery: bool,
    /// `default_transaction_read_only`.
    pub read_only: bool,
    /// The baton schema version recorded in `baton_schema`.
    pub schema: SchemaState,
    /// How a transaction-pooling proxy gave itself away (see the [module docs](self)), or
    /// `None` when nothing did.
    pub transaction_pooling: Option<String>,
}

/// The baton schema in the database.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SchemaState {
    /// No `baton_schema` table in the `search_path`: the store creates it at first connect.
    Missing,
    /// `baton_schema` exists but records no version: baton did not create it.
    Unrecorded,
    /// The recorded version, to compare with [`sql::SCHEMA_VERSION`].
    Version(i32),
}

/// Reads the facts about the server named by a `postgres://` or `postgresql://` URL.
///
/// # Errors
/// `InvalidInput` for a malformed URL or option (as
/// [`PostgresStore::connect`](crate::PostgresStore::connect)); `Unavailable` when the
/// server cannot be reached or a step gets no answer within the store's deadline
/// (`connect_timeout + response_timeout`).
pub async fn inspect(url: &str) -> Result<ServerFacts> {
    let (target, options) = url::parse(url)?;
    let server = target.redacted.clone();
    let deadline = options.call_deadline();
    let step = |what: &'static str| (what, server.as_str(), deadline);
    let connect = || async { within(step("connecting"), target.connect.clone().connect()).await };

    let mut first = connect().await?;
    let mut round_trips = Vec::with_capacity(PINGS);
    for _ in 0..PINGS {
        let started = Instant::now();
        within(
            step("SELECT 1"),
            sqlx::query("SELECT 1")
                .persistent(false)
                .execute(&mut first),
        )
        .await?;
        round_trips.push(started.elapsed());
    }

    let before = SystemTime::now();
    let started = Instant::now();
    let server_micros: i64 = within(
        step("reading the clock"),
        sqlx::query_scalar("SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint")
            .persistent(false)
            .fetch_one(&mut first),
    )
    .await?;
    let round_trip = started.elapsed();
    let local_micros = micros_since_epoch(before + round_trip / 2);

    let (version, in_recovery, read_only): (String, bool, String) = within(
        step("reading the server's settings"),
        sqlx::query_as(
            "SELECT current_setting('server_version'), pg_is_in_recovery(), current_setting('default_transaction_read_only')",
        )
        .persistent(false)
        .fetch_one(&mut first),
    )
    .await?;

    let exists: bool = within(
        step("looking for baton_schema"),
        sqlx::query_scalar(sql::RELATION_EXISTS)
            .bind("baton_schema")
            .persistent(false)
            .fetch_one(&mut first),
    )
    .await?;
    let schema = if exists {
        let version: Option<i32> = within(
            step("reading the schema version"),
            sqlx::query_scalar(sql::SCHEMA_VERSION_OF)
                .persistent(false)
                .fetch_optional(&mut first),
        )
        .await?;
        version.map_or(SchemaState::Unrecorded, SchemaState::Version)
    } else {
        SchemaState::Missing
    };

    // Alternate between two connections: first, second, first, second.
    let mut second = connect().await?;
    let mut pids = [Vec::new(), Vec::new()];
    for round in 0..4 {
        let conn = if round % 2 == 0 {
            &mut first
        } else {
            &mut second
        };
        let pid: i32 = within(
            step("SELECT pg_backend_pid()"),
            sqlx::query_scalar("SELECT pg_backend_pid()")
                .persistent(false)
                .fetch_one(conn),
        )
        .await?;
        pids[round % 2].push(pid);
    }
    let _ = first.close().await;
    let _ = second.close().await;

    Ok(ServerFacts {
        response_timeout: options.get_response_timeout(),
        listen: options.get_listen(),
        round_trips,
        clock_offset_micros: server_micros.saturating_sub(local_micros),
        clock_uncertainty: round_trip / 2,
        version,
        in_recovery,
        read_only: read_only == "on",
        schema,
        transaction_pooling: pooling_evidence(&pids[0], &pids[1]),
        server,
    })
}

/// How the backend pids seen by two connections betray transaction pooling, if they do.
fn pooling_evidence(first: &[i32], second: &[i32]) -> Option<String> {
    let changed = |pids: &[i32]| pids.windows(2).any(|w| w[0] != w[1]);
    if changed(first) || changed(second) {
        return Some(format!(
            "one connection's server backend changed between transactions (pg_backend_pid {first:?} and {second:?})"
        ));
    }
    first.iter().find(|pid| second.contains(pid)).map(|pid| {
        format!("two connections were served by the same server backend (pg_backend_pid {pid})")
    })
}

fn micros_since_epoch(at: SystemTime) -> i64 {
    match at.duration_since(UNIX_EPOCH) {
        Ok(since) => i64::try_from(since.as_micros()).unwrap_or(i64::MAX),
        Err(before) => -i64::try_from(before.duration().as_micros()).unwrap_or(0),
    }
}

/// Awaits one step within the deadline.
async fn within<T>(
    (what, server, deadline): (&'static str, &str, Duration),
    request: impl Future<Output = std::result::Result<T, sqlx::Error>>,
) -> Result<T> {
    match timeout(deadline, request).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(e)) => Err(sql_error(e, what, server)),
        Err(_) => Err(timed_out(what, server, deadline)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn direct_connections_show_no_pooling() {
        assert_eq!(pooling_evidence(&[101, 101], &[202, 202]), None);
    }

    #[test]
    fn a_shared_or_changing_backend_is_pooling() {
        let shared = pooling_evidence(&[101, 101], &[101, 101]).unwrap();
        assert!(shared.contains("same server backend"), "{shared}");
        let changed = pooling_evidence(&[101, 202], &[303, 303]).unwrap();
        assert!(changed.contains("changed"), "{changed}");
    }
}
