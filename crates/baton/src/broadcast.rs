//! Broadcast: [`Baton::broadcast`] and the types it hands out (re-exported from
//! `baton-core`).
//!
//! `redis://` broadcasts to every process subscribed on the server (pub/sub, over one
//! dedicated connection per store), `postgres://` to every process on the database
//! (`LISTEN`/`NOTIFY`, messages up to about 7,400 bytes); `memory://` within the process. `sqlite://` cannot push
//! to other processes and says so when asked (see `docs/broadcast.md` and
//! `dev/decisions.md`). Delivery is at most once, and subscribers are told about losses.

use std::sync::Arc;

use crate::{Baton, Result};
pub use baton_core::broadcast::{
    Broadcast, BroadcastStore, DEFAULT_CAPACITY, Event, MAX_CAPACITY, MAX_MESSAGE_BYTES, Message,
    PublisherId, SubscribeOptions, Subscription,
};

impl Baton {
    /// A broadcast client of this store, in this connection's namespace: publish to every
    /// subscriber of a channel, at most once.
    ///
    /// Cheap: every call (on this `Baton` or a clone of it) hands out the same publisher, made
    /// at the first call: one publisher id and one sequence of numbers, so subscribers see
    /// one publisher per connection. Subscriptions of every handle on one store share one
    /// connection.
    ///
    /// # Errors
    /// `Unsupported` for a store that cannot push messages to other processes: the SQLite
    /// store (processes on one file have no channel to wake each other), a PostgreSQL store
    /// opened with `listen=off`, or a store of your own given to [`Baton::from_store`] that
    /// cannot. The message names the stores that can.
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
        if let Some(broadcast) = self.broadcast.get() {
            return Ok(broadcast.clone());
        }
        let store = Arc::clone(self.store()).broadcast_store()?;
        Ok(self
            .broadcast
            .get_or_init(|| Broadcast::with_namespace(store, self.namespace().clone()))
            .clone())
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
        for part in ["SQLite", "push", "redis://", "postgres://", "memory://"] {
            assert!(err.message().contains(part), "{part}: {err}");
        }
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
        let baton = crate::testing::locks_only();
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
    async fn one_baton_has_one_publisher() {
        let baton = crate::connect("memory://").await.unwrap();
        let first = baton.broadcast().unwrap();
        let again = baton.broadcast().unwrap();
        let clone = baton.clone().broadcast().unwrap();
        assert_eq!(first.publisher(), again.publisher());
        assert_eq!(first.publisher(), clone.publisher());
        let mut sub = first.subscribe::<u8>("c").await.unwrap();
        for (n, handle) in [&first, &again, &clone].into_iter().enumerate() {
            handle.publish("c", &(n as u8)).await.unwrap();
        }
        let mut seqs = Vec::new();
        for n in 0..3u8 {
            match sub.next().await {
                Some(crate::broadcast::Event::Message(m)) => {
                    assert_eq!((m.publisher, m.payload), (first.publisher(), n));
                    seqs.push(m.seq);
                }
                other => panic!("expected message {n}, got {other:?}"),
            }
        }
        assert!(
            seqs.windows(2).all(|w| w[1] == w[0] + 1),
            "one sequence: {seqs:?}"
        );
        let other = crate::Baton::from_store(
            std::sync::Arc::clone(
                baton
                    .store_as::<crate::store::MemoryStore>()
                    .as_ref()
                    .unwrap(),
            ),
            baton.namespace().clone(),
        );
        assert_ne!(
            other.broadcast().unwrap().publisher(),
            first.publisher(),
            "another Baton, another publisher"
        );
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
