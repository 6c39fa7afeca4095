//! What `baton doctor` reads about an SQLite store file: [`inspect`] returns [`StoreFile`].
//!
//! These are facts, not verdicts: the file's metadata, the file system it lives on, the
//! header (`application_id`, `user_version`), which of the claimable-work tables
//! ([`WORK_TABLES`]) it holds, the journal mode, and whether this user can take the write
//! lock. The `baton` facade turns them into findings with fixes.
//!
//! The claimable-work tables have no version of their own in SQLite: the store creates any
//! that are missing (`CREATE TABLE IF NOT EXISTS`) every time it opens the file, and
//! `user_version` is the only schema version the file records.
//!
//! Inspecting never creates or changes the store: the file is opened without
//! `SQLITE_OPEN_CREATE` and without the store's pragmas, and the write probe is
//! `BEGIN IMMEDIATE` followed by `ROLLBACK`, which writes nothing. Whether files can be
//! created in the file's directory (SQLite creates the `-wal` and `-shm` files there), or in
//! the nearest existing directory when the file does not exist yet, is probed by creating and
//! removing an empty file named `.baton-doctor-<pid>`.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use baton_core::{Error, Result};
use rusqlite::{Connection, OpenFlags};

use crate::options::SqliteOptions;
use crate::sql;
use crate::url;

/// The tables of claimable work (queues, schedules, migration records), as created by
/// [`work::sql::SCHEMA`](crate::work::sql::SCHEMA).
pub const WORK_TABLES: &[&str] = &[
    "baton_work_item",
    "baton_work_dedup",
    "baton_work_schedule",
    "baton_work_migration",
];

/// Facts about the file of an SQLite store, as read by [`inspect`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct StoreFile {
    /// The file's path, as given in the URL.
    pub path: PathBuf,
    /// The options given in the URL.
    pub options: SqliteOptions,
    /// The file system type (`ext4`, `nfs4`, ...) of the mount that holds the file (or the
    /// directory it would be created in), from `/proc/self/mounts`; `None` where that cannot
    /// be read.
    pub filesystem: Option<String>,
    /// The effective user id of this process (Linux), for messages about permissions.
    pub uid: Option<u32>,
    /// What is at the path.
    pub state: FileState,
}

/// What is at the store's path.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum FileState {
    /// Nothing yet: the store creates the file, and its directories, at first use.
    Missing {
        /// The nearest directory on the path that exists.
        existing_dir: PathBuf,
        /// Why a file could not be created there, or `None` when it could.
        cannot_create: Option<String>,
    },
    /// Something that is not a regular file (a directory, a socket).
    NotAFile,
    /// The metadata could not be read (a directory on the path is not searchable).
    Unreadable {
        /// The operating system's message.
        error: String,
    },
    /// A regular file.
    Present {
        /// The file's metadata.
        meta: FileMeta,
        /// Why this user cannot open the file for writing, or `None` when it can.
        cannot_write: Option<String>,
        /// Why this user cannot create files in the file's directory (SQLite creates the
        /// `-wal` and `-shm` files there), or `None` when it can.
        cannot_create_beside: Option<String>,
        /// What SQLite says about it.
        database: DatabaseFacts,
    },
}

/// A regular file's size, owner and permission bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct FileMeta {
    /// Size in bytes (the main file only; the `-wal` file holds recent commits).
    pub size: u64,
    /// Permission bits (`0o644`).
    pub mode: u32,
    /// Owner user id.
    pub uid: u32,
    /// Owner group id.
    pub gid: u32,
}

/// What SQLite says about an existing file.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum DatabaseFacts {
    /// SQLite could not open or read it; the message says why.
    Unreadable {
        /// SQLite's message.
        error: String,
    },
    /// SQLite read it.
    Read {
        /// How long opening it and reading its header took: the store's round trip.
        read_time: Duration,
        /// `PRAGMA application_id`: `sql::APPLICATION_ID` for a baton store, 0 for a new file.
        application_id: i32,
        /// `PRAGMA user_version`: the schema version (`sql::SCHEMA_VERSION` today).
        schema_version: i32,
        /// How many tables and indexes the file holds (0 for an empty file).
        objects: i64,
        /// The [`WORK_TABLES`] the file lacks, in that order (all of them for an empty file).
        missing_work_tables: Vec<&'static str>,
        /// `PRAGMA journal_mode` as stored in the file: `wal` once baton has opened it.
        journal_mode: String,
        /// Whether this user may write the file: `Ok` with the time `BEGIN IMMEDIATE` took,
        /// or the error that refused the write lock.
        write_lock: WriteProbe,
    },
}

/// The outcome of taking the write lock (`BEGIN IMMEDIATE`, then `ROLLBACK`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum WriteProbe {
    /// The write lock was taken (and given back) in this time.
    Taken(Duration),
    /// SQLite opened the file read-only: this user may not write the file, or its
    /// directory (for the `-wal` and `-shm` files).
    ReadOnly,
    /// Another connection held the write lock for longer than `busy_timeout`.
    Busy,
    /// Any other failure, with SQLite's message.
    Failed(String),
}

/// Reads the facts about the store named by a `sqlite://` URL, without creating or changing
/// it.
///
/// # Errors
/// `InvalidInput` for a malformed URL or option (as [`SqliteStore::connect`](crate::SqliteStore::connect)).
/// Everything found about the file, including that it cannot be read, is an answer.
pub async fn inspect(url: &str) -> Result<StoreFile> {
    let (path, options) = url::parse(url)?;
    tokio::task::spawn_blocking(move || inspect_blocking(path, options))
        .await
        .map_err(|e| Error::internal("inspecting the SQLite file failed").with_source(e))
}

fn inspect_blocking(path: PathBuf, options: SqliteOptions) -> StoreFile {
    let state = match fs::metadata(&path) {
        Ok(meta) if meta.is_file() => FileState::Present {
            meta: file_meta(&meta),
            // Opening for writing without truncating or creating changes nothing.
            cannot_write: fs::OpenOptions::new()
                .write(true)
                .open(&path)
                .err()
                .map(|e| e.to_string()),
            cannot_create_beside: probe_create(&nearest_existing_dir(&path))
                .err()
                .map(|e| e.to_string()),
            database: read_database(&path, &options),
        },
        Ok(_) => FileState::NotAFile,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let existing_dir = nearest_existing_dir(&path);
            let cannot_create = probe_create(&existing_dir).err().map(|e| e.to_string());
            FileState::Missing {
                existing_dir,
                cannot_create,
            }
        }
        Err(e) => FileState::Unreadable {
            error: e.to_string(),
        },
    };
    let anchor = match &state {
        FileState::Missing { existing_dir, .. } => existing_dir.clone(),
        _ => path.clone(),
    };
    StoreFile {
        filesystem: filesystem_of(&anchor),
        uid: effective_uid(),
        path,
        options,
        state,
    }
}

#[cfg(unix)]
fn file_meta(meta: &fs::Metadata) -> FileMeta {
    use std::os::unix::fs::MetadataExt;
    FileMeta {
        size: meta.len(),
        mode: meta.mode() & 0o7777,
        uid: meta.uid(),
        gid: meta.gid(),
    }
}

#[cfg(not(unix))]
fn file_meta(meta: &fs::Metadata) -> FileMeta {
    FileMeta {
        size: meta.len(),
        mode: 0,
        uid: 0,
        gid: 0,
    }
}

fn read_database(path: &Path, options: &SqliteOptions) -> DatabaseFacts {
    let started = Instant::now();
    // No SQLITE_OPEN_CREATE: a file that vanished in between is not re-created here.
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let read = Connection::open_with_flags(path, flags).and_then(|conn| {
        conn.busy_timeout(options.get_busy_timeout())?;
        let pragma = |name: &str| -> rusqlite::Result<i32> {
            conn.query_row(&format!("PRAGMA {name}"), [], |r| r.get(0))
        };
        let application_id = pragma("application_id")?;
        let schema_version = pragma("user_version")?;
        let objects: i64 =
            conn.query_row("SELECT count(*) FROM sqlite_schema", [], |r| r.get(0))?;
        let mut missing_work_tables = Vec::new();
        for &table in WORK_TABLES {
            let found: bool = conn.query_row(
                "SELECT EXISTS (SELECT 1 FROM sqlite_schema WHERE type = 'table' AND name = ?1)",
                [table],
                |r| r.get(0),
            )?;
            if !found {
                missing_work_tables.push(table);
            }
        }
        let journal_mode: String = conn.query_row("PRAGMA journal_mode", [], |r| r.get(0))?;
        Ok((
            conn,
            application_id,
            schema_version,
            objects,
            missing_work_tables,
            journal_mode,
        ))
    });
    let read_time = started.elapsed();
    match read {
        Ok((conn, application_id, schema_version, objects, missing_work_tables, journal_mode)) => {
            DatabaseFacts::Read {
                read_time,
                application_id,
                schema_version,
                objects,
                missing_work_tables,
                journal_mode: journal_mode.to_ascii_lowercase(),
                write_lock: probe_write(&conn),
            }
        }
        Err(e) => DatabaseFacts::Unreadable {
            error: e.to_string(),
        },
    }
}

/// Takes the write lock and gives it back, writing nothing.
fn probe_write(conn: &Connection) -> WriteProbe {
    if conn.is_readonly("main").unwrap_or(false) {
        return WriteProbe::ReadOnly;
    }
    let started = Instant::now();
    match conn.execute_batch(sql::BEGIN_IMMEDIATE) {
        Ok(()) => {
            let taken = started.elapsed();
            let _ = conn.execute_batch(sql::ROLLBACK);
            WriteProbe::Taken(taken)
        }
        Err(e) => match e.sqlite_error_code() {
            Some(rusqlite::ErrorCode::ReadOnly) => WriteProbe::ReadOnly,
            Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked) => {
                WriteProbe::Busy
            }
            _ => WriteProbe::Failed(e.to_string()),
        },
    }
}

/// The nearest ancestor of `path` that exists (the working directory for a bare relative
/// name).
fn nearest_existing_dir(path: &Path) -> PathBuf {
    let mut dir = path.parent();
    while let Some(candidate) = dir {
        let candidate = if candidate.as_os_str().is_empty() {
            Path::new(".")
        } else {
            candidate
        };
        if candidate.is_dir() {
            return candidate.to_owned();
        }
        dir = candidate.parent();
    }
    PathBuf::from(".")
}

/// Creates and removes an empty file with a unique name in `dir`.
fn probe_create(dir: &Path) -> io::Result<()> {
    let probe = dir.join(format!(".baton-doctor-{}", std::process::id()));
    fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&probe)?;
    fs::remove_file(&probe)
}

/// The type of the file system whose mount point is the longest prefix of `path`.
fn filesystem_of(path: &Path) -> Option<String> {
    let path = fs::canonicalize(path).ok()?;
    let mounts = fs::read_to_string("/proc/self/mounts").ok()?;
    mount_type(&mounts, &path)
}

fn mount_type(mounts: &str, path: &Path) -> Option<String> {
    mounts
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let (_device, point, kind) = (fields.next()?, fields.next()?, fields.next()?);
            // Spaces and tabs in mount points are written as octal escapes.
            let point = point
                .replace("\\040", " ")
                .replace("\\011", "\t")
                .replace("\\134", "\\");
            path.starts_with(&point)
                .then(|| (point.len(), kind.to_owned()))
        })
        .max_by_key(|(len, _)| *len)
        .map(|(_, kind)| kind)
}

/// The effective user id, from `/proc/self/status` (Linux only).
fn effective_uid() -> Option<u32> {
    let status = fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("Uid:"))?;
    line.split_whitespace().nth(2)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_longest_mount_point_wins() {
        let mounts = "overlay / overlay rw 0 0\n\
                      server:/export /mnt/shared\\040dir nfs4 rw 0 0\n\
                      tmpfs /tmp tmpfs rw 0 0\n";
        let kind = |p: &str| mount_type(mounts, Path::new(p));
        assert_eq!(kind("/mnt/shared dir/baton.db").as_deref(), Some("nfs4"));
        assert_eq!(kind("/tmp/x/baton.db").as_deref(), Some("tmpfs"));
        assert_eq!(kind("/var/lib/baton.db").as_deref(), Some("overlay"));
        assert_eq!(kind("/tmpfoo/baton.db").as_deref(), Some("overlay"));
    }

    #[tokio::test]
    async fn a_missing_file_is_not_created() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/baton.db");
        let url = format!("sqlite://{}", path.display());
        let facts = inspect(&url).await.unwrap();
        match facts.state {
            FileState::Missing {
                existing_dir,
                cannot_create,
            } => {
                assert_eq!(existing_dir, dir.path());
                assert_eq!(cannot_create, None);
            }
            other => panic!("{other:?}"),
        }
        assert!(!path.exists() && !dir.path().join("sub").exists());
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[tokio::test]
    async fn a_store_file_reads_as_baton_in_wal_mode_and_writable() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}/baton.db", dir.path().display());
        drop(crate::SqliteStore::connect(&url).await.unwrap());
        let facts = inspect(&url).await.unwrap();
        let FileState::Present { database, .. } = facts.state else {
            panic!("{:?}", facts.state)
        };
        let DatabaseFacts::Read {
            application_id,
            schema_version,
            missing_work_tables,
            journal_mode,
            write_lock,
            ..
        } = database
        else {
            panic!("{database:?}")
        };
        assert_eq!(application_id, sql::APPLICATION_ID);
        assert_eq!(schema_version, sql::SCHEMA_VERSION);
        assert_eq!(missing_work_tables, Vec::<&str>::new());
        assert_eq!(journal_mode, "wal");
        assert!(matches!(write_lock, WriteProbe::Taken(_)), "{write_lock:?}");
    }

    #[test]
    fn the_work_tables_are_those_the_store_creates() {
        let created = crate::work::sql::SCHEMA
            .matches("CREATE TABLE IF NOT EXISTS ")
            .count();
        assert_eq!(created, WORK_TABLES.len());
        for table in WORK_TABLES {
            let create = format!("CREATE TABLE IF NOT EXISTS {table} (");
            assert!(crate::work::sql::SCHEMA.contains(&create), "{table}");
        }
    }

    #[tokio::test]
    async fn bad_urls_are_invalid_input() {
        let err = inspect("sqlite://").await.unwrap_err();
        assert_eq!(err.kind(), baton_core::ErrorKind::InvalidInput);
    }
}
