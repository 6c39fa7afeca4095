//! Creating, checking and migrating the schema when a store connects.
//!
//! The common case costs two reads and no lock: the schema exists at this build's version.
//! Otherwise one transaction takes the transaction-level advisory lock
//! [`MIGRATION_LOCK`](crate::sql::MIGRATION_LOCK), looks again (another replica may have
//! finished meanwhile), and creates the schema or runs the missing migrations, recording the
//! version it reached; the commit releases the lock. So any number of replicas may start
//! against a new database at the same moment: one creates, the others wait a moment and
//! find it done. A schema from a newer baton is refused with `Internal` and left untouched;
//! so is a `baton_lease` table that no baton created.
//!
//! Every statement here runs unnamed inside that one transaction, which keeps one server
//! connection from `BEGIN` to `COMMIT`, so connecting is as safe behind a transaction pooler
//! as directly. The wait for the migration lock is bounded by `lock_timeout`, set for the
//! transaction to what is left of the connect deadline: a session that holds the lock
//! longer makes connect fail with `Unavailable` ("schema migration lock held by another
//! session") in time, and the server gives up the wait too.
//!
//! The queue of waiting stores ([`sql::WAIT_SCHEMA`]), the idempotency table
//! ([`crate::idempotency::SCHEMA`]) and the rate-limit and cache
//! objects ([`crate::limit::SCHEMA`], [`crate::limit::STEP_FUNCTION`]) are not versioned:
//! they are created if missing, in the same transaction.
//!
//! Two version tracks are kept, each in a one-row table of its own and each migrated the
//! same way, in the same transaction: the lease schema (`baton_schema`,
//! [`sql::SCHEMA_VERSION`]) and the claimable-work tables (`baton_work_schema`,
//! [`work::sql::SCHEMA_VERSION`](crate::work::sql::SCHEMA_VERSION)). The work tables came
//! later and are versioned on their own so that neither track has to move when the other
//! does; a database that has the lease schema but no work tables gets them at the next
//! connect.

use std::time::Duration;

use sqlx::{Executor, PgConnection, PgPool, Postgres, Transaction};

use crate::sql;
use crate::work::sql as work_sql;

/// Why the schema could not be prepared.
#[derive(Debug)]
pub(crate) enum SchemaError {
    /// The database failed or could not be reached.
    Sql(sqlx::Error),
    /// The database holds something this build must not touch; the message says what.
    Refused(String),
    /// Another session held the migration lock for all of `lock_wait`.
    LockHeld,
}

impl From<sqlx::Error> for SchemaError {
    fn from(e: sqlx::Error) -> Self {
        SchemaError::Sql(e)
    }
}

/// Makes sure the schema exists at [`sql::SCHEMA_VERSION`], the work tables at
/// [`work::sql::SCHEMA_VERSION`](crate::work::sql::SCHEMA_VERSION), and the idempotency,
/// rate-limit and cache objects, waiting at most `lock_wait` for the migration lock.
pub(crate) async fn prepare(pool: &PgPool, lock_wait: Duration) -> Result<(), SchemaError> {
    let mut tx = pool.begin().await?;
    if up_to_date(&mut tx).await? {
        tx.commit().await?;
        return Ok(());
    }
    // `SET LOCAL` takes no parameters; `set_config(..., true)` is its form that does.
    let millis = lock_wait.as_millis().max(1).to_string();
    sqlx::query(sql::SET_LOCK_TIMEOUT)
        .bind(millis)
        .persistent(false)
        .execute(&mut *tx)
        .await?;
    let locked = sqlx::query(sql::LOCK_MIGRATION)
        .bind(sql::MIGRATION_LOCK)
        .persistent(false)
        .execute(&mut *tx)
        .await;
    match locked {
        Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("55P03") => {
            return Err(SchemaError::LockHeld);
        }
        other => other?,
    };
    match current_version(&mut tx).await? {
        None => create(&mut tx).await?,
        Some(version) => migrate(&mut tx, version).await?,
    }
    match work_version(&mut tx).await? {
        None => create_work(&mut tx).await?,
        Some(version) => migrate_work(&mut tx, version).await?,
    }
    // Not `sqlx::raw_sql`: its executor bound keeps callers' futures from being `Send`.
    (&mut *tx).execute(sql::WAIT_SCHEMA).await?;
    (&mut *tx).execute(crate::idempotency::SCHEMA).await?;
    (&mut *tx).execute(crate::limit::SCHEMA).await?;
    (&mut *tx).execute(crate::limit::STEP_FUNCTION).await?;
    (&mut *tx).execute(crate::semaphore::SCHEMA).await?;
    (&mut *tx).execute(crate::semaphore::CLAIM_FUNCTION).await?;
    (&mut *tx)
        .execute(crate::semaphore::RELEASE_FUNCTION)
        .await?;
    tx.commit().await?;
    Ok(())
}

/// Whether every object exists at this build's version (then nothing is locked or written).
async fn up_to_date(conn: &mut PgConnection) -> Result<bool, SchemaError> {
    Ok(current_version(conn).await? == Some(sql::SCHEMA_VERSION)
        && work_version(conn).await? == Some(work_sql::SCHEMA_VERSION)
        && relation_exists(conn, "baton_wait").await?
        && relation_exists(conn, "baton_idempotency").await?
        && sqlx::query_scalar::<_, bool>(crate::limit::OBJECTS_EXIST)
            .persistent(false)
            .fetch_one(&mut *conn)
            .await?
        && sqlx::query_scalar::<_, bool>(crate::semaphore::OBJECTS_EXIST)
            .persistent(false)
            .fetch_one(&mut *conn)
            .await?)
}

async fn relation_exists(conn: &mut PgConnection, name: &str) -> Result<bool, SchemaError> {
    Ok(sqlx::query_scalar(sql::RELATION_EXISTS)
        .bind(name)
        .persistent(false)
        .fetch_one(&mut *conn)
        .await?)
}

/// The recorded version, `None` when there is no schema.
async fn current_version(conn: &mut PgConnection) -> Result<Option<i32>, SchemaError> {
    let exists = relation_exists(conn, "baton_schema").await?;
    if !exists {
        return Ok(None);
    }
    let version: Option<i32> = sqlx::query_scalar(sql::SCHEMA_VERSION_OF)
        .persistent(false)
        .fetch_optional(&mut *conn)
        .await?;
    match version {
        Some(version) => Ok(Some(version)),
        None => Err(SchemaError::Refused(
            "baton_schema exists but holds no version; it was not left by baton".into(),
        )),
    }
}

async fn create(tx: &mut Transaction<'_, Postgres>) -> Result<(), SchemaError> {
    let stray = relation_exists(tx, "baton_lease").await?;
    if stray {
        return Err(SchemaError::Refused(
            "a baton_lease table exists without baton_schema; it was not created by baton, so baton will not use or change it (point the store at another schema with ?options=-csearch_path%3D<schema>)".into(),
        ));
    }
    (&mut **tx).execute(sql::SCHEMA_V1).await?;
    migrate(tx, 1).await
}

/// Runs the migrations from `version` to [`sql::SCHEMA_VERSION`].
async fn migrate(tx: &mut Transaction<'_, Postgres>, version: i32) -> Result<(), SchemaError> {
    if version > sql::SCHEMA_VERSION {
        return Err(SchemaError::Refused(format!(
            "the database has baton schema version {version}, newer than version {} that this baton understands; upgrade baton to use it",
            sql::SCHEMA_VERSION
        )));
    }
    if version < 1 {
        return Err(SchemaError::Refused(format!(
            "the database has baton schema version {version}, which no baton wrote"
        )));
    }
    for to in version + 1..=sql::SCHEMA_VERSION {
        let step = sql::MIGRATIONS[(to - 2) as usize];
        (&mut **tx).execute(step).await?;
        sqlx::query(sql::SET_SCHEMA_VERSION)
            .bind(to)
            .persistent(false)
            .execute(&mut **tx)
            .await?;
    }
    Ok(())
}

/// The recorded work-schema version, `None` when there are no work tables.
async fn work_version(conn: &mut PgConnection) -> Result<Option<i32>, SchemaError> {
    let exists = relation_exists(conn, "baton_work_schema").await?;
    if !exists {
        return Ok(None);
    }
    let version: Option<i32> = sqlx::query_scalar(work_sql::SCHEMA_VERSION_OF)
        .persistent(false)
        .fetch_optional(&mut *conn)
        .await?;
    match version {
        Some(version) => Ok(Some(version)),
        None => Err(SchemaError::Refused(
            "baton_work_schema exists but holds no version; it was not left by baton".into(),
        )),
    }
}

async fn create_work(tx: &mut Transaction<'_, Postgres>) -> Result<(), SchemaError> {
    for table in [
        "baton_work_item",
        "baton_work_dedup",
        "baton_work_schedule",
        "baton_work_migration",
    ] {
        let stray = relation_exists(tx, table).await?;
        if stray {
            return Err(SchemaError::Refused(format!(
                "a {table} table exists without baton_work_schema; it was not created by baton, so baton will not use or change it (point the store at another schema with ?options=-csearch_path%3D<schema>)"
            )));
        }
    }
    (&mut **tx).execute(work_sql::SCHEMA_V1).await?;
    migrate_work(tx, 1).await
}

/// Runs the work-table migrations from `version` to
/// [`work::sql::SCHEMA_VERSION`](crate::work::sql::SCHEMA_VERSION).
async fn migrate_work(tx: &mut Transaction<'_, Postgres>, version: i32) -> Result<(), SchemaError> {
    if version > work_sql::SCHEMA_VERSION {
        return Err(SchemaError::Refused(format!(
            "the database has baton work-schema version {version}, newer than version {} that this baton understands; upgrade baton to use it",
            work_sql::SCHEMA_VERSION
        )));
    }
    if version < 1 {
        return Err(SchemaError::Refused(format!(
            "the database has baton work-schema version {version}, which no baton wrote"
        )));
    }
    for to in version + 1..=work_sql::SCHEMA_VERSION {
        let step = work_sql::MIGRATIONS[(to - 2) as usize];
        (&mut **tx).execute(step).await?;
        sqlx::query(work_sql::SET_SCHEMA_VERSION)
            .bind(to)
            .persistent(false)
            .execute(&mut **tx)
            .await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::sql;
    use crate::work::sql as work_sql;

    #[test]
    fn every_version_after_the_first_has_a_migration() {
        assert_eq!(sql::MIGRATIONS.len() as i32, sql::SCHEMA_VERSION - 1);
        assert!(sql::SCHEMA_V1.contains("INSERT INTO baton_schema (version) VALUES (1)"));
        assert_eq!(
            work_sql::MIGRATIONS.len() as i32,
            work_sql::SCHEMA_VERSION - 1
        );
        assert!(work_sql::SCHEMA_V1.contains("INSERT INTO baton_work_schema (version) VALUES (1)"));
    }
}
