//! Rate limits on PostgreSQL: one statement per decision, on the database server's clock.
//!
//! The statement ([`STEP`]) calls the function [`STEP_FUNCTION`], a PL/pgSQL transcription
//! of the core's sliding log ([`baton_core::limit::window`]): it locks the key's row, forgets
//! what left the window, and admits or says when, reading `clock_timestamp()` once. The
//! conformance rules check that it answers as the memory store does.
//!
//! ## Objects
//! Created when a store connects if missing (idempotent, under the schema's migration lock,
//! so replicas starting together do not race; see `crate::schema`):
//!
//! - `baton_limit (key, ends, units, forget_at)`: one row per key; `ends` and `units` are
//!   the log's entries, oldest first (slot ends in microseconds since the Unix epoch, on the
//!   server's clock); `forget_at` is when every entry has left its window. Rows past it are
//!   deleted now and then ([`FORGET`]).
//! - `baton_limit_step_v1(...)`: the step. A later algorithm gets a new name rather than
//!   replacing this one under running replicas.
//! - `baton_cache`, the cache's table (see [`crate::cache`]), so that connecting checks one
//!   set of objects.
//!
//! ## Behavior
//! - A call whose pooled connection had broken is run again on another; if the first run
//!   did commit, its units are counted without having been granted: stricter, never looser.
//! - The server's clock stepping back makes units count longer: stricter, never looser.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use baton_core::limit::window::resolution;
use baton_core::{Decision, Quota, RateStore, Result, StoreKey};
use sqlx::Row;

use crate::error::{sql_error, unexpected};
use crate::locks::PostgresStore;

/// The rate-limit and cache objects, created in one transaction under
/// [`MIGRATION_LOCK`](crate::sql::MIGRATION_LOCK) when any is missing.
pub const SCHEMA: &str = "\
CREATE TABLE IF NOT EXISTS baton_limit (
    key       text COLLATE \"C\" PRIMARY KEY,
    ends      bigint[] NOT NULL,
    units     bigint[] NOT NULL,
    forget_at bigint   NOT NULL
);
CREATE INDEX IF NOT EXISTS baton_limit_forget ON baton_limit (forget_at);
CREATE UNLOGGED TABLE IF NOT EXISTS baton_cache (
    key        text COLLATE \"C\" PRIMARY KEY,
    value      bytea       NOT NULL,
    expires_at timestamptz NOT NULL
);
CREATE INDEX IF NOT EXISTS baton_cache_expiry ON baton_cache (expires_at);
";

/// One step of the sliding log (see the module docs). Returns one row: `allowed`,
/// `remaining`, `retry_us`.
pub const STEP_FUNCTION: &str = r#"
CREATE OR REPLACE FUNCTION baton_limit_step_v1(
    p_key text, p_cost bigint, p_max bigint, p_window bigint, p_slot bigint)
RETURNS TABLE (allowed boolean, remaining bigint, retry_us bigint)
LANGUAGE plpgsql VOLATILE AS $step$
DECLARE
    now_us   bigint := (extract(epoch FROM clock_timestamp()) * 1000000)::bigint;
    e        bigint[];
    u        bigint[];
    n        int;
    first    int := 1;
    total    bigint := 0;
    slot_end bigint;
    need     bigint;
    freed    bigint := 0;
BEGIN
    -- Lock the key's row, creating it first if needed (a row deleted by FORGET between
    -- the two statements is created again).
    LOOP
        INSERT INTO baton_limit (key, ends, units, forget_at)
        VALUES (p_key, '{}', '{}', 0) ON CONFLICT (key) DO NOTHING;
        SELECT l.ends, l.units INTO e, u FROM baton_limit AS l WHERE l.key = p_key FOR UPDATE;
        EXIT WHEN FOUND;
    END LOOP;
    n := coalesce(array_length(e, 1), 0);
    FOR i IN 1..n LOOP
        total := total + u[i];
    END LOOP;
    -- 1. Forget the entries whose slot end + window <= now.
    WHILE first <= n AND e[first] + p_window <= now_us LOOP
        total := total - u[first];
        first := first + 1;
    END LOOP;
    e := e[first:n];
    u := u[first:n];
    n := n - first + 1;
    -- 2. Admit when the units fit; the clock stepping back joins the newest entry.
    IF total + p_cost <= p_max THEN
        slot_end := ((now_us + p_slot - 1) / p_slot) * p_slot;
        IF n > 0 AND e[n] >= slot_end THEN
            u[n] := u[n] + p_cost;
        ELSE
            e := e || slot_end;
            u := u || p_cost;
            n := n + 1;
        END IF;
        UPDATE baton_limit SET ends = e, units = u, forget_at = e[n] + p_window
        WHERE key = p_key;
        allowed := true;
        remaining := p_max - total - p_cost;
        retry_us := 0;
        RETURN NEXT;
        RETURN;
    END IF;
    -- 3. Deny: the oldest units must leave until `need` of them have.
    IF first > 1 THEN
        UPDATE baton_limit SET ends = e, units = u WHERE key = p_key;
    END IF;
    need := total + p_cost - p_max;
    FOR i IN 1..n LOOP
        freed := freed + u[i];
        IF freed >= need THEN
            allowed := false;
            remaining := greatest(p_max - total, 0);
            retry_us := e[i] + p_window - now_us;
            RETURN NEXT;
            RETURN;
        END IF;
    END LOOP;
    RAISE EXCEPTION 'baton: the rate-limit log of % is inconsistent', p_key
        USING ERRCODE = 'XX000';
END
$step$;
"#;

/// Whether every object of [`SCHEMA`] and [`STEP_FUNCTION`] exists.
pub const OBJECTS_EXIST: &str = "\
SELECT to_regclass('baton_limit') IS NOT NULL
   AND to_regclass('baton_cache') IS NOT NULL
   AND to_regprocedure('baton_limit_step_v1(text, bigint, bigint, bigint, bigint)') IS NOT NULL";

/// One decision.
///
/// Parameters: `$1` key, `$2` cost, `$3` max, `$4` window (µs), `$5` slot (µs,
/// [`resolution`]).
pub const STEP: &str =
    "SELECT allowed, remaining, retry_us FROM baton_limit_step_v1($1, $2, $3, $4, $5)";

/// Deletes the rows whose every entry has left its window.
pub const FORGET: &str = "\
DELETE FROM baton_limit
WHERE forget_at <= (extract(epoch FROM clock_timestamp()) * 1000000)::bigint";

/// How many decisions pass between runs of [`FORGET`] (per process).
const FORGET_EVERY: u64 = 4096;

#[async_trait]
impl RateStore for PostgresStore {
    async fn admit(&self, key: &StoreKey, cost: u32, quota: Quota) -> Result<Decision> {
        let window = quota.window_us();
        let what = || format!("rate limit of {key}");
        let row = self
            .db
            .call(
                what,
                || {
                    sqlx::query(STEP)
                        .bind(key.as_str())
                        .bind(i64::from(cost))
                        .bind(i64::from(quota.max()))
                        .bind(window as i64)
                        .bind(resolution(window) as i64)
                        .fetch_one(self.db.exec())
                },
                // A step that ran and was retried counted its units twice: stricter.
                |_| true,
            )
            .await?;
        let read = |row: &sqlx::postgres::PgRow| -> Result<(bool, i64, i64), sqlx::Error> {
            Ok((
                row.try_get("allowed")?,
                row.try_get("remaining")?,
                row.try_get("retry_us")?,
            ))
        };
        let (allowed, remaining, retry_us) =
            read(&row).map_err(|e| sql_error(e, &what(), &self.db.server))?;
        let decision = match (u32::try_from(remaining), u64::try_from(retry_us)) {
            (Ok(remaining), Ok(retry_us)) => Decision {
                allowed,
                remaining,
                retry_after: Duration::from_micros(retry_us),
            },
            _ => {
                return Err(unexpected(
                    &what(),
                    &self.db.server,
                    format!("remaining {remaining}, retry_us {retry_us}"),
                ));
            }
        };
        static DECISIONS: AtomicU64 = AtomicU64::new(0);
        if DECISIONS.fetch_add(1, Ordering::Relaxed) % FORGET_EVERY == FORGET_EVERY - 1 {
            // Housekeeping: a failure costs nothing but a larger table.
            let _ = sqlx::query(FORGET).execute(self.db.exec()).await;
        }
        Ok(decision)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statements_take_values_only_as_parameters() {
        for text in [STEP, FORGET, OBJECTS_EXIST] {
            assert!(!text.contains("{}"));
        }
        assert!(STEP_FUNCTION.contains("clock_timestamp()"));
        assert!(
            !STEP_FUNCTION.contains("now()"),
            "now() is frozen per transaction"
        );
    }
}
