//! Claimable work: queues with claim-leases, workers, a cron scheduler whose every tick runs
//! on exactly one replica, fan-out of a scan into per-record items, and a boot-migration
//! coordinator.
//!
//! Which one to use:
//! - [`Queue`] + [`Worker`]: durable per-item work, at least once, on any replica —
//!   emails to send, webhooks to deliver. [`Item`] is one claimed item.
//! - [`Scheduler`]: "run this every night at 3" on exactly one replica per tick.
//! - [`Queue::fan_out`]: a periodic scan that finds many records (the cron-tickle +
//!   fan-out pattern): run the scan on one replica per tick with the scheduler, enqueue one
//!   item per record de-duplicated by the record's id, and let workers on every replica
//!   process them.
//! - [`Migrations`]: "exactly one replica runs each data migration, in order, at boot".
//! - [`store`]: the atoms a store implements ([`QueueStore`], [`ScheduleStore`],
//!   [`MigrationStore`], together [`WorkStore`]); [`MemoryStore`](crate::MemoryStore) is the
//!   in-process one.
//!
//! The user guide page is `docs/work.md`.

mod backoff;
#[cfg(feature = "conformance")]
pub mod conformance;
mod cron;
mod fan_out;
mod item;
mod memory;
mod migrations;
mod options;
mod queue;
mod schedule;
pub mod store;
mod worker;

pub use backoff::Backoff;
pub use cron::{CronSpec, MAX_CRON_SPEC_BYTES};
pub use fan_out::{FAN_OUT_CHUNK, FanOut};
pub use item::{Failure, Item};
pub(crate) use memory::MemoryWork;
pub use migrations::{
    Contended, LoserPolicy, MAX_CONVERGENCE_WAIT, MAX_MIGRATION_NAME_BYTES, Migration,
    MigrationContext, MigrationError, MigrationFailure, MigrationFn, MigrationOutcome,
    MigrationReport, Migrations, ReturnContended, WaitForConvergence,
};
pub use options::{
    DEFAULT_DEDUP_WINDOW, DEFAULT_LEASE, DEFAULT_MAX_ATTEMPTS, EnqueueOptions, MAX_ATTEMPTS_LIMIT,
    MAX_BATCH, MAX_DEDUP_ID_BYTES, MAX_DELAY, MAX_ERROR_BYTES, MAX_PAYLOAD_BYTES,
    MAX_QUEUE_NAME_BYTES, QueueOptions,
};
pub use queue::{Enqueue, Queue};
pub use schedule::{
    MAX_SCHEDULE_NAME_BYTES, Missed, ScheduleInfo, Scheduler, SchedulerReport, Tick,
};
pub use store::{
    DeadItem, ItemId, MigrationRecord, MigrationState, MigrationStore, QueueStats, QueueStore,
    ScheduleStore, Settle, WorkStore,
};
pub use worker::{Job, MAX_CONCURRENCY, Worker, WorkerReport};
