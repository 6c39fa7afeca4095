//! The sharded pub/sub of a [`RedisClusterStore`](crate::RedisClusterStore): how its waiters
//! hear of releases on the master of each key's slot, and how its broadcast subscriptions
//! are carried.
//!
//! On one server a store listens on one channel, and the lock scripts `PUBLISH` to it. On a
//! cluster a script runs on the master of its key's slot and can reach, with `SPUBLISH`, only
//! subscribers of a channel in that same slot (on that shard). So a cluster store listens on
//! one sharded channel per slot it has waited in, `baton:wake:{<tag>}:<random id>`, where
//! `<tag>` is a short text that hashes to the slot: the channel moves with the slot, and a
//! release wakes only waiters of that key's shard. Every slot's channel is also the store's
//! name in the queues of that slot's keys, so the queue, hand-over, reservation and watch
//! protocol of the single server (see [`crate::wakeups`]) runs unchanged; the scripts pick
//! `SPUBLISH` for a channel with a hash tag.
//!
//! ## Behavior
//! - A store subscribes to a slot's channel (`SSUBSCRIBE`, on the slot's master) the first
//!   time one of its waiters claims a held key in that slot, before the claim that queues it,
//!   and stays subscribed for as long as it lives (at most one channel per slot).
//! - The redis crate's cluster client sends the subscriptions again after it reconnects to a
//!   node or reads a new slot map; a server that unsubscribes the store (its slot moved to
//!   another master, a failover) is answered by subscribing again here.
//! - A lost subscription (a node's connection closed, the server unsubscribed the channel,
//!   or a subscription failed) emits
//!   [`baton.store.push_lost`](baton_core::telemetry::events::STORE_PUSH_LOST) and wakes
//!   every waiter of the process; until every channel is subscribed again, claims do not
//!   queue the store, its waiters are woken every [`DEGRADED_POLL`] to look again, and the
//!   channels are subscribed again at that pace. Then it emits
//!   [`baton.store.push_restored`](baton_core::telemetry::events::STORE_PUSH_RESTORED) and
//!   wakes every waiter once more.
//! - Broadcast channels (`Q:db0`) ride the same connection: a channel is subscribed
//!   (`SSUBSCRIBE` on its slot's master) by its first local subscription and unsubscribed
//!   when its last is dropped, one change at a time, so an unsubscription's confirmation is
//!   never mistaken for the server dropping the channel. A node's connection closing, or the
//!   server dropping a channel with local subscribers, reports a gap to them
//!   (`baton.subscription.dropped`); the channels are subscribed again every
//!   [`DEGRADED_POLL`] until all are back, and the subscriptions are told
//!   (`baton.subscription.resubscribed`). Messages published in between are lost (at most
//!   once), as on one server.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use baton_core::StoreKey;
use baton_core::broadcast::RawSubscription;
use baton_core::broadcast::delivery::Fanout;
use baton_core::telemetry::{self, events};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::Slot;
use redis::{PushInfo, PushKind, Value};
use tokio::sync::mpsc::UnboundedReceiver;
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep_until, timeout};

use crate::wakeups::{DEGRADED_POLL, Inbox};

/// The store's subscriptions: a cluster connection that only subscribes, the channels it
/// wants, and the task that turns their messages into wake-ups.
pub(crate) struct ShardedPush {
    shared: Arc<Shared>,
    task: JoinHandle<()>,
}

impl Drop for ShardedPush {
    fn drop(&mut self) {
        self.task.abort();
        self.shared.fanout.close();
    }
}

impl std::fmt::Debug for ShardedPush {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShardedPush")
            .field("names", &self.shared.names)
            .field("healthy", &self.is_healthy())
            .finish_non_exhaustive()
    }
}

/// What the store and the task share.
struct Shared {
    /// A connection of its own (RESP3, with a push sender): subscriptions only.
    conn: ClusterConnection,
    names: Arc<ChannelNames>,
    /// Per channel the store wants, whether it is subscribed now; and a tag per slot.
    channels: Mutex<Channels>,
    /// Every wanted channel is subscribed (or none is wanted yet).
    healthy: AtomicBool,
    /// A resubscription round is under way.
    resubscribing: AtomicBool,
    /// Wakes the task when a loss was noticed outside it.
    wake: tokio::sync::Notify,
    /// Broadcast: the local subscriptions of each channel, and per channel the store
    /// subscribed to, whether it is subscribed now.
    fanout: Arc<Fanout>,
    broadcast: Mutex<HashMap<String, bool>>,
    /// Per broadcast channel, the `SUNSUBSCRIBE`s sent whose confirmation has not arrived:
    /// a confirmation is the store's own, not the server dropping the channel.
    leaving: Mutex<HashMap<String, u32>>,
    /// Orders a broadcast channel's subscription and unsubscription.
    switching: tokio::sync::Mutex<()>,
    /// The call deadline, for one `SSUBSCRIBE`.
    deadline: Duration,
    /// The cluster, as messages name it (password redacted).
    server: String,
}

#[derive(Default)]
struct Channels {
    subscribed: HashMap<String, bool>,
    /// Set when a subscription was lost; the task acts on it.
    lost: Option<String>,
}

/// The names of one store's channels, one per slot: `baton:wake:{<tag>}:<id>`.
#[derive(Debug)]
pub(crate) struct ChannelNames {
    /// The store's random id, the end of each of its channel names.
    id: String,
    /// The store's channel in each slot it has named one in. Built once per slot: a release
    /// names its store's channel on every call.
    channels: Mutex<HashMap<Slot, Arc<SlotChannel>>>,
}

/// One store's channel in one slot, also in the two forms a release sends it in.
#[derive(Debug)]
pub(crate) struct SlotChannel {
    /// `0<channel>` and `1<channel>`: the channel after a flag that says whether one of the
    /// store's waiters waits for the key (`release.lua`'s and `permit_release.lua`'s store
    /// argument).
    flagged: [String; 2],
}

impl SlotChannel {
    /// The channel's name.
    pub(crate) fn name(&self) -> &str {
        &self.flagged[0][1..]
    }

    /// The channel after the flag `1` when `waiting`, else `0`.
    pub(crate) fn flagged(&self, waiting: bool) -> &str {
        &self.flagged[usize::from(waiting)]
    }
}

impl ChannelNames {
    /// The names of the store with random id `id`.
    pub(crate) fn new(id: &str) -> Self {
        // The slots' tags are found now, when a store opens, not on a call's path.
        slot_tags();
        ChannelNames {
            id: id.to_owned(),
            channels: Mutex::default(),
        }
    }

    /// The store's channel in the slot of `key`'s Redis keys (`{Q}`).
    pub(crate) fn of(&self, key: &StoreKey) -> Arc<SlotChannel> {
        let slot = slot_of(key);
        let mut channels = self.channels.lock().unwrap_or_else(PoisonError::into_inner);
        let channel = channels.entry(slot).or_insert_with(|| {
            let name = format!("baton:wake:{{{}}}:{}", tag_of(slot), self.id);
            Arc::new(SlotChannel {
                flagged: [format!("0{name}"), format!("1{name}")],
            })
        });
        Arc::clone(channel)
    }
}

/// The slot of `key`'s Redis keys, whose hash tag is `{Q}`. Without braces in `Q`, the tag is
/// all of `Q`, and `Q` alone (no tag) hashes the same: so it is hashed without writing `{Q}`.
fn slot_of(key: &StoreKey) -> Slot {
    let q = key.as_str();
    if q.is_empty() || q.contains(['{', '}']) {
        Slot::for_key(format!("{{{q}}}"))
    } else {
        Slot::for_key(q)
    }
}

impl ShardedPush {
    /// A subscribing connection from `client` (built with RESP3 and the sender of `pushes`),
    /// and the task that feeds `inbox` from `pushes`.
    ///
    /// # Errors
    /// The redis error when the cluster cannot be reached.
    pub(crate) async fn start(
        client: &ClusterClient,
        pushes: UnboundedReceiver<PushInfo>,
        inbox: Inbox,
        names: Arc<ChannelNames>,
        deadline: Duration,
        server: String,
    ) -> redis::RedisResult<Self> {
        let conn = client.get_async_connection().await?;
        inbox.handoffs.connected(inbox.generation);
        // A channel whose last local subscription is dropped is unsubscribed by the task.
        let (unsubscribe, unsubscribes) = tokio::sync::mpsc::unbounded_channel::<String>();
        let fanout = Arc::new(Fanout::with_on_empty(move |channel| {
            let _ = unsubscribe.send(channel.to_owned());
        }));
        let shared = Arc::new(Shared {
            conn,
            names,
            channels: Mutex::new(Channels::default()),
            healthy: AtomicBool::new(true),
            resubscribing: AtomicBool::new(false),
            wake: tokio::sync::Notify::new(),
            fanout,
            broadcast: Mutex::default(),
            leaving: Mutex::default(),
            switching: tokio::sync::Mutex::new(()),
            deadline,
            server,
        });
        let task = tokio::spawn(run(Arc::clone(&shared), pushes, unsubscribes, inbox));
        Ok(ShardedPush { shared, task })
    }

    /// Whether every channel the store wants is subscribed.
    pub(crate) fn is_healthy(&self) -> bool {
        self.shared.healthy.load(Ordering::Acquire)
    }

    /// The store's channel in `key`'s slot once it is subscribed: subscribes first if it is
    /// not. `None` when it is not subscribed now: the subscription failed (the loss is
    /// reported, and the waiters poll), or subscriptions are down, and the task's rounds
    /// subscribe it with the others.
    pub(crate) async fn subscribed(&self, key: &StoreKey) -> Option<Arc<SlotChannel>> {
        let channel = self.shared.names.of(key);
        {
            let mut channels = self.shared.lock();
            match channels.subscribed.get(channel.name()) {
                Some(true) => return Some(channel),
                Some(false) => {}
                None => {
                    channels.subscribed.insert(channel.name().to_owned(), false);
                }
            }
        }
        if !self.is_healthy() {
            return None;
        }
        match self.shared.subscribe(channel.name()).await {
            Ok(()) => Some(channel),
            Err(why) => {
                self.shared.lose(why);
                None
            }
        }
    }
}

impl ShardedPush {
    /// A local subscription to the sharded broadcast channel `channel`, once the store is
    /// subscribed to it (`SSUBSCRIBE` on the master of its slot).
    ///
    /// # Errors
    /// `Unavailable` when the subscription fails or goes unanswered within the call
    /// deadline.
    pub(crate) async fn subscribe_broadcast(
        &self,
        channel: &str,
        capacity: usize,
    ) -> baton_core::Result<RawSubscription> {
        // Registered first, so nothing published after Redis confirms is missed.
        let (subscription, _first) = self.shared.fanout.subscribe(channel, capacity);
        let _switching = self.shared.switching.lock().await;
        let subscribed = *self
            .shared
            .broadcasts()
            .entry(channel.to_owned())
            .or_insert(false);
        if subscribed {
            return Ok(subscription);
        }
        match self.shared.subscribe(channel).await {
            Ok(()) => Ok(subscription),
            Err(why) => Err(baton_core::Error::unavailable(format!(
                "redis cluster {}: {why}",
                self.shared.server
            ))),
        }
    }
}

impl Shared {
    fn leaving(&self) -> std::sync::MutexGuard<'_, HashMap<String, u32>> {
        self.leaving.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Counts off one `SUNSUBSCRIBE` of the store's own for `channel`; whether there was one.
    fn left(&self, channel: &str) -> bool {
        let mut leaving = self.leaving();
        match leaving.get_mut(channel) {
            Some(1) => {
                leaving.remove(channel);
                true
            }
            Some(n) => {
                *n -= 1;
                true
            }
            None => false,
        }
    }

    fn broadcasts(&self) -> std::sync::MutexGuard<'_, HashMap<String, bool>> {
        self.broadcast
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Channels> {
        self.channels.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Sends `SSUBSCRIBE channel`, within the call deadline; marks the channel subscribed.
    async fn subscribe(&self, channel: &str) -> Result<(), String> {
        let mut conn = self.conn.clone();
        match timeout(self.deadline, conn.ssubscribe(channel)).await {
            Ok(Ok(())) => {
                self.confirmed(channel);
                Ok(())
            }
            Ok(Err(e)) => Err(format!("SSUBSCRIBE {channel} failed: {e}")),
            Err(_) => Err(format!(
                "SSUBSCRIBE {channel} went unanswered for {:?}",
                self.deadline
            )),
        }
    }

    fn confirmed(&self, channel: &str) {
        if let Some(subscribed) = self.lock().subscribed.get_mut(channel) {
            *subscribed = true;
        }
        if let Some(subscribed) = self.broadcasts().get_mut(channel) {
            *subscribed = true;
        }
    }

    /// Whether `channel` is one of the store's wake-up channels (else a broadcast's).
    fn is_wake_channel(&self, channel: &str) -> bool {
        self.lock().subscribed.contains_key(channel)
    }

    /// Marks the broadcast channel `channel` (every one: `None`) not subscribed, and tells
    /// the local subscriptions they lose messages until it is back
    /// (`baton.subscription.dropped`).
    fn broadcast_lost(&self, channel: Option<&str>, why: &str) {
        {
            let mut broadcasts = self.broadcasts();
            match channel {
                Some(channel) => match broadcasts.get_mut(channel) {
                    Some(subscribed) => *subscribed = false,
                    None => return,
                },
                None if broadcasts.is_empty() => return,
                None => broadcasts.values_mut().for_each(|s| *s = false),
            }
        }
        self.fanout.disconnected(why);
        self.wake.notify_one();
    }

    /// The broadcast channels with local subscriptions that are not subscribed now.
    fn broadcasts_missing(&self) -> Vec<String> {
        let channels: Vec<String> = self
            .broadcasts()
            .iter()
            .filter(|(_, subscribed)| !**subscribed)
            .map(|(channel, _)| channel.clone())
            .collect();
        channels
            .into_iter()
            .filter(|channel| self.fanout.has_subscribers(channel))
            .collect()
    }

    /// Marks `channel` (every channel: `None`) not subscribed, for `why`.
    fn unsubscribed(&self, channel: Option<&str>, why: String) {
        let mut channels = self.lock();
        match channel {
            Some(channel) => match channels.subscribed.get_mut(channel) {
                Some(subscribed) => *subscribed = false,
                None => return,
            },
            None => {
                if channels.subscribed.is_empty() {
                    return;
                }
                channels.subscribed.values_mut().for_each(|s| *s = false);
            }
        }
        channels.lost.get_or_insert(why);
    }

    /// Records a loss for the task to act on, and wakes it.
    fn lose(&self, why: String) {
        self.lock().lost.get_or_insert(why);
        self.wake.notify_one();
    }

    /// The channels not subscribed now.
    fn missing(&self) -> Vec<String> {
        self.lock()
            .subscribed
            .iter()
            .filter(|(_, subscribed)| !**subscribed)
            .map(|(channel, _)| channel.clone())
            .collect()
    }
}

/// A short text whose hash slot is `slot`: the hash tag of the store's channel in that slot,
/// the first number (in hex) that hashes there.
///
/// The numbers of all 16,384 slots are found together, once per process (about 170,000
/// hashes, a few milliseconds): looking for one slot's alone costs thousands of hashes, and
/// it came on the path of every call in a slot the store had not named yet (a release names
/// its store), so a workload over many keys spent its time here.
fn tag_of(slot: Slot) -> String {
    slot_tags()
        .get(&slot)
        .map(|n| format!("{n:x}"))
        .unwrap_or_default()
}

/// The number of every slot's tag (see [`tag_of`]), found on first use.
fn slot_tags() -> &'static HashMap<Slot, u32> {
    static TAGS: OnceLock<HashMap<Slot, u32>> = OnceLock::new();
    TAGS.get_or_init(|| {
        let mut tags = HashMap::with_capacity(usize::from(SLOTS));
        let mut text = String::with_capacity(8);
        for n in 0u32.. {
            text.clear();
            let _ = write!(text, "{n:x}");
            tags.entry(Slot::for_key(&text)).or_insert(n);
            if tags.len() == usize::from(SLOTS) {
                break;
            }
        }
        tags
    })
}

/// How many hash slots a Redis Cluster has.
const SLOTS: u16 = 16_384;

/// The channel a push about a subscription or a message names, its first element.
fn channel_of(push: &PushInfo) -> Option<String> {
    match push.data.first()? {
        Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}

async fn run(
    shared: Arc<Shared>,
    mut pushes: UnboundedReceiver<PushInfo>,
    mut unsubscribes: UnboundedReceiver<String>,
    mut inbox: Inbox,
) {
    let mut next_poll = Instant::now();
    loop {
        // Broadcast subscriptions that were lost and are all back: their gap ends.
        if shared.fanout.is_down() && shared.broadcasts_missing().is_empty() {
            shared.fanout.resubscribed();
        }
        // A loss noticed by a subscription or by the last push.
        let lost = shared.lock().lost.take();
        if let Some(why) = lost {
            if shared.healthy.swap(false, Ordering::AcqRel) {
                inbox.handoffs.disconnected();
                telemetry::emit(
                    &events::STORE_PUSH_LOST,
                    None,
                    format_args!(
                        "sharded pub/sub of redis cluster {} lost ({why}); waiters re-check now and poll every {DEGRADED_POLL:?} until it is back",
                        shared.server
                    ),
                );
                next_poll = Instant::now() + DEGRADED_POLL;
            }
            inbox.hub.notify_all();
        }
        let healthy = shared.healthy.load(Ordering::Acquire);
        let broadcast_down = shared.fanout.is_down();
        if !healthy && shared.missing().is_empty() {
            shared.healthy.store(true, Ordering::Release);
            inbox.generation += 1;
            inbox.handoffs.connected(inbox.generation);
            telemetry::emit(
                &events::STORE_PUSH_RESTORED,
                None,
                format_args!(
                    "sharded pub/sub of redis cluster {} subscribed again; waiters re-check for releases missed in the gap",
                    shared.server
                ),
            );
            inbox.hub.notify_all();
            continue;
        }
        if broadcast_down && healthy && next_poll < Instant::now() {
            next_poll = Instant::now() + DEGRADED_POLL;
        }
        let watch = inbox.next_watch();
        tokio::select! {
            push = pushes.recv() => match push {
                Some(push) => on_push(&shared, &mut inbox, push),
                // The store was dropped: the sender went with its client.
                None => return,
            },
            _ = sleep_until(watch.unwrap_or_else(Instant::now)), if watch.is_some() => {
                inbox.fire_watches();
            }
            _ = shared.wake.notified() => {}
            channel = unsubscribes.recv() => {
                if let Some(channel) = channel {
                    unsubscribe(&shared, channel);
                }
            }
            _ = sleep_until(next_poll), if !healthy || broadcast_down => {
                next_poll = Instant::now() + DEGRADED_POLL;
                if !healthy {
                    inbox.hub.notify_all();
                }
                resubscribe(&shared);
            }
        }
    }
}

fn on_push(shared: &Shared, inbox: &mut Inbox, push: PushInfo) {
    match push.kind {
        PushKind::SMessage => match (channel_of(&push), push.data.get(1)) {
            (Some(channel), Some(Value::BulkString(payload))) => {
                if shared.is_wake_channel(&channel) {
                    inbox.on_message(payload);
                } else {
                    shared.fanout.deliver(&channel, payload);
                }
            }
            _ => tracing::debug!(?push, "ignored a sharded message without a payload"),
        },
        PushKind::SSubscribe => {
            if let Some(channel) = channel_of(&push) {
                shared.confirmed(&channel);
            }
        }
        // The store never unsubscribes: the server did, because the slot left that node.
        // A broadcast channel the store unsubscribed itself has no local subscription.
        PushKind::SUnsubscribe => {
            if let Some(channel) = channel_of(&push) {
                if shared.left(&channel) {
                    return;
                }
                let why = format!("the server unsubscribed {channel} (its slot moved)");
                if shared.fanout.has_subscribers(&channel) {
                    shared.broadcast_lost(Some(&channel), &why);
                }
                shared.unsubscribed(Some(&channel), why);
            }
        }
        PushKind::Disconnection => {
            let why = "a connection to a cluster node closed";
            shared.broadcast_lost(None, why);
            shared.unsubscribed(None, why.to_owned());
        }
        _ => {}
    }
}

/// Unsubscribes, in the background, the broadcast channel `channel` if it still has no
/// local subscription. A failure is only logged: messages for it are then dropped here.
fn unsubscribe(shared: &Arc<Shared>, channel: String) {
    let shared = Arc::clone(shared);
    tokio::spawn(async move {
        let _switching = shared.switching.lock().await;
        if shared.fanout.has_subscribers(&channel) || shared.broadcasts().remove(&channel).is_none()
        {
            return;
        }
        *shared.leaving().entry(channel.clone()).or_insert(0) += 1;
        let mut conn = shared.conn.clone();
        let failed = match timeout(shared.deadline, conn.sunsubscribe(&channel)).await {
            Ok(Ok(())) => return,
            Ok(Err(e)) => format!("SUNSUBSCRIBE failed: {e}"),
            Err(_) => "SUNSUBSCRIBE went unanswered".to_owned(),
        };
        // No confirmation will come (or it comes late, and reads as a loss: a gap reported
        // too many, never one too few).
        shared.left(&channel);
        tracing::debug!(%channel, %failed, "a broadcast channel stays subscribed");
    });
}

/// Subscribes again, in the background, to every channel not subscribed now; one round at
/// a time. A failure leaves the channel for the next round.
fn resubscribe(shared: &Arc<Shared>) {
    if shared.resubscribing.swap(true, Ordering::AcqRel) {
        return;
    }
    let shared = Arc::clone(shared);
    tokio::spawn(async move {
        for channel in shared
            .missing()
            .into_iter()
            .chain(shared.broadcasts_missing())
        {
            if let Err(why) = shared.subscribe(&channel).await {
                tracing::debug!(%why, "sharded resubscription failed; trying again");
            }
        }
        shared.resubscribing.store(false, Ordering::Release);
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_channel_shares_the_slot_of_its_key() {
        let names = ChannelNames::new("0123456789abcdef");
        for q in ["ns:lock:a", "ns:lock:b", "x:semaphore:{odd}", "ns:lock:}"] {
            let key = StoreKey::from_stored(q.to_owned());
            let slot = names.of(&key);
            let channel = slot.name();
            assert_eq!(slot.flagged(false), format!("0{channel}"));
            assert_eq!(slot.flagged(true), format!("1{channel}"));
            assert!(channel.starts_with("baton:wake:{"), "{channel}");
            assert!(channel.ends_with("}:0123456789abcdef"), "{channel}");
            assert!(
                channel.len() <= "baton:wake:{}:0123456789abcdef".len() + 4,
                "{channel}"
            );
            assert_eq!(
                Slot::for_key(channel),
                Slot::for_key(format!("{{{q}}}")),
                "{q}"
            );
            assert!(Arc::ptr_eq(&names.of(&key), &slot), "named once per slot");
        }
    }

    #[test]
    fn a_key_is_hashed_as_its_tag_is() {
        for q in [
            "ns:lock:a",
            "x",
            "ns:semaphore:jobs/nightly",
            "x:lock:{odd}",
            "x:lock:}",
            "x:lock:{",
            "}x",
            "x:lock:caf\u{e9}",
        ] {
            let key = StoreKey::from_stored(q.to_owned());
            assert_eq!(slot_of(&key), Slot::for_key(format!("{{{q}}}")), "{q}");
        }
    }
}
