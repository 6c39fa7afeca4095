//! Broadcast on etcd: a channel is one key that every message is put on, and a subscription
//! is a watch of that key.
//!
//! `publish` puts the payload on the channel's key `<channel>\0b` (no lease: each message
//! replaces the one before). etcd's watch delivers every put in revision order, so each
//! process that watches the key sees every message once, in the order the cluster applied
//! them. A process watches each channel once, from the first local subscription to the
//! last, and hands each message to its local subscriptions through a
//! [`Fanout`] (each with its own buffer).
//!
//! ## Behavior
//! - `subscribe` returns once the watch is live, from the revision after the cluster's
//!   current one: every message published after it returns reaches it.
//! - A watch that fails (its member died, the connection dropped) is opened again from the
//!   revision after the last one it delivered, so nothing published meanwhile is lost while
//!   the cluster keeps that history. Only when the cluster has compacted it away are the
//!   subscriptions told of a gap ([`RawEvent::Gap`](baton_core::broadcast::RawEvent),
//!   `baton.subscription.dropped` / `baton.subscription.resubscribed`), and the watch starts
//!   again from the current revision.
//! - Every message stays in etcd's history until the cluster compacts it: run etcd with
//!   auto-compaction (`--auto-compaction-retention`), as any etcd that takes writes needs.
//! - A payload is at most [`MAX_PAYLOAD`] bytes (etcd refuses requests above 1.5 MiB by
//!   default).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use baton_core::broadcast::delivery::Fanout;
use baton_core::broadcast::{BroadcastStore, RawSubscription};
use baton_core::{CancellationToken, Result, StoreKey};
use etcd_client::{Client, EventType, GetOptions, WatchOptions, WatchStream};

use crate::EtcdStore;
use crate::watch::IDLE_CHECK;

/// The largest payload the etcd store carries, in bytes.
pub const MAX_PAYLOAD: usize = 1024 * 1024;

/// How long a failed watch waits before it is opened again.
const RETRY: Duration = Duration::from_millis(200);

/// The etcd key that `channel`'s messages are put on.
fn channel_key(channel: &str) -> String {
    format!("{channel}\u{0}b")
}

/// The channels this process watches.
pub(crate) struct Channels {
    client: Client,
    fanout: Arc<Fanout>,
    /// The channels watched now, each with its watch's number.
    watched: Mutex<HashMap<String, u64>>,
    last: Mutex<u64>,
    /// Subscriptions are set up one at a time, so a second subscriber of a channel never
    /// returns before the first one's watch is live.
    setting_up: tokio::sync::Mutex<()>,
    stopped: CancellationToken,
}

impl std::fmt::Debug for Channels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Channels")
            .field("watched", &self.watched().len())
            .finish_non_exhaustive()
    }
}

impl Channels {
    pub(crate) fn new(client: Client) -> Arc<Channels> {
        Arc::new(Channels {
            client,
            fanout: Arc::new(Fanout::new()),
            watched: Mutex::new(HashMap::new()),
            last: Mutex::new(0),
            setting_up: tokio::sync::Mutex::new(()),
            stopped: CancellationToken::new(),
        })
    }

    fn watched(&self) -> MutexGuard<'_, HashMap<String, u64>> {
        self.watched.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Stops every watch and ends every subscription.
    pub(crate) fn stop(&self) {
        self.stopped.cancel();
        self.fanout.close();
    }

    /// Whether some local subscription still listens to `channel`; if not, forgets watch
    /// `id` while holding the map's lock, so a subscriber never relies on a leaving watch.
    fn still_listened(&self, channel: &str, id: u64) -> bool {
        let mut watched = self.watched();
        if self.fanout.has_subscribers(channel) {
            return true;
        }
        if watched.get(channel) == Some(&id) {
            watched.remove(channel);
        }
        false
    }

    /// Delivers `channel`'s messages from `stream` (which starts at `from`) until nobody
    /// listens or the store stops, opening the watch again when it fails.
    async fn deliver(&self, channel: String, id: u64, mut stream: WatchStream, mut from: i64) {
        loop {
            let failed = loop {
                match tokio::time::timeout(IDLE_CHECK, stream.message()).await {
                    Ok(Ok(Some(answer))) => {
                        if answer.compact_revision() > 0 {
                            // The history from `from` is gone: a gap.
                            self.fanout.disconnected(&format!(
                                "the cluster compacted its history past revision {from}"
                            ));
                            from = 0;
                            break true;
                        }
                        if answer.canceled() {
                            break true;
                        }
                        for event in answer.events() {
                            if let (EventType::Put, Some(kv)) = (event.event_type(), event.kv()) {
                                self.fanout.deliver(&channel, kv.value());
                                from = kv.mod_revision() + 1;
                            }
                        }
                    }
                    Ok(Ok(None) | Err(_)) => break true,
                    Err(_idle) => {}
                }
                if !self.still_listened(&channel, id) {
                    break false;
                }
            };
            if !failed {
                return;
            }
            // Open it again, from where it stopped (or from now after a compaction).
            loop {
                if !self.still_listened(&channel, id) {
                    return;
                }
                tokio::time::sleep(RETRY).await;
                if let Ok((opened, start)) = self.watch(&channel, from).await {
                    stream = opened;
                    from = start;
                    if self.fanout.is_down() {
                        self.fanout.resubscribed();
                    }
                    break;
                }
            }
        }
    }

    /// A watch of `channel` from `from` (0: from the revision after the cluster's current
    /// one), live when this returns; and the revision it starts at.
    async fn watch(
        &self,
        channel: &str,
        from: i64,
    ) -> std::result::Result<(WatchStream, i64), etcd_client::Error> {
        let start = if from > 0 {
            from
        } else {
            let mut kv = self.client.kv_client();
            let answer = kv
                .get(
                    channel_key(channel),
                    Some(GetOptions::new().with_count_only()),
                )
                .await?;
            answer.header().map_or(0, |h| h.revision()) + 1
        };
        let mut client = self.client.watch_client();
        let stream = client
            .watch(
                channel_key(channel),
                Some(WatchOptions::new().with_start_revision(start)),
            )
            .await?;
        Ok((stream, start))
    }
}

#[async_trait]
impl BroadcastStore for EtcdStore {
    async fn publish(&self, channel: &StoreKey, payload: Vec<u8>) -> Result<()> {
        let key = channel_key(channel.as_str());
        self.call("publish", || {
            let mut kv = self.client.kv_client();
            let (key, payload) = (key.clone(), payload.clone());
            async move { kv.put(key, payload, None).await }
        })
        .await?;
        Ok(())
    }

    async fn subscribe(&self, channel: &StoreKey, capacity: usize) -> Result<RawSubscription> {
        let channels = &self.channels;
        let _one_at_a_time = channels.setting_up.lock().await;
        let channel = channel.as_str().to_owned();
        let (subscription, _) = channels.fanout.subscribe(&channel, capacity);
        if channels.watched().contains_key(&channel) {
            return Ok(subscription);
        }
        let within = self.options.get_response_timeout();
        let (stream, from) = match tokio::time::timeout(within, channels.watch(&channel, 0)).await {
            Ok(Ok(opened)) => opened,
            Ok(Err(e)) => return Err(self.failed("subscribe", crate::requests::Fault::Etcd(e))),
            Err(_) => {
                return Err(self.failed("subscribe", crate::requests::Fault::TimedOut(within)));
            }
        };
        let id = {
            let mut last = channels.last.lock().unwrap_or_else(|p| p.into_inner());
            *last += 1;
            *last
        };
        channels.watched().insert(channel.clone(), id);
        let watching = Arc::clone(channels);
        tokio::spawn(async move {
            let stopped = watching.stopped.clone();
            tokio::select! {
                () = watching.deliver(channel.clone(), id, stream, from) => {}
                () = stopped.cancelled() => {}
            }
            let mut watched = watching.watched();
            if watched.get(&channel) == Some(&id) {
                watched.remove(&channel);
            }
        });
        Ok(subscription)
    }

    fn max_payload(&self) -> Option<usize> {
        Some(MAX_PAYLOAD)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_channel_is_one_key_apart_from_grants_and_permits() {
        assert_eq!(channel_key("ns:broadcast:c"), "ns:broadcast:c\u{0}b");
    }
}
