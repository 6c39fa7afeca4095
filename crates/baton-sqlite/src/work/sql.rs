//! Every SQL text the claimable-work atoms run, as public constants.
//!
//! Use these to do by hand exactly what the store does: the benchmark's raw loop runs these
//! very statements, and an operator can inspect or repair a queue with the `sqlite3` shell.
//! Every value is a positional bind parameter, listed on each statement.
//!
//! ## Conventions
//! - `wall` is the host's wall clock in milliseconds since the Unix epoch
//!   ([`wall_ms`](super::wall_ms)); `mono` is the host's monotonic clock in nanoseconds
//!   ([`crate::clock::now`]); a lease is nanoseconds. `run_at`, dedup `expires_at`, and
//!   schedule times are on the wall clock (they must mean the same after a reboot);
//!   `locked_until` and a migration's `lease_until` are on the monotonic clock (a wall-clock
//!   step must never hand a live claim to a second worker). See the [module](super) docs.
//! - Every write is one short transaction: [`BEGIN_IMMEDIATE`](crate::sql::BEGIN_IMMEDIATE),
//!   a read of the clocks, the statements named below, [`COMMIT`](crate::sql::COMMIT).
//!
//! | operation | statements, in order |
//! |---|---|
//! | enqueue | [`PURGE_DEDUP`]; per item: with a dedup id [`LIVE_DEDUP`], and when it found none, [`INSERT_ITEM`] then [`REMEMBER_DEDUP`]; without one [`INSERT_ITEM`] |
//! | claim | [`PEEK`] before the transaction (no write lock for an empty queue); then [`CLAIM`] |
//! | complete | [`COMPLETE`] (1 changed row: settled) |
//! | fail | [`RETRY`] or [`DEAD_LETTER`] (1 changed row: settled) |
//! | extend | [`EXTEND`] (1 changed row: renewed) |
//! | release | [`RELEASE`] (1 changed row: settled) |
//! | stats, dead letters | [`STATS`], [`DEAD_LETTERS`] (no transaction) |
//! | register a schedule | [`REGISTER_SCHEDULE`], then [`SCHEDULE`] |
//! | advance a schedule | [`ADVANCE_SCHEDULE`] (1 changed row: claimed) |
//! | schedule, schedules, remove | [`SCHEDULE`], [`SCHEDULES`] (no transaction), [`REMOVE_SCHEDULE`] |
//! | claim a migration | [`MIGRATION`], then [`INSERT_MIGRATION`] or [`TAKE_MIGRATION`] |
//! | heartbeat, finish | [`HEARTBEAT_MIGRATION`], [`FINISH_MIGRATION`] (1 changed row: done) |
//! | migrations | [`MIGRATIONS`] (no transaction) |
//!
//! Prefix listings ([`STATS`], [`SCHEDULES`]) take the key range `prefix <= key < upper`,
//! where `upper` is the smallest string above every key with the prefix or, when there is
//! none (an empty prefix), a BLOB: SQLite orders every BLOB after every TEXT. Keys may
//! contain `%` and `_`, so no `LIKE`.

/// The tables and indexes of claimable work, created on open when missing (`IF NOT
/// EXISTS`, so any number of processes may open the file at once).
///
/// - `baton_work_item`: one row per item until it completes. `id` is `AUTOINCREMENT` so an
///   id is never reused, not even the id of the last item after it completed (a
///   de-duplication answer may name a completed item). `state` is `ready`, `running` or
///   `dead`. `run_at` (wall ms) is when a ready item becomes claimable; `token` and
///   `locked_until` (monotonic ns) are set while it runs.
/// - Three partial indexes, one per state, each in the order its reader wants, so a claim
///   walks `(queue, run_at, id)` of ready items and `(queue, locked_until)` of running ones
///   and stops after `batch` rows, [`STATS`] counts from the indexes alone, and a state
///   change moves one index entry instead of rewriting two. (The `id` is in every index as
///   the rowid.)
/// - `baton_work_dedup`: one row per remembered de-duplication id, with its item and the
///   end of its window (wall ms); the `expires_at` index serves [`PURGE_DEDUP`].
/// - `baton_work_schedule`: one row per schedule; times are wall ms.
/// - `baton_work_migration`: one row per `(set, name)`; `lease_until` is monotonic ns.
pub const SCHEMA: &str = "\
CREATE TABLE IF NOT EXISTS baton_work_item (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    queue        TEXT    NOT NULL,
    state        TEXT    NOT NULL,
    run_at       INTEGER NOT NULL,
    payload      BLOB    NOT NULL,
    dedup_id     TEXT,
    attempts     INTEGER NOT NULL,
    max_attempts INTEGER NOT NULL,
    token        TEXT,
    locked_until INTEGER,
    last_error   TEXT    NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS baton_work_item_ready
    ON baton_work_item (queue, run_at) WHERE state = 'ready';
CREATE INDEX IF NOT EXISTS baton_work_item_running
    ON baton_work_item (queue, locked_until) WHERE state = 'running';
CREATE INDEX IF NOT EXISTS baton_work_item_dead
    ON baton_work_item (queue) WHERE state = 'dead';
CREATE TABLE IF NOT EXISTS baton_work_dedup (
    queue      TEXT    NOT NULL,
    dedup_id   TEXT    NOT NULL,
    item_id    INTEGER NOT NULL,
    expires_at INTEGER NOT NULL,
    PRIMARY KEY (queue, dedup_id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS baton_work_dedup_expiry ON baton_work_dedup (expires_at);
CREATE TABLE IF NOT EXISTS baton_work_schedule (
    name        TEXT    NOT NULL PRIMARY KEY,
    spec        TEXT    NOT NULL,
    due_at_ms   INTEGER NOT NULL,
    runs        INTEGER NOT NULL DEFAULT 0,
    last_holder TEXT,
    last_run_ms INTEGER
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS baton_work_migration (
    set_key     TEXT    NOT NULL,
    name        TEXT    NOT NULL,
    state       TEXT    NOT NULL,
    claimed_by  TEXT    NOT NULL,
    attempt     INTEGER NOT NULL,
    lease_until INTEGER NOT NULL,
    error       TEXT    NOT NULL DEFAULT '',
    PRIMARY KEY (set_key, name)
) WITHOUT ROWID;
";

/// Enqueue, first step of every call: forgets up to `?2` de-duplication ids whose window
/// ended (the store passes 64 plus the number of ids in the batch, so the table never
/// grows by more than it sheds while expired rows remain).
///
/// Parameters: `?1` wall now, `?2` limit.
pub const PURGE_DEDUP: &str = "\
DELETE FROM baton_work_dedup WHERE (queue, dedup_id) IN
    (SELECT queue, dedup_id FROM baton_work_dedup WHERE expires_at <= ?1 LIMIT ?2)";

/// Enqueue: the item holding a de-duplication id whose window is still open (`item_id`; no
/// row: absent or expired).
///
/// Parameters: `?1` queue, `?2` dedup id, `?3` wall now.
pub const LIVE_DEDUP: &str = "\
SELECT item_id FROM baton_work_dedup WHERE queue = ?1 AND dedup_id = ?2 AND expires_at > ?3";

/// Enqueue: adds a ready item and returns its `id`.
///
/// Parameters: `?1` queue, `?2` run at (wall ms), `?3` payload, `?4` dedup id or NULL, `?5`
/// max attempts.
pub const INSERT_ITEM: &str = "\
INSERT INTO baton_work_item (queue, state, run_at, payload, dedup_id, attempts, max_attempts)
VALUES (?1, 'ready', ?2, ?3, ?4, 0, ?5)
RETURNING id";

/// Enqueue: remembers a de-duplication id for its window, inserting it when absent and
/// replacing it when its window ended. Changes one row; [`LIVE_DEDUP`] ran first in the
/// same transaction, so a live row is never there.
///
/// Parameters: `?1` queue, `?2` dedup id, `?3` item id, `?4` wall now, `?5` window (ms).
pub const REMEMBER_DEDUP: &str = "\
INSERT INTO baton_work_dedup (queue, dedup_id, item_id, expires_at) VALUES (?1, ?2, ?3, ?4 + ?5)
ON CONFLICT (queue, dedup_id) DO UPDATE SET
    item_id = excluded.item_id, expires_at = excluded.expires_at
WHERE expires_at <= ?4";

/// Claim, before the transaction: whether the queue has an eligible item at all (1 or 0).
/// Run outside a transaction (WAL readers take no lock), so pollers of an empty queue never
/// take the file's write lock. A stale "no" is an answer the claim could have given a
/// moment earlier.
///
/// Parameters: `?1` queue, `?2` wall now, `?3` monotonic now.
pub const PEEK: &str = "\
SELECT EXISTS (SELECT 1 FROM baton_work_item
               WHERE queue = ?1 AND state = 'ready' AND run_at <= ?2)
    OR EXISTS (SELECT 1 FROM baton_work_item
               WHERE queue = ?1 AND state = 'running' AND locked_until <= ?3)";

/// Claim: takes up to `?6` eligible items of a queue — ready with `run_at <= now`, or running
/// with a lapsed lease — oldest `run_at` first, then lowest id; stamps them with the token
/// and the lease, one more attempt; and returns them: `id, run_at, payload, attempts,
/// max_attempts, dedup_id, last_error` (in no particular order; the store sorts them).
///
/// Each arm walks its partial index in order and stops after `?6` rows, so a claim reads at
/// most `2 × ?6` candidates whatever the backlog. The write lock of the transaction makes
/// the selection and the update one step for every process on the file.
///
/// Parameters: `?1` queue, `?2` wall now, `?3` monotonic now, `?4` token, `?5` lease (ns),
/// `?6` batch.
pub const CLAIM: &str = "\
UPDATE baton_work_item
SET state = 'running', token = ?4, locked_until = ?3 + ?5, attempts = attempts + 1
WHERE id IN (
    SELECT id FROM (
        SELECT id, run_at FROM (
            SELECT id, run_at FROM baton_work_item
            WHERE queue = ?1 AND state = 'ready' AND run_at <= ?2
            ORDER BY run_at, id LIMIT ?6)
        UNION ALL
        SELECT id, run_at FROM (
            SELECT id, run_at FROM baton_work_item
            WHERE queue = ?1 AND state = 'running' AND locked_until <= ?3
            ORDER BY run_at, id LIMIT ?6))
    ORDER BY run_at, id LIMIT ?6)
RETURNING id, run_at, payload, attempts, max_attempts, dedup_id, last_error";

/// Complete: deletes the item if the token owns it (its dedup id stays remembered).
///
/// Parameters: `?1` id, `?2` queue, `?3` token.
pub const COMPLETE: &str = "\
DELETE FROM baton_work_item WHERE id = ?1 AND queue = ?2 AND state = 'running' AND token = ?3";

/// Fail with a retry: makes the owned item ready again after the backoff, storing the error.
///
/// Parameters: `?1` id, `?2` queue, `?3` token, `?4` run at (wall now + backoff, ms,
/// saturated by the caller: a backoff is any `Duration`), `?5` error.
pub const RETRY: &str = "\
UPDATE baton_work_item
SET state = 'ready', run_at = ?4, last_error = ?5, token = NULL, locked_until = NULL
WHERE id = ?1 AND queue = ?2 AND state = 'running' AND token = ?3";

/// Fail for good: dead-letters the owned item, storing the error.
///
/// Parameters: `?1` id, `?2` queue, `?3` token, `?4` error.
pub const DEAD_LETTER: &str = "\
UPDATE baton_work_item
SET state = 'dead', last_error = ?4, token = NULL, locked_until = NULL
WHERE id = ?1 AND queue = ?2 AND state = 'running' AND token = ?3";

/// Extend: restarts the owned item's lease.
///
/// Parameters: `?1` id, `?2` queue, `?3` token, `?4` monotonic now, `?5` lease (ns).
pub const EXTEND: &str = "\
UPDATE baton_work_item SET locked_until = ?4 + ?5
WHERE id = ?1 AND queue = ?2 AND state = 'running' AND token = ?3";

/// Release: returns the owned item to the queue at once, not counting the attempt.
///
/// Parameters: `?1` id, `?2` queue, `?3` token, `?4` wall now.
pub const RELEASE: &str = "\
UPDATE baton_work_item
SET state = 'ready', run_at = ?4, attempts = max(attempts - 1, 0), token = NULL,
    locked_until = NULL
WHERE id = ?1 AND queue = ?2 AND state = 'running' AND token = ?3";

/// Stats: per queue in the key range, in key order: `queue, ready, scheduled, running,
/// expired, dead, oldest due (ms, wall), oldest lapsed (ns, monotonic)`. Each arm reads one
/// partial index only.
///
/// Parameters: `?1` prefix, `?2` upper bound (see the [module](self) docs), `?3` wall now,
/// `?4` monotonic now.
pub const STATS: &str = "\
SELECT queue, sum(ready), sum(scheduled), sum(running), sum(expired), sum(dead),
       max(due_ms), max(lapsed_ns)
FROM (
    SELECT queue, run_at <= ?3 AS ready, run_at > ?3 AS scheduled, 0 AS running,
           0 AS expired, 0 AS dead, CASE WHEN run_at <= ?3 THEN ?3 - run_at END AS due_ms,
           NULL AS lapsed_ns
    FROM baton_work_item WHERE state = 'ready' AND queue >= ?1 AND queue < ?2
    UNION ALL
    SELECT queue, 0, 0, locked_until > ?4, locked_until <= ?4, 0, NULL,
           CASE WHEN locked_until <= ?4 THEN ?4 - locked_until END
    FROM baton_work_item WHERE state = 'running' AND queue >= ?1 AND queue < ?2
    UNION ALL
    SELECT queue, 0, 0, 0, 0, 1, NULL, NULL
    FROM baton_work_item WHERE state = 'dead' AND queue >= ?1 AND queue < ?2)
GROUP BY queue ORDER BY queue";

/// Dead letters of a queue, oldest (lowest id) first: `id, payload, attempts, dedup_id,
/// last_error`.
///
/// Parameters: `?1` queue, `?2` limit.
pub const DEAD_LETTERS: &str = "\
SELECT id, payload, attempts, dedup_id, last_error FROM baton_work_item
WHERE queue = ?1 AND state = 'dead' ORDER BY id LIMIT ?2";

/// Register a schedule: inserts the row when absent; replaces spec and due time when the
/// spec differs; otherwise changes nothing. [`SCHEDULE`] then reads the row as stored.
///
/// Parameters: `?1` name, `?2` spec, `?3` first due (wall ms).
pub const REGISTER_SCHEDULE: &str = "\
INSERT INTO baton_work_schedule (name, spec, due_at_ms, runs) VALUES (?1, ?2, ?3, 0)
ON CONFLICT (name) DO UPDATE SET spec = excluded.spec, due_at_ms = excluded.due_at_ms
WHERE spec <> excluded.spec";

/// A schedule row: `name, spec, due_at_ms, runs, last_holder, last_run_ms`.
///
/// Parameters: `?1` name.
pub const SCHEDULE: &str = "\
SELECT name, spec, due_at_ms, runs, last_holder, last_run_ms FROM baton_work_schedule
WHERE name = ?1";

/// Schedule rows in the key range, in key order (columns as [`SCHEDULE`]).
///
/// Parameters: `?1` prefix, `?2` upper bound (see the [module](self) docs).
pub const SCHEDULES: &str = "\
SELECT name, spec, due_at_ms, runs, last_holder, last_run_ms FROM baton_work_schedule
WHERE name >= ?1 AND name < ?2 ORDER BY name";

/// Advance a schedule: the claim of one tick. Moves the row from the expected due time to
/// the next only if it is there and due on the store's wall clock; when `?5` is 1 (the
/// tick ran) it also records the holder, the time and one more run. One changed row:
/// claimed.
///
/// Parameters: `?1` name, `?2` expected due (ms), `?3` next due (ms), `?4` holder, `?5` ran
/// (0 or 1), `?6` wall now.
pub const ADVANCE_SCHEDULE: &str = "\
UPDATE baton_work_schedule
SET due_at_ms   = ?3,
    runs        = runs + ?5,
    last_holder = CASE WHEN ?5 = 1 THEN ?4 ELSE last_holder END,
    last_run_ms = CASE WHEN ?5 = 1 THEN ?6 ELSE last_run_ms END
WHERE name = ?1 AND due_at_ms = ?2 AND ?2 <= ?6";

/// Deletes a schedule row (1 changed row: there was one).
///
/// Parameters: `?1` name.
pub const REMOVE_SCHEDULE: &str = "DELETE FROM baton_work_schedule WHERE name = ?1";

/// A migration record as claim reads it: `state, claimed_by, lease_until`.
///
/// Parameters: `?1` set, `?2` name.
pub const MIGRATION: &str = "\
SELECT state, claimed_by, lease_until FROM baton_work_migration WHERE set_key = ?1 AND name = ?2";

/// Claim of a new migration: a pending record owned by the writer, attempt 1.
///
/// Parameters: `?1` set, `?2` name, `?3` writer, `?4` monotonic now, `?5` lease (ns).
pub const INSERT_MIGRATION: &str = "\
INSERT INTO baton_work_migration (set_key, name, state, claimed_by, attempt, lease_until, error)
VALUES (?1, ?2, 'pending', ?3, 1, ?4 + ?5, '')";

/// Takeover of a failed, rolled back, or lapsed pending record, or of the writer's own
/// pending one (lapsed or not): the writer owns it, one more attempt, a new lease. Returns
/// `attempt` when it took it (the condition repeats what [`MIGRATION`] found, so the
/// statement is a compare-and-set on its own).
///
/// Parameters: `?1` set, `?2` name, `?3` writer, `?4` monotonic now, `?5` lease (ns).
pub const TAKE_MIGRATION: &str = "\
UPDATE baton_work_migration
SET state = 'pending', claimed_by = ?3, attempt = attempt + 1, lease_until = ?4 + ?5
WHERE set_key = ?1 AND name = ?2
  AND (state IN ('failed', 'rolled_back')
       OR (state = 'pending' AND (lease_until <= ?4 OR claimed_by = ?3)))
RETURNING attempt";

/// Heartbeat: restarts the lease of the writer's pending record.
///
/// Parameters: `?1` set, `?2` name, `?3` writer, `?4` monotonic now, `?5` lease (ns).
pub const HEARTBEAT_MIGRATION: &str = "\
UPDATE baton_work_migration SET lease_until = ?4 + ?5
WHERE set_key = ?1 AND name = ?2 AND state = 'pending' AND claimed_by = ?3";

/// Finish: moves the writer's pending record to a final state, storing the error; the lease
/// ends.
///
/// Parameters: `?1` set, `?2` name, `?3` writer, `?4` state, `?5` error, `?6` monotonic now.
pub const FINISH_MIGRATION: &str = "\
UPDATE baton_work_migration SET state = ?4, error = ?5, lease_until = ?6
WHERE set_key = ?1 AND name = ?2 AND state = 'pending' AND claimed_by = ?3";

/// Every record of a set, by name: `name, state, claimed_by, attempt, lease_until, error`.
///
/// Parameters: `?1` set.
pub const MIGRATIONS: &str = "\
SELECT name, state, claimed_by, attempt, lease_until, error FROM baton_work_migration
WHERE set_key = ?1 ORDER BY name";

/// The boot the stored leases belong to: `value` (no row: not recorded).
pub const WORK_BOOT: &str = "SELECT value FROM baton_meta WHERE name = 'work_boot'";

/// Records the boot the stored leases belong to.
///
/// Parameters: `?1` boot id.
pub const SET_WORK_BOOT: &str = "\
INSERT INTO baton_meta (name, value) VALUES ('work_boot', ?1)
ON CONFLICT (name) DO UPDATE SET value = excluded.value";

/// After a reboot: every running item's lease lapses now (its claimer died with the old
/// boot, and its time is on a clock that restarted). The token stays.
///
/// Parameters: `?1` monotonic now, `?2` how far ahead a lease must lie to be lapsed (0 after
/// a known reboot; the longest lease where the boot cannot be identified).
pub const LAPSE_ITEMS: &str = "\
UPDATE baton_work_item SET locked_until = ?1
WHERE state = 'running' AND locked_until > ?1 + ?2";

/// After a reboot: every pending migration's lease lapses now (parameters as
/// [`LAPSE_ITEMS`]).
pub const LAPSE_MIGRATIONS: &str = "\
UPDATE baton_work_migration SET lease_until = ?1
WHERE state = 'pending' AND lease_until > ?1 + ?2";
