//! A dedicated `LISTEN` connection that stays up for as long as its owner lives: the loop
//! that both push paths of the store share, the release wake-ups ([`crate::wakeups`]) and
//! broadcast ([`crate::broadcast`]).
//!
//! Use it for anything that must hear every `NOTIFY` on one channel of a database: it opens
//! a connection of its own (outside the pool), `LISTEN`s on the channel, hands each payload
//! to a [`Sink`] in the task that reads the connection, and tells the sink when the
//! connection is lost and when it is listening again.
//!
//! ## Behavior
//! - Every [`HEARTBEAT_EVERY`] it notifies a channel private to this connection through the
//!   pool; a heartbeat that has not come back by the next one means the connection went
//!   silent (a half-open TCP connection), not just one the server closed. A heartbeat that
//!   cannot be sent says nothing about the connection.
//! - When the connection is lost (closed, `pg_terminate_backend`, a restart, silence) the
//!   task that read it is stopped first, so nothing from it reaches [`Sink::notify`] after
//!   [`Sink::lost`]. Then it reconnects: at once, then with a jittered backoff doubling from 50 ms to
//!   2 s. The new connection `LISTEN`s before anything else, and [`Sink::restored`] follows.
//!   Notifications sent in between are not received.

use std::sync::Arc;

use baton_core::retry::RECONNECT;
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgListener, PgPoolOptions};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::{sleep, timeout};

use crate::connection::Exec;
use crate::error::{sql_error, timed_out};
use crate::options::PostgresOptions;
use crate::sql;
use crate::wakeups::HEARTBEAT_EVERY;

/// Where a [`ListenTask`]'s notifications and connection events go.
pub(crate) trait Sink: Send + Sync + 'static {
    /// A notification on the listened channel. Runs in the task that reads the connection,
    /// as each one arrives: keep it cheap, and never block.
    fn notify(&self, payload: &str);

    /// The connection to `server` was lost, for the reason `why`; nothing it received
    /// reaches [`Sink::notify`] any more.
    fn lost(&self, server: &str, why: &str);

    /// A new connection to `server` is listening again after [`Sink::lost`].
    fn restored(&self, server: &str);

    /// The first connection of a task started by [`ListenTask::spawn`] is listening.
    fn listening(&self) {}

    /// A connection is listening, on the server backend `pid` (its `pg_backend_pid()`);
    /// called before [`Sink::listening`] or [`Sink::restored`].
    fn connected(&self, _pid: i32) {}
}

/// What a [`ListenTask`] connects to, listens on and feeds.
pub(crate) struct Spec<S> {
    /// How to connect; the `application_name` is set from `application`.
    pub(crate) connect: PgConnectOptions,
    /// The store's pool, which sends the heartbeats.
    pub(crate) pool: PgPool,
    /// Whether the pool's statements must run unnamed, in a transaction of their own
    /// ([`Db::unnamed`](crate::connection::Db::unnamed)).
    pub(crate) unnamed: bool,
    /// The store's options: the connect timeout and the deadline of each call.
    pub(crate) options: PostgresOptions,
    /// The server, as errors and events name it.
    pub(crate) server: String,
    /// The connection's `application_name`, to find it in `pg_stat_activity`.
    pub(crate) application: &'static str,
    /// The channel to `LISTEN` on.
    pub(crate) channel: &'static str,
    /// The start of a channel addressed to this connection alone, also `LISTEN`ed on and fed
    /// to the sink: the prefix followed by the connection's backend pid (see
    /// [`Sink::connected`]). `None` for none.
    pub(crate) addressed: Option<&'static str>,
    /// The start of the private heartbeat channel's name; a random suffix follows.
    pub(crate) heartbeat_prefix: &'static str,
    /// Where notifications and connection events go.
    pub(crate) sink: Arc<S>,
}

/// The task that keeps the connection listening. Dropping it stops the task and closes the
/// connection.
#[derive(Debug)]
pub(crate) struct ListenTask(JoinHandle<()>);

impl Drop for ListenTask {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl ListenTask {
    /// Listens, and starts the task that keeps listening.
    ///
    /// # Errors
    /// `Unavailable` when the first `LISTEN` fails or does not finish within the call
    /// deadline.
    pub(crate) async fn start<S: Sink>(spec: Spec<S>) -> baton_core::Result<Self> {
        let source = Source::new(spec);
        let connection = source.listen().await?;
        Ok(ListenTask(tokio::spawn(run(source, connection))))
    }

    /// Starts the task that connects (retrying as after a loss, without its events), calls
    /// [`Sink::listening`] once it listens, and keeps listening. Must run in a runtime.
    pub(crate) fn spawn<S: Sink>(spec: Spec<S>) -> Self {
        let source = Source::new(spec);
        ListenTask(tokio::spawn(async move {
            let connection = source.reconnect().await;
            source.sink.listening();
            run(source, connection).await
        }))
    }
}

impl<S: Sink> Source<S> {
    fn new(spec: Spec<S>) -> Self {
        Source {
            connect: spec.connect.application_name(spec.application),
            heartbeat_channel: format!("{}{:016x}", spec.heartbeat_prefix, rand::random::<u64>()),
            pool: spec.pool,
            unnamed: spec.unnamed,
            options: spec.options,
            server: spec.server,
            application: spec.application,
            channel: spec.channel,
            addressed: spec.addressed,
            sink: spec.sink,
        }
    }
}

struct Source<S> {
    connect: PgConnectOptions,
    heartbeat_channel: String,
    pool: PgPool,
    unnamed: bool,
    options: PostgresOptions,
    server: String,
    application: &'static str,
    channel: &'static str,
    addressed: Option<&'static str>,
    sink: Arc<S>,
}

/// One listening connection: its receiving task hands each notification of the channel to
/// the sink, forwards every other notification (heartbeats), and ends (with the reason)
/// when the connection is lost.
struct Connection {
    /// `(channel, payload)` of each notification not for the sink, or why the connection
    /// was lost.
    payloads: mpsc::UnboundedReceiver<Result<(String, String), String>>,
    receiver: JoinHandle<()>,
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.receiver.abort();
    }
}

impl Connection {
    /// Stops the receiving task and waits until it has stopped, so that it hands nothing
    /// more to the sink.
    async fn close(mut self) {
        self.receiver.abort();
        let _ = (&mut self.receiver).await;
    }
}

async fn run<S: Sink>(source: Source<S>, mut connection: Connection) {
    loop {
        let why = source.serve(&mut connection).await;
        connection.close().await;
        source.sink.lost(&source.server, &why);
        connection = source.reconnect().await;
        source.sink.restored(&source.server);
    }
}

impl<S: Sink> Source<S> {
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
                            .execute(Exec::new(&self.pool, self.unnamed)),
                    )
                    .await;
                    match sent {
                        Ok(Ok(_)) => outstanding = Some(beat),
                        Ok(Err(e)) => tracing::debug!(
                            error = %e,
                            application = self.application,
                            "heartbeat notification not sent"
                        ),
                        Err(_) => tracing::debug!(
                            application = self.application,
                            "heartbeat notification not sent in time"
                        ),
                    }
                }
            }
        }
    }

    /// Listens again, retrying until it works: at once, then with a doubling backoff.
    async fn reconnect(&self) -> Connection {
        let mut backoff = RECONNECT.attempts();
        loop {
            match self.listen().await {
                Ok(connection) => return connection,
                Err(e) => {
                    tracing::debug!(
                        error = %e,
                        retry_in = ?backoff.peek(),
                        application = self.application,
                        "LISTEN reconnect failed"
                    );
                }
            }
            sleep(backoff.next_delay()).await;
        }
    }

    /// Opens a connection of its own (a pool of one, which the listener keeps), `LISTEN`s on
    /// the channel and the heartbeat channel, and starts the receiving task.
    async fn listen(&self) -> baton_core::Result<Connection> {
        let what = format!("LISTEN {}", self.channel);
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
                .listen_all([self.channel, self.heartbeat_channel.as_str()])
                .await?;
            let pid: i32 = sqlx::query_scalar(sql::BACKEND_PID)
                .fetch_one(&mut listener)
                .await?;
            let addressed = self.addressed.map(|prefix| format!("{prefix}{pid}"));
            if let Some(addressed) = &addressed {
                listener.listen(addressed).await?;
            }
            Ok::<_, sqlx::Error>((listener, pid, addressed))
        };
        let (listener, addressed) = match timeout(deadline, listening).await {
            Ok(Ok((listener, pid, addressed))) => {
                self.sink.connected(pid);
                (listener, addressed)
            }
            Ok(Err(e)) => return Err(sql_error(e, &what, &self.server)),
            Err(_) => return Err(timed_out(&what, &self.server, deadline)),
        };
        let (sender, payloads) = mpsc::unbounded_channel();
        let receiver = tokio::spawn(receive(
            listener,
            self.channel,
            addressed,
            Arc::clone(&self.sink),
            sender,
        ));
        Ok(Connection { payloads, receiver })
    }
}

/// Hands each notification of `channel` (and of `addressed`) to the sink and forwards every
/// other notification,
/// until the connection is lost. The sink is called here, not from the serving task: for
/// release wake-ups it is the handoff's path, and a hop through another task would add a
/// task wake-up to every handoff. `try_recv` is never cancelled here (it may lose part of a
/// message if it were); the task is aborted only when the connection is given up.
async fn receive<S: Sink>(
    mut listener: PgListener,
    channel: &'static str,
    addressed: Option<String>,
    sink: Arc<S>,
    sender: mpsc::UnboundedSender<Result<(String, String), String>>,
) {
    loop {
        let message = match listener.try_recv().await {
            Ok(Some(notification))
                if notification.channel() == channel
                    || addressed.as_deref() == Some(notification.channel()) =>
            {
                sink.notify(notification.payload());
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
