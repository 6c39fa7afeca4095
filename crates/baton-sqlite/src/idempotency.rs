//! The idempotency atoms over the SQLite file: one table, a unique key, an expiry.
//!
//! Every record is one row of `baton_idempotency`, keyed by the qualified key. Acquire is
//! one `INSERT ... ON CONFLICT DO UPDATE ... WHERE ... RETURNING` statement ([`ACQUIRE`]):
//! it inserts a new record, replaces an expired one, or takes over a lapsed or (when asked)
//! failed one, and returns the row only when the caller got it; a duplicate then reads the
//! row ([`CURRENT`]) in the same transaction. Finalize and renew are one conditional
//! `UPDATE` each, keyed by the owner's token.
//!
//! ## Two clocks, on purpose
//! - **Expiry** (`expires_at`) is on the host's wall clock, in milliseconds since the Unix
//!   epoch, because records must outlive reboots: a charge completed yesterday must still be
//!   a duplicate after the machine restarted. A wall-clock step only makes records live a
//!   little shorter or longer; it never hands a running attempt's record to another.
//! - **The owner's lease** (`lease_until`) is on the host's monotonic clock, like the
//!   lock store's grants (see the [`crate::clock`] module), because a step there *would* take
//!   over a live owner. A lease written in an earlier boot (`lease_boot` differs, or where no
//!   boot id exists, `lease_until` lies further ahead than any lease can) has lapsed: its
//!   owner died with that boot.
//!
//! Expired rows are replaced by the next acquire of their key; every 128th acquire of a
//! store also deletes up to 64 expired rows ([`SWEEP`]), and
//! [`SqliteStore::prune_idempotency`] deletes them all.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use baton_core::idempotency::store::{
    AcquireAnswer, AcquireRequest, AttemptEnd, FinalizeAnswer, IdempotencyStore, StoredRecord,
};
use baton_core::idempotency::{Outcome, Status};
use baton_core::store::Renewal;
use baton_core::time::MAX_TTL;
use baton_core::{Holder, Result, StoreKey, Ttl};
use rusqlite::{Connection, OptionalExtension, Row, params};

use crate::clock;
use crate::connection::Role;
use crate::error::OpError;
use crate::locks::SqliteStore;
use crate::schema::immediate;

/// The table and its expiry index, created on open when missing (`IF NOT EXISTS`, so any
/// number of processes may open the file at once).
///
/// - `expires_at`: wall clock, milliseconds since the Unix epoch.
/// - `lease_until`: the host's monotonic clock, nanoseconds; `lease_boot` the boot it
///   belongs to (`''` where the platform has no boot id).
/// - `previous`: the status the current attempt took over (`NULL` for a new record), so
///   that [`ACQUIRE`] can say so in its `RETURNING` clause.
pub const SCHEMA: &str = "\
CREATE TABLE IF NOT EXISTS baton_idempotency (
    key         TEXT    NOT NULL PRIMARY KEY,
    status      TEXT    NOT NULL,
    owner       TEXT    NOT NULL,
    attempt     INTEGER NOT NULL,
    fingerprint TEXT    NOT NULL,
    metadata    BLOB    NOT NULL,
    expires_at  INTEGER NOT NULL,
    lease_until INTEGER NOT NULL,
    lease_boot  TEXT    NOT NULL,
    previous    TEXT
);
CREATE INDEX IF NOT EXISTS baton_idempotency_expiry ON baton_idempotency (expires_at);
";

/// Acquire: inserts a pending record, or replaces an expired one, or takes over a live one
/// with the same fingerprint whose lease lapsed (pending) or that failed (when `?10` is 1).
/// Returns the row when this attempt got it; no row for a duplicate.
///
/// Parameters: `?1` key, `?2` owner token, `?3` fingerprint, `?4` wall now (ms), `?5` ttl
/// (ms), `?6` monotonic now (ns), `?7` lease (ns), `?8` boot id, `?9` the longest lease
/// (ns), `?10` retry failed (0 or 1).
pub const ACQUIRE: &str = "\
INSERT INTO baton_idempotency
    (key, status, owner, attempt, fingerprint, metadata, expires_at, lease_until, lease_boot, previous)
VALUES (?1, 'pending', ?2, 1, ?3, x'', ?4 + ?5, ?6 + ?7, ?8, NULL)
ON CONFLICT (key) DO UPDATE SET
    status      = 'pending',
    owner       = excluded.owner,
    attempt     = CASE WHEN expires_at <= ?4 THEN 1 ELSE attempt + 1 END,
    previous    = CASE WHEN expires_at <= ?4 THEN NULL ELSE status END,
    fingerprint = excluded.fingerprint,
    metadata    = x'',
    expires_at  = excluded.expires_at,
    lease_until = excluded.lease_until,
    lease_boot  = excluded.lease_boot
WHERE expires_at <= ?4
   OR (fingerprint = excluded.fingerprint AND (
          (status = 'pending' AND (lease_until <= ?6 OR lease_boot <> ?8 OR lease_until > ?6 + ?9))
       OR (status = 'failed' AND ?10 = 1)))
RETURNING status, owner, attempt, fingerprint, metadata, expires_at, lease_until, lease_boot, previous";

/// The live record of a key: `status, owner, attempt, fingerprint, metadata, expires_at,
/// lease_until, lease_boot`.
///
/// Parameters: `?1` key, `?2` wall now (ms).
pub const CURRENT: &str = "\
SELECT status, owner, attempt, fingerprint, metadata, expires_at, lease_until, lease_boot
FROM baton_idempotency WHERE key = ?1 AND expires_at > ?2";

/// Finalize: sets the outcome and metadata of the owner's live pending record. Returns the
/// row (without the metadata, which the caller has) when it changed; otherwise [`OWNED`]
/// tells a repeated finalize from a stale one.
///
/// Parameters: `?1` key, `?2` owner token, `?3` status, `?4` metadata, `?5` wall now (ms).
pub const FINALIZE: &str = "\
UPDATE baton_idempotency SET status = ?3, metadata = ?4
WHERE key = ?1 AND owner = ?2 AND status = 'pending' AND expires_at > ?5
RETURNING status, owner, attempt, fingerprint, x'', expires_at, lease_until, lease_boot";

/// The live record of a key if `owner` owns it (columns as [`CURRENT`]).
///
/// Parameters: `?1` key, `?2` owner token, `?3` wall now (ms).
pub const OWNED: &str = "\
SELECT status, owner, attempt, fingerprint, metadata, expires_at, lease_until, lease_boot
FROM baton_idempotency WHERE key = ?1 AND owner = ?2 AND expires_at > ?3";

/// Renew: restarts the lease of the owner's live pending record. One changed row: renewed.
///
/// Parameters: `?1` key, `?2` owner token, `?3` monotonic now (ns), `?4` lease (ns), `?5`
/// boot id, `?6` wall now (ms).
pub const RENEW: &str = "\
UPDATE baton_idempotency SET lease_until = ?3 + ?4, lease_boot = ?5
WHERE key = ?1 AND owner = ?2 AND status = 'pending' AND expires_at > ?6";

/// Deletes up to 64 expired records (run by every 128th acquire).
///
/// Parameters: `?1` wall now (ms).
pub const SWEEP: &str = "\
DELETE FROM baton_idempotency WHERE key IN
    (SELECT key FROM baton_idempotency WHERE expires_at <= ?1 LIMIT 64)";

/// Deletes every expired record.
///
/// Parameters: `?1` wall now (ms).
pub const PRUNE: &str = "DELETE FROM baton_idempotency WHERE expires_at <= ?1";

/// How many acquires (per process) pass between sweeps.
const SWEEP_EVERY: u64 = 128;
static ACQUIRES: AtomicU64 = AtomicU64::new(0);

/// Creates the table and index when missing. Called once per open, by `schema::prepare`.
pub(crate) fn ensure_schema(conn: &Connection) -> Result<(), OpError> {
    conn.execute_batch(SCHEMA)?;
    Ok(())
}

/// The wall clock in milliseconds since the Unix epoch.
fn wall_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// This boot's id, read once; `""` where the platform has none.
fn boot() -> &'static str {
    static BOOT: OnceLock<String> = OnceLock::new();
    BOOT.get_or_init(|| clock::boot_id().unwrap_or_default())
}

fn ms(ttl: Ttl) -> i64 {
    ttl.as_millis() as i64
}

fn ns(ttl: Ttl) -> i64 {
    // At most 30 days: far inside i64 nanoseconds.
    ttl.as_millis() as i64 * 1_000_000
}

/// A row as [`CURRENT`], [`OWNED`], [`FINALIZE`] and [`ACQUIRE`] read it.
struct Row8 {
    status: String,
    owner: String,
    attempt: i64,
    fingerprint: String,
    metadata: Vec<u8>,
    expires_at: i64,
    lease_until: i64,
    lease_boot: String,
}

impl Row8 {
    fn read(row: &Row<'_>) -> rusqlite::Result<Self> {
        Ok(Row8 {
            status: row.get(0)?,
            owner: row.get(1)?,
            attempt: row.get(2)?,
            fingerprint: row.get(3)?,
            metadata: row.get(4)?,
            expires_at: row.get(5)?,
            lease_until: row.get(6)?,
            lease_boot: row.get(7)?,
        })
    }

    fn into_record(self, wall: i64, mono: i64) -> Result<StoredRecord, OpError> {
        let status = parse_status(&self.status)?;
        let attempt = u32::try_from(self.attempt)
            .ok()
            .filter(|a| *a >= 1)
            .ok_or_else(|| {
                OpError::Corrupt(format!(
                    "an idempotency record has attempt {}",
                    self.attempt
                ))
            })?;
        let lease_live = status == Status::Pending
            && self.lease_boot == boot()
            && self.lease_until > mono
            && self.lease_until <= mono.saturating_add(max_lease_ns());
        Ok(StoredRecord {
            status,
            owner: Holder::from_stored(self.owner),
            attempt,
            fingerprint: self.fingerprint,
            metadata: self.metadata,
            expires_in: Duration::from_millis(self.expires_at.saturating_sub(wall).max(0) as u64),
            lease_remaining: if lease_live {
                Duration::from_nanos((self.lease_until - mono) as u64)
            } else {
                Duration::ZERO
            },
        })
    }
}

fn parse_status(text: &str) -> Result<Status, OpError> {
    Status::parse(text)
        .ok_or_else(|| OpError::Corrupt(format!("an idempotency record has status {text:?}")))
}

fn max_lease_ns() -> i64 {
    MAX_TTL.as_millis() as i64 * 1_000_000
}

fn acquire(
    conn: &Connection,
    key: &str,
    owner: &str,
    fingerprint: &str,
    ttl: Ttl,
    lease: Ttl,
    retry_failed: bool,
) -> Result<AcquireAnswer, OpError> {
    immediate(conn, |conn| {
        let (wall, mono) = (wall_ms(), clock::now());
        if ACQUIRES.fetch_add(1, Ordering::Relaxed) % SWEEP_EVERY == SWEEP_EVERY - 1 {
            conn.prepare_cached(SWEEP)?.execute([wall])?;
        }
        let got = conn
            .prepare_cached(ACQUIRE)?
            .query_row(
                params![
                    key,
                    owner,
                    fingerprint,
                    wall,
                    ms(ttl),
                    mono,
                    ns(lease),
                    boot(),
                    max_lease_ns(),
                    i64::from(retry_failed)
                ],
                |r| Ok((Row8::read(r)?, r.get::<_, Option<String>>(8)?)),
            )
            .optional()?;
        if let Some((row, previous)) = got {
            let previous = previous.as_deref().map(parse_status).transpose()?;
            return Ok(AcquireAnswer::Acquired {
                record: row.into_record(wall, mono)?,
                previous,
            });
        }
        // ACQUIRE left a live record alone; the write lock keeps it so until we commit.
        let current = conn
            .prepare_cached(CURRENT)?
            .query_row(params![key, wall], Row8::read)
            .optional()?
            .ok_or_else(|| {
                OpError::Corrupt(format!(
                    "the idempotency record of {key:?} is neither free nor live"
                ))
            })?;
        Ok(AcquireAnswer::Duplicate(current.into_record(wall, mono)?))
    })
}

fn finalize(
    conn: &Connection,
    key: &str,
    owner: &str,
    outcome: Outcome,
    metadata: &[u8],
) -> Result<FinalizeAnswer, OpError> {
    immediate(conn, |conn| {
        let (wall, mono) = (wall_ms(), clock::now());
        let changed = conn
            .prepare_cached(FINALIZE)?
            .query_row(
                params![key, owner, outcome.status().as_str(), metadata, wall],
                Row8::read,
            )
            .optional()?;
        if let Some(mut row) = changed {
            row.metadata = metadata.to_vec();
            return Ok(FinalizeAnswer::Finalized(row.into_record(wall, mono)?));
        }
        let owned = conn
            .prepare_cached(OWNED)?
            .query_row(params![key, owner, wall], Row8::read)
            .optional()?;
        Ok(match owned {
            // Already finalized by this owner: the first finalize stands.
            Some(row) if row.status != Status::Pending.as_str() => {
                FinalizeAnswer::Finalized(row.into_record(wall, mono)?)
            }
            _ => FinalizeAnswer::NotOwner,
        })
    })
}

impl SqliteStore {
    /// Deletes every expired idempotency record and returns how many. Expired records are
    /// already invisible and are replaced or swept as the store is used; call this from a
    /// maintenance job to reclaim their space at once.
    ///
    /// # Errors
    /// `Unavailable` or `Internal`, as every operation.
    pub async fn prune_idempotency(&self) -> Result<u64> {
        self.database()
            .run(Role::Write, "pruning idempotency records", |conn, _| {
                immediate(conn, |conn| {
                    Ok(conn.prepare_cached(PRUNE)?.execute([wall_ms()])? as u64)
                })
            })
            .await
    }
}

#[async_trait]
impl IdempotencyStore for SqliteStore {
    async fn acquire(&self, key: &StoreKey, request: AcquireRequest<'_>) -> Result<AcquireAnswer> {
        let key = key.clone();
        let owner = request.attempt.clone();
        let fingerprint = request.fingerprint.to_owned();
        let (ttl, lease, retry) = (request.ttl, request.lease, request.retry_failed);
        self.database()
            .run(Role::Write, "idempotency acquire", move |conn, _| {
                acquire(
                    conn,
                    key.as_str(),
                    owner.as_str(),
                    &fingerprint,
                    ttl,
                    lease,
                    retry,
                )
            })
            .await
    }

    async fn renew(&self, key: &StoreKey, owner: &Holder, lease: Ttl) -> Result<Renewal> {
        let (key, owner) = (key.clone(), owner.clone());
        self.database()
            .run(Role::Write, "idempotency renewal", move |conn, _| {
                immediate(conn, |conn| {
                    let changed = conn.prepare_cached(RENEW)?.execute(params![
                        key.as_str(),
                        owner.as_str(),
                        clock::now(),
                        ns(lease),
                        boot(),
                        wall_ms()
                    ])?;
                    Ok(if changed == 1 {
                        Renewal::Renewed
                    } else {
                        Renewal::NotHeld
                    })
                })
            })
            .await
    }

    async fn finalize(&self, key: &StoreKey, end: AttemptEnd<'_>) -> Result<FinalizeAnswer> {
        let (owner, outcome, metadata) = (end.owner, end.outcome, end.metadata);
        let (key, owner, metadata) = (key.clone(), owner.clone(), metadata.to_vec());
        self.database()
            .run(Role::Write, "idempotency finalize", move |conn, _| {
                finalize(conn, key.as_str(), owner.as_str(), outcome, &metadata)
            })
            .await
    }

    async fn get(&self, key: &StoreKey) -> Result<Option<StoredRecord>> {
        let key = key.clone();
        self.database()
            .run(Role::Read, "idempotency read", move |conn, _| {
                let (wall, mono) = (wall_ms(), clock::now());
                let row = conn
                    .prepare_cached(CURRENT)?
                    .query_row(params![key.as_str(), wall], Row8::read)
                    .optional()?;
                row.map(|row| row.into_record(wall, mono)).transpose()
            })
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conn() -> Connection {
        let conn = Connection::open_in_memory().unwrap();
        ensure_schema(&conn).unwrap();
        ensure_schema(&conn).expect("idempotent");
        conn
    }

    fn fingerprint_of(conn: &Connection, key: &str) -> (String, i64) {
        conn.query_row(
            "SELECT status, attempt FROM baton_idempotency WHERE key = ?1",
            [key],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap()
    }

    /// A lease written in another boot has lapsed whatever its time says.
    #[test]
    fn a_lease_from_another_boot_has_lapsed() {
        let conn = conn();
        let far = clock::now() + 3_600_000_000_000;
        conn.execute(
            "INSERT INTO baton_idempotency VALUES ('k', 'pending', 'old', 1, 'f', x'', ?1, ?2, 'another-boot', NULL)",
            params![wall_ms() + 60_000, far],
        )
        .unwrap();
        let ttl = Ttl::new(Duration::from_secs(60)).unwrap();
        let answer = acquire(&conn, "k", "new", "f", ttl, ttl, false).unwrap();
        let AcquireAnswer::Acquired { record, previous } = answer else {
            panic!("taken over: {answer:?}");
        };
        assert_eq!(previous, Some(Status::Pending));
        assert_eq!((record.owner.as_str(), record.attempt), ("new", 2));
        assert_eq!(fingerprint_of(&conn, "k"), ("pending".into(), 2));
    }

    /// A lease that lies further ahead than any lease can was written before a reboot.
    #[test]
    fn a_lease_from_the_future_has_lapsed() {
        let conn = conn();
        let future = clock::now() + max_lease_ns() + 3_600_000_000_000;
        conn.execute(
            "INSERT INTO baton_idempotency VALUES ('k', 'pending', 'old', 1, 'f', x'', ?1, ?2, ?3, NULL)",
            params![wall_ms() + 60_000, future, boot()],
        )
        .unwrap();
        let ttl = Ttl::new(Duration::from_secs(60)).unwrap();
        assert!(matches!(
            acquire(&conn, "k", "new", "f", ttl, ttl, false).unwrap(),
            AcquireAnswer::Acquired { .. }
        ));
    }

    /// Expiry is the wall clock's: a record whose `expires_at` passed is replaced as new.
    #[test]
    fn an_expired_record_is_replaced_as_new() {
        let conn = conn();
        conn.execute(
            "INSERT INTO baton_idempotency VALUES ('k', 'completed', 'old', 7, 'other', x'01', ?1, 0, '', NULL)",
            params![wall_ms() - 1],
        )
        .unwrap();
        let ttl = Ttl::new(Duration::from_secs(60)).unwrap();
        let AcquireAnswer::Acquired { record, previous } =
            acquire(&conn, "k", "new", "f", ttl, ttl, false).unwrap()
        else {
            panic!("an expired record is free");
        };
        assert_eq!((record.attempt, previous), (1, None));
        assert!(record.metadata.is_empty());
        assert!(record.lease_remaining > Duration::from_secs(50));
    }

    #[test]
    fn a_corrupt_status_is_internal() {
        let conn = conn();
        conn.execute(
            "INSERT INTO baton_idempotency VALUES ('k', 'weird', 'o', 1, '', x'', ?1, 0, '', NULL)",
            params![wall_ms() + 60_000],
        )
        .unwrap();
        let ttl = Ttl::new(Duration::from_secs(60)).unwrap();
        assert!(matches!(
            acquire(&conn, "k", "new", "", ttl, ttl, false),
            Err(OpError::Corrupt(_))
        ));
    }
}
