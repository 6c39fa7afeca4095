//! The migration coordinator does not wait out leases needlessly: an admin run answers at
//! once while a record is still claimed, and a run retried after a store outage takes over
//! the record it left pending itself.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use baton_core::conformance::fresh_namespace;
use baton_core::store::Renewal;
use baton_core::work::store::{
    MigrationClaim, MigrationEnd, MigrationRecord, MigrationState, Settle, Writer,
};
use baton_core::work::{
    LoserPolicy, MigrationContext, MigrationFn, MigrationOutcome, MigrationStore, Migrations,
    ReturnContended, WaitForConvergence,
};
use baton_core::{Error, Holder, Locks, MemoryStore, Result, StoreKey, Ttl};

/// The lock is free (its runner died and its TTL lapsed) but the runner's claim on a record
/// still has a minute of lease: `ReturnContended` names that writer instead of waiting out the
/// lease, and runs nothing.
#[tokio::test]
async fn return_contended_answers_at_once_when_a_record_is_still_claimed() {
    let store = Arc::new(MemoryStore::new());
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
            Writer::new(migrations.set_key(), "m1", &dead_runner),
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

/// A migration store that goes down on demand and comes back after the first claim it
/// refused; it logs the writer of every claim that reached the store.
#[derive(Debug, Default)]
struct Outage {
    inner: MemoryStore,
    down: AtomicBool,
    claims: Mutex<Vec<Holder>>,
}

impl Outage {
    fn check(&self) -> Result<()> {
        if self.down.load(Ordering::SeqCst) {
            return Err(Error::unavailable("injected outage"));
        }
        Ok(())
    }
}

#[async_trait]
impl MigrationStore for Outage {
    async fn claim_migration(&self, writer: Writer<'_>, lease: Ttl) -> Result<MigrationClaim> {
        if self.down.swap(false, Ordering::SeqCst) {
            return Err(Error::unavailable("injected outage (ending now)"));
        }
        self.claims.lock().unwrap().push(writer.token.clone());
        self.inner.claim_migration(writer, lease).await
    }

    async fn heartbeat_migration(&self, writer: Writer<'_>, lease: Ttl) -> Result<Renewal> {
        self.check()?;
        self.inner.heartbeat_migration(writer, lease).await
    }

    async fn finish_migration(&self, writer: Writer<'_>, end: MigrationEnd<'_>) -> Result<Settle> {
        self.check()?;
        self.inner.finish_migration(writer, end).await
    }

    async fn migrations(&self, set: &StoreKey) -> Result<Vec<MigrationRecord>> {
        self.check()?;
        self.inner.migrations(set).await
    }
}

/// The store goes down while `up()` runs, so the run cannot record its result and the
/// record stays pending under the run's minute-long lease. The run retries (the store is
/// back after refusing one more claim) and runs `up()` again at once, as a takeover of its
/// own claim, with the same writer: it neither waits out its own lease (boot) nor reports
/// itself as the contending writer (admin).
async fn retried_run_takes_over_its_own_claim<P: LoserPolicy>(policy: P) {
    let store = Arc::new(Outage::default());
    let runs = Arc::new(Mutex::new(Vec::new()));
    let seen = runs.clone();
    let outage = store.clone();
    let migrations = Migrations::new(
        store.clone(),
        Locks::new(Arc::new(MemoryStore::new())),
        &format!("app-{}", fresh_namespace().as_str()),
    )
    .unwrap()
    .lease(Duration::from_secs(60))
    .unavailable_retries(10)
    .migration(MigrationFn::new("m1", move |ctx: MigrationContext| {
        let (seen, outage) = (seen.clone(), outage.clone());
        async move {
            let mut seen = seen.lock().unwrap();
            if seen.is_empty() {
                outage.down.store(true, Ordering::SeqCst);
            }
            seen.push((ctx.attempt(), ctx.previous(), ctx.is_takeover()));
            Ok(())
        }
    }));

    // Far below the lease: waiting it out fails here.
    let report = tokio::time::timeout(Duration::from_secs(20), migrations.run(policy))
        .await
        .expect("a retried run must not wait out its own lease")
        .unwrap();
    assert!(
        matches!(report.outcome, MigrationOutcome::Completed),
        "{:?}",
        report.outcome
    );
    assert_eq!(report.ran, ["m1"]);
    assert_eq!(report.took_over, ["m1"]);
    assert_eq!(
        *runs.lock().unwrap(),
        [(1, None, false), (2, Some(MigrationState::Pending), true)],
        "up() ran again, as a takeover, on the next attempt"
    );
    let claims = store.claims.lock().unwrap().clone();
    assert_eq!(claims.len(), 2, "{claims:?}");
    assert_eq!(
        claims[0], claims[1],
        "one writer id across the run's retries"
    );
    let records = migrations.records().await.unwrap();
    assert_eq!(
        (records[0].state, records[0].attempt),
        (MigrationState::Completed, 2)
    );
}

#[tokio::test]
async fn a_boot_run_retried_after_an_outage_takes_over_its_own_claim_at_once() {
    retried_run_takes_over_its_own_claim(WaitForConvergence {
        timeout: Duration::from_secs(300),
    })
    .await;
}

#[tokio::test]
async fn an_admin_run_retried_after_an_outage_is_not_contended_with_itself() {
    retried_run_takes_over_its_own_claim(ReturnContended).await;
}
