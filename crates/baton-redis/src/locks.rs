//! [`RedisStore`]: the atoms of [`LeaseStore`] as Lua scripts on one Redis server.

use std::collections::BTreeSet;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use baton_core::signals::{Handoffs, ReleaseHub};
use baton_core::store::{Claim, HolderInfo, LeaseRequest, LeaseStore, Release, Renewal, Wakeups};
use baton_core::telemetry::{self, events};
use baton_core::{Error, Fence, Holder, Result, StoreKey, Ttl};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{RedisError, ScriptInvocation, Value};
use tokio::time::{Instant, timeout, timeout_at};

use crate::connection::Link;
use crate::endpoint::Endpoint;
use crate::error::{redis_error, timed_out, unexpected};
use crate::keys;
use crate::options::RedisOptions;
use crate::scripts::{Evalsha, SCRIPTS, Sent, is_noscript};
use crate::server::{self, ServerInfo};
use crate::url::{self, Target};
use crate::wakeups::{DEGRADED_POLL, Identity, PushChannel};

/// How long a key's fence counter lives after its last grant, beyond that grant's TTL.
///
/// Each grant's fence is the larger of the counter plus one and the server's `TIME` in
/// microseconds, and is written back to the counter. The clock decides whenever the counter
/// is missing (a new key, a restart without persistence) or stale (a promoted replica that
/// missed the last grants), so fences keep increasing then too, as long as the server's
/// clock is not behind the one that handed out the earlier fences; while the counter exists,
/// it also guards against the server clock stepping back. Longer retention costs one small
/// key per recently used lock key.
pub const FENCE_RETENTION: Duration = Duration::from_secs(3600);

/// How many keys `list` reads per `SCAN` step and per pipelined batch of reads.
const SCAN_BATCH: usize = 500;

/// A [`LeaseStore`] on one Redis server (a single primary, possibly with replicas and
/// Sentinel in front; not Redis Cluster).
///
/// Use it when the processes to exclude run on several hosts and you already run Redis. For
/// processes on one host, the embedded SQLite store needs no server; for exclusion that
/// must survive a Redis failover, see the trade-offs in `docs/redis.md`.
///
/// Open it with [`RedisStore::connect`] (a URL, options in the query) or
/// [`RedisStore::open`] (a URL and [`RedisOptions`]); most code opens it through
/// `baton::connect("redis://...")`.
///
/// ## Behavior
/// - One multiplexed connection carries every request of the store, pipelined; it
///   reconnects by itself after the server restarts or the connection drops. One more
///   connection is subscribed to the store's own wake-up channel (see [`crate::wakeups`]).
/// - Waiting processes queue per key in Redis: a release hands the key to the process
///   that waited longest and wakes only that one; with nobody waiting it publishes nothing.
///   The release grants the key to that process's waiting holder itself, so the waiter
///   takes it without another round trip, except with `min_replicas` (a grant must be
///   confirmed by replicas first): the key is then reserved for that process, whose waiter
///   claims it.
/// - Every call answers within `connect_timeout + response_timeout` or fails with
///   `Unavailable`; a call that found the connection refused is tried once more on the new
///   connection, and so is an idempotent call (everything but `release`) whose connection
///   dropped.
/// - Expiry is Redis's (`PEXPIRE`, `PTTL`); a fence is the larger of a per-key counter plus
///   one and the server's `TIME` in microseconds, so fences keep increasing after a restart
///   without persistence and after a replica that missed grants is promoted.
/// - Connecting checks `maxmemory-policy` and emits a registered warning unless it is
///   `noeviction` (see [`ServerInfo`]).
///
/// Dropping the store closes both connections.
pub struct RedisStore {
    pub(crate) link: Arc<Link>,
    target: Target,
    options: RedisOptions,
    /// The channel this store listens on, `baton:wake:<db>:<random id>`; also its name in
    /// the queues of waiting stores.
    pub(crate) channel: String,
    /// The release script's last argument, made once: `1` (a waiter of this store waits for
    /// the key) or `0`, then the channel.
    pub(crate) release_waiting: String,
    pub(crate) release_idle: String,
    pub(crate) hub: Arc<ReleaseHub>,
    /// The grants releases handed to this store's waiting holders.
    handoffs: Arc<Handoffs>,
    /// Whether releases may hand keys to this store's holders: not with `min_replicas`,
    /// whose grants must be confirmed by replicas before anyone relies on them, which a
    /// hand-over message cannot wait for (its waiters take a reservation instead).
    hands_over: bool,
    pub(crate) push: PushChannel,
    /// The broadcast subscriber connection, started by the first subscription.
    broadcast: crate::broadcast::HubCell,
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore")
            .field("server", &self.target.redacted)
            .field("options", &self.options)
            .field("channel", &self.channel)
            .field("pubsub_healthy", &self.push.is_healthy())
            .finish()
    }
}

impl RedisStore {
    /// Opens the store named by a `redis://` or `rediss://` URL, with options in its query:
    /// `redis://[[user]:password@]host[:port][/db][?connect_timeout=2s&response_timeout=2s]`.
    ///
    /// # Errors
    /// `InvalidInput` for a malformed URL or option (before any I/O); `Unsupported` for
    /// `rediss://` in a build without the `tls` feature; `Unavailable` when the server cannot
    /// be reached, refuses the credentials, or cannot subscribe to the release channel.
    ///
    /// # Examples
    /// ```no_run
    /// # async fn example() -> baton_core::Result<()> {
    /// let store = baton_redis::RedisStore::connect("redis://cache.internal:6379/0?response_timeout=500ms").await?;
    /// # Ok(()) }
    /// ```
    pub async fn connect(url: &str) -> Result<Self> {
        let (target, options) = url::parse(url)?;
        RedisStore::start(target, options).await
    }

    /// Checks `url` as [`connect`](Self::connect) reads it, address and options, without
    /// any I/O: how a command line rejects a bad `--store` before it does anything.
    ///
    /// # Errors
    /// `InvalidInput`, as [`connect`](Self::connect) for the same URL.
    pub fn check_url(url: &str) -> Result<()> {
        let (target, options) = url::parse(url)?;
        options.validate()?;
        Endpoint::new(&target).map(drop)
    }

    /// Opens the store at `url` (which may not carry options in its query) with `options`.
    ///
    /// # Errors
    /// As [`RedisStore::connect`]; also `InvalidInput` when the URL has a query.
    pub async fn open(url: &str, options: RedisOptions) -> Result<Self> {
        let (target, from_url) = url::parse(url)?;
        if from_url != RedisOptions::new() || url.contains('?') {
            return Err(Error::invalid_input(format!(
                "store URL {:?} carries options; pass options either in the URL (RedisStore::connect) or as RedisOptions, not both",
                target.redacted
            )));
        }
        options.validate()?;
        RedisStore::start(target, options).await
    }

    async fn start(target: Target, options: RedisOptions) -> Result<Self> {
        let endpoint = Endpoint::new(&target)?;
        let server = target.redacted.clone();
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(options.get_connect_timeout()))
            .set_response_timeout(Some(options.get_response_timeout()))
            // One attempt per reconnect: a call never waits through a backoff series. The
            // next call after a failed attempt triggers the next attempt.
            .set_number_of_retries(0);
        let opened = endpoint.open(&config, &options, &server).await?;
        server::report_eviction_policy(&opened.info, &server);
        let link = Link::new(
            opened,
            endpoint.clone(),
            config,
            options.clone(),
            server.clone(),
        );
        let identity = Identity {
            // 64 random bits: the channels of the stores on one server never meet.
            channel: keys::wake_channel(target.db, &Holder::random().as_str()[..16]),
            link: Arc::clone(&link),
            server,
        };
        let channel = identity.channel.clone();
        let hub = Arc::new(ReleaseHub::new());
        let handoffs = Arc::new(Handoffs::new(Arc::clone(&hub), {
            let (link, hub) = (Arc::clone(&link), Arc::clone(&hub));
            let channel = channel.clone();
            let deadline = options.call_deadline();
            move |handoffs: &Arc<Handoffs>, key, holder| {
                give_back(
                    GiveBack {
                        link: Arc::clone(&link),
                        hub: Arc::clone(&hub),
                        handoffs: Arc::clone(handoffs),
                        channel: channel.clone(),
                        deadline,
                    },
                    key,
                    holder,
                );
            }
        }));
        let push = PushChannel::start(
            endpoint,
            identity,
            Arc::clone(&hub),
            Arc::clone(&handoffs),
            options.clone(),
        )
        .await?;
        Ok(RedisStore {
            hands_over: options.get_min_replicas() == 0,
            link,
            target,
            options,
            release_waiting: format!("1{channel}"),
            release_idle: format!("0{channel}"),
            channel,
            hub,
            handoffs,
            push,
            broadcast: Default::default(),
        })
    }

    /// The server's version and eviction policy, read now; for health checks such as
    /// `baton doctor`.
    ///
    /// # Errors
    /// `Unavailable` when the server cannot be reached. A server that refuses `CONFIG` is
    /// not an error: [`ServerInfo::maxmemory_policy`] is `None` then.
    pub async fn server_info(&self) -> Result<ServerInfo> {
        let mut conn = self.link.get();
        self.within("reading server info", server::read(&mut conn))
            .await
    }

    /// The options the store was opened with.
    pub fn options(&self) -> &RedisOptions {
        &self.options
    }

    /// Runs one script call and parses its answer, within the call deadline.
    ///
    /// A call that found the connection refused never reached the server, and is tried once
    /// more on the connection the manager is opening by then. A call whose connection
    /// dropped may or may not have run: it is tried once more too, and the second answer is
    /// taken only if `trust_retry` says it means the same whether or not the first attempt
    /// ran (always, for the idempotent atoms); otherwise the first error stands.
    ///
    /// The first request needs no timer of its own: the client's connect and response
    /// timeouts bound it to the call deadline (`connect_timeout + response_timeout`), and it
    /// is by far the most common case. Whatever follows it (loading the script after
    /// `NOSCRIPT`, the retry) runs within what is left of the deadline.
    pub(crate) async fn call<T>(
        &self,
        what: impl Fn() -> String,
        invocation: &Evalsha<'_>,
        parse: impl Fn(&Value) -> Option<T>,
        trust_retry: impl Fn(&T) -> bool,
    ) -> Result<T> {
        self.call_confirmed(what, invocation, parse, trust_retry)
            .await
            .map(|(answer, _)| answer)
    }

    /// [`RedisStore::call`] that also answers how many replicas acknowledged the call's
    /// writes, for an invocation [confirmed](Evalsha::confirmed_by) by replicas.
    pub(crate) async fn call_confirmed<T>(
        &self,
        what: impl Fn() -> String,
        invocation: &Evalsha<'_>,
        parse: impl Fn(&Value) -> Option<T>,
        trust_retry: impl Fn(&T) -> bool,
    ) -> Result<(T, Option<i64>)> {
        let deadline = self.options.call_deadline();
        let server = &self.target.redacted;
        let started = Instant::now();
        let mut conn = self.link.get();
        let answer = match invocation.send(&mut conn).await {
            Ok(sent) => Ok((sent, None)),
            Err(first) => {
                if first.is_timeout() {
                    self.link.timed_out();
                }
                self.link.failed(&first);
                let rest = finish(invocation, &mut conn, first);
                match timeout_at(started + deadline, rest).await {
                    Ok(answer) => answer,
                    Err(_) => {
                        self.link.timed_out();
                        return Err(timed_out(&what(), server, deadline));
                    }
                }
            }
        };
        let (sent, dropped) = answer.map_err(|e| redis_error(e, &what(), server))?;
        let parsed = parse(&sent.value)
            .ok_or_else(|| unexpected(&what(), server, format!("{:?}", sent.value)))?;
        match dropped {
            Some(error) if !trust_retry(&parsed) => Err(redis_error(error, &what(), server)),
            _ => Ok((parsed, sent.replicas)),
        }
    }

    /// Has `invocation` confirmed by `min_replicas` replicas, when the option asks for any.
    pub(crate) fn confirm(&self, invocation: &mut Evalsha<'_>) {
        confirm(&self.options, invocation);
    }

    /// Frees `holder`'s grant of `key`, a grant the replicas did not confirm, before the claim
    /// answers: the waiter that made it claims again as the same holder, and a release still
    /// in flight then could free the grant that later claim was answered as extended. A
    /// failure is only logged; the grant's TTL frees it then, and a later claim of the holder
    /// finds it its own.
    async fn give_back_unconfirmed(&self, key: &StoreKey, holder: &str) {
        let mut invocation = Evalsha::new(&SCRIPTS.release, 2, 0);
        invocation
            .arg(keys::grant(key))
            .arg(keys::queue(key))
            .arg(holder)
            .arg(&self.release_idle);
        send_unconfirmed_give_back(&self.link, self.options.call_deadline(), key, &invocation)
            .await;
    }

    /// Whether a write answered with `replicas` acknowledgements (`None`: not confirmed by
    /// replicas) has as many as `min_replicas` asks for; otherwise emits
    /// `baton.redis.replication_unconfirmed` and answers the `Unavailable` error to report.
    pub(crate) fn unconfirmed(&self, what: &str, replicas: Option<i64>) -> Option<Error> {
        unconfirmed(&self.options, &self.target.redacted, what, replicas)
    }

    async fn scan(&self, prefix: &str) -> Result<BTreeSet<StoreKey>> {
        self.scan_matching(&keys::grant_pattern(prefix), prefix, keys::from_grant_key)
            .await
    }

    /// The qualified keys that start with `prefix` of the Redis keys that `SCAN MATCH
    /// pattern` finds and `parse` reads back (a grant's `{Q}`, a semaphore's
    /// `{Q}:permits`), in key order.
    pub(crate) async fn scan_matching(
        &self,
        pattern: &str,
        prefix: &str,
        parse: fn(&str) -> Option<StoreKey>,
    ) -> Result<BTreeSet<StoreKey>> {
        let mut found = BTreeSet::new();
        let mut cursor: u64 = 0;
        loop {
            let mut conn = self.link.get();
            let mut scan = redis::cmd("SCAN");
            scan.arg(cursor)
                .arg("MATCH")
                .arg(pattern)
                .arg("COUNT")
                .arg(SCAN_BATCH);
            let step = scan.query_async::<(u64, Vec<String>)>(&mut conn);
            let (next, batch) = self.within("listing", step).await?;
            found.extend(
                batch
                    .iter()
                    .filter_map(|k| parse(k))
                    .filter(|k| k.as_str().starts_with(prefix)),
            );
            if next == 0 {
                return Ok(found);
            }
            cursor = next;
        }
    }

    /// Awaits one plain request within the call deadline.
    pub(crate) async fn within<T>(
        &self,
        what: &str,
        request: impl Future<Output = redis::RedisResult<T>>,
    ) -> Result<T> {
        let deadline = self.options.call_deadline();
        match timeout(deadline, request).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) => {
                if e.is_timeout() {
                    self.link.timed_out();
                }
                self.link.failed(&e);
                Err(redis_error(e, what, &self.target.redacted))
            }
            Err(_) => {
                self.link.timed_out();
                Err(timed_out(what, &self.target.redacted, deadline))
            }
        }
    }
}

/// What the other capabilities' atoms in this crate need (`cache`, `broadcast`).
impl RedisStore {
    /// The multiplexed connection.
    pub(crate) fn connection(&self) -> ConnectionManager {
        self.link.get()
    }

    /// The server, as messages name it (password redacted).
    pub(crate) fn server(&self) -> &str {
        &self.target.redacted
    }

    /// The database number.
    pub(crate) fn db(&self) -> i64 {
        self.target.db
    }

    /// A new client for a dedicated connection.
    pub(crate) fn endpoint(&self) -> Endpoint {
        self.link.endpoint().clone()
    }

    /// The broadcast subscriber connection's cell.
    pub(crate) fn broadcast_hub(&self) -> &crate::broadcast::HubCell {
        &self.broadcast
    }
}

#[async_trait]
impl LeaseStore for RedisStore {
    async fn claim(&self, key: &StoreKey, request: LeaseRequest<'_>) -> Result<Claim> {
        let (holder, ttl, reason) = (request.holder, request.ttl, request.reason);
        // A waiter of this process subscribes before it claims, so this tells whether the
        // store should queue for the key if it is held. The queue key and the store's channel
        // go only with such a claim: the uncontended one carries two keys and two arguments.
        let waiting = self.hub.has_waiters(key);
        // With a waiter, the claim may queue the store; if its holder waits and the store may
        // be handed keys, it also names the holder (`{Q}:who`), and a release grants the key
        // to it directly. Nothing of this touches the claim nobody here waits for.
        let mut hand_over = false;
        if waiting {
            if let Some(handed) = self.handoffs.take(key, holder) {
                // Trusted from memory while at least half its TTL is left; an older one is
                // confirmed by the claim below, which finds the key this holder's and extends it.
                if handed.since.elapsed() < ttl.get() / 2 {
                    return Ok(Claim::HandedOver {
                        fence: handed.fence,
                        since: handed.since,
                    });
                }
            }
            hand_over = self.hands_over
                && reason.is_empty()
                && self.handoffs.address().is_some()
                && self.hub.is_waiting(key, holder);
            if hand_over {
                self.handoffs.queueing(key, holder, Instant::now());
            }
        }
        let holder_id = holder;
        let holder = holder.as_str();
        let ttl = ttl.as_millis();
        let size = 4 * key.as_str().len() + holder.len() + reason.len() + self.channel.len();
        let key_count = match (waiting, hand_over) {
            (false, _) => 2,
            (true, false) => 3,
            (true, true) => 4,
        };
        let mut invocation = Evalsha::new(&SCRIPTS.claim, key_count, size);
        invocation.arg(keys::grant(key)).arg(keys::fence(key));
        if waiting {
            invocation.arg(keys::queue(key));
        }
        if hand_over {
            invocation.arg(keys::who(key));
        }
        invocation.arg(holder).arg(ttl);
        match (waiting, reason.is_empty()) {
            (true, true) => invocation.arg(&self.channel),
            (true, false) => invocation.arg(&self.channel).arg(reason),
            (false, true) => &mut invocation,
            (false, false) => invocation.arg("").arg(reason),
        };
        self.confirm(&mut invocation);
        let what = || format!("claim of {key}");
        let (claim, replicas) = self
            .call_confirmed(what, &invocation, parse_claim, |_| true)
            .await?;
        if waiting && let Claim::Granted { .. } | Claim::Extended { .. } = claim {
            self.handoffs.granted(key, holder_id);
        }
        if let Claim::Granted { .. } | Claim::Extended { .. } = claim
            && let Some(e) = self.unconfirmed(&what(), replicas)
        {
            // A grant that a failover could lose is not handed out: it is freed again. A
            // holder's own grant that was extended stays as it was.
            if let Claim::Granted { .. } = claim {
                self.give_back_unconfirmed(key, holder).await;
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
        let what = || format!("renewal of {key}");
        let parse = |v: &Value| match int(v)? {
            1 => Some(Renewal::Renewed),
            0 => Some(Renewal::NotHeld),
            _ => None,
        };
        self.confirm(&mut invocation);
        let (renew, replicas) = self
            .call_confirmed(what, &invocation, parse, |_| true)
            .await?;
        if renew == Renewal::Renewed
            && let Some(e) = self.unconfirmed(&what(), replicas)
        {
            return Err(e);
        }
        Ok(renew)
    }

    async fn release(&self, key: &StoreKey, holder: &Holder) -> Result<Release> {
        let store = if self.hub.has_waiters(key) {
            &self.release_waiting
        } else {
            &self.release_idle
        };
        let holder = holder.as_str();
        let size = 2 * key.as_str().len() + holder.len() + store.len();
        let mut invocation = Evalsha::new(&SCRIPTS.release, 2, size);
        invocation
            .arg(keys::grant(key))
            .arg(keys::queue(key))
            .arg(holder)
            .arg(store);
        let what = || format!("release of {key}");
        // A release retried after its connection dropped answers NoHolder if the first
        // attempt had removed the grant: that answer would report an expiry that did not
        // happen, so the fault is reported instead. Removed and Reclaimed are true either way.
        let trust = |r: &Released| r.release != Release::NoHolder;
        self.confirm(&mut invocation);
        let confirmed = self
            .call_confirmed(what, &invocation, parse_release, trust)
            .await
            .and_then(|(released, replicas)| match released.release {
                Release::Removed => match self.unconfirmed(&what(), replicas) {
                    Some(e) => Err(e),
                    None => Ok(released),
                },
                _ => Ok(released),
            });
        let released = match confirmed {
            Ok(released) => released,
            Err(e) => {
                // The release may have run and reserved the key for a waiter of this process,
                // which no message would wake: have this process's waiters look again.
                self.hub.notify(key);
                return Err(e);
            }
        };
        Ok(released.tell(&self.hub, &self.handoffs, key, self.push.is_healthy()))
    }

    async fn inspect(&self, key: &StoreKey) -> Result<Option<HolderInfo>> {
        let mut invocation = Evalsha::new(&SCRIPTS.inspect, 1, key.as_str().len());
        invocation.arg(keys::grant(key));
        let what = || format!("inspection of {key}");
        self.call(what, &invocation, |v| holder_info(key, v), |_| true)
            .await
    }

    async fn list(&self, prefix: &str, limit: usize) -> Result<Vec<HolderInfo>> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let candidates: Vec<StoreKey> = self.scan(prefix).await?.into_iter().collect();
        let mut found = Vec::new();
        for batch in candidates.chunks(SCAN_BATCH) {
            let invocations: Vec<ScriptInvocation<'_>> = batch
                .iter()
                .map(|key| {
                    let mut invocation = SCRIPTS.inspect.prepare_invoke();
                    invocation.key(keys::grant(key));
                    invocation
                })
                .collect();
            // Load the script in the same pipeline, so a SCRIPT FLUSH cannot fail the batch.
            let mut pipe = redis::pipe();
            pipe.load_script(&SCRIPTS.inspect).ignore();
            for invocation in &invocations {
                pipe.invoke_script(invocation);
            }
            let mut conn = self.link.get();
            let answers = self
                .within("listing", pipe.query_async::<Vec<Value>>(&mut conn))
                .await?;
            if answers.len() != batch.len() {
                return Err(unexpected(
                    "listing",
                    &self.target.redacted,
                    format!("{} answers to {} reads", answers.len(), batch.len()),
                ));
            }
            for (key, answer) in batch.iter().zip(&answers) {
                let info = holder_info(key, answer).ok_or_else(|| {
                    unexpected("listing", &self.target.redacted, format!("{answer:?}"))
                })?;
                // A grant that expired between the scan and the read is simply not listed.
                found.extend(info);
                if found.len() == limit {
                    return Ok(found);
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

/// What a store's give-back needs: see [`give_back`].
struct GiveBack {
    link: Arc<Link>,
    hub: Arc<ReleaseHub>,
    handoffs: Arc<Handoffs>,
    /// The store's channel.
    channel: String,
    deadline: Duration,
}

/// Releases, in the background, the grant a release handed to `holder`, who stopped
/// waiting before it arrived: the release hands the key to the next store in line (this
/// one, if another of its holders waits). A failure is only logged; the grant's TTL frees
/// the key then.
fn give_back(store: GiveBack, key: StoreKey, holder: Holder) {
    tokio::spawn(async move {
        let waiting = if store.hub.has_waiters(&key) {
            "1"
        } else {
            "0"
        };
        let mut invocation = Evalsha::new(&SCRIPTS.release, 2, 0);
        invocation
            .arg(keys::grant(&key))
            .arg(keys::queue(&key))
            .arg(holder.as_str())
            .arg(format!("{waiting}{}", store.channel));
        let mut conn = store.link.get();
        let sent = timeout(store.deadline, async {
            match invocation.send(&mut conn).await {
                Err(e) if is_noscript(&e) => reload_and_send(&invocation, &mut conn).await,
                sent => sent,
            }
        })
        .await;
        match sent
            .ok()
            .and_then(|sent| sent.ok())
            .and_then(|sent| parse_release(&sent.value))
        {
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

/// What follows a first attempt that failed with `first`: after `NOSCRIPT`, the script is
/// loaded and the call sent again; after a refused or dropped connection, the call is sent
/// once more (loading the script if the server restarted meanwhile). Answers the value and,
/// for a call retried after its connection dropped, the first error.
async fn finish(
    invocation: &Evalsha<'_>,
    conn: &mut ConnectionManager,
    first: RedisError,
) -> redis::RedisResult<(Sent, Option<RedisError>)> {
    let error = if is_noscript(&first) {
        match reload_and_send(invocation, conn).await {
            Ok(sent) => return Ok((sent, None)),
            Err(e) => e,
        }
    } else {
        first
    };
    if !(error.is_connection_refusal() || error.is_connection_dropped()) {
        return Err(error);
    }
    let again = match invocation.send(conn).await {
        Err(e) if is_noscript(&e) => reload_and_send(invocation, conn).await,
        again => again,
    };
    match again {
        Ok(sent) if error.is_connection_refusal() => Ok((sent, None)),
        Ok(sent) => Ok((sent, Some(error))),
        Err(_) => Err(error),
    }
}

/// Loads the script and sends the call again.
pub(crate) async fn reload_and_send(
    invocation: &Evalsha<'_>,
    conn: &mut ConnectionManager,
) -> redis::RedisResult<Sent> {
    invocation.load(conn).await?;
    invocation.send(conn).await
}

/// The answer of the claim script: the fence alone when granted.
pub(crate) fn parse_claim(value: &Value) -> Option<Claim> {
    let items = match value {
        Value::Int(_) => {
            return Some(Claim::Granted {
                fence: fence(value)?,
            });
        }
        Value::Array(items) => items,
        _ => return None,
    };
    match (int(items.first()?)?, items.len()) {
        (1, 2) => Some(Claim::Extended {
            fence: fence(&items[1])?,
        }),
        (2, 3) => Some(Claim::Held {
            holder: Holder::from_stored(text(&items[1])?),
            remaining: remaining(&items[2])?,
        }),
        _ => None,
    }
}

/// Has `invocation` confirmed by the replicas `options` ask for (`min_replicas`), if any:
/// a `WAIT` sent right after it, on the same connection. Both Redis stores confirm the same
/// writes this way: claims, renewals and releases of grants and permits.
pub(crate) fn confirm(options: &RedisOptions, invocation: &mut Evalsha<'_>) {
    let replicas = options.get_min_replicas();
    if replicas > 0 {
        invocation.confirmed_by(replicas, options.wait_millis());
    }
}

/// Whether a write to `server` answered with `replicas` acknowledgements (`None`: not
/// confirmed by replicas) has as many as `options`' `min_replicas`; otherwise emits
/// [`baton.redis.replication_unconfirmed`](events::REDIS_REPLICATION_UNCONFIRMED) and answers
/// the `Unavailable` error to report.
pub(crate) fn unconfirmed(
    options: &RedisOptions,
    server: &str,
    what: &str,
    replicas: Option<i64>,
) -> Option<Error> {
    let wanted = options.get_min_replicas();
    let replicas = replicas?;
    if replicas >= i64::from(wanted) {
        return None;
    }
    let message = format!(
        "{server}: {what} reached {replicas} of the {wanted} replicas min_replicas asks for within {}ms; it is not acknowledged",
        options.wait_millis()
    );
    telemetry::emit(
        &events::REDIS_REPLICATION_UNCONFIRMED,
        None,
        format_args!("{message}"),
    );
    Some(Error::unavailable(message))
}

/// Sends `invocation`, the release of a grant or permit the replicas did not confirm, and
/// waits up to `deadline` for its answer, which is only logged when it fails (the grant's TTL
/// ends it then).
pub(crate) async fn send_unconfirmed_give_back(
    link: &Link,
    deadline: Duration,
    key: &StoreKey,
    invocation: &Evalsha<'_>,
) {
    let mut conn = link.get();
    let sent = timeout(deadline, async {
        match invocation.send(&mut conn).await {
            Err(e) if is_noscript(&e) => reload_and_send(invocation, &mut conn).await,
            sent => sent,
        }
    })
    .await;
    if !matches!(sent, Ok(Ok(_))) {
        tracing::debug!(%key, "could not give back an unconfirmed grant; its TTL ends it");
    }
}

/// What the release script answered: the release, and whether the key went to this store.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Released {
    pub(crate) release: Release,
    /// The key is now reserved for a waiter of this store.
    to_this_store: bool,
    /// The key is now granted to a waiting holder of this store, with this fence.
    handed: Option<(Fence, Holder)>,
}

impl Released {
    /// Tells this process what the release did: a grant handed to one of its waiting holders
    /// goes to `handoffs` (it is told here, not by a message); a key reserved for its
    /// waiters, or freed while its push connection is down (`push_healthy` false: its
    /// waiters would not hear of a handoff), wakes them. Answers the release.
    pub(crate) fn tell(
        self,
        hub: &ReleaseHub,
        handoffs: &Arc<Handoffs>,
        key: &StoreKey,
        push_healthy: bool,
    ) -> Release {
        if let Some((fence, to)) = self.handed {
            match handoffs.address() {
                Some(address) => handoffs.arrived(address, key.clone(), to, fence),
                // Pub/sub is down: the holder's next claim finds the key its own.
                None => hub.notify(key),
            }
        } else if self.to_this_store || (self.release == Release::Removed && !push_healthy) {
            hub.notify(key);
        }
        self.release
    }
}

/// The answer of the release script: 0, 1 or 2, `{fence, holder}`, or the other holder's id.
pub(crate) fn parse_release(value: &Value) -> Option<Released> {
    if let Value::Array(items) = value {
        let [granted, to] = items.as_slice() else {
            return None;
        };
        return Some(Released {
            release: Release::Removed,
            to_this_store: false,
            handed: Some((fence(granted)?, Holder::from_stored(text(to)?))),
        });
    }
    let (release, to_this_store) = match value {
        Value::Int(0) => (Release::Removed, false),
        Value::Int(1) => (Release::Removed, true),
        Value::Int(2) => (Release::NoHolder, false),
        Value::BulkString(_) => (
            Release::Reclaimed {
                by: Holder::from_stored(text(value)?),
            },
            false,
        ),
        _ => return None,
    };
    Some(Released {
        release,
        to_this_store,
        handed: None,
    })
}

pub(crate) fn int(value: &Value) -> Option<i64> {
    match value {
        Value::Int(n) => Some(*n),
        Value::BulkString(b) => std::str::from_utf8(b).ok()?.parse().ok(),
        _ => None,
    }
}

pub(crate) fn text(value: &Value) -> Option<String> {
    match value {
        Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}

pub(crate) fn fence(value: &Value) -> Option<Fence> {
    let n = u64::try_from(int(value)?).ok()?;
    (n > 0).then_some(Fence::new(n))
}

/// A `PTTL` of a live grant. Negative values (no expiry, no key) are not answers the
/// scripts give for a live grant.
pub(crate) fn remaining(value: &Value) -> Option<Duration> {
    let ms = u64::try_from(int(value)?).ok()?;
    Some(Duration::from_millis(ms))
}

/// The answer of the inspect script: `Some(None)` for nil, `None` for a malformed answer.
pub(crate) fn holder_info(key: &StoreKey, value: &Value) -> Option<Option<HolderInfo>> {
    match value {
        Value::Nil => Some(None),
        Value::Array(items) if items.len() == 4 => Some(Some(HolderInfo {
            key: key.clone(),
            holder: Holder::from_stored(text(&items[0])?),
            fence: fence(&items[1])?,
            reason: text(&items[2])?,
            remaining: remaining(&items[3])?,
        })),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use baton_testkit::redis::RedisServer;

    use baton_testkit::redis::calls as ran;

    /// The calls the lock scripts make are what the benchmarks measure: the uncontended pair
    /// is two calls in each script, and a handoff makes no call it can do without. This pins
    /// them, so that a change to a script that adds work on these paths is a decision.
    #[tokio::test]
    async fn the_scripts_make_only_the_calls_their_paths_need() {
        let server = Arc::new(
            tokio::task::spawn_blocking(RedisServer::start)
                .await
                .unwrap()
                .expect("a private redis-server"),
        );
        let a = RedisStore::connect(&server.url()).await.unwrap();
        let b = RedisStore::connect(&server.url()).await.unwrap();
        let key = StoreKey::from_stored("t:lock:calls".to_owned());
        let ttl = Ttl::new(Duration::from_secs(10)).unwrap();
        let granted = |claim: Result<Claim>| match claim.unwrap() {
            Claim::Granted { fence } => fence,
            other => panic!("expected a grant, got {other:?}"),
        };
        // The first claim of a key creates its counter.
        let first = Holder::random();
        granted(a.claim(&key, LeaseRequest::new(&first, ttl)).await);
        assert_eq!(a.release(&key, &first).await.unwrap(), Release::Removed);

        let holder = Holder::random();
        let (claim, calls) = server
            .commands_during(a.claim(&key, LeaseRequest::new(&holder, ttl)))
            .await;
        granted(claim);
        assert_eq!(calls, ran(&[("evalsha", 1), ("time", 1), ("set", 2)]));
        let (release, calls) = server.commands_during(a.release(&key, &holder)).await;
        assert_eq!(release.unwrap(), Release::Removed);
        assert_eq!(calls, ran(&[("evalsha", 1), ("get", 1), ("del", 1)]));

        // A handoff to a waiter of another store: it queues, the release reserves the key
        // for it and tells it, and its claim takes the reservation.
        let (held, waiter) = (Holder::random(), Holder::random());
        granted(a.claim(&key, LeaseRequest::new(&held, ttl)).await);
        let _waiting = b.wakeups().hub.subscribe(&key);
        let (claim, calls) = server
            .commands_during(b.claim(&key, LeaseRequest::new(&waiter, ttl)))
            .await;
        assert!(matches!(claim.unwrap(), Claim::Held { .. }));
        assert_eq!(
            calls,
            ran(&[
                ("evalsha", 1),
                ("get", 1),
                ("pttl", 2),
                ("time", 1),
                ("zadd", 1),
                ("pexpire", 1),
                ("set", 1),
            ])
        );
        let (release, calls) = server.commands_during(a.release(&key, &held)).await;
        assert_eq!(release.unwrap(), Release::Removed);
        assert_eq!(
            calls,
            ran(&[
                ("evalsha", 1),
                ("get", 1),
                ("zrange", 1),
                ("zrem", 1),
                ("hget", 1),
                ("publish", 1),
                ("set", 1),
            ])
        );
        let (claim, calls) = server
            .commands_during(b.claim(&key, LeaseRequest::new(&waiter, ttl)))
            .await;
        granted(claim);
        assert_eq!(
            calls,
            ran(&[("evalsha", 1), ("get", 1), ("time", 1), ("set", 2)])
        );
        // Its grant is marked (others may wait): the release looks at the queue, finds it
        // empty, and deletes.
        let (release, calls) = server.commands_during(b.release(&key, &waiter)).await;
        assert_eq!(release.unwrap(), Release::Removed);
        assert_eq!(
            calls,
            ran(&[("evalsha", 1), ("get", 1), ("zrange", 1), ("del", 1)])
        );

        // A hand-over to a holder of another store that waits for the key: its claim also
        // names the holder, the release grants the key to it with the next fence and tells
        // its store, and the holder's next claim is answered from memory.
        let (held, waiter) = (Holder::random(), Holder::random());
        let fence = granted(a.claim(&key, LeaseRequest::new(&held, ttl)).await);
        let _waiting = b.wakeups().hub.subscribe_as(&key, &waiter);
        let (claim, calls) = server
            .commands_during(b.claim(&key, LeaseRequest::new(&waiter, ttl)))
            .await;
        assert!(matches!(claim.unwrap(), Claim::Held { .. }));
        assert_eq!(
            calls,
            ran(&[
                ("evalsha", 1),
                ("get", 1),
                ("pttl", 3),
                ("time", 1),
                ("zadd", 1),
                ("pexpire", 2),
                ("hset", 1),
                ("set", 1),
            ])
        );
        let (release, calls) = server.commands_during(a.release(&key, &held)).await;
        assert_eq!(release.unwrap(), Release::Removed);
        assert_eq!(
            calls,
            ran(&[
                ("evalsha", 1),
                ("get", 1),
                ("zrange", 1),
                ("zrem", 1),
                ("hget", 1),
                ("hdel", 1),
                ("time", 1),
                ("publish", 1),
                ("set", 2),
            ])
        );
        // The message arrives on b's pub/sub connection.
        let arrived = Instant::now() + Duration::from_secs(5);
        let handed = loop {
            if let Some(handed) = b.handoffs.take(&key, &waiter) {
                break handed;
            }
            assert!(Instant::now() < arrived, "the hand-over reaches b");
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        assert!(handed.fence > fence, "{handed:?} after {fence:?}");
    }

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn replies() {
        assert_eq!(
            fence(&bulk("1700000000000001")),
            Some(Fence::new(1_700_000_000_000_001))
        );
        assert_eq!(fence(&Value::Int(7)), Some(Fence::new(7)));
        assert_eq!(fence(&bulk("0")), None);
        assert_eq!(fence(&bulk("x")), None);
        assert_eq!(
            remaining(&Value::Int(1500)),
            Some(Duration::from_millis(1500))
        );
        assert_eq!(remaining(&Value::Int(-1)), None);
        let key = StoreKey::from_stored("ns:lock:k".into());
        assert_eq!(holder_info(&key, &Value::Nil), Some(None));
        let info = holder_info(
            &key,
            &Value::Array(vec![bulk("h"), bulk("42"), bulk(""), Value::Int(900)]),
        )
        .unwrap()
        .unwrap();
        assert_eq!(info.holder.as_str(), "h");
        assert_eq!(info.fence, Fence::new(42));
        assert_eq!(info.reason, "");
        assert_eq!(info.remaining, Duration::from_millis(900));
        assert_eq!(holder_info(&key, &Value::Int(1)), None);
        let array = |items: Vec<Value>| Value::Array(items);
        assert_eq!(
            parse_claim(&Value::Int(9)),
            Some(Claim::Granted {
                fence: Fence::new(9)
            })
        );
        assert_eq!(parse_claim(&Value::Int(0)), None);
        assert_eq!(
            parse_claim(&array(vec![Value::Int(1), bulk("9")])),
            Some(Claim::Extended {
                fence: Fence::new(9)
            })
        );
        assert_eq!(
            parse_claim(&array(vec![Value::Int(2), bulk("h"), Value::Int(5)])),
            Some(Claim::Held {
                holder: Holder::from_stored("h".into()),
                remaining: Duration::from_millis(5)
            })
        );
        assert_eq!(
            parse_claim(&array(vec![Value::Int(2), bulk("h"), Value::Int(-1)])),
            None
        );
        assert_eq!(parse_claim(&array(vec![Value::Int(0), bulk("9")])), None);
        assert_eq!(parse_claim(&Value::Nil), None);
        let released = |release, to_this_store| {
            Some(Released {
                release,
                to_this_store,
                handed: None,
            })
        };
        assert_eq!(
            parse_release(&array(vec![Value::Int(7), bulk("h")])),
            Some(Released {
                release: Release::Removed,
                to_this_store: false,
                handed: Some((Fence::new(7), Holder::from_stored("h".into()))),
            })
        );
        assert_eq!(parse_release(&array(vec![Value::Int(0), bulk("h")])), None);
        assert_eq!(parse_release(&array(vec![Value::Int(7)])), None);
        assert_eq!(
            parse_release(&Value::Int(0)),
            released(Release::Removed, false)
        );
        assert_eq!(
            parse_release(&Value::Int(1)),
            released(Release::Removed, true)
        );
        assert_eq!(
            parse_release(&bulk("b")),
            released(
                Release::Reclaimed {
                    by: Holder::from_stored("b".into())
                },
                false
            )
        );
        assert_eq!(
            parse_release(&Value::Int(2)),
            released(Release::NoHolder, false)
        );
        assert_eq!(parse_release(&Value::Int(3)), None);
        assert_eq!(parse_release(&array(vec![Value::Int(0)])), None);
        assert_eq!(
            holder_info(
                &key,
                &Value::Array(vec![bulk("h"), bulk("42"), bulk(""), Value::Int(-1)])
            ),
            None
        );
    }
}
