//! [`Worker`]: runs a handler over a queue's items, with concurrency, lease extension and
//! graceful shutdown.
//!
//! A worker claims items in batches while it has free slots, runs the handler on each in
//! its own task, extends each item's lease every third of the lease while the handler runs,
//! and settles the item by the handler's answer: `Ok` completes it, `Err` fails it (retried
//! after the queue's backoff, dead-lettered after its last attempt), a panic fails it too.
//! Run one worker per process per queue (or several, with different handlers, on different
//! queues); run the process on as many replicas as you like.
//!
//! ## Behavior
//! - **At least once.** A handler may run more than once for one item: when its process
//!   dies before the item is settled, when a settle cannot reach the store, and when an
//!   extension does not land in time and another claim takes the item (the worker then
//!   fires the job's [`lost`](Job::lost) signal and discards the result, emitting
//!   [`baton.work.lease_lost`](crate::telemetry::events::WORK_LEASE_LOST)). Make handlers
//!   idempotent.
//! - When the queue is empty, the worker polls with a jittered backoff (100 ms doubling to
//!   5 s by default), so idle replicas do not query the store in step.
//! - A store fault while claiming emits
//!   [`baton.work.unavailable`](crate::telemetry::events::WORK_UNAVAILABLE) and backs off;
//!   the worker keeps running. A settle that faults is retried three times, then left to the
//!   lease.
//! - **Shutdown** (the [`CancellationToken`] given to [`Worker::shutdown`] fires): the worker
//!   stops claiming, lets the handlers in flight finish within the grace period (30 s by
//!   default), then aborts the rest and releases their items (claimable again at once, the
//!   attempt not counted), and returns its [`WorkerReport`].
//! - **A handler can give its item back**: one that called [`Job::release_on_return`] has
//!   its item released as soon as it returns, whatever it returns (a panic still fails it),
//!   instead of settled by its answer. A handler whose work was cut short at shutdown (it
//!   stopped a child process, say) uses it to release its item at once rather than hold it
//!   until the grace period ends.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio::time::sleep_until;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

use crate::error::{Error, Result};
use crate::keepalive::{self, Events, Lifeline, Loss, Plan, RenewAtom};
use crate::lock::grant::now;
use crate::retry::{self, Backoff};
use crate::telemetry::events;

use super::item::{Failure, Item};
use super::options::{MAX_BATCH, error_text};
use super::queue::Queue;
use super::store::{ItemId, Settle};

/// Most handlers one worker runs at once.
pub const MAX_CONCURRENCY: usize = 1024;
/// How many times a worker tries to settle an item whose settle hit a store fault.
const SETTLE_TRIES: u32 = 3;
/// The waits between those tries.
const SETTLE_BACKOFF: Backoff =
    Backoff::new(Duration::from_millis(100), Duration::from_millis(200));

/// What a handler receives: the item's payload and attempt, and a signal that fires when the
/// item is known or presumed lost. Cheap to clone.
#[derive(Clone)]
pub struct Job {
    inner: Arc<JobInner>,
}

struct JobInner {
    id: ItemId,
    payload: Vec<u8>,
    attempt: u32,
    max_attempts: u32,
    dedup_id: Option<String>,
    last_error: String,
    lost: CancellationToken,
    release: AtomicBool,
}

impl fmt::Debug for Job {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Job")
            .field("id", &self.inner.id)
            .field("payload_bytes", &self.inner.payload.len())
            .field("attempt", &self.inner.attempt)
            .field("max_attempts", &self.inner.max_attempts)
            .field("dedup_id", &self.inner.dedup_id)
            .field("lost", &self.inner.lost.is_cancelled())
            .field(
                "release_on_return",
                &self.inner.release.load(Ordering::SeqCst),
            )
            .finish()
    }
}

impl Job {
    fn of(item: &Item, lost: CancellationToken) -> Job {
        let data = item.data();
        Job {
            inner: Arc::new(JobInner {
                id: data.id,
                payload: data.payload.clone(),
                attempt: data.attempt,
                max_attempts: data.max_attempts,
                dedup_id: data.dedup_id.clone(),
                last_error: data.last_error.clone(),
                lost,
                release: AtomicBool::new(false),
            }),
        }
    }

    /// The item's id.
    pub fn id(&self) -> ItemId {
        self.inner.id
    }

    /// The payload, as enqueued.
    pub fn payload(&self) -> &[u8] {
        &self.inner.payload
    }

    /// This attempt's number, from 1.
    pub fn attempt(&self) -> u32 {
        self.inner.attempt
    }

    /// The attempts the item gets.
    pub fn max_attempts(&self) -> u32 {
        self.inner.max_attempts
    }

    /// Whether a failure of this attempt dead-letters the item.
    pub fn is_last_attempt(&self) -> bool {
        self.inner.attempt >= self.inner.max_attempts
    }

    /// The de-duplication id it was enqueued with, if any.
    pub fn dedup_id(&self) -> Option<&str> {
        self.inner.dedup_id.as_deref()
    }

    /// The error of the previous attempt; empty on the first.
    pub fn last_error(&self) -> &str {
        &self.inner.last_error
    }

    /// Fires when the item is known lost (an extension answered that another claim owns it)
    /// or presumed lost (no extension landed before the lease ran out). The handler's result
    /// will then most likely be discarded: stop early, and do not make further side effects.
    ///
    /// An owned future: await it, or make it a `tokio::select!` branch.
    pub fn lost(&self) -> WaitForCancellationFutureOwned {
        self.inner.lost.clone().cancelled_owned()
    }

    /// The lost signal as a [`CancellationToken`] (a child of the item's own: cancelling it
    /// changes nothing for the item).
    pub fn lost_token(&self) -> CancellationToken {
        self.inner.lost.child_token()
    }

    /// Whether [`lost`](Job::lost) has fired.
    pub fn is_lost(&self) -> bool {
        self.inner.lost.is_cancelled()
    }

    /// Gives the item back when the handler returns: the worker then releases it (claimable
    /// again at once, the attempt not counted; counted in [`WorkerReport::released`])
    /// instead of settling it by the handler's answer, `Ok` or `Err` alike. A handler that
    /// panics after calling it still fails its item, so a crashing handler still runs out of
    /// attempts.
    ///
    /// For a handler that did not do the work and knows it, typically at shutdown: one that
    /// stopped its child process when the worker's [`shutdown`](Worker::shutdown) fired
    /// releases the item as soon as the child has exited, instead of holding it until the
    /// grace period ends and the worker aborts it. Calling it again changes nothing; an item
    /// lost meanwhile is not released (another claim owns it).
    ///
    /// Wrong: releasing an item the handler cannot process *now* while the worker runs. It
    /// is claimable again at once, by this worker too, so the worker spins on it; return
    /// `Err` instead, and the queue's backoff spaces the attempts.
    ///
    /// # Examples
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), baton_core::Error> {
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// use baton_core::MemoryStore;
    /// use baton_core::work::{EnqueueOptions, Job, Queue, Worker};
    /// use tokio_util::sync::CancellationToken;
    /// # async fn render(_scene: &[u8]) -> std::io::Result<()> { std::future::pending().await }
    ///
    /// let queue = Queue::new(Arc::new(MemoryStore::new()), "renders")?;
    /// queue.enqueue(b"scene-1", EnqueueOptions::new()).await?;
    /// let shutdown = CancellationToken::new();
    /// let token = shutdown.clone();
    /// # let started = Arc::new(tokio::sync::Notify::new());
    /// # let notify = started.clone();
    /// let worker = Worker::new(queue.clone())
    ///     .grace(Duration::from_secs(600))
    ///     .shutdown(shutdown.clone())
    ///     .run(move |job: Job| {
    ///         let token = token.clone();
    /// #       let notify = notify.clone();
    ///         async move {
    /// #           notify.notify_one();
    ///             tokio::select! {
    ///                 done = render(job.payload()) => done,
    ///                 () = token.cancelled() => {
    ///                     // Cut short by the shutdown: give the item back now.
    ///                     job.release_on_return();
    ///                     Ok(())
    ///                 }
    ///             }
    ///         }
    ///     });
    /// // ... on SIGTERM: shutdown.cancel() ...
    /// # let stop = async { started.notified().await; shutdown.cancel() };
    /// # let (report, ()) = tokio::join!(worker, stop);
    /// # let report = report?;
    /// // Released when the handler returned, not after the 10 minutes of grace.
    /// assert_eq!(report.released, 1);
    /// assert_eq!(queue.claim(1).await?[0].attempt(), 1, "a release is not an attempt");
    /// # Ok(()) }
    /// ```
    pub fn release_on_return(&self) {
        self.inner.release.store(true, Ordering::SeqCst);
    }

    fn releases_on_return(&self) -> bool {
        self.inner.release.load(Ordering::SeqCst)
    }
}

/// What a [`Worker`] did, counted per item.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct WorkerReport {
    /// Items claimed.
    pub claimed: u64,
    /// Items completed.
    pub completed: u64,
    /// Items failed and scheduled for another attempt.
    pub retried: u64,
    /// Items dead-lettered.
    pub dead_lettered: u64,
    /// Items released untried: aborted at the end of the shutdown grace, or given back by
    /// their handler ([`Job::release_on_return`]).
    pub released: u64,
    /// Items lost to another claim while their handler ran (results discarded).
    pub lease_lost: u64,
    /// Handlers that panicked (their items were failed).
    pub panicked: u64,
    /// Store faults (claims, and settles that failed every try).
    pub store_faults: u64,
}

/// Whether a queue has nothing left to do: every item is completed or dead-lettered.
fn settled(stats: &super::QueueStats) -> bool {
    stats.ready == 0 && stats.scheduled == 0 && stats.running == 0 && stats.expired == 0
}

/// Runs a handler over a queue. Build with [`Worker::new`] and the setters, then
/// [`run`](Worker::run).
///
/// # Examples
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), baton_core::Error> {
/// use std::sync::Arc;
/// use baton_core::MemoryStore;
/// use baton_core::work::{EnqueueOptions, Job, Queue, Worker};
///
/// let queue = Queue::new(Arc::new(MemoryStore::new()), "thumbnails")?;
/// queue.enqueue(b"photo-1.jpg", EnqueueOptions::new()).await?;
/// let report = Worker::new(queue)
///     .concurrency(4)
///     .exit_when_empty(true)
///     .run(|job: Job| async move {
///         let _path = String::from_utf8_lossy(job.payload()).into_owned();
///         // ... make the thumbnail ...
///         Ok::<(), std::io::Error>(())
///     })
///     .await?;
/// assert_eq!(report.completed, 1);
/// # Ok(()) }
/// ```
#[must_use = "a worker does nothing until run"]
#[derive(Debug)]
pub struct Worker {
    queue: Queue,
    concurrency: usize,
    batch: Option<u32>,
    exit_when_empty: bool,
    exit_when_settled: bool,
    grace: Duration,
    poll_min: Duration,
    poll_max: Duration,
    shutdown: CancellationToken,
}

impl Worker {
    /// A worker over `queue`: one handler at a time, polling with a backoff from 100 ms to
    /// 5 s when the queue is empty, 30 s of grace at shutdown, running until shut down.
    pub fn new(queue: Queue) -> Self {
        Worker {
            queue,
            concurrency: 1,
            batch: None,
            exit_when_empty: false,
            exit_when_settled: false,
            grace: Duration::from_secs(30),
            poll_min: Duration::from_millis(100),
            poll_max: Duration::from_secs(5),
            shutdown: CancellationToken::new(),
        }
    }

    /// How many handlers run at once (1 to [`MAX_CONCURRENCY`]).
    pub fn concurrency(mut self, n: usize) -> Self {
        self.concurrency = n;
        self
    }

    /// The most items one claim takes (1 to [`MAX_BATCH`](super::MAX_BATCH)); by default
    /// the concurrency. A claim never takes more items than there are free slots.
    pub fn batch(mut self, batch: u32) -> Self {
        self.batch = Some(batch);
        self
    }

    /// Return once a claim finds nothing claimable and no handler is running (items waiting
    /// for a delay or a backoff are left for later). For batch jobs and tests; to wait for
    /// retries too, use [`exit_when_settled`](Worker::exit_when_settled).
    pub fn exit_when_empty(mut self, exit: bool) -> Self {
        self.exit_when_empty = exit;
        self
    }

    /// Drain until settled: return only once every item of the queue is completed or
    /// dead-lettered, that is when a claim finds nothing claimable, no handler of this
    /// worker is running, and the queue's [`stats`](super::Queue::stats) count nothing
    /// ready, scheduled (waiting out a retry backoff, or an enqueue delay), running (on any
    /// worker) or with a lapsed lease. A failed item waiting out its backoff keeps the
    /// worker running until it is retried and settles. Not with
    /// [`exit_when_empty`](Worker::exit_when_empty).
    ///
    /// # Examples
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), baton_core::Error> {
    /// use std::{sync::Arc, time::Duration};
    /// use baton_core::MemoryStore;
    /// use baton_core::work::{Backoff, EnqueueOptions, Job, Queue, QueueOptions, Worker};
    ///
    /// let queue = Queue::new(Arc::new(MemoryStore::new()), "imports")?
    ///     .with_options(QueueOptions::new().backoff(Backoff::fixed(Duration::from_millis(50))))?;
    /// queue.enqueue(b"file-1.csv", EnqueueOptions::new()).await?;
    /// let report = Worker::new(queue)
    ///     .poll(Duration::from_millis(10), Duration::from_millis(50))
    ///     .exit_when_settled(true)
    ///     .run(|job: Job| async move {
    ///         // The first attempt fails; the retry, after the backoff, succeeds.
    ///         if job.attempt() == 1 { Err("flaky") } else { Ok(()) }
    ///     })
    ///     .await?;
    /// assert_eq!((report.retried, report.completed), (1, 1));
    /// # Ok(()) }
    /// ```
    pub fn exit_when_settled(mut self, exit: bool) -> Self {
        self.exit_when_settled = exit;
        self
    }

    /// How long handlers in flight may finish after shutdown before they are aborted and
    /// their items released. A handler that knows sooner that its work is over can release
    /// its item at once with [`Job::release_on_return`].
    pub fn grace(mut self, grace: Duration) -> Self {
        self.grace = grace;
        self
    }

    /// The polling backoff while the queue is empty: from `min`, doubling to `max`, each
    /// wait jittered to between half and all of it.
    pub fn poll(mut self, min: Duration, max: Duration) -> Self {
        self.poll_min = min;
        self.poll_max = max;
        self
    }

    /// Shuts the worker down gracefully when `token` fires.
    pub fn shutdown(mut self, token: CancellationToken) -> Self {
        self.shutdown = token;
        self
    }

    fn validate(&self) -> Result<u32> {
        if self.concurrency == 0 || self.concurrency > MAX_CONCURRENCY {
            return Err(Error::invalid_input(format!(
                "worker concurrency is {}; it must be from 1 to {MAX_CONCURRENCY}",
                self.concurrency
            )));
        }
        let batch = self
            .batch
            .unwrap_or(self.concurrency.min(MAX_BATCH as usize) as u32);
        if batch == 0 || batch > MAX_BATCH {
            return Err(Error::invalid_input(format!(
                "worker batch is {batch}; it must be from 1 to {MAX_BATCH}"
            )));
        }
        if self.poll_min.is_zero() || self.poll_min > self.poll_max {
            return Err(Error::invalid_input(format!(
                "worker poll backoff {:?}..{:?} must start above zero and not above its maximum",
                self.poll_min, self.poll_max
            )));
        }
        if self.exit_when_empty && self.exit_when_settled {
            return Err(Error::invalid_input(
                "worker exit_when_empty and exit_when_settled are both set; exit_when_settled waits for retries as well, exit_when_empty does not: choose one",
            ));
        }
        if self.grace > Duration::from_secs(24 * 3600) {
            return Err(Error::invalid_input(format!(
                "worker grace {:?} is above the maximum of 24h",
                self.grace
            )));
        }
        Ok(batch)
    }

    /// Runs `handler` on every item until shutdown (or, with
    /// [`exit_when_empty`](Worker::exit_when_empty), until the queue is drained, or with
    /// [`exit_when_settled`](Worker::exit_when_settled), until every item settled), and
    /// reports what it did.
    ///
    /// # Errors
    /// `InvalidInput` before any I/O for a bad setting. Store faults are not errors of
    /// `run`: they are counted, reported through telemetry, and retried.
    ///
    /// # Cancel safety
    /// Dropping the future aborts the handlers in flight without releasing their items;
    /// they are claimed again when their leases lapse. Use [`Worker::shutdown`] to stop
    /// gracefully.
    pub async fn run<F, Fut, E>(self, handler: F) -> Result<WorkerReport>
    where
        F: Fn(Job) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = std::result::Result<(), E>> + Send + 'static,
        E: fmt::Display + Send + 'static,
    {
        let batch = self.validate()?;
        let handler = Arc::new(handler);
        let slots = Arc::new(Semaphore::new(self.concurrency));
        let abort = CancellationToken::new();
        // Dropped with this future, the set aborts every item's task, and each of those
        // aborts its handler's task (`AbortOnDrop`).
        let mut tasks: JoinSet<Outcome> = JoinSet::new();
        let mut report = WorkerReport::default();
        let mut idle = Backoff::new(self.poll_min, self.poll_max).attempts();
        loop {
            while let Some(done) = tasks.try_join_next() {
                tally(&mut report, done);
            }
            if self.shutdown.is_cancelled() {
                break;
            }
            let free = slots.available_permits();
            if free == 0 {
                tokio::select! {
                    Some(done) = tasks.join_next() => tally(&mut report, done),
                    _ = self.shutdown.cancelled() => {}
                }
                continue;
            }
            let want = batch.min(free as u32);
            let items = match self.queue.claim(want).await {
                Ok(items) => items,
                Err(e) if e.is_invalid_input() => return Err(e),
                Err(_) => {
                    report.store_faults += 1;
                    self.pause(&mut tasks, &mut report, idle.next_delay()).await;
                    continue;
                }
            };
            if items.is_empty() {
                if self.exit_when_empty && tasks.is_empty() {
                    break;
                }
                if self.exit_when_settled && tasks.is_empty() {
                    match self.queue.stats().await {
                        Ok(stats) if settled(&stats) => break,
                        Ok(_) => {}
                        Err(_) => report.store_faults += 1,
                    }
                }
                self.pause(&mut tasks, &mut report, idle.next_delay()).await;
                continue;
            }
            idle.reset();
            report.claimed += items.len() as u64;
            for item in items {
                let permit = Arc::clone(&slots)
                    .try_acquire_owned()
                    .expect("a claim takes no more items than free slots");
                let handler = Arc::clone(&handler);
                let lease = self.queue.lease();
                let abort = abort.clone();
                tasks.spawn(async move {
                    let item = Arc::new(item);
                    let life = keep_extended(&item, lease);
                    let job = Job::of(&item, life.lost().clone());
                    let work = AbortOnDrop(tokio::spawn(handler(job.clone())));
                    run_one(item, job, life, work, abort, permit).await
                });
            }
        }
        // Shutdown: no more claims; handlers in flight get the grace period.
        let deadline = now() + self.grace;
        loop {
            tokio::select! {
                done = tasks.join_next() => match done {
                    Some(done) => tally(&mut report, done),
                    None => break,
                },
                _ = sleep_until(deadline) => {
                    abort.cancel();
                    while let Some(done) = tasks.join_next().await {
                        tally(&mut report, done);
                    }
                    break;
                }
            }
        }
        Ok(report)
    }

    /// Waits `wait` (already jittered), waking early for shutdown or a finished handler.
    async fn pause(&self, tasks: &mut JoinSet<Outcome>, report: &mut WorkerReport, wait: Duration) {
        let until = now() + wait;
        tokio::select! {
            Some(done) = tasks.join_next(), if !tasks.is_empty() => tally(report, done),
            _ = sleep_until(until) => {}
            _ = self.shutdown.cancelled() => {}
        }
    }
}

/// A handler's task, aborted when its item's task ends or is aborted first.
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// How one item ended.
enum Outcome {
    Completed,
    Retried,
    DeadLettered,
    Released,
    LeaseLost,
    Fault,
    Panicked(Box<Outcome>),
}

fn tally(report: &mut WorkerReport, done: std::result::Result<Outcome, tokio::task::JoinError>) {
    let outcome = match done {
        Ok(outcome) => outcome,
        // The item's own task never panics; an abort (the run future dropped) ends here.
        Err(_) => return,
    };
    let outcome = match outcome {
        Outcome::Panicked(inner) => {
            report.panicked += 1;
            *inner
        }
        other => other,
    };
    match outcome {
        Outcome::Completed => report.completed += 1,
        Outcome::Retried => report.retried += 1,
        Outcome::DeadLettered => report.dead_lettered += 1,
        Outcome::Released => report.released += 1,
        Outcome::LeaseLost => report.lease_lost += 1,
        Outcome::Fault => report.store_faults += 1,
        Outcome::Panicked(_) => {}
    }
}

/// Starts the keep-alive engine on `item`'s lease: extended every third of it, from the
/// instant before the claim that took it was sent.
fn keep_extended(item: &Arc<Item>, lease: Duration) -> Arc<Lifeline> {
    let granted_at = item.valid_until().checked_sub(lease).unwrap_or_else(now);
    let life = Lifeline::new(
        item.queue_key().as_str(),
        format!("item {} (attempt {})", item.id(), item.attempt()),
        granted_at,
        lease,
    );
    let kept = Arc::clone(item);
    let renew: RenewAtom = Box::new(move || {
        let item = Arc::clone(&kept);
        Box::pin(async move { item.extend().await })
    });
    // Item::extend reports a not-owner answer and a fault itself.
    let events = Events {
        expired: Some(&events::WORK_LEASE_LOST),
        ..Events::default()
    };
    keepalive::spawn(
        Arc::clone(&life),
        Plan::new(lease, lease / 3, events),
        renew,
    );
    life
}

/// Waits for `work` (the handler's task) while the keep-alive engine keeps `item` extended,
/// then settles the item by the handler's answer, or releases it when the handler asked so;
/// releases it if `abort` fires first.
async fn run_one<E: fmt::Display + Send + 'static>(
    item: Arc<Item>,
    job: Job,
    life: Arc<Lifeline>,
    mut work: AbortOnDrop<std::result::Result<(), E>>,
    abort: CancellationToken,
    _permit: OwnedSemaphorePermit,
) -> Outcome {
    let result = tokio::select! {
        done = &mut work.0 => Some(done),
        _ = abort.cancelled() => {
            work.0.abort();
            None
        }
    };
    life.stop();
    // Known lost: an extension answered that another claim owns it. An item only presumed
    // lost (no extension landed in time) is still settled: the store decides.
    let known_lost = life.loss() == Some(Loss::NotHeld);
    let Some(done) = result else {
        if known_lost {
            return Outcome::LeaseLost;
        }
        return release(&item).await;
    };
    if known_lost {
        // The extension already reported it; the result is discarded.
        return Outcome::LeaseLost;
    }
    match done {
        // The handler gave the item back (a panic still fails it, below).
        Ok(_) if job.releases_on_return() => release(&item).await,
        Ok(Ok(())) => match settle(|| item.try_complete()).await {
            Some(Settle::Settled) => Outcome::Completed,
            Some(Settle::NotOwner) => Outcome::LeaseLost,
            None => Outcome::Fault,
        },
        Ok(Err(error)) => fail(&item, &error_text(&error)).await,
        Err(join) => {
            let error = if join.is_panic() {
                "the handler panicked".to_owned()
            } else {
                "the handler was cancelled".to_owned()
            };
            Outcome::Panicked(Box::new(fail(&item, &error).await))
        }
    }
}

async fn release(item: &Item) -> Outcome {
    match settle(|| item.try_release()).await {
        Some(Settle::Settled) => Outcome::Released,
        Some(Settle::NotOwner) => Outcome::LeaseLost,
        None => Outcome::Fault,
    }
}

async fn fail(item: &Item, error: &str) -> Outcome {
    match settle(|| item.try_fail(error, false)).await {
        Some(Failure::Retrying { .. }) => Outcome::Retried,
        Some(Failure::DeadLettered) => Outcome::DeadLettered,
        Some(Failure::NotOwner) => Outcome::LeaseLost,
        None => Outcome::Fault,
    }
}

/// Runs a settle up to [`SETTLE_TRIES`] times while it hits store faults; `None` when every
/// try faulted (the item is left to its lease).
async fn settle<T, F, Fut>(call: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T>>,
{
    retry::retry(SETTLE_BACKOFF, SETTLE_TRIES, call).await.ok()
}
