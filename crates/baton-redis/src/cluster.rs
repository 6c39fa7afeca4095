//! [`RedisClusterStore`]: every primitive of the single server's store on a Redis Cluster
//! (locks, leases, semaphores, so reader-writer locks and elections, rate limits, the cache,
//! idempotency records, broadcast), each key's scripts and commands run on the master that
//! serves the key's slot.
//!
//! Every Redis key of one qualified key `Q` (the grant `{Q}` or a semaphore's permits, its
//! fence counter, its queue)
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
//! - Waiting processes queue per key and take turns, as on one server: the queue, the
//!   hand-over of a released key to the holder that waited longest and the reservations are
//!   the single-server protocol (see [`crate::wakeups`]), carried over sharded pub/sub
//!   (`SSUBSCRIBE`/`SPUBLISH`, Redis 7 or later): a store listens on one channel per slot
//!   it waits in, named so that it hashes to that slot, so the release script on the key's
//!   master reaches it and a release wakes only waiters of that key's shard (see
//!   [`sharded`](crate::sharded) for the subscriptions and what happens when one is lost:
//!   the store says so with `baton.store.push_lost` and its waiters poll every
//!   [`DEGRADED_POLL`] until it is back).
//! - A release whose connection dropped may have been retried by the cluster client after
//!   it ran; it then answers that nobody held the key, which the core reports as a release
//!   after expiry. The lock was freed either way.
//! - Semaphores are the single server's permit scripts and calls (`crate::semaphore`),
//!   queueing and waking stores as locks do; reader-writer locks and elections are built on
//!   leases and semaphores in the core (an election's notices go over broadcast).
//! - Rate limits, the cache and idempotency records are the single server's scripts, calls
//!   and commands, each about one key (a rate-limit log and its counter share the tag `{Q}`).
//! - Broadcast is sharded pub/sub: the channel `Q:db0` is published with `SPUBLISH` to the
//!   master of its slot and subscribed there on the store's subscribing connection, with
//!   gaps reported as on one server (see [`sharded`](crate::sharded)).
//! - `min_replicas=N` works as on one server, on the key's master: every claim, renewal and
//!   release of a grant or permit is followed by `WAIT N` on the same connection, a write
//!   fewer than N of that master's replicas acknowledged is reported `Unavailable` (a grant
//!   it made is freed again first), and releases do not hand keys to waiting holders. So a
//!   grant acknowledged to its holder survives the master's SIGKILL when its replica takes
//!   over. Claimable work is refused as on one server.
//! - `list` scans every master in turn (`CLUSTER SLOTS`, then `SCAN` on each), then reads
//!   each grant it found; during a failover it may miss a grant or fail `Unavailable`.

use std::collections::BTreeSet;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use baton_core::broadcast::RawSubscription;
use baton_core::idempotency::store::{
    AcquireAnswer, AcquireRequest, AttemptEnd, FinalizeAnswer, IdempotencyStore, StoredRecord,
};
use baton_core::semaphore::PermitInfo;
use baton_core::signals::{Handoffs, ReleaseHub};
use baton_core::store::{
    Claim, HolderInfo, LeaseRequest, LeaseStore, Release, Renewal, Store, Wakeups,
};
use baton_core::telemetry::{self, events};
use baton_core::{
    BroadcastStore, CacheStore, Decision, Error, Holder, Quota, RateStore, Result, SemaphoreStore,
    StoreKey, Ttl,
};
use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::io::tcp::TcpSettings;
use redis::{ProtocolVersion, PushInfo, RedisError, RedisResult, Script, Value};
use tokio::time::{Instant, timeout};

use crate::broadcast::redis_channel;
use crate::endpoint::tls_ready;
use crate::error::{redis_error, timed_out, unexpected};
use crate::keys;
use crate::locks::{holder_info, int, parse_claim, parse_release};
use crate::options::RedisOptions;
use crate::scripts::{Evalsha, SCRIPTS, Sent, is_noscript};
use crate::semaphore;
use crate::sharded::{ChannelNames, ShardedPush};
use crate::url::{self, ClusterTarget};
use crate::wakeups::{DEGRADED_POLL, GiveUp, Inbox};
use crate::{cache, idempotency, limit};

/// How many times a script call that met `NOSCRIPT` loads the script and is sent again.
const NOSCRIPT_LOADS: u32 = 3;

/// How many keys one `SCAN` step asks each master for.
const SCAN_BATCH: usize = 500;

/// How often the cluster client retries a call that met a redirection, a failover or a
/// dropped connection, and how long it waits in between (milliseconds, growing): short,
/// since the call deadline bounds the whole call anyway.
const RETRIES: u32 = 16;
const MIN_RETRY_WAIT_MS: u64 = 10;
const MAX_RETRY_WAIT_MS: u64 = 250;

/// Every primitive of [`RedisStore`](crate::RedisStore) on a Redis Cluster: its scripts and
/// commands run on the master of each key's slot.
///
/// Use it when your Redis is a cluster. On one server (with or without Sentinel), use
/// [`RedisStore`](crate::RedisStore). Most code opens it through
/// `baton::connect("redis+cluster://host:port,host:port")`.
///
/// See the [module docs](self) for what runs where.
pub struct RedisClusterStore {
    scripts: ClusterScripts,
    target: ClusterTarget,
    options: RedisOptions,
    hub: Arc<ReleaseHub>,
    /// The grants releases handed to this store's waiting holders.
    handoffs: Arc<Handoffs>,
    /// The store's channel in each slot: also its name in the queues of that slot's keys.
    names: Arc<ChannelNames>,
    push: ShardedPush,
}

/// The cluster connection that runs the scripts, cloned into background work (a pass, a
/// give-back).
#[derive(Clone)]
struct ClusterScripts {
    conn: ClusterConnection,
    /// The cluster, as messages name it (password redacted).
    server: String,
    deadline: Duration,
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
    /// `redis+cluster://[[user]:password@]host:port[,host:port...][?connect_timeout=2s&response_timeout=2s&min_replicas=1]`.
    ///
    /// # Errors
    /// `InvalidInput` for a malformed URL or option (before any I/O); `Unsupported` for
    /// `rediss+cluster://` in a build without the `tls` feature; `Unavailable` when no seed
    /// node can be reached, or the cluster does not answer within the call deadline.
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
        tls_ready(target.tls, &target.redacted)?;
        client(&target, &options).map(drop)
    }

    /// The options the store was opened with.
    pub fn options(&self) -> &RedisOptions {
        &self.options
    }

    async fn start(target: ClusterTarget, options: RedisOptions) -> Result<Self> {
        let server = target.redacted.clone();
        tls_ready(target.tls, &server)?;
        let client = client(&target, &options)?;
        let deadline = options.call_deadline();
        let connecting = async {
            let mut conn = client.get_async_connection().await?;
            // Loaded on every node now, so that the first calls find them; a node that
            // joins or restarts later loads each on its first NOSCRIPT.
            let others = [limit::script()].into_iter().chain(idempotency::scripts());
            for script in SCRIPTS.all().into_iter().chain(others) {
                script.load_async(&mut conn).await?;
            }
            Ok::<_, RedisError>(conn)
        };
        let conn = match timeout(deadline, connecting).await {
            Ok(Ok(conn)) => conn,
            Ok(Err(e)) => return Err(redis_error(e, "connecting to the cluster", &server)),
            Err(_) => return Err(timed_out("connecting to the cluster", &server, deadline)),
        };
        let scripts = ClusterScripts {
            conn,
            server: server.clone(),
            deadline,
        };
        // 64 random bits: the channels of the stores on one cluster never meet.
        let names = Arc::new(ChannelNames::new(&Holder::random().as_str()[..16]));
        let hub = Arc::new(ReleaseHub::new());
        let handoffs = Arc::new(Handoffs::new(Arc::clone(&hub), {
            let (scripts, names, hub) = (scripts.clone(), Arc::clone(&names), Arc::clone(&hub));
            move |handoffs: &Arc<Handoffs>, key, holder| {
                give_back(
                    GiveBack {
                        scripts: scripts.clone(),
                        names: Arc::clone(&names),
                        hub: Arc::clone(&hub),
                        handoffs: Arc::clone(handoffs),
                    },
                    key,
                    holder,
                );
            }
        }));
        let inbox = Inbox::new(
            Arc::clone(&hub),
            Arc::clone(&handoffs),
            Arc::new(Turns {
                scripts: scripts.clone(),
                names: Arc::clone(&names),
            }),
            deadline,
        );
        let (sender, pushes) = tokio::sync::mpsc::unbounded_channel::<PushInfo>();
        let push_client = ClusterClientBuilder::new(target.seed_urls());
        let push_client = configure(push_client, &options)
            .use_protocol(ProtocolVersion::RESP3)
            .push_sender(sender)
            .build()
            .map_err(|e| redis_error(e, "opening a cluster client", &server))?;
        let starting = ShardedPush::start(
            &push_client,
            pushes,
            inbox,
            Arc::clone(&names),
            deadline,
            server.clone(),
        );
        let push = match timeout(deadline, starting).await {
            Ok(Ok(push)) => push,
            Ok(Err(e)) => return Err(redis_error(e, "connecting for sharded pub/sub", &server)),
            Err(_) => {
                return Err(timed_out(
                    "connecting for sharded pub/sub",
                    &server,
                    deadline,
                ));
            }
        };
        Ok(RedisClusterStore {
            scripts,
            target,
            options,
            hub,
            handoffs,
            names,
            push,
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
        self.call_confirmed(what, key, invocation, parse)
            .await
            .map(|(answer, _)| answer)
    }

    /// [`call`](Self::call) that also answers how many replicas acknowledged the call's
    /// writes, for an invocation [confirmed](crate::locks::confirm) by replicas.
    async fn call_confirmed<T>(
        &self,
        what: impl Fn() -> String,
        key: &StoreKey,
        invocation: &Evalsha<'_>,
        parse: impl Fn(&Value) -> Option<T>,
    ) -> Result<(T, Option<i64>)> {
        let sent = self.scripts.send(&what, key, invocation).await?;
        let parsed = parse(&sent.value).ok_or_else(|| {
            unexpected(&what(), &self.scripts.server, format!("{:?}", sent.value))
        })?;
        Ok((parsed, sent.replicas))
    }

    /// Whether a write answered with `replicas` acknowledgements has as many as
    /// `min_replicas` asks for; otherwise the `Unavailable` error to report (see
    /// [`crate::locks::unconfirmed`]).
    fn unconfirmed(&self, what: &str, replicas: Option<i64>) -> Option<Error> {
        crate::locks::unconfirmed(&self.options, &self.target.redacted, what, replicas)
    }

    /// Frees a grant or permit the replicas did not confirm (`invocation`, its release)
    /// before the claim answers, as on one server: the waiter that made it claims again as
    /// the same holder, and a release still in flight could free what that later claim was
    /// answered as extended. A failure is only logged; the TTL ends the grant then.
    async fn give_back_unconfirmed(&self, key: &StoreKey, invocation: &Evalsha<'_>) {
        let what = || format!("giving back an unconfirmed grant of {key}");
        if self.scripts.send(&what, key, invocation).await.is_err() {
            tracing::debug!(%key, "could not give back an unconfirmed grant; its TTL ends it");
        }
    }

    /// A renewal, or the `Unavailable` error when it renewed a grant the replicas did not
    /// confirm.
    fn confirmed_renewal(
        &self,
        what: &str,
        renewal: Renewal,
        replicas: Option<i64>,
    ) -> Result<Renewal> {
        match renewal {
            Renewal::Renewed => self.unconfirmed(what, replicas).map_or(Ok(renewal), Err),
            _ => Ok(renewal),
        }
    }

    /// A release, or the `Unavailable` error when it removed a grant and the replicas did
    /// not confirm it (they may still hold the grant, which its TTL then ends).
    fn confirmed_release(
        &self,
        what: &str,
        release: &Release,
        replicas: Option<i64>,
    ) -> Result<()> {
        match release {
            Release::Removed => self.unconfirmed(what, replicas).map_or(Ok(()), Err),
            _ => Ok(()),
        }
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
        let mut conn = self.scripts.conn.clone();
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

    /// The qualified keys that start with `prefix` of the Redis keys that `SCAN MATCH
    /// pattern` finds on any master and `parse` reads back (a grant's `{Q}`, a semaphore's
    /// `{Q}:permits`), in key order.
    async fn scan(
        &self,
        pattern: &str,
        prefix: &str,
        parse: fn(&str) -> Option<StoreKey>,
    ) -> Result<BTreeSet<StoreKey>> {
        let mut found = BTreeSet::new();
        for (host, port) in self.masters().await? {
            let mut cursor: u64 = 0;
            loop {
                let mut scan = redis::cmd("SCAN");
                scan.arg(cursor)
                    .arg("MATCH")
                    .arg(pattern)
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
                        .filter_map(|k| parse(k))
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

/// The cluster client for `target`: the seed nodes, the store's timeouts, `TCP_NODELAY`,
/// short retries.
fn client(target: &ClusterTarget, options: &RedisOptions) -> Result<ClusterClient> {
    configure(ClusterClientBuilder::new(target.seed_urls()), options)
        .build()
        .map_err(|e| redis_error(e, "opening a cluster client", &target.redacted))
}

/// The store's timeouts, `TCP_NODELAY` and short retries, for the scripts' client and the
/// subscriptions' alike.
fn configure(builder: ClusterClientBuilder, options: &RedisOptions) -> ClusterClientBuilder {
    builder
        .connection_timeout(options.get_connect_timeout())
        .response_timeout(options.get_response_timeout())
        .overall_response_timeout(Some(options.call_deadline()))
        .retries(RETRIES)
        .min_retry_wait(MIN_RETRY_WAIT_MS)
        .max_retry_wait(MAX_RETRY_WAIT_MS)
        .tcp_settings(TcpSettings::default().set_nodelay(true))
}

impl ClusterScripts {
    /// Sends one script call about `key` within the call deadline; after `NOSCRIPT` loads
    /// the script on the master of `key`'s slot and sends it again, up to
    /// [`NOSCRIPT_LOADS`] times: right after a failover the client may load it on the old
    /// master (its slot map still names it) while the call, redirected, runs on the new one.
    async fn send(
        &self,
        what: &impl Fn() -> String,
        key: &StoreKey,
        invocation: &Evalsha<'_>,
    ) -> Result<Sent> {
        let mut conn = self.conn.clone();
        let sending = async {
            let mut loads = 0;
            loop {
                match invocation.send(&mut conn).await {
                    Err(e) if is_noscript(&e) && loads < NOSCRIPT_LOADS => {
                        loads += 1;
                        load_on_master(&mut conn, invocation.script(), key).await?;
                    }
                    sent => return sent,
                }
            }
        };
        match timeout(self.deadline, sending).await {
            Ok(Ok(sent)) => Ok(sent),
            Ok(Err(e)) => Err(redis_error(e, &what(), &self.server)),
            Err(_) => Err(timed_out(&what(), &self.server, self.deadline)),
        }
    }

    /// Sends `invocation` in the background; a failure is only logged, with `what`.
    fn send_in_background(&self, what: String, key: StoreKey, invocation: Evalsha<'static>) {
        let scripts = self.clone();
        tokio::spawn(async move {
            if let Err(e) = scripts.send(&|| what.clone(), &key, &invocation).await {
                tracing::debug!(error = %e, "a background call failed; timers move the key on");
            }
        });
    }
}

/// How a cluster store gives a turn away: `pass.lua` and `permit_pass.lua`, every key they
/// touch declared, with the store's channel in the key's slot.
struct Turns {
    scripts: ClusterScripts,
    names: Arc<ChannelNames>,
}

impl GiveUp for Turns {
    fn pass(&self, key: StoreKey, _deadline: Duration) {
        let mut invocation = Evalsha::new(&SCRIPTS.pass, 4, 0);
        invocation
            .arg(keys::grant(&key))
            .arg(keys::queue(&key))
            .arg(keys::who(&key))
            .arg(keys::fence(&key))
            .arg(self.names.of(&key).name());
        self.scripts
            .send_in_background(format!("giving up the turn for {key}"), key, invocation);
    }

    fn pass_permit(&self, key: StoreKey, _deadline: Duration) {
        let mut invocation = Evalsha::new(&SCRIPTS.permit_pass, 2, 0);
        invocation
            .arg(keys::queue(&key))
            .arg(keys::permits(&key))
            .arg(self.names.of(&key).name());
        self.scripts.send_in_background(
            format!("giving up the permit turn for {key}"),
            key,
            invocation,
        );
    }
}

/// What a cluster store's give-back needs: see [`give_back`].
struct GiveBack {
    scripts: ClusterScripts,
    names: Arc<ChannelNames>,
    hub: Arc<ReleaseHub>,
    handoffs: Arc<Handoffs>,
}

/// The release of `holder`'s grant of `key` by a store with `hub` and channel `names`: every
/// key the script may touch declared, the hand-over's too, and the store named by its
/// channel in the key's slot ('1' first when one of its `waiting` waiters waits for the key).
fn release_call(
    waiting: bool,
    names: &ChannelNames,
    key: &StoreKey,
    holder: &Holder,
) -> Evalsha<'static> {
    let channel = names.of(key);
    let store = channel.flagged(waiting);
    let size = 4 * key.as_str().len() + holder.as_str().len() + store.len();
    let mut invocation = Evalsha::new(&SCRIPTS.release, 4, size);
    invocation
        .arg(keys::grant(key))
        .arg(keys::queue(key))
        .arg(keys::who(key))
        .arg(keys::fence(key))
        .arg(holder.as_str())
        .arg(store);
    invocation
}

/// Releases, in the background, the grant a release handed to `holder`, who stopped
/// waiting before it arrived: the release hands the key to the next store in line (this
/// one, if another of its holders waits). A failure emits
/// [`baton.lock.release_faulted`](events::LOCK_RELEASE_FAULTED): the grant's TTL frees the
/// key then.
fn give_back(store: GiveBack, key: StoreKey, holder: Holder) {
    tokio::spawn(async move {
        let invocation = release_call(store.hub.has_waiters(&key), &store.names, &key, &holder);
        let what = || format!("giving back {key}");
        let sent = store.scripts.send(&what, &key, &invocation).await;
        match sent.ok().and_then(|sent| parse_release(&sent.value)) {
            Some(released) => {
                released.tell(&store.hub, &store.handoffs, &key, true);
            }
            None => telemetry::emit(
                &events::LOCK_RELEASE_FAULTED,
                Some(key.as_str()),
                format_args!(
                    "a grant handed to a waiter that stopped waiting could not be released, \
                     so the key stays held until its TTL"
                ),
            ),
        }
    });
}

/// Loads `script` on the master that serves `key`'s slot.
async fn load_on_master(
    conn: &mut ClusterConnection,
    script: &Script,
    key: &StoreKey,
) -> RedisResult<()> {
    let text = SCRIPTS.text_of(script).ok_or_else(|| {
        RedisError::from((redis::ErrorKind::Client, "not a script of the Redis store"))
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
        let (holder, ttl, reason) = (request.holder, request.ttl, request.reason);
        // As on one server (see `RedisStore`'s claim): a waiter of this process subscribes
        // before it claims, so this tells whether the store should queue for the key. On a
        // cluster it queues under its channel in the key's slot, subscribed first; without
        // that subscription it does not queue, and its waiters poll.
        let channel = if self.hub.has_waiters(key) {
            // A hand-over told to this store is never trusted from memory here, as it is on
            // one server: it is confirmed by the claim below, which finds the key this
            // holder's and extends it. `SPUBLISH` counts only the subscribers on the master
            // it ran on, but the message also reaches those on the slot's replicas (where a
            // store's subscription stays after a failover), so a release that counted this
            // store unreached, and so granted the key to nobody or to the next store, may
            // still have told it "yours".
            let _ = self.handoffs.take(key, holder);
            self.push.subscribed(key).await
        } else {
            None
        };
        // With `min_replicas`, a grant must be confirmed by replicas before anyone relies on
        // it, which a hand-over cannot wait for: the release reserves the key for this store
        // instead, and its waiter's own claim, confirmed, takes it (as on one server).
        let hand_over = channel.is_some()
            && self.options.get_min_replicas() == 0
            && reason.is_empty()
            && self.handoffs.address().is_some()
            && self.hub.is_waiting(key, holder);
        if hand_over {
            self.handoffs.queueing(key, holder, Instant::now());
        }
        let size = 4 * key.as_str().len()
            + holder.as_str().len()
            + reason.len()
            + channel.as_ref().map_or(0, |c| c.name().len());
        // Every key the script touches is declared: the queue only with a channel, the
        // waiting holders only with a hand-over.
        let key_count = 2 + usize::from(channel.is_some()) + usize::from(hand_over);
        let mut invocation = Evalsha::new(&SCRIPTS.claim, key_count, size);
        invocation.arg(keys::grant(key)).arg(keys::fence(key));
        if channel.is_some() {
            invocation.arg(keys::queue(key));
        }
        if hand_over {
            invocation.arg(keys::who(key));
        }
        invocation.arg(holder.as_str()).arg(ttl.as_millis());
        match (&channel, reason.is_empty()) {
            (Some(channel), true) => invocation.arg(channel.name()),
            (Some(channel), false) => invocation.arg(channel.name()).arg(reason),
            (None, true) => &mut invocation,
            (None, false) => invocation.arg("").arg(reason),
        };
        crate::locks::confirm(&self.options, &mut invocation);
        let what = || format!("claim of {key}");
        let (claim, replicas) = self
            .call_confirmed(what, key, &invocation, parse_claim)
            .await?;
        if channel.is_some()
            && let Claim::Granted { .. } | Claim::Extended { .. } = claim
        {
            self.handoffs.granted(key, holder);
        }
        if let Claim::Granted { .. } | Claim::Extended { .. } = claim
            && let Some(e) = self.unconfirmed(&what(), replicas)
        {
            // A grant that a failover could lose is not handed out: it is freed again. A
            // holder's own grant that was extended stays as it was.
            if let Claim::Granted { .. } = claim {
                let release = release_call(false, &self.names, key, holder);
                self.give_back_unconfirmed(key, &release).await;
            }
            return Err(e);
        }
        Ok(claim)
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
        crate::locks::confirm(&self.options, &mut invocation);
        let what = || format!("renewal of {key}");
        let (renewal, replicas) = self.call_confirmed(what, key, &invocation, parse).await?;
        self.confirmed_renewal(&what(), renewal, replicas)
    }

    async fn release(&self, key: &StoreKey, holder: &Holder) -> Result<Release> {
        let mut invocation = release_call(self.hub.has_waiters(key), &self.names, key, holder);
        crate::locks::confirm(&self.options, &mut invocation);
        let what = || format!("release of {key}");
        let released = self
            .call_confirmed(what, key, &invocation, parse_release)
            .await
            .and_then(|(released, replicas)| {
                self.confirmed_release(&what(), &released.release, replicas)
                    .map(|_| released)
            });
        match released {
            Ok(released) => {
                Ok(released.tell(&self.hub, &self.handoffs, key, self.push.is_healthy()))
            }
            Err(e) => {
                // The release may have run and reserved the key for a waiter of this process,
                // which no message would wake: have this process's waiters look again.
                self.hub.notify(key);
                Err(e)
            }
        }
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
        let grants = self
            .scan(&keys::grant_pattern(prefix), prefix, keys::from_grant_key)
            .await?;
        for key in grants {
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
            poll: (!self.push.is_healthy()).then_some(DEGRADED_POLL),
        }
    }
}

/// Semaphores: the single server's permit scripts and calls (`semaphore.rs`), on the
/// master of each key's slot, with the lock's queue and sharded wake-ups.
#[async_trait]
impl SemaphoreStore for RedisClusterStore {
    async fn claim_permit(
        &self,
        key: &StoreKey,
        request: LeaseRequest<'_>,
        permits: u32,
    ) -> Result<Claim> {
        // As for a lock: a waiter of this process subscribes before it claims, and the claim
        // queues the store only under its subscribed channel in the key's slot.
        let channel = if self.hub.has_waiters(key) {
            self.push.subscribed(key).await
        } else {
            None
        };
        let mut invocation =
            semaphore::claim_call(key, &request, permits, channel.as_ref().map(|c| c.name()));
        crate::locks::confirm(&self.options, &mut invocation);
        let what = || format!("permit claim of {key}");
        // A claim that ran and was retried comes back as an extension: a permit either way.
        let (claim, replicas) = self
            .call_confirmed(what, key, &invocation, parse_claim)
            .await?;
        if let Claim::Granted { .. } | Claim::Extended { .. } = claim
            && let Some(e) = self.unconfirmed(&what(), replicas)
        {
            // A permit that a failover could lose is not handed out: it is given back.
            if let Claim::Granted { .. } = claim {
                let channel = self.names.of(key);
                let release =
                    semaphore::release_call(key, request.holder.as_str(), channel.flagged(false));
                self.give_back_unconfirmed(key, &release).await;
            }
            return Err(e);
        }
        Ok(claim)
    }

    async fn renew_permit(&self, key: &StoreKey, holder: &Holder, ttl: Ttl) -> Result<Renewal> {
        let mut invocation = semaphore::renew_call(key, holder, ttl);
        crate::locks::confirm(&self.options, &mut invocation);
        let what = || format!("permit renewal of {key}");
        let (renewal, replicas) = self
            .call_confirmed(what, key, &invocation, semaphore::parse_renewal)
            .await?;
        self.confirmed_renewal(&what(), renewal, replicas)
    }

    async fn release_permit(&self, key: &StoreKey, holder: &Holder) -> Result<Release> {
        let channel = self.names.of(key);
        let store = channel.flagged(self.hub.has_waiters(key));
        let mut invocation = semaphore::release_call(key, holder.as_str(), store);
        crate::locks::confirm(&self.options, &mut invocation);
        let what = || format!("permit release of {key}");
        let released = self
            .call_confirmed(what, key, &invocation, semaphore::parse_release)
            .await
            .and_then(|(released, replicas)| {
                self.confirmed_release(&what(), &released.0, replicas)
                    .map(|_| released)
            });
        match released {
            Ok((release, to_this_store)) => Ok(semaphore::tell_permit_release(
                &self.hub,
                key,
                release,
                to_this_store,
                self.push.is_healthy(),
            )),
            Err(e) => {
                // The release may have run and chosen a waiter of this process, which no
                // message would wake: have this process's waiters look again.
                self.hub.notify(key);
                Err(e)
            }
        }
    }

    async fn permits(&self, key: &StoreKey) -> Result<Vec<HolderInfo>> {
        Ok(self
            .permits_of(key)
            .await?
            .into_iter()
            .map(|p| p.grant)
            .collect())
    }

    /// Scans every master for the keys' `{Q}:permits`, then reads each key's live permits,
    /// in key order, until `limit` keys had some.
    async fn list_permits(&self, prefix: &str, limit: usize) -> Result<Vec<PermitInfo>> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let candidates = self
            .scan(
                &semaphore::permits_pattern(prefix),
                prefix,
                semaphore::from_permits_key,
            )
            .await?;
        semaphore::first_with_permits(&candidates, limit, |key| self.permits_of(key)).await
    }

    fn permit_wakeups(&self) -> Wakeups {
        LeaseStore::wakeups(self)
    }
}

impl RedisClusterStore {
    /// The live permits of `key`, oldest fence first, with the N of each claim.
    async fn permits_of(&self, key: &StoreKey) -> Result<Vec<PermitInfo>> {
        self.call(
            || format!("permits of {key}"),
            key,
            &semaphore::list_call(key),
            |v| semaphore::parse_permits(key, v),
        )
        .await
    }
}

/// Rate limits: the single server's script and call ([`crate::limit`]), on the master of the
/// key's slot.
#[async_trait]
impl RateStore for RedisClusterStore {
    async fn admit(&self, key: &StoreKey, cost: u32, quota: Quota) -> Result<Decision> {
        let invocation = limit::admit_call(key, cost, quota);
        self.call(
            || format!("rate limit of {key}"),
            key,
            &invocation,
            limit::parse,
        )
        .await
    }
}

/// The cache: the single server's commands ([`crate::cache`]), each on the master of its
/// key's slot.
#[async_trait]
impl CacheStore for RedisClusterStore {
    async fn get(&self, key: &StoreKey) -> Result<Option<Vec<u8>>> {
        self.command(&format!("cache get of {key}"), cache::get_cmd(key))
            .await
    }

    async fn set(&self, key: &StoreKey, value: Vec<u8>, ttl: Ttl) -> Result<()> {
        self.command(
            &format!("cache set of {key}"),
            cache::set_cmd(key, value, ttl),
        )
        .await
    }

    async fn delete(&self, key: &StoreKey) -> Result<bool> {
        let deleted: i64 = self
            .command(&format!("cache delete of {key}"), cache::del_cmd(key))
            .await?;
        Ok(deleted == 1)
    }
}

/// The idempotency log: the single server's scripts and calls ([`crate::idempotency`]), on
/// the master of the record's slot.
#[async_trait]
impl IdempotencyStore for RedisClusterStore {
    async fn acquire(&self, key: &StoreKey, request: AcquireRequest<'_>) -> Result<AcquireAnswer> {
        let invocation = idempotency::acquire_call(key, &request);
        self.call(
            || format!("idempotency acquire of {key}"),
            key,
            &invocation,
            idempotency::parse_acquire,
        )
        .await
    }

    async fn renew(&self, key: &StoreKey, owner: &Holder, lease: Ttl) -> Result<Renewal> {
        let invocation = idempotency::renew_call(key, owner, lease);
        self.call(
            || format!("idempotency renewal of {key}"),
            key,
            &invocation,
            idempotency::parse_renewal,
        )
        .await
    }

    async fn finalize(&self, key: &StoreKey, end: AttemptEnd<'_>) -> Result<FinalizeAnswer> {
        let invocation = idempotency::finalize_call(key, &end);
        self.call(
            || format!("idempotency finalize of {key}"),
            key,
            &invocation,
            |v| idempotency::parse_finalize(v, end.owner, end.metadata),
        )
        .await
    }

    async fn get(&self, key: &StoreKey) -> Result<Option<StoredRecord>> {
        self.call(
            || format!("idempotency read of {key}"),
            key,
            &idempotency::get_call(key),
            idempotency::parse_get,
        )
        .await
    }
}

/// Broadcast over sharded pub/sub: a channel `Q:db0` (as on one server, database 0) is
/// published with `SPUBLISH` to the master of its slot and subscribed there, on the store's
/// subscribing connection ([`crate::sharded`]).
#[async_trait]
impl BroadcastStore for RedisClusterStore {
    async fn publish(&self, channel: &StoreKey, payload: Vec<u8>) -> Result<()> {
        let mut publish = redis::cmd("SPUBLISH");
        publish.arg(redis_channel(channel, 0)).arg(payload);
        let _receivers: i64 = self
            .command(&format!("publishing on {channel}"), publish)
            .await?;
        Ok(())
    }

    async fn subscribe(&self, channel: &StoreKey, capacity: usize) -> Result<RawSubscription> {
        self.push
            .subscribe_broadcast(&redis_channel(channel, 0), capacity)
            .await
    }
}

impl RedisClusterStore {
    /// Sends a one-key command, routed by its key, within the call deadline.
    async fn command<T: redis::FromRedisValue>(&self, what: &str, cmd: redis::Cmd) -> Result<T> {
        let mut conn = self.scripts.conn.clone();
        match timeout(self.scripts.deadline, cmd.query_async::<T>(&mut conn)).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) => Err(redis_error(e, what, &self.scripts.server)),
            Err(_) => Err(timed_out(what, &self.scripts.server, self.scripts.deadline)),
        }
    }
}

/// Every capability of the single server's store; claimable work is refused as on one
/// server.
impl Store for RedisClusterStore {
    fn name(&self) -> &'static str {
        "Redis Cluster"
    }

    baton_core::offers!(
        semaphore_store,
        rate_store,
        cache_store,
        idempotency_store,
        broadcast_store
    );
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
    fn urls_are_checked_before_any_io() {
        RedisClusterStore::check_url("redis+cluster://u:hunter2@127.0.0.1:1?min_replicas=1")
            .unwrap();
        let e =
            RedisClusterStore::check_url("redis+cluster://u:hunter2@127.0.0.1:1?min_replicas=33")
                .unwrap_err();
        assert!(e.is_invalid_input(), "{e}");
        assert!(!e.message().contains("hunter2"), "{e}");
        RedisClusterStore::check_url("redis+cluster://127.0.0.1:1,127.0.0.1:2").unwrap();
        let e = RedisClusterStore::check_url("redis://127.0.0.1:1").unwrap_err();
        assert!(e.is_invalid_input(), "{e}");
    }
}
