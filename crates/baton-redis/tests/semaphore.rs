//! Semaphores on the Redis store: the conformance rules (each on a private redis-server),
//! permits shared by several stores (as several processes would share them), four OS
//! processes' history, and fences across the promotion of a replica that missed permits.

mod common;

use std::sync::Arc;
use std::time::Duration;

use baton_core::conformance::fresh_namespace;
use baton_core::store::{Claim, LeaseRequest, Release};
use baton_core::{Holder, Key, KeyKind, Namespace, Semaphore, SemaphoreStore, StoreKey, Ttl};
use baton_redis::RedisStore;
use baton_testkit::redis::{RedisOptions as ServerOptions, RedisServer};
use baton_testkit::{PermitWorkload, most_permit_holders, permit_order};

baton_core::semaphore_conformance_tests!(common::harness());

/// Four stores (four processes' worth of connections and pub/sub channels), three tasks each,
/// two permits: never more than two hold at once, and a release in one store wakes the waiters
/// of another (the store that waited longest is told).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stores_on_one_server_share_the_permits() {
    let server = common::server().await;
    let mut stores: Vec<Arc<dyn SemaphoreStore>> = Vec::new();
    for _ in 0..4 {
        stores.push(Arc::new(common::store(&server).await));
    }
    let most = most_permit_holders(stores, &fresh_namespace(), "shared", 2, 3).await;
    assert!(most <= 2, "{most} holders of 2 permits");
}

/// A waiter in another store is woken by the release itself, not by its timer: the permit it
/// waits for would not end for a minute.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_wakes_a_waiter_of_another_store() {
    let server = common::server().await;
    let ns = fresh_namespace();
    let a = Semaphore::new(Arc::new(common::store(&server).await), ns.clone(), "w", 1).unwrap();
    let b = Semaphore::new(Arc::new(common::store(&server).await), ns, "w", 1).unwrap();
    let long = baton_core::LockOptions::new(Duration::from_secs(60));
    let held = a.try_acquire(&long).await.unwrap().expect("free");
    let waiter = tokio::spawn(async move {
        let started = tokio::time::Instant::now();
        let got = b
            .acquire(
                &baton_core::LockOptions::new(Duration::from_secs(60))
                    .wait(Duration::from_secs(30)),
            )
            .await
            .expect("the released permit");
        (got, started.elapsed())
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let fence = held.fence();
    held.release().await;
    let (got, waited) = waiter.await.unwrap();
    assert!(got.fence() > fence);
    assert!(
        waited < Duration::from_secs(20),
        "woken by the release, after {waited:?}"
    );
    got.release().await;
}

/// A store told that a permit is free while none of its waiters wants one any more passes
/// the turn on: the store queued behind it is woken by the release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_without_waiters_passes_its_turn_on() {
    let server = common::server().await;
    let ns = fresh_namespace();
    let sem = |store: RedisStore| Semaphore::new(Arc::new(store), ns.clone(), "pass", 1).unwrap();
    let (holder, gone, next) = (
        sem(common::store(&server).await),
        sem(common::store(&server).await),
        sem(common::store(&server).await),
    );
    let long = baton_core::LockOptions::new(Duration::from_secs(60));
    let held = holder.try_acquire(&long).await.unwrap().expect("free");
    // The first waiter queues its store, then gives up.
    let impatient = gone
        .acquire(&long.clone().wait(Duration::from_millis(300)))
        .await
        .expect_err("still held");
    assert!(impatient.is_contended(), "{impatient}");
    let waiter = tokio::spawn(async move {
        next.acquire(
            &baton_core::LockOptions::new(Duration::from_secs(60)).wait(Duration::from_secs(30)),
        )
        .await
        .expect("the released permit")
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = tokio::time::Instant::now();
    held.release().await;
    let got = waiter.await.unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "the turn was passed on, after {:?}",
        started.elapsed()
    );
    got.release().await;
}

/// The permit a release frees is reserved for the store that queued for it (the rule is in
/// `baton_testkit::permit_order`).
#[tokio::test]
async fn a_released_permit_is_reserved_for_the_store_that_queued() {
    let server = common::server().await;
    let (a, b) = (common::store(&server).await, common::store(&server).await);
    let key = fresh_namespace().qualify(KeyKind::Semaphore, &Key::new("reserved").unwrap());
    permit_order::a_released_permit_is_reserved_for_the_store_that_queued(&a, &b, &key).await;
}

/// Stores take permits in the order they queued, the releaser asking again at once last.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stores_take_permits_in_the_order_they_queued() {
    let server = common::server().await;
    let ns = fresh_namespace();
    let key = ns.qualify(KeyKind::Semaphore, &Key::new("fifo").unwrap());
    let queue = format!("{{{}}}:queue", key.as_str());
    let raw = common::raw(&server.url()).await;
    permit_order::stores_take_permits_in_the_order_they_queued(
        || async { Arc::new(common::store(&server).await) as Arc<dyn SemaphoreStore> },
        &ns,
        "fifo",
        || {
            let (mut raw, queue) = (raw.clone(), queue.clone());
            async move {
                redis::cmd("ZCARD")
                    .arg(&queue)
                    .query_async(&mut raw)
                    .await
                    .unwrap()
            }
        },
    )
    .await;
}

/// Four OS processes, each with its store (and its pub/sub channel), share two permits: the
/// merged history never has more than two holders believing they hold at once, and no two
/// permits share a fence.
#[test]
fn four_processes_never_hold_more_than_the_permits() {
    let server = RedisServer::start().expect("a private redis-server");
    let dir = tempfile::tempdir().unwrap();
    PermitWorkload::new(2).run_in_processes(
        "permit_contender_process",
        4,
        dir.path(),
        &[("STORE_URL", &server.url())],
    );
}

#[test]
#[ignore = "a child process of four_processes_never_hold_more_than_the_permits"]
fn permit_contender_process() {
    PermitWorkload::new(2).run_as_child(|| async {
        let url = baton_testkit::process::parent_env("STORE_URL");
        let store: Arc<dyn SemaphoreStore> = Arc::new(RedisStore::connect(&url).await.unwrap());
        Semaphore::new(store, Namespace::default(), "history", 2).unwrap()
    });
}

fn permit_key(user: &str) -> StoreKey {
    Namespace::new("t")
        .unwrap()
        .qualify(KeyKind::Semaphore, &Key::new(user).unwrap())
}

/// Takes and gives back a permit of `key` `times` times; returns the fences.
async fn permits(store: &RedisStore, key: &StoreKey, times: usize) -> Vec<u64> {
    let ttl = Ttl::new(Duration::from_secs(10)).unwrap();
    let mut fences = Vec::new();
    for _ in 0..times {
        let holder = Holder::random();
        match store
            .claim_permit(key, LeaseRequest::new(&holder, ttl), 2)
            .await
            .unwrap()
        {
            Claim::Granted { fence } => fences.push(fence.get()),
            other => panic!("expected a permit of {key}, got {other:?}"),
        }
        assert_eq!(
            store.release_permit(key, &holder).await.unwrap(),
            Release::Removed
        );
    }
    fences
}

/// As for locks: three permits replicated, the replica cut off, three more on the primary, the
/// primary killed and the replica promoted. The permits on the promoted replica still get
/// fences above all six.
#[tokio::test]
async fn fences_never_repeat_after_a_lagging_replica_is_promoted() {
    let (primary, replica) = tokio::task::spawn_blocking(|| {
        let primary = RedisServer::start().expect("a private redis-server");
        let replica = RedisServer::start_replica_of(&primary, ServerOptions::new())
            .expect("a private replica");
        (primary, replica)
    })
    .await
    .unwrap();
    let store = RedisStore::connect(&primary.url()).await.unwrap();
    let key = permit_key("promoted");
    let mut before = permits(&store, &key, 3).await;
    assert_eq!(
        primary
            .wait_for_replicas(1, Duration::from_secs(3))
            .unwrap(),
        1,
        "the replica has the first three permits"
    );
    replica.cut_off_replication().unwrap();
    before.extend(permits(&store, &key, 3).await);
    drop(store);
    primary.kill();
    replica.promote().unwrap();

    let promoted = RedisStore::connect(&replica.url()).await.unwrap();
    let after = permits(&promoted, &key, 3).await;
    let last = *before.iter().max().unwrap();
    assert!(
        after.iter().all(|f| *f > last),
        "fences repeated or went back across the promotion: before {before:?}, after {after:?}"
    );
    assert!(after.windows(2).all(|w| w[0] < w[1]), "{after:?}");
}

/// `min_replicas=1` with the replica cut off: a permit claim is `Unavailable`, not granted,
/// and the permit it took on the primary is given back; a renewal and a release of a
/// confirmed permit are `Unavailable` too. As for a lock's grant.
#[tokio::test]
async fn with_min_replicas_an_unconfirmed_permit_is_unavailable_and_given_back() {
    let (primary, replica) = tokio::task::spawn_blocking(|| {
        let primary = RedisServer::start().expect("a private redis-server");
        let replica = RedisServer::start_replica_of(&primary, ServerOptions::new())
            .expect("a private replica");
        (primary, replica)
    })
    .await
    .unwrap();
    let url = format!("{}?min_replicas=1&response_timeout=2s", primary.url());
    let store = RedisStore::connect(&url).await.unwrap();
    let plain = RedisStore::connect(&primary.url()).await.unwrap();
    let key = permit_key("unconfirmed");
    let ttl = Ttl::new(Duration::from_secs(10)).unwrap();
    let holder = Holder::random();
    assert!(matches!(
        store
            .claim_permit(&key, LeaseRequest::new(&holder, ttl), 1)
            .await
            .unwrap(),
        Claim::Granted { .. }
    ));

    replica.cut_off_replication().unwrap();
    let err = store.renew_permit(&key, &holder, ttl).await.unwrap_err();
    assert_eq!(err.kind(), baton_core::ErrorKind::Unavailable, "{err}");
    assert!(err.message().contains("0 of the 1 replicas"), "{err}");
    let err = store.release_permit(&key, &holder).await.unwrap_err();
    assert_eq!(err.kind(), baton_core::ErrorKind::Unavailable, "{err}");
    assert!(
        plain.permits(&key).await.unwrap().is_empty(),
        "given back on the primary"
    );

    let other = Holder::random();
    let err = store
        .claim_permit(&key, LeaseRequest::new(&other, ttl), 1)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), baton_core::ErrorKind::Unavailable, "{err}");
    // The unconfirmed permit is given back: the permit is free on the primary again.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
    while !plain.permits(&key).await.unwrap().is_empty() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the unconfirmed permit was not given back"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(matches!(
        plain
            .claim_permit(&key, LeaseRequest::new(&other, ttl), 1)
            .await
            .unwrap(),
        Claim::Granted { .. }
    ));
}

/// Through Sentinel (a `redis+sentinel://` URL), the store keeps semaphores as it keeps
/// locks: permits are granted on the primary, and when the primary is killed and a replica
/// promoted, a waiter of another store queued before the failover is granted on the new
/// primary, with a fence above every permit before it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_sentinel_permits_carry_on_across_a_failover() {
    let topology = Arc::new(
        tokio::task::spawn_blocking(baton_testkit::sentinel::SentinelTopology::start)
            .await
            .unwrap()
            .expect("a private Sentinel topology (apt-get install redis-sentinel)"),
    );
    let url = format!("{}?connect_timeout=1s&response_timeout=1s", topology.url());
    let ns = fresh_namespace();
    let a = Semaphore::new(
        Arc::new(RedisStore::connect(&url).await.unwrap()),
        ns.clone(),
        "s",
        2,
    )
    .unwrap();
    let b = Semaphore::new(
        Arc::new(RedisStore::connect(&url).await.unwrap()),
        ns,
        "s",
        2,
    )
    .unwrap();
    let short = baton_core::LockOptions::new(Duration::from_secs(3));
    let first = a.try_acquire(&short).await.unwrap().expect("free");
    let second = a.try_acquire(&short).await.unwrap().expect("free");
    assert!(
        b.try_acquire(&short).await.unwrap().is_none(),
        "both are held"
    );
    let last = second.fence();
    let waiter = tokio::spawn(async move {
        b.acquire(
            &baton_core::LockOptions::new(Duration::from_secs(10)).wait(Duration::from_secs(90)),
        )
        .await
        .expect("one acquire carried on through the failover")
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let old = topology.primary_port().unwrap();
    assert_eq!(
        topology
            .server(old)
            .unwrap()
            .wait_for_replicas(1, Duration::from_secs(3))
            .unwrap(),
        1,
        "the permits are on the replica before the primary dies"
    );
    let moved = Arc::clone(&topology);
    tokio::task::spawn_blocking(move || {
        moved.kill(old).unwrap();
        moved.wait_for_failover(old, Duration::from_secs(60))
    })
    .await
    .unwrap()
    .unwrap_or_else(|e| panic!("{e}"));
    let got = waiter.await.unwrap();
    assert!(got.fence() > last, "{} after {last}", got.fence());
    // The permits taken before the failover ended with their TTL (their holders' releases
    // may have reached the old primary or nobody).
    first.release().await;
    second.release().await;
    got.release().await;
}

/// `SCRIPT FLUSH` before every permit call: the store loads the script again and the answers
/// are the real ones, so `NOSCRIPT` is never taken for "not held".
#[tokio::test]
async fn flushed_permit_scripts_are_reloaded_and_never_read_as_not_held() {
    let server = common::server().await;
    let store = common::store(&server).await;
    let key = permit_key("flushed");
    let ttl = Ttl::new(Duration::from_secs(30)).unwrap();
    let (a, b) = (Holder::random(), Holder::random());
    let flush = || {
        let reply = server
            .command_ok(&["SCRIPT", "FLUSH"])
            .expect("SCRIPT FLUSH");
        assert_eq!(reply.as_text().as_deref(), Some("OK"));
    };
    flush();
    assert!(matches!(
        store
            .claim_permit(&key, LeaseRequest::new(&a, ttl), 1)
            .await
            .unwrap(),
        Claim::Granted { .. }
    ));
    flush();
    assert!(matches!(
        store
            .claim_permit(&key, LeaseRequest::new(&b, ttl), 1)
            .await
            .unwrap(),
        Claim::Held { holder, .. } if holder == a
    ));
    flush();
    assert_eq!(
        store.renew_permit(&key, &a, ttl).await.unwrap(),
        baton_core::store::Renewal::Renewed
    );
    flush();
    assert_eq!(store.permits(&key).await.unwrap().len(), 1);
    flush();
    assert_eq!(
        store.release_permit(&key, &a).await.unwrap(),
        Release::Removed
    );
}

/// A store that cannot reach its server answers `Unavailable`, never contention: the atoms
/// fail with that kind, and an acquire that waits fails with `AcquireError::Unavailable`.
#[tokio::test]
async fn a_killed_server_is_unavailable_not_contention() {
    let server = Arc::new(common::server().await);
    let store = Arc::new(common::store(&server).await);
    let key = permit_key("down");
    let ttl = Ttl::new(Duration::from_secs(30)).unwrap();
    let holder = Holder::random();
    common::kill(&server).await;
    let err = store
        .claim_permit(&key, LeaseRequest::new(&holder, ttl), 1)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), baton_core::ErrorKind::Unavailable, "{err}");
    let err = store.renew_permit(&key, &holder, ttl).await.unwrap_err();
    assert_eq!(err.kind(), baton_core::ErrorKind::Unavailable, "{err}");
    let err = store.release_permit(&key, &holder).await.unwrap_err();
    assert_eq!(err.kind(), baton_core::ErrorKind::Unavailable, "{err}");
    let err = store.permits(&key).await.unwrap_err();
    assert_eq!(err.kind(), baton_core::ErrorKind::Unavailable, "{err}");
    let sem = Semaphore::new(store, fresh_namespace(), "down", 1).unwrap();
    let err = sem
        .acquire(
            &baton_core::LockOptions::new(Duration::from_secs(30)).wait(Duration::from_secs(1)),
        )
        .await
        .expect_err("the server is down");
    assert!(
        matches!(err, baton_core::AcquireError::Unavailable(_)),
        "{err}"
    );
}
