//! The in-memory store: exact-key, process-local, TTL-honouring.
//!
//! Use it in tests, and in a single-process tool that needs no persistence. One
//! [`MemoryStore`] carries every capability, each in its module's `memory.rs` with its state
//! in a field of the store (locks and leases in `lease/memory.rs`; rate limits, cache,
//! broadcast, idempotency records and claimable work likewise), so every client made from
//! one store sees the same data and another store sees none of it.
//!
//! It coordinates only tasks of *this* process: the first write through a store (a grant, a
//! rate decision, a record, a queued item...) emits
//! [`baton.store.process_local`](crate::telemetry::events::STORE_PROCESS_LOCAL) once, naming
//! the degradation and the fix, so a multi-replica deployment that fell back to it is visible.
//!
//! ## Behavior
//! - Expiry is decided by the store's [`Clock`] (tokio's monotonic clock by default), so
//!   `tokio::time::pause` drives it in tests.
//! - Fences come from one counter per store seeded from the wall clock in microseconds, so
//!   they strictly increase per key, also across a store that is dropped and created again
//!   in the same process (as long as the wall clock does not step back).
//! - Releases wake waiters in this process at once.
//! - Expired entries are dropped when touched, and every capability sweeps its map once in
//!   [`SWEEP_EVERY`] operations.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use crate::key::StoreKey;
use crate::signals::ReleaseHub;
use crate::store::Store;
use crate::telemetry::{self, events};
use crate::time::{Clock, SystemClock};

/// How many operations on one capability's map pass between sweeps of its expired entries.
pub(crate) const SWEEP_EVERY: u64 = 1024;

/// The operation counter of one map, saying when it is due for a sweep of expired entries.
#[derive(Debug, Default)]
pub(crate) struct Sweep {
    ops: u64,
}

impl Sweep {
    /// Counts one operation; true once in [`SWEEP_EVERY`].
    pub(crate) fn due(&mut self) -> bool {
        self.ops += 1;
        self.ops.is_multiple_of(SWEEP_EVERY)
    }
}

/// The next fence of a counter seeded from the wall clock in microseconds: `last` plus one,
/// or the clock if that is ahead, so fences keep increasing across the stores a process opens
/// one after another.
pub(crate) fn next_fence(last: &mut u64) -> u64 {
    let wall_us = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0);
    *last = (*last + 1).max(wall_us);
    *last
}

/// A process-local store offering every capability of baton: the one to use in tests.
///
/// Locks and leases ([`LeaseStore`](crate::store::LeaseStore)), rate limits, the cache,
/// broadcast (an in-process bus), idempotency records and claimable work all live in this
/// value; clone the `Arc` to share them.
#[derive(Debug)]
pub struct MemoryStore {
    pub(crate) leases: Mutex<crate::lease::memory::MemoryLeases>,
    pub(crate) permits: Mutex<crate::semaphore::memory::MemoryPermits>,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) hub: Arc<ReleaseHub>,
    warned: AtomicBool,
    /// The state of the other capabilities: see their modules' `memory.rs`.
    pub(crate) limits: crate::limit::MemoryLimits,
    pub(crate) cache: crate::cache::MemoryCache,
    pub(crate) bus: crate::broadcast::MemoryBus,
    pub(crate) records: crate::idempotency::MemoryRecords,
    pub(crate) work: crate::work::MemoryWork,
}

impl MemoryStore {
    /// A store on tokio's clock.
    pub fn new() -> Self {
        MemoryStore::with_clock(Arc::new(SystemClock))
    }

    /// A store whose expiry follows `clock`.
    pub fn with_clock(clock: Arc<dyn Clock>) -> Self {
        MemoryStore {
            leases: Mutex::default(),
            permits: Mutex::default(),
            limits: crate::limit::MemoryLimits::new(clock.as_ref()),
            cache: crate::cache::MemoryCache::default(),
            bus: crate::broadcast::MemoryBus::default(),
            records: crate::idempotency::MemoryRecords::default(),
            work: crate::work::MemoryWork::new(clock.as_ref()),
            clock,
            hub: Arc::new(ReleaseHub::new()),
            warned: AtomicBool::new(false),
        }
    }

    /// Emits [`baton.store.process_local`](events::STORE_PROCESS_LOCAL) with `message` at the
    /// first write through this store, whichever capability makes it; later calls do nothing.
    pub(crate) fn warn_once(&self, key: &StoreKey, message: &str) {
        if !self.warned.swap(true, Ordering::Relaxed) {
            telemetry::emit(
                &events::STORE_PROCESS_LOCAL,
                Some(key.as_str()),
                format_args!("{message}"),
            );
        }
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        MemoryStore::new()
    }
}

impl Store for MemoryStore {
    fn name(&self) -> &'static str {
        "memory"
    }

    crate::offers!(
        rate_store,
        cache_store,
        broadcast_store,
        idempotency_store,
        work_store,
        semaphore_store
    );
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::holder::Holder;
    use crate::key::{Key, KeyKind, Namespace};
    use crate::limit::{Quota, RateStore};
    use crate::store::{LeaseRequest, LeaseStore};
    use crate::time::Ttl;

    fn key(kind: KeyKind, name: &str) -> StoreKey {
        Namespace::default().qualify(kind, &Key::new(name).unwrap())
    }

    fn warned_about(key: &StoreKey) -> Vec<String> {
        telemetry::recent_events()
            .into_iter()
            .filter(|e| e.event.key == events::STORE_PROCESS_LOCAL.key && e.key == key.as_str())
            .map(|e| e.detail)
            .collect()
    }

    /// One store warns once, at its first write, whichever capability makes it.
    #[tokio::test]
    async fn the_process_local_warning_is_once_per_store() {
        let tag = Holder::random();
        let rate = key(KeyKind::Limit, &format!("warn-rate-{tag}"));
        let lock = key(KeyKind::Lock, &format!("warn-lock-{tag}"));
        let store = MemoryStore::new();
        let quota = Quota::new(1, Duration::from_secs(1)).unwrap();
        assert!(store.admit(&rate, 1, quota).await.unwrap().allowed);
        let ttl = Ttl::new(Duration::from_secs(1)).unwrap();
        store
            .claim(&lock, LeaseRequest::new(&tag, ttl))
            .await
            .unwrap();
        let said = warned_about(&rate);
        assert_eq!(said.len(), 1, "{said:?}");
        assert!(
            said[0].contains("limits rates only within this process"),
            "{said:?}"
        );
        assert!(warned_about(&lock).is_empty(), "the same store warns once");

        let other = MemoryStore::new();
        let again = key(KeyKind::Lock, &format!("warn-other-{tag}"));
        other
            .claim(&again, LeaseRequest::new(&tag, ttl))
            .await
            .unwrap();
        assert_eq!(warned_about(&again).len(), 1, "another store warns again");
    }
}
