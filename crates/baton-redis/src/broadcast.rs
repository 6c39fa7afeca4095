//! Broadcast on Redis pub/sub: `PUBLISH` on the multiplexed connection, and one dedicated
//! subscriber connection per store that carries every channel this process subscribes to.
//!
//! The subscriber connection (the *hub*) starts with the store's first subscription. Its
//! task reads messages and hands them to the local subscriptions through a
//! [`Fanout`], subscribes a channel when its first local subscription
//! arrives and unsubscribes when its last one is dropped. It is separate from the store's
//! release-wake-up connection ([`crate::wakeups`]), so a slow broadcast consumer never delays
//! a lock handoff.
//!
//! ## Channels
//! Pub/sub ignores database numbers, so a channel names its database: the qualified channel
//! `Q` (`<namespace>:broadcast:<channel>`) is the Redis channel `Q:db<N>`. The namespace comes
//! first, so an ACL can grant a user `&<namespace>:*`.
//!
//! ## Behavior
//! - The hub is checked with `PING` every [`PING_EVERY`], so a silent (half-open) connection
//!   is noticed, not only one the server closed (`CLIENT KILL`, a restart, an output buffer
//!   limit hit by a consumer that fell far behind).
//! - When the hub's connection is lost it reports it to every subscription
//!   ([`Fanout::disconnected`]: `baton.subscription.dropped`), reconnects at once and then
//!   with a backoff doubling from 50 ms to 2 s, subscribes every channel again, and sends
//!   each subscription a gap and a resubscribed event (`baton.subscription.resubscribed`
//!   with `gap_ms`). Messages published in between are lost (at most once).
//! - `subscribe` returns once Redis confirmed the subscription, or fails with `Unavailable`
//!   after `connect_timeout + response_timeout` (also while the hub is reconnecting).
//! - `publish` is one `PUBLISH`, not retried; a failure is `Unavailable`.
//! - Dropping the store closes the hub and ends every subscription's stream.

use std::collections::HashSet;
use std::sync::Arc;

use async_trait::async_trait;
use baton_core::broadcast::RawSubscription;
use baton_core::broadcast::delivery::Fanout;
use baton_core::retry::RECONNECT;
use baton_core::{BroadcastStore, Error, Result, StoreKey};
use futures_util::StreamExt;
use redis::aio::{PubSubSink, PubSubStream};
use redis::{RedisError, Value};
use tokio::sync::{OnceCell, mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio::time::{sleep, timeout};

use crate::endpoint::Endpoint;
use crate::error::{redis_error, timed_out};
use crate::locks::RedisStore;
use crate::options::RedisOptions;
pub use crate::wakeups::PING_EVERY;
use crate::wakeups::{PubSubError, open_pubsub};

/// The Redis channel of the qualified channel `key` on database `db`: `Q:db<N>`.
pub fn redis_channel(key: &StoreKey, db: i64) -> String {
    format!("{}:db{db}", key.as_str())
}

/// The store's hub, started by its first subscription.
#[derive(Debug, Default)]
pub(crate) struct HubCell(OnceCell<Hub>);

#[derive(Debug)]
pub(crate) struct Hub {
    fanout: Arc<Fanout>,
    commands: mpsc::UnboundedSender<Command>,
    task: JoinHandle<()>,
}

impl Drop for Hub {
    fn drop(&mut self) {
        self.task.abort();
        self.fanout.close();
    }
}

#[derive(Debug)]
enum Command {
    /// Make sure `channel` is subscribed, then answer.
    Subscribe {
        channel: String,
        done: oneshot::Sender<Result<()>>,
    },
    /// Unsubscribe `channel` if it still has no local subscription.
    Unsubscribe(String),
}

type Connection = (PubSubSink, PubSubStream);

/// What the hub's task owns.
struct Task {
    endpoint: Endpoint,
    options: RedisOptions,
    server: String,
    fanout: Arc<Fanout>,
    commands: mpsc::UnboundedReceiver<Command>,
    /// Channels subscribed on the current connection.
    subscribed: HashSet<String>,
    /// Subscribe commands that arrived while the connection was down.
    waiting: Vec<(String, oneshot::Sender<Result<()>>)>,
}

impl Hub {
    async fn start(endpoint: Endpoint, options: RedisOptions, server: String) -> Result<Hub> {
        let connection = connect(&endpoint, &options, &server)
            .await
            .map_err(|e| e.into_error("opening the broadcast connection", &server))?;
        let (commands, receiver) = mpsc::unbounded_channel();
        let unsubscribe = commands.clone();
        let fanout = Arc::new(Fanout::with_on_empty(move |channel| {
            let _ = unsubscribe.send(Command::Unsubscribe(channel.to_owned()));
        }));
        let task = tokio::spawn(run(
            Task {
                endpoint,
                options,
                server,
                fanout: Arc::clone(&fanout),
                commands: receiver,
                subscribed: HashSet::new(),
                waiting: Vec::new(),
            },
            connection,
        ));
        Ok(Hub {
            fanout,
            commands,
            task,
        })
    }
}

async fn run(mut task: Task, mut connection: Connection) {
    loop {
        let why = serve(&mut task, &mut connection).await;
        task.subscribed.clear();
        task.fanout.disconnected(&format!(
            "the connection to redis at {} was lost: {why}",
            task.server
        ));
        connection = reconnect(&mut task).await;
        task.fanout.resubscribed();
        for (channel, done) in std::mem::take(&mut task.waiting) {
            let answer = if task.subscribed.contains(&channel) {
                Ok(())
            } else {
                subscribe_one(&mut task, &mut connection, &channel).await
            };
            let _ = done.send(answer);
        }
    }
}

/// Serves the connection until it is lost; returns why.
async fn serve(task: &mut Task, (sink, stream): &mut Connection) -> String {
    let mut ping = tokio::time::interval(PING_EVERY);
    ping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ping.tick().await;
    let response = task.options.get_response_timeout();
    loop {
        tokio::select! {
            message = stream.next() => match message {
                Some(message) => {
                    task.fanout.deliver(message.get_channel_name(), message.get_payload_bytes());
                }
                None => return "the server closed it".to_owned(),
            },
            command = task.commands.recv() => match command {
                Some(Command::Subscribe { channel, done }) => {
                    if task.subscribed.contains(&channel) {
                        let _ = done.send(Ok(()));
                        continue;
                    }
                    match timeout(response, sink.subscribe(&channel)).await {
                        Ok(Ok(())) => {
                            task.subscribed.insert(channel);
                            let _ = done.send(Ok(()));
                        }
                        Ok(Err(e)) if !lost(&e) => {
                            let what = format!("subscribing to {channel}");
                            let _ = done.send(Err(redis_error(e, &what, &task.server)));
                        }
                        Ok(Err(e)) => {
                            task.waiting.push((channel, done));
                            return format!("SUBSCRIBE failed: {e}");
                        }
                        Err(_) => {
                            task.waiting.push((channel, done));
                            return format!("no answer to SUBSCRIBE within {response:?}");
                        }
                    }
                }
                Some(Command::Unsubscribe(channel)) => {
                    if task.fanout.has_subscribers(&channel) || !task.subscribed.remove(&channel) {
                        continue;
                    }
                    match timeout(response, sink.unsubscribe(&channel)).await {
                        Ok(Ok(())) => {}
                        Ok(Err(e)) if !lost(&e) => tracing::debug!(
                            channel = %channel, error = %e, "UNSUBSCRIBE refused"
                        ),
                        Ok(Err(e)) => return format!("UNSUBSCRIBE failed: {e}"),
                        Err(_) => return format!("no answer to UNSUBSCRIBE within {response:?}"),
                    }
                }
                // The store is being dropped; its Drop aborts this task.
                None => std::future::pending::<()>().await,
            },
            _ = ping.tick() => {
                match timeout(response, sink.ping::<Value>()).await {
                    Ok(Ok(_)) => {}
                    Ok(Err(e)) => return format!("PING failed: {e}"),
                    Err(_) => return format!("no answer to PING within {response:?}"),
                }
            }
        }
    }
}

/// Whether `e` means the connection is gone (rather than a refusal of one command).
fn lost(e: &RedisError) -> bool {
    e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal() || e.is_timeout()
}

/// Connects and subscribes every channel that has local subscriptions, retrying until it
/// works: at once, then with a doubling backoff. Subscribe commands that arrive meanwhile
/// wait for the connection.
async fn reconnect(task: &mut Task) -> Connection {
    let mut backoff = RECONNECT.attempts();
    loop {
        match connect(&task.endpoint, &task.options, &task.server).await {
            Ok(mut connection) => {
                let mut all = true;
                for channel in task.fanout.channels() {
                    if subscribe_one(task, &mut connection, &channel)
                        .await
                        .is_err()
                    {
                        all = false;
                        break;
                    }
                }
                if all {
                    return connection;
                }
                task.subscribed.clear();
            }
            Err(e) => {
                let e = e.into_error("reconnecting the broadcast connection", &task.server);
                tracing::debug!(error = %e, retry_in = ?backoff.peek(), "broadcast reconnect failed");
            }
        }
        let pause = sleep(backoff.next_delay());
        tokio::pin!(pause);
        loop {
            tokio::select! {
                _ = &mut pause => break,
                command = task.commands.recv() => match command {
                    Some(Command::Subscribe { channel, done }) => task.waiting.push((channel, done)),
                    // Re-subscribing after the reconnect looks at the fanout's channels.
                    Some(Command::Unsubscribe(_)) => {}
                    None => std::future::pending::<()>().await,
                },
            }
        }
    }
}

async fn subscribe_one(task: &mut Task, (sink, _): &mut Connection, channel: &str) -> Result<()> {
    let response = task.options.get_response_timeout();
    let what = format!("subscribing to {channel}");
    match timeout(response, sink.subscribe(channel)).await {
        Ok(Ok(())) => {
            task.subscribed.insert(channel.to_owned());
            Ok(())
        }
        Ok(Err(e)) => Err(redis_error(e, &what, &task.server)),
        Err(_) => Err(timed_out(&what, &task.server, response)),
    }
}

/// Opens a pub/sub connection to the server the endpoint names now (through Sentinel, the
/// primary: messages published there reach its subscribers).
async fn connect(
    endpoint: &Endpoint,
    options: &RedisOptions,
    server: &str,
) -> Result<Connection, PubSubError> {
    let (sink, stream, _address) = open_pubsub(endpoint, options, server).await?;
    Ok((sink, stream))
}

#[async_trait]
impl BroadcastStore for RedisStore {
    async fn publish(&self, channel: &StoreKey, payload: Vec<u8>) -> Result<()> {
        let mut conn = self.connection();
        let mut publish = redis::cmd("PUBLISH");
        publish.arg(redis_channel(channel, self.db())).arg(payload);
        let reply = publish.query_async::<i64>(&mut conn);
        self.within(&format!("publishing on {channel}"), reply)
            .await
            .map(|_receivers| ())
    }

    async fn subscribe(&self, channel: &StoreKey, capacity: usize) -> Result<RawSubscription> {
        let hub = self
            .broadcast_hub()
            .0
            .get_or_try_init(|| async {
                Hub::start(
                    self.endpoint(),
                    self.options().clone(),
                    self.server().to_owned(),
                )
                .await
            })
            .await?;
        let name = redis_channel(channel, self.db());
        // Register first, so nothing published after Redis confirms is missed.
        let (subscription, _first) = hub.fanout.subscribe(&name, capacity);
        let (done, answer) = oneshot::channel();
        hub.commands
            .send(Command::Subscribe {
                channel: name,
                done,
            })
            .map_err(|_| Error::unavailable("the broadcast connection's task has stopped"))?;
        let deadline = self.options().call_deadline();
        let what = format!("subscribing to {channel}");
        match timeout(deadline, answer).await {
            Ok(Ok(Ok(()))) => Ok(subscription),
            Ok(Ok(Err(e))) => Err(e),
            Ok(Err(_)) => Err(Error::unavailable(
                "the broadcast connection's task has stopped",
            )),
            Err(_) => Err(timed_out(&what, self.server(), deadline)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn channels_name_their_database() {
        let key = StoreKey::from_stored("app:broadcast:ancestry-invalidate".into());
        assert_eq!(
            redis_channel(&key, 3),
            "app:broadcast:ancestry-invalidate:db3"
        );
    }
}
