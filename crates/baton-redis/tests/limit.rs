//! Rate limits on the Redis store: the conformance rules (each on a private redis-server),
//! a budget shared by two stores (two processes' worth of connections), a flushed script,
//! and a server restart: `Unavailable` while it is down, then recovery.

mod common;

use std::sync::Arc;
use std::time::Duration;

use baton_core::conformance::fresh_namespace;
use baton_core::telemetry::events;
use baton_core::{LimitError, Namespace, Quota, RateLimiter};
use baton_testkit::redis::RedisServer;
use baton_testkit::workload::admitted_concurrently;
use tokio::time::{Instant, sleep};

baton_core::rate_limit_conformance_tests!(common::harness());

/// A limiter in `namespace` allowing `max` per `window`, over a store of its own on `server`.
async fn limiter(
    server: &RedisServer,
    namespace: Namespace,
    max: u32,
    window: Duration,
) -> RateLimiter {
    let store = Arc::new(common::store(server).await);
    RateLimiter::with_namespace(store, namespace, Quota::new(max, window).unwrap())
}

/// Two stores (as two replicas) with 32 tasks each draw from one budget.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_stores_share_one_budget() {
    let server = common::server().await;
    let namespace = fresh_namespace();
    let (max, window) = (15u32, Duration::from_secs(60));
    let mut limiters = Vec::new();
    for _ in 0..2 {
        limiters.push(limiter(&server, namespace.clone(), max, window).await);
    }
    let admitted = admitted_concurrently(&limiters, 32, 3, "shared").await;
    assert_eq!(admitted, max);
}

/// `SCRIPT FLUSH` (or a restart) forgets the script; the next call loads it again and is
/// answered, never misread.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flushed_script_is_loaded_again() {
    let server = common::server().await;
    let window = Duration::from_secs(60);
    let limiter = limiter(&server, fresh_namespace(), 2, window).await;
    assert!(limiter.try_acquire("k", 1).await.unwrap().allowed);
    server
        .command_ok(&["SCRIPT", "FLUSH"])
        .expect("SCRIPT FLUSH");
    let d = limiter.try_acquire("k", 1).await.unwrap();
    assert!(d.allowed && d.remaining == 0, "{d:?}");
    assert!(!limiter.try_acquire("k", 1).await.unwrap().allowed);
}

/// The server dies: every decision fails closed with `Unavailable` (and the registered
/// event) within the call deadline; after a restart the same limiter decides again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_gives_unavailable_then_recovery() {
    let events = common::Events::capture();
    let server = Arc::new(common::server().await);
    let window = Duration::from_secs(60);
    let limiter = limiter(&server, fresh_namespace(), 5, window).await;
    assert!(limiter.try_acquire("k", 1).await.unwrap().allowed);

    common::kill(&server).await;
    let address = format!("127.0.0.1:{}", server.port());
    for _ in 0..3 {
        let started = Instant::now();
        match limiter.try_acquire("k", 1).await {
            Err(e @ LimitError::Unavailable(_)) => assert!(e.is_retryable(), "{e}"),
            other => panic!("a dead server answered {other:?}"),
        }
        // connect_timeout + response_timeout of the test store, and a generous margin.
        assert!(started.elapsed() < Duration::from_secs(30));
    }
    match limiter.acquire("k", 1, Duration::from_secs(5)).await {
        Err(LimitError::Unavailable(_)) => {}
        other => panic!("acquire against a dead server answered {other:?}"),
    }
    assert!(
        events.count(events::LIMIT_UNAVAILABLE.key, &address) >= 4,
        "{:?}",
        events.all()
    );

    common::restart(&server).await;
    let started = Instant::now();
    let d = loop {
        match limiter.try_acquire("k", 1).await {
            Ok(d) => break d,
            Err(e) => {
                assert!(
                    started.elapsed() < Duration::from_secs(60),
                    "no recovery: {e}"
                );
                sleep(Duration::from_millis(100)).await;
            }
        }
    };
    // No persistence: the window went with the old process.
    assert!(d.allowed && d.remaining == 4, "{d:?}");
}
