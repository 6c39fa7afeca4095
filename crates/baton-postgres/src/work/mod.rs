//! Claimable work on PostgreSQL: the atoms of
//! [`QueueStore`](baton_core::work::QueueStore),
//! [`ScheduleStore`](baton_core::work::ScheduleStore) and
//! [`MigrationStore`](baton_core::work::MigrationStore) for
//! [`PostgresStore`](crate::PostgresStore), each one statement on the database server's
//! clock.
//!
//! Use it through `baton_core::work` (queues, workers, the scheduler, the migration
//! coordinator), which owns every policy; this module holds only the atoms and their SQL
//! ([`sql`]).
//!
//! - A claim is one `UPDATE ... FROM (... FOR UPDATE SKIP LOCKED)` ([`sql::CLAIM`]):
//!   concurrent claimers, in one process or many, pass each other's rows and never take the
//!   same item; nothing is held between calls.
//! - Complete, fail, extend and release compare the item's state and token in their
//!   `WHERE` clause: a zombie claimer (its item since claimed by another) changes nothing.
//! - An enqueue of any size is one statement over `unnest`ed arrays ([`sql::ENQUEUE`]), its
//!   de-duplication one `INSERT ... ON CONFLICT` on `baton_work_dedup`.
//! - A schedule tick is claimed by one conditional `UPDATE` ([`sql::ADVANCE_SCHEDULE`]); a
//!   migration by one `INSERT ... ON CONFLICT DO UPDATE ... WHERE` ([`sql::CLAIM_MIGRATION`]).
//! - The tables are created, or migrated, when a store connects (their own version track,
//!   see [`sql::SCHEMA_VERSION`]).
//!
//! ## Behavior
//! - Every call answers within `connect_timeout + response_timeout` or fails with
//!   `Unavailable`; store faults never look like "empty", "duplicate" or "not owner".
//! - A call whose pooled connection had broken (a server restart) is run again on another.
//!   Where the first run may have committed, the answer of the second is taken only when it
//!   means the same either way (a settle answered `NotOwner` after a broken first run is an
//!   `Unavailable` error instead, since that first run may have settled it). An enqueue or
//!   a claim is always run again: an enqueue that had committed adds its items twice (use
//!   de-duplication ids to make that exact: the second run then answers `Duplicate` with
//!   the first run's ids), and items claimed by a lost first run come back when their
//!   lease lapses: at least once, never lost.
//! - Expired de-duplication rows are ignored at once, and swept in the background by every
//!   128th enqueue of a process.
//! - Every commit waits for the WAL flush, as the server is configured: a claim or a
//!   complete lost in a server crash would run an item twice.

mod migrate;
mod queue;
mod schedule;
pub mod sql;

use std::time::Duration;

/// Whole milliseconds of a [`Ttl`](baton_core::Ttl) (at most 30 days: far inside `i64`).
fn ttl_ms(ttl: baton_core::Ttl) -> i64 {
    ttl.as_millis() as i64
}

/// Whole microseconds of a delay, saturating (the server then refuses an interval that far
/// away with `InvalidInput`).
fn micros(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

/// A stored count of microseconds as a duration (negative counts are zero).
fn from_micros(us: i64) -> Duration {
    Duration::from_micros(us.max(0) as u64)
}

/// A stored non-negative integer column that the statements never make negative.
fn count(raw: i64, what: &str) -> Result<u64, sqlx::Error> {
    u64::try_from(raw).map_err(|_| corrupt(format!("{what} is {raw}")))
}

/// An answer no statement of this module returns.
fn corrupt(message: String) -> sqlx::Error {
    sqlx::Error::Decode(message.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conversions() {
        assert_eq!(micros(Duration::from_millis(3)), 3_000);
        assert_eq!(micros(Duration::MAX), i64::MAX);
        assert_eq!(from_micros(-5), Duration::ZERO);
        assert!(count(-1, "a count").is_err());
    }
}
