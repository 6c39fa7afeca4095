//! The pub/sub connection that turns wake-up messages into wake-ups, and the queue protocol
//! that decides who is woken.
//!
//! Each store instance has a random id and keeps one pub/sub connection subscribed, for as
//! long as the store lives, to a channel of its own: `baton:wake:<db>:<id>`. Nothing is
//! published for a release nobody waits for. When a claim finds a key held and a waiter of
//! this process waits for it, the claim script puts the store in the key's queue
//! (`{Q}:queue`, oldest first, once per store) and records which of its holders waits
//! (`{Q}:who`). A release then grants the key to that holder of the store that waited
//! longest, with a new fence, and sends the store alone a `g<fence>\n<holder>\n<Q>` message
//! (a hand-over); this connection's task gives it to the core's [`Handoffs`], which wakes
//! that holder's waiter, and its next claim answers `HandedOver` from memory: a grant costs
//! the waiter's queueing claim and the holder's release, and no claim after the release. A
//! store queued without a `who` entry (an older baton, or one with `min_replicas`, whose
//! grants must be confirmed by replicas before anyone relies on them, which a message cannot
//! wait for) gets a reservation instead: the key is reserved for it for
//! [`HANDOFF_RESERVATION`] and it is sent an `h<Q>` message ("your turn"); this task wakes
//! the store's waiters of `Q` through [`ReleaseHub::notify`], and in the core only the first
//! of them claims. So a release wakes one waiter in one process, and processes take turns in
//! the order they started waiting.
//! Because the subscription is permanent, a waiter's subscribe-before-attempt is a local
//! operation and a handoff costs no `SUBSCRIBE` round trip.
//!
//! Semaphores queue their waiting stores in the same `{Q}:queue`. A release that frees a
//! permit reserves it, for [`HANDOFF_RESERVATION`], for the store that waited longest (the
//! member `handoff:<store>` of `{Q}:permits`, which counts as held) and sends that store a
//! `p<Q>` message; this task wakes the store's waiters of `Q`, and the first of them claims
//! the reserved permit. A store with no waiter left gives its reservation to the next store
//! (`permit_pass.lua`). So stores take permits in the order they queued, and a releaser that
//! asks again at once queues behind them.
//!
//! ## Behavior
//! - The connection's generation (1, 2, ... for each subscription) is the [`Handoffs`]
//!   address: holders queued while an earlier connection listened are forgotten, and while
//!   it is down nothing is queued for a hand-over (claims queue for a reservation only).
//! - A hand-over to a holder whose wait ended is given back by the store (a release as that
//!   holder, which hands the key on).
//! - Told it is its turn while none of its waiters wants the key any more (they gave up or
//!   were cancelled), the task gives the turn away at once (`pass.lua`): the store leaves the
//!   queue and the reservation goes to the next store.
//! - A store whose connection is gone (its process exited or was killed) is skipped by the
//!   release: `PUBLISH` reaches nobody, and the next store in the queue is tried.
//! - A store that is reached but never claims (paused, partitioned, overloaded) costs at
//!   most [`HANDOFF_RESERVATION`]: with every handoff the next store in the queue gets a
//!   `w<ms>:<Q>` message ("you are next; look again in `ms`") and keeps a timer,
//!   [`WATCH_SLACK`] later than the reservation's end. When it fires with no turn in between,
//!   the store's waiters claim again: they find the key free, or set their timers by the new
//!   holder's grant (or the store passes, if it has no waiters). The waiters' own timer at
//!   the holder's remaining TTL stays the backstop.
//! - The connection is checked with `PING` every [`PING_EVERY`], so a connection that went
//!   silent (a half-open TCP connection) is noticed, not just one the server closed.
//! - When it is lost, the task emits
//!   [`baton.store.push_lost`](baton_core::telemetry::events::STORE_PUSH_LOST), wakes every
//!   waiter of this process ([`ReleaseHub::notify_all`]) so they re-check, and reconnects:
//!   at once, then with a jittered backoff doubling from 50ms to 2s. Releases skip the store while it
//!   is disconnected; its waiters queue again when they re-check.
//! - Once subscribed again it emits
//!   [`baton.store.push_restored`](baton_core::telemetry::events::STORE_PUSH_RESTORED) and
//!   wakes every waiter again: a turn given during the gap was missed, and the re-check
//!   finds it.
//! - While it is down the store reports a poll interval in its wake-ups and signals its own
//!   releases locally, so waiters keep moving; a missed wake-up never costs more than the
//!   holder's remaining TTL.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use baton_core::retry::RECONNECT;
use baton_core::signals::{Handoffs, ReleaseHub};
use baton_core::telemetry::{self, events};
use baton_core::{Fence, Holder, StoreKey};
use futures_util::StreamExt;
use redis::aio::{PubSubSink, PubSubStream};
use redis::{RedisError, Value};
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep, sleep_until, timeout};

use crate::connection::Link;
use crate::endpoint::Endpoint;
use crate::error::{redis_error, timed_out};
use crate::keys;
use crate::options::RedisOptions;
use crate::scripts::SCRIPTS;

/// How often the pub/sub connection is checked with `PING`.
pub const PING_EVERY: Duration = Duration::from_secs(5);
/// How often waiters re-check while the pub/sub connection is down.
pub const DEGRADED_POLL: Duration = Duration::from_millis(200);
/// How long a released key stays reserved for the store whose turn it is (the core's
/// [`signals::HANDOFF_RESERVATION`](baton_core::signals::HANDOFF_RESERVATION)). Only a claim
/// from that store takes the key meanwhile; others are answered "held" with the
/// reservation's remaining time.
pub const HANDOFF_RESERVATION: Duration = baton_core::signals::HANDOFF_RESERVATION;
/// How long a key's queue of waiting stores outlives the holder's remaining time: waiters
/// look again by the holder's expiry, and queue again if they are still waiting.
pub const QUEUE_GRACE: Duration = Duration::from_secs(5);
/// How much later than the end it was told of a watch timer fires, so that on the server
/// that end has passed.
pub const WATCH_SLACK: Duration = baton_core::signals::WATCH_SLACK;

/// The store's pub/sub connection and its task. Dropping it stops the task and closes the
/// connection.
#[derive(Debug)]
pub(crate) struct PushChannel {
    healthy: Arc<AtomicBool>,
    task: JoinHandle<()>,
}

impl Drop for PushChannel {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Who the store is on the wake-up protocol, and how it gives up a turn.
#[derive(Clone)]
pub(crate) struct Identity {
    /// The channel the store listens on, `baton:wake:<db>:<random id>`: also its name in
    /// the queues.
    pub(crate) channel: String,
    /// The store's multiplexed connection, for `pass.lua`.
    pub(crate) link: Arc<Link>,
    /// The server, for messages.
    pub(crate) server: String,
}

/// How a store gives up a turn that none of its waiters wants any more: the single server's
/// store through its multiplexed connection ([`Identity`]), a cluster store through its
/// cluster connection, the scripts and their policy being the same.
pub(crate) trait GiveUp: Send + Sync + 'static {
    /// Gives up this store's place in `key`'s queue and a reservation made for it, in the
    /// background (`pass.lua`). A failure is only logged: the next store's watch timer and
    /// its waiters' TTL timers still move the key on.
    fn pass(&self, key: StoreKey, deadline: Duration);

    /// Gives up this store's turn for a permit of `key`, in the background: the store leaves
    /// the key's queue, and the permit reserved for it is reserved for the next store in
    /// line, which is told instead (`permit_pass.lua`). A failure is only logged: the
    /// reservation ends on its own, and the next store's waiters look again when the permit
    /// or reservation that ends soonest ends.
    fn pass_permit(&self, key: StoreKey, deadline: Duration);
}

impl GiveUp for Identity {
    fn pass(&self, key: StoreKey, deadline: Duration) {
        let identity = self.clone();
        tokio::spawn(async move {
            let mut invocation = SCRIPTS.pass.prepare_invoke();
            invocation
                .key(keys::grant(&key))
                .key(keys::queue(&key))
                .arg(&identity.channel);
            let mut conn = identity.link.get();
            let what = format!("giving up the turn for {key}");
            match timeout(deadline, invocation.invoke_async::<Value>(&mut conn)).await {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => {
                    let e = redis_error(e, &what, &identity.server);
                    tracing::debug!(error = %e, "pass failed; the next store's watch moves the key on");
                }
                Err(_) => {
                    let e = timed_out(&what, &identity.server, deadline);
                    tracing::debug!(error = %e, "pass failed; the next store's watch moves the key on");
                }
            }
        });
    }

    fn pass_permit(&self, key: StoreKey, deadline: Duration) {
        let identity = self.clone();
        tokio::spawn(async move {
            let mut invocation = SCRIPTS.permit_pass.prepare_invoke();
            invocation
                .key(keys::queue(&key))
                .key(keys::permits(&key))
                .arg(&identity.channel);
            let mut conn = identity.link.get();
            let what = format!("giving up the permit turn for {key}");
            let failed = match timeout(deadline, invocation.invoke_async::<Value>(&mut conn)).await
            {
                Ok(Ok(_)) => return,
                Ok(Err(e)) => redis_error(e, &what, &identity.server),
                Err(_) => timed_out(&what, &identity.server, deadline),
            };
            tracing::debug!(error = %failed, "permit pass failed; the next store's waiters look again when a permit ends");
        });
    }
}

impl PushChannel {
    /// Subscribes to the store's channel and starts the task that feeds `hub`.
    ///
    /// # Errors
    /// `Unavailable` when the first subscription fails (including a user whose ACL may not
    /// subscribe to the channel): a store that cannot push wake-ups says so at connect.
    pub(crate) async fn start(
        endpoint: Endpoint,
        identity: Identity,
        hub: Arc<ReleaseHub>,
        handoffs: Arc<Handoffs>,
        options: RedisOptions,
    ) -> baton_core::Result<Self> {
        let channel = identity.channel.clone();
        let connection = subscribe(&endpoint, &channel, &options, &identity.server)
            .await
            .map_err(|e| e.into_error(&format!("subscribing to {channel}"), &identity.server))?;
        let healthy = Arc::new(AtomicBool::new(true));
        handoffs.connected(1);
        let inbox = Inbox::new(
            hub,
            handoffs,
            Arc::new(identity.clone()),
            options.call_deadline(),
        );
        let task = tokio::spawn(run(
            Listener {
                endpoint,
                channel,
                identity,
                inbox,
                options,
                healthy: Arc::clone(&healthy),
            },
            connection,
        ));
        Ok(PushChannel { healthy, task })
    }

    /// Whether the connection is subscribed now.
    pub(crate) fn is_healthy(&self) -> bool {
        self.healthy.load(Ordering::Acquire)
    }
}

struct Listener {
    endpoint: Endpoint,
    channel: String,
    identity: Identity,
    inbox: Inbox,
    options: RedisOptions,
    healthy: Arc<AtomicBool>,
}

/// What a store does with the wake-up messages it is sent, whichever connection brings them
/// (the single server's subscription, or a cluster store's sharded ones): hand-overs go to
/// the core's [`Handoffs`], turns and permits wake this process's waiters (or are given
/// away when none wants them), and watches become timers.
pub(crate) struct Inbox {
    pub(crate) hub: Arc<ReleaseHub>,
    pub(crate) handoffs: Arc<Handoffs>,
    /// The subscription's generation, the [`Handoffs`] address while it is up.
    pub(crate) generation: u64,
    give_up: Arc<dyn GiveUp>,
    /// The call deadline of the store, for giving a turn away.
    deadline: Duration,
    /// Keys this store is next in line for, with when to look at them again.
    watches: HashMap<StoreKey, Instant>,
}

/// A wake-up message, as the lock scripts publish them.
#[derive(Debug, PartialEq, Eq)]
enum Message {
    /// `g<fence>\n<holder>\n<Q>`: a release granted the key to this store's waiting holder.
    Granted {
        key: StoreKey,
        holder: Holder,
        fence: Fence,
    },
    /// `h<Q>`: the key is reserved for this store.
    Turn(StoreKey),
    /// `w<ms>:<Q>`: this store is next for the key; look again in `ms` unless woken before.
    Watch(StoreKey, Duration),
    /// `p<Q>`: a permit of the semaphore `Q` was released, and this store waited longest.
    Permit(StoreKey),
}

impl Message {
    fn parse(payload: &[u8]) -> Option<Message> {
        let text = std::str::from_utf8(payload).ok()?;
        if let Some(grant) = text.strip_prefix('g') {
            let (fence, rest) = grant.split_once('\n')?;
            let (holder, key) = rest.split_once('\n')?;
            let fence: u64 = fence.parse().ok().filter(|f| *f > 0)?;
            if holder.is_empty() || key.is_empty() {
                return None;
            }
            return Some(Message::Granted {
                key: StoreKey::from_stored(key.to_owned()),
                holder: Holder::from_stored(holder.to_owned()),
                fence: Fence::new(fence),
            });
        }
        if let Some(key) = text.strip_prefix('h') {
            return Some(Message::Turn(StoreKey::from_stored(key.to_owned())));
        }
        if let Some(key) = text.strip_prefix('p') {
            return (!key.is_empty())
                .then(|| Message::Permit(StoreKey::from_stored(key.to_owned())));
        }
        let (ms, key) = text.strip_prefix('w')?.split_once(':')?;
        let ms: u64 = ms.parse().ok()?;
        Some(Message::Watch(
            StoreKey::from_stored(key.to_owned()),
            Duration::from_millis(ms),
        ))
    }
}

impl Inbox {
    /// An inbox at generation 1, with no watches.
    pub(crate) fn new(
        hub: Arc<ReleaseHub>,
        handoffs: Arc<Handoffs>,
        give_up: Arc<dyn GiveUp>,
        deadline: Duration,
    ) -> Self {
        Inbox {
            hub,
            handoffs,
            generation: 1,
            give_up,
            deadline,
            watches: HashMap::new(),
        }
    }

    /// Acts on one message's payload.
    pub(crate) fn on_message(&mut self, payload: &[u8]) {
        match Message::parse(payload) {
            Some(Message::Granted { key, holder, fence }) => {
                self.watches.remove(&key);
                self.handoffs.arrived(self.generation, key, holder, fence);
            }
            Some(Message::Turn(key)) => {
                self.watches.remove(&key);
                self.look_again(key);
            }
            Some(Message::Permit(key)) => {
                if self.hub.has_waiters(&key) {
                    self.hub.notify(&key);
                } else {
                    self.give_up.pass_permit(key, self.deadline);
                }
            }
            Some(Message::Watch(key, after)) => {
                self.watches
                    .insert(key, Instant::now() + after + WATCH_SLACK);
            }
            None => tracing::debug!("ignored a wake-up message this version does not know"),
        }
    }

    /// Wakes this store's waiters of `key`; with none, gives the store's turn away.
    fn look_again(&self, key: StoreKey) {
        if self.hub.has_waiters(&key) {
            self.hub.notify(&key);
        } else {
            self.give_up.pass(key, self.deadline);
        }
    }

    /// The earliest watch deadline.
    pub(crate) fn next_watch(&self) -> Option<Instant> {
        self.watches.values().min().copied()
    }

    /// Acts on every watch whose time has come.
    pub(crate) fn fire_watches(&mut self) {
        let now = Instant::now();
        let due: Vec<StoreKey> = self
            .watches
            .iter()
            .filter(|(_, at)| **at <= now)
            .map(|(key, _)| key.clone())
            .collect();
        for key in due {
            self.watches.remove(&key);
            self.look_again(key);
        }
    }
}

/// A subscribed connection, and the `host:port` of its server.
type Connection = (PubSubSink, PubSubStream, String);

async fn run(mut listener: Listener, mut connection: Connection) {
    loop {
        let why = listen(&mut listener, &mut connection).await;
        drop(connection);
        listener.healthy.store(false, Ordering::Release);
        listener.inbox.handoffs.disconnected();
        telemetry::emit(
            &events::STORE_PUSH_LOST,
            None,
            format_args!(
                "pub/sub connection to redis at {} lost ({why}); waiters re-check now and fall back to TTL timers and polling until it is back",
                listener.identity.server
            ),
        );
        listener.inbox.hub.notify_all();
        connection = reconnect(&listener).await;
        listener.inbox.generation += 1;
        listener.inbox.handoffs.connected(listener.inbox.generation);
        listener.healthy.store(true, Ordering::Release);
        telemetry::emit(
            &events::STORE_PUSH_RESTORED,
            None,
            format_args!(
                "pub/sub connection to redis at {} subscribed again to {}; waiters re-check for releases missed in the gap",
                listener.identity.server, listener.channel
            ),
        );
        listener.inbox.hub.notify_all();
    }
}

/// Feeds the hub until the connection is lost; returns why.
async fn listen(listener: &mut Listener, (sink, stream, address): &mut Connection) -> String {
    let mut ping = tokio::time::interval(PING_EVERY);
    ping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ping.tick().await;
    loop {
        let watch = listener.inbox.next_watch();
        tokio::select! {
            message = stream.next() => match message {
                Some(message) => listener.inbox.on_message(message.get_payload_bytes()),
                None => return "the server closed it".to_owned(),
            },
            _ = ping.tick() => {
                // A move missed while this connection was being opened.
                if let Some(why) = moved_away(listener, address) {
                    return why;
                }
                let response = listener.options.get_response_timeout();
                match timeout(response, sink.ping::<Value>()).await {
                    Ok(Ok(_)) => {}
                    Ok(Err(e)) => return format!("PING failed: {e}"),
                    Err(_) => return format!("no answer to PING within {response:?}"),
                }
            }
            _ = sleep_until(watch.unwrap_or_else(Instant::now)), if watch.is_some() => {
                listener.inbox.fire_watches();
            }
            _ = listener.identity.link.moved(), if listener.endpoint.follows_sentinel() => {
                if let Some(why) = moved_away(listener, address) {
                    return why;
                }
            }
        }
    }
}

/// Through Sentinel, whether the store's connection has followed the primary to another
/// server than `address`, where this connection listens: the primary's releases do not
/// count the subscribers of another server, so the connection must move too.
fn moved_away(listener: &Listener, address: &str) -> Option<String> {
    if !listener.endpoint.follows_sentinel() {
        return None;
    }
    let primary = listener.identity.link.address();
    (primary != address).then(|| format!("the primary moved from {address} to {primary}"))
}

/// Subscribes again, retrying until it works: at once, then with a doubling backoff.
async fn reconnect(listener: &Listener) -> Connection {
    let mut backoff = RECONNECT.attempts();
    loop {
        match subscribe(
            &listener.endpoint,
            &listener.channel,
            &listener.options,
            &listener.identity.server,
        )
        .await
        {
            Ok(connection) => return connection,
            Err(e) => {
                let e = e.into_error(&listener.channel, &listener.identity.server);
                tracing::debug!(error = %e, retry_in = ?backoff.peek(), "pub/sub reconnect failed");
            }
        }
        // Through Sentinel, the store's connection finding the new primary is the moment
        // to try again.
        tokio::select! {
            _ = sleep(backoff.next_delay()) => {}
            _ = listener.identity.link.moved() => backoff.reset(),
        }
    }
}

/// Why a pub/sub connection could not be opened or subscribed.
pub(crate) enum PubSubError {
    Redis(RedisError),
    TimedOut(Duration),
    NoServer(baton_core::Error),
}

impl PubSubError {
    pub(crate) fn into_error(self, what: &str, server: &str) -> baton_core::Error {
        match self {
            PubSubError::Redis(e) => redis_error(e, what, server),
            PubSubError::TimedOut(after) => timed_out(what, server, after),
            PubSubError::NoServer(e) => e,
        }
    }
}

/// Opens a pub/sub connection to the server the endpoint names now (through Sentinel, the
/// primary: messages published there reach its subscribers), with the address it reached.
pub(crate) async fn open_pubsub(
    endpoint: &Endpoint,
    options: &RedisOptions,
    server: &str,
) -> Result<Connection, PubSubError> {
    let (client, address) = endpoint
        .client(options, server)
        .await
        .map_err(PubSubError::NoServer)?;
    let limit = options.get_connect_timeout();
    let pubsub = timeout(limit, client.get_async_pubsub())
        .await
        .map_err(|_| PubSubError::TimedOut(limit))?
        .map_err(PubSubError::Redis)?;
    let (sink, stream) = pubsub.split();
    Ok((sink, stream, address))
}

async fn subscribe(
    endpoint: &Endpoint,
    channel: &str,
    options: &RedisOptions,
    server: &str,
) -> Result<Connection, PubSubError> {
    let (mut sink, stream, address) = open_pubsub(endpoint, options, server).await?;
    let response = options.get_response_timeout();
    timeout(response, sink.subscribe(channel))
        .await
        .map_err(|_| PubSubError::TimedOut(response))?
        .map_err(PubSubError::Redis)?;
    Ok((sink, stream, address))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages() {
        let key = |s: &str| StoreKey::from_stored(s.to_owned());
        assert_eq!(
            Message::parse(b"hns:lock:a:b"),
            Some(Message::Turn(key("ns:lock:a:b")))
        );
        assert_eq!(
            Message::parse(b"w250:ns:lock:a:b"),
            Some(Message::Watch(
                key("ns:lock:a:b"),
                Duration::from_millis(250)
            ))
        );
        assert_eq!(
            Message::parse(b"g17\ntok:en\nns:lock:a:b"),
            Some(Message::Granted {
                key: key("ns:lock:a:b"),
                holder: Holder::from_stored("tok:en".to_owned()),
                fence: Fence::new(17),
            })
        );
        assert_eq!(Message::parse(b"g0\nh\nns:lock:a"), None);
        assert_eq!(Message::parse(b"gx\nh\nns:lock:a"), None);
        assert_eq!(Message::parse(b"g1\nh"), None);
        assert_eq!(Message::parse(b"g1\n\nns:lock:a"), None);
        assert_eq!(Message::parse(b"w-1:ns:lock:a"), None);
        assert_eq!(Message::parse(b"wx:ns:lock:a"), None);
        assert_eq!(
            Message::parse(b"pns:semaphore:a"),
            Some(Message::Permit(key("ns:semaphore:a")))
        );
        assert_eq!(Message::parse(b"p"), None);
        assert_eq!(Message::parse(b"x"), None);
        assert_eq!(Message::parse(b""), None);
        assert_eq!(Message::parse(b"h\xff"), None);
    }
}
