//! The cache on Redis: `GET`, `SET ... PX` and `DEL` on the multiplexed connection (on a
//! cluster, on the master of the key's slot).
//!
//! A qualified key `Q` (`<namespace>:cache:<key>`) is stored as the Redis string `Q`
//! itself, holding the value's JSON, with Redis's own expiry.
//!
//! ## Behavior
//! - Every call answers within `connect_timeout + response_timeout` or fails with
//!   `Unavailable` (fail fast: callers treat it as a miss). Calls are not retried.
//! - Cache keys may be evicted under memory pressure like any other key (a miss), unlike
//!   lock keys; run caches and locks on one server only with `noeviction` (see
//!   `docs/redis.md`) or accept that caches then fill memory until their TTLs.

use async_trait::async_trait;
use baton_core::{CacheStore, Result, StoreKey, Ttl};

use crate::locks::RedisStore;

// The commands, built once for the single server's store and a cluster store alike (a
// cluster routes each by its one key).

/// `GET Q`.
pub(crate) fn get_cmd(key: &StoreKey) -> redis::Cmd {
    let mut get = redis::cmd("GET");
    get.arg(key.as_str());
    get
}

/// `SET Q value PX ttl`.
pub(crate) fn set_cmd(key: &StoreKey, value: Vec<u8>, ttl: Ttl) -> redis::Cmd {
    let mut set = redis::cmd("SET");
    set.arg(key.as_str())
        .arg(value)
        .arg("PX")
        .arg(ttl.as_millis());
    set
}

/// `DEL Q`.
pub(crate) fn del_cmd(key: &StoreKey) -> redis::Cmd {
    let mut del = redis::cmd("DEL");
    del.arg(key.as_str());
    del
}

#[async_trait]
impl CacheStore for RedisStore {
    async fn get(&self, key: &StoreKey) -> Result<Option<Vec<u8>>> {
        let mut conn = self.connection();
        let get = get_cmd(key);
        let reply = get.query_async::<Option<Vec<u8>>>(&mut conn);
        self.within(&format!("cache get of {key}"), reply).await
    }

    async fn set(&self, key: &StoreKey, value: Vec<u8>, ttl: Ttl) -> Result<()> {
        let mut conn = self.connection();
        let set = set_cmd(key, value, ttl);
        let reply = set.query_async::<()>(&mut conn);
        self.within(&format!("cache set of {key}"), reply).await
    }

    async fn delete(&self, key: &StoreKey) -> Result<bool> {
        let mut conn = self.connection();
        let del = del_cmd(key);
        let reply = del.query_async::<i64>(&mut conn);
        Ok(self
            .within(&format!("cache delete of {key}"), reply)
            .await?
            == 1)
    }
}
