//! Semaphores on the PostgreSQL store: the conformance rules (on the test binary's shared
//! server, each rule in a namespace of its own), and permits shared by several stores, as
//! several processes would share them.

mod common;

use std::sync::Arc;
use std::time::Duration;

use baton_core::conformance::{Opens, fresh_namespace};
use baton_core::store::{Claim, LeaseRequest, Release};
use baton_core::{Holder, Key, KeyKind, LockOptions, Semaphore, SemaphoreStore, Ttl};

use baton_postgres::PostgresStore;
use baton_testkit::postgres::PostgresServer;
use baton_testkit::{PermitWorkload, most_permit_holders};
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

/// The permit a release frees is reserved for the store that queued for it: a claim from
/// elsewhere (here the releasing store, asking again at once) finds it held by the
/// reservation, the reservation is no holder, and the queued store's next claim takes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_released_permit_is_reserved_for_the_store_that_queued() {
    let url = shared().await.url();
    let (a, b) = (connect(&url).await, connect(&url).await);
    let key = fresh_namespace().qualify(KeyKind::Semaphore, &Key::new("reserved").unwrap());
    let ttl = Ttl::new(Duration::from_secs(60)).unwrap();
    let (first, waiting, again) = (Holder::random(), Holder::random(), Holder::random());
    let claim = async |store: &PostgresStore, holder: &Holder| {
        store
            .claim_permit(&key, LeaseRequest::new(holder, ttl), 1)
            .await
            .unwrap()
    };
    assert!(matches!(claim(&a, &first).await, Claim::Granted { .. }));
    // A waiter of b's process waits for the key: b's claim queues b.
    let _waits = b.permit_wakeups().hub.subscribe(&key);
    assert!(matches!(claim(&b, &waiting).await, Claim::Held { .. }));
    assert_eq!(
        a.release_permit(&key, &first).await.unwrap(),
        Release::Removed
    );
    match claim(&a, &again).await {
        Claim::Held { holder, remaining } => {
            assert!(
                holder.as_str().starts_with("handoff:"),
                "held by the reservation, not {holder}"
            );
            assert!(remaining <= Duration::from_millis(250), "{remaining:?}");
        }
        other => panic!("the releaser cut in before the queued store: {other:?}"),
    }
    assert!(
        a.permits(&key).await.unwrap().is_empty(),
        "a reservation is not a holder"
    );
    assert!(matches!(claim(&b, &waiting).await, Claim::Granted { .. }));
    assert_eq!(
        b.release_permit(&key, &waiting).await.unwrap(),
        Release::Removed
    );
}

/// Stores take permits in the order they queued. With the only permit held, three other
/// stores queue one after another; the holder gives its permit back and asks again at once,
/// and still comes last.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stores_take_permits_in_the_order_they_queued() {
    let url = shared().await.url();
    let ns = fresh_namespace();
    let key = ns.qualify(KeyKind::Semaphore, &Key::new("fifo").unwrap());
    let mut conn = raw(&url).await;
    let sem =
        |store: PostgresStore| Semaphore::new(Arc::new(store), ns.clone(), "fifo", 1).unwrap();
    let long = LockOptions::new(Duration::from_secs(60));
    let mine = sem(connect(&url).await);
    let held = mine.try_acquire(&long).await.unwrap().expect("free");
    let mut waiters = Vec::new();
    for queued in 1..=3 {
        let other = sem(connect(&url).await);
        let wait = long.clone().wait(Duration::from_secs(30));
        waiters.push(tokio::spawn(async move {
            let got = other.acquire(&wait).await.expect("its turn");
            let fence = got.fence().get();
            got.release().await;
            fence
        }));
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            let n: i64 = sqlx::query_scalar("SELECT count(*) FROM baton_wait WHERE key = $1")
                .bind(key.as_str())
                .fetch_one(&mut conn)
                .await
                .unwrap();
            if n == queued {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{queued} stores queued"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    held.release().await;
    let again = mine
        .acquire(&long.clone().wait(Duration::from_secs(30)))
        .await
        .expect("a permit after the others");
    let mut fences = Vec::new();
    for waiter in waiters {
        fences.push(waiter.await.unwrap());
    }
    assert!(
        fences.windows(2).all(|w| w[0] < w[1]),
        "permits follow the order of queueing: {fences:?}"
    );
    assert!(
        again.fence().get() > fences[2],
        "the releaser asked again at once and still came last: {} before {fences:?}",
        again.fence()
    );
    again.release().await;
}
