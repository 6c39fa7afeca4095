//! Broadcast: publish a message to every replica subscribed to a channel, at most once.
//!
//! Use a [`Broadcast`] for cluster-wide notifications whose loss is tolerable because
//! something else bounds it: the canonical use is cache invalidation ("evict org 42"), where
//! a missed message leaves a local cache stale only until its TTL. Do not use it for
//! one-to-one messaging (that is a queue) or for replicating state (use a real datastore).
//!
//! ## Delivery: at most once, and you are told about losses
//! - A message reaches the subscriptions that are connected when it is published; it is
//!   never stored and never redelivered.
//! - Every message carries its publisher's id and a sequence number (per [`Broadcast`]
//!   handle, from 1). A subscription drops duplicates (a publish retried after a dropped
//!   connection) and reports a jump as [`Event::Missed`].
//! - When the store's connection drops, the subscription resubscribes by itself; once it is
//!   back it yields [`Event::Gap`] (how long it was down) and then [`Event::Resubscribed`],
//!   and emits [`baton.subscription.dropped`](crate::telemetry::events::SUBSCRIPTION_DROPPED)
//!   and [`baton.subscription.resubscribed`](crate::telemetry::events::SUBSCRIPTION_RESUBSCRIBED).
//! - A subscription that is not consumed fast enough buffers up to its capacity and then
//!   discards, reporting [`Event::Lagged`]; a slow consumer never holds up the others.
//! - [`Event::may_have_lost_messages`] is true for every one of these: a cache that
//!   receives such an event should drop everything it may have missed an invalidation for.
//!
//! Messages are JSON (serde) at most [`MAX_MESSAGE_BYTES`] including the envelope, or less
//! where the store has its own limit.

pub mod delivery;
mod memory;
mod store;

#[cfg(feature = "conformance")]
pub mod conformance;

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::SystemTime;

use serde::de::{DeserializeOwned, IgnoredAny};
use serde::{Deserialize, Serialize};

pub(crate) use memory::MemoryBus;
pub use store::{BroadcastStore, RawEvent, RawSubscription};

use crate::error::{Error, Result};
use crate::key::{Key, KeyKind, Namespace, StoreKey};
use crate::telemetry::{self, events};

/// Largest message, in bytes of JSON including baton's envelope (about 40 bytes).
pub const MAX_MESSAGE_BYTES: usize = 1024 * 1024;
/// Default buffer of a subscription, in messages.
pub const DEFAULT_CAPACITY: usize = 1024;
/// Largest buffer of a subscription, in messages.
pub const MAX_CAPACITY: usize = 1 << 20;
/// How many publishers a subscription remembers sequence numbers for; beyond this the
/// least recently first-seen is forgotten (its next message counts as its first).
const TRACKED_PUBLISHERS: usize = 4096;

/// Who published a message: one [`Broadcast`] handle, random per handle.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PublisherId(u64);

impl PublisherId {
    fn random() -> Self {
        PublisherId(rand::random())
    }

    fn parse(text: &str) -> Option<Self> {
        (text.len() == 16)
            .then(|| u64::from_str_radix(text, 16).ok())
            .flatten()
            .map(PublisherId)
    }
}

impl fmt::Display for PublisherId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

impl fmt::Debug for PublisherId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PublisherId({self})")
    }
}

/// A delivered message.
#[derive(Debug, Clone, PartialEq)]
pub struct Message<T> {
    /// The publishing handle.
    pub publisher: PublisherId,
    /// Its sequence number: 1 for the handle's first message, then one more for each.
    pub seq: u64,
    /// The message.
    pub payload: T,
}

/// What a [`Subscription`] yields.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Event<T> {
    /// A message.
    Message(Message<T>),
    /// Messages of `publisher` were lost: its sequence jumped by `count + 1`. Reported just
    /// before the message after the jump. (A publish that failed with an error also counts:
    /// it may or may not have been delivered.)
    Missed {
        /// Whose messages.
        publisher: PublisherId,
        /// How many.
        count: u64,
    },
    /// This subscription's buffer was full and `dropped` messages were discarded: the
    /// consumer is slower than the publishers.
    Lagged {
        /// How many.
        dropped: u64,
    },
    /// The connection to the store was down for `gap_ms` from `since`: anything published
    /// then is lost to this subscription. Followed by [`Event::Resubscribed`].
    Gap {
        /// When the loss was noticed (wall clock, for correlating with logs).
        since: SystemTime,
        /// How long the subscription was down, in milliseconds.
        gap_ms: u64,
    },
    /// Subscribed again after a gap: delivery continues.
    Resubscribed,
}

impl<T> Event<T> {
    /// Whether messages may have been lost just before this event (`Missed`, `Lagged`,
    /// `Gap`): the moment to drop whatever a lost message would have invalidated.
    pub fn may_have_lost_messages(&self) -> bool {
        matches!(
            self,
            Event::Missed { .. } | Event::Lagged { .. } | Event::Gap { .. }
        )
    }
}

/// Options of [`Broadcast::subscribe_with`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use = "options do nothing until passed to Broadcast::subscribe_with"]
pub struct SubscribeOptions {
    capacity: usize,
}

impl Default for SubscribeOptions {
    fn default() -> Self {
        SubscribeOptions {
            capacity: DEFAULT_CAPACITY,
        }
    }
}

impl SubscribeOptions {
    /// The defaults: a buffer of [`DEFAULT_CAPACITY`] messages.
    pub fn new() -> Self {
        SubscribeOptions::default()
    }

    /// How many undelivered messages the subscription buffers before it discards (1 to
    /// [`MAX_CAPACITY`]).
    pub fn capacity(mut self, capacity: usize) -> Self {
        self.capacity = capacity;
        self
    }

    fn checked(&self) -> Result<usize> {
        if self.capacity == 0 || self.capacity > MAX_CAPACITY {
            return Err(Error::invalid_input(format!(
                "subscription capacity {} is out of range; use 1 to {MAX_CAPACITY}",
                self.capacity
            )));
        }
        Ok(self.capacity)
    }
}

/// The envelope on the wire: `{"p":"<publisher, 16 hex digits>","s":<seq>,"m":<message>}`.
#[derive(Serialize)]
struct Outgoing<'a, T: ?Sized> {
    p: String,
    s: u64,
    m: &'a T,
}

#[derive(Deserialize)]
struct Incoming<T> {
    p: String,
    s: u64,
    m: T,
}

/// The broadcast client over one store. Cheap to clone; clones publish as the same
/// publisher. Share one per process.
///
/// # Examples
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::sync::Arc;
/// use baton_core::{Broadcast, MemoryStore};
/// use baton_core::broadcast::Event;
///
/// let broadcast = Broadcast::new(Arc::new(MemoryStore::new()));
/// let mut invalidations = broadcast.subscribe::<u64>("ancestry-invalidate").await?;
/// broadcast.publish("ancestry-invalidate", &42u64).await?;
/// match invalidations.next().await {
///     Some(Event::Message(m)) => assert_eq!(m.payload, 42), // evict org 42 locally
///     Some(e) if e.may_have_lost_messages() => { /* evict everything */ }
///     _ => {}
/// }
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct Broadcast {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    store: Arc<dyn BroadcastStore>,
    namespace: Namespace,
    /// What channels are qualified as: [`KeyKind::Broadcast`] for the users' own.
    kind: KeyKind,
    publisher: PublisherId,
    seq: AtomicU64,
}

impl Broadcast {
    /// Broadcast in the default namespace.
    pub fn new(store: Arc<dyn BroadcastStore>) -> Self {
        Broadcast::with_namespace(store, Namespace::default())
    }

    /// Broadcast in `namespace`: channels of other namespaces are other channels.
    pub fn with_namespace(store: Arc<dyn BroadcastStore>, namespace: Namespace) -> Self {
        Broadcast::of_kind(store, namespace, KeyKind::Broadcast)
    }

    /// Broadcast whose channels are qualified as keys of `kind`: how an election's notices
    /// stay apart from every user channel.
    pub(crate) fn of_kind(
        store: Arc<dyn BroadcastStore>,
        namespace: Namespace,
        kind: KeyKind,
    ) -> Self {
        Broadcast {
            inner: Arc::new(Inner {
                store,
                namespace,
                kind,
                publisher: PublisherId::random(),
                seq: AtomicU64::new(0),
            }),
        }
    }

    /// The namespace channels are qualified with.
    pub fn namespace(&self) -> &Namespace {
        &self.inner.namespace
    }

    /// The id this handle publishes as.
    pub fn publisher(&self) -> PublisherId {
        self.inner.publisher
    }

    fn qualify(&self, channel: &str) -> Result<StoreKey> {
        let key = Key::new(channel)
            .map_err(|e| Error::invalid_input(e.message().replacen("key", "channel", 1)))?;
        Ok(self.inner.namespace.qualify(self.inner.kind, &key))
    }

    /// Publishes `message` on `channel` to every connected subscriber; returns its sequence
    /// number. Delivery is at most once: see the [module docs](self).
    ///
    /// # Errors
    /// - `InvalidInput` for an invalid channel name, a message that does not serialize to
    ///   JSON, or one too large for [`MAX_MESSAGE_BYTES`] or the store, before any I/O;
    /// - `Unavailable` when the store faulted (emits
    ///   [`baton.broadcast.publish_failed`](crate::telemetry::events::BROADCAST_PUBLISH_FAILED));
    ///   the message may or may not have been delivered, and subscribers count it as missed.
    pub async fn publish<T: Serialize + ?Sized>(&self, channel: &str, message: &T) -> Result<u64> {
        let key = self.qualify(channel)?;
        // Serialize the message alone first, so that a message that cannot be sent does not
        // take a sequence number.
        let probe = serde_json::to_vec(message).map_err(|e| {
            Error::invalid_input(format!(
                "the message for channel {channel:?} does not serialize to JSON: {e}"
            ))
        })?;
        let limit = self
            .inner
            .store
            .max_payload()
            .map_or(MAX_MESSAGE_BYTES, |store| store.min(MAX_MESSAGE_BYTES));
        // The envelope adds at most 60 bytes: {"p":"<16>","s":<20 digits>,"m":...}.
        if probe.len() + 60 > limit {
            return Err(Error::invalid_input(format!(
                "the message for channel {channel:?} is {} bytes of JSON; with its envelope it must fit in {limit} bytes",
                probe.len()
            )));
        }
        let seq = self.inner.seq.fetch_add(1, Ordering::Relaxed) + 1;
        let payload = serde_json::to_vec(&Outgoing {
            p: self.inner.publisher.to_string(),
            s: seq,
            m: message,
        })
        .map_err(|e| Error::internal(format!("encoding the envelope failed: {e}")))?;
        match self.inner.store.publish(&key, payload).await {
            Ok(()) => Ok(seq),
            Err(error) => {
                telemetry::emit(
                    &events::BROADCAST_PUBLISH_FAILED,
                    Some(key.as_str()),
                    format_args!("publishing message {seq} failed: {error}"),
                );
                Err(error)
            }
        }
    }

    /// Subscribes to `channel` with the default options. Messages published after this
    /// returns reach the subscription; earlier ones do not.
    ///
    /// # Errors
    /// `InvalidInput` for an invalid channel name, before any I/O; `Unavailable` when the
    /// store could not subscribe.
    pub async fn subscribe<T: DeserializeOwned>(&self, channel: &str) -> Result<Subscription<T>> {
        self.subscribe_with(channel, &SubscribeOptions::new()).await
    }

    /// Subscribes to `channel` with `options`.
    ///
    /// # Errors
    /// As [`Broadcast::subscribe`], and `InvalidInput` for options out of range.
    pub async fn subscribe_with<T: DeserializeOwned>(
        &self,
        channel: &str,
        options: &SubscribeOptions,
    ) -> Result<Subscription<T>> {
        let key = self.qualify(channel)?;
        let capacity = options.checked()?;
        let raw = self.inner.store.subscribe(&key, capacity).await?;
        Ok(Subscription {
            raw,
            channel: key,
            publishers: Publishers::default(),
            pending: VecDeque::new(),
            _payload: PhantomData,
        })
    }
}

/// The last sequence number seen per publisher, forgetting the oldest beyond a bound.
#[derive(Debug, Default)]
struct Publishers {
    last: HashMap<PublisherId, u64>,
    order: VecDeque<PublisherId>,
}

/// What a message's sequence number says.
enum Seq {
    /// The next one, or the first seen from this publisher.
    InOrder,
    /// `count` messages before it were lost.
    After(u64),
    /// Seen already.
    Duplicate,
}

impl Publishers {
    fn observe(&mut self, publisher: PublisherId, seq: u64) -> Seq {
        match self.last.get_mut(&publisher) {
            Some(last) if seq <= *last => Seq::Duplicate,
            Some(last) => {
                let missed = seq - *last - 1;
                *last = seq;
                if missed == 0 {
                    Seq::InOrder
                } else {
                    Seq::After(missed)
                }
            }
            None => {
                if self.order.len() == TRACKED_PUBLISHERS
                    && let Some(oldest) = self.order.pop_front()
                {
                    self.last.remove(&oldest);
                }
                self.order.push_back(publisher);
                self.last.insert(publisher, seq);
                Seq::InOrder
            }
        }
    }
}

/// A live subscription to one channel: a [`Stream`](futures_core::Stream) of [`Event`]s,
/// also readable with [`Subscription::next`]. Dropping it unsubscribes.
///
/// The stream ends (`None`) only when the store is dropped.
#[must_use = "a subscription delivers nothing unless it is polled"]
pub struct Subscription<T> {
    raw: RawSubscription,
    channel: StoreKey,
    publishers: Publishers,
    pending: VecDeque<Event<T>>,
    _payload: PhantomData<fn() -> T>,
}

impl<T> fmt::Debug for Subscription<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Subscription")
            .field("channel", &self.channel)
            .field("raw", &self.raw)
            .finish_non_exhaustive()
    }
}

impl<T: DeserializeOwned> Subscription<T> {
    /// The next event.
    ///
    /// # Cancel safety
    /// Cancel safe: an event that arrives while nobody awaits is kept for the next call.
    pub async fn next(&mut self) -> Option<Event<T>> {
        std::future::poll_fn(|cx| self.poll_event(cx)).await
    }

    /// The channel, as the caller named it.
    pub fn channel(&self) -> &str {
        self.channel.user_key()
    }

    fn poll_event(&mut self, cx: &mut Context<'_>) -> Poll<Option<Event<T>>> {
        loop {
            if let Some(event) = self.pending.pop_front() {
                return Poll::Ready(Some(event));
            }
            match self.raw.poll_recv(cx) {
                Poll::Ready(Some(raw)) => self.accept(raw),
                Poll::Ready(None) => return Poll::Ready(None),
                Poll::Pending => return Poll::Pending,
            }
        }
    }

    fn accept(&mut self, raw: RawEvent) {
        match raw {
            RawEvent::Message(bytes) => self.accept_message(&bytes),
            RawEvent::Lagged { dropped } => self.pending.push_back(Event::Lagged { dropped }),
            RawEvent::Gap { since, gap } => self.pending.push_back(Event::Gap {
                since,
                gap_ms: u64::try_from(gap.as_millis()).unwrap_or(u64::MAX),
            }),
            RawEvent::Resubscribed => self.pending.push_back(Event::Resubscribed),
        }
    }

    fn accept_message(&mut self, bytes: &[u8]) {
        let (publisher, seq, payload) = match serde_json::from_slice::<Incoming<T>>(bytes) {
            Ok(m) => match PublisherId::parse(&m.p) {
                Some(publisher) => (publisher, m.s, Ok(m.m)),
                None => return self.undecodable("the publisher id is not 16 hex digits"),
            },
            Err(e) => match serde_json::from_slice::<Incoming<IgnoredAny>>(bytes) {
                Ok(m) => match PublisherId::parse(&m.p) {
                    Some(publisher) => (publisher, m.s, Err(e)),
                    None => return self.undecodable("the publisher id is not 16 hex digits"),
                },
                Err(_) => return self.undecodable(&format!("not a baton envelope: {e}")),
            },
        };
        match self.publishers.observe(publisher, seq) {
            Seq::Duplicate => {
                telemetry::emit(
                    &events::BROADCAST_DUPLICATE,
                    Some(self.channel.as_str()),
                    format_args!("dropped a duplicate of message {seq} from publisher {publisher}"),
                );
                return;
            }
            Seq::After(count) => {
                telemetry::emit(
                    &events::BROADCAST_MISSED,
                    Some(self.channel.as_str()),
                    format_args!(
                        "{count} message(s) from publisher {publisher} were lost before message {seq}"
                    ),
                );
                self.pending.push_back(Event::Missed { publisher, count });
            }
            Seq::InOrder => {}
        }
        match payload {
            Ok(payload) => self.pending.push_back(Event::Message(Message {
                publisher,
                seq,
                payload,
            })),
            Err(e) => self.undecodable(&format!(
                "message {seq} from publisher {publisher} does not deserialize as {}: {e}",
                std::any::type_name::<T>()
            )),
        }
    }

    fn undecodable(&self, why: &str) {
        telemetry::emit(
            &events::BROADCAST_UNDECODABLE,
            Some(self.channel.as_str()),
            format_args!("skipped a message: {why}"),
        );
    }
}

// Nothing in a subscription is ever pinned in place: events are moved out of the queue.
impl<T> Unpin for Subscription<T> {}

impl<T: DeserializeOwned> futures_core::Stream for Subscription<T> {
    type Item = Event<T>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Event<T>>> {
        self.get_mut().poll_event(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::MemoryStore;

    #[tokio::test]
    async fn sequence_numbers_reveal_loss_and_duplicates() {
        let store = Arc::new(MemoryStore::new());
        let broadcast = Broadcast::new(store.clone());
        let mut sub = broadcast.subscribe::<u32>("c").await.unwrap();
        let channel = broadcast.qualify("c").unwrap();
        let envelope = |seq: u64, m: &str| {
            format!(r#"{{"p":"00000000000000ab","s":{seq},"m":{m}}}"#).into_bytes()
        };
        for (seq, m) in [
            (5, "1"),
            (6, "2"),
            (6, "2"),
            (9, "3"),
            (10, "\"x\""),
            (11, "4"),
        ] {
            store.publish(&channel, envelope(seq, m)).await.unwrap();
        }
        store.publish(&channel, b"not json".to_vec()).await.unwrap();
        let seq = broadcast.publish("c", &7).await.unwrap();
        assert_eq!(seq, 1);
        let publisher = PublisherId(0xab);
        let mut got = Vec::new();
        for _ in 0..6 {
            got.push(sub.next().await.unwrap());
        }
        let message = |seq, payload| {
            Event::Message(Message {
                publisher,
                seq,
                payload,
            })
        };
        assert_eq!(
            got,
            [
                message(5, 1),
                message(6, 2),
                Event::Missed {
                    publisher,
                    count: 2
                },
                message(9, 3),
                // 10 does not deserialize as u32: skipped, but it was not lost.
                message(11, 4),
                Event::Message(Message {
                    publisher: broadcast.publisher(),
                    seq: 1,
                    payload: 7
                }),
            ]
        );
        assert!(got[2].may_have_lost_messages());
        assert!(!got[0].may_have_lost_messages());
    }

    #[test]
    fn publisher_ids_print_and_parse_as_16_hex_digits() {
        let id = PublisherId(0x1234);
        assert_eq!(id.to_string(), "0000000000001234");
        assert_eq!(PublisherId::parse("0000000000001234"), Some(id));
        assert_eq!(PublisherId::parse("1234"), None);
        assert_eq!(PublisherId::parse("000000000000123g"), None);
    }

    #[test]
    fn forgets_the_oldest_publishers_beyond_the_bound() {
        let mut seen = Publishers::default();
        for p in 0..TRACKED_PUBLISHERS as u64 + 1 {
            assert!(matches!(seen.observe(PublisherId(p), 1), Seq::InOrder));
        }
        assert_eq!(seen.last.len(), TRACKED_PUBLISHERS);
        assert!(
            matches!(seen.observe(PublisherId(0), 1), Seq::InOrder),
            "forgotten"
        );
        assert!(matches!(seen.observe(PublisherId(5), 1), Seq::Duplicate));
    }
}
