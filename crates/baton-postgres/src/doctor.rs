//! What `baton doctor` checks about a PostgreSQL server: [`inspect`] reads the facts
//! ([`ServerFacts`]) and [`diagnose`] judges them into a [`Report`] of checks with fixes.
//!
//! The facts are round-trip times, the server clock against this host's,
//! the version, whether the server is a read-only standby, the settings that decide whether
//! a commit is on disk when it answers (`synchronous_commit`, `fsync`, and the URL's
//! `durable_grants`), the versions of the lease schema (`baton_schema`) and of the
//! claimable-work tables (`baton_work_schema`), and whether a transaction-pooling proxy
//! stands in front.
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

use std::time::{Duration, Instant, SystemTime};

use baton_core::Result;
use baton_core::doctor::{self, Check, Report, clock_offset, millis, round_trip};
use sqlx::{ConnectOptions, Connection};
use tokio::time::timeout;

use crate::error::{sql_error, timed_out};
use crate::options::Pooler;
use crate::sql;
use crate::sql::SCHEMA_VERSION;
use crate::url;
use crate::work::sql as work_sql;
use crate::work::sql::SCHEMA_VERSION as WORK_SCHEMA_VERSION;

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
    /// The store URL's `pooler` (default [`Pooler::None`]).
    pub pooler: Pooler,
    /// Whether the store URL gives a `listen_url` for the LISTEN connection.
    pub listen_url: bool,
    /// The store's pool size: the URL's `max_connections`, else the default.
    pub pool_size: u32,
    /// The server's `max_connections`.
    pub server_max_connections: u32,
    /// The server's `superuser_reserved_connections`: slots that only superusers may take.
    pub reserved_connections: u32,
    /// Whether the store URL leaves claims and renewals waiting for their commit to reach
    /// the disk (`durable_grants=on`, the default).
    pub durable_grants: bool,
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
    /// `synchronous_commit` as this user's sessions get it (`on`, `off`, `local`,
    /// `remote_write`, `remote_apply`): only `off` answers a commit before its WAL flush.
    pub synchronous_commit: String,
    /// `fsync`: with `off` the server never forces the WAL to disk.
    pub fsync: bool,
    /// The lease schema's version, recorded in `baton_schema` (compare with
    /// [`sql::SCHEMA_VERSION`]).
    pub schema: SchemaState,
    /// The claimable-work tables' version, recorded in `baton_work_schema` (compare with
    /// [`work::sql::SCHEMA_VERSION`](crate::work::sql::SCHEMA_VERSION)).
    pub work_schema: SchemaState,
    /// How a transaction-pooling proxy gave itself away (see the [module docs](self)), or
    /// `None` when nothing did.
    pub transaction_pooling: Option<String>,
}

/// One of baton's schema version tracks in the database: the lease schema
/// (`baton_schema`) or the claimable-work tables (`baton_work_schema`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SchemaState {
    /// No version table in the `search_path`: the store creates it at its next connect.
    Missing,
    /// The version table exists but records no version: baton did not create it.
    Unrecorded,
    /// The recorded version, to compare with the track's `SCHEMA_VERSION`.
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

    #[allow(clippy::type_complexity)]
    let (version, in_recovery, read_only, synchronous_commit, fsync, max_conn, reserved): (
        String,
        bool,
        String,
        String,
        String,
        i32,
        i32,
    ) = within(
        step("reading the server's settings"),
        sqlx::query_as(
            "SELECT current_setting('server_version'), pg_is_in_recovery(), current_setting('default_transaction_read_only'), current_setting('synchronous_commit'), current_setting('fsync'), current_setting('max_connections')::int, current_setting('superuser_reserved_connections')::int",
        )
        .persistent(false)
        .fetch_one(&mut first),
    )
    .await?;

    let schema = schema_state(
        &mut first,
        ("baton_schema", sql::SCHEMA_VERSION_OF),
        step("reading the schema version"),
    )
    .await?;
    let work_schema = schema_state(
        &mut first,
        ("baton_work_schema", work_sql::SCHEMA_VERSION_OF),
        step("reading the work-schema version"),
    )
    .await?;

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
        pooler: options.get_pooler(),
        listen_url: options.get_listen_url().is_some(),
        pool_size: options.get_max_connections(),
        server_max_connections: u32::try_from(max_conn).unwrap_or(0),
        reserved_connections: u32::try_from(reserved).unwrap_or(0),
        durable_grants: options.get_durable_grants(),
        round_trips,
        clock_offset_micros: doctor::clock_offset_micros(server_micros, before, round_trip),
        clock_uncertainty: round_trip / 2,
        version,
        in_recovery,
        read_only: read_only == "on",
        synchronous_commit,
        fsync: fsync == "on",
        schema,
        work_schema,
        transaction_pooling: pooling_evidence(&pids[0], &pids[1]),
        server,
    })
}

/// The version recorded in `table` (read with `version_of`), looking for the table first.
async fn schema_state(
    conn: &mut sqlx::PgConnection,
    (table, version_of): (&'static str, &'static str),
    step: (&'static str, &str, Duration),
) -> Result<SchemaState> {
    let exists: bool = within(
        step,
        sqlx::query_scalar(sql::RELATION_EXISTS)
            .bind(table)
            .persistent(false)
            .fetch_one(&mut *conn),
    )
    .await?;
    if !exists {
        return Ok(SchemaState::Missing);
    }
    let version: Option<i32> = within(
        step,
        sqlx::query_scalar(version_of)
            .persistent(false)
            .fetch_optional(&mut *conn),
    )
    .await?;
    Ok(version.map_or(SchemaState::Unrecorded, SchemaState::Version))
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

/// Checks the PostgreSQL deployment named by a `postgres://` URL from the facts
/// [`inspect`] reads, changing nothing (the store is not opened: that would create or
/// migrate the schema): round trip, version and role, the clock, both schema versions,
/// durable grants, a transaction pooler in front, and the pool against the server's
/// connection slots.
///
/// # Errors
/// `InvalidInput` for a malformed URL or option; `Unsupported` for an `sslmode` this build
/// cannot serve. A server that cannot be reached is not an error: the report says so.
pub async fn diagnose(url: &str) -> Result<Report> {
    let started = std::time::Instant::now();
    // Opening the store as an application does would create or migrate the schema;
    // the doctor changes nothing, so it only reads.
    let facts = match inspect(url).await {
        Ok(facts) => facts,
        Err(e) => return doctor::unreachable(url, e),
    };
    let opened = started.elapsed();
    Ok(Report::new(&facts.server, checks(&facts, opened)))
}

fn checks(facts: &ServerFacts, opened: Duration) -> Vec<Check> {
    vec![
        round_trip(
            format!(
                "connected and read the facts over two connections in {}; SELECT 1",
                millis(opened)
            ),
            &facts.round_trips,
            facts.response_timeout,
        ),
        server(facts),
        clock(facts),
        schema(facts),
        work_schema(facts),
        durable_grants(facts),
        pooling(facts),
        connections(facts),
    ]
}

fn server(facts: &ServerFacts) -> Check {
    let role = if facts.in_recovery {
        "a standby"
    } else {
        "a primary"
    };
    let detail = format!("PostgreSQL {}, {role}", facts.version);
    if facts.in_recovery {
        Check::finding(
            "server",
            format!("{detail}: a standby refuses writes, so no lock can be taken"),
            "point the store URL at the primary (or at a name that follows failover)",
        )
    } else if facts.read_only {
        Check::finding(
            "server",
            format!("{detail}, with default_transaction_read_only on: every claim would fail"),
            "turn default_transaction_read_only off for baton's user or database (ALTER ROLE ... SET default_transaction_read_only = off)",
        )
    } else {
        Check::ok("server", detail)
    }
}

fn clock(facts: &ServerFacts) -> Check {
    let (offset, far) = clock_offset(facts.clock_offset_micros, facts.clock_uncertainty);
    let detail = format!(
        "{offset}; expiry is decided by the server's clock_timestamp() alone, fences come from a sequence"
    );
    if far {
        Check::finding(
            "clock",
            format!(
                "{detail}: clocks this far apart mean one is not synchronized, and when the server's is corrected a forward step expires grants early, while their holders still count their TTL"
            ),
            "synchronize the clocks of the server and of this host with NTP, slewing rather than stepping (chrony, systemd-timesyncd)",
        )
    } else {
        Check::ok("clock", detail)
    }
}

/// One of baton's version tracks in the database: the lease schema or the claimable-work
/// tables.
#[derive(Clone, Copy)]
struct Track {
    /// The check's name.
    check: &'static str,
    /// The table that records the version.
    table: &'static str,
    /// How the detail names the schema.
    label: &'static str,
    /// What the store creates when the table is missing.
    creates: &'static str,
    /// The version this build understands.
    current: i32,
}

const LEASES: Track = Track {
    check: "schema",
    table: "baton_schema",
    label: "baton schema",
    creates: "the schema at first connect",
    current: SCHEMA_VERSION,
};

const WORK: Track = Track {
    check: "work-schema",
    table: "baton_work_schema",
    label: "baton work schema",
    creates: "the claimable-work tables (queues, schedules, migration records) at its next connect",
    current: WORK_SCHEMA_VERSION,
};

fn schema(facts: &ServerFacts) -> Check {
    version_track(&LEASES, facts.schema)
}

fn work_schema(facts: &ServerFacts) -> Check {
    version_track(&WORK, facts.work_schema)
}

/// Missing or older: a note (the store creates or migrates it); unrecorded, newer than
/// this build or below 1 (which the store refuses): a finding.
fn version_track(track: &Track, state: SchemaState) -> Check {
    let Track {
        check,
        table,
        label,
        creates,
        current,
    } = *track;
    match state {
        SchemaState::Missing => Check::note(
            check,
            format!(
                "no {table} table in the search_path: the store creates {creates} (its user needs CREATE on the schema)"
            ),
            None,
        ),
        SchemaState::Unrecorded => Check::finding(
            check,
            format!(
                "{table} exists but records no version: baton did not create it and will not use it"
            ),
            "point the store at another schema (?options=-csearch_path%3D<schema>), or drop the stray table",
        ),
        SchemaState::Version(v) if v > current => Check::finding(
            check,
            format!(
                "the {label} is version {v}, newer than version {current} that this baton understands"
            ),
            "upgrade baton to the version that wrote the schema",
        ),
        SchemaState::Version(v) if v < 1 => Check::finding(
            check,
            format!(
                "the {label} is version {v}, which no baton wrote: the store refuses to use it"
            ),
            "point the store at another schema (?options=-csearch_path%3D<schema>), or drop the stray table",
        ),
        SchemaState::Version(v) if v < current => Check::note(
            check,
            format!(
                "the {label} is version {v}; this baton migrates it to {current} at its first connect"
            ),
            None,
        ),
        SchemaState::Version(v) => Check::ok(check, format!("{label} version {v}")),
    }
}

/// Whether an answered grant survives a crash: the URL's `durable_grants` and the
/// server's `synchronous_commit` and `fsync` must all let a claim's commit reach the
/// disk before it answers. Each is a choice someone made, so a note, as Redis
/// persistence and SQLite's `synchronous=normal` are.
fn durable_grants(facts: &ServerFacts) -> Check {
    let mut causes = Vec::new();
    let mut fixes = Vec::new();
    if !facts.durable_grants {
        causes.push("durable_grants=off in the store URL");
        fixes.push(
            "remove durable_grants=off from the store URL (durable_grants=on is the default)",
        );
    }
    if facts.synchronous_commit == "off" {
        causes.push("synchronous_commit is off for this user's sessions");
        fixes.push("turn synchronous_commit back on for baton's role or database (ALTER ROLE ... SET synchronous_commit = on)");
    }
    if !facts.fsync {
        causes.push("the server runs with fsync=off");
        fixes.push("set fsync = on in the server's configuration");
    }
    if causes.is_empty() {
        return Check::ok(
            "durable-grants",
            format!(
                "durable_grants=on, synchronous_commit {}, fsync on: a claim or renewal answers only once its commit is flushed to the WAL, so an answered grant and its fence survive a server crash",
                facts.synchronous_commit
            ),
        );
    }
    Check::note(
        "durable-grants",
        format!(
            "{}: claims and renewals answer before their commit is on disk, so a crash of the server or its host can lose an answered grant and hand the key, possibly with the same fence, to a second holder",
            causes.join(", and ")
        ),
        Some(format!(
            "{} to have grants flushed before they are returned",
            fixes.join("; ")
        )),
    )
}

fn pooling(facts: &ServerFacts) -> Check {
    use crate::Pooler;
    let pooled = facts.pooler == Pooler::Transaction;
    match (&facts.transaction_pooling, pooled) {
        (Some(evidence), false) => Check::finding(
            "pooling",
            format!(
                "a transaction-pooling proxy is in front ({evidence}): statements prepared under a name on one server connection are looked up on another, so every command fails (prepared statement \"sqlx_s_1\" already exists), with listen on or off"
            ),
            "add pooler=transaction to the store URL (every statement then runs unnamed in a transaction of its own), and listen_url=<a direct postgres:// URL of the server, percent-encoded> for release wake-ups (without it waiters poll every poll_interval)",
        ),
        (Some(evidence), true) if facts.listen && !facts.listen_url => Check::note(
            "pooling",
            format!(
                "a transaction-pooling proxy is in front ({evidence}) and the URL says pooler=transaction; with no listen_url, waiters poll every poll_interval and broadcast is refused"
            ),
            Some(
                "add listen_url=<a direct postgres:// URL of the server, percent-encoded> for push wake-ups, or listen=off to say polling is meant".into(),
            ),
        ),
        (Some(evidence), true) => Check::ok(
            "pooling",
            format!(
                "a transaction-pooling proxy is in front ({evidence}) and the URL says pooler=transaction"
            ),
        ),
        (None, true) => Check::note(
            "pooling",
            "the URL says pooler=transaction, but no transaction-pooling proxy was detected: every call pays three extra round trips (BEGIN, a separate prepare, COMMIT)",
            Some(
                "remove pooler=transaction when baton connects directly or through session pooling".into(),
            ),
        ),
        (None, false) => Check::ok(
            "pooling",
            "no transaction-pooling proxy detected: two connections kept two server backends of their own",
        ),
    }
}

/// The store's pool (and its LISTEN connection) against the server's connection slots.
fn connections(facts: &ServerFacts) -> Check {
    let per_process = facts.pool_size + u32::from(facts.listen);
    let slots = facts
        .server_max_connections
        .saturating_sub(facts.reserved_connections);
    let detail = format!(
        "each process of this store opens up to {per_process} connection(s) (max_connections={} in the URL{}); the server has max_connections={} ({} reserved for superusers), room for {} such processes at once",
        facts.pool_size,
        if facts.listen {
            ", plus one to LISTEN"
        } else {
            ""
        },
        facts.server_max_connections,
        facts.reserved_connections,
        slots / per_process.max(1)
    );
    if facts.transaction_pooling.is_some() {
        return Check::ok(
            "connections",
            format!(
                "{detail}; behind the transaction pooler, the pooler's own pool size is what the server sees"
            ),
        );
    }
    if per_process > slots {
        return Check::finding(
            "connections",
            detail,
            "lower max_connections in the store URL, or raise the server's max_connections",
        );
    }
    Check::ok("connections", detail)
}

#[cfg(test)]
mod tests {
    use baton_core::doctor::Verdict;

    use super::*;

    fn healthy() -> ServerFacts {
        ServerFacts {
            server: "postgres://app:***@db/coord".into(),
            response_timeout: Duration::from_secs(2),
            listen: true,
            pooler: Pooler::None,
            listen_url: false,
            pool_size: 10,
            server_max_connections: 100,
            reserved_connections: 3,
            durable_grants: true,
            round_trips: vec![Duration::from_micros(300); PINGS],
            clock_offset_micros: -80,
            clock_uncertainty: Duration::from_micros(100),
            version: "16.4".into(),
            in_recovery: false,
            read_only: false,
            synchronous_commit: "on".into(),
            fsync: true,
            schema: SchemaState::Version(sql::SCHEMA_VERSION),
            work_schema: SchemaState::Version(work_sql::SCHEMA_VERSION),
            transaction_pooling: None,
        }
    }

    /// The one check named `name`.
    fn verdict(facts: &ServerFacts, name: &str) -> Check {
        let found: Vec<_> = checks(facts, Duration::from_millis(3))
            .into_iter()
            .filter(|c| c.name == name)
            .collect();
        assert_eq!(found.len(), 1, "{name}: {found:?}");
        found.into_iter().next().unwrap()
    }

    #[test]
    fn a_healthy_server_has_no_findings() {
        let checks = checks(&healthy(), Duration::from_millis(3));
        let names: Vec<_> = checks.iter().map(|c| c.name).collect();
        assert_eq!(
            names,
            [
                "connect",
                "server",
                "clock",
                "schema",
                "work-schema",
                "durable-grants",
                "pooling",
                "connections"
            ]
        );
        assert!(
            checks.iter().all(|c| c.verdict == Verdict::Ok),
            "{checks:#?}"
        );
    }

    #[test]
    fn schema_versions_missing_older_newer_and_stray() {
        let at = |schema| {
            verdict(
                &ServerFacts {
                    schema,
                    ..healthy()
                },
                "schema",
            )
        };
        assert_eq!(at(SchemaState::Missing).verdict, Verdict::Note);
        assert_eq!(at(SchemaState::Unrecorded).verdict, Verdict::Finding);
        assert_eq!(at(SchemaState::Version(0)).verdict, Verdict::Finding);
        let newer = at(SchemaState::Version(sql::SCHEMA_VERSION + 1));
        assert_eq!(newer.verdict, Verdict::Finding);
        assert!(newer.fix.unwrap().starts_with("upgrade baton"));
        if sql::SCHEMA_VERSION > 1 {
            let older = at(SchemaState::Version(sql::SCHEMA_VERSION - 1));
            assert_eq!(older.verdict, Verdict::Note);
            assert!(older.detail.contains("migrates it"), "{older:?}");
        }
    }

    #[test]
    fn poolers_durability_and_connection_slots() {
        let pooled = ServerFacts {
            transaction_pooling: Some(
                "two connections were served by the same server backend (pg_backend_pid 7)".into(),
            ),
            ..healthy()
        };
        let check = verdict(&pooled, "pooling");
        assert_eq!(check.verdict, Verdict::Finding);
        assert!(check.fix.unwrap().starts_with("add pooler=transaction"));
        let told = ServerFacts {
            pooler: Pooler::Transaction,
            ..pooled.clone()
        };
        assert_eq!(verdict(&told, "pooling").verdict, Verdict::Note);
        assert_eq!(verdict(&told, "connections").verdict, Verdict::Ok);

        let relaxed = ServerFacts {
            durable_grants: false,
            fsync: false,
            ..healthy()
        };
        let check = verdict(&relaxed, "durable-grants");
        assert_eq!(check.verdict, Verdict::Note);
        assert!(
            check.detail.starts_with(
                "durable_grants=off in the store URL, and the server runs with fsync=off"
            ),
            "{check:?}"
        );

        let crowded = ServerFacts {
            pool_size: 100,
            ..healthy()
        };
        let check = verdict(&crowded, "connections");
        assert_eq!(check.verdict, Verdict::Finding);
        assert!(
            check.detail.contains("up to 101 connection(s)"),
            "{check:?}"
        );

        let standby = ServerFacts {
            in_recovery: true,
            ..healthy()
        };
        assert_eq!(verdict(&standby, "server").verdict, Verdict::Finding);
    }

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
