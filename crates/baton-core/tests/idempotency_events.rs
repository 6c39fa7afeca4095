//! An idempotency attempt reports when its keep-alive presumes it lost: a lease that passes
//! without a successful renewal fires the lost signal and a registered event naming the key.

use std::sync::Arc;
use std::time::Duration;

use baton_core::MemoryStore;
use baton_core::conformance::fresh_namespace;
use baton_core::idempotency::conformance::FaultyIdempotencyStore;
use baton_core::idempotency::{Acquire, AcquireOptions, IdempotencyLog, IdempotencyStore, Scope};
use baton_core::telemetry::events;
use baton_testkit::capture::{capture_events, events as captured, wait_for_event};

#[tokio::test]
async fn a_lease_that_lapses_while_the_store_is_down_fires_lost_and_is_reported() {
    capture_events();
    let faulty = Arc::new(FaultyIdempotencyStore::new(Arc::new(MemoryStore::new())));
    let store: Arc<dyn IdempotencyStore> = faulty.clone();
    let log = IdempotencyLog::with_namespace(store, fresh_namespace());
    let scope = Scope::new("org-1", "payments.charge", "order-lapsed").unwrap();
    let options = AcquireOptions::new(Duration::from_secs(3600)).lease(Duration::from_millis(300));
    let Acquire::Acquired(attempt) = log.try_acquire_with(&scope, &options).await.unwrap() else {
        panic!("a new key is acquired");
    };
    let kept = log.keep_alive(&attempt);
    faulty.set_failing(true);

    tokio::time::timeout(Duration::from_secs(10), kept.lost())
        .await
        .expect("the lost signal fires once the lease has passed without a renewal");
    let about = |key: &str| key.ends_with("order-lapsed");
    wait_for_event(&events::IDEMPOTENCY_LEASE_LAPSED, |c| about(&c.key)).await;
    assert!(
        !captured(&events::IDEMPOTENCY_UNAVAILABLE, |c| about(&c.key)).is_empty(),
        "each failed renewal was reported as well"
    );
}

#[tokio::test]
async fn a_kept_attempt_that_finalizes_is_not_reported_lapsed() {
    capture_events();
    let log = IdempotencyLog::with_namespace(Arc::new(MemoryStore::new()), fresh_namespace());
    let scope = Scope::new("org-1", "payments.charge", "order-kept").unwrap();
    let options = AcquireOptions::new(Duration::from_secs(3600)).lease(Duration::from_millis(300));
    let Acquire::Acquired(attempt) = log.try_acquire_with(&scope, &options).await.unwrap() else {
        panic!("a new key is acquired");
    };
    let kept = log.keep_alive(&attempt);
    tokio::time::sleep(Duration::from_millis(900)).await;
    assert!(
        !kept.is_lost(),
        "renewals keep the attempt through three leases"
    );
    kept.stop();
    let lapsed = captured(&events::IDEMPOTENCY_LEASE_LAPSED, |c| {
        c.key.ends_with("order-kept")
    });
    assert!(lapsed.is_empty(), "{lapsed:?}");
}
