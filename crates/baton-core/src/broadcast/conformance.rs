//! The broadcast conformance rules: written once, run by every store that implements
//! [`BroadcastStore`].
//!
//! A store's test target implements [`Opens`] for its store (the
//! [`BroadcastHarness`]) and expands
//! [`broadcast_conformance_tests!`](crate::broadcast_conformance_tests)
//! (`baton_core::broadcast_conformance_tests!(my_harness())`), which generates one
//! `#[tokio::test]` per rule. Each rule uses a fresh random namespace. Rules about a store's
//! connection (a killed connection, a restarted server) need the server, and live in the
//! store's own tests.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde::de::DeserializeOwned;
use tokio::time::timeout;

use super::{
    Broadcast, BroadcastStore, Event, MAX_MESSAGE_BYTES, Message, RawSubscription,
    SubscribeOptions, Subscription,
};
use crate::conformance::{Faulty, Opens, fresh_namespace};
use crate::error::{ErrorKind, Result};
use crate::key::StoreKey;

/// What a store's test target provides to the broadcast rules: the store under test, as
/// [`BroadcastStore`].
pub type BroadcastHarness = dyn Opens<dyn BroadcastStore>;

/// Generates one `#[tokio::test]` per broadcast rule. `$harness` is an expression that
/// evaluates to a future of a [`BroadcastHarness`]; it is evaluated once per test.
#[macro_export]
macro_rules! broadcast_conformance_tests {
    ($harness:expr) => {
        $crate::__conformance_rules!($crate::broadcast::conformance; $harness;
            every_subscriber_gets_every_message_in_order,
            channels_and_namespaces_are_separate,
            only_messages_published_after_subscribe_arrive,
            duplicates_are_dropped_and_jumps_reported,
            undecodable_messages_are_skipped,
            a_slow_consumer_lags_without_holding_up_others,
            dropping_a_subscription_unsubscribes,
            invalid_input_is_rejected_before_io,
            publish_faults_are_unavailable_and_counted_as_missed,
            a_subscription_is_a_stream,
        );
    };
}

/// How long any one event may take to arrive before a rule fails.
const PATIENCE: Duration = Duration::from_secs(30);
/// How long a rule waits to be sure that nothing (more) arrives.
const QUIET: Duration = Duration::from_millis(300);

async fn next<T: DeserializeOwned>(sub: &mut Subscription<T>) -> Event<T> {
    timeout(PATIENCE, sub.next())
        .await
        .unwrap_or_else(|_| panic!("no event within {PATIENCE:?}"))
        .expect("the subscription ended")
}

async fn message<T: DeserializeOwned + std::fmt::Debug>(sub: &mut Subscription<T>) -> Message<T> {
    match next(sub).await {
        Event::Message(m) => m,
        other => panic!("expected a message, got {other:?}"),
    }
}

async fn nothing_more<T: DeserializeOwned + std::fmt::Debug>(sub: &mut Subscription<T>) {
    if let Ok(event) = timeout(QUIET, sub.next()).await {
        panic!("expected nothing more, got {event:?}");
    }
}

async fn broadcast(h: &BroadcastHarness) -> Broadcast {
    Broadcast::with_namespace(h.open().await, fresh_namespace())
}

/// Two subscribers each get all messages of a publisher, in order, numbered from 1.
pub async fn every_subscriber_gets_every_message_in_order(h: &BroadcastHarness) {
    let broadcast = broadcast(h).await;
    let mut a = broadcast.subscribe::<u32>("c").await.unwrap();
    let mut b = broadcast.subscribe::<u32>("c").await.unwrap();
    for i in 1..=100u32 {
        assert_eq!(broadcast.publish("c", &i).await.unwrap(), u64::from(i));
    }
    for sub in [&mut a, &mut b] {
        for i in 1..=100u32 {
            let m = message(sub).await;
            assert_eq!((m.seq, m.payload), (u64::from(i), i));
            assert_eq!(m.publisher, broadcast.publisher());
        }
        nothing_more(sub).await;
    }
}

/// A channel hears only its own messages; the same channel in another namespace is another
/// channel.
pub async fn channels_and_namespaces_are_separate(h: &BroadcastHarness) {
    let store = h.open().await;
    let one = Broadcast::with_namespace(Arc::clone(&store), fresh_namespace());
    let two = Broadcast::with_namespace(store, fresh_namespace());
    let mut c = one.subscribe::<String>("c").await.unwrap();
    let mut d = one.subscribe::<String>("d").await.unwrap();
    let mut other_ns = two.subscribe::<String>("c").await.unwrap();
    one.publish("c", "for c").await.unwrap();
    one.publish("d", "for d").await.unwrap();
    two.publish("c", "for the other c").await.unwrap();
    assert_eq!(message(&mut c).await.payload, "for c");
    assert_eq!(message(&mut d).await.payload, "for d");
    assert_eq!(message(&mut other_ns).await.payload, "for the other c");
    for sub in [&mut c, &mut d, &mut other_ns] {
        nothing_more(sub).await;
    }
}

/// Nothing is stored: a message published before a subscription does not reach it.
pub async fn only_messages_published_after_subscribe_arrive(h: &BroadcastHarness) {
    let broadcast = broadcast(h).await;
    broadcast.publish("c", "early").await.unwrap();
    let mut sub = broadcast.subscribe::<String>("c").await.unwrap();
    broadcast.publish("c", "late").await.unwrap();
    let m = message(&mut sub).await;
    assert_eq!(m.payload, "late");
    assert_eq!(m.seq, 2, "the early message was published, and numbered");
}

/// A message seen twice is delivered once; a jump in a publisher's sequence is reported as
/// `Missed` before the message after it.
pub async fn duplicates_are_dropped_and_jumps_reported(h: &BroadcastHarness) {
    let store = h.open().await;
    let broadcast = Broadcast::with_namespace(Arc::clone(&store), fresh_namespace());
    let mut sub = broadcast.subscribe::<u32>("c").await.unwrap();
    let channel = broadcast.qualify("c").unwrap();
    let raw = |seq: u64| format!(r#"{{"p":"00000000000000ff","s":{seq},"m":{seq}}}"#);
    for seq in [1, 2, 2, 1, 3, 7, 7, 8] {
        store
            .publish(&channel, raw(seq).into_bytes())
            .await
            .unwrap();
    }
    let mut seqs = Vec::new();
    loop {
        match next(&mut sub).await {
            Event::Message(m) => {
                assert_eq!(u64::from(m.payload), m.seq);
                seqs.push(m.seq);
                if m.seq == 8 {
                    break;
                }
            }
            Event::Missed { count, .. } => {
                assert_eq!(count, 3, "4, 5 and 6 were lost");
                assert_eq!(seqs, [1, 2, 3], "reported just before 7");
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(seqs, [1, 2, 3, 7, 8]);
    nothing_more(&mut sub).await;
}

/// Messages that are not baton envelopes, or whose payload is not the subscriber's type,
/// are skipped; the subscription goes on.
pub async fn undecodable_messages_are_skipped(h: &BroadcastHarness) {
    let store = h.open().await;
    let broadcast = Broadcast::with_namespace(Arc::clone(&store), fresh_namespace());
    let mut sub = broadcast.subscribe::<u32>("c").await.unwrap();
    let channel = broadcast.qualify("c").unwrap();
    store
        .publish(&channel, b"not json {".to_vec())
        .await
        .unwrap();
    store
        .publish(&channel, br#"{"p":"zz","s":1,"m":1}"#.to_vec())
        .await
        .unwrap();
    broadcast.publish("c", "not a number").await.unwrap();
    broadcast.publish("c", &5u32).await.unwrap();
    let m = message(&mut sub).await;
    assert_eq!((m.seq, m.payload), (2, 5));
}

/// A subscriber that does not keep up loses messages beyond its buffer and is told how
/// many; another subscriber of the same channel gets everything.
pub async fn a_slow_consumer_lags_without_holding_up_others(h: &BroadcastHarness) {
    let broadcast = broadcast(h).await;
    let mut slow = broadcast
        .subscribe_with::<u32>("c", &SubscribeOptions::new().capacity(4))
        .await
        .unwrap();
    let mut fast = broadcast.subscribe::<u32>("c").await.unwrap();
    for i in 1..=50u32 {
        broadcast.publish("c", &i).await.unwrap();
    }
    for i in 1..=50u32 {
        assert_eq!(message(&mut fast).await.payload, i);
    }
    match next(&mut slow).await {
        Event::Lagged { dropped } => assert_eq!(dropped, 46),
        other => panic!("expected Lagged, got {other:?}"),
    }
    for i in 1..=4u32 {
        assert_eq!(message(&mut slow).await.payload, i);
    }
    broadcast.publish("c", &51u32).await.unwrap();
    // The sequence jump over the discarded messages is reported too, as the publisher's.
    match next(&mut slow).await {
        Event::Missed { count, .. } => assert_eq!(count, 46),
        other => panic!("expected Missed, got {other:?}"),
    }
    assert_eq!(message(&mut slow).await.payload, 51);
    assert_eq!(message(&mut fast).await.payload, 51);
}

/// A dropped subscription receives nothing more; subscribing again works.
pub async fn dropping_a_subscription_unsubscribes(h: &BroadcastHarness) {
    let broadcast = broadcast(h).await;
    for round in 0..3u32 {
        let mut sub = broadcast.subscribe::<u32>("c").await.unwrap();
        broadcast.publish("c", &round).await.unwrap();
        assert_eq!(message(&mut sub).await.payload, round);
        drop(sub);
    }
    let mut keep = broadcast.subscribe::<u32>("c").await.unwrap();
    let gone = broadcast.subscribe::<u32>("c").await.unwrap();
    drop(gone);
    broadcast.publish("c", &9u32).await.unwrap();
    assert_eq!(message(&mut keep).await.payload, 9);
}

/// Invalid channel names, messages too large and bad options fail before any I/O.
pub async fn invalid_input_is_rejected_before_io(h: &BroadcastHarness) {
    let store = Arc::new(FaultyBroadcastStore::new(h.open().await));
    let broadcast = Broadcast::with_namespace(store.clone(), fresh_namespace());
    for channel in ["", "a\nb"] {
        let e = broadcast.publish(channel, &1).await.unwrap_err();
        assert!(e.is_invalid_input(), "{e}");
        assert!(e.message().contains("channel"), "{e}");
        assert!(
            broadcast
                .subscribe::<u8>(channel)
                .await
                .unwrap_err()
                .is_invalid_input()
        );
    }
    let big = "x".repeat(MAX_MESSAGE_BYTES);
    let e = broadcast.publish("c", &big).await.unwrap_err();
    assert!(
        e.is_invalid_input() && e.message().contains("must fit"),
        "{e}"
    );
    let e = broadcast
        .subscribe_with::<u8>("c", &SubscribeOptions::new().capacity(0))
        .await
        .unwrap_err();
    assert!(e.is_invalid_input(), "{e}");
    assert_eq!(store.calls(), 0, "rejected input reached the store");
    // Rejected messages took no sequence number.
    let mut sub = broadcast.subscribe::<u8>("c").await.unwrap();
    assert_eq!(broadcast.publish("c", &1u8).await.unwrap(), 1);
    assert_eq!(message(&mut sub).await.seq, 1);
}

/// A publish the store refuses is `Unavailable`; subscribers count it as missed.
pub async fn publish_faults_are_unavailable_and_counted_as_missed(h: &BroadcastHarness) {
    let store = Arc::new(FaultyBroadcastStore::new(h.open().await));
    let broadcast = Broadcast::with_namespace(store.clone(), fresh_namespace());
    let mut sub = broadcast.subscribe::<u32>("c").await.unwrap();
    broadcast.publish("c", &1u32).await.unwrap();
    store.set_failing(true);
    let e = broadcast.publish("c", &2u32).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable);
    store.set_failing(false);
    broadcast.publish("c", &3u32).await.unwrap();
    assert_eq!(message(&mut sub).await.payload, 1);
    match next(&mut sub).await {
        Event::Missed {
            count: 1,
            publisher,
        } => assert_eq!(publisher, broadcast.publisher()),
        other => panic!("expected Missed, got {other:?}"),
    }
    assert_eq!(message(&mut sub).await.payload, 3);
}

/// The subscription implements `Stream`.
pub async fn a_subscription_is_a_stream(h: &BroadcastHarness) {
    use futures_core::Stream;
    let broadcast = broadcast(h).await;
    let mut sub = broadcast.subscribe::<String>("c").await.unwrap();
    broadcast.publish("c", "hello").await.unwrap();
    let event = timeout(
        PATIENCE,
        std::future::poll_fn(|cx| Pin::new(&mut sub).poll_next(cx)),
    )
    .await
    .expect("an event")
    .expect("not ended");
    assert!(matches!(event, Event::Message(m) if m.payload == "hello"));
}

/// A [`BroadcastStore`] wrapper that counts calls and fails them on demand.
pub type FaultyBroadcastStore = Faulty<dyn BroadcastStore>;

#[async_trait]
impl BroadcastStore for FaultyBroadcastStore {
    async fn publish(&self, channel: &StoreKey, payload: Vec<u8>) -> Result<()> {
        self.enter()?;
        self.inner.publish(channel, payload).await
    }

    async fn subscribe(&self, channel: &StoreKey, capacity: usize) -> Result<RawSubscription> {
        self.enter()?;
        self.inner.subscribe(channel, capacity).await
    }

    fn max_payload(&self) -> Option<usize> {
        self.inner.max_payload()
    }
}
