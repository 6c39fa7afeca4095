//! Waiting for a semaphore's permits on etcd: processes (here, stores of their own) whose
//! waiters wait for a permit queue once each, the queue decides who may take a free permit
//! (its head, or anyone while nobody is queued), and a release wakes only the head. So
//! processes take permits in the order they queued, a releaser asking again at once or a
//! newcomer comes after them, and a process that dies while queued holds the others up only
//! until its queue entry's lease ends.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use baton_core::conformance::fresh_namespace;
use baton_core::semaphore::PermitInfo;
use baton_core::store::{Claim, HolderInfo, LeaseRequest, Release, Renewal, Wakeups};
use baton_core::{
    Holder, Key, KeyKind, LockOptions, Namespace, Result, Semaphore, SemaphoreStore, StoreKey, Ttl,
};
use baton_etcd::EtcdStore;
use baton_testkit::permit_order;
use etcd_client::GetOptions;
use tokio::sync::{mpsc, oneshot};
use tokio::time::{Instant, sleep};

/// The number of processes queued for a permit of `key`, as a raw client reads the queue.
async fn queued(raw: &mut etcd_client::Client, key: &StoreKey) -> usize {
    let count = raw
        .get(
            format!("{}\u{1}q\u{0}", key.as_str()),
            Some(GetOptions::new().with_prefix().with_count_only()),
        )
        .await
        .expect("read the queue")
        .count();
    usize::try_from(count).expect("a count")
}

/// Waits (at most 10s) until `n` processes are queued for a permit of `key`.
async fn until_queued(raw: &mut etcd_client::Client, key: &StoreKey, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let now = queued(raw, key).await;
        if now == n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{n} processes never queued ({now})"
        );
        sleep(Duration::from_millis(20)).await;
    }
}

fn semaphore_key(ns: &Namespace, key: &str) -> StoreKey {
    ns.qualify(KeyKind::Semaphore, &Key::new(key).unwrap())
}

/// The one-permit semaphore `key` in `ns`, through a new store (a process of its own).
async fn semaphore_of_a_new_store(ns: &Namespace, key: &str) -> Semaphore {
    let store = common::store(&*common::cluster().await).await;
    Semaphore::new(Arc::new(store), ns.clone(), key, 1).unwrap()
}

/// The permit of `key` in `ns` for a minute, taken through a new store.
async fn held_for_a_minute(ns: &Namespace, key: &str) -> baton_core::LockGuard {
    semaphore_of_a_new_store(ns, key)
        .await
        .try_acquire(&LockOptions::new(Duration::from_secs(60)))
        .await
        .unwrap()
        .expect("free")
}

/// Stores take permits in the order they queued, the releaser asking again at once last (the
/// rule is in `baton_testkit::permit_order`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processes_take_permits_in_the_order_they_queued() {
    let cluster = common::cluster().await;
    let raw = common::raw(&cluster).await;
    let ns = fresh_namespace();
    let key = semaphore_key(&ns, "fifo");
    permit_order::stores_take_permits_in_the_order_they_queued(
        || async { Arc::new(common::store(&cluster).await) as Arc<dyn SemaphoreStore> },
        &ns,
        "fifo",
        || {
            let (mut raw, key) = (raw.clone(), key.clone());
            async move { queued(&mut raw, &key).await }
        },
    )
    .await;
}

/// A permit that is free while a process is queued is that process's: a newcomer's claim (a
/// process not queued) is `Held` by the queue, naming its head, for at most the queue entry's
/// lease, and the queued process's claim takes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_free_permit_is_the_queued_process_s_not_a_newcomer_s() {
    let cluster = common::cluster().await;
    let mut raw = common::raw(&cluster).await;
    let (holder, queued_store, newcomer) = (
        common::store(&cluster).await,
        common::store(&cluster).await,
        common::store(&cluster).await,
    );
    let key = semaphore_key(&fresh_namespace(), "free");
    let ttl = Ttl::new(Duration::from_secs(60)).unwrap();
    let claim = async |store: &EtcdStore, who: &Holder| {
        store
            .claim_permit(&key, LeaseRequest::new(who, ttl), 1)
            .await
            .expect("a permit claim")
    };
    let (first, waiting, late) = (Holder::random(), Holder::random(), Holder::random());
    assert!(matches!(
        claim(&holder, &first).await,
        Claim::Granted { .. }
    ));
    // A waiter of the second process waits for the key: its claim queues the process.
    let _waits = queued_store.permit_wakeups().hub.subscribe(&key);
    assert!(matches!(
        claim(&queued_store, &waiting).await,
        Claim::Held { .. }
    ));
    until_queued(&mut raw, &key, 1).await;
    assert_eq!(
        holder.release_permit(&key, &first).await.unwrap(),
        Release::Removed
    );
    match claim(&newcomer, &late).await {
        Claim::Held { holder, remaining } => {
            assert!(
                holder.as_str().starts_with("queued:"),
                "held by the queue, not {holder}"
            );
            assert!(
                remaining <= Duration::from_secs(5) && remaining > Duration::ZERO,
                "{remaining:?}"
            );
        }
        other => panic!("the newcomer cut in before the queued process: {other:?}"),
    }
    assert!(
        newcomer.permits(&key).await.unwrap().is_empty(),
        "the queue is no holder"
    );
    assert!(matches!(
        claim(&queued_store, &waiting).await,
        Claim::Granted { .. }
    ));
    // Granted, the process left the queue in the same transaction.
    assert_eq!(queued(&mut raw, &key).await, 0);
    match claim(&newcomer, &late).await {
        Claim::Held { holder, .. } => assert_eq!(holder, waiting),
        other => panic!("one permit, held: {other:?}"),
    }
    queued_store.release_permit(&key, &waiting).await.unwrap();
}

/// A `try_acquire` (no waiter) never queues its process, even when it is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn try_acquire_never_queues() {
    let cluster = common::cluster().await;
    let mut raw = common::raw(&cluster).await;
    let ns = fresh_namespace();
    let key = semaphore_key(&ns, "try");
    let long = LockOptions::new(Duration::from_secs(60));
    let held = held_for_a_minute(&ns, "try").await;
    let b = semaphore_of_a_new_store(&ns, "try").await;
    for _ in 0..3 {
        assert!(b.try_acquire(&long).await.unwrap().is_none());
    }
    sleep(Duration::from_millis(300)).await;
    assert_eq!(queued(&mut raw, &key).await, 0, "a try_acquire queued");
    held.release().await;
}

/// A semaphore store that counts the permit claims made through it.
#[derive(Debug)]
struct Counted {
    store: EtcdStore,
    claims: AtomicUsize,
}

#[async_trait]
impl SemaphoreStore for Counted {
    async fn claim_permit(
        &self,
        key: &StoreKey,
        request: LeaseRequest<'_>,
        permits: u32,
    ) -> Result<Claim> {
        self.claims.fetch_add(1, Ordering::SeqCst);
        self.store.claim_permit(key, request, permits).await
    }

    async fn renew_permit(&self, key: &StoreKey, holder: &Holder, ttl: Ttl) -> Result<Renewal> {
        self.store.renew_permit(key, holder, ttl).await
    }

    async fn release_permit(&self, key: &StoreKey, holder: &Holder) -> Result<Release> {
        self.store.release_permit(key, holder).await
    }

    async fn permits(&self, key: &StoreKey) -> Result<Vec<HolderInfo>> {
        self.store.permits(key).await
    }

    async fn list_permits(&self, prefix: &str, limit: usize) -> Result<Vec<PermitInfo>> {
        self.store.list_permits(prefix, limit).await
    }

    fn permit_wakeups(&self) -> Wakeups {
        self.store.permit_wakeups()
    }
}

/// A release wakes only the head of the queue: of three processes waiting for the one permit
/// (none of whose timers fires within the test: the permits last a minute), only the first
/// claims when it is released; the others claim only when their turn comes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_wakes_only_the_head_process() {
    let cluster = common::cluster().await;
    let mut raw = common::raw(&cluster).await;
    let ns = fresh_namespace();
    let key = semaphore_key(&ns, "herd");
    let long = LockOptions::new(Duration::from_secs(60));
    let held = held_for_a_minute(&ns, "herd").await;
    let (granted_tx, mut granted) = mpsc::unbounded_channel();
    let mut counted = Vec::new();
    let mut releases = Vec::new();
    for process in 0..3 {
        let store = Arc::new(Counted {
            store: common::store(&cluster).await,
            claims: AtomicUsize::new(0),
        });
        counted.push(Arc::clone(&store));
        let sem = Semaphore::new(store, ns.clone(), "herd", 1).unwrap();
        let (release, released) = oneshot::channel::<()>();
        releases.push(release);
        let (granted_tx, wait) = (
            granted_tx.clone(),
            long.clone().wait(Duration::from_secs(60)),
        );
        tokio::spawn(async move {
            let guard = sem.acquire(&wait).await.expect("its turn comes");
            granted_tx.send(process).unwrap();
            let _ = released.await;
            guard.release().await;
        });
        until_queued(&mut raw, &key, process + 1).await;
    }
    // Every process has claimed once (and was refused); from here on, count.
    sleep(Duration::from_millis(200)).await;
    for store in &counted {
        store.claims.store(0, Ordering::SeqCst);
    }
    held.release().await;
    let first = tokio::time::timeout(Duration::from_secs(10), granted.recv())
        .await
        .expect("the head took the released permit")
        .unwrap();
    assert_eq!(first, 0, "the first process queued");
    // Time for any other process woken by the release to claim.
    sleep(Duration::from_millis(500)).await;
    let claims: Vec<usize> = counted
        .iter()
        .map(|s| s.claims.load(Ordering::SeqCst))
        .collect();
    assert_eq!(claims, [1, 0, 0], "claims after the release, by process");
    // The others follow, one release each.
    for (next, release) in releases.into_iter().enumerate() {
        release.send(()).unwrap();
        if next < 2 {
            let got = tokio::time::timeout(Duration::from_secs(10), granted.recv())
                .await
                .expect("the next process's turn")
                .unwrap();
            assert_eq!(got, next + 1);
        }
    }
    until_queued(&mut raw, &key, 0).await;
    let claims: Vec<usize> = counted
        .iter()
        .map(|s| s.claims.load(Ordering::SeqCst))
        .collect();
    assert_eq!(claims, [1, 1, 1], "one claim per turn: {claims:?}");
}

/// A process that dies while queued first (its store dropped without leaving the queue)
/// holds up the process behind it only until its queue entry's lease ends, although the
/// holder's permit would last a minute.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_that_died_in_the_queue_holds_up_the_next_only_until_its_entry_expires() {
    let cluster = common::cluster().await;
    let mut raw = common::raw(&cluster).await;
    let ns = fresh_namespace();
    let key = semaphore_key(&ns, "dead");
    let long = LockOptions::new(Duration::from_secs(60));
    let held = held_for_a_minute(&ns, "dead").await;
    let wait = long.clone().wait(Duration::from_secs(60));
    let dies = {
        let sem = semaphore_of_a_new_store(&ns, "dead").await;
        let wait = wait.clone();
        tokio::spawn(async move { sem.acquire(&wait).await.map(|_| ()) })
    };
    until_queued(&mut raw, &key, 1).await;
    let next = {
        let sem = semaphore_of_a_new_store(&ns, "dead").await;
        tokio::spawn(async move {
            let guard = sem.acquire(&wait).await.expect("its turn comes");
            guard.release().await;
        })
    };
    until_queued(&mut raw, &key, 2).await;
    // The first process dies: its store stops without leaving the queue.
    dies.abort();
    let _ = dies.await;
    let released = Instant::now();
    held.release().await;
    tokio::time::timeout(Duration::from_secs(20), next)
        .await
        .expect("the next process's turn came when the dead one's entry expired")
        .unwrap();
    let waited = released.elapsed();
    assert!(
        waited < Duration::from_secs(u64::try_from(baton_etcd::watch::QUEUE_LEASE).unwrap() + 3),
        "{waited:?}"
    );
    until_queued(&mut raw, &key, 0).await;
}

/// The etcd semantics the claim's queue compares rely on, on the real cluster: a compare
/// with a range end applies to every key of the range, and an empty range compares as a key
/// never created (create revision 0).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_range_compares_hold_for_every_key_and_an_empty_range_is_revision_0() {
    use etcd_client::{Compare, CompareOp, Txn};
    let cluster = common::cluster().await;
    let mut raw = common::raw(&cluster).await;
    let key = semaphore_key(&fresh_namespace(), "compare");
    let (queue, end) = (
        format!("{}\u{1}q\u{0}", key.as_str()),
        format!("{}\u{1}q\u{1}", key.as_str()),
    );
    let holds = async |raw: &mut etcd_client::Client, op, revision| {
        raw.txn(Txn::new().when([
            Compare::create_revision(queue.as_str(), op, revision).with_range(end.as_str()),
        ]))
        .await
        .expect("a transaction")
        .succeeded()
    };
    assert!(
        holds(&mut raw, CompareOp::Equal, 0).await,
        "empty: revision 0"
    );
    assert!(
        !holds(&mut raw, CompareOp::Greater, 0).await,
        "empty: nothing above 0"
    );
    let first = raw
        .put(format!("{queue}a"), "x", None)
        .await
        .unwrap()
        .header()
        .unwrap()
        .revision();
    let second = raw
        .put(format!("{queue}b"), "x", None)
        .await
        .unwrap()
        .header()
        .unwrap()
        .revision();
    assert!(!holds(&mut raw, CompareOp::Equal, 0).await, "not empty");
    assert!(
        holds(&mut raw, CompareOp::Greater, first - 1).await,
        "the first entry is the oldest"
    );
    assert!(
        !holds(&mut raw, CompareOp::Greater, second - 1).await,
        "the second is not: every key is compared"
    );
    raw.delete(
        queue.as_str(),
        Some(etcd_client::DeleteOptions::new().with_prefix()),
    )
    .await
    .unwrap();
    assert!(holds(&mut raw, CompareOp::Equal, 0).await, "empty again");
}

/// A process that queues again while an entry of an earlier wait of its own is still there
/// (its revoke failed; here an operator's put on a lease of its own stands in for it) keeps
/// that entry's place, and is woken as the head by the release: it is not its own
/// predecessor.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_that_finds_its_own_entry_left_over_keeps_its_place() {
    let cluster = common::cluster().await;
    let mut raw = common::raw(&cluster).await;
    let ns = fresh_namespace();
    let key = semaphore_key(&ns, "left");
    let long = LockOptions::new(Duration::from_secs(60));
    let held = held_for_a_minute(&ns, "left").await;
    let waiting = semaphore_of_a_new_store(&ns, "left").await;
    // A first wait queues the process, and leaves when it gives up.
    let first = tokio::spawn({
        let waiting = waiting.clone();
        let wait = long.clone().wait(Duration::from_secs(2));
        async move { waiting.acquire(&wait).await.map(|_| ()) }
    });
    until_queued(&mut raw, &key, 1).await;
    let entry = raw
        .get(
            format!("{}\u{1}q\u{0}", key.as_str()),
            Some(GetOptions::new().with_prefix().with_keys_only()),
        )
        .await
        .unwrap()
        .kvs()[0]
        .key()
        .to_vec();
    assert!(
        first.await.unwrap().is_err(),
        "held throughout the first wait"
    );
    until_queued(&mut raw, &key, 0).await;
    // The entry is back, as a failed revoke would have left it.
    let lease = raw.lease_grant(30, None).await.unwrap().id();
    raw.put(
        entry,
        "baton:queue:v1",
        Some(etcd_client::PutOptions::new().with_lease(lease)),
    )
    .await
    .unwrap();
    let second = tokio::spawn({
        let wait = long.clone().wait(Duration::from_secs(30));
        async move {
            let guard = waiting.acquire(&wait).await.expect("the released permit");
            guard.release().await;
        }
    });
    // Its claim found the permit held, and its process queued again (on the same entry).
    sleep(Duration::from_millis(500)).await;
    held.release().await;
    tokio::time::timeout(Duration::from_secs(10), second)
        .await
        .expect("the head was woken by the release")
        .unwrap();
    raw.lease_revoke(lease).await.ok();
    until_queued(&mut raw, &key, 0).await;
}
