//! The store's multiplexed connection, replaced when it stops answering.
//!
//! The redis crate's `ConnectionManager` opens a new connection when its connection breaks
//! (an I/O error, a reset, the server closing it), but not when the connection merely goes
//! silent: a NAT or load balancer that dropped its state, or a proxy whose upstream session
//! hung, leaves a socket that accepts requests and never answers, and every request then
//! runs into `response_timeout`, for as long as the process lives. So a request that timed
//! out makes the store open a new connection in the background and send everything on it
//! from then on, emitting
//! [`baton.store.connection_replaced`](baton_core::telemetry::events::STORE_CONNECTION_REPLACED).
//!
//! ## Behavior
//! - One replacement at a time: the requests that time out meanwhile start none of their
//!   own. A replacement that cannot connect is only logged; the next timeout tries again.
//! - Requests in flight on the old connection end with an error when it closes (the last
//!   clone of its manager is dropped): a timed-out call was already answered `Unavailable`.
//! - A slow server costs a reconnect per timeout, nothing more: scripts stay in the server's
//!   cache, and `NOSCRIPT` reloads them where they are not.
//! - Through Sentinel the store follows the primary: a request that found its connection
//!   refused, dropped, timed out or read-only (the old primary died, or came back as a
//!   replica) makes the store ask the sentinels again, every 100 ms until they name a
//!   primary that answers as one, and open its connection there; when that is another server it emits
//!   [`baton.redis.primary_changed`](baton_core::telemetry::events::REDIS_PRIMARY_CHANGED).
//!   The calls made meanwhile fail with `Unavailable`, which the core's waiting and
//!   keep-alive retry; a keep-alive whose grant is not on the new primary fires `lost()`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use baton_core::telemetry::{self, events};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{ErrorKind, RedisError, ServerErrorKind};

use crate::endpoint::{Endpoint, Opened};
use crate::options::RedisOptions;

/// How long a failed search for the primary keeps the next one from starting: during a
/// failover every call fails, and each would otherwise ask the sentinels again.
const SEARCH_PAUSE: Duration = Duration::from_millis(100);

/// The current connection and how to open another.
pub(crate) struct Link {
    /// The connection, and the `host:port` of its server.
    current: RwLock<(ConnectionManager, String)>,
    endpoint: Endpoint,
    config: ConnectionManagerConfig,
    options: RedisOptions,
    replacing: AtomicBool,
    /// Woken when the connection moved to another server (a failover followed).
    moved: tokio::sync::Notify,
    /// The server, as events name it (password redacted).
    server: String,
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Link")
            .field("server", &self.server)
            .field("address", &self.address())
            .field("replacing", &self.replacing.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// Why the connection is replaced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cause {
    /// A request went unanswered past `response_timeout`.
    Silent,
    /// Through Sentinel: a request found the connection refused, dropped or read-only.
    Failover,
}

impl Link {
    /// Wraps the connection `opened` from `endpoint` with `config`.
    pub(crate) fn new(
        opened: Opened,
        endpoint: Endpoint,
        config: ConnectionManagerConfig,
        options: RedisOptions,
        server: String,
    ) -> Arc<Link> {
        Arc::new(Link {
            current: RwLock::new((opened.conn, opened.address)),
            endpoint,
            config,
            options,
            replacing: AtomicBool::new(false),
            moved: tokio::sync::Notify::new(),
            server,
        })
    }

    /// The connection to send on now.
    pub(crate) fn get(&self) -> ConnectionManager {
        self.current
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .0
            .clone()
    }

    /// The `host:port` of the server the connection goes to.
    pub(crate) fn address(&self) -> String {
        self.current
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .1
            .clone()
    }

    /// Resolves when the connection next moves to another server (the primary changed).
    pub(crate) async fn moved(&self) {
        self.moved.notified().await;
    }

    /// Where the store's connections go.
    pub(crate) fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// A request on the connection went unanswered within `response_timeout`: opens a new
    /// connection in the background and swaps it in, unless a replacement is under way.
    pub(crate) fn timed_out(self: &Arc<Self>) {
        self.replace(Cause::Silent);
    }

    /// A request failed with `error`. Through Sentinel, an error that says the server is
    /// gone or is no longer the primary makes the store look for the primary again.
    pub(crate) fn failed(self: &Arc<Self>, error: &RedisError) {
        if !self.endpoint.follows_sentinel() {
            return;
        }
        let moved = error.is_io_error()
            || error.is_connection_refusal()
            || error.is_connection_dropped()
            || error.is_timeout()
            || matches!(
                error.kind(),
                ErrorKind::Server(ServerErrorKind::ReadOnly | ServerErrorKind::MasterDown)
            )
            || matches!(error.code(), Some("READONLY" | "MASTERDOWN"));
        if moved {
            self.replace(Cause::Failover);
        }
    }

    fn replace(self: &Arc<Self>, cause: Cause) {
        if self.replacing.swap(true, Ordering::AcqRel) {
            return;
        }
        // The task holds the link weakly: a store dropped during an outage stops it.
        let weak = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                let Some(link) = weak.upgrade() else { return };
                match link.reopen(cause).await {
                    Ok(()) => break,
                    // Through Sentinel, keep looking until the sentinels name a primary
                    // that answers: the calls that fail meanwhile need not drive it.
                    Err(()) if cause == Cause::Failover => {
                        drop(link);
                        tokio::time::sleep(SEARCH_PAUSE).await;
                    }
                    Err(()) => break,
                }
            }
            if let Some(link) = weak.upgrade() {
                link.replacing.store(false, Ordering::Release);
            }
        });
    }

    /// Opens a new connection and swaps it in, saying so.
    async fn reopen(&self, cause: Cause) -> Result<(), ()> {
        let before = self.address();
        match self
            .endpoint
            .open(&self.config, &self.options, &self.server)
            .await
        {
            Ok(opened) => {
                let address = opened.address.clone();
                *self.current.write().unwrap_or_else(PoisonError::into_inner) =
                    (opened.conn, opened.address);
                if address != before {
                    self.moved.notify_waiters();
                    telemetry::emit(
                        &events::REDIS_PRIMARY_CHANGED,
                        None,
                        format_args!(
                            "redis at {}: the primary moved from {before} to {address} (a failover); the store sends everything there from now on",
                            self.server
                        ),
                    );
                } else if cause == Cause::Silent {
                    telemetry::emit(
                        &events::STORE_CONNECTION_REPLACED,
                        None,
                        format_args!(
                            "a request to redis at {} went unanswered past response_timeout; the store opened a new connection and uses it from now on",
                            self.server
                        ),
                    );
                }
                Ok(())
            }
            Err(error) => {
                tracing::debug!(
                    server = %self.server,
                    %error,
                    "could not open a replacement connection; trying again"
                );
                Err(())
            }
        }
    }
}
