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
use std::time::Duration;

use baton_core::idempotency::IdempotencyLog;
use baton_core::idempotency::store::{AcquireAnswer, AcquireRequest, IdempotencyStore};
use baton_core::{Holder, Key, KeyKind, Namespace, Ttl};
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
    let key = baton_core::conformance::fresh_namespace()
        .qualify(KeyKind::Idempotency, &Key::new("o:d:k").unwrap());
    let token = Holder::random();
    let ttl = Ttl::new(Duration::from_secs(60)).unwrap();
    let request = AcquireRequest {
        attempt: &token,
        fingerprint: "f",
        ttl,
        lease: ttl,
        retry_failed: false,
    };
    let first = store.acquire(&key, request).await.unwrap();
    let again = store.acquire(&key, request).await.unwrap();
    let (
        AcquireAnswer::Acquired { record: a, .. },
        AcquireAnswer::Acquired {
            record: b,
            previous,
        },
    ) = (first, again)
    else {
        panic!("both answers are Acquired");
    };
    assert_eq!((a.owner, a.attempt), (b.owner, b.attempt));
    assert_eq!(previous, None);
    assert!(b.lease_remaining > Duration::ZERO && b.lease_remaining <= ttl.get());
}
