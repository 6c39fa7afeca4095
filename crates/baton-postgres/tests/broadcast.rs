//! Broadcast on the PostgreSQL store (`LISTEN`/`NOTIFY`): the conformance rules on the test
//! binary's shared server, then on private servers what happens when the LISTEN connection
//! breaks: terminated (`pg_terminate_backend`) and the server restarted mid-stream.
//! Subscribers resume by themselves, are told about the gap, and never get a message twice.
//! Also: a message too large for `NOTIFY` is refused before it is sent, and a store opened
//! with `listen=off` cannot subscribe.

mod common;

use std::sync::Arc;
use std::time::Duration;

use baton_core::broadcast::Event;
use baton_core::telemetry::events;
use baton_core::{Broadcast, ErrorKind};
use baton_postgres::PostgresStore;
use baton_postgres::broadcast::{APPLICATION, MAX_MESSAGE};
use baton_testkit::postgres::Stop;
use tokio::time::{Instant, sleep, timeout};

use common::*;

baton_core::broadcast_conformance_tests!(harness());

/// The next event of a subscription, within [`PATIENCE`].
macro_rules! next {
    ($sub:expr) => {
        within("the next event", $sub.next())
            .await
            .expect("the subscription ended")
    };
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminated_listen_connection_resubscribes_with_a_gap() {
    capture_events();
    let server = private().await;
    let broadcast = Broadcast::with_namespace(Arc::new(connect(&server.url()).await), namespace());
    let mut sub = broadcast.subscribe::<u32>("c").await.unwrap();
    broadcast.publish("c", &1u32).await.unwrap();
    assert!(matches!(next!(sub), Event::Message(m) if m.payload == 1));

    let killed = blocking(move || {
        let killed = server.terminate_backends(APPLICATION).expect("terminate");
        (server, killed)
    })
    .await;
    let server = killed.0;
    assert_eq!(killed.1, 1, "one broadcast connection");
    match next!(sub) {
        Event::Gap { gap_ms, .. } => assert!(gap_ms < PATIENCE.as_millis() as u64),
        other => panic!("expected a gap, got {other:?}"),
    }
    assert!(matches!(next!(sub), Event::Resubscribed));
    let channel = format!("{}:broadcast:c", broadcast.namespace());
    assert!(!events(&events::SUBSCRIPTION_DROPPED, |e| e.key == channel).is_empty());
    assert!(
        events(&events::SUBSCRIPTION_RESUBSCRIBED, |e| e.key == channel
            && e.message.contains("gap_ms="))
        .len()
            == 1
    );
    broadcast.publish("c", &2u32).await.unwrap();
    match next!(sub) {
        Event::Message(m) => assert_eq!((m.seq, m.payload), (2, 2)),
        other => panic!("expected message 2, got {other:?}"),
    }
    assert!(
        timeout(Duration::from_millis(300), sub.next())
            .await
            .is_err()
    );
    drop(server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_server_mid_stream_loses_messages_but_never_doubles_them() {
    let server = Arc::new(private().await);
    let ns = namespace();
    let publisher = Broadcast::with_namespace(Arc::new(connect(&server.url()).await), ns.clone());
    let subscriber = Broadcast::with_namespace(Arc::new(connect(&server.url()).await), ns);
    let mut sub = subscriber.subscribe::<u64>("stream").await.unwrap();
    let publishing = tokio::spawn({
        let publisher = publisher.clone();
        async move {
            let mut sent = Vec::new();
            let mut failed = 0;
            let started = Instant::now();
            let mut i = 0u64;
            while started.elapsed() < Duration::from_secs(8) || sent.len() < 20 {
                i += 1;
                match publisher.publish("stream", &i).await {
                    Ok(seq) => sent.push(seq),
                    Err(_) => failed += 1,
                }
                sleep(Duration::from_millis(20)).await;
                assert!(
                    started.elapsed() < PATIENCE * 2,
                    "the publisher never recovered"
                );
            }
            (sent, failed)
        }
    });
    sleep(Duration::from_millis(1500)).await;
    let restarted = Arc::clone(&server);
    blocking(move || restarted.restart(Stop::Fast))
        .await
        .expect("the server restarts");
    let (sent, _failed) = publishing.await.unwrap();

    let last_sent = *sent.last().unwrap();
    let mut received: Vec<u64> = Vec::new();
    let (mut gaps, mut resubscribed) = (0, 0);
    while received.last() != Some(&last_sent) {
        match next!(sub) {
            Event::Message(m) => {
                assert_eq!(m.publisher, publisher.publisher());
                assert_eq!(m.payload, m.seq);
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
                resubscribed += 1;
                assert_eq!(resubscribed, gaps);
            }
            Event::Missed { .. } => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    assert!(
        gaps >= 1 && resubscribed == gaps,
        "gaps {gaps}, resubscribed {resubscribed}"
    );
    assert!(received.iter().all(|seq| sent.contains(seq)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_too_large_for_notify_is_refused_before_it_is_sent() {
    let broadcast =
        Broadcast::with_namespace(Arc::new(connect(&shared().await.url()).await), namespace());
    let mut sub = broadcast.subscribe::<String>("c").await.unwrap();
    let err = broadcast
        .publish("c", &"x".repeat(MAX_MESSAGE))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
    assert!(err.message().contains(&MAX_MESSAGE.to_string()), "{err}");
    // The largest message that fits goes through.
    let fits = "y".repeat(MAX_MESSAGE - 64);
    assert_eq!(broadcast.publish("c", &fits).await.unwrap(), 1);
    assert!(matches!(next!(sub), Event::Message(m) if m.payload == fits));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listen_off_cannot_subscribe() {
    let url = with_timeouts(&shared().await.url());
    let store = PostgresStore::connect(&format!("{url}&listen=off"))
        .await
        .unwrap();
    let err = baton::Baton::from_store(Arc::new(store), namespace())
        .broadcast()
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}");
    assert!(err.message().contains("listen=off"), "{err}");
}
