//! The guard of a held lock.

use std::fmt;
use std::sync::Arc;

use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

use crate::fence::Fence;
use crate::grant::{GrantState, now};
use crate::store::Release;
use crate::telemetry::{self, events};

/// How a release ended. Release never fails: a fault is reported here and in telemetry, and
/// the TTL frees the key.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
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
