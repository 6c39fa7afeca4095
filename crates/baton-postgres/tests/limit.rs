//! Rate limits on the PostgreSQL store: the conformance rules (on the test binary's shared
//! server, each rule in a namespace of its own), and a restarted server: `Unavailable`
//! while it is down, then recovery with the window kept (the log is a logged table).

mod common;

use std::sync::Arc;
use std::time::Duration;

use baton_core::{LimitError, Quota, RateLimiter};
use baton_testkit::postgres::Stop;

use common::*;

baton_core::rate_limit_conformance_tests!(harness());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_gives_unavailable_then_recovery_with_the_window_kept() {
    capture_events();
    let server = Arc::new(private().await);
    let hour = Duration::from_secs(3600);
    let quota = Quota::new(5, hour).unwrap();
    let limiter =
        RateLimiter::with_namespace(Arc::new(connect(&server.url()).await), namespace(), quota);
    assert!(limiter.try_acquire("k", 3).await.unwrap().allowed);

    let stopped = Arc::clone(&server);
    blocking(move || stopped.stop(Stop::Immediate))
        .await
        .expect("the server stops");
    match within("a decision", limiter.try_acquire("k", 1)).await {
        Err(e @ LimitError::Unavailable(_)) => assert!(e.is_retryable(), "{e}"),
        other => panic!("a stopped server answered {other:?}"),
    }
    let started = Arc::clone(&server);
    blocking(move || started.start_again())
        .await
        .expect("the server starts again");
    let d = eventually("the limiter to recover", || async {
        limiter.try_acquire("k", 2).await.ok()
    })
    .await;
    assert!(
        d.allowed && d.remaining == 0,
        "the window was forgotten: {d:?}"
    );
    assert!(!limiter.try_acquire("k", 1).await.unwrap().allowed);
}
