//! [`ScheduleStore`] for [`PostgresStore`]: schedules as rows of `baton_work_schedule`, each
//! tick claimed by one conditional `UPDATE` on the server's clock (see [`sql`]).

use async_trait::async_trait;
use baton_core::work::store::{Advance, ScheduleRow, ScheduleStore, TickClaim};
use baton_core::{Error, Holder, Result, StoreKey};
use sqlx::Row;
use sqlx::postgres::PgRow;

use super::{count, sql};
use crate::locks::PostgresStore;
use baton_core::work::store::NewSchedule;

/// How often a register is run again when the row it conflicted with was committed after
/// its statement's snapshot (each rerun needs another replica to insert the row during it).
const MAX_RERUNS: usize = 16;

fn schedule_row(row: &PgRow) -> Result<ScheduleRow, sqlx::Error> {
    let last_holder: Option<String> = row.try_get("last_holder")?;
    let last_run_ms: Option<i64> = row.try_get("last_run_ms")?;
    Ok(ScheduleRow {
        name: StoreKey::from_stored(row.try_get("name")?),
        spec: row.try_get("spec")?,
        due_at_ms: row.try_get("due_at_ms")?,
        runs: count(row.try_get("runs")?, "a schedule's run count")?,
        last_run: last_holder
            .zip(last_run_ms)
            .map(|(holder, at)| (Holder::from_stored(holder), at)),
    })
}

#[async_trait]
impl ScheduleStore for PostgresStore {
    async fn now_ms(&self) -> Result<i64> {
        self.db
            .call(
                || "reading the server clock".to_owned(),
                || sqlx::query_scalar(sql::NOW_MS).fetch_one(self.db.exec()),
                |_| true,
            )
            .await
    }

    async fn register_schedule(&self, schedule: NewSchedule<'_>) -> Result<ScheduleRow> {
        let (name, spec, first_due_ms) = (schedule.name, schedule.spec, schedule.first_due_ms);
        let what = || format!("register of schedule {name}");
        for _ in 0..MAX_RERUNS {
            let row = self
                .db
                .call(
                    what,
                    || async {
                        let row = sqlx::query(sql::REGISTER_SCHEDULE)
                            .bind(name.as_str())
                            .bind(spec)
                            .bind(first_due_ms)
                            .fetch_optional(self.db.exec())
                            .await?;
                        row.as_ref().map(schedule_row).transpose()
                    },
                    // A register run twice answers the row as stored either way.
                    |_| true,
                )
                .await?;
            if let Some(row) = row {
                return Ok(row);
            }
        }
        Err(Error::unavailable(format!(
            "{}: {} failed: the row changed during each of {MAX_RERUNS} attempts in a row",
            self.db.server,
            what()
        )))
    }

    async fn advance_schedule(&self, name: &StoreKey, tick: TickClaim<'_>) -> Result<Advance> {
        let (expected_due_ms, next_due_ms) = (tick.expected_due_ms, tick.next_due_ms);
        let (holder, ran) = (tick.holder, tick.ran);
        self.db
            .call(
                || format!("advance of schedule {name}"),
                || async {
                    let changed = sqlx::query(sql::ADVANCE_SCHEDULE)
                        .bind(name.as_str())
                        .bind(expected_due_ms)
                        .bind(next_due_ms)
                        .bind(holder.as_str())
                        .bind(ran)
                        .execute(self.db.exec())
                        .await?
                        .rows_affected();
                    Ok(if changed == 1 {
                        Advance::Claimed
                    } else {
                        Advance::Lost
                    })
                },
                // A first run that claimed the tick makes the second lose it.
                |advance| *advance == Advance::Claimed,
            )
            .await
    }

    async fn schedule(&self, name: &StoreKey) -> Result<Option<ScheduleRow>> {
        let what = || format!("read of schedule {name}");
        self.db
            .call(
                what,
                || async {
                    let row = sqlx::query(sql::SCHEDULE)
                        .bind(name.as_str())
                        .fetch_optional(self.db.exec())
                        .await?;
                    row.as_ref().map(schedule_row).transpose()
                },
                |_| true,
            )
            .await
    }

    async fn schedules(&self, prefix: &str) -> Result<Vec<ScheduleRow>> {
        self.db
            .by_prefix(
                || format!("list of schedules {prefix}*"),
                sql::SCHEDULES,
                prefix,
                schedule_row,
            )
            .await
    }

    async fn remove_schedule(&self, name: &StoreKey) -> Result<bool> {
        self.db
            .call(
                || format!("removal of schedule {name}"),
                || async {
                    Ok(sqlx::query(sql::REMOVE_SCHEDULE)
                        .bind(name.as_str())
                        .execute(self.db.exec())
                        .await?
                        .rows_affected()
                        == 1)
                },
                // A first run that removed it makes the second find nothing.
                |removed| *removed,
            )
            .await
    }
}
