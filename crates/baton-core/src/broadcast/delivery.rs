//! [`Fanout`]: hands a store's incoming messages and connection events to the local
//! subscriptions of each channel.
//!
//! Use it in a store that receives every channel of this process through one connection
//! (Redis pub/sub, PostgreSQL `LISTEN`), or none (the memory store): the connection's task
//! calls [`Fanout::deliver`] for each message, [`Fanout::disconnected`] when the connection
//! is lost and [`Fanout::resubscribed`] once every channel is subscribed again. The fanout
//! emits the registered telemetry for the subscriptions it carries, so every store reports
//! a drop the same way:
//! [`baton.subscription.dropped`](crate::telemetry::events::SUBSCRIPTION_DROPPED) and
//! [`baton.subscription.resubscribed`](crate::telemetry::events::SUBSCRIPTION_RESUBSCRIBED)
//! (with `gap_ms`), once per channel.
//!
//! ## Behavior
//! - Each subscription buffers up to its capacity of undelivered messages; a message that
//!   finds the buffer full is discarded and counted (a slow consumer never blocks the
//!   connection, nor other subscribers), and the subscriber is told how many before its
//!   next event, with [`baton.broadcast.lagged`](crate::telemetry::events::BROADCAST_LAGGED).
//! - Connection events (gap, resubscribed) are never discarded.
//! - When the last subscription of a channel is dropped, the `on_empty` callback runs with
//!   the channel's name (the store unsubscribes there).
//! - [`Fanout::close`] ends every subscription (the store was dropped).

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::SystemTime;

use tokio::sync::mpsc;
use tokio::time::Instant;

use super::store::{Counters, RawEvent, RawSubscription};
use crate::telemetry::{self, events};

type OnEmpty = Box<dyn Fn(&str) + Send + Sync>;

/// Local subscriptions by channel. See the [module docs](self).
pub struct Fanout {
    state: Mutex<State>,
    on_empty: Option<OnEmpty>,
    next_id: AtomicU64,
}

#[derive(Default)]
struct State {
    channels: HashMap<String, Vec<Tap>>,
    /// When the connection was lost, while it is down.
    down_since: Option<(Instant, SystemTime)>,
    closed: bool,
}

struct Tap {
    id: u64,
    sender: mpsc::UnboundedSender<RawEvent>,
    counters: Arc<Counters>,
}

impl fmt::Debug for Fanout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.state();
        f.debug_struct("Fanout")
            .field("channels", &state.channels.len())
            .field("down", &state.down_since.is_some())
            .finish()
    }
}

/// Removes its subscription from the fanout when the subscription is dropped.
struct Leave {
    fanout: Weak<Fanout>,
    channel: String,
    id: u64,
}

impl Drop for Leave {
    fn drop(&mut self) {
        if let Some(fanout) = self.fanout.upgrade() {
            fanout.remove(&self.channel, self.id);
        }
    }
}

impl Default for Fanout {
    fn default() -> Self {
        Fanout::new()
    }
}

impl Fanout {
    /// A fanout with no callback for emptied channels (the memory store's).
    pub fn new() -> Self {
        Fanout {
            state: Mutex::new(State::default()),
            on_empty: None,
            next_id: AtomicU64::new(1),
        }
    }

    /// A fanout that calls `on_empty(channel)` when the last subscription of a channel is
    /// dropped. The callback runs on the dropping thread: make it cheap (send a command to
    /// the connection's task).
    pub fn with_on_empty(on_empty: impl Fn(&str) + Send + Sync + 'static) -> Self {
        Fanout {
            on_empty: Some(Box::new(on_empty)),
            ..Fanout::new()
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds a subscription of `channel` buffering up to `capacity` messages. The `bool` is
    /// `true` when it is the channel's first, so the store must subscribe to it.
    pub fn subscribe(self: &Arc<Self>, channel: &str, capacity: usize) -> (RawSubscription, bool) {
        let (sender, receiver) = mpsc::unbounded_channel();
        let counters = Arc::new(Counters {
            queued: AtomicUsize::new(0),
            dropped: AtomicU64::new(0),
            capacity: capacity.max(1),
        });
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let first = {
            let mut state = self.state();
            if state.closed {
                // The sender is dropped here: the subscription ends at once.
                false
            } else {
                let taps = state.channels.entry(channel.to_owned()).or_default();
                taps.push(Tap {
                    id,
                    sender,
                    counters: Arc::clone(&counters),
                });
                taps.len() == 1
            }
        };
        let leave = Leave {
            fanout: Arc::downgrade(self),
            channel: channel.to_owned(),
            id,
        };
        (
            RawSubscription::new(receiver, counters, Box::new(leave)),
            first,
        )
    }

    /// Hands `payload` to every subscription of `channel`; returns how many received it.
    pub fn deliver(&self, channel: &str, payload: &[u8]) -> usize {
        let mut lagging = false;
        let mut delivered = 0;
        {
            let state = self.state();
            let Some(taps) = state.channels.get(channel) else {
                return 0;
            };
            for tap in taps {
                let queued = tap.counters.queued.fetch_add(1, Ordering::AcqRel);
                if queued >= tap.counters.capacity {
                    tap.counters.queued.fetch_sub(1, Ordering::AcqRel);
                    if tap.counters.dropped.fetch_add(1, Ordering::AcqRel) == 0 {
                        lagging = true;
                    }
                    continue;
                }
                if tap.sender.send(RawEvent::Message(payload.to_vec())).is_ok() {
                    delivered += 1;
                } else {
                    tap.counters.queued.fetch_sub(1, Ordering::AcqRel);
                }
            }
        }
        if lagging {
            telemetry::emit(
                &events::BROADCAST_LAGGED,
                Some(channel),
                format_args!(
                    "a subscriber's buffer is full, so messages are discarded until it catches up; consume faster or subscribe with a larger capacity"
                ),
            );
        }
        delivered
    }

    /// The connection carrying every channel was lost. Emits
    /// `baton.subscription.dropped` for each channel the first time, and remembers when.
    pub fn disconnected(&self, why: &str) {
        let channels = {
            let mut state = self.state();
            if state.down_since.is_some() {
                return;
            }
            state.down_since = Some((Instant::now(), SystemTime::now()));
            state.channels.keys().cloned().collect::<Vec<_>>()
        };
        for channel in channels {
            telemetry::emit(
                &events::SUBSCRIPTION_DROPPED,
                Some(&channel),
                format_args!(
                    "subscription dropped ({why}); messages published until it is back are lost to it"
                ),
            );
        }
    }

    /// Every channel is subscribed again after [`Fanout::disconnected`]: sends each
    /// subscription a gap and a resubscribed event, and emits
    /// `baton.subscription.resubscribed` with `gap_ms` for each channel. Nothing happens
    /// when the connection was not down.
    pub fn resubscribed(&self) {
        let (since, gap, channels) = {
            let mut state = self.state();
            let Some((down_at, since)) = state.down_since.take() else {
                return;
            };
            let gap = Instant::now().saturating_duration_since(down_at);
            (
                since,
                gap,
                state.channels.keys().cloned().collect::<Vec<_>>(),
            )
        };
        // Telemetry first, so that a log read after a subscriber saw the gap shows it.
        let gap_ms = gap.as_millis();
        for channel in channels {
            telemetry::emit(
                &events::SUBSCRIPTION_RESUBSCRIBED,
                Some(&channel),
                format_args!(
                    "subscribed again after a gap of {gap_ms}ms (gap_ms={gap_ms}); messages published in the gap were lost"
                ),
            );
        }
        let state = self.state();
        for taps in state.channels.values() {
            for tap in taps {
                let _ = tap.sender.send(RawEvent::Gap { since, gap });
                let _ = tap.sender.send(RawEvent::Resubscribed);
            }
        }
    }

    /// Whether the connection is down (between [`Fanout::disconnected`] and
    /// [`Fanout::resubscribed`]).
    pub fn is_down(&self) -> bool {
        self.state().down_since.is_some()
    }

    /// The channels that have subscriptions: what to subscribe to after a reconnect.
    pub fn channels(&self) -> Vec<String> {
        self.state().channels.keys().cloned().collect()
    }

    /// Whether `channel` has subscriptions.
    pub fn has_subscribers(&self, channel: &str) -> bool {
        self.state().channels.contains_key(channel)
    }

    /// Ends every subscription (their streams end) and refuses new ones.
    pub fn close(&self) {
        let mut state = self.state();
        state.closed = true;
        state.channels.clear();
    }

    fn remove(&self, channel: &str, id: u64) {
        let emptied = {
            let mut state = self.state();
            let Some(taps) = state.channels.get_mut(channel) else {
                return;
            };
            taps.retain(|tap| tap.id != id);
            if taps.is_empty() {
                state.channels.remove(channel);
                true
            } else {
                false
            }
        };
        if emptied && let Some(on_empty) = &self.on_empty {
            on_empty(channel);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn delivers_per_channel_and_reports_first_and_last() {
        let emptied = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&emptied);
        let fanout = Arc::new(Fanout::with_on_empty(move |c| {
            seen.lock().unwrap().push(c.to_owned())
        }));
        let (mut a, first) = fanout.subscribe("a", 8);
        assert!(first);
        let (mut a2, first) = fanout.subscribe("a", 8);
        assert!(!first);
        let (b, _) = fanout.subscribe("b", 8);
        assert_eq!(fanout.deliver("a", b"x"), 2);
        assert_eq!(a.recv().await, Some(RawEvent::Message(b"x".to_vec())));
        assert_eq!(a2.recv().await, Some(RawEvent::Message(b"x".to_vec())));
        drop(a);
        assert!(emptied.lock().unwrap().is_empty());
        drop(a2);
        assert_eq!(*emptied.lock().unwrap(), ["a"]);
        assert!(fanout.has_subscribers("b"));
        drop(b);
        assert!(fanout.channels().is_empty());
    }

    #[tokio::test]
    async fn a_full_buffer_discards_and_counts() {
        let fanout = Arc::new(Fanout::new());
        let (mut sub, _) = fanout.subscribe("c", 2);
        for i in 0..5u8 {
            fanout.deliver("c", &[i]);
        }
        assert_eq!(sub.recv().await, Some(RawEvent::Lagged { dropped: 3 }));
        assert_eq!(sub.recv().await, Some(RawEvent::Message(vec![0])));
        assert_eq!(sub.recv().await, Some(RawEvent::Message(vec![1])));
        fanout.deliver("c", &[9]);
        assert_eq!(sub.recv().await, Some(RawEvent::Message(vec![9])));
    }

    #[tokio::test]
    async fn gaps_reach_every_subscription_once() {
        let fanout = Arc::new(Fanout::new());
        let (mut sub, _) = fanout.subscribe("c", 1);
        fanout.deliver("c", b"1");
        fanout.disconnected("test");
        fanout.disconnected("test again");
        assert!(fanout.is_down());
        fanout.resubscribed();
        fanout.resubscribed();
        assert!(!fanout.is_down());
        assert_eq!(sub.recv().await, Some(RawEvent::Message(b"1".to_vec())));
        assert!(matches!(sub.recv().await, Some(RawEvent::Gap { .. })));
        assert_eq!(sub.recv().await, Some(RawEvent::Resubscribed));
        fanout.close();
        assert_eq!(sub.recv().await, None);
    }
}
