//! Rate limits in the SQLite file: one row per key holding its sliding log, stepped in one
//! `BEGIN IMMEDIATE` transaction by the core's own algorithm.
//!
//! Each decision reads the key's row, runs
//! [`SlidingLog::admit`](baton_core::limit::window::SlidingLog::admit) (the code the memory
//! store runs, so the two cannot disagree) on the host's monotonic clock, and writes the row
//! back when the log changed. The write lock of the transaction makes the step atomic across
//! every process on the file.
//!
//! ## Clocks, and reboots
//! Slot ends are microseconds of the host's monotonic clock, like every expiry in this store
//! (see [`crate::clock`]), so a wall-clock step never shortens a window. That clock restarts
//! at boot, but a rate-limit window must not: a per-day quota that a reboot refilled would
//! admit twice the quota that day. So each row also records the boot it was written in and
//! the wall clock at that moment; a row from an earlier boot (another boot id, or a
//! monotonic time later than now) is carried onto this boot's time line by the wall-clock
//! time that passed since it was written (never less than zero). Only across a reboot does
//! the wall clock matter, and a wall clock that stepped back makes the limiter stricter.
//!
//! ## The row
//! `baton_limit (key, boot, mono_us, wall_us, forget_us, log)`: `log` is the entries, oldest
//! first, each 16 bytes: the slot end and the units as big-endian 64-bit integers.
//! `forget_us` is when every entry has left its window; rows past it are deleted now and
//! then.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use baton_core::limit::window::SlidingLog;
use baton_core::{Decision, Quota, RateStore, Result, StoreKey};
use rusqlite::{Connection, OptionalExtension, params};

use crate::clock;
use crate::connection::Role;
use crate::error::OpError;
use crate::locks::SqliteStore;
use crate::schema::immediate;

/// The rate-limit and cache tables, created on open if missing. Idempotent.
///
/// Parameters: none.
pub const SCHEMA: &str = "\
CREATE TABLE IF NOT EXISTS baton_limit (
    key       TEXT    NOT NULL PRIMARY KEY,
    boot      TEXT    NOT NULL,
    mono_us   INTEGER NOT NULL,
    wall_us   INTEGER NOT NULL,
    forget_us INTEGER NOT NULL,
    log       BLOB    NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS baton_limit_forget ON baton_limit (forget_us);
";

/// Reads a key's row.
///
/// Parameters: `?1` key.
pub const READ: &str = "SELECT boot, mono_us, wall_us, log FROM baton_limit WHERE key = ?1";

/// Writes a key's row.
///
/// Parameters: `?1` key, `?2` boot, `?3` monotonic now (µs), `?4` wall now (µs since the
/// Unix epoch), `?5` forget at (µs, monotonic), `?6` log.
pub const WRITE: &str = "\
INSERT INTO baton_limit (key, boot, mono_us, wall_us, forget_us, log)
VALUES (?1, ?2, ?3, ?4, ?5, ?6)
ON CONFLICT (key) DO UPDATE SET
    boot = excluded.boot, mono_us = excluded.mono_us, wall_us = excluded.wall_us,
    forget_us = excluded.forget_us, log = excluded.log";

/// Deletes a key's row (its log became empty).
///
/// Parameters: `?1` key.
pub const DELETE: &str = "DELETE FROM baton_limit WHERE key = ?1";

/// Deletes rows whose every entry has left its window: this boot's by `forget_us`, an
/// earlier boot's by the wall clock.
///
/// Parameters: `?1` boot, `?2` monotonic now (µs), `?3` wall now (µs).
pub const FORGET: &str = "\
DELETE FROM baton_limit
WHERE (boot = ?1 AND mono_us <= ?2 AND forget_us <= ?2)
   OR ((boot <> ?1 OR mono_us > ?2) AND wall_us + (forget_us - mono_us) <= ?3)";

/// How many writes pass between runs of [`FORGET`].
const FORGET_EVERY: u64 = 1024;

/// Creates the rate-limit tables and, so that `schema.rs` calls one function for both, the
/// cache's.
pub(crate) fn ensure_schema(conn: &Connection) -> Result<(), OpError> {
    conn.execute_batch(SCHEMA)?;
    crate::cache::ensure_schema(conn)
}

/// This boot's id, read once; `""` where the platform has none.
pub(crate) fn boot() -> &'static str {
    static BOOT: OnceLock<String> = OnceLock::new();
    BOOT.get_or_init(|| clock::boot_id().unwrap_or_default())
}

/// The wall clock in microseconds since the Unix epoch.
fn wall_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or(0)
}

fn encode(log: &SlidingLog) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(log.entries().len() * 16);
    for (end, units) in log.entries() {
        bytes.extend_from_slice(&end.to_be_bytes());
        bytes.extend_from_slice(&units.to_be_bytes());
    }
    bytes
}

fn decode(bytes: &[u8]) -> Option<Vec<(u64, u64)>> {
    if !bytes.len().is_multiple_of(16) {
        return None;
    }
    Some(
        bytes
            .chunks_exact(16)
            .map(|c| {
                let (end, units) = c.split_at(8);
                (
                    u64::from_be_bytes(end.try_into().unwrap_or_default()),
                    u64::from_be_bytes(units.try_into().unwrap_or_default()),
                )
            })
            .collect(),
    )
}

/// Moves entries written at monotonic `then_mono` (wall `then_wall`) onto the time line of
/// `now_mono` (wall `now_wall`): they are as old as the wall clock says, never younger than
/// written. Entries pushed before this boot's zero are clamped to it and merged.
fn carry_over(
    entries: Vec<(u64, u64)>,
    then_mono: i64,
    then_wall: i64,
    now_mono: i64,
    now_wall: i64,
) -> Vec<(u64, u64)> {
    let elapsed = now_wall.saturating_sub(then_wall).max(0);
    let offset = now_mono.saturating_sub(elapsed).saturating_sub(then_mono);
    let mut carried: Vec<(u64, u64)> = Vec::with_capacity(entries.len());
    for (end, units) in entries {
        let end = (end as i64).saturating_add(offset).max(0) as u64;
        match carried.last_mut() {
            Some((last, total)) if *last >= end => *total += units,
            _ => carried.push((end, units)),
        }
    }
    carried
}

/// One decision, in one transaction.
fn admit(conn: &Connection, key: &str, cost: u32, quota: Quota) -> Result<Decision, OpError> {
    immediate(conn, |conn| {
        let now_mono = clock::now() / 1000;
        let now_wall = wall_us();
        let row: Option<(String, i64, i64, Vec<u8>)> = conn
            .prepare_cached(READ)?
            .query_row([key], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
            .optional()?;
        let corrupt = || OpError::Corrupt(format!("the rate-limit log of {key:?} is malformed"));
        let mut log = match row {
            None => SlidingLog::new(),
            Some((row_boot, then_mono, then_wall, bytes)) => {
                let mut entries = decode(&bytes).ok_or_else(corrupt)?;
                if row_boot != boot() || then_mono > now_mono {
                    entries = carry_over(entries, then_mono, then_wall, now_mono, now_wall);
                }
                SlidingLog::from_entries(entries).ok_or_else(corrupt)?
            }
        };
        let before = log.entries().len();
        let decision = log.admit(now_mono.max(0) as u64, cost, quota);
        if decision.allowed || log.entries().len() != before {
            match log.forgettable_at(quota.window_us()) {
                Some(forget) => {
                    conn.prepare_cached(WRITE)?.execute(params![
                        key,
                        boot(),
                        now_mono,
                        now_wall,
                        forget as i64,
                        encode(&log)
                    ])?;
                }
                None => {
                    conn.prepare_cached(DELETE)?.execute([key])?;
                }
            }
            static WRITES: AtomicU64 = AtomicU64::new(0);
            if WRITES.fetch_add(1, Ordering::Relaxed) % FORGET_EVERY == FORGET_EVERY - 1 {
                conn.prepare_cached(FORGET)?
                    .execute(params![boot(), now_mono, now_wall])?;
            }
        }
        Ok(decision)
    })
}

#[async_trait]
impl RateStore for SqliteStore {
    async fn admit(&self, key: &StoreKey, cost: u32, quota: Quota) -> Result<Decision> {
        let key = key.clone();
        self.database()
            .run(Role::Write, "rate limit", move |conn, _| {
                admit(conn, key.as_str(), cost, quota)
            })
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logs_round_trip() {
        let log = SlidingLog::from_entries([(1, 2), (1 << 40, 7)]).unwrap();
        let bytes = encode(&log);
        assert_eq!(bytes.len(), 32);
        assert_eq!(decode(&bytes).unwrap(), [(1, 2), (1 << 40, 7)]);
        assert!(decode(&bytes[..31]).is_none());
    }

    /// Entries written 10 s before a reboot, read 3 s (wall) later on a clock that restarted.
    #[test]
    fn entries_cross_a_reboot_as_old_as_the_wall_clock_says() {
        let then_mono = 500_000_000; // 500 s of uptime
        let then_wall = 1_700_000_000_000_000;
        let entries = vec![(then_mono as u64 - 10_000_000, 1), (then_mono as u64, 2)];
        let now_mono = 2_000_000; // 2 s of uptime
        let now_wall = then_wall + 3_000_000;
        let carried = carry_over(entries, then_mono, then_wall, now_mono, now_wall);
        // 13 s and 3 s old: before this boot's zero (clamped) and at 2 s - 3 s -> clamped.
        assert_eq!(carried, [(0, 3)]);
        let carried = carry_over(
            vec![(then_mono as u64, 2)],
            then_mono,
            then_wall,
            60_000_000,
            then_wall + 3_000_000,
        );
        assert_eq!(carried, [(57_000_000, 2)]);
        // A wall clock that stepped back counts as no time passed.
        let carried = carry_over(
            vec![(then_mono as u64, 2)],
            then_mono,
            then_wall,
            60_000_000,
            then_wall - 5_000_000,
        );
        assert_eq!(carried, [(60_000_000, 2)]);
    }

    #[test]
    fn the_schema_is_idempotent() {
        let conn = Connection::open_in_memory().unwrap();
        ensure_schema(&conn).unwrap();
        ensure_schema(&conn).unwrap();
    }

    #[test]
    fn a_reboot_keeps_the_window() {
        let conn = Connection::open_in_memory().unwrap();
        ensure_schema(&conn).unwrap();
        let quota = Quota::new(2, std::time::Duration::from_secs(3600)).unwrap();
        assert!(admit(&conn, "k", 2, quota).unwrap().allowed);
        // Pretend the row was written in another boot, a second ago on the wall clock.
        conn.execute(
            "UPDATE baton_limit SET boot = 'another boot', wall_us = wall_us - 1000000",
            [],
        )
        .unwrap();
        let d = admit(&conn, "k", 1, quota).unwrap();
        assert!(!d.allowed, "a reboot refilled the quota: {d:?}");
        assert!(
            d.retry_after > std::time::Duration::from_secs(3500),
            "{d:?}"
        );
    }
}
