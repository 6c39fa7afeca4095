//! The lease atom: the small atomic operations under both locks and leases, which every
//! store implements ([`LeaseStore`]). A lock is a lease whose holder is a fresh random token
//! per acquisition. Each operation must be atomic on the store and decide expiry on the
//! store's own clock.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::error::Result;
use crate::fence::Fence;
use crate::holder::Holder;
use crate::key::StoreKey;
use crate::signals::ReleaseHub;
use crate::time::Ttl;

/// What [`LeaseStore::claim`] is asked to do: who claims, for how long, and why.
#[derive(Debug, Clone, Copy)]
pub struct LeaseRequest<'a> {
    /// Who claims: a lease's holder name, or a lock's fresh random token.
    pub holder: &'a Holder,
    /// How long the grant lasts without renewal.
    pub ttl: Ttl,
    /// Why it is held, shown by `inspect` and `list`; empty for locks.
    pub reason: &'a str,
}

impl<'a> LeaseRequest<'a> {
    /// A claim with no reason, as locks make.
    pub fn new(holder: &'a Holder, ttl: Ttl) -> Self {
        LeaseRequest {
            holder,
            ttl,
            reason: "",
        }
    }

    /// The same claim, recording `reason`.
    pub fn reason(self, reason: &'a str) -> Self {
        LeaseRequest { reason, ..self }
    }
}

/// The answer of [`LeaseStore::claim`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// The key was free or expired: it now belongs to the holder, with the next fence.
    Granted {
        /// The new grant's fence, larger than every earlier fence of this key.
        fence: Fence,
    },
    /// The holder already held the key: its TTL was extended, the fence is unchanged.
    Extended {
        /// The fence of the grant that was extended.
        fence: Fence,
    },
    /// The store gave the key to this holder while it waited: a release handed the grant
    /// over to the waiter whose turn it was, and the store learned of it without a claim
    /// of its own (the PostgreSQL store, from the release's notification). Only a holder
    /// that is [waiting](ReleaseHub::subscribe_as) for the key is ever answered this.
    HandedOver {
        /// The handed-over grant's fence, larger than every earlier fence of this key.
        fence: Fence,
        /// An instant no later than the store's grant (before the request that queued the
        /// holder was sent): the grant's TTL is measured from it, as a claim's is from the
        /// instant before it was sent.
        since: tokio::time::Instant,
    },
    /// Another holder holds the key.
    Held {
        /// The current holder.
        holder: Holder,
        /// Its remaining time on the store's clock.
        remaining: Duration,
    },
}

/// The answer of every renewal in baton: a lock's or a lease's grant
/// ([`LeaseStore::renew`], [`Leases::renew`](crate::Leases::renew)), a work item's lease
/// ([`Item::extend`](crate::work::Item::extend)), a migration record's lease, an idempotency
/// attempt's lease ([`IdempotencyLog::renew`](crate::idempotency::IdempotencyLog::renew)).
///
/// A store fault is not an answer: it is an error of kind `Unavailable`, after which the
/// grant may or may not still be held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Renewal {
    /// The grant was still held by the caller; its TTL (or lease) now starts again.
    Renewed,
    /// The caller no longer holds the grant (it expired, was released, finalized, or taken
    /// over by someone else). Nothing was changed: a late renewal never revives a grant.
    NotHeld,
}

/// The answer of [`LeaseStore::release`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Release {
    /// The holder held the key and it is now free.
    Removed,
    /// Another holder holds the key now; it was left alone.
    Reclaimed {
        /// The current holder.
        by: Holder,
    },
    /// Nobody holds the key (it expired, or was already released). Nothing was changed.
    NoHolder,
}

/// A live grant, as [`LeaseStore::inspect`] and [`LeaseStore::list`] report it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HolderInfo {
    /// The qualified key.
    pub key: StoreKey,
    /// The current holder.
    pub holder: Holder,
    /// The grant's fence.
    pub fence: Fence,
    /// Remaining time on the store's clock.
    pub remaining: Duration,
    /// The reason given when the grant was claimed (empty for locks).
    pub reason: String,
}

/// How waiters learn that a key may have become free.
#[derive(Debug, Clone)]
pub struct Wakeups {
    /// Release signals this store delivers. A store without push from other processes still
    /// signals releases made through this process.
    pub hub: Arc<ReleaseHub>,
    /// `Some(interval)` when some releases are not pushed (another process on an SQLite file),
    /// so waiters must also re-check at this interval. `None` when every release is pushed.
    pub poll: Option<Duration>,
}

/// The atomic lease operations of one store. Object safe: a `baton::Baton` holds its store
/// as an `Arc<dyn Store>`, whose lease atoms are these.
///
/// # Contract
/// - Every operation is atomic on the store and decides expiry on the store's clock.
/// - `claim` grants when the key is free or expired (next fence), extends when `holder`
///   already holds it (same fence), and otherwise reports the holder and its remaining time.
///   A store that hands released keys to waiting holders answers `HandedOver` to the holder
///   it gave the key to, with an instant no later than that grant.
/// - Fences strictly increase per key across every grant, also after expiry and after the
///   store is restarted or re-opened.
/// - `renew` and `release` compare the holder before changing anything; an expired grant is
///   never renewed.
/// - A release that removed a grant signals [`Wakeups::hub`] for that key.
/// - Store faults are errors of kind `Unavailable`; they never look like contention.
#[async_trait]
pub trait LeaseStore: Send + Sync + fmt::Debug + 'static {
    /// Claims `key` for `request.holder` for `request.ttl`.
    async fn claim(&self, key: &StoreKey, request: LeaseRequest<'_>) -> Result<Claim>;

    /// Extends `holder`'s grant of `key` to `ttl` from now.
    async fn renew(&self, key: &StoreKey, holder: &Holder, ttl: Ttl) -> Result<Renewal>;

    /// Frees `key` if `holder` holds it.
    async fn release(&self, key: &StoreKey, holder: &Holder) -> Result<Release>;

    /// The live grant of `key`, if any.
    async fn inspect(&self, key: &StoreKey) -> Result<Option<HolderInfo>>;

    /// Live grants whose qualified key starts with `prefix`, in key order, at most `limit`.
    async fn list(&self, prefix: &str, limit: usize) -> Result<Vec<HolderInfo>>;

    /// How waiters on this store are woken.
    fn wakeups(&self) -> Wakeups;
}
