//! The schedule atoms ([`ScheduleStore`]) over `baton_work_schedule`. Every time here is the
//! host's wall clock in unix milliseconds ([`wall_ms`]).

use async_trait::async_trait;
use baton_core::work::ScheduleStore;
use baton_core::work::store::{Advance, ScheduleRow, TickClaim};
use baton_core::{Holder, Result, StoreKey};
use rusqlite::{Connection, OptionalExtension, Row, params};

use super::{sql, stored_u64, upper_bound_value, wall_ms};
use crate::connection::Role;
use crate::error::OpError;
use crate::locks::SqliteStore;
use crate::schema::immediate;
use baton_core::work::store::NewSchedule;

/// A row's columns as [`sql::SCHEDULE`] and [`sql::SCHEDULES`] read them.
struct Stored {
    name: String,
    spec: String,
    due_at_ms: i64,
    runs: i64,
    last_holder: Option<String>,
    last_run_ms: Option<i64>,
}

impl Stored {
    fn read(row: &Row<'_>) -> rusqlite::Result<Self> {
        Ok(Stored {
            name: row.get(0)?,
            spec: row.get(1)?,
            due_at_ms: row.get(2)?,
            runs: row.get(3)?,
            last_holder: row.get(4)?,
            last_run_ms: row.get(5)?,
        })
    }

    fn into_row(self) -> Result<ScheduleRow, OpError> {
        Ok(ScheduleRow {
            name: StoreKey::from_stored(self.name),
            spec: self.spec,
            due_at_ms: self.due_at_ms,
            runs: stored_u64("run count", self.runs)?,
            last_run: match (self.last_holder, self.last_run_ms) {
                (Some(holder), Some(at)) => Some((Holder::from_stored(holder), at)),
                _ => None,
            },
        })
    }
}

fn read_one(conn: &Connection, name: &str) -> Result<Option<ScheduleRow>, OpError> {
    conn.prepare_cached(sql::SCHEDULE)?
        .query_row([name], Stored::read)
        .optional()?
        .map(Stored::into_row)
        .transpose()
}

#[async_trait]
impl ScheduleStore for SqliteStore {
    async fn now_ms(&self) -> Result<i64> {
        // The store's clock is this host's: no need to ask the file.
        Ok(wall_ms())
    }

    async fn register_schedule(&self, schedule: NewSchedule<'_>) -> Result<ScheduleRow> {
        let (name, spec, first_due_ms) = (schedule.name, schedule.spec, schedule.first_due_ms);
        let (name, spec) = (name.clone(), spec.to_owned());
        self.database()
            .run(Role::Write, "registering a schedule", move |conn, _| {
                immediate(conn, |conn| {
                    conn.prepare_cached(sql::REGISTER_SCHEDULE)?
                        .execute(params![name.as_str(), spec, first_due_ms])?;
                    read_one(conn, name.as_str())?.ok_or_else(|| {
                        OpError::Corrupt(format!("the schedule {name:?} vanished while registered"))
                    })
                })
            })
            .await
    }

    async fn advance_schedule(&self, name: &StoreKey, tick: TickClaim<'_>) -> Result<Advance> {
        let (expected_due_ms, next_due_ms) = (tick.expected_due_ms, tick.next_due_ms);
        let (holder, ran) = (tick.holder, tick.ran);
        let (name, holder) = (name.clone(), holder.clone());
        self.database()
            .run(Role::Write, "advancing a schedule", move |conn, _| {
                let advanced = immediate(conn, |conn| {
                    Ok(conn
                        .prepare_cached(sql::ADVANCE_SCHEDULE)?
                        .execute(params![
                            name.as_str(),
                            expected_due_ms,
                            next_due_ms,
                            holder.as_str(),
                            i64::from(ran),
                            wall_ms()
                        ])?
                        == 1)
                })?;
                Ok(if advanced {
                    Advance::Claimed
                } else {
                    Advance::Lost
                })
            })
            .await
    }

    async fn schedule(&self, name: &StoreKey) -> Result<Option<ScheduleRow>> {
        let name = name.clone();
        self.database()
            .run(Role::Read, "reading a schedule", move |conn, _| {
                read_one(conn, name.as_str())
            })
            .await
    }

    async fn schedules(&self, prefix: &str) -> Result<Vec<ScheduleRow>> {
        let prefix = prefix.to_owned();
        self.database()
            .run(Role::Read, "listing schedules", move |conn, _| {
                let mut stmt = conn.prepare_cached(sql::SCHEDULES)?;
                let rows =
                    stmt.query_map(params![prefix, upper_bound_value(&prefix)], Stored::read)?;
                rows.map(|row| row?.into_row()).collect()
            })
            .await
    }

    async fn remove_schedule(&self, name: &StoreKey) -> Result<bool> {
        let name = name.clone();
        self.database()
            .run(Role::Write, "removing a schedule", move |conn, _| {
                immediate(conn, |conn| {
                    Ok(conn
                        .prepare_cached(sql::REMOVE_SCHEDULE)?
                        .execute([name.as_str()])?
                        == 1)
                })
            })
            .await
    }
}
