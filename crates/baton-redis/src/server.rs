//! What the store checks about its server when it connects: [`ServerInfo`].
//!
//! Lock keys carry a TTL, so a server whose `maxmemory-policy` evicts keys (any policy but
//! `noeviction`; the `volatile-*` ones pick keys with a TTL first) may drop a held lock under
//! memory pressure and hand it to a second holder. Connecting reads the policy and emits
//! [`baton.redis.eviction_policy_unsafe`](baton_core::telemetry::events::REDIS_EVICTION_POLICY_UNSAFE)
//! unless it is `noeviction`. Managed services often disable `CONFIG`; then the store
//! connects anyway and emits
//! [`baton.redis.eviction_policy_unknown`](baton_core::telemetry::events::REDIS_EVICTION_POLICY_UNKNOWN).

use baton_core::telemetry::{self, events};
use redis::Value;
use redis::aio::ConnectionLike;

/// Facts about the Redis server a store is connected to, as read by
/// [`RedisStore::server_info`](crate::RedisStore::server_info).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ServerInfo {
    /// `redis_version` from `INFO server`, if the server reported one.
    pub version: Option<String>,
    /// `maxmemory-policy` from `CONFIG GET`, or `None` when the server refused `CONFIG`.
    pub maxmemory_policy: Option<String>,
    /// `role` from `INFO replication` (`master`, `slave`), or `None` when the server
    /// refused `INFO`.
    pub role: Option<String>,
}

impl ServerInfo {
    /// `Some(true)` when the server never evicts keys (`noeviction`), `Some(false)` when it
    /// may evict lock keys, `None` when the policy could not be read.
    pub fn eviction_safe(&self) -> Option<bool> {
        self.maxmemory_policy.as_deref().map(|p| p == "noeviction")
    }

    /// Whether the server said it is a replica (`role:slave`): it refuses writes, and the
    /// store does not use it.
    pub fn is_replica(&self) -> bool {
        self.role.as_deref().is_some_and(|r| r != "master")
    }
}

/// Reads the version and eviction policy. Only I/O errors fail it: a server that refuses
/// `INFO` or `CONFIG` just leaves the field empty, and the refusal is logged.
pub(crate) async fn read(conn: &mut impl ConnectionLike) -> redis::RedisResult<ServerInfo> {
    let version = info_field(conn, "server", "redis_version").await?;
    let role = info_field(conn, "replication", "role").await?;
    let maxmemory_policy = match redis::cmd("CONFIG")
        .arg("GET")
        .arg("maxmemory-policy")
        .query_async::<Value>(conn)
        .await
    {
        Ok(value) => config_value(value),
        Err(e) if e.is_io_error() => return Err(e),
        Err(e) => {
            tracing::info!(
                error = %e,
                "CONFIG GET maxmemory-policy was refused; cannot check that lock keys are safe from eviction"
            );
            None
        }
    };
    Ok(ServerInfo {
        version,
        maxmemory_policy,
        role,
    })
}

/// The field `name` of `INFO section`; `None` when the server refused `INFO` (logged) or
/// did not report the field. Only I/O errors fail it.
async fn info_field(
    conn: &mut impl ConnectionLike,
    section: &str,
    name: &str,
) -> redis::RedisResult<Option<String>> {
    match redis::cmd("INFO")
        .arg(section)
        .query_async::<String>(conn)
        .await
    {
        Ok(text) => Ok(text
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .map(|v| v.trim().to_owned())),
        Err(e) if e.is_io_error() => Err(e),
        Err(e) => {
            tracing::debug!(error = %e, section, "INFO was refused");
            Ok(None)
        }
    }
}

/// The value of a one-parameter `CONFIG GET` reply (an array in RESP2, a map in RESP3).
pub(crate) fn config_value(value: Value) -> Option<String> {
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

/// Emits the registered event that says whether lock keys are safe from eviction.
pub(crate) fn report_eviction_policy(info: &ServerInfo, server: &str) {
    match info.maxmemory_policy.as_deref() {
        Some("noeviction") => {}
        Some(policy) => telemetry::emit(
            &events::REDIS_EVICTION_POLICY_UNSAFE,
            None,
            format_args!(
                "redis at {server} has maxmemory-policy {policy}: under memory pressure it may evict lock keys and let a second holder in; set maxmemory-policy noeviction"
            ),
        ),
        None => telemetry::emit(
            &events::REDIS_EVICTION_POLICY_UNKNOWN,
            None,
            format_args!(
                "redis at {server} refused CONFIG GET maxmemory-policy; check that it is noeviction where the server is configured"
            ),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_replies() {
        let bulk = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        assert_eq!(
            config_value(Value::Array(vec![
                bulk("maxmemory-policy"),
                bulk("allkeys-lru")
            ])),
            Some("allkeys-lru".into())
        );
        assert_eq!(
            config_value(Value::Map(vec![(
                bulk("maxmemory-policy"),
                bulk("noeviction")
            )])),
            Some("noeviction".into())
        );
        assert_eq!(
            config_value(Value::Array(vec![bulk("save"), bulk("")])),
            Some(String::new())
        );
        assert_eq!(config_value(Value::Array(vec![])), None);
        assert_eq!(config_value(Value::Nil), None);
    }

    #[test]
    fn eviction_safety() {
        let info = |p: Option<&str>| ServerInfo {
            version: None,
            maxmemory_policy: p.map(str::to_owned),
            role: None,
        };
        assert_eq!(info(Some("noeviction")).eviction_safe(), Some(true));
        assert_eq!(info(Some("volatile-lru")).eviction_safe(), Some(false));
        assert_eq!(info(None).eviction_safe(), None);
        let role = |r: Option<&str>| ServerInfo {
            role: r.map(str::to_owned),
            ..info(None)
        };
        assert!(role(Some("slave")).is_replica());
        assert!(!role(Some("master")).is_replica());
        assert!(!role(None).is_replica());
    }
}
