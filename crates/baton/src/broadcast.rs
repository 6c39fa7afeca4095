//! Broadcast: [`Baton::broadcast`] and the types it hands out (re-exported from
//! `baton-core`).
//!
//! `redis://` broadcasts to every process subscribed on the server (pub/sub, over one
//! dedicated connection per store), `postgres://` to every process on the database
//! (`LISTEN`/`NOTIFY`, messages up to about 7,400 bytes); `memory://` within the process. `sqlite://` cannot push
//! to other processes and says so when asked (see `docs/broadcast.md` and
//! `docs/decisions.md`). Delivery is at most once, and subscribers are told about losses.

use std::sync::Arc;

pub use baton_core::broadcast::{
    Broadcast, BroadcastStore, DEFAULT_CAPACITY, Event, MAX_CAPACITY, MAX_MESSAGE_BYTES, Message,
    PublisherId, SubscribeOptions, Subscription,
};
use baton_core::{Error, Result};

use crate::{Backend, Baton};

/// The stores that can broadcast, for error messages.
const BROADCAST_STORES: &str =
    "redis:// (every process on the server) or memory:// (this process only)";

impl Baton {
    /// A broadcast client of this store, in this connection's namespace: publish to every
    /// subscriber of a channel, at most once.
    ///
    /// Each call hands out a new publisher (its own id and sequence numbers); keep one per
    /// process and clone it. Subscriptions of every handle on one store share one
    /// connection.
    ///
    /// # Errors
    /// `Unsupported` for a store that cannot push messages to other processes: the SQLite
    /// store (processes on one file have no channel to wake each other), or a custom lease
    /// store given to [`Baton::from_store`]. The message names the stores that can.
    ///
    /// # Examples
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use baton::broadcast::Event;
    ///
    /// let baton = baton::connect("memory://").await?;
    /// let broadcast = baton.broadcast()?;
    /// let mut invalidations = broadcast.subscribe::<String>("ancestry-invalidate").await?;
    /// broadcast.publish("ancestry-invalidate", "org-42").await?;
    /// if let Some(Event::Message(m)) = invalidations.next().await {
    ///     assert_eq!(m.payload, "org-42");
    /// }
    /// # Ok(()) }
    /// ```
    pub fn broadcast(&self) -> Result<Broadcast> {
        let store: Arc<dyn BroadcastStore> = match self.backend() {
            Backend::Memory(store) => store.clone(),
            #[cfg(feature = "redis")]
            Backend::Redis(store) => store.clone(),
            #[cfg(feature = "postgres")]
            Backend::Postgres(store) => {
                if !store.options().get_listen() {
                    return Err(Error::unsupported(format!(
                        "this PostgreSQL store was opened with listen=off (for a transaction-pooling proxy), so it cannot receive broadcasts; open it with a direct connection, or use {BROADCAST_STORES}"
                    )));
                }
                store.clone()
            }
            #[cfg(feature = "sqlite")]
            Backend::Sqlite(_) => {
                return Err(Error::unsupported(format!(
                    "the SQLite store cannot broadcast: it has no way to push a message to other processes on the file (polling a table would turn at-most-once delivery into a delayed, unbounded log); use {BROADCAST_STORES}"
                )));
            }
            #[allow(unreachable_patterns)]
            other => {
                return Err(Error::unsupported(format!(
                    "the {} store cannot broadcast; use {BROADCAST_STORES}",
                    other.scheme()
                )));
            }
        };
        Ok(Broadcast::with_namespace(store, self.namespace().clone()))
    }
}

#[cfg(test)]
mod tests {
    #[tokio::test]
    async fn sqlite_says_unsupported_and_names_the_stores_that_can() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}/b.db", dir.path().display());
        let baton = crate::connect(&url).await.unwrap();
        let err = baton.broadcast().unwrap_err();
        assert_eq!(err.kind(), crate::ErrorKind::Unsupported);
        assert!(err.message().contains("redis://"), "{err}");
        assert!(
            baton
                .rate_limiter(
                    crate::limit::Quota::new(1, std::time::Duration::from_secs(1)).unwrap()
                )
                .is_ok()
        );
        assert!(baton.cache().is_ok());
    }

    #[tokio::test]
    async fn a_custom_store_offers_locks_only() {
        let baton = crate::Baton::from_store(
            std::sync::Arc::new(crate::MemoryStore::new()),
            crate::Namespace::default(),
        );
        for err in [
            baton.broadcast().unwrap_err(),
            baton
                .rate_limiter(
                    crate::limit::Quota::new(1, std::time::Duration::from_secs(1)).unwrap(),
                )
                .unwrap_err(),
            baton.cache().unwrap_err(),
        ] {
            assert_eq!(err.kind(), crate::ErrorKind::Unsupported, "{err}");
            assert!(err.message().contains("custom"), "{err}");
        }
    }

    #[tokio::test]
    async fn every_handle_on_a_memory_store_shares_its_state() {
        let baton = crate::connect("memory://").await.unwrap();
        let window = std::time::Duration::from_secs(60);
        let quota = crate::limit::Quota::new(2, window).unwrap();
        let first = baton.rate_limiter(quota).unwrap();
        assert!(first.try_acquire("k", 2).await.unwrap().allowed);
        let second = baton.rate_limiter(quota).unwrap();
        assert!(!second.try_acquire("k", 1).await.unwrap().allowed);
        let mut sub = baton
            .broadcast()
            .unwrap()
            .subscribe::<u8>("c")
            .await
            .unwrap();
        baton.broadcast().unwrap().publish("c", &7u8).await.unwrap();
        assert!(
            matches!(sub.next().await, Some(crate::broadcast::Event::Message(m)) if m.payload == 7)
        );
        baton.cache().unwrap().set("k", &1u8, window).await.unwrap();
        assert_eq!(
            baton.cache().unwrap().get::<u8>("k").await.unwrap(),
            Some(1)
        );
    }
}
