//! The migration-record atoms ([`MigrationStore`]) over `baton_work_migration`. Leases are
//! on the host's monotonic clock, like the lock store's grants (see [`crate::clock`]).

use std::time::Duration;

use async_trait::async_trait;
use baton_core::store::Renewal;
use baton_core::work::MigrationStore;
use baton_core::work::store::{
    MigrationClaim, MigrationEnd, MigrationRecord, MigrationState, Settle, Writer,
};
use baton_core::{Holder, Result, StoreKey, Ttl};
use rusqlite::{Connection, OptionalExtension, params};

use super::{lease_ns, sql, stored_u32};
use crate::clock;
use crate::connection::Role;
use crate::error::OpError;
use crate::locks::SqliteStore;
use crate::schema::immediate;

fn state(text: &str) -> Result<MigrationState, OpError> {
    MigrationState::parse(text)
        .ok_or_else(|| OpError::Corrupt(format!("a migration record has state {text:?}")))
}

fn remaining(lease_until: i64, now: i64) -> Duration {
    Duration::from_nanos(lease_until.saturating_sub(now).max(0) as u64)
}

fn claim(
    conn: &Connection,
    set: &str,
    name: &str,
    writer: &str,
    lease: i64,
) -> Result<MigrationClaim, OpError> {
    immediate(conn, |conn| {
        let now = clock::now();
        let current = conn
            .prepare_cached(sql::MIGRATION)?
            .query_row(params![set, name], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, i64>(2)?,
                ))
            })
            .optional()?;
        let Some((stored, owner, lease_until)) = current else {
            conn.prepare_cached(sql::INSERT_MIGRATION)?
                .execute(params![set, name, writer, now, lease])?;
            return Ok(MigrationClaim::Claimed {
                attempt: 1,
                previous: None,
            });
        };
        let previous = state(&stored)?;
        match previous {
            MigrationState::Completed => return Ok(MigrationClaim::Completed),
            // Another writer's live claim; the writer's own is taken over.
            MigrationState::Pending if lease_until > now && owner != writer => {
                return Ok(MigrationClaim::Busy {
                    by: Holder::from_stored(owner),
                    remaining: remaining(lease_until, now),
                });
            }
            _ => {}
        }
        let attempt: i64 = conn
            .prepare_cached(sql::TAKE_MIGRATION)?
            .query_row(params![set, name, writer, now, lease], |r| r.get(0))
            .optional()?
            .ok_or_else(|| {
                OpError::Corrupt(format!(
                    "the migration record {name:?} of {set:?} changed inside a transaction"
                ))
            })?;
        Ok(MigrationClaim::Claimed {
            attempt: stored_u32("migration attempt", attempt)?,
            previous: Some(previous),
        })
    })
}

fn records(conn: &Connection, set: &str) -> Result<Vec<MigrationRecord>, OpError> {
    let now = clock::now();
    let mut stmt = conn.prepare_cached(sql::MIGRATIONS)?;
    let rows = stmt.query_map([set], |r| {
        Ok((
            r.get::<_, String>(0)?,
            r.get::<_, String>(1)?,
            r.get::<_, String>(2)?,
            r.get::<_, i64>(3)?,
            r.get::<_, i64>(4)?,
            r.get::<_, String>(5)?,
        ))
    })?;
    rows.map(|row| {
        let (name, stored, claimed_by, attempt, lease_until, error) = row?;
        let state = state(&stored)?;
        Ok(MigrationRecord {
            name,
            state,
            claimed_by: Holder::from_stored(claimed_by),
            attempt: stored_u32("migration attempt", attempt)?,
            lease_remaining: if state == MigrationState::Pending {
                remaining(lease_until, now)
            } else {
                Duration::ZERO
            },
            error,
        })
    })
    .collect()
}

#[async_trait]
impl MigrationStore for SqliteStore {
    async fn claim_migration(&self, writer: Writer<'_>, lease: Ttl) -> Result<MigrationClaim> {
        let (set, name, writer) = (writer.set, writer.name, writer.token);
        let (set, name, writer) = (set.clone(), name.to_owned(), writer.clone());
        self.database()
            .run(Role::Write, "claiming a migration", move |conn, _| {
                claim(conn, set.as_str(), &name, writer.as_str(), lease_ns(lease))
            })
            .await
    }

    async fn heartbeat_migration(&self, writer: Writer<'_>, lease: Ttl) -> Result<Renewal> {
        let (set, name, writer) = (writer.set, writer.name, writer.token);
        let (set, name, writer) = (set.clone(), name.to_owned(), writer.clone());
        self.database()
            .run(Role::Write, "migration heartbeat", move |conn, _| {
                let renewed = immediate(conn, |conn| {
                    Ok(conn
                        .prepare_cached(sql::HEARTBEAT_MIGRATION)?
                        .execute(params![
                            set.as_str(),
                            name,
                            writer.as_str(),
                            clock::now(),
                            lease_ns(lease)
                        ])?
                        == 1)
                })?;
                Ok(if renewed {
                    Renewal::Renewed
                } else {
                    Renewal::NotHeld
                })
            })
            .await
    }

    async fn finish_migration(&self, writer: Writer<'_>, end: MigrationEnd<'_>) -> Result<Settle> {
        let (set, name, writer) = (writer.set, writer.name, writer.token);
        let (state, error) = (end.state(), end.error());
        let (set, name, writer, error) = (
            set.clone(),
            name.to_owned(),
            writer.clone(),
            error.to_owned(),
        );
        self.database()
            .run(Role::Write, "finishing a migration", move |conn, _| {
                let finished = immediate(conn, |conn| {
                    Ok(conn
                        .prepare_cached(sql::FINISH_MIGRATION)?
                        .execute(params![
                            set.as_str(),
                            name,
                            writer.as_str(),
                            state.as_str(),
                            error,
                            clock::now()
                        ])?
                        == 1)
                })?;
                Ok(if finished {
                    Settle::Settled
                } else {
                    Settle::NotOwner
                })
            })
            .await
    }

    async fn migrations(&self, set: &StoreKey) -> Result<Vec<MigrationRecord>> {
        let set = set.clone();
        self.database()
            .run(Role::Read, "listing migrations", move |conn, _| {
                records(conn, set.as_str())
            })
            .await
    }
}
