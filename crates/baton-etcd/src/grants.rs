//! Locks and leases on etcd: how each [`LeaseStore`] atom maps to etcd's primitives.
//!
//! ## A grant
//! A grant of the qualified key `k` is the etcd key `k` (the same bytes), attached to an
//! etcd lease of its own whose TTL is the grant's TTL rounded up to whole seconds. Its value
//! is
//!
//! ```text
//! baton:v1\n<holder>\n<lease seconds>\n<reason>
//! ```
//!
//! (a holder holds no control characters, so the first three newlines split it; the reason
//! may hold anything; the lease's seconds tell a renewal whether a longer TTL needs a new
//! lease, without asking the cluster). The cluster's leader expires the lease on its own clock and deletes
//! the key with it: no client clock decides expiry.
//!
//! ## The fence is the grant's create revision
//! Every change to etcd's keyspace gets the next revision of the whole cluster, and a key
//! created again after a delete gets a new, larger create revision. So the create revision
//! of the key that holds a grant is larger than that of every earlier grant of the key (and
//! of every other key's earlier grants): fences strictly increase across grants, expiry,
//! member failures and restarts, with no counter of baton's own to lose. Extending a grant
//! (a re-claim by the same holder, a renewal onto a longer lease) re-puts the key, which
//! keeps its create revision, so the fence stays the same. The one way back is a cluster
//! rebuilt from nothing (a new data directory on every member): revisions start again at 1.
//!
//! ## The atoms
//! - `claim`: a lease is granted for the TTL, then one transaction: if the key's create
//!   revision is 0 (absent), put it with that lease — granted, and the transaction's
//!   revision is the fence; else read it. A key that names this holder is extended: re-put
//!   with the new lease (and reason) if it still has the lease it was read with, and the old
//!   lease revoked. A key that names another holder is `Held`, with its lease's remaining
//!   TTL as the cluster reports it; the unused lease is revoked in the background.
//! - `renew`: read the key; if it names the holder, one keep-alive exchange on its lease
//!   (the lease's TTL starts again), on a stream kept for the grant (see `keepers.rs`).
//!   Once the store has renewed a grant, a renewal sends the keep-alive and the read at once
//!   (one round trip), and is `Renewed` when the read finds the key still on that lease and
//!   the keep-alive finds the lease alive. A renewal to another TTL than the lease's moves the
//!   grant onto a new lease, as an extending claim does. A lease the cluster no longer knows
//!   is `NotHeld`: a late renewal never revives a grant.
//! - `release`: read the key; if it names the holder, a transaction deletes it only if it
//!   is still attached to the lease it was read with, then the lease is revoked.
//! - `inspect` and `list`: reads, with each lease's remaining TTL.
//!
//! Store faults (no member answering, no leader, a timeout) are errors of kind
//! `Unavailable`, never contention.

use std::time::Duration;

use async_trait::async_trait;
use baton_core::store::{Claim, HolderInfo, LeaseRequest, LeaseStore, Release, Renewal, Wakeups};
use baton_core::{Fence, Holder, Result, StoreKey, Ttl};
use etcd_client::{
    Compare, CompareOp, GetOptions, KeyValue, PutOptions, Txn, TxnOp, TxnOpResponse,
};

use crate::EtcdStore;
use crate::error;

/// What a key holds: a lock's or lease's grant, or a semaphore's permit. The first line of
/// the value names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Layout {
    /// `baton:v1\n<holder>\n<lease seconds>\n<reason>`.
    Grant,
    /// `baton:permit:v1\n<holder>\n<lease seconds>\n<permits>`: the N of the claim.
    Permit,
}

impl Layout {
    fn tag(self) -> &'static str {
        match self {
            Layout::Grant => "baton:v1",
            Layout::Permit => "baton:permit:v1",
        }
    }

    fn what(self) -> &'static str {
        match self {
            Layout::Grant => "grant",
            Layout::Permit => "permit",
        }
    }
}

/// What `Held` reports for a lease the cluster has expired but not yet revoked (its leader
/// sweeps expired leases periodically): a short while, after which waiters look again (the
/// key's delete wakes them sooner through its watch).
pub(crate) const EXPIRING: Duration = Duration::from_millis(100);

/// How often an atom re-reads a key that changed between its read and its transaction
/// before it answers `Unavailable`.
pub(crate) const RACE_ATTEMPTS: usize = 8;

/// The whole seconds of an etcd lease for `ttl`: rounded up, at least 1.
pub fn lease_seconds(ttl: Ttl) -> i64 {
    let ttl = ttl.get();
    let seconds = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
    i64::try_from(seconds.max(1)).unwrap_or(i64::MAX)
}

/// The value of `layout` for `holder` on a lease of `seconds`, with `tail` (the reason, or
/// the permits).
pub(crate) fn encode(layout: Layout, holder: &Holder, seconds: i64, tail: &str) -> String {
    format!("{}\n{}\n{seconds}\n{tail}", layout.tag(), holder.as_str())
}

/// A grant or permit as read from the cluster.
pub(crate) struct Stored {
    pub(crate) layout: Layout,
    pub(crate) holder: Holder,
    /// A grant's reason, a permit's N.
    pub(crate) tail: String,
    /// The lease's TTL when it was granted, in seconds.
    pub(crate) seconds: i64,
    pub(crate) fence: i64,
    pub(crate) lease: i64,
}

/// The grant or permit a key-value holds, or `None` for a value baton did not write.
pub(crate) fn decode(kv: &KeyValue) -> Option<Stored> {
    let value = std::str::from_utf8(kv.value()).ok()?;
    let mut parts = value.splitn(4, '\n');
    let layout = match parts.next()? {
        tag if tag == Layout::Grant.tag() => Layout::Grant,
        tag if tag == Layout::Permit.tag() => Layout::Permit,
        _ => return None,
    };
    let holder = Holder::new(parts.next()?).ok()?;
    let seconds = parts.next()?.parse().ok()?;
    let tail = parts.next()?.to_owned();
    Some(Stored {
        layout,
        holder,
        tail,
        seconds,
        fence: kv.create_revision(),
        lease: kv.lease(),
    })
}

/// The remaining time of a lease whose time-to-live the cluster reports as `seconds`
/// (whole seconds, rounded down; -1 for a lease it no longer knows): `None` for a lease that
/// is gone, at least [`EXPIRING`] for one that is still there.
pub(crate) fn remaining_time(seconds: i64) -> Option<Duration> {
    let seconds = u64::try_from(seconds).ok()?;
    Some(Duration::from_secs(seconds).max(EXPIRING))
}

pub(crate) fn fence(revision: i64) -> Fence {
    Fence::new(u64::try_from(revision).unwrap_or(0))
}

impl EtcdStore {
    /// The key's current value, if any.
    pub(crate) async fn read(&self, key: &StoreKey, what: &str) -> Result<Option<KeyValue>> {
        let mut answer = self.get(what, key.as_str(), None).await?;
        Ok(answer.take_kvs().into_iter().next())
    }

    /// What `kv` holds as `layout`, or an `Internal` error naming a value baton did not
    /// write there.
    pub(crate) fn stored(
        &self,
        key: &StoreKey,
        kv: &KeyValue,
        layout: Layout,
        what: &str,
    ) -> Result<Stored> {
        decode(kv)
            .filter(|stored| stored.layout == layout)
            .ok_or_else(|| {
                error::unexpected(
                    what,
                    self.cluster(),
                    format_args!(
                        "the key {key} holds a value that is not a baton {}",
                        layout.what()
                    ),
                )
            })
    }

    /// `(remaining, granted)` seconds of `lease`; remaining is -1 for a lease the cluster
    /// no longer knows.
    pub(crate) async fn lease_ttl(&self, lease: i64) -> Result<(i64, i64)> {
        let answer = self.lease_time_to_live(lease).await?;
        Ok((answer.ttl(), answer.granted_ttl()))
    }

    /// Re-puts `key` with `value` on `new_lease` if it is still attached to `old_lease`,
    /// keeping its create revision (the fence); revokes `old_lease` when it moved. Whether
    /// it moved.
    pub(crate) async fn move_to_lease(
        &self,
        key: &StoreKey,
        old_lease: i64,
        new_lease: i64,
        value: String,
    ) -> Result<bool> {
        let txn = Txn::new()
            .when([Compare::lease(key.as_str(), CompareOp::Equal, old_lease)])
            .and_then([TxnOp::put(
                key.as_str(),
                value,
                Some(PutOptions::new().with_lease(new_lease)),
            )]);
        let answer = self.txn("extend (txn)", txn).await?;
        if answer.succeeded() {
            self.revoke_in_background(old_lease);
        }
        Ok(answer.succeeded())
    }

    /// What `Held` reports as the holder's remaining time.
    async fn remaining(&self, lease: i64) -> Result<Duration> {
        let (remaining, _) = self.lease_ttl(lease).await?;
        Ok(remaining_time(remaining).unwrap_or(EXPIRING))
    }
}

#[async_trait]
impl LeaseStore for EtcdStore {
    async fn claim(&self, key: &StoreKey, request: LeaseRequest<'_>) -> Result<Claim> {
        let seconds = lease_seconds(request.ttl);
        let value = encode(Layout::Grant, request.holder, seconds, request.reason);
        let lease = self.grant_lease(seconds).await?;
        for _ in 0..RACE_ATTEMPTS {
            let txn = Txn::new()
                .when([Compare::create_revision(key.as_str(), CompareOp::Equal, 0)])
                .and_then([TxnOp::put(
                    key.as_str(),
                    value.clone(),
                    Some(PutOptions::new().with_lease(lease)),
                )])
                .or_else([TxnOp::get(key.as_str(), None)]);
            let answer = match self.txn("claim (txn)", txn).await {
                Ok(answer) => answer,
                Err(e) => {
                    self.revoke_in_background(lease);
                    return Err(e);
                }
            };
            if answer.succeeded() {
                let revision = answer.header().map_or(0, |h| h.revision());
                // This process leaves the key's queue of waiting processes, if it was in it.
                self.watches.granted(key);
                return Ok(Claim::Granted {
                    fence: fence(revision),
                });
            }
            let current = answer.op_responses().into_iter().find_map(|r| match r {
                TxnOpResponse::Get(mut get) => get.take_kvs().into_iter().next(),
                _ => None,
            });
            // Deleted between the compare and the read: cannot happen in one transaction,
            // but an empty answer is treated as a race and tried again.
            let Some(current) = current else { continue };
            let stored = match self.stored(key, &current, Layout::Grant, "claim") {
                Ok(stored) => stored,
                Err(e) => {
                    self.revoke_in_background(lease);
                    return Err(e);
                }
            };
            if stored.holder != *request.holder {
                self.revoke_in_background(lease);
                let remaining = self.remaining(stored.lease).await?;
                // This process queues for the key, and its waiters wake when its turn may
                // have come (the key's delete, once it is the head of the queue).
                let revision = answer.header().map_or(0, |h| h.revision());
                self.watches.ensure(key, revision + 1);
                return Ok(Claim::Held {
                    holder: stored.holder,
                    remaining,
                });
            }
            // Ours already: move the grant onto the new lease (the TTL starts again, the
            // reason is the new one), keeping its create revision.
            match self
                .move_to_lease(key, stored.lease, lease, value.clone())
                .await
            {
                Ok(true) => {
                    return Ok(Claim::Extended {
                        fence: fence(stored.fence),
                    });
                }
                Ok(false) => continue,
                Err(e) => {
                    self.revoke_in_background(lease);
                    return Err(e);
                }
            }
        }
        self.revoke_in_background(lease);
        Err(baton_core::Error::unavailable(format!(
            "{}: claim of {key} failed: the key changed under {RACE_ATTEMPTS} attempts in a row",
            self.cluster()
        )))
    }

    async fn renew(&self, key: &StoreKey, holder: &Holder, ttl: Ttl) -> Result<Renewal> {
        self.renew_key(key, Layout::Grant, holder, ttl).await
    }

    async fn release(&self, key: &StoreKey, holder: &Holder) -> Result<Release> {
        self.release_key(key, Layout::Grant, holder, key).await
    }

    async fn inspect(&self, key: &StoreKey) -> Result<Option<HolderInfo>> {
        let Some(kv) = self.read(key, "inspect").await? else {
            return Ok(None);
        };
        let stored = self.stored(key, &kv, Layout::Grant, "inspect")?;
        self.info(key.clone(), stored).await
    }

    async fn list(&self, prefix: &str, limit: usize) -> Result<Vec<HolderInfo>> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let options = GetOptions::new().with_limit(i64::try_from(limit).unwrap_or(i64::MAX));
        let options = if prefix.is_empty() {
            options.with_all_keys()
        } else {
            options.with_prefix()
        };
        let mut answer = self.get("list", prefix, Some(options)).await?;
        let mut found = Vec::new();
        for kv in answer.take_kvs() {
            // Keys baton did not write are not grants.
            let (Ok(key), Some(stored)) = (
                kv.key_str(),
                decode(&kv).filter(|s| s.layout == Layout::Grant),
            ) else {
                continue;
            };
            let key = StoreKey::from_stored(key.to_owned());
            if let Some(info) = self.info(key, stored).await? {
                found.push(info);
            }
        }
        Ok(found)
    }

    fn wakeups(&self) -> Wakeups {
        Wakeups {
            hub: self.hub.clone(),
            poll: None,
        }
    }
}

impl EtcdStore {
    /// Renews `holder`'s grant or permit at `key` (see the module docs).
    pub(crate) async fn renew_key(
        &self,
        key: &StoreKey,
        layout: Layout,
        holder: &Holder,
        ttl: Ttl,
    ) -> Result<Renewal> {
        let seconds = lease_seconds(ttl);
        let mut read = None;
        if let Some(lease) = self.keepers.known_lease(key.as_str(), holder, seconds) {
            // Renewed by this store before: the keep-alive on the grant's stream and the read
            // that confirms the key is still that grant, at once.
            let (kv, kept) = tokio::join!(
                self.read(key, "renew (read)"),
                self.keep_alive(key.as_str(), holder, lease, seconds)
            );
            let kv = kv?;
            let stored = match &kv {
                Some(kv) => Some(self.stored(key, kv, layout, "renew")?),
                None => None,
            };
            match stored {
                Some(stored) if stored.holder == *holder && stored.lease == lease => {
                    return if kept? {
                        Ok(Renewal::Renewed)
                    } else {
                        Ok(Renewal::NotHeld)
                    };
                }
                Some(stored) if stored.holder == *holder => read = Some(stored),
                _ => {
                    self.keepers.forget(key.as_str());
                    return Ok(Renewal::NotHeld);
                }
            }
        }
        let stored = match read {
            Some(stored) => stored,
            None => {
                let Some(kv) = self.read(key, "renew (read)").await? else {
                    self.keepers.forget(key.as_str());
                    return Ok(Renewal::NotHeld);
                };
                self.stored(key, &kv, layout, "renew")?
            }
        };
        if stored.holder != *holder {
            self.keepers.forget(key.as_str());
            return Ok(Renewal::NotHeld);
        }
        if seconds != stored.seconds {
            // Another TTL than the lease's (`keep_for`): move the grant onto a lease of the
            // new TTL, keeping its fence.
            let longer = self.grant_lease(seconds).await?;
            let value = encode(layout, holder, seconds, &stored.tail);
            if !self.move_to_lease(key, stored.lease, longer, value).await? {
                self.revoke_in_background(longer);
                return Ok(Renewal::NotHeld);
            }
            return Ok(Renewal::Renewed);
        }
        // The key was on this lease when it was read, and the keep-alive finds the lease
        // alive later: the key can only have left it since by a delete, which the next
        // renewal's read sees, as it would see a delete made just after this renewal.
        Ok(
            if self
                .keep_alive(key.as_str(), holder, stored.lease, seconds)
                .await?
            {
                Renewal::Renewed
            } else {
                Renewal::NotHeld
            },
        )
    }

    /// Releases `holder`'s grant or permit at `key`, signalling waiters for `waited`.
    pub(crate) async fn release_key(
        &self,
        key: &StoreKey,
        layout: Layout,
        holder: &Holder,
        waited: &StoreKey,
    ) -> Result<Release> {
        for _ in 0..RACE_ATTEMPTS {
            let Some(kv) = self.read(key, "release (read)").await? else {
                self.keepers.forget(key.as_str());
                return Ok(Release::NoHolder);
            };
            let stored = self.stored(key, &kv, layout, "release")?;
            if stored.holder != *holder {
                self.keepers.forget(key.as_str());
                return Ok(Release::Reclaimed { by: stored.holder });
            }
            let txn = Txn::new()
                .when([Compare::lease(key.as_str(), CompareOp::Equal, stored.lease)])
                .and_then([TxnOp::delete(key.as_str(), None)]);
            let answer = self.txn("release (txn)", txn).await?;
            if answer.succeeded() {
                self.keepers.forget(key.as_str());
                self.hub.notify(waited);
                // The key is gone; the lease has nothing else attached. Its TTL removes it
                // if the revoke fails.
                let _ = self.revoke(stored.lease).await;
                return Ok(Release::Removed);
            }
        }
        Err(baton_core::Error::unavailable(format!(
            "{}: release of {key} failed: the key changed under {RACE_ATTEMPTS} attempts in a row",
            self.cluster()
        )))
    }

    /// The live grant `stored` of `key`, with its lease's remaining time; `None` when the
    /// cluster has expired the lease.
    async fn info(&self, key: StoreKey, stored: Stored) -> Result<Option<HolderInfo>> {
        let (remaining, _) = self.lease_ttl(stored.lease).await?;
        let Some(remaining) = remaining_time(remaining) else {
            return Ok(None);
        };
        Ok(Some(HolderInfo {
            key,
            holder: stored.holder,
            fence: fence(stored.fence),
            remaining,
            reason: stored.tail,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ttl(ms: u64) -> Ttl {
        Ttl::new(Duration::from_millis(ms)).unwrap()
    }

    #[test]
    fn leases_are_whole_seconds_rounded_up() {
        assert_eq!(lease_seconds(ttl(10)), 1);
        assert_eq!(lease_seconds(ttl(1000)), 1);
        assert_eq!(lease_seconds(ttl(1001)), 2);
        assert_eq!(lease_seconds(ttl(30_000)), 30);
    }

    #[test]
    fn remaining_time_is_whole_seconds_with_a_floor() {
        assert_eq!(remaining_time(-1), None);
        assert_eq!(remaining_time(0), Some(EXPIRING));
        assert_eq!(remaining_time(7), Some(Duration::from_secs(7)));
    }

    #[test]
    fn values_say_the_holder_the_lease_seconds_and_the_reason() {
        let holder = Holder::new("instance-1").unwrap();
        let value = encode(Layout::Grant, &holder, 3, "rewind\nwith a newline");
        assert_eq!(value, "baton:v1\ninstance-1\n3\nrewind\nwith a newline");
    }
}
