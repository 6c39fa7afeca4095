//! The idempotency atoms over PostgreSQL: one table, a unique key, an expiry; one statement
//! per call.
//!
//! Every record is one row of `baton_idempotency`. Acquire is one
//! `INSERT ... ON CONFLICT DO UPDATE ... WHERE ... RETURNING` ([`ACQUIRE`]): in `READ
//! COMMITTED` concurrent acquires of one key are serialized by the row lock and the
//! condition is evaluated again on the newest version, so exactly one of them gets the row;
//! a duplicate then reads it ([`CURRENT`]). Finalize and renew are one conditional `UPDATE`
//! each, keyed by the owner's token. The database server's `clock_timestamp()` decides
//! expiry and leases, read once per statement.
//!
//! The table is created when a store connects, if missing, under the migration lock (so
//! replicas starting together do not race; see `crate::schema`); it is not part of the
//! versioned lease schema.
//! Expired rows are replaced by the next acquire of their key; every 128th acquire of a
//! process also deletes up to 64 expired rows ([`SWEEP`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use baton_core::idempotency::Status;
use baton_core::idempotency::store::{
    AcquireAnswer, AcquireRequest, AttemptEnd, FinalizeAnswer, IdempotencyStore, StoredRecord,
};
use baton_core::store::Renewal;
use baton_core::{Error, Holder, Result, StoreKey, Ttl};
use sqlx::Row;
use sqlx::postgres::PgRow;

use crate::locks::PostgresStore;

/// The table and its expiry index. `updated_at` is the server time of the last write;
/// `previous` the status the current attempt took over (`NULL` for a new record).
pub const SCHEMA: &str = "\
CREATE TABLE IF NOT EXISTS baton_idempotency (
    key         text COLLATE \"C\" PRIMARY KEY,
    status      text        NOT NULL,
    owner       text        NOT NULL,
    attempt     integer     NOT NULL,
    fingerprint text        NOT NULL,
    metadata    bytea       NOT NULL,
    expires_at  timestamptz NOT NULL,
    lease_until timestamptz NOT NULL,
    updated_at  timestamptz NOT NULL,
    previous    text
);
CREATE INDEX IF NOT EXISTS baton_idempotency_expiry ON baton_idempotency (expires_at);
";

/// Acquire: inserts a pending record, or replaces an expired one, or takes over a live one
/// with the same fingerprint whose lease lapsed (pending) or that failed (when `$6`).
/// Returns the row when this attempt got it (`expires_us`, `lease_us`: remaining
/// microseconds), no row for a duplicate.
///
/// Parameters: `$1` key, `$2` owner token, `$3` fingerprint, `$4` ttl (ms), `$5` lease
/// (ms), `$6` retry failed (`bool`).
pub const ACQUIRE: &str = "\
INSERT INTO baton_idempotency AS r
    (key, status, owner, attempt, fingerprint, metadata, expires_at, lease_until, updated_at, previous)
SELECT $1, 'pending', $2, 1, $3, '\\x'::bytea,
       c.now + $4 * interval '1 millisecond', c.now + $5 * interval '1 millisecond', c.now, NULL
FROM (SELECT clock_timestamp() AS now) AS c
ON CONFLICT (key) DO UPDATE SET
    status      = 'pending',
    owner       = excluded.owner,
    attempt     = CASE WHEN r.expires_at <= excluded.updated_at THEN 1 ELSE r.attempt + 1 END,
    previous    = CASE WHEN r.expires_at <= excluded.updated_at THEN NULL ELSE r.status END,
    fingerprint = excluded.fingerprint,
    metadata    = '\\x'::bytea,
    expires_at  = excluded.expires_at,
    lease_until = excluded.lease_until,
    updated_at  = excluded.updated_at
WHERE r.expires_at <= excluded.updated_at
   OR (r.fingerprint = excluded.fingerprint AND (
          (r.status = 'pending' AND r.lease_until <= excluded.updated_at)
       OR (r.status = 'failed' AND $6)))
RETURNING r.status, r.owner, r.attempt, r.fingerprint, r.metadata,
    greatest(0, floor(extract(epoch FROM r.expires_at - r.updated_at) * 1000000))::bigint AS expires_us,
    greatest(0, floor(extract(epoch FROM r.lease_until - r.updated_at) * 1000000))::bigint AS lease_us,
    r.previous";

/// The live record of a key: `status, owner, attempt, fingerprint, metadata, expires_us,
/// lease_us, previous`.
///
/// Parameters: `$1` key.
pub const CURRENT: &str = "\
SELECT r.status, r.owner, r.attempt, r.fingerprint, r.metadata,
    greatest(0, floor(extract(epoch FROM r.expires_at - c.now) * 1000000))::bigint AS expires_us,
    greatest(0, floor(extract(epoch FROM r.lease_until - c.now) * 1000000))::bigint AS lease_us,
    r.previous
FROM baton_idempotency AS r, (SELECT clock_timestamp() AS now) AS c
WHERE r.key = $1 AND r.expires_at > c.now";

/// Finalize: sets the outcome and metadata of the owner's live pending record; returns the
/// row (with an empty metadata: the caller has it) when it changed. Otherwise [`CURRENT`]
/// tells a repeated finalize (the owner's, already final) from a stale one.
///
/// Parameters: `$1` key, `$2` owner token, `$3` status, `$4` metadata.
pub const FINALIZE: &str = "\
UPDATE baton_idempotency AS r SET status = $3, metadata = $4, updated_at = c.now
FROM (SELECT clock_timestamp() AS now) AS c
WHERE r.key = $1 AND r.owner = $2 AND r.status = 'pending' AND r.expires_at > c.now
RETURNING r.status, r.owner, r.attempt, r.fingerprint, '\\x'::bytea AS metadata,
    greatest(0, floor(extract(epoch FROM r.expires_at - c.now) * 1000000))::bigint AS expires_us,
    0::bigint AS lease_us, r.previous";

/// Renew: restarts the lease of the owner's live pending record. One changed row: renewed.
///
/// Parameters: `$1` key, `$2` owner token, `$3` lease (ms).
pub const RENEW: &str = "\
UPDATE baton_idempotency AS r
SET lease_until = c.now + $3 * interval '1 millisecond', updated_at = c.now
FROM (SELECT clock_timestamp() AS now) AS c
WHERE r.key = $1 AND r.owner = $2 AND r.status = 'pending' AND r.expires_at > c.now";

/// Deletes up to 64 expired records (run by every 128th acquire of a process).
pub const SWEEP: &str = "\
DELETE FROM baton_idempotency WHERE key IN (
    SELECT key FROM baton_idempotency WHERE expires_at <= clock_timestamp() LIMIT 64)";

/// Deletes every expired record.
pub const PRUNE: &str = "DELETE FROM baton_idempotency WHERE expires_at <= clock_timestamp()";

/// How many acquires (per process) pass between sweeps.
const SWEEP_EVERY: u64 = 128;
static ACQUIRES: AtomicU64 = AtomicU64::new(0);

/// How often an acquire is run again when its record vanished between its two statements
/// (expired and swept, or pruned, in between).
const MAX_RERUNS: usize = 16;

fn parse(row: &PgRow) -> Result<(StoredRecord, Option<Status>), sqlx::Error> {
    let status = status_of(&row.try_get::<String, _>("status")?)?;
    let previous = row
        .try_get::<Option<String>, _>("previous")?
        .map(|p| status_of(&p))
        .transpose()?;
    let attempt: i32 = row.try_get("attempt")?;
    let micros = |name: &str| -> Result<Duration, sqlx::Error> {
        Ok(Duration::from_micros(
            row.try_get::<i64, _>(name)?.max(0) as u64
        ))
    };
    Ok((
        StoredRecord {
            status,
            owner: Holder::from_stored(row.try_get("owner")?),
            attempt: u32::try_from(attempt)
                .ok()
                .filter(|a| *a >= 1)
                .ok_or_else(|| corrupt(format!("an idempotency record has attempt {attempt}")))?,
            fingerprint: row.try_get("fingerprint")?,
            metadata: row.try_get("metadata")?,
            expires_in: micros("expires_us")?,
            lease_remaining: if status == Status::Pending {
                micros("lease_us")?
            } else {
                Duration::ZERO
            },
        },
        previous,
    ))
}

fn status_of(text: &str) -> Result<Status, sqlx::Error> {
    Status::parse(text).ok_or_else(|| corrupt(format!("an idempotency record has status {text:?}")))
}

fn corrupt(message: String) -> sqlx::Error {
    sqlx::Error::Decode(message.into())
}

impl PostgresStore {
    /// Deletes every expired idempotency record and returns how many. Expired records are
    /// already invisible and are replaced or swept as the store is used; call this from a
    /// maintenance job to reclaim their space at once.
    ///
    /// # Errors
    /// `Unavailable` or `Internal`, as every operation.
    pub async fn prune_idempotency(&self) -> Result<u64> {
        self.db
            .call(
                || "pruning idempotency records".to_owned(),
                || async {
                    Ok(sqlx::query(PRUNE)
                        .execute(self.db.exec())
                        .await?
                        .rows_affected())
                },
                |_| true,
            )
            .await
    }

    async fn acquire_once(
        &self,
        key: &StoreKey,
        request: AcquireRequest<'_>,
    ) -> Result<Option<AcquireAnswer>> {
        let what = || format!("idempotency acquire of {key}");
        let got = self
            .db
            .call(
                what,
                || async {
                    let row = sqlx::query(ACQUIRE)
                        .bind(key.as_str())
                        .bind(request.attempt.as_str())
                        .bind(request.fingerprint)
                        .bind(request.ttl.as_millis() as i64)
                        .bind(request.lease.as_millis() as i64)
                        .bind(request.retry_failed)
                        .fetch_optional(self.db.exec())
                        .await?;
                    row.as_ref().map(parse).transpose()
                },
                // A retried acquire that finds the record answers below by its owner.
                |_| true,
            )
            .await?;
        if let Some((record, previous)) = got {
            return Ok(Some(AcquireAnswer::Acquired { record, previous }));
        }
        let current = self.current(key).await?;
        Ok(current.map(|(record, previous)| {
            if record.owner == *request.attempt && record.status == Status::Pending {
                // This attempt's own record, written by a first try whose answer was lost.
                AcquireAnswer::Acquired { record, previous }
            } else {
                AcquireAnswer::Duplicate(record)
            }
        }))
    }

    async fn current(&self, key: &StoreKey) -> Result<Option<(StoredRecord, Option<Status>)>> {
        self.db
            .call(
                || format!("idempotency read of {key}"),
                || async {
                    let row = sqlx::query(CURRENT)
                        .bind(key.as_str())
                        .fetch_optional(self.db.exec())
                        .await?;
                    row.as_ref().map(parse).transpose()
                },
                |_| true,
            )
            .await
    }
}

#[async_trait]
impl IdempotencyStore for PostgresStore {
    async fn acquire(&self, key: &StoreKey, request: AcquireRequest<'_>) -> Result<AcquireAnswer> {
        if ACQUIRES.fetch_add(1, Ordering::Relaxed) % SWEEP_EVERY == SWEEP_EVERY - 1 {
            // Best effort: a failed sweep leaves the rows for the next one.
            let _ = sqlx::query(SWEEP).execute(self.db.exec()).await;
        }
        for _ in 0..MAX_RERUNS {
            if let Some(answer) = self.acquire_once(key, request).await? {
                return Ok(answer);
            }
        }
        Err(Error::unavailable(format!(
            "{}: idempotency acquire of {key} did not settle in {MAX_RERUNS} runs (the record kept vanishing)",
            self.db.server
        )))
    }

    async fn renew(&self, key: &StoreKey, owner: &Holder, lease: Ttl) -> Result<Renewal> {
        self.db
            .renew(
                || format!("idempotency renewal of {key}"),
                || {
                    sqlx::query(RENEW)
                        .bind(key.as_str())
                        .bind(owner.as_str())
                        .bind(lease.as_millis() as i64)
                },
            )
            .await
    }

    async fn finalize(&self, key: &StoreKey, end: AttemptEnd<'_>) -> Result<FinalizeAnswer> {
        let (owner, outcome, metadata) = (end.owner, end.outcome, end.metadata);
        let changed = self
            .db
            .call(
                || format!("idempotency finalize of {key}"),
                || async {
                    let row = sqlx::query(FINALIZE)
                        .bind(key.as_str())
                        .bind(owner.as_str())
                        .bind(outcome.status().as_str())
                        .bind(metadata)
                        .fetch_optional(self.db.exec())
                        .await?;
                    row.as_ref().map(parse).transpose()
                },
                |_| true,
            )
            .await?;
        if let Some((mut record, _)) = changed {
            record.metadata = metadata.to_vec();
            return Ok(FinalizeAnswer::Finalized(record));
        }
        Ok(match self.current(key).await? {
            // Already finalized by this owner: the first finalize stands.
            Some((record, _)) if record.owner == *owner && record.status != Status::Pending => {
                FinalizeAnswer::Finalized(record)
            }
            _ => FinalizeAnswer::NotOwner,
        })
    }

    async fn get(&self, key: &StoreKey) -> Result<Option<StoredRecord>> {
        Ok(self.current(key).await?.map(|(record, _)| record))
    }
}
