//! The Redis store on a Redis Cluster (`redis+cluster://`), against private clusters started
//! by `baton_testkit::redis_cluster` (three masters, three replicas on loopback).
//!
//! The lock and lease conformance suite runs on one cluster shared by this test binary
//! (every rule in a namespace of its own, so keys spread over the masters); `evict` deletes
//! a grant and its fence counter on the master of its slot, as an operator would. The tests
//! that fail a master over start a cluster of their own.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use baton_core::store::{Claim, LeaseRequest, LeaseStore, Release, Renewal};
use baton_core::telemetry::events;
use baton_core::{
    Fence, Holder, Key, KeyKind, LockGuard, LockOptions, Locks, Namespace, ReleaseOutcome,
    StoreKey, Ttl,
};
use baton_redis::RedisClusterStore;
use baton_redis::wakeups::DEGRADED_POLL;
use baton_testkit::capture::{
    capture_events, events as captured, eventually, wait_for_event, within,
};
use baton_testkit::harness::{Evictor, Opener, Stores};
use baton_testkit::redis::Resp;
use baton_testkit::redis_cluster::RedisCluster;
use tokio::task::JoinHandle;

/// Short timeouts, so a failing test fails fast; long enough for a failover's retries.
const OPTIONS: &str = "connect_timeout=1s&response_timeout=1s";
const FAILOVER_PATIENCE: Duration = Duration::from_secs(60);

/// The cluster this binary shares, started on first use, off the async workers.
async fn shared() -> &'static RedisCluster {
    tokio::task::spawn_blocking(RedisCluster::shared)
        .await
        .unwrap()
}

/// A cluster of the test's own, to fail over.
async fn own_cluster() -> Arc<RedisCluster> {
    Arc::new(
        tokio::task::spawn_blocking(RedisCluster::start)
            .await
            .unwrap()
            .expect("a private Redis Cluster"),
    )
}

async fn store(cluster: &RedisCluster) -> RedisClusterStore {
    RedisClusterStore::connect(&format!("{}?{OPTIONS}", cluster.url()))
        .await
        .expect("connect to the private cluster")
}

/// The Redis key of `key`'s grant.
fn grant(key: &StoreKey) -> String {
    format!("{{{}}}", key.as_str())
}

/// Runs `f` on the cluster off the async workers.
async fn blocking<T: Send + 'static>(
    cluster: &Arc<RedisCluster>,
    f: impl FnOnce(&RedisCluster) -> T + Send + 'static,
) -> T {
    let cluster = Arc::clone(cluster);
    tokio::task::spawn_blocking(move || f(&cluster))
        .await
        .unwrap()
}

/// Opens stores (new connections) on the shared cluster; evicts a grant with an operator's
/// `DEL` on the master of its slot.
struct SharedCluster(&'static RedisCluster);

#[async_trait]
impl Opener for SharedCluster {
    type Store = RedisClusterStore;

    async fn open(&self) -> RedisClusterStore {
        store(self.0).await
    }
}

#[async_trait]
impl Evictor for SharedCluster {
    async fn evict(&self, key: &StoreKey) {
        let grant = grant(key);
        let cluster = self.0;
        tokio::task::spawn_blocking(move || {
            let master = cluster.master_for(&grant).expect("the key's master");
            let counter = format!("{grant}:fence");
            let deleted = cluster
                .node(master)
                .unwrap()
                .command_ok(&["DEL", grant.as_str(), counter.as_str()])
                .expect("operator DEL");
            assert!(
                deleted.as_integer().is_some_and(|n| n >= 1),
                "nothing to evict at {grant}: {deleted:?}"
            );
        })
        .await
        .unwrap();
    }
}

async fn harness() -> Stores<SharedCluster> {
    Stores::new(SharedCluster(shared().await))
}

mod conformance {
    baton_core::conformance_tests!(super::harness());
}

mod semaphore_conformance {
    baton_core::semaphore_conformance_tests!(super::harness());
}

mod rwlock_conformance {
    baton_core::rwlock_conformance_tests!(super::harness());
}

mod election_conformance {
    baton_core::election_conformance_tests!(super::harness());
}

mod rate_limit_conformance {
    baton_core::rate_limit_conformance_tests!(super::harness());
}

mod cache_conformance {
    baton_core::cache_conformance_tests!(super::harness());
}

mod idempotency_conformance {
    baton_core::idempotency_conformance_tests!(super::harness());
}

mod broadcast_conformance {
    baton_core::broadcast_conformance_tests!(super::harness());
}

fn ttl(d: Duration) -> Ttl {
    Ttl::new(d).unwrap()
}

async fn granted(store: &RedisClusterStore, key: &StoreKey, holder: &Holder, t: Duration) -> Fence {
    match store
        .claim(key, LeaseRequest::new(holder, ttl(t)))
        .await
        .expect("claim")
    {
        Claim::Granted { fence } => fence,
        other => panic!("expected a grant of {key}, got {other:?}"),
    }
}

/// Keys whose slots are served by different masters are held at once, each grant on its
/// own master, through one store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_on_different_masters_are_held_at_once() {
    let cluster = shared().await;
    let ns = Namespace::new(format!("slots{}", &Holder::random().as_str()[..8])).unwrap();
    // One key per master: qualify candidates until every master has one.
    let mut by_master: BTreeMap<u16, StoreKey> = BTreeMap::new();
    for i in 0..200 {
        let key = ns.qualify(KeyKind::Lock, &Key::new(format!("k{i}")).unwrap());
        let redis_key = grant(&key);
        let master = tokio::task::spawn_blocking(move || cluster.master_for(&redis_key))
            .await
            .unwrap()
            .unwrap();
        by_master.entry(master).or_insert(key);
        if by_master.len() == baton_testkit::redis_cluster::MASTERS {
            break;
        }
    }
    assert_eq!(
        by_master.len(),
        baton_testkit::redis_cluster::MASTERS,
        "{by_master:?}"
    );
    let store = Arc::new(store(cluster).await);
    let t = Duration::from_secs(10);
    let claims = by_master.values().map(|key| {
        let store = Arc::clone(&store);
        let key = key.clone();
        async move {
            let holder = Holder::random();
            let fence = granted(&store, &key, &holder, t).await;
            (key, holder, fence)
        }
    });
    let held = futures_util::future::join_all(claims).await;
    for ((master, key), (_, holder, fence)) in by_master.iter().zip(&held) {
        // Each grant is on its key's master, and only there among the masters.
        let value = cluster
            .node(*master)
            .unwrap()
            .command_ok(&["GET", grant(key).as_str()])
            .unwrap()
            .as_text()
            .unwrap_or_default();
        assert!(
            value.ends_with(holder.as_str()) && value.starts_with(&fence.get().to_string()),
            "{key} on {master}: {value:?}"
        );
        let info = store.inspect(key).await.unwrap().expect("held");
        assert_eq!((&info.holder, info.fence), (holder, *fence));
    }
    let listed = store.list(&format!("{}:", ns.as_str()), 10).await.unwrap();
    assert_eq!(listed.len(), held.len(), "{listed:?}");
    // A second holder is refused each key while the first holds them all.
    for (key, _, _) in &held {
        let other = Holder::random();
        let claim = store
            .claim(key, LeaseRequest::new(&other, ttl(t)))
            .await
            .unwrap();
        assert!(matches!(claim, Claim::Held { .. }), "{key}: {claim:?}");
    }
    for (key, holder, _) in &held {
        assert_eq!(store.release(key, holder).await.unwrap(), Release::Removed);
    }
}

/// `baton::connect` opens a `redis+cluster://` URL (with `min_replicas` too), whose locks and
/// cache work; claimable work, which no Redis store offers, is refused when its client is
/// built.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_facade_opens_a_cluster_and_refuses_what_it_lacks() {
    let cluster = shared().await;
    let baton = baton::connect(&format!("{}?{OPTIONS}", cluster.url()))
        .await
        .expect("baton::connect(redis+cluster://)");
    let guard = baton
        .locks()
        .acquire("facade", &LockOptions::new(Duration::from_secs(5)))
        .await
        .expect("a lock on the cluster");
    assert!(guard.fence().get() > 0);
    guard.release().await;
    let cache = baton.cache().expect("a cache on a cluster");
    cache
        .set("facade", &7u32, Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(cache.get::<u32>("facade").await.unwrap(), Some(7));
    let e = baton.work_store().expect_err("no claimable work on Redis");
    assert_eq!(e.kind(), baton_core::ErrorKind::Unsupported, "{e}");
    // What `min_replicas` does on a cluster is tested in `cluster_replication.rs`.
    baton::connect(&format!("{}?min_replicas=1", cluster.url()))
        .await
        .expect("min_replicas on a cluster");
    baton::store::check_url(&cluster.url()).unwrap();
}

/// A lock survives a coordinated failover of its key's master (`CLUSTER FAILOVER` on the
/// replica): after it the store finds the grant on the new master, the holder renews and
/// releases it, nobody else is granted it meanwhile, and the next grants' fences are above
/// every fence before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_survives_cluster_failover_with_fences_increasing() {
    let cluster = own_cluster().await;
    let store = store(&cluster).await;
    let ns = Namespace::new("failover").unwrap();
    let key = ns.qualify(KeyKind::Lock, &Key::new("job").unwrap());
    let redis_key = grant(&key);
    let t = Duration::from_secs(30);

    let mut fences = Vec::new();
    for _ in 0..3 {
        let holder = Holder::random();
        fences.push(granted(&store, &key, &holder, t).await);
        assert_eq!(
            store.release(&key, &holder).await.unwrap(),
            Release::Removed
        );
    }
    let holder = Holder::random();
    let held = granted(&store, &key, &holder, t).await;
    fences.push(held);

    let master = blocking(&cluster, {
        let k = redis_key.clone();
        move |c| c.master_for(&k).unwrap()
    })
    .await;
    let replica = blocking(&cluster, move |c| c.replica_of(master).unwrap()).await;
    blocking(&cluster, move |c| c.failover(replica, FAILOVER_PATIENCE))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let now = blocking(&cluster, {
        let k = redis_key.clone();
        move |c| c.master_for(&k).unwrap()
    })
    .await;
    assert_eq!(now, replica, "the replica serves the key's slot now");

    // The grant is on the new master, as it was.
    let info = store.inspect(&key).await.unwrap().expect("still held");
    assert_eq!((&info.holder, info.fence), (&holder, held));
    assert_eq!(
        store.renew(&key, &holder, ttl(t)).await.unwrap(),
        Renewal::Renewed
    );
    let other = Holder::random();
    let claim = store
        .claim(&key, LeaseRequest::new(&other, ttl(t)))
        .await
        .unwrap();
    assert!(
        matches!(&claim, Claim::Held { holder: h, .. } if *h == holder),
        "{claim:?}"
    );
    // Through the policy layer too: a lock attempt of another store waits and gives up.
    let locks = Locks::with_namespace(Arc::new(self::store(&cluster).await), ns.clone());
    let attempt = locks
        .try_acquire(
            "job",
            &LockOptions::new(Duration::from_secs(5)).wait(Duration::from_millis(300)),
        )
        .await
        .unwrap();
    assert!(attempt.is_none(), "granted while held: {attempt:?}");
    assert_eq!(
        store.release(&key, &holder).await.unwrap(),
        Release::Removed
    );
    // The attempt's store queued while it waited, so the release may have handed the key to
    // its holder, which had stopped waiting: that store gives the grant back.
    eventually(
        "a hand-over to the attempt that gave up to be given back",
        || async { store.inspect(&key).await.unwrap().is_none().then_some(()) },
    )
    .await;

    for _ in 0..3 {
        let holder = Holder::random();
        fences.push(granted(&store, &key, &holder, t).await);
        assert_eq!(
            store.release(&key, &holder).await.unwrap(),
            Release::Removed
        );
    }
    let guard = locks
        .acquire("job", &LockOptions::new(Duration::from_secs(5)))
        .await
        .unwrap();
    fences.push(guard.fence());
    guard.release().await;
    assert!(
        fences.windows(2).all(|w| w[0] < w[1]),
        "fences strictly increase across the failover: {fences:?}"
    );
}

/// A master killed with SIGKILL: its replica takes over, the store follows it within the
/// core's retries, and the fences of the key's grants after the failover are above every
/// fence before it (the counter, or the new master's clock where the counter was not
/// replicated yet).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fences_increase_across_a_killed_master() {
    let cluster = own_cluster().await;
    let store = store(&cluster).await;
    let ns = Namespace::new("killed").unwrap();
    let key = ns.qualify(KeyKind::Lock, &Key::new("job").unwrap());
    let redis_key = grant(&key);
    let t = Duration::from_secs(2);

    let mut fences = Vec::new();
    for _ in 0..3 {
        let holder = Holder::random();
        fences.push(granted(&store, &key, &holder, t).await);
        assert_eq!(
            store.release(&key, &holder).await.unwrap(),
            Release::Removed
        );
    }
    // Held when the master dies: the grant may or may not reach the replica.
    fences.push(granted(&store, &key, &Holder::random(), t).await);
    let master = blocking(&cluster, {
        let k = redis_key.clone();
        move |c| c.master_for(&k).unwrap()
    })
    .await;
    let replica = blocking(&cluster, move |c| c.replica_of(master).unwrap()).await;
    blocking(&cluster, move |c| {
        c.kill(master).unwrap();
        c.wait_healthy(FAILOVER_PATIENCE)
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    let now = blocking(&cluster, {
        let k = redis_key.clone();
        move |c| c.master_for(&k).unwrap()
    })
    .await;
    assert_eq!(now, replica, "the replica serves the key's slot now");

    // The first calls after the failover may still meet the dead master (the client reads
    // the new slot map on its first error) and answer Unavailable; a caller tries again.
    let locks = Locks::with_namespace(Arc::new(store), ns);
    let options = LockOptions::new(Duration::from_secs(2)).wait(Duration::from_secs(10));
    let deadline = tokio::time::Instant::now() + FAILOVER_PATIENCE;
    let mut grants = 0;
    while grants < 3 {
        match locks.acquire("job", &options).await {
            Ok(guard) => {
                fences.push(guard.fence());
                guard.release().await;
                grants += 1;
            }
            Err(e) => {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "the key is not granted again after the failover: {e}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    assert!(
        fences.windows(2).all(|w| w[0] < w[1]),
        "fences strictly increase across the failover: {fences:?}"
    );
}

/// A holder's TTL far beyond the tests' patience: a waiter that gets the key after its
/// release was woken by the release, not by the holder's expiry.
const LONG: Duration = Duration::from_secs(600);

/// A waiter for `key` in `locks`, acquiring in a task of its own.
fn waiter(locks: &Locks, key: &str) -> JoinHandle<Result<LockGuard, baton_core::AcquireError>> {
    let (locks, key) = (locks.clone(), key.to_owned());
    tokio::spawn(async move {
        locks
            .acquire(
                &key,
                &LockOptions::new(Duration::from_secs(30)).wait(Duration::from_secs(300)),
            )
            .await
    })
}

/// The members of `key`'s queue of waiting stores, read on its master (blocking the worker
/// briefly, as the multi-threaded runtime allows).
fn queue_of(cluster: &RedisCluster, key: &StoreKey) -> Vec<String> {
    let queue = format!("{}:queue", grant(key));
    tokio::task::block_in_place(|| {
        let master = cluster.master_for(&queue).unwrap();
        let members = cluster
            .node(master)
            .unwrap()
            .command_ok(&["ZRANGE", queue.as_str(), "0", "-1"])
            .unwrap();
        members.as_texts().unwrap_or_default()
    })
}

/// How many subscribers `channel` has on each master, by port.
fn shard_subscribers(cluster: &RedisCluster, channel: &str) -> BTreeMap<u16, i64> {
    tokio::task::block_in_place(|| {
        let mut masters: Vec<u16> = (0..16384u16)
            .step_by(512)
            .map(|slot| cluster.master_of_slot(slot).unwrap())
            .collect();
        masters.sort_unstable();
        masters.dedup();
        masters
            .into_iter()
            .map(|port| {
                let answer = cluster
                    .node(port)
                    .unwrap()
                    .command_ok(&["PUBSUB", "SHARDNUMSUB", channel])
                    .unwrap();
                let count = match answer {
                    Resp::Array(Some(pair)) => pair.get(1).and_then(Resp::as_integer),
                    _ => None,
                }
                .unwrap_or(-1);
                (port, count)
            })
            .collect()
    })
}

/// A release in one store wakes a waiter of another store (its own cluster client) through
/// sharded pub/sub: the waiting store queues under a channel in the key's slot, subscribed
/// on that slot's master only, and the release hands the key over. Nothing else could wake
/// it in time: its store reports no poll interval (push is healthy) and the holder's TTL is
/// far beyond the test's patience.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_wakes_a_waiter_of_another_store_by_sharded_push() {
    capture_events();
    let cluster = shared().await;
    let ns = Namespace::new(format!("push{}", &Holder::random().as_str()[..8])).unwrap();
    let holding = Locks::with_namespace(Arc::new(store(cluster).await), ns.clone());
    let waiting_store = Arc::new(store(cluster).await);
    let waiting = Locks::with_namespace(waiting_store.clone(), ns.clone());
    let key = ns.qualify(KeyKind::Lock, &Key::new("job").unwrap());

    let guard = holding
        .acquire("job", &LockOptions::new(LONG))
        .await
        .expect("the lock");
    let woken = waiter(&waiting, "job");
    let queued = eventually("the waiting store to queue for the key", || async {
        queue_of(cluster, &key).into_iter().next()
    })
    .await;
    assert!(
        queued.starts_with("baton:wake:{") && queued.contains("}:"),
        "a store queues under its sharded channel: {queued}"
    );
    // Subscribed on the key's master only: a release elsewhere never reaches it.
    let master = {
        let g = grant(&key);
        tokio::task::spawn_blocking(move || cluster.master_for(&g).unwrap())
            .await
            .unwrap()
    };
    let subscribers = shard_subscribers(cluster, &queued);
    assert_eq!(subscribers.len(), baton_testkit::redis_cluster::MASTERS);
    for (port, count) in &subscribers {
        let expected = i64::from(*port == master);
        assert_eq!(
            *count, expected,
            "subscribers of {queued} on {port}: {subscribers:?}"
        );
    }
    assert_eq!(
        waiting_store.wakeups().poll,
        None,
        "push is healthy: no polling"
    );
    assert!(!woken.is_finished(), "the waiter got a lock that is held");

    let before = guard.fence();
    assert_eq!(guard.release().await, ReleaseOutcome::Released);
    let taken = within("the waiter to wake", woken)
        .await
        .expect("the waiter task")
        .expect("the lock after the release");
    assert!(
        taken.fence() > before,
        "{:?} after {before:?}",
        taken.fence()
    );
    assert!(
        queue_of(cluster, &key).is_empty(),
        "the hand-over took the store from the queue"
    );
    assert_eq!(taken.release().await, ReleaseOutcome::Released);
    // The stores of this test connect without credentials (the only loss on the shared
    // cluster is the ACL test's, whose URL names its user).
    let url = cluster.url();
    assert!(
        captured(&events::STORE_PUSH_LOST, |e| e.message.contains(&url)).is_empty(),
        "no loss reported"
    );
}

/// A store whose subscriptions are dropped by the server (`CLIENT KILL TYPE pubsub` on the
/// key's master) says so, keeps its waiters moving, subscribes again and says that too; a
/// release after that wakes the waiter of the other store by push again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_subscription_is_reported_and_subscribed_again() {
    capture_events();
    let cluster = own_cluster().await;
    let url = cluster.url();
    let ns = Namespace::new("killedpush").unwrap();
    let holding = Locks::with_namespace(Arc::new(store(&cluster).await), ns.clone());
    let waiting_store = Arc::new(store(&cluster).await);
    let waiting = Locks::with_namespace(waiting_store.clone(), ns.clone());
    let key = ns.qualify(KeyKind::Lock, &Key::new("job").unwrap());
    let master = blocking(&cluster, {
        let g = grant(&key);
        move |c| c.master_for(&g).unwrap()
    })
    .await;

    let guard = holding
        .acquire("job", &LockOptions::new(LONG))
        .await
        .expect("the lock");
    let woken = waiter(&waiting, "job");
    // Queued, so subscribed.
    eventually("the waiting store to queue", || async {
        queue_of(&cluster, &key).into_iter().next()
    })
    .await;
    let killed = blocking(&cluster, move |c| {
        c.node(master)
            .unwrap()
            .command_ok(&["CLIENT", "KILL", "TYPE", "pubsub"])
            .unwrap()
    })
    .await;
    assert!(
        killed.as_integer().is_some_and(|n| n >= 1),
        "killed {killed:?}"
    );
    let ours = |e: &baton_testkit::capture::Captured| e.message.contains(&url[..30]);
    wait_for_event(&events::STORE_PUSH_LOST, ours).await;
    wait_for_event(&events::STORE_PUSH_RESTORED, ours).await;
    eventually("the waiting store to queue again", || async {
        queue_of(&cluster, &key).into_iter().next()
    })
    .await;
    assert_eq!(waiting_store.wakeups().poll, None, "push is healthy again");
    assert!(!woken.is_finished(), "the waiter got a lock that is held");
    assert_eq!(guard.release().await, ReleaseOutcome::Released);
    let taken = within("the waiter to wake", woken)
        .await
        .expect("the waiter task")
        .expect("the lock after the release");
    assert_eq!(taken.release().await, ReleaseOutcome::Released);
}

/// A store that may not subscribe (its user's ACL denies `SSUBSCRIBE`) reports the loss,
/// reports a poll interval, and its waiter still takes the key soon after a release, by
/// polling: the holder's TTL is far beyond the test's patience, and nothing is pushed to a
/// store that never subscribed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_cannot_subscribe_polls_and_says_so() {
    capture_events();
    let cluster = shared().await;
    tokio::task::spawn_blocking(move || {
        for node in cluster.nodes() {
            node.command_ok(&[
                "ACL",
                "SETUSER",
                "nopush",
                "on",
                ">nopush-secret",
                "~*",
                "&*",
                "+@all",
                "-ssubscribe",
            ])
            .expect("ACL SETUSER on every node");
        }
    })
    .await
    .unwrap();
    let ns = Namespace::new(format!("nopush{}", &Holder::random().as_str()[..8])).unwrap();
    let holding = Locks::with_namespace(Arc::new(store(cluster).await), ns.clone());
    let denied_url = cluster
        .url()
        .replace("redis+cluster://", "redis+cluster://nopush:nopush-secret@");
    let waiting_store = Arc::new(
        RedisClusterStore::connect(&format!("{denied_url}?{OPTIONS}"))
            .await
            .expect("connect as a user that may not subscribe"),
    );
    let waiting = Locks::with_namespace(waiting_store.clone(), ns.clone());

    let guard = holding
        .acquire("job", &LockOptions::new(LONG))
        .await
        .expect("the lock");
    let woken = waiter(&waiting, "job");
    let lost = wait_for_event(&events::STORE_PUSH_LOST, |e| {
        e.message.contains("nopush") && e.message.contains("SSUBSCRIBE")
    })
    .await;
    assert!(!lost.message.contains("nopush-secret"), "{}", lost.message);
    assert_eq!(waiting_store.wakeups().poll, Some(DEGRADED_POLL));
    assert!(!woken.is_finished(), "the waiter got a lock that is held");
    assert_eq!(guard.release().await, ReleaseOutcome::Released);
    let taken = within("the waiter to poll", woken)
        .await
        .expect("the waiter task")
        .expect("the lock after the release");
    assert_eq!(taken.release().await, ReleaseOutcome::Released);
}

/// A permit released in one store goes to the waiter of another store by push: the waiting
/// store queues under its sharded channel and is told the permit is its turn, though the
/// permit it waits for would not end within the test's patience.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_release_wakes_a_waiter_of_another_store_by_sharded_push() {
    let cluster = shared().await;
    let ns = Namespace::new(format!("permits{}", &Holder::random().as_str()[..8])).unwrap();
    let semaphore = |store: RedisClusterStore| {
        baton_core::Semaphore::new(Arc::new(store), ns.clone(), "pool", 1).unwrap()
    };
    let holding = semaphore(store(cluster).await);
    let waiting = semaphore(store(cluster).await);
    let key = ns.qualify(KeyKind::Semaphore, &Key::new("pool").unwrap());

    let held = holding
        .try_acquire(&LockOptions::new(LONG))
        .await
        .unwrap()
        .expect("a free permit");
    let woken = tokio::spawn(async move {
        waiting
            .acquire(&LockOptions::new(Duration::from_secs(30)).wait(Duration::from_secs(300)))
            .await
    });
    let queued = eventually("the waiting store to queue for a permit", || async {
        queue_of(cluster, &key).into_iter().next()
    })
    .await;
    assert!(queued.starts_with("baton:wake:{"), "{queued}");
    assert!(!woken.is_finished(), "the waiter got a permit that is held");
    let fence = held.fence();
    held.release().await;
    let taken = within("the waiter to wake", woken)
        .await
        .expect("the waiter task")
        .expect("the permit after the release");
    assert!(taken.fence() > fence);
    taken.release().await;
}

/// After `SCRIPT FLUSH` on every node, a rate limit, an idempotency record and a semaphore
/// permit are still served: the store loads each script on the master of its key's slot
/// when that master answers `NOSCRIPT`, and sends the call again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flushed_scripts_are_loaded_again_on_the_keys_master() {
    let cluster = own_cluster().await;
    let store = Arc::new(store(&cluster).await);
    blocking(&cluster, |c| {
        for node in c.nodes() {
            node.command_ok(&["SCRIPT", "FLUSH"]).expect("SCRIPT FLUSH");
        }
    })
    .await;
    let limiter = baton_core::RateLimiter::with_namespace(
        store.clone(),
        Namespace::new("flushed").unwrap(),
        baton_core::Quota::new(1, Duration::from_secs(60)).unwrap(),
    );
    assert!(limiter.try_acquire("k", 1).await.unwrap().allowed);
    assert!(!limiter.try_acquire("k", 1).await.unwrap().allowed);
    let log = baton_core::idempotency::IdempotencyLog::with_namespace(
        store.clone(),
        Namespace::new("flushed").unwrap(),
    );
    let scope = baton_core::idempotency::Scope::new("org", "domain", "key").unwrap();
    let first = log
        .try_acquire(&scope, Duration::from_secs(60))
        .await
        .unwrap();
    assert!(first.is_acquired(), "{first:?}");
    let semaphore =
        baton_core::Semaphore::new(store, Namespace::new("flushed").unwrap(), "s", 1).unwrap();
    let permit = semaphore
        .try_acquire(&LockOptions::new(Duration::from_secs(5)))
        .await
        .unwrap()
        .expect("a free permit");
    permit.release().await;
}

/// A broadcast subscriber on a cluster whose subscription the server drops (`CLIENT KILL
/// TYPE pubsub` on the master of the channel's slot) is told of the gap, subscribes again by
/// itself, and receives what is published after, from a publisher on another store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_broadcast_subscription_reports_a_gap_and_resumes() {
    use baton_core::broadcast::Event;

    capture_events();
    let cluster = own_cluster().await;
    let ns = Namespace::new("bgap").unwrap();
    let listening =
        baton_core::Broadcast::with_namespace(Arc::new(store(&cluster).await), ns.clone());
    let publishing = baton_core::Broadcast::with_namespace(Arc::new(store(&cluster).await), ns);
    let mut sub = listening.subscribe::<u32>("news").await.unwrap();
    publishing.publish("news", &1u32).await.unwrap();
    assert!(
        matches!(within("the next broadcast event", sub.next()).await, Some(Event::Message(m)) if m.payload == 1)
    );

    let master = blocking(&cluster, |c| {
        c.master_for("bgap:broadcast:news:db0").unwrap()
    })
    .await;
    let killed = blocking(&cluster, move |c| {
        c.node(master)
            .unwrap()
            .command_ok(&["CLIENT", "KILL", "TYPE", "pubsub"])
            .unwrap()
    })
    .await;
    assert!(
        killed.as_integer().is_some_and(|n| n >= 1),
        "killed {killed:?}"
    );
    assert!(matches!(
        within("the next broadcast event", sub.next()).await,
        Some(Event::Gap { .. })
    ));
    assert!(matches!(
        within("the next broadcast event", sub.next()).await,
        Some(Event::Resubscribed)
    ));
    publishing.publish("news", &2u32).await.unwrap();
    match within("the next broadcast event", sub.next()).await {
        Some(Event::Message(m)) => assert_eq!(m.payload, 2),
        other => panic!("expected message 2, got {other:?}"),
    }
}
