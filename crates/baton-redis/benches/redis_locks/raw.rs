//! The hand-written baseline: the classic Redis lock, `SET key token NX PX ttl` to take it
//! and a compare-and-delete script by `EVALSHA` to give it back, over the same client the
//! store uses (the `redis` crate's `ConnectionManager`, one multiplexed connection,
//! `TCP_NODELAY`, the same timeouts).
//!
//! It is what a careful user would write without baton: no fences, no wake-ups, no
//! telemetry, no per-call deadline. The ratio of the store to it is the price of all of
//! those.

use std::time::Duration;

use redis::Script;
use redis::aio::ConnectionManager;

/// Deletes `KEYS[1]` only if it still holds `ARGV[1]`.
const COMPARE_AND_DELETE: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
    return redis.call('DEL', KEYS[1])
end
return 0
";

/// One multiplexed connection and the compare-and-delete script.
pub(crate) struct RawLocks {
    conn: ConnectionManager,
    release: Script,
}

impl RawLocks {
    /// Connects to `url` as the store does.
    pub(crate) async fn connect(url: &str, timeout: Duration) -> RawLocks {
        RawLocks {
            conn: crate::client::connect_as_the_store(url, timeout).await,
            release: Script::new(COMPARE_AND_DELETE),
        }
    }

    /// Takes `key` for `token` and gives it back: two round trips.
    pub(crate) async fn pair(&self, key: &str, token: &str, ttl: Duration) {
        let mut conn = self.conn.clone();
        let taken: Option<String> = redis::cmd("SET")
            .arg(key)
            .arg(token)
            .arg("NX")
            .arg("PX")
            .arg(ttl.as_millis() as u64)
            .query_async(&mut conn)
            .await
            .expect("SET NX PX");
        assert!(taken.is_some(), "uncontended SET NX found {key} taken");
        let removed: i64 = self
            .release
            .key(key)
            .arg(token)
            .invoke_async(&mut conn)
            .await
            .expect("compare-and-delete");
        assert_eq!(removed, 1, "compare-and-delete did not remove {key}");
    }
}

/// The store's own Lua scripts, sent by hand over the same kind of client: the store's
/// round trips and server work without its Rust layer. A diagnostic, not a baseline.
pub(crate) struct RawScripts {
    conn: ConnectionManager,
    claim: Script,
    release: Script,
}

impl RawScripts {
    pub(crate) async fn connect(url: &str, timeout: Duration) -> RawScripts {
        let RawLocks { conn, .. } = RawLocks::connect(url, timeout).await;
        RawScripts {
            conn,
            claim: Script::new(baton_redis::scripts::CLAIM),
            release: Script::new(baton_redis::scripts::RELEASE),
        }
    }

    /// Claims and releases the qualified key `qualified` as the store would, with no waiter
    /// (its key layout is in `baton-redis/src/keys.rs`, its arguments in the scripts): the
    /// claim with the grant and counter keys, holder and TTL; the release with the grant and
    /// queue keys, holder, and `0` + the store's channel.
    pub(crate) async fn pair(&self, qualified: &str, holder: &str, ttl: Duration) {
        const STORE: &str = "0baton:wake:0:bench00000000000";
        let mut conn = self.conn.clone();
        let grant = format!("{{{qualified}}}");
        let counter = format!("{{{qualified}}}:fence");
        let queue = format!("{{{qualified}}}:queue");
        let claimed: redis::Value = self
            .claim
            .key(&grant)
            .key(&counter)
            .arg(holder)
            .arg(ttl.as_millis() as u64)
            .invoke_async(&mut conn)
            .await
            .expect("claim script");
        assert!(
            matches!(claimed, redis::Value::Int(fence) if fence > 0),
            "uncontended claim answered {claimed:?}"
        );
        let released: redis::Value = self
            .release
            .key(&grant)
            .key(&queue)
            .arg(holder)
            .arg(STORE)
            .invoke_async(&mut conn)
            .await
            .expect("release script");
        assert_eq!(
            released,
            redis::Value::Int(0),
            "release answered {released:?}"
        );
    }
}
