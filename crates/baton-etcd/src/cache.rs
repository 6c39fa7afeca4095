//! The cache on etcd: a value is a key attached to an etcd lease of its own, so the cluster
//! expires it.
//!
//! The qualified key `Q` (`<namespace>:cache:<key>`) is the etcd key `Q`, holding the value's
//! JSON, attached to a lease whose TTL is the value's rounded up to whole seconds (etcd's
//! leases are whole seconds, and the cluster may raise one to its minimum lease TTL).
//!
//! - `get`: one read.
//! - `set`: a lease is granted, then one put on it, which also answers the value it replaced;
//!   that value's lease, now without keys, is revoked in the background.
//! - `delete`: one delete, which answers whether a value was there; its lease is revoked in
//!   the background.
//!
//! ## Behavior
//! - A value is never gone before its TTL; it may be read for up to about a second and a half
//!   after it (the rounding to whole seconds, and the leader's periodic sweep of expired
//!   leases): stale, never wrong.
//! - Each `set` is two requests through the cluster's consensus (the lease grant and the put),
//!   so etcd suits caches of values that are read far more often than written.
//! - A value larger than the cluster accepts in one request (etcd's `--max-request-bytes`,
//!   1.5 MiB by default) is `InvalidInput`, and nothing is stored.
//! - Store faults are `Unavailable` (callers treat them as a miss); a request that may have
//!   reached the cluster is not sent twice.

use async_trait::async_trait;
use baton_core::{CacheStore, Result, StoreKey, Ttl};
use etcd_client::{DeleteOptions, PutOptions};

use crate::EtcdStore;
use crate::grants::lease_seconds;

#[async_trait]
impl CacheStore for EtcdStore {
    async fn get(&self, key: &StoreKey) -> Result<Option<Vec<u8>>> {
        let mut answer = self
            .get(&format!("cache get of {key}"), key.as_str(), None)
            .await?;
        Ok(answer
            .take_kvs()
            .into_iter()
            .next()
            .map(|kv| kv.value().to_vec()))
    }

    async fn set(&self, key: &StoreKey, value: Vec<u8>, ttl: Ttl) -> Result<()> {
        let what = format!("cache set of {key}");
        let lease = self.grant_lease(lease_seconds(ttl)).await?;
        let put = self
            .call(&what, || {
                let mut kv = self.client.kv_client();
                let options = PutOptions::new().with_lease(lease).with_prev_key();
                let (key, value) = (key.as_str().to_owned(), value.clone());
                async move { kv.put(key, value, Some(options)).await }
            })
            .await;
        let mut put = match put {
            Ok(put) => put,
            Err(e) => {
                self.revoke_in_background(lease);
                return Err(e);
            }
        };
        if let Some(replaced) = put.take_prev_key().filter(|kv| kv.lease() != 0) {
            self.revoke_in_background(replaced.lease());
        }
        Ok(())
    }

    async fn delete(&self, key: &StoreKey) -> Result<bool> {
        let what = format!("cache delete of {key}");
        let mut deleted = self
            .call(&what, || {
                let mut kv = self.client.kv_client();
                let key = key.as_str().to_owned();
                async move {
                    kv.delete(key, Some(DeleteOptions::new().with_prev_key()))
                        .await
                }
            })
            .await?;
        let removed = deleted.take_prev_kvs();
        for kv in removed.iter().filter(|kv| kv.lease() != 0) {
            self.revoke_in_background(kv.lease());
        }
        Ok(!removed.is_empty())
    }
}
