//! Claimable work on the SQLite store: the conformance rules (module `conformance`, every
//! replica a new store on the same file), every clause of the `baton_core::work::store`
//! contract checked directly against the store, the races that need several stores or OS
//! processes on one file (32 claimers over two opens; 4 processes), and what survives
//! re-opening.
//!
//! The child processes are this test binary run again with a role (see
//! `baton_testkit::process`); their test is `#[ignore]`d in ordinary runs.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use baton_core::store::Renewal;
use baton_core::work::conformance::minute_tick;
use baton_core::work::store::{
    Advance, ClaimRequest, ClaimedItem, Enqueued, FailPlan, ItemId, ItemRef, MigrationClaim,
    MigrationEnd, MigrationRecord, MigrationState, NewItem, NewSchedule, Settle, TickClaim, Writer,
};
use baton_core::work::{MigrationStore, QueueStore, ScheduleStore};
use baton_core::{ErrorKind, Holder, Key, KeyKind, Namespace, StoreKey, Ttl};
use baton_sqlite::SqliteStore;
use baton_testkit::process::{self, ChildTest};
use baton_testkit::process::{child_runtime, parent_env};

mod common;
use common::{open, open_impatient, write_lock};

/// The conformance rules, each on a file of its own; every `open` is a new store on it, as
/// another replica's would be.
mod conformance {
    use std::path::PathBuf;
    use std::sync::Arc;

    use async_trait::async_trait;
    use baton_core::conformance::Opens;
    use baton_core::work::WorkStore;

    struct SqliteWork {
        path: PathBuf,
        _dir: tempfile::TempDir,
    }

    async fn sqlite() -> SqliteWork {
        let dir = tempfile::tempdir().expect("temp dir");
        SqliteWork {
            path: dir.path().join("baton.db"),
            _dir: dir,
        }
    }

    #[async_trait]
    impl Opens<dyn WorkStore> for SqliteWork {
        async fn open(&self) -> Arc<dyn WorkStore> {
            Arc::new(super::open(&self.path).await)
        }
    }

    baton_core::work_conformance_tests!(sqlite());
}

const LONG: Duration = Duration::from_secs(600);
const CHILD_TIMEOUT: Duration = Duration::from_secs(300);

fn ttl(d: Duration) -> Ttl {
    Ttl::new(d).unwrap()
}

fn rand_u64() -> u64 {
    use std::hash::{BuildHasher, RandomState};
    RandomState::new().hash_one(std::time::Instant::now())
}

fn namespace() -> Namespace {
    Namespace::new(format!("t{:016x}", rand_u64())).unwrap()
}

fn qkey(ns: &Namespace, kind: KeyKind, name: &str) -> StoreKey {
    ns.qualify(kind, &Key::new(name).unwrap())
}

/// A store on a fresh file, and a queue key in a fresh namespace.
struct Fixture {
    store: SqliteStore,
    path: PathBuf,
    ns: Namespace,
    q: StoreKey,
    _dir: tempfile::TempDir,
}

async fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("baton.db");
    let ns = namespace();
    Fixture {
        store: open(&path).await,
        q: qkey(&ns, KeyKind::Queue, "jobs"),
        path,
        ns,
        _dir: dir,
    }
}

impl Fixture {
    fn migrations(&self) -> Migrations<'_> {
        Migrations::schema(&self.store, &self.ns)
    }
}

/// The migration set `schema` of a namespace on one store, the store's answers unwrapped.
struct Migrations<'a> {
    store: &'a SqliteStore,
    set: StoreKey,
}

impl Migrations<'_> {
    fn schema<'a>(store: &'a SqliteStore, ns: &Namespace) -> Migrations<'a> {
        Migrations {
            store,
            set: qkey(ns, KeyKind::Migration, "schema"),
        }
    }

    async fn claim(&self, name: &str, writer: &Holder, lease: Duration) -> MigrationClaim {
        self.store
            .claim_migration(Writer::new(&self.set, name, writer), ttl(lease))
            .await
            .unwrap()
    }

    /// A heartbeat that asks for another [`LONG`] lease.
    async fn heartbeat(&self, name: &str, writer: &Holder) -> Renewal {
        self.store
            .heartbeat_migration(Writer::new(&self.set, name, writer), ttl(LONG))
            .await
            .unwrap()
    }

    async fn finish(&self, name: &str, writer: &Holder, end: MigrationEnd<'_>) -> Settle {
        self.store
            .finish_migration(Writer::new(&self.set, name, writer), end)
            .await
            .unwrap()
    }

    async fn records(&self) -> Vec<MigrationRecord> {
        self.store.migrations(&self.set).await.unwrap()
    }
}

fn item(payload: &[u8]) -> NewItem<'_> {
    NewItem {
        payload,
        dedup: None,
        delay: Duration::ZERO,
        max_attempts: 3,
    }
}

fn deduped<'a>(payload: &'a [u8], id: &'a str, window: Duration) -> NewItem<'a> {
    NewItem {
        dedup: Some((id, ttl(window))),
        ..item(payload)
    }
}

fn added(answer: Enqueued) -> ItemId {
    match answer {
        Enqueued::Added(id) => id,
        other => panic!("expected the item to be added, got {other:?}"),
    }
}

async fn enqueue_one(store: &SqliteStore, q: &StoreKey, new: NewItem<'_>) -> ItemId {
    added(store.enqueue(q, &[new]).await.unwrap()[0])
}

async fn claim(
    store: &SqliteStore,
    q: &StoreKey,
    token: &Holder,
    batch: u32,
    lease: Duration,
) -> Vec<ClaimedItem> {
    store
        .claim(
            q,
            ClaimRequest {
                token,
                batch,
                lease: ttl(lease),
            },
        )
        .await
        .unwrap()
}

fn claimed_ids(items: &[ClaimedItem]) -> Vec<ItemId> {
    items.iter().map(|i| i.id).collect()
}

/// Waits (polling, generously) until a claim with `token` returns something.
async fn claim_eventually(store: &SqliteStore, q: &StoreKey, token: &Holder) -> Vec<ClaimedItem> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let got = claim(store, q, token, 10, LONG).await;
        if !got.is_empty() {
            return got;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "nothing became claimable within 30 s"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn wall_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

// ---------------------------------------------------------------------------------------
// Queues
// ---------------------------------------------------------------------------------------

#[tokio::test]
async fn enqueue_assigns_increasing_ids_and_claim_hands_out_the_items() {
    let f = fixture().await;
    let answers = f
        .store
        .enqueue(&f.q, &[item(b"a"), item(b"b"), item(b"c")])
        .await
        .unwrap();
    let ids: Vec<ItemId> = answers.into_iter().map(added).collect();
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "{ids:?}");
    let later = enqueue_one(&f.store, &f.q, item(b"d")).await;
    assert!(later > ids[2]);

    let token = Holder::random();
    let got = claim(&f.store, &f.q, &token, 2, LONG).await;
    assert_eq!(
        claimed_ids(&got),
        vec![ids[0], ids[1]],
        "oldest first, batch-limited"
    );
    assert_eq!(got[0].payload, b"a");
    assert_eq!(
        (
            got[0].attempt,
            got[0].max_attempts,
            got[0].dedup_id.as_deref()
        ),
        (1, 3, None)
    );
    assert_eq!(got[0].last_error, "");
    let rest = claim(&f.store, &f.q, &token, 10, LONG).await;
    assert_eq!(claimed_ids(&rest), vec![ids[2], later]);
    assert!(claim(&f.store, &f.q, &token, 10, LONG).await.is_empty());
}

#[tokio::test]
async fn an_empty_or_unknown_queue_answers_nothing_and_queues_are_separate() {
    let f = fixture().await;
    let token = Holder::random();
    assert!(claim(&f.store, &f.q, &token, 5, LONG).await.is_empty());
    let other = qkey(&f.ns, KeyKind::Queue, "other");
    enqueue_one(&f.store, &other, item(b"x")).await;
    assert!(claim(&f.store, &f.q, &token, 5, LONG).await.is_empty());
    assert_eq!(claim(&f.store, &other, &token, 5, LONG).await.len(), 1);
}

#[tokio::test]
async fn claims_take_the_oldest_run_at_first_then_the_lowest_id() {
    let f = fixture().await;
    let late = enqueue_one(
        &f.store,
        &f.q,
        NewItem {
            delay: Duration::from_millis(300),
            ..item(b"late")
        },
    )
    .await;
    // One batch: one clock read, so equal run_at; the id decides.
    let batch: Vec<ItemId> = f
        .store
        .enqueue(&f.q, &[item(b"1"), item(b"2"), item(b"3")])
        .await
        .unwrap()
        .into_iter()
        .map(added)
        .collect();
    tokio::time::sleep(Duration::from_millis(350)).await;
    let newest = enqueue_one(&f.store, &f.q, item(b"new")).await;
    let token = Holder::random();
    let got = claim(&f.store, &f.q, &token, 10, LONG).await;
    assert_eq!(
        claimed_ids(&got),
        vec![batch[0], batch[1], batch[2], late, newest],
        "run_at order, then id"
    );
}

#[tokio::test]
async fn delayed_items_wait_for_their_run_at() {
    let f = fixture().await;
    let id = enqueue_one(
        &f.store,
        &f.q,
        NewItem {
            delay: Duration::from_millis(400),
            ..item(b"later")
        },
    )
    .await;
    let token = Holder::random();
    assert!(claim(&f.store, &f.q, &token, 5, LONG).await.is_empty());
    let stats = f.store.stats(f.q.as_str()).await.unwrap();
    assert_eq!((stats[0].scheduled, stats[0].ready), (1, 0));
    let got = claim_eventually(&f.store, &f.q, &token).await;
    assert_eq!(claimed_ids(&got), vec![id]);
}

#[tokio::test]
async fn complete_deletes_only_for_the_owner() {
    let f = fixture().await;
    let id = enqueue_one(&f.store, &f.q, item(b"x")).await;
    let token = Holder::random();
    claim(&f.store, &f.q, &token, 1, LONG).await;
    let stranger = Holder::random();
    assert_eq!(
        f.store
            .complete(ItemRef::new(&f.q, id, &stranger))
            .await
            .unwrap(),
        Settle::NotOwner
    );
    let other_queue = qkey(&f.ns, KeyKind::Queue, "other");
    assert_eq!(
        f.store
            .complete(ItemRef::new(&other_queue, id, &token))
            .await
            .unwrap(),
        Settle::NotOwner,
        "the item is in another queue"
    );
    assert_eq!(
        f.store
            .complete(ItemRef::new(&f.q, id, &token))
            .await
            .unwrap(),
        Settle::Settled
    );
    assert_eq!(
        f.store
            .complete(ItemRef::new(&f.q, id, &token))
            .await
            .unwrap(),
        Settle::NotOwner,
        "gone"
    );
    assert!(f.store.stats(f.q.as_str()).await.unwrap().is_empty());
    // A ready item is owned by nobody.
    let ready = enqueue_one(&f.store, &f.q, item(b"y")).await;
    assert_eq!(
        f.store
            .complete(ItemRef::new(&f.q, ready, &token))
            .await
            .unwrap(),
        Settle::NotOwner
    );
}

/// A lapsed lease returns the item; the zombie's token then owns nothing.
#[tokio::test]
async fn a_lapsed_lease_returns_the_item_and_the_zombie_is_not_owner() {
    let f = fixture().await;
    let id = enqueue_one(&f.store, &f.q, item(b"x")).await;
    let zombie = Holder::random();
    let first = claim(&f.store, &f.q, &zombie, 1, Duration::from_millis(200)).await;
    assert_eq!(first[0].attempt, 1);
    let taker = Holder::random();
    assert!(
        claim(&f.store, &f.q, &taker, 1, LONG).await.is_empty(),
        "live lease"
    );
    let second = claim_eventually(&f.store, &f.q, &taker).await;
    assert_eq!((second[0].id, second[0].attempt), (id, 2));
    for answer in [
        f.store
            .complete(ItemRef::new(&f.q, id, &zombie))
            .await
            .unwrap(),
        f.store
            .fail(
                ItemRef::new(&f.q, id, &zombie),
                FailPlan::DeadLetter,
                "zombie",
            )
            .await
            .unwrap(),
        f.store
            .release(ItemRef::new(&f.q, id, &zombie))
            .await
            .unwrap(),
    ] {
        assert_eq!(answer, Settle::NotOwner);
    }
    assert_eq!(
        f.store
            .extend(ItemRef::new(&f.q, id, &zombie), ttl(LONG))
            .await
            .unwrap(),
        Renewal::NotHeld
    );
    let stats = &f.store.stats(f.q.as_str()).await.unwrap()[0];
    assert_eq!(
        (stats.running, stats.dead),
        (1, 0),
        "the zombie changed nothing"
    );
    assert_eq!(
        f.store
            .complete(ItemRef::new(&f.q, id, &taker))
            .await
            .unwrap(),
        Settle::Settled
    );
}

/// Ownership ends at the next claim, not when the lease lapses.
#[tokio::test]
async fn a_late_complete_without_a_claim_in_between_is_accepted() {
    let f = fixture().await;
    let id = enqueue_one(&f.store, &f.q, item(b"x")).await;
    let token = Holder::random();
    claim(&f.store, &f.q, &token, 1, Duration::from_millis(50)).await;
    tokio::time::sleep(Duration::from_millis(120)).await;
    let stats = &f.store.stats(f.q.as_str()).await.unwrap()[0];
    assert_eq!((stats.running, stats.expired), (0, 1));
    assert!(stats.oldest_due.unwrap() > Duration::ZERO);
    assert_eq!(
        f.store
            .extend(ItemRef::new(&f.q, id, &token), ttl(LONG))
            .await
            .unwrap(),
        Renewal::Renewed,
        "a lapsed lease of the last claimer can be extended"
    );
    assert!(
        claim(&f.store, &f.q, &Holder::random(), 1, LONG)
            .await
            .is_empty()
    );
    assert_eq!(
        f.store
            .complete(ItemRef::new(&f.q, id, &token))
            .await
            .unwrap(),
        Settle::Settled
    );
}

#[tokio::test]
async fn extend_restarts_the_lease() {
    let f = fixture().await;
    let id = enqueue_one(&f.store, &f.q, item(b"x")).await;
    let token = Holder::random();
    claim(&f.store, &f.q, &token, 1, Duration::from_millis(300)).await;
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(
            f.store
                .extend(
                    ItemRef::new(&f.q, id, &token),
                    ttl(Duration::from_millis(300))
                )
                .await
                .unwrap(),
            Renewal::Renewed
        );
    }
    // 400 ms after a 300 ms claim: only the extensions kept it.
    assert!(
        claim(&f.store, &f.q, &Holder::random(), 1, LONG)
            .await
            .is_empty()
    );
    assert_eq!(
        f.store
            .extend(ItemRef::new(&f.q, id, &Holder::random()), ttl(LONG))
            .await
            .unwrap(),
        Renewal::NotHeld
    );
}

#[tokio::test]
async fn fail_retries_after_the_backoff_with_the_error() {
    let f = fixture().await;
    let id = enqueue_one(&f.store, &f.q, item(b"x")).await;
    let token = Holder::random();
    claim(&f.store, &f.q, &token, 1, LONG).await;
    let plan = FailPlan::Retry {
        after: Duration::from_millis(300),
    };
    assert_eq!(
        f.store
            .fail(ItemRef::new(&f.q, id, &token), plan, "boom")
            .await
            .unwrap(),
        Settle::Settled
    );
    assert_eq!(
        f.store
            .fail(ItemRef::new(&f.q, id, &token), plan, "again")
            .await
            .unwrap(),
        Settle::NotOwner,
        "a retried item is no longer running"
    );
    let stats = &f.store.stats(f.q.as_str()).await.unwrap()[0];
    assert_eq!((stats.scheduled, stats.running), (1, 0));
    let token2 = Holder::random();
    assert!(
        claim(&f.store, &f.q, &token2, 1, LONG).await.is_empty(),
        "backing off"
    );
    let again = claim_eventually(&f.store, &f.q, &token2).await;
    assert_eq!(
        (again[0].id, again[0].attempt, again[0].last_error.as_str()),
        (id, 2, "boom")
    );
}

/// Delays and backoffs are any `Duration`: the longest put the item out of reach, and
/// nothing overflows.
#[tokio::test]
async fn the_longest_delay_and_backoff_park_the_item() {
    let f = fixture().await;
    let parked = enqueue_one(
        &f.store,
        &f.q,
        NewItem {
            delay: Duration::MAX,
            ..item(b"never")
        },
    )
    .await;
    let id = enqueue_one(&f.store, &f.q, item(b"x")).await;
    let token = Holder::random();
    assert_eq!(
        claimed_ids(&claim(&f.store, &f.q, &token, 5, LONG).await),
        vec![id]
    );
    let plan = FailPlan::Retry {
        after: Duration::MAX,
    };
    assert_eq!(
        f.store
            .fail(ItemRef::new(&f.q, id, &token), plan, "later")
            .await
            .unwrap(),
        Settle::Settled
    );
    assert!(claim(&f.store, &f.q, &token, 5, LONG).await.is_empty());
    let stats = &f.store.stats(f.q.as_str()).await.unwrap()[0];
    assert_eq!(
        (stats.scheduled, stats.ready, stats.oldest_due),
        (2, 0, None)
    );
    assert!(parked < id);
}

#[tokio::test]
async fn dead_letters_are_kept_listed_and_never_claimed() {
    let f = fixture().await;
    let a = enqueue_one(&f.store, &f.q, deduped(b"a", "da", LONG)).await;
    let b = enqueue_one(&f.store, &f.q, item(b"b")).await;
    let token = Holder::random();
    claim(&f.store, &f.q, &token, 2, LONG).await;
    for (id, why) in [(b, "bad b"), (a, "bad a")] {
        assert_eq!(
            f.store
                .fail(ItemRef::new(&f.q, id, &token), FailPlan::DeadLetter, why)
                .await
                .unwrap(),
            Settle::Settled
        );
    }
    assert!(claim(&f.store, &f.q, &token, 5, LONG).await.is_empty());
    let dead = f.store.dead_letters(&f.q, 10).await.unwrap();
    assert_eq!(dead.len(), 2);
    assert_eq!(
        (dead[0].id, dead[0].payload.as_slice(), dead[0].attempts),
        (a, &b"a"[..], 1),
        "oldest first"
    );
    assert_eq!(
        (dead[0].dedup_id.as_deref(), dead[0].error.as_str()),
        (Some("da"), "bad a")
    );
    assert_eq!((dead[1].id, dead[1].error.as_str()), (b, "bad b"));
    assert_eq!(f.store.dead_letters(&f.q, 1).await.unwrap().len(), 1);
    assert!(f.store.dead_letters(&f.q, 0).await.unwrap().is_empty());
    assert_eq!(f.store.stats(f.q.as_str()).await.unwrap()[0].dead, 2);
    assert_eq!(
        f.store
            .complete(ItemRef::new(&f.q, a, &token))
            .await
            .unwrap(),
        Settle::NotOwner,
        "a dead item is not running"
    );
}

#[tokio::test]
async fn release_returns_the_item_at_once_without_counting_the_attempt() {
    let f = fixture().await;
    let id = enqueue_one(&f.store, &f.q, item(b"x")).await;
    let token = Holder::random();
    assert_eq!(claim(&f.store, &f.q, &token, 1, LONG).await[0].attempt, 1);
    assert_eq!(
        f.store
            .release(ItemRef::new(&f.q, id, &token))
            .await
            .unwrap(),
        Settle::Settled
    );
    assert_eq!(
        f.store
            .release(ItemRef::new(&f.q, id, &token))
            .await
            .unwrap(),
        Settle::NotOwner
    );
    let again = claim(&f.store, &f.q, &Holder::random(), 1, LONG).await;
    assert_eq!((again[0].id, again[0].attempt), (id, 1));
}

#[tokio::test]
async fn dedup_inside_the_window_answers_the_first_item_even_after_it_completed() {
    let f = fixture().await;
    let window = Duration::from_millis(500);
    let first = enqueue_one(&f.store, &f.q, deduped(b"1", "order-7", window)).await;
    // Inside one batch too.
    let answers = f
        .store
        .enqueue(
            &f.q,
            &[
                deduped(b"2", "order-7", window),
                deduped(b"3", "order-8", window),
                deduped(b"4", "order-8", window),
            ],
        )
        .await
        .unwrap();
    assert_eq!(answers[0], Enqueued::Duplicate(first));
    let eighth = added(answers[1]);
    assert_eq!(answers[2], Enqueued::Duplicate(eighth));
    // The same id in another queue is another item.
    let other = qkey(&f.ns, KeyKind::Queue, "other");
    enqueue_one(&f.store, &other, deduped(b"o", "order-7", window)).await;

    let token = Holder::random();
    let got = claim(&f.store, &f.q, &token, 10, LONG).await;
    assert_eq!(claimed_ids(&got), vec![first, eighth]);
    assert_eq!(got[0].dedup_id.as_deref(), Some("order-7"));
    f.store
        .complete(ItemRef::new(&f.q, first, &token))
        .await
        .unwrap();
    assert_eq!(
        f.store
            .enqueue(&f.q, &[deduped(b"5", "order-7", window)])
            .await
            .unwrap(),
        vec![Enqueued::Duplicate(first)],
        "completed, still inside the window"
    );

    tokio::time::sleep(window + Duration::from_millis(100)).await;
    let after = enqueue_one(&f.store, &f.q, deduped(b"6", "order-7", window)).await;
    assert!(after > first, "outside the window: a new item");
    assert_eq!(
        f.store
            .enqueue(&f.q, &[deduped(b"7", "order-7", window)])
            .await
            .unwrap(),
        vec![Enqueued::Duplicate(after)],
        "the new item holds the id now"
    );
}

/// Expired de-duplication rows are purged as enqueues happen, a bounded number at a time.
#[tokio::test]
async fn expired_dedup_ids_are_purged_by_later_enqueues() {
    let f = fixture().await;
    let window = Duration::from_millis(100);
    let names: Vec<String> = (0..200).map(|i| format!("d{i}")).collect();
    let items: Vec<NewItem<'_>> = names.iter().map(|n| deduped(b"p", n, window)).collect();
    f.store.enqueue(&f.q, &items).await.unwrap();
    let rows = |path: PathBuf| {
        tokio::task::spawn_blocking(move || {
            rusqlite::Connection::open(path)
                .unwrap()
                .query_row("SELECT count(*) FROM baton_work_dedup", [], |r| {
                    r.get::<_, i64>(0)
                })
                .unwrap()
        })
    };
    assert_eq!(rows(f.path.clone()).await.unwrap(), 200);
    tokio::time::sleep(Duration::from_millis(150)).await;
    enqueue_one(&f.store, &f.q, item(b"plain")).await;
    assert_eq!(rows(f.path.clone()).await.unwrap(), 136, "64 purged");
    enqueue_one(&f.store, &f.q, deduped(b"x", "fresh", LONG)).await;
    assert_eq!(rows(f.path.clone()).await.unwrap(), 136 - 65 + 1);
}

#[tokio::test]
async fn ten_thousand_items_enqueue_in_one_batch() {
    let f = fixture().await;
    let payloads: Vec<Vec<u8>> = (0..10_000u32).map(|i| i.to_be_bytes().to_vec()).collect();
    let items: Vec<NewItem<'_>> = payloads.iter().map(|p| item(p)).collect();
    let answers = f.store.enqueue(&f.q, &items).await.unwrap();
    let ids: Vec<ItemId> = answers.into_iter().map(added).collect();
    assert_eq!(ids.len(), 10_000);
    assert!(ids.windows(2).all(|w| w[0] < w[1]));
    assert_eq!(f.store.stats(f.q.as_str()).await.unwrap()[0].ready, 10_000);
    let got = claim(&f.store, &f.q, &Holder::random(), 100, LONG).await;
    assert_eq!(claimed_ids(&got), ids[..100].to_vec());
    assert_eq!(got[99].payload, 99u32.to_be_bytes());
}

#[tokio::test]
async fn stats_count_every_state_per_queue_by_prefix() {
    let f = fixture().await;
    let a = qkey(&f.ns, KeyKind::Queue, "a");
    let b = qkey(&f.ns, KeyKind::Queue, "b");
    let token = Holder::random();
    // a: 2 ready, 1 scheduled, 1 running, 1 expired, 1 dead.
    let ids: Vec<ItemId> = f
        .store
        .enqueue(&a, &[item(b"1"), item(b"2"), item(b"3")])
        .await
        .unwrap()
        .into_iter()
        .map(added)
        .collect();
    claim(&f.store, &a, &token, 3, Duration::from_millis(200)).await;
    // Ownership outlives the lease: ids[1] and ids[2] stay running, ids[0] lapses.
    for id in &ids[1..] {
        f.store
            .extend(ItemRef::new(&a, *id, &token), ttl(LONG))
            .await
            .unwrap();
    }
    f.store
        .fail(ItemRef::new(&a, ids[1], &token), FailPlan::DeadLetter, "x")
        .await
        .unwrap();
    f.store
        .enqueue(
            &a,
            &[
                item(b"4"),
                item(b"5"),
                NewItem {
                    delay: LONG,
                    ..item(b"6")
                },
            ],
        )
        .await
        .unwrap();
    enqueue_one(&f.store, &b, item(b"b")).await;
    let elsewhere = qkey(&namespace(), KeyKind::Queue, "a");
    enqueue_one(&f.store, &elsewhere, item(b"e")).await;
    tokio::time::sleep(Duration::from_millis(250)).await;

    let prefix = format!("{}:queue:", f.ns.as_str());
    let stats = f.store.stats(&prefix).await.unwrap();
    let keys: Vec<&StoreKey> = stats.iter().map(|s| &s.key).collect();
    assert_eq!(keys, vec![&a, &b], "by key, this namespace only");
    let s = &stats[0];
    assert_eq!(
        (s.ready, s.scheduled, s.running, s.expired, s.dead),
        (2, 1, 1, 1, 1)
    );
    let oldest = s.oldest_due.unwrap();
    assert!(
        oldest >= Duration::from_millis(25) && oldest < Duration::from_secs(30),
        "{oldest:?}"
    );
    assert_eq!((stats[1].ready, stats[1].oldest_due.is_some()), (1, true));
    let only_b = f.store.stats(b.as_str()).await.unwrap();
    assert_eq!(only_b.len(), 1);
    let all = f.store.stats("").await.unwrap();
    assert!(all.iter().any(|s| s.key == elsewhere) && all.len() >= 3);
}

#[tokio::test]
async fn a_claim_of_zero_items_is_invalid_input() {
    let f = fixture().await;
    enqueue_one(&f.store, &f.q, item(b"x")).await;
    let token = Holder::random();
    let err = f
        .store
        .claim(
            &f.q,
            ClaimRequest {
                token: &token,
                batch: 0,
                lease: ttl(LONG),
            },
        )
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput);
    assert_eq!(claim(&f.store, &f.q, &token, 1, LONG).await.len(), 1);
}

/// Items, their leases, tokens and dedup ids live in the file.
#[tokio::test]
async fn queues_survive_reopening() {
    let f = fixture().await;
    let running = enqueue_one(&f.store, &f.q, deduped(b"r", "kept", LONG)).await;
    let token = Holder::random();
    claim(&f.store, &f.q, &token, 1, LONG).await;
    let waiting = enqueue_one(&f.store, &f.q, item(b"w")).await;
    drop(f.store);

    let store = open(&f.path).await;
    assert_eq!(
        store
            .enqueue(&f.q, &[deduped(b"again", "kept", LONG)])
            .await
            .unwrap(),
        vec![Enqueued::Duplicate(running)]
    );
    let got = claim(&store, &f.q, &Holder::random(), 10, LONG).await;
    assert_eq!(
        claimed_ids(&got),
        vec![waiting],
        "the running item's lease is live"
    );
    assert_eq!(
        store
            .complete(ItemRef::new(&f.q, running, &token))
            .await
            .unwrap(),
        Settle::Settled,
        "its token still owns it"
    );
    let newer = enqueue_one(&store, &f.q, item(b"n")).await;
    assert!(newer > waiting, "ids keep increasing across opens");
}

/// Store faults are `Unavailable` errors, never an empty claim or "not owner".
#[tokio::test]
async fn a_locked_file_is_unavailable_not_empty() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("baton.db");
    let store = open_impatient(&path, Duration::from_millis(100)).await;
    let q = qkey(&namespace(), KeyKind::Queue, "jobs");
    let id = enqueue_one(&store, &q, item(b"x")).await;
    let token = Holder::random();
    claim(&store, &q, &token, 1, Duration::from_millis(10)).await;
    tokio::time::sleep(Duration::from_millis(30)).await;

    let blocker = write_lock(&path);
    let err = store
        .claim(
            &q,
            ClaimRequest {
                token: &token,
                batch: 1,
                lease: ttl(LONG),
            },
        )
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    let err = store
        .complete(ItemRef::new(&q, id, &token))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    let err = store.enqueue(&q, &[item(b"y")]).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    blocker.execute_batch("ROLLBACK").unwrap();
    assert_eq!(claim(&store, &q, &token, 5, LONG).await.len(), 1);
}

/// 32 claimers, 16 on each of two stores opened on one file, drain 1,000 items: every item
/// is claimed exactly once and completed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn thirty_two_claimers_over_two_opens_claim_every_item_exactly_once() {
    let f = fixture().await;
    let second = Arc::new(open(&f.path).await);
    let first = Arc::new(f.store);
    let payloads: Vec<Vec<u8>> = (0..1_000u32).map(|i| i.to_be_bytes().to_vec()).collect();
    let items: Vec<NewItem<'_>> = payloads.iter().map(|p| item(p)).collect();
    let enqueued: BTreeSet<ItemId> = first
        .enqueue(&f.q, &items)
        .await
        .unwrap()
        .into_iter()
        .map(added)
        .collect();

    let mut tasks = Vec::new();
    for n in 0..32u32 {
        let store = if n % 2 == 0 {
            Arc::clone(&first)
        } else {
            Arc::clone(&second)
        };
        let q = f.q.clone();
        tasks.push(tokio::spawn(async move {
            let mut mine = Vec::new();
            loop {
                let token = Holder::random();
                let got = claim(&store, &q, &token, 1 + n % 4, LONG).await;
                if got.is_empty() {
                    return mine;
                }
                for item in got {
                    assert_eq!(item.attempt, 1, "no item is claimed twice");
                    assert_eq!(
                        store
                            .complete(ItemRef::new(&q, item.id, &token))
                            .await
                            .unwrap(),
                        Settle::Settled
                    );
                    mine.push(item.id);
                }
            }
        }));
    }
    let mut seen = HashSet::new();
    let mut total = 0;
    for task in tasks {
        for id in task.await.unwrap() {
            total += 1;
            assert!(seen.insert(id), "{id} was claimed twice");
        }
    }
    assert_eq!(total, 1_000);
    assert_eq!(seen.into_iter().collect::<BTreeSet<_>>(), enqueued);
    assert!(first.stats(f.q.as_str()).await.unwrap().is_empty());
}

// ---------------------------------------------------------------------------------------
// Cross-process: 4 OS processes drain one file
// ---------------------------------------------------------------------------------------

const PROCESSES: [&str; 4] = ["p1", "p2", "p3", "p4"];
const CROSS_ITEMS: u32 = 800;

/// 4 processes of 4 claimers each drain 800 items from one file: every item is claimed once
/// and completed exactly once.
#[test]
fn four_processes_complete_every_item_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("baton.db");
    let go = dir.path().join("go");
    let ns = namespace();
    let q = qkey(&ns, KeyKind::Queue, "jobs");
    let enqueued: BTreeSet<i64> = child_runtime().block_on(async {
        let store = open(&db).await;
        let payloads: Vec<Vec<u8>> = (0..CROSS_ITEMS).map(|i| i.to_be_bytes().to_vec()).collect();
        let items: Vec<NewItem<'_>> = payloads.iter().map(|p| item(p)).collect();
        store
            .enqueue(&q, &items)
            .await
            .unwrap()
            .into_iter()
            .map(|a| added(a).0)
            .collect()
    });
    let mut children: Vec<_> = PROCESSES
        .iter()
        .map(|name| {
            ChildTest::new("claimer", *name)
                .env("WORK_DB", &db)
                .env("WORK_GO", &go)
                .env("WORK_QUEUE", q.as_str())
                .env("WORK_OUT", dir.path().join(format!("done-{name}")))
                .env("WORK_READY", dir.path().join(format!("ready-{name}")))
                .spawn()
                .unwrap()
        })
        .collect();
    for name in PROCESSES {
        process::wait_for_file(dir.path().join(format!("ready-{name}")), CHILD_TIMEOUT).unwrap();
    }
    std::fs::write(&go, "go").unwrap();
    for child in &mut children {
        child.wait_success(CHILD_TIMEOUT).unwrap();
    }
    let mut completed: BTreeMap<i64, &str> = BTreeMap::new();
    for name in PROCESSES {
        let text = std::fs::read_to_string(dir.path().join(format!("done-{name}"))).unwrap();
        for line in text.lines() {
            let id: i64 = line.parse().unwrap();
            if let Some(before) = completed.insert(id, name) {
                panic!("item {id} completed by {before} and {name}");
            }
        }
    }
    assert_eq!(
        completed.keys().copied().collect::<BTreeSet<_>>(),
        enqueued,
        "every item completed once"
    );
    let busy = PROCESSES
        .iter()
        .filter(|name| completed.values().any(|n| n == *name))
        .count();
    println!("{busy} of 4 processes completed items");
    child_runtime().block_on(async {
        assert!(open(&db).await.stats(q.as_str()).await.unwrap().is_empty());
    });
}

#[test]
#[ignore = "a child process of four_processes_complete_every_item_exactly_once"]
fn claimer() {
    let Some(_role) = process::role() else { return };
    child_runtime().block_on(async {
        let store = Arc::new(open(Path::new(&parent_env("WORK_DB"))).await);
        let q = StoreKey::from_stored(parent_env("WORK_QUEUE"));
        std::fs::write(parent_env("WORK_READY"), "ready").unwrap();
        process::wait_for_file(parent_env("WORK_GO"), CHILD_TIMEOUT).unwrap();
        let mut tasks = Vec::new();
        for n in 0..4u32 {
            let (store, q) = (Arc::clone(&store), q.clone());
            tasks.push(tokio::spawn(async move {
                let mut done = Vec::new();
                loop {
                    let token = Holder::random();
                    let got = claim(&store, &q, &token, 1 + n % 3, LONG).await;
                    if got.is_empty() {
                        return done;
                    }
                    for item in got {
                        assert_eq!(item.attempt, 1, "claimed twice: {item:?}");
                        assert_eq!(
                            store
                                .complete(ItemRef::new(&q, item.id, &token))
                                .await
                                .unwrap(),
                            Settle::Settled
                        );
                        done.push(item.id.0);
                    }
                }
            }));
        }
        let mut lines = String::new();
        for task in tasks {
            for id in task.await.unwrap() {
                lines.push_str(&format!("{id}\n"));
            }
        }
        std::fs::write(parent_env("WORK_OUT"), lines).unwrap();
    });
}

// ---------------------------------------------------------------------------------------
// Schedules
// ---------------------------------------------------------------------------------------

#[tokio::test]
async fn now_ms_is_the_wall_clock() {
    let f = fixture().await;
    let before = wall_ms();
    let now = f.store.now_ms().await.unwrap();
    assert!(now >= before && now <= wall_ms());
}

#[tokio::test]
async fn register_inserts_keeps_or_replaces_on_a_new_spec() {
    let f = fixture().await;
    let name = qkey(&f.ns, KeyKind::Schedule, "nightly");
    let row = f
        .store
        .register_schedule(NewSchedule::new(&name, "0 3 * * *", 1_000))
        .await
        .unwrap();
    assert_eq!(
        (row.name.clone(), row.spec.as_str(), row.due_at_ms, row.runs),
        (name.clone(), "0 3 * * *", 1_000, 0)
    );
    assert_eq!(row.last_run, None);
    let same = f
        .store
        .register_schedule(NewSchedule::new(&name, "0 3 * * *", 9_999))
        .await
        .unwrap();
    assert_eq!(same, row, "same spec: nothing changes");
    let changed = f
        .store
        .register_schedule(NewSchedule::new(&name, "0 4 * * *", 2_000))
        .await
        .unwrap();
    assert_eq!(
        (changed.spec.as_str(), changed.due_at_ms),
        ("0 4 * * *", 2_000)
    );
    assert_eq!(f.store.schedule(&name).await.unwrap(), Some(changed));
}

#[tokio::test]
async fn advance_claims_a_due_tick_once_and_records_the_run() {
    let f = fixture().await;
    let name = qkey(&f.ns, KeyKind::Schedule, "tick");
    let now = f.store.now_ms().await.unwrap();
    let due = now - 1_000;
    f.store
        .register_schedule(NewSchedule::new(&name, "* * * * *", due))
        .await
        .unwrap();
    let holder = Holder::new("replica-1").unwrap();
    assert_eq!(
        f.store
            .advance_schedule(
                &name,
                TickClaim {
                    expected_due_ms: due + 1,
                    next_due_ms: due + 60_000,
                    holder: &holder,
                    ran: true
                }
            )
            .await
            .unwrap(),
        Advance::Lost,
        "not at the expected tick"
    );
    assert_eq!(
        f.store
            .advance_schedule(&name, minute_tick(due, &holder))
            .await
            .unwrap(),
        Advance::Claimed
    );
    assert_eq!(
        f.store
            .advance_schedule(&name, minute_tick(due, &holder))
            .await
            .unwrap(),
        Advance::Lost,
        "already advanced"
    );
    let row = f.store.schedule(&name).await.unwrap().unwrap();
    assert_eq!((row.due_at_ms, row.runs), (due + 60_000, 1));
    let (by, at) = row.last_run.unwrap();
    assert_eq!(by, holder);
    assert!(at >= now && at <= wall_ms());
    assert_eq!(
        f.store
            .advance_schedule(
                &name,
                TickClaim {
                    expected_due_ms: due + 60_000,
                    next_due_ms: due + 120_000,
                    holder: &holder,
                    ran: true
                }
            )
            .await
            .unwrap(),
        Advance::Lost,
        "the next tick is not due yet"
    );
    let unknown = qkey(&f.ns, KeyKind::Schedule, "unknown");
    assert_eq!(
        f.store
            .advance_schedule(
                &unknown,
                TickClaim {
                    expected_due_ms: due,
                    next_due_ms: due + 1,
                    holder: &holder,
                    ran: true
                }
            )
            .await
            .unwrap(),
        Advance::Lost
    );
}

#[tokio::test]
async fn an_advance_that_did_not_run_records_nothing() {
    let f = fixture().await;
    let name = qkey(&f.ns, KeyKind::Schedule, "skip");
    let due = wall_ms() - 10;
    f.store
        .register_schedule(NewSchedule::new(&name, "@hourly", due))
        .await
        .unwrap();
    let holder = Holder::random();
    assert_eq!(
        f.store
            .advance_schedule(
                &name,
                TickClaim {
                    expected_due_ms: due,
                    next_due_ms: due + 5,
                    holder: &holder,
                    ran: false
                }
            )
            .await
            .unwrap(),
        Advance::Claimed
    );
    let row = f.store.schedule(&name).await.unwrap().unwrap();
    assert_eq!((row.due_at_ms, row.runs, row.last_run), (due + 5, 0, None));
}

/// Of 32 advances of one tick from two stores on one file, exactly one claims it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_of_many_concurrent_advances_claims_the_tick() {
    let f = fixture().await;
    let second = Arc::new(open(&f.path).await);
    let first = Arc::new(f.store);
    let name = qkey(&f.ns, KeyKind::Schedule, "race");
    let due = wall_ms() - 1;
    first
        .register_schedule(NewSchedule::new(&name, "@every 1m", due))
        .await
        .unwrap();
    let tasks: Vec<_> = (0..32)
        .map(|n| {
            let store = if n % 2 == 0 { &first } else { &second };
            let (store, name) = (Arc::clone(store), name.clone());
            tokio::spawn(async move {
                store
                    .advance_schedule(&name, minute_tick(due, &Holder::random()))
                    .await
                    .unwrap()
            })
        })
        .collect();
    let mut claimed = 0;
    for task in tasks {
        if task.await.unwrap() == Advance::Claimed {
            claimed += 1;
        }
    }
    assert_eq!(claimed, 1);
    assert_eq!(second.schedule(&name).await.unwrap().unwrap().runs, 1);
}

#[tokio::test]
async fn schedules_list_by_prefix_and_remove() {
    let f = fixture().await;
    let a = qkey(&f.ns, KeyKind::Schedule, "a");
    let b = qkey(&f.ns, KeyKind::Schedule, "b");
    let elsewhere = qkey(&namespace(), KeyKind::Schedule, "a");
    for key in [&b, &a, &elsewhere] {
        f.store
            .register_schedule(NewSchedule::new(key, "@daily", 0))
            .await
            .unwrap();
    }
    let prefix = format!("{}:schedule:", f.ns.as_str());
    let names: Vec<StoreKey> = f
        .store
        .schedules(&prefix)
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.name)
        .collect();
    assert_eq!(names, vec![a.clone(), b.clone()]);
    assert_eq!(f.store.schedules("").await.unwrap().len(), 3);
    assert!(f.store.remove_schedule(&a).await.unwrap());
    assert!(!f.store.remove_schedule(&a).await.unwrap());
    assert_eq!(f.store.schedule(&a).await.unwrap(), None);
    assert_eq!(f.store.schedules(&prefix).await.unwrap().len(), 1);
}

#[tokio::test]
async fn schedules_survive_reopening() {
    let f = fixture().await;
    let name = qkey(&f.ns, KeyKind::Schedule, "kept");
    let due = wall_ms() - 1;
    f.store
        .register_schedule(NewSchedule::new(&name, "@daily", due))
        .await
        .unwrap();
    let holder = Holder::new("replica-2").unwrap();
    f.store
        .advance_schedule(
            &name,
            TickClaim {
                expected_due_ms: due,
                next_due_ms: due + 86_400_000,
                holder: &holder,
                ran: true,
            },
        )
        .await
        .unwrap();
    let before = f.store.schedule(&name).await.unwrap();
    drop(f.store);
    assert_eq!(open(&f.path).await.schedule(&name).await.unwrap(), before);
}

// ---------------------------------------------------------------------------------------
// Migrations
// ---------------------------------------------------------------------------------------

#[tokio::test]
async fn a_migration_is_claimed_once_and_then_completed() {
    let f = fixture().await;
    let m = f.migrations();
    let (w1, w2) = (
        Holder::new("writer-1").unwrap(),
        Holder::new("writer-2").unwrap(),
    );
    assert_eq!(
        m.claim("001-init", &w1, LONG).await,
        MigrationClaim::Claimed {
            attempt: 1,
            previous: None
        }
    );
    match m.claim("001-init", &w2, LONG).await {
        MigrationClaim::Busy { by, remaining } => {
            assert_eq!(by, w1);
            assert!(remaining > LONG - Duration::from_secs(30) && remaining <= LONG);
        }
        other => panic!("expected busy, got {other:?}"),
    }
    assert_eq!(m.heartbeat("001-init", &w2).await, Renewal::NotHeld);
    assert_eq!(m.heartbeat("001-init", &w1).await, Renewal::Renewed);
    assert_eq!(
        m.finish("001-init", &w2, MigrationEnd::Completed).await,
        Settle::NotOwner
    );
    assert_eq!(
        m.finish("001-init", &w1, MigrationEnd::Completed).await,
        Settle::Settled
    );
    assert_eq!(
        m.finish("001-init", &w1, MigrationEnd::Failed("late"))
            .await,
        Settle::NotOwner,
        "no longer pending"
    );
    assert_eq!(
        m.claim("001-init", &w2, LONG).await,
        MigrationClaim::Completed
    );
    let records = m.records().await;
    assert_eq!(records.len(), 1);
    let r = &records[0];
    assert_eq!(
        (r.name.as_str(), r.state, &r.claimed_by, r.attempt),
        ("001-init", MigrationState::Completed, &w1, 1)
    );
    assert_eq!((r.lease_remaining, r.error.as_str()), (Duration::ZERO, ""));
}

#[tokio::test]
async fn failed_rolled_back_and_lapsed_migrations_are_taken_over() {
    let f = fixture().await;
    let m = f.migrations();
    let (w1, w2) = (Holder::random(), Holder::random());
    for (name, end) in [
        ("a", MigrationEnd::Failed("it broke")),
        ("b", MigrationEnd::RolledBack("it broke")),
    ] {
        m.claim(name, &w1, LONG).await;
        m.finish(name, &w1, end).await;
        assert_eq!(
            m.claim(name, &w2, LONG).await,
            MigrationClaim::Claimed {
                attempt: 2,
                previous: Some(end.state())
            }
        );
    }
    m.claim("c", &w1, Duration::from_millis(100)).await;
    tokio::time::sleep(Duration::from_millis(150)).await;
    let c = m.records().await.pop().unwrap();
    assert_eq!((c.name.as_str(), c.lease_remaining), ("c", Duration::ZERO));
    assert_eq!(
        m.claim("c", &w2, LONG).await,
        MigrationClaim::Claimed {
            attempt: 2,
            previous: Some(MigrationState::Pending)
        }
    );
    // The writer taken over owns nothing any more.
    assert_eq!(m.heartbeat("c", &w1).await, Renewal::NotHeld);
    assert_eq!(
        m.finish("c", &w1, MigrationEnd::Completed).await,
        Settle::NotOwner
    );
    let records = m.records().await;
    let names: Vec<&str> = records.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, vec!["a", "b", "c"]);
    assert!(records.iter().all(|r| r.state == MigrationState::Pending
        && r.claimed_by == w2
        && r.lease_remaining > Duration::from_secs(60)));
    assert_eq!(records[0].error, "it broke", "the last failure is kept");
}

/// Ownership ends at a takeover, not when the lease lapses.
#[tokio::test]
async fn a_lapsed_writer_may_still_finish_without_a_takeover() {
    let f = fixture().await;
    let m = f.migrations();
    let w = Holder::random();
    m.claim("m", &w, Duration::from_millis(50)).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(m.heartbeat("m", &w).await, Renewal::Renewed);
    assert_eq!(
        m.finish("m", &w, MigrationEnd::RolledBack("undone")).await,
        Settle::Settled
    );
    let r = &m.records().await[0];
    assert_eq!(
        (r.state, r.error.as_str()),
        (MigrationState::RolledBack, "undone")
    );
}

/// Of 32 claims of one migration from two stores on one file, exactly one gets it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_of_many_concurrent_writers_claims_a_migration() {
    let f = fixture().await;
    let second = Arc::new(open(&f.path).await);
    let first = Arc::new(f.store);
    let set = qkey(&f.ns, KeyKind::Migration, "schema");
    let tasks: Vec<_> = (0..32)
        .map(|n| {
            let store = if n % 2 == 0 { &first } else { &second };
            let (store, set) = (Arc::clone(store), set.clone());
            tokio::spawn(async move {
                store
                    .claim_migration(Writer::new(&set, "001", &Holder::random()), ttl(LONG))
                    .await
                    .unwrap()
            })
        })
        .collect();
    let mut claimed = 0;
    for task in tasks {
        match task.await.unwrap() {
            MigrationClaim::Claimed { .. } => claimed += 1,
            MigrationClaim::Busy { .. } => {}
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(claimed, 1);
}

#[tokio::test]
async fn migrations_survive_reopening() {
    let f = fixture().await;
    let w = Holder::random();
    f.migrations().claim("live", &w, LONG).await;
    drop(f.store);
    let store = open(&f.path).await;
    let m = Migrations::schema(&store, &f.ns);
    assert!(matches!(
        m.claim("live", &Holder::random(), LONG).await,
        MigrationClaim::Busy { by, .. } if by == w
    ));
    assert_eq!(
        m.finish("live", &w, MigrationEnd::Completed).await,
        Settle::Settled
    );
}
