//! The Redis store with replication, against private redis-server processes: a primary and
//! a replica, the replica cut off from the primary, the primary killed, the replica
//! promoted. Fences must never repeat or go backwards across the promotion, and with
//! `min_replicas` a grant is acknowledged only once a replica has it.

mod common;

use std::time::Duration;

use baton_core::store::{Claim, LeaseRequest, LeaseStore, Release, Renewal};
use baton_core::telemetry::events;
use baton_core::{ErrorKind, Holder, Key, KeyKind, Namespace, StoreKey, Ttl};
use baton_redis::RedisStore;
use baton_testkit::redis::{RedisOptions as ServerOptions, RedisServer};

fn key(user: &str) -> StoreKey {
    Namespace::new("t")
        .unwrap()
        .qualify(KeyKind::Lock, &Key::new(user).unwrap())
}

fn ttl() -> Ttl {
    Ttl::new(Duration::from_secs(10)).unwrap()
}

/// Claims and releases `key` `times` times on `store`; returns the fences.
async fn grants(store: &RedisStore, key: &StoreKey, times: usize) -> Vec<u64> {
    let mut fences = Vec::new();
    for _ in 0..times {
        let holder = Holder::random();
        match store
            .claim(key, LeaseRequest::new(&holder, ttl()))
            .await
            .unwrap()
        {
            Claim::Granted { fence } => fences.push(fence.get()),
            other => panic!("expected a grant of {key}, got {other:?}"),
        }
        assert_eq!(store.release(key, &holder).await.unwrap(), Release::Removed);
    }
    fences
}

/// A primary and a synchronized replica.
async fn pair() -> (RedisServer, RedisServer) {
    tokio::task::spawn_blocking(|| {
        let primary = RedisServer::start().expect("a private redis-server");
        let replica = RedisServer::start_replica_of(&primary, ServerOptions::new())
            .expect("a private replica");
        (primary, replica)
    })
    .await
    .unwrap()
}

/// The reported failure: three grants replicated, the replica cut off, three more grants on
/// the primary, the primary killed and the replica promoted. The replica holds the fence
/// counter with the value of the third grant; the grants on the promoted replica must
/// still get fences above all six.
#[tokio::test]
async fn fences_never_repeat_after_a_lagging_replica_is_promoted() {
    let (primary, replica) = pair().await;
    let store = RedisStore::connect(&primary.url()).await.unwrap();
    let key = key("promoted");
    let mut before = grants(&store, &key, 3).await;
    assert_eq!(
        primary
            .wait_for_replicas(1, Duration::from_secs(3))
            .unwrap(),
        1,
        "the replica has the first three grants"
    );
    replica.cut_off_replication().unwrap();
    before.extend(grants(&store, &key, 3).await);
    drop(store);
    primary.kill();
    replica.promote().unwrap();

    let promoted = RedisStore::connect(&replica.url()).await.unwrap();
    let after = grants(&promoted, &key, 3).await;
    let last = *before.iter().max().unwrap();
    assert!(
        after.iter().all(|f| *f > last),
        "fences repeated or went back across the promotion: before {before:?}, after {after:?}"
    );
    assert!(after.windows(2).all(|w| w[0] < w[1]), "{after:?}");
}

/// `min_replicas=1`: an acknowledged grant is on the replica, so a replica promoted after
/// the primary is killed still has it, and nobody else is granted the key there.
#[tokio::test]
async fn with_min_replicas_an_acknowledged_grant_survives_the_promotion() {
    let (primary, replica) = pair().await;
    // Generous: on a loaded machine the replica's acknowledgement may take a while.
    let url = format!("{}?min_replicas=1&response_timeout=4s", primary.url());
    let store = RedisStore::connect(&url).await.unwrap();
    assert_eq!(store.options().get_min_replicas(), 1);
    let key = key("replicated");
    let holder = Holder::random();
    let fence = match store
        .claim(&key, LeaseRequest::new(&holder, ttl()))
        .await
        .unwrap()
    {
        Claim::Granted { fence } => fence,
        other => panic!("expected a grant, got {other:?}"),
    };
    assert_eq!(
        store.renew(&key, &holder, ttl()).await.unwrap(),
        Renewal::Renewed
    );
    // No WAIT of the test's own: the store's acknowledgement alone says the replica has it.
    replica.cut_off_replication().unwrap();
    drop(store);
    primary.kill();
    replica.promote().unwrap();
    let promoted = RedisStore::connect(&replica.url()).await.unwrap();
    let info = promoted
        .inspect(&key)
        .await
        .unwrap()
        .expect("the grant survived");
    assert_eq!((info.holder, info.fence), (holder.clone(), fence));
    match promoted
        .claim(&key, LeaseRequest::new(&Holder::random(), ttl()))
        .await
        .unwrap()
    {
        Claim::Held { holder: by, .. } => assert_eq!(by, holder),
        other => panic!("a second holder across the failover: {other:?}"),
    }
}

/// `min_replicas=1` with the replica cut off: a claim is `Unavailable`, not granted, the
/// grant it made on the primary is freed again, and the registered event names the server;
/// a renewal and a release are `Unavailable` too.
#[tokio::test]
async fn with_min_replicas_an_unconfirmed_grant_is_unavailable_and_freed() {
    let events = common::Events::capture();
    let (primary, replica) = pair().await;
    let url = format!("{}?min_replicas=1&response_timeout=2s", primary.url());
    let store = RedisStore::connect(&url).await.unwrap();
    let plain = RedisStore::connect(&primary.url()).await.unwrap();
    let key = key("unconfirmed");
    let holder = Holder::random();
    assert!(matches!(
        store
            .claim(&key, LeaseRequest::new(&holder, ttl()))
            .await
            .unwrap(),
        Claim::Granted { .. }
    ));

    replica.cut_off_replication().unwrap();
    let err = store.renew(&key, &holder, ttl()).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(err.message().contains("0 of the 1 replicas"), "{err}");
    let err = store.release(&key, &holder).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert_eq!(
        plain.inspect(&key).await.unwrap(),
        None,
        "released on the primary"
    );

    let other = Holder::random();
    let err = store
        .claim(&key, LeaseRequest::new(&other, ttl()))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    let server = format!("127.0.0.1:{}", primary.port());
    assert!(
        events.count(events::REDIS_REPLICATION_UNCONFIRMED.key, &server) >= 3,
        "{:?}",
        events.all()
    );
    // The unconfirmed grant is freed: the key is free on the primary again.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
    while plain.inspect(&key).await.unwrap().is_some() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the unconfirmed grant was not freed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(matches!(
        plain
            .claim(&key, LeaseRequest::new(&other, ttl()))
            .await
            .unwrap(),
        Claim::Granted { .. }
    ));
}

/// `min_replicas=1`: a grant must be confirmed by replicas before anyone relies on it, which
/// a hand-over message cannot wait for. So a waiting store is queued without naming its
/// holder (`{Q}:who`), the release reserves the key for it, and its waiter's own claim,
/// confirmed by the replica, takes the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_min_replicas_a_waiter_takes_its_turn_with_a_confirmed_claim() {
    use std::sync::Arc;

    use baton_core::{LockOptions, Locks};

    let (primary, _replica) = pair().await;
    let url = format!("{}?min_replicas=1&response_timeout=4s", primary.url());
    let open = || async {
        Locks::with_namespace(
            Arc::new(RedisStore::connect(&url).await.unwrap()),
            Namespace::new("t").unwrap(),
        )
    };
    let (a, b) = (open().await, open().await);
    let long = LockOptions::new(Duration::from_secs(10)).wait(Duration::from_secs(10));
    let guard = a.acquire("k", &long).await.unwrap();
    let held = guard.fence();
    let waiter = tokio::spawn(async move { b.acquire("k", &long).await });
    let mut raw = common::raw(&primary.url()).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let queued: i64 = redis::cmd("ZCARD")
            .arg("{t:lock:k}:queue")
            .query_async(&mut raw)
            .await
            .unwrap();
        if queued == 1 {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "b did not queue");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let named: i64 = redis::cmd("EXISTS")
        .arg("{t:lock:k}:who")
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(named, 0, "no hand-over with min_replicas");
    guard.release().await;
    let next = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("the release hands the turn to b long before the TTL")
        .unwrap()
        .unwrap();
    assert!(next.fence() > held);
    next.release().await;
}
