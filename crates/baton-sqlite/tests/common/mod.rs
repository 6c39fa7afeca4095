//! Helpers shared by this crate's integration tests: the conformance harness on a database
//! file in a temp dir of its own.

#![allow(dead_code, unreachable_pub)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use async_trait::async_trait;
use baton_core::StoreKey;
use baton_sqlite::{SqliteOptions, SqliteStore};
use baton_testkit::harness::{Evictor, Opener, Stores};

/// A store on `path` with the default options.
pub async fn open(path: &Path) -> SqliteStore {
    open_with(path, SqliteOptions::new()).await
}

/// A store on `path` with `options`.
pub async fn open_with(path: &Path, options: SqliteOptions) -> SqliteStore {
    SqliteStore::open(path, options)
        .await
        .expect("open the store")
}

/// A store on `path` that gives up on another connection's write lock after `busy`.
pub async fn open_impatient(path: &Path, busy: Duration) -> SqliteStore {
    open_with(path, SqliteOptions::new().busy_timeout(busy)).await
}

/// The processes queued for a key of the file at `db`: the entries of its wake-up directory
/// that are not sockets.
pub fn queued(db: &Path) -> usize {
    let mut dir = db.as_os_str().to_owned();
    dir.push("-wake");
    std::fs::read_dir(PathBuf::from(dir))
        .map(|entries| {
            entries
                .filter_map(|e| e.ok())
                .filter(|e| !e.file_name().to_string_lossy().starts_with("p."))
                .count()
        })
        .unwrap_or(0)
}

/// Waits (up to 20 s) until `n` processes are queued on the file at `db`.
pub async fn until_queued(db: &Path, n: usize) {
    baton_testkit::process::wait_until_async(
        &format!("{n} processes queued"),
        Duration::from_secs(20),
        || queued(db) == n,
    )
    .await
    .unwrap();
}

/// A connection of its own (as an operator's `sqlite3` shell) holding the file's write
/// lock until it runs `ROLLBACK`.
pub fn write_lock(path: &Path) -> rusqlite::Connection {
    let conn = rusqlite::Connection::open(path).expect("operator connection");
    conn.busy_timeout(Duration::from_secs(5)).unwrap();
    conn.execute_batch("BEGIN IMMEDIATE")
        .expect("BEGIN IMMEDIATE");
    conn
}

/// A database file in a temp dir that lives as long as this value. Opens a new store on
/// the file; evicts a grant by deleting its row with a connection of its own, as an operator
/// in the `sqlite3` shell would.
pub struct TempFile {
    /// The database file (not created until a store opens it).
    pub path: PathBuf,
    _dir: tempfile::TempDir,
}

impl TempFile {
    /// A file at `relative` (which may name folders the store creates) in a new temp dir.
    pub fn new(relative: &str) -> TempFile {
        let dir = tempfile::tempdir().expect("temp dir");
        TempFile {
            path: dir.path().join(relative),
            _dir: dir,
        }
    }
}

#[async_trait]
impl Opener for TempFile {
    type Store = SqliteStore;

    async fn open(&self) -> SqliteStore {
        open(&self.path).await
    }
}

#[async_trait]
impl Evictor for TempFile {
    async fn evict(&self, key: &StoreKey) {
        let path = self.path.clone();
        let key = key.as_str().to_owned();
        let deleted = tokio::task::spawn_blocking(move || {
            let conn = rusqlite::Connection::open(&path).expect("operator connection");
            conn.busy_timeout(Duration::from_secs(5)).unwrap();
            conn.execute("DELETE FROM baton_grant WHERE key = ?1", [&key])
                .expect("operator delete")
        })
        .await
        .unwrap();
        assert_eq!(deleted, 1, "nothing to evict");
    }
}

/// The conformance harness on `baton.db` in a temp dir of its own.
pub async fn harness() -> Stores<TempFile> {
    Stores::new(TempFile::new("baton.db"))
}
