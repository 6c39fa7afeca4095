//! The lock and lease conformance rules: one test per contract rule, written once, run by
//! every store.
//!
//! A store's test target implements [`Harness`] and expands
//! [`conformance_tests!`](crate::conformance_tests)
//! (`baton_core::conformance_tests!(my_harness())`), which generates one `#[tokio::test]` per
//! rule. Each rule uses a fresh random namespace, so the rules may share a server.
//!
//! The rules exercise the policy layer ([`Locks`], [`Leases`]) *through* the store, and the
//! store atoms directly where a rule is about the atom itself. [`FaultyStore`] wraps a real
//! store to count calls, inject faults and delay answers, for the rules about what the
//! policy does when a store misbehaves.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::{Instant, sleep, timeout};

use crate::conformance::{eventually, fresh_namespace, ms};
use crate::error::{Error, ErrorKind, Result};
use crate::holder::Holder;
use crate::key::{Key, KeyKind, Namespace, StoreKey};
use crate::lease::{ClaimResult, KeptClaim, LeaseOptions, Leases, RemoveResult, stream_key};
use crate::lock::{AcquireError, LockOptions, Locks, ReleaseOutcome};
use crate::store::{Claim, HolderInfo, LeaseRequest, LeaseStore, Release, Renewal, Wakeups};
use crate::time::Ttl;

/// What a store's test target provides to the suite.
#[async_trait]
pub trait Harness: Send + Sync + 'static {
    /// The store under test. Every call within one harness sees the same data.
    async fn open(&self) -> Arc<dyn LeaseStore>;

    /// Closes the store and opens it again from its durable state (a new process would see
    /// the same). A store without durable state returns a new, empty store.
    async fn reopen(&self) -> Arc<dyn LeaseStore>;

    /// Removes `key`'s grant behind its holder's back, as an operator breaking a lock would.
    async fn evict(&self, key: &StoreKey);
}

/// Generates one `#[tokio::test]` per conformance rule. `$harness` is an expression that
/// evaluates to a future of a [`Harness`]; it is evaluated once per test.
#[macro_export]
macro_rules! conformance_tests {
    ($harness:expr) => {
        $crate::__conformance_rules!($crate::conformance; $harness;
            grant_and_release,
            contended_reports_the_holder,
            two_holders_never_overlap,
            fences_increase_across_grants,
            fences_increase_after_expiry,
            fences_increase_after_reopen,
            release_after_expiry_is_expired_and_spares_the_new_holder,
            double_release_is_harmless,
            reentrant_attempt_fails,
            wait_zero_makes_one_attempt,
            waiter_wakes_on_release,
            waiter_wakes_on_expiry,
            no_waiter_starves,
            lost_fires_when_key_is_deleted,
            lost_fires_when_renewal_is_impossible,
            lost_fires_at_valid_until_without_keep_alive,
            keep_alive_holds_across_ttls,
            max_hold_stops_renewal,
            kept_until_expiry_stays_held_quietly,
            kept_for_holds_for_the_new_ttl,
            store_faults_are_unavailable_not_contention,
            invalid_input_is_rejected_before_io,
            dropped_guard_is_released_in_background,
            cancelled_acquire_leaves_no_lock,
            cancelled_release_still_releases,
            lease_reclaim_is_idempotent_and_extends,
            lease_release_reports_ownership,
            late_renewal_never_revives,
            lease_keep_alive_signals_loss,
            inspect_and_list,
        );
    };
}

/// Generates one `#[tokio::test]` per rule named, each running `$module::$rule` against
/// the harness `$harness` evaluates to. Shared by the suites' exported macros.
#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_rules {
    ($module:path; $harness:expr; $($rule:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $rule() {
                use $module as rules;
                let harness = $harness.await;
                rules::$rule(&harness).await;
            }
        )*
    };
}

fn locks(store: Arc<dyn LeaseStore>, ns: &Namespace) -> Locks {
    Locks::with_namespace(store, ns.clone())
}

fn lock_key(ns: &Namespace, key: &str) -> StoreKey {
    ns.qualify(KeyKind::Lock, &Key::new(key).expect("valid key"))
}

fn lease_key(ns: &Namespace, key: &str) -> StoreKey {
    ns.qualify(KeyKind::Lease, &Key::new(key).expect("valid key"))
}

fn ttl(d: Duration) -> Ttl {
    Ttl::new(d).expect("valid ttl")
}

async fn granted(store: &dyn LeaseStore, key: &StoreKey, holder: &Holder, t: Duration) -> u64 {
    match store
        .claim(key, LeaseRequest::new(holder, ttl(t)))
        .await
        .expect("claim")
    {
        Claim::Granted { fence } => fence.get(),
        other => panic!("expected a grant of {key}, got {other:?}"),
    }
}

/// A grant is made with a fence, shows up in `inspect`, and is gone after release.
pub async fn grant_and_release(h: &dyn Harness) {
    let ns = fresh_namespace();
    let locks = locks(h.open().await, &ns);
    let guard = locks
        .acquire("job", &LockOptions::new(Duration::from_secs(10)))
        .await
        .expect("free key is granted");
    assert!(guard.fence().get() > 0);
    assert!(!guard.is_lost());
    assert!(guard.valid_until() > Instant::now());
    let info = locks.inspect("job").await.unwrap().expect("held");
    assert_eq!(info.fence, guard.fence());
    assert!(info.remaining <= Duration::from_secs(10));
    assert!(info.remaining > Duration::from_secs(5));
    assert_eq!(guard.release().await, ReleaseOutcome::Released);
    assert!(locks.inspect("job").await.unwrap().is_none());
}

/// Contention is a result that names the holder, not an error.
pub async fn contended_reports_the_holder(h: &dyn Harness) {
    let ns = fresh_namespace();
    let locks = locks(h.open().await, &ns);
    let guard = locks
        .acquire("job", &LockOptions::new(Duration::from_secs(10)))
        .await
        .unwrap();
    let holder = locks.inspect("job").await.unwrap().unwrap().holder;
    match locks
        .acquire("job", &LockOptions::new(Duration::from_secs(10)))
        .await
    {
        Err(AcquireError::Contended {
            holder: Some(seen),
            remaining: Some(remaining),
        }) => {
            assert_eq!(seen, holder.as_str());
            assert!(remaining <= Duration::from_secs(10));
        }
        other => panic!("expected Contended with the holder, got {other:?}"),
    }
    guard.release().await;
}

/// Two holders never hold one key at once, at the atom and through the lock policy.
pub async fn two_holders_never_overlap(h: &dyn Harness) {
    let ns = fresh_namespace();
    let store = h.open().await;
    let key = lock_key(&ns, "k");
    let (a, b) = (Holder::random(), Holder::random());
    granted(&*store, &key, &a, Duration::from_secs(10)).await;
    match store
        .claim(&key, LeaseRequest::new(&b, ttl(Duration::from_secs(10))))
        .await
        .unwrap()
    {
        Claim::Held { holder, .. } => assert_eq!(holder, a),
        other => panic!("second holder must see Held, got {other:?}"),
    }

    let locks = locks(store, &ns);
    let inside = Arc::new(AtomicUsize::new(0));
    let entries = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let (locks, inside, entries) = (locks.clone(), inside.clone(), entries.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..5 {
                let options =
                    LockOptions::new(Duration::from_secs(10)).wait(Duration::from_secs(20));
                let guard = locks.acquire("shared", &options).await.expect("acquired");
                assert_eq!(
                    inside.fetch_add(1, Ordering::SeqCst),
                    0,
                    "two holders at once"
                );
                entries.fetch_add(1, Ordering::SeqCst);
                sleep(ms(2)).await;
                inside.fetch_sub(1, Ordering::SeqCst);
                assert_eq!(guard.release().await, ReleaseOutcome::Released);
            }
        }));
    }
    for task in tasks {
        task.await.expect("contender panicked");
    }
    assert_eq!(entries.load(Ordering::SeqCst), 40);
}

/// Fences strictly increase across grants of one key.
pub async fn fences_increase_across_grants(h: &dyn Harness) {
    let ns = fresh_namespace();
    let locks = locks(h.open().await, &ns);
    let mut last = 0;
    for _ in 0..5 {
        let guard = locks
            .acquire("k", &LockOptions::new(Duration::from_secs(10)))
            .await
            .unwrap();
        assert!(
            guard.fence().get() > last,
            "fence {} after {last}",
            guard.fence()
        );
        last = guard.fence().get();
        guard.release().await;
    }
}

/// A grant that expired is followed by one with a larger fence.
pub async fn fences_increase_after_expiry(h: &dyn Harness) {
    let ns = fresh_namespace();
    let store = h.open().await;
    let key = lock_key(&ns, "k");
    let first = granted(&*store, &key, &Holder::random(), ms(30)).await;
    sleep(ms(80)).await;
    let second = granted(&*store, &key, &Holder::random(), ms(30)).await;
    assert!(second > first, "fence {second} after expired {first}");
}

/// Fences keep increasing after the store is closed and opened again.
pub async fn fences_increase_after_reopen(h: &dyn Harness) {
    let ns = fresh_namespace();
    let key = lock_key(&ns, "k");
    let store = h.open().await;
    let holder = Holder::random();
    let first = granted(&*store, &key, &holder, Duration::from_secs(10)).await;
    assert_eq!(
        store.release(&key, &holder).await.unwrap(),
        Release::Removed
    );
    drop(store);
    let store = h.reopen().await;
    let second = granted(&*store, &key, &Holder::random(), Duration::from_secs(10)).await;
    assert!(
        second > first,
        "fence {second} after re-open, before it {first}"
    );
}

/// Releasing a guard whose grant expired reports `Expired` and leaves the new holder alone.
pub async fn release_after_expiry_is_expired_and_spares_the_new_holder(h: &dyn Harness) {
    let ns = fresh_namespace();
    let locks = locks(h.open().await, &ns);
    let old = locks.acquire("k", &LockOptions::new(ms(50))).await.unwrap();
    sleep(ms(120)).await;
    let new = locks
        .acquire("k", &LockOptions::new(Duration::from_secs(10)))
        .await
        .expect("expired grant can be taken");
    assert!(new.fence() > old.fence());
    assert!(old.is_lost(), "the old guard's valid_until passed");
    assert_eq!(old.release().await, ReleaseOutcome::Expired);
    let info = locks.inspect("k").await.unwrap().expect("new holder kept");
    assert_eq!(info.fence, new.fence());
    assert_eq!(new.release().await, ReleaseOutcome::Released);
}

/// Releasing twice, or releasing a grant that is gone, changes nothing.
pub async fn double_release_is_harmless(h: &dyn Harness) {
    let ns = fresh_namespace();
    let store = h.open().await;
    let key = lock_key(&ns, "k");
    let (a, b) = (Holder::random(), Holder::random());
    granted(&*store, &key, &a, Duration::from_secs(10)).await;
    assert_eq!(store.release(&key, &a).await.unwrap(), Release::Removed);
    assert_eq!(store.release(&key, &a).await.unwrap(), Release::NoHolder);
    granted(&*store, &key, &b, Duration::from_secs(10)).await;
    assert_eq!(
        store.release(&key, &a).await.unwrap(),
        Release::Reclaimed { by: b.clone() }
    );
    let info = store.inspect(&key).await.unwrap().expect("b still holds");
    assert_eq!(info.holder, b);

    // A guard that was dropped after release does not release again.
    let locks = locks(store, &ns);
    let guard = locks
        .acquire("g", &LockOptions::new(Duration::from_secs(10)))
        .await
        .unwrap();
    assert_eq!(guard.release().await, ReleaseOutcome::Released);
    let next = locks
        .acquire("g", &LockOptions::new(Duration::from_secs(10)))
        .await
        .unwrap();
    sleep(ms(50)).await;
    assert_eq!(
        locks.inspect("g").await.unwrap().map(|i| i.fence),
        Some(next.fence())
    );
    next.release().await;
}

/// The same task asking again for a lock it holds waits for itself and fails.
pub async fn reentrant_attempt_fails(h: &dyn Harness) {
    let ns = fresh_namespace();
    let locks = locks(h.open().await, &ns);
    let guard = locks
        .acquire("k", &LockOptions::new(Duration::from_secs(10)))
        .await
        .unwrap();
    let started = Instant::now();
    let again = locks
        .try_acquire(
            "k",
            &LockOptions::new(Duration::from_secs(10)).wait(ms(200)),
        )
        .await
        .expect("no store fault");
    assert!(again.is_none(), "a lock is not reentrant");
    assert!(started.elapsed() >= ms(200), "it waited for the whole wait");
    assert!(locks.inspect("k").await.unwrap().is_some());
    assert_eq!(guard.release().await, ReleaseOutcome::Released);
}

/// `wait == 0` is exactly one attempt.
pub async fn wait_zero_makes_one_attempt(h: &dyn Harness) {
    let ns = fresh_namespace();
    let store = Arc::new(FaultyStore::new(h.open().await));
    let locks = locks(store.clone(), &ns);
    let guard = locks
        .acquire("k", &LockOptions::new(Duration::from_secs(10)))
        .await
        .unwrap();
    let before = store.claims();
    let started = Instant::now();
    let none = locks
        .try_acquire("k", &LockOptions::new(Duration::from_secs(10)))
        .await
        .unwrap();
    assert!(none.is_none());
    assert_eq!(store.claims() - before, 1, "exactly one claim");
    assert!(started.elapsed() < Duration::from_secs(5), "no waiting");
    guard.release().await;
}

/// A waiter wakes when the holder releases, long before the holder's TTL.
pub async fn waiter_wakes_on_release(h: &dyn Harness) {
    let ns = fresh_namespace();
    let locks = locks(h.open().await, &ns);
    let guard = locks
        .acquire("k", &LockOptions::new(Duration::from_secs(60)))
        .await
        .unwrap();
    let waiter = {
        let locks = locks.clone();
        tokio::spawn(async move {
            locks
                .acquire(
                    "k",
                    &LockOptions::new(Duration::from_secs(10)).wait(Duration::from_secs(20)),
                )
                .await
        })
    };
    sleep(ms(100)).await;
    let released_at = Instant::now();
    guard.release().await;
    let next = waiter
        .await
        .unwrap()
        .expect("the waiter gets the lock after the release");
    // The holder's TTL was 60s and the wait 20s: only a wake-up on release explains this.
    assert!(released_at.elapsed() < Duration::from_secs(20));
    next.release().await;
}

/// A waiter wakes when the holder's grant expires (expiry sends no signal).
pub async fn waiter_wakes_on_expiry(h: &dyn Harness) {
    let ns = fresh_namespace();
    let store = h.open().await;
    granted(&*store, &lock_key(&ns, "k"), &Holder::random(), ms(300)).await;
    let locks = locks(store, &ns);
    let started = Instant::now();
    let guard = locks
        .acquire(
            "k",
            &LockOptions::new(Duration::from_secs(10)).wait(Duration::from_secs(10)),
        )
        .await
        .expect("acquired after the holder's TTL");
    assert!(
        started.elapsed() >= ms(250),
        "not before the holder expired"
    );
    guard.release().await;
}

/// Contenders that cycle on one key each get a fair share: nobody starves.
pub async fn no_waiter_starves(h: &dyn Harness) {
    let ns = fresh_namespace();
    let locks = locks(h.open().await, &ns);
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let (locks, stop) = (locks.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            let mut won = 0u32;
            while !stop.load(Ordering::SeqCst) {
                let options =
                    LockOptions::new(Duration::from_secs(10)).wait(Duration::from_secs(10));
                let guard = locks.acquire("hot", &options).await.expect("acquired");
                won += 1;
                sleep(ms(3)).await;
                guard.release().await;
                sleep(ms(1)).await;
            }
            won
        }));
    }
    sleep(Duration::from_millis(1500)).await;
    stop.store(true, Ordering::SeqCst);
    let mut wins = Vec::new();
    for task in tasks {
        wins.push(task.await.unwrap());
    }
    let total: u32 = wins.iter().sum();
    let fair = total / 4;
    for won in &wins {
        assert!(*won * 4 >= fair, "a contender starved: wins {wins:?}");
    }
}

/// `lost()` fires when the grant is deleted behind the holder's back.
pub async fn lost_fires_when_key_is_deleted(h: &dyn Harness) {
    let ns = fresh_namespace();
    let locks = locks(h.open().await, &ns);
    let options = LockOptions::new(Duration::from_secs(2)).keep_alive(ms(100));
    let guard = locks.acquire("k", &options).await.unwrap();
    h.evict(&lock_key(&ns, "k")).await;
    timeout(Duration::from_secs(5), guard.lost())
        .await
        .expect("lost fires at the next renewal");
    // The next renewal found another state; the TTL (2s) has not passed, so only the
    // store's not-holder answer explains it.
    assert!(Instant::now() < guard.valid_until() + Duration::from_secs(1));
    assert_eq!(guard.release().await, ReleaseOutcome::Expired);
}

/// `lost()` fires when renewal is impossible, no later than shortly after `valid_until`,
/// and not before it.
pub async fn lost_fires_when_renewal_is_impossible(h: &dyn Harness) {
    let ns = fresh_namespace();
    let store = Arc::new(FaultyStore::new(h.open().await));
    let locks = locks(store.clone(), &ns);
    let options = LockOptions::new(ms(400)).keep_alive(ms(100));
    let guard = locks.acquire("k", &options).await.unwrap();
    store.set_failing(true);
    let deadline = guard.valid_until();
    timeout(Duration::from_secs(5), guard.lost())
        .await
        .expect("lost fires once valid_until passes without a renewal");
    assert!(Instant::now() >= deadline, "lost fired before valid_until");
    assert_eq!(guard.release().await, ReleaseOutcome::Faulted);
    store.set_failing(false);
}

/// Without keep-alive, `lost()` fires when `valid_until` passes.
pub async fn lost_fires_at_valid_until_without_keep_alive(h: &dyn Harness) {
    let ns = fresh_namespace();
    let locks = locks(h.open().await, &ns);
    let before = Instant::now();
    let guard = locks
        .acquire("k", &LockOptions::new(ms(200)))
        .await
        .unwrap();
    let after = Instant::now();
    assert!(
        guard.valid_until() >= before + ms(200) && guard.valid_until() <= after + ms(200),
        "valid_until is the ttl counted from when the request was sent"
    );
    timeout(Duration::from_secs(5), guard.lost())
        .await
        .expect("lost fires at valid_until");
    assert!(Instant::now() >= guard.valid_until());
    guard.release().await;
}

/// Keep-alive holds a lock across several TTLs; nobody else gets it meanwhile.
pub async fn keep_alive_holds_across_ttls(h: &dyn Harness) {
    let ns = fresh_namespace();
    let locks = locks(h.open().await, &ns);
    // Renewals every 200 ms against a 1 s TTL: a renewal may take most of a TTL on a
    // loaded machine (an SQLite write behind other tests' transactions) before the lock
    // would lapse; the loop spans three TTLs.
    let options = LockOptions::new(ms(1000)).keep_alive(ms(200));
    let guard = locks.acquire("k", &options).await.unwrap();
    let first_deadline = guard.valid_until();
    let started = Instant::now();
    while started.elapsed() < ms(3000) {
        let other = locks
            .try_acquire("k", &LockOptions::new(ms(300)))
            .await
            .unwrap();
        assert!(other.is_none(), "someone else got a kept-alive lock");
        sleep(ms(50)).await;
    }
    assert!(!guard.is_lost());
    assert!(
        guard.valid_until() > first_deadline,
        "renewals moved valid_until"
    );
    assert_eq!(guard.release().await, ReleaseOutcome::Released);
}

/// `keep_until_expiry` stops the keep-alive and releases nothing: the key stays held until
/// the grant's TTL ends, then is free, and the lost signal never fires.
pub async fn kept_until_expiry_stays_held_quietly(h: &dyn Harness) {
    let ns = fresh_namespace();
    let locks = locks(h.open().await, &ns);
    let options = LockOptions::new(ms(1000)).keep_alive(ms(200));
    let guard = locks.acquire("k", &options).await.unwrap();
    let handle = guard.handle();
    let until = guard.keep_until_expiry();
    let other = LockOptions::new(ms(300));
    assert!(
        locks.try_acquire("k", &other).await.unwrap().is_none(),
        "a kept lock is not released"
    );
    let info = locks.inspect("k").await.unwrap().expect("still held");
    assert_eq!(info.fence, handle.fence());
    // Held until the TTL ends (no renewal moves it), then free.
    sleep(until.saturating_duration_since(Instant::now()) + ms(50)).await;
    let mut next = None;
    let deadline = Instant::now() + Duration::from_secs(5);
    while next.is_none() && Instant::now() < deadline {
        next = locks.try_acquire("k", &other).await.unwrap();
        if next.is_none() {
            sleep(ms(20)).await;
        }
    }
    let next = next.expect("the key is free once the kept grant's TTL ended");
    assert!(next.fence() > handle.fence());
    assert!(
        !handle.is_lost(),
        "keeping a lock until expiry is not a loss"
    );
    next.release().await;
    sleep(ms(100)).await;
    assert!(
        !handle.is_lost(),
        "the lost signal stays quiet after expiry"
    );
}

/// `keep_for` sets the kept grant to end `ttl` from now, shorter than its own TTL here.
pub async fn kept_for_holds_for_the_new_ttl(h: &dyn Harness) {
    let ns = fresh_namespace();
    let locks = locks(h.open().await, &ns);
    let guard = locks
        .acquire("k", &LockOptions::new(Duration::from_secs(30)))
        .await
        .unwrap();
    let handle = guard.handle();
    let kept_at = Instant::now();
    let until = match guard.keep_for(ttl(ms(600))).await {
        crate::lock::KeepOutcome::Kept { until } => until,
        other => panic!("keep_for answered {other:?}"),
    };
    assert!(until <= Instant::now() + ms(600));
    let other = LockOptions::new(ms(300));
    assert!(locks.try_acquire("k", &other).await.unwrap().is_none());
    let mut next = None;
    while next.is_none() && kept_at.elapsed() < Duration::from_secs(10) {
        next = locks.try_acquire("k", &other).await.unwrap();
        if next.is_none() {
            sleep(ms(20)).await;
        }
    }
    let next = next.expect("free after the new TTL, long before the old one");
    assert!(kept_at.elapsed() >= ms(550), "held for the new TTL");
    assert!(!handle.is_lost());
    next.release().await;
}

/// Keep-alive stops at `max_hold`; the lock then expires and can be taken.
pub async fn max_hold_stops_renewal(h: &dyn Harness) {
    let ns = fresh_namespace();
    let locks = locks(h.open().await, &ns);
    let options = LockOptions::new(ms(200))
        .keep_alive(ms(50))
        .max_hold(ms(300));
    let guard = locks.acquire("k", &options).await.unwrap();
    timeout(Duration::from_secs(5), guard.lost())
        .await
        .expect("the lock is lost after max_hold");
    let next = locks
        .acquire(
            "k",
            &LockOptions::new(Duration::from_secs(5)).wait(Duration::from_secs(5)),
        )
        .await
        .expect("another holder gets it");
    assert!(next.fence() > guard.fence());
    next.release().await;
    guard.release().await;
}

/// A store fault is `Unavailable`, never contention; leases report it as an error.
pub async fn store_faults_are_unavailable_not_contention(h: &dyn Harness) {
    let ns = fresh_namespace();
    let store = Arc::new(FaultyStore::new(h.open().await));
    store.set_failing(true);
    let locks = locks(store.clone(), &ns);
    match locks
        .acquire(
            "k",
            &LockOptions::new(Duration::from_secs(5)).wait(Duration::from_secs(5)),
        )
        .await
    {
        Err(AcquireError::Unavailable(e)) => assert_eq!(e.kind(), ErrorKind::Unavailable),
        other => panic!("expected Unavailable, got {other:?}"),
    }
    let err = locks
        .try_acquire("k", &LockOptions::new(Duration::from_secs(5)))
        .await
        .unwrap_err();
    assert!(err.is_unavailable());
    let leases = Leases::with_namespace(store.clone(), ns.clone());
    let ttl = Duration::from_secs(5);
    assert!(
        leases
            .claim("l", "a", &LeaseOptions::new(ttl))
            .await
            .unwrap_err()
            .is_unavailable()
    );
    assert!(
        leases
            .renew("l", "a", ttl)
            .await
            .unwrap_err()
            .is_unavailable()
    );
    assert!(leases.release("l", "a").await.unwrap_err().is_unavailable());
    store.set_failing(false);
    assert!(
        locks
            .try_acquire("k", &LockOptions::new(ttl))
            .await
            .unwrap()
            .is_some()
    );
}

/// Every invalid input is rejected with `InvalidInput`, before any store call.
pub async fn invalid_input_is_rejected_before_io(h: &dyn Harness) {
    let ns = fresh_namespace();
    let store = Arc::new(FaultyStore::new(h.open().await));
    let locks = locks(store.clone(), &ns);
    let leases = Leases::with_namespace(store.clone(), ns.clone());
    let ok = Duration::from_secs(10);
    let long_key = "k".repeat(513);
    let lock_cases: Vec<(&str, &str, LockOptions)> = vec![
        ("empty key", "", LockOptions::new(ok)),
        ("513-byte key", &long_key, LockOptions::new(ok)),
        ("control character", "a\u{0}b", LockOptions::new(ok)),
        ("newline", "a\nb", LockOptions::new(ok)),
        ("zero ttl", "k", LockOptions::new(Duration::ZERO)),
        ("9ms ttl", "k", LockOptions::new(ms(9))),
        (
            "31-day ttl",
            "k",
            LockOptions::new(Duration::from_secs(31 * 86_400)),
        ),
        (
            "2-day wait",
            "k",
            LockOptions::new(ok).wait(Duration::from_secs(2 * 86_400)),
        ),
        (
            "zero keep-alive",
            "k",
            LockOptions::new(ok).keep_alive(Duration::ZERO),
        ),
        (
            "keep-alive = ttl/2",
            "k",
            LockOptions::new(ok).keep_alive(ok / 2),
        ),
        (
            "keep-alive > ttl",
            "k",
            LockOptions::new(ok).keep_alive(ok * 2),
        ),
        (
            "max_hold without keep-alive",
            "k",
            LockOptions::new(ok).max_hold(ok * 2),
        ),
    ];
    for (what, key, options) in lock_cases {
        match locks.acquire(key, &options).await {
            Err(AcquireError::InvalidInput(e)) => {
                assert_eq!(e.kind(), ErrorKind::InvalidInput, "{what}")
            }
            other => panic!("{what}: expected InvalidInput, got {other:?}"),
        }
    }
    assert!(
        locks
            .try_acquire("", &LockOptions::new(ok))
            .await
            .unwrap_err()
            .is_invalid_input()
    );
    let long_holder = "h".repeat(257);
    let long_reason = "r".repeat(65);
    let lease_cases: Vec<(&str, Result<ClaimResult>)> = vec![
        (
            "empty holder",
            leases.claim("k", "", &LeaseOptions::new(ok)).await,
        ),
        (
            "257-byte holder",
            leases
                .claim("k", &long_holder, &LeaseOptions::new(ok))
                .await,
        ),
        (
            "control in holder",
            leases.claim("k", "a\u{1b}", &LeaseOptions::new(ok)).await,
        ),
        (
            "empty key",
            leases.claim("", "a", &LeaseOptions::new(ok)).await,
        ),
        (
            "zero ttl",
            leases
                .claim("k", "a", &LeaseOptions::new(Duration::ZERO))
                .await,
        ),
        (
            "long reason",
            leases
                .claim("k", "a", &LeaseOptions::new(ok).reason(&long_reason))
                .await,
        ),
    ];
    for (what, result) in lease_cases {
        let e = result.expect_err(what);
        assert_eq!(e.kind(), ErrorKind::InvalidInput, "{what}: {e}");
    }
    assert!(
        leases
            .renew("k", "", ok)
            .await
            .unwrap_err()
            .is_invalid_input()
    );
    assert!(
        leases
            .release("", "a")
            .await
            .unwrap_err()
            .is_invalid_input()
    );
    assert!(
        leases
            .keep_alive("k", "a", &LeaseOptions::new(ok).keep_alive(ok))
            .await
            .unwrap_err()
            .is_invalid_input()
    );
    assert!(
        leases
            .claim_and_keep("k", "a", &LeaseOptions::new(ok).keep_alive(Duration::ZERO))
            .await
            .unwrap_err()
            .is_invalid_input()
    );
    assert!(
        locks
            .list("a\u{7}", 10)
            .await
            .unwrap_err()
            .is_invalid_input()
    );
    assert!(Namespace::new("a:b").unwrap_err().is_invalid_input());
    assert_eq!(store.calls(), 0, "a store call was made for invalid input");
    assert!(
        locks.list("", 100).await.unwrap().is_empty(),
        "nothing was written"
    );
    assert!(
        leases.list("", 100).await.unwrap().is_empty(),
        "nothing was written"
    );
}

/// A guard dropped without `release` is released in the background.
pub async fn dropped_guard_is_released_in_background(h: &dyn Harness) {
    let ns = fresh_namespace();
    let locks = locks(h.open().await, &ns);
    let guard = locks
        .acquire("k", &LockOptions::new(Duration::from_secs(60)))
        .await
        .unwrap();
    drop(guard);
    eventually(Duration::from_secs(5), "background release", || async {
        locks.inspect("k").await.unwrap().is_none()
    })
    .await;
}

/// Cancelling an acquire while its claim is in flight leaves no lock behind.
pub async fn cancelled_acquire_leaves_no_lock(h: &dyn Harness) {
    let ns = fresh_namespace();
    let store = Arc::new(FaultyStore::new(h.open().await));
    store.set_reply_delay(ms(300));
    let locks = locks(store.clone(), &ns);
    let attempt = timeout(
        ms(100),
        locks.acquire("k", &LockOptions::new(Duration::from_secs(60))),
    )
    .await;
    assert!(attempt.is_err(), "the acquire was cancelled mid-flight");
    store.set_reply_delay(Duration::ZERO);
    eventually(
        Duration::from_secs(5),
        "release of the cancelled grant",
        || async { locks.inspect("k").await.unwrap().is_none() },
    )
    .await;
    let guard = locks
        .acquire("k", &LockOptions::new(Duration::from_secs(5)))
        .await
        .expect("the key is free");
    guard.release().await;
}

/// Cancelling a release before the store answered still releases, in the background.
pub async fn cancelled_release_still_releases(h: &dyn Harness) {
    let ns = fresh_namespace();
    let store = Arc::new(FaultyStore::new(h.open().await));
    let locks = locks(store.clone(), &ns);
    let guard = locks
        .acquire("k", &LockOptions::new(Duration::from_secs(60)))
        .await
        .unwrap();
    store.set_request_delay(ms(300));
    assert!(
        timeout(ms(50), guard.release()).await.is_err(),
        "the release was cancelled before the store saw it"
    );
    store.set_request_delay(Duration::ZERO);
    eventually(Duration::from_secs(5), "background release", || async {
        locks.inspect("k").await.unwrap().is_none()
    })
    .await;
}

/// Re-claiming a lease as its holder extends it and keeps the fence; others see `HeldBy`.
pub async fn lease_reclaim_is_idempotent_and_extends(h: &dyn Harness) {
    let ns = fresh_namespace();
    let leases = Leases::with_namespace(h.open().await, ns.clone());
    let first = match leases
        .claim("s", "a", &LeaseOptions::new(ms(400)).reason("rewind"))
        .await
        .unwrap()
    {
        ClaimResult::Claimed { fence, .. } => fence,
        other => panic!("{other:?}"),
    };
    sleep(ms(250)).await;
    match leases
        .claim("s", "a", &LeaseOptions::new(ms(400)).reason("rewind"))
        .await
        .unwrap()
    {
        ClaimResult::Claimed { fence, .. } => assert_eq!(fence, first, "re-claim keeps the fence"),
        other => panic!("{other:?}"),
    }
    sleep(ms(250)).await;
    // 500ms after the first claim: alive only because the re-claim extended it.
    match leases
        .claim("s", "b", &LeaseOptions::new(ms(400)).reason("bootstrap"))
        .await
        .unwrap()
    {
        ClaimResult::HeldBy { holder, .. } => assert_eq!(holder, "a"),
        other => panic!("{other:?}"),
    }
}

/// Release says whether the caller still owned the lease.
pub async fn lease_release_reports_ownership(h: &dyn Harness) {
    let ns = fresh_namespace();
    let leases = Leases::with_namespace(h.open().await, ns.clone());
    let ttl = Duration::from_secs(10);
    leases
        .claim("s", "a", &LeaseOptions::new(ttl))
        .await
        .unwrap();
    assert_eq!(
        leases.release("s", "a").await.unwrap(),
        RemoveResult::Removed { holder: "a".into() }
    );
    assert_eq!(
        leases.release("s", "a").await.unwrap(),
        RemoveResult::NoHolder
    );
    leases
        .claim("s", "a", &LeaseOptions::new(ms(50)))
        .await
        .unwrap();
    sleep(ms(120)).await;
    leases
        .claim("s", "b", &LeaseOptions::new(ttl))
        .await
        .unwrap();
    assert_eq!(
        leases.release("s", "a").await.unwrap(),
        RemoveResult::Reclaimed { by: "b".into() }
    );
    assert_eq!(leases.inspect("s").await.unwrap().unwrap().holder, "b");
}

/// A late renewal never revives a lapsed lease nor touches a new holder's.
pub async fn late_renewal_never_revives(h: &dyn Harness) {
    let ns = fresh_namespace();
    let leases = Leases::with_namespace(h.open().await, ns.clone());
    leases
        .claim("s", "a", &LeaseOptions::new(ms(50)))
        .await
        .unwrap();
    sleep(ms(120)).await;
    assert_eq!(
        leases
            .renew("s", "a", Duration::from_secs(10))
            .await
            .unwrap(),
        Renewal::NotHeld
    );
    assert!(
        leases.inspect("s").await.unwrap().is_none(),
        "renewal revived a lapsed lease"
    );
    leases
        .claim("s", "b", &LeaseOptions::new(Duration::from_secs(10)))
        .await
        .unwrap();
    assert_eq!(
        leases
            .renew("s", "a", Duration::from_secs(10))
            .await
            .unwrap(),
        Renewal::NotHeld
    );
    assert_eq!(leases.inspect("s").await.unwrap().unwrap().holder, "b");
    assert_eq!(
        leases
            .renew("s", "b", Duration::from_secs(10))
            .await
            .unwrap(),
        Renewal::Renewed
    );
}

/// A lease claimed and kept alive in one call outlives its TTL, says whether the grant was
/// new, and signals when it is lost; an invalid interval is refused before any I/O; a
/// keep-alive of a lease not held is refused rather than started lost.
pub async fn lease_keep_alive_signals_loss(h: &dyn Harness) {
    let ns = fresh_namespace();
    let leases = Leases::with_namespace(h.open().await, ns.clone());
    let key = stream_key("order-7", "Orders").unwrap();
    // An interval not below ttl / 2 is refused before the claim is sent: no grant is made.
    let invalid = leases
        .claim_and_keep(
            &key,
            "instance-1",
            &LeaseOptions::new(ms(1000)).keep_alive(ms(500)),
        )
        .await
        .unwrap_err();
    assert!(invalid.is_invalid_input(), "{invalid}");
    assert!(
        leases.inspect(&key).await.unwrap().is_none(),
        "an invalid keep-alive wrote nothing"
    );
    // Renewals every 200 ms against a 1 s TTL, so that a renewal delayed on a loaded machine
    // does not lapse the lease; the sleep spans two TTLs.
    let options = LeaseOptions::new(ms(1000))
        .reason("rewind")
        .keep_alive(ms(200));
    let KeptClaim::Kept {
        keep_alive: keep,
        new,
    } = leases
        .claim_and_keep(&key, "instance-1", &options)
        .await
        .unwrap()
    else {
        panic!("a free lease is claimed");
    };
    assert!(new, "a free lease is a new grant");
    sleep(ms(2000)).await;
    assert!(!keep.is_lost());
    assert_eq!(
        leases.inspect(&key).await.unwrap().unwrap().holder,
        "instance-1"
    );
    match leases
        .claim(
            &key,
            "instance-1",
            &LeaseOptions::new(ms(1000)).reason("rewind"),
        )
        .await
        .unwrap()
    {
        ClaimResult::Claimed { fence, new, .. } => {
            assert!(!new, "the holder's re-claim extends its grant");
            assert_eq!(fence, keep.fence());
        }
        other => panic!("the holder re-claims its own lease: {other:?}"),
    }
    match leases
        .claim(&key, "instance-2", &LeaseOptions::new(ms(1000)))
        .await
        .unwrap()
    {
        ClaimResult::HeldBy {
            holder, remaining, ..
        } => {
            assert_eq!(holder, "instance-1");
            assert!(
                remaining > Duration::ZERO && remaining <= ms(1000),
                "{remaining:?}"
            );
        }
        other => panic!("another holder is told who has it: {other:?}"),
    }
    h.evict(&lease_key(&ns, &key)).await;
    leases
        .claim(
            &key,
            "instance-2",
            &LeaseOptions::new(Duration::from_secs(10)).reason("bootstrap"),
        )
        .await
        .unwrap();
    timeout(Duration::from_secs(5), keep.lost())
        .await
        .expect("keep-alive notices the new holder");
    assert_eq!(
        leases.inspect(&key).await.unwrap().unwrap().holder,
        "instance-2"
    );
    // Keep-alive for a lease this holder does not hold is refused, and changes nothing.
    let options = LeaseOptions::new(ms(300)).keep_alive(ms(60));
    assert!(
        leases
            .keep_alive("nobody", "x", &options)
            .await
            .unwrap()
            .is_none()
    );
    assert!(leases.inspect("nobody").await.unwrap().is_none());
    assert!(
        leases
            .keep_alive(&key, "instance-1", &options)
            .await
            .unwrap()
            .is_none()
    );
    assert_eq!(
        leases.inspect(&key).await.unwrap().unwrap().holder,
        "instance-2"
    );
}

/// `inspect` and `list` report live grants only, by prefix, in key order, within a namespace.
pub async fn inspect_and_list(h: &dyn Harness) {
    let ns = fresh_namespace();
    let store = h.open().await;
    let locks = locks(store.clone(), &ns);
    let ten = Duration::from_secs(10);
    let mut guards = Vec::new();
    for key in ["jobs:c", "jobs:a", "jobs:b", "other"] {
        guards.push(locks.acquire(key, &LockOptions::new(ten)).await.unwrap());
    }
    let short = locks
        .acquire("jobs:expired", &LockOptions::new(ms(30)))
        .await
        .unwrap();
    sleep(ms(80)).await;
    let listed: Vec<String> = locks
        .list("jobs:", 100)
        .await
        .unwrap()
        .into_iter()
        .map(|i| i.key.user_key().to_owned())
        .collect();
    assert_eq!(listed, ["jobs:a", "jobs:b", "jobs:c"]);
    assert_eq!(locks.list("jobs:", 2).await.unwrap().len(), 2);
    assert_eq!(locks.list("", 100).await.unwrap().len(), 4);
    let elsewhere = Locks::with_namespace(store.clone(), fresh_namespace());
    assert!(
        elsewhere.list("", 100).await.unwrap().is_empty(),
        "namespaces are isolated"
    );
    assert!(elsewhere.inspect("jobs:a").await.unwrap().is_none());

    let leases = Leases::with_namespace(store, ns.clone());
    assert!(
        leases.list("", 100).await.unwrap().is_empty(),
        "locks and leases are apart"
    );
    leases
        .claim("stream/P", "i1", &LeaseOptions::new(ten).reason("purge"))
        .await
        .unwrap();
    let info = leases.inspect("stream/P").await.unwrap().unwrap();
    assert_eq!(
        (
            info.key.as_str(),
            info.holder.as_str(),
            info.reason.as_str()
        ),
        ("stream/P", "i1", "purge")
    );
    assert!(info.fence.get() > 0);
    let listed = leases.list("stream", 10).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(
        (&listed[0].key, &listed[0].holder, listed[0].fence),
        (&info.key, &info.holder, info.fence)
    );
    for guard in guards {
        guard.release().await;
    }
    short.release().await;
}

/// A store wrapper for the rules about misbehaving stores: counts calls, fails every call
/// with `Unavailable` while failing, and delays replies (the operation still happens).
#[derive(Debug)]
pub struct FaultyStore {
    inner: Arc<dyn LeaseStore>,
    failing: AtomicBool,
    delay_ms: AtomicU64,
    request_delay_ms: AtomicU64,
    calls: AtomicUsize,
    claims: AtomicUsize,
}

impl FaultyStore {
    /// Wraps `inner`.
    pub fn new(inner: Arc<dyn LeaseStore>) -> Self {
        FaultyStore {
            inner,
            failing: AtomicBool::new(false),
            delay_ms: AtomicU64::new(0),
            request_delay_ms: AtomicU64::new(0),
            calls: AtomicUsize::new(0),
            claims: AtomicUsize::new(0),
        }
    }

    /// While `true`, every call fails with `Unavailable` without reaching the store.
    pub fn set_failing(&self, failing: bool) {
        self.failing.store(failing, Ordering::SeqCst);
    }

    /// Delays every reply by `delay`, after the operation was done on the store.
    pub fn set_reply_delay(&self, delay: Duration) {
        self.delay_ms
            .store(delay.as_millis() as u64, Ordering::SeqCst);
    }

    /// Delays every request by `delay` before it reaches the store.
    pub fn set_request_delay(&self, delay: Duration) {
        self.request_delay_ms
            .store(delay.as_millis() as u64, Ordering::SeqCst);
    }

    /// Calls made so far, of any operation.
    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    /// Claims made so far.
    pub fn claims(&self) -> usize {
        self.claims.load(Ordering::SeqCst)
    }

    async fn enter(&self) -> Result<()> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let delay = self.request_delay_ms.load(Ordering::SeqCst);
        if delay > 0 {
            sleep(ms(delay)).await;
        }
        if self.failing.load(Ordering::SeqCst) {
            return Err(Error::unavailable("injected fault"));
        }
        Ok(())
    }

    async fn reply<T>(&self, value: Result<T>) -> Result<T> {
        let delay = self.delay_ms.load(Ordering::SeqCst);
        if delay > 0 {
            sleep(ms(delay)).await;
        }
        value
    }
}

#[async_trait]
impl LeaseStore for FaultyStore {
    async fn claim(&self, key: &StoreKey, request: LeaseRequest<'_>) -> Result<Claim> {
        self.claims.fetch_add(1, Ordering::SeqCst);
        self.enter().await?;
        let answer = self.inner.claim(key, request).await;
        self.reply(answer).await
    }

    async fn renew(&self, key: &StoreKey, holder: &Holder, ttl: Ttl) -> Result<Renewal> {
        self.enter().await?;
        let answer = self.inner.renew(key, holder, ttl).await;
        self.reply(answer).await
    }

    async fn release(&self, key: &StoreKey, holder: &Holder) -> Result<Release> {
        self.enter().await?;
        let answer = self.inner.release(key, holder).await;
        self.reply(answer).await
    }

    async fn inspect(&self, key: &StoreKey) -> Result<Option<HolderInfo>> {
        self.enter().await?;
        self.inner.inspect(key).await
    }

    async fn list(&self, prefix: &str, limit: usize) -> Result<Vec<HolderInfo>> {
        self.enter().await?;
        self.inner.list(prefix, limit).await
    }

    fn wakeups(&self) -> Wakeups {
        self.inner.wakeups()
    }
}
