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

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, PoisonError, RwLock};

use baton_core::telemetry::{self, events};
use redis::Client;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};

/// The current connection and how to open another.
pub(crate) struct Link {
    current: RwLock<ConnectionManager>,
    client: Client,
    config: ConnectionManagerConfig,
    replacing: AtomicBool,
    /// The server, as events name it (password redacted).
    server: String,
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Link")
            .field("server", &self.server)
            .field("replacing", &self.replacing.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl Link {
    /// Wraps `conn`, opened from `client` with `config`.
    pub(crate) fn new(
        conn: ConnectionManager,
        client: Client,
        config: ConnectionManagerConfig,
        server: String,
    ) -> Arc<Link> {
        Arc::new(Link {
            current: RwLock::new(conn),
            client,
            config,
            replacing: AtomicBool::new(false),
            server,
        })
    }

    /// The connection to send on now.
    pub(crate) fn get(&self) -> ConnectionManager {
        self.current
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// A request on the connection went unanswered within `response_timeout`: opens a new
    /// connection in the background and swaps it in, unless a replacement is under way.
    pub(crate) fn timed_out(self: &Arc<Self>) {
        if self.replacing.swap(true, Ordering::AcqRel) {
            return;
        }
        let link = Arc::clone(self);
        tokio::spawn(async move {
            match ConnectionManager::new_with_config(link.client.clone(), link.config.clone()).await
            {
                Ok(conn) => {
                    *link.current.write().unwrap_or_else(PoisonError::into_inner) = conn;
                    telemetry::emit(
                        &events::STORE_CONNECTION_REPLACED,
                        None,
                        format_args!(
                            "a request to redis at {} went unanswered past response_timeout; the store opened a new connection and uses it from now on",
                            link.server
                        ),
                    );
                }
                Err(error) => tracing::debug!(
                    server = %link.server,
                    %error,
                    "could not open a replacement connection; the next timeout tries again"
                ),
            }
            link.replacing.store(false, Ordering::Release);
        });
    }
}
