//! The claimable-work store interface: the atoms under queues, schedules and migrations.
//!
//! Policy lives once in [`work`](super) (validation, defaults, backoff, dead-lettering
//! decisions, cron arithmetic, workers, telemetry); a store implements only these atoms,
//! each atomic on the store (one statement or one transaction) and deciding time on the
//! store's own clock. The conformance rules (module `work::conformance`, feature
//! `conformance`, macro `work_conformance_tests!`) check every store against this contract.
//!
//! Three traits, one per concern, so a store can offer claimable work as a whole through
//! [`WorkStore`]:
//!
//! # [`QueueStore`] contract
//! - Items live in a queue named by a [`StoreKey`] (`<namespace>:queue:<name>`). Each item
//!   has an id assigned by the store (unique per store, increasing in enqueue order), its
//!   payload bytes, an optional de-duplication id, a `run_at` time, an attempt count
//!   (starting at 0), `max_attempts`, and a state: *ready* (waiting for `run_at`),
//!   *running* (claimed: a token and a `locked_until` time), or *dead* (dead-lettered).
//! - [`enqueue`](QueueStore::enqueue) takes a batch in one transaction. An item with a
//!   de-duplication id is a no-op answering [`Enqueued::Duplicate`] (with the id of the
//!   item that holds the de-duplication id) when an item with the same id was enqueued in
//!   the same queue within that earlier item's window, whether or not the earlier item has
//!   been completed since; otherwise it is added with `run_at = now + delay`. Duplicates
//!   inside one batch are answered the same way.
//! - [`claim`](QueueStore::claim) atomically takes up to `batch` eligible items of one
//!   queue — *ready* with `run_at <= now`, or *running* with `locked_until <= now` (a lapsed
//!   lease) — oldest `run_at` first, then lowest id; stamps each with the request's token,
//!   `locked_until = now + lease`, state *running*, attempt + 1; and returns them. Two
//!   concurrent claims never return the same item (PostgreSQL `FOR UPDATE SKIP LOCKED`,
//!   SQLite one conditional `UPDATE` in a write transaction). An empty queue answers an
//!   empty vector.
//! - [`complete`](QueueStore::complete), [`fail`](QueueStore::fail),
//!   [`extend`](QueueStore::extend) and [`release`](QueueStore::release) act only on a
//!   *running* item whose token equals the caller's. Ownership ends when another claim takes
//!   the item, not when the lease lapses: a late complete from the last claimer, with no
//!   claim in between, is accepted. Anything else answers `NotOwner` (`Renewal::NotHeld` for an extend) and
//!   changes nothing.
//!   - `complete` deletes the item (its de-duplication id stays remembered for its window).
//!   - `fail` with [`FailPlan::Retry`] makes it *ready* again with `run_at = now + after` and
//!     stores the error text; with [`FailPlan::DeadLetter`] makes it *dead* with the error.
//!   - `extend` sets `locked_until = now + lease`.
//!   - `release` makes it *ready* with `run_at = now`, the attempt count minus one (a
//!     release is not an attempt), and no token.
//! - [`stats`](QueueStore::stats) counts items per queue whose key starts with a prefix.
//! - [`dead_letters`](QueueStore::dead_letters) lists dead items, oldest first.
//!
//! # [`ScheduleStore`] contract
//! - A schedule row (named by `<namespace>:schedule:<name>`) holds a cron spec, the unix
//!   time in milliseconds of its next due tick (`due_at_ms`), and the record of the last
//!   run. [`register`](ScheduleStore::register_schedule) inserts a row when absent; when the
//!   row exists with a different spec, it replaces the spec and `due_at_ms`; with the same
//!   spec it changes nothing. It answers the row as stored.
//! - [`advance`](ScheduleStore::advance_schedule) is the claim of one tick: one conditional
//!   update that sets `due_at_ms = next_due_ms` only if the stored `due_at_ms` equals
//!   `expected_due_ms` *and* `expected_due_ms <= now` on the store's clock; when `ran`, it
//!   also records the holder, the time and one more run. Of any number of concurrent
//!   advances of one tick, exactly one answers [`Advance::Claimed`].
//! - [`now_ms`](ScheduleStore::now_ms) is the store's wall clock (unix milliseconds), the
//!   clock `advance` compares against.
//!
//! # [`MigrationStore`] contract
//! - A migration record is `(set, name)` with a [`MigrationState`], the writer that claimed
//!   it, a lease end on the store's clock, the attempt count and the last error.
//! - [`claim_migration`](MigrationStore::claim_migration) is one compare-and-set: absent →
//!   insert *pending* owned by `writer`, attempt 1; *failed* or *rolled back*, *pending*
//!   whose lease lapsed, or *pending* owned by `writer` itself (lapsed or not: a writer
//!   claiming again has given up its earlier claim, e.g. a run retrying after a store fault)
//!   → take it (owner `writer`, attempt + 1, lease restarted), answering the previous
//!   state; *completed* → [`MigrationClaim::Completed`]; *pending* with a live lease of
//!   another writer → [`MigrationClaim::Busy`] with the owner and its remaining lease.
//! - [`heartbeat_migration`](MigrationStore::heartbeat_migration) and
//!   [`finish_migration`](MigrationStore::finish_migration) act only on a *pending* record
//!   owned by `writer` (as for queue items, ownership ends at a takeover, not when the lease
//!   lapses); otherwise `Renewal::NotHeld` / `Settle::NotOwner`, nothing changed.
//!
//! Store faults are errors of kind `Unavailable`; they never look like "empty", "duplicate"
//! or "not owner".

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;

use crate::error::Result;
use crate::holder::Holder;
use crate::key::StoreKey;
use crate::store::Renewal;
use crate::time::Ttl;

/// An item's id, assigned by the store: unique per store, increasing in enqueue order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ItemId(pub i64);

impl fmt::Display for ItemId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

/// One item of an [`enqueue`](QueueStore::enqueue) batch.
#[derive(Debug, Clone, Copy)]
pub struct NewItem<'a> {
    /// The payload, stored as given.
    pub payload: &'a [u8],
    /// The de-duplication id and how long it is remembered, if any.
    pub dedup: Option<(&'a str, Ttl)>,
    /// How long after now the item becomes claimable (zero: at once).
    pub delay: Duration,
    /// The number of claims after which a failure dead-letters the item (at least 1).
    pub max_attempts: u32,
}

/// The answer for one item of [`QueueStore::enqueue`], in batch order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Enqueued {
    /// The item was added with this id.
    Added(ItemId),
    /// An item with the same de-duplication id was enqueued within its window; nothing was
    /// added. The id is that earlier item's (it may have been completed since).
    Duplicate(ItemId),
}

/// What [`QueueStore::claim`] is asked to do.
#[derive(Debug, Clone, Copy)]
pub struct ClaimRequest<'a> {
    /// The token stamped on every claimed item: a fresh random 128-bit value per claim.
    pub token: &'a Holder,
    /// At most this many items (at least 1).
    pub batch: u32,
    /// How long the claimer owns each item without extending.
    pub lease: Ttl,
}

/// An item as [`QueueStore::claim`] hands it out.
#[derive(Clone, PartialEq, Eq)]
pub struct ClaimedItem {
    /// The item's id.
    pub id: ItemId,
    /// The payload as enqueued.
    pub payload: Vec<u8>,
    /// This claim's attempt number, from 1.
    pub attempt: u32,
    /// The item's `max_attempts`.
    pub max_attempts: u32,
    /// The de-duplication id it was enqueued with, if any.
    pub dedup_id: Option<String>,
    /// The error text of the last failed attempt; empty when none.
    pub last_error: String,
}

impl fmt::Debug for ClaimedItem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClaimedItem")
            .field("id", &self.id)
            .field("payload_bytes", &self.payload.len())
            .field("attempt", &self.attempt)
            .field("max_attempts", &self.max_attempts)
            .field("dedup_id", &self.dedup_id)
            .field("last_error", &self.last_error)
            .finish()
    }
}

/// The item an atom acts on: its queue, its id, and the token of the claim that holds it.
/// [`complete`](QueueStore::complete), [`fail`](QueueStore::fail),
/// [`extend`](QueueStore::extend) and [`release`](QueueStore::release) act only when the
/// token still owns the item.
#[derive(Debug, Clone, Copy)]
pub struct ItemRef<'a> {
    /// The qualified queue key.
    pub queue: &'a StoreKey,
    /// The item's id.
    pub id: ItemId,
    /// The token of the claim that took it.
    pub token: &'a Holder,
}

impl<'a> ItemRef<'a> {
    /// Item `id` of `queue`, as held by `token`.
    pub fn new(queue: &'a StoreKey, id: ItemId, token: &'a Holder) -> Self {
        ItemRef { queue, id, token }
    }
}

/// What [`QueueStore::fail`] does with the item.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailPlan {
    /// Make it claimable again after this delay.
    Retry {
        /// The backoff before the next attempt.
        after: Duration,
    },
    /// Dead-letter it: it stays, but is never claimed again.
    DeadLetter,
}

/// The answer of [`QueueStore::complete`], [`QueueStore::fail`] and
/// [`QueueStore::release`] (and of [`MigrationStore::finish_migration`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settle {
    /// The caller owned it; the change was made.
    Settled,
    /// The caller does not own it (another claim took it, or it is gone); nothing changed.
    NotOwner,
}

/// Counts of one queue, as [`QueueStore::stats`] reports them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueStats {
    /// The qualified queue key (`<namespace>:queue:<name>`), as stores report it; the name
    /// the queue was opened with is [`QueueStats::queue`].
    pub key: StoreKey,
    /// Ready items whose `run_at` has come.
    pub ready: u64,
    /// Ready items waiting for a later `run_at` (delayed, or backing off).
    pub scheduled: u64,
    /// Running items whose lease is live.
    pub running: u64,
    /// Running items whose lease lapsed (claimable again).
    pub expired: u64,
    /// Dead-lettered items.
    pub dead: u64,
    /// How long the oldest claimable item (ready and due, or expired) has been claimable.
    pub oldest_due: Option<Duration>,
}

impl QueueStats {
    /// The counts of a queue with no items.
    pub fn empty(key: StoreKey) -> Self {
        QueueStats {
            key,
            ready: 0,
            scheduled: 0,
            running: 0,
            expired: 0,
            dead: 0,
            oldest_due: None,
        }
    }

    /// The queue's name, as it was given to [`Queue::new`](super::Queue::new) or
    /// `baton.queue(name)`.
    pub fn queue(&self) -> &str {
        self.key.user_key()
    }
}

/// A dead-lettered item, as [`QueueStore::dead_letters`] lists it.
#[derive(Clone, PartialEq, Eq)]
pub struct DeadItem {
    /// The item's id.
    pub id: ItemId,
    /// The payload as enqueued.
    pub payload: Vec<u8>,
    /// How many attempts were made.
    pub attempts: u32,
    /// The de-duplication id, if any.
    pub dedup_id: Option<String>,
    /// The error text of the last attempt.
    pub error: String,
}

impl fmt::Debug for DeadItem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeadItem")
            .field("id", &self.id)
            .field("payload_bytes", &self.payload.len())
            .field("attempts", &self.attempts)
            .field("dedup_id", &self.dedup_id)
            .field("error", &self.error)
            .finish()
    }
}

/// The queue atoms of one store. See the [module documentation](self) for the contract.
#[async_trait]
pub trait QueueStore: Send + Sync + fmt::Debug + 'static {
    /// Adds a batch of items in one transaction, de-duplicating by id within each window.
    async fn enqueue(&self, queue: &StoreKey, items: &[NewItem<'_>]) -> Result<Vec<Enqueued>>;

    /// Claims up to `request.batch` eligible items.
    async fn claim(&self, queue: &StoreKey, request: ClaimRequest<'_>) -> Result<Vec<ClaimedItem>>;

    /// Deletes the item if `token` owns it.
    async fn complete(&self, item: ItemRef<'_>) -> Result<Settle>;

    /// Retries or dead-letters the item if `token` owns it, storing `error`.
    async fn fail(&self, item: ItemRef<'_>, plan: FailPlan, error: &str) -> Result<Settle>;

    /// Restarts the item's lease if `token` owns it.
    async fn extend(&self, item: ItemRef<'_>, lease: Ttl) -> Result<Renewal>;

    /// Returns the item to the queue at once, not counting the attempt, if `token` owns it.
    async fn release(&self, item: ItemRef<'_>) -> Result<Settle>;

    /// Counts of every queue whose qualified key starts with `prefix`, ordered by key.
    /// Queues with no items are not listed.
    async fn stats(&self, prefix: &str) -> Result<Vec<QueueStats>>;

    /// Up to `limit` dead-lettered items of the queue, oldest first.
    async fn dead_letters(&self, queue: &StoreKey, limit: u32) -> Result<Vec<DeadItem>>;
}

/// A schedule row as a store reads it back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScheduleRow {
    /// The qualified schedule key.
    pub name: StoreKey,
    /// The cron spec, as registered.
    pub spec: String,
    /// The next due tick, unix milliseconds.
    pub due_at_ms: i64,
    /// How many ticks ran.
    pub runs: u64,
    /// The holder that ran the last tick, and when it claimed it (unix milliseconds).
    pub last_run: Option<(Holder, i64)>,
}

/// A schedule as [`ScheduleStore::register_schedule`] registers it.
#[derive(Debug, Clone, Copy)]
pub struct NewSchedule<'a> {
    /// The qualified schedule key.
    pub name: &'a StoreKey,
    /// The cron spec, stored as given.
    pub spec: &'a str,
    /// The first due tick (unix milliseconds), used when the row is new or its spec changed.
    pub first_due_ms: i64,
}

impl<'a> NewSchedule<'a> {
    /// Schedule `name` running on `spec`, first due at `first_due_ms`.
    pub fn new(name: &'a StoreKey, spec: &'a str, first_due_ms: i64) -> Self {
        NewSchedule {
            name,
            spec,
            first_due_ms,
        }
    }
}

/// What [`ScheduleStore::advance_schedule`] is asked to do (the claim of one tick): named fields, so that the two
/// due times cannot be passed in each other's place.
#[derive(Debug, Clone, Copy)]
pub struct TickClaim<'a> {
    /// The due time the caller read (unix milliseconds): the row moves only from there.
    pub expected_due_ms: i64,
    /// The due time of the tick after it (unix milliseconds).
    pub next_due_ms: i64,
    /// Who claims the tick.
    pub holder: &'a Holder,
    /// Whether the tick runs (recorded as a run) or is skipped.
    pub ran: bool,
}

/// The answer of [`ScheduleStore::advance_schedule`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Advance {
    /// This caller moved the row from the expected tick to the next one.
    Claimed,
    /// The row was not at the expected tick, or the tick is not due yet on the store's
    /// clock; nothing changed.
    Lost,
}

/// The schedule atoms of one store. See the [module documentation](self) for the contract.
#[async_trait]
pub trait ScheduleStore: Send + Sync + fmt::Debug + 'static {
    /// The store's wall clock, unix milliseconds.
    async fn now_ms(&self) -> Result<i64>;

    /// Inserts the row, or replaces spec and due time when the spec changed; answers the row.
    async fn register_schedule(&self, schedule: NewSchedule<'_>) -> Result<ScheduleRow>;

    /// Moves the row from `tick.expected_due_ms` to `tick.next_due_ms` if it is there and due.
    async fn advance_schedule(&self, name: &StoreKey, tick: TickClaim<'_>) -> Result<Advance>;

    /// The row, if registered.
    async fn schedule(&self, name: &StoreKey) -> Result<Option<ScheduleRow>>;

    /// Every row whose key starts with `prefix`, ordered by key.
    async fn schedules(&self, prefix: &str) -> Result<Vec<ScheduleRow>>;

    /// Deletes the row; `true` when there was one.
    async fn remove_schedule(&self, name: &StoreKey) -> Result<bool>;
}

/// Where a migration stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MigrationState {
    /// Claimed by a writer that is running (or was running) `up()` or `down()`.
    Pending,
    /// `up()` finished.
    Completed,
    /// `up()` failed and `down()` failed or was not given.
    Failed,
    /// `up()` failed and `down()` undid it.
    RolledBack,
}

impl MigrationState {
    /// The state as stored: `pending`, `completed`, `failed`, `rolled_back`.
    pub fn as_str(self) -> &'static str {
        match self {
            MigrationState::Pending => "pending",
            MigrationState::Completed => "completed",
            MigrationState::Failed => "failed",
            MigrationState::RolledBack => "rolled_back",
        }
    }

    /// Parses a stored state.
    pub fn parse(text: &str) -> Option<Self> {
        Some(match text {
            "pending" => MigrationState::Pending,
            "completed" => MigrationState::Completed,
            "failed" => MigrationState::Failed,
            "rolled_back" => MigrationState::RolledBack,
            _ => return None,
        })
    }
}

/// A migration record as a store reads it back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigrationRecord {
    /// The migration's name within its set.
    pub name: String,
    /// Where it stands.
    pub state: MigrationState,
    /// The writer that claimed it last.
    pub claimed_by: Holder,
    /// The claim number, from 1.
    pub attempt: u32,
    /// Time left on the writer's lease: zero when lapsed, and for finished records.
    pub lease_remaining: Duration,
    /// The error text of the last failure; empty when none.
    pub error: String,
}

/// The answer of [`MigrationStore::claim_migration`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MigrationClaim {
    /// `writer` owns the record now, at `pending`.
    Claimed {
        /// The claim number, from 1.
        attempt: u32,
        /// `None` for a new record; otherwise the state taken over (`Failed`,
        /// `RolledBack`, or `Pending`: a lapsed lease, or the writer's own earlier claim).
        previous: Option<MigrationState>,
    },
    /// The migration already completed; nothing changed.
    Completed,
    /// Another writer's claim is live; nothing changed. Never the caller's own claim.
    Busy {
        /// The owner.
        by: Holder,
        /// Its remaining lease.
        remaining: Duration,
    },
}

/// A writer's hold on one migration record, as the migration atoms take it: the set, the
/// migration's name, and the writer's token.
#[derive(Debug, Clone, Copy)]
pub struct Writer<'a> {
    /// The qualified key of the migration set.
    pub set: &'a StoreKey,
    /// The migration's name within the set.
    pub name: &'a str,
    /// The writer's token: a fresh random value per run.
    pub token: &'a Holder,
}

impl<'a> Writer<'a> {
    /// `token`'s hold on migration `name` of `set`.
    pub fn new(set: &'a StoreKey, name: &'a str, token: &'a Holder) -> Self {
        Writer { set, name, token }
    }
}

/// How a pending migration record ends ([`MigrationStore::finish_migration`]): never
/// `Pending` again, and an error text only where something failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MigrationEnd<'a> {
    /// `up()` finished.
    Completed,
    /// `up()` failed and `down()` failed or was not given; the error text.
    Failed(&'a str),
    /// `up()` failed and `down()` undid it; the error text of `up()`.
    RolledBack(&'a str),
}

impl<'a> MigrationEnd<'a> {
    /// The state the record gets.
    pub fn state(self) -> MigrationState {
        match self {
            MigrationEnd::Completed => MigrationState::Completed,
            MigrationEnd::Failed(_) => MigrationState::Failed,
            MigrationEnd::RolledBack(_) => MigrationState::RolledBack,
        }
    }

    /// The error text stored with it: empty for `Completed`.
    pub fn error(self) -> &'a str {
        match self {
            MigrationEnd::Completed => "",
            MigrationEnd::Failed(error) | MigrationEnd::RolledBack(error) => error,
        }
    }
}

/// The migration-record atoms of one store. See the [module documentation](self).
#[async_trait]
pub trait MigrationStore: Send + Sync + fmt::Debug + 'static {
    /// Compare-and-set claim of one migration record (taking over `writer`'s own pending
    /// claim too, live or not).
    async fn claim_migration(&self, writer: Writer<'_>, lease: Ttl) -> Result<MigrationClaim>;

    /// Restarts the lease of `writer`'s pending record.
    async fn heartbeat_migration(&self, writer: Writer<'_>, lease: Ttl) -> Result<Renewal>;

    /// Ends `writer`'s pending record as `end` says, storing its error text.
    async fn finish_migration(&self, writer: Writer<'_>, end: MigrationEnd<'_>) -> Result<Settle>;

    /// Every record of the set, ordered by name.
    async fn migrations(&self, set: &StoreKey) -> Result<Vec<MigrationRecord>>;
}

/// A store offering all of claimable work: queues, schedules and migration records.
pub trait WorkStore: QueueStore + ScheduleStore + MigrationStore {}

impl<T: QueueStore + ScheduleStore + MigrationStore> WorkStore for T {}
