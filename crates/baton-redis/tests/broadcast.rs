//! Broadcast on the Redis store: the conformance rules (each on a private redis-server),
//! then what pub/sub does to subscribers when it breaks: a killed subscriber connection
//! (`CLIENT KILL TYPE pubsub`) and a killed and restarted server, mid-stream. Subscribers
//! resume by themselves, are told about the gap, and never get a message twice. Last, the
//! seed's use: local caches on several replicas evicted everywhere by one broadcast.

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use baton_core::Broadcast;
use baton_core::broadcast::Event;
use baton_core::conformance::fresh_namespace;
use baton_core::telemetry::events;
use tokio::time::{Instant, sleep, timeout};

baton_core::broadcast_conformance_tests!(common::harness());

const PATIENCE: Duration = Duration::from_secs(60);

/// The next event of a subscription, within [`PATIENCE`].
macro_rules! next {
    ($sub:expr) => {
        timeout(PATIENCE, $sub.next())
            .await
            .unwrap_or_else(|_| panic!("no event within {PATIENCE:?}"))
            .expect("the subscription ended")
    };
}

/// `CLIENT KILL TYPE pubsub` drops the subscriber connection: the subscription reports a
/// gap, resubscribes by itself, and delivery continues with nothing lost or doubled (nothing
/// was published in the gap).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_subscriber_connection_resubscribes_with_a_gap() {
    let events = common::Events::capture();
    let server = common::server().await;
    let store = Arc::new(common::store(&server).await);
    let broadcast = Broadcast::with_namespace(store, fresh_namespace());
    let mut sub = broadcast.subscribe::<u32>("c").await.unwrap();
    broadcast.publish("c", &1u32).await.unwrap();
    assert!(matches!(next!(sub), Event::Message(m) if m.payload == 1));

    let killed = server
        .command_ok(&["CLIENT", "KILL", "TYPE", "pubsub"])
        .expect("CLIENT KILL");
    assert!(killed.as_integer().is_some_and(|n| n >= 2), "{killed:?}");
    match next!(sub) {
        Event::Gap { gap_ms, .. } => assert!(gap_ms < PATIENCE.as_millis() as u64),
        other => panic!("expected a gap, got {other:?}"),
    }
    assert!(matches!(next!(sub), Event::Resubscribed));
    let address = format!("127.0.0.1:{}", server.port());
    assert!(events.count(events::SUBSCRIPTION_DROPPED.key, &address) >= 1);
    assert!(
        events
            .all()
            .iter()
            .any(|(k, m)| k == events::SUBSCRIPTION_RESUBSCRIBED.key && m.contains("gap_ms=")),
        "{:?}",
        events.all()
    );

    broadcast.publish("c", &2u32).await.unwrap();
    match next!(sub) {
        Event::Message(m) => assert_eq!((m.seq, m.payload), (2, 2)),
        other => panic!("expected message 2, got {other:?}"),
    }
    assert!(
        timeout(Duration::from_millis(300), sub.next())
            .await
            .is_err(),
        "something more arrived"
    );
}

/// A publisher on one store streams messages to a subscriber on another while the server is
/// killed and restarted: the subscriber sees a gap, resubscribes, is told which messages it
/// missed, keeps receiving, and never receives a message twice or out of order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_server_mid_stream_loses_messages_but_never_doubles_them() {
    let server = Arc::new(common::server().await);
    let namespace = fresh_namespace();
    let publisher =
        Broadcast::with_namespace(Arc::new(common::store(&server).await), namespace.clone());
    let subscriber = Broadcast::with_namespace(Arc::new(common::store(&server).await), namespace);
    let mut sub = subscriber.subscribe::<u64>("stream").await.unwrap();
    let publishing = tokio::spawn({
        let publisher = publisher.clone();
        async move {
            let mut sent = Vec::new();
            let mut failed = 0;
            let started = Instant::now();
            let mut i = 0u64;
            while started.elapsed() < Duration::from_secs(6) || sent.len() < 20 {
                i += 1;
                match publisher.publish("stream", &i).await {
                    Ok(seq) => sent.push(seq),
                    Err(_) => failed += 1,
                }
                sleep(Duration::from_millis(20)).await;
                assert!(
                    started.elapsed() < PATIENCE,
                    "the publisher never recovered"
                );
            }
            (sent, failed)
        }
    });
    sleep(Duration::from_millis(1500)).await;
    common::kill(&server).await;
    sleep(Duration::from_millis(800)).await;
    common::restart(&server).await;
    let (sent, failed) = publishing.await.unwrap();
    assert!(failed > 0, "no publish failed while the server was down");

    let last_sent = *sent.last().unwrap();
    let mut received = Vec::new();
    let (mut gaps, mut resubscribed, mut missed) = (0, 0, 0);
    while received.last() != Some(&last_sent) {
        match next!(sub) {
            Event::Message(m) => {
                assert_eq!(m.publisher, publisher.publisher());
                assert_eq!(m.payload, m.seq, "publish i is the i-th sequence number");
                if let Some(&previous) = received.last() {
                    assert!(
                        m.seq > previous,
                        "{} after {previous}: doubled or reordered",
                        m.seq
                    );
                }
                received.push(m.seq);
            }
            Event::Gap { .. } => gaps += 1,
            Event::Resubscribed => {
                assert_eq!(resubscribed + 1, gaps, "resubscribed follows its gap");
                resubscribed += 1;
            }
            Event::Missed {
                count,
                publisher: who,
            } => {
                assert_eq!(who, publisher.publisher());
                missed += count;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert!(
        gaps >= 1 && resubscribed == gaps,
        "gaps {gaps}, resubscribed {resubscribed}"
    );
    // Failed publishes took sequence numbers, and messages published while the
    // subscriber was still reconnecting were lost: both are reported as missed.
    assert!(missed >= 1, "missed {missed}, failed publishes {failed}");
    assert!(received.iter().all(|seq| sent.contains(seq)));
    // Every message sent while the subscriber was connected arrived: those sent before the
    // kill and after the resubscribe.
    assert!(received.len() >= 20, "{received:?}");
}

/// One broadcast evicts an entry from the local in-process cache of every replica. Each
/// replica has its own connection (its own store), a local map, and a task that applies
/// invalidations; a replica that may have missed one drops its whole map.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_broadcast_evicts_a_local_cache_on_every_replica() {
    let server = common::server().await;
    let namespace = fresh_namespace();
    type LocalCache = Arc<Mutex<HashMap<String, String>>>;
    let mut replicas: Vec<(Broadcast, LocalCache)> = Vec::new();
    for _ in 0..3 {
        let broadcast =
            Broadcast::with_namespace(Arc::new(common::store(&server).await), namespace.clone());
        let local: LocalCache = Arc::new(Mutex::new(HashMap::from([
            ("org-42".to_owned(), "ancestry of 42".to_owned()),
            ("org-7".to_owned(), "ancestry of 7".to_owned()),
        ])));
        let mut invalidations = broadcast
            .subscribe::<String>("ancestry-invalidate")
            .await
            .unwrap();
        let evict = Arc::clone(&local);
        tokio::spawn(async move {
            while let Some(event) = invalidations.next().await {
                match event {
                    Event::Message(m) => {
                        evict.lock().unwrap().remove(&m.payload);
                    }
                    e if e.may_have_lost_messages() => evict.lock().unwrap().clear(),
                    _ => {}
                }
            }
        });
        replicas.push((broadcast, local));
    }
    replicas[1]
        .0
        .publish("ancestry-invalidate", "org-42")
        .await
        .unwrap();
    let started = Instant::now();
    for (_, local) in &replicas {
        while local.lock().unwrap().contains_key("org-42") {
            assert!(started.elapsed() < PATIENCE, "a replica kept org-42");
            sleep(Duration::from_millis(10)).await;
        }
        assert!(
            local.lock().unwrap().contains_key("org-7"),
            "only org-42 was evicted"
        );
    }
}
