//! [`Migrations`]: the boot-migration coordinator — exactly one writer runs each migration
//! of a set, in order, with crash-safe recovery, however many replicas boot at once.
//!
//! Two layers, composed from existing primitives:
//! - **Orchestration: a [lock](crate::Locks)** (`migrate:<set>`, kept alive while held).
//!   The replica that takes it walks the registry; the others wait for convergence (or are
//!   told at once, by policy). The lock only saves duplicate work: nothing relies on it.
//! - **Correctness: one record per migration**, claimed by a compare-and-set
//!   ([`claim_migration`](super::MigrationStore::claim_migration)) that takes an absent,
//!   failed, rolled-back, or pending-with-a-lapsed-lease record (or the writer's own pending
//!   one), under a lease that a heartbeat task renews for the whole of `up()` and, if `up()`
//!   fails, `down()`. Every transition is scoped to the writer that claimed it, so a zombie
//!   writer (resumed after losing its lease) cannot touch its successor's claim. This holds
//!   even when two replicas hold the orchestration lock at once (a lock TTL lapsed under a
//!   pause).
//!
//! ## Behavior
//! - A failed `up()` runs `down()` (if [reversible](super::Migration::reversible)) and
//!   records `rolled_back`, or `failed` when `down()` failed or is missing; the walk stops
//!   there and the run reports the failure. The next run retries that migration.
//! - A writer that died in the middle leaves its record pending; once the record's lease
//!   lapses, the next writer takes it over and runs `up()` again
//!   ([`baton.migration.takeover`](crate::telemetry::events::MIGRATION_TAKEOVER)): `up()` is
//!   at least once, so make it safe to run twice.
//! - Store and lock faults are retried with bounded exponential backoff
//!   ([`baton.migration.unavailable`](crate::telemetry::events::MIGRATION_UNAVAILABLE)),
//!   then fail the run with `Unavailable`, so a short outage does not make a booting
//!   service crash-loop. One run keeps one writer id across its retries: a record it left
//!   pending when the fault struck (its result could not be recorded) is its own, so the
//!   retry takes it over at once and runs `up()` again (a takeover, as above), instead of
//!   waiting out its own lease (or, with [`ReturnContended`], answering that it is
//!   contended with itself).
//! - The loser's behaviour is chosen by type: [`WaitForConvergence`] (for boot: wait until
//!   the set is complete, or failed; never "contended") or [`ReturnContended`] (for an admin
//!   endpoint: answer at once that another replica is migrating).

use std::convert::Infallible;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::{Instant, sleep};

use crate::error::{Error, ErrorKind, Result};
use crate::holder::Holder;
use crate::keepalive::{self, Events, Lifeline, Plan, RenewAtom};
use crate::key::{Key, KeyKind, StoreKey, check_text};
use crate::lock::grant::now;
use crate::lock::{AcquireError, LockOptions, Locks};
use crate::retry::{self, Backoff, jitter};
use crate::telemetry::{self, events};
use crate::time::{Ttl, format_duration};

use super::store::{
    MigrationClaim, MigrationEnd, MigrationRecord, MigrationState, MigrationStore, Settle, Writer,
};

mod step;

pub use step::{Migration, MigrationContext, MigrationError, MigrationFn};

/// Longest migration set or migration name, in bytes of UTF-8.
pub const MAX_MIGRATION_NAME_BYTES: usize = 200;
/// Longest wait of [`WaitForConvergence`].
pub const MAX_CONVERGENCE_WAIT: Duration = Duration::from_secs(24 * 3600);
/// How many times a finish is tried while it hits store faults.
const FINISH_TRIES: u32 = 5;
/// The waits between those tries.
const FINISH_BACKOFF: Backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(2));
/// The waits between the retries of a run that met a store or lock fault.
const RUN_BACKOFF: Backoff = Backoff::new(Duration::from_millis(250), Duration::from_secs(5));

mod sealed {
    #[allow(unreachable_pub)]
    pub trait Sealed {}
}

/// What a run does when another replica holds the orchestration lock: wait
/// ([`WaitForConvergence`]) or answer at once ([`ReturnContended`]). The choice narrows the
/// run's outcome type: with `WaitForConvergence` its
/// [`Contended`](MigrationOutcome::Contended) variant holds [`Infallible`], so a boot path
/// cannot be handed "contended".
pub trait LoserPolicy: sealed::Sealed + Copy + Send + Sync + fmt::Debug + 'static {
    /// What the outcome carries when the run did not migrate because another replica was.
    type Contended: fmt::Debug + Send + 'static;

    #[doc(hidden)]
    fn on_contended(
        &self,
        holder: Option<String>,
        remaining: Option<Duration>,
    ) -> Option<Self::Contended>;

    #[doc(hidden)]
    fn wait_limit(&self) -> Option<Duration>;
}

/// For boot: a loser waits (polling the records) until every migration of the set is
/// completed, or the walk ended in a failure, or the lock is free again (the winner died)
/// and it walks itself; at most `timeout`, then the run fails with `Timeout`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WaitForConvergence {
    /// The longest wait, at most [`MAX_CONVERGENCE_WAIT`].
    pub timeout: Duration,
}

/// For an admin endpoint: a loser answers at once with [`Contended`], both when another
/// replica holds the orchestration lock and when a record is still claimed by a writer whose
/// lease has not lapsed (a dead runner's, or one that lost the lock while `up()` runs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ReturnContended;

/// Another replica holds the orchestration lock, or (when the lock was free) a claim on one
/// of the set's records whose lease has not lapsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Contended {
    /// The lock's holder, or the record's writer, when known.
    pub holder: Option<String>,
    /// Its remaining lock time, when known.
    pub remaining: Option<Duration>,
}

impl sealed::Sealed for WaitForConvergence {}
impl sealed::Sealed for ReturnContended {}

impl LoserPolicy for WaitForConvergence {
    type Contended = Infallible;

    fn on_contended(&self, _: Option<String>, _: Option<Duration>) -> Option<Infallible> {
        None
    }

    fn wait_limit(&self) -> Option<Duration> {
        Some(self.timeout)
    }
}

impl LoserPolicy for ReturnContended {
    type Contended = Contended;

    fn on_contended(
        &self,
        holder: Option<String>,
        remaining: Option<Duration>,
    ) -> Option<Contended> {
        Some(Contended { holder, remaining })
    }

    fn wait_limit(&self) -> Option<Duration> {
        None
    }
}

/// A migration whose `up()` failed in this set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigrationFailure {
    /// Its name.
    pub name: String,
    /// `RolledBack` when `down()` undid it, `Failed` otherwise.
    pub state: MigrationState,
    /// The error text of `up()` (and of `down()`, when it failed too).
    pub error: String,
}

/// How a [`Migrations::run`] ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MigrationOutcome<C = Infallible> {
    /// Every migration of the set is completed (by this run or another).
    Completed,
    /// A migration failed; the migrations after it did not run.
    Failed(MigrationFailure),
    /// Another replica holds the lock, or a record of the set is still claimed by a live
    /// writer ([`ReturnContended`] only).
    Contended(C),
}

/// What a [`Migrations::run`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigrationReport<C = Infallible> {
    /// How the run ended.
    pub outcome: MigrationOutcome<C>,
    /// The migrations this run applied, in order.
    pub ran: Vec<String>,
    /// The migrations this run found completed already.
    pub skipped: Vec<String>,
    /// Of `ran`, those taken over from a writer that stopped in the middle.
    pub took_over: Vec<String>,
    /// Whether this run lost the lock and waited for another replica.
    pub waited: bool,
}

impl<C> MigrationReport<C> {
    fn new() -> Self {
        MigrationReport {
            outcome: MigrationOutcome::Completed,
            ran: Vec::new(),
            skipped: Vec::new(),
            took_over: Vec::new(),
            waited: false,
        }
    }
}

/// The boot-migration coordinator of one migration set.
///
/// # Examples
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), baton_core::Error> {
/// use std::{sync::Arc, time::Duration};
/// use baton_core::{Locks, MemoryStore};
/// use baton_core::work::{
///     MigrationContext, MigrationFn, MigrationOutcome, Migrations,
///     WaitForConvergence,
/// };
///
/// let migrations = Migrations::new(
///     Arc::new(MemoryStore::new()),
///     Locks::new(Arc::new(MemoryStore::new())),
///     "app",
/// )?
/// .migration(MigrationFn::new("001-backfill-emails", |_ctx: MigrationContext| async { Ok(()) }));
///
/// let report = migrations
///     .run(WaitForConvergence { timeout: Duration::from_secs(600) })
///     .await?;
/// match report.outcome {
///     MigrationOutcome::Completed => {}
///     MigrationOutcome::Failed(failure) => panic!("{} failed: {}", failure.name, failure.error),
///     // No `Contended` arm: with WaitForConvergence it cannot happen.
/// }
/// # Ok(()) }
/// ```
pub struct Migrations {
    store: Arc<dyn MigrationStore>,
    locks: Locks,
    set_name: String,
    set: StoreKey,
    steps: Vec<Arc<dyn Migration>>,
    lease: Duration,
    lock_ttl: Duration,
    poll: Duration,
    retries: u32,
}

impl fmt::Debug for Migrations {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.steps.iter().map(|m| m.name()).collect();
        f.debug_struct("Migrations")
            .field("set", &self.set)
            .field("migrations", &names)
            .field("lease", &self.lease)
            .field("lock_ttl", &self.lock_ttl)
            .finish()
    }
}

impl Migrations {
    /// The coordinator of the set `set`, keeping records in `store` and taking the
    /// orchestration lock through `locks` (whose namespace qualifies the set too).
    ///
    /// # Errors
    /// `InvalidInput` for a bad set name.
    pub fn new(store: Arc<dyn MigrationStore>, locks: Locks, set: &str) -> Result<Self> {
        check_text("migration set", set, MAX_MIGRATION_NAME_BYTES)?;
        let set_key = locks
            .namespace()
            .qualify(KeyKind::Migration, &Key::new(set)?);
        Ok(Migrations {
            store,
            locks,
            set_name: set.to_owned(),
            set: set_key,
            steps: Vec::new(),
            lease: Duration::from_secs(60),
            lock_ttl: Duration::from_secs(60),
            poll: Duration::from_millis(500),
            retries: 5,
        })
    }

    /// Appends a migration; migrations run in the order they are added.
    #[must_use]
    pub fn migration(mut self, migration: impl Migration) -> Self {
        self.steps.push(Arc::new(migration));
        self
    }

    /// The lease of a migration record (60 s by default), renewed every third of it while
    /// `up()` and `down()` run: how long a crashed writer blocks the migration.
    #[must_use]
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// The TTL of the orchestration lock (60 s by default), kept alive every third of it.
    #[must_use]
    pub fn lock_ttl(mut self, ttl: Duration) -> Self {
        self.lock_ttl = ttl;
        self
    }

    /// How often a waiting run reads the records (500 ms by default, jittered).
    #[must_use]
    pub fn poll(mut self, poll: Duration) -> Self {
        self.poll = poll;
        self
    }

    /// How many times a run retries after a store or lock fault before it fails (5 by
    /// default; 0 fails at the first fault).
    #[must_use]
    pub fn unavailable_retries(mut self, retries: u32) -> Self {
        self.retries = retries;
        self
    }

    /// The qualified key of the set's records.
    pub fn set_key(&self) -> &StoreKey {
        &self.set
    }

    /// The lock key (within the locks' namespace) of the orchestration lock.
    pub fn lock_key(&self) -> String {
        format!("migrate:{}", self.set_name)
    }

    /// The set's records, ordered by name (also those of migrations no longer registered).
    ///
    /// # Errors
    /// `Unavailable` when the store faulted.
    pub async fn records(&self) -> Result<Vec<MigrationRecord>> {
        self.store.migrations(&self.set).await
    }

    fn validate<P: LoserPolicy>(&self, policy: &P) -> Result<(Ttl, Ttl)> {
        let lease = Ttl::new(self.lease)
            .map_err(|e| Error::invalid_input(format!("migration lease: {}", e.message())))?;
        if lease.get() < Duration::from_millis(30) {
            return Err(Error::invalid_input(
                "migration lease is below 30ms; its heartbeat runs every third of it",
            ));
        }
        let lock_ttl = Ttl::new(self.lock_ttl)
            .map_err(|e| Error::invalid_input(format!("migration lock ttl: {}", e.message())))?;
        if lock_ttl.get() < Duration::from_millis(30) {
            return Err(Error::invalid_input(
                "migration lock ttl is below 30ms; its keep-alive runs every third of it",
            ));
        }
        if self.poll.is_zero() || self.poll > Duration::from_secs(60) {
            return Err(Error::invalid_input(format!(
                "migration poll {} must be above 0 and at most 1m",
                format_duration(self.poll)
            )));
        }
        if let Some(limit) = policy.wait_limit()
            && limit > MAX_CONVERGENCE_WAIT
        {
            return Err(Error::invalid_input(format!(
                "convergence timeout {} is above the maximum of {}",
                format_duration(limit),
                format_duration(MAX_CONVERGENCE_WAIT)
            )));
        }
        let mut seen = std::collections::HashSet::new();
        for m in &self.steps {
            check_text("migration name", m.name(), MAX_MIGRATION_NAME_BYTES)?;
            if !seen.insert(m.name()) {
                return Err(Error::invalid_input(format!(
                    "migration {:?} is added twice to set {:?}",
                    m.name(),
                    self.set_name
                )));
            }
        }
        Ok((lease, lock_ttl))
    }

    /// Runs the set: takes the orchestration lock and walks the migrations in order, or —
    /// when another replica holds the lock — waits for it or answers at once, by `policy`.
    ///
    /// # Errors
    /// `InvalidInput` before any I/O for bad settings, a bad or repeated migration name;
    /// `Unavailable` when store or lock faults outlast the retries; `Timeout` when
    /// [`WaitForConvergence`] waited its whole timeout. A failed migration is not an error:
    /// it is [`MigrationOutcome::Failed`].
    ///
    /// # Cancel safety
    /// Dropping the future (a killed task) stops the heartbeat: the record in progress stays
    /// pending until its lease lapses, then the next writer takes it over. The lock is
    /// released in the background.
    pub async fn run<P: LoserPolicy>(&self, policy: P) -> Result<MigrationReport<P::Contended>> {
        let (lease, lock_ttl) = self.validate(&policy)?;
        let deadline = policy.wait_limit().map(|limit| now() + limit);
        // One writer for the whole run, retries included: a record this run left pending
        // when a fault cut an attempt short is taken over at once (the claim takes the
        // writer's own pending record), not after its lease.
        let writer = Holder::random();
        let mut backoff = RUN_BACKOFF.attempts();
        let mut retries = 0;
        loop {
            match self
                .run_once(&policy, &writer, lease, lock_ttl, deadline)
                .await
            {
                Err(e) if e.is_unavailable() && retries < self.retries => {
                    retries += 1;
                    telemetry::emit(
                        &events::MIGRATION_UNAVAILABLE,
                        Some(self.set.as_str()),
                        format_args!(
                            "migration run failed ({e}); retry {retries} of {} in at most {}ms",
                            self.retries,
                            backoff.peek().as_millis()
                        ),
                    );
                    sleep(backoff.next_delay()).await;
                }
                Err(e) => {
                    if e.is_unavailable() {
                        telemetry::emit(
                            &events::MIGRATION_UNAVAILABLE,
                            Some(self.set.as_str()),
                            format_args!("migration run failed after {retries} retries: {e}"),
                        );
                    }
                    return Err(e);
                }
                Ok(report) => return Ok(report),
            }
        }
    }

    async fn run_once<P: LoserPolicy>(
        &self,
        policy: &P,
        writer: &Holder,
        lease: Ttl,
        lock_ttl: Ttl,
        deadline: Option<Instant>,
    ) -> Result<MigrationReport<P::Contended>> {
        let options = LockOptions::new(lock_ttl.get()).keep_alive(lock_ttl.get() / 3);
        let mut report = MigrationReport::new();
        loop {
            match self.locks.acquire(&self.lock_key(), &options).await {
                Ok(guard) => {
                    let walked = self.walk(policy, writer, lease, deadline, report).await;
                    guard.release().await;
                    return walked;
                }
                Err(AcquireError::Contended { holder, remaining }) => {
                    if let Some(c) = policy.on_contended(holder.clone(), remaining) {
                        report.outcome = MigrationOutcome::Contended(c);
                        return Ok(report);
                    }
                    report.waited = true;
                    if let Some(done) = self.wait(deadline, holder).await? {
                        report.outcome = done;
                        report.skipped = self.completed_names().await?;
                        return Ok(report);
                    }
                    // The lock is free and the set is not done: walk it ourselves.
                }
                Err(AcquireError::Unavailable(e) | AcquireError::InvalidInput(e)) => return Err(e),
            }
        }
    }

    /// Waits for the walk of the lock holder. `Some(outcome)` when the set converged or the
    /// walk ended in a failure; `None` when the lock became free first.
    async fn wait<C>(
        &self,
        deadline: Option<Instant>,
        holder: Option<String>,
    ) -> Result<Option<MigrationOutcome<C>>> {
        loop {
            // The lock first, then the records: a walk that ended before the lock was seen
            // free has written its last record by then.
            let free = self.locks.inspect(&self.lock_key()).await?.is_none();
            let records = self.store.migrations(&self.set).await?;
            let mut failure = None;
            let mut done = true;
            for m in &self.steps {
                match records.iter().find(|r| r.name == m.name()) {
                    Some(r) if r.state == MigrationState::Completed => {}
                    Some(r)
                        if matches!(
                            r.state,
                            MigrationState::Failed | MigrationState::RolledBack
                        ) =>
                    {
                        failure = Some(MigrationFailure {
                            name: r.name.clone(),
                            state: r.state,
                            error: r.error.clone(),
                        });
                        done = false;
                        break;
                    }
                    _ => {
                        done = false;
                        break;
                    }
                }
            }
            if done {
                return Ok(Some(MigrationOutcome::Completed));
            }
            if free {
                return Ok(failure.map(MigrationOutcome::Failed));
            }
            if let Some(deadline) = deadline
                && now() >= deadline
            {
                return Err(Error::new(
                    ErrorKind::Timeout,
                    format!(
                        "migrations of set {:?} did not converge within the wait; the lock is held by {}",
                        self.set_name,
                        holder.as_deref().unwrap_or("another replica")
                    ),
                ));
            }
            sleep(jitter(self.poll)).await;
        }
    }

    async fn completed_names(&self) -> Result<Vec<String>> {
        let records = self.store.migrations(&self.set).await?;
        Ok(self
            .steps
            .iter()
            .filter(|m| {
                records
                    .iter()
                    .any(|r| r.name == m.name() && r.state == MigrationState::Completed)
            })
            .map(|m| m.name().to_owned())
            .collect())
    }

    /// Walks the registry as the lock holder, claiming records as `writer`.
    async fn walk<P: LoserPolicy>(
        &self,
        policy: &P,
        writer: &Holder,
        lease: Ttl,
        deadline: Option<Instant>,
        mut report: MigrationReport<P::Contended>,
    ) -> Result<MigrationReport<P::Contended>> {
        for m in &self.steps {
            let name = m.name();
            loop {
                let sent = now();
                let claim = self
                    .store
                    .claim_migration(Writer::new(&self.set, name, writer), lease)
                    .await?;
                let (attempt, previous) = match claim {
                    MigrationClaim::Completed => {
                        report.skipped.push(name.to_owned());
                        break;
                    }
                    MigrationClaim::Busy { by, remaining } => {
                        // Another writer (a co-holder of the lock, or one whose lease has
                        // not lapsed yet): an admin run answers at once; a boot run waits
                        // for it to finish or lapse.
                        if let Some(c) =
                            policy.on_contended(Some(by.as_str().to_owned()), Some(remaining))
                        {
                            report.outcome = MigrationOutcome::Contended(c);
                            return Ok(report);
                        }
                        if let Some(deadline) = deadline
                            && now() >= deadline
                        {
                            return Err(Error::new(
                                ErrorKind::Timeout,
                                format!(
                                    "migration {name:?} of set {:?} stayed claimed by {by} for the whole wait",
                                    self.set_name
                                ),
                            ));
                        }
                        sleep(jitter(remaining.min(self.poll)).max(Duration::from_millis(5))).await;
                        continue;
                    }
                    MigrationClaim::Claimed { attempt, previous } => (attempt, previous),
                };
                if previous == Some(MigrationState::Pending) {
                    telemetry::emit(
                        &events::MIGRATION_TAKEOVER,
                        Some(self.set.as_str()),
                        format_args!(
                            "migration {name:?} was left pending by a writer whose lease lapsed, or by this run before a store fault; running it again (attempt {attempt})"
                        ),
                    );
                }
                let heartbeat = Heartbeat::start(
                    Arc::clone(&self.store),
                    self.set.clone(),
                    name.to_owned(),
                    writer.clone(),
                    lease,
                    sent,
                );
                let context =
                    MigrationContext::new(name, attempt, previous, heartbeat.life.lost().clone());
                // How the run ends; a failure's text lives in `error`, which `end` borrows.
                let error: String;
                let end = match m.up(&context).await {
                    Ok(()) => MigrationEnd::Completed,
                    Err(up) if m.reversible() => match m.down(&context).await {
                        Ok(()) => {
                            error = format!("up: {up}");
                            MigrationEnd::RolledBack(&error)
                        }
                        Err(down) => {
                            error = format!("up: {up}; down: {down}");
                            MigrationEnd::Failed(&error)
                        }
                    },
                    Err(up) => {
                        error = format!("up: {up}");
                        MigrationEnd::Failed(&error)
                    }
                };
                let state = end.state();
                let finished = self.finish(name, writer, end).await;
                heartbeat.stop();
                match finished? {
                    Settle::Settled => {}
                    Settle::NotOwner => {
                        telemetry::emit(
                            &events::MIGRATION_LEASE_LOST,
                            Some(self.set.as_str()),
                            format_args!(
                                "migration {name:?} was taken over by another writer while this one ran it; its result ({}) was not recorded",
                                state.as_str()
                            ),
                        );
                        // Follow the new owner: claim again (busy until it finishes).
                        continue;
                    }
                }
                if previous == Some(MigrationState::Pending) {
                    report.took_over.push(name.to_owned());
                }
                if state == MigrationState::Completed {
                    report.ran.push(name.to_owned());
                    break;
                }
                telemetry::emit(
                    &events::MIGRATION_FAILED,
                    Some(self.set.as_str()),
                    format_args!("migration {name:?} {}: {}", state.as_str(), end.error()),
                );
                report.outcome = MigrationOutcome::Failed(MigrationFailure {
                    name: name.to_owned(),
                    state,
                    error: end.error().to_owned(),
                });
                return Ok(report);
            }
        }
        Ok(report)
    }

    /// Records the end of `name`, retrying store faults a few times while the heartbeat
    /// keeps the record.
    async fn finish(&self, name: &str, writer: &Holder, end: MigrationEnd<'_>) -> Result<Settle> {
        retry::retry(FINISH_BACKOFF, FINISH_TRIES, || {
            self.store
                .finish_migration(Writer::new(&self.set, name, writer), end)
        })
        .await
    }
}

/// Renews a record's lease every third of it while `up()` / `down()` run, with the
/// keep-alive engine; stopped when stopped or dropped (so a killed run stops renewing at
/// once).
struct Heartbeat {
    life: Arc<Lifeline>,
}

impl Heartbeat {
    /// Keeps the record claimed by a request sent at `sent`.
    fn start(
        store: Arc<dyn MigrationStore>,
        set: StoreKey,
        name: String,
        writer: Holder,
        lease: Ttl,
        sent: Instant,
    ) -> Self {
        let life = Lifeline::new(
            set.as_str(),
            format!("the claim on migration {name:?}"),
            sent,
            lease.get(),
        );
        let renew: RenewAtom = Box::new(move || {
            let (store, set, name, writer) = (
                Arc::clone(&store),
                set.clone(),
                name.clone(),
                writer.clone(),
            );
            Box::pin(async move {
                store
                    .heartbeat_migration(Writer::new(&set, &name, &writer), lease)
                    .await
            })
        });
        let events = Events {
            not_held: Some(&events::MIGRATION_LEASE_LOST),
            expired: Some(&events::MIGRATION_LEASE_LOST),
            renew_failed: Some(&events::MIGRATION_UNAVAILABLE),
            max_hold: None,
        };
        keepalive::spawn(
            Arc::clone(&life),
            Plan::new(lease.get(), lease.get() / 3, events),
            renew,
        );
        Heartbeat { life }
    }

    fn stop(self) {}
}

impl Drop for Heartbeat {
    fn drop(&mut self) {
        self.life.stop();
    }
}
