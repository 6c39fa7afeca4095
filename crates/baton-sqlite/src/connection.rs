//! Running SQLite statements without blocking the async executor.
//!
//! rusqlite is synchronous, and a statement may wait for another process's lock (up to
//! `busy_timeout`) or for the disk. Every operation therefore runs on tokio's blocking
//! threads (`spawn_blocking`) with a connection taken from a small pool:
//!
//! - **one writer connection** per store for claim, renew, release, evict and prune. SQLite
//!   admits one writer per file at a time anyway; queueing this process's writers on a fair
//!   async semaphore costs nothing, where letting them collide inside SQLite would put them
//!   to sleep and retry. Other processes (and other stores on the same file) wait in the
//!   busy handler, up to `busy_timeout` (see `busy`).
//! - **up to [`READERS`] reader connections** for inspect and list. In WAL mode readers
//!   never wait for the writer.
//!
//! Connections are opened lazily and kept while the path still names the file they are on:
//! each operation compares the two first (one `stat`, see [`crate::file`]), closes the
//! connections on a deleted or replaced file, and opens, checks and prepares the file now at
//! the path, emitting `baton.sqlite.file_replaced`. A holder whose file was replaced so
//! finds at its next renewal that it holds nothing. A connection left inside a transaction by a
//! failure is dropped rather than reused. When the store is dropped, its connections are
//! closed on a blocking thread (the last connection to a file checkpoints the log, which
//! is disk I/O).

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use crate::wakeups::FileWakeups;
use baton_core::telemetry::{self, events};
use baton_core::{Error, Result};
use rusqlite::Connection;
use tokio::sync::Semaphore;

use crate::busy;
use crate::error::OpError;
use crate::file::FileId;
use crate::options::SqliteOptions;
use crate::schema::{self, Owner};

/// Most reader connections one store opens.
pub(crate) const READERS: usize = 2;

/// Which connections an operation needs.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Role {
    /// A write transaction.
    Write,
    /// A read.
    Read,
}

#[derive(Debug)]
struct Pool {
    permits: Arc<Semaphore>,
    idle: Mutex<Vec<Pooled>>,
}

impl Pool {
    fn new(size: usize) -> Self {
        Pool {
            permits: Arc::new(Semaphore::new(size)),
            idle: Mutex::new(Vec::with_capacity(size)),
        }
    }

    fn idle(&self) -> std::sync::MutexGuard<'_, Vec<Pooled>> {
        self.idle.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// An idle connection on `current` (the file at the path now), and the connections on
    /// a file that is no longer there, for the caller to close once it has a new one (while
    /// they hold the old file open, its inode number cannot be given to a new file).
    fn take(&self, current: Option<FileId>) -> (Option<Pooled>, Vec<Pooled>) {
        let mut idle = self.idle();
        let stale: Vec<_> = idle
            .extract_if(.., |(_, file)| Some(*file) != current)
            .collect();
        (idle.pop(), stale)
    }
}

/// A connection and the file it is on.
type Pooled = (Connection, FileId);

/// One open database file: its connections, options and release wake-ups.
#[derive(Debug)]
pub(crate) struct Database {
    /// The path as given to open.
    pub(crate) path: PathBuf,
    /// The options it was opened with.
    pub(crate) options: SqliteOptions,
    /// The release wake-ups shared by every store on this file in this process.
    pub(crate) wakeups: Arc<FileWakeups>,
    /// The file the store last opened and prepared at `path`.
    file: Mutex<FileId>,
    writer: Pool,
    readers: Pool,
}

impl Database {
    /// A database whose first writer connection is `writer`, on `file` (already prepared).
    pub(crate) fn new(
        path: PathBuf,
        options: SqliteOptions,
        wakeups: Arc<FileWakeups>,
        (writer, file): Pooled,
    ) -> Self {
        let db = Database {
            path,
            options,
            wakeups,
            file: Mutex::new(file),
            writer: Pool::new(1),
            readers: Pool::new(READERS),
        };
        db.writer.idle().push((writer, file));
        db
    }

    /// Opens a connection to the file at the path. When that is not the file the store
    /// prepared last (it was deleted or replaced), checks and prepares the new one first,
    /// and says so.
    fn connect(&self) -> Result<(Connection, FileId)> {
        let opening = |e: OpError| e.into_error("opening a connection", &self.path);
        let (conn, file, owner) = schema::connect(&self.path, &self.options).map_err(opening)?;
        let mut prepared = self.file.lock().unwrap_or_else(|p| p.into_inner());
        // A new file is prepared whatever its inode number: the number of a file nobody
        // holds open any more may be given to the next one.
        let replaced = *prepared != file;
        if replaced || owner == Owner::New {
            schema::prepare(&conn).map_err(opening)?;
            *prepared = file;
        }
        drop(prepared);
        // Once per file: a second connection to a new file prepares it too (idempotent),
        // but it is the same replacement.
        if replaced {
            telemetry::emit(
                &events::SQLITE_FILE_REPLACED,
                None,
                format_args!(
                    "SQLite file {} is no longer the file this store opened (it was deleted, or another file was moved over it); the grants in the old file are gone, and the store uses the file now at the path",
                    self.path.display()
                ),
            );
        }
        Ok((conn, file))
    }

    fn pool(&self, role: Role) -> &Pool {
        match role {
            Role::Write => &self.writer,
            Role::Read => &self.readers,
        }
    }

    /// Runs `op` with a connection of `role` on a blocking thread. `what` names the
    /// operation in errors.
    ///
    /// # Cancel safety
    /// Once `op` has started it runs to its end (commit or rollback) even if this future is
    /// dropped; only the answer is lost.
    pub(crate) async fn run<T, F>(
        self: &Arc<Self>,
        role: Role,
        what: &'static str,
        op: F,
    ) -> Result<T>
    where
        F: FnOnce(&Connection, &Database) -> Result<T, OpError> + Send + 'static,
        T: Send + 'static,
    {
        let permit = Arc::clone(&self.pool(role).permits)
            .acquire_owned()
            .await
            .map_err(|_| Error::internal("the SQLite connection pool was closed"))?;
        let db = Arc::clone(self);
        let joined = tokio::task::spawn_blocking(move || {
            let _permit = permit;
            busy::within(db.options.get_busy_timeout(), || {
                let pool = db.pool(role);
                // One stat per operation: a connection on a file that is no longer at the
                // path would renew grants nobody else can see (see `file`).
                let current = FileId::of(&db.path).ok();
                let (taken, stale) = pool.take(current);
                let (conn, file) = match taken {
                    Some(taken) => taken,
                    None => db.connect()?,
                };
                drop(stale);
                let result = op(&conn, &db);
                if conn.is_autocommit() {
                    pool.idle().push((conn, file));
                }
                result.map_err(|e| e.into_error(what, &db.path))
            })
        })
        .await;
        match joined {
            Ok(result) => result,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(e) => Err(Error::unavailable(format!(
                "{what} on SQLite file {} was cancelled: the runtime is shutting down",
                self.path.display()
            ))
            .with_source(e)),
        }
    }
}

impl Drop for Database {
    fn drop(&mut self) {
        let mut connections = std::mem::take(&mut *self.writer.idle());
        connections.append(&mut self.readers.idle());
        if connections.is_empty() {
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn_blocking(move || drop(connections));
        }
    }
}
