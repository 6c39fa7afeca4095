//! Waiting on the predecessor: processes (here, stores of their own) that wait for one lock
//! queue once each, and a release wakes only the head of the queue, so they take the lock in
//! the order they queued. A process that dies while queued holds up the ones behind it only
//! until its queue entry's lease ends.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use baton_core::conformance::fresh_namespace;
use baton_core::{Key, KeyKind, LockOptions, Locks, Namespace, StoreKey};
use etcd_client::GetOptions;
use tokio::time::{Instant, sleep};

/// The number of processes queued for `key`, as a raw client reads the queue.
async fn queued(raw: &mut etcd_client::Client, key: &StoreKey) -> i64 {
    raw.get(
        format!("{}\u{0}q\u{0}", key.as_str()),
        Some(GetOptions::new().with_prefix().with_count_only()),
    )
    .await
    .expect("read the queue")
    .count()
}

/// Waits (at most 10s) until `n` processes are queued for `key`.
async fn until_queued(raw: &mut etcd_client::Client, key: &StoreKey, n: i64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while queued(raw, key).await != n {
        assert!(Instant::now() < deadline, "{n} processes never queued");
        sleep(Duration::from_millis(20)).await;
    }
}

async fn locks_of_a_new_store(ns: &Namespace) -> Locks {
    let store = common::store(&*common::cluster().await).await;
    Locks::with_namespace(Arc::new(store), ns.clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processes_take_the_lock_in_the_order_they_queued() {
    let cluster = common::cluster().await;
    let mut raw = common::raw(&cluster).await;
    let ns = fresh_namespace();
    let key = ns.qualify(KeyKind::Lock, &Key::new("k").unwrap());
    let holder = locks_of_a_new_store(&ns)
        .await
        .acquire("k", &LockOptions::new(Duration::from_secs(30)))
        .await
        .unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for process in 0..4 {
        let locks = locks_of_a_new_store(&ns).await;
        let order = Arc::clone(&order);
        waiters.push(tokio::spawn(async move {
            let options = LockOptions::new(Duration::from_secs(30)).wait(Duration::from_secs(60));
            let guard = locks.acquire("k", &options).await.expect("its turn comes");
            order.lock().unwrap().push((process, guard.fence()));
            sleep(Duration::from_millis(100)).await;
            guard.release().await;
        }));
        until_queued(&mut raw, &key, process + 1).await;
    }
    holder.release().await;
    for waiter in waiters {
        waiter.await.unwrap();
    }
    let order = order.lock().unwrap().clone();
    let processes: Vec<i64> = order.iter().map(|(p, _)| *p).collect();
    assert_eq!(
        processes,
        [0, 1, 2, 3],
        "in the order they queued: {order:?}"
    );
    assert!(order.windows(2).all(|w| w[0].1 < w[1].1), "{order:?}");
    until_queued(&mut raw, &key, 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_that_died_in_the_queue_holds_up_the_next_only_until_its_entry_expires() {
    let cluster = common::cluster().await;
    let mut raw = common::raw(&cluster).await;
    let ns = fresh_namespace();
    let key = ns.qualify(KeyKind::Lock, &Key::new("k").unwrap());
    let holder = locks_of_a_new_store(&ns)
        .await
        .acquire("k", &LockOptions::new(Duration::from_secs(60)))
        .await
        .unwrap();
    let long = LockOptions::new(Duration::from_secs(60)).wait(Duration::from_secs(60));
    let dies = {
        let locks = locks_of_a_new_store(&ns).await;
        let long = long.clone();
        tokio::spawn(async move { locks.acquire("k", &long).await.map(|_| ()) })
    };
    until_queued(&mut raw, &key, 1).await;
    let next = {
        let locks = locks_of_a_new_store(&ns).await;
        tokio::spawn(async move {
            let guard = locks.acquire("k", &long).await.expect("its turn comes");
            guard.release().await;
        })
    };
    until_queued(&mut raw, &key, 2).await;
    // The first process dies: its store stops without leaving the queue.
    dies.abort();
    let _ = dies.await;
    holder.release().await;
    // The holder's TTL was a minute, so only the dead entry's lease ending lets the next
    // process in this soon.
    tokio::time::timeout(Duration::from_secs(30), next)
        .await
        .expect("the next process's turn came when the dead one's entry expired")
        .unwrap();
}
