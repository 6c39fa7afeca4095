//! Semaphores on etcd: how each [`SemaphoreStore`] atom maps to etcd's primitives. Reader-
//! writer locks are built on these permits and the lock atom by `baton-core`.
//!
//! ## A permit is a slot
//! A semaphore of the qualified key `k` claimed with N permits has N slots, the etcd keys
//! `k\0<slot>` for slot `00000` to N-1 in five fixed-width digits (a NUL byte, which no
//! key may hold, so the permits of `k` are exactly the keys under the prefix `k\0`, and
//! fixed width, so the keys sort by slot). A permit is one slot key, attached to an etcd
//! lease of its own as a lock's grant is, whose value is
//!
//! ```text
//! baton:permit:v1\n<holder>\n<lease seconds>\n<permits>
//! ```
//!
//! where `<permits>` is the N of the claim that was granted it. Its fence is its create
//! revision: every permit of `k` is created after the ones before it, so fences strictly
//! increase across the permits of a key (and across every other change to the cluster).
//!
//! ## Claim: a free slot, and no slot at or beyond N
//! A claim reads the slots under `k\0`. If one holds the holder's own permit, it is
//! extended onto a new lease (same fence), as a lock's re-claim is. If N or more are taken,
//! or any slot at or beyond N is (a permit of a claim with a larger N), the answer is
//! `Held`, with the permit that ends soonest among the oldest [`SOONEST_AMONG`]. Otherwise
//! one transaction creates a free slot below N, picked at random, **only if that slot is
//! still free and every slot from N on is still free** (etcd compares a whole key range),
//! and only if the queue of waiting processes lets this claim's process take it (below).
//! So at most N permits of claims with N are live at once, claims with a smaller N wait
//! until the permits beyond their N end, and concurrent claims conflict only when they pick
//! the same slot; a claim whose transaction failed goes round again with the slots the
//! transaction read, and one still racing when its response timeout has passed answers
//! `Unavailable`.
//!
//! `renew_permit` and `release_permit` find the holder's slot, then renew or release it as a
//! lock's grant is renewed or released.
//!
//! ## Waiting: a queue of processes decides who takes a free permit
//! A process one of whose waiters got `Held` queues once for `k`: an entry
//! `k\u{1}q\0<store id>` on a short lease it keeps alive while it waits
//! ([`watch`](crate::watch) says how: the head watches the permits, every other process
//! only its predecessor, so a release wakes one process). The entries are outside the
//! range `k\0`..`k\u{1}` of the slots (no key holds a control character), so slot reads
//! and the slot compares never see them.
//!
//! The queue is enforced **inside the claim's transaction**, with range compares on the
//! queue's prefix (etcd compares every key of a range; an empty range compares as a key
//! never created, create revision 0):
//! - a process that is queued may create a slot only if its entry is still there at its
//!   place (create revision) and every entry's create revision is at least its own (it is
//!   the **head**); the same transaction deletes its entry, so it leaves the queue as it is
//!   granted, and the process queues again at the end if more of its waiters wait;
//! - a process that is not queued (a newcomer, a `try_acquire`) may create a slot only if
//!   the queue is empty.
//!
//! The claim's first read (one transaction: the slots, the queue's head, this process's
//! entry) tells which rule applies, and a claim that may not take the free permit answers
//! `Held` at once, without a transaction, with the holder `queued:<store id of the head>`
//! and the remaining time of a queue entry's lease ([`QUEUE_LEASE`]): the longest the head
//! keeps a free permit from the others if it stopped without leaving. A waiter's timer
//! looks again then; its predecessor's delete wakes it sooner. A claim that finds no free
//! permit answers `Held` by the permit that ends soonest, as before, queued or not.
//!
//! So processes take permits in the order they queued: a releaser asking again at once, or
//! a newcomer, comes after every process queued before its claim. The cost: free permits
//! are handed out one after another (each head is woken by the grant of the one before), so
//! permits held for less than a handoff (a watch event and about three requests) are seldom
//! held all at once; and a queued process that dies keeps a free permit from everyone for up
//! to its entry's lease. A queue is per key, not per N: a head whose claim has a smaller N
//! than the permits held waits, and the processes behind it wait with it.

use std::time::Duration;

use async_trait::async_trait;
use baton_core::semaphore::PermitInfo;
use baton_core::store::{Claim, HolderInfo, LeaseRequest, Release, Renewal, Wakeups};
use baton_core::{Holder, Result, SemaphoreStore, StoreKey, Ttl};
use etcd_client::{
    Compare, CompareOp, GetOptions, KeyValue, PutOptions, SortOrder, SortTarget, Txn, TxnOp,
    TxnOpResponse, TxnResponse,
};
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::EtcdStore;
use crate::grants::{
    EXPIRING, Layout, Stored, decode, encode, fence, lease_seconds, remaining_time,
};
use crate::watch::{QUEUE_LEASE, Range, permit_queue_end, permit_queue_prefix};

/// How many of the oldest permits a contended claim asks the remaining time of, to report
/// the one that ends soonest (one request each, made at once).
pub const SOONEST_AMONG: usize = 16;

/// The end of the range of `key`'s permits: `key` and the byte after NUL.
fn prefix_end(key: &StoreKey) -> String {
    format!("{}\u{1}", key.as_str())
}

/// The prefix of the permits of `key`: `key` and a NUL byte.
pub(crate) fn prefix(key: &StoreKey) -> String {
    format!("{}\u{0}", key.as_str())
}

/// The etcd key of slot `slot` of `key`.
fn slot_key(key: &StoreKey, slot: u32) -> String {
    format!("{}{slot:05}", prefix(key))
}

/// The slot a permit's etcd key names, if it is one.
fn slot_of(kv: &KeyValue) -> Option<u32> {
    let key = kv.key_str().ok()?;
    let (_, slot) = key.split_once('\u{0}')?;
    if slot.len() != 5 {
        return None;
    }
    slot.parse().ok()
}

/// A free slot below `permits`, none of `taken`, from a random place on; `None` when every
/// one is taken.
fn free_slot(taken: &[u32], permits: u32) -> Option<u32> {
    let start = rand::random_range(0..permits);
    (0..permits)
        .map(|i| (start + i) % permits)
        .find(|slot| !taken.contains(slot))
}

/// Whether a claim with `permits` (its N) finds a free slot among `kvs` (the keys under a
/// semaphore's prefix): fewer than N slots below N taken, and none from N on.
pub(crate) fn has_free_slot(kvs: &[KeyValue], permits: u32) -> bool {
    let taken: Vec<u32> = kvs.iter().filter_map(slot_of).collect();
    taken.iter().all(|&t| t < permits) && free_slot(&taken, permits).is_some()
}

/// What a claim reads in one request: the permits of a key (oldest first), the head of its
/// queue of processes, and this process's entry in it, at one revision.
struct View {
    permits: Vec<KeyValue>,
    head: Option<KeyValue>,
    mine: Option<KeyValue>,
    revision: i64,
}

impl View {
    /// The reads of a [`View`] of `key`, with `entry` this process's queue entry.
    fn reads(key: &StoreKey, entry: &str) -> [TxnOp; 3] {
        let keys = || GetOptions::new().with_keys_only();
        [
            TxnOp::get(
                prefix(key),
                Some(
                    GetOptions::new()
                        .with_prefix()
                        .with_sort(SortTarget::Create, SortOrder::Ascend),
                ),
            ),
            TxnOp::get(
                permit_queue_prefix(key),
                Some(
                    keys()
                        .with_prefix()
                        .with_sort(SortTarget::Create, SortOrder::Ascend)
                        .with_limit(1),
                ),
            ),
            TxnOp::get(entry, Some(keys())),
        ]
    }

    /// The view a transaction's answer holds (the reads of [`View::reads`], in order).
    fn of(answer: TxnResponse) -> View {
        let revision = answer.header().map_or(0, |h| h.revision());
        let mut gets = answer.op_responses().into_iter().filter_map(|r| match r {
            TxnOpResponse::Get(mut get) => Some(get.take_kvs()),
            _ => None,
        });
        let permits = gets.next().unwrap_or_default();
        let head = gets.next().and_then(|kvs| kvs.into_iter().next());
        let mine = gets.next().and_then(|kvs| kvs.into_iter().next());
        View {
            permits,
            head,
            mine,
            revision,
        }
    }

    /// This process's place in the queue (its entry's create revision), if it is queued.
    fn place(&self) -> Option<i64> {
        self.mine.as_ref().map(KeyValue::create_revision)
    }

    /// Whether this process may take a free permit: nobody is queued, or it is the head.
    fn my_turn(&self) -> bool {
        match (&self.head, self.place()) {
            (None, _) => true,
            (Some(head), Some(place)) => head.create_revision() == place,
            (Some(_), None) => false,
        }
    }
}

/// The compares by which the queue of `key` decides, inside a claim's transaction, that this
/// process (queue entry `entry`, at `place` if it is queued) may take a free permit: its
/// entry is still there and none is older (it is the head), or, not queued, nobody is.
fn queue_rule(key: &StoreKey, entry: &str, place: Option<i64>) -> Vec<Compare> {
    let (queue, end) = (permit_queue_prefix(key), permit_queue_end(key));
    match place {
        Some(place) => vec![
            Compare::create_revision(entry, CompareOp::Equal, place),
            // Every entry of the range is compared.
            Compare::create_revision(queue, CompareOp::Greater, place - 1).with_range(end),
        ],
        // An empty range compares as a key never created.
        None => vec![Compare::create_revision(queue, CompareOp::Equal, 0).with_range(end)],
    }
}

/// `Held` by the queue of `key` whose head is `head` (an entry, keys only): a permit is free
/// but processes queued before this one take it first. The holder is `queued:<store id>`
/// (the head's); the remaining time is a queue entry's lease, the longest the head keeps a
/// free permit from the others if it stopped without leaving, so a waiter's timer looks
/// again then (its predecessor's delete wakes it sooner).
fn held_by_queue(key: &StoreKey, head: Option<&KeyValue>) -> Claim {
    let queue = permit_queue_prefix(key);
    let id = head
        .and_then(|kv| kv.key_str().ok())
        .and_then(|k| k.strip_prefix(queue.as_str()))
        .unwrap_or_default();
    let holder = Holder::new(format!("queued:{id}"))
        .or_else(|_| Holder::new("queued"))
        .expect("a valid holder");
    Claim::Held {
        holder,
        remaining: Duration::from_secs(QUEUE_LEASE.unsigned_abs()),
    }
}

/// The permits among `kvs` (slot keys), oldest first; values baton did not write are left
/// out.
fn oldest_first(kvs: Vec<KeyValue>) -> Vec<(KeyValue, Stored)> {
    let mut permits: Vec<(KeyValue, Stored)> = kvs
        .into_iter()
        .filter_map(|kv| {
            slot_of(&kv)?;
            let stored = decode(&kv).filter(|s| s.layout == Layout::Permit)?;
            Some((kv, stored))
        })
        .collect();
    permits.sort_by_key(|(_, stored)| stored.fence);
    permits
}

impl EtcdStore {
    /// The key-values under `key`'s permit prefix.
    async fn read_permits(&self, key: &StoreKey, what: &str) -> Result<Vec<KeyValue>> {
        let options = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Ascend);
        let mut answer = self.get(what, &prefix(key), Some(options)).await?;
        Ok(answer.take_kvs())
    }

    /// The etcd key of the slot that holds `holder`'s permit of `key`, if any.
    async fn slot_of_holder(
        &self,
        key: &StoreKey,
        holder: &Holder,
        what: &str,
    ) -> Result<Option<StoreKey>> {
        let kvs = self.read_permits(key, what).await?;
        Ok(oldest_first(kvs)
            .into_iter()
            .find(|(_, stored)| stored.holder == *holder)
            .and_then(|(kv, _)| Some(StoreKey::from_stored(kv.key_str().ok()?.to_owned()))))
    }

    /// The remaining time of each of `leases`, asked at once; -1 for a lease that is gone.
    async fn remaining_of(&self, leases: &[i64]) -> Result<Vec<(i64, i64)>> {
        let within = self.options.get_response_timeout();
        let mut asked = JoinSet::new();
        for (index, &lease) in leases.iter().enumerate() {
            let mut client = self.client.lease_client();
            asked.spawn(async move {
                let answer = tokio::time::timeout(within, client.time_to_live(lease, None)).await;
                (index, answer)
            });
        }
        let mut remaining = vec![(0, -1); leases.len()];
        while let Some(done) = asked.join_next().await {
            let (index, answer) = done.map_err(|e| {
                baton_core::Error::internal(format!("asking a lease's time-to-live: {e}"))
            })?;
            let answer = match answer {
                Ok(Ok(answer)) => answer,
                Ok(Err(e)) => {
                    return Err(self.failed("lease time-to-live", crate::requests::Fault::Etcd(e)));
                }
                Err(_) => {
                    return Err(self.failed(
                        "lease time-to-live",
                        crate::requests::Fault::TimedOut(within),
                    ));
                }
            };
            remaining[index] = (leases[index], answer.ttl());
        }
        Ok(remaining)
    }

    /// `Held` by the permit that ends soonest among the oldest [`SOONEST_AMONG`] of `held`.
    async fn held_by_soonest(&self, held: &[(KeyValue, Stored)]) -> Result<Claim> {
        let considered = &held[..held.len().min(SOONEST_AMONG)];
        let leases: Vec<i64> = considered.iter().map(|(_, s)| s.lease).collect();
        let remaining = self.remaining_of(&leases).await?;
        let (index, seconds) = remaining
            .iter()
            .enumerate()
            .map(|(index, &(_, seconds))| (index, seconds))
            .min_by_key(|&(_, seconds)| seconds)
            .unwrap_or((0, -1));
        Ok(Claim::Held {
            holder: considered[index].1.holder.clone(),
            remaining: remaining_time(seconds).unwrap_or(EXPIRING),
        })
    }

    /// The live permits among `kvs` as `key`'s holders, oldest first, each with its N.
    async fn live_permits(&self, key: &StoreKey, kvs: Vec<KeyValue>) -> Result<Vec<PermitInfo>> {
        let permits = oldest_first(kvs);
        let leases: Vec<i64> = permits.iter().map(|(_, s)| s.lease).collect();
        let remaining = self.remaining_of(&leases).await?;
        Ok(permits
            .into_iter()
            .zip(remaining)
            .filter_map(|((_, stored), (_, seconds))| {
                Some(PermitInfo {
                    permits: stored.tail.parse().ok(),
                    grant: HolderInfo {
                        key: key.clone(),
                        holder: stored.holder,
                        fence: fence(stored.fence),
                        remaining: remaining_time(seconds)?,
                        reason: String::new(),
                    },
                })
            })
            .collect())
    }
}

#[async_trait]
impl SemaphoreStore for EtcdStore {
    async fn claim_permit(
        &self,
        key: &StoreKey,
        request: LeaseRequest<'_>,
        permits: u32,
    ) -> Result<Claim> {
        let seconds = lease_seconds(request.ttl);
        let value = encode(
            Layout::Permit,
            request.holder,
            seconds,
            &permits.to_string(),
        );
        let entry = self.watches.permit_entry(key);
        let read = || Txn::new().and_then(View::reads(key, &entry));
        // The lease and the first read at once: one round trip less before the claim.
        let (lease, first) = tokio::join!(
            self.grant_lease(seconds),
            self.txn("claim permit (read)", read())
        );
        let lease = lease?;
        let started = Instant::now();
        let timeout = self.options.get_response_timeout();
        let racing = || {
            baton_core::Error::unavailable(format!(
                "{}: claim of a permit of {key} failed: other claims changed its permits throughout {}",
                self.cluster(),
                baton_core::time::format_duration(timeout)
            ))
        };
        let outcome = async {
            let mut view = View::of(first?);
            loop {
                let held = oldest_first(std::mem::take(&mut view.permits));
                let taken: Vec<u32> = held.iter().filter_map(|(kv, _)| slot_of(kv)).collect();
                if let Some((kv, mine)) = held.iter().find(|(_, s)| s.holder == *request.holder) {
                    // Ours already: onto the new lease, same fence.
                    let own = StoreKey::from_stored(kv.key_str().unwrap_or_default().to_owned());
                    if self
                        .move_to_lease(&own, mine.lease, lease, value.clone())
                        .await?
                    {
                        return Ok(Claim::Extended {
                            fence: fence(mine.fence),
                        });
                    }
                    // It changed under the extension: read again.
                    view = View::of(self.txn("claim permit (read)", read()).await?);
                } else if let Some(slot) =
                    free_slot(&taken, permits).filter(|_| taken.iter().all(|&t| t < permits))
                {
                    if !view.my_turn() {
                        // A free permit, but processes queued before this one: theirs.
                        self.watches.ensure_range(
                            key,
                            Range::Permits { permits },
                            view.revision + 1,
                        );
                        return Ok(held_by_queue(key, view.head.as_ref()));
                    }
                    let place = view.place();
                    let mut grant = vec![TxnOp::put(
                        slot_key(key, slot),
                        value.clone(),
                        Some(PutOptions::new().with_lease(lease)),
                    )];
                    if place.is_some() {
                        // Granted, the process leaves the queue in the same step.
                        grant.push(TxnOp::delete(entry.as_str(), None));
                    }
                    let txn = Txn::new()
                        .when(
                            [
                                Compare::create_revision(slot_key(key, slot), CompareOp::Equal, 0),
                                Compare::create_revision(
                                    slot_key(key, permits),
                                    CompareOp::Equal,
                                    0,
                                )
                                .with_range(prefix_end(key)),
                            ]
                            .into_iter()
                            .chain(queue_rule(key, &entry, place))
                            .collect::<Vec<_>>(),
                        )
                        .and_then(grant)
                        .or_else(View::reads(key, &entry));
                    let answer = self.txn("claim permit (txn)", txn).await?;
                    if answer.succeeded() {
                        let at = answer.header().map_or(0, |h| h.revision());
                        if place.is_some() {
                            // Queue again at the end if more of this process's waiters wait.
                            self.watches.granted(key);
                        }
                        return Ok(Claim::Granted { fence: fence(at) });
                    }
                    // Taken, or the queue changed, since the read: the transaction read
                    // both again.
                    view = View::of(answer);
                } else {
                    // This process queues (if a waiter of it waits), and its waiters wake
                    // when its turn may have come.
                    self.watches
                        .ensure_range(key, Range::Permits { permits }, view.revision + 1);
                    return self.held_by_soonest(&held).await;
                }
                if started.elapsed() >= timeout {
                    return Err(racing());
                }
            }
        }
        .await;
        if !matches!(outcome, Ok(Claim::Granted { .. } | Claim::Extended { .. })) {
            self.revoke_in_background(lease);
        }
        outcome
    }

    async fn renew_permit(&self, key: &StoreKey, holder: &Holder, ttl: Ttl) -> Result<Renewal> {
        match self
            .slot_of_holder(key, holder, "renew permit (read)")
            .await?
        {
            Some(slot) => self.renew_key(&slot, Layout::Permit, holder, ttl).await,
            None => Ok(Renewal::NotHeld),
        }
    }

    async fn release_permit(&self, key: &StoreKey, holder: &Holder) -> Result<Release> {
        match self
            .slot_of_holder(key, holder, "release permit (read)")
            .await?
        {
            Some(slot) => self.release_key(&slot, Layout::Permit, holder, key).await,
            None => Ok(Release::NoHolder),
        }
    }

    async fn permits(&self, key: &StoreKey) -> Result<Vec<HolderInfo>> {
        let kvs = self.read_permits(key, "permits").await?;
        Ok(self
            .live_permits(key, kvs)
            .await?
            .into_iter()
            .map(|p| p.grant)
            .collect())
    }

    async fn list_permits(&self, prefix: &str, limit: usize) -> Result<Vec<PermitInfo>> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let options = if prefix.is_empty() {
            GetOptions::new().with_all_keys()
        } else {
            GetOptions::new().with_prefix()
        };
        let answer = self.get("list permits", prefix, Some(options)).await?;
        // By key (the etcd keys sort by the semaphore's key first: NUL sorts before any
        // character a key may hold), then each key's permits by fence.
        let mut groups: Vec<(String, Vec<KeyValue>)> = Vec::new();
        for kv in answer.kvs() {
            let Some((key, _holder)) = kv.key_str().ok().and_then(|k| k.split_once('\u{0}')) else {
                continue;
            };
            match groups.last_mut() {
                Some((last, kvs)) if last == key => kvs.push(kv.clone()),
                _ => groups.push((key.to_owned(), vec![kv.clone()])),
            }
        }
        let mut found = Vec::new();
        let mut keys = 0;
        for (key, kvs) in groups {
            if keys == limit {
                break;
            }
            let live = self.live_permits(&StoreKey::from_stored(key), kvs).await?;
            if !live.is_empty() {
                keys += 1;
                found.extend(live);
            }
        }
        Ok(found)
    }

    fn permit_wakeups(&self) -> Wakeups {
        Wakeups {
            hub: self.hub.clone(),
            poll: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_of_a_key_sort_by_number_under_its_nul_prefix() {
        let key = StoreKey::from_stored("ns:semaphore:a".to_owned());
        assert_eq!(prefix(&key), "ns:semaphore:a\u{0}");
        assert_eq!(slot_key(&key, 7), "ns:semaphore:a\u{0}00007");
        assert!(slot_key(&key, 9) < slot_key(&key, 10));
        assert!(slot_key(&key, 9_999) < prefix_end(&key));
        // The slots of `a` are not under the prefix of `ab`, nor theirs under it.
        let other = StoreKey::from_stored("ns:semaphore:ab".to_owned());
        assert!(!slot_key(&other, 0).starts_with(&prefix(&key)));
        assert!(slot_key(&other, 0).as_str() > prefix_end(&key).as_str());
    }

    #[test]
    fn a_free_slot_is_below_n_and_not_taken() {
        for _ in 0..100 {
            let slot = free_slot(&[0, 2], 4).unwrap();
            assert!(slot == 1 || slot == 3, "{slot}");
        }
        assert_eq!(free_slot(&[0, 1, 2], 3), None);
        assert_eq!(free_slot(&[], 1), Some(0));
    }
}
