//! The PostgreSQL store of baton: locks and leases as rows changed by single statements,
//! fences from a sequence, `LISTEN`/`NOTIFY` wake-ups, and stream locks kept in columns of
//! your own table. Not for direct use; see `baton`, which opens it for `postgres://` and
//! `postgresql://` URLs.
//!
//! Use it when the processes to exclude run on several hosts and PostgreSQL is already part
//! of the deployment. Expiry is decided by the database server's `clock_timestamp()`, every
//! grant carries a fence that keeps increasing across restarts and crash recovery, and a
//! release hands the key to the process that has waited longest, in the same statement. No
//! session state and no advisory lock is held between calls, so it works behind
//! transaction-pooling proxies (with `listen=off`).
//!
//! - [`PostgresStore`]: the store; [`PostgresOptions`]: its timeouts, pool and wake-ups.
//! - [`TableLeases`]: leases in columns of a table of yours (the stream-lock storage model),
//!   each atom one conditional `UPDATE`; [`TableLeaseColumns`] names them.
//! - [`sql`]: every statement the store runs, for operators, tests and benchmarks.
//! - [`wakeups`]: how release notifications become wake-ups, and what happens when the
//!   LISTEN connection drops; [`handoff`]: how a release hands the key to the waiter whose
//!   turn it is.
//! - [`limit`], [`cache`], [`broadcast`]: rate limits (one statement), the cache (an
//!   `UNLOGGED` table) and broadcast over `LISTEN`/`NOTIFY`.
//! - [`doctor`]: what `baton doctor` reads about a server.
//! - [`idempotency`]: the idempotency log's table and statements.
//!
//! The user guide page is `docs/postgres.md`.

#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

pub mod broadcast;
pub mod cache;
mod connection;
pub mod doctor;
mod error;
pub mod handoff;
pub mod idempotency;
pub mod limit;
mod listener;
mod locks;
mod options;
mod schema;
pub mod semaphore;
pub mod sql;
pub mod table;
mod url;
pub mod wakeups;
pub mod work;

pub use locks::PostgresStore;
pub use options::{
    DEFAULT_CONNECT_TIMEOUT, DEFAULT_MAX_CONNECTIONS, DEFAULT_POLL_INTERVAL,
    DEFAULT_RESPONSE_TIMEOUT, Pooler, PostgresOptions,
};
pub use table::{TableLeaseColumns, TableLeases, TableStatements};

use std::sync::Arc;

use baton_core::Result;
use baton_core::broadcast::BroadcastStore;
use baton_core::store::{Capability, Store};

/// Every capability; broadcast only when the store may `LISTEN` (not with `listen=off`).
impl Store for PostgresStore {
    fn name(&self) -> &'static str {
        "PostgreSQL"
    }

    baton_core::offers!(
        rate_store,
        cache_store,
        idempotency_store,
        work_store,
        semaphore_store
    );

    fn broadcast_store(self: Arc<Self>) -> Result<Arc<dyn BroadcastStore>> {
        if !self.options().get_listen() {
            return Err(Capability::Broadcast.unsupported(
                self.name(),
                Some(
                    "it was opened with listen=off (for a transaction-pooling proxy), so it cannot receive notifications; open it with a direct connection",
                ),
            ));
        }
        Ok(self)
    }
}
