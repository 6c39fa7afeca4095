//! Helpers of the Redis fault tests: stores on private servers, captured telemetry, and
//! bounded waiting.
//!
//! Every wait here is a poll with a generous deadline, so the tests hold on a loaded 2-core
//! machine; the only time bounds asserted are the ones the contract states (a call fails
//! within its configured timeout, a lost signal fires by `valid_until`), each with slack.

#![allow(dead_code, unreachable_pub)]

use std::sync::Arc;
use std::time::Duration;

use baton_core::{Key, KeyKind, Namespace, StoreKey};
use baton_redis::RedisStore;

/// The timeouts of the stores under test (connect, and response): short, so faults show
/// quickly, but far above a loaded machine's round trip.
pub const STORE_TIMEOUT: Duration = Duration::from_secs(1);

/// The longest a store call may take by its options: a reconnect plus a request.
pub const CALL_DEADLINE: Duration = Duration::from_secs(2);

/// What a loaded machine may add to a deadline the contract states.
pub const SLACK: Duration = Duration::from_secs(5);

/// `url` with the test timeouts in its query.
pub fn with_timeouts(url: &str) -> String {
    let ms = STORE_TIMEOUT.as_millis();
    format!("{url}?connect_timeout={ms}ms&response_timeout={ms}ms")
}

/// A store on `url` (a bare `redis://host:port`), with the test timeouts.
pub async fn connect(url: &str) -> Arc<RedisStore> {
    Arc::new(
        RedisStore::connect(&with_timeouts(url))
            .await
            .unwrap_or_else(|e| panic!("connect to {url}: {e}")),
    )
}

/// A namespace no other test uses, so tests may share a server.
pub fn namespace() -> Namespace {
    baton_core::conformance::fresh_namespace()
}

/// The qualified key of lock `key` in `ns`.
pub fn lock_key(ns: &Namespace, key: &str) -> StoreKey {
    ns.qualify(KeyKind::Lock, &Key::new(key).expect("a valid key"))
}

pub use baton_testkit::capture::*;
