//! The cache in the SQLite file: one row per key, expiring on the host's monotonic clock.
//!
//! Reads run on the reader connections (in WAL mode they never wait for a writer); `set`
//! and `delete` are single statements on the writer connection. Values are the JSON bytes
//! the [`Cache`](baton_core::Cache) wrote.
//!
//! ## Clocks, and reboots
//! `expires_at` is nanoseconds of the host's monotonic clock (see [`crate::clock`]), so a
//! wall-clock step never keeps a value past its TTL. A value written in an earlier boot
//! (its `boot` differs from this boot's) is a miss: its time means nothing now, and a miss
//! is always a correct answer for a cache. Expired rows and rows of earlier boots are
//! deleted now and then by a write.

use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;
use baton_core::{CacheStore, Result, StoreKey, Ttl};
use rusqlite::{Connection, OptionalExtension, params};

use crate::clock;
use crate::connection::Role;
use crate::error::OpError;
use crate::limit::boot;
use crate::locks::SqliteStore;

/// The cache table, created on open if missing. Idempotent.
pub const SCHEMA: &str = "\
CREATE TABLE IF NOT EXISTS baton_cache (
    key        TEXT    NOT NULL PRIMARY KEY,
    value      BLOB    NOT NULL,
    boot       TEXT    NOT NULL,
    expires_at INTEGER NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS baton_cache_expiry ON baton_cache (expires_at);
";

/// Reads a live value.
///
/// Parameters: `?1` key, `?2` boot, `?3` monotonic now (ns).
pub const GET: &str =
    "SELECT value FROM baton_cache WHERE key = ?1 AND boot = ?2 AND expires_at > ?3";

/// Writes a value.
///
/// Parameters: `?1` key, `?2` value, `?3` boot, `?4` expires at (monotonic ns).
pub const SET: &str = "\
INSERT INTO baton_cache (key, value, boot, expires_at) VALUES (?1, ?2, ?3, ?4)
ON CONFLICT (key) DO UPDATE SET
    value = excluded.value, boot = excluded.boot, expires_at = excluded.expires_at";

/// Deletes a value; returns whether it was live.
///
/// Parameters: `?1` key, `?2` boot, `?3` monotonic now (ns).
pub const DELETE: &str =
    "DELETE FROM baton_cache WHERE key = ?1 RETURNING boot = ?2 AND expires_at > ?3";

/// Deletes expired values and values of earlier boots.
///
/// Parameters: `?1` boot, `?2` monotonic now (ns).
pub const SWEEP: &str = "DELETE FROM baton_cache WHERE expires_at <= ?2 OR boot <> ?1";

/// How many writes pass between runs of [`SWEEP`].
const SWEEP_EVERY: u64 = 1024;

/// Creates the cache table.
pub(crate) fn ensure_schema(conn: &Connection) -> Result<(), OpError> {
    conn.execute_batch(SCHEMA)?;
    Ok(())
}

fn ttl_nanos(ttl: Ttl) -> i64 {
    // At most 30 days: far inside i64 nanoseconds.
    ttl.as_millis() as i64 * 1_000_000
}

#[async_trait]
impl CacheStore for SqliteStore {
    async fn get(&self, key: &StoreKey) -> Result<Option<Vec<u8>>> {
        let key = key.clone();
        self.database()
            .run(Role::Read, "cache get", move |conn, _| {
                Ok(conn
                    .prepare_cached(GET)?
                    .query_row(params![key.as_str(), boot(), clock::now()], |r| r.get(0))
                    .optional()?)
            })
            .await
    }

    async fn set(&self, key: &StoreKey, value: Vec<u8>, ttl: Ttl) -> Result<()> {
        let key = key.clone();
        self.database()
            .run(Role::Write, "cache set", move |conn, _| {
                let now = clock::now();
                conn.prepare_cached(SET)?.execute(params![
                    key.as_str(),
                    value,
                    boot(),
                    now + ttl_nanos(ttl)
                ])?;
                static WRITES: AtomicU64 = AtomicU64::new(0);
                if WRITES.fetch_add(1, Ordering::Relaxed) % SWEEP_EVERY == SWEEP_EVERY - 1 {
                    conn.prepare_cached(SWEEP)?.execute(params![boot(), now])?;
                }
                Ok(())
            })
            .await
    }

    async fn delete(&self, key: &StoreKey) -> Result<bool> {
        let key = key.clone();
        self.database()
            .run(Role::Write, "cache delete", move |conn, _| {
                let live: Option<bool> = conn
                    .prepare_cached(DELETE)?
                    .query_row(params![key.as_str(), boot(), clock::now()], |r| r.get(0))
                    .optional()?;
                Ok(live.unwrap_or(false))
            })
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_of_an_earlier_boot_are_misses_and_swept() {
        let conn = Connection::open_in_memory().unwrap();
        ensure_schema(&conn).unwrap();
        let far = clock::now() + 3_600_000_000_000;
        conn.execute(SET, params!["old", b"1".to_vec(), "another boot", far])
            .unwrap();
        conn.execute(SET, params!["new", b"2".to_vec(), boot(), far])
            .unwrap();
        let get = |key: &str| -> Option<Vec<u8>> {
            conn.query_row(GET, params![key, boot(), clock::now()], |r| r.get(0))
                .optional()
                .unwrap()
        };
        assert_eq!(get("old"), None);
        assert_eq!(get("new"), Some(b"2".to_vec()));
        assert_eq!(
            conn.execute(SWEEP, params![boot(), clock::now()]).unwrap(),
            1
        );
    }
}
