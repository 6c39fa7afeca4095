//! The broadcast store interface: publish bytes on a channel, subscribe to a channel's
//! bytes and connection events.
//!
//! Policy lives in [`Broadcast`](crate::Broadcast) (the envelope with publisher and sequence
//! number, typed payloads, loss and duplicate detection, validation, telemetry); a store
//! carries bytes, and tells its subscribers when its connection dropped and came back. A
//! store that pushes through one connection per process can use
//! [`Fanout`](super::delivery::Fanout) to hand messages to local subscribers.

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use tokio::sync::mpsc;

use crate::error::Result;
use crate::key::StoreKey;

/// What a store delivers to one subscription.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RawEvent {
    /// A published payload, as given to [`BroadcastStore::publish`].
    Message(Vec<u8>),
    /// This subscription's buffer was full: `dropped` messages were discarded.
    Lagged {
        /// How many.
        dropped: u64,
    },
    /// The store's connection was down from `since` for `gap`; anything published then was
    /// not delivered. Sent when it is subscribed again, just before [`RawEvent::Resubscribed`].
    Gap {
        /// Wall-clock time the loss was noticed, for correlating with logs.
        since: SystemTime,
        /// How long the subscription was down.
        gap: Duration,
    },
    /// Subscribed again after a [`RawEvent::Gap`]; delivery continues.
    Resubscribed,
}

/// The receiving end of one subscription, as a store hands it out.
///
/// Messages are buffered up to a capacity; beyond it they are discarded and counted, and
/// the count is delivered as [`RawEvent::Lagged`] before the next event. Connection events
/// are never discarded. Dropping it unsubscribes.
pub struct RawSubscription {
    receiver: mpsc::UnboundedReceiver<RawEvent>,
    counters: std::sync::Arc<Counters>,
    _guard: Box<dyn Send + Sync>,
}

/// The shared accounting of one subscription's buffer.
#[derive(Debug)]
pub(crate) struct Counters {
    pub(crate) queued: std::sync::atomic::AtomicUsize,
    pub(crate) dropped: std::sync::atomic::AtomicU64,
    pub(crate) capacity: usize,
}

impl fmt::Debug for RawSubscription {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RawSubscription")
            .field("counters", &self.counters)
            .finish_non_exhaustive()
    }
}

impl RawSubscription {
    pub(crate) fn new(
        receiver: mpsc::UnboundedReceiver<RawEvent>,
        counters: std::sync::Arc<Counters>,
        guard: Box<dyn Send + Sync>,
    ) -> Self {
        RawSubscription {
            receiver,
            counters,
            _guard: guard,
        }
    }

    /// The next event; `None` once the store has closed the subscription (the store was
    /// dropped).
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn recv(&mut self) -> Option<RawEvent> {
        std::future::poll_fn(|cx| self.poll_recv(cx)).await
    }

    /// Polls for the next event (see [`RawSubscription::recv`]).
    pub fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Option<RawEvent>> {
        use std::sync::atomic::Ordering;
        let dropped = self.counters.dropped.swap(0, Ordering::AcqRel);
        if dropped > 0 {
            return Poll::Ready(Some(RawEvent::Lagged { dropped }));
        }
        let polled = Pin::new(&mut self.receiver).poll_recv(cx);
        if let Poll::Ready(Some(RawEvent::Message(_))) = &polled {
            self.counters.queued.fetch_sub(1, Ordering::AcqRel);
        }
        polled
    }
}

/// The broadcast atoms of one store. Object safe: a store hands itself out as an
/// `Arc<dyn BroadcastStore>` from [`Store::broadcast_store`](crate::store::Store::broadcast_store), which the
/// facade asks when a client is built.
///
/// # Contract
/// - `publish` delivers `payload` to every subscription of `channel` that is connected, in
///   every process, at most once; a message published while a subscriber is disconnected
///   is lost to it. Messages of one publisher arrive in the order they were published.
/// - `subscribe` returns once the subscription is live: a message published after it
///   returns reaches it (unless the connection drops).
/// - A store whose connection can drop resubscribes by itself and then delivers
///   [`RawEvent::Gap`] and [`RawEvent::Resubscribed`] to every subscription it carried.
/// - Store faults are errors of kind `Unavailable`.
#[async_trait]
pub trait BroadcastStore: Send + Sync + fmt::Debug + 'static {
    /// Publishes `payload` on `channel`.
    async fn publish(&self, channel: &StoreKey, payload: Vec<u8>) -> Result<()>;

    /// Subscribes to `channel`, buffering up to `capacity` undelivered messages.
    async fn subscribe(&self, channel: &StoreKey, capacity: usize) -> Result<RawSubscription>;

    /// The largest payload this store can carry, when it has a limit of its own
    /// (PostgreSQL `NOTIFY`: under 8000 bytes). [`Broadcast`](crate::Broadcast) refuses a
    /// larger message with `InvalidInput` before sending it.
    fn max_payload(&self) -> Option<usize> {
        None
    }
}
