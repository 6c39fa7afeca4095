//! Semaphores on the PostgreSQL store: the conformance rules (on the test binary's shared
//! server, each rule in a namespace of its own), and permits shared by several stores, as
//! several processes would share them.

mod common;

use std::sync::Arc;

use baton_core::conformance::{Opens, fresh_namespace};
use baton_core::{Key, KeyKind, Semaphore, SemaphoreStore};

use baton_testkit::postgres::PostgresServer;
use baton_testkit::{PermitWorkload, most_permit_holders, permit_order};
use common::*;

baton_core::semaphore_conformance_tests!(harness());

/// Three stores (three processes' worth of pools and LISTEN connections), four tasks each,
/// two permits: never more than two hold at once, and a release in one store wakes the
/// waiters of the others (through `baton_released`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stores_share_the_permits() {
    let mut stores: Vec<Arc<dyn SemaphoreStore>> = Vec::new();
    for _ in 0..3 {
        stores.push(harness().await.open().await);
    }
    let most = most_permit_holders(stores, &fresh_namespace(), "shared", 2, 4).await;
    assert!(most <= 2, "{most} holders of 2 permits");
}

/// Four OS processes, each with its store (and its LISTEN connection), share two permits:
/// the merged history never has more than two holders believing they hold at once, and no
/// two permits share a fence.
#[test]
fn four_processes_never_hold_more_than_the_permits() {
    let dir = tempfile::tempdir().unwrap();
    let url = PostgresServer::shared().url();
    PermitWorkload::new(2).run_in_processes(
        "permit_contender_process",
        4,
        dir.path(),
        &[("STORE_URL", &url)],
    );
}

#[test]
#[ignore = "a child process of four_processes_never_hold_more_than_the_permits"]
fn permit_contender_process() {
    PermitWorkload::new(2).run_as_child(|| async {
        let url = baton_testkit::process::parent_env("STORE_URL");
        // The default namespace: every process must reach the same key (the other tests on
        // the shared server use namespaces of their own).
        let store: Arc<dyn SemaphoreStore> = Arc::new(connect(&url).await);
        Semaphore::new(store, baton_core::Namespace::default(), "history", 2).unwrap()
    });
}

/// The permit a release frees is reserved for the store that queued for it (the rule is in
/// `baton_testkit::permit_order`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_released_permit_is_reserved_for_the_store_that_queued() {
    let url = shared().await.url();
    let (a, b) = (connect(&url).await, connect(&url).await);
    let key = fresh_namespace().qualify(KeyKind::Semaphore, &Key::new("reserved").unwrap());
    permit_order::a_released_permit_is_reserved_for_the_store_that_queued(&a, &b, &key).await;
}

/// Stores take permits in the order they queued, the releaser asking again at once last.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stores_take_permits_in_the_order_they_queued() {
    let url = shared().await.url();
    let ns = fresh_namespace();
    let key = ns.qualify(KeyKind::Semaphore, &Key::new("fifo").unwrap());
    let conn = Arc::new(tokio::sync::Mutex::new(raw(&url).await));
    permit_order::stores_take_permits_in_the_order_they_queued(
        || async { Arc::new(connect(&url).await) as Arc<dyn SemaphoreStore> },
        &ns,
        "fifo",
        || {
            let (conn, key) = (Arc::clone(&conn), key.clone());
            async move {
                let n: i64 = sqlx::query_scalar("SELECT count(*) FROM baton_wait WHERE key = $1")
                    .bind(key.as_str())
                    .fetch_one(&mut *conn.lock().await)
                    .await
                    .unwrap();
                usize::try_from(n).unwrap()
            }
        },
    )
    .await;
}

/// A claim does not wait for another claim of the same key that is still committing: while
/// one claim's transaction has taken the first slot and not committed (as a claim waiting
/// for its WAL flush has), ten claims in turn each take the second slot at once, instead of
/// choosing the first and waiting on its uncommitted row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_does_not_wait_for_a_concurrent_claim_still_committing() {
    use std::time::Duration;

    use baton_core::store::{Claim, LeaseRequest, Release};
    use baton_core::{Holder, Ttl};
    use sqlx::Row;

    let url = shared().await.url();
    let store = connect(&url).await;
    let key = fresh_namespace().qualify(KeyKind::Semaphore, &Key::new("committing").unwrap());
    let mut committing = raw(&url).await;
    execute(&mut committing, "BEGIN").await;
    let first = sqlx::query(baton_postgres::semaphore::CLAIM)
        .bind(key.as_str())
        .bind("committing")
        .bind(30_000_i64)
        .bind(2_i64)
        .bind(None::<i32>)
        .fetch_one(&mut committing)
        .await
        .unwrap();
    assert_eq!(first.get::<String, _>("outcome"), "granted");
    let ttl = Ttl::new(Duration::from_secs(30)).unwrap();
    for _ in 0..10 {
        let holder = Holder::random();
        let claim = tokio::time::timeout(
            Duration::from_secs(2),
            store.claim_permit(&key, LeaseRequest::new(&holder, ttl), 2),
        )
        .await
        .expect("the claim waited for the uncommitted one");
        assert!(matches!(claim, Ok(Claim::Granted { .. })), "{claim:?}");
        let release = store.release_permit(&key, &holder).await.unwrap();
        assert_eq!(release, Release::Removed);
    }
    execute(&mut committing, "ROLLBACK").await;
}
