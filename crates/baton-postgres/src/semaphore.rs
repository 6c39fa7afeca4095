//! Semaphores on PostgreSQL: one row per live permit, each claim one statement, on the
//! database server's clock.
//!
//! ## Objects
//! Created when a store connects if missing (idempotent, under the schema's migration lock,
//! like the rate-limit objects; see `crate::schema`):
//!
//! - `baton_permit (key, slot, holder, fence, expires_at, permits)`: one row per slot of a
//!   key that was ever taken; an ended permit's row is reused by the next claim of its slot.
//!   `permits` is the N of the claim that was granted the permit, for listings; it was added
//!   later (`ADD COLUMN IF NOT EXISTS`, default 0 = not recorded), not by a new schema
//!   version, which every older replica would refuse.
//! - `baton_permit_claim_v5(...)`: the claim ([`CLAIM_FUNCTION`]): a permit reserved for
//!   the caller's store, or a free slot below N taken by one `INSERT ... ON CONFLICT DO
//!   NOTHING` (or, for a slot whose permit ended unreleased, one `UPDATE` of that row), so
//!   claims of one key take no lock beyond the slot's row and commit in parallel. A later
//!   algorithm gets a new name rather than replacing this one under running replicas: v2 is
//!   v1 that also records N, v3 is v2 that reads the key's live permits once (the count and
//!   the free slot from one materialized scan, instead of a count and a probe per slot), v4
//!   is v3 that takes reservations and queues its store, v5 is v4 that keeps concurrent
//!   claims off each other's slots (below), and the earlier ones are left for
//!   the older replicas that call them (v1's permits record no N; one that reuses a slot
//!   leaves the slot's earlier N, so during a rolling upgrade a listing's N may be stale; v3
//!   counts a reservation as a held permit, and never queues, so its waiters are woken by
//!   their timers).
//!
//! Concurrent claims of one key read the same free slots (a claim's snapshot does not see
//! another's uncommitted insert), and a claim that writes a slot another claim is writing
//! waits for that claim's commit, WAL flush included, before it can choose again. So each
//! claim takes the first free slot whose transaction-scoped advisory lock
//! (`pg_try_advisory_xact_lock(hashtext(key), slot)`, the two-integer form) it gets, skipping
//! slots that concurrent claims are taking; only when every free slot is being taken does it
//! wait on one, as v4 always might. It writes a free slot with `ON CONFLICT DO NOTHING`, so it
//! never locks a live permit's row (v4's `ON CONFLICT DO UPDATE ... WHERE` ended locked the
//! row even when it was live, and the holder's release then waited for that claim's
//! commit). The advisory locks end with the claim's transaction; one taken by an
//! application with the same two integers only makes a claim skip that slot.
//!
//! Both functions plan their statements once per session, for any arguments
//! (`plan_cache_mode = force_generic_plan`), and only as index scans (`enable_seqscan = off`,
//! `enable_bitmapscan = off`); these are settings of the functions, so they apply to their
//! own statements only. Every statement finds one key's rows through the primary key or
//! `baton_permit_holder`, whatever the key, the holder or N, and a busy key's index entries
//! are mostly dead between two vacuums (every release deletes a row, every claim inserts
//! one). Left to choose, the server planned the claim's read of the live permits again at
//! every call (about 0.4 ms of CPU, more than running it); on a table not yet analyzed it
//! chose bitmap scans, which never mark dead index entries, so each read walked every entry
//! the key's churn had left since the last vacuum; and on few live rows it chose sequential
//! scans that read every page. `baton_permit_release_v2` is v1 with these settings; v1 is
//! left for older replicas. `plan_cache_mode` needs PostgreSQL 12 or later.
//!
//! Fences come from the `baton_fence` sequence, as lock grants' do, so they increase across
//! every permit of a key (and every grant of the database).
//!
//! ## Waking waiters
//! Stores queue for permits in `baton_wait`, as for lock grants: a claim made while one of the
//! store's waiters waits for the key, that finds every permit held, queues the store under its
//! LISTEN backend's pid. A release that gave back a live permit reserves it for the store that
//! waited longest (its row becomes `handoff:<pid>` with fence 0, for
//! [`HANDOFF_RESERVATION`]) and notifies that store
//! alone; its first waiter claims and takes the reservation. Meanwhile the reservation counts
//! as a held permit, so a claim from elsewhere (the releaser asking again at once, a
//! newcomer) finds the key full and queues behind: stores take permits in the order they
//! queued, and one release wakes one store. A store told of a reservation it has no waiter
//! for any more passes it to the next store (`pass`). With nobody queued, a release
//! notifies `baton_released`, as a lock's plain release does.

use std::time::Duration;

use async_trait::async_trait;
use baton_core::semaphore::PermitInfo;
use baton_core::store::{Claim, HolderInfo, LeaseRequest, LeaseStore, Release, Renewal, Wakeups};
use baton_core::{Fence, Holder, Result, SemaphoreStore, StoreKey, Ttl};
use sqlx::Row;

use baton_core::signals::HANDOFF_RESERVATION;

use crate::connection::Db;
use crate::error::{sql_error, unexpected};
use crate::handoff;
use crate::locks::PostgresStore;

/// The permit objects, created in one transaction under
/// [`MIGRATION_LOCK`](crate::sql::MIGRATION_LOCK) when any is missing.
///
/// A permit is a slot of its key: slots `0..N` of a semaphore of N permits, so two claims
/// never hold one slot (the primary key), and no lock is taken across a claim's commit.
pub const SCHEMA: &str = "\
CREATE TABLE IF NOT EXISTS baton_permit (
    key        text COLLATE \"C\" NOT NULL,
    slot       integer     NOT NULL,
    holder     text        NOT NULL,
    fence      bigint      NOT NULL,
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (key, slot)
);
CREATE INDEX IF NOT EXISTS baton_permit_holder ON baton_permit (key, holder);
ALTER TABLE baton_permit ADD COLUMN IF NOT EXISTS permits integer NOT NULL DEFAULT 0;
";

/// One claim (see the module docs). Returns one row: `outcome` (`granted`, `extended` or
/// `held`), `fence` (of the permit granted or extended), `holder` and `remaining_us` (of the
/// live permit or reservation that ends soonest, when held).
///
/// The caller's own live permit is extended. Otherwise a permit a release reserved for the
/// caller's store (`p_pid`, its LISTEN backend's pid, given only while one of its waiters
/// waits for the key) is deleted first, making room for this claim. Then,
/// while fewer than `p_permits` live permits and reservations are held, a free slot below
/// `p_permits` is chosen (the first whose advisory lock it gets, see the module docs) and
/// taken with one `INSERT ... ON CONFLICT DO NOTHING`, or an `UPDATE` of an ended permit's
/// row: two claims that chose the same slot meet at its primary key, the second finds it
/// live and chooses again. Slots are what bound the holders, so clients that
/// agree on N never see more than N; a client with a smaller N than others is refused while
/// as many permits as its N are held (a smaller N revokes nothing). A claim with `p_pid`
/// that finds the key full queues its store in `baton_wait` (keeping its place if queued);
/// one that is granted takes its store out of the queue.
pub const CLAIM_FUNCTION: &str = r#"
CREATE OR REPLACE FUNCTION baton_permit_claim_v5(
    p_key text, p_holder text, p_ttl_ms bigint, p_permits bigint, p_pid integer)
RETURNS TABLE (outcome text, fence bigint, holder text, remaining_us bigint)
LANGUAGE plpgsql VOLATILE
SET enable_seqscan = off SET enable_bitmapscan = off SET plan_cache_mode = force_generic_plan
AS $claim$
DECLARE
    until timestamptz;
    free  integer;
BEGIN
    until := clock_timestamp() + p_ttl_ms * interval '1 millisecond';
    UPDATE baton_permit AS p SET expires_at = until
    WHERE p.key = p_key AND p.holder = p_holder AND p.expires_at > clock_timestamp()
    RETURNING 'extended', p.fence, NULL::text, NULL::bigint
    INTO outcome, fence, holder, remaining_us;
    IF FOUND THEN
        RETURN NEXT;
        RETURN;
    END IF;
    IF p_pid IS NOT NULL THEN
        -- A permit reserved for this store (a release woke it for it; the one that ends
        -- soonest, if it has more) makes room for this claim, which then takes a slot as
        -- any claim does: so it is granted only if the other live permits leave room under
        -- its own N (a writer of a reader-writer lock claims with N = 1).
        DELETE FROM baton_permit AS p
        WHERE p.key = p_key AND p.holder = 'handoff:' || p_pid
          AND p.expires_at > clock_timestamp()
          AND p.slot = (SELECT r.slot FROM baton_permit AS r
                        WHERE r.key = p_key AND r.holder = 'handoff:' || p_pid
                          AND r.expires_at > clock_timestamp()
                        ORDER BY r.expires_at LIMIT 1);
    END IF;
    LOOP
        -- One read of the key's live permits and reservations: how many, and a free slot
        -- below N, the first one no concurrent claim is taking (its advisory lock is free,
        -- and now this claim's), or else any, chosen at random.
        WITH live AS MATERIALIZED (
            SELECT p.slot FROM baton_permit AS p
            WHERE p.key = p_key AND p.expires_at > clock_timestamp()
        ),
        unheld AS MATERIALIZED (
            SELECT s::integer AS s FROM generate_series(0, p_permits - 1) AS s
            WHERE s NOT IN (SELECT l.slot FROM live AS l)
        )
        SELECT CASE WHEN (SELECT count(*) FROM live) < p_permits THEN
                   coalesce((SELECT u.s FROM unheld AS u
                             WHERE pg_try_advisory_xact_lock(hashtext(p_key), u.s)
                             LIMIT 1),
                            (SELECT u.s FROM unheld AS u ORDER BY random() LIMIT 1))
               END
        INTO free;
        IF free IS NULL THEN
            SELECT 'held', NULL::bigint, p.holder,
                   greatest((extract(epoch FROM p.expires_at - clock_timestamp()) * 1000000)::bigint, 0)
            INTO outcome, fence, holder, remaining_us
            FROM baton_permit AS p WHERE p.key = p_key AND p.expires_at > clock_timestamp()
            ORDER BY p.expires_at LIMIT 1;
            IF FOUND THEN
                IF p_pid IS NOT NULL THEN
                    INSERT INTO baton_wait AS w (key, pid, holder, ttl_ms, since)
                    VALUES (p_key, p_pid, p_holder, p_ttl_ms, clock_timestamp())
                    ON CONFLICT (key, pid) DO UPDATE
                        SET holder = excluded.holder, ttl_ms = excluded.ttl_ms;
                END IF;
                RETURN NEXT;
                RETURN;
            END IF;
            -- Every permit ended or was released meanwhile: look again.
            CONTINUE;
        END IF;
        -- A released slot has no row; one whose permit ended unreleased is taken by an update
        -- that, unlike ON CONFLICT DO UPDATE, locks no row it does not change.
        INSERT INTO baton_permit AS p (key, slot, holder, fence, expires_at, permits)
        VALUES (p_key, free, p_holder, nextval('baton_fence'), until, p_permits)
        ON CONFLICT (key, slot) DO NOTHING
        RETURNING 'granted', p.fence, NULL::text, NULL::bigint
        INTO outcome, fence, holder, remaining_us;
        IF NOT FOUND THEN
            UPDATE baton_permit AS p
            SET holder = p_holder, fence = nextval('baton_fence'), expires_at = until,
                permits = p_permits
            WHERE p.key = p_key AND p.slot = free AND p.expires_at <= clock_timestamp()
            RETURNING 'granted', p.fence, NULL::text, NULL::bigint
            INTO outcome, fence, holder, remaining_us;
        END IF;
        IF FOUND THEN
            IF p_pid IS NOT NULL THEN
                DELETE FROM baton_wait AS w WHERE w.key = p_key AND w.pid = p_pid;
            END IF;
            RETURN NEXT;
            RETURN;
        END IF;
        -- Another claim took the slot first: choose again.
    END LOOP;
END
$claim$;
"#;

/// Whether every object of [`SCHEMA`], [`CLAIM_FUNCTION`] and [`RELEASE_FUNCTION`] exists.
pub const OBJECTS_EXIST: &str = "\
SELECT to_regclass('baton_permit') IS NOT NULL
   AND to_regclass('baton_permit_holder') IS NOT NULL
   AND EXISTS (SELECT 1 FROM pg_catalog.pg_attribute
               WHERE attrelid = to_regclass('baton_permit') AND attname = 'permits'
                 AND NOT attisdropped)
   AND to_regprocedure('baton_permit_claim_v5(text, text, bigint, bigint, integer)') IS NOT NULL
   AND to_regprocedure('baton_permit_release_v2(text, text, bigint)') IS NOT NULL";

/// A claim.
///
/// Parameters: `$1` key, `$2` holder, `$3` ttl (ms), `$4` permits, `$5` the LISTEN backend's
/// pid of the claiming store while one of its waiters waits for the key (`integer`, `NULL`
/// otherwise: the claim then neither takes a reservation nor queues).
pub const CLAIM: &str =
    "SELECT outcome, fence, holder, remaining_us FROM baton_permit_claim_v5($1, $2, $3, $4, $5)";

/// Renews the caller's live permit (one changed row: renewed).
///
/// Parameters: `$1` key, `$2` holder, `$3` ttl (ms).
pub const RENEW: &str = "\
UPDATE baton_permit SET expires_at = clock_timestamp() + $3 * interval '1 millisecond'
WHERE key = $1 AND holder = $2 AND expires_at > clock_timestamp()";

/// The release ([`RELEASE`]), as a function so that the common case, nobody queued, is a
/// delete and one index probe of `baton_wait`. Returns one row, `live`, when the caller had a
/// row (none otherwise).
///
/// The caller's permit is deleted, live or ended. A live one, while stores are queued for the
/// key, is reserved for the one that has waited longest and is still there (the oldest entry
/// of `baton_wait` whose pid is a LISTEN backend, as a lock's release chooses; dead entries
/// are deleted on the way), for `p_reserve_ms`: the freed slot gets a row with holder
/// `handoff:<pid>`, fence 0 and no N, which counts as held but is no permit, and only that
/// store's claim takes it ([`CLAIM_FUNCTION`]). That store alone is notified, on its own
/// channel ([`HANDOFF_CHANNEL`](crate::sql::HANDOFF_CHANNEL) and its pid), with
/// `U+001E key`, and its entry is deleted. With no store queued, `baton_released` is notified
/// with the key. The commit is asynchronous, as a lock's release that frees the key is: a
/// release or reservation lost in a crash leaves the permit to its TTL, which is what a
/// crashed holder's permit costs anyway.
///
/// A store that is told of a reservation while none of its waiters wants the permit any more
/// calls this with `handoff:<its pid>` as the holder: the reservation goes to the next store.
pub const RELEASE_FUNCTION: &str = r#"
CREATE OR REPLACE FUNCTION baton_permit_release_v2(
    p_key text, p_holder text, p_reserve_ms bigint)
RETURNS TABLE (live boolean)
LANGUAGE plpgsql VOLATILE
SET enable_seqscan = off SET enable_bitmapscan = off SET plan_cache_mode = force_generic_plan
AS $release$
DECLARE
    freed integer;
    waiter record;
BEGIN
    PERFORM set_config('synchronous_commit', 'off', true);
    IF left(p_holder, 8) = 'handoff:' THEN
        -- One of a store's reservations (it may have two of one key): the latest.
        DELETE FROM baton_permit AS p
        WHERE p.key = p_key AND p.holder = p_holder
          AND p.slot = (SELECT o.slot FROM baton_permit AS o
                        WHERE o.key = p_key AND o.holder = p_holder
                        ORDER BY o.expires_at DESC LIMIT 1)
        RETURNING p.slot, p.expires_at > clock_timestamp() INTO freed, live;
    ELSE
        -- A holder has one permit of a key.
        DELETE FROM baton_permit AS p WHERE p.key = p_key AND p.holder = p_holder
        RETURNING p.slot, p.expires_at > clock_timestamp() INTO freed, live;
    END IF;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF live THEN
        FOR waiter IN
            SELECT w.pid FROM baton_wait AS w WHERE w.key = p_key ORDER BY w.since, w.pid
        LOOP
            DELETE FROM baton_wait AS w WHERE w.key = p_key AND w.pid = waiter.pid;
            IF EXISTS (SELECT 1 FROM pg_stat_get_activity(waiter.pid) AS a
                       WHERE a.application_name IS NULL
                          OR a.application_name = 'baton-listen') THEN
                INSERT INTO baton_permit (key, slot, holder, fence, expires_at, permits)
                VALUES (p_key, freed, 'handoff:' || waiter.pid, 0,
                        clock_timestamp() + p_reserve_ms * interval '1 millisecond', 0);
                PERFORM pg_notify('baton_handoff_' || waiter.pid, chr(30) || p_key);
                RETURN NEXT;
                RETURN;
            END IF;
        END LOOP;
        -- Nobody queued, as far as this transaction sees: a waiter whose queueing claim
        -- commits after this read is woken by this, so it claims again at once.
        PERFORM pg_notify('baton_released', p_key);
    END IF;
    RETURN NEXT;
END
$release$;
"#;

/// Gives back the caller's permit and hands a live one to the store that waited longest
/// ([`RELEASE_FUNCTION`]). Returns one row, `live`, when the caller had a row.
///
/// Parameters: `$1` key, `$2` holder (or `handoff:<pid>`), `$3` reservation (ms).
pub const RELEASE: &str = "SELECT live FROM baton_permit_release_v2($1, $2, $3)";

/// The live permits of a key, oldest fence first: `holder`, `fence`, `remaining_us`.
///
/// Parameters: `$1` key.
pub const LIVE: &str = "\
SELECT holder, fence,
       greatest((extract(epoch FROM expires_at - clock_timestamp()) * 1000000)::bigint, 0)
           AS remaining_us
FROM baton_permit WHERE key = $1 AND expires_at > clock_timestamp() AND fence > 0
ORDER BY fence";

/// The live permits of the first `$3` keys in `[$1, $2)` that have any, by key then fence:
/// `key`, `holder`, `fence`, `remaining_us`, `permits`. One range read of the primary key.
///
/// Parameters: `$1` prefix, `$2` its upper bound, `$3` limit (keys).
pub const LIST: &str = "\
WITH c AS (SELECT clock_timestamp() AS now),
listed AS (
    SELECT DISTINCT p.key FROM baton_permit AS p, c
    WHERE p.key >= $1 AND p.key < $2 AND p.expires_at > c.now AND p.fence > 0
    ORDER BY p.key LIMIT $3
)
SELECT p.key, p.holder, p.fence, p.permits,
       greatest((extract(epoch FROM p.expires_at - c.now) * 1000000)::bigint, 0) AS remaining_us
FROM baton_permit AS p JOIN listed USING (key), c
WHERE p.expires_at > c.now AND p.fence > 0
ORDER BY p.key, p.fence";

/// [`LIST`] for a prefix that has no upper bound (it is empty, or ends in U+10FFFF only).
///
/// Parameters: `$1` prefix, `$2` limit (keys).
pub const LIST_FROM: &str = "\
WITH c AS (SELECT clock_timestamp() AS now),
listed AS (
    SELECT DISTINCT p.key FROM baton_permit AS p, c
    WHERE p.key >= $1 AND p.expires_at > c.now AND p.fence > 0
    ORDER BY p.key LIMIT $2
)
SELECT p.key, p.holder, p.fence, p.permits,
       greatest((extract(epoch FROM p.expires_at - c.now) * 1000000)::bigint, 0) AS remaining_us
FROM baton_permit AS p JOIN listed USING (key), c
WHERE p.expires_at > c.now AND p.fence > 0
ORDER BY p.key, p.fence";

/// Gives back `holder`'s permit of `key` (or a reservation, as `handoff:<pid>`); whether it
/// was live.
async fn release(db: &Db, key: &StoreKey, holder: &Holder) -> Result<bool> {
    let what = || format!("permit release of {key}");
    let reservation = i64::try_from(HANDOFF_RESERVATION.as_millis()).unwrap_or(i64::MAX);
    let row = db
        .call(
            what,
            || {
                sqlx::query(RELEASE)
                    .bind(key.as_str())
                    .bind(holder.as_str())
                    .bind(reservation)
                    .fetch_optional(db.exec())
            },
            // A release that ran and was retried finds nothing the second time: the first
            // answer is the one that counts.
            |row| row.is_some(),
        )
        .await?;
    match row {
        Some(row) => row
            .try_get::<bool, _>("live")
            .map_err(|e| sql_error(e, &what(), &db.server)),
        None => Ok(false),
    }
}

/// Whether a notification `payload` tells this store of a permit reserved for it
/// (`U+001E key`): the key, if so.
pub(crate) fn reserved_key(payload: &str) -> Option<StoreKey> {
    payload
        .strip_prefix('\u{1e}')
        .filter(|key| !key.is_empty())
        .map(|key| StoreKey::from_stored(key.to_owned()))
}

/// Gives up the permit of `key` reserved for the store whose LISTEN backend is `pid`, none
/// of whose waiters wants it any more, in the background: the release hands the reservation
/// to the next store in line. A failure is only logged: the reservation ends on its own.
pub(crate) fn pass(db: Db, key: StoreKey, pid: i32) {
    tokio::spawn(async move {
        let reservation = Holder::from_stored(format!("handoff:{pid}"));
        if let Err(error) = release(&db, &key, &reservation).await {
            tracing::debug!(%key, %error, "could not pass a permit reservation on; it ends on its own");
        }
    });
}

fn millis(ttl: Ttl) -> i64 {
    i64::try_from(ttl.get().as_millis()).unwrap_or(i64::MAX)
}

fn fence(raw: i64) -> Fence {
    Fence::new(raw.max(0) as u64)
}

fn remaining(us: i64) -> Duration {
    Duration::from_micros(us.max(0) as u64)
}

#[async_trait]
impl SemaphoreStore for PostgresStore {
    async fn claim_permit(
        &self,
        key: &StoreKey,
        request: LeaseRequest<'_>,
        permits: u32,
    ) -> Result<Claim> {
        let what = || format!("permit claim of {key}");
        // A waiter of this store subscribes before it claims: only then does the claim take a
        // reservation for the store or queue it.
        let pid = if self.hub.has_waiters(key) {
            handoff::pid(&self.handoffs)
        } else {
            None
        };
        let row = self
            .db
            .call(
                what,
                || {
                    sqlx::query(CLAIM)
                        .bind(key.as_str())
                        .bind(request.holder.as_str())
                        .bind(millis(request.ttl))
                        .bind(i64::from(permits))
                        .bind(pid)
                        .fetch_one(self.db.exec())
                },
                // A claim that ran and was retried comes back as an extension: a permit
                // either way.
                |_| true,
            )
            .await?;
        let read = |row: &sqlx::postgres::PgRow| -> Result<Claim, sqlx::Error> {
            let outcome: String = row.try_get("outcome")?;
            Ok(match outcome.as_str() {
                "granted" => Claim::Granted {
                    fence: fence(row.try_get("fence")?),
                },
                "extended" => Claim::Extended {
                    fence: fence(row.try_get("fence")?),
                },
                _ => Claim::Held {
                    holder: Holder::from_stored(row.try_get::<String, _>("holder")?),
                    remaining: remaining(row.try_get("remaining_us")?),
                },
            })
        };
        match read(&row) {
            Ok(claim) => Ok(claim),
            Err(e) => Err(unexpected(&what(), &self.db.server, e.to_string())),
        }
    }

    async fn renew_permit(&self, key: &StoreKey, holder: &Holder, ttl: Ttl) -> Result<Renewal> {
        let done = self
            .db
            .call(
                || format!("permit renewal of {key}"),
                || {
                    sqlx::query(RENEW)
                        .bind(key.as_str())
                        .bind(holder.as_str())
                        .bind(millis(ttl))
                        .execute(self.db.exec())
                },
                // A renewal that ran and was retried renewed.
                |_| true,
            )
            .await?;
        Ok(if done.rows_affected() == 1 {
            Renewal::Renewed
        } else {
            Renewal::NotHeld
        })
    }

    async fn release_permit(&self, key: &StoreKey, holder: &Holder) -> Result<Release> {
        let live = release(&self.db, key, holder).await?;
        if live && !self.is_listening() {
            // Nobody hears this store's own notification: wake its own waiters here.
            self.wakeups().hub.notify(key);
        }
        Ok(if live {
            Release::Removed
        } else {
            Release::NoHolder
        })
    }

    async fn permits(&self, key: &StoreKey) -> Result<Vec<HolderInfo>> {
        let what = || format!("permits of {key}");
        let rows = self
            .db
            .call(
                what,
                || {
                    sqlx::query(LIVE)
                        .bind(key.as_str())
                        .fetch_all(self.db.exec())
                },
                |_| true,
            )
            .await?;
        rows.iter()
            .map(|row| {
                Ok(HolderInfo {
                    key: key.clone(),
                    holder: Holder::from_stored(row.try_get::<String, _>("holder")?),
                    fence: fence(row.try_get("fence")?),
                    remaining: remaining(row.try_get("remaining_us")?),
                    reason: String::new(),
                })
            })
            .collect::<Result<Vec<_>, sqlx::Error>>()
            .map_err(|e| sql_error(e, &what(), &self.db.server))
    }

    async fn list_permits(&self, prefix: &str, limit: usize) -> Result<Vec<PermitInfo>> {
        let what = || format!("permits of {prefix}*");
        let rows = self
            .list_by_prefix(what, [LIST, LIST_FROM], prefix, limit)
            .await?;
        rows.iter()
            .map(|row| {
                let key: String = row.try_get("key")?;
                let permits: i32 = row.try_get("permits")?;
                Ok(PermitInfo {
                    grant: HolderInfo {
                        key: StoreKey::from_stored(key),
                        holder: Holder::from_stored(row.try_get::<String, _>("holder")?),
                        fence: fence(row.try_get("fence")?),
                        remaining: remaining(row.try_get("remaining_us")?),
                        reason: String::new(),
                    },
                    // 0: granted by a baton that did not record N.
                    permits: u32::try_from(permits).ok().filter(|n| *n > 0),
                })
            })
            .collect::<Result<Vec<_>, sqlx::Error>>()
            .map_err(|e| sql_error(e, &what(), &self.db.server))
    }

    fn permit_wakeups(&self) -> Wakeups {
        self.wakeups()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statements_take_values_only_as_parameters() {
        for text in [CLAIM, RENEW, RELEASE, LIVE, LIST, LIST_FROM, OBJECTS_EXIST] {
            assert!(!text.contains("{}"));
        }
        assert!(CLAIM_FUNCTION.contains("clock_timestamp()"));
        assert!(RELEASE_FUNCTION.contains("clock_timestamp()"));
        assert!(!RELEASE_FUNCTION.contains("now()"));
        assert!(
            !CLAIM_FUNCTION.contains("now()"),
            "now() is frozen per transaction"
        );
    }
}
