//! The embedded SQLite store of baton: leases and locks in one file, safe across the
//! processes of one host. Not for direct use; see `baton`, which opens it for
//! `sqlite://` URLs and makes it the default store.
//!
//! Use it when every process that must be excluded runs on one machine (several workers, a
//! cron job and the CLI), or whenever you want coordination without running a server.
//! Grants and their fences live in the file, so they survive restarts. For processes on
//! several hosts use a server store (Redis, PostgreSQL); for a single process in tests,
//! `memory://`.
//!
//! - [`SqliteStore`]: the store; [`SqliteOptions`]: how it is opened.
//! - [`sql`]: every statement it runs, for benchmarks and operators.
//! - [`clock`]: which clock decides expiry, and why.
//! - [`limit`], [`cache`], [`semaphore`]: the rate-limit, cache and permit tables and
//!   statements.
//! - [`idempotency`]: the idempotency log's table and statements, and its two clocks.
//! - [`doctor`]: what `baton doctor` reads about a store file.
//!
//! The user guide page is `docs/sqlite.md`.

#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

mod busy;
pub mod cache;
pub mod clock;
mod connection;
pub mod doctor;
mod error;
mod file;
pub mod idempotency;
pub mod limit;
mod locks;
mod options;
mod schema;
pub mod semaphore;
pub mod sql;
mod url;
mod wakeups;
pub mod work;

pub use locks::SqliteStore;
pub use options::{DEFAULT_BUSY_TIMEOUT, DEFAULT_POLL_INTERVAL, SqliteOptions, Synchronous};
use std::sync::Arc;

use baton_core::Result;
use baton_core::store::{Capability, Store};

/// Every capability but broadcast: processes on one file have no channel to push messages
/// to each other.
impl Store for SqliteStore {
    fn name(&self) -> &'static str {
        "SQLite"
    }

    baton_core::offers!(
        rate_store,
        cache_store,
        idempotency_store,
        work_store,
        semaphore_store
    );

    fn broadcast_store(self: Arc<Self>) -> Result<Arc<dyn baton_core::BroadcastStore>> {
        Err(Capability::Broadcast.unsupported(
            self.name(),
            Some(
                "it has no way to push a message to other processes on the file (polling a table would turn at-most-once delivery into a delayed, unbounded log)",
            ),
        ))
    }
}
