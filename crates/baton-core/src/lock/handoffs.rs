//! Hand-overs, the store-independent half: which holders a store queued for a key, and the
//! grants a release handed to them.
//!
//! Stores that let a release give the key to the waiting holder of another process
//! (PostgreSQL, Redis) keep one [`Handoffs`]. A claim that may queue the store calls
//! [`Handoffs::queueing`] before it is sent and [`Handoffs::granted`] when it granted; the
//! store's push connection calls [`Handoffs::arrived`] when a release handed a grant to
//! one of its holders, and the holder's next claim answers
//! [`Claim::HandedOver`](crate::store::Claim::HandedOver) from [`Handoffs::take`] without a
//! round trip. What the store supplies is the transport: the *address* its push
//! connection has now (an integer that changes whenever the connection does: a LISTEN
//! backend's pid, a pub/sub connection's generation) and how a grant nobody will use is
//! given back (a release as that holder, which hands the key on).
//!
//! ## Behavior
//! - A hand-over is taken only for a holder this store queued under the current address
//!   and that has not been granted the key by a claim since (a late message about a grant
//!   its own claim already took is ignored), so the only holder ever told "handed over" is
//!   one whose grant the store made.
//! - A hand-over to a holder whose wait has ended (it gave up, or its acquire was dropped)
//!   is given back at once; one whose waiter does not take it within
//!   [`HANDOFF_RESERVATION`] is given back then if the waiter is gone.
//! - The grant's TTL runs from the instant before the holder's first queueing claim was
//!   sent, earlier than the release that made it, so `valid_until` never outlasts the
//!   server's expiry.
//! - A new address (the push connection was lost and is back) forgets every holder queued
//!   under the old one: hand-overs addressed to it are never answered here.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;

use super::signals::{HANDOFF_RESERVATION, ReleaseHub};
use crate::fence::Fence;
use crate::holder::Holder;
use crate::key::StoreKey;

/// How long a holder this store queued, whose wait has ended, is remembered while its
/// store's queue entry may still be read by a release in flight.
const FORGET_AFTER: Duration = Duration::from_secs(60);

/// How a store gives back a grant handed to a holder that will never use it: a release
/// as that holder, in the background (it must not block), which hands the key on.
type GiveBack = dyn Fn(&Arc<Handoffs>, StoreKey, Holder) + Send + Sync;

/// The hand-overs of one store: whom it queued, and the grants handed to them.
pub struct Handoffs {
    hub: Arc<ReleaseHub>,
    /// The push connection's address while it is up; 0 otherwise.
    address: AtomicU64,
    state: Mutex<State>,
    give_back: Box<GiveBack>,
}

impl fmt::Debug for Handoffs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Handoffs")
            .field("address", &self.address())
            .finish_non_exhaustive()
    }
}

#[derive(Debug, Default)]
struct State {
    /// The holders this store queued for each key, with the instant before the first claim
    /// that queued each.
    queued: HashMap<StoreKey, Vec<(Holder, Instant)>>,
    /// Grants handed to a waiting holder of this store and not taken yet, one per key.
    handed: HashMap<StoreKey, Handed>,
}

/// A grant a release handed to one of this store's holders.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Handed {
    /// The holder the grant is for.
    pub holder: Holder,
    /// The grant's fence.
    pub fence: Fence,
    /// The instant before the claim that queued the holder was sent.
    pub since: Instant,
}

impl Handoffs {
    /// Hand-overs fed by `hub`'s waiters; `give_back` releases a grant handed to a holder
    /// that stopped waiting (in the background: it is called with the state unlocked, from
    /// the push connection's task or a timer task, and must not block).
    pub fn new(
        hub: Arc<ReleaseHub>,
        give_back: impl Fn(&Arc<Handoffs>, StoreKey, Holder) + Send + Sync + 'static,
    ) -> Self {
        Handoffs {
            hub,
            address: AtomicU64::new(0),
            state: Mutex::new(State::default()),
            give_back: Box::new(give_back),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The address to queue this store under: `Some` while the push connection is up.
    pub fn address(&self) -> Option<u64> {
        Some(self.address.load(Ordering::Acquire)).filter(|a| *a != 0)
    }

    /// The push connection is up at `address` (not 0). Holders queued under an earlier
    /// address will never be answered here: they are forgotten.
    pub fn connected(&self, address: u64) {
        debug_assert_ne!(address, 0, "0 means disconnected");
        let previous = self.address.swap(address, Ordering::AcqRel);
        if previous != address {
            self.state().queued.clear();
        }
    }

    /// The push connection was lost: nothing is queued until it is back.
    pub fn disconnected(&self) {
        self.address.store(0, Ordering::Release);
    }

    /// The grant handed to `holder` for `key`, taken (it is answered once).
    pub fn take(&self, key: &StoreKey, holder: &Holder) -> Option<Handed> {
        let mut state = self.state();
        match state.handed.get(key) {
            Some(handed) if handed.holder == *holder => state.handed.remove(key),
            _ => None,
        }
    }

    /// `holder` is about to claim `key` and be queued if it is held; `sent` is the instant
    /// before the claim is sent. Its first queueing is kept: the hand-over's TTL runs from it.
    pub fn queueing(&self, key: &StoreKey, holder: &Holder, sent: Instant) {
        let mut state = self.state();
        let queued = state.queued.entry(key.clone()).or_default();
        queued.retain(|(queued, at)| {
            queued == holder
                || self.hub.is_waiting(key, queued)
                || sent.saturating_duration_since(*at) < FORGET_AFTER
        });
        if !queued.iter().any(|(queued, _)| queued == holder) {
            queued.push((holder.clone(), sent));
        }
    }

    /// A claim granted or extended `key` to `holder`: it is no longer queued, and a
    /// hand-over of that grant that arrives late (or arrived while the claim was in flight)
    /// is not answered again.
    pub fn granted(&self, key: &StoreKey, holder: &Holder) {
        let mut state = self.state();
        if let Some(queued) = state.queued.get_mut(key) {
            // The claim deleted this store's entry: holders whose wait ended are done with.
            queued.retain(|(queued, _)| queued != holder && self.hub.is_waiting(key, queued));
            if queued.is_empty() {
                state.queued.remove(key);
            }
        }
        if state.handed.get(key).is_some_and(|h| h.holder == *holder) {
            state.handed.remove(key);
        }
    }

    /// A release handed `key` to `holder` with `fence`, in a message to `address`: read by
    /// the push connection's task (or by the release itself, for a holder of the releasing
    /// store). Wakes the holder's waiter, or gives the grant back when its wait has ended.
    /// Must be called within a Tokio runtime.
    pub fn arrived(self: &Arc<Self>, address: u64, key: StoreKey, holder: Holder, fence: Fence) {
        if Some(address) != self.address() {
            // Addressed to an earlier connection of this store, or to another store.
            return;
        }
        let handed = {
            let mut state = self.state();
            let Some(queued) = state.queued.get_mut(&key) else {
                return;
            };
            let Some(at) = queued.iter().position(|(queued, _)| *queued == holder) else {
                // Not queued (any more): the holder's own claim took this grant already.
                return;
            };
            let (_, since) = queued.remove(at);
            if queued.is_empty() {
                state.queued.remove(&key);
            }
            let handed = Handed {
                holder: holder.clone(),
                fence,
                since,
            };
            if !self.hub.is_waiting(&key, &holder) {
                // Its wait ended before its turn came: pass the turn on.
                drop(state);
                (self.give_back)(self, key, holder);
                return;
            }
            state.handed.insert(key.clone(), handed.clone());
            handed
        };
        self.hub.notify(&key);
        let this = Arc::clone(self);
        tokio::spawn(async move { this.watch(key, handed).await });
    }

    /// Gives back a hand-over its waiter does not take, once that waiter's wait has ended.
    async fn watch(self: Arc<Self>, key: StoreKey, handed: Handed) {
        loop {
            tokio::time::sleep(HANDOFF_RESERVATION).await;
            let mut state = self.state();
            match state.handed.get(&key) {
                Some(h) if h.holder == handed.holder && h.fence == handed.fence => {
                    if self.hub.is_waiting(&key, &handed.holder) {
                        continue;
                    }
                    state.handed.remove(&key);
                }
                // Taken, or replaced by a later hand-over.
                _ => return,
            }
            drop(state);
            (self.give_back)(&self, key, handed.holder);
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use super::*;

    fn key() -> StoreKey {
        StoreKey::from_stored("ns:lock:k".to_owned())
    }

    fn handoffs(given_back: &Arc<AtomicUsize>) -> (Arc<ReleaseHub>, Arc<Handoffs>) {
        let hub = Arc::new(ReleaseHub::new());
        let count = Arc::clone(given_back);
        let handoffs = Arc::new(Handoffs::new(Arc::clone(&hub), move |_, _, _| {
            count.fetch_add(1, Ordering::SeqCst);
        }));
        (hub, handoffs)
    }

    #[tokio::test(start_paused = true)]
    async fn a_hand_over_reaches_only_the_waiting_holder_it_was_queued_for() {
        let given_back = Arc::new(AtomicUsize::new(0));
        let (hub, handoffs) = handoffs(&given_back);
        let holder = Holder::random();
        let _waiter = hub.subscribe_as(&key(), &holder);
        // Not connected: nothing is answered.
        handoffs.arrived(0, key(), holder.clone(), Fence::new(5));
        handoffs.connected(7);
        let sent = Instant::now();
        handoffs.queueing(&key(), &holder, sent);
        handoffs.arrived(8, key(), holder.clone(), Fence::new(5));
        assert_eq!(handoffs.take(&key(), &holder), None, "another address");
        handoffs.arrived(7, key(), holder.clone(), Fence::new(5));
        let handed = handoffs.take(&key(), &holder).unwrap();
        assert_eq!((handed.fence, handed.since), (Fence::new(5), sent));
        assert_eq!(handoffs.take(&key(), &holder), None, "answered once");
        assert_eq!(given_back.load(Ordering::SeqCst), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_hand_over_to_a_holder_that_stopped_waiting_is_given_back() {
        let given_back = Arc::new(AtomicUsize::new(0));
        let (hub, handoffs) = handoffs(&given_back);
        let holder = Holder::random();
        handoffs.connected(1);
        let waiter = hub.subscribe_as(&key(), &holder);
        handoffs.queueing(&key(), &holder, Instant::now());
        drop(waiter);
        handoffs.arrived(1, key(), holder.clone(), Fence::new(9));
        assert_eq!(given_back.load(Ordering::SeqCst), 1);
        assert_eq!(handoffs.take(&key(), &holder), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_claim_that_granted_ignores_a_late_hand_over() {
        let given_back = Arc::new(AtomicUsize::new(0));
        let (hub, handoffs) = handoffs(&given_back);
        let holder = Holder::random();
        handoffs.connected(1);
        let _waiter = hub.subscribe_as(&key(), &holder);
        handoffs.queueing(&key(), &holder, Instant::now());
        handoffs.granted(&key(), &holder);
        handoffs.arrived(1, key(), holder.clone(), Fence::new(9));
        assert_eq!(handoffs.take(&key(), &holder), None);
        assert_eq!(given_back.load(Ordering::SeqCst), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn an_untaken_hand_over_is_given_back_once_its_waiter_is_gone() {
        let given_back = Arc::new(AtomicUsize::new(0));
        let (hub, handoffs) = handoffs(&given_back);
        let holder = Holder::random();
        handoffs.connected(1);
        let waiter = hub.subscribe_as(&key(), &holder);
        handoffs.queueing(&key(), &holder, Instant::now());
        handoffs.arrived(1, key(), holder.clone(), Fence::new(9));
        tokio::time::sleep(HANDOFF_RESERVATION * 2).await;
        assert_eq!(given_back.load(Ordering::SeqCst), 0, "still waiting");
        drop(waiter);
        tokio::time::sleep(HANDOFF_RESERVATION * 2).await;
        assert_eq!(given_back.load(Ordering::SeqCst), 1);
    }
}
