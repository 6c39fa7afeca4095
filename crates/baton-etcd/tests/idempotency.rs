//! The idempotency log on a private three-member etcd cluster: the conformance rules through
//! a URL that names all three members (`reopen` is a new store, new connections, on the
//! cluster), and the races that need several OS processes (1,000 attempts from 2 processes of
//! 8 tasks each; the owner killed between acquire and finalize).
//!
//! Leases and TTLs of a few hundred milliseconds last a second or two on etcd (its leases are
//! whole seconds); the rules wait for them without asserting speed. The child processes are
//! this test binary run again with a role (see `baton_testkit::process`); their tests are
//! `#[ignore]`d in ordinary runs.

mod common;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use baton_core::Namespace;
use baton_core::idempotency::IdempotencyLog;
use baton_etcd::EtcdStore;

baton_core::idempotency_conformance_tests!(common::harness());

/// How every process of the races reaches the cluster.
fn open_log(
    url: String,
    namespace: Namespace,
) -> Pin<Box<dyn Future<Output = IdempotencyLog> + Send>> {
    Box::pin(async move {
        let store = EtcdStore::connect(&format!("{url}?response_timeout=10s"))
            .await
            .expect("connect to the private cluster");
        IdempotencyLog::with_namespace(Arc::new(store), namespace)
    })
}

baton_testkit::idempotency_races!(
    {
        let cluster = common::cluster_blocking();
        let url = cluster.url();
        (cluster, url)
    },
    open_log
);

/// A retried acquire whose first try ran (its answer lost with the connection) is answered
/// as acquired again, not as a duplicate of itself: the store recognises its own token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_that_finds_its_own_token_is_acquired() {
    let cluster = common::cluster().await;
    let store = common::store(&cluster).await;
    baton_testkit::idempotency::own_token_is_acquired_again(&store).await;
}
