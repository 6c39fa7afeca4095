//! An admin run of the migration coordinator answers at once while a record is still claimed.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use baton_core::conformance::fresh_namespace;
use baton_core::work::store::MigrationClaim;
use baton_core::work::{
    MemoryWorkStore, MigrationContext, MigrationFn, MigrationOutcome, MigrationStore, Migrations,
    ReturnContended,
};
use baton_core::{Holder, Locks, MemoryStore, Ttl};

/// The lock is free (its runner died and its TTL lapsed) but the runner's claim on a record
/// still has a minute of lease: `ReturnContended` names that writer instead of waiting out the
/// lease, and runs nothing.
#[tokio::test]
async fn return_contended_answers_at_once_when_a_record_is_still_claimed() {
    let store = Arc::new(MemoryWorkStore::new());
    let ups = Arc::new(AtomicUsize::new(0));
    let counted = ups.clone();
    let set = format!("app-{}", fresh_namespace().as_str());
    let migrations = Migrations::new(
        store.clone(),
        Locks::new(Arc::new(MemoryStore::new())),
        &set,
    )
    .unwrap()
    .migration(MigrationFn::new("m1", move |_: MigrationContext| {
        let counted = counted.clone();
        async move {
            counted.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }
    }));
    let dead_runner = Holder::random();
    let claim = store
        .claim_migration(
            migrations.set_key(),
            "m1",
            &dead_runner,
            Ttl::new(Duration::from_secs(60)).unwrap(),
        )
        .await
        .unwrap();
    assert!(matches!(claim, MigrationClaim::Claimed { .. }), "{claim:?}");

    // Far below the lease: the old behaviour (waiting for the lease) fails here.
    let report = tokio::time::timeout(Duration::from_secs(20), migrations.run(ReturnContended))
        .await
        .expect("an admin run must not wait out another writer's lease")
        .unwrap();
    let MigrationOutcome::Contended(contended) = report.outcome else {
        panic!("expected Contended, got {:?}", report.outcome);
    };
    assert_eq!(contended.holder.as_deref(), Some(dead_runner.as_str()));
    assert!(contended.remaining.is_some_and(|r| r > Duration::ZERO));
    assert!(report.ran.is_empty());
    assert_eq!(ups.load(Ordering::SeqCst), 0);
}
