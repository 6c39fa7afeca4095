//! [`MigrationStore`] for [`PostgresStore`]: migration records as rows of
//! `baton_work_migration`, claimed by one `INSERT ... ON CONFLICT DO UPDATE ... WHERE` (see
//! [`sql`]).

use async_trait::async_trait;
use baton_core::store::Renewal;
use baton_core::work::store::{
    MigrationClaim, MigrationEnd, MigrationRecord, MigrationState, MigrationStore, Settle, Writer,
};
use baton_core::{Error, Holder, Result, StoreKey, Ttl};
use sqlx::Row;
use sqlx::postgres::PgRow;

use super::{corrupt, from_micros, sql, ttl_ms};
use crate::error::sql_error;
use crate::locks::PostgresStore;

/// How often a claim is run again when the record changed between its two statements (it
/// was taken over, or finished, in between; each rerun needs that to happen again).
const MAX_RERUNS: usize = 16;

fn state_of(text: &str) -> Result<MigrationState, sqlx::Error> {
    MigrationState::parse(text)
        .ok_or_else(|| corrupt(format!("a migration record has state {text:?}")))
}

fn attempt_of(row: &PgRow) -> Result<u32, sqlx::Error> {
    let raw: i32 = row.try_get("attempt")?;
    u32::try_from(raw)
        .ok()
        .filter(|a| *a >= 1)
        .ok_or_else(|| corrupt(format!("a migration record has attempt {raw}")))
}

fn record(row: &PgRow) -> Result<MigrationRecord, sqlx::Error> {
    let state = state_of(&row.try_get::<String, _>("state")?)?;
    Ok(MigrationRecord {
        name: row.try_get("name")?,
        state,
        claimed_by: Holder::from_stored(row.try_get("claimed_by")?),
        attempt: attempt_of(row)?,
        lease_remaining: if state == MigrationState::Pending {
            from_micros(row.try_get("remaining_us")?)
        } else {
            Default::default()
        },
        error: row.try_get("error")?,
    })
}

/// What [`sql::MIGRATION`] found after a claim that changed nothing.
enum Found {
    Answer(MigrationClaim),
    /// The record changed since the claim ran (or vanished): run the claim again.
    Changed,
}

impl PostgresStore {
    /// [`sql::CLAIM_MIGRATION`]: `Some` when `writer` owns the record now.
    async fn try_claim_migration(
        &self,
        set: &StoreKey,
        name: &str,
        writer: &Holder,
        lease: Ttl,
    ) -> Result<Option<MigrationClaim>> {
        self.db
            .call(
                || format!("claim of migration {name} of {set}"),
                || async {
                    let row = sqlx::query(sql::CLAIM_MIGRATION)
                        .bind(set.as_str())
                        .bind(name)
                        .bind(writer.as_str())
                        .bind(ttl_ms(lease))
                        .fetch_optional(self.db.exec())
                        .await?;
                    row.map(|row| -> Result<_, sqlx::Error> {
                        let previous = row
                            .try_get::<Option<String>, _>("previous")?
                            .map(|p| state_of(&p))
                            .transpose()?;
                        Ok(MigrationClaim::Claimed {
                            attempt: attempt_of(&row)?,
                            previous,
                        })
                    })
                    .transpose()
                },
                // A first run that claimed leaves the writer's own claim, which the second
                // takes over (attempt + 1, previous pending: at least once), so a second
                // run that claims nothing is right too: the record is completed or another
                // writer's.
                |_| true,
            )
            .await
    }

    /// Reads the record a claim left alone: completed, or another writer's live claim.
    async fn migration_after_claim(
        &self,
        set: &StoreKey,
        name: &str,
        writer: &Holder,
    ) -> Result<Found> {
        self.db
            .call(
                || format!("read of migration {name} of {set}"),
                || async {
                    let Some(row) = sqlx::query(sql::MIGRATION)
                        .bind(set.as_str())
                        .bind(name)
                        .fetch_optional(self.db.exec())
                        .await?
                    else {
                        return Ok(Found::Changed);
                    };
                    let state = state_of(&row.try_get::<String, _>("state")?)?;
                    let by: String = row.try_get("claimed_by")?;
                    let remaining = from_micros(row.try_get("remaining_us")?);
                    Ok(match state {
                        MigrationState::Completed => Found::Answer(MigrationClaim::Completed),
                        // Another writer's live claim. The writer's own (made since the
                        // claim ran) is not busy: the claim takes it over when run again.
                        MigrationState::Pending
                            if !remaining.is_zero() && by != writer.as_str() =>
                        {
                            Found::Answer(MigrationClaim::Busy {
                                by: Holder::from_stored(by),
                                remaining,
                            })
                        }
                        // Failed, rolled back or lapsed since the claim ran: claim again.
                        _ => Found::Changed,
                    })
                },
                |_| true,
            )
            .await
    }
}

#[async_trait]
impl MigrationStore for PostgresStore {
    async fn claim_migration(&self, writer: Writer<'_>, lease: Ttl) -> Result<MigrationClaim> {
        let (set, name, writer) = (writer.set, writer.name, writer.token);
        for _ in 0..MAX_RERUNS {
            if let Some(claim) = self.try_claim_migration(set, name, writer, lease).await? {
                return Ok(claim);
            }
            if let Found::Answer(answer) = self.migration_after_claim(set, name, writer).await? {
                return Ok(answer);
            }
        }
        Err(Error::unavailable(format!(
            "{}: claim of migration {name} of {set} failed: the record changed during each of {MAX_RERUNS} attempts in a row",
            self.db.server
        )))
    }

    async fn heartbeat_migration(&self, writer: Writer<'_>, lease: Ttl) -> Result<Renewal> {
        let (set, name, writer) = (writer.set, writer.name, writer.token);
        self.db
            .renew(
                || format!("heartbeat of migration {name} of {set}"),
                || {
                    sqlx::query(sql::HEARTBEAT_MIGRATION)
                        .bind(set.as_str())
                        .bind(name)
                        .bind(writer.as_str())
                        .bind(ttl_ms(lease))
                },
            )
            .await
    }

    async fn finish_migration(&self, writer: Writer<'_>, end: MigrationEnd<'_>) -> Result<Settle> {
        let (set, name, writer) = (writer.set, writer.name, writer.token);
        let (state, error) = (end.state(), end.error());
        self.db
            .call(
                || format!("finish of migration {name} of {set}"),
                || async {
                    let changed = sqlx::query(sql::FINISH_MIGRATION)
                        .bind(set.as_str())
                        .bind(name)
                        .bind(writer.as_str())
                        .bind(state.as_str())
                        .bind(error)
                        .execute(self.db.exec())
                        .await?
                        .rows_affected();
                    Ok(if changed == 1 {
                        Settle::Settled
                    } else {
                        Settle::NotOwner
                    })
                },
                // A first run that finished it makes the second find nothing pending.
                |settled| *settled == Settle::Settled,
            )
            .await
    }

    async fn migrations(&self, set: &StoreKey) -> Result<Vec<MigrationRecord>> {
        let what = || format!("list of migrations of {set}");
        let rows = self
            .db
            .call(
                what,
                || {
                    sqlx::query(sql::MIGRATIONS_OF)
                        .bind(set.as_str())
                        .fetch_all(self.db.exec())
                },
                |_| true,
            )
            .await?;
        rows.iter()
            .map(record)
            .collect::<Result<_, _>>()
            .map_err(|e| sql_error(e, &what(), &self.db.server))
    }
}
