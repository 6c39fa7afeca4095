//! [`Scheduler`]: cron schedules whose every tick runs on exactly one replica.
//!
//! Every replica registers the same schedules and runs a scheduler. A schedule is one row in
//! the store holding its next due tick; when the tick is due on the store's clock, each
//! replica's scheduler tries to move the row to the following tick with one conditional
//! update ([`advance_schedule`](super::ScheduleStore::advance_schedule)), and only the one
//! that moved it runs the handler. No lock is held while the handler runs.
//!
//! ## Behavior
//! - **Exactly one claim per tick**, decided by the store. The handler itself runs at most
//!   once per tick *per claim*: a replica that dies after claiming a tick and before (or
//!   while) running it loses that tick — schedules are at most once; put work that must
//!   happen into a [`Queue`](super::Queue) from the handler (the cron-tickle pattern).
//! - A handler that runs longer than the period does not delay the next tick, which may run
//!   on another replica at the same time; guard it with a lock if that matters.
//! - **Missed ticks**: when the tick after the due one has passed too (every replica was
//!   down or stalled), [`Missed::Skip`] moves the row to the next future tick without
//!   running, and [`Missed::CatchUpOnce`] runs once for the due tick and then moves it;
//!   either way [`baton.schedule.missed`](crate::telemetry::events::SCHEDULE_MISSED) says
//!   how many ticks did not run.
//! - Cron is evaluated in UTC; time is the store's clock
//!   ([`now_ms`](super::ScheduleStore::now_ms)), so replicas with skewed clocks agree.
//! - A replica claims ticks only of a row whose stored spec equals its own: during a rolling
//!   deploy that changes a spec, the replicas that registered last (the new ones) run it.
//! - Store faults emit
//!   [`baton.schedule.unavailable`](crate::telemetry::events::SCHEDULE_UNAVAILABLE) and are
//!   retried with a jittered backoff; a handler error emits
//!   [`baton.schedule.failed`](crate::telemetry::events::SCHEDULE_FAILED) and is not
//!   retried.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::Notify;
use tokio::task::JoinSet;
use tokio::time::sleep_until;
use tokio_util::sync::CancellationToken;

use crate::error::{Error, Result};
use crate::holder::Holder;
use crate::key::{Key, KeyKind, Namespace, StoreKey, check_text};
use crate::lock::grant::now;
use crate::retry::{Backoff, jitter};
use crate::telemetry::{self, events};

use super::cron::CronSpec;
use super::store::{Advance, ScheduleRow, ScheduleStore, TickClaim};
use crate::work::store::NewSchedule;

/// Longest schedule name, in bytes of UTF-8.
pub const MAX_SCHEDULE_NAME_BYTES: usize = 200;
/// The longest a scheduler sleeps between reads of its rows, so a spec changed or a row
/// removed elsewhere is noticed.
const MAX_IDLE: Duration = Duration::from_secs(10);

/// What to do with ticks that passed while no scheduler ran them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Missed {
    /// Do not run them: move on to the next future tick.
    Skip,
    /// Run once for all of them (the handler sees how many were missed), then move on.
    CatchUpOnce,
}

/// One tick, as a schedule's handler receives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tick {
    name: String,
    due_ms: i64,
    missed: u64,
}

impl Tick {
    /// The schedule's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// When the tick was due, in unix milliseconds (a whole second).
    pub fn due_ms(&self) -> i64 {
        self.due_ms
    }

    /// When the tick was due.
    pub fn due(&self) -> SystemTime {
        at_ms(self.due_ms)
    }

    /// How many later ticks this run stands for ([`Missed::CatchUpOnce`]); zero normally.
    pub fn missed(&self) -> u64 {
        self.missed
    }

    /// Whether this run is a catch-up for missed ticks.
    pub fn is_catch_up(&self) -> bool {
        self.missed > 0
    }
}

/// A schedule as stored, for listings (`baton schedule list`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScheduleInfo {
    /// The schedule's name.
    pub name: String,
    /// The cron spec, as registered last.
    pub spec: String,
    /// The next due tick, unix milliseconds.
    pub next_due_ms: i64,
    /// How many ticks ran.
    pub runs: u64,
    /// The holder that ran the last tick and when it claimed it (unix milliseconds).
    pub last_run: Option<(Holder, i64)>,
}

impl ScheduleInfo {
    fn of(row: ScheduleRow) -> Self {
        ScheduleInfo {
            name: row.name.user_key().to_owned(),
            spec: row.spec,
            next_due_ms: row.due_at_ms,
            runs: row.runs,
            last_run: row.last_run,
        }
    }

    /// The next due tick.
    pub fn next_due(&self) -> SystemTime {
        at_ms(self.next_due_ms)
    }
}

/// What a [`Scheduler::run`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SchedulerReport {
    /// Ticks this replica claimed and ran (a catch-up counts once).
    pub ran: u64,
    /// Ticks this replica found missed and did not run (skipped, or folded into a catch-up).
    pub missed: u64,
    /// Runs whose handler returned an error or panicked.
    pub failed: u64,
    /// Store faults met.
    pub store_faults: u64,
}

type Handler = dyn Fn(Tick) -> Pin<Box<dyn Future<Output = std::result::Result<(), String>> + Send>>
    + Send
    + Sync;

/// What a finished handler task hands back.
type Ran = (Arc<Entry>, Tick, std::result::Result<(), String>);

struct Entry {
    name: String,
    key: StoreKey,
    spec: CronSpec,
    missed: Missed,
    handler: Arc<Handler>,
}

/// Cron schedules over a store; every tick runs on exactly one replica. Cheap to clone;
/// clones share the registered schedules.
///
/// # Examples
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), baton_core::Error> {
/// use std::sync::Arc;
/// use baton_core::MemoryStore;
/// use baton_core::work::{Missed, Scheduler, Tick};
/// use tokio_util::sync::CancellationToken;
///
/// let scheduler = Scheduler::new(Arc::new(MemoryStore::new()));
/// scheduler
///     .register("nightly-report", "0 3 * * *", Missed::CatchUpOnce, |tick: Tick| async move {
///         println!("report for the tick due at {:?}", tick.due());
///         Ok::<(), std::io::Error>(())
///     })
///     .await?;
/// let shutdown = CancellationToken::new();
/// let running = tokio::spawn({
///     let (scheduler, shutdown) = (scheduler.clone(), shutdown.clone());
///     async move { scheduler.run(shutdown).await }
/// });
/// // ... at process exit:
/// shutdown.cancel();
/// running.await.unwrap()?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Scheduler {
    inner: Arc<Inner>,
}

struct Inner {
    store: Arc<dyn ScheduleStore>,
    namespace: Namespace,
    holder: Holder,
    grace: Duration,
    entries: Mutex<Vec<Arc<Entry>>>,
    changed: Notify,
}

impl fmt::Debug for Scheduler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<String> = self.entries().iter().map(|e| e.name.clone()).collect();
        f.debug_struct("Scheduler")
            .field("namespace", &self.inner.namespace)
            .field("holder", &self.inner.holder)
            .field("schedules", &names)
            .finish()
    }
}

impl Scheduler {
    /// A scheduler in the default namespace, identified by a random holder.
    pub fn new(store: Arc<dyn ScheduleStore>) -> Self {
        Scheduler::with_namespace(store, Namespace::default())
    }

    /// A scheduler in `namespace`.
    pub fn with_namespace(store: Arc<dyn ScheduleStore>, namespace: Namespace) -> Self {
        Scheduler {
            inner: Arc::new(Inner {
                store,
                namespace,
                holder: Holder::random(),
                grace: Duration::from_secs(30),
                entries: Mutex::new(Vec::new()),
                changed: Notify::new(),
            }),
        }
    }

    /// The same scheduler recording `holder` (say `host:pid`) as the runner of the ticks it
    /// claims, so `baton schedule list` names the replica. Call before registering.
    pub fn with_holder(self, holder: Holder) -> Self {
        self.rebuild(holder, self.inner.grace)
    }

    /// How long handlers still running at shutdown may finish before they are aborted
    /// (30 s by default).
    pub fn with_grace(self, grace: Duration) -> Self {
        self.rebuild(self.inner.holder.clone(), grace)
    }

    fn rebuild(&self, holder: Holder, grace: Duration) -> Self {
        Scheduler {
            inner: Arc::new(Inner {
                store: Arc::clone(&self.inner.store),
                namespace: self.inner.namespace.clone(),
                holder,
                grace,
                entries: Mutex::new(self.entries().clone()),
                changed: Notify::new(),
            }),
        }
    }

    /// The holder recorded for the ticks this scheduler claims.
    pub fn holder(&self) -> &Holder {
        &self.inner.holder
    }

    fn entries(&self) -> MutexGuard<'_, Vec<Arc<Entry>>> {
        self.inner.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn key(&self, name: &str) -> Result<StoreKey> {
        check_text("schedule name", name, MAX_SCHEDULE_NAME_BYTES)?;
        Ok(self
            .inner
            .namespace
            .qualify(KeyKind::Schedule, &Key::new(name)?))
    }

    /// Registers the schedule `name` with a cron `spec` (5 fields, or 6 with seconds first;
    /// UTC) and its `handler`, and writes its row: a new row is due at the spec's next tick;
    /// an existing row with the same spec keeps its due tick (and so its missed ticks); one
    /// with another spec takes this spec and its next tick.
    ///
    /// # Errors
    /// `InvalidInput` before any I/O for a bad name or spec, or a name this scheduler
    /// already registered; `Unavailable` when the store faulted.
    pub async fn register<F, Fut, E>(
        &self,
        name: &str,
        spec: &str,
        missed: Missed,
        handler: F,
    ) -> Result<ScheduleInfo>
    where
        F: Fn(Tick) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = std::result::Result<(), E>> + Send + 'static,
        E: fmt::Display + Send + 'static,
    {
        let key = self.key(name)?;
        let spec = CronSpec::parse(spec)?;
        if self.entries().iter().any(|e| e.name == name) {
            return Err(Error::invalid_input(format!(
                "schedule {name:?} is already registered with this scheduler"
            )));
        }
        let store = &self.inner.store;
        let now_ms = store.now_ms().await.map_err(|e| fault(&key, e))?;
        let first = spec.next_after_ms(now_ms)?;
        let row = store
            .register_schedule(NewSchedule::new(&key, spec.as_str(), first))
            .await
            .map_err(|e| fault(&key, e))?;
        let handler: Arc<Handler> = Arc::new(move |tick| {
            let fut = handler(tick);
            Box::pin(async move { fut.await.map_err(|e| e.to_string()) })
        });
        {
            let mut entries = self.entries();
            if entries.iter().any(|e| e.name == name) {
                return Err(Error::invalid_input(format!(
                    "schedule {name:?} is already registered with this scheduler"
                )));
            }
            entries.push(Arc::new(Entry {
                name: name.to_owned(),
                key,
                spec,
                missed,
                handler,
            }));
        }
        self.inner.changed.notify_waiters();
        Ok(ScheduleInfo::of(row))
    }

    /// Every schedule of this scheduler's namespace, as stored (also those registered by
    /// other replicas or versions), ordered by name.
    ///
    /// # Errors
    /// `Unavailable` when the store faulted.
    pub async fn list(&self) -> Result<Vec<ScheduleInfo>> {
        let prefix = self.inner.namespace.qualify_prefix(KeyKind::Schedule, "")?;
        let rows = self.inner.store.schedules(&prefix).await?;
        Ok(rows.into_iter().map(ScheduleInfo::of).collect())
    }

    /// Forgets the schedule `name` here and deletes its row; `true` when there was a row.
    /// Replicas that still register it write it again.
    ///
    /// # Errors
    /// `InvalidInput` for a bad name; `Unavailable` when the store faulted.
    pub async fn remove(&self, name: &str) -> Result<bool> {
        let key = self.key(name)?;
        self.entries().retain(|e| e.name != name);
        self.inner.changed.notify_waiters();
        self.inner.store.remove_schedule(&key).await
    }

    /// Runs the registered schedules until `shutdown` fires: sleeps until the earliest due
    /// tick (re-reading the rows at least every 10 s), claims each due tick, and runs the
    /// claimed ticks' handlers in their own tasks. At shutdown, handlers still running get
    /// the grace period, then are aborted.
    ///
    /// # Errors
    /// None today: store faults are reported, counted and retried. The `Result` leaves room
    /// for faults that cannot be retried.
    ///
    /// # Cancel safety
    /// Dropping the future aborts running handlers; a tick claimed but not yet run is lost
    /// (schedules are at most once per tick).
    pub async fn run(&self, shutdown: CancellationToken) -> Result<SchedulerReport> {
        let mut report = SchedulerReport::default();
        let mut running: JoinSet<Ran> = JoinSet::new();
        let mut backoff = FAULT_BACKOFF.attempts();
        loop {
            while let Some(done) = running.try_join_next() {
                finished(&mut report, done);
            }
            if shutdown.is_cancelled() {
                break;
            }
            let changed = self.inner.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let entries: Vec<Arc<Entry>> = self.entries().clone();
            let wait = if entries.is_empty() {
                MAX_IDLE
            } else {
                match self.pass(&entries, &mut running, &mut report).await {
                    Ok(wait) => {
                        backoff.reset();
                        wait.min(MAX_IDLE) + jitter(Duration::from_millis(25))
                    }
                    Err(_) => {
                        report.store_faults += 1;
                        backoff.next_delay()
                    }
                }
            };
            let until = now() + wait;
            tokio::select! {
                _ = sleep_until(until) => {}
                _ = shutdown.cancelled() => {}
                _ = &mut changed => {}
                Some(done) = running.join_next(), if !running.is_empty() => {
                    finished(&mut report, done);
                }
            }
        }
        let deadline = now() + self.inner.grace;
        loop {
            tokio::select! {
                done = running.join_next() => match done {
                    Some(done) => finished(&mut report, done),
                    None => break,
                },
                _ = sleep_until(deadline) => {
                    running.abort_all();
                    while let Some(done) = running.join_next().await {
                        finished(&mut report, done);
                    }
                    break;
                }
            }
        }
        Ok(report)
    }

    /// One look at every schedule: claims and starts what is due. Answers how long until
    /// the earliest due tick.
    async fn pass(
        &self,
        entries: &[Arc<Entry>],
        running: &mut JoinSet<Ran>,
        report: &mut SchedulerReport,
    ) -> Result<Duration> {
        let store = &self.inner.store;
        let now_ms = store
            .now_ms()
            .await
            .map_err(|e| fault(&entries[0].key, e))?;
        let mut earliest = i64::MAX;
        for entry in entries {
            let row = match store
                .schedule(&entry.key)
                .await
                .map_err(|e| fault(&entry.key, e))?
            {
                Some(row) => row,
                None => {
                    // Removed behind our back (an operator, a replica that stopped
                    // registering it): write it again, due at the next tick.
                    let first = entry.spec.next_after_ms(now_ms)?;
                    store
                        .register_schedule(NewSchedule::new(&entry.key, entry.spec.as_str(), first))
                        .await
                        .map_err(|e| fault(&entry.key, e))?
                }
            };
            if row.spec != entry.spec.as_str() {
                // Another version registered another spec: it runs this schedule.
                continue;
            }
            let due = row.due_at_ms;
            if due > now_ms {
                earliest = earliest.min(due);
                continue;
            }
            let next = entry.spec.next_after_ms(due)?;
            let (target, tick, skipped) = if next > now_ms {
                let tick = Tick {
                    name: entry.name.clone(),
                    due_ms: due,
                    missed: 0,
                };
                (next, Some(tick), 0)
            } else {
                // Ticks after `due` have passed too: nobody ran them.
                let target = entry.spec.next_after_ms(now_ms)?;
                let later = entry.spec.count_after(due, now_ms);
                match entry.missed {
                    Missed::Skip => (target, None, later + 1),
                    Missed::CatchUpOnce => {
                        let tick = Tick {
                            name: entry.name.clone(),
                            due_ms: due,
                            missed: later,
                        };
                        (target, Some(tick), later)
                    }
                }
            };
            let answer = store
                .advance_schedule(
                    &entry.key,
                    TickClaim {
                        expected_due_ms: due,
                        next_due_ms: target,
                        holder: &self.inner.holder,
                        ran: tick.is_some(),
                    },
                )
                .await
                .map_err(|e| fault(&entry.key, e))?;
            match answer {
                Advance::Claimed => {
                    earliest = earliest.min(target);
                    if skipped > 0 {
                        report.missed += skipped;
                        telemetry::emit(
                            &events::SCHEDULE_MISSED,
                            Some(entry.key.as_str()),
                            format_args!(
                                "{skipped} tick(s) from {} did not run ({:?}); next tick {}",
                                fmt_ms(due),
                                entry.missed,
                                fmt_ms(target)
                            ),
                        );
                    }
                    if let Some(tick) = tick {
                        report.ran += 1;
                        let entry = Arc::clone(entry);
                        running.spawn(async move {
                            let result = (entry.handler)(tick.clone()).await;
                            (entry, tick, result)
                        });
                    }
                }
                // Another replica claimed it: read the row again shortly.
                Advance::Lost => earliest = earliest.min(now_ms + 1),
            }
        }
        Ok(if earliest == i64::MAX {
            MAX_IDLE
        } else {
            Duration::from_millis(earliest.saturating_sub(now_ms).max(0) as u64)
        })
    }
}

fn finished(report: &mut SchedulerReport, done: std::result::Result<Ran, tokio::task::JoinError>) {
    let (key, detail) = match done {
        Ok((_, _, Ok(()))) => return,
        Ok((entry, tick, Err(error))) => (
            Some(entry.key.clone()),
            format!(
                "the handler of the tick due {} failed: {error}",
                fmt_ms(tick.due_ms)
            ),
        ),
        Err(join) if join.is_panic() => (None, "a schedule handler panicked".to_owned()),
        Err(_) => (
            None,
            "a schedule handler was aborted at shutdown".to_owned(),
        ),
    };
    report.failed += 1;
    telemetry::emit(
        &events::SCHEDULE_FAILED,
        key.as_ref().map(StoreKey::as_str),
        format_args!("{detail}"),
    );
}

fn fault(key: &StoreKey, error: Error) -> Error {
    if !error.is_invalid_input() {
        telemetry::emit(
            &events::SCHEDULE_UNAVAILABLE,
            Some(key.as_str()),
            format_args!("scheduler store call failed: {error}"),
        );
    }
    error
}

/// How long the scheduler waits after a store fault: 100 ms, doubling to 5 s, jittered.
const FAULT_BACKOFF: Backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));

fn at_ms(ms: i64) -> SystemTime {
    if ms >= 0 {
        UNIX_EPOCH + Duration::from_millis(ms as u64)
    } else {
        UNIX_EPOCH - Duration::from_millis(ms.unsigned_abs())
    }
}

fn fmt_ms(ms: i64) -> String {
    chrono::DateTime::<chrono::Utc>::from_timestamp_millis(ms)
        .map(|t| t.format("%Y-%m-%dT%H:%M:%SZ").to_string())
        .unwrap_or_else(|| format!("{ms}ms"))
}
