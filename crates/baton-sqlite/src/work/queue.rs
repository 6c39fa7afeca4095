//! The queue atoms ([`QueueStore`]) over `baton_work_item` and `baton_work_dedup`.

use std::ops::Range;
use std::time::Duration;

use async_trait::async_trait;
use baton_core::store::Renewal;
use baton_core::work::QueueStore;
use baton_core::work::store::{
    ClaimRequest, ClaimedItem, DeadItem, Enqueued, FailPlan, ItemId, ItemRef, NewItem, QueueStats,
    Settle,
};
use baton_core::{Error, Result, StoreKey, Ttl};
use rusqlite::{Connection, OptionalExtension, params};

use super::{ceil_ms, lease_ns, sql, stored_u32, stored_u64, upper_bound_value, wall_ms};
use crate::clock;
use crate::connection::Role;
use crate::error::OpError;
use crate::locks::SqliteStore;
use crate::schema::immediate;

/// Expired de-duplication rows every enqueue deletes, besides one per id in its batch.
const PURGE_PER_ENQUEUE: i64 = 64;

/// An enqueue batch, owned for the blocking thread: the payloads in one buffer (one copy,
/// one allocation, however many items).
struct Batch {
    payloads: Vec<u8>,
    items: Vec<Owned>,
}

/// One item of a [`Batch`].
struct Owned {
    /// Where its payload lies in [`Batch::payloads`].
    payload: Range<usize>,
    dedup: Option<(String, i64)>,
    delay_ms: i64,
    max_attempts: u32,
}

impl Batch {
    fn new(items: &[NewItem<'_>]) -> Batch {
        let mut payloads = Vec::with_capacity(items.iter().map(|i| i.payload.len()).sum());
        let items = items
            .iter()
            .map(|item| {
                let start = payloads.len();
                payloads.extend_from_slice(item.payload);
                Owned {
                    payload: start..payloads.len(),
                    dedup: item
                        .dedup
                        .map(|(id, window)| (id.to_owned(), ceil_ms(window.get()))),
                    delay_ms: ceil_ms(item.delay),
                    max_attempts: item.max_attempts,
                }
            })
            .collect();
        Batch { payloads, items }
    }
}

fn enqueue(conn: &Connection, queue: &str, batch: &Batch) -> Result<Vec<Enqueued>, OpError> {
    immediate(conn, |conn| {
        let wall = wall_ms();
        let dedups = batch.items.iter().filter(|i| i.dedup.is_some()).count() as i64;
        conn.prepare_cached(sql::PURGE_DEDUP)?
            .execute(params![wall, PURGE_PER_ENQUEUE + dedups])?;
        let mut insert = conn.prepare_cached(sql::INSERT_ITEM)?;
        let mut answers = Vec::with_capacity(batch.items.len());
        for item in &batch.items {
            let dedup_id = item.dedup.as_ref().map(|(id, _)| id.as_str());
            if let Some(id) = dedup_id {
                let live: Option<i64> = conn
                    .prepare_cached(sql::LIVE_DEDUP)?
                    .query_row(params![queue, id, wall], |r| r.get(0))
                    .optional()?;
                if let Some(holder) = live {
                    answers.push(Enqueued::Duplicate(ItemId(holder)));
                    continue;
                }
            }
            let run_at = wall.saturating_add(item.delay_ms);
            let payload = &batch.payloads[item.payload.clone()];
            let added: i64 = insert.query_row(
                params![queue, run_at, payload, dedup_id, item.max_attempts],
                |r| r.get(0),
            )?;
            if let Some((id, window_ms)) = &item.dedup {
                let remembered = conn
                    .prepare_cached(sql::REMEMBER_DEDUP)?
                    .execute(params![queue, id, added, wall, window_ms])?;
                if remembered != 1 {
                    return Err(OpError::Corrupt(format!(
                        "the de-duplication id {id:?} of {queue:?} is neither free nor live"
                    )));
                }
            }
            answers.push(Enqueued::Added(ItemId(added)));
        }
        Ok(answers)
    })
}

fn claim(
    conn: &Connection,
    queue: &str,
    token: &str,
    lease: i64,
    batch: u32,
) -> Result<Vec<ClaimedItem>, OpError> {
    // Outside the transaction: an empty queue costs no write lock.
    let any: bool = conn
        .prepare_cached(sql::PEEK)?
        .query_row(params![queue, wall_ms(), clock::now()], |r| r.get(0))?;
    if !any {
        return Ok(Vec::new());
    }
    let mut claimed = immediate(conn, |conn| {
        let (wall, mono) = (wall_ms(), clock::now());
        let mut stmt = conn.prepare_cached(sql::CLAIM)?;
        let rows = stmt.query_map(params![queue, wall, mono, token, lease, batch], |r| {
            Ok((
                r.get::<_, i64>(1)?,
                r.get::<_, i64>(0)?,
                r.get::<_, Vec<u8>>(2)?,
                r.get::<_, i64>(3)?,
                r.get::<_, i64>(4)?,
                r.get::<_, Option<String>>(5)?,
                r.get::<_, String>(6)?,
            ))
        })?;
        Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
    })?;
    // RETURNING answers in no particular order: hand them out oldest first.
    claimed.sort_unstable_by_key(|(run_at, id, ..)| (*run_at, *id));
    claimed
        .into_iter()
        .map(
            |(_, id, payload, attempt, max_attempts, dedup_id, last_error)| {
                Ok(ClaimedItem {
                    id: ItemId(id),
                    payload,
                    attempt: stored_u32("attempt count", attempt)?,
                    max_attempts: stored_u32("max_attempts", max_attempts)?,
                    dedup_id,
                    last_error,
                })
            },
        )
        .collect()
}

/// Runs one owner-checked statement in a write transaction (the clocks it reads are read
/// inside it); one changed row means the caller owned the item.
fn owned_change(
    conn: &Connection,
    statement: impl FnOnce(&Connection) -> rusqlite::Result<usize>,
) -> Result<bool, OpError> {
    immediate(conn, |conn| Ok(statement(conn)? == 1))
}

fn settle(owned: bool) -> Settle {
    if owned {
        Settle::Settled
    } else {
        Settle::NotOwner
    }
}

fn stats(conn: &Connection, prefix: &str) -> Result<Vec<QueueStats>, OpError> {
    let (wall, mono) = (wall_ms(), clock::now());
    let mut stmt = conn.prepare_cached(sql::STATS)?;
    let rows = stmt.query_map(
        params![prefix, upper_bound_value(prefix), wall, mono],
        |r| {
            Ok((
                r.get::<_, String>(0)?,
                [
                    r.get::<_, i64>(1)?,
                    r.get::<_, i64>(2)?,
                    r.get::<_, i64>(3)?,
                    r.get::<_, i64>(4)?,
                    r.get::<_, i64>(5)?,
                ],
                r.get::<_, Option<i64>>(6)?,
                r.get::<_, Option<i64>>(7)?,
            ))
        },
    )?;
    let mut out = Vec::new();
    for row in rows {
        let (queue, [ready, scheduled, running, expired, dead], due_ms, lapsed_ns) = row?;
        let due = due_ms.map(|ms| Duration::from_millis(ms.max(0) as u64));
        let lapsed = lapsed_ns.map(|ns| Duration::from_nanos(ns.max(0) as u64));
        out.push(QueueStats {
            key: StoreKey::from_stored(queue),
            ready: stored_u64("ready count", ready)?,
            scheduled: stored_u64("scheduled count", scheduled)?,
            running: stored_u64("running count", running)?,
            expired: stored_u64("expired count", expired)?,
            dead: stored_u64("dead count", dead)?,
            oldest_due: due.max(lapsed),
        });
    }
    Ok(out)
}

fn dead_letters(conn: &Connection, queue: &str, limit: u32) -> Result<Vec<DeadItem>, OpError> {
    let mut stmt = conn.prepare_cached(sql::DEAD_LETTERS)?;
    let rows = stmt.query_map(params![queue, limit], |r| {
        Ok((
            r.get::<_, i64>(0)?,
            r.get::<_, Vec<u8>>(1)?,
            r.get::<_, i64>(2)?,
            r.get::<_, Option<String>>(3)?,
            r.get::<_, String>(4)?,
        ))
    })?;
    rows.map(|row| {
        let (id, payload, attempts, dedup_id, error) = row?;
        Ok(DeadItem {
            id: ItemId(id),
            payload,
            attempts: stored_u32("attempt count", attempts)?,
            dedup_id,
            error,
        })
    })
    .collect()
}

#[async_trait]
impl QueueStore for SqliteStore {
    async fn enqueue(&self, queue: &StoreKey, items: &[NewItem<'_>]) -> Result<Vec<Enqueued>> {
        if items.is_empty() {
            return Ok(Vec::new());
        }
        let (queue, batch) = (queue.clone(), Batch::new(items));
        self.database()
            .run(Role::Write, "enqueue", move |conn, _| {
                enqueue(conn, queue.as_str(), &batch)
            })
            .await
    }

    async fn claim(&self, queue: &StoreKey, request: ClaimRequest<'_>) -> Result<Vec<ClaimedItem>> {
        if request.batch == 0 {
            return Err(Error::invalid_input("a claim takes at least one item"));
        }
        let (queue, token) = (queue.clone(), request.token.clone());
        let (lease, batch) = (lease_ns(request.lease), request.batch);
        self.database()
            .run(Role::Write, "claim", move |conn, _| {
                claim(conn, queue.as_str(), token.as_str(), lease, batch)
            })
            .await
    }

    async fn complete(&self, item: ItemRef<'_>) -> Result<Settle> {
        let (queue, id, token) = (item.queue, item.id, item.token);
        let (queue, token) = (queue.clone(), token.clone());
        self.database()
            .run(Role::Write, "complete", move |conn, _| {
                owned_change(conn, |conn| {
                    conn.prepare_cached(sql::COMPLETE)?.execute(params![
                        id.0,
                        queue.as_str(),
                        token.as_str()
                    ])
                })
                .map(settle)
            })
            .await
    }

    async fn fail(&self, item: ItemRef<'_>, plan: FailPlan, error: &str) -> Result<Settle> {
        let (queue, id, token) = (item.queue, item.id, item.token);
        let (queue, token, error) = (queue.clone(), token.clone(), error.to_owned());
        self.database()
            .run(Role::Write, "fail", move |conn, _| {
                let (queue, token) = (queue.as_str(), token.as_str());
                owned_change(conn, |conn| match plan {
                    FailPlan::Retry { after } => conn.prepare_cached(sql::RETRY)?.execute(params![
                        id.0,
                        queue,
                        token,
                        wall_ms().saturating_add(ceil_ms(after)),
                        error
                    ]),
                    FailPlan::DeadLetter => conn
                        .prepare_cached(sql::DEAD_LETTER)?
                        .execute(params![id.0, queue, token, error]),
                })
                .map(settle)
            })
            .await
    }

    async fn extend(&self, item: ItemRef<'_>, lease: Ttl) -> Result<Renewal> {
        let (queue, id, token) = (item.queue, item.id, item.token);
        let (queue, token) = (queue.clone(), token.clone());
        self.database()
            .run(Role::Write, "extend", move |conn, _| {
                let extended = owned_change(conn, |conn| {
                    conn.prepare_cached(sql::EXTEND)?.execute(params![
                        id.0,
                        queue.as_str(),
                        token.as_str(),
                        clock::now(),
                        lease_ns(lease)
                    ])
                })?;
                Ok(if extended {
                    Renewal::Renewed
                } else {
                    Renewal::NotHeld
                })
            })
            .await
    }

    async fn release(&self, item: ItemRef<'_>) -> Result<Settle> {
        let (queue, id, token) = (item.queue, item.id, item.token);
        let (queue, token) = (queue.clone(), token.clone());
        self.database()
            .run(Role::Write, "release", move |conn, _| {
                owned_change(conn, |conn| {
                    conn.prepare_cached(sql::RELEASE)?.execute(params![
                        id.0,
                        queue.as_str(),
                        token.as_str(),
                        wall_ms()
                    ])
                })
                .map(settle)
            })
            .await
    }

    async fn stats(&self, prefix: &str) -> Result<Vec<QueueStats>> {
        let prefix = prefix.to_owned();
        self.database()
            .run(Role::Read, "queue stats", move |conn, _| {
                stats(conn, &prefix)
            })
            .await
    }

    async fn dead_letters(&self, queue: &StoreKey, limit: u32) -> Result<Vec<DeadItem>> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let queue = queue.clone();
        self.database()
            .run(Role::Read, "listing dead letters", move |conn, _| {
                dead_letters(conn, queue.as_str(), limit)
            })
            .await
    }
}
