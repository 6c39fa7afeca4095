//! Opening a connection, and creating or checking the schema.
//!
//! Opening is safe when several processes open the same (possibly new) file at the same
//! moment: the pragmas are idempotent, and the schema is created inside a `BEGIN IMMEDIATE`
//! transaction that first checks again whether another process created it meanwhile. The
//! file header says whose file it is (`application_id`) and which schema version it holds
//! (`user_version`): another application's database, or a schema from a newer baton, is
//! refused with `Internal` and left untouched: the header is read before the first pragma
//! that writes (the switch to WAL).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rusqlite::{Connection, OpenFlags, OptionalExtension};

use crate::busy;
use crate::clock;
use crate::error::OpError;
use crate::file::FileId;
use crate::options::SqliteOptions;
use crate::sql;

/// Opens one connection to `path`, checks that the file is baton's (or new), runs
/// [`sql::pragmas`] on it and installs the [`busy::handler`]; returns it with the identity
/// of the file it is on. Call it inside [`busy::within`].
///
/// A file that belongs to another application is refused before anything in it is
/// changed: the header is read before the pragmas switch the file to WAL.
pub(crate) fn connect(
    path: &Path,
    options: &SqliteOptions,
) -> Result<(Connection, FileId, Owner), OpError> {
    let (conn, file) = open(path)?;
    conn.set_prepared_statement_cache_capacity(32);
    // Same timeout, finer retries than SQLite's own handler (see busy).
    conn.busy_handler(Some(busy::handler))?;
    let owner = check_owner(&conn)?;
    let pragmas = sql::pragmas(options);
    // Switching a new file to WAL needs a moment of exclusive access; when another process
    // is doing the same, SQLite may answer busy without waiting. Retry within busy_timeout.
    let deadline = Instant::now() + options.get_busy_timeout();
    loop {
        match conn.execute_batch(&pragmas) {
            Ok(()) => break,
            Err(e) if is_busy(&e) && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(e) => return Err(e.into()),
        }
    }
    // `PRAGMA busy_timeout` replaced the handler; put it back.
    conn.busy_handler(Some(busy::handler))?;
    let mode: String = conn.query_row("PRAGMA journal_mode", [], |r| r.get(0))?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(OpError::Baton(baton_core::Error::unavailable(format!(
            "SQLite file {} could not be switched to WAL mode (it is in {mode} mode); WAL needs a local file system with shared memory",
            path.display()
        ))));
    }
    Ok((conn, file, owner))
}

/// Whose a file was when a connection opened it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Owner {
    /// baton's: it has baton's `application_id`.
    Baton,
    /// Nobody's yet: no `application_id`, no tables (a new or empty file).
    New,
}

/// How many times [`open`] tries when the file at the path changes while it opens it.
const OPEN_ATTEMPTS: usize = 3;

/// Opens `path` and says which file the connection is on: the path names the same file
/// just before and just after the open, so the connection is on that file. (A new file is
/// created by the first attempt and confirmed by the second.)
fn open(path: &Path) -> Result<(Connection, FileId), OpError> {
    // No SQLITE_OPEN_URI: the path is a file name, never interpreted.
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
        | OpenFlags::SQLITE_OPEN_CREATE
        | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    refuse_orphaned_log(path)?;
    for _ in 0..OPEN_ATTEMPTS {
        let before = FileId::of(path).ok();
        let conn = Connection::open_with_flags(path, flags)?;
        let after = FileId::of(path).map_err(|e| {
            baton_core::Error::unavailable(format!(
                "SQLite file {} disappeared while it was being opened",
                path.display()
            ))
            .with_source(e)
        })?;
        if before == Some(after) {
            return Ok((conn, after));
        }
    }
    Err(OpError::Baton(baton_core::Error::unavailable(format!(
        "SQLite file {} was replaced each time it was opened ({OPEN_ATTEMPTS} times); something is deleting or moving it",
        path.display()
    ))))
}

/// Refuses to create a file where the `-wal` or `-shm` file of a deleted one is left: SQLite
/// would read the new file through the old log and index, and mix the two databases.
///
/// SQLite creates the main file before its `-wal` and `-shm` files and removes it never, so
/// companions found while the main file is missing (checked again after them) are left
/// from a database that someone deleted.
fn refuse_orphaned_log(path: &Path) -> Result<(), OpError> {
    if path.exists() {
        return Ok(());
    }
    let orphans: Vec<PathBuf> = ["-wal", "-shm"]
        .iter()
        .map(|suffix| {
            let mut name = path.as_os_str().to_owned();
            name.push(suffix);
            PathBuf::from(name)
        })
        .filter(|companion| companion.exists())
        .collect();
    if orphans.is_empty() || path.exists() {
        return Ok(());
    }
    let names: Vec<String> = orphans.iter().map(|o| o.display().to_string()).collect();
    Err(OpError::Baton(baton_core::Error::unavailable(format!(
        "SQLite file {} is missing, but {} of a deleted database {} still there; a new file would be read through them. Stop the processes that used the old file and remove {}, or restore the file together with them",
        path.display(),
        names.join(" and "),
        if names.len() == 1 { "is" } else { "are" },
        if names.len() == 1 { "it" } else { "them" },
    ))))
}

/// Refuses a file that another application owns: one with another `application_id`, or
/// without one but with tables. Reads only; a new (empty) file and baton's pass.
fn check_owner(conn: &Connection) -> Result<Owner, OpError> {
    // One statement, so one snapshot: another process creating the schema commits the
    // tables and the header together.
    let (application_id, version, tables): (i32, i32, i64) =
        conn.query_row(sql::OWNER, [], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?;
    match (application_id, version) {
        (sql::APPLICATION_ID, _) => Ok(Owner::Baton),
        (0, 0) if tables > 0 => Err(foreign_tables()),
        (0, 0) => Ok(Owner::New),
        _ => Err(refusal(application_id, version)),
    }
}

fn tables(conn: &Connection) -> Result<i64, OpError> {
    Ok(conn.query_row("SELECT count(*) FROM sqlite_schema", [], |r| r.get(0))?)
}

fn foreign_tables() -> OpError {
    OpError::Corrupt(
        "the file is an SQLite database of another application (it has tables but no baton application_id); point baton at a new file".into(),
    )
}

fn is_busy(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
    )
}

/// Creates the schema in a new file, or checks the one that is there; then frees the
/// grants of an earlier boot.
pub(crate) fn prepare(conn: &Connection) -> Result<(), OpError> {
    if header(conn)? != (sql::APPLICATION_ID, sql::SCHEMA_VERSION) {
        immediate(conn, |conn| {
            let (application_id, version) = header(conn)?;
            match (application_id, version) {
                (sql::APPLICATION_ID, sql::SCHEMA_VERSION) => Ok(()),
                (0, 0) => create(conn),
                _ => Err(refusal(application_id, version)),
            }
        })?;
    }
    crate::idempotency::ensure_schema(conn)?;
    crate::limit::ensure_schema(conn)?;
    crate::semaphore::ensure_schema(conn)?;
    crate::work::prepare(conn)?;
    free_earlier_boots(conn, clock::boot_id())
}

fn header(conn: &Connection) -> Result<(i32, i32), OpError> {
    let application_id = conn.query_row("PRAGMA application_id", [], |r| r.get(0))?;
    let version = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    Ok((application_id, version))
}

fn refusal(application_id: i32, version: i32) -> OpError {
    if application_id != sql::APPLICATION_ID {
        return OpError::Corrupt(format!(
            "the file is not a baton store (application_id {application_id:#x}, user_version {version}); point baton at a new file"
        ));
    }
    if version > sql::SCHEMA_VERSION {
        return OpError::Corrupt(format!(
            "the file has schema version {version}, newer than version {} that this baton understands; upgrade baton to use it",
            sql::SCHEMA_VERSION
        ));
    }
    OpError::Corrupt(format!(
        "the file has schema version {version}, which no baton wrote"
    ))
}

/// Creates the schema in a file that has none (inside the caller's transaction).
fn create(conn: &Connection) -> Result<(), OpError> {
    if tables(conn)? > 0 {
        return Err(foreign_tables());
    }
    conn.execute_batch(sql::SCHEMA)?;
    // The header pragmas take no bind parameters; both values are constants.
    conn.execute_batch(&format!(
        "PRAGMA application_id = {};\nPRAGMA user_version = {};",
        sql::APPLICATION_ID,
        sql::SCHEMA_VERSION
    ))?;
    if let Some(boot) = clock::boot_id() {
        conn.execute(sql::SET_BOOT_ID, [boot])?;
    }
    Ok(())
}

/// Frees the grants written before the last reboot (see [`crate::clock`]). `boot` is the
/// current boot's id, where the platform has one.
///
/// - The file records another boot: every grant is from it, and is freed.
/// - The file records no boot (it was created where no boot id could be read), or there is
///   no boot id here: only grants written later than now are surely from an earlier boot.
fn free_earlier_boots(conn: &Connection, boot: Option<String>) -> Result<(), OpError> {
    let recorded = |conn: &Connection| -> Result<Option<String>, OpError> {
        Ok(conn
            .query_row(sql::BOOT_ID, [], |r| r.get::<_, String>(0))
            .optional()?)
    };
    let any_later = |conn: &Connection| -> Result<bool, OpError> {
        Ok(conn.query_row(sql::ANY_FROM_EARLIER_BOOT, [clock::now()], |r| r.get(0))?)
    };
    let Some(boot) = boot else {
        if any_later(conn)? {
            immediate(conn, |conn| {
                conn.execute(sql::FREE_FROM_EARLIER_BOOT, [clock::now()])?;
                Ok(())
            })?;
        }
        free_permits_from_earlier_boot(conn)?;
        return Ok(());
    };
    if recorded(conn)?.as_deref() == Some(boot.as_str()) {
        return Ok(());
    }
    immediate(conn, |conn| {
        match recorded(conn)? {
            Some(same) if same == boot => return Ok(()),
            Some(_) => {
                conn.execute(crate::semaphore::FREE_ALL, [])?;
                conn.execute(sql::FREE_ALL, [clock::now()])?
            }
            None => {
                free_permits_from_earlier_boot(conn)?;
                conn.execute(sql::FREE_FROM_EARLIER_BOOT, [clock::now()])?
            }
        };
        conn.execute(sql::SET_BOOT_ID, [&boot])?;
        Ok(())
    })
}

/// Deletes the permits that end later than any TTL from now: on a monotonic clock, they were
/// granted before a reboot.
fn free_permits_from_earlier_boot(conn: &Connection) -> Result<(), OpError> {
    let longest = i64::try_from(baton_core::time::MAX_TTL.as_nanos()).unwrap_or(i64::MAX);
    conn.execute(
        crate::semaphore::FREE_FROM_EARLIER_BOOT,
        rusqlite::params![clock::now(), longest],
    )?;
    Ok(())
}

/// Runs `body` in one `BEGIN IMMEDIATE` transaction: commits when it succeeds, rolls back
/// when it fails.
pub(crate) fn immediate<T>(
    conn: &Connection,
    body: impl FnOnce(&Connection) -> Result<T, OpError>,
) -> Result<T, OpError> {
    conn.prepare_cached(sql::BEGIN_IMMEDIATE)?.execute([])?;
    let result = body(conn).and_then(|value| {
        conn.prepare_cached(sql::COMMIT)?.execute([])?;
        Ok(value)
    });
    if result.is_err() && !conn.is_autocommit() {
        // Best effort: a connection left inside a transaction is not reused (see pool).
        let _ = conn
            .prepare_cached(sql::ROLLBACK)
            .and_then(|mut s| s.execute([]));
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fresh() -> (tempfile::TempDir, Connection) {
        let dir = tempfile::tempdir().unwrap();
        let (conn, _, _) = connect(&dir.path().join("s.db"), &SqliteOptions::new()).unwrap();
        prepare(&conn).unwrap();
        (dir, conn)
    }

    fn holders(conn: &Connection) -> Vec<(String, Option<String>, i64)> {
        let mut s = conn
            .prepare("SELECT key, holder, fence FROM baton_grant ORDER BY key")
            .unwrap();
        s.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .unwrap()
            .map(Result::unwrap)
            .collect()
    }

    fn insert(conn: &Connection, key: &str, updated_at: i64) {
        conn.execute(
            "INSERT INTO baton_grant (key, holder, fence, expires_at, updated_at) VALUES (?1, 'h', 7, ?2 + 1000000000000, ?2)",
            rusqlite::params![key, updated_at],
        )
        .unwrap();
    }

    /// Without a boot id, a grant written later than now is from an earlier boot; the
    /// others are left to expire.
    #[test]
    fn without_a_boot_id_grants_from_the_future_are_freed() {
        let (_dir, conn) = fresh();
        let now = clock::now();
        insert(&conn, "earlier-boot", now + 3_600_000_000_000);
        insert(&conn, "this-boot", now - 1_000_000);
        free_earlier_boots(&conn, None).unwrap();
        assert_eq!(
            holders(&conn),
            [
                ("earlier-boot".to_owned(), None, 7),
                ("this-boot".to_owned(), Some("h".to_owned()), 7)
            ]
        );
    }

    #[test]
    fn a_new_boot_id_frees_every_grant_once() {
        let (_dir, conn) = fresh();
        insert(&conn, "k", clock::now());
        free_earlier_boots(&conn, Some("boot-a".into())).unwrap();
        assert_eq!(holders(&conn), [("k".to_owned(), None, 7)]);
        let recorded: String = conn.query_row(sql::BOOT_ID, [], |r| r.get(0)).unwrap();
        assert_eq!(recorded, "boot-a");
        insert(&conn, "k2", clock::now());
        free_earlier_boots(&conn, Some("boot-a".into())).unwrap();
        assert_eq!(
            holders(&conn)[1],
            ("k2".to_owned(), Some("h".to_owned()), 7)
        );
    }

    #[test]
    fn a_file_without_a_recorded_boot_frees_only_grants_from_the_future() {
        let (_dir, conn) = fresh();
        conn.execute("DELETE FROM baton_meta WHERE name = 'boot_id'", [])
            .unwrap();
        let now = clock::now();
        insert(&conn, "earlier-boot", now + 3_600_000_000_000);
        insert(&conn, "this-boot", now - 1_000_000);
        free_earlier_boots(&conn, Some("boot-b".into())).unwrap();
        assert_eq!(
            holders(&conn),
            [
                ("earlier-boot".to_owned(), None, 7),
                ("this-boot".to_owned(), Some("h".to_owned()), 7)
            ]
        );
        let recorded: String = conn.query_row(sql::BOOT_ID, [], |r| r.get(0)).unwrap();
        assert_eq!(recorded, "boot-b");
    }

    #[test]
    fn prepare_is_idempotent() {
        let (_dir, conn) = fresh();
        prepare(&conn).unwrap();
        prepare(&conn).unwrap();
        assert_eq!(
            header(&conn).unwrap(),
            (sql::APPLICATION_ID, sql::SCHEMA_VERSION)
        );
    }
}
