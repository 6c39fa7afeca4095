//! [`RedisClusterStore`]: locks and leases on a Redis Cluster, each key's lock scripts run on
//! the master that serves the key's slot.
//!
//! Every Redis key of one qualified key `Q` (the grant `{Q}`, its fence counter, its queue)
//! carries the hash tag `{Q}`, so they share one slot and one master (see the key layout in
//! `keys.rs`), and every lock script declares each key it touches: the cluster routes a
//! call by its declared keys, and a slot that moves between masters moves with all of them.
//! The scripts are the single-server store's, sent the same way (`EVALSHA`; after
//! `NOSCRIPT`, `SCRIPT LOAD` on the master of the key's slot, then `EVALSHA` again).
//!
//! ## Behavior
//! - The redis crate's cluster client discovers the cluster from the URL's seed nodes,
//!   keeps a connection per master, follows `MOVED` and `ASK`, and reads the slot map
//!   again when a master fails or a slot moves. A call that meets a failover is retried by
//!   the client (with short waits) within the store's call deadline
//!   (`connect_timeout + response_timeout`), after which it is `Unavailable`, as on one
//!   server; the core's waiting and keep-alive retry it.
//! - Fences follow the single-server rule: the larger of the key's counter plus one and the
//!   master's clock (`TIME`, microseconds). The counter is replicated with the grant, so a
//!   coordinated failover (`CLUSTER FAILOVER`) keeps fences increasing; after an abrupt one
//!   the promoted replica's clock keeps them increasing as long as it is not behind the
//!   old master's.
//! - Waiting polls. The single-server store wakes waiters of other processes through one
//!   pub/sub channel per store, published by the release script; on a cluster that script
//!   runs on the key's master, which can only publish to its own shard (`SPUBLISH`), not to
//!   a channel the waiting store listens on at another master. Until wake-ups go over
//!   sharded pub/sub per key, a waiter looks again every [`CLUSTER_POLL`] (and at once when
//!   a release in its own process frees the key), so a handoff between processes takes up
//!   to that long, and the claim never queues the store: there is no hand-over and no
//!   first-come order between processes.
//! - A release whose connection dropped may have been retried by the cluster client after
//!   it ran; it then answers that nobody held the key, which the core reports as a release
//!   after expiry. The lock was freed either way.
//! - Locks and leases only: the other capabilities answer `Unsupported` when a client is
//!   built, naming the cluster, and so does `min_replicas` (a `WAIT` on the key's master)
//!   when the store is opened.
//! - `list` scans every master in turn (`CLUSTER SLOTS`, then `SCAN` on each), then reads
//!   each grant it found; during a failover it may miss a grant or fail `Unavailable`.

use std::collections::BTreeSet;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use baton_core::idempotency::IdempotencyStore;
use baton_core::signals::ReleaseHub;
use baton_core::store::{
    Capability, Claim, HolderInfo, LeaseRequest, LeaseStore, Release, Renewal, Store, Wakeups,
};
use baton_core::{
    BroadcastStore, CacheStore, Error, Holder, RateStore, Result, SemaphoreStore, StoreKey, Ttl,
};
use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::io::tcp::TcpSettings;
use redis::{RedisError, RedisResult, Script, Value};
use tokio::time::timeout;

use crate::endpoint::tls_ready;
use crate::error::{redis_error, timed_out, unexpected};
use crate::keys;
use crate::locks::{holder_info, int, parse_claim, parse_release};
use crate::options::RedisOptions;
use crate::scripts::{CLAIM, Evalsha, INSPECT, RELEASE, RENEW, SCRIPTS, Sent, is_noscript};
use crate::url::{self, ClusterTarget};

/// How often a waiter on a cluster looks at a held key again, besides the timer at the
/// holder's remaining time: releases in other processes are not pushed on a cluster yet.
pub const CLUSTER_POLL: Duration = Duration::from_millis(100);

/// How many keys one `SCAN` step asks each master for.
const SCAN_BATCH: usize = 500;

/// How often the cluster client retries a call that met a redirection, a failover or a
/// dropped connection, and how long it waits in between (milliseconds, growing): short,
/// since the call deadline bounds the whole call anyway.
const RETRIES: u32 = 16;
const MIN_RETRY_WAIT_MS: u64 = 10;
const MAX_RETRY_WAIT_MS: u64 = 250;

/// Why a capability beyond locks and leases is refused on a cluster.
const LEASES_ONLY: &str = "on a Redis Cluster baton offers locks and leases only so far (their scripts are the ones tested on a cluster); use one Redis server (redis:// or redis+sentinel://) for the others";

/// A [`LeaseStore`] on a Redis Cluster: the lock scripts of [`RedisStore`](crate::RedisStore)
/// run on the master of each key's slot.
///
/// Use it when your Redis is a cluster. On one server (with or without Sentinel), use
/// [`RedisStore`](crate::RedisStore): it also pushes wake-ups to waiting processes and offers
/// every other primitive. Most code opens it through
/// `baton::connect("redis+cluster://host:port,host:port")`.
///
/// See the [module docs](self) for what runs where and what is not there yet (push wake-ups,
/// `min_replicas`, the primitives beyond locks and leases).
pub struct RedisClusterStore {
    conn: ClusterConnection,
    target: ClusterTarget,
    options: RedisOptions,
    hub: Arc<ReleaseHub>,
    /// The release script's last argument: `0` (no waiter of this store is queued, which on
    /// a cluster is always so), then a name for the store.
    release_idle: String,
}

impl fmt::Debug for RedisClusterStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisClusterStore")
            .field("cluster", &self.target)
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl RedisClusterStore {
    /// Opens the store named by a `redis+cluster://` or `rediss+cluster://` URL, with
    /// options in its query:
    /// `redis+cluster://[[user]:password@]host:port[,host:port...][?connect_timeout=2s&response_timeout=2s]`.
    ///
    /// # Errors
    /// `InvalidInput` for a malformed URL or option (before any I/O); `Unsupported` for
    /// `min_replicas` above 0 (not on a cluster yet) and for `rediss+cluster://` in a build
    /// without the `tls` feature; `Unavailable` when no seed node can be reached, or the
    /// cluster does not answer within the call deadline.
    ///
    /// # Examples
    /// ```no_run
    /// # async fn example() -> baton_core::Result<()> {
    /// let store = baton_redis::RedisClusterStore::connect(
    ///     "redis+cluster://10.0.0.1:7000,10.0.0.2:7000?response_timeout=500ms",
    /// )
    /// .await?;
    /// # Ok(()) }
    /// ```
    pub async fn connect(url: &str) -> Result<Self> {
        let (target, options) = url::parse_cluster(url)?;
        RedisClusterStore::start(target, options).await
    }

    /// Opens the store at `url` (which may not carry options in its query) with `options`.
    ///
    /// # Errors
    /// As [`RedisClusterStore::connect`]; also `InvalidInput` when the URL has a query.
    pub async fn open(url: &str, options: RedisOptions) -> Result<Self> {
        let (target, from_url) = url::parse_cluster(url)?;
        if from_url != RedisOptions::new() || url.contains('?') {
            return Err(Error::invalid_input(format!(
                "store URL {:?} carries options; pass options either in the URL (RedisClusterStore::connect) or as RedisOptions, not both",
                target.redacted
            )));
        }
        options.validate()?;
        RedisClusterStore::start(target, options).await
    }

    /// Checks `url` as [`connect`](Self::connect) reads it, without any I/O.
    ///
    /// # Errors
    /// As [`connect`](Self::connect) for the same URL, but never `Unavailable`.
    pub fn check_url(url: &str) -> Result<()> {
        let (target, options) = url::parse_cluster(url)?;
        options.validate()?;
        supported(&options, &target.redacted)?;
        tls_ready(target.tls, &target.redacted)?;
        client(&target, &options).map(drop)
    }

    /// The options the store was opened with.
    pub fn options(&self) -> &RedisOptions {
        &self.options
    }

    async fn start(target: ClusterTarget, options: RedisOptions) -> Result<Self> {
        let server = target.redacted.clone();
        supported(&options, &server)?;
        tls_ready(target.tls, &server)?;
        let client = client(&target, &options)?;
        let deadline = options.call_deadline();
        let connecting = async {
            let mut conn = client.get_async_connection().await?;
            // Loaded on every node now, so that the first calls find them; a node that
            // joins or restarts later loads each on its first NOSCRIPT.
            for script in [
                &SCRIPTS.claim,
                &SCRIPTS.renew,
                &SCRIPTS.release,
                &SCRIPTS.inspect,
            ] {
                script.load_async(&mut conn).await?;
            }
            Ok::<_, RedisError>(conn)
        };
        let conn = match timeout(deadline, connecting).await {
            Ok(Ok(conn)) => conn,
            Ok(Err(e)) => return Err(redis_error(e, "connecting to the cluster", &server)),
            Err(_) => return Err(timed_out("connecting to the cluster", &server, deadline)),
        };
        Ok(RedisClusterStore {
            conn,
            target,
            options,
            hub: Arc::new(ReleaseHub::new()),
            release_idle: format!("0baton:cluster:{}", &Holder::random().as_str()[..16]),
        })
    }

    /// Runs one script call about `key` and parses its answer, within the call deadline;
    /// after `NOSCRIPT` loads the script on the master of `key`'s slot and sends it again.
    async fn call<T>(
        &self,
        what: impl Fn() -> String,
        key: &StoreKey,
        invocation: &Evalsha<'_>,
        parse: impl Fn(&Value) -> Option<T>,
    ) -> Result<T> {
        let deadline = self.options.call_deadline();
        let server = &self.target.redacted;
        let mut conn = self.conn.clone();
        let sending = async {
            match invocation.send(&mut conn).await {
                Err(e) if is_noscript(&e) => {
                    load_on_master(&mut conn, invocation.script(), key).await?;
                    invocation.send(&mut conn).await
                }
                sent => sent,
            }
        };
        let sent: Sent = match timeout(deadline, sending).await {
            Ok(Ok(sent)) => sent,
            Ok(Err(e)) => return Err(redis_error(e, &what(), server)),
            Err(_) => return Err(timed_out(&what(), server, deadline)),
        };
        parse(&sent.value).ok_or_else(|| unexpected(&what(), server, format!("{:?}", sent.value)))
    }

    /// Sends a plain command to the node at `host:port`, within the call deadline.
    async fn ask_node(&self, what: &str, cmd: redis::Cmd, host: &str, port: u16) -> Result<Value> {
        let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
            host: host.to_owned(),
            port,
        });
        self.within(what, cmd, routing).await
    }

    async fn within(&self, what: &str, cmd: redis::Cmd, routing: RoutingInfo) -> Result<Value> {
        let deadline = self.options.call_deadline();
        let mut conn = self.conn.clone();
        match timeout(deadline, conn.route_command(cmd, routing)).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) => Err(redis_error(e, what, &self.target.redacted)),
            Err(_) => Err(timed_out(what, &self.target.redacted, deadline)),
        }
    }

    /// The `host:port` of every master, from `CLUSTER SLOTS` as one node sees it.
    async fn masters(&self) -> Result<Vec<(String, u16)>> {
        let slots = self
            .within(
                "listing",
                redis::cmd("CLUSTER").arg("SLOTS").to_owned(),
                RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random),
            )
            .await?;
        masters_of(&slots).ok_or_else(|| {
            unexpected(
                "listing (CLUSTER SLOTS)",
                &self.target.redacted,
                format!("{slots:?}"),
            )
        })
    }

    /// The qualified keys starting with `prefix` whose grants `SCAN` finds on any master.
    async fn scan(&self, prefix: &str) -> Result<BTreeSet<StoreKey>> {
        let pattern = keys::grant_pattern(prefix);
        let mut found = BTreeSet::new();
        for (host, port) in self.masters().await? {
            let mut cursor: u64 = 0;
            loop {
                let mut scan = redis::cmd("SCAN");
                scan.arg(cursor)
                    .arg("MATCH")
                    .arg(&pattern)
                    .arg("COUNT")
                    .arg(SCAN_BATCH);
                let value = self.ask_node("listing", scan, &host, port).await?;
                let (next, batch): (u64, Vec<String>) = redis::from_redis_value(value.clone())
                    .map_err(|_| {
                        unexpected(
                            "listing (SCAN)",
                            &self.target.redacted,
                            format!("{value:?}"),
                        )
                    })?;
                found.extend(
                    batch
                        .iter()
                        .filter_map(|k| keys::from_grant_key(k))
                        .filter(|k| k.as_str().starts_with(prefix)),
                );
                if next == 0 {
                    break;
                }
                cursor = next;
            }
        }
        Ok(found)
    }
}

/// Refuses what the cluster store does not do yet.
fn supported(options: &RedisOptions, server: &str) -> Result<()> {
    if options.get_min_replicas() > 0 {
        return Err(Error::unsupported(format!(
            "{server}: min_replicas={} is not supported on a Redis Cluster yet (each grant would need WAIT on its key's master); remove it, or use one server through redis+sentinel://",
            options.get_min_replicas()
        )));
    }
    Ok(())
}

/// The cluster client for `target`: the seed nodes, the store's timeouts, `TCP_NODELAY`,
/// short retries.
fn client(target: &ClusterTarget, options: &RedisOptions) -> Result<ClusterClient> {
    ClusterClientBuilder::new(target.seed_urls())
        .connection_timeout(options.get_connect_timeout())
        .response_timeout(options.get_response_timeout())
        .overall_response_timeout(Some(options.call_deadline()))
        .retries(RETRIES)
        .min_retry_wait(MIN_RETRY_WAIT_MS)
        .max_retry_wait(MAX_RETRY_WAIT_MS)
        .tcp_settings(TcpSettings::default().set_nodelay(true))
        .build()
        .map_err(|e| redis_error(e, "opening a cluster client", &target.redacted))
}

/// Loads `script` on the master that serves `key`'s slot.
async fn load_on_master(
    conn: &mut ClusterConnection,
    script: &Script,
    key: &StoreKey,
) -> RedisResult<()> {
    let text = [
        (&SCRIPTS.claim, CLAIM),
        (&SCRIPTS.renew, RENEW),
        (&SCRIPTS.release, RELEASE),
        (&SCRIPTS.inspect, INSPECT),
    ]
    .into_iter()
    .find(|(s, _)| s.get_hash() == script.get_hash())
    .map(|(_, text)| text)
    .ok_or_else(|| {
        RedisError::from((
            redis::ErrorKind::Client,
            "not a lock script of the cluster store",
        ))
    })?;
    let grant = format!("{{{}}}", key.as_str());
    let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(Route::with_key(
        grant.as_bytes(),
        SlotAddr::Master,
    )));
    let mut load = redis::cmd("SCRIPT");
    load.arg("LOAD").arg(text);
    conn.route_command(load, routing).await.map(drop)
}

/// The masters' `host:port` in a `CLUSTER SLOTS` answer: per slot range
/// `[start, end, [host, port, id, ...], replicas...]`.
fn masters_of(slots: &Value) -> Option<Vec<(String, u16)>> {
    let Value::Array(ranges) = slots else {
        return None;
    };
    let mut masters = Vec::new();
    for range in ranges {
        let Value::Array(fields) = range else {
            return None;
        };
        let Value::Array(master) = fields.get(2)? else {
            return None;
        };
        let host = crate::locks::text(master.first()?)?;
        let port = u16::try_from(int(master.get(1)?)?).ok()?;
        if !masters.contains(&(host.clone(), port)) {
            masters.push((host, port));
        }
    }
    Some(masters)
}

#[async_trait]
impl LeaseStore for RedisClusterStore {
    async fn claim(&self, key: &StoreKey, request: LeaseRequest<'_>) -> Result<Claim> {
        let (holder, ttl, reason) = (request.holder.as_str(), request.ttl, request.reason);
        let size = 2 * key.as_str().len() + holder.len() + reason.len();
        // Never with a store in ARGV[3]: a cluster store does not queue (see the module
        // docs), so the claim touches the grant and its counter, both declared.
        let mut invocation = Evalsha::new(&SCRIPTS.claim, 2, size);
        invocation
            .arg(keys::grant(key))
            .arg(keys::fence(key))
            .arg(holder)
            .arg(ttl.as_millis());
        if !reason.is_empty() {
            invocation.arg("").arg(reason);
        }
        self.call(|| format!("claim of {key}"), key, &invocation, parse_claim)
            .await
    }

    async fn renew(&self, key: &StoreKey, holder: &Holder, ttl: Ttl) -> Result<Renewal> {
        let mut invocation = Evalsha::new(&SCRIPTS.renew, 1, key.as_str().len() + 64);
        invocation
            .arg(keys::grant(key))
            .arg(holder.as_str())
            .arg(ttl.as_millis());
        let parse = |v: &Value| match int(v)? {
            1 => Some(Renewal::Renewed),
            0 => Some(Renewal::NotHeld),
            _ => None,
        };
        self.call(|| format!("renewal of {key}"), key, &invocation, parse)
            .await
    }

    async fn release(&self, key: &StoreKey, holder: &Holder) -> Result<Release> {
        let holder = holder.as_str();
        let size = 4 * key.as_str().len() + holder.len() + self.release_idle.len();
        // All four keys a release may touch are declared, the hand-over's too (it runs
        // only for a grant some store queued for, which a cluster store never does).
        let mut invocation = Evalsha::new(&SCRIPTS.release, 4, size);
        invocation
            .arg(keys::grant(key))
            .arg(keys::queue(key))
            .arg(keys::who(key))
            .arg(keys::fence(key))
            .arg(holder)
            .arg(&self.release_idle);
        let released = self
            .call(
                || format!("release of {key}"),
                key,
                &invocation,
                parse_release,
            )
            .await?;
        if released.release == Release::Removed {
            // Waiters in this process look again now; those of other processes poll.
            self.hub.notify(key);
        }
        Ok(released.release)
    }

    async fn inspect(&self, key: &StoreKey) -> Result<Option<HolderInfo>> {
        let mut invocation = Evalsha::new(&SCRIPTS.inspect, 1, key.as_str().len());
        invocation.arg(keys::grant(key));
        self.call(
            || format!("inspection of {key}"),
            key,
            &invocation,
            |v| holder_info(key, v),
        )
        .await
    }

    async fn list(&self, prefix: &str, limit: usize) -> Result<Vec<HolderInfo>> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let mut found = Vec::new();
        for key in self.scan(prefix).await? {
            // A grant that expired between the scan and the read is simply not listed.
            if let Some(info) = self.inspect(&key).await? {
                found.push(info);
                if found.len() == limit {
                    break;
                }
            }
        }
        Ok(found)
    }

    fn wakeups(&self) -> Wakeups {
        Wakeups {
            hub: Arc::clone(&self.hub),
            poll: Some(CLUSTER_POLL),
        }
    }
}

/// Locks and leases; every other capability is refused with the reason (see the module
/// docs).
impl Store for RedisClusterStore {
    fn name(&self) -> &'static str {
        "Redis Cluster"
    }

    fn rate_store(self: Arc<Self>) -> Result<Arc<dyn RateStore>> {
        Err(Capability::RateLimits.unsupported(self.name(), Some(LEASES_ONLY)))
    }

    fn cache_store(self: Arc<Self>) -> Result<Arc<dyn CacheStore>> {
        Err(Capability::Cache.unsupported(self.name(), Some(LEASES_ONLY)))
    }

    fn broadcast_store(self: Arc<Self>) -> Result<Arc<dyn BroadcastStore>> {
        Err(Capability::Broadcast.unsupported(self.name(), Some(LEASES_ONLY)))
    }

    fn idempotency_store(self: Arc<Self>) -> Result<Arc<dyn IdempotencyStore>> {
        Err(Capability::Idempotency.unsupported(self.name(), Some(LEASES_ONLY)))
    }

    fn semaphore_store(self: Arc<Self>) -> Result<Arc<dyn SemaphoreStore>> {
        Err(Capability::Semaphores.unsupported(self.name(), Some(LEASES_ONLY)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn masters_are_read_from_cluster_slots() {
        let node = |port: i64| Value::Array(vec![bulk("127.0.0.1"), Value::Int(port), bulk("id")]);
        let range = |a: i64, b: i64, master: i64, replica: i64| {
            Value::Array(vec![
                Value::Int(a),
                Value::Int(b),
                node(master),
                node(replica),
            ])
        };
        let slots = Value::Array(vec![
            range(0, 5460, 7000, 7003),
            range(5461, 10922, 7001, 7004),
            range(10923, 16000, 7002, 7005),
            range(16001, 16383, 7000, 7003),
        ]);
        assert_eq!(
            masters_of(&slots).unwrap(),
            [
                ("127.0.0.1".to_owned(), 7000),
                ("127.0.0.1".to_owned(), 7001),
                ("127.0.0.1".to_owned(), 7002)
            ]
        );
        assert_eq!(masters_of(&Value::Nil), None);
        assert_eq!(masters_of(&Value::Array(vec![Value::Int(1)])), None);
        assert_eq!(masters_of(&Value::Array(vec![])).unwrap(), []);
    }

    #[test]
    fn what_the_cluster_does_not_do_yet_is_unsupported_before_any_io() {
        let e =
            RedisClusterStore::check_url("redis+cluster://u:hunter2@127.0.0.1:1?min_replicas=1")
                .unwrap_err();
        assert_eq!(e.kind(), baton_core::ErrorKind::Unsupported, "{e}");
        assert!(e.message().contains("Redis Cluster"), "{e}");
        assert!(!e.message().contains("hunter2"), "{e}");
        RedisClusterStore::check_url("redis+cluster://127.0.0.1:1,127.0.0.1:2").unwrap();
        let e = RedisClusterStore::check_url("redis://127.0.0.1:1").unwrap_err();
        assert!(e.is_invalid_input(), "{e}");
    }
}
