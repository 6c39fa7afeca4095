//! The in-memory store's idempotency records, in this process's memory.
//!
//! Use it in tests and in single-process tools. It deduplicates only within this process:
//! the first record made through a [`MemoryStore`] emits
//! [`baton.store.process_local`](crate::telemetry::events::STORE_PROCESS_LOCAL) once, so a
//! replicated service that fell back to it is visible. Records die with the process.
//!
//! ## Behavior
//! - Time (expiry and leases) follows the store's [`Clock`](crate::time::Clock), tokio's
//!   monotonic clock by default, so `tokio::time::pause` drives it in tests.
//! - Expired records are dropped when touched, and swept with the store's other expired
//!   entries.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use crate::error::Result;
use crate::holder::Holder;
use crate::key::StoreKey;
use crate::memory::{MemoryStore, Sweep};
use crate::store::Renewal;
use crate::time::Ttl;

use super::record::Status;
use super::store::{
    AcquireAnswer, AcquireRequest, AttemptEnd, FinalizeAnswer, IdempotencyStore, StoredRecord,
};

/// What the first record says about the memory store's reach.
const PROCESS_LOCAL: &str = "the in-memory idempotency log deduplicates only within this process; use sqlite://, redis://, postgres:// or etcd:// to deduplicate across processes";

/// The idempotency state of a [`MemoryStore`].
#[derive(Debug, Default)]
pub(crate) struct MemoryRecords {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    records: HashMap<StoreKey, Entry>,
    sweep: Sweep,
}

#[derive(Debug, Clone)]
struct Entry {
    status: Status,
    owner: Holder,
    attempt: u32,
    fingerprint: String,
    metadata: Vec<u8>,
    expires_at: Instant,
    lease_until: Instant,
}

impl Entry {
    fn read(&self, now: Instant) -> StoredRecord {
        StoredRecord {
            status: self.status,
            owner: self.owner.clone(),
            attempt: self.attempt,
            fingerprint: self.fingerprint.clone(),
            metadata: self.metadata.clone(),
            expires_in: self.expires_at.saturating_duration_since(now),
            lease_remaining: if self.status == Status::Pending {
                self.lease_until.saturating_duration_since(now)
            } else {
                Duration::ZERO
            },
        }
    }
}

impl State {
    /// The live record of `key`, dropping it first if it expired.
    fn live(&mut self, key: &StoreKey, now: Instant) -> Option<&mut Entry> {
        if self.sweep.due() {
            self.records.retain(|_, e| e.expires_at > now);
        }
        if self.records.get(key).is_some_and(|e| e.expires_at <= now) {
            self.records.remove(key);
        }
        self.records.get_mut(key)
    }
}

impl MemoryRecords {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[async_trait]
impl IdempotencyStore for MemoryStore {
    async fn acquire(&self, key: &StoreKey, request: AcquireRequest<'_>) -> Result<AcquireAnswer> {
        let now = self.clock.now();
        let fresh = |attempt: u32| Entry {
            status: Status::Pending,
            owner: request.attempt.clone(),
            attempt,
            fingerprint: request.fingerprint.to_owned(),
            metadata: Vec::new(),
            expires_at: now + request.ttl.get(),
            lease_until: now + request.lease.get(),
        };
        let answer = {
            let mut state = self.records.state();
            match state.live(key, now) {
                None => {
                    let entry = fresh(1);
                    let record = entry.read(now);
                    state.records.insert(key.clone(), entry);
                    AcquireAnswer::Acquired {
                        record,
                        previous: None,
                    }
                }
                Some(entry) => {
                    let lapsed = entry.status == Status::Pending && entry.lease_until <= now;
                    let retry = entry.status == Status::Failed && request.retry_failed;
                    if entry.fingerprint == request.fingerprint && (lapsed || retry) {
                        let previous = entry.status;
                        *entry = fresh(entry.attempt.saturating_add(1));
                        AcquireAnswer::Acquired {
                            record: entry.read(now),
                            previous: Some(previous),
                        }
                    } else {
                        AcquireAnswer::Duplicate(entry.read(now))
                    }
                }
            }
        };
        if matches!(answer, AcquireAnswer::Acquired { .. }) {
            self.warn_once(key, PROCESS_LOCAL);
        }
        Ok(answer)
    }

    async fn renew(&self, key: &StoreKey, owner: &Holder, lease: Ttl) -> Result<Renewal> {
        let now = self.clock.now();
        let mut state = self.records.state();
        Ok(match state.live(key, now) {
            Some(entry) if entry.owner == *owner && entry.status == Status::Pending => {
                entry.lease_until = now + lease.get();
                Renewal::Renewed
            }
            _ => Renewal::NotHeld,
        })
    }

    async fn finalize(&self, key: &StoreKey, end: AttemptEnd<'_>) -> Result<FinalizeAnswer> {
        let (owner, outcome, metadata) = (end.owner, end.outcome, end.metadata);
        let now = self.clock.now();
        let mut state = self.records.state();
        Ok(match state.live(key, now) {
            Some(entry) if entry.owner == *owner => {
                if entry.status == Status::Pending {
                    entry.status = outcome.status();
                    entry.metadata = metadata.to_vec();
                }
                FinalizeAnswer::Finalized(entry.read(now))
            }
            _ => FinalizeAnswer::NotOwner,
        })
    }

    async fn get(&self, key: &StoreKey) -> Result<Option<StoredRecord>> {
        let now = self.clock.now();
        let mut state = self.records.state();
        Ok(state.live(key, now).map(|entry| entry.read(now)))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::idempotency::{
        Acquire, AcquireOptions, Finalize, IdempotencyLog, Outcome, Scope, Takeover,
    };
    use crate::time::ManualClock;

    /// Leases and expiry follow the store's clock, not the caller's.
    #[tokio::test]
    async fn time_is_the_store_clock() {
        let clock = ManualClock::new();
        let log = IdempotencyLog::new(Arc::new(MemoryStore::with_clock(Arc::new(clock.clone()))));
        let scope = Scope::new("o", "d", "k").unwrap();
        let options = AcquireOptions::new(Duration::from_secs(60)).lease(Duration::from_secs(5));
        let Acquire::Acquired(first) = log.try_acquire_with(&scope, &options).await.unwrap() else {
            panic!("first acquires");
        };
        clock.advance(Duration::from_millis(4_999));
        assert!(
            !log.try_acquire_with(&scope, &options)
                .await
                .unwrap()
                .is_acquired()
        );
        clock.advance(Duration::from_millis(1));
        let Acquire::Acquired(second) = log.try_acquire_with(&scope, &options).await.unwrap()
        else {
            panic!("the lapsed lease is taken over");
        };
        assert_eq!(second.takeover(), Some(Takeover::LeaseLapsed));
        assert_eq!(second.number(), 2);
        assert_eq!(
            log.finalize(&first, Outcome::Completed, b"late")
                .await
                .unwrap(),
            Finalize::NotOwner
        );
        clock.advance(Duration::from_secs(60));
        assert!(log.get(&scope).await.unwrap().is_none(), "expired");
        let Acquire::Acquired(third) = log.try_acquire_with(&scope, &options).await.unwrap() else {
            panic!("an expired record starts afresh");
        };
        assert_eq!((third.number(), third.takeover()), (1, None));
    }
}
