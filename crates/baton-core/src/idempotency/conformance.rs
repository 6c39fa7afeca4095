//! The idempotency conformance rules: written once, run by every store's test target.
//!
//! A store's test target implements [`IdempotencyHarness`] and expands
//! [`idempotency_conformance_tests!`](crate::idempotency_conformance_tests)
//! (`baton_core::idempotency_conformance_tests!(my_harness())`), which generates one
//! `#[tokio::test]` per rule. Each rule uses a fresh random namespace, so rules may share a
//! store. [`FaultyIdempotencyStore`] wraps a real store to count calls and inject faults.
//!
//! Timing rules never assert speed: they wait for a lease or TTL to lapse by polling with
//! generous deadlines, and a lease that must *not* lapse during a check is seconds long.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::{Instant, sleep};

use crate::conformance::{Faulty, eventually, fresh_namespace, ms};
use crate::error::{ErrorKind, Result};
use crate::holder::Holder;
use crate::key::{Namespace, StoreKey};
use crate::store::Renewal;
use crate::time::Ttl;

use super::store::{
    AcquireAnswer, AcquireRequest, AttemptEnd, FinalizeAnswer, IdempotencyStore, StoredRecord,
};
use super::{
    Acquire, AcquireOptions, Attempt, Finalize, IdempotencyLog, MAX_METADATA_BYTES, Outcome,
    Record, Scope, Status, Takeover,
};

/// What a store's test target provides to the rules.
#[async_trait]
pub trait IdempotencyHarness: Send + Sync + 'static {
    /// The store under test. Every call within one harness sees the same data.
    async fn open(&self) -> Arc<dyn IdempotencyStore>;

    /// Closes the store and opens it again from its durable state, as a new process would;
    /// `None` for a store without durable state.
    async fn reopen(&self) -> Option<Arc<dyn IdempotencyStore>>;
}

/// Generates one `#[tokio::test]` per idempotency rule. `$harness` is an expression that
/// evaluates to a future of an [`IdempotencyHarness`]; it is evaluated once per test.
#[macro_export]
macro_rules! idempotency_conformance_tests {
    ($harness:expr) => {
        $crate::__conformance_rules!($crate::idempotency::conformance; $harness;
            first_attempt_acquires_and_duplicates_see_it_pending,
            one_of_a_thousand_concurrent_attempts_acquires,
            finalize_stores_outcome_and_metadata,
            finalize_is_idempotent_for_its_owner,
            stale_finalize_is_not_owner_and_changes_nothing,
            takeover_only_after_the_lease_lapses,
            exactly_one_of_many_takes_over,
            late_finalize_without_takeover_is_accepted,
            renew_keeps_duplicates_out,
            keep_alive_holds_the_lease_and_signals_a_finalize_elsewhere,
            failed_records_are_retried_only_when_asked,
            different_fingerprint_never_takes_over,
            records_expire_after_their_ttl,
            scopes_and_namespaces_are_isolated,
            metadata_round_trips_any_bytes,
            records_survive_reopen,
            invalid_input_is_rejected_before_io,
            store_faults_are_errors_not_duplicates,
        );
    };
}

const DAY: Duration = Duration::from_secs(86_400);
/// A lease that cannot lapse during a check, even on a loaded machine.
const LONG_LEASE: Duration = Duration::from_secs(60);
/// How long a rule waits for a short lease or TTL to lapse before failing.
const PATIENCE: Duration = Duration::from_secs(30);

fn log(store: Arc<dyn IdempotencyStore>, ns: &Namespace) -> IdempotencyLog {
    IdempotencyLog::with_namespace(store, ns.clone())
}

fn scope(key: &str) -> Scope {
    Scope::new("org-1", "charges", key).expect("valid scope")
}

fn long(ttl: Duration) -> AcquireOptions {
    AcquireOptions::new(ttl).lease(LONG_LEASE.min(ttl))
}

async fn acquired(log: &IdempotencyLog, scope: &Scope, options: &AcquireOptions) -> Attempt {
    match log.try_acquire_with(scope, options).await.expect("acquire") {
        Acquire::Acquired(attempt) => attempt,
        Acquire::Duplicate(record) => panic!("expected to acquire {scope}, got {record:?}"),
    }
}

async fn duplicate(log: &IdempotencyLog, scope: &Scope, options: &AcquireOptions) -> Record {
    match log.try_acquire_with(scope, options).await.expect("acquire") {
        Acquire::Duplicate(record) => record,
        Acquire::Acquired(attempt) => panic!("expected a duplicate of {scope}, got {attempt:?}"),
    }
}

/// Waits, reading only, until the owner's lease on `scope` has lapsed; panics after `PATIENCE`.
async fn until_the_lease_lapses(log: &IdempotencyLog, scope: &Scope) {
    eventually(PATIENCE, "the lease lapsing", || async move {
        log.get(scope).await.unwrap().unwrap().lease_remaining() == Duration::ZERO
    })
    .await;
}

/// Acquires `scope` with `options`, retrying while it answers Duplicate, until `PATIENCE`.
async fn acquired_eventually(
    log: &IdempotencyLog,
    scope: &Scope,
    options: &AcquireOptions,
) -> Attempt {
    let start = Instant::now();
    loop {
        match log.try_acquire_with(scope, options).await.expect("acquire") {
            Acquire::Acquired(attempt) => return attempt,
            Acquire::Duplicate(record) => assert!(
                start.elapsed() < PATIENCE,
                "{scope} was not acquirable within {PATIENCE:?}: {record:?}"
            ),
        }
        sleep(ms(10)).await;
    }
}

/// The first attempt acquires a pending record; a duplicate sees it pending, with the owner's
/// lease running, and changes nothing.
pub async fn first_attempt_acquires_and_duplicates_see_it_pending(h: &dyn IdempotencyHarness) {
    let ns = fresh_namespace();
    let log = log(h.open().await, &ns);
    let scope = scope("first");
    let options = long(DAY).fingerprint("fp-1");
    let attempt = acquired(&log, &scope, &options).await;
    assert_eq!(attempt.number(), 1);
    assert_eq!(attempt.takeover(), None);
    assert_eq!(attempt.scope(), &scope);
    let record = attempt.record();
    assert_eq!(record.status(), Status::Pending);
    assert_eq!(record.fingerprint(), Some("fp-1"));
    assert!(record.metadata().is_empty());
    assert!(record.expires_in() <= DAY && record.expires_in() > DAY - Duration::from_secs(600));
    assert!(record.lease_remaining() <= LONG_LEASE && record.lease_remaining() > Duration::ZERO);

    let seen = duplicate(&log, &scope, &options).await;
    assert_eq!(seen.status(), Status::Pending);
    assert_eq!(seen.attempt(), 1);
    assert!(seen.fingerprint_matches(Some("fp-1")));
    assert!(seen.lease_remaining() > Duration::ZERO);
    let got = log.get(&scope).await.unwrap().expect("the record is there");
    assert_eq!((got.status(), got.attempt()), (Status::Pending, 1));
    // The duplicate changed nothing: the first attempt still finalizes.
    assert!(matches!(
        log.finalize(&attempt, Outcome::Completed, b"ok")
            .await
            .unwrap(),
        Finalize::Finalized(_)
    ));
}

/// 1,000 attempts on one scope from 8 concurrent tasks: exactly one acquires.
pub async fn one_of_a_thousand_concurrent_attempts_acquires(h: &dyn IdempotencyHarness) {
    let ns = fresh_namespace();
    let log = log(h.open().await, &ns);
    let scope = scope("contended");
    let winners = race(&log, &scope, &long(DAY), 8, 1000).await;
    assert_eq!(winners.len(), 1, "exactly one of 1,000 attempts acquires");
    assert_eq!(winners[0].number(), 1);
}

/// Runs `attempts` acquires of `scope` with `options`, spread over `tasks` concurrent tasks
/// that start together, and returns the attempts that acquired. For store tests that race
/// several processes (each process runs one race and reports how many it won).
///
/// # Panics
/// When an acquire fails.
pub async fn race(
    log: &IdempotencyLog,
    scope: &Scope,
    options: &AcquireOptions,
    tasks: usize,
    attempts: usize,
) -> Vec<Attempt> {
    let start = Arc::new(tokio::sync::Barrier::new(tasks));
    let handles: Vec<_> = (0..tasks)
        .map(|task| {
            let (log, scope, options, start) = (
                log.clone(),
                scope.clone(),
                options.clone(),
                Arc::clone(&start),
            );
            let mine = attempts / tasks + usize::from(task < attempts % tasks);
            tokio::spawn(async move {
                start.wait().await;
                let mut won = Vec::new();
                for _ in 0..mine {
                    if let Acquire::Acquired(attempt) = log
                        .try_acquire_with(&scope, &options)
                        .await
                        .expect("acquire")
                    {
                        won.push(attempt);
                    }
                }
                won
            })
        })
        .collect();
    let mut winners = Vec::new();
    for handle in handles {
        winners.extend(handle.await.expect("a racing task"));
    }
    winners
}

/// From `tasks` concurrent tasks, keeps trying to acquire `scope` (every few milliseconds)
/// until the record's attempt number reaches `attempt`, and returns the attempts that
/// acquired. Used to race for the takeover of a record whose owner died: every contender
/// stops once someone took over, so the answer is how many did.
///
/// # Panics
/// When an acquire fails, or nobody reached `attempt` within a minute.
pub async fn race_until_attempt(
    log: &IdempotencyLog,
    scope: &Scope,
    options: &AcquireOptions,
    tasks: usize,
    attempt: u32,
) -> Vec<Attempt> {
    let handles: Vec<_> = (0..tasks)
        .map(|_| {
            let (log, scope, options) = (log.clone(), scope.clone(), options.clone());
            tokio::spawn(async move {
                let start = Instant::now();
                let mut won = Vec::new();
                loop {
                    match log
                        .try_acquire_with(&scope, &options)
                        .await
                        .expect("acquire")
                    {
                        Acquire::Acquired(a) => {
                            let reached = a.number() >= attempt;
                            won.push(a);
                            if reached {
                                return won;
                            }
                        }
                        Acquire::Duplicate(record) if record.attempt() >= attempt => return won,
                        Acquire::Duplicate(record) => assert!(
                            start.elapsed() < 2 * PATIENCE,
                            "{scope} did not reach attempt {attempt}: {record:?}"
                        ),
                    }
                    sleep(ms(5)).await;
                }
            })
        })
        .collect();
    let mut winners = Vec::new();
    for handle in handles {
        winners.extend(handle.await.expect("a racing task"));
    }
    winners
}

/// Finalize stores the outcome and the metadata; duplicates then see them.
pub async fn finalize_stores_outcome_and_metadata(h: &dyn IdempotencyHarness) {
    let ns = fresh_namespace();
    let log = log(h.open().await, &ns);
    for (key, outcome, status) in [
        ("done", Outcome::Completed, Status::Completed),
        ("broken", Outcome::Failed, Status::Failed),
    ] {
        let scope = scope(key);
        let attempt = acquired(&log, &scope, &long(DAY)).await;
        let Finalize::Finalized(record) = log
            .finalize(&attempt, outcome, format!("result of {key}"))
            .await
            .unwrap()
        else {
            panic!("the owner finalizes");
        };
        assert_eq!(record.status(), status);
        assert_eq!(record.metadata(), format!("result of {key}").as_bytes());
        assert_eq!(record.lease_remaining(), Duration::ZERO);
        let seen = duplicate(&log, &scope, &long(DAY)).await;
        assert_eq!(seen.status(), status);
        assert_eq!(seen.metadata(), format!("result of {key}").as_bytes());
        assert_eq!(seen.attempt(), 1);
        assert!(seen.expires_in() > DAY - Duration::from_secs(600));
    }
}

/// Finalizing twice with the same attempt changes nothing the second time and answers the
/// record as the first finalize left it (a retried finalize is safe).
pub async fn finalize_is_idempotent_for_its_owner(h: &dyn IdempotencyHarness) {
    let ns = fresh_namespace();
    let log = log(h.open().await, &ns);
    let scope = scope("twice");
    let attempt = acquired(&log, &scope, &long(DAY)).await;
    let first = log
        .finalize(&attempt, Outcome::Completed, b"first")
        .await
        .unwrap();
    let again = log
        .finalize(&attempt, Outcome::Failed, b"second")
        .await
        .unwrap();
    let (Finalize::Finalized(first), Finalize::Finalized(again)) = (first, again) else {
        panic!("both finalizes answer Finalized");
    };
    assert_eq!(first.metadata(), b"first");
    assert_eq!(again.status(), Status::Completed);
    assert_eq!(again.metadata(), b"first");
    assert!(
        log.renew(&attempt).await.unwrap() == Renewal::NotHeld,
        "a finalized record has no lease"
    );
}

/// An attempt that was taken over cannot finalize or renew: it gets `NotOwner`, and the
/// record is exactly as the new owner left it.
pub async fn stale_finalize_is_not_owner_and_changes_nothing(h: &dyn IdempotencyHarness) {
    let ns = fresh_namespace();
    let log = log(h.open().await, &ns);
    let scope = scope("zombie");
    let options = AcquireOptions::new(DAY).lease(ms(50));
    let zombie = acquired(&log, &scope, &options).await;
    let owner = acquired_eventually(&log, &scope, &long(DAY)).await;
    assert_eq!(owner.takeover(), Some(Takeover::LeaseLapsed));
    assert_eq!(
        log.finalize(&zombie, Outcome::Completed, b"zombie")
            .await
            .unwrap(),
        Finalize::NotOwner
    );
    assert_eq!(log.renew(&zombie).await.unwrap(), Renewal::NotHeld);
    let record = log.get(&scope).await.unwrap().unwrap();
    assert_eq!((record.status(), record.attempt()), (Status::Pending, 2));
    assert!(record.metadata().is_empty());
    let Finalize::Finalized(done) = log
        .finalize(&owner, Outcome::Completed, b"owner")
        .await
        .unwrap()
    else {
        panic!("the new owner finalizes");
    };
    assert_eq!(done.metadata(), b"owner");
    assert_eq!(
        log.finalize(&zombie, Outcome::Failed, b"zombie")
            .await
            .unwrap(),
        Finalize::NotOwner,
        "not even after the owner finalized"
    );
    assert_eq!(log.get(&scope).await.unwrap().unwrap().metadata(), b"owner");
}

/// A pending record is not taken over while its owner's lease runs; once it lapsed, the next
/// attempt takes it over as attempt 2, with its own lease.
pub async fn takeover_only_after_the_lease_lapses(h: &dyn IdempotencyHarness) {
    let ns = fresh_namespace();
    let log = log(h.open().await, &ns);
    let held = scope("held");
    let _owner = acquired(&log, &held, &long(DAY)).await;
    for _ in 0..3 {
        let seen = duplicate(&log, &held, &long(DAY)).await;
        assert_eq!(seen.attempt(), 1, "a running lease is never taken over");
    }

    let lapsing = scope("lapsing");
    let first = acquired(&log, &lapsing, &AcquireOptions::new(DAY).lease(ms(100))).await;
    let second = acquired_eventually(&log, &lapsing, &long(DAY)).await;
    assert_eq!(second.takeover(), Some(Takeover::LeaseLapsed));
    assert_eq!(second.number(), 2);
    assert_eq!(second.record().status(), Status::Pending);
    assert!(
        second.record().lease_remaining() > Duration::from_secs(10),
        "the new owner's lease"
    );
    let seen = duplicate(&log, &lapsing, &long(DAY)).await;
    assert_eq!(seen.attempt(), 2);
    drop(first);
}

/// When many attempts race for a lapsed record, exactly one takes it over.
pub async fn exactly_one_of_many_takes_over(h: &dyn IdempotencyHarness) {
    let ns = fresh_namespace();
    let log = log(h.open().await, &ns);
    let scope = scope("takeover-race");
    let _dead = acquired(&log, &scope, &AcquireOptions::new(DAY).lease(ms(50))).await;
    // Wait until the lease has lapsed, reading only.
    until_the_lease_lapses(&log, &scope).await;
    let winners: Vec<_> = race_until_attempt(&log, &scope, &long(DAY), 8, 2)
        .await
        .into_iter()
        .map(|a| (a.number(), a.takeover()))
        .collect();
    assert_eq!(winners, [(2, Some(Takeover::LeaseLapsed))]);
}

/// An owner whose lease lapsed but whom nobody took over still owns the record: its renewal
/// and its finalize are accepted.
pub async fn late_finalize_without_takeover_is_accepted(h: &dyn IdempotencyHarness) {
    let ns = fresh_namespace();
    let log = log(h.open().await, &ns);
    let scope = scope("late");
    let attempt = acquired(&log, &scope, &AcquireOptions::new(DAY).lease(ms(30))).await;
    until_the_lease_lapses(&log, &scope).await;
    assert_eq!(
        log.renew(&attempt).await.unwrap(),
        Renewal::Renewed,
        "renewing after a lapse"
    );
    let Finalize::Finalized(record) = log
        .finalize(&attempt, Outcome::Completed, b"late")
        .await
        .unwrap()
    else {
        panic!("nobody took over, so the owner still finalizes");
    };
    assert_eq!(
        (record.status(), record.metadata()),
        (Status::Completed, &b"late"[..])
    );
}

/// The log's keep-alive renews an attempt's lease past its length, so duplicates keep out and
/// nobody takes over; once the attempt no longer owns its record, the lost signal fires.
pub async fn keep_alive_holds_the_lease_and_signals_a_finalize_elsewhere(
    h: &dyn IdempotencyHarness,
) {
    let ns = fresh_namespace();
    let log = log(h.open().await, &ns);
    let scope = scope("kept");
    // A lease of 1.5 s renewed every 500 ms, held for three leases.
    let lease = ms(1500);
    let attempt = acquired(&log, &scope, &AcquireOptions::new(DAY).lease(lease)).await;
    let kept = log.keep_alive(&attempt);
    sleep(lease * 3).await;
    assert!(!kept.is_lost(), "renewed across three leases");
    let record = duplicate(&log, &scope, &AcquireOptions::new(DAY).lease(lease)).await;
    assert_eq!(
        record.status(),
        Status::Pending,
        "still the attempt's, pending"
    );
    assert!(
        record.lease_remaining() > Duration::ZERO,
        "no takeover possible"
    );
    assert!(kept.valid_until() > Instant::now());
    // Finalized while the keep-alive still runs: the next renewal finds the record no longer
    // the attempt's pending one, and the keep-alive reports it.
    log.finalize(&attempt, Outcome::Completed, b"done")
        .await
        .unwrap();
    tokio::time::timeout(PATIENCE, kept.lost())
        .await
        .expect("lost fires once the record is not the attempt's pending record");
}

/// Renewing restarts the owner's lease from now, so duplicates keep out while it is renewed.
pub async fn renew_keeps_duplicates_out(h: &dyn IdempotencyHarness) {
    let ns = fresh_namespace();
    let log = log(h.open().await, &ns);
    let scope = scope("renewed");
    let lease = Duration::from_secs(30);
    let attempt = acquired(&log, &scope, &AcquireOptions::new(DAY).lease(lease)).await;
    sleep(Duration::from_secs(2)).await;
    let before = log.get(&scope).await.unwrap().unwrap().lease_remaining();
    assert!(before <= lease - Duration::from_secs(2), "{before:?}");
    assert_eq!(log.renew(&attempt).await.unwrap(), Renewal::Renewed);
    let after = log.get(&scope).await.unwrap().unwrap();
    assert!(
        after.lease_remaining() > before,
        "{:?} after renewing, {before:?} before",
        after.lease_remaining()
    );
    assert!(after.lease_remaining() <= lease);
    assert_eq!((after.status(), after.attempt()), (Status::Pending, 1));
    assert_eq!(duplicate(&log, &scope, &long(DAY)).await.attempt(), 1);
    assert!(matches!(
        log.finalize(&attempt, Outcome::Completed, b"")
            .await
            .unwrap(),
        Finalize::Finalized(_)
    ));
}

/// A failed record is a duplicate unless the attempt asks to retry failures; then one
/// attempt takes it over as the next attempt number.
pub async fn failed_records_are_retried_only_when_asked(h: &dyn IdempotencyHarness) {
    let ns = fresh_namespace();
    let log = log(h.open().await, &ns);
    let scope = scope("flaky");
    let first = acquired(&log, &scope, &long(DAY).fingerprint("f")).await;
    log.finalize(&first, Outcome::Failed, b"boom")
        .await
        .unwrap();
    let seen = duplicate(&log, &scope, &long(DAY).fingerprint("f")).await;
    assert_eq!(
        (seen.status(), seen.metadata()),
        (Status::Failed, &b"boom"[..])
    );
    let retry = long(DAY).fingerprint("f").retry_failed(true);
    let second = acquired(&log, &scope, &retry).await;
    assert_eq!(
        (second.number(), second.takeover()),
        (2, Some(Takeover::RetryFailed))
    );
    assert!(
        second.record().metadata().is_empty(),
        "a retry starts without the old metadata"
    );
    let again = duplicate(&log, &scope, &retry).await;
    assert_eq!(
        again.status(),
        Status::Pending,
        "the retry is pending, not retried twice"
    );
    log.finalize(&second, Outcome::Completed, b"ok")
        .await
        .unwrap();
    let done = duplicate(&log, &scope, &retry).await;
    assert_eq!((done.status(), done.attempt()), (Status::Completed, 2));
    assert_eq!(
        log.finalize(&first, Outcome::Completed, b"").await.unwrap(),
        Finalize::NotOwner
    );
}

/// An attempt with another fingerprint never takes over a lapsed or failed record; it sees
/// the record and can tell the request differs.
pub async fn different_fingerprint_never_takes_over(h: &dyn IdempotencyHarness) {
    let ns = fresh_namespace();
    let log = log(h.open().await, &ns);
    let lapsed = scope("fp-lapsed");
    let _dead = acquired(
        &log,
        &lapsed,
        &AcquireOptions::new(DAY).lease(ms(20)).fingerprint("a"),
    )
    .await;
    let failed = scope("fp-failed");
    let owner = acquired(&log, &failed, &long(DAY).fingerprint("a")).await;
    log.finalize(&owner, Outcome::Failed, b"").await.unwrap();
    until_the_lease_lapses(&log, &lapsed).await;
    for other in [
        AcquireOptions::new(DAY).fingerprint("b").retry_failed(true),
        AcquireOptions::new(DAY).retry_failed(true),
    ] {
        for scope in [&lapsed, &failed] {
            let seen = duplicate(&log, scope, &other).await;
            assert!(seen.fingerprint_matches(Some("a")));
            assert!(!seen.fingerprint_matches(Some("b")));
            assert_eq!(seen.attempt(), 1);
        }
    }
    let same = AcquireOptions::new(DAY).fingerprint("a").retry_failed(true);
    assert_eq!(acquired(&log, &lapsed, &same).await.number(), 2);
    assert_eq!(acquired(&log, &failed, &same).await.number(), 2);
}

/// A record expires after its TTL whatever its status; the scope then starts afresh.
pub async fn records_expire_after_their_ttl(h: &dyn IdempotencyHarness) {
    let ns = fresh_namespace();
    let log = log(h.open().await, &ns);
    let done = scope("short-lived");
    let ttl = AcquireOptions::new(ms(300));
    let attempt = acquired(&log, &done, &ttl).await;
    log.finalize(&attempt, Outcome::Completed, b"x")
        .await
        .unwrap();
    let fresh = acquired_eventually(&log, &done, &ttl).await;
    assert_eq!(
        (fresh.number(), fresh.takeover()),
        (1, None),
        "an expired record is gone"
    );
    let start = Instant::now();
    while log.get(&done).await.unwrap().is_some() {
        assert!(start.elapsed() < PATIENCE, "the record never expired");
        sleep(ms(20)).await;
    }
    // An expired record cannot be finalized or renewed.
    assert_eq!(
        log.finalize(&fresh, Outcome::Completed, b"").await.unwrap(),
        Finalize::NotOwner
    );
    assert_eq!(log.renew(&fresh).await.unwrap(), Renewal::NotHeld);
}

/// Scopes differing in any part, and namespaces, never see each other's records.
pub async fn scopes_and_namespaces_are_isolated(h: &dyn IdempotencyHarness) {
    let ns = fresh_namespace();
    let store = h.open().await;
    let log = log(Arc::clone(&store), &ns);
    let scopes = [
        Scope::new("org-1", "charges", "k").unwrap(),
        Scope::new("org-2", "charges", "k").unwrap(),
        Scope::new("org-1", "refunds", "k").unwrap(),
        Scope::new("org-1", "charges", "k2").unwrap(),
        Scope::new("org-1", "charges", "k:x").unwrap(),
    ];
    for scope in &scopes {
        let _owner = acquired(&log, scope, &long(DAY)).await;
    }
    let elsewhere = IdempotencyLog::with_namespace(store, fresh_namespace());
    for scope in &scopes {
        assert!(elsewhere.get(scope).await.unwrap().is_none());
        let _owner = acquired(&elsewhere, scope, &long(DAY)).await;
    }
}

/// Metadata is stored exactly: empty, every byte value, and the largest allowed.
pub async fn metadata_round_trips_any_bytes(h: &dyn IdempotencyHarness) {
    let ns = fresh_namespace();
    let log = log(h.open().await, &ns);
    let every: Vec<u8> = (0..=255u8).chain((0..=255u8).rev()).collect();
    let largest: Vec<u8> = (0..MAX_METADATA_BYTES)
        .map(|i| (i * 31 % 251) as u8)
        .collect();
    for (key, metadata) in [
        ("empty", Vec::new()),
        ("every", every),
        ("largest", largest),
    ] {
        let scope = scope(key);
        let attempt = acquired(&log, &scope, &long(DAY)).await;
        log.finalize(&attempt, Outcome::Completed, &metadata)
            .await
            .unwrap();
        let seen = duplicate(&log, &scope, &long(DAY)).await;
        assert!(
            seen.metadata() == metadata.as_slice(),
            "{key} changed in the store"
        );
        assert_eq!(
            log.get(&scope).await.unwrap().unwrap().into_metadata(),
            metadata
        );
    }
}

/// Records, their owners and their leases survive closing and re-opening a durable store.
pub async fn records_survive_reopen(h: &dyn IdempotencyHarness) {
    let ns = fresh_namespace();
    let first = log(h.open().await, &ns);
    let (done, pending) = (scope("durable-done"), scope("durable-pending"));
    let a = acquired(&first, &done, &long(DAY)).await;
    first
        .finalize(&a, Outcome::Completed, b"kept")
        .await
        .unwrap();
    let b = acquired(&first, &pending, &long(DAY)).await;
    drop(first);
    let Some(store) = h.reopen().await else {
        return;
    };
    let again = log(store, &ns);
    let seen = duplicate(&again, &done, &long(DAY)).await;
    assert_eq!(
        (seen.status(), seen.metadata()),
        (Status::Completed, &b"kept"[..])
    );
    let seen = duplicate(&again, &pending, &long(DAY)).await;
    assert!(
        seen.lease_remaining() > Duration::ZERO,
        "the lease survives a reopen"
    );
    // The attempt made before the reopen still owns its record.
    assert!(matches!(
        again
            .finalize(&b, Outcome::Completed, b"after")
            .await
            .unwrap(),
        Finalize::Finalized(_)
    ));
}

/// Bad input is rejected with `InvalidInput` before any I/O.
pub async fn invalid_input_is_rejected_before_io(h: &dyn IdempotencyHarness) {
    let ns = fresh_namespace();
    let faulty = Arc::new(FaultyIdempotencyStore::new(h.open().await));
    let log = log(faulty.clone(), &ns);
    let scope = scope("valid");
    let bad_options = [
        AcquireOptions::new(Duration::ZERO),
        AcquireOptions::new(ms(9)),
        AcquireOptions::new(Duration::from_secs(31 * 86_400)),
        AcquireOptions::new(DAY).lease(ms(5)),
        AcquireOptions::new(Duration::from_secs(5)).lease(Duration::from_secs(6)),
        AcquireOptions::new(DAY).fingerprint(""),
        AcquireOptions::new(DAY).fingerprint("a\nb"),
        AcquireOptions::new(DAY).fingerprint("f".repeat(257)),
    ];
    for options in &bad_options {
        let e = log.try_acquire_with(&scope, options).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput, "{options:?}: {e}");
    }
    assert_eq!(faulty.calls(), 0, "no I/O for bad options");
    let attempt = acquired(&log, &scope, &long(DAY)).await;
    let calls = faulty.calls();
    let e = log
        .finalize(
            &attempt,
            Outcome::Completed,
            vec![0; MAX_METADATA_BYTES + 1],
        )
        .await
        .unwrap_err();
    assert!(e.is_invalid_input(), "{e}");
    assert_eq!(faulty.calls(), calls, "no I/O for oversized metadata");
    assert_eq!(
        log.get(&scope).await.unwrap().unwrap().status(),
        Status::Pending,
        "and nothing changed"
    );
    for (org, domain, key) in [("", "d", "k"), ("o:x", "d", "k"), ("o", "d", "k\u{0}")] {
        assert!(Scope::new(org, domain, key).unwrap_err().is_invalid_input());
    }
}

/// A store fault is an `Unavailable` error, never a duplicate nor an acquire.
pub async fn store_faults_are_errors_not_duplicates(h: &dyn IdempotencyHarness) {
    let ns = fresh_namespace();
    let faulty = Arc::new(FaultyIdempotencyStore::new(h.open().await));
    let log = log(faulty.clone(), &ns);
    let scope = scope("faulty");
    let attempt = acquired(&log, &scope, &long(DAY)).await;
    faulty.set_failing(true);
    let e = log.try_acquire_with(&scope, &long(DAY)).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    assert!(e.is_retryable());
    let e = log
        .try_acquire_with(
            &Scope::new("org-1", "charges", "other").unwrap(),
            &long(DAY),
        )
        .await
        .unwrap_err();
    assert_eq!(
        e.kind(),
        ErrorKind::Unavailable,
        "a free scope does not look acquired"
    );
    assert!(
        log.finalize(&attempt, Outcome::Completed, b"")
            .await
            .unwrap_err()
            .is_unavailable()
    );
    assert!(log.renew(&attempt).await.unwrap_err().is_unavailable());
    assert!(log.get(&scope).await.unwrap_err().is_unavailable());
    faulty.set_failing(false);
    assert_eq!(
        log.get(&scope).await.unwrap().unwrap().status(),
        Status::Pending
    );
    assert!(matches!(
        log.finalize(&attempt, Outcome::Completed, b"")
            .await
            .unwrap(),
        Finalize::Finalized(_)
    ));
}

/// An idempotency store wrapper for the rules about misbehaving stores: counts calls and,
/// while failing, answers every call with `Unavailable` without reaching the store.
pub type FaultyIdempotencyStore = Faulty<dyn IdempotencyStore>;

#[async_trait]
impl IdempotencyStore for FaultyIdempotencyStore {
    async fn acquire(&self, key: &StoreKey, request: AcquireRequest<'_>) -> Result<AcquireAnswer> {
        self.enter()?;
        self.inner.acquire(key, request).await
    }

    async fn renew(&self, key: &StoreKey, owner: &Holder, lease: Ttl) -> Result<Renewal> {
        self.enter()?;
        self.inner.renew(key, owner, lease).await
    }

    async fn finalize(&self, key: &StoreKey, end: AttemptEnd<'_>) -> Result<FinalizeAnswer> {
        self.enter()?;
        self.inner.finalize(key, end).await
    }

    async fn get(&self, key: &StoreKey) -> Result<Option<StoredRecord>> {
        self.enter()?;
        self.inner.get(key).await
    }
}
