//! Claimable work on the PostgreSQL store, on the test binary's shared private server
//! (each test in a fresh namespace): the work conformance rules, which check the
//! `QueueStore`, `ScheduleStore` and `MigrationStore` contracts clause by clause, and what
//! only a real server shows beyond them: 32 claimers in two stores (two pools, as two
//! replicas) over 2,000 items, a zombie's settles leaving the row as it was, concurrent
//! enqueues of one de-duplication id, 10,000 items in one enqueue, concurrent schedule
//! advances and migration claims from two stores, a server restart and a stopped server,
//! and the work tables' own schema version.
//!
//! Every store here is opened with `listen=off`: claimable work never waits on a release
//! notification, so the LISTEN connection would only cost a connection per store.
//!
//! No test asserts speed. A lease that must lapse is short and waited for by polling; a
//! lease that must not lapse during a check is a minute long.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use baton_core::conformance::Opens;
use baton_core::store::Renewal;
use baton_core::work::conformance::minute_tick;
use baton_core::work::store::{
    Advance, ClaimRequest, ClaimedItem, Enqueued, FailPlan, ItemId, ItemRef, MigrationClaim,
    MigrationStore, NewItem, NewSchedule, QueueStore, ScheduleStore, Settle, WorkStore, Writer,
};
use baton_core::{ErrorKind, Holder, Key, KeyKind, Namespace, StoreKey, Ttl};
use baton_postgres::PostgresStore;
use baton_postgres::work::sql;
use baton_testkit::postgres::Stop;

use common::*;

const MINUTE: Duration = Duration::from_secs(60);

fn ttl(d: Duration) -> Ttl {
    Ttl::new(d).unwrap()
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn key(ns: &Namespace, kind: KeyKind, name: &str) -> StoreKey {
    ns.qualify(kind, &Key::new(name).unwrap())
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

fn added(answer: &Enqueued) -> ItemId {
    match answer {
        Enqueued::Added(id) => *id,
        Enqueued::Duplicate(id) => panic!("expected an added item, got a duplicate of {id}"),
    }
}

/// A store on `url` with the test timeouts and no LISTEN connection.
async fn open(url: &str) -> PostgresStore {
    let url = format!("{}&listen=off", with_timeouts(url));
    PostgresStore::connect(&url)
        .await
        .unwrap_or_else(|e| panic!("connect to {url}: {e}"))
}

async fn store() -> PostgresStore {
    open(&shared().await.url()).await
}

/// Every `open` is a new store (its own pool), as another replica would be.
struct PostgresWorkHarness {
    url: String,
}

#[async_trait]
impl Opens<dyn WorkStore> for PostgresWorkHarness {
    async fn open(&self) -> Arc<dyn WorkStore> {
        Arc::new(open(&self.url).await)
    }
}

async fn harness() -> PostgresWorkHarness {
    PostgresWorkHarness {
        url: shared().await.url(),
    }
}

baton_core::work_conformance_tests!(harness());

async fn claim(
    store: &PostgresStore,
    queue: &StoreKey,
    token: &Holder,
    batch: u32,
    lease: Duration,
) -> Vec<ClaimedItem> {
    store
        .claim(
            queue,
            ClaimRequest {
                token,
                batch,
                lease: ttl(lease),
            },
        )
        .await
        .unwrap()
}

/// The stored `(state, lock_token, attempts)` of an item, read as an operator would.
async fn row_of(id: ItemId) -> Option<(String, Option<String>, i32)> {
    let mut conn = raw(&shared().await.url()).await;
    sqlx::query_as("SELECT state, lock_token, attempts FROM baton_work_item WHERE id = $1")
        .bind(id.0)
        .fetch_optional(&mut conn)
        .await
        .unwrap()
}

/// 32 claimers on one queue, 16 in each of two stores (two pools, as two replicas), take
/// 2,000 items in batches of 1 to 4: every item is claimed exactly once and completed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thirty_two_claimers_in_two_stores_claim_each_item_once() {
    const ITEMS: usize = 2_000;
    let stores = two_stores().await;
    let ns = namespace();
    let q = key(&ns, KeyKind::Queue, "race");
    let payloads: Vec<Vec<u8>> = (0..ITEMS).map(|i| i.to_string().into_bytes()).collect();
    let batch: Vec<NewItem<'_>> = payloads.iter().map(|p| item(p)).collect();
    let enqueued: BTreeSet<ItemId> = stores[0]
        .enqueue(&q, &batch)
        .await
        .unwrap()
        .iter()
        .map(added)
        .collect();
    assert_eq!(enqueued.len(), ITEMS);

    let seen = Arc::new(Mutex::new(BTreeMap::<ItemId, usize>::new()));
    let mut tasks = Vec::new();
    for worker in 0..32 {
        let store = Arc::clone(&stores[worker % 2]);
        let (q, seen) = (q.clone(), Arc::clone(&seen));
        tasks.push(tokio::spawn(async move {
            loop {
                let token = Holder::random();
                let batch = 1 + (worker % 4) as u32;
                let claimed = claim(&store, &q, &token, batch, MINUTE).await;
                if claimed.is_empty() {
                    return;
                }
                for c in claimed {
                    *seen.lock().unwrap().entry(c.id).or_default() += 1;
                    assert_eq!(c.attempt, 1, "claimed before: {c:?}");
                    assert_eq!(
                        store
                            .complete(ItemRef::new(&q, c.id, &token))
                            .await
                            .unwrap(),
                        Settle::Settled
                    );
                }
            }
        }));
    }
    for task in tasks {
        within("a claimer", task).await.unwrap();
    }
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.keys().copied().collect::<BTreeSet<_>>(), enqueued);
    assert!(seen.values().all(|n| *n == 1), "claimed twice: {seen:?}");
    assert!(stores[1].stats(q.as_str()).await.unwrap().is_empty());
}

/// Once another claim took a lapsed item, the first claimer's token is a zombie: its
/// complete, fail, extend and release answer not-owner and change nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zombie_token_is_not_owner_and_changes_nothing() {
    let store = store().await;
    let ns = namespace();
    let q = key(&ns, KeyKind::Queue, "zombies");
    let id = added(&store.enqueue(&q, &[item(b"x")]).await.unwrap()[0]);
    let zombie = Holder::random();
    assert_eq!(claim(&store, &q, &zombie, 1, ms(100)).await.len(), 1);
    let owner = Holder::random();
    let taken = eventually("the lease to lapse", || async {
        let claimed = claim(&store, &q, &owner, 1, MINUTE).await;
        (!claimed.is_empty()).then_some(claimed)
    })
    .await;
    assert_eq!((taken[0].id, taken[0].attempt), (id, 2));
    let before = row_of(id).await;

    assert_eq!(
        store.complete(ItemRef::new(&q, id, &zombie)).await.unwrap(),
        Settle::NotOwner
    );
    assert_eq!(
        store
            .fail(
                ItemRef::new(&q, id, &zombie),
                FailPlan::Retry { after: ms(0) },
                "late"
            )
            .await
            .unwrap(),
        Settle::NotOwner
    );
    assert_eq!(
        store
            .fail(ItemRef::new(&q, id, &zombie), FailPlan::DeadLetter, "late")
            .await
            .unwrap(),
        Settle::NotOwner
    );
    assert_eq!(
        store
            .extend(ItemRef::new(&q, id, &zombie), ttl(MINUTE))
            .await
            .unwrap(),
        Renewal::NotHeld
    );
    assert_eq!(
        store.release(ItemRef::new(&q, id, &zombie)).await.unwrap(),
        Settle::NotOwner
    );
    assert_eq!(row_of(id).await, before, "nothing changed");
    assert_eq!(
        before,
        Some(("running".into(), Some(owner.as_str().to_owned()), 2))
    );
    assert_eq!(
        store
            .extend(ItemRef::new(&q, id, &owner), ttl(MINUTE))
            .await
            .unwrap(),
        Renewal::Renewed
    );
    assert_eq!(
        store.complete(ItemRef::new(&q, id, &owner)).await.unwrap(),
        Settle::Settled
    );
}

/// Concurrent enqueues of one de-duplication id from two stores add it once, and every
/// duplicate names the item that was added.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_enqueues_of_one_dedup_id_add_it_once() {
    let stores = two_stores().await;
    let ns = namespace();
    let q = key(&ns, KeyKind::Queue, "dedup-race");
    let answers = sixteen_on_two_stores(&stores, "an enqueue", |_, store| {
        let q = q.clone();
        async move {
            store
                .enqueue(&q, &[deduped(b"x", "only-once", MINUTE)])
                .await
                .unwrap()[0]
        }
    })
    .await;
    let added: Vec<ItemId> = answers
        .iter()
        .filter_map(|a| match a {
            Enqueued::Added(id) => Some(*id),
            Enqueued::Duplicate(_) => None,
        })
        .collect();
    assert_eq!(added.len(), 1, "{answers:?}");
    assert!(
        answers
            .iter()
            .all(|a| matches!(a, Enqueued::Duplicate(id) | Enqueued::Added(id) if *id == added[0]))
    );
    assert_eq!(store_stats_ready(&stores[0], &q).await, 1);
}

/// Two stores on the shared server, as two replicas would have.
async fn two_stores() -> [Arc<PostgresStore>; 2] {
    let url = shared().await.url();
    [Arc::new(open(&url).await), Arc::new(open(&url).await)]
}

/// Runs `task(i, store)` for `i` in `0..16`, concurrently, each in a task of its own on
/// the stores in turn; the answers in order of `i`, each within the bounded wait.
async fn sixteen_on_two_stores<T, F, Fut>(
    stores: &[Arc<PostgresStore>; 2],
    what: &str,
    task: F,
) -> Vec<T>
where
    F: Fn(usize, Arc<PostgresStore>) -> Fut,
    Fut: Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    let tasks: Vec<_> = (0..16)
        .map(|i| tokio::spawn(task(i, Arc::clone(&stores[i % 2]))))
        .collect();
    let mut answers = Vec::new();
    for task in tasks {
        answers.push(within(what, task).await.unwrap());
    }
    answers
}

async fn store_stats_ready(store: &PostgresStore, q: &StoreKey) -> u64 {
    store.stats(q.as_str()).await.unwrap()[0].ready
}

/// Release makes the item ready at once and gives back the attempt; claims take the oldest
/// `run_at` first, then the lowest id, so a released item queues behind older ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_and_claim_order() {
    let store = store().await;
    let ns = namespace();
    let q = key(&ns, KeyKind::Queue, "order");
    let ids: Vec<ItemId> = store
        .enqueue(&q, &[item(b"a"), item(b"b"), item(b"c")])
        .await
        .unwrap()
        .iter()
        .map(added)
        .collect();
    let token = Holder::random();
    let first = claim(&store, &q, &token, 1, MINUTE).await;
    assert_eq!((first[0].id, first[0].attempt), (ids[0], 1));
    assert_eq!(
        store
            .release(ItemRef::new(&q, ids[0], &token))
            .await
            .unwrap(),
        Settle::Settled
    );
    assert_eq!(
        store
            .release(ItemRef::new(&q, ids[0], &token))
            .await
            .unwrap(),
        Settle::NotOwner
    );
    let token = Holder::random();
    let all = claim(&store, &q, &token, 10, MINUTE).await;
    let order: Vec<(ItemId, u32)> = all.iter().map(|c| (c.id, c.attempt)).collect();
    assert_eq!(order, vec![(ids[1], 1), (ids[2], 1), (ids[0], 1)]);
}

/// 10,000 items go in with one call, with increasing ids, and come out in id order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_items_in_one_enqueue() {
    let store = store().await;
    let ns = namespace();
    let q = key(&ns, KeyKind::Queue, "bulk");
    let payloads: Vec<Vec<u8>> = (0..10_000u32).map(|i| i.to_be_bytes().to_vec()).collect();
    let ids: Vec<String> = (0..10_000).map(|i| format!("d{i}")).collect();
    let batch: Vec<NewItem<'_>> = payloads
        .iter()
        .zip(&ids)
        .map(|(p, id)| deduped(p, id, MINUTE))
        .collect();
    let answers = within("the enqueue", store.enqueue(&q, &batch))
        .await
        .unwrap();
    let added: Vec<ItemId> = answers.iter().map(added).collect();
    assert!(added.windows(2).all(|w| w[0] < w[1]));
    let token = Holder::random();
    let claimed = claim(&store, &q, &token, 10_000, MINUTE).await;
    assert_eq!(claimed.iter().map(|c| c.id).collect::<Vec<_>>(), added);
    assert_eq!(claimed[9_999].payload, 9_999u32.to_be_bytes());
}

/// Expired de-duplication rows are ignored at once, and deleted as the store is used (a
/// sweep every 128th enqueue of a process); live ones stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_dedup_rows_are_swept() {
    let store = store().await;
    let ns = namespace();
    let q = key(&ns, KeyKind::Queue, "sweep");
    let ids: Vec<String> = (0..20).map(|i| format!("gone-{i}")).collect();
    let short: Vec<NewItem<'_>> = ids.iter().map(|id| deduped(b"x", id, ms(10))).collect();
    store.enqueue(&q, &short).await.unwrap();
    store
        .enqueue(&q, &[deduped(b"y", "kept", MINUTE)])
        .await
        .unwrap();
    let url = shared().await.url();
    let other = key(&ns, KeyKind::Queue, "traffic");
    eventually("the expired rows to be swept", || {
        let (store, other, url, q) = (&store, &other, &url, &q);
        async move {
            for _ in 0..16 {
                store.enqueue(other, &[item(b"t")]).await.unwrap();
            }
            let left: Vec<String> = sqlx::query_scalar(
                "SELECT dedup_id FROM baton_work_dedup WHERE queue = $1 ORDER BY dedup_id",
            )
            .bind(q.as_str())
            .fetch_all(&mut raw(url).await)
            .await
            .unwrap();
            (left == ["kept"]).then_some(())
        }
    })
    .await;
}

/// Of 16 concurrent advances of one due tick, from two stores, exactly one claims it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_one_of_sixteen_concurrent_advances_wins() {
    let stores = two_stores().await;
    let ns = namespace();
    let name = key(&ns, KeyKind::Schedule, "tick");
    for round in 0..5 {
        let due = stores[0].now_ms().await.unwrap() - 1;
        let row = stores[0]
            .register_schedule(NewSchedule::new(&name, &format!("spec {round}"), due))
            .await
            .unwrap();
        assert_eq!(row.due_at_ms, due);
        let answers = sixteen_on_two_stores(&stores, "an advance", |i, store| {
            let name = name.clone();
            async move {
                let holder = Holder::new(format!("replica-{i}")).unwrap();
                store
                    .advance_schedule(&name, minute_tick(due, &holder))
                    .await
                    .unwrap()
            }
        })
        .await;
        let wins = answers.iter().filter(|a| **a == Advance::Claimed).count();
        assert_eq!(wins, 1, "round {round}");
    }
    assert_eq!(stores[1].schedule(&name).await.unwrap().unwrap().runs, 5);
}

/// Of 16 concurrent claims of a new migration record, from two stores, exactly one claims
/// it and the others are told it is busy with that writer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_one_of_sixteen_concurrent_migration_claims_wins() {
    let stores = two_stores().await;
    let ns = namespace();
    let set = key(&ns, KeyKind::Migration, "boot");
    let answers = sixteen_on_two_stores(&stores, "a claim", |i, store| {
        let set = set.clone();
        async move {
            let writer = Holder::new(format!("replica-{i}")).unwrap();
            let claim = store
                .claim_migration(Writer::new(&set, "003", &writer), ttl(MINUTE))
                .await
                .unwrap();
            (writer, claim)
        }
    })
    .await;
    let mut winners = Vec::new();
    let mut busy_with = BTreeSet::new();
    for answer in answers {
        match answer {
            (
                writer,
                MigrationClaim::Claimed {
                    attempt: 1,
                    previous: None,
                },
            ) => winners.push(writer),
            (_, MigrationClaim::Busy { by, .. }) => {
                busy_with.insert(by.as_str().to_owned());
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(winners.len(), 1);
    assert!(busy_with.iter().all(|by| by == winners[0].as_str()));
}

/// A restarted server (cleanly, then by a crash) keeps queued and running items, and the
/// running item's token still owns it; while the server is down, every atom fails with
/// `Unavailable` rather than answering empty, duplicate or not-owner.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn items_survive_server_restarts_and_faults_are_unavailable() {
    let server = Arc::new(private().await);
    let store = open(&server.url()).await;
    let ns = namespace();
    let q = key(&ns, KeyKind::Queue, "durable");
    let ids: Vec<ItemId> = store
        .enqueue(
            &q,
            &[
                item(b"running"),
                deduped(b"queued", "d", MINUTE),
                item(b"third"),
            ],
        )
        .await
        .unwrap()
        .iter()
        .map(added)
        .collect();
    let token = Holder::random();
    assert_eq!(claim(&store, &q, &token, 1, MINUTE).await[0].id, ids[0]);

    for how in [Stop::Fast, Stop::Immediate] {
        let s = Arc::clone(&server);
        blocking(move || s.restart(how)).await.expect("restart");
        let stats = eventually("the store to answer after the restart", || async {
            store.stats(q.as_str()).await.ok()
        })
        .await;
        assert_eq!((stats[0].running, stats[0].ready), (1, 2), "after {how:?}");
        assert_eq!(
            store
                .enqueue(&q, &[deduped(b"again", "d", MINUTE)])
                .await
                .unwrap(),
            vec![Enqueued::Duplicate(ids[1])],
            "the de-duplication id is remembered after {how:?}"
        );
        assert_eq!(
            store
                .extend(ItemRef::new(&q, ids[0], &token), ttl(MINUTE))
                .await
                .unwrap(),
            Renewal::Renewed
        );
    }

    let s = Arc::clone(&server);
    blocking(move || s.stop(Stop::Fast)).await.expect("stop");
    let unavailable = |e: baton_core::Error| assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    unavailable(store.enqueue(&q, &[item(b"x")]).await.unwrap_err());
    unavailable(
        store
            .claim(
                &q,
                ClaimRequest {
                    token: &token,
                    batch: 1,
                    lease: ttl(MINUTE),
                },
            )
            .await
            .unwrap_err(),
    );
    unavailable(
        store
            .complete(ItemRef::new(&q, ids[0], &token))
            .await
            .unwrap_err(),
    );
    unavailable(store.stats(q.as_str()).await.unwrap_err());
    unavailable(store.now_ms().await.unwrap_err());
    let set = key(&ns, KeyKind::Migration, "m");
    unavailable(
        store
            .claim_migration(Writer::new(&set, "1", &token), ttl(MINUTE))
            .await
            .unwrap_err(),
    );
    let s = Arc::clone(&server);
    blocking(move || s.start_again()).await.expect("start");
    eventually("the store to answer after the start", || async {
        store.stats(q.as_str()).await.ok()
    })
    .await;
    assert_eq!(
        store
            .complete(ItemRef::new(&q, ids[0], &token))
            .await
            .unwrap(),
        Settle::Settled
    );
    let rest = claim(&store, &q, &Holder::random(), 10, MINUTE).await;
    assert_eq!(
        rest.iter().map(|c| c.id).collect::<Vec<_>>(),
        ids[1..].to_vec()
    );
}

/// The work tables have a version track of their own: created at version 1 beside the
/// lease schema, created again on a database that has the lease schema but lost them, and a
/// work table that baton did not create (or a newer work schema) is refused, untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_work_tables_have_their_own_schema_version() {
    let server = shared().await;
    let suffix = std::process::id();
    let url = {
        let name = format!("work_schema_{suffix}_{}", rand_tag());
        blocking(move || server.create_database(&name))
            .await
            .unwrap()
    };
    connect(&url).await;
    let mut conn = raw(&url).await;
    let version: i32 = sqlx::query_scalar(sql::SCHEMA_VERSION_OF)
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(version, sql::SCHEMA_VERSION);

    sqlx::raw_sql(
        "DROP TABLE baton_work_item, baton_work_dedup, baton_work_schedule, baton_work_migration, baton_work_schema",
    )
    .execute(&mut conn)
    .await
    .unwrap();
    let store = connect(&url).await;
    let q = key(&namespace(), KeyKind::Queue, "q");
    added(&store.enqueue(&q, &[item(b"x")]).await.unwrap()[0]);

    execute(&mut conn, "UPDATE baton_work_schema SET version = 42").await;
    let err = refused(&url, "a work schema from the future").await;
    assert_eq!(err.kind(), ErrorKind::Internal, "{err}");
    assert!(err.message().contains("version 42"), "{err}");

    let url = {
        let name = format!("work_stray_{suffix}_{}", rand_tag());
        blocking(move || server.create_database(&name))
            .await
            .unwrap()
    };
    let mut conn = raw(&url).await;
    execute(&mut conn, "CREATE TABLE baton_work_item (id int)").await;
    let err = refused(&url, "a work table baton did not create").await;
    assert_eq!(err.kind(), ErrorKind::Internal, "{err}");
    assert!(err.message().contains("baton_work_item"), "{err}");
}

fn rand_tag() -> u32 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos()
}
