//! The LISTEN connection that turns release notifications into wake-ups.
//!
//! Each store keeps one connection of its own (outside its pool, `application_name`
//! [`LISTENER_APPLICATION`]) that `LISTEN`s on [`CHANNEL`](crate::sql::CHANNEL) for as long
//! as the store lives. [`RELEASE`](crate::sql::RELEASE) notifies the qualified key in the
//! releasing transaction; the task that reads the connection calls [`ReleaseHub::notify`]
//! with it as soon as it arrives (no hop through another task), which is cheap when nobody in
//! this process waits on the key. Because the subscription is permanent, a waiter's
//! subscribe-before-attempt is a local operation and a handoff costs no `LISTEN` round trip.
//!
//! ## Behavior
//! - Every [`HEARTBEAT_EVERY`] the store notifies a channel private to this connection
//!   through its pool; a heartbeat that has not come back by the next one means the
//!   connection went silent (a half-open TCP connection), not just one the server closed.
//! - When the connection is lost (closed, terminated with `pg_terminate_backend`, or
//!   silent), the task emits
//!   [`baton.store.push_lost`](baton_core::telemetry::events::STORE_PUSH_LOST), wakes every
//!   waiter of this process ([`ReleaseHub::notify_all`]) so they re-check, and reconnects:
//!   at once, then with a backoff doubling from 50ms to 2s. The new connection `LISTEN`s
//!   again before anything else.
//! - Once listening again it emits
//!   [`baton.store.push_restored`](baton_core::telemetry::events::STORE_PUSH_RESTORED) and
//!   wakes every waiter again: a release notified during the gap was missed, and the
//!   re-check finds it.
//! - While it is down the store reports its poll interval in its wake-ups and signals its own
//!   releases locally, so waiters keep moving; a missed release never costs more than the
//!   holder's remaining TTL or the poll interval.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use baton_core::StoreKey;
use baton_core::signals::ReleaseHub;
use baton_core::telemetry::{self, events};
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgListener, PgPoolOptions};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::{sleep, timeout};

use crate::error::{sql_error, timed_out};
use crate::options::PostgresOptions;
use crate::sql;

/// How often the LISTEN connection is checked with a heartbeat notification.
pub const HEARTBEAT_EVERY: Duration = Duration::from_secs(5);

/// The `application_name` of every listener connection, to find it in
/// `pg_stat_activity`.
pub const LISTENER_APPLICATION: &str = "baton-listen";

const FIRST_BACKOFF: Duration = Duration::from_millis(50);
const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// The store's LISTEN connection and its task. Dropping it stops the task and closes the
/// connection.
#[derive(Debug)]
pub(crate) struct Listener {
    healthy: Arc<AtomicBool>,
    task: JoinHandle<()>,
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Listener {
    /// Listens and starts the task that feeds `hub`.
    ///
    /// # Errors
    /// `Unavailable` when the first `LISTEN` fails: a store that cannot push wake-ups says
    /// so at connect.
    pub(crate) async fn start(
        connect: PgConnectOptions,
        pool: PgPool,
        hub: Arc<ReleaseHub>,
        options: PostgresOptions,
        server: String,
    ) -> baton_core::Result<Self> {
        let source = Source {
            connect: connect.application_name(LISTENER_APPLICATION),
            heartbeat_channel: format!("baton_heartbeat_{:016x}", rand::random::<u64>()),
            pool,
            hub,
            options,
            server,
            healthy: Arc::new(AtomicBool::new(true)),
        };
        let connection = source.listen().await?;
        let healthy = Arc::clone(&source.healthy);
        let task = tokio::spawn(run(source, connection));
        Ok(Listener { healthy, task })
    }

    /// Whether the connection is listening now.
    pub(crate) fn is_healthy(&self) -> bool {
        self.healthy.load(Ordering::Acquire)
    }
}

struct Source {
    connect: PgConnectOptions,
    heartbeat_channel: String,
    pool: PgPool,
    hub: Arc<ReleaseHub>,
    options: PostgresOptions,
    server: String,
    healthy: Arc<AtomicBool>,
}

/// One listening connection: its receiving task wakes waiters on each release notification,
/// forwards every other notification (heartbeats), and ends (with the reason) when the
/// connection is lost.
struct Connection {
    /// `(channel, payload)` of each notification other than a release's, or why the
    /// connection was lost.
    payloads: mpsc::UnboundedReceiver<Result<(String, String), String>>,
    receiver: JoinHandle<()>,
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.receiver.abort();
    }
}

async fn run(source: Source, mut connection: Connection) {
    loop {
        let why = source.serve(&mut connection).await;
        drop(connection);
        source.healthy.store(false, Ordering::Release);
        telemetry::emit(
            &events::STORE_PUSH_LOST,
            None,
            format_args!(
                "LISTEN connection to {} lost ({why}); waiters re-check now and fall back to TTL timers and polling until it is back",
                source.server
            ),
        );
        source.hub.notify_all();
        connection = source.reconnect().await;
        source.healthy.store(true, Ordering::Release);
        telemetry::emit(
            &events::STORE_PUSH_RESTORED,
            None,
            format_args!(
                "LISTEN connection to {} is listening again on {}; waiters re-check for releases missed in the gap",
                source.server,
                sql::CHANNEL
            ),
        );
        source.hub.notify_all();
    }
}

impl Source {
    /// Checks the connection with heartbeats until it is lost; returns why.
    async fn serve(&self, connection: &mut Connection) -> String {
        let mut heartbeat = tokio::time::interval(HEARTBEAT_EVERY);
        heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        heartbeat.tick().await;
        let mut outstanding: Option<String> = None;
        let mut beats: u64 = 0;
        loop {
            tokio::select! {
                payload = connection.payloads.recv() => match payload {
                    Some(Ok((channel, payload))) => {
                        if channel == self.heartbeat_channel
                            && outstanding.as_deref() == Some(payload.as_str())
                        {
                            outstanding = None;
                        }
                    }
                    Some(Err(why)) => return why,
                    None => return "the receiving task ended".to_owned(),
                },
                _ = heartbeat.tick() => {
                    if outstanding.is_some() {
                        return format!(
                            "a heartbeat sent {HEARTBEAT_EVERY:?} ago did not come back"
                        );
                    }
                    beats += 1;
                    let beat = beats.to_string();
                    // A heartbeat that cannot be sent says nothing about the listener (the
                    // pool may be busy or the server down, which the listener notices by
                    // itself); only one that was sent and never came back does.
                    let deadline = self.options.call_deadline();
                    let sent = timeout(
                        deadline,
                        sqlx::query(sql::NOTIFY)
                            .bind(&self.heartbeat_channel)
                            .bind(&beat)
                            .execute(&self.pool),
                    )
                    .await;
                    match sent {
                        Ok(Ok(_)) => outstanding = Some(beat),
                        Ok(Err(e)) => tracing::debug!(error = %e, "heartbeat notification not sent"),
                        Err(_) => tracing::debug!("heartbeat notification not sent in time"),
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
                    tracing::debug!(error = %e, retry_in = ?backoff, "LISTEN reconnect failed");
                }
            }
            sleep(backoff).await;
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }

    /// Opens a connection of its own (a pool of one, which the listener keeps), `LISTEN`s on
    /// the release channel and the heartbeat channel, and starts the receiving task.
    async fn listen(&self) -> baton_core::Result<Connection> {
        let what = format!("LISTEN {}", sql::CHANNEL);
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
                .listen_all([sql::CHANNEL, self.heartbeat_channel.as_str()])
                .await?;
            Ok::<_, sqlx::Error>(listener)
        };
        let listener = match timeout(deadline, listening).await {
            Ok(Ok(listener)) => listener,
            Ok(Err(e)) => return Err(sql_error(e, &what, &self.server)),
            Err(_) => return Err(timed_out(&what, &self.server, deadline)),
        };
        let (sender, payloads) = mpsc::unbounded_channel();
        let receiver = tokio::spawn(receive(listener, Arc::clone(&self.hub), sender));
        Ok(Connection { payloads, receiver })
    }
}

/// Wakes the waiters of each released key and forwards every other notification, until the
/// connection is lost. A release is handed to the hub here, not forwarded: it is the
/// handoff's path, and a hop through the serving task would add a task wake-up to every
/// handoff. `try_recv` is never cancelled here (it may lose part of a message if it were);
/// the task is aborted only when the connection is given up.
async fn receive(
    mut listener: PgListener,
    hub: Arc<ReleaseHub>,
    sender: mpsc::UnboundedSender<Result<(String, String), String>>,
) {
    loop {
        let message = match listener.try_recv().await {
            Ok(Some(notification)) if notification.channel() == sql::CHANNEL => {
                let payload = notification.payload();
                if !payload.is_empty() {
                    hub.notify(&StoreKey::from_stored(payload.to_owned()));
                }
                continue;
            }
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
