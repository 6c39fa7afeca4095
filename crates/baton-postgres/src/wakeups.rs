//! The LISTEN connection that turns release notifications into wake-ups, and hand-overs
//! into grants ([`crate::handoff`]).
//!
//! Each store keeps one connection of its own (outside its pool, `application_name`
//! [`LISTENER_APPLICATION`], kept up by the loop it shares with broadcast) that `LISTEN`s on [`CHANNEL`](crate::sql::CHANNEL) for as long
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
//!   at once, then with a jittered backoff doubling from 50ms to 2s. The new connection `LISTEN`s
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
use baton_core::signals::{Handoffs, ReleaseHub};
use baton_core::telemetry::{self, events};
use sqlx::PgPool;
use sqlx::postgres::PgConnectOptions;

use crate::connection::Db;
use crate::handoff;
use crate::listener::{ListenTask, Sink, Spec};
use crate::options::PostgresOptions;
use crate::semaphore;
use crate::sql;

/// How often the LISTEN connection is checked with a heartbeat notification.
pub const HEARTBEAT_EVERY: Duration = Duration::from_secs(5);

/// The `application_name` of every listener connection, to find it in
/// `pg_stat_activity`.
pub const LISTENER_APPLICATION: &str = "baton-listen";

/// The store's LISTEN connection and its task. Dropping it stops the task and closes the
/// connection.
#[derive(Debug)]
pub(crate) struct Listener {
    wakeups: Arc<Wakeups>,
    _task: ListenTask,
}

/// What a [`Listener`] connects to and feeds.
pub(crate) struct ListenerSpec {
    /// Where the LISTEN connection goes: the store's server or its `listen_url`.
    pub(crate) connect: PgConnectOptions,
    /// The store's pool, which sends the heartbeats.
    pub(crate) pool: PgPool,
    /// Whether the pool's statements run unnamed (behind a transaction pooler).
    pub(crate) unnamed: bool,
    /// The hub whose waiters the notifications wake.
    pub(crate) hub: Arc<ReleaseHub>,
    /// The store's hand-overs, which read the hand-over notifications.
    pub(crate) handoffs: Arc<Handoffs>,
    /// The store's pool and options, for statements the notifications call for.
    pub(crate) db: Db,
    /// The store's options.
    pub(crate) options: PostgresOptions,
    /// The LISTEN connection's server, as messages name it.
    pub(crate) server: String,
}

impl ListenerSpec {
    fn split(self, healthy: bool) -> (Arc<Wakeups>, Spec<Wakeups>) {
        let wakeups = Arc::new(Wakeups {
            hub: self.hub,
            handoffs: self.handoffs,
            db: self.db,
            healthy: AtomicBool::new(healthy),
        });
        let spec = Spec {
            connect: self.connect,
            pool: self.pool,
            unnamed: self.unnamed,
            options: self.options,
            server: self.server,
            application: LISTENER_APPLICATION,
            channel: sql::CHANNEL,
            addressed: Some(sql::HANDOFF_CHANNEL),
            heartbeat_prefix: "baton_heartbeat_",
            sink: Arc::clone(&wakeups),
        };
        (wakeups, spec)
    }
}

impl Listener {
    /// Listens and starts the task that feeds the hub.
    ///
    /// # Errors
    /// `Unavailable` when the first `LISTEN` fails: a store that cannot push wake-ups says
    /// so at connect.
    pub(crate) async fn start(spec: ListenerSpec) -> baton_core::Result<Self> {
        let (wakeups, spec) = spec.split(true);
        let task = ListenTask::start(spec).await?;
        Ok(Listener {
            wakeups,
            _task: task,
        })
    }

    /// Starts the task that connects and then feeds the hub, without waiting for it: the
    /// listener is not healthy until its first `LISTEN` worked. Must run in a runtime.
    pub(crate) fn spawn(spec: ListenerSpec) -> Self {
        let (wakeups, spec) = spec.split(false);
        Listener {
            wakeups,
            _task: ListenTask::spawn(spec),
        }
    }

    /// Whether the connection is listening now.
    pub(crate) fn is_healthy(&self) -> bool {
        self.wakeups.healthy.load(Ordering::Acquire)
    }
}

/// Turns release notifications into wake-ups, and a lost connection into a re-check by
/// every waiter.
#[derive(Debug)]
struct Wakeups {
    hub: Arc<ReleaseHub>,
    handoffs: Arc<Handoffs>,
    /// The store's pool, to pass on a permit reserved for a store with no waiter for it.
    db: Db,
    healthy: AtomicBool,
}

impl Sink for Wakeups {
    fn notify(&self, payload: &str) {
        if handoff::is_handover(payload) {
            handoff::arrived(&self.handoffs, payload);
        } else if let Some(key) = semaphore::reserved_key(payload) {
            if self.hub.has_waiters(&key) {
                self.hub.notify(&key);
            } else if let Some(pid) = handoff::pid(&self.handoffs) {
                semaphore::pass(self.db.clone(), key, pid);
            }
        } else if !payload.is_empty() {
            self.hub.notify(&StoreKey::from_stored(payload.to_owned()));
        }
    }

    fn connected(&self, pid: i32) {
        handoff::connected(&self.handoffs, pid);
    }

    fn lost(&self, server: &str, why: &str) {
        self.healthy.store(false, Ordering::Release);
        self.handoffs.disconnected();
        telemetry::emit(
            &events::STORE_PUSH_LOST,
            None,
            format_args!(
                "LISTEN connection to {server} lost ({why}); waiters re-check now and fall back to TTL timers and polling until it is back"
            ),
        );
        self.hub.notify_all();
    }

    fn listening(&self) {
        self.healthy.store(true, Ordering::Release);
        // Waiters that began while there was no connection poll; a re-check now costs one
        // statement each and finds a release notified before the LISTEN.
        self.hub.notify_all();
    }

    fn restored(&self, server: &str) {
        self.healthy.store(true, Ordering::Release);
        telemetry::emit(
            &events::STORE_PUSH_RESTORED,
            None,
            format_args!(
                "LISTEN connection to {server} is listening again on {}; waiters re-check for releases missed in the gap",
                sql::CHANNEL
            ),
        );
        self.hub.notify_all();
    }
}
