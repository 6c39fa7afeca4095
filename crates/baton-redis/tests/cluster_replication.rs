//! `min_replicas` on a Redis Cluster: every claim, renewal and release of a grant or permit
//! is confirmed by `WAIT` on its key's master, so a write that master's replicas did not
//! acknowledge is `Unavailable` (and a grant it made is freed again), while keys on the other
//! masters are unaffected.
//!
//! The test starts a cluster of its own (three masters, three replicas on loopback) and
//! pauses one replica with SIGSTOP. The four-process history through a SIGKILLed master with
//! `min_replicas` is in `cluster_history.rs`.

use std::time::Duration;

use baton_core::semaphore::SemaphoreStore;
use baton_core::store::{Claim, LeaseRequest, LeaseStore, Release, Renewal};
use baton_core::telemetry::events;
use baton_core::{ErrorKind, Holder, Key, KeyKind, Namespace, StoreKey, Ttl};
use baton_redis::RedisClusterStore;
use baton_testkit::capture::{capture_events, events as captured, eventually};
use baton_testkit::redis_cluster::RedisCluster;

fn ttl() -> Ttl {
    Ttl::new(Duration::from_secs(30)).unwrap()
}

/// The first lock key named `prefix-N` whose slot `cluster` serves from a master for which
/// `wanted` holds.
fn key_on(cluster: &RedisCluster, prefix: &str, wanted: impl Fn(u16) -> bool) -> StoreKey {
    (0..)
        .map(|n| {
            Namespace::default().qualify(KeyKind::Lock, &Key::new(format!("{prefix}-{n}")).unwrap())
        })
        .find(|key| {
            wanted(
                cluster
                    .master_for(&format!("{{{}}}", key.as_str()))
                    .unwrap(),
            )
        })
        .unwrap()
}

fn granted(claim: &Claim) -> bool {
    matches!(claim, Claim::Granted { .. })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_min_replicas_writes_the_keys_replica_missed_are_unavailable_and_undone() {
    capture_events();
    let cluster = tokio::task::spawn_blocking(RedisCluster::start)
        .await
        .unwrap()
        .expect("a private Redis Cluster");
    let url = format!(
        "{}?min_replicas=1&response_timeout=2s&connect_timeout=1s",
        cluster.url()
    );
    let store = RedisClusterStore::connect(&url).await.unwrap();
    assert_eq!(store.options().get_min_replicas(), 1);
    let plain = RedisClusterStore::connect(&cluster.url()).await.unwrap();
    let key = key_on(&cluster, "confirmed", |_| true);
    let master = cluster
        .master_for(&format!("{{{}}}", key.as_str()))
        .unwrap();
    let replica = cluster.replica_of(master).unwrap();
    let elsewhere = key_on(&cluster, "elsewhere", |m| m != master);
    let semaphore = key_on(&cluster, "permits", |m| m == master);

    // With the replica up, every write is confirmed.
    let holder = Holder::random();
    let claim = store
        .claim(&key, LeaseRequest::new(&holder, ttl()))
        .await
        .unwrap();
    assert!(granted(&claim), "{claim:?}");
    assert_eq!(
        store.renew(&key, &holder, ttl()).await.unwrap(),
        Renewal::Renewed
    );
    let claim = store
        .claim_permit(&semaphore, LeaseRequest::new(&holder, ttl()), 2)
        .await
        .unwrap();
    assert!(granted(&claim), "{claim:?}");

    cluster.node(replica).unwrap().pause().unwrap();
    let unconfirmed = || {
        captured(&events::REDIS_REPLICATION_UNCONFIRMED, |e| {
            e.message.contains("0 of the 1 replicas")
        })
        .len()
    };
    let before = unconfirmed();

    // A renewal and a release the replica missed are Unavailable; the release did free the
    // key on the master.
    let e = store.renew(&key, &holder, ttl()).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    assert!(e.message().contains("0 of the 1 replicas"), "{e}");
    let e = store.release(&key, &holder).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    assert_eq!(plain.inspect(&key).await.unwrap(), None, "released");

    // A grant the replica missed is not handed out, and is freed again.
    let other = Holder::random();
    let e = store
        .claim(&key, LeaseRequest::new(&other, ttl()))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    assert_eq!(
        plain.inspect(&key).await.unwrap(),
        None,
        "the grant is freed"
    );

    // The same for permits: the permit is given back, the holder's earlier one stays.
    let e = store
        .claim_permit(&semaphore, LeaseRequest::new(&other, ttl()), 2)
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    let holders: Vec<Holder> = plain
        .permits(&semaphore)
        .await
        .unwrap()
        .into_iter()
        .map(|p| p.holder)
        .collect();
    assert_eq!(holders, vec![holder.clone()], "only the confirmed permit");
    let e = store
        .renew_permit(&semaphore, &holder, ttl())
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    let e = store.release_permit(&semaphore, &holder).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    assert!(plain.permits(&semaphore).await.unwrap().is_empty());
    assert!(
        unconfirmed() >= before + 6,
        "each unconfirmed write emits the event"
    );

    // A key whose master's replica runs is unaffected.
    let claim = store
        .claim(&elsewhere, LeaseRequest::new(&holder, ttl()))
        .await
        .unwrap();
    assert!(granted(&claim), "{claim:?}");
    assert_eq!(
        store.release(&elsewhere, &holder).await.unwrap(),
        Release::Removed
    );

    // Once the replica is back, writes on its master are confirmed again.
    cluster.node(replica).unwrap().resume().unwrap();
    let claim = eventually("a confirmed grant once the replica is back", || async {
        match store.claim(&key, LeaseRequest::new(&other, ttl())).await {
            Ok(claim) => Some(claim),
            Err(e) => {
                assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
                None
            }
        }
    })
    .await;
    assert!(granted(&claim), "{claim:?}");
    assert_eq!(store.release(&key, &other).await.unwrap(), Release::Removed);
}
