//! What `baton doctor` checks about a Redis server: [`inspect`] reads the facts
//! ([`ServerFacts`]) and [`diagnose`] judges them into a [`Report`] of checks with fixes.
//!
//! The facts are round-trip times, the server clock against this host's,
//! the eviction policy, the persistence settings, the replication role and whether cluster
//! mode is on.
//!
//! Inspecting opens one connection of its own (not the store's), sends only read commands
//! (`PING`, `TIME`, `INFO`, `CONFIG GET`) and closes it. A server that refuses `INFO` or
//! `CONFIG` (managed services often disable `CONFIG`; an ACL may deny either) leaves those
//! facts `None`; only a server that cannot be reached is an error.

use std::collections::BTreeMap;
use std::time::{Duration, Instant, SystemTime};

use baton_core::Result;
use baton_core::doctor::{self, Check, Report, clock_offset, millis, round_trip};
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, RedisResult, Value};
use tokio::time::timeout;

use crate::endpoint::Endpoint;
use crate::error::{redis_error, timed_out};
use crate::server::config_value;
use crate::url;

/// How many `PING`s measure the round trip.
pub const PINGS: usize = 5;

/// Facts about a Redis server, as read by [`inspect`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ServerFacts {
    /// The store URL with the password replaced by `***`.
    pub server: String,
    /// The store's response timeout (from the URL, else the default): a round trip close
    /// to it means calls will time out.
    pub response_timeout: Duration,
    /// The time of each of [`PINGS`] `PING`s, in order (the first includes nothing but
    /// the round trip: the connection is already open).
    pub round_trips: Vec<Duration>,
    /// The server's clock minus this host's, in microseconds, from `TIME` against the
    /// midpoint of the request; `None` when `TIME` was refused.
    pub clock_offset_micros: Option<i64>,
    /// Half the round trip of the `TIME` request: how far off [`clock_offset_micros`](Self::clock_offset_micros)
    /// may be.
    pub clock_uncertainty: Duration,
    /// `redis_version` from `INFO`.
    pub version: Option<String>,
    /// The `host:port` of the server read: through Sentinel, the primary it named.
    pub address: String,
    /// The master name, for a `redis+sentinel://` URL.
    pub sentinel_master: Option<String>,
    /// The store's `min_replicas` option (from the URL, else 0).
    pub min_replicas: u32,
    /// `role` from `INFO` (`master`, `slave`).
    pub role: Option<String>,
    /// `connected_slaves` from `INFO`: replicas connected to this primary.
    pub connected_replicas: Option<u32>,
    /// Each connected replica, from the `slaveN:` lines of `INFO`.
    pub replicas: Vec<ReplicaFacts>,
    /// `master_link_status` from `INFO`, on a replica (`up`, `down`).
    pub master_link_status: Option<String>,
    /// `cluster_enabled` from `INFO`.
    pub cluster_enabled: Option<bool>,
    /// `aof_enabled` from `INFO` (readable where `CONFIG` is not).
    pub aof_enabled: Option<bool>,
    /// `rdb_last_bgsave_status` and `aof_last_write_status` from `INFO`, when either is not
    /// `ok`.
    pub persistence_error: Option<String>,
    /// `CONFIG GET maxmemory-policy`.
    pub maxmemory_policy: Option<String>,
    /// `CONFIG GET maxmemory`, in bytes (0: no limit).
    pub maxmemory: Option<u64>,
    /// `CONFIG GET appendonly` (`yes`, `no`).
    pub appendonly: Option<String>,
    /// `CONFIG GET appendfsync` (`always`, `everysec`, `no`).
    pub appendfsync: Option<String>,
    /// `CONFIG GET save`: the RDB snapshot schedule, `""` when snapshots are off.
    pub save: Option<String>,
    /// The error of the first refused `CONFIG GET`, when `CONFIG` was refused.
    pub config_refused: Option<String>,
}

/// One replica of the primary, as `INFO replication` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReplicaFacts {
    /// `ip:port` as the replica announced it.
    pub address: String,
    /// `state` (`online` once synchronized).
    pub state: String,
    /// How far its acknowledged replication offset is behind the primary's, in bytes.
    pub behind_bytes: Option<u64>,
    /// `lag`: seconds since its last acknowledgement.
    pub lag_seconds: Option<u64>,
}

/// The replicas of an `INFO` reply (`slave0:ip=...,port=...,state=online,offset=...,lag=0`).
fn replicas(info: &BTreeMap<String, String>) -> Vec<ReplicaFacts> {
    let primary_offset: Option<u64> = info.get("master_repl_offset").and_then(|v| v.parse().ok());
    (0..)
        .map_while(|i| info.get(&format!("slave{i}")))
        .map(|line| {
            let field = |name: &str| {
                line.split(',')
                    .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
                    .map(str::to_owned)
            };
            let offset: Option<u64> = field("offset").and_then(|v| v.parse().ok());
            ReplicaFacts {
                address: format!(
                    "{}:{}",
                    field("ip").unwrap_or_default(),
                    field("port").unwrap_or_default()
                ),
                state: field("state").unwrap_or_default(),
                behind_bytes: primary_offset.zip(offset).map(|(p, o)| p.saturating_sub(o)),
                lag_seconds: field("lag").and_then(|v| v.parse().ok()),
            }
        })
        .collect()
}

/// Reads the facts about the server named by a `redis://` or `rediss://` URL, or about the
/// primary the sentinels of a `redis+sentinel://` URL name.
///
/// # Errors
/// `InvalidInput` for a malformed URL or option (as
/// [`RedisStore::connect`](crate::RedisStore::connect)); `Unsupported` for `rediss://`
/// without the `tls` feature; `Unavailable` when the server cannot be reached or does not
/// answer within the store's deadline (`connect_timeout + response_timeout`) per step.
pub async fn inspect(url: &str) -> Result<ServerFacts> {
    let (target, options) = url::parse(url)?;
    let server = target.redacted.clone();
    let deadline = options.call_deadline();
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(options.get_connect_timeout()))
        .set_response_timeout(Some(options.get_response_timeout()));
    let (client, address) = Endpoint::new(&target)?.client(&options, &server).await?;
    let mut conn = match timeout(
        deadline,
        client.get_multiplexed_async_connection_with_config(&config),
    )
    .await
    {
        Ok(Ok(conn)) => conn,
        Ok(Err(e)) => return Err(redis_error(e, "connecting", &server)),
        Err(_) => return Err(timed_out("connecting", &server, deadline)),
    };
    let step = |what: &'static str| (what, server.as_str(), deadline);

    let mut round_trips = Vec::with_capacity(PINGS);
    for _ in 0..PINGS {
        let started = Instant::now();
        let reply = within(
            step("PING"),
            redis::cmd("PING").query_async::<Value>(&mut conn),
        )
        .await?;
        if let Err(e) = reply {
            return Err(redis_error(e, "PING", &server));
        }
        round_trips.push(started.elapsed());
    }

    let (clock_offset_micros, clock_uncertainty) = read_clock(&mut conn, step("TIME")).await?;

    let info = match within(
        step("INFO"),
        redis::cmd("INFO").query_async::<String>(&mut conn),
    )
    .await?
    {
        Ok(text) => parse_info(&text),
        Err(_) => BTreeMap::new(),
    };
    let field = |name: &str| info.get(name).cloned();
    let persistence_error = ["rdb_last_bgsave_status", "aof_last_write_status"]
        .iter()
        .filter_map(|name| info.get(*name).map(|v| (name, v)))
        .filter(|(_, v)| v.as_str() != "ok")
        .map(|(name, v)| format!("{name}:{v}"))
        .reduce(|a, b| format!("{a}, {b}"));

    let mut config = BTreeMap::new();
    let mut config_refused = None;
    for name in [
        "maxmemory-policy",
        "maxmemory",
        "appendonly",
        "appendfsync",
        "save",
    ] {
        let reply = within(
            step("CONFIG GET"),
            redis::cmd("CONFIG")
                .arg("GET")
                .arg(name)
                .query_async::<Value>(&mut conn),
        )
        .await?;
        match reply {
            Ok(value) => {
                if let Some(value) = config_value(value) {
                    config.insert(name, value);
                }
            }
            Err(e) => {
                config_refused = Some(e.to_string());
                break;
            }
        }
    }

    Ok(ServerFacts {
        server,
        response_timeout: options.get_response_timeout(),
        round_trips,
        clock_offset_micros,
        clock_uncertainty,
        version: field("redis_version"),
        address,
        sentinel_master: target.sentinels.as_ref().map(|s| s.master.clone()),
        min_replicas: options.get_min_replicas(),
        role: field("role"),
        connected_replicas: field("connected_slaves").and_then(|v| v.parse().ok()),
        replicas: replicas(&info),
        master_link_status: field("master_link_status"),
        cluster_enabled: field("cluster_enabled").map(|v| v == "1"),
        aof_enabled: field("aof_enabled").map(|v| v == "1"),
        persistence_error,
        maxmemory_policy: config.get("maxmemory-policy").cloned(),
        maxmemory: config.get("maxmemory").and_then(|v| v.parse().ok()),
        appendonly: config.get("appendonly").cloned(),
        appendfsync: config.get("appendfsync").cloned(),
        save: config.get("save").cloned(),
        config_refused,
    })
}

/// Awaits one request within the deadline. An I/O error or a timeout is the outer error;
/// a refusal by the server (an error reply) is the inner one, for the caller to record.
async fn within<T>(
    (what, server, deadline): (&'static str, &str, Duration),
    request: impl Future<Output = RedisResult<T>>,
) -> Result<RedisResult<T>> {
    match timeout(deadline, request).await {
        Ok(Err(e)) if e.is_io_error() || e.is_timeout() => Err(redis_error(e, what, server)),
        Ok(answer) => Ok(answer),
        Err(_) => Err(timed_out(what, server, deadline)),
    }
}

/// The server clock minus the local clock (microseconds), and half the request's round
/// trip.
async fn read_clock(
    conn: &mut MultiplexedConnection,
    step: (&'static str, &str, Duration),
) -> Result<(Option<i64>, Duration)> {
    let before = SystemTime::now();
    let started = Instant::now();
    let reply = within(step, redis::cmd("TIME").query_async::<(i64, i64)>(conn)).await?;
    let round_trip = started.elapsed();
    let Ok((seconds, micros)) = reply else {
        return Ok((None, round_trip / 2));
    };
    let server_micros = seconds.saturating_mul(1_000_000).saturating_add(micros);
    Ok((
        Some(doctor::clock_offset_micros(
            server_micros,
            before,
            round_trip,
        )),
        round_trip / 2,
    ))
}

/// `name:value` lines of an `INFO` reply.
fn parse_info(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect()
}

/// Checks the Redis deployment named by a `redis://`, `rediss://` or `redis+sentinel://`
/// URL: the store is opened as an application opens it (scripts loaded, subscribed to
/// release messages), then [`inspect`] reads the facts and each is judged: round trip,
/// server version, role and cluster mode, the clock, replication, `maxmemory-policy` and
/// persistence.
///
/// # Errors
/// `InvalidInput` for a malformed URL or option; `Unsupported` for `rediss://` without the
/// `tls` feature. A server that cannot be reached is not an error: the report says so.
pub async fn diagnose(url: &str) -> Result<Report> {
    let started = Instant::now();
    // Opening the store as an application does checks script loading and the
    // subscription to release messages too.
    let store = match crate::RedisStore::connect(url).await {
        Ok(store) => store,
        Err(e) => return doctor::unreachable(url, e),
    };
    let opened = started.elapsed();
    drop(store);
    let facts = match inspect(url).await {
        Ok(facts) => facts,
        Err(e) => return doctor::unreachable(url, e),
    };
    Ok(Report::new(&facts.server, checks(&facts, opened)))
}

/// The slot map of a cluster as one node serves it: every master with its slot count and
/// replicas, and how the cluster judges itself (`CLUSTER INFO`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
struct ClusterMap {
    /// `host:port` of each master, with the slots it serves and its replicas' addresses,
    /// in the order `CLUSTER SLOTS` first names them.
    masters: Vec<(String, u16, u32, Vec<String>)>,
    /// `cluster_state` (`ok`, `fail`).
    state: Option<String>,
    /// `cluster_slots_ok`, `cluster_slots_pfail` and `cluster_slots_fail`.
    slots_ok: Option<u32>,
    slots_pfail: Option<u32>,
    slots_fail: Option<u32>,
}

/// How many slots a Redis Cluster has.
const SLOTS: u32 = 16_384;

/// Checks the Redis Cluster named by a `redis+cluster://` or `rediss+cluster://` URL: the
/// store is opened as an application opens it (scripts loaded on every master), the slot
/// map is read from the first seed node that answers (`CLUSTER SLOTS`, `CLUSTER INFO`), and
/// then every master is inspected as a single server is ([`inspect`]) and judged: round
/// trip, version and role, clock, its replicas, `maxmemory-policy` and persistence, each
/// check naming the master.
///
/// # Errors
/// `InvalidInput` for a malformed URL or option; `Unsupported` for what
/// [`RedisClusterStore::connect`](crate::RedisClusterStore::connect) refuses. A cluster
/// that cannot be reached is not an error: the report says so.
pub async fn diagnose_cluster(url: &str) -> Result<Report> {
    let started = Instant::now();
    let store = match crate::RedisClusterStore::connect(url).await {
        Ok(store) => store,
        Err(e) => return doctor::unreachable(url, e),
    };
    let opened = started.elapsed();
    drop(store);
    let (target, options) = url::parse_cluster(url)?;
    let query = url.split_once('?').map(|(_, q)| q).unwrap_or("");
    let map = match read_cluster_map(&target, &options).await {
        Ok(map) => map,
        Err(e) => return doctor::unreachable(url, e),
    };
    let mut checks = Vec::new();
    // The masters without a replica, by what each says of itself (INFO), else by the slot
    // map (whose replicas a node learns by gossip, so a young cluster's may lag).
    let mut without_replica = Vec::new();
    for (host, port, slots, replicas) in &map.masters {
        let mut node = target.node_url(host, *port);
        if !query.is_empty() {
            node = format!("{node}?{query}");
        }
        let address = url::host_port(host, *port);
        let inspected = inspect(&node).await;
        let replicated = match &inspected {
            Ok(facts) => facts
                .connected_replicas
                .map_or(!replicas.is_empty(), |n| n > 0),
            Err(_) => !replicas.is_empty(),
        };
        if !replicated {
            without_replica.push(address.clone());
        }
        match inspected {
            Ok(facts) => {
                let judged = [
                    round_trip(
                        format!(
                            "master {address} ({slots} slots); the store opened in {} (scripts loaded on every master); PING",
                            millis(opened)
                        ),
                        &facts.round_trips,
                        facts.response_timeout,
                    ),
                    cluster_node(&facts),
                    clock(&facts),
                    replication(&facts),
                    eviction(&facts),
                ];
                checks.extend(
                    judged
                        .into_iter()
                        .chain(persistence(&facts))
                        .map(|check| on_master(check, &address)),
                );
            }
            Err(e) => checks.push(Check::finding(
                "master",
                format!("master {address} ({slots} slots) could not be inspected: {e}"),
                "check that every master is reachable from this host with the store's credentials",
            )),
        }
    }
    checks.insert(0, slot_coverage(&map, &without_replica));
    Ok(Report::new(&target.redacted, checks))
}

/// `check`, its detail naming the master it is about (the round trip's names it already).
fn on_master(mut check: Check, address: &str) -> Check {
    if !check.detail.starts_with("master ") {
        check.detail = format!("master {address}: {}", check.detail);
    }
    check
}

/// Version and role of a cluster's master: cluster mode is expected there.
fn cluster_node(facts: &ServerFacts) -> Check {
    let version = facts.version.as_deref().unwrap_or("unknown");
    let role = facts.role.as_deref().unwrap_or("unknown");
    let detail = format!("Redis {version}, role {role}, cluster mode on");
    let major: Option<u32> = facts
        .version
        .as_deref()
        .and_then(|v| v.split('.').next())
        .and_then(|m| m.parse().ok());
    if facts.role.as_deref().is_some_and(|r| r != "master") {
        Check::finding(
            "server",
            format!(
                "{detail}: the slot map names it a master, but it says it is a replica (a failover in progress?)"
            ),
            "run baton doctor again once the cluster is stable; if it persists, check CLUSTER NODES",
        )
    } else if major.is_some_and(|m| m < 7) {
        Check::finding(
            "server",
            format!("{detail}: baton on a cluster needs Redis 7 or newer (sharded pub/sub)"),
            "upgrade the cluster's nodes",
        )
    } else {
        Check::ok("server", detail)
    }
}

/// Whether every slot is served, by how many masters, and which of them have no replica.
fn slot_coverage(map: &ClusterMap, without_replica: &[String]) -> Check {
    let served: u32 = map.masters.iter().map(|(_, _, slots, _)| slots).sum();
    let state = map.state.as_deref().unwrap_or("unknown");
    let detail = format!(
        "{served} of {SLOTS} slots served by {} master(s), cluster_state {state} (slots ok {}, pfail {}, fail {})",
        map.masters.len(),
        count(map.slots_ok),
        count(map.slots_pfail),
        count(map.slots_fail),
    );
    if served < SLOTS || map.state.as_deref().is_some_and(|s| s != "ok") {
        Check::finding(
            "slots",
            format!("{detail}: keys whose slot is not served can be neither locked nor released"),
            "assign every slot (redis-cli --cluster fix) and bring failed masters back",
        )
    } else if map.slots_pfail.unwrap_or(0) + map.slots_fail.unwrap_or(0) > 0 {
        Check::finding(
            "slots",
            format!(
                "{detail}: a master is failing; its keys' grants wait for its replica's promotion"
            ),
            "check the failing master (CLUSTER NODES)",
        )
    } else if !without_replica.is_empty() {
        Check::note(
            "slots",
            format!(
                "{detail}; without a replica: {}: if one of them is lost, its slots are down until it is back, with every grant on it",
                without_replica.join(", ")
            ),
            Some("give every master a replica".into()),
        )
    } else {
        Check::ok("slots", format!("{detail}; every master has a replica"))
    }
}

fn count(n: Option<u32>) -> String {
    n.map_or("unknown".into(), |n| n.to_string())
}

/// Reads the slot map from the first seed node that answers.
async fn read_cluster_map(
    target: &url::ClusterTarget,
    options: &crate::RedisOptions,
) -> Result<ClusterMap> {
    let deadline = options.call_deadline();
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(options.get_connect_timeout()))
        .set_response_timeout(Some(options.get_response_timeout()));
    let mut last = None;
    for (seed, (host, port)) in target.seed_urls().iter().zip(&target.seeds) {
        let address = url::host_port(host, *port);
        let step = |what: &'static str| (what, address.as_str(), deadline);
        let read = async {
            let client = redis::Client::open(seed.as_str())
                .map_err(|e| redis_error(e, "connecting", &address))?;
            let mut conn = match timeout(
                deadline,
                client.get_multiplexed_async_connection_with_config(&config),
            )
            .await
            {
                Ok(Ok(conn)) => conn,
                Ok(Err(e)) => return Err(redis_error(e, "connecting", &address)),
                Err(_) => return Err(timed_out("connecting", &address, deadline)),
            };
            let slots = within(
                step("CLUSTER SLOTS"),
                redis::cmd("CLUSTER")
                    .arg("SLOTS")
                    .query_async::<Value>(&mut conn),
            )
            .await?
            .map_err(|e| redis_error(e, "CLUSTER SLOTS", &address))?;
            let info = within(
                step("CLUSTER INFO"),
                redis::cmd("CLUSTER")
                    .arg("INFO")
                    .query_async::<String>(&mut conn),
            )
            .await?
            .map(|text| parse_info(&text))
            .unwrap_or_default();
            Ok(cluster_map(&slots, &info, host))
        };
        match read.await {
            Ok(map) => return Ok(map),
            Err(e) => last = Some(e),
        }
    }
    Err(last
        .unwrap_or_else(|| baton_core::Error::invalid_input("a cluster URL without seed nodes")))
}

/// The slot map of a `CLUSTER SLOTS` reply and a `CLUSTER INFO` one; a node that announces
/// no address is at `seed_host`, the host it was reached at.
fn cluster_map(slots: &Value, info: &BTreeMap<String, String>, seed_host: &str) -> ClusterMap {
    let mut masters: Vec<(String, u16, u32, Vec<String>)> = Vec::new();
    let node = |value: &Value| -> Option<(String, u16)> {
        let Value::Array(fields) = value else {
            return None;
        };
        let host = match fields.first()? {
            Value::BulkString(bytes) => String::from_utf8_lossy(bytes).into_owned(),
            Value::SimpleString(text) => text.clone(),
            _ => return None,
        };
        let host = if host.is_empty() || host == "?" {
            seed_host.to_owned()
        } else {
            host
        };
        let port = match fields.get(1)? {
            Value::Int(port) => u16::try_from(*port).ok()?,
            _ => return None,
        };
        Some((host, port))
    };
    if let Value::Array(ranges) = slots {
        for range in ranges {
            let Value::Array(fields) = range else {
                continue;
            };
            let (Some(Value::Int(start)), Some(Value::Int(end)), Some(master)) =
                (fields.first(), fields.get(1), fields.get(2).and_then(node))
            else {
                continue;
            };
            let count = u32::try_from(end - start + 1).unwrap_or(0);
            let replicas: Vec<String> = fields[3..]
                .iter()
                .filter_map(node)
                .map(|(h, p)| url::host_port(&h, p))
                .collect();
            match masters
                .iter_mut()
                .find(|(h, p, _, _)| (h.as_str(), *p) == (master.0.as_str(), master.1))
            {
                Some(known) => {
                    known.2 += count;
                    for replica in replicas {
                        if !known.3.contains(&replica) {
                            known.3.push(replica);
                        }
                    }
                }
                None => masters.push((master.0, master.1, count, replicas)),
            }
        }
    }
    let number = |name: &str| info.get(name).and_then(|v| v.parse().ok());
    ClusterMap {
        masters,
        state: info.get("cluster_state").cloned(),
        slots_ok: number("cluster_slots_ok"),
        slots_pfail: number("cluster_slots_pfail"),
        slots_fail: number("cluster_slots_fail"),
    }
}

fn checks(facts: &ServerFacts, opened: Duration) -> Vec<Check> {
    let mut checks = vec![
        round_trip(
            format!(
                "opened the store in {} (scripts loaded, subscribed to release messages); PING",
                millis(opened)
            ),
            &facts.round_trips,
            facts.response_timeout,
        ),
        server(facts),
    ];
    checks.push(clock(facts));
    checks.push(replication(facts));
    checks.push(eviction(facts));
    checks.extend(persistence(facts));
    checks
}

fn server(facts: &ServerFacts) -> Check {
    let version = facts.version.as_deref().unwrap_or("unknown");
    let role = facts.role.as_deref().unwrap_or("unknown");
    let detail = format!(
        "Redis {version}, role {role}, cluster mode {}",
        match facts.cluster_enabled {
            Some(true) => "on",
            Some(false) => "off",
            None => "unknown",
        }
    );
    let major: Option<u32> = facts
        .version
        .as_deref()
        .and_then(|v| v.split('.').next())
        .and_then(|m| m.parse().ok());
    if facts.cluster_enabled == Some(true) {
        Check::finding(
            "server",
            format!(
                "{detail}: this server is a node of a Redis Cluster, and a redis:// URL reaches only the slots it serves"
            ),
            "name the cluster with a redis+cluster:// URL (its nodes as seeds), which baton doctor also checks master by master",
        )
    } else if facts.role.as_deref().is_some_and(|r| r != "master") {
        Check::finding(
            "server",
            format!("{detail}: a replica refuses writes (READONLY), so no lock can be taken"),
            "point the store URL at the primary",
        )
    } else if major.is_some_and(|m| m < 5) {
        Check::finding(
            "server",
            format!(
                "{detail}: baton needs Redis 5 or newer (scripts that replicate their effects)"
            ),
            "upgrade Redis",
        )
    } else {
        Check::ok("server", detail)
    }
}

fn clock(facts: &ServerFacts) -> Check {
    let Some(offset) = facts.clock_offset_micros else {
        return Check::finding(
            "clock",
            "TIME was refused; the claim script reads TIME to seed fences, so claims will fail too",
            "allow +time for baton's user in the server's ACL (see docs/redis.md, Permissions)",
        );
    };
    let (offset, far) = clock_offset(offset, facts.clock_uncertainty);
    let detail = format!(
        "{offset}; expiry is decided by Redis alone, and fences are seeded from the server clock"
    );
    if far {
        Check::finding(
            "clock",
            format!(
                "{detail}: clocks this far apart mean one is not synchronized, and a server clock that steps back after the server loses its data (a restart without persistence, a failover) can hand out smaller fences than before, which fenced resources reject"
            ),
            "synchronize the clocks of the server and of this host with NTP (chrony, systemd-timesyncd)",
        )
    } else {
        Check::ok("clock", detail)
    }
}

/// The primary's replicas, their lag, and what a promotion would mean for grants and
/// fences.
fn replication(facts: &ServerFacts) -> Check {
    let via = match &facts.sentinel_master {
        Some(master) => format!(
            "primary of {master:?} (through Sentinel) at {}",
            facts.address
        ),
        None => format!("server at {}", facts.address),
    };
    let fences = "fences never fall below the server clock, so a promoted replica keeps them increasing as long as its clock is not behind this server's by more than the time since the last grant it received";
    let online = facts
        .replicas
        .iter()
        .filter(|r| r.state == "online")
        .count();
    let listed = facts
        .replicas
        .iter()
        .map(|r| {
            let lag = r.lag_seconds.map_or("unknown".into(), |l| format!("{l}s"));
            let behind = r
                .behind_bytes
                .map_or("unknown".into(), |b| format!("{b} bytes"));
            format!("{} {} (lag {lag}, behind {behind})", r.address, r.state)
        })
        .collect::<Vec<_>>()
        .join(", ");
    let Some(connected) = facts.connected_replicas else {
        return Check::note(
            "replication",
            format!("{via}: the replication state could not be read (INFO was refused)"),
            Some("check the replicas where the servers are configured".into()),
        );
    };
    let min = facts.min_replicas;
    if min > 0 && online < min as usize {
        return Check::finding(
            "replication",
            format!(
                "{via}: min_replicas={min}, but {online} of {connected} replicas are online ({}): every claim, renewal and release waits out the response timeout and is Unavailable",
                if listed.is_empty() {
                    "none".into()
                } else {
                    listed
                }
            ),
            "bring the replicas back, or lower min_replicas in the store URL",
        );
    }
    if connected == 0 {
        return Check::ok(
            "replication",
            format!(
                "{via}: role master, no replicas; grants live on this server alone (see persistence), and {fences}"
            ),
        );
    }
    let grants = if min > 0 {
        format!(
            "min_replicas={min}: every acknowledged grant is on {min} replica(s) too, so a promoted one has it"
        )
    } else {
        "min_replicas=0: replication is asynchronous, so a replica promoted after this server is lost misses the grants it had not received, and their keys can be granted again beside the old holders".into()
    };
    Check::ok(
        "replication",
        format!("{via}: role master, {connected} replica(s): {listed}; {grants}; {fences}"),
    )
}

fn eviction(facts: &ServerFacts) -> Check {
    let limit = match facts.maxmemory {
        Some(0) => " (maxmemory is 0: no limit is set, so eviction starts only once one is)",
        _ => "",
    };
    match facts.maxmemory_policy.as_deref() {
        Some("noeviction") => Check::ok(
            "maxmemory-policy",
            "maxmemory-policy is noeviction: lock keys are never evicted",
        ),
        Some(policy) => Check::finding(
            "maxmemory-policy",
            format!(
                "maxmemory-policy is {policy}{limit}: under memory pressure Redis may evict lock keys and hand a held lock to a second holder"
            ),
            "set maxmemory-policy noeviction (CONFIG SET maxmemory-policy noeviction, and in redis.conf or the provider's parameter group so it survives a restart), or give baton a Redis of its own",
        ),
        None => Check::note(
            "maxmemory-policy",
            format!(
                "maxmemory-policy could not be read (CONFIG GET was refused: {})",
                facts.config_refused.as_deref().unwrap_or("no answer")
            ),
            Some("confirm in the provider's settings that maxmemory-policy is noeviction".into()),
        ),
    }
}

fn persistence(facts: &ServerFacts) -> Vec<Check> {
    let mut checks = Vec::new();
    if let Some(error) = &facts.persistence_error {
        checks.push(Check::finding(
            "persistence",
            format!("the last persistence write failed ({error}); by default Redis then refuses writes, so no lock can be taken"),
            "check the server's disk space and log, and its dir and permissions",
        ));
    }
    let aof = match (facts.appendonly.as_deref(), facts.aof_enabled) {
        (Some(v), _) => Some(v == "yes"),
        (None, known) => known,
    };
    let save = facts.save.as_deref().map(str::trim);
    let fences = "fences keep increasing across restarts either way (never below the server clock)";
    let check = match (aof, facts.appendfsync.as_deref(), save) {
        (Some(true), Some("always"), _) => Check::ok(
            "persistence",
            format!("appendonly yes, appendfsync always: grants survive a restart of this primary; {fences}"),
        ),
        (Some(true), fsync, _) => Check::note(
            "persistence",
            format!(
                "appendonly yes, appendfsync {}: a crash loses up to the last second of grants, whose holders keep running beside the next holders until their own TTL; {fences}",
                fsync.unwrap_or("unknown")
            ),
            Some("for exclusion across restarts set appendfsync always; either way pass fences to what you protect".into()),
        ),
        (Some(false), _, Some(schedule)) if !schedule.is_empty() => Check::note(
            "persistence",
            format!(
                "appendonly no, RDB snapshots (save \"{schedule}\"): a restart loses every grant made since the last snapshot, and their holders keep running beside the next holders until their own TTL; {fences}"
            ),
            Some("enable appendonly with appendfsync always, or keep a restarted server out of service for longer than your longest lock TTL".into()),
        ),
        (Some(false), _, Some(_)) => Check::note(
            "persistence",
            format!(
                "no persistence (appendonly no, save \"\"): a restart frees every lock at once while its holders keep running until their own TTL; {fences}"
            ),
            Some("keep a restarted server out of service for longer than your longest lock TTL, or enable appendonly with appendfsync always; pass fences to what you protect".into()),
        ),
        _ => Check::note(
            "persistence",
            "the persistence settings could not be read (CONFIG GET was refused)",
            Some("check appendonly, appendfsync and save in the provider's settings; docs/redis.md says what each means for exclusion".into()),
        ),
    };
    checks.push(check);
    checks
}

#[cfg(test)]
mod tests {
    use baton_core::doctor::Verdict;

    use super::*;

    fn healthy() -> ServerFacts {
        ServerFacts {
            server: "redis://:***@cache:6379".into(),
            response_timeout: Duration::from_secs(2),
            round_trips: vec![Duration::from_micros(200); PINGS],
            clock_offset_micros: Some(150),
            clock_uncertainty: Duration::from_micros(100),
            version: Some("7.2.4".into()),
            address: "cache:6379".into(),
            sentinel_master: None,
            min_replicas: 0,
            role: Some("master".into()),
            connected_replicas: Some(0),
            replicas: Vec::new(),
            master_link_status: None,
            cluster_enabled: Some(false),
            aof_enabled: Some(true),
            persistence_error: None,
            maxmemory_policy: Some("noeviction".into()),
            maxmemory: Some(0),
            appendonly: Some("yes".into()),
            appendfsync: Some("always".into()),
            save: Some(String::new()),
            config_refused: None,
        }
    }

    /// The verdict of the one check named `name`.
    fn verdict(facts: &ServerFacts, name: &str) -> Check {
        let found: Vec<_> = checks(facts, Duration::from_millis(3))
            .into_iter()
            .filter(|c| c.name == name)
            .collect();
        assert_eq!(found.len(), 1, "{name}: {found:?}");
        found.into_iter().next().unwrap()
    }

    #[test]
    fn a_healthy_server_has_no_findings() {
        let checks = checks(&healthy(), Duration::from_millis(3));
        let names: Vec<_> = checks.iter().map(|c| c.name).collect();
        assert_eq!(
            names,
            [
                "connect",
                "server",
                "clock",
                "replication",
                "maxmemory-policy",
                "persistence"
            ]
        );
        assert!(
            checks.iter().all(|c| c.verdict == Verdict::Ok),
            "{checks:#?}"
        );
    }

    #[test]
    fn unsafe_settings_are_findings_with_fixes() {
        let evicting = ServerFacts {
            maxmemory_policy: Some("allkeys-lru".into()),
            ..healthy()
        };
        let check = verdict(&evicting, "maxmemory-policy");
        assert_eq!(check.verdict, Verdict::Finding);
        assert!(check.fix.unwrap().contains("noeviction"));

        let cluster = ServerFacts {
            cluster_enabled: Some(true),
            ..healthy()
        };
        assert_eq!(verdict(&cluster, "server").verdict, Verdict::Finding);
        let replica = ServerFacts {
            role: Some("slave".into()),
            ..healthy()
        };
        assert!(verdict(&replica, "server").detail.contains("READONLY"));

        let drifting = ServerFacts {
            clock_offset_micros: Some(-5_000_000),
            ..healthy()
        };
        let check = verdict(&drifting, "clock");
        assert_eq!(check.verdict, Verdict::Finding);
        assert!(
            check.detail.starts_with("the server clock is 5.00s behind"),
            "{check:?}"
        );
        let no_time = ServerFacts {
            clock_offset_micros: None,
            ..healthy()
        };
        assert!(verdict(&no_time, "clock").fix.unwrap().contains("+time"));

        let waiting = ServerFacts {
            min_replicas: 1,
            ..healthy()
        };
        let check = verdict(&waiting, "replication");
        assert_eq!(check.verdict, Verdict::Finding);
        assert!(
            check.detail.contains("0 of 0 replicas are online"),
            "{check:?}"
        );
    }

    #[test]
    fn persistence_is_a_note_unless_every_write_is_synced() {
        let everysec = ServerFacts {
            appendfsync: Some("everysec".into()),
            ..healthy()
        };
        assert_eq!(verdict(&everysec, "persistence").verdict, Verdict::Note);
        let none = ServerFacts {
            appendonly: Some("no".into()),
            ..healthy()
        };
        let check = verdict(&none, "persistence");
        assert_eq!(check.verdict, Verdict::Note);
        assert!(check.detail.starts_with("no persistence"), "{check:?}");
        let refused = ServerFacts {
            appendonly: None,
            aof_enabled: None,
            appendfsync: None,
            save: None,
            maxmemory_policy: None,
            config_refused: Some("NOPERM".into()),
            ..healthy()
        };
        assert_eq!(verdict(&refused, "persistence").verdict, Verdict::Note);
        let check = verdict(&refused, "maxmemory-policy");
        assert_eq!(check.verdict, Verdict::Note);
        assert!(check.detail.contains("NOPERM"), "{check:?}");
    }

    #[test]
    fn info_lines() {
        let info = parse_info(
            "# Server\r\nredis_version:7.0.15\r\nrole:master\r\n\r\ncluster_enabled:0\r\n",
        );
        assert_eq!(info["redis_version"], "7.0.15");
        assert_eq!(info["role"], "master");
        assert_eq!(info["cluster_enabled"], "0");
        assert!(!info.contains_key("# Server"));
        let info = parse_info(
            "role:master\r\nconnected_slaves:2\r\nslave0:ip=127.0.0.1,port=6380,state=online,offset=90,lag=0\r\nslave1:ip=10.0.0.2,port=6379,state=wait_bgsave,offset=0,lag=3\r\nmaster_repl_offset:100\r\n",
        );
        let found = replicas(&info);
        assert_eq!(found.len(), 2);
        assert_eq!(found[0].address, "127.0.0.1:6380");
        assert_eq!(found[0].state, "online");
        assert_eq!(found[0].behind_bytes, Some(10));
        assert_eq!(found[0].lag_seconds, Some(0));
        assert_eq!(found[1].behind_bytes, Some(100));
        assert_eq!(found[1].lag_seconds, Some(3));
    }

    fn node(ip: &str, port: i64) -> Value {
        Value::Array(vec![
            Value::BulkString(ip.as_bytes().to_vec()),
            Value::Int(port),
            Value::BulkString(b"id".to_vec()),
        ])
    }

    #[test]
    fn a_slot_map_counts_slots_per_master_and_unserved_slots_are_a_finding() {
        let slots = Value::Array(vec![
            Value::Array(vec![
                Value::Int(0),
                Value::Int(99),
                node("10.0.0.1", 7000),
                node("10.0.0.4", 7000),
            ]),
            Value::Array(vec![Value::Int(100), Value::Int(8000), node("", 7001)]),
            Value::Array(vec![
                Value::Int(8001),
                Value::Int(8100),
                node("10.0.0.1", 7000),
            ]),
        ]);
        let info = parse_info("cluster_state:fail\r\ncluster_slots_ok:8101\r\n");
        let map = cluster_map(&slots, &info, "seed");
        assert_eq!(
            map.masters,
            [
                (
                    "10.0.0.1".to_owned(),
                    7000,
                    200,
                    vec!["10.0.0.4:7000".to_owned()]
                ),
                ("seed".to_owned(), 7001, 7901, vec![]),
            ]
        );
        let check = slot_coverage(&map, &["seed:7001".to_owned()]);
        assert_eq!(check.verdict, Verdict::Finding, "{check:?}");
        assert!(
            check
                .detail
                .starts_with("8101 of 16384 slots served by 2 master(s), cluster_state fail"),
            "{check:?}"
        );
    }
}
