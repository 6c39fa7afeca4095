//! Locks: non-reentrant, TTL-bounded, best-effort mutual exclusion across processes.
//!
//! Use a lock to collapse duplicate work (a cron job that must run on one replica, a paid
//! API call that must not be made twice at once) whose state is not a row you could update
//! conditionally. Never make a lock the only guard on an invariant that your database can
//! enforce: a holder paused past its TTL loses the lock without knowing it. Every grant
//! carries a [`Fence`](crate::Fence) for that case.
//!
//! Use [`Leases`](crate::Leases) instead when the holder is a stable identity (an instance
//! id) that may re-claim what it already holds.

pub(crate) mod grant;
mod guard;
mod handoffs;
mod options;
pub mod signals;
mod turns;

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::{Instant, sleep_until};

pub use guard::{KeepOutcome, LockGuard, LockHandle, ReleaseOutcome};
pub use options::{LockOptions, MAX_HOLD_LIMIT, MAX_LABEL_BYTES};

use crate::error::{Error, ErrorKind, Result};
use crate::holder::Holder;
use crate::key::{Key, KeyKind, Namespace, StoreKey};
use crate::lock::grant::{Deadlines, GrantState, Watch, now, spawn_watchdog};
use crate::retry::{Backoff, jitter};
use crate::store::{Claim, LeaseRequest, LeaseStore};
use crate::telemetry::{self, Event, events};
use options::ValidOptions;
use turns::Turns;

/// Why [`Locks::acquire`] did not return a guard.
#[derive(Debug)]
#[non_exhaustive]
pub enum AcquireError {
    /// Another holder held the lock for the whole wait: steady-state contention, not an
    /// incident.
    Contended {
        /// The holder seen at the last attempt, when known.
        holder: Option<String>,
        /// Its remaining time at the last attempt, when known.
        remaining: Option<Duration>,
    },
    /// The store could not be reached: an incident (emits
    /// [`baton.lock.unavailable`](crate::telemetry::events::LOCK_UNAVAILABLE)).
    Unavailable(Error),
    /// The input was rejected before any I/O.
    InvalidInput(Error),
}

impl AcquireError {
    /// Whether this is contention rather than a failure.
    pub fn is_contended(&self) -> bool {
        matches!(self, AcquireError::Contended { .. })
    }

    fn from_error(error: Error) -> Self {
        match error.kind() {
            ErrorKind::InvalidInput => AcquireError::InvalidInput(error),
            _ => AcquireError::Unavailable(error),
        }
    }
}

impl fmt::Display for AcquireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AcquireError::Contended {
                holder: Some(holder),
                remaining,
            } => {
                write!(f, "lock is held by {holder}")?;
                if let Some(remaining) = remaining {
                    write!(f, " for another {}ms", remaining.as_millis())?;
                }
                Ok(())
            }
            AcquireError::Contended { holder: None, .. } => write!(f, "lock is held elsewhere"),
            AcquireError::Unavailable(e) | AcquireError::InvalidInput(e) => fmt::Display::fmt(e, f),
        }
    }
}

impl std::error::Error for AcquireError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            AcquireError::Unavailable(e) | AcquireError::InvalidInput(e) => Some(e),
            AcquireError::Contended { .. } => None,
        }
    }
}

impl From<Error> for AcquireError {
    fn from(error: Error) -> Self {
        AcquireError::from_error(error)
    }
}

impl From<AcquireError> for Error {
    /// `Unavailable` and `InvalidInput` give back their error; `Contended` becomes
    /// [`ErrorKind::Timeout`] (the wait ended with the lock still held), naming the holder.
    /// So `?` works on [`Locks::acquire`] in a function returning [`crate::Result`]:
    ///
    /// ```
    /// use std::time::Duration;
    /// use baton_core::{Locks, LockOptions};
    ///
    /// async fn nightly(locks: &Locks) -> baton_core::Result<u64> {
    ///     let guard = locks.acquire("nightly", &LockOptions::new(Duration::from_secs(30))).await?;
    ///     let fence = guard.fence().get();
    ///     guard.release().await;
    ///     Ok(fence)
    /// }
    /// ```
    fn from(error: AcquireError) -> Self {
        match error {
            AcquireError::Unavailable(e) | AcquireError::InvalidInput(e) => e,
            contended @ AcquireError::Contended { .. } => {
                Error::new(ErrorKind::Timeout, contended.to_string())
            }
        }
    }
}

/// The lock client over one store. Cheap to clone; share one per process.
///
/// # Examples
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::{sync::Arc, time::Duration};
/// use baton_core::{Locks, LockOptions, MemoryStore};
///
/// let locks = Locks::new(Arc::new(MemoryStore::new()));
/// let guard = locks.acquire("nightly-report", &LockOptions::new(Duration::from_secs(30))).await?;
/// // ... the work, passing guard.fence() to what it writes ...
/// guard.release().await;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct Locks {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    store: Arc<dyn LeaseStore>,
    namespace: Namespace,
    /// What the keys are: locks, or a semaphore's permits.
    kind: KeyKind,
    /// What a lost grant is reported as.
    lost_event: &'static Event,
    turns: Turns,
    /// Whether waiters tell the store that they wait ([`ReleaseHub::subscribe_as`]), so a
    /// store that hands a released key to a waiting holder may hand it to them.
    ///
    /// [`ReleaseHub::subscribe_as`]: crate::signals::ReleaseHub::subscribe_as
    hand_over: bool,
    /// Fires the lost signal of grants without keep-alive.
    deadlines: Deadlines,
}

/// A claim that granted: the grant's fence, and when its request was sent.
struct Granted {
    fence: crate::fence::Fence,
    sent: Instant,
}

/// The last holder seen while waiting.
struct Seen {
    holder: Holder,
    remaining: Duration,
}

impl Locks {
    /// Locks in the default namespace.
    pub fn new(store: Arc<dyn LeaseStore>) -> Self {
        Locks::with_namespace(store, Namespace::default())
    }

    /// Locks in `namespace`.
    pub fn with_namespace(store: Arc<dyn LeaseStore>, namespace: Namespace) -> Self {
        Locks::of_kind(store, namespace, KeyKind::Lock, &events::LOCK_LOST)
    }

    /// The lock policy over `store` for keys of `kind`, reporting a lost grant as
    /// `lost_event`: how a semaphore's permits reuse it.
    pub(crate) fn of_kind(
        store: Arc<dyn LeaseStore>,
        namespace: Namespace,
        kind: KeyKind,
        lost_event: &'static Event,
    ) -> Self {
        Locks::build(store, namespace, kind, lost_event, true)
    }

    fn build(
        store: Arc<dyn LeaseStore>,
        namespace: Namespace,
        kind: KeyKind,
        lost_event: &'static Event,
        hand_over: bool,
    ) -> Self {
        Locks {
            inner: Arc::new(Inner {
                store,
                namespace,
                kind,
                lost_event,
                turns: Turns::default(),
                hand_over,
                deadlines: Deadlines::new(lost_event),
            }),
        }
    }

    /// The same policy whose waiters are never handed a released key by the store: each
    /// claims it, so the claim records its reason. How elections keep a new leader's value
    /// with its grant (a hand-over carries no reason).
    pub(crate) fn claiming_only(
        store: Arc<dyn LeaseStore>,
        namespace: Namespace,
        kind: KeyKind,
        lost_event: &'static Event,
    ) -> Self {
        Locks::build(store, namespace, kind, lost_event, false)
    }

    /// The namespace keys are qualified with.
    pub fn namespace(&self) -> &Namespace {
        &self.inner.namespace
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn LeaseStore> {
        &self.inner.store
    }

    fn qualify(&self, key: &str) -> Result<StoreKey> {
        Ok(self
            .inner
            .namespace
            .qualify(self.inner.kind, &Key::new(key)?))
    }

    /// Tries to take `key` with `options` (TTL, wait, keep-alive), waiting up to the
    /// options' `wait` for a current holder; a zero wait (the default) is exactly one
    /// attempt. `Ok(None)` means the lock was still held when the wait elapsed.
    ///
    /// # Examples
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> baton_core::Result<()> {
    /// use std::{sync::Arc, time::Duration};
    /// use baton_core::{Locks, LockOptions, MemoryStore};
    ///
    /// let locks = Locks::new(Arc::new(MemoryStore::new()));
    /// let options = LockOptions::new(Duration::from_secs(30)).wait(Duration::from_millis(100));
    /// let guard = locks.try_acquire("job", &options).await?.expect("free");
    /// assert!(locks.try_acquire("job", &options).await?.is_none(), "held");
    /// guard.release().await;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// `InvalidInput` before any I/O for a bad key or options; `Unavailable` when the store
    /// faulted.
    ///
    /// # Cancel safety
    /// Dropping the future while a claim is in flight releases what that claim may have
    /// granted, in the background; the TTL is the backstop.
    pub async fn try_acquire(&self, key: &str, options: &LockOptions) -> Result<Option<LockGuard>> {
        match self.acquire(key, options).await {
            Ok(guard) => Ok(Some(guard)),
            Err(AcquireError::Contended { .. }) => Ok(None),
            Err(AcquireError::Unavailable(e) | AcquireError::InvalidInput(e)) => Err(e),
        }
    }

    /// Takes `key` with `options`, telling contention apart from a store fault.
    ///
    /// Waiting wakes on the store's release signal, falls back to the holder's remaining TTL
    /// (expiry sends no signal), and polls where the store has no push. Waiters of one key in
    /// one process queue in FIFO order and only the first of them queries the store, so a
    /// release wakes one waiter rather than a herd, and nobody starves.
    ///
    /// A waiter that has had an answer from the store rides out the faults that follow (a
    /// Redis failover, a server restart, a replaced connection): it claims again with a
    /// backoff of 50 ms doubling to 1 s, and answers `Unavailable` only when the store is
    /// still failing as its wait ends (`baton.lock.wait_faulted` says it met a fault). A
    /// first claim that faults answers `Unavailable` at once.
    ///
    /// A lock is not reentrant: asking again for a key this task holds waits for itself and
    /// ends with [`AcquireError::Contended`].
    ///
    /// # Errors
    /// See [`AcquireError`].
    ///
    /// # Cancel safety
    /// As for [`Locks::try_acquire`].
    pub async fn acquire(
        &self,
        key: &str,
        options: &LockOptions,
    ) -> Result<LockGuard, AcquireError> {
        let holder = options.new_holder();
        self.acquire_as(key, options, holder, "").await
    }

    /// [`Locks::acquire`] for `holder`, recording `reason` with the grant (as a lease's
    /// reason is): how an election's campaign keeps its candidate's value beside the grant.
    pub(crate) async fn acquire_as(
        &self,
        key: &str,
        options: &LockOptions,
        holder: Holder,
        reason: &str,
    ) -> Result<LockGuard, AcquireError> {
        let valid = options.checked()?;
        let key = self.qualify(key)?;
        let started = now();
        let result = self
            .acquire_valid(key, holder, valid, started, reason)
            .await;
        let outcome = match &result {
            Ok(_) => "acquired",
            Err(AcquireError::Contended { .. }) => "contended",
            Err(_) => "failed",
        };
        telemetry::record_wait(
            now().saturating_duration_since(started).as_secs_f64(),
            outcome,
        );
        result
    }

    /// Runs `work` under the lock and releases it afterwards, also when `work` panics or
    /// its future is dropped (the guard's drop releases in the background). `work` receives
    /// a [`LockHandle`] with the fence and the lost signal.
    ///
    /// The release outcome is reported through telemetry; use [`Locks::acquire`] and
    /// [`LockGuard::release`] to act on it.
    ///
    /// # Errors
    /// As [`Locks::acquire`]; `work` does not run unless the lock was acquired.
    pub async fn with_lock<F, Fut, T>(
        &self,
        key: &str,
        options: &LockOptions,
        work: F,
    ) -> Result<T, AcquireError>
    where
        F: FnOnce(LockHandle) -> Fut,
        Fut: Future<Output = T>,
    {
        let guard = self.acquire(key, options).await?;
        let value = work(guard.handle()).await;
        guard.release().await;
        Ok(value)
    }

    /// The current holder of lock `key`.
    ///
    /// # Errors
    /// `InvalidInput` for a bad key; `Unavailable` when the store faulted.
    pub async fn inspect(&self, key: &str) -> Result<Option<crate::HolderInfo>> {
        let key = self.qualify(key)?;
        self.inner.store.inspect(&key).await
    }

    /// Held locks whose key starts with `prefix`, at most `limit`.
    ///
    /// # Errors
    /// `InvalidInput` for a bad prefix; `Unavailable` when the store faulted.
    pub async fn list(&self, prefix: &str, limit: usize) -> Result<Vec<crate::HolderInfo>> {
        let prefix = self
            .inner
            .namespace
            .qualify_prefix(self.inner.kind, prefix)?;
        self.inner.store.list(&prefix, limit).await
    }

    async fn acquire_valid(
        &self,
        key: StoreKey,
        holder: Holder,
        options: ValidOptions,
        started: Instant,
        reason: &str,
    ) -> Result<LockGuard, AcquireError> {
        if options.wait.is_zero() {
            return match self.attempt(&key, &holder, options, reason).await {
                Ok(Ok(granted)) => Ok(self.guard(key, holder, granted, options)),
                Ok(Err(seen)) => Err(contended(Some(seen))),
                Err(error) => Err(unavailable(&key, error)),
            };
        }
        let deadline = started + options.wait.get();
        // Queue behind this process's other waiters for the key; only the head waits on the
        // store.
        let Ok(_turn) = tokio::time::timeout_at(deadline, self.inner.turns.take(&key)).await else {
            // Other waiters of this process kept the key's queue busy for the whole wait.
            // One last attempt tells whether it is still held, and by whom.
            return match self.attempt(&key, &holder, options, reason).await {
                Ok(Ok(granted)) => Ok(self.guard(key, holder, granted, options)),
                Ok(Err(seen)) => Err(contended(Some(seen))),
                Err(error) => Err(unavailable(&key, error)),
            };
        };
        let wakeups = self.inner.store.wakeups();
        // Subscribe before the first attempt so that a release in between is not missed; the
        // subscription then lasts the whole wait (a signal that arrives while an attempt is
        // in flight is kept for the next sleep), so this process counts as waiting for the key
        // from the first attempt to the last.
        let mut released = if self.inner.hand_over {
            wakeups.hub.subscribe_as(&key, &holder)
        } else {
            wakeups.hub.subscribe(&key)
        };
        // Whether the store has answered this acquire: a waiter rides out the store faults
        // that come after an answer (a failover, a restart, a replaced connection) until its
        // wait ends, while a first claim that faults fails at once.
        let mut answered = false;
        let mut faults = FAULT_BACKOFF.attempts();
        loop {
            let seen = match self.attempt(&key, &holder, options, reason).await {
                Ok(Ok(granted)) => return Ok(self.guard(key, holder, granted, options)),
                Ok(Err(seen)) => {
                    answered = true;
                    faults.reset();
                    Some(seen)
                }
                Err(error)
                    if answered && error.is_retryable() && now() + faults.peek() < deadline =>
                {
                    if faults.is_fresh() {
                        telemetry::emit(
                            &events::LOCK_WAIT_FAULTED,
                            Some(key.as_str()),
                            format_args!(
                                "a waiting acquire met a store fault and keeps claiming until its wait ends: {error}"
                            ),
                        );
                    }
                    None
                }
                Err(error) => return Err(unavailable(&key, error)),
            };
            let now = now();
            let wake_at = match seen {
                Some(seen) => {
                    if now >= deadline {
                        return Err(contended(Some(seen)));
                    }
                    // Expiry publishes nothing: re-check when the holder's TTL runs out.
                    let mut wake_at =
                        (now + seen.remaining + Duration::from_millis(1)).min(deadline);
                    if let Some(poll) = wakeups.poll {
                        wake_at = wake_at.min(now + jitter(poll));
                    }
                    wake_at
                }
                // A fault: claim again after a backoff (a release signal still wakes sooner).
                None => now + faults.next_delay(),
            };
            tokio::select! {
                _ = released.released() => {}
                _ = sleep_until(wake_at) => {}
            }
        }
    }

    /// One claim. `Ok(Err(seen))` is contention; `Ok(Ok(granted))` a grant, which
    /// [`Locks::guard`] turns into a guard; `Err` the store's fault, which the caller either
    /// rides out or reports with [`unavailable`].
    async fn attempt(
        &self,
        key: &StoreKey,
        holder: &Holder,
        options: ValidOptions,
        reason: &str,
    ) -> Result<Result<Granted, Seen>> {
        let store = &self.inner.store;
        let sent = now();
        let pending = PendingClaim {
            store: Some(Arc::clone(store)),
            key,
            holder,
        };
        let claim = store
            .claim(key, LeaseRequest::new(holder, options.ttl).reason(reason))
            .await;
        pending.disarm();
        match claim {
            Ok(Claim::Granted { fence } | Claim::Extended { fence }) => {
                Ok(Ok(Granted { fence, sent }))
            }
            // Granted at a release while this waiter was queued: valid from before the claim
            // that queued it, which is earlier than `sent`.
            Ok(Claim::HandedOver { fence, since }) => Ok(Ok(Granted {
                fence,
                sent: since.min(sent),
            })),
            Ok(Claim::Held { holder, remaining }) => Ok(Err(Seen { holder, remaining })),
            Err(error) => Err(error),
        }
    }

    /// The guard of a grant, watched until it is released.
    fn guard(
        &self,
        key: StoreKey,
        holder: Holder,
        granted: Granted,
        options: ValidOptions,
    ) -> LockGuard {
        let store = Arc::clone(&self.inner.store);
        let Granted { fence, sent } = granted;
        let grant = GrantState::new(store, key, holder, fence, sent, options.ttl);
        let grant = match options.keep_alive {
            // The lost signal fires at valid_until: a shared timer, no task.
            None => self.inner.deadlines.watch(grant),
            Some(_) => {
                let grant = Arc::new(grant);
                spawn_watchdog(
                    Arc::clone(&grant),
                    Watch {
                        ttl: options.ttl,
                        keep_alive: options.keep_alive,
                        max_hold: options.max_hold,
                        lost_event: self.inner.lost_event,
                        renew_failed_event: &events::LOCK_RENEW_FAILED,
                        max_hold_event: Some(&events::LOCK_MAX_HOLD_REACHED),
                    },
                );
                grant
            }
        };
        LockGuard::new(grant)
    }
}

/// How long a waiter that met a store fault waits before it claims again: 50 ms, doubling to
/// 1 s, jittered.
const FAULT_BACKOFF: Backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(1));

/// The store's fault as the answer of an acquire, reported as `baton.lock.unavailable`.
fn unavailable(key: &StoreKey, error: Error) -> AcquireError {
    telemetry::emit(
        &events::LOCK_UNAVAILABLE,
        Some(key.as_str()),
        format_args!("acquire failed: {error}"),
    );
    AcquireError::from_error(error)
}

fn contended(seen: Option<Seen>) -> AcquireError {
    match seen {
        Some(seen) => AcquireError::Contended {
            holder: Some(seen.holder.as_str().to_owned()),
            remaining: Some(seen.remaining),
        },
        None => AcquireError::Contended {
            holder: None,
            remaining: None,
        },
    }
}

/// Releases, in the background, what an in-flight claim may have granted if the acquire
/// future is dropped before the answer arrives.
struct PendingClaim<'a> {
    store: Option<Arc<dyn LeaseStore>>,
    key: &'a StoreKey,
    holder: &'a Holder,
}

impl PendingClaim<'_> {
    fn disarm(mut self) {
        self.store = None;
    }
}

impl Drop for PendingClaim<'_> {
    fn drop(&mut self) {
        let Some(store) = self.store.take() else {
            return;
        };
        telemetry::emit(
            &events::LOCK_ACQUIRE_CANCELLED,
            Some(self.key.as_str()),
            format_args!("acquire cancelled with a claim in flight; releasing in the background"),
        );
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let key = self.key.clone();
            let holder = self.holder.clone();
            runtime.spawn(async move {
                let _ = store.release(&key, &holder).await;
            });
        }
    }
}
