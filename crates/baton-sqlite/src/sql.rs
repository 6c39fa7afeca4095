//! Every SQL text the store runs, as public constants.
//!
//! Use these when you need to do by hand exactly what the store does: a benchmark baseline
//! that runs the same statements over the same driver, or an operator inspecting or breaking
//! a grant with the `sqlite3` shell. The store never formats a value into SQL: every value is
//! a positional bind parameter (`?1`, `?2`, ...), listed on each statement.
//!
//! ## Conventions
//! - `now` and `expires_at` are nanoseconds of the host's monotonic clock, as
//!   [`crate::clock::now`] reads it; `ttl` is nanoseconds too. A stored time means nothing
//!   on another host or after a reboot (see the [`clock`](crate::clock) module).
//! - A row with `holder IS NULL` and `expires_at <= now` is a free key that keeps its last
//!   fence. A row with a holder whose `expires_at <= now` is an expired grant: it is free
//!   too, and keeps its holder only until the next claim or [`PRUNE`]. A row with no holder
//!   whose `expires_at > now` is a key reserved by a release for the process that waited
//!   longest ([`RESERVE`]); its `reason` names that process.
//! - Every lease operation is one short transaction: [`BEGIN_IMMEDIATE`], a clock read,
//!   the statements named on the operation, [`COMMIT`].
//!
//! | operation | statements, in order |
//! |---|---|
//! | claim | now and then [`SWEEP`]; [`GRANT`]; when it returned no row, [`CURRENT`], then [`EXTEND`] if the caller holds it |
//! | renew | [`RENEW`] (1 changed row: renewed) |
//! | release | [`RELEASE`]; when it changed a row and another process waits, [`RESERVE`]; when it changed no row, [`CURRENT`] |
//! | inspect | [`INSPECT`] (no transaction) |
//! | list | [`LIST`], or [`LIST_FROM`] when the prefix has no upper bound (no transaction) |

use crate::options::SqliteOptions;

/// The `application_id` in the file header that marks a baton file (`"batn"`).
pub const APPLICATION_ID: i32 = 0x6261_746e;

/// The schema version this build writes and understands, kept in `PRAGMA user_version`.
pub const SCHEMA_VERSION: i32 = 1;

/// The tables, created in one `BEGIN IMMEDIATE` transaction when the file is new.
///
/// - `baton_grant`: one row per key ever claimed. Rows are kept when a grant is released or
///   expires, so the key's fence survives; [`PRUNE`] removes free rows, and claims now and
///   then remove a bounded number of them ([`SWEEP`]).
/// - `baton_meta`: `fence_floor` (every fence of a deleted row is at most this, so a key that
///   is created again starts above it) and `boot_id` (the boot the stored times belong to).
/// - The trigger raises `fence_floor` for every deleted row, whoever deletes it (the store's
///   prune, or an operator's `DELETE` in the `sqlite3` shell), so fences never go back.
pub const SCHEMA: &str = "\
CREATE TABLE baton_grant (
    key        TEXT    NOT NULL PRIMARY KEY,
    holder     TEXT,
    fence      INTEGER NOT NULL,
    expires_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL,
    reason     TEXT    NOT NULL DEFAULT ''
) WITHOUT ROWID;
CREATE TABLE baton_meta (
    name  TEXT NOT NULL PRIMARY KEY,
    value
) WITHOUT ROWID;
INSERT INTO baton_meta (name, value) VALUES ('fence_floor', 0);
CREATE TRIGGER baton_grant_keeps_fence AFTER DELETE ON baton_grant BEGIN
    UPDATE baton_meta SET value = max(value, old.fence) WHERE name = 'fence_floor';
END;
";

/// Whose file it is, read before anything is written: `application_id`, `user_version` and
/// the number of tables and indexes, in one snapshot. A file with another `application_id`,
/// or with none but with tables, belongs to another application and is refused untouched.
pub const OWNER: &str = "\
SELECT (SELECT application_id FROM pragma_application_id()),
       (SELECT user_version FROM pragma_user_version()),
       (SELECT count(*) FROM sqlite_schema)";

/// Starts a write transaction, waiting up to `busy_timeout` for other writers.
pub const BEGIN_IMMEDIATE: &str = "BEGIN IMMEDIATE";

/// Commits the transaction.
pub const COMMIT: &str = "COMMIT";

/// Rolls the transaction back.
pub const ROLLBACK: &str = "ROLLBACK";

/// Claim, first step: grants `key` when it is new, free, expired or reserved for the
/// caller's process, with the next fence, and returns that fence. Returns no row when the
/// key is live (held by anyone, the caller too) or reserved for another process.
///
/// The next fence is one more than the key's last (or than `fence_floor` for a new row),
/// and at least the wall clock in microseconds (`?6`, [`crate::clock::wall_micros`]): so a
/// key whose row went with its file (deleted, replaced) starts again above every fence
/// handed out for it before, as long as the wall clock has not stepped back.
///
/// Parameters: `?1` key, `?2` holder, `?3` now, `?4` ttl, `?5` reason, `?6` wall clock µs,
/// `?7` `handoff:<process>` of the caller's process (`NULL` when it takes no turns).
pub const GRANT: &str = "\
INSERT INTO baton_grant (key, holder, fence, expires_at, updated_at, reason)
VALUES (?1, ?2, max((SELECT value FROM baton_meta WHERE name = 'fence_floor') + 1, ?6), ?3 + ?4, ?3, ?5)
ON CONFLICT (key) DO UPDATE SET
    holder     = excluded.holder,
    fence      = max(fence + 1, ?6),
    expires_at = excluded.expires_at,
    updated_at = excluded.updated_at,
    reason     = excluded.reason
WHERE expires_at <= ?3 OR (holder IS NULL AND (reason = ?7 OR substr(reason, 1, 8) <> 'handoff:'))
RETURNING fence";

/// The row of `key` as it is now: `holder`, `expires_at`, `reason` (no row: never claimed,
/// or pruned). Claim reads it after [`GRANT`] found the key live or reserved; release after
/// [`RELEASE`] changed nothing.
///
/// Parameters: `?1` key.
pub const CURRENT: &str = "SELECT holder, expires_at, reason FROM baton_grant WHERE key = ?1";

/// Release, second step when another process waits for the key: reserves the free key for
/// that process until `?2 + ?3`, as `reason` `handoff:<process>` with no holder. Only a claim
/// that names the same reservation ([`GRANT`]'s `?7`) takes the key meanwhile; others find it
/// held by `handoff:<process>`.
///
/// Parameters: `?1` key, `?2` now, `?3` reservation, `?4` `handoff:<process>`.
pub const RESERVE: &str = "\
UPDATE baton_grant SET expires_at = ?2 + ?3, reason = ?4
WHERE key = ?1 AND holder IS NULL";

/// Claim by the current holder: extends its live grant and returns the unchanged fence.
///
/// Parameters: `?1` key, `?2` holder, `?3` now, `?4` ttl, `?5` reason.
pub const EXTEND: &str = "\
UPDATE baton_grant SET expires_at = ?3 + ?4, updated_at = ?3, reason = ?5
WHERE key = ?1 AND holder = ?2 AND expires_at > ?3
RETURNING fence";

/// Renew: extends the holder's live grant. One changed row means renewed; none means the
/// caller is not the holder (expired, released or taken), and nothing changed.
///
/// Parameters: `?1` key, `?2` holder, `?3` now, `?4` ttl.
pub const RENEW: &str = "\
UPDATE baton_grant SET expires_at = ?3 + ?4, updated_at = ?3
WHERE key = ?1 AND holder = ?2 AND expires_at > ?3";

/// Release: frees the holder's live grant, keeping the row and its fence. One changed row
/// means removed; otherwise [`CURRENT`] tells `Reclaimed` from `NoHolder`.
///
/// Parameters: `?1` key, `?2` holder, `?3` now.
pub const RELEASE: &str = "\
UPDATE baton_grant SET holder = NULL, expires_at = ?3, updated_at = ?3, reason = ''
WHERE key = ?1 AND holder = ?2 AND expires_at > ?3";

/// Evict: frees `key`'s live grant whoever holds it, keeping the fence (what an operator
/// breaking a stuck lock runs). Its holder learns of it at its next renewal.
///
/// Parameters: `?1` key, `?2` now.
pub const EVICT: &str = "\
UPDATE baton_grant SET holder = NULL, expires_at = ?2, updated_at = ?2, reason = ''
WHERE key = ?1 AND holder IS NOT NULL AND expires_at > ?2";

/// Inspect: the live grant of `key`: `holder`, `fence`, `expires_at`, `reason`.
///
/// Parameters: `?1` key, `?2` now.
pub const INSPECT: &str = "\
SELECT holder, fence, expires_at, reason FROM baton_grant
WHERE key = ?1 AND holder IS NOT NULL AND expires_at > ?2";

/// List: live grants whose key starts with a prefix, as the key range
/// `prefix <= key < upper` (keys may contain `%` and `_`, so no `LIKE`), in key order:
/// `key`, `holder`, `fence`, `expires_at`, `reason`.
///
/// Parameters: `?1` prefix, `?2` upper bound of the prefix, `?3` now, `?4` limit.
pub const LIST: &str = "\
SELECT key, holder, fence, expires_at, reason FROM baton_grant
WHERE key >= ?1 AND key < ?2 AND holder IS NOT NULL AND expires_at > ?3
ORDER BY key LIMIT ?4";

/// [`LIST`] for a prefix that has no upper bound (it is empty, or ends in U+10FFFF only).
///
/// Parameters: `?1` prefix, `?2` now, `?3` limit.
pub const LIST_FROM: &str = "\
SELECT key, holder, fence, expires_at, reason FROM baton_grant
WHERE key >= ?1 AND holder IS NOT NULL AND expires_at > ?2
ORDER BY key LIMIT ?3";

/// Prune: deletes the rows of free and expired keys. The trigger keeps their fences in
/// `fence_floor`, so a pruned key that is claimed again gets a larger fence.
///
/// Parameters: `?1` now.
pub const PRUNE: &str = "\
DELETE FROM baton_grant
WHERE expires_at <= ?1 OR (holder IS NULL AND substr(reason, 1, 8) <> 'handoff:')";

/// Sweep: deletes at most `?2` rows of free and expired keys, as [`PRUNE`] does for all of
/// them. Run inside a claim's transaction, before [`GRANT`], on the first claim of each
/// store and every [`SWEEP_EVERY`] claims after, so that per-tick keys (`report:<hour>`)
/// do not pile up rows; the trigger keeps their fences in `fence_floor`.
///
/// Parameters: `?1` now, `?2` limit.
pub const SWEEP: &str = "\
DELETE FROM baton_grant WHERE key IN
    (SELECT key FROM baton_grant
     WHERE expires_at <= ?1 OR (holder IS NULL AND substr(reason, 1, 8) <> 'handoff:')
     LIMIT ?2)";

/// How many claims of one store pass between runs of [`SWEEP`].
pub const SWEEP_EVERY: u64 = 32;

/// How many rows one [`SWEEP`] deletes at most: more than the claims between two sweeps can
/// create, so the rows of expired keys do not grow without bound.
pub const SWEEP_LIMIT: i64 = 100;

/// The boot the stored times belong to: `value` (no row: not recorded).
pub const BOOT_ID: &str = "SELECT value FROM baton_meta WHERE name = 'boot_id'";

/// Records the boot the stored times belong to.
///
/// Parameters: `?1` boot id.
pub const SET_BOOT_ID: &str = "\
INSERT INTO baton_meta (name, value) VALUES ('boot_id', ?1)
ON CONFLICT (name) DO UPDATE SET value = excluded.value";

/// After a reboot: frees every grant (all their holders died with the old boot, and their
/// times are on a clock that restarted), keeping the fences.
///
/// Parameters: `?1` now.
pub const FREE_ALL: &str = "\
UPDATE baton_grant SET holder = NULL, expires_at = ?1, updated_at = ?1, reason = ''
WHERE holder IS NOT NULL OR reason <> ''";

/// Where the boot cannot be identified: whether a grant was written later than `now`, which
/// on a monotonic clock means before a reboot.
///
/// Parameters: `?1` now.
pub const ANY_FROM_EARLIER_BOOT: &str = "SELECT EXISTS (SELECT 1 FROM baton_grant WHERE (holder IS NOT NULL OR reason <> '') AND updated_at > ?1)";

/// Frees the grants [`ANY_FROM_EARLIER_BOOT`] finds, keeping the fences.
///
/// Parameters: `?1` now.
pub const FREE_FROM_EARLIER_BOOT: &str = "\
UPDATE baton_grant SET holder = NULL, expires_at = ?1, updated_at = ?1, reason = ''
WHERE (holder IS NOT NULL OR reason <> '') AND updated_at > ?1";

/// The pragmas every connection runs right after it is opened, as one batch (run it with
/// `execute_batch`), in this order:
///
/// - `busy_timeout`: a connection that finds the file locked by another writer waits (and
///   queues) up to this long instead of failing at once (the store then replaces SQLite's
///   retry schedule, 1ms to 100ms sleeps, by a finer one with the same timeout; this only
///   matters when connections contend);
/// - `journal_mode = WAL`: readers never block the writer nor each other, and a commit
///   appends to the log; the mode is stored in the file;
/// - `synchronous`: `FULL` (the default) syncs the log on every commit, so a grant and its
///   fence survive power loss; `NORMAL` syncs only at checkpoints (see
///   [`Synchronous`](crate::Synchronous)).
///
/// The values are validated numbers and keywords, never caller text.
pub fn pragmas(options: &SqliteOptions) -> String {
    format!(
        "PRAGMA busy_timeout = {};\nPRAGMA journal_mode = WAL;\nPRAGMA synchronous = {};\n",
        options.get_busy_timeout().as_millis(),
        options.get_synchronous().as_sql(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Synchronous;
    use std::time::Duration;

    #[test]
    fn pragmas_name_the_options() {
        let text = pragmas(
            &SqliteOptions::new()
                .busy_timeout(Duration::from_millis(1500))
                .synchronous(Synchronous::Normal),
        );
        assert_eq!(
            text,
            "PRAGMA busy_timeout = 1500;\nPRAGMA journal_mode = WAL;\nPRAGMA synchronous = NORMAL;\n"
        );
        assert!(pragmas(&SqliteOptions::new()).contains("synchronous = FULL"));
    }
}
