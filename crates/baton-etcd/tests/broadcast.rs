//! Broadcast on the etcd store (a watched key per channel): the conformance rules on the
//! test binary's private cluster, messages between stores (as between processes), and a
//! subscriber whose member is killed mid-stream, which carries on from where its watch
//! stopped with nothing lost or doubled.

mod common;

use std::sync::Arc;
use std::time::Duration;

use baton_core::Broadcast;
use baton_core::broadcast::Event;
use baton_core::conformance::fresh_namespace;
use baton_etcd::EtcdStore;
use tokio::time::timeout;

baton_core::broadcast_conformance_tests!(common::harness());

const PATIENCE: Duration = Duration::from_secs(30);

/// The payload of the next event, which must be a message.
async fn next_message(sub: &mut baton_core::broadcast::Subscription<u32>) -> u32 {
    match timeout(PATIENCE, sub.next())
        .await
        .unwrap_or_else(|_| panic!("no event within {PATIENCE:?}"))
        .expect("the subscription ended")
    {
        Event::Message(m) => m.payload,
        other => panic!("expected a message, got {other:?}"),
    }
}

/// Two subscribing stores and a publishing one: each subscriber gets every message once,
/// in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_store_gets_every_message_of_another() {
    let cluster = common::cluster().await;
    let ns = fresh_namespace();
    let open = || async { Arc::new(common::store(&cluster).await) };
    let publisher = Broadcast::with_namespace(open().await, ns.clone());
    let mut subs = Vec::new();
    for _ in 0..2 {
        let broadcast = Broadcast::with_namespace(open().await, ns.clone());
        subs.push((broadcast.subscribe::<u32>("c").await.unwrap(), broadcast));
    }
    for n in 0..20u32 {
        publisher.publish("c", &n).await.unwrap();
    }
    for (sub, _) in &mut subs {
        for n in 0..20u32 {
            assert_eq!(next_message(sub).await, n);
        }
    }
}

/// The member a subscriber's store talks to is killed while messages are published (each
/// member in turn): the watch is opened again on another member from the revision after the
/// last one it delivered, so every message whose publish succeeded arrives, once, in order,
/// and no gap is reported. (A publish that failed during a leader election is the core's
/// `Missed`; if it reached the cluster after all, it arrives too.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_member_loses_no_message() {
    let cluster = common::private_cluster().await;
    let ns = fresh_namespace();
    let url = format!("{}?connect_timeout=1s&response_timeout=2s", cluster.url());
    let subscriber = Broadcast::with_namespace(
        Arc::new(EtcdStore::connect(&url).await.unwrap()),
        ns.clone(),
    );
    let publisher =
        Broadcast::with_namespace(Arc::new(EtcdStore::connect(&url).await.unwrap()), ns);
    let mut sub = subscriber.subscribe::<u32>("c").await.unwrap();
    let mut sent = Vec::new();
    let mut next = 0u32;
    for member in 0..cluster.len() {
        let kill = {
            let cluster = cluster.clone();
            tokio::task::spawn_blocking(move || cluster.kill(member))
        };
        for _ in 0..10 {
            if publisher.publish("c", &next).await.is_ok() {
                sent.push(next);
            }
            next += 1;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        kill.await.unwrap();
        let cluster = cluster.clone();
        tokio::task::spawn_blocking(move || cluster.restart(member))
            .await
            .unwrap()
            .unwrap();
    }
    publisher.publish("c", &next).await.unwrap();
    sent.push(next);
    let mut received = Vec::new();
    while received.last() != Some(&next) {
        match timeout(PATIENCE, sub.next())
            .await
            .unwrap_or_else(|_| panic!("no event within {PATIENCE:?}; got {received:?}"))
            .expect("the subscription ended")
        {
            Event::Message(m) => received.push(m.payload),
            Event::Missed { .. } => {}
            other => panic!("expected messages only, got {other:?} after {received:?}"),
        }
    }
    assert!(
        received.windows(2).all(|w| w[0] < w[1]),
        "in order, once each: {received:?}"
    );
    let lost: Vec<&u32> = sent.iter().filter(|n| !received.contains(n)).collect();
    assert!(lost.is_empty(), "published but lost: {lost:?}");
}
