//! Claimable work in the SQLite file: queues with claim-leases, cron schedules, and
//! migration records ([`QueueStore`](baton_core::work::QueueStore),
//! [`ScheduleStore`](baton_core::work::ScheduleStore),
//! [`MigrationStore`](baton_core::work::MigrationStore) for [`SqliteStore`]).
//!
//! Each atom is one short `BEGIN IMMEDIATE` transaction on the store's writer connection
//! (reads run on reader connections without one), so every process on the file sees it
//! whole; the statements are the public constants of [`sql`].
//!
//! - **Claim** is one conditional `UPDATE ... WHERE id IN (eligible ORDER BY run_at, id LIMIT
//!   batch) RETURNING ...` ([`sql::CLAIM`]). The transaction's write lock is the file's only
//!   writer lock, so two claims — from tasks, stores or processes — never return one item.
//!   An unlocked read ([`sql::PEEK`]) first answers an empty queue without taking the lock.
//! - **Complete, fail, extend, release** compare the item's token and state in the `WHERE`
//!   clause of one statement; no changed row means "not the owner", and nothing changed.
//! - **Enqueue** of a batch is one transaction: one commit, one sync of the log, however
//!   many items. A de-duplication id is looked up in `baton_work_dedup` and remembered there
//!   for its window; rows whose window ended are replaced, and each enqueue deletes a
//!   bounded number of them ([`sql::PURGE_DEDUP`]).
//!
//! ## Two clocks, on purpose
//! - **Leases** — an item's `locked_until`, a migration's `lease_until` — are on the host's
//!   monotonic clock in nanoseconds, like the lock store's grants (see [`crate::clock`]): a
//!   wall-clock step must never expire a live claim and hand the item to a second worker.
//!   That clock restarts at boot, so the first store opened after a reboot lapses every
//!   lease written before it (their claimers died with the old boot); the boot is recorded
//!   as `work_boot` in `baton_meta`. Where the boot cannot be identified, only leases lying
//!   further ahead than any lease can are lapsed at open, and others linger at most their
//!   lease.
//! - **Due times** — an item's `run_at`, a de-duplication window's end, a schedule's
//!   `due_at_ms` and last run — are on the host's wall clock ([`SystemTime`], milliseconds
//!   since the Unix epoch, [`wall_ms`]), because they must keep their meaning across
//!   reboots: an item delayed by an hour, a dedup window of a day, a cron tick. A wall-clock
//!   step only makes them come a little early or late; it never breaks exclusion.
//!   [`ScheduleStore::now_ms`](baton_core::work::ScheduleStore::now_ms) answers this clock.
//!
//! Sub-millisecond delays, backoffs and windows are rounded up to the next millisecond, so
//! nothing becomes due early.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use baton_core::time::MAX_TTL;
use baton_core::{Ttl, prefix_upper_bound};
use rusqlite::{Connection, OptionalExtension};

use crate::clock;
use crate::error::OpError;
use crate::schema::immediate;

mod migrate;
mod queue;
mod schedule;
pub mod sql;

#[cfg(doc)]
use crate::SqliteStore;

/// The host's wall clock in milliseconds since the Unix epoch: the clock of `run_at`,
/// de-duplication windows and schedules (the `wall` of every statement in [`sql`]).
pub fn wall_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// A lease in nanoseconds (at most 30 days: far inside `i64`).
pub(crate) fn lease_ns(ttl: Ttl) -> i64 {
    ttl.as_millis() as i64 * 1_000_000
}

/// A delay in whole milliseconds, rounded up, saturating.
pub(crate) fn ceil_ms(d: Duration) -> i64 {
    let ms = d.as_nanos().div_ceil(1_000_000);
    i64::try_from(ms).unwrap_or(i64::MAX)
}

/// Creates the tables when missing, then lapses the leases of an earlier boot. Called once
/// per open, by `schema::prepare`.
pub(crate) fn prepare(conn: &Connection) -> Result<(), OpError> {
    conn.execute_batch(sql::SCHEMA)?;
    lapse_earlier_boots(conn, clock::boot_id())
}

/// Lapses every lease written in an earlier boot (see the module docs). `boot` is this
/// boot's id, where the platform has one.
fn lapse_earlier_boots(conn: &Connection, boot: Option<String>) -> Result<(), OpError> {
    let lapse = |conn: &Connection, ahead: i64| -> Result<(), OpError> {
        let now = clock::now();
        conn.prepare_cached(sql::LAPSE_ITEMS)?
            .execute([now, ahead])?;
        conn.prepare_cached(sql::LAPSE_MIGRATIONS)?
            .execute([now, ahead])?;
        Ok(())
    };
    let Some(boot) = boot else {
        // Nothing written in this boot lies further ahead than the longest lease.
        let longest = MAX_TTL.as_millis() as i64 * 1_000_000;
        return immediate(conn, |conn| lapse(conn, longest));
    };
    let recorded = |conn: &Connection| -> Result<Option<String>, OpError> {
        Ok(conn
            .query_row(sql::WORK_BOOT, [], |r| r.get::<_, String>(0))
            .optional()?)
    };
    if recorded(conn)?.as_deref() == Some(boot.as_str()) {
        return Ok(());
    }
    immediate(conn, |conn| {
        // Another process may have done it meanwhile; then this boot's leases are live.
        if recorded(conn)?.as_deref() == Some(boot.as_str()) {
            return Ok(());
        }
        lapse(conn, 0)?;
        conn.execute(sql::SET_WORK_BOOT, [&boot])?;
        Ok(())
    })
}

/// The upper bound parameter of a prefix range: the bound, or a BLOB, which SQLite orders
/// after every TEXT (see [`sql`]).
fn upper_bound_value(prefix: &str) -> rusqlite::types::Value {
    match prefix_upper_bound(prefix) {
        Some(upper) => rusqlite::types::Value::Text(upper),
        None => rusqlite::types::Value::Blob(vec![0xff]),
    }
}

/// A stored count or number that must fit a `u32`.
fn stored_u32(what: &str, raw: i64) -> Result<u32, OpError> {
    u32::try_from(raw).map_err(|_| OpError::Corrupt(format!("a stored {what} is {raw}")))
}

/// A stored count that must not be negative.
fn stored_u64(what: &str, raw: i64) -> Result<u64, OpError> {
    u64::try_from(raw).map_err(|_| OpError::Corrupt(format!("a stored {what} is {raw}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SqliteOptions;
    use rusqlite::params;

    fn fresh() -> (tempfile::TempDir, Connection) {
        let dir = tempfile::tempdir().unwrap();
        let (conn, _, _) =
            crate::schema::connect(&dir.path().join("w.db"), &SqliteOptions::new()).unwrap();
        crate::schema::prepare(&conn).unwrap();
        (dir, conn)
    }

    fn running(conn: &Connection, locked_until: i64) -> i64 {
        conn.query_row(
            "INSERT INTO baton_work_item (queue, state, run_at, payload, attempts, max_attempts, token, locked_until)
             VALUES ('q', 'running', 0, x'', 1, 3, 't', ?1) RETURNING id",
            [locked_until],
            |r| r.get(0),
        )
        .unwrap()
    }

    fn locked_until(conn: &Connection, id: i64) -> i64 {
        conn.query_row(
            "SELECT locked_until FROM baton_work_item WHERE id = ?1",
            [id],
            |r| r.get(0),
        )
        .unwrap()
    }

    #[test]
    fn ceil_ms_rounds_up() {
        assert_eq!(ceil_ms(Duration::ZERO), 0);
        assert_eq!(ceil_ms(Duration::from_nanos(1)), 1);
        assert_eq!(ceil_ms(Duration::from_millis(7)), 7);
        assert_eq!(ceil_ms(Duration::from_micros(7_001)), 8);
        assert_eq!(ceil_ms(Duration::MAX), i64::MAX);
    }

    #[test]
    fn schema_is_idempotent() {
        let (_dir, conn) = fresh();
        prepare(&conn).unwrap();
        prepare(&conn).unwrap();
    }

    /// A new boot lapses every lease once, keeping the token; later opens in the same boot
    /// leave live leases alone.
    #[test]
    fn a_new_boot_lapses_every_lease_once() {
        let (_dir, conn) = fresh();
        let far = clock::now() + 3_600_000_000_000;
        let item = running(&conn, far);
        conn.execute(
            "INSERT INTO baton_work_migration VALUES ('s', 'm', 'pending', 'w', 1, ?1, '')",
            [far],
        )
        .unwrap();
        lapse_earlier_boots(&conn, Some("boot-a".into())).unwrap();
        assert!(locked_until(&conn, item) <= clock::now());
        let lease: i64 = conn
            .query_row("SELECT lease_until FROM baton_work_migration", [], |r| {
                r.get(0)
            })
            .unwrap();
        assert!(lease <= clock::now());
        let token: String = conn
            .query_row("SELECT token FROM baton_work_item", [], |r| r.get(0))
            .unwrap();
        assert_eq!(token, "t");
        let recorded: String = conn.query_row(sql::WORK_BOOT, [], |r| r.get(0)).unwrap();
        assert_eq!(recorded, "boot-a");

        let live = running(&conn, far);
        lapse_earlier_boots(&conn, Some("boot-a".into())).unwrap();
        assert_eq!(locked_until(&conn, live), far, "same boot: untouched");
    }

    /// Without a boot id, only leases further ahead than any lease can be are lapsed.
    #[test]
    fn without_a_boot_id_leases_from_the_future_lapse() {
        let (_dir, conn) = fresh();
        let now = clock::now();
        let longest = MAX_TTL.as_millis() as i64 * 1_000_000;
        let earlier_boot = running(&conn, now + longest + 3_600_000_000_000);
        let this_boot = running(&conn, now + 60_000_000_000);
        lapse_earlier_boots(&conn, None).unwrap();
        assert!(locked_until(&conn, earlier_boot) <= clock::now());
        assert_eq!(locked_until(&conn, this_boot), now + 60_000_000_000);
    }

    /// The claim walks the partial indexes; it never scans or sorts the backlog.
    #[test]
    fn the_claim_reads_the_partial_indexes() {
        let (_dir, conn) = fresh();
        let plan: Vec<String> = conn
            .prepare(&format!("EXPLAIN QUERY PLAN {}", sql::CLAIM))
            .unwrap()
            .query_map(params!["q", 0, 0, "t", 0, 1], |r| r.get::<_, String>(3))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        let plan = plan.join("\n");
        assert!(plan.contains("baton_work_item_ready"), "{plan}");
        assert!(plan.contains("baton_work_item_running"), "{plan}");
        assert!(!plan.contains("SCAN baton_work_item\n"), "{plan}");
    }

    /// A BLOB bound sorts after every key, so an empty prefix lists everything.
    #[test]
    fn a_blob_bound_is_above_every_text() {
        let (_dir, conn) = fresh();
        for name in ["", "a", "\u{10FFFF}\u{10FFFF}"] {
            conn.execute(
                "INSERT INTO baton_work_schedule (name, spec, due_at_ms) VALUES (?1, '', 0)",
                [name],
            )
            .unwrap();
        }
        let n: i64 = conn
            .query_row(
                "SELECT count(*) FROM baton_work_schedule WHERE name >= ?1 AND name < ?2",
                params!["", upper_bound_value("")],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(n, 3);
    }
}
