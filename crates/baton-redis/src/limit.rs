//! Rate limits on Redis: one script, one round trip, on the server's clock.
//!
//! [`LIMIT`] is a transcription of the core's sliding log
//! ([`baton_core::limit::window`]): it reads `TIME`, forgets what left the window, and
//! admits or says when, atomically (a script runs alone). The conformance rules check that
//! it answers as the memory store does.
//!
//! ## Keys
//! A qualified key `Q` (`<namespace>:limit:<key>`) is two Redis keys in one Cluster slot:
//!
//! | Redis key | type | holds |
//! |---|---|---|
//! | `{Q}` | list | `"<slot end µs>:<units>"` per slot that admitted something, oldest first (at most 1001) |
//! | `{Q}:units` | string | the units in the list |
//!
//! Both expire when the newest entry has left the window, so an idle key costs nothing.
//!
//! ## Behavior
//! - A call whose connection dropped is tried once more on the new connection; if the first
//!   attempt did run, its units are counted without having been granted: the limiter only
//!   gets stricter, never looser.
//! - A server that lost its data (a restart without persistence, a failover to a replica
//!   that missed the last writes) forgets the windows: budgets refill. Keep rate-limit keys
//!   on a server that persists if a refill matters.

use std::sync::LazyLock;
use std::time::Duration;

use async_trait::async_trait;
use baton_core::limit::window::resolution;
use baton_core::{Decision, Quota, RateStore, Result, StoreKey};
use redis::{Script, Value};

use crate::locks::RedisStore;
use crate::scripts::Evalsha;

/// The rate-limit step (see the module docs).
pub const LIMIT: &str = include_str!("../scripts/limit.lua");

static SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(LIMIT));

/// The script as the store runs it, for benchmarks that run it by hand.
pub fn script() -> &'static Script {
    &SCRIPT
}

/// The Redis keys of `key`'s log: `{Q}` and `{Q}:units`.
pub fn redis_keys(key: &StoreKey) -> [String; 2] {
    [
        format!("{{{}}}", key.as_str()),
        format!("{{{}}}:units", key.as_str()),
    ]
}

/// The script's arguments for `cost` units under `quota`, in order.
pub fn arguments(cost: u32, quota: Quota) -> [u64; 4] {
    let window = quota.window_us();
    [
        u64::from(cost),
        u64::from(quota.max()),
        window,
        resolution(window),
    ]
}

/// The call of the script for `cost` units of `key` under `quota` (both stores send it: one
/// server, and a cluster on the master of the key's slot).
pub(crate) fn admit_call(key: &StoreKey, cost: u32, quota: Quota) -> Evalsha<'static> {
    let redis_keys = redis_keys(key);
    let mut invocation = Evalsha::new(&SCRIPT, redis_keys.len(), 128);
    for redis_key in redis_keys {
        invocation.arg(redis_key);
    }
    for argument in arguments(cost, quota) {
        invocation.arg(argument);
    }
    invocation
}

/// The script's answer: `{allowed, remaining, retry after µs}`.
pub(crate) fn parse(value: &Value) -> Option<Decision> {
    let Value::Array(items) = value else {
        return None;
    };
    let int = |v: &Value| match v {
        Value::Int(n) => Some(*n),
        _ => None,
    };
    match items.as_slice() {
        [allowed, remaining, retry_after] => {
            let allowed = match int(allowed)? {
                1 => true,
                0 => false,
                _ => return None,
            };
            Some(Decision {
                allowed,
                remaining: u32::try_from(int(remaining)?).ok()?,
                retry_after: Duration::from_micros(u64::try_from(int(retry_after)?).ok()?),
            })
        }
        _ => None,
    }
}

#[async_trait]
impl RateStore for RedisStore {
    async fn admit(&self, key: &StoreKey, cost: u32, quota: Quota) -> Result<Decision> {
        let what = || format!("rate limit of {key}");
        self.call(what, &admit_call(key, cost, quota), parse, |_| true)
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies() {
        let reply = |a, r, t| Value::Array(vec![Value::Int(a), Value::Int(r), Value::Int(t)]);
        assert_eq!(
            parse(&reply(1, 4, 0)),
            Some(Decision {
                allowed: true,
                remaining: 4,
                retry_after: Duration::ZERO
            })
        );
        assert_eq!(
            parse(&reply(0, 0, 1500)).map(|d| d.retry_after),
            Some(Duration::from_micros(1500))
        );
        assert_eq!(parse(&reply(2, 0, 0)), None);
        assert_eq!(parse(&reply(0, -1, 0)), None);
        assert_eq!(parse(&Value::Nil), None);
    }

    #[test]
    fn the_script_takes_keys_and_values_only_as_arguments() {
        assert!(LIMIT.contains("KEYS[1]") && LIMIT.contains("KEYS[2]"));
        assert!(!LIMIT.contains("{{"));
        let key = StoreKey::from_stored("ns:limit:a}b".into());
        assert_eq!(redis_keys(&key), ["{ns:limit:a}b}", "{ns:limit:a}b}:units"]);
    }
}
