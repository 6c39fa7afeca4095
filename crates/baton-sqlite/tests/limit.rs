//! Rate limits on the SQLite store: the conformance rules on a temporary file, and a budget
//! shared by several stores on one file (as several processes would share it).

mod common;

use std::sync::Arc;
use std::time::Duration;

use baton_core::conformance::fresh_namespace;
use baton_core::{Quota, RateLimiter};
use baton_sqlite::{SqliteOptions, SqliteStore};
use baton_testkit::workload::admitted_concurrently;

baton_core::rate_limit_conformance_tests!(common::harness());

/// Four stores on one file (four processes' worth of connections), 16 tasks each: the
/// file's budget holds across them, and a fresh store sees what the others admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stores_on_one_file_share_one_budget() {
    let harness = common::harness().await;
    let namespace = fresh_namespace();
    let (max, window) = (10u32, Duration::from_secs(60));
    let mut limiters = Vec::new();
    for _ in 0..4 {
        let store = Arc::new(
            SqliteStore::open(&harness.opener.path, SqliteOptions::new())
                .await
                .unwrap(),
        );
        limiters.push(RateLimiter::with_namespace(
            store,
            namespace.clone(),
            Quota::new(max, window).unwrap(),
        ));
    }
    let admitted = admitted_concurrently(&limiters, 16, 4, "shared").await;
    assert_eq!(admitted, max, "64 tasks x 4 attempts within one window");
    let fresh = RateLimiter::with_namespace(
        Arc::new(
            SqliteStore::open(&harness.opener.path, SqliteOptions::new())
                .await
                .unwrap(),
        ),
        namespace,
        Quota::new(max, window).unwrap(),
    );
    let d = fresh.try_acquire("shared", 1).await.unwrap();
    assert!(!d.allowed, "a re-opened store forgot the window: {d:?}");
    assert!(d.retry_after > window / 2, "{d:?}");
}
