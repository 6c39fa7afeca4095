//! The Redis store of baton: locks and leases as Lua-script atoms on one Redis server, with
//! pub/sub wake-ups. Not for direct use; see `baton`, which opens it for `redis://` and
//! `rediss://` URLs.
//!
//! Use it when the processes to exclude run on several hosts and a Redis server is already
//! part of the deployment. Expiry is decided by Redis, fences never fall below the server
//! clock so they keep increasing across restarts and promotions, and waiting processes take turns: a release
//! hands the key to the one that waited longest. Like every single-primary Redis lock it is
//! best-effort under failover: read the trade-offs in `docs/redis.md` before you rely on it.
//!
//! - [`RedisStore`]: the store; [`RedisOptions`]: its timeouts.
//! - [`RedisClusterStore`]: every primitive on a Redis Cluster (`redis+cluster://`); what
//!   it does not do yet is in [`cluster`]; [`sharded`]: how its waiters are woken over
//!   sharded pub/sub, and its broadcast.
//! - [`scripts`]: the Lua scripts it runs, for operators and benchmarks.
//! - [`idempotency`]: the idempotency log's record layout and scripts.
//! - [`wakeups`]: who a release wakes (the queue of waiting processes, handoffs), and what
//!   happens when pub/sub drops.
//! - [`limit`], [`cache`], [`broadcast`]: rate limits (one script), the cache, and
//!   broadcast over a dedicated pub/sub connection.
//! - Semaphores: the permits of a key in a sorted set beside their fences, one script per
//!   operation, fences from the lock's counter, and the lock's queue of waiting stores.
//! - [`ServerInfo`]: what the store checks about its server (the eviction policy).
//! - [`doctor`]: what `baton doctor` reads about a server.
//!
//! The user guide page is `docs/redis.md`.

#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

pub mod broadcast;
pub mod cache;
pub mod cluster;
mod connection;
pub mod doctor;
mod endpoint;
mod error;
pub mod idempotency;
mod keys;
pub mod limit;
mod locks;
mod options;
pub mod scripts;
mod semaphore;
mod sentinel;
mod server;
pub mod sharded;
mod url;
pub mod wakeups;

pub use cluster::RedisClusterStore;
pub use locks::{FENCE_RETENTION, RedisStore};
pub use options::{
    DEFAULT_CONNECT_TIMEOUT, DEFAULT_RESPONSE_TIMEOUT, MAX_MIN_REPLICAS, RedisOptions,
};
pub use server::ServerInfo;

use baton_core::store::Store;

/// Every capability but claimable work: a Redis restart without persistence would lose
/// queued items silently, which is the failure claimable work exists to prevent.
impl Store for RedisStore {
    fn name(&self) -> &'static str {
        "Redis"
    }

    baton_core::offers!(
        rate_store,
        cache_store,
        broadcast_store,
        idempotency_store,
        semaphore_store
    );
}
