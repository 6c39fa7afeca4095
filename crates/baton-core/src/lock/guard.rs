//! The guard of a held lock.

use std::fmt;
use std::sync::Arc;

use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

use crate::fence::Fence;
use crate::lock::grant::{GrantState, now};
use crate::store::{Release, Renewal};
use crate::telemetry::{self, events};
use crate::time::{Ttl, format_duration};

/// How a release ended. Release never fails: a fault is reported here and in telemetry, and
/// the TTL frees the key.
///
/// Exhaustive (an answer, not an error; see `dev/decisions.md`), so a `match` names every
/// case:
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), baton_core::AcquireError> {
/// use std::{sync::Arc, time::Duration};
/// use baton_core::{Locks, LockOptions, MemoryStore, ReleaseOutcome};
///
/// let locks = Locks::new(Arc::new(MemoryStore::new()));
/// let guard = locks.acquire("job", &LockOptions::new(Duration::from_secs(30))).await?;
/// match guard.release().await {
///     ReleaseOutcome::Released => {}
///     ReleaseOutcome::Expired => { /* not exclusive throughout: check the fence's effects */ }
///     ReleaseOutcome::Faulted => { /* store down; the TTL frees the key */ }
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReleaseOutcome {
    /// The grant was still ours and is now free.
    Released,
    /// The grant had already expired (and may belong to someone else now): the section was
    /// **not** exclusive throughout. Logged as
    /// [`baton.lock.release_after_expiry`](crate::telemetry::events::LOCK_RELEASE_AFTER_EXPIRY).
    Expired,
    /// The store could not be reached; the key stays held until its TTL lapses. Logged as
    /// [`baton.lock.release_faulted`](crate::telemetry::events::LOCK_RELEASE_FAULTED).
    Faulted,
}

/// How [`LockGuard::keep_for`] ended. The guard is gone either way and nothing was released.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeepOutcome {
    /// The grant was still ours; it now ends on the store `ttl` after the request was
    /// answered, and is certainly held until `until` (measured from before the request).
    Kept {
        /// The monotonic instant until which the key is certainly held.
        until: Instant,
    },
    /// The grant had already expired (and may belong to someone else now): the section was
    /// **not** exclusive throughout. Logged as
    /// [`baton.lock.release_after_expiry`](crate::telemetry::events::LOCK_RELEASE_AFTER_EXPIRY).
    Expired,
    /// The store could not be reached; the grant keeps the TTL it had, and ends then. Logged
    /// as [`baton.lock.keep_faulted`](crate::telemetry::events::LOCK_KEEP_FAULTED).
    Faulted,
}

/// A cheap, cloneable view of a held lock: its fence, deadline and lost signal. Hand it to
/// the work the lock protects (see [`Locks::with_lock`](crate::Locks::with_lock)).
#[derive(Clone)]
pub struct LockHandle {
    grant: Arc<GrantState>,
}

impl LockHandle {
    /// The grant's fencing token: strictly larger than every earlier grant's of this key.
    /// Pass it to the resource you protect and have the resource reject smaller fences.
    pub fn fence(&self) -> Fence {
        self.grant.fence
    }

    /// The monotonic instant until which the grant is certainly valid, measured from before
    /// the request that granted (or last renewed) it was sent. Past it, assume the lock is
    /// gone.
    pub fn valid_until(&self) -> Instant {
        self.grant.valid_until()
    }

    /// Resolves when the grant is known or presumed gone: the store reported another holder,
    /// or `valid_until` passed without a successful renewal. An owned future (it borrows
    /// nothing): await it, or make it a `tokio::select!` branch to stop work that is no
    /// longer exclusive.
    ///
    /// # Examples
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::{sync::Arc, time::Duration};
    /// use baton_core::{LockOptions, Locks, MemoryStore};
    /// # async fn reindex() {}
    ///
    /// let locks = Locks::new(Arc::new(MemoryStore::new()));
    /// let options = LockOptions::new(Duration::from_secs(30)).keep_alive(Duration::from_secs(10));
    /// let guard = locks.acquire("reindex", &options).await?;
    /// tokio::select! {
    ///     () = reindex() => {}
    ///     _ = guard.lost() => return Err("lost the reindex lock; stopping".into()),
    /// }
    /// guard.release().await;
    /// # Ok(()) }
    /// ```
    pub fn lost(&self) -> WaitForCancellationFutureOwned {
        self.grant.lost.clone().cancelled_owned()
    }

    /// The lost signal as a [`CancellationToken`], to hand to code that takes one (a child
    /// of the grant's own: cancelling it changes nothing for the grant).
    pub fn lost_token(&self) -> CancellationToken {
        self.grant.lost.child_token()
    }

    /// Whether the lost signal has fired.
    pub fn is_lost(&self) -> bool {
        self.grant.lost.is_cancelled()
    }

    /// The key as the caller gave it.
    pub fn key(&self) -> &str {
        self.grant.key.user_key()
    }
}

impl fmt::Debug for LockHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockHandle")
            .field("key", &self.grant.key)
            .field("fence", &self.grant.fence)
            .field("lost", &self.is_lost())
            .finish()
    }
}

/// A held lock. Release it with [`LockGuard::release`]; dropping it schedules a best-effort
/// release in the background.
///
/// A lock is best-effort, not a consensus protocol: a holder paused past its TTL loses the
/// lock without knowing it. Keep the protected resource correct with [`LockGuard::fence`],
/// and stop work when [`LockGuard::lost`] fires.
///
/// ## Behavior
/// - `release` compares the holder token, so it never frees a newer holder's grant.
/// - `Drop` without `release` never blocks: it spawns the release on the current tokio
///   runtime, or, outside any runtime, leaves the key to its TTL and says so in telemetry.
/// - The watchdog (and keep-alive, when configured) stops on release and on drop.
#[must_use = "dropping a LockGuard releases the lock at once; bind it to a variable for the length of the critical section"]
pub struct LockGuard {
    handle: LockHandle,
    released: bool,
}

impl LockGuard {
    pub(crate) fn new(grant: Arc<GrantState>) -> Self {
        LockGuard {
            handle: LockHandle { grant },
            released: false,
        }
    }

    /// See [`LockHandle::fence`].
    pub fn fence(&self) -> Fence {
        self.handle.fence()
    }

    /// See [`LockHandle::valid_until`].
    pub fn valid_until(&self) -> Instant {
        self.handle.valid_until()
    }

    /// See [`LockHandle::lost`].
    pub fn lost(&self) -> WaitForCancellationFutureOwned {
        self.handle.lost()
    }

    /// See [`LockHandle::lost_token`].
    pub fn lost_token(&self) -> CancellationToken {
        self.handle.lost_token()
    }

    /// See [`LockHandle::is_lost`].
    pub fn is_lost(&self) -> bool {
        self.handle.is_lost()
    }

    /// See [`LockHandle::key`].
    pub fn key(&self) -> &str {
        self.handle.key()
    }

    /// The grant this guard holds: its store, key and holder.
    pub(crate) fn grant(&self) -> &GrantState {
        &self.handle.grant
    }

    /// A cloneable view of this lock, for work that runs elsewhere.
    pub fn handle(&self) -> LockHandle {
        self.handle.clone()
    }

    /// Releases the lock, if this grant still holds it. Never an error.
    ///
    /// # Cancel safety
    /// If the returned future is dropped before it completes, the release continues as a
    /// best-effort background release (as with `Drop`).
    pub async fn release(mut self) -> ReleaseOutcome {
        self.released = true;
        let grant = Arc::clone(&self.handle.grant);
        drop(self);
        // Released inline; if this future is dropped mid-release, the guard below hands the
        // release to a background task (a second release of the same token is harmless).
        let pending = PendingRelease(Some(Arc::clone(&grant)));
        let outcome = release_grant(grant).await;
        pending.disarm();
        outcome
    }

    /// Ends the guard **without releasing**: the keep-alive stops, and the key stays held
    /// until the grant's current TTL ends on the store. Returns the instant until which the
    /// key is certainly held ([`LockGuard::valid_until`]).
    ///
    /// This is "release on completion or rely on the TTL" made explicit: a cron job that
    /// locks a per-tick key with the TTL as its cooldown, so that no other replica runs the
    /// tick again. Unlike `std::mem::forget(guard)` or a drop, it is quiet: no lost signal,
    /// no `baton.lock.lost`, only the debug event
    /// [`baton.lock.kept_until_expiry`](crate::telemetry::events::LOCK_KEPT_UNTIL_EXPIRY).
    /// To choose how long the key stays held from now, use [`LockGuard::keep_for`].
    ///
    /// # Examples
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::{sync::Arc, time::Duration};
    /// use baton_core::{Locks, LockOptions, MemoryStore};
    ///
    /// let locks = Locks::new(Arc::new(MemoryStore::new()));
    /// // One run per tick on the whole cluster: the TTL is the cooldown.
    /// let options = LockOptions::new(Duration::from_secs(300));
    /// if let Some(guard) = locks.try_acquire("report:2026-12-02T05:00", &options).await? {
    ///     // ... the tick's work ...
    ///     guard.keep_until_expiry();
    /// }
    /// assert!(locks.try_acquire("report:2026-12-02T05:00", &options).await?.is_none());
    /// # Ok(()) }
    /// ```
    pub fn keep_until_expiry(mut self) -> Instant {
        self.released = true;
        let grant = &self.handle.grant;
        grant.stop();
        let until = grant.valid_until();
        telemetry::emit(
            &events::LOCK_KEPT_UNTIL_EXPIRY,
            Some(grant.key.as_str()),
            format_args!(
                "lock with fence {} kept until its TTL ends, in {}",
                grant.fence,
                format_duration(until.saturating_duration_since(now()))
            ),
        );
        until
    }

    /// Ends the guard **without releasing**, with the grant set to end `ttl` from now: the
    /// keep-alive stops, one renewal with `ttl` (shorter or longer than the grant's own)
    /// sets when the key is freed, and nothing releases it before. `baton run --cooldown`
    /// is built on this.
    ///
    /// Quiet in telemetry as [`LockGuard::keep_until_expiry`] is; a grant found expired is
    /// reported as a release after expiry would be.
    ///
    /// # Cancel safety
    /// If the future is dropped before the store answers, the grant keeps either its old
    /// TTL or `ttl`, whichever the store applied; it is not released.
    pub async fn keep_for(mut self, ttl: Ttl) -> KeepOutcome {
        self.released = true;
        let grant = Arc::clone(&self.handle.grant);
        drop(self);
        // A renewal the keep-alive already sent must not land after this one and put the
        // lock's own TTL back.
        grant.stop_and_settle().await;
        let key = grant.key.as_str();
        let sent = now();
        match grant.store.renew(&grant.key, &grant.holder, ttl).await {
            Ok(Renewal::Renewed) => {
                telemetry::emit(
                    &events::LOCK_KEPT_UNTIL_EXPIRY,
                    Some(key),
                    format_args!(
                        "lock with fence {} kept for another {}",
                        grant.fence,
                        format_duration(ttl.get())
                    ),
                );
                KeepOutcome::Kept {
                    until: sent + ttl.get(),
                }
            }
            Ok(Renewal::NotHeld) => {
                telemetry::emit(
                    &events::LOCK_RELEASE_AFTER_EXPIRY,
                    Some(key),
                    format_args!(
                        "lock with fence {} was to be kept for {}, but it had already expired",
                        grant.fence,
                        format_duration(ttl.get())
                    ),
                );
                KeepOutcome::Expired
            }
            Err(error) => {
                telemetry::emit(
                    &events::LOCK_KEEP_FAULTED,
                    Some(key),
                    format_args!(
                        "setting the TTL of the lock with fence {} to {} failed; it ends with its current TTL: {error}",
                        grant.fence,
                        format_duration(ttl.get())
                    ),
                );
                KeepOutcome::Faulted
            }
        }
    }
}

/// Finishes a release in the background if the future running it is dropped.
struct PendingRelease(Option<Arc<GrantState>>);

impl PendingRelease {
    fn disarm(mut self) {
        self.0 = None;
    }
}

impl Drop for PendingRelease {
    fn drop(&mut self) {
        if let (Some(grant), Ok(runtime)) = (self.0.take(), tokio::runtime::Handle::try_current()) {
            runtime.spawn(release_grant(grant));
        }
    }
}

/// Releases `grant` on the store and reports the outcome.
pub(crate) async fn release_grant(grant: Arc<GrantState>) -> ReleaseOutcome {
    grant.stop();
    let key = grant.key.as_str();
    let held_for = now().saturating_duration_since(grant.granted_at);
    telemetry::record_hold(held_for.as_secs_f64());
    match grant.store.release(&grant.key, &grant.holder).await {
        Ok(Release::Removed) => ReleaseOutcome::Released,
        Ok(Release::Reclaimed { by }) => {
            telemetry::emit(
                &events::LOCK_RELEASE_AFTER_EXPIRY,
                Some(key),
                format_args!(
                    "lock with fence {} released after {:?}, but it had expired and is now held by {by}",
                    grant.fence, held_for
                ),
            );
            ReleaseOutcome::Expired
        }
        Ok(Release::NoHolder) => {
            telemetry::emit(
                &events::LOCK_RELEASE_AFTER_EXPIRY,
                Some(key),
                format_args!(
                    "lock with fence {} released after {:?}, but it had already expired",
                    grant.fence, held_for
                ),
            );
            ReleaseOutcome::Expired
        }
        Err(error) => {
            telemetry::emit(
                &events::LOCK_RELEASE_FAULTED,
                Some(key),
                format_args!(
                    "release of the lock with fence {} failed; its TTL will free it: {error}",
                    grant.fence
                ),
            );
            ReleaseOutcome::Faulted
        }
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        let grant = Arc::clone(&self.handle.grant);
        grant.stop();
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                telemetry::emit(
                    &events::LOCK_DROPPED_UNRELEASED,
                    Some(grant.key.as_str()),
                    format_args!(
                        "guard with fence {} dropped; releasing in the background",
                        grant.fence
                    ),
                );
                runtime.spawn(release_grant(grant));
            }
            Err(_) => telemetry::emit(
                &events::LOCK_DROPPED_WITHOUT_RUNTIME,
                Some(grant.key.as_str()),
                format_args!(
                    "guard with fence {} dropped outside a tokio runtime; the key is held until its TTL lapses",
                    grant.fence
                ),
            ),
        }
    }
}

impl fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockGuard")
            .field("key", &self.handle.grant.key)
            .field("fence", &self.handle.grant.fence)
            .field("lost", &self.is_lost())
            .finish()
    }
}
