//! The in-memory store's claimable work: queues, schedules and migration records in this
//! process's memory.
//!
//! Use it in tests and in single-process tools. Its items, schedules and records die with
//! the process, and it coordinates only the tasks of this process: the first write through a
//! [`MemoryStore`] emits
//! [`baton.store.process_local`](crate::telemetry::events::STORE_PROCESS_LOCAL) once, so a
//! replicated service that fell back to it is visible.
//!
//! ## Behavior
//! - Every atom takes one mutex, so each is atomic and concurrent claims never share an item.
//! - Leases, `run_at` times and de-duplication windows follow the store's [`Clock`] (tokio's
//!   monotonic clock by default, so `tokio::time::pause` drives them in tests).
//! - The wall clock of [`now_ms`](ScheduleStore::now_ms) is read from `SystemTime` once, when
//!   the store is made, and moves on with the monotonic clock from then on: it never steps
//!   back, and schedules follow paused time in tests like everything else.
//! - Remembered de-duplication ids are dropped when their window has passed and the queue is
//!   next written.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use tokio::time::Instant;

use crate::error::Result;
use crate::holder::Holder;
use crate::key::StoreKey;
use crate::memory::MemoryStore;
use crate::store::Renewal;
use crate::time::{Clock, Ttl};

use super::store::{
    Advance, ClaimRequest, ClaimedItem, DeadItem, Enqueued, FailPlan, ItemId, ItemRef,
    MigrationClaim, MigrationEnd, MigrationRecord, MigrationState, MigrationStore, NewItem,
    QueueStats, QueueStore, ScheduleRow, ScheduleStore, Settle, TickClaim, Writer,
};
use crate::work::store::NewSchedule;

/// What the first write says about the memory store's reach.
const PROCESS_LOCAL: &str = "the in-memory store coordinates work only within this process; use sqlite:// or postgres:// to share queues, schedules and migrations across processes";

/// The claimable-work state of a [`MemoryStore`].
#[derive(Debug)]
pub(crate) struct MemoryWork {
    state: Mutex<State>,
    /// The wall clock (unix milliseconds) at `started`.
    wall_at_start_ms: i64,
    started: Instant,
}

#[derive(Debug, Default)]
struct State {
    next_id: i64,
    queues: BTreeMap<StoreKey, Queue>,
    schedules: BTreeMap<StoreKey, ScheduleRow>,
    migrations: HashMap<StoreKey, BTreeMap<String, Migration>>,
}

impl State {
    /// `writer`'s pending migration record: the one record the heartbeat and the finish
    /// of a migration may change.
    fn pending_of(&mut self, writer: Writer<'_>) -> Option<&mut Migration> {
        self.migrations
            .get_mut(writer.set)
            .and_then(|records| records.get_mut(writer.name))
            .filter(|record| {
                record.state == MigrationState::Pending && record.claimed_by == *writer.token
            })
    }
}

#[derive(Debug, Default)]
struct Queue {
    items: BTreeMap<i64, Item>,
    /// De-duplication id → (the item that holds it, when the window ends).
    dedup: HashMap<String, (ItemId, Instant)>,
}

#[derive(Debug)]
struct Item {
    payload: Vec<u8>,
    dedup_id: Option<String>,
    run_at: Instant,
    attempt: u32,
    max_attempts: u32,
    state: ItemState,
    last_error: String,
}

#[derive(Debug)]
enum ItemState {
    Ready,
    Running {
        token: Holder,
        locked_until: Instant,
    },
    Dead,
}

#[derive(Debug)]
struct Migration {
    state: MigrationState,
    claimed_by: Holder,
    lease_until: Instant,
    attempt: u32,
    error: String,
}

impl Queue {
    /// The running item `id` owned by `token`.
    fn owned(&mut self, id: ItemId, token: &Holder) -> Option<&mut Item> {
        self.items.get_mut(&id.0).filter(
            |item| matches!(&item.state, ItemState::Running { token: owner, .. } if owner == token),
        )
    }
}

impl MemoryWork {
    pub(crate) fn new(clock: &dyn Clock) -> Self {
        let wall_at_start_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as i64)
            .unwrap_or(0);
        MemoryWork {
            state: Mutex::new(State::default()),
            started: clock.now(),
            wall_at_start_ms,
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl MemoryStore {
    fn wall_ms(&self, now: Instant) -> i64 {
        self.work.wall_at_start_ms
            + now.saturating_duration_since(self.work.started).as_millis() as i64
    }
}

#[async_trait]
impl QueueStore for MemoryStore {
    async fn enqueue(&self, queue: &StoreKey, items: &[NewItem<'_>]) -> Result<Vec<Enqueued>> {
        let now = self.clock.now();
        let answers = {
            let mut state = self.work.state();
            let mut next_id = state.next_id;
            let q = state.queues.entry(queue.clone()).or_default();
            q.dedup.retain(|_, (_, until)| *until > now);
            let mut answers = Vec::with_capacity(items.len());
            for new in items {
                if let Some((dedup_id, _)) = new.dedup
                    && let Some((first, _)) = q.dedup.get(dedup_id)
                {
                    answers.push(Enqueued::Duplicate(*first));
                    continue;
                }
                next_id += 1;
                let id = ItemId(next_id);
                if let Some((dedup_id, window)) = new.dedup {
                    q.dedup
                        .insert(dedup_id.to_owned(), (id, now + window.get()));
                }
                q.items.insert(
                    id.0,
                    Item {
                        payload: new.payload.to_vec(),
                        dedup_id: new.dedup.map(|(d, _)| d.to_owned()),
                        run_at: now + new.delay,
                        attempt: 0,
                        max_attempts: new.max_attempts,
                        state: ItemState::Ready,
                        last_error: String::new(),
                    },
                );
                answers.push(Enqueued::Added(id));
            }
            if q.items.is_empty() && q.dedup.is_empty() {
                state.queues.remove(queue);
            }
            state.next_id = next_id;
            answers
        };
        self.warn_once(queue, PROCESS_LOCAL);
        Ok(answers)
    }

    async fn claim(&self, queue: &StoreKey, request: ClaimRequest<'_>) -> Result<Vec<ClaimedItem>> {
        let now = self.clock.now();
        let mut state = self.work.state();
        let Some(q) = state.queues.get_mut(queue) else {
            return Ok(Vec::new());
        };
        let mut eligible: Vec<(Instant, i64)> = q
            .items
            .iter()
            .filter(|(_, item)| match &item.state {
                ItemState::Ready => item.run_at <= now,
                ItemState::Running { locked_until, .. } => *locked_until <= now,
                ItemState::Dead => false,
            })
            .map(|(id, item)| (item.run_at, *id))
            .collect();
        eligible.sort_unstable();
        eligible.truncate(request.batch as usize);
        let mut claimed = Vec::with_capacity(eligible.len());
        for (_, id) in eligible {
            let item = q.items.get_mut(&id).expect("eligible item exists");
            item.state = ItemState::Running {
                token: request.token.clone(),
                locked_until: now + request.lease.get(),
            };
            item.attempt = item.attempt.saturating_add(1);
            claimed.push(ClaimedItem {
                id: ItemId(id),
                payload: item.payload.clone(),
                attempt: item.attempt,
                max_attempts: item.max_attempts,
                dedup_id: item.dedup_id.clone(),
                last_error: item.last_error.clone(),
            });
        }
        Ok(claimed)
    }

    async fn complete(&self, item: ItemRef<'_>) -> Result<Settle> {
        let (queue, id, token) = (item.queue, item.id, item.token);
        let mut state = self.work.state();
        let Some(q) = state.queues.get_mut(queue) else {
            return Ok(Settle::NotOwner);
        };
        if q.owned(id, token).is_none() {
            return Ok(Settle::NotOwner);
        }
        q.items.remove(&id.0);
        Ok(Settle::Settled)
    }

    async fn fail(&self, item: ItemRef<'_>, plan: FailPlan, error: &str) -> Result<Settle> {
        let (queue, id, token) = (item.queue, item.id, item.token);
        let now = self.clock.now();
        let mut state = self.work.state();
        let Some(item) = state.queues.get_mut(queue).and_then(|q| q.owned(id, token)) else {
            return Ok(Settle::NotOwner);
        };
        item.last_error = error.to_owned();
        match plan {
            FailPlan::Retry { after } => {
                item.state = ItemState::Ready;
                item.run_at = now + after;
            }
            FailPlan::DeadLetter => item.state = ItemState::Dead,
        }
        Ok(Settle::Settled)
    }

    async fn extend(&self, item: ItemRef<'_>, lease: Ttl) -> Result<Renewal> {
        let (queue, id, token) = (item.queue, item.id, item.token);
        let now = self.clock.now();
        let mut state = self.work.state();
        match state.queues.get_mut(queue).and_then(|q| q.owned(id, token)) {
            Some(item) => {
                if let ItemState::Running { locked_until, .. } = &mut item.state {
                    *locked_until = now + lease.get();
                }
                Ok(Renewal::Renewed)
            }
            None => Ok(Renewal::NotHeld),
        }
    }

    async fn release(&self, item: ItemRef<'_>) -> Result<Settle> {
        let (queue, id, token) = (item.queue, item.id, item.token);
        let now = self.clock.now();
        let mut state = self.work.state();
        let Some(item) = state.queues.get_mut(queue).and_then(|q| q.owned(id, token)) else {
            return Ok(Settle::NotOwner);
        };
        item.state = ItemState::Ready;
        item.run_at = now;
        item.attempt = item.attempt.saturating_sub(1);
        Ok(Settle::Settled)
    }

    async fn stats(&self, prefix: &str) -> Result<Vec<QueueStats>> {
        let now = self.clock.now();
        let state = self.work.state();
        let mut out = Vec::new();
        for (key, q) in &state.queues {
            if !key.as_str().starts_with(prefix) || q.items.is_empty() {
                continue;
            }
            let mut stats = QueueStats::empty(key.clone());
            let mut claimable_since: Option<Instant> = None;
            for item in q.items.values() {
                let since = match &item.state {
                    ItemState::Ready if item.run_at <= now => {
                        stats.ready += 1;
                        Some(item.run_at)
                    }
                    ItemState::Ready => {
                        stats.scheduled += 1;
                        None
                    }
                    ItemState::Running { locked_until, .. } if *locked_until <= now => {
                        stats.expired += 1;
                        Some(*locked_until)
                    }
                    ItemState::Running { .. } => {
                        stats.running += 1;
                        None
                    }
                    ItemState::Dead => {
                        stats.dead += 1;
                        None
                    }
                };
                if let Some(since) = since {
                    claimable_since = Some(claimable_since.map_or(since, |s| s.min(since)));
                }
            }
            stats.oldest_due = claimable_since.map(|s| now.saturating_duration_since(s));
            out.push(stats);
        }
        Ok(out)
    }

    async fn dead_letters(&self, queue: &StoreKey, limit: u32) -> Result<Vec<DeadItem>> {
        let state = self.work.state();
        let Some(q) = state.queues.get(queue) else {
            return Ok(Vec::new());
        };
        Ok(q.items
            .iter()
            .filter(|(_, item)| matches!(item.state, ItemState::Dead))
            .take(limit as usize)
            .map(|(id, item)| DeadItem {
                id: ItemId(*id),
                payload: item.payload.clone(),
                attempts: item.attempt,
                dedup_id: item.dedup_id.clone(),
                error: item.last_error.clone(),
            })
            .collect())
    }
}

#[async_trait]
impl ScheduleStore for MemoryStore {
    async fn now_ms(&self) -> Result<i64> {
        Ok(self.wall_ms(self.clock.now()))
    }

    async fn register_schedule(&self, schedule: NewSchedule<'_>) -> Result<ScheduleRow> {
        let (name, spec, first_due_ms) = (schedule.name, schedule.spec, schedule.first_due_ms);
        let row = {
            let mut state = self.work.state();
            let row = state
                .schedules
                .entry(name.clone())
                .or_insert_with(|| ScheduleRow {
                    name: name.clone(),
                    spec: spec.to_owned(),
                    due_at_ms: first_due_ms,
                    runs: 0,
                    last_run: None,
                });
            if row.spec != spec {
                row.spec = spec.to_owned();
                row.due_at_ms = first_due_ms;
            }
            row.clone()
        };
        self.warn_once(name, PROCESS_LOCAL);
        Ok(row)
    }

    async fn advance_schedule(&self, name: &StoreKey, tick: TickClaim<'_>) -> Result<Advance> {
        let (expected_due_ms, next_due_ms) = (tick.expected_due_ms, tick.next_due_ms);
        let (holder, ran) = (tick.holder, tick.ran);
        let now_ms = self.wall_ms(self.clock.now());
        let mut state = self.work.state();
        let Some(row) = state.schedules.get_mut(name) else {
            return Ok(Advance::Lost);
        };
        if row.due_at_ms != expected_due_ms || expected_due_ms > now_ms {
            return Ok(Advance::Lost);
        }
        row.due_at_ms = next_due_ms;
        if ran {
            row.runs += 1;
            row.last_run = Some((holder.clone(), now_ms));
        }
        Ok(Advance::Claimed)
    }

    async fn schedule(&self, name: &StoreKey) -> Result<Option<ScheduleRow>> {
        Ok(self.work.state().schedules.get(name).cloned())
    }

    async fn schedules(&self, prefix: &str) -> Result<Vec<ScheduleRow>> {
        Ok(self
            .work
            .state()
            .schedules
            .values()
            .filter(|row| row.name.as_str().starts_with(prefix))
            .cloned()
            .collect())
    }

    async fn remove_schedule(&self, name: &StoreKey) -> Result<bool> {
        Ok(self.work.state().schedules.remove(name).is_some())
    }
}

#[async_trait]
impl MigrationStore for MemoryStore {
    async fn claim_migration(&self, writer: Writer<'_>, lease: Ttl) -> Result<MigrationClaim> {
        let (set, name, writer) = (writer.set, writer.name, writer.token);
        let now = self.clock.now();
        let answer = {
            let mut state = self.work.state();
            let records = state.migrations.entry(set.clone()).or_default();
            match records.get_mut(name) {
                None => {
                    records.insert(
                        name.to_owned(),
                        Migration {
                            state: MigrationState::Pending,
                            claimed_by: writer.clone(),
                            lease_until: now + lease.get(),
                            attempt: 1,
                            error: String::new(),
                        },
                    );
                    MigrationClaim::Claimed {
                        attempt: 1,
                        previous: None,
                    }
                }
                Some(record) => match record.state {
                    MigrationState::Completed => MigrationClaim::Completed,
                    // Another writer's live claim; the writer's own is taken over.
                    MigrationState::Pending
                        if record.lease_until > now && record.claimed_by != *writer =>
                    {
                        MigrationClaim::Busy {
                            by: record.claimed_by.clone(),
                            remaining: record.lease_until - now,
                        }
                    }
                    previous => {
                        record.state = MigrationState::Pending;
                        record.claimed_by = writer.clone();
                        record.lease_until = now + lease.get();
                        record.attempt = record.attempt.saturating_add(1);
                        MigrationClaim::Claimed {
                            attempt: record.attempt,
                            previous: Some(previous),
                        }
                    }
                },
            }
        };
        self.warn_once(set, PROCESS_LOCAL);
        Ok(answer)
    }

    async fn heartbeat_migration(&self, writer: Writer<'_>, lease: Ttl) -> Result<Renewal> {
        let now = self.clock.now();
        let mut state = self.work.state();
        Ok(match state.pending_of(writer) {
            Some(record) => {
                record.lease_until = now + lease.get();
                Renewal::Renewed
            }
            None => Renewal::NotHeld,
        })
    }

    async fn finish_migration(&self, writer: Writer<'_>, end: MigrationEnd<'_>) -> Result<Settle> {
        let mut state = self.work.state();
        Ok(match state.pending_of(writer) {
            Some(record) => {
                record.state = end.state();
                record.error = end.error().to_owned();
                Settle::Settled
            }
            None => Settle::NotOwner,
        })
    }

    async fn migrations(&self, set: &StoreKey) -> Result<Vec<MigrationRecord>> {
        let now = self.clock.now();
        let state = self.work.state();
        Ok(state
            .migrations
            .get(set)
            .map(|records| {
                records
                    .iter()
                    .map(|(name, record)| MigrationRecord {
                        name: name.clone(),
                        state: record.state,
                        claimed_by: record.claimed_by.clone(),
                        attempt: record.attempt,
                        lease_remaining: if record.state == MigrationState::Pending {
                            record.lease_until.saturating_duration_since(now)
                        } else {
                            Duration::ZERO
                        },
                        error: record.error.clone(),
                    })
                    .collect()
            })
            .unwrap_or_default())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::key::{Key, KeyKind, Namespace};
    use crate::time::ManualClock;

    fn key(kind: KeyKind, name: &str) -> StoreKey {
        Namespace::default().qualify(kind, &Key::new(name).unwrap())
    }

    fn ttl(ms: u64) -> Ttl {
        Ttl::new(Duration::from_millis(ms)).unwrap()
    }

    /// Leases, delays and de-duplication windows follow the store's clock.
    #[tokio::test]
    async fn time_is_the_store_clock() {
        let clock = ManualClock::new();
        let store = MemoryStore::with_clock(Arc::new(clock.clone()));
        let q = key(KeyKind::Queue, "q");
        let item = |dedup| NewItem {
            payload: b"p",
            dedup: Some((dedup, ttl(1_000))),
            delay: Duration::from_millis(100),
            max_attempts: 3,
        };
        let Enqueued::Added(first) = store.enqueue(&q, &[item("d")]).await.unwrap()[0] else {
            panic!("the first item is added");
        };
        let token = Holder::random();
        let request = ClaimRequest {
            token: &token,
            batch: 10,
            lease: ttl(500),
        };
        assert!(
            store.claim(&q, request).await.unwrap().is_empty(),
            "delayed"
        );
        clock.advance(Duration::from_millis(100));
        let claimed = store.claim(&q, request).await.unwrap();
        assert_eq!(claimed.len(), 1);
        clock.advance(Duration::from_millis(499));
        assert!(store.claim(&q, request).await.unwrap().is_empty(), "leased");
        clock.advance(Duration::from_millis(1));
        assert_eq!(store.claim(&q, request).await.unwrap()[0].attempt, 2);
        assert_eq!(
            store.enqueue(&q, &[item("d")]).await.unwrap(),
            vec![Enqueued::Duplicate(first)]
        );
        clock.advance(Duration::from_millis(400));
        assert!(matches!(
            store.enqueue(&q, &[item("d")]).await.unwrap()[0],
            Enqueued::Added(_)
        ));
    }

    /// The wall clock starts at the system's and moves with the store's clock.
    #[tokio::test]
    async fn now_ms_moves_with_the_clock() {
        let clock = ManualClock::new();
        let store = MemoryStore::with_clock(Arc::new(clock.clone()));
        let system = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64;
        let first = store.now_ms().await.unwrap();
        assert!((first - system).abs() < 5_000);
        clock.advance(Duration::from_secs(90));
        assert_eq!(store.now_ms().await.unwrap(), first + 90_000);
    }
}
