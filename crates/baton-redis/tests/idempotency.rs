//! The idempotency log on the Redis store: the conformance rules on a private server, and
//! the races that need several OS processes on one server (1,000 attempts from 2 processes
//! of 8 tasks each; the owner killed between acquire and finalize).
//!
//! The child processes are this test binary run again with a role (see
//! `baton_testkit::process`); their tests are `#[ignore]`d in ordinary runs.

mod common;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use baton_core::Namespace;
use baton_core::idempotency::IdempotencyLog;
use baton_redis::RedisStore;
use baton_testkit::redis::RedisServer;

baton_core::idempotency_conformance_tests!(common::harness());

/// How every process of the races reaches the private server.
fn open_log(
    url: String,
    namespace: Namespace,
) -> Pin<Box<dyn Future<Output = IdempotencyLog> + Send>> {
    Box::pin(async move {
        let store = RedisStore::connect(&format!("{url}?response_timeout=10s"))
            .await
            .expect("connect to the private server");
        IdempotencyLog::with_namespace(Arc::new(store), namespace)
    })
}

baton_testkit::idempotency_races!(
    {
        let server = RedisServer::start().expect("a private redis-server");
        let url = server.url();
        (server, url)
    },
    open_log
);

/// A retried acquire whose first try ran (its answer lost with the connection) is answered
/// as acquired again, not as a duplicate of itself: the script recognises its own token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_that_finds_its_own_token_is_acquired() {
    let server = common::server().await;
    let store = common::store(&server).await;
    baton_testkit::idempotency::own_token_is_acquired_again(&store).await;
}
