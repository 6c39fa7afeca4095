//! The cache on PostgreSQL: one row per key in the `UNLOGGED` table `baton_cache`,
//! expiring on the database server's clock.
//!
//! The table is created with the rate-limit objects (see [`crate::limit`]). It is
//! **unlogged**: writes skip the write-ahead log, which makes them several times cheaper,
//! and the price is exactly what a cache can pay — after a crash (not a clean restart) the
//! table is emptied, and standbys do not have it (a store on a standby misses). Every
//! answer stays right: a miss is a correct answer for a cache.
//!
//! ## Behavior
//! - Each operation is one statement reading `clock_timestamp()`; every call answers within
//!   `connect_timeout + response_timeout` or fails with `Unavailable`.
//! - Expired rows are deleted now and then ([`SWEEP`]) by a write.

use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;
use baton_core::{CacheStore, Result, StoreKey, Ttl};

use crate::locks::PostgresStore;

/// Reads a live value. Parameters: `$1` key.
pub const GET: &str =
    "SELECT value FROM baton_cache WHERE key = $1 AND expires_at > clock_timestamp()";

/// Writes a value. Parameters: `$1` key, `$2` value, `$3` ttl (ms).
pub const SET: &str = "\
INSERT INTO baton_cache (key, value, expires_at)
VALUES ($1, $2, clock_timestamp() + $3 * interval '1 millisecond')
ON CONFLICT (key) DO UPDATE SET value = excluded.value, expires_at = excluded.expires_at";

/// Deletes a value; returns whether it was live. Parameters: `$1` key.
pub const DELETE: &str =
    "DELETE FROM baton_cache WHERE key = $1 RETURNING expires_at > clock_timestamp()";

/// Deletes expired values.
pub const SWEEP: &str = "DELETE FROM baton_cache WHERE expires_at <= clock_timestamp()";

/// How many writes pass between runs of [`SWEEP`] (per process).
const SWEEP_EVERY: u64 = 1024;

#[async_trait]
impl CacheStore for PostgresStore {
    async fn get(&self, key: &StoreKey) -> Result<Option<Vec<u8>>> {
        self.db
            .call(
                || format!("cache get of {key}"),
                || {
                    sqlx::query_scalar(GET)
                        .bind(key.as_str())
                        .fetch_optional(self.db.exec())
                },
                |_| true,
            )
            .await
    }

    async fn set(&self, key: &StoreKey, value: Vec<u8>, ttl: Ttl) -> Result<()> {
        let ttl_ms = ttl.as_millis() as i64;
        self.db
            .call(
                || format!("cache set of {key}"),
                || {
                    sqlx::query(SET)
                        .bind(key.as_str())
                        .bind(value.as_slice())
                        .bind(ttl_ms)
                        .execute(self.db.exec())
                },
                |_| true,
            )
            .await?;
        static WRITES: AtomicU64 = AtomicU64::new(0);
        if WRITES.fetch_add(1, Ordering::Relaxed) % SWEEP_EVERY == SWEEP_EVERY - 1 {
            // Housekeeping: a failure costs nothing but a larger table.
            let _ = sqlx::query(SWEEP).execute(self.db.exec()).await;
        }
        Ok(())
    }

    async fn delete(&self, key: &StoreKey) -> Result<bool> {
        let live: Option<bool> = self
            .db
            .call(
                || format!("cache delete of {key}"),
                || {
                    sqlx::query_scalar(DELETE)
                        .bind(key.as_str())
                        .fetch_optional(self.db.exec())
                },
                // A delete that ran and was retried finds nothing: the first answer is
                // lost, and "nothing live" is reported.
                |_| true,
            )
            .await?;
        Ok(live.unwrap_or(false))
    }
}
