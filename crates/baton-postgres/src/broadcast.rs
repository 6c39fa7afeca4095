//! Broadcast on PostgreSQL: `NOTIFY` through the pool, and one dedicated `LISTEN`
//! connection per store that carries every channel this process subscribes to.
//!
//! Every broadcast of a database is notified on the one channel [`CHANNEL`], with the
//! qualified channel name (`<namespace>:broadcast:<channel>`) and a newline before the
//! message: PostgreSQL channel names are identifiers of at most 63 bytes, where baton's
//! channels may be 588, and one fixed channel needs no `LISTEN`/`UNLISTEN` per subscription
//! (the same design as the release wake-ups, [`crate::wakeups`], whose connection loop it
//! shares). The task that reads the connection hands each message to the local
//! subscriptions of its channel through a [`Fanout`] as it arrives; messages of channels
//! nobody here subscribes to are dropped on arrival.
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
//!   reconnects at once, then backing off (jittered) from 50 ms to 2 s, and once listening again each
//!   subscription gets a gap and a resubscribed event (`baton.subscription.resubscribed`
//!   with `gap_ms`). Messages notified in between are lost (at most once).
//! - `subscribe` returns once the connection is listening, or fails with `Unavailable`
//!   after `connect_timeout + response_timeout`.
//! - A store opened with `listen=off`, or with `pooler=transaction` and no `listen_url`,
//!   cannot listen: `Baton::broadcast` refuses it with `Unsupported`, and `subscribe` fails
//!   the same way. With `listen_url` the connection goes there; messages are still sent
//!   through the pool (a `NOTIFY` works through any pooler).

use std::sync::Arc;

use async_trait::async_trait;
use baton_core::broadcast::RawSubscription;
use baton_core::broadcast::delivery::Fanout;
use baton_core::{BroadcastStore, Error, MAX_KEY_BYTES, MAX_NAMESPACE_BYTES, Result, StoreKey};
use tokio::sync::{OnceCell, watch};
use tokio::time::timeout;

use crate::error::timed_out;
use crate::listener::{ListenTask, Sink, Spec};
use crate::locks::PostgresStore;
use crate::sql;
pub use crate::wakeups::HEARTBEAT_EVERY;

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

/// The store's broadcast connection, started by its first subscription.
#[derive(Debug, Default)]
pub(crate) struct HubCell(OnceCell<Hub>);

#[derive(Debug)]
pub(crate) struct Hub {
    fanout: Arc<Fanout>,
    listening: watch::Receiver<bool>,
    _task: ListenTask,
}

impl Drop for Hub {
    fn drop(&mut self) {
        self.fanout.close();
    }
}

/// Hands each notification to the local subscriptions of its channel, and the connection's
/// loss and return to all of them.
#[derive(Debug)]
struct Deliver {
    fanout: Arc<Fanout>,
    listening: watch::Sender<bool>,
}

impl Sink for Deliver {
    fn notify(&self, payload: &str) {
        if let Some((name, message)) = payload.split_once('\n') {
            self.fanout.deliver(name, message.as_bytes());
        }
    }

    fn lost(&self, server: &str, why: &str) {
        self.listening.send_replace(false);
        self.fanout.disconnected(&format!(
            "the LISTEN connection to {server} was lost: {why}"
        ));
    }

    fn restored(&self, _server: &str) {
        self.listening.send_replace(true);
        self.fanout.resubscribed();
    }
}

impl Hub {
    async fn start(store: &PostgresStore) -> Result<Hub> {
        // Nobody sees `listening` before the first `LISTEN` worked: the hub exists only then.
        let (listening, watching) = watch::channel(true);
        let fanout = Arc::new(Fanout::new());
        let Some(target) = &store.listen_target else {
            return Err(no_listen());
        };
        let task = ListenTask::start(Spec {
            connect: target.connect.clone(),
            pool: store.db.pool.clone(),
            unnamed: store.db.unnamed(),
            options: store.db.options.clone(),
            server: target.redacted.clone(),
            application: APPLICATION,
            channel: CHANNEL,
            addressed: None,
            heartbeat_prefix: "baton_bheartbeat_",
            sink: Arc::new(Deliver {
                fanout: Arc::clone(&fanout),
                listening,
            }),
        })
        .await?;
        Ok(Hub {
            fanout,
            listening: watching,
            _task: task,
        })
    }
}

fn no_listen() -> Error {
    Error::unsupported(
        "this PostgreSQL store has no LISTEN connection (listen=off, or pooler=transaction without listen_url), so it cannot receive broadcasts; give it listen_url= with a direct connection to the server, or use redis://",
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
                        .execute(self.db.exec())
                },
                // A publish retried after its connection broke may be delivered twice:
                // subscribers drop the duplicate by its sequence number.
                |_| true,
            )
            .await?;
        Ok(())
    }

    async fn subscribe(&self, channel: &StoreKey, capacity: usize) -> Result<RawSubscription> {
        if self.listen_target.is_none() {
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
