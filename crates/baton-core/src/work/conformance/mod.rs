//! The claimable-work conformance rules: written once, run by every store's test target.
//!
//! A store's test target implements [`Opens`] for its store (the
//! [`WorkHarness`]) and expands
//! [`work_conformance_tests!`](crate::work_conformance_tests)
//! (`baton_core::work_conformance_tests!(my_harness())`), which generates one
//! `#[tokio::test]` per rule. Each rule uses a fresh random namespace, so rules may share a
//! store.
//!
//! The rules check every clause of the [store contract](super::store) on the atoms, and the
//! policy layer ([`Queue`](super::Queue), [`Worker`](super::Worker),
//! [`Scheduler`](super::Scheduler), [`fan_out`](super::Queue::fan_out),
//! [`Migrations`](super::Migrations)) through the store, including the multi-replica
//! scenarios: four schedulers over eight ticks, three workers over a fan-out of 10,000
//! records, and a migration runner killed in the middle of `up()`.
//! [`FaultyWorkStore`] wraps a real store to count calls and inject faults.
//!
//! Timing rules never assert speed: they wait for a lease to lapse by polling with generous
//! deadlines, and a lease that must *not* lapse during a check is a minute long.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::Barrier;
use tokio::time::sleep;

use crate::conformance::{Faulty, Opens, eventually, fresh_namespace, ms};
use crate::error::{ErrorKind, Result};
use crate::holder::Holder;
use crate::key::{Key, KeyKind, Namespace, StoreKey};
use crate::store::Renewal;
use crate::time::Ttl;

mod policy;
mod scenarios;

pub use policy::*;
pub use scenarios::*;

use super::store::{
    Advance, ClaimRequest, ClaimedItem, DeadItem, Enqueued, FailPlan, ItemId, ItemRef,
    MigrationClaim, MigrationEnd, MigrationRecord, MigrationState, MigrationStore, NewItem,
    QueueStats, QueueStore, ScheduleRow, ScheduleStore, Settle, TickClaim, WorkStore, Writer,
};
use crate::work::store::NewSchedule;

/// What a store's test target provides to the claimable-work rules: the store under test, as
/// [`WorkStore`]. Every call answers a store over the same data; a store with connections
/// should open new ones on every call, as another replica would, because the multi-replica
/// rules call it once per replica.
pub type WorkHarness = dyn Opens<dyn WorkStore>;

/// Generates one `#[tokio::test]` per claimable-work rule. `$harness` is an expression that
/// evaluates to a future of a [`WorkHarness`]; it is evaluated once per test.
#[macro_export]
macro_rules! work_conformance_tests {
    ($harness:expr) => {
        $crate::__conformance_rules!($crate::work::conformance; $harness;
            enqueue_adds_items_with_increasing_ids,
            dedup_inside_the_window_is_a_noop_naming_the_first,
            dedup_after_the_window_adds,
            duplicates_within_one_batch,
            claim_takes_the_oldest_first_up_to_the_batch,
            claim_skips_items_not_yet_due,
            concurrent_claimers_never_share_an_item,
            settling_requires_the_token,
            zombie_after_a_reclaim_is_not_owner,
            late_settle_without_a_reclaim_is_accepted,
            lapsed_lease_returns_the_item,
            extend_restarts_the_lease,
            fail_with_retry_makes_the_item_ready_after_the_backoff,
            fail_with_dead_letter_keeps_the_item_unclaimable,
            release_is_not_an_attempt,
            stats_count_every_state,
            dead_letters_oldest_first_up_to_the_limit,
            schedule_register_inserts_or_replaces_the_spec,
            schedule_advance_exactly_one_of_many,
            schedule_advance_not_due_or_moved_is_lost,
            schedule_now_is_the_wall_clock,
            migration_claim_is_a_compare_and_set,
            migration_claim_exactly_one_of_many,
            migration_reclaim_by_its_own_writer_takes_it_over,
            migration_heartbeat_and_finish_are_scoped_to_the_writer,
            migration_late_finish_without_a_takeover_is_accepted,
            store_faults_are_errors_not_answers,
            queue_enqueue_and_claim,
            queue_retries_with_backoff_then_dead_letters,
            queue_zombie_gets_not_owner,
            queue_dead_letters_items_whose_leases_keep_lapsing,
            worker_settles_by_the_handler_answer,
            worker_drains_until_settled,
            worker_extends_leases_while_handlers_run,
            worker_discards_the_result_of_a_lost_item,
            worker_shuts_down_gracefully,
            invalid_input_is_rejected_before_io,
            policy_store_faults_are_errors,
            scheduler_skips_missed_ticks,
            scheduler_catches_up_once,
            scheduler_lists_and_removes_schedules,
            fan_out_reports_added_and_duplicates,
            four_schedulers_run_every_tick_exactly_once,
            fan_out_to_three_replicas_processes_each_record_once,
            migrations_run_once_in_order,
            migration_failure_rolls_back_and_stops_the_walk,
            migration_runner_killed_mid_up_is_taken_over,
            migration_loser_policies,
        );
    };
}

/// A lease that cannot lapse during a check, even on a loaded machine.
const LONG: Duration = Duration::from_secs(60);
/// How long a rule waits for something that must happen before failing.
const PATIENCE: Duration = Duration::from_secs(30);
const DAY: Duration = Duration::from_secs(86_400);

fn ttl(d: Duration) -> Ttl {
    Ttl::new(d).expect("valid ttl")
}

fn queue_key(ns: &Namespace, name: &str) -> StoreKey {
    ns.qualify(KeyKind::Queue, &Key::new(name).expect("valid key"))
}

fn schedule_key(ns: &Namespace, name: &str) -> StoreKey {
    ns.qualify(KeyKind::Schedule, &Key::new(name).expect("valid key"))
}

fn migration_key(ns: &Namespace, name: &str) -> StoreKey {
    ns.qualify(KeyKind::Migration, &Key::new(name).expect("valid key"))
}

fn item(payload: &[u8]) -> NewItem<'_> {
    NewItem {
        payload,
        dedup: None,
        delay: Duration::ZERO,
        max_attempts: 5,
    }
}

fn deduped<'a>(payload: &'a [u8], dedup: &'a str, window: Duration) -> NewItem<'a> {
    NewItem {
        dedup: Some((dedup, ttl(window))),
        ..item(payload)
    }
}

async fn added(store: &dyn QueueStore, key: &StoreKey, new: NewItem<'_>) -> ItemId {
    match store.enqueue(key, &[new]).await.expect("enqueue")[..] {
        [Enqueued::Added(id)] => id,
        ref other => panic!("expected one item added to {key}, got {other:?}"),
    }
}

async fn claim(
    store: &dyn QueueStore,
    key: &StoreKey,
    token: &Holder,
    batch: u32,
    lease: Duration,
) -> Vec<ClaimedItem> {
    store
        .claim(
            key,
            ClaimRequest {
                token,
                batch,
                lease: ttl(lease),
            },
        )
        .await
        .expect("claim")
}

async fn claim_one(
    store: &dyn QueueStore,
    key: &StoreKey,
    token: &Holder,
    lease: Duration,
) -> ClaimedItem {
    let mut items = claim(store, key, token, 1, lease).await;
    assert_eq!(items.len(), 1, "expected one claimable item in {key}");
    items.pop().expect("one item")
}

/// Claims with `token` until an item comes back (a lapsed lease), for up to `PATIENCE`.
async fn claim_eventually(
    store: &dyn QueueStore,
    key: &StoreKey,
    token: &Holder,
    lease: Duration,
) -> ClaimedItem {
    let start = tokio::time::Instant::now();
    loop {
        if let Some(item) = claim(store, key, token, 1, lease).await.pop() {
            return item;
        }
        assert!(
            start.elapsed() < PATIENCE,
            "nothing in {key} became claimable within {PATIENCE:?}"
        );
        sleep(ms(10)).await;
    }
}

async fn stats_of(store: &dyn QueueStore, key: &StoreKey) -> Option<QueueStats> {
    store
        .stats(key.as_str())
        .await
        .expect("stats")
        .into_iter()
        .find(|s| s.key == *key)
}

/// Enqueued items get increasing ids and come back from a claim exactly as they went in:
/// payload, attempt 1, `max_attempts`, de-duplication id, no error yet.
pub async fn enqueue_adds_items_with_increasing_ids(h: &WorkHarness) {
    let ns = fresh_namespace();
    let store = h.open().await;
    let key = queue_key(&ns, "jobs");
    let payloads: [&[u8]; 3] = [b"first", b"", &[0, 159, 146, 150, 255]];
    let batch: Vec<_> = payloads
        .iter()
        .map(|p| NewItem {
            max_attempts: 7,
            ..item(p)
        })
        .collect();
    let answers = store.enqueue(&key, &batch).await.unwrap();
    let ids: Vec<ItemId> = answers
        .iter()
        .map(|a| match a {
            Enqueued::Added(id) => *id,
            other => panic!("no de-duplication id, so added: {other:?}"),
        })
        .collect();
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "{ids:?}");
    let later = added(&*store, &key, deduped(b"later", "d-1", DAY)).await;
    assert!(later > ids[2]);

    let token = Holder::random();
    let claimed = claim(&*store, &key, &token, 10, LONG).await;
    assert_eq!(
        claimed.iter().map(|c| c.id).collect::<Vec<_>>(),
        vec![ids[0], ids[1], ids[2], later]
    );
    for (c, payload) in claimed.iter().zip(payloads) {
        assert_eq!(c.payload, payload);
        assert_eq!((c.attempt, c.max_attempts), (1, 7));
        assert_eq!(c.dedup_id, None);
        assert_eq!(c.last_error, "");
    }
    assert_eq!(claimed[3].dedup_id.as_deref(), Some("d-1"));
    assert_eq!(claimed[3].max_attempts, 5);
    assert!(claim(&*store, &key, &token, 10, LONG).await.is_empty());
}

/// Inside the window, an item with a known de-duplication id is not added: the answer names
/// the first item, also after that item completed, and nothing changes.
pub async fn dedup_inside_the_window_is_a_noop_naming_the_first(h: &WorkHarness) {
    let ns = fresh_namespace();
    let store = h.open().await;
    let key = queue_key(&ns, "jobs");
    let first = added(&*store, &key, deduped(b"one", "order-1", DAY)).await;
    assert_eq!(
        store
            .enqueue(&key, &[deduped(b"two", "order-1", DAY)])
            .await
            .unwrap(),
        vec![Enqueued::Duplicate(first)]
    );
    let other = added(&*store, &key, deduped(b"three", "order-2", DAY)).await;
    assert_ne!(other, first);
    let stats = stats_of(&*store, &key).await.expect("listed");
    assert_eq!(stats.ready, 2, "the duplicate added nothing: {stats:?}");

    let token = Holder::random();
    let c = claim_one(&*store, &key, &token, LONG).await;
    assert_eq!((c.id, c.payload.as_slice()), (first, &b"one"[..]));
    assert_eq!(
        store
            .complete(ItemRef::new(&key, first, &token))
            .await
            .unwrap(),
        Settle::Settled
    );
    assert_eq!(
        store
            .enqueue(&key, &[deduped(b"again", "order-1", DAY)])
            .await
            .unwrap(),
        vec![Enqueued::Duplicate(first)],
        "a completed item's de-duplication id is remembered for its window"
    );
    // The same id in another queue is another item.
    let elsewhere = queue_key(&ns, "other-jobs");
    added(&*store, &elsewhere, deduped(b"x", "order-1", DAY)).await;
}

/// Once the first item's window has passed, the same de-duplication id adds a new item.
pub async fn dedup_after_the_window_adds(h: &WorkHarness) {
    let ns = fresh_namespace();
    let store = h.open().await;
    let key = queue_key(&ns, "jobs");
    let first = added(&*store, &key, deduped(b"one", "tick", ms(200))).await;
    let start = tokio::time::Instant::now();
    let second = loop {
        match store
            .enqueue(&key, &[deduped(b"two", "tick", DAY)])
            .await
            .unwrap()[..]
        {
            [Enqueued::Added(id)] => break id,
            [Enqueued::Duplicate(seen)] => assert_eq!(seen, first),
            ref other => panic!("one answer per item: {other:?}"),
        }
        assert!(
            start.elapsed() < PATIENCE,
            "the 200ms window did not pass within {PATIENCE:?}"
        );
        sleep(ms(20)).await;
    };
    assert!(second > first);
    // The new item's own window (a day) now holds.
    assert_eq!(
        store
            .enqueue(&key, &[deduped(b"three", "tick", DAY)])
            .await
            .unwrap(),
        vec![Enqueued::Duplicate(second)]
    );
    assert_eq!(stats_of(&*store, &key).await.unwrap().ready, 2);
}

/// Duplicates inside one batch are answered like duplicates across batches.
pub async fn duplicates_within_one_batch(h: &WorkHarness) {
    let ns = fresh_namespace();
    let store = h.open().await;
    let key = queue_key(&ns, "jobs");
    let answers = store
        .enqueue(
            &key,
            &[
                deduped(b"a", "x", DAY),
                deduped(b"b", "x", DAY),
                deduped(b"c", "y", DAY),
                item(b"d"),
                deduped(b"e", "y", DAY),
            ],
        )
        .await
        .unwrap();
    let [
        Enqueued::Added(a),
        Enqueued::Duplicate(b),
        Enqueued::Added(c),
        Enqueued::Added(d),
        Enqueued::Duplicate(e),
    ] = answers[..]
    else {
        panic!("expected added, duplicate, added, added, duplicate: {answers:?}");
    };
    assert_eq!((b, e), (a, c));
    assert!(a < c && c < d);
    assert_eq!(stats_of(&*store, &key).await.unwrap().ready, 3);
}

/// A claim takes at most `batch` items, oldest `run_at` first, then lowest id; an empty
/// queue answers nothing.
pub async fn claim_takes_the_oldest_first_up_to_the_batch(h: &WorkHarness) {
    let ns = fresh_namespace();
    let store = h.open().await;
    let key = queue_key(&ns, "jobs");
    let token = Holder::random();
    assert!(claim(&*store, &key, &token, 5, LONG).await.is_empty());
    // `late` has the lower id but the later run_at.
    let late = added(
        &*store,
        &key,
        NewItem {
            delay: Duration::from_secs(1),
            ..item(b"late")
        },
    )
    .await;
    let answers = store
        .enqueue(&key, &[item(b"a"), item(b"b"), item(b"c")])
        .await
        .unwrap();
    let ids: Vec<ItemId> = answers
        .iter()
        .map(|a| match a {
            Enqueued::Added(id) => *id,
            other => panic!("{other:?}"),
        })
        .collect();
    eventually(PATIENCE, "the delayed item coming due", || {
        let (store, key) = (&store, &key);
        async move { stats_of(&**store, key).await.is_some_and(|s| s.ready == 4) }
    })
    .await;
    let first = claim(&*store, &key, &token, 2, LONG).await;
    assert_eq!(
        first.iter().map(|c| c.id).collect::<Vec<_>>(),
        vec![ids[0], ids[1]],
        "oldest run_at first (`late` has the lowest id but runs last), then lowest id"
    );
    let rest = claim(&*store, &key, &Holder::random(), 10, LONG).await;
    assert_eq!(
        rest.iter().map(|c| c.id).collect::<Vec<_>>(),
        vec![ids[2], late],
        "the batch is a maximum"
    );
    assert!(claim(&*store, &key, &token, 10, LONG).await.is_empty());
}

/// An item waiting for its `run_at` is not claimable until then; other queues' items never
/// are.
pub async fn claim_skips_items_not_yet_due(h: &WorkHarness) {
    let ns = fresh_namespace();
    let store = h.open().await;
    let key = queue_key(&ns, "jobs");
    added(
        &*store,
        &key,
        NewItem {
            delay: Duration::from_secs(3600),
            ..item(b"later")
        },
    )
    .await;
    let soon = added(
        &*store,
        &key,
        NewItem {
            delay: ms(200),
            ..item(b"soon")
        },
    )
    .await;
    added(&*store, &queue_key(&ns, "other"), item(b"elsewhere")).await;
    added(&*store, &queue_key(&fresh_namespace(), "jobs"), item(b"x")).await;
    let token = Holder::random();
    let first = claim(&*store, &key, &token, 10, LONG).await;
    assert!(
        first.is_empty() || first.iter().all(|c| c.id == soon),
        "only `soon` may be due: {first:?}"
    );
    let c = if first.is_empty() {
        claim_eventually(&*store, &key, &token, LONG).await
    } else {
        first.into_iter().next().expect("one")
    };
    assert_eq!(c.id, soon);
    assert!(claim(&*store, &key, &token, 10, LONG).await.is_empty());
    let s = stats_of(&*store, &key).await.unwrap();
    assert_eq!((s.scheduled, s.running), (1, 1), "{s:?}");
}

/// 32 concurrent claimers over four connections: every item is claimed exactly once.
pub async fn concurrent_claimers_never_share_an_item(h: &WorkHarness) {
    const ITEMS: usize = 400;
    const CLAIMERS: usize = 32;
    let ns = fresh_namespace();
    let key = queue_key(&ns, "contended");
    let stores = [
        h.open().await,
        h.open().await,
        h.open().await,
        h.open().await,
    ];
    let payloads: Vec<Vec<u8>> = (0..ITEMS).map(|i| i.to_string().into_bytes()).collect();
    for chunk in payloads.chunks(100) {
        let batch: Vec<_> = chunk.iter().map(|p| item(p)).collect();
        stores[0].enqueue(&key, &batch).await.unwrap();
    }
    let start = Arc::new(Barrier::new(CLAIMERS));
    let tasks: Vec<_> = (0..CLAIMERS)
        .map(|i| {
            let (store, key, start) = (stores[i % 4].clone(), key.clone(), start.clone());
            tokio::spawn(async move {
                start.wait().await;
                let token = Holder::random();
                let mut mine = Vec::new();
                loop {
                    let batch = 1 + (i % 5) as u32;
                    let got = claim(&*store, &key, &token, batch, LONG).await;
                    if got.is_empty() {
                        return mine;
                    }
                    assert!(got.len() <= batch as usize);
                    for c in got {
                        assert_eq!(c.attempt, 1, "claimed twice: {c:?}");
                        mine.push(c.id);
                    }
                }
            })
        })
        .collect();
    let mut seen = BTreeSet::new();
    let mut total = 0;
    for task in tasks {
        for id in task.await.expect("claimer") {
            assert!(seen.insert(id), "item {id} claimed twice");
            total += 1;
        }
    }
    assert_eq!((total, seen.len()), (ITEMS, ITEMS));
}

/// Complete, fail, extend and release act only with the claim's token; with any other
/// token they answer `NotOwner` (`Renewal::NotHeld` for extend) and change nothing.
pub async fn settling_requires_the_token(h: &WorkHarness) {
    let ns = fresh_namespace();
    let store = h.open().await;
    let key = queue_key(&ns, "jobs");
    let id = added(&*store, &key, item(b"p")).await;
    let token = Holder::random();
    let stranger = Holder::random();
    // Not claimed yet: nobody owns it.
    assert_eq!(
        store
            .complete(ItemRef::new(&key, id, &token))
            .await
            .unwrap(),
        Settle::NotOwner
    );
    let c = claim_one(&*store, &key, &token, LONG).await;
    assert_eq!(c.id, id);
    assert_eq!(
        store
            .complete(ItemRef::new(&key, id, &stranger))
            .await
            .unwrap(),
        Settle::NotOwner
    );
    assert_eq!(
        store
            .fail(ItemRef::new(&key, id, &stranger), FailPlan::DeadLetter, "x")
            .await
            .unwrap(),
        Settle::NotOwner
    );
    assert_eq!(
        store
            .extend(ItemRef::new(&key, id, &stranger), ttl(ms(10)))
            .await
            .unwrap(),
        Renewal::NotHeld
    );
    assert_eq!(
        store
            .release(ItemRef::new(&key, id, &stranger))
            .await
            .unwrap(),
        Settle::NotOwner
    );
    assert_eq!(
        store
            .complete(ItemRef::new(&key, ItemId(id.0 + 1_000_000), &token))
            .await
            .unwrap(),
        Settle::NotOwner,
        "an unknown id is not owned"
    );
    let s = stats_of(&*store, &key).await.unwrap();
    assert_eq!(
        (s.running, s.dead, s.ready),
        (1, 0, 0),
        "nothing changed: {s:?}"
    );
    assert_eq!(
        store
            .complete(ItemRef::new(&key, id, &token))
            .await
            .unwrap(),
        Settle::Settled
    );
    assert!(stats_of(&*store, &key).await.is_none(), "completed: gone");
    assert_eq!(
        store
            .complete(ItemRef::new(&key, id, &token))
            .await
            .unwrap(),
        Settle::NotOwner,
        "a completed item is owned by nobody"
    );
}

/// A claimer whose lapsed item was claimed again (a zombie) gets `NotOwner` for every
/// settle, and changes nothing: the new claimer still owns the item.
pub async fn zombie_after_a_reclaim_is_not_owner(h: &WorkHarness) {
    let ns = fresh_namespace();
    let store = h.open().await;
    let key = queue_key(&ns, "jobs");
    let id = added(&*store, &key, item(b"p")).await;
    let zombie = Holder::random();
    assert_eq!(claim_one(&*store, &key, &zombie, ms(50)).await.id, id);
    let heir = Holder::random();
    let again = claim_eventually(&*store, &key, &heir, LONG).await;
    assert_eq!((again.id, again.attempt), (id, 2));
    assert_eq!(
        store
            .complete(ItemRef::new(&key, id, &zombie))
            .await
            .unwrap(),
        Settle::NotOwner
    );
    assert_eq!(
        store
            .fail(
                ItemRef::new(&key, id, &zombie),
                FailPlan::Retry { after: ms(0) },
                "late"
            )
            .await
            .unwrap(),
        Settle::NotOwner
    );
    assert_eq!(
        store
            .extend(ItemRef::new(&key, id, &zombie), ttl(LONG))
            .await
            .unwrap(),
        Renewal::NotHeld
    );
    assert_eq!(
        store
            .release(ItemRef::new(&key, id, &zombie))
            .await
            .unwrap(),
        Settle::NotOwner
    );
    let s = stats_of(&*store, &key).await.unwrap();
    assert_eq!((s.running, s.ready, s.expired), (1, 0, 0), "{s:?}");
    assert!(
        claim(&*store, &key, &Holder::random(), 5, LONG)
            .await
            .is_empty(),
        "the heir's lease is intact"
    );
    assert_eq!(
        store.complete(ItemRef::new(&key, id, &heir)).await.unwrap(),
        Settle::Settled
    );
}

/// Ownership ends at the next claim, not when the lease lapses: the last claimer may still
/// complete, fail, extend or release while nobody claimed the item since.
pub async fn late_settle_without_a_reclaim_is_accepted(h: &WorkHarness) {
    let ns = fresh_namespace();
    let store = h.open().await;
    let key = queue_key(&ns, "jobs");
    let a = added(&*store, &key, item(b"a")).await;
    let b = added(&*store, &key, item(b"b")).await;
    let token = Holder::random();
    assert_eq!(claim(&*store, &key, &token, 2, ms(30)).await.len(), 2);
    eventually(PATIENCE, "both leases lapsing", || {
        let (store, key) = (&store, &key);
        async move {
            stats_of(&**store, key)
                .await
                .is_some_and(|s| s.expired == 2)
        }
    })
    .await;
    assert_eq!(
        store
            .extend(ItemRef::new(&key, b, &token), ttl(LONG))
            .await
            .unwrap(),
        Renewal::Renewed,
        "a lapsed lease is extended by its owner while nobody took it"
    );
    assert_eq!(
        store.complete(ItemRef::new(&key, a, &token)).await.unwrap(),
        Settle::Settled
    );
    let s = stats_of(&*store, &key).await.unwrap();
    assert_eq!((s.running, s.expired), (1, 0), "{s:?}");
}

/// A lapsed lease makes the item claimable again, as the next attempt.
pub async fn lapsed_lease_returns_the_item(h: &WorkHarness) {
    let ns = fresh_namespace();
    let store = h.open().await;
    let key = queue_key(&ns, "jobs");
    let id = added(&*store, &key, deduped(b"p", "d", DAY)).await;
    let first = claim_one(&*store, &key, &Holder::random(), ms(50)).await;
    assert_eq!(first.attempt, 1);
    eventually(PATIENCE, "the lease lapsing", || {
        let (store, key) = (&store, &key);
        async move {
            stats_of(&**store, key)
                .await
                .is_some_and(|s| s.expired == 1 && s.running == 0 && s.oldest_due.is_some())
        }
    })
    .await;
    let again = claim_one(&*store, &key, &Holder::random(), LONG).await;
    assert_eq!(
        (again.id, again.attempt, again.payload),
        (id, 2, b"p".to_vec())
    );
    assert_eq!(again.dedup_id.as_deref(), Some("d"));
}

/// `extend` sets `locked_until = now + lease`: it keeps a claimed item from others, and
/// can shorten a lease as well as lengthen it.
pub async fn extend_restarts_the_lease(h: &WorkHarness) {
    let ns = fresh_namespace();
    let store = h.open().await;
    let key = queue_key(&ns, "jobs");
    let id = added(&*store, &key, item(b"p")).await;
    let token = Holder::random();
    claim_one(&*store, &key, &token, Duration::from_secs(2)).await;
    assert_eq!(
        store
            .extend(ItemRef::new(&key, id, &token), ttl(LONG))
            .await
            .unwrap(),
        Renewal::Renewed
    );
    sleep(Duration::from_millis(2_500)).await;
    assert!(
        claim(&*store, &key, &Holder::random(), 1, LONG)
            .await
            .is_empty(),
        "the extended lease outlives the first one"
    );
    assert_eq!(
        store
            .extend(ItemRef::new(&key, id, &token), ttl(ms(20)))
            .await
            .unwrap(),
        Renewal::Renewed
    );
    let again = claim_eventually(&*store, &key, &Holder::random(), LONG).await;
    assert_eq!((again.id, again.attempt), (id, 2));
}

/// `fail` with a retry makes the item ready again after the backoff, with the error kept;
/// with zero backoff it is claimable at once.
pub async fn fail_with_retry_makes_the_item_ready_after_the_backoff(h: &WorkHarness) {
    let ns = fresh_namespace();
    let store = h.open().await;
    let key = queue_key(&ns, "jobs");
    let id = added(&*store, &key, item(b"p")).await;
    let token = Holder::random();
    claim_one(&*store, &key, &token, LONG).await;
    assert_eq!(
        store
            .fail(
                ItemRef::new(&key, id, &token),
                FailPlan::Retry { after: LONG },
                "boom"
            )
            .await
            .unwrap(),
        Settle::Settled
    );
    let s = stats_of(&*store, &key).await.unwrap();
    assert_eq!((s.scheduled, s.running, s.ready), (1, 0, 0), "{s:?}");
    assert!(claim(&*store, &key, &token, 1, LONG).await.is_empty());

    let other = added(&*store, &key, item(b"q")).await;
    claim_one(&*store, &key, &token, LONG).await;
    assert_eq!(
        store
            .fail(
                ItemRef::new(&key, other, &token),
                FailPlan::Retry { after: ms(100) },
                "first error"
            )
            .await
            .unwrap(),
        Settle::Settled
    );
    assert_eq!(
        store
            .fail(ItemRef::new(&key, other, &token), FailPlan::DeadLetter, "x")
            .await
            .unwrap(),
        Settle::NotOwner,
        "a failed item is owned by nobody until claimed again"
    );
    let token2 = Holder::random();
    let again = claim_eventually(&*store, &key, &token2, LONG).await;
    assert_eq!((again.id, again.attempt), (other, 2));
    assert_eq!(again.last_error, "first error");
    assert_eq!(
        store
            .fail(
                ItemRef::new(&key, other, &token2),
                FailPlan::Retry {
                    after: Duration::ZERO
                },
                "second"
            )
            .await
            .unwrap(),
        Settle::Settled
    );
    let third = claim_one(&*store, &key, &token2, LONG).await;
    assert_eq!((third.id, third.attempt), (other, 3));
    assert_eq!(third.last_error, "second");
}

/// `fail` with a dead letter keeps the item, never claimed again, listed with its error.
pub async fn fail_with_dead_letter_keeps_the_item_unclaimable(h: &WorkHarness) {
    let ns = fresh_namespace();
    let store = h.open().await;
    let key = queue_key(&ns, "jobs");
    let id = added(&*store, &key, deduped(b"poison", "p-1", DAY)).await;
    let token = Holder::random();
    claim_one(&*store, &key, &token, LONG).await;
    let error = "no such customer: ü\u{1F600}";
    assert_eq!(
        store
            .fail(ItemRef::new(&key, id, &token), FailPlan::DeadLetter, error)
            .await
            .unwrap(),
        Settle::Settled
    );
    assert!(claim(&*store, &key, &token, 10, LONG).await.is_empty());
    let dead = store.dead_letters(&key, 10).await.unwrap();
    assert_eq!(
        dead,
        vec![DeadItem {
            id,
            payload: b"poison".to_vec(),
            attempts: 1,
            dedup_id: Some("p-1".to_owned()),
            error: error.to_owned(),
        }]
    );
    let s = stats_of(&*store, &key).await.unwrap();
    assert_eq!((s.dead, s.ready, s.running), (1, 0, 0), "{s:?}");
    assert_eq!(
        store
            .complete(ItemRef::new(&key, id, &token))
            .await
            .unwrap(),
        Settle::NotOwner,
        "a dead item is owned by nobody"
    );
    assert_eq!(
        store
            .enqueue(&key, &[deduped(b"again", "p-1", DAY)])
            .await
            .unwrap(),
        vec![Enqueued::Duplicate(id)]
    );
}

/// `release` returns the item at once and does not count the attempt.
pub async fn release_is_not_an_attempt(h: &WorkHarness) {
    let ns = fresh_namespace();
    let store = h.open().await;
    let key = queue_key(&ns, "jobs");
    let id = added(&*store, &key, item(b"p")).await;
    let token = Holder::random();
    assert_eq!(claim_one(&*store, &key, &token, LONG).await.attempt, 1);
    assert_eq!(
        store.release(ItemRef::new(&key, id, &token)).await.unwrap(),
        Settle::Settled
    );
    assert_eq!(
        store.release(ItemRef::new(&key, id, &token)).await.unwrap(),
        Settle::NotOwner
    );
    let again = claim_one(&*store, &key, &Holder::random(), LONG).await;
    assert_eq!((again.id, again.attempt), (id, 1));
}

/// Stats count each state of each queue under a prefix, ordered by key; queues without
/// items are not listed.
pub async fn stats_count_every_state(h: &WorkHarness) {
    let ns = fresh_namespace();
    let store = h.open().await;
    let key = queue_key(&ns, "s1");
    let token = Holder::random();
    // dead
    let a = added(&*store, &key, item(b"a")).await;
    claim_one(&*store, &key, &token, LONG).await;
    store
        .fail(ItemRef::new(&key, a, &token), FailPlan::DeadLetter, "x")
        .await
        .unwrap();
    // running
    added(&*store, &key, item(b"c")).await;
    claim_one(&*store, &key, &token, LONG).await;
    // expired
    added(&*store, &key, item(b"b")).await;
    claim_one(&*store, &key, &token, ms(30)).await;
    // ready, scheduled
    added(&*store, &key, item(b"d")).await;
    added(
        &*store,
        &key,
        NewItem {
            delay: Duration::from_secs(3600),
            ..item(b"e")
        },
    )
    .await;
    let s2 = queue_key(&ns, "s2");
    added(&*store, &s2, item(b"f")).await;
    let s3 = queue_key(&ns, "s3");
    let done = added(&*store, &s3, deduped(b"g", "g", DAY)).await;
    claim_one(&*store, &s3, &token, LONG).await;
    store
        .complete(ItemRef::new(&s3, done, &token))
        .await
        .unwrap();
    added(&*store, &queue_key(&fresh_namespace(), "s1"), item(b"h")).await;

    eventually(PATIENCE, "the short lease lapsing", || {
        let (store, key) = (&store, &key);
        async move {
            stats_of(&**store, key)
                .await
                .is_some_and(|s| s.expired == 1)
        }
    })
    .await;
    let prefix = format!("{}:queue:", ns.as_str());
    let all = store.stats(&prefix).await.unwrap();
    assert_eq!(
        all.iter().map(|s| s.key.clone()).collect::<Vec<_>>(),
        vec![key.clone(), s2.clone()],
        "ordered by key; s3 has no items; other namespaces are not listed"
    );
    let s = &all[0];
    assert_eq!(
        (s.ready, s.scheduled, s.running, s.expired, s.dead),
        (1, 1, 1, 1, 1),
        "{s:?}"
    );
    assert!(s.oldest_due.is_some());
    assert!(s.oldest_due.unwrap() < Duration::from_secs(3600));
    let only = store.stats(s2.as_str()).await.unwrap();
    assert_eq!(only.len(), 1);
    assert_eq!((only[0].ready, only[0].dead), (1, 0));
    let none = store
        .stats(&format!("{}:queue:zzz", ns.as_str()))
        .await
        .unwrap();
    assert!(none.is_empty());
}

/// Dead letters are listed oldest first, at most `limit`, only for their queue.
pub async fn dead_letters_oldest_first_up_to_the_limit(h: &WorkHarness) {
    let ns = fresh_namespace();
    let store = h.open().await;
    let key = queue_key(&ns, "jobs");
    let token = Holder::random();
    let mut ids = Vec::new();
    for i in 0..4 {
        let id = added(&*store, &key, item(format!("p{i}").as_bytes())).await;
        claim_one(&*store, &key, &token, LONG).await;
        store
            .fail(
                ItemRef::new(&key, id, &token),
                FailPlan::DeadLetter,
                &format!("e{i}"),
            )
            .await
            .unwrap();
        ids.push(id);
    }
    let first = store.dead_letters(&key, 3).await.unwrap();
    assert_eq!(
        first.iter().map(|d| d.id).collect::<Vec<_>>(),
        ids[..3].to_vec()
    );
    assert_eq!(first[1].error, "e1");
    assert_eq!(first[1].payload, b"p1");
    assert_eq!(store.dead_letters(&key, 10).await.unwrap().len(), 4);
    assert!(
        store
            .dead_letters(&queue_key(&ns, "other"), 10)
            .await
            .unwrap()
            .is_empty()
    );
}

/// Register inserts a row; with the same spec it changes nothing; with another spec it
/// replaces spec and due time. Rows are read back one by one and by prefix, and removed.
pub async fn schedule_register_inserts_or_replaces_the_spec(h: &WorkHarness) {
    let ns = fresh_namespace();
    let store = h.open().await;
    let name = schedule_key(&ns, "nightly");
    let row = store
        .register_schedule(NewSchedule::new(&name, "0 3 * * *", 1_000))
        .await
        .unwrap();
    assert_eq!(
        row,
        ScheduleRow {
            name: name.clone(),
            spec: "0 3 * * *".to_owned(),
            due_at_ms: 1_000,
            runs: 0,
            last_run: None,
        }
    );
    let same = store
        .register_schedule(NewSchedule::new(&name, "0 3 * * *", 5_000))
        .await
        .unwrap();
    assert_eq!(same, row, "same spec: nothing changes");
    let changed = store
        .register_schedule(NewSchedule::new(&name, "0 4 * * *", 7_000))
        .await
        .unwrap();
    assert_eq!(
        (changed.spec.as_str(), changed.due_at_ms),
        ("0 4 * * *", 7_000)
    );
    assert_eq!(store.schedule(&name).await.unwrap(), Some(changed.clone()));
    let other = schedule_key(&ns, "hourly");
    store
        .register_schedule(NewSchedule::new(&other, "0 * * * *", 9))
        .await
        .unwrap();
    store
        .register_schedule(NewSchedule::new(
            &schedule_key(&fresh_namespace(), "x"),
            "0 * * * *",
            9,
        ))
        .await
        .unwrap();
    let rows = store
        .schedules(&format!("{}:schedule:", ns.as_str()))
        .await
        .unwrap();
    assert_eq!(
        rows.iter().map(|r| r.name.clone()).collect::<Vec<_>>(),
        vec![other.clone(), name.clone()],
        "ordered by key, this namespace only"
    );
    assert!(store.remove_schedule(&name).await.unwrap());
    assert!(!store.remove_schedule(&name).await.unwrap());
    assert_eq!(store.schedule(&name).await.unwrap(), None);
}

/// Of many concurrent advances of one due tick, over several connections, exactly one
/// claims it; the row then names the next tick, one more run and the winner.
pub async fn schedule_advance_exactly_one_of_many(h: &WorkHarness) {
    let ns = fresh_namespace();
    let stores = [
        h.open().await,
        h.open().await,
        h.open().await,
        h.open().await,
    ];
    let name = schedule_key(&ns, "tick");
    let now = stores[0].now_ms().await.unwrap();
    let due = now - 1_000;
    stores[0]
        .register_schedule(NewSchedule::new(&name, "* * * * *", due))
        .await
        .unwrap();
    let start = Arc::new(Barrier::new(16));
    let tasks: Vec<_> = (0..16)
        .map(|i| {
            let (store, name, start) = (stores[i % 4].clone(), name.clone(), start.clone());
            tokio::spawn(async move {
                let holder = Holder::new(format!("replica-{i}")).unwrap();
                start.wait().await;
                let answer = store
                    .advance_schedule(&name, minute_tick(due, &holder))
                    .await
                    .expect("advance");
                (holder, answer)
            })
        })
        .collect();
    let mut winners = Vec::new();
    for task in tasks {
        let (holder, answer) = task.await.expect("advancer");
        if answer == Advance::Claimed {
            winners.push(holder);
        }
    }
    assert_eq!(winners.len(), 1, "exactly one advance claims the tick");
    let row = stores[1].schedule(&name).await.unwrap().unwrap();
    assert_eq!((row.due_at_ms, row.runs), (due + 60_000, 1));
    let (holder, at) = row.last_run.expect("the run is recorded");
    assert_eq!(holder, winners[0]);
    assert!((at - now).abs() < 60_000, "claimed at {at}, now {now}");

    // A skipped tick (ran = false) moves the row without recording a run.
    let skipped = schedule_key(&ns, "skipped");
    stores[0]
        .register_schedule(NewSchedule::new(&skipped, "* * * * *", due))
        .await
        .unwrap();
    assert_eq!(
        stores[2]
            .advance_schedule(
                &skipped,
                TickClaim {
                    expected_due_ms: due,
                    next_due_ms: due + 120_000,
                    holder: &Holder::random(),
                    ran: false
                }
            )
            .await
            .unwrap(),
        Advance::Claimed
    );
    let row = stores[3].schedule(&skipped).await.unwrap().unwrap();
    assert_eq!(
        (row.due_at_ms, row.runs, row.last_run),
        (due + 120_000, 0, None)
    );
}

/// An advance of a tick that is not due yet on the store's clock, or that the row has moved
/// past, or of a row that does not exist, is `Lost` and changes nothing.
pub async fn schedule_advance_not_due_or_moved_is_lost(h: &WorkHarness) {
    let ns = fresh_namespace();
    let store = h.open().await;
    let name = schedule_key(&ns, "tick");
    let now = store.now_ms().await.unwrap();
    let future = now + 600_000;
    store
        .register_schedule(NewSchedule::new(&name, "* * * * *", future))
        .await
        .unwrap();
    let holder = Holder::random();
    assert_eq!(
        store
            .advance_schedule(&name, minute_tick(future, &holder))
            .await
            .unwrap(),
        Advance::Lost,
        "not due yet"
    );
    assert_eq!(
        store
            .advance_schedule(
                &name,
                TickClaim {
                    expected_due_ms: now - 60_000,
                    next_due_ms: now,
                    holder: &holder,
                    ran: true
                }
            )
            .await
            .unwrap(),
        Advance::Lost,
        "the row is not at that tick"
    );
    assert_eq!(
        store
            .advance_schedule(
                &schedule_key(&ns, "absent"),
                TickClaim {
                    expected_due_ms: now - 1,
                    next_due_ms: now,
                    holder: &holder,
                    ran: true
                }
            )
            .await
            .unwrap(),
        Advance::Lost
    );
    let row = store.schedule(&name).await.unwrap().unwrap();
    assert_eq!((row.due_at_ms, row.runs, row.last_run), (future, 0, None));
}

/// `now_ms` is the wall clock in unix milliseconds (the store runs on this machine in the
/// rules, so it agrees with ours within a minute) and does not go back between calls.
pub async fn schedule_now_is_the_wall_clock(h: &WorkHarness) {
    let store = h.open().await;
    let ours = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let first = store.now_ms().await.unwrap();
    assert!((first - ours).abs() < 60_000, "store {first}, ours {ours}");
    sleep(ms(20)).await;
    let second = store.now_ms().await.unwrap();
    assert!(second >= first + 10, "{first} then {second}");
}

async fn claimed(
    store: &dyn MigrationStore,
    set: &StoreKey,
    name: &str,
    writer: &Holder,
    lease: Duration,
) -> (u32, Option<MigrationState>) {
    match store
        .claim_migration(Writer::new(set, name, writer), ttl(lease))
        .await
        .expect("claim_migration")
    {
        MigrationClaim::Claimed { attempt, previous } => (attempt, previous),
        other => panic!("expected {writer} to claim {name}, got {other:?}"),
    }
}

async fn record(store: &dyn MigrationStore, set: &StoreKey, name: &str) -> MigrationRecord {
    store
        .migrations(set)
        .await
        .expect("migrations")
        .into_iter()
        .find(|r| r.name == name)
        .unwrap_or_else(|| panic!("no record of {name}"))
}

/// The claim is one compare-and-set over every state: absent → claimed (attempt 1); another
/// writer's live pending claim → busy with its owner; completed → completed; failed, rolled
/// back, or pending with a lapsed lease → taken over (attempt + 1, the previous state
/// named). A writer's own pending claim: see
/// [`migration_reclaim_by_its_own_writer_takes_it_over`].
pub async fn migration_claim_is_a_compare_and_set(h: &WorkHarness) {
    let ns = fresh_namespace();
    let store = h.open().await;
    let set = migration_key(&ns, "app");
    let (a, b) = (
        Holder::new("writer-a").unwrap(),
        Holder::new("writer-b").unwrap(),
    );
    assert_eq!(claimed(&*store, &set, "001", &a, LONG).await, (1, None));
    match store
        .claim_migration(Writer::new(&set, "001", &b), ttl(LONG))
        .await
        .unwrap()
    {
        MigrationClaim::Busy { by, remaining } => {
            assert_eq!(by, a);
            assert!(remaining <= LONG && remaining > LONG / 2, "{remaining:?}");
        }
        other => panic!("a live claim is busy, got {other:?}"),
    }
    assert_eq!(
        store
            .finish_migration(Writer::new(&set, "001", &a), MigrationEnd::Completed)
            .await
            .unwrap(),
        Settle::Settled
    );
    assert_eq!(
        store
            .claim_migration(Writer::new(&set, "001", &b), ttl(LONG))
            .await
            .unwrap(),
        MigrationClaim::Completed
    );

    for (name, end) in [
        ("002", MigrationEnd::Failed("it broke")),
        ("003", MigrationEnd::RolledBack("it broke")),
    ] {
        let state = end.state();
        claimed(&*store, &set, name, &a, LONG).await;
        store
            .finish_migration(Writer::new(&set, name, &a), end)
            .await
            .unwrap();
        let r = record(&*store, &set, name).await;
        assert_eq!((r.state, r.error.as_str()), (state, "it broke"));
        assert_eq!(r.lease_remaining, Duration::ZERO);
        assert_eq!(
            claimed(&*store, &set, name, &b, LONG).await,
            (2, Some(state))
        );
        let r = record(&*store, &set, name).await;
        assert_eq!(
            (r.state, r.claimed_by.clone(), r.attempt),
            (MigrationState::Pending, b.clone(), 2)
        );
    }

    claimed(&*store, &set, "004", &a, ms(50)).await;
    let start = tokio::time::Instant::now();
    loop {
        match store
            .claim_migration(Writer::new(&set, "004", &b), ttl(LONG))
            .await
            .unwrap()
        {
            MigrationClaim::Claimed { attempt, previous } => {
                assert_eq!((attempt, previous), (2, Some(MigrationState::Pending)));
                break;
            }
            MigrationClaim::Busy { by, .. } => assert_eq!(by, a),
            other => panic!("{other:?}"),
        }
        assert!(start.elapsed() < PATIENCE, "the 50ms lease never lapsed");
        sleep(ms(10)).await;
    }
    let records = store.migrations(&set).await.unwrap();
    assert_eq!(
        records.iter().map(|r| r.name.as_str()).collect::<Vec<_>>(),
        vec!["001", "002", "003", "004"],
        "ordered by name"
    );
    assert_eq!(records[0].state, MigrationState::Completed);
    assert_eq!(records[3].claimed_by, b);
    assert!(
        store
            .migrations(&migration_key(&ns, "other"))
            .await
            .unwrap()
            .is_empty()
    );
}

/// Of many concurrent claims of an absent record, over several connections, exactly one
/// wins.
pub async fn migration_claim_exactly_one_of_many(h: &WorkHarness) {
    let ns = fresh_namespace();
    let stores = [
        h.open().await,
        h.open().await,
        h.open().await,
        h.open().await,
    ];
    let set = migration_key(&ns, "app");
    let start = Arc::new(Barrier::new(16));
    let tasks: Vec<_> = (0..16)
        .map(|i| {
            let (store, set, start) = (stores[i % 4].clone(), set.clone(), start.clone());
            tokio::spawn(async move {
                start.wait().await;
                store
                    .claim_migration(Writer::new(&set, "001", &Holder::random()), ttl(LONG))
                    .await
                    .expect("claim")
            })
        })
        .collect();
    let mut won = 0;
    for task in tasks {
        match task.await.expect("claimer") {
            MigrationClaim::Claimed { attempt, previous } => {
                assert_eq!((attempt, previous), (1, None));
                won += 1;
            }
            MigrationClaim::Busy { .. } => {}
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(won, 1);
}

/// A writer that claims its own pending record again, its lease live or not, takes it over
/// at once (attempt + 1, previous `Pending`, the lease restarted): it gave up its earlier
/// claim, as a migration run retrying after a store fault does, and must not wait out its
/// own lease. Another writer's live claim stays busy for it, and other writers still find
/// the record busy.
pub async fn migration_reclaim_by_its_own_writer_takes_it_over(h: &WorkHarness) {
    let ns = fresh_namespace();
    let store = h.open().await;
    let set = migration_key(&ns, "app");
    let (a, b) = (
        Holder::new("writer-a").unwrap(),
        Holder::new("writer-b").unwrap(),
    );
    claimed(&*store, &set, "001", &a, LONG).await;
    assert_eq!(
        claimed(&*store, &set, "001", &a, LONG).await,
        (2, Some(MigrationState::Pending)),
        "its own live claim is taken over at once"
    );
    let r = record(&*store, &set, "001").await;
    assert_eq!(
        (r.state, r.claimed_by.clone(), r.attempt),
        (MigrationState::Pending, a.clone(), 2)
    );
    assert!(r.lease_remaining > LONG / 2, "{:?}", r.lease_remaining);
    match store
        .claim_migration(Writer::new(&set, "001", &b), ttl(LONG))
        .await
        .unwrap()
    {
        MigrationClaim::Busy { by, remaining } => {
            assert_eq!(by, a);
            assert!(remaining > LONG / 2, "{remaining:?}");
        }
        other => panic!("still busy for another writer, got {other:?}"),
    }
    assert_eq!(
        store
            .heartbeat_migration(Writer::new(&set, "001", &a), ttl(LONG))
            .await
            .unwrap(),
        Renewal::Renewed
    );
    assert_eq!(
        store
            .finish_migration(Writer::new(&set, "001", &a), MigrationEnd::Completed)
            .await
            .unwrap(),
        Settle::Settled
    );
    assert_eq!(
        store
            .claim_migration(Writer::new(&set, "001", &a), ttl(LONG))
            .await
            .unwrap(),
        MigrationClaim::Completed,
        "a completed record stays completed for its writer too"
    );

    // A lapsed claim of its own is taken over the same way.
    claimed(&*store, &set, "002", &a, ms(30)).await;
    eventually(PATIENCE, "the lease lapsing", || {
        let (store, set) = (&store, &set);
        async move { record(&**store, set, "002").await.lease_remaining.is_zero() }
    })
    .await;
    assert_eq!(
        claimed(&*store, &set, "002", &a, LONG).await,
        (2, Some(MigrationState::Pending))
    );

    // Its writer has no say over another writer's live claim.
    claimed(&*store, &set, "003", &b, LONG).await;
    match store
        .claim_migration(Writer::new(&set, "003", &a), ttl(LONG))
        .await
        .unwrap()
    {
        MigrationClaim::Busy { by, .. } => assert_eq!(by, b),
        other => panic!("another writer's live claim is busy, got {other:?}"),
    }
    assert_eq!(
        claimed(&*store, &set, "003", &b, LONG).await,
        (2, Some(MigrationState::Pending)),
        "and that writer takes its own over"
    );
}

/// Heartbeat and finish act only on a pending record owned by the writer; a zombie whose
/// record was taken over changes nothing.
pub async fn migration_heartbeat_and_finish_are_scoped_to_the_writer(h: &WorkHarness) {
    let ns = fresh_namespace();
    let store = h.open().await;
    let set = migration_key(&ns, "app");
    let (a, b) = (Holder::random(), Holder::random());
    claimed(&*store, &set, "001", &a, ms(200)).await;
    assert_eq!(
        store
            .heartbeat_migration(Writer::new(&set, "001", &b), ttl(LONG))
            .await
            .unwrap(),
        Renewal::NotHeld
    );
    assert_eq!(
        store
            .finish_migration(Writer::new(&set, "001", &b), MigrationEnd::Completed)
            .await
            .unwrap(),
        Settle::NotOwner
    );
    assert_eq!(
        store
            .heartbeat_migration(Writer::new(&set, "001", &a), ttl(LONG))
            .await
            .unwrap(),
        Renewal::Renewed
    );
    sleep(ms(400)).await;
    assert!(
        matches!(
            store
                .claim_migration(Writer::new(&set, "001", &b), ttl(LONG))
                .await
                .unwrap(),
            MigrationClaim::Busy { .. }
        ),
        "the heartbeat restarted the lease"
    );
    assert!(record(&*store, &set, "001").await.lease_remaining > LONG / 2);
    assert_eq!(
        store
            .heartbeat_migration(Writer::new(&set, "absent", &a), ttl(LONG))
            .await
            .unwrap(),
        Renewal::NotHeld
    );

    // A zombie: its lease lapses, another writer takes over.
    claimed(&*store, &set, "002", &a, ms(50)).await;
    let start = tokio::time::Instant::now();
    while !matches!(
        store
            .claim_migration(Writer::new(&set, "002", &b), ttl(LONG))
            .await
            .unwrap(),
        MigrationClaim::Claimed { .. }
    ) {
        assert!(start.elapsed() < PATIENCE, "the 50ms lease never lapsed");
        sleep(ms(10)).await;
    }
    assert_eq!(
        store
            .heartbeat_migration(Writer::new(&set, "002", &a), ttl(LONG))
            .await
            .unwrap(),
        Renewal::NotHeld
    );
    assert_eq!(
        store
            .finish_migration(Writer::new(&set, "002", &a), MigrationEnd::Completed)
            .await
            .unwrap(),
        Settle::NotOwner
    );
    let r = record(&*store, &set, "002").await;
    assert_eq!(
        (r.state, r.claimed_by.clone()),
        (MigrationState::Pending, b.clone())
    );
    assert_eq!(
        store
            .finish_migration(
                Writer::new(&set, "002", &b),
                MigrationEnd::RolledBack("undone")
            )
            .await
            .unwrap(),
        Settle::Settled
    );
    // Finished records have no owner to act for.
    assert_eq!(
        store
            .heartbeat_migration(Writer::new(&set, "002", &b), ttl(LONG))
            .await
            .unwrap(),
        Renewal::NotHeld
    );
    assert_eq!(
        store
            .finish_migration(Writer::new(&set, "002", &b), MigrationEnd::Completed)
            .await
            .unwrap(),
        Settle::NotOwner
    );
    let r = record(&*store, &set, "002").await;
    assert_eq!(
        (r.state, r.error.as_str()),
        (MigrationState::RolledBack, "undone")
    );
}

/// Ownership of a record ends at a takeover, not when the lease lapses: a writer whose
/// lease lapsed may still finish while nobody took over.
pub async fn migration_late_finish_without_a_takeover_is_accepted(h: &WorkHarness) {
    let ns = fresh_namespace();
    let store = h.open().await;
    let set = migration_key(&ns, "app");
    let a = Holder::random();
    claimed(&*store, &set, "001", &a, ms(30)).await;
    eventually(PATIENCE, "the lease lapsing", || {
        let (store, set) = (&store, &set);
        async move { record(&**store, set, "001").await.lease_remaining.is_zero() }
    })
    .await;
    assert_eq!(
        store
            .finish_migration(Writer::new(&set, "001", &a), MigrationEnd::Completed)
            .await
            .unwrap(),
        Settle::Settled
    );
    assert_eq!(
        record(&*store, &set, "001").await.state,
        MigrationState::Completed
    );
}

/// A store fault is an `Unavailable` error from every atom: never an empty claim, a
/// duplicate, `NotOwner` or `Lost`.
pub async fn store_faults_are_errors_not_answers(h: &WorkHarness) {
    let ns = fresh_namespace();
    let faulty = Arc::new(FaultyWorkStore::new(h.open().await));
    let store: &dyn WorkStore = &*faulty;
    let key = queue_key(&ns, "jobs");
    let id = added(store, &key, item(b"p")).await;
    let token = Holder::random();
    claim_one(store, &key, &token, LONG).await;
    let set = migration_key(&ns, "app");
    let writer = Holder::random();
    claimed(store, &set, "001", &writer, LONG).await;
    let name = schedule_key(&ns, "s");
    store
        .register_schedule(NewSchedule::new(&name, "* * * * *", 0))
        .await
        .unwrap();

    faulty.set_failing(true);
    let unavailable = |e: crate::Error| {
        assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    };
    unavailable(store.enqueue(&key, &[item(b"q")]).await.unwrap_err());
    unavailable(
        store
            .claim(
                &key,
                ClaimRequest {
                    token: &token,
                    batch: 1,
                    lease: ttl(LONG),
                },
            )
            .await
            .unwrap_err(),
    );
    unavailable(
        store
            .complete(ItemRef::new(&key, id, &token))
            .await
            .unwrap_err(),
    );
    unavailable(
        store
            .fail(ItemRef::new(&key, id, &token), FailPlan::DeadLetter, "")
            .await
            .unwrap_err(),
    );
    unavailable(
        store
            .extend(ItemRef::new(&key, id, &token), ttl(LONG))
            .await
            .unwrap_err(),
    );
    unavailable(
        store
            .release(ItemRef::new(&key, id, &token))
            .await
            .unwrap_err(),
    );
    unavailable(store.stats("").await.unwrap_err());
    unavailable(store.dead_letters(&key, 1).await.unwrap_err());
    unavailable(store.now_ms().await.unwrap_err());
    unavailable(
        store
            .register_schedule(NewSchedule::new(&name, "* * * * *", 0))
            .await
            .unwrap_err(),
    );
    unavailable(
        store
            .advance_schedule(
                &name,
                TickClaim {
                    expected_due_ms: 0,
                    next_due_ms: 1,
                    holder: &writer,
                    ran: true,
                },
            )
            .await
            .unwrap_err(),
    );
    unavailable(store.schedule(&name).await.unwrap_err());
    unavailable(store.schedules("").await.unwrap_err());
    unavailable(store.remove_schedule(&name).await.unwrap_err());
    unavailable(
        store
            .claim_migration(Writer::new(&set, "001", &writer), ttl(LONG))
            .await
            .unwrap_err(),
    );
    unavailable(
        store
            .heartbeat_migration(Writer::new(&set, "001", &writer), ttl(LONG))
            .await
            .unwrap_err(),
    );
    unavailable(
        store
            .finish_migration(Writer::new(&set, "001", &writer), MigrationEnd::Completed)
            .await
            .unwrap_err(),
    );
    unavailable(store.migrations(&set).await.unwrap_err());
    faulty.set_failing(false);
    assert_eq!(
        store
            .complete(ItemRef::new(&key, id, &token))
            .await
            .unwrap(),
        Settle::Settled,
        "the faults changed nothing"
    );
    assert_eq!(
        store
            .finish_migration(Writer::new(&set, "001", &writer), MigrationEnd::Completed)
            .await
            .unwrap(),
        Settle::Settled
    );
}

/// The claim of the tick due at `due` of an every-minute schedule, run by `holder`: the tick
/// the schedule rules advance most.
pub fn minute_tick(due: i64, holder: &Holder) -> TickClaim<'_> {
    TickClaim {
        expected_due_ms: due,
        next_due_ms: due + 60_000,
        holder,
        ran: true,
    }
}

/// A work store wrapper for the rules about misbehaving stores: counts calls and, while
/// failing, answers every call with `Unavailable` without reaching the store.
pub type FaultyWorkStore = Faulty<dyn WorkStore>;

#[async_trait]
impl QueueStore for FaultyWorkStore {
    async fn enqueue(&self, queue: &StoreKey, items: &[NewItem<'_>]) -> Result<Vec<Enqueued>> {
        self.enter()?;
        self.inner.enqueue(queue, items).await
    }

    async fn claim(&self, queue: &StoreKey, request: ClaimRequest<'_>) -> Result<Vec<ClaimedItem>> {
        self.enter()?;
        self.inner.claim(queue, request).await
    }

    async fn complete(&self, item: ItemRef<'_>) -> Result<Settle> {
        self.enter()?;
        self.inner.complete(item).await
    }

    async fn fail(&self, item: ItemRef<'_>, plan: FailPlan, error: &str) -> Result<Settle> {
        self.enter()?;
        self.inner.fail(item, plan, error).await
    }

    async fn extend(&self, item: ItemRef<'_>, lease: Ttl) -> Result<Renewal> {
        self.enter()?;
        self.inner.extend(item, lease).await
    }

    async fn release(&self, item: ItemRef<'_>) -> Result<Settle> {
        self.enter()?;
        self.inner.release(item).await
    }

    async fn stats(&self, prefix: &str) -> Result<Vec<QueueStats>> {
        self.enter()?;
        self.inner.stats(prefix).await
    }

    async fn dead_letters(&self, queue: &StoreKey, limit: u32) -> Result<Vec<DeadItem>> {
        self.enter()?;
        self.inner.dead_letters(queue, limit).await
    }
}

#[async_trait]
impl ScheduleStore for FaultyWorkStore {
    async fn now_ms(&self) -> Result<i64> {
        self.enter()?;
        self.inner.now_ms().await
    }

    async fn register_schedule(&self, schedule: NewSchedule<'_>) -> Result<ScheduleRow> {
        self.enter()?;
        self.inner.register_schedule(schedule).await
    }

    async fn advance_schedule(&self, name: &StoreKey, tick: TickClaim<'_>) -> Result<Advance> {
        self.enter()?;
        self.inner.advance_schedule(name, tick).await
    }

    async fn schedule(&self, name: &StoreKey) -> Result<Option<ScheduleRow>> {
        self.enter()?;
        self.inner.schedule(name).await
    }

    async fn schedules(&self, prefix: &str) -> Result<Vec<ScheduleRow>> {
        self.enter()?;
        self.inner.schedules(prefix).await
    }

    async fn remove_schedule(&self, name: &StoreKey) -> Result<bool> {
        self.enter()?;
        self.inner.remove_schedule(name).await
    }
}

#[async_trait]
impl MigrationStore for FaultyWorkStore {
    async fn claim_migration(&self, writer: Writer<'_>, lease: Ttl) -> Result<MigrationClaim> {
        self.enter()?;
        self.inner.claim_migration(writer, lease).await
    }

    async fn heartbeat_migration(&self, writer: Writer<'_>, lease: Ttl) -> Result<Renewal> {
        self.enter()?;
        self.inner.heartbeat_migration(writer, lease).await
    }

    async fn finish_migration(&self, writer: Writer<'_>, end: MigrationEnd<'_>) -> Result<Settle> {
        self.enter()?;
        self.inner.finish_migration(writer, end).await
    }

    async fn migrations(&self, set: &StoreKey) -> Result<Vec<MigrationRecord>> {
        self.enter()?;
        self.inner.migrations(set).await
    }
}
