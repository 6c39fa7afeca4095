//! Semaphores in the SQLite file: one row per live permit, each operation one
//! `BEGIN IMMEDIATE` transaction.
//!
//! `baton_permit (key, holder, fence, expires_at, permits)`, with `expires_at` on the host's
//! monotonic clock like every grant of this store, and `permits` the N of the claim that was
//! granted the permit (0 for a permit granted by a baton that did not record it: the column
//! was added later, with that default, so older files and older batons on newer files keep
//! working; see `ensure_schema`). A permit's fence comes from the key's row
//! in `baton_grant`, the row a lock of the same qualified key would use (a semaphore's keys
//! are of kind `semaphore`, so no lock ever shares it): that row holds no holder and is only
//! the key's counter, so the fences of the key's permits increase as a lock's do, also after
//! the row is pruned (the `fence_floor` trigger) and after the file is replaced (the wall
//! clock floor).
//!
//! Waiting uses the file's wake-ups, as locks do (see `docs/sqlite.md`): a claim that finds
//! every permit held while a waiter of this process waits queues the process for the key,
//! inside its write transaction; a release that gave back a live permit reserves it for the
//! process that waited longest (and reachable) and tells that process, inside its own
//! transaction. The reservation is a row of `baton_permit` whose holder is
//! `handoff:<process>/<fence of the released permit>` and whose fence is 0, ending
//! [`HANDOFF_RESERVATION`](crate::wakeups::HANDOFF_RESERVATION) after the release: it counts
//! as a held permit, so a claim of another process (the releaser asking again at once, a
//! newcomer) finds the key full and queues behind, and a claim of that process takes it.
//! It is never listed as a holder. So processes take permits in the order they queued. Where
//! the wake-ups are unavailable, nothing is reserved and waiters poll every
//! `poll_interval`, as lock waiters do; every waiter also looks again when the permit (or
//! reservation) that ends soonest ends.

use std::time::Duration;

use async_trait::async_trait;
use baton_core::semaphore::PermitInfo;
use baton_core::store::{Claim, HolderInfo, LeaseRequest, LeaseStore, Release, Renewal, Wakeups};
use baton_core::{Fence, Holder, Result, SemaphoreStore, StoreKey, Ttl, prefix_upper_bound};
use rusqlite::{Connection, OptionalExtension, params};

use crate::clock;
use crate::connection::Role;
use crate::error::OpError;
use crate::locks::SqliteStore;
use crate::schema::immediate;
use crate::wakeups::FileWakeups;

/// The permits table, created on open if missing. Idempotent.
///
/// Parameters: none.
pub const SCHEMA: &str = "\
CREATE TABLE IF NOT EXISTS baton_permit (
    key        TEXT    NOT NULL,
    holder     TEXT    NOT NULL,
    fence      INTEGER NOT NULL,
    expires_at INTEGER NOT NULL,
    permits    INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (key, holder)
) WITHOUT ROWID;
";

/// Whether `baton_permit` has the `permits` column (a file from before it does not).
///
/// Parameters: none.
pub const HAS_PERMITS_COLUMN: &str =
    "SELECT count(*) > 0 FROM pragma_table_info('baton_permit') WHERE name = 'permits'";

/// Adds the `permits` column to a file from before it; its permits read as 0 (not recorded).
///
/// Parameters: none.
pub const ADD_PERMITS_COLUMN: &str =
    "ALTER TABLE baton_permit ADD COLUMN permits INTEGER NOT NULL DEFAULT 0";

/// Deletes the ended permits of a key.
///
/// Parameters: `?1` key, `?2` now.
pub const DROP_ENDED: &str = "DELETE FROM baton_permit WHERE key = ?1 AND expires_at <= ?2";

/// Extends the caller's live permit and returns its fence (no row: it holds none).
///
/// Parameters: `?1` key, `?2` holder, `?3` now, `?4` ttl.
pub const EXTEND: &str = "\
UPDATE baton_permit SET expires_at = ?3 + ?4
WHERE key = ?1 AND holder = ?2 AND expires_at > ?3
RETURNING fence";

/// Takes one of the live permits reserved for the caller's process (the one that ends
/// soonest): a release reserved it for this process, whose claim this is. Returns a row when
/// there was one.
///
/// Parameters: `?1` key, `?2` `handoff:<process>/` (the reservations' holder prefix), `?3`
/// the first text after every holder with that prefix (`handoff:<process>0`), `?4` now.
pub const TAKE_RESERVATION: &str = "\
DELETE FROM baton_permit WHERE key = ?1 AND holder = (
    SELECT holder FROM baton_permit
    WHERE key = ?1 AND holder >= ?2 AND holder < ?3 AND expires_at > ?4
    ORDER BY expires_at LIMIT 1)
RETURNING 1";

/// Reserves a permit for the process next in line: a row with no fence (0), holder
/// `handoff:<process>/<fence of the released permit>`, ending at `?3`.
///
/// Parameters: `?1` key, `?2` holder, `?3` expires at.
pub const RESERVE: &str = "\
INSERT OR REPLACE INTO baton_permit (key, holder, fence, expires_at, permits)
VALUES (?1, ?2, 0, ?3, 0)";

/// How many live permits a key has, reservations included (after [`DROP_ENDED`]: all its
/// rows).
///
/// Parameters: `?1` key.
pub const COUNT: &str = "SELECT count(*) FROM baton_permit WHERE key = ?1";

/// Takes the key's next fence from its counter row in `baton_grant` (a row with no holder),
/// creating the row above `fence_floor` and the wall clock when it is missing.
///
/// Parameters: `?1` key, `?2` now, `?3` wall clock µs.
pub const NEXT_FENCE: &str = "\
INSERT INTO baton_grant (key, holder, fence, expires_at, updated_at, reason)
VALUES (?1, NULL, max((SELECT value FROM baton_meta WHERE name = 'fence_floor') + 1, ?3), ?2, ?2, '')
ON CONFLICT (key) DO UPDATE SET fence = max(fence + 1, ?3), updated_at = ?2
RETURNING fence";

/// Records a new permit.
///
/// Parameters: `?1` key, `?2` holder, `?3` fence, `?4` expires at, `?5` the claim's N.
pub const INSERT: &str = "\
INSERT INTO baton_permit (key, holder, fence, expires_at, permits) VALUES (?1, ?2, ?3, ?4, ?5)";

/// The live permit (or reservation) that ends soonest: `holder`, `expires_at`.
///
/// Parameters: `?1` key, `?2` now.
pub const SOONEST: &str = "\
SELECT holder, expires_at FROM baton_permit WHERE key = ?1 AND expires_at > ?2
ORDER BY expires_at LIMIT 1";

/// Renews the caller's live permit (one changed row: renewed).
///
/// Parameters: `?1` key, `?2` holder, `?3` now, `?4` ttl.
pub const RENEW: &str = "\
UPDATE baton_permit SET expires_at = ?3 + ?4
WHERE key = ?1 AND holder = ?2 AND expires_at > ?3";

/// Gives back the caller's permit, live or ended; returns whether it was live, and its
/// fence.
///
/// Parameters: `?1` key, `?2` holder, `?3` now.
pub const RELEASE: &str = "\
DELETE FROM baton_permit WHERE key = ?1 AND holder = ?2
RETURNING expires_at > ?3, fence";

/// The live permits of a key, oldest fence first: `holder`, `fence`, `expires_at`.
/// Reservations (fence 0) are not permits.
///
/// Parameters: `?1` key, `?2` now.
pub const LIVE: &str = "\
SELECT holder, fence, expires_at FROM baton_permit
WHERE key = ?1 AND expires_at > ?2 AND fence > 0
ORDER BY fence";

/// The live permits of the first `?4` keys in `[?1, ?2)` that have any, by key then fence:
/// `key`, `holder`, `fence`, `expires_at`, `permits`. One range read of the primary key.
/// Reservations (fence 0) are not permits.
///
/// Parameters: `?1` prefix, `?2` its upper bound, `?3` now, `?4` limit (keys).
pub const LIST: &str = "\
SELECT key, holder, fence, expires_at, permits FROM baton_permit
WHERE key IN (SELECT DISTINCT key FROM baton_permit
              WHERE key >= ?1 AND key < ?2 AND expires_at > ?3 AND fence > 0
              ORDER BY key LIMIT ?4)
  AND expires_at > ?3 AND fence > 0
ORDER BY key, fence";

/// [`LIST`] for a prefix that has no upper bound (it is empty, or ends in U+10FFFF only).
///
/// Parameters: `?1` prefix, `?2` now, `?3` limit (keys).
pub const LIST_FROM: &str = "\
SELECT key, holder, fence, expires_at, permits FROM baton_permit
WHERE key IN (SELECT DISTINCT key FROM baton_permit
              WHERE key >= ?1 AND expires_at > ?2 AND fence > 0 ORDER BY key LIMIT ?3)
  AND expires_at > ?2 AND fence > 0
ORDER BY key, fence";

/// After a reboot: every permit is from the old boot, whose holders are gone.
///
/// Parameters: none.
pub const FREE_ALL: &str = "DELETE FROM baton_permit";

/// Where the boot cannot be identified: deletes the permits written later than now, which
/// on a monotonic clock means before a reboot (their end is beyond any TTL from now).
///
/// Parameters: `?1` now, `?2` the longest TTL.
pub const FREE_FROM_EARLIER_BOOT: &str = "DELETE FROM baton_permit WHERE expires_at > ?1 + ?2";

/// Creates the permits table, or adds the `permits` column to one from before it.
///
/// The column is added in place rather than by a new schema version: a file at a newer
/// version is refused by every older baton, and this change needs none of them to stop (an
/// older baton's permits simply record no N). The check is repeated inside a
/// `BEGIN IMMEDIATE` transaction, so processes that open an old file at once add it once.
pub(crate) fn ensure_schema(conn: &Connection) -> Result<(), OpError> {
    conn.execute_batch(SCHEMA)?;
    let has = |conn: &Connection| -> Result<bool, OpError> {
        Ok(conn
            .prepare_cached(HAS_PERMITS_COLUMN)?
            .query_row([], |r| r.get(0))?)
    };
    if !has(conn)? {
        immediate(conn, |conn| {
            if !has(conn)? {
                conn.execute(ADD_PERMITS_COLUMN, [])?;
            }
            Ok(())
        })?;
    }
    Ok(())
}

/// The N a permit recorded: 0 is "not recorded".
fn recorded_permits(raw: i64) -> Option<u32> {
    u32::try_from(raw).ok().filter(|n| *n > 0)
}

/// The live permits under `prefix`, for at most `limit` keys (see [`LIST`]).
fn list(conn: &Connection, prefix: &str, limit: i64) -> Result<Vec<PermitInfo>, OpError> {
    let now = clock::now();
    let read = |r: &rusqlite::Row<'_>| {
        Ok((
            r.get::<_, String>(0)?,
            r.get::<_, String>(1)?,
            r.get::<_, i64>(2)?,
            r.get::<_, i64>(3)?,
            r.get::<_, i64>(4)?,
        ))
    };
    let rows = match prefix_upper_bound(prefix) {
        Some(upper) => conn
            .prepare_cached(LIST)?
            .query_map(params![prefix, upper, now, limit], read)?
            .collect::<rusqlite::Result<Vec<_>>>()?,
        None => conn
            .prepare_cached(LIST_FROM)?
            .query_map(params![prefix, now, limit], read)?
            .collect::<rusqlite::Result<Vec<_>>>()?,
    };
    Ok(rows
        .into_iter()
        .map(|(key, holder, raw_fence, expires_at, permits)| PermitInfo {
            grant: HolderInfo {
                key: StoreKey::from_stored(key),
                holder: Holder::from_stored(holder),
                fence: fence(raw_fence),
                remaining: remaining(expires_at, now),
                reason: String::new(),
            },
            permits: recorded_permits(permits),
        })
        .collect())
}

/// Nanoseconds, as the store's times are.
fn nanos(d: Duration) -> i64 {
    i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)
}

fn remaining(expires_at: i64, now: i64) -> Duration {
    Duration::from_nanos(expires_at.saturating_sub(now).max(0) as u64)
}

fn fence(raw: i64) -> Fence {
    Fence::new(raw.max(0) as u64)
}

fn claim(
    conn: &Connection,
    store_key: &StoreKey,
    holder: &str,
    ttl: Ttl,
    permits: u32,
    wakeups: &FileWakeups,
) -> Result<Claim, OpError> {
    let key = store_key.as_str();
    immediate(conn, |conn| {
        let now = clock::now();
        let ttl = nanos(ttl.get());
        conn.prepare_cached(DROP_ENDED)?
            .execute(params![key, now])?;
        let own: Option<i64> = conn
            .prepare_cached(EXTEND)?
            .query_row(params![key, holder, now, ttl], |r| r.get(0))
            .optional()?;
        if let Some(own) = own {
            return Ok(Claim::Extended { fence: fence(own) });
        }
        if let Some(handoff) = wakeups
            .handoff()
            .filter(|_| wakeups.hub().has_waiters(store_key))
        {
            // A permit a release reserved for this process makes room for this claim (made
            // while one of its waiters waits: the release woke it for that reservation).
            let (from, to) = (format!("{handoff}/"), format!("{handoff}0"));
            conn.prepare_cached(TAKE_RESERVATION)?
                .query_row(params![key, from, to, now], |_| Ok(()))
                .optional()?;
        }
        let held: i64 = conn.prepare_cached(COUNT)?.query_row([key], |r| r.get(0))?;
        if held < i64::from(permits) {
            let next: i64 = conn
                .prepare_cached(NEXT_FENCE)?
                .query_row(params![key, now, clock::wall_micros()], |r| r.get(0))?;
            conn.prepare_cached(INSERT)?
                .execute(params![key, holder, next, now + ttl, permits])?;
            return Ok(Claim::Granted { fence: fence(next) });
        }
        let (holder, expires_at): (String, i64) = conn
            .prepare_cached(SOONEST)?
            .query_row(params![key, now], |r| Ok((r.get(0)?, r.get(1)?)))?;
        // Before the commit: a release cannot come between this answer and the queue.
        wakeups.held(store_key, None);
        Ok(Claim::Held {
            holder: Holder::from_stored(holder),
            remaining: remaining(expires_at, now),
        })
    })
}

#[async_trait]
impl SemaphoreStore for SqliteStore {
    async fn claim_permit(
        &self,
        key: &StoreKey,
        request: LeaseRequest<'_>,
        permits: u32,
    ) -> Result<Claim> {
        let (key, holder, ttl) = (key.clone(), request.holder.clone(), request.ttl);
        self.database()
            .run(Role::Write, "semaphore claim", move |conn, db| {
                let claimed = claim(conn, &key, holder.as_str(), ttl, permits, &db.wakeups)?;
                if !matches!(claimed, Claim::Held { .. }) {
                    db.wakeups.granted(&key);
                }
                Ok(claimed)
            })
            .await
    }

    async fn renew_permit(&self, key: &StoreKey, holder: &Holder, ttl: Ttl) -> Result<Renewal> {
        let (key, holder) = (key.clone(), holder.clone());
        self.database()
            .run(Role::Write, "semaphore renewal", move |conn, _| {
                let changed = conn.prepare_cached(RENEW)?.execute(params![
                    key.as_str(),
                    holder.as_str(),
                    clock::now(),
                    nanos(ttl.get())
                ])?;
                Ok(if changed == 1 {
                    Renewal::Renewed
                } else {
                    Renewal::NotHeld
                })
            })
            .await
    }

    async fn release_permit(&self, key: &StoreKey, holder: &Holder) -> Result<Release> {
        let (owned, holder) = (key.clone(), holder.clone());
        let live = self
            .database()
            .run(Role::Write, "semaphore release", move |conn, db| {
                let live = immediate(conn, |conn| {
                    let now = clock::now();
                    let released: Option<(bool, i64)> = conn
                        .prepare_cached(RELEASE)?
                        .query_row(params![owned.as_str(), holder.as_str(), now], |r| {
                            Ok((r.get(0)?, r.get(1)?))
                        })
                        .optional()?;
                    let Some((true, released)) = released else {
                        return Ok(false);
                    };
                    if let Some(line) = db.wakeups.next_in_line(&owned) {
                        // Inside the transaction, as a lock's release: no other claim takes
                        // the permit before the reservation, and the woken process's claim
                        // waits for this commit's write lock.
                        let reservation = nanos(crate::wakeups::HANDOFF_RESERVATION);
                        conn.prepare_cached(RESERVE)?.execute(params![
                            owned.as_str(),
                            format!("{}/{released}", line.handoff()),
                            now + reservation
                        ])?;
                        db.wakeups.hand_over(line);
                    }
                    Ok(true)
                })?;
                if live {
                    // Here rather than after the await: a caller that stops waiting for the
                    // answer must not leave the waiters asleep.
                    db.wakeups.released(&owned);
                }
                Ok(live)
            })
            .await?;
        Ok(if live {
            Release::Removed
        } else {
            Release::NoHolder
        })
    }

    async fn permits(&self, key: &StoreKey) -> Result<Vec<HolderInfo>> {
        let owned = key.clone();
        self.database()
            .run(Role::Read, "semaphore holders", move |conn, _| {
                let now = clock::now();
                let mut statement = conn.prepare_cached(LIVE)?;
                let rows = statement.query_map(params![owned.as_str(), now], |r| {
                    Ok((
                        r.get::<_, String>(0)?,
                        r.get::<_, i64>(1)?,
                        r.get::<_, i64>(2)?,
                    ))
                })?;
                let mut permits = Vec::new();
                for row in rows {
                    let (holder, raw_fence, expires_at) = row?;
                    permits.push(HolderInfo {
                        key: owned.clone(),
                        holder: Holder::from_stored(holder),
                        fence: fence(raw_fence),
                        remaining: remaining(expires_at, now),
                        reason: String::new(),
                    });
                }
                Ok(permits)
            })
            .await
    }

    async fn list_permits(&self, prefix: &str, limit: usize) -> Result<Vec<PermitInfo>> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let prefix = prefix.to_owned();
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.database()
            .run(Role::Read, "semaphore listing", move |conn, _| {
                list(conn, &prefix, limit)
            })
            .await
    }

    fn permit_wakeups(&self) -> Wakeups {
        self.wakeups()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_schema_is_idempotent() {
        let conn = Connection::open_in_memory().unwrap();
        ensure_schema(&conn).unwrap();
        ensure_schema(&conn).unwrap();
    }

    /// A file from before the `permits` column gets it, and its permits read as not recorded.
    #[test]
    fn a_permit_table_from_before_the_permits_column_gets_it() {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch(
            "CREATE TABLE baton_permit (key TEXT NOT NULL, holder TEXT NOT NULL, \
             fence INTEGER NOT NULL, expires_at INTEGER NOT NULL, PRIMARY KEY (key, holder)) \
             WITHOUT ROWID; \
             INSERT INTO baton_permit VALUES ('ns:semaphore:k', 'old', 3, 9223372036854775807);",
        )
        .unwrap();
        ensure_schema(&conn).unwrap();
        ensure_schema(&conn).unwrap();
        let listed = list(&conn, "ns:semaphore:", 10).unwrap();
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].grant.holder.as_str(), "old");
        assert_eq!(listed[0].permits, None);
        assert_eq!(recorded_permits(4), Some(4));
    }
}
