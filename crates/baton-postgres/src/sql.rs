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
//! - **Commits are durable, except a release's.** Claim, renew and evict commit as the
//!   server is configured (`synchronous_commit = on` by default: the answer waits for the
//!   WAL flush). [`RELEASE`] sets `synchronous_commit = off` for its own transaction
//!   ([`ASYNC_COMMIT`]), so it answers, and its `NOTIFY` goes out, without waiting for the
//!   disk: a release lost in a server crash leaves the key held until its TTL, which is
//!   safe; a lost claim or renewal would not be. [`CLAIM_RELAXED`] and [`RENEW_RELAXED`] do
//!   the same for grants, for stores opened with `durable_grants=off` only (see
//!   `docs/postgres.md`, "Durability of each statement").
//!
//! | operation | statement |
//! |---|---|
//! | claim | [`CLAIM`] ([`CLAIM_RELAXED`] with `durable_grants=off`) |
//! | renew | [`RENEW`] (1 changed row: renewed) ([`RENEW_RELAXED`] with `durable_grants=off`) |
//! | release | [`RELEASE`] (notifies [`CHANNEL`] in the same transaction; commits asynchronously) |
//! | inspect | [`INSPECT`] |
//! | list | [`LIST`], or [`LIST_FROM`] when the prefix has no upper bound |
//! | evict (operators) | [`EVICT`] |
//! | prune (maintenance) | [`PRUNE`] |
//! | sweep (now and then, after a claim) | [`SWEEP`] |

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
/// Parameters: `$1` key, `$2` holder, `$3` ttl (ms), `$4` reason.
pub const CLAIM: &str = "\
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
claimed AS (SELECT fence, granted FROM updated UNION ALL SELECT fence, granted FROM inserted)
SELECT true AS claimed, granted, fence, NULL::text AS holder, 0::bigint AS remaining_us
FROM claimed
UNION ALL
SELECT false, false, l.fence, l.holder,
       greatest(0, floor(extract(epoch FROM l.expires_at - c.now) * 1000000))::bigint
FROM baton_lease AS l, c
WHERE l.key = $1 AND l.holder IS NOT NULL AND l.expires_at > c.now
  AND NOT EXISTS (SELECT 1 FROM claimed)";

/// [`CLAIM`] committing asynchronously ([`ASYNC_COMMIT`] in the `RETURNING` list of both
/// writes), for stores opened with `durable_grants=off`: an answered grant may be lost if
/// the server crashes within a moment of it. Same parameters and answer as [`CLAIM`].
pub const CLAIM_RELAXED: &str = "\
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
claimed AS (SELECT fence, granted FROM updated UNION ALL SELECT fence, granted FROM inserted)
SELECT true AS claimed, granted, fence, NULL::text AS holder, 0::bigint AS remaining_us
FROM claimed
UNION ALL
SELECT false, false, l.fence, l.holder,
       greatest(0, floor(extract(epoch FROM l.expires_at - c.now) * 1000000))::bigint
FROM baton_lease AS l, c
WHERE l.key = $1 AND l.holder IS NOT NULL AND l.expires_at > c.now
  AND NOT EXISTS (SELECT 1 FROM claimed)";

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

/// Release: frees the holder's live grant, keeping the row and its fence, and notifies
/// [`CHANNEL`] with the key in the same transaction (delivered when it commits).
///
/// A release that frees the key sets `synchronous_commit = off` for its transaction
/// ([`ASYNC_COMMIT`] in the `RETURNING` list, evaluated for the freed row), so its
/// commit neither waits for the WAL flush nor delays the notification: the next holder's
/// claim, which does wait, flushes the release with it. If the server crashes before the
/// release reaches the disk, the key comes back held by the releasing holder until the
/// grant's expiry: a conservative loss, unlike a lost claim (a fence handed out twice) or
/// a lost renewal (an expiry earlier than its holder believes). A release that frees
/// nothing writes nothing and changes no setting.
///
/// Run by hand inside a larger transaction, it turns `synchronous_commit` off for the rest
/// of that transaction too; the store always runs it alone.
///
/// Returns one row: `removed` (`bigint`, 1 when freed) and `current` (`text`, the live
/// holder when not freed; `NULL` when nobody holds the key). `removed = 0` with the caller
/// as `current` means the key changed between the statement's snapshot and its write: run
/// it again.
///
/// Parameters: `$1` key, `$2` holder.
pub const RELEASE: &str = "\
WITH c AS (SELECT clock_timestamp() AS now),
released AS (
    UPDATE baton_lease AS l SET holder = NULL, reason = '', updated_at = c.now, expires_at = c.now
    FROM c
    WHERE l.key = $1 AND l.holder = $2 AND l.expires_at > c.now
    RETURNING l.key, set_config('synchronous_commit', 'off', true) AS commit_mode
),
notified AS (SELECT pg_notify('baton_released', key) FROM released)
SELECT (SELECT count(*) FROM notified) AS removed,
       (SELECT l.holder FROM baton_lease AS l, c
        WHERE l.key = $1 AND l.holder IS NOT NULL AND l.expires_at > c.now) AS current";

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
        assert!(RELEASE.contains(&format!("RETURNING l.key, {ASYNC_COMMIT} AS commit_mode")));
        for durable in [CLAIM, RENEW, EVICT] {
            assert!(!durable.contains("synchronous_commit"), "{durable}");
        }
    }
}
