//! The semaphore atom ([`SemaphoreStore`]), and the adapter that lets the lock policy drive
//! it: a semaphore's permit is a lock grant on an atom that admits up to N holders.

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;

use crate::error::{Error, Result};
use crate::holder::Holder;
use crate::key::StoreKey;
use crate::store::{Claim, HolderInfo, LeaseRequest, LeaseStore, Release, Renewal, Wakeups};
use crate::time::Ttl;

/// A live permit as [`SemaphoreStore::list_permits`] reports it: the grant, and the number
/// of permits (N) the claim that was granted it was made with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PermitInfo {
    /// The permit's key, holder, fence and remaining time (`reason` is empty).
    pub grant: HolderInfo,
    /// The N of the claim that was granted this permit (an extension keeps it); `None` for a
    /// permit granted by a baton that did not record it.
    pub permits: Option<u32>,
}

/// The atomic permit operations of one store.
///
/// # Contract
/// - Every operation is atomic on the store and decides expiry on the store's clock; an
///   expired permit counts for nothing and is never renewed.
/// - `claim_permit` grants a permit of `key` to `request.holder` (with the next fence of
///   `key`) when fewer than `permits` live permits of `key` are held; extends the holder's
///   own live permit (same fence) when it holds one; and otherwise answers
///   [`Claim::Held`] with the live permit that ends soonest (its holder and remaining time),
///   so a waiter knows when to look again even if no release is signalled.
/// - `permits` is the caller's: claims made with a smaller number than permits already held
///   grant nothing until enough of them end; nothing already granted is revoked.
/// - Fences strictly increase per key across every permit of it, also after expiry and after
///   the store is restarted or re-opened.
/// - A granted permit records the N of its claim, which `list_permits` reports.
/// - `renew_permit` and `release_permit` change only the holder's own live permit.
/// - A release that removed a permit signals [`Wakeups::hub`] for that key.
/// - Store faults are errors of kind `Unavailable`; they never look like contention.
#[async_trait]
pub trait SemaphoreStore: Send + Sync + fmt::Debug + 'static {
    /// Takes a permit of `key` for `request.holder`, out of `permits`.
    async fn claim_permit(
        &self,
        key: &StoreKey,
        request: LeaseRequest<'_>,
        permits: u32,
    ) -> Result<Claim>;

    /// Extends `holder`'s permit of `key` to `ttl` from now.
    async fn renew_permit(&self, key: &StoreKey, holder: &Holder, ttl: Ttl) -> Result<Renewal>;

    /// Gives back `holder`'s permit of `key`: [`Release::Removed`] when it was live,
    /// [`Release::NoHolder`] when it had ended (or was never held).
    async fn release_permit(&self, key: &StoreKey, holder: &Holder) -> Result<Release>;

    /// The live permits of `key`, oldest fence first.
    async fn permits(&self, key: &StoreKey) -> Result<Vec<HolderInfo>>;

    /// The live permits of the keys whose qualified key starts with `prefix`, ordered by key
    /// and then by fence (oldest first), each with the number of permits its claim was made
    /// with. At most `limit` **keys**, each with all of its live permits, so a listed key's
    /// holders are never cut short; a key whose permits have all ended is not listed and
    /// does not count.
    async fn list_permits(&self, prefix: &str, limit: usize) -> Result<Vec<PermitInfo>>;

    /// How waiters for permits of this store are woken.
    fn permit_wakeups(&self) -> Wakeups;
}

/// The permits of one semaphore as the lock policy sees them: a "lock" whose claim admits up
/// to `permits` holders. So waiting, keep-alive, the lost signal, guards and release outcomes
/// are the locks' own, written once.
#[derive(Debug)]
pub(crate) struct PermitLocks {
    pub(crate) store: Arc<dyn SemaphoreStore>,
    pub(crate) permits: u32,
}

#[async_trait]
impl LeaseStore for PermitLocks {
    async fn claim(&self, key: &StoreKey, request: LeaseRequest<'_>) -> Result<Claim> {
        self.store.claim_permit(key, request, self.permits).await
    }

    async fn renew(&self, key: &StoreKey, holder: &Holder, ttl: Ttl) -> Result<Renewal> {
        self.store.renew_permit(key, holder, ttl).await
    }

    async fn release(&self, key: &StoreKey, holder: &Holder) -> Result<Release> {
        self.store.release_permit(key, holder).await
    }

    async fn inspect(&self, key: &StoreKey) -> Result<Option<HolderInfo>> {
        Ok(self.store.permits(key).await?.into_iter().next())
    }

    async fn list(&self, _prefix: &str, _limit: usize) -> Result<Vec<HolderInfo>> {
        // `Semaphore` never lists through the lock policy: its holders are `permits`.
        Err(Error::unsupported(
            "semaphores are inspected one key at a time (Semaphore::holders)",
        ))
    }

    fn wakeups(&self) -> Wakeups {
        self.store.permit_wakeups()
    }
}
