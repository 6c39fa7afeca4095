//! [`QueueStore`] for [`PostgresStore`]: items as rows of `baton_work_item`, claimed with
//! `FOR UPDATE SKIP LOCKED` (see [`sql`] for every statement).

use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;
use baton_core::store::Renewal;
use baton_core::work::store::{
    ClaimRequest, ClaimedItem, DeadItem, Enqueued, FailPlan, ItemId, ItemRef, NewItem, QueueStats,
    QueueStore, Settle,
};
use baton_core::{Result, StoreKey, Ttl};
use sqlx::postgres::{PgArguments, PgRow};
use sqlx::query::Query;
use sqlx::{Postgres, Row};

use super::{corrupt, count, from_micros, micros, sql, ttl_ms};
use crate::error::unexpected;
use crate::locks::PostgresStore;

/// How many enqueues (per process) pass between sweeps of expired de-duplication rows.
const SWEEP_EVERY: u64 = 128;
static ENQUEUES: AtomicU64 = AtomicU64::new(0);

/// The answer of a statement that changes at most one row: settled when it did.
fn settle(changed: u64) -> Settle {
    if changed == 1 {
        Settle::Settled
    } else {
        Settle::NotOwner
    }
}

/// A stored attempt count as the API's `u32` (the statements keep it within 0..=i32::MAX).
fn attempts(row: &PgRow, column: &str) -> Result<u32, sqlx::Error> {
    let raw: i32 = row.try_get(column)?;
    u32::try_from(raw).map_err(|_| corrupt(format!("an item has {column} = {raw}")))
}

fn claimed_item(row: &PgRow) -> Result<ClaimedItem, sqlx::Error> {
    let attempt = attempts(row, "attempts")?;
    if attempt == 0 {
        return Err(corrupt("a claimed item has attempt 0".into()));
    }
    Ok(ClaimedItem {
        id: ItemId(row.try_get("id")?),
        payload: row.try_get("payload")?,
        attempt,
        max_attempts: attempts(row, "max_attempts")?,
        dedup_id: row.try_get("dedup_id")?,
        last_error: row.try_get("last_error")?,
    })
}

fn dead_item(row: &PgRow) -> Result<DeadItem, sqlx::Error> {
    Ok(DeadItem {
        id: ItemId(row.try_get("id")?),
        payload: row.try_get("payload")?,
        attempts: attempts(row, "attempts")?,
        dedup_id: row.try_get("dedup_id")?,
        error: row.try_get("last_error")?,
    })
}

fn queue_stats(row: &PgRow) -> Result<QueueStats, sqlx::Error> {
    let column = |name: &str| -> Result<u64, sqlx::Error> {
        count(
            row.try_get::<i64, _>(name)?,
            &format!("a queue's {name} count"),
        )
    };
    Ok(QueueStats {
        key: StoreKey::from_stored(row.try_get("queue")?),
        ready: column("ready")?,
        scheduled: column("scheduled")?,
        running: column("running")?,
        expired: column("expired")?,
        dead: column("dead")?,
        oldest_due: row
            .try_get::<Option<i64>, _>("oldest_due_us")?
            .map(from_micros),
    })
}

/// The batch as the parallel arrays [`sql::ENQUEUE`] takes.
struct Columns {
    payloads: Vec<Vec<u8>>,
    dedup_ids: Vec<Option<String>>,
    windows_ms: Vec<Option<i64>>,
    delays_us: Vec<i64>,
    max_attempts: Vec<i32>,
}

impl Columns {
    fn of(items: &[NewItem<'_>]) -> Columns {
        let mut columns = Columns {
            payloads: Vec::with_capacity(items.len()),
            dedup_ids: Vec::with_capacity(items.len()),
            windows_ms: Vec::with_capacity(items.len()),
            delays_us: Vec::with_capacity(items.len()),
            max_attempts: Vec::with_capacity(items.len()),
        };
        for item in items {
            columns.payloads.push(item.payload.to_vec());
            columns
                .dedup_ids
                .push(item.dedup.map(|(id, _)| id.to_owned()));
            columns
                .windows_ms
                .push(item.dedup.map(|(_, window)| ttl_ms(window)));
            columns.delays_us.push(micros(item.delay));
            columns
                .max_attempts
                .push(i32::try_from(item.max_attempts).unwrap_or(i32::MAX));
        }
        columns
    }
}

impl PostgresStore {
    /// Runs one statement that changes at most one item, and answers whether it did. A run
    /// after a broken connection is trusted only when it changed the row (a first run that
    /// committed would make it find nothing).
    async fn settle_item<'q>(
        &self,
        what: impl Fn() -> String,
        statement: impl Fn() -> Query<'q, Postgres, PgArguments>,
    ) -> Result<Settle> {
        self.db
            .call(
                what,
                || async {
                    Ok(settle(
                        statement().execute(self.db.exec()).await?.rows_affected(),
                    ))
                },
                |settled| *settled == Settle::Settled,
            )
            .await
    }
}

#[async_trait]
impl QueueStore for PostgresStore {
    async fn enqueue(&self, queue: &StoreKey, items: &[NewItem<'_>]) -> Result<Vec<Enqueued>> {
        if items.is_empty() {
            return Ok(Vec::new());
        }
        if ENQUEUES.fetch_add(1, Ordering::Relaxed) % SWEEP_EVERY == SWEEP_EVERY - 1 {
            // In the background, within the call deadline, best effort: a failed sweep
            // leaves the rows (already ignored) for the next one.
            let db = self.db.clone();
            tokio::spawn(async move {
                let _ = db
                    .call(
                        || "sweeping expired de-duplication ids".to_owned(),
                        || async {
                            sqlx::query(sql::SWEEP_DEDUP).execute(db.exec()).await?;
                            Ok(())
                        },
                        |_| true,
                    )
                    .await;
            });
        }
        let columns = Columns::of(items);
        let what = || format!("enqueue of {} items to {queue}", items.len());
        let rows = self
            .db
            .call(
                what,
                || {
                    sqlx::query(sql::ENQUEUE)
                        .bind(queue.as_str())
                        .bind(&columns.payloads)
                        .bind(&columns.dedup_ids)
                        .bind(&columns.windows_ms)
                        .bind(&columns.delays_us)
                        .bind(&columns.max_attempts)
                        .fetch_all(self.db.exec())
                },
                // At least once: see the module docs.
                |_| true,
            )
            .await?;
        if rows.len() != items.len() {
            return Err(unexpected(
                &what(),
                &self.db.server,
                format!("{} answers for {} items", rows.len(), items.len()),
            ));
        }
        rows.iter()
            .map(|row| {
                let id = ItemId(row.try_get("id")?);
                Ok(if row.try_get("added")? {
                    Enqueued::Added(id)
                } else {
                    Enqueued::Duplicate(id)
                })
            })
            .collect::<Result<_, sqlx::Error>>()
            .map_err(|e| crate::error::sql_error(e, &what(), &self.db.server))
    }

    async fn claim(&self, queue: &StoreKey, request: ClaimRequest<'_>) -> Result<Vec<ClaimedItem>> {
        let what = || format!("claim from {queue}");
        let rows = self
            .db
            .call(
                what,
                || {
                    sqlx::query(sql::CLAIM)
                        .bind(queue.as_str())
                        .bind(i64::from(request.batch))
                        .bind(request.token.as_str())
                        .bind(ttl_ms(request.lease))
                        .fetch_all(self.db.exec())
                },
                // Items taken by a lost first run come back when their lease lapses.
                |_| true,
            )
            .await?;
        rows.iter()
            .map(claimed_item)
            .collect::<Result<_, _>>()
            .map_err(|e| crate::error::sql_error(e, &what(), &self.db.server))
    }

    async fn complete(&self, item: ItemRef<'_>) -> Result<Settle> {
        let (queue, id, token) = (item.queue, item.id, item.token);
        self.settle_item(
            || format!("complete of item {id} of {queue}"),
            || {
                sqlx::query(sql::COMPLETE)
                    .bind(queue.as_str())
                    .bind(id.0)
                    .bind(token.as_str())
            },
        )
        .await
    }

    async fn fail(&self, item: ItemRef<'_>, plan: FailPlan, error: &str) -> Result<Settle> {
        let (queue, id, token) = (item.queue, item.id, item.token);
        let what = || format!("fail of item {id} of {queue}");
        match plan {
            FailPlan::Retry { after } => {
                self.settle_item(what, || {
                    sqlx::query(sql::RETRY)
                        .bind(queue.as_str())
                        .bind(id.0)
                        .bind(token.as_str())
                        .bind(micros(after))
                        .bind(error)
                })
                .await
            }
            FailPlan::DeadLetter => {
                self.settle_item(what, || {
                    sqlx::query(sql::DEAD_LETTER)
                        .bind(queue.as_str())
                        .bind(id.0)
                        .bind(token.as_str())
                        .bind(error)
                })
                .await
            }
        }
    }

    async fn extend(&self, item: ItemRef<'_>, lease: Ttl) -> Result<Renewal> {
        let (queue, id, token) = (item.queue, item.id, item.token);
        self.db
            .renew(
                || format!("extend of item {id} of {queue}"),
                || {
                    sqlx::query(sql::EXTEND)
                        .bind(queue.as_str())
                        .bind(id.0)
                        .bind(token.as_str())
                        .bind(ttl_ms(lease))
                },
            )
            .await
    }

    async fn release(&self, item: ItemRef<'_>) -> Result<Settle> {
        let (queue, id, token) = (item.queue, item.id, item.token);
        self.settle_item(
            || format!("release of item {id} of {queue}"),
            || {
                sqlx::query(sql::RELEASE)
                    .bind(queue.as_str())
                    .bind(id.0)
                    .bind(token.as_str())
            },
        )
        .await
    }

    async fn stats(&self, prefix: &str) -> Result<Vec<QueueStats>> {
        self.db
            .by_prefix(
                || format!("stats of queues {prefix}*"),
                sql::STATS,
                prefix,
                queue_stats,
            )
            .await
    }

    async fn dead_letters(&self, queue: &StoreKey, limit: u32) -> Result<Vec<DeadItem>> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let what = || format!("dead letters of {queue}");
        let rows = self
            .db
            .call(
                what,
                || {
                    sqlx::query(sql::DEAD_LETTERS)
                        .bind(queue.as_str())
                        .bind(i64::from(limit))
                        .fetch_all(self.db.exec())
                },
                |_| true,
            )
            .await?;
        rows.iter()
            .map(dead_item)
            .collect::<Result<_, _>>()
            .map_err(|e| crate::error::sql_error(e, &what(), &self.db.server))
    }
}
