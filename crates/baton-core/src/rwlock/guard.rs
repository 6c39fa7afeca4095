//! The guard of a held write lock: the writer's gate and its permit, held and given back
//! together.

use std::fmt;

use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, DropGuard, WaitForCancellationFutureOwned};

use crate::fence::Fence;
use crate::lock::{LockGuard, ReleaseOutcome};

/// A held write lock of an [`RwLock`](crate::RwLock): no reader and no other writer holds
/// the key until it is released (best effort, as for every lease-based lock: see
/// [the module](crate::rwlock#behavior)).
///
/// It holds two grants, the key's **gate** (which keeps new readers and writers out) and a
/// **permit** (the only live one of the key); it reads as one:
///
/// - [`fence`](WriteGuard::fence) is the permit's: larger than the fence of every read and
///   write grant of the key before it.
/// - [`valid_until`](WriteGuard::valid_until) is the earlier of the two grants'.
/// - [`lost`](WriteGuard::lost) fires when either grant is lost.
/// - Keep-alive (from the options) renews both.
/// - [`release`](WriteGuard::release) gives back the permit first, then the gate, so a
///   reader let in by the gate never finds the writer's permit still held.
///
/// Dropping it without `release` releases both in the background, as dropping a
/// [`LockGuard`] does.
#[must_use = "dropping a WriteGuard releases the write lock at once; bind it to a variable for the length of the critical section"]
pub struct WriteGuard {
    // Dropped in this order: the permit's background release is started before the gate's.
    permit: LockGuard,
    gate: LockGuard,
    lost: CancellationToken,
    /// Stops the task that forwards either grant's lost signal to `lost`.
    _forwarding: DropGuard,
}

impl WriteGuard {
    pub(crate) fn new(gate: LockGuard, permit: LockGuard) -> WriteGuard {
        let lost = CancellationToken::new();
        let done = CancellationToken::new();
        let (gate_lost, permit_lost) = (gate.lost(), permit.lost());
        let (fire, stop) = (lost.clone(), done.clone());
        tokio::spawn(async move {
            tokio::select! {
                () = gate_lost => fire.cancel(),
                () = permit_lost => fire.cancel(),
                () = stop.cancelled() => {}
            }
        });
        WriteGuard {
            permit,
            gate,
            lost,
            _forwarding: done.drop_guard(),
        }
    }

    /// The write grant's fencing token (its permit's): strictly larger than every earlier
    /// read or write grant's of this key. Pass it to the resource you protect and have the
    /// resource reject smaller fences.
    pub fn fence(&self) -> Fence {
        self.permit.fence()
    }

    /// The monotonic instant until which the write lock is certainly held: the earlier of
    /// the gate's and the permit's, each measured from before the request that granted (or
    /// last renewed) it. Past it, assume readers or another writer may be in.
    pub fn valid_until(&self) -> Instant {
        self.gate.valid_until().min(self.permit.valid_until())
    }

    /// Resolves when the gate or the permit is known or presumed gone. An owned future, as
    /// [`LockGuard::lost`] is.
    pub fn lost(&self) -> WaitForCancellationFutureOwned {
        self.lost.clone().cancelled_owned()
    }

    /// The lost signal as a [`CancellationToken`] (a child: cancelling it changes nothing for
    /// the grant).
    pub fn lost_token(&self) -> CancellationToken {
        self.lost.child_token()
    }

    /// Whether the gate's or the permit's lost signal has fired.
    pub fn is_lost(&self) -> bool {
        self.gate.is_lost() || self.permit.is_lost() || self.lost.is_cancelled()
    }

    /// The key as the caller gave it.
    pub fn key(&self) -> &str {
        self.permit.key()
    }

    /// Releases the permit, then the gate. Never an error.
    ///
    /// [`ReleaseOutcome::Expired`] when either had expired (the section was not exclusive
    /// throughout), else [`ReleaseOutcome::Faulted`] when either release faulted (the TTL
    /// frees it), else [`ReleaseOutcome::Released`].
    ///
    /// # Cancel safety
    /// If the future is dropped before it completes, the releases not yet made are made in
    /// the background.
    pub async fn release(self) -> ReleaseOutcome {
        let WriteGuard { permit, gate, .. } = self;
        let permit = permit.release().await;
        let gate = gate.release().await;
        combine(permit, gate)
    }
}

/// One outcome for two releases: an expiry says most, then a fault.
fn combine(a: ReleaseOutcome, b: ReleaseOutcome) -> ReleaseOutcome {
    use ReleaseOutcome::{Expired, Faulted, Released};
    match (a, b) {
        (Expired, _) | (_, Expired) => Expired,
        (Faulted, _) | (_, Faulted) => Faulted,
        (Released, Released) => Released,
    }
}

impl fmt::Debug for WriteGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WriteGuard")
            .field("key", &self.key())
            .field("fence", &self.fence())
            .field("gate_fence", &self.gate.fence())
            .field("lost", &self.is_lost())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_expiry_outweighs_a_fault_and_a_fault_a_release() {
        use ReleaseOutcome::{Expired, Faulted, Released};
        assert_eq!(combine(Released, Released), Released);
        assert_eq!(combine(Released, Faulted), Faulted);
        assert_eq!(combine(Faulted, Expired), Expired);
        assert_eq!(combine(Expired, Released), Expired);
    }

    #[test]
    fn bounds() {
        fn is_send_sync<T: Send + Sync + 'static>() {}
        is_send_sync::<WriteGuard>();
    }
}
