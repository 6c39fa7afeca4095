//! Member failures: the client moves to another member, fences keep increasing, because
//! they are the cluster's revisions, not a member's, and idempotency records and cached
//! values the cluster acknowledged survive the loss of the leader.

mod common;

use std::time::Duration;

use baton_core::conformance::fresh_namespace;
use baton_core::store::{Claim, LeaseRequest, LeaseStore, Release};
use baton_core::telemetry::events;
use baton_core::{Holder, Key, KeyKind, StoreKey, Ttl};
use baton_etcd::EtcdStore;
use tokio::time::{Instant, sleep};

/// Calls `read` until the cluster answers (riding out a failover's errors, at most
/// 20s); the answer.
async fn once_served<T, F, Fut>(what: &str, mut read: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = baton_core::Result<T>>,
{
    let started = Instant::now();
    loop {
        match read().await {
            Ok(answer) => return answer,
            Err(e) => {
                assert!(
                    e.is_unavailable(),
                    "{what}: a member failure is Unavailable: {e}"
                );
                assert!(
                    started.elapsed() < Duration::from_secs(20),
                    "{what}: no member served within 20s: {e}"
                );
                sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// Claims `key` for a fresh holder until it is granted (riding out the errors of a
/// failover, at most 20s), releases it, and returns the fence.
async fn grant_and_release(store: &EtcdStore, key: &StoreKey) -> u64 {
    let holder = Holder::random();
    let ttl = Ttl::new(Duration::from_secs(5)).unwrap();
    let claim = once_served("a claim", || {
        store.claim(key, LeaseRequest::new(&holder, ttl))
    })
    .await;
    let Claim::Granted { fence } = claim else {
        panic!("nobody else claims {key}: {claim:?}");
    };
    // The release may meet the failover too; the TTL is the backstop.
    let released = store.release(key, &holder).await;
    assert!(
        matches!(released, Ok(Release::Removed) | Err(_)),
        "{released:?}"
    );
    if released.is_err() {
        sleep(Duration::from_secs(6)).await;
    }
    fence.get()
}

/// SIGKILL of the member the client talks to (the leader, which every write reaches, and
/// then each member in turn): grants go on through the others, with fences strictly
/// increasing across the failures and the restarts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fences_strictly_increase_across_a_sigkill_of_a_member() {
    let cluster = common::private_cluster().await;
    let store = common::store(&cluster).await;
    let key = fresh_namespace().qualify(KeyKind::Lock, &Key::new("k").unwrap());
    let mut fences = vec![grant_and_release(&store, &key).await];
    for round in 0..3 {
        // The leader first; then the member the client's requests reached last time is as
        // likely as any to be the next leader.
        let victim = {
            let cluster = cluster.clone();
            tokio::task::spawn_blocking(move || cluster.leader().unwrap())
                .await
                .unwrap()
        };
        {
            let cluster = cluster.clone();
            tokio::task::spawn_blocking(move || cluster.kill(victim))
                .await
                .unwrap();
        }
        // Grants during the failure, through the two members left.
        for _ in 0..3 {
            fences.push(grant_and_release(&store, &key).await);
        }
        {
            let cluster = cluster.clone();
            tokio::task::spawn_blocking(move || cluster.restart(victim))
                .await
                .unwrap()
                .unwrap_or_else(|e| panic!("round {round}: member {victim} restarts: {e}"));
        }
        fences.push(grant_and_release(&store, &key).await);
    }
    assert!(
        fences.windows(2).all(|w| w[0] < w[1]),
        "fences must strictly increase: {fences:?}"
    );
}

/// A store whose URL names only members that are down answers `Unavailable` within its
/// timeouts, never contention; with one member left of three, the cluster has no quorum,
/// and the same holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_quorum_is_unavailable_not_contention() {
    let cluster = common::private_cluster().await;
    let store = common::store(&cluster).await;
    let key = fresh_namespace().qualify(KeyKind::Lock, &Key::new("k").unwrap());
    let holder = Holder::random();
    let ttl = Ttl::new(Duration::from_secs(5)).unwrap();
    {
        let cluster = cluster.clone();
        tokio::task::spawn_blocking(move || {
            cluster.kill(0);
            cluster.kill(1);
        })
        .await
        .unwrap();
    }
    let started = Instant::now();
    let e = store
        .claim(&key, LeaseRequest::new(&holder, ttl))
        .await
        .unwrap_err();
    assert!(e.is_unavailable(), "{e}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    let e = EtcdStore::connect(&format!(
        "{}?connect_timeout=200ms&response_timeout=500ms",
        cluster.member_url(2)
    ))
    .await
    .unwrap_err();
    assert!(e.is_unavailable(), "{e}");
}

/// A URL that names a member that is down (here a port nothing listens on) beside the three
/// that serve: requests the client sends to the dead one never left this process, so they go
/// again to a member that answers, and no call fails; each miss is reported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_that_is_down_costs_no_call() {
    baton_testkit::capture::capture_events();
    let cluster = common::cluster().await;
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let members: Vec<String> = (0..cluster.len())
        .map(|i| cluster.client_addr(i).to_string())
        .collect();
    let url = format!(
        "etcd://127.0.0.1:{closed},{}?connect_timeout=1s&response_timeout=2s",
        members.join(",")
    );
    let store = EtcdStore::connect(&url)
        .await
        .expect("three members of four answer");
    let key = fresh_namespace().qualify(KeyKind::Lock, &Key::new("k").unwrap());
    let ttl = Ttl::new(Duration::from_secs(5)).unwrap();
    for _ in 0..30 {
        let holder = Holder::random();
        let claimed = store.claim(&key, LeaseRequest::new(&holder, ttl)).await;
        assert!(matches!(claimed, Ok(Claim::Granted { .. })), "{claimed:?}");
        let released = store.release(&key, &holder).await;
        assert!(matches!(released, Ok(Release::Removed)), "{released:?}");
    }
    let closed = format!("127.0.0.1:{closed}");
    assert!(
        !baton_testkit::capture::events(&events::ETCD_MEMBER_UNREACHABLE, |e| {
            e.message.contains(&closed) && e.message.contains("sending it again")
        })
        .is_empty(),
        "a request that went to {closed} was reported"
    );
}

/// SIGKILL of the leader: idempotency records (finalized and pending, with the owner's lease)
/// and cached values the cluster acknowledged are all there after the failover, and the
/// finalized record still answers as a duplicate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_and_cached_values_survive_a_sigkill_of_the_leader() {
    use baton_core::idempotency::{
        Acquire, AcquireOptions, Finalize, IdempotencyLog, Outcome, Scope, Status,
    };

    let cluster = common::private_cluster().await;
    let store = std::sync::Arc::new(common::store(&cluster).await);
    let ns = fresh_namespace();
    let log = IdempotencyLog::with_namespace(store.clone(), ns.clone());
    let cache = baton_core::Cache::with_namespace(store, ns);
    let (done, pending) = (
        Scope::new("org", "charges", "done").unwrap(),
        Scope::new("org", "charges", "pending").unwrap(),
    );
    let options = AcquireOptions::new(Duration::from_secs(3600)).lease(Duration::from_secs(600));
    let Acquire::Acquired(first) = log.try_acquire_with(&done, &options).await.unwrap() else {
        panic!("a fresh scope acquires");
    };
    assert!(matches!(
        log.finalize(&first, Outcome::Completed, b"receipt")
            .await
            .unwrap(),
        Finalize::Finalized(_)
    ));
    let Acquire::Acquired(owner) = log.try_acquire_with(&pending, &options).await.unwrap() else {
        panic!("a fresh scope acquires");
    };
    cache
        .set("k", &"cached", Duration::from_secs(3600))
        .await
        .unwrap();

    {
        let cluster = cluster.clone();
        tokio::task::spawn_blocking(move || {
            cluster.kill(cluster.leader().unwrap());
            cluster.wait_for_leader(Duration::from_secs(30)).unwrap();
        })
        .await
        .unwrap();
    }

    let seen = once_served("the finalized record", || {
        log.try_acquire_with(&done, &options)
    })
    .await;
    let Acquire::Duplicate(record) = seen else {
        panic!("the finalized record is a duplicate after the failover");
    };
    assert_eq!(
        (record.status(), record.metadata()),
        (Status::Completed, &b"receipt"[..])
    );
    let record = once_served("the pending record", || log.get(&pending))
        .await
        .expect("the pending record survives");
    assert_eq!((record.status(), record.attempt()), (Status::Pending, 1));
    assert!(
        record.lease_remaining() > Duration::ZERO,
        "its owner's lease too"
    );
    assert!(matches!(
        once_served("the owner's finalize", || log.finalize(
            &owner,
            Outcome::Completed,
            b"after"
        ))
        .await,
        Finalize::Finalized(_)
    ));
    let value = once_served("the cached value", || cache.get::<String>("k")).await;
    assert_eq!(value.as_deref(), Some("cached"));
}
