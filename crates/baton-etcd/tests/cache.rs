//! The cache on a private three-member etcd cluster: the conformance rules (each in a
//! namespace of its own), and a value larger than the cluster accepts in one request.

mod common;

use std::time::Duration;

use baton_core::{Cache, ErrorKind};

baton_core::cache_conformance_tests!(common::harness());

/// A value above etcd's request limit (1.5 MiB by default) is bad input that says so, and
/// leaves the value that was there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_value_larger_than_the_cluster_accepts_is_invalid_input() {
    let cluster = common::cluster().await;
    let cache = Cache::with_namespace(
        std::sync::Arc::new(common::store(&cluster).await),
        baton_core::conformance::fresh_namespace(),
    );
    let minute = Duration::from_secs(60);
    cache.set("k", &"small", minute).await.unwrap();
    // Refused by etcd itself (above 1.5 MiB), and by its gRPC server (above 2 MiB).
    for bytes in [1800 * 1024, 3 * 1024 * 1024] {
        let e = cache
            .set("k", &"x".repeat(bytes), minute)
            .await
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput, "{bytes}: {e}");
        assert!(e.message().contains("--max-request-bytes"), "{bytes}: {e}");
    }
    assert_eq!(
        cache.get::<String>("k").await.unwrap().as_deref(),
        Some("small")
    );
}
