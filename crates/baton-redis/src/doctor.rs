//! What `baton doctor` reads about a Redis server: [`inspect`] returns [`ServerFacts`].
//!
//! These are facts, not verdicts: round-trip times, the server clock against this host's,
//! the eviction policy, the persistence settings, the replication role and whether cluster
//! mode is on. The `baton` facade turns them into findings with fixes.
//!
//! Inspecting opens one connection of its own (not the store's), sends only read commands
//! (`PING`, `TIME`, `INFO`, `CONFIG GET`) and closes it. A server that refuses `INFO` or
//! `CONFIG` (managed services often disable `CONFIG`; an ACL may deny either) leaves those
//! facts `None`; only a server that cannot be reached is an error.

use std::collections::BTreeMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use baton_core::Result;
use redis::aio::MultiplexedConnection;
use redis::io::tcp::TcpSettings;
use redis::{AsyncConnectionConfig, Client, IntoConnectionInfo, RedisResult, Value};
use tokio::time::timeout;

use crate::error::{redis_error, timed_out};
use crate::url::{self, Target};

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
    /// `role` from `INFO` (`master`, `slave`).
    pub role: Option<String>,
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

/// Reads the facts about the server named by a `redis://` or `rediss://` URL.
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
    let client = client(&target)?;
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
        role: field("role"),
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
    let local_mid = before + round_trip / 2;
    let local_micros = match local_mid.duration_since(UNIX_EPOCH) {
        Ok(since) => i64::try_from(since.as_micros()).unwrap_or(i64::MAX),
        Err(before_epoch) => -i64::try_from(before_epoch.duration().as_micros()).unwrap_or(0),
    };
    let server_micros = seconds.saturating_mul(1_000_000).saturating_add(micros);
    Ok((
        Some(server_micros.saturating_sub(local_micros)),
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

/// The value of a one-parameter `CONFIG GET` reply (an array in RESP2, a map in RESP3).
fn config_value(value: Value) -> Option<String> {
    let text = |v: &Value| match v {
        Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    };
    match value {
        Value::Array(items) if items.len() == 2 => text(&items[1]),
        Value::Map(pairs) => pairs.first().and_then(|(_, v)| text(v)),
        _ => None,
    }
}

/// A client for `target`, as the store builds it: `TCP_NODELAY`, TLS for `rediss://`.
fn client(target: &Target) -> Result<Client> {
    if target.tls {
        #[cfg(not(feature = "tls"))]
        return Err(baton_core::Error::unsupported(format!(
            "store URL {:?} asks for TLS, but this build of baton-redis has no TLS support; enable its `tls` feature (on by default)",
            target.redacted
        )));
        #[cfg(feature = "tls")]
        {
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
    }
    let info = target
        .client_url
        .as_str()
        .into_connection_info()
        .map_err(|e| redis_error(e, "parsing the URL", &target.redacted))?
        .set_tcp_settings(TcpSettings::default().set_nodelay(true));
    Client::open(info).map_err(|e| redis_error(e, "opening a client", &target.redacted))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn info_lines() {
        let info = parse_info(
            "# Server\r\nredis_version:7.0.15\r\nrole:master\r\n\r\ncluster_enabled:0\r\n",
        );
        assert_eq!(info["redis_version"], "7.0.15");
        assert_eq!(info["role"], "master");
        assert_eq!(info["cluster_enabled"], "0");
        assert!(!info.contains_key("# Server"));
    }

    #[test]
    fn config_replies() {
        let bulk = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        assert_eq!(
            config_value(Value::Array(vec![bulk("save"), bulk("")])),
            Some(String::new())
        );
        assert_eq!(
            config_value(Value::Map(vec![(bulk("appendonly"), bulk("yes"))])),
            Some("yes".into())
        );
        assert_eq!(config_value(Value::Nil), None);
    }
}
