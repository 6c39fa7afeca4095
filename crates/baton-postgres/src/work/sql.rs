//! Every SQL text of claimable work, as public constants: the work schema, and one statement
//! per atom of [`QueueStore`](baton_core::work::QueueStore),
//! [`ScheduleStore`](baton_core::work::ScheduleStore) and
//! [`MigrationStore`](baton_core::work::MigrationStore).
//!
//! Use these to do by hand exactly what the store does: a benchmark baseline (`pgbench`
//! runs [`CLAIM`] and [`COMPLETE`] verbatim), a test, or an operator looking at a queue in
//! `psql`. The conventions of [`crate::sql`] hold here too: every value is a bind parameter,
//! every statement reads `clock_timestamp()` once (in a sub-select or a `WITH c`) and uses
//! that one value for every comparison and every time it writes, and every atom is one
//! statement in its own implicit transaction.
//!
//! - Durations from a [`Ttl`](baton_core::Ttl) (leases, de-duplication windows) are whole
//!   milliseconds (`bigint`); delays and retry backoffs (a `Duration`) are whole
//!   microseconds (`bigint`); remaining times come back as whole microseconds.
//! - Schedule times are unix milliseconds (`bigint`), compared with
//!   `floor(extract(epoch FROM clock_timestamp()) * 1000)`.
//!
//! | operation | statement |
//! |---|---|
//! | enqueue a batch | [`ENQUEUE`] (every 128th call of a process also runs [`SWEEP_DEDUP`]) |
//! | claim | [`CLAIM`] |
//! | complete / retry / dead-letter / extend / release | [`COMPLETE`] / [`RETRY`] / [`DEAD_LETTER`] / [`EXTEND`] / [`RELEASE`] (1 changed row: done) |
//! | stats / dead letters | [`STATS`] / [`DEAD_LETTERS`] |
//! | schedules | [`NOW_MS`], [`REGISTER_SCHEDULE`], [`ADVANCE_SCHEDULE`], [`SCHEDULE`], [`SCHEDULES`], [`REMOVE_SCHEDULE`] |
//! | migrations | [`CLAIM_MIGRATION`] then [`MIGRATION`], [`HEARTBEAT_MIGRATION`], [`FINISH_MIGRATION`], [`MIGRATIONS_OF`] |

/// The version of the work tables this build writes and understands, kept in
/// `baton_work_schema` (a track of its own beside the lease schema's `baton_schema`; see
/// `crate::schema`).
pub const SCHEMA_VERSION: i32 = 1;

/// The migrations from each work-schema version to the next: `MIGRATIONS[0]` takes version
/// 1 to 2, and so on. Each runs in the migration transaction, which then records the new
/// version.
pub const MIGRATIONS: &[&str] = &[];

/// The objects of work-schema version 1, created in one transaction (under
/// [`MIGRATION_LOCK`](crate::sql::MIGRATION_LOCK)) when the database has none.
///
/// - `baton_work_item`: one row per item, deleted when completed. `state` is `ready`
///   (waiting for `run_at`), `running` (claimed: `lock_token` and `locked_until` set) or
///   `dead`. `run_at` is kept while an item runs, so a lapsed item is claimed again in its
///   original `run_at` order. Three partial indexes, one per state, each leading with the
///   queue: `ready` in claim order `(run_at, id)`, so a claim reads the due head of the
///   queue and nothing else; `running` by `locked_until`, so a claim finds lapsed leases
///   without reading the live ones (a queue with thousands of items in flight costs a claim
///   nothing extra); `dead` by id, for listing dead letters.
/// - `baton_work_dedup`: one row per remembered de-duplication id and queue, naming the item
///   that holds it; an expired row is replaced by the next enqueue of its id, and swept now
///   and then ([`SWEEP_DEDUP`]). It outlives the item on purpose: a completed item's id
///   stays remembered for its window.
/// - `baton_work_schedule`: one row per schedule.
/// - `baton_work_migration`: one row per migration of a set; `previous` is the state the
///   current claim took over (`NULL` for a new record).
/// - `baton_work_schema`: the work-schema version, one row.
pub const SCHEMA_V1: &str = "\
CREATE TABLE baton_work_item (
    id           bigserial   PRIMARY KEY,
    queue        text COLLATE \"C\" NOT NULL,
    payload      bytea       NOT NULL,
    dedup_id     text,
    state        text        NOT NULL CHECK (state IN ('ready', 'running', 'dead')),
    run_at       timestamptz NOT NULL,
    locked_until timestamptz,
    lock_token   text,
    attempts     integer     NOT NULL,
    max_attempts integer     NOT NULL,
    last_error   text        NOT NULL,
    enqueued_at  timestamptz NOT NULL
);
CREATE INDEX baton_work_item_ready ON baton_work_item (queue, run_at, id) WHERE state = 'ready';
CREATE INDEX baton_work_item_running ON baton_work_item (queue, locked_until) WHERE state = 'running';
CREATE INDEX baton_work_item_dead ON baton_work_item (queue, id) WHERE state = 'dead';
CREATE TABLE baton_work_dedup (
    queue      text COLLATE \"C\" NOT NULL,
    dedup_id   text COLLATE \"C\" NOT NULL,
    item_id    bigint      NOT NULL,
    created_at timestamptz NOT NULL,
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (queue, dedup_id)
);
CREATE INDEX baton_work_dedup_expiry ON baton_work_dedup (expires_at);
CREATE TABLE baton_work_schedule (
    name        text COLLATE \"C\" PRIMARY KEY,
    spec        text        NOT NULL,
    due_at_ms   bigint      NOT NULL,
    runs        bigint      NOT NULL,
    last_holder text,
    last_run_ms bigint,
    updated_at  timestamptz NOT NULL
);
CREATE TABLE baton_work_migration (
    set_key     text COLLATE \"C\" NOT NULL,
    name        text COLLATE \"C\" NOT NULL,
    state       text        NOT NULL
                CHECK (state IN ('pending', 'completed', 'failed', 'rolled_back')),
    claimed_by  text        NOT NULL,
    attempt     integer     NOT NULL,
    lease_until timestamptz NOT NULL,
    error       text        NOT NULL,
    previous    text,
    updated_at  timestamptz NOT NULL,
    PRIMARY KEY (set_key, name)
);
CREATE TABLE baton_work_schema (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    version   integer NOT NULL
);
INSERT INTO baton_work_schema (version) VALUES (1);
";

/// The work-schema version: `version`.
pub const SCHEMA_VERSION_OF: &str = "SELECT version FROM baton_work_schema";

/// Records the work-schema version a migration reached. Parameters: `$1` version.
pub const SET_SCHEMA_VERSION: &str = "UPDATE baton_work_schema SET version = $1";

/// Enqueue, in one statement: a batch of items passed as parallel arrays, de-duplicated.
///
/// - Every item draws an id from the `baton_work_item` sequence, in batch order (an item
///   that turns out a duplicate leaves a gap).
/// - The first item of each de-duplication id in the batch is offered to `baton_work_dedup`
///   with `INSERT ... ON CONFLICT DO UPDATE`: a missing or expired row becomes this item's;
///   a live row keeps its item (the update rewrites it unchanged, so that the statement
///   always returns the row and learns the holder's id without a second read, and
///   concurrent enqueues of one id are serialized by its row lock). Later items of the
///   same id in the batch are its duplicates.
/// - Items without a de-duplication id, and those whose id now names them, are inserted
///   `ready` with `run_at = now + delay`.
///
/// Returns one row per item, in batch order: `id` (`bigint`, the added item's, or for a
/// duplicate the id of the item holding the de-duplication id) and `added` (`bool`).
///
/// Parameters: `$1` queue, `$2` payloads (`bytea[]`), `$3` de-duplication ids (`text[]`,
/// `NULL` for none), `$4` windows (`bigint[]`, ms; `NULL` for none), `$5` delays
/// (`bigint[]`, µs), `$6` max attempts (`integer[]`).
pub const ENQUEUE: &str = "\
WITH c AS (SELECT clock_timestamp() AS now),
batch AS (
    SELECT t.ord, t.payload, t.dedup_id, t.window_ms, t.delay_us, t.max_attempts,
           nextval('baton_work_item_id_seq') AS id
    FROM unnest($2::bytea[], $3::text[], $4::bigint[], $5::bigint[], $6::integer[])
         WITH ORDINALITY AS t (payload, dedup_id, window_ms, delay_us, max_attempts, ord)
),
firsts AS (
    SELECT DISTINCT ON (b.dedup_id) b.dedup_id, b.id, b.window_ms
    FROM batch AS b
    WHERE b.dedup_id IS NOT NULL
    ORDER BY b.dedup_id, b.ord
),
kept AS (
    INSERT INTO baton_work_dedup AS d (queue, dedup_id, item_id, created_at, expires_at)
    SELECT $1, f.dedup_id, f.id, c.now, c.now + f.window_ms * interval '1 millisecond'
    FROM firsts AS f CROSS JOIN c
    ON CONFLICT (queue, dedup_id) DO UPDATE SET
        item_id    = CASE WHEN d.expires_at <= excluded.created_at
                          THEN excluded.item_id ELSE d.item_id END,
        created_at = CASE WHEN d.expires_at <= excluded.created_at
                          THEN excluded.created_at ELSE d.created_at END,
        expires_at = CASE WHEN d.expires_at <= excluded.created_at
                          THEN excluded.expires_at ELSE d.expires_at END
    RETURNING d.dedup_id, d.item_id
),
added AS (
    INSERT INTO baton_work_item
        (id, queue, payload, dedup_id, state, run_at, attempts, max_attempts, last_error, enqueued_at)
    SELECT b.id, $1, b.payload, b.dedup_id, 'ready', c.now + b.delay_us * interval '1 microsecond',
           0, b.max_attempts, '', c.now
    FROM batch AS b CROSS JOIN c
    WHERE b.dedup_id IS NULL
       OR EXISTS (SELECT 1 FROM kept AS k WHERE k.dedup_id = b.dedup_id AND k.item_id = b.id)
    ORDER BY b.ord
    RETURNING id
)
SELECT coalesce(k.item_id, b.id) AS id, coalesce(k.item_id, b.id) = b.id AS added
FROM batch AS b LEFT JOIN kept AS k ON k.dedup_id = b.dedup_id
ORDER BY b.ord";

/// Deletes up to 256 expired de-duplication rows (run by every 128th enqueue of a process;
/// an expired row is already ignored, this only reclaims its space).
pub const SWEEP_DEDUP: &str = "\
DELETE FROM baton_work_dedup WHERE (queue, dedup_id) IN (
    SELECT queue, dedup_id FROM baton_work_dedup
    WHERE expires_at <= clock_timestamp() LIMIT 256)";

/// Claim, in one statement: takes up to `$2` eligible items of queue `$1`, oldest `run_at`
/// first, then lowest id, for token `$3`.
///
/// - `due`: ready items whose `run_at` has come, read from the `ready` index in claim order;
///   `lapsed`: running items whose lease lapsed, found through the `running` index and
///   sorted. Each takes up to `$2` rows `FOR UPDATE SKIP LOCKED`, so concurrent claims pass
///   each other's rows instead of waiting, and in `READ COMMITTED` a row another claim took
///   since this statement's snapshot is checked again on its new version and dropped.
///   Keeping the two apart lets a claim skip the live leases entirely, however many items
///   are in flight.
/// - The oldest `$2` of both are stamped: `running`, token `$3`, `locked_until = now +
///   $4`, one more attempt. Rows locked but not taken (only when lapsed items compete with
///   due ones) are let go when the statement ends; a claim running meanwhile skips them, as
///   it skips every row another claim holds, so under concurrency a claim may answer fewer
///   items than are eligible, never an item twice.
///
/// Returns the claimed items in claim order: `id`, `payload`, `attempts` (this claim's
/// attempt number), `max_attempts`, `dedup_id`, `last_error`. No rows: nothing eligible.
///
/// Parameters: `$1` queue, `$2` batch (`bigint`), `$3` token, `$4` lease (ms).
pub const CLAIM: &str = "\
WITH c AS (SELECT clock_timestamp() AS now),
due AS (
    SELECT i.id, i.run_at FROM baton_work_item AS i
    WHERE i.queue = $1 AND i.state = 'ready' AND i.run_at <= (SELECT now FROM c)
    ORDER BY i.run_at, i.id
    LIMIT $2
    FOR UPDATE SKIP LOCKED
),
lapsed AS (
    SELECT i.id, i.run_at FROM baton_work_item AS i
    WHERE i.queue = $1 AND i.state = 'running' AND i.locked_until <= (SELECT now FROM c)
    ORDER BY i.run_at, i.id
    LIMIT $2
    FOR UPDATE SKIP LOCKED
),
picked AS (
    SELECT e.id FROM (SELECT id, run_at FROM due UNION ALL SELECT id, run_at FROM lapsed) AS e
    ORDER BY e.run_at, e.id
    LIMIT $2
),
claimed AS (
    UPDATE baton_work_item AS i SET
        state        = 'running',
        lock_token   = $3,
        locked_until = c.now + $4 * interval '1 millisecond',
        attempts     = i.attempts + 1
    FROM picked, c
    WHERE i.id = picked.id
    RETURNING i.id, i.run_at, i.payload, i.attempts, i.max_attempts, i.dedup_id, i.last_error
)
SELECT id, payload, attempts, max_attempts, dedup_id, last_error
FROM claimed
ORDER BY run_at, id";

/// Complete: deletes the item if token `$3` owns it (running, this token). One deleted row:
/// settled; none: not the owner (another claim took it, it was settled, or it is gone).
/// Ownership does not end when the lease lapses, only when another claim takes the item.
///
/// Parameters: `$1` queue, `$2` item id, `$3` token.
pub const COMPLETE: &str = "\
DELETE FROM baton_work_item
WHERE id = $2 AND queue = $1 AND state = 'running' AND lock_token = $3";

/// Fail with a retry: makes the owner's item `ready` at `now + $4`, storing the error. One
/// changed row: settled.
///
/// Parameters: `$1` queue, `$2` item id, `$3` token, `$4` backoff (µs), `$5` error.
pub const RETRY: &str = "\
UPDATE baton_work_item AS i SET
    state = 'ready', run_at = c.now + $4 * interval '1 microsecond',
    lock_token = NULL, locked_until = NULL, last_error = $5
FROM (SELECT clock_timestamp() AS now) AS c
WHERE i.id = $2 AND i.queue = $1 AND i.state = 'running' AND i.lock_token = $3";

/// Fail for good: makes the owner's item `dead`, storing the error. One changed row:
/// settled.
///
/// Parameters: `$1` queue, `$2` item id, `$3` token, `$4` error.
pub const DEAD_LETTER: &str = "\
UPDATE baton_work_item SET state = 'dead', lock_token = NULL, locked_until = NULL, last_error = $4
WHERE id = $2 AND queue = $1 AND state = 'running' AND lock_token = $3";

/// Extend: restarts the owner's lease at `now + $4`. One changed row: renewed.
///
/// Parameters: `$1` queue, `$2` item id, `$3` token, `$4` lease (ms).
pub const EXTEND: &str = "\
UPDATE baton_work_item AS i SET locked_until = c.now + $4 * interval '1 millisecond'
FROM (SELECT clock_timestamp() AS now) AS c
WHERE i.id = $2 AND i.queue = $1 AND i.state = 'running' AND i.lock_token = $3";

/// Release: makes the owner's item `ready` now, giving back the attempt its claim counted.
/// One changed row: settled.
///
/// Parameters: `$1` queue, `$2` item id, `$3` token.
pub const RELEASE: &str = "\
UPDATE baton_work_item AS i SET
    state = 'ready', run_at = c.now, lock_token = NULL, locked_until = NULL,
    attempts = greatest(i.attempts - 1, 0)
FROM (SELECT clock_timestamp() AS now) AS c
WHERE i.id = $2 AND i.queue = $1 AND i.state = 'running' AND i.lock_token = $3";

/// Stats: per queue whose key is in the range `$1 <= queue < $2` (`$2` `NULL`: no upper
/// bound), in key order: `queue`, `ready`, `scheduled`, `running`, `expired`, `dead`
/// (`bigint` each) and `oldest_due_us` (`bigint`, how long the oldest claimable item has
/// been claimable; `NULL` when none is, so no `greatest(0, ...)` here, which would turn
/// `NULL` into 0). One aggregate per state, so each reads its own
/// partial index.
///
/// Parameters: `$1` prefix, `$2` upper bound of the prefix, or `NULL`.
pub const STATS: &str = "\
WITH c AS (SELECT clock_timestamp() AS now),
per_state AS (
    SELECT i.queue,
           count(*) FILTER (WHERE i.run_at <= c.now) AS ready,
           count(*) FILTER (WHERE i.run_at > c.now) AS scheduled,
           0::bigint AS running, 0::bigint AS expired, 0::bigint AS dead,
           min(i.run_at) FILTER (WHERE i.run_at <= c.now) AS due_since
    FROM baton_work_item AS i CROSS JOIN c
    WHERE i.state = 'ready' AND i.queue >= $1 AND ($2::text IS NULL OR i.queue < $2)
    GROUP BY i.queue
    UNION ALL
    SELECT i.queue, 0, 0,
           count(*) FILTER (WHERE i.locked_until > c.now),
           count(*) FILTER (WHERE i.locked_until <= c.now),
           0,
           min(i.locked_until) FILTER (WHERE i.locked_until <= c.now)
    FROM baton_work_item AS i CROSS JOIN c
    WHERE i.state = 'running' AND i.queue >= $1 AND ($2::text IS NULL OR i.queue < $2)
    GROUP BY i.queue
    UNION ALL
    SELECT i.queue, 0, 0, 0, 0, count(*), NULL
    FROM baton_work_item AS i
    WHERE i.state = 'dead' AND i.queue >= $1 AND ($2::text IS NULL OR i.queue < $2)
    GROUP BY i.queue
)
SELECT s.queue,
       sum(s.ready)::bigint AS ready, sum(s.scheduled)::bigint AS scheduled,
       sum(s.running)::bigint AS running, sum(s.expired)::bigint AS expired,
       sum(s.dead)::bigint AS dead,
       floor(extract(epoch FROM c.now - min(s.due_since)) * 1000000)::bigint AS oldest_due_us
FROM per_state AS s CROSS JOIN c
GROUP BY s.queue, c.now
ORDER BY s.queue";

/// Dead letters: up to `$2` dead items of queue `$1`, oldest (lowest id) first: `id`,
/// `payload`, `attempts`, `dedup_id`, `last_error`.
///
/// Parameters: `$1` queue, `$2` limit (`bigint`).
pub const DEAD_LETTERS: &str = "\
SELECT id, payload, attempts, dedup_id, last_error
FROM baton_work_item
WHERE queue = $1 AND state = 'dead'
ORDER BY id
LIMIT $2";

/// The server's wall clock: `now_ms` (`bigint`, unix milliseconds).
pub const NOW_MS: &str =
    "SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint AS now_ms";

/// Register: inserts the schedule when absent; replaces spec and due time when the spec
/// differs; otherwise changes nothing. Returns the row as stored: `name`, `spec`,
/// `due_at_ms`, `runs`, `last_holder`, `last_run_ms`. No row means the row was inserted by
/// a concurrent register after this statement's snapshot: run it again.
///
/// Parameters: `$1` name, `$2` spec, `$3` first due time (unix ms).
pub const REGISTER_SCHEDULE: &str = "\
WITH c AS (SELECT clock_timestamp() AS now),
up AS (
    INSERT INTO baton_work_schedule AS s (name, spec, due_at_ms, runs, updated_at)
    SELECT $1, $2, $3, 0, c.now FROM c
    ON CONFLICT (name) DO UPDATE SET
        spec = excluded.spec, due_at_ms = excluded.due_at_ms, updated_at = excluded.updated_at
    WHERE s.spec <> excluded.spec
    RETURNING s.name, s.spec, s.due_at_ms, s.runs, s.last_holder, s.last_run_ms
)
SELECT name, spec, due_at_ms, runs, last_holder, last_run_ms FROM up
UNION ALL
SELECT name, spec, due_at_ms, runs, last_holder, last_run_ms
FROM baton_work_schedule
WHERE name = $1 AND NOT EXISTS (SELECT 1 FROM up)";

/// Advance, the claim of one tick: moves the row from `$2` to `$3` only if it is at `$2`
/// and `$2` has come on the server's clock; when `$5`, also records holder `$4`, the time
/// and one more run. One changed row: claimed. In `READ COMMITTED` concurrent advances of
/// one tick are serialized by the row lock and the condition is checked again on the
/// winner's version, which no longer matches: exactly one of them changes the row.
///
/// Parameters: `$1` name, `$2` expected due time, `$3` next due time (unix ms), `$4`
/// holder, `$5` ran (`bool`).
pub const ADVANCE_SCHEDULE: &str = "\
UPDATE baton_work_schedule AS s SET
    due_at_ms   = $3,
    runs        = s.runs + CASE WHEN $5 THEN 1 ELSE 0 END,
    last_holder = CASE WHEN $5 THEN $4 ELSE s.last_holder END,
    last_run_ms = CASE WHEN $5 THEN c.now_ms ELSE s.last_run_ms END,
    updated_at  = c.now
FROM (SELECT n AS now, floor(extract(epoch FROM n) * 1000)::bigint AS now_ms
      FROM clock_timestamp() AS n) AS c
WHERE s.name = $1 AND s.due_at_ms = $2 AND $2 <= c.now_ms";

/// One schedule: `name`, `spec`, `due_at_ms`, `runs`, `last_holder`, `last_run_ms`.
///
/// Parameters: `$1` name.
pub const SCHEDULE: &str = "\
SELECT name, spec, due_at_ms, runs, last_holder, last_run_ms
FROM baton_work_schedule WHERE name = $1";

/// The schedules whose name is in the range `$1 <= name < $2` (`$2` `NULL`: no upper
/// bound), in name order, with the columns of [`SCHEDULE`].
///
/// Parameters: `$1` prefix, `$2` upper bound of the prefix, or `NULL`.
pub const SCHEDULES: &str = "\
SELECT name, spec, due_at_ms, runs, last_holder, last_run_ms
FROM baton_work_schedule
WHERE name >= $1 AND ($2::text IS NULL OR name < $2)
ORDER BY name";

/// Deletes a schedule. One deleted row: there was one.
///
/// Parameters: `$1` name.
pub const REMOVE_SCHEDULE: &str = "DELETE FROM baton_work_schedule WHERE name = $1";

/// Claim a migration, one compare-and-set: inserts it `pending` for `$3` (attempt 1), or
/// takes it over when it `failed`, was `rolled_back`, or is `pending` with a lapsed lease or
/// owned by `$3` itself (attempt + 1, `previous` = the state taken over). Returns `attempt`
/// and `previous` when `$3` owns it now; no row when it is completed or another writer's
/// lease is live, which [`MIGRATION`] then tells apart (a new statement, so it sees the row
/// this one conflicted with even when that row was committed after this statement's
/// snapshot).
///
/// Parameters: `$1` set, `$2` name, `$3` writer, `$4` lease (ms).
pub const CLAIM_MIGRATION: &str = "\
INSERT INTO baton_work_migration AS m
    (set_key, name, state, claimed_by, attempt, lease_until, error, previous, updated_at)
SELECT $1, $2, 'pending', $3, 1, c.now + $4 * interval '1 millisecond', '', NULL, c.now
FROM (SELECT clock_timestamp() AS now) AS c
ON CONFLICT (set_key, name) DO UPDATE SET
    state       = 'pending',
    claimed_by  = excluded.claimed_by,
    attempt     = m.attempt + 1,
    lease_until = excluded.lease_until,
    previous    = m.state,
    updated_at  = excluded.updated_at
WHERE m.state IN ('failed', 'rolled_back')
   OR (m.state = 'pending'
       AND (m.lease_until <= excluded.updated_at OR m.claimed_by = excluded.claimed_by))
RETURNING m.attempt, m.previous";

/// One migration record: `state`, `claimed_by`, `remaining_us` (`bigint`, the lease left).
///
/// Parameters: `$1` set, `$2` name.
pub const MIGRATION: &str = "\
SELECT m.state, m.claimed_by,
       greatest(0, floor(extract(epoch FROM m.lease_until - c.now) * 1000000))::bigint AS remaining_us
FROM baton_work_migration AS m, (SELECT clock_timestamp() AS now) AS c
WHERE m.set_key = $1 AND m.name = $2";

/// Heartbeat: restarts the lease of `$3`'s pending record. One changed row: renewed.
/// Ownership does not end when the lease lapses, only at a takeover.
///
/// Parameters: `$1` set, `$2` name, `$3` writer, `$4` lease (ms).
pub const HEARTBEAT_MIGRATION: &str = "\
UPDATE baton_work_migration AS m
SET lease_until = c.now + $4 * interval '1 millisecond', updated_at = c.now
FROM (SELECT clock_timestamp() AS now) AS c
WHERE m.set_key = $1 AND m.name = $2 AND m.state = 'pending' AND m.claimed_by = $3";

/// Finish: moves `$3`'s pending record to state `$4` with error `$5`. One changed row:
/// settled.
///
/// Parameters: `$1` set, `$2` name, `$3` writer, `$4` state, `$5` error.
pub const FINISH_MIGRATION: &str = "\
UPDATE baton_work_migration AS m
SET state = $4, error = $5, lease_until = c.now, updated_at = c.now
FROM (SELECT clock_timestamp() AS now) AS c
WHERE m.set_key = $1 AND m.name = $2 AND m.state = 'pending' AND m.claimed_by = $3";

/// Every record of set `$1`, in name order: `name`, `state`, `claimed_by`, `attempt`,
/// `remaining_us` (`bigint`), `error`.
///
/// Parameters: `$1` set.
pub const MIGRATIONS_OF: &str = "\
SELECT m.name, m.state, m.claimed_by, m.attempt,
       greatest(0, floor(extract(epoch FROM m.lease_until - c.now) * 1000000))::bigint AS remaining_us,
       m.error
FROM baton_work_migration AS m, (SELECT clock_timestamp() AS now) AS c
WHERE m.set_key = $1
ORDER BY m.name";
