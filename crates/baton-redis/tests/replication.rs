//! The Redis store with replication, against private redis-server processes: a primary and
//! a replica, the replica cut off from the primary, the primary killed, the replica
//! promoted. Fences must never repeat or go backwards across the promotion, and with
//! `min_replicas` a grant is acknowledged only once a replica has it.

use std::time::Duration;

use baton_core::store::{Claim, LeaseStore, Release};
use baton_core::{Holder, Key, KeyKind, Namespace, StoreKey, Ttl};
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
        match store.claim(key, &holder, ttl(), "").await.unwrap() {
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
