//! Every SQL text the store runs, as public constants.
//!
//! Use these when you need to do by hand exactly what the store does: a benchmark baseline
//! that runs the same statements over the same driver, a test that runs a claim inside a
//! transaction of its own, or an operator inspecting or breaking a grant in `psql`. The
//! store never formats a value into SQL: every value is a bind parameter (`$1`, `$2`, ...),
//! listed on each statement.
//!
//! ## Conventions
//! - Tables and the sequence are named without a schema, so they live in the first schema
//!   of the connection's `search_path` (`public` by default; set another with
//!   `?options=-csearch_path%3D<schema>` in the URL).
//! - **The database server's clock decides**: every statement reads `clock_timestamp()`
//!   once, in a sub-select, and uses that one value for every comparison and every time it
//!   writes. Never `now()`, which is frozen at the start of the surrounding transaction:
//!   a claim run late in a long transaction would write an expiry that is already in the
//!   past, and the next claimer would take a grant its holder believes live.
//! - `ttl` parameters are whole milliseconds (`bigint`); remaining times come back as whole
//!   microseconds (`bigint`).
//! - A row with `holder IS NULL` is a free key that keeps its last fence. A row whose
//!   `expires_at <= clock_timestamp()` is an expired grant: it is free too, and keeps its
//!   holder only until the next claim or [`PRUNE`].
//! - Every atom is **one statement** in its own (implicit) transaction.
//! - **Commits are durable, except a freeing release's.** Claim, renew, evict and a release
//!   that hands the key over (a grant) commit as the server is configured
//!   (`synchronous_commit = on` by default: the answer waits for the WAL flush). A
//!   [`RELEASE`] that frees the key sets `synchronous_commit = off` for its own transaction
//!   ([`ASYNC_COMMIT`]), so it answers, and its `NOTIFY` goes out, without waiting for the
//!   disk: a release lost in a server crash leaves the key held until its TTL, which is
//!   safe; a lost grant or renewal would not be. [`CLAIM_RELAXED`], [`RENEW_RELAXED`] and
//!   [`RELEASE_RELAXED`] do the same for grants, for stores opened with `durable_grants=off`
//!   only (see `docs/postgres.md`, "Durability of each statement").
//!
//! | operation | statement |
//! |---|---|
//! | claim | [`CLAIM`] ([`CLAIM_RELAXED`] with `durable_grants=off`) |
//! | renew | [`RENEW`] (1 changed row: renewed) ([`RENEW_RELAXED`] with `durable_grants=off`) |
//! | release | [`RELEASE`] (hands the key to the store that waited longest, notifying its [`HANDOFF_CHANNEL`], or frees it, notifying [`CHANNEL`], in the same transaction) ([`RELEASE_RELAXED`] with `durable_grants=off`) |
//! | inspect | [`INSPECT`] |
//! | list | [`LIST`], or [`LIST_FROM`] when the prefix has no upper bound |
//! | evict (operators) | [`EVICT`] |
//! | prune (maintenance) | [`PRUNE`] |
//! | sweep (now and then, after a claim) | [`SWEEP`] |

/// The end of [`CLAIM`] and [`CLAIM_RELAXED`], which differ only before it: the queue of
/// waiting stores (`dequeued`, `queued`), then the answer.
macro_rules! claim_queue_and_answer {
    () => {
        "\
dequeued AS (
    DELETE FROM baton_wait AS w
    WHERE w.key = $1 AND w.pid = $5 AND EXISTS (SELECT 1 FROM claimed)
),
queued AS (
    INSERT INTO baton_wait (key, pid, holder, ttl_ms, since)
    SELECT $1, $5, $2, $3, c.now FROM c
    WHERE $6 AND $5 IS NOT NULL AND NOT EXISTS (SELECT 1 FROM claimed)
      AND EXISTS (SELECT 1 FROM baton_lease AS l
                  WHERE l.key = $1 AND l.holder IS NOT NULL AND l.expires_at > c.now)
    ON CONFLICT (key, pid) DO UPDATE SET holder = excluded.holder, ttl_ms = excluded.ttl_ms
)
SELECT true AS claimed, granted, fence, NULL::text AS holder, 0::bigint AS remaining_us
FROM claimed
UNION ALL
SELECT false, false, l.fence, l.holder,
       greatest(0, floor(extract(epoch FROM l.expires_at - c.now) * 1000000))::bigint
FROM baton_lease AS l, c
WHERE l.key = $1 AND l.holder IS NOT NULL AND l.expires_at > c.now
  AND NOT EXISTS (SELECT 1 FROM claimed)"
    };
}

/// The text of [`RELEASE`] and [`RELEASE_RELAXED`], which differ only in when the commit is
/// made asynchronous (`$async_when`, an SQL condition over `n`, the next waiter).
macro_rules! release {
    ($async_when:literal) => {
        concat!(
            "\
WITH c AS (SELECT clock_timestamp() AS now),
queue AS (
    SELECT w.pid, w.holder, w.ttl_ms, w.since
    FROM baton_wait AS w
    WHERE w.key = $1 AND w.holder <> $2
),
next AS (
    SELECT q.pid, q.holder, q.ttl_ms, q.since
    FROM (SELECT * FROM queue ORDER BY since, pid OFFSET 0) AS q
    WHERE EXISTS (SELECT 1 FROM pg_stat_get_activity(q.pid) AS a
                  WHERE a.application_name IS NULL OR a.application_name = 'baton-listen')
    ORDER BY q.since, q.pid
    LIMIT 1
),
released AS (
    UPDATE baton_lease AS l SET
        holder     = n.holder,
        fence      = CASE WHEN n.pid IS NULL THEN l.fence
                          ELSE greatest(nextval('baton_fence'), l.fence + 1) END,
        reason     = '',
        granted_at = c.now,
        updated_at = c.now,
        expires_at = c.now + coalesce(n.ttl_ms, 0) * interval '1 millisecond'
    FROM c LEFT JOIN next AS n ON true
    WHERE l.key = $1 AND l.holder = $2 AND l.expires_at > c.now
    RETURNING l.key, l.fence, l.holder, n.pid,
              CASE WHEN ",
            $async_when,
            " THEN set_config('synchronous_commit', 'off', true) END AS commit_mode
),
dequeued AS (
    DELETE FROM baton_wait AS w USING queue AS q, released AS r
    WHERE w.key = $1 AND w.pid = q.pid
      AND (r.pid IS NULL OR (q.since, q.pid) <= (SELECT n.since, n.pid FROM next AS n))
),
notified AS (
    SELECT CASE WHEN pid IS NULL THEN pg_notify('baton_released', key)
        ELSE pg_notify('baton_handoff_' || pid,
                       chr(31) || pid || chr(31) || fence || chr(31) || holder || chr(31) || key)
        END
    FROM released
)
SELECT (SELECT count(*) FROM notified) AS removed,
       (SELECT l.holder FROM baton_lease AS l, c
        WHERE l.key = $1 AND l.holder IS NOT NULL AND l.expires_at > c.now) AS current"
        )
    };
}

/// The schema version this build writes and understands, kept in `baton_schema`.
pub const SCHEMA_VERSION: i32 = 1;

/// The key of the transaction-level advisory lock that serializes schema creation and
/// migration when several replicas start at the same moment (`"batnschm"` in ASCII).
///
/// It is taken with `pg_advisory_xact_lock` inside the migration transaction and released
/// by its commit; no session-level advisory lock is ever taken (see [`CLAIM`] for why the
/// atoms take none at all).
pub const MIGRATION_LOCK: i64 = 0x6261_746e_7363_686d;

/// The expression that makes the transaction it runs in commit without waiting for the WAL
/// flush: `synchronous_commit = off` until the end of the transaction (`SET LOCAL`), read
/// when it commits. Statements evaluate it in the `RETURNING` list of their write, so it is
/// set exactly when they change a row (a statement that changes nothing commits nothing).
pub const ASYNC_COMMIT: &str = "set_config('synchronous_commit', 'off', true)";

/// The channel [`RELEASE`] and [`EVICT`] notify, with the qualified key as the payload.
pub const CHANNEL: &str = "baton_released";

/// The start of the channel each store's LISTEN connection listens on besides [`CHANNEL`]:
/// followed by that connection's backend pid, it carries the hand-overs addressed to that
/// store alone, so the other stores' connections read nothing (see [`RELEASE`]).
pub const HANDOFF_CHANNEL: &str = "baton_handoff_";

/// The objects of schema version 1, created in one transaction (under [`MIGRATION_LOCK`])
/// when the database has none.
///
/// - `baton_fence`: the sequence fences are drawn from. A sequence is not transactional
///   (a value drawn by a claim that found the key held is simply skipped) and it survives
///   restarts; after a crash it resumes *above* every value it handed out to a committed
///   transaction (see `docs/postgres.md`, "Fences").
/// - `baton_lease`: one row per key ever claimed. Rows are kept when a grant is released or
///   expires, so the key's fence survives; [`PRUNE`] removes rows that have been free for
///   an hour, and claims now and then remove a bounded number of them ([`SWEEP`]). `key` sorts by code point (`COLLATE "C"`), so prefix listing is a range scan.
///   `granted_at` is when the current grant began (a claim that extends keeps it),
///   `updated_at` when the row was last written. `fillfactor = 80` leaves room on each page
///   for the frequent updates to stay heap-only (no index writes).
/// - `baton_schema`: the schema version, one row.
pub const SCHEMA_V1: &str = "\
CREATE SEQUENCE baton_fence AS bigint;
CREATE TABLE baton_lease (
    key        text COLLATE \"C\" PRIMARY KEY,
    holder     text,
    fence      bigint      NOT NULL,
    reason     text        NOT NULL DEFAULT '',
    granted_at timestamptz NOT NULL,
    updated_at timestamptz NOT NULL,
    expires_at timestamptz NOT NULL
) WITH (fillfactor = 80);
CREATE TABLE baton_schema (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    version   integer NOT NULL
);
INSERT INTO baton_schema (version) VALUES (1);
";

/// The queue of waiting stores: one row per key and waiting store, created if missing at
/// every connect (it is not part of the versioned schema, so a baton that predates it keeps
/// working on the same database; its releases wake waiters by a plain notification).
///
/// - `pid` is the waiting store's LISTEN backend (`pg_backend_pid()` of that connection):
///   the address a hand-over is sent to, and its liveness (a store whose LISTEN connection is
///   gone has no backend, and [`RELEASE`] skips and deletes its rows).
/// - `holder` and `ttl_ms` are what the store's waiting holder asked for; `since` (the
///   server's clock when the store first queued) orders the queue.
/// - `UNLOGGED`: writing it costs no table WAL. A crash empties it; waiters queue again
///   at their next claim, after the LISTEN connection is back.
pub const WAIT_SCHEMA: &str = "\
CREATE UNLOGGED TABLE IF NOT EXISTS baton_wait (
    key    text COLLATE \"C\" NOT NULL,
    pid    integer     NOT NULL,
    holder text        NOT NULL,
    ttl_ms bigint      NOT NULL,
    since  timestamptz NOT NULL,
    PRIMARY KEY (key, pid)
)";

/// The migrations from each version to the next: `MIGRATIONS[0]` takes version 1 to 2,
/// and so on. Each runs in the migration transaction, which then records the new version.
pub const MIGRATIONS: &[&str] = &[];

/// Whether a relation named `$1` exists in a schema of the `search_path`.
///
/// Read from the catalog tables with the statement's own snapshot, not with `to_regclass`,
/// whose cached answer can predate another replica's commit that the migration lock just
/// waited for.
///
/// Parameters: `$1` relation name.
pub const RELATION_EXISTS: &str = "\
SELECT EXISTS (
    SELECT 1 FROM pg_catalog.pg_class AS c
    JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace
    WHERE c.relname = $1 AND n.nspname = ANY (current_schemas(false))
)";

/// The schema version: `version`.
pub const SCHEMA_VERSION_OF: &str = "SELECT version FROM baton_schema";

/// Records the schema version a migration reached. Parameters: `$1` version.
pub const SET_SCHEMA_VERSION: &str = "UPDATE baton_schema SET version = $1";

/// Takes the migration lock until the end of the transaction. Parameters: `$1`
/// [`MIGRATION_LOCK`].
pub const LOCK_MIGRATION: &str = "SELECT pg_advisory_xact_lock($1)";

/// Bounds every lock wait of the current transaction: `$1` milliseconds, as text (the
/// parameterised form of `SET LOCAL lock_timeout`). A wait that outlasts it fails with
/// SQLSTATE `55P03`.
pub const SET_LOCK_TIMEOUT: &str = "SELECT set_config('lock_timeout', $1, true)";

/// Claim, in one statement: grants `key` when it is new, free or expired, with a new fence;
/// extends it, keeping the fence, when `holder` holds it; otherwise changes nothing and
/// returns the live holder.
///
/// - `updated`: an `UPDATE ... WHERE` (free, expired, or the same holder) of the key's row.
///   In `READ COMMITTED` a row that a concurrent claim is changing is waited for and the
///   condition evaluated again on its new version, so two claimers of one key are serialized
///   by the row lock and exactly one is granted. A row that does not match in the snapshot
///   is neither locked nor written: a claim that finds the key held writes nothing. A claim
///   that had to wait for a concurrent claim is different: it locks the row's new version
///   before it evaluates the condition again, and that lock gives it a transaction id, a
///   commit record and a WAL flush although it changes nothing (`pg_waldump` shows them as
///   `Heap/LOCK` records), so waking many waiters of one key at once costs commits.
/// - `inserted`: when the statement's snapshot has no row for the key, an
///   `INSERT ... ON CONFLICT DO NOTHING`; of concurrent first claimers one inserts, the
///   others insert nothing.
/// - `dequeued` and `queued`: the waiting stores' queue ([`WAIT_SCHEMA`]). A claim that
///   grants removes its store's entry for the key; a claim that finds the key held, made by
///   a waiting holder (`$6`) of a store that listens (`$5`, its LISTEN backend's
///   `pg_backend_pid()`), queues the store, or updates its entry's holder and TTL keeping
///   its place. `baton_wait` is unlogged, so queueing writes no table WAL and takes no lock
///   on the key's row; only the transaction's commit record is logged, and not flushed
///   (nothing logged precedes it).
/// - The last part returns the grant, or the live holder.
///
/// Nothing is held after the statement: no session state, no advisory lock, so the store
/// works through transaction-pooling proxies and a dead client holds nothing but its TTL.
///
/// A new grant's fence is `greatest(nextval('baton_fence'), <the row's fence> + 1)`: the
/// sequence makes fences survive deleted rows, the row makes them strictly increase even
/// when a claim drew its sequence value before a concurrent claim drew a larger one.
///
/// Returns at most one row, `claimed` (`bool`), `granted` (`bool`: a new grant rather than
/// an extension), `fence` (`bigint`), `holder` (`text`, the live holder when not claimed),
/// `remaining_us` (`bigint`). No row, or a row naming the caller as holder, means the key
/// changed between the statement's snapshot and its write (another claim inserted or took
/// it): run it again.
///
/// Parameters: `$1` key, `$2` holder, `$3` ttl (ms), `$4` reason, `$5` the LISTEN
/// backend's pid of the claiming store (`integer`, `NULL` when it has none), `$6` queue the
/// store when the key is held (`boolean`).
pub const CLAIM: &str = concat!(
    "\
WITH c AS (SELECT clock_timestamp() AS now),
updated AS (
    UPDATE baton_lease AS l SET
        holder     = $2,
        fence      = CASE WHEN l.holder = $2 AND l.expires_at > c.now
                          THEN l.fence ELSE greatest(nextval('baton_fence'), l.fence + 1) END,
        reason     = $4,
        granted_at = CASE WHEN l.holder = $2 AND l.expires_at > c.now
                          THEN l.granted_at ELSE c.now END,
        updated_at = c.now,
        expires_at = c.now + $3 * interval '1 millisecond'
    FROM c
    WHERE l.key = $1 AND (l.holder IS NULL OR l.expires_at <= c.now OR l.holder = $2)
    RETURNING l.fence, l.granted_at = l.updated_at AS granted
),
inserted AS (
    INSERT INTO baton_lease (key, holder, fence, reason, granted_at, updated_at, expires_at)
    SELECT $1, $2, nextval('baton_fence'), $4, c.now, c.now, c.now + $3 * interval '1 millisecond'
    FROM c
    WHERE NOT EXISTS (SELECT 1 FROM baton_lease WHERE key = $1)
    ON CONFLICT (key) DO NOTHING
    RETURNING fence, true AS granted
),
claimed AS (SELECT fence, granted FROM updated UNION ALL SELECT fence, granted FROM inserted),
",
    claim_queue_and_answer!()
);

/// [`CLAIM`] committing asynchronously ([`ASYNC_COMMIT`] in the `RETURNING` list of both
/// writes), for stores opened with `durable_grants=off`: an answered grant may be lost if
/// the server crashes within a moment of it. Same parameters and answer as [`CLAIM`].
pub const CLAIM_RELAXED: &str = concat!(
    "\
WITH c AS (SELECT clock_timestamp() AS now),
updated AS (
    UPDATE baton_lease AS l SET
        holder     = $2,
        fence      = CASE WHEN l.holder = $2 AND l.expires_at > c.now
                          THEN l.fence ELSE greatest(nextval('baton_fence'), l.fence + 1) END,
        reason     = $4,
        granted_at = CASE WHEN l.holder = $2 AND l.expires_at > c.now
                          THEN l.granted_at ELSE c.now END,
        updated_at = c.now,
        expires_at = c.now + $3 * interval '1 millisecond'
    FROM c
    WHERE l.key = $1 AND (l.holder IS NULL OR l.expires_at <= c.now OR l.holder = $2)
    RETURNING l.fence, l.granted_at = l.updated_at AS granted,
              set_config('synchronous_commit', 'off', true) AS commit_mode
),
inserted AS (
    INSERT INTO baton_lease (key, holder, fence, reason, granted_at, updated_at, expires_at)
    SELECT $1, $2, nextval('baton_fence'), $4, c.now, c.now, c.now + $3 * interval '1 millisecond'
    FROM c
    WHERE NOT EXISTS (SELECT 1 FROM baton_lease WHERE key = $1)
    ON CONFLICT (key) DO NOTHING
    RETURNING fence, true AS granted,
              set_config('synchronous_commit', 'off', true) AS commit_mode
),
claimed AS (SELECT fence, granted FROM updated UNION ALL SELECT fence, granted FROM inserted),
",
    claim_queue_and_answer!()
);

/// Renew: extends the holder's live grant. One changed row means renewed; none means the
/// caller is not the holder (expired, released or taken), and nothing changed.
///
/// Parameters: `$1` key, `$2` holder, `$3` ttl (ms).
pub const RENEW: &str = "\
UPDATE baton_lease AS l SET updated_at = c.now, expires_at = c.now + $3 * interval '1 millisecond'
FROM (SELECT clock_timestamp() AS now) AS c
WHERE l.key = $1 AND l.holder = $2 AND l.expires_at > c.now";

/// [`RENEW`] committing asynchronously ([`ASYNC_COMMIT`] in a `RETURNING` list), for stores
/// opened with `durable_grants=off`: an answered renewal may be lost if the server crashes
/// within a moment of it, leaving the earlier expiry. Same parameters and answer (the
/// number of changed rows) as [`RENEW`].
pub const RENEW_RELAXED: &str = "\
UPDATE baton_lease AS l SET updated_at = c.now, expires_at = c.now + $3 * interval '1 millisecond'
FROM (SELECT clock_timestamp() AS now) AS c
WHERE l.key = $1 AND l.holder = $2 AND l.expires_at > c.now
RETURNING set_config('synchronous_commit', 'off', true) AS commit_mode";

/// Release: ends the holder's live grant and, in the same statement, hands the key to the
/// store that has waited longest for it, or frees it when no store waits.
///
/// - `queue` and `next`: the key's entries in `baton_wait`; `next` is the oldest live one
///   (its `pid` is a backend named [`LISTENER_APPLICATION`](crate::wakeups::LISTENER_APPLICATION)),
///   found by checking the entries oldest first and stopping at the first live one, so a
///   release looks up one backend when the head of the queue lives, however many wait (the
///   subquery's `OFFSET 0` keeps the check above its sort, where `LIMIT` stops it).
/// - `released`: with a `next`, the row becomes `next`'s grant: its holder, a new fence
///   (as [`CLAIM`] draws one), expiry `now + ttl_ms`. Without one, the row is freed, keeping
///   its fence.
/// - `dequeued`: deletes `next`'s entry and the dead ones before it; with no live `next`,
///   every entry (all were found dead). A dead entry behind `next` goes when it reaches the
///   head.
/// - `notified`: [`CHANNEL`] gets the key when the key was freed; when it was handed over,
///   the channel of `next`'s store alone ([`HANDOFF_CHANNEL`] followed by `pid`) gets
///   `U+001F pid U+001F fence U+001F holder U+001F key`, which that store takes as its
///   holder's grant, and no other store reads. Delivered when the transaction commits.
///
/// **Commit mode.** A release that frees the key sets `synchronous_commit = off` for its
/// transaction ([`ASYNC_COMMIT`], evaluated for the freed row): it answers, and its
/// `NOTIFY` goes out, without waiting for the WAL flush, and the next holder's claim flushes
/// it. If the server crashes first, the key comes back held by the releasing holder until its
/// expiry: a conservative loss. A release that hands the key over is a grant, and commits
/// as a claim does (durably, with the server's `synchronous_commit`), so a hand-over that was
/// notified survives a crash; [`RELEASE_RELAXED`] commits it asynchronously too, for stores
/// opened with `durable_grants=off`. A release that frees nothing writes nothing.
///
/// Run by hand inside a larger transaction, a freeing release turns `synchronous_commit` off
/// for the rest of that transaction too; the store always runs it alone.
///
/// Returns one row: `removed` (`bigint`, 1 when the grant ended) and `current` (`text`, the
/// live holder when not ended; `NULL` when nobody holds the key). `removed = 0` with the
/// caller as `current` means the key changed between the statement's snapshot and its
/// write: run it again.
///
/// Parameters: `$1` key, `$2` holder.
pub const RELEASE: &str = release!("n.pid IS NULL");

/// [`RELEASE`] committing asynchronously also when it hands the key over, for stores opened
/// with `durable_grants=off`. Same parameters and answer.
pub const RELEASE_RELAXED: &str = release!("true");

/// Evict: frees `key`'s live grant whoever holds it, keeping the fence, and notifies
/// waiters (what an operator breaking a stuck lock runs). Its holder learns of it at its
/// next renewal. Returns one row, `evicted` (`bigint`, 1 when a live grant was freed).
///
/// Parameters: `$1` key.
pub const EVICT: &str = "\
WITH c AS (SELECT clock_timestamp() AS now),
evicted AS (
    UPDATE baton_lease AS l SET holder = NULL, reason = '', updated_at = c.now, expires_at = c.now
    FROM c
    WHERE l.key = $1 AND l.holder IS NOT NULL AND l.expires_at > c.now
    RETURNING l.key
)
SELECT count(pg_notify('baton_released', key)) AS evicted FROM evicted";

/// Inspect: the live grant of `key`: `holder`, `fence`, `remaining_us`, `reason`.
///
/// Parameters: `$1` key.
pub const INSPECT: &str = "\
SELECT l.holder, l.fence,
       greatest(0, floor(extract(epoch FROM l.expires_at - c.now) * 1000000))::bigint AS remaining_us,
       l.reason
FROM baton_lease AS l, (SELECT clock_timestamp() AS now) AS c
WHERE l.key = $1 AND l.holder IS NOT NULL AND l.expires_at > c.now";

/// List: live grants whose key starts with a prefix, as the key range
/// `prefix <= key < upper` (keys may contain `%` and `_`, so no `LIKE`), in key order:
/// `key`, `holder`, `fence`, `remaining_us`, `reason`.
///
/// Parameters: `$1` prefix, `$2` upper bound of the prefix, `$3` limit.
pub const LIST: &str = "\
SELECT l.key, l.holder, l.fence,
       greatest(0, floor(extract(epoch FROM l.expires_at - c.now) * 1000000))::bigint AS remaining_us,
       l.reason
FROM baton_lease AS l, (SELECT clock_timestamp() AS now) AS c
WHERE l.key >= $1 AND l.key < $2 AND l.holder IS NOT NULL AND l.expires_at > c.now
ORDER BY l.key LIMIT $3";

/// [`LIST`] for a prefix that has no upper bound (it is empty, or ends in U+10FFFF only).
///
/// Parameters: `$1` prefix, `$2` limit.
pub const LIST_FROM: &str = "\
SELECT l.key, l.holder, l.fence,
       greatest(0, floor(extract(epoch FROM l.expires_at - c.now) * 1000000))::bigint AS remaining_us,
       l.reason
FROM baton_lease AS l, (SELECT clock_timestamp() AS now) AS c
WHERE l.key >= $1 AND l.holder IS NOT NULL AND l.expires_at > c.now
ORDER BY l.key LIMIT $2";

/// Prune: deletes the rows of keys that have been free or expired, and unwritten, for an
/// hour. A pruned key that is claimed again draws its fence from the sequence, above every
/// fence handed out before; the hour only keeps a row for a claim that drew its sequence
/// value long before it wrote (which takes a statement stalled that long).
pub const PRUNE: &str = "\
DELETE FROM baton_lease AS l
WHERE (l.holder IS NULL OR l.expires_at <= clock_timestamp())
  AND l.updated_at < clock_timestamp() - interval '1 hour'";

/// Sweep: deletes at most `$1` of the rows [`PRUNE`] would delete, skipping rows another
/// statement has locked. A claim runs it in the background on the first claim of each store
/// and every [`SWEEP_EVERY`] claims after, so per-tick keys (`report:<hour>`) do not pile
/// up rows; fences stay strictly increasing as after [`PRUNE`].
///
/// Parameters: `$1` limit.
pub const SWEEP: &str = "\
DELETE FROM baton_lease
WHERE key IN (
    SELECT l.key FROM baton_lease AS l
    WHERE (l.holder IS NULL OR l.expires_at <= clock_timestamp())
      AND l.updated_at < clock_timestamp() - interval '1 hour'
    LIMIT $1
    FOR UPDATE SKIP LOCKED)";

/// How many claims of one store pass between runs of [`SWEEP`].
pub const SWEEP_EVERY: u64 = 32;

/// How many rows one [`SWEEP`] deletes at most: more than the claims between two sweeps can
/// create, so the rows of expired keys do not grow without bound.
pub const SWEEP_LIMIT: i64 = 100;

/// The server backend of the connection it runs on: a LISTEN connection's address for
/// hand-overs (see [`WAIT_SCHEMA`]).
pub const BACKEND_PID: &str = "SELECT pg_backend_pid()";

/// Sends a notification: the listener's heartbeat on its private channel.
///
/// Parameters: `$1` channel, `$2` payload.
pub const NOTIFY: &str = "SELECT pg_notify($1, $2)";

#[cfg(test)]
mod tests {
    use super::*;

    /// The relaxed statements are the durable ones plus [`ASYNC_COMMIT`] in each write's
    /// `RETURNING` list, and nothing else.
    #[test]
    fn relaxed_statements_differ_only_by_the_commit_mode() {
        let returning = format!(",\n              {ASYNC_COMMIT} AS commit_mode\n");
        let claim = CLAIM
            .replace(" AS granted\n", &format!(" AS granted{returning}"))
            .replace("true AS granted\n", &format!("true AS granted{returning}"));
        assert_eq!(CLAIM_RELAXED, claim);
        assert_eq!(CLAIM_RELAXED.matches(ASYNC_COMMIT).count(), 2);
        assert_eq!(
            RENEW_RELAXED,
            format!("{RENEW}\nRETURNING {ASYNC_COMMIT} AS commit_mode")
        );
        assert_eq!(
            RELEASE_RELAXED,
            RELEASE.replace(
                "CASE WHEN n.pid IS NULL THEN set_config",
                "CASE WHEN true THEN set_config"
            )
        );
        assert_eq!(RELEASE.matches(ASYNC_COMMIT).count(), 1);
        for durable in [CLAIM, RENEW, EVICT] {
            assert!(!durable.contains("synchronous_commit"), "{durable}");
        }
    }
}
