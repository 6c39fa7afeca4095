//! What `baton doctor` checks about an SQLite store file: [`inspect`] reads the facts
//! ([`StoreFile`]) and [`diagnose`] judges them into a [`Report`] of checks with fixes.
//!
//! The facts are the file's metadata, the file system it lives on, the
//! header (`application_id`, `user_version`), which of the claimable-work tables
//! ([`WORK_TABLES`]) it holds, the journal mode, and whether this user can take the write
//! lock.
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

use baton_core::doctor::{Check, Report, millis};
use baton_core::{Error, Result};
use rusqlite::{Connection, OpenFlags};

use crate::Synchronous;
use crate::options::SqliteOptions;
use crate::sql;
use crate::sql::{APPLICATION_ID, SCHEMA_VERSION};
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

/// File systems on which SQLite's locking and WAL shared memory are not reliable.
const NETWORK_FILE_SYSTEMS: &[&str] = &[
    "nfs",
    "nfs4",
    "cifs",
    "smb3",
    "smbfs",
    "9p",
    "ceph",
    "glusterfs",
    "lustre",
    "afs",
    "davfs",
    "fuse.sshfs",
    "fuse.glusterfs",
    "fuse.s3fs",
    "fuse.gcsfuse",
    "fuse.davfs2",
];

/// Checks the store file named by a `sqlite://` URL from the facts [`inspect`] reads,
/// without creating or changing it: the file, its file system and permissions, header and
/// schema version, the claimable-work tables, WAL mode, the write lock, `synchronous` and
/// the clock. A local file is never unreachable: whatever is wrong with it is a finding.
///
/// # Errors
/// `InvalidInput` for a malformed URL or option.
pub async fn diagnose(url: &str) -> Result<Report> {
    let facts = inspect(url).await?;
    // A local file is never "unreachable": whatever is wrong with it is a finding.
    Ok(Report::new(url, checks(&facts)))
}

fn user(facts: &StoreFile) -> String {
    match facts.uid {
        Some(uid) => format!("this user (uid {uid})"),
        None => "this user".to_owned(),
    }
}

fn checks(facts: &StoreFile) -> Vec<Check> {
    let path = facts.path.display();
    let on = facts
        .filesystem
        .as_deref()
        .map(|fs| format!(" on {fs}"))
        .unwrap_or_default();
    let mut checks = Vec::new();
    match &facts.state {
        FileState::Missing {
            existing_dir,
            cannot_create: None,
        } => checks.push(Check::note(
            "file",
            format!(
                "{path} does not exist yet; baton creates it, and its directories, at first use, and {user} can create files in {}{on}",
                existing_dir.display(),
                user = user(facts)
            ),
            None,
        )),
        FileState::Missing {
            existing_dir,
            cannot_create: Some(error),
        } => checks.push(Check::finding(
            "file",
            format!(
                "{path} does not exist and {} cannot create it in {}: {error}",
                user(facts),
                existing_dir.display()
            ),
            "create the directory and make it writable by the user baton runs as, or point --store/BATON_STORE at a writable place",
        )),
        FileState::NotAFile => checks.push(Check::finding(
            "file",
            format!("{path} is not a regular file"),
            format!("name a file, such as sqlite://{path}/baton.db"),
        )),
        FileState::Unreadable { error } => checks.push(Check::finding(
            "file",
            format!("{path} cannot be examined: {error}"),
            "make every directory on the path searchable (x) by the user baton runs as",
        )),
        FileState::Present {
            meta,
            cannot_write,
            cannot_create_beside,
            database,
        } => {
            checks.push(Check::ok(
                "file",
                format!(
                    "{path}: {} bytes, mode {:04o}, owner {}:{}{on}",
                    meta.size, meta.mode, meta.uid, meta.gid
                ),
            ));
            if meta.mode & 0o002 != 0 {
                checks.push(Check::note(
                    "permissions",
                    format!("{path} is writable by every user of the host (mode {:04o}): anyone can take or break its locks", meta.mode),
                    Some(format!("chmod o-w {path}, and share it through a group instead")),
                ));
            }
            let owner = format!("mode {:04o}, owner {}:{}", meta.mode, meta.uid, meta.gid);
            let writable = cannot_write.is_none() && cannot_create_beside.is_none();
            if let Some(error) = cannot_write {
                checks.push(Check::finding(
                    "permissions",
                    format!("{} cannot open {path} for writing ({owner}): {error}; every claim would fail", user(facts)),
                    PERMISSIONS_FIX,
                ));
            }
            if let Some(error) = cannot_create_beside {
                let dir = facts.path.parent().map(|d| d.display().to_string()).unwrap_or_default();
                checks.push(Check::finding(
                    "permissions",
                    format!("{} cannot create files in the directory {dir:?}, where SQLite keeps the -wal and -shm files: {error}", user(facts)),
                    PERMISSIONS_FIX,
                ));
            }
            checks.extend(database_checks(facts, database, &owner, writable));
        }
    }
    if let Some(fs) = facts
        .filesystem
        .as_deref()
        .filter(|fs| NETWORK_FILE_SYSTEMS.contains(fs))
    {
        checks.push(Check::finding(
            "filesystem",
            format!("{path} is on {fs}, a network file system: SQLite's locking and WAL shared memory are not reliable there, and the stored times mean nothing on another host"),
            "put the file on a local disk; for processes on several hosts use redis://",
        ));
    }
    checks.push(match facts.options.get_synchronous() {
        Synchronous::Normal => Check::note(
            "durability",
            "synchronous=normal: commits reach the disk at checkpoints, so after a power loss or kernel crash the fences of the lost commits are handed out again",
            Some("use synchronous=full (the default) when fenced resources live on other hosts".into()),
        ),
        _ => Check::ok(
            "durability",
            "synchronous=full: every answered grant, and its fence, survives power loss",
        ),
    });
    checks.push(Check::ok(
        "clock",
        "expiry is decided by this host's monotonic clock (CLOCK_MONOTONIC), read inside each transaction: the store's clock is the host's, so there is no offset to measure, and wall-clock steps change nothing",
    ));
    checks
}

/// The claimable-work tables. SQLite keeps no version of their own (the store creates
/// any that are missing every time it opens the file), so there is nothing newer to
/// find: only which are there.
fn work_schema(missing: &[&str]) -> Check {
    if missing.is_empty() {
        Check::ok(
            "work-schema",
            "the claimable-work tables are present (unversioned in SQLite: the store creates any that are missing each time it opens the file)",
        )
    } else if missing.len() == WORK_TABLES.len() {
        Check::note(
            "work-schema",
            "no claimable-work tables yet: the store creates them (queues, schedules, migration records) the next time it opens the file",
            None,
        )
    } else {
        Check::note(
            "work-schema",
            format!(
                "the claimable-work tables {} are missing: the store creates them the next time it opens the file",
                missing.join(", ")
            ),
            None,
        )
    }
}

/// The fix of every permission finding.
const PERMISSIONS_FIX: &str = "give every user that runs baton write access to the file, its -wal and -shm files and its directory (one group for all of them: chgrp -R, chmod g+w on the files, chmod g+ws on the directory)";

/// The checks SQLite answers; a permission problem found already (`writable` false) is
/// not reported again.
fn database_checks(
    facts: &StoreFile,
    database: &DatabaseFacts,
    owner: &str,
    writable: bool,
) -> Vec<Check> {
    let path = facts.path.display();
    let (
        read_time,
        application_id,
        schema_version,
        objects,
        missing_work_tables,
        journal_mode,
        write_lock,
    ) = match database {
        DatabaseFacts::Read {
            read_time,
            application_id,
            schema_version,
            objects,
            missing_work_tables,
            journal_mode,
            write_lock,
        } => (
            read_time,
            *application_id,
            *schema_version,
            *objects,
            missing_work_tables,
            journal_mode,
            write_lock,
        ),
        // The permission findings above already say why SQLite cannot open it.
        DatabaseFacts::Unreadable { .. } if !writable => return Vec::new(),
        DatabaseFacts::Unreadable { error } => {
            return vec![Check::finding(
                "connect",
                format!("SQLite cannot open {path}: {error}"),
                "check that the user baton runs as can read and write the file, its -wal and -shm files and its directory; replace a corrupt file (grants are short-lived: an empty file is a valid store)",
            )];
        }
    };
    let mut checks = vec![Check::ok(
        "connect",
        format!(
            "opened the file and read its header in {}",
            millis(*read_time)
        ),
    )];
    let fresh = application_id == 0 && schema_version == 0 && objects == 0;
    checks.push(if fresh {
        Check::note(
            "schema",
            "the file is empty: baton creates its schema at first use",
            None,
        )
    } else if application_id != APPLICATION_ID {
        Check::finding(
            "schema",
            format!("{path} is not a baton store (application_id {application_id:#x}): baton refuses to open another application's database"),
            "point the store URL at a new file",
        )
    } else if schema_version > SCHEMA_VERSION {
        Check::finding(
            "schema",
            format!("{path} has schema version {schema_version}, newer than version {SCHEMA_VERSION} that this baton understands"),
            "upgrade baton to the version that wrote the file",
        )
    } else {
        Check::ok(
            "schema",
            format!("a baton store, schema version {schema_version}"),
        )
    });
    if fresh || application_id == APPLICATION_ID {
        checks.push(work_schema(missing_work_tables));
    }
    if journal_mode == "wal" {
        checks.push(Check::ok("wal", "journal_mode is wal"));
    } else if !fresh {
        checks.push(Check::finding(
            "wal",
            format!("journal_mode is {journal_mode}, not wal: readers would block the writer, and baton refuses to open the file"),
            "open it once with baton on a local file system, which switches it to WAL; if it stays, the file system lacks the shared memory WAL needs",
        ));
    }
    if !writable {
        // Already reported above, with the cause.
        return checks;
    }
    checks.push(match write_lock {
        WriteProbe::Taken(took) => Check::ok(
            "permissions",
            format!("{} can take the write lock (took {})", user(facts), millis(*took)),
        ),
        WriteProbe::ReadOnly => Check::finding(
            "permissions",
            format!(
                "SQLite opened {path} read-only for {} ({owner}): its -wal or -shm file is not writable, so every claim would fail",
                user(facts)
            ),
            PERMISSIONS_FIX,
        ),
        WriteProbe::Busy => Check::finding(
            "permissions",
            format!(
                "another connection held the write lock for longer than busy_timeout ({})",
                millis(facts.options.get_busy_timeout())
            ),
            "find the process holding a long write transaction (an open sqlite3 shell, a backup with cp), or raise busy_timeout in the store URL",
        ),
        WriteProbe::Failed(error) => Check::finding(
            "permissions",
            format!("taking the write lock failed: {error}"),
            "check the file, its -wal and -shm files and the disk (space, read-only mount)",
        ),
    });
    checks
}

#[cfg(test)]
mod tests {
    use super::*;
    use baton_core::doctor::Verdict;

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

    #[tokio::test]
    async fn a_fresh_store_is_healthy() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}/baton.db", dir.path().display());
        let report = diagnose(&url).await.unwrap();
        assert!(report.is_healthy(), "{report:#?}");
        drop(crate::SqliteStore::connect(&url).await.unwrap());
        let report = diagnose(&url).await.unwrap();
        assert!(report.is_healthy(), "{report:#?}");
        let names: Vec<_> = report.checks.iter().map(|c| c.name).collect();
        for name in ["file", "connect", "schema", "wal", "permissions", "clock"] {
            assert!(names.contains(&name), "{name} missing from {names:?}");
        }
    }

    /// The one check named `name`.
    fn check<'a>(report: &'a Report, name: &str) -> &'a Check {
        let found: Vec<_> = report.checks.iter().filter(|c| c.name == name).collect();
        assert_eq!(found.len(), 1, "{name} in {report:#?}");
        found[0]
    }

    #[tokio::test]
    async fn work_tables_absent_partial_and_present() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("baton.db");
        let url = format!("sqlite://{}", path.display());
        let tables = |path: &std::path::Path| -> Vec<String> {
            let conn = rusqlite::Connection::open(path).unwrap();
            let mut statement = conn
                .prepare("SELECT name FROM sqlite_schema WHERE type = 'table' AND name LIKE 'baton_work_%' ORDER BY name")
                .unwrap();
            statement
                .query_map([], |r| r.get(0))
                .unwrap()
                .collect::<rusqlite::Result<_>>()
                .unwrap()
        };

        // A store file from before the work tables: a note, and doctor creates none.
        drop(crate::SqliteStore::connect(&url).await.unwrap());
        let conn = rusqlite::Connection::open(&path).unwrap();
        for table in WORK_TABLES {
            conn.execute_batch(&format!("DROP TABLE {table}")).unwrap();
        }
        drop(conn);
        let report = diagnose(&url).await.unwrap();
        let work = check(&report, "work-schema");
        assert_eq!(work.verdict, Verdict::Note, "{work:?}");
        assert!(
            work.detail.starts_with("no claimable-work tables"),
            "{work:?}"
        );
        assert!(report.is_healthy(), "{report:#?}");
        assert_eq!(tables(&path), Vec::<String>::new());

        // Opening the store again creates them: present.
        drop(crate::SqliteStore::connect(&url).await.unwrap());
        let report = diagnose(&url).await.unwrap();
        let work = check(&report, "work-schema");
        assert_eq!(work.verdict, Verdict::Ok, "{work:?}");
        assert!(work.detail.contains("present"), "{work:?}");
        assert_eq!(tables(&path).len(), WORK_TABLES.len());

        // One missing: a note that names it.
        rusqlite::Connection::open(&path)
            .unwrap()
            .execute_batch("DROP TABLE baton_work_schedule")
            .unwrap();
        let report = diagnose(&url).await.unwrap();
        let work = check(&report, "work-schema");
        assert_eq!(work.verdict, Verdict::Note, "{work:?}");
        assert!(
            work.detail
                .starts_with("the claimable-work tables baton_work_schedule are missing"),
            "{work:?}"
        );
    }
}
