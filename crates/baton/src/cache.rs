//! The cache: [`Baton::cache`] and the types it hands out (re-exported from `baton-core`).
//!
//! `memory://` caches within the process, `sqlite://` in the store's file (table
//! `baton_cache`), `redis://` as plain keys with Redis's expiry, `postgres://` in the
//! `UNLOGGED` table `baton_cache`. See `docs/cache.md`.

use std::sync::Arc;

use crate::{Baton, Result};
pub use baton_core::cache::{Cache, CacheStore, FetchError, MAX_VALUE_BYTES};

impl Baton {
    /// The cache of this store, in this connection's namespace: typed JSON values with a
    /// TTL; a miss is fine, stale is fine, wrong is not.
    ///
    /// Cheap: every call hands out a client of the same values, and concurrent
    /// `get_or_fetch` calls for one key collapse across all of them.
    ///
    /// # Errors
    /// `Unsupported` when the store keeps no cache (a store of your own given to
    /// [`Baton::from_store`] that offers none).
    ///
    /// # Examples
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    ///
    /// let baton = baton::connect("memory://").await?;
    /// let cache = baton.cache()?;
    /// cache.set("user:42:name", "Ada", Duration::from_secs(60)).await?;
    /// assert_eq!(cache.get::<String>("user:42:name").await?.as_deref(), Some("Ada"));
    /// # Ok(()) }
    /// ```
    pub fn cache(&self) -> Result<Cache> {
        let store = Arc::clone(self.store()).cache_store()?;
        Ok(Cache::with_namespace(store, self.namespace().clone()))
    }
}
