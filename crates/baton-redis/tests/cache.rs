//! The cache on the Redis store: the conformance rules (each on a private redis-server),
//! and a dead server: errors the caller may treat as a miss, `get_or_fetch` answering from
//! the source, then recovery.

mod common;

use std::sync::Arc;
use std::time::Duration;

use baton_core::conformance::fresh_namespace;
use baton_core::telemetry::events;
use baton_core::{Cache, Error};
use tokio::time::{Instant, sleep};

baton_core::cache_conformance_tests!(common::harness());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_server_is_a_miss_to_get_or_fetch_and_the_cache_recovers() {
    let events = common::Events::capture();
    let server = Arc::new(common::server().await);
    let cache = Cache::with_namespace(Arc::new(common::store(&server).await), fresh_namespace());
    let minute = Duration::from_secs(60);
    cache.set("k", &1u32, minute).await.unwrap();

    common::kill(&server).await;
    let err = cache.get::<u32>("k").await.unwrap_err();
    assert!(err.is_unavailable(), "{err}");
    let fetched = cache
        .get_or_fetch("k", minute, || async { Ok::<u32, Error>(2) })
        .await
        .expect("the fetch answers while the server is down");
    assert_eq!(fetched, 2);
    let address = format!("127.0.0.1:{}", server.port());
    assert!(events.count(events::CACHE_UNAVAILABLE.key, &address) >= 2);

    common::restart(&server).await;
    let started = Instant::now();
    while cache.set("k", &3u32, minute).await.is_err() {
        assert!(started.elapsed() < Duration::from_secs(60), "no recovery");
        sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(cache.get::<u32>("k").await.unwrap(), Some(3));
}
