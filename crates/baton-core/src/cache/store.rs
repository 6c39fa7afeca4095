//! The cache store interface: get, set with a TTL, delete, of opaque bytes.
//!
//! Policy lives in [`Cache`](crate::Cache) (typed JSON values, validation, collapsing of
//! concurrent fetches, telemetry); a store keeps bytes under qualified keys and expires them
//! on its own clock.

use std::fmt;

use async_trait::async_trait;

use crate::error::Result;
use crate::key::StoreKey;
use crate::time::Ttl;

/// The cache atoms of one store. Object safe: a store hands itself out as an
/// `Arc<dyn CacheStore>` from [`Store::cache_store`](crate::store::Store::cache_store), which the
/// facade asks when a client is built.
///
/// # Contract
/// - `get` returns exactly the bytes of the last `set` of `key`, or `None` when there was
///   none, it was deleted, or its TTL (on the store's clock) has run out. Never another
///   key's bytes.
/// - `set` replaces the value and restarts the TTL; `delete` answers whether a live value
///   was removed.
/// - Store faults are errors of kind `Unavailable`.
#[async_trait]
pub trait CacheStore: Send + Sync + fmt::Debug + 'static {
    /// The live value of `key`.
    async fn get(&self, key: &StoreKey) -> Result<Option<Vec<u8>>>;

    /// Stores `value` under `key` for `ttl`.
    async fn set(&self, key: &StoreKey, value: Vec<u8>, ttl: Ttl) -> Result<()>;

    /// Removes `key`'s value; `true` when a live value was removed.
    async fn delete(&self, key: &StoreKey) -> Result<bool>;
}
