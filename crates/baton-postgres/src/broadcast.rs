//! Broadcast on PostgreSQL: `NOTIFY` through the pool, and one dedicated `LISTEN`
//! connection per store that carries every channel this process subscribes to.
//!
//! Every broadcast of a database is notified on the one channel [`CHANNEL`], with the
//! qualified channel name (`<namespace>:broadcast:<channel>`) and a newline before the
//! message: PostgreSQL channel names are identifiers of at most 63 bytes, where baton's
//! channels may be 588, and one fixed channel needs no `LISTEN`/`UNLISTEN` per subscription
//! (the same design as the release wake-ups, [`crate::listen`]). The connection's task hands
//! each message to the local subscriptions of its channel through a [`Fanout`]; messages of
//! channels nobody here subscribes to are dropped on arrival.
//!
//! ## Behavior
//! - `NOTIFY` payloads must be shorter than 8000 bytes, so a message (with baton's envelope)
//!   may have at most [`MAX_MESSAGE`] bytes here; a larger one is refused with
//!   `InvalidInput` before it is sent. Payloads are text: a message that is not UTF-8 is
//!   refused the same way (baton's envelopes always are).
//! - The connection (`application_name` [`APPLICATION`]) starts with the store's first
//!   subscription. Every [`HEARTBEAT_EVERY`] the store notifies a channel private to it; a
//!   heartbeat that has not come back by the next one means the connection went silent.
//! - When it is lost (closed, `pg_terminate_backend`, a restart, silence) every
//!   subscription is told ([`Fanout::disconnected`]: `baton.subscription.dropped`); it
//!   reconnects at once, then backing off from 50 ms to 2 s, and once listening again each
//!   subscription gets a gap and a resubscribed event (`baton.subscription.resubscribed`
//!   with `gap_ms`). Messages notified in between are lost (at most once).
//! - `subscribe` returns once the connection is listening, or fails with `Unavailable`
//!   after `connect_timeout + response_timeout`.
//! - A store opened with `listen=off` (behind a transaction-pooling proxy) cannot listen:
//!   `Baton::broadcast` refuses it with `Unsupported`, and `subscribe` fails the same way.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use baton_core::broadcast::RawSubscription;
use baton_core::broadcast::fanout::Fanout;
use baton_core::{BroadcastStore, Error, MAX_KEY_BYTES, MAX_NAMESPACE_BYTES, Result, StoreKey};
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgListener, PgPoolOptions};
use tokio::sync::{OnceCell, mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::{sleep, timeout};

use crate::error::{sql_error, timed_out};
pub use crate::listen::HEARTBEAT_EVERY;
use crate::options::PostgresOptions;
use crate::sql;
use crate::store::PostgresStore;

/// The channel every broadcast of a database is notified on.
pub const CHANNEL: &str = "baton_broadcast";

/// The `application_name` of the broadcast connection, to find it in `pg_stat_activity`.
pub const APPLICATION: &str = "baton-broadcast";

/// `NOTIFY`'s limit: a payload must be shorter than 8000 bytes.
pub const NOTIFY_LIMIT: usize = 7999;

/// Room for the longest qualified channel name and its newline.
const CHANNEL_ROOM: usize = MAX_NAMESPACE_BYTES + ":broadcast:".len() + MAX_KEY_BYTES + 1;

/// The largest message (baton's envelope included) this store carries.
pub const MAX_MESSAGE: usize = NOTIFY_LIMIT - CHANNEL_ROOM;

const FIRST_BACKOFF: Duration = Duration::from_millis(50);
const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// The store's broadcast connection, started by its first subscription.
#[derive(Debug, Default)]
pub(crate) struct HubCell(OnceCell<Hub>);

#[derive(Debug)]
pub(crate) struct Hub {
    fanout: Arc<Fanout>,
    listening: watch::Receiver<bool>,
    task: JoinHandle<()>,
}

impl Drop for Hub {
    fn drop(&mut self) {
        self.task.abort();
        self.fanout.close();
    }
}

struct Source {
    connect: PgConnectOptions,
    heartbeat_channel: String,
    pool: PgPool,
    options: PostgresOptions,
    server: String,
    fanout: Arc<Fanout>,
    listening: watch::Sender<bool>,
}

/// One listening connection: its receiving task forwards every notification, and ends
/// (with the reason) when the connection is lost.
struct Connection {
    notifications: mpsc::UnboundedReceiver<Result<(String, String), String>>,
    receiver: JoinHandle<()>,
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.receiver.abort();
    }
}

impl Hub {
    async fn start(store: &PostgresStore) -> Result<Hub> {
        let (listening, watching) = watch::channel(false);
        let source = Source {
            connect: (*store.db.pool.connect_options())
                .clone()
                .application_name(APPLICATION),
            heartbeat_channel: format!("baton_bheartbeat_{:016x}", rand::random::<u64>()),
            pool: store.db.pool.clone(),
            options: store.db.options.clone(),
            server: store.db.server.clone(),
            fanout: Arc::new(Fanout::new()),
            listening,
        };
        let connection = source.listen().await?;
        source.listening.send_replace(true);
        let fanout = Arc::clone(&source.fanout);
        let task = tokio::spawn(run(source, connection));
        Ok(Hub {
            fanout,
            listening: watching,
            task,
        })
    }
}

async fn run(source: Source, mut connection: Connection) {
    loop {
        let why = source.serve(&mut connection).await;
        drop(connection);
        source.listening.send_replace(false);
        source.fanout.disconnected(&format!(
            "the LISTEN connection to {} was lost: {why}",
            source.server
        ));
        connection = source.reconnect().await;
        source.listening.send_replace(true);
        source.fanout.resubscribed();
    }
}

impl Source {
    /// Delivers notifications until the connection is lost; returns why.
    async fn serve(&self, connection: &mut Connection) -> String {
        let mut heartbeat = tokio::time::interval(HEARTBEAT_EVERY);
        heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        heartbeat.tick().await;
        let mut outstanding: Option<String> = None;
        let mut beats: u64 = 0;
        loop {
            tokio::select! {
                notification = connection.notifications.recv() => match notification {
                    Some(Ok((channel, payload))) => {
                        if channel == self.heartbeat_channel {
                            if outstanding.as_deref() == Some(payload.as_str()) {
                                outstanding = None;
                            }
                        } else if let Some((name, message)) = payload.split_once('\n') {
                            self.fanout.deliver(name, message.as_bytes());
                        }
                    }
                    Some(Err(why)) => return why,
                    None => return "the receiving task ended".to_owned(),
                },
                _ = heartbeat.tick() => {
                    if outstanding.is_some() {
                        return format!("a heartbeat sent {HEARTBEAT_EVERY:?} ago did not come back");
                    }
                    beats += 1;
                    let beat = beats.to_string();
                    let sent = timeout(
                        self.options.call_deadline(),
                        sqlx::query(sql::NOTIFY)
                            .bind(&self.heartbeat_channel)
                            .bind(&beat)
                            .execute(&self.pool),
                    )
                    .await;
                    // Only a heartbeat that was sent and never came back says the
                    // connection is silent; one that could not be sent says nothing.
                    if let Ok(Ok(_)) = sent {
                        outstanding = Some(beat);
                    }
                }
            }
        }
    }

    /// Listens again, retrying until it works: at once, then with a doubling backoff.
    async fn reconnect(&self) -> Connection {
        let mut backoff = FIRST_BACKOFF;
        loop {
            match self.listen().await {
                Ok(connection) => return connection,
                Err(e) => {
                    tracing::debug!(error = %e, retry_in = ?backoff, "broadcast LISTEN reconnect failed");
                }
            }
            sleep(backoff).await;
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }

    /// Opens a connection of its own, `LISTEN`s on [`CHANNEL`] and the heartbeat channel,
    /// and starts the receiving task.
    async fn listen(&self) -> Result<Connection> {
        let what = format!("LISTEN {CHANNEL}");
        let deadline = self.options.call_deadline();
        let pool = PgPoolOptions::new()
            .max_connections(1)
            .min_connections(0)
            .max_lifetime(None)
            .idle_timeout(None)
            .acquire_timeout(self.options.get_connect_timeout())
            .test_before_acquire(false)
            .connect_lazy_with(self.connect.clone());
        let listening = async {
            let mut listener = PgListener::connect_with(&pool).await?;
            listener.ignore_pool_close_event(true);
            listener.eager_reconnect(false);
            listener
                .listen_all([CHANNEL, self.heartbeat_channel.as_str()])
                .await?;
            Ok::<_, sqlx::Error>(listener)
        };
        let listener = match timeout(deadline, listening).await {
            Ok(Ok(listener)) => listener,
            Ok(Err(e)) => return Err(sql_error(e, &what, &self.server)),
            Err(_) => return Err(timed_out(&what, &self.server, deadline)),
        };
        let (sender, notifications) = mpsc::unbounded_channel();
        let receiver = tokio::spawn(receive(listener, sender));
        Ok(Connection {
            notifications,
            receiver,
        })
    }
}

/// Forwards notifications until the connection is lost. `try_recv` is never cancelled
/// here; the task is aborted only when the connection is given up.
async fn receive(
    mut listener: PgListener,
    sender: mpsc::UnboundedSender<Result<(String, String), String>>,
) {
    loop {
        let message = match listener.try_recv().await {
            Ok(Some(notification)) => Ok((
                notification.channel().to_owned(),
                notification.payload().to_owned(),
            )),
            Ok(None) => Err("the server closed it".to_owned()),
            Err(e) => Err(e.to_string()),
        };
        let lost = message.is_err();
        if sender.send(message).is_err() || lost {
            return;
        }
    }
}

fn no_listen() -> Error {
    Error::unsupported(
        "this PostgreSQL store was opened with listen=off (for a transaction-pooling proxy), so it cannot receive broadcasts; open it with a direct connection, or use redis://",
    )
}

#[async_trait]
impl BroadcastStore for PostgresStore {
    async fn publish(&self, channel: &StoreKey, payload: Vec<u8>) -> Result<()> {
        let message = String::from_utf8(payload).map_err(|_| {
            Error::invalid_input(format!(
                "a message on {channel} is not UTF-8; PostgreSQL NOTIFY carries text only"
            ))
        })?;
        let notification = format!("{}\n{message}", channel.as_str());
        if notification.len() > NOTIFY_LIMIT {
            return Err(Error::invalid_input(format!(
                "a message on {channel} is {} bytes; PostgreSQL NOTIFY carries at most {NOTIFY_LIMIT} bytes with the channel name",
                message.len()
            )));
        }
        self.db
            .call(
                || format!("publishing on {channel}"),
                || {
                    sqlx::query(sql::NOTIFY)
                        .bind(CHANNEL)
                        .bind(&notification)
                        .execute(&self.db.pool)
                },
                // A publish retried after its connection broke may be delivered twice:
                // subscribers drop the duplicate by its sequence number.
                |_| true,
            )
            .await?;
        Ok(())
    }

    async fn subscribe(&self, channel: &StoreKey, capacity: usize) -> Result<RawSubscription> {
        if !self.db.options.get_listen() {
            return Err(no_listen());
        }
        let hub = self
            .broadcast
            .0
            .get_or_try_init(|| Hub::start(self))
            .await?;
        let deadline = self.db.options.call_deadline();
        let mut listening = hub.listening.clone();
        let what = format!("subscribing to {channel}");
        match timeout(deadline, listening.wait_for(|up| *up)).await {
            Ok(Ok(_)) => {}
            Ok(Err(_)) => return Err(Error::unavailable("the broadcast connection has stopped")),
            Err(_) => return Err(timed_out(&what, &self.db.server, deadline)),
        }
        Ok(hub.fanout.subscribe(channel.as_str(), capacity).0)
    }

    fn max_payload(&self) -> Option<usize> {
        Some(MAX_MESSAGE)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_longest_channel_leaves_room_for_messages() {
        assert_eq!(CHANNEL_ROOM, 64 + 11 + 512 + 1);
        assert_eq!(MAX_MESSAGE, 7999 - 588);
        assert!(CHANNEL.len() <= 63 && APPLICATION.len() <= 63);
    }
}
