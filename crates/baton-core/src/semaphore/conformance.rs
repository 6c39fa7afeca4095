//! The semaphore conformance rules: written once, run by every store that implements
//! [`SemaphoreStore`].
//!
//! A store's test target implements [`Opens`] for its store (the [`SemaphoreHarness`]) and
//! expands [`semaphore_conformance_tests!`](crate::semaphore_conformance_tests)
//! (`baton_core::semaphore_conformance_tests!(my_harness())`), which generates one
//! `#[tokio::test]` per rule. Each rule uses a fresh random namespace, so rules may share a
//! server. Every wait is generous and no rule asserts how fast anything happened.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::time::sleep;

use super::{MAX_PERMITS, PermitInfo, Semaphore, SemaphoreStore};
use crate::ErrorKind;
use crate::conformance::{Opens, fresh_namespace, ms};
use crate::holder::Holder;
use crate::key::{Key, KeyKind, Namespace, StoreKey};
use crate::lock::{LockOptions, ReleaseOutcome};
use crate::store::{Claim, LeaseRequest, Release, Renewal};
use crate::time::Ttl;

/// What a store's test target provides to the semaphore rules: the store under test, as
/// [`SemaphoreStore`].
pub type SemaphoreHarness = dyn Opens<dyn SemaphoreStore>;

/// Generates one `#[tokio::test]` per semaphore rule. `$harness` is an expression that
/// evaluates to a future of a [`SemaphoreHarness`]; it is evaluated once per test.
#[macro_export]
macro_rules! semaphore_conformance_tests {
    ($harness:expr) => {
        $crate::__conformance_rules!($crate::semaphore::conformance; $harness;
            grants_up_to_n_permits_then_is_contended,
            fences_increase_across_permits,
            a_holder_s_claim_extends_its_own_permit,
            renew_and_release_touch_only_the_holder_s_own_permit,
            a_release_frees_a_permit_for_a_waiter,
            an_expired_permit_frees_its_place,
            a_lost_permit_fires_lost,
            lowering_the_permits_revokes_nothing,
            never_more_than_n_holders_at_once,
            holders_are_the_live_permits_oldest_first,
            list_permits_lists_keys_of_the_prefix_with_their_n,
            keys_and_namespaces_are_separate,
            bad_permits_are_rejected_before_io,
        );
    };
}

fn semaphore(store: Arc<dyn SemaphoreStore>, ns: &Namespace, key: &str, n: u32) -> Semaphore {
    Semaphore::new(store, ns.clone(), key, n).expect("valid semaphore")
}

fn options(ttl: Duration) -> LockOptions {
    LockOptions::new(ttl)
}

fn permit_key(ns: &Namespace, key: &str) -> StoreKey {
    ns.qualify(KeyKind::Semaphore, &Key::new(key).expect("valid key"))
}

fn ttl(d: Duration) -> Ttl {
    Ttl::new(d).expect("valid ttl")
}

/// N permits are granted at once; the next claim is contention, and a release makes room.
pub async fn grants_up_to_n_permits_then_is_contended(h: &SemaphoreHarness) {
    let ns = fresh_namespace();
    let sem = semaphore(h.open().await, &ns, "builders", 3);
    let opts = options(Duration::from_secs(30));
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(
            sem.try_acquire(&opts)
                .await
                .unwrap()
                .expect("a free permit"),
        );
    }
    assert!(
        sem.try_acquire(&opts).await.unwrap().is_none(),
        "a fourth permit of three"
    );
    let err = sem.acquire(&opts).await.expect_err("contended");
    assert!(err.is_contended(), "{err}");
    for guard in held {
        assert_eq!(guard.release().await, ReleaseOutcome::Released);
    }
    let again = sem.try_acquire(&opts).await.unwrap().expect("free again");
    again.release().await;
}

/// Every permit's fence is larger than every earlier permit's of the key, across holders and releases.
pub async fn fences_increase_across_permits(h: &SemaphoreHarness) {
    let ns = fresh_namespace();
    let sem = semaphore(h.open().await, &ns, "f", 2);
    let opts = options(Duration::from_secs(30));
    let mut last = 0;
    for _ in 0..4 {
        let a = sem.try_acquire(&opts).await.unwrap().expect("free");
        let b = sem.try_acquire(&opts).await.unwrap().expect("free");
        assert!(a.fence().get() > last, "{} after {last}", a.fence());
        assert!(b.fence() > a.fence(), "{} after {}", b.fence(), a.fence());
        last = b.fence().get();
        a.release().await;
        b.release().await;
    }
}

/// A holder that claims again extends its own permit (same fence) instead of taking a second one.
pub async fn a_holder_s_claim_extends_its_own_permit(h: &SemaphoreHarness) {
    let store = h.open().await;
    let key = permit_key(&fresh_namespace(), "x");
    let holder = Holder::random();
    let request = LeaseRequest::new(&holder, ttl(Duration::from_secs(30)));
    let Claim::Granted { fence } = store.claim_permit(&key, request, 2).await.unwrap() else {
        panic!("a free permit");
    };
    assert_eq!(
        store.claim_permit(&key, request, 2).await.unwrap(),
        Claim::Extended { fence },
        "the same holder again"
    );
    assert_eq!(
        store.permits(&key).await.unwrap().len(),
        1,
        "one permit, not two"
    );
    assert_eq!(
        store.release_permit(&key, &holder).await.unwrap(),
        Release::Removed
    );
}

/// Renewing or releasing changes only the caller's own live permit; an ended permit is never renewed.
pub async fn renew_and_release_touch_only_the_holder_s_own_permit(h: &SemaphoreHarness) {
    let store = h.open().await;
    let key = permit_key(&fresh_namespace(), "own");
    let (a, b) = (Holder::random(), Holder::random());
    let t = ttl(Duration::from_secs(30));
    assert!(matches!(
        store
            .claim_permit(&key, LeaseRequest::new(&a, t), 2)
            .await
            .unwrap(),
        Claim::Granted { .. }
    ));
    assert_eq!(
        store.renew_permit(&key, &b, t).await.unwrap(),
        Renewal::NotHeld
    );
    assert_eq!(
        store.release_permit(&key, &b).await.unwrap(),
        Release::NoHolder
    );
    assert_eq!(store.permits(&key).await.unwrap().len(), 1);
    assert_eq!(
        store.renew_permit(&key, &a, t).await.unwrap(),
        Renewal::Renewed
    );
    assert_eq!(
        store.release_permit(&key, &a).await.unwrap(),
        Release::Removed
    );
    assert_eq!(
        store.release_permit(&key, &a).await.unwrap(),
        Release::NoHolder
    );
    assert_eq!(
        store.renew_permit(&key, &a, t).await.unwrap(),
        Renewal::NotHeld
    );
    assert!(store.permits(&key).await.unwrap().is_empty());
}

/// A waiter takes the permit a release frees, with a larger fence.
pub async fn a_release_frees_a_permit_for_a_waiter(h: &SemaphoreHarness) {
    let ns = fresh_namespace();
    let store = h.open().await;
    let sem = semaphore(Arc::clone(&store), &ns, "w", 1);
    let held = sem
        .try_acquire(&options(Duration::from_secs(30)))
        .await
        .unwrap()
        .expect("free");
    let waiter = {
        let sem = sem.clone();
        tokio::spawn(async move {
            sem.acquire(&options(Duration::from_secs(30)).wait(Duration::from_secs(20)))
                .await
        })
    };
    sleep(ms(100)).await;
    let fence = held.fence();
    held.release().await;
    let got = waiter
        .await
        .unwrap()
        .expect("the waiter takes the freed permit");
    assert!(got.fence() > fence);
    got.release().await;
}

/// An expired permit frees its place without a release; its holder's release then says `Expired`.
pub async fn an_expired_permit_frees_its_place(h: &SemaphoreHarness) {
    let ns = fresh_namespace();
    let sem = semaphore(h.open().await, &ns, "e", 1);
    let short = sem
        .try_acquire(&options(ms(300)))
        .await
        .unwrap()
        .expect("free");
    // No release is signalled for an expiry: the waiter looks again when the permit ends.
    let next = sem
        .acquire(&options(Duration::from_secs(30)).wait(Duration::from_secs(20)))
        .await
        .expect("the expired permit's place");
    assert!(next.fence() > short.fence());
    assert_eq!(short.release().await, ReleaseOutcome::Expired);
    next.release().await;
}

/// A kept permit that the store no longer has fires the lost signal.
pub async fn a_lost_permit_fires_lost(h: &SemaphoreHarness) {
    let ns = fresh_namespace();
    let store = h.open().await;
    let sem = semaphore(Arc::clone(&store), &ns, "lost", 2);
    let guard = sem
        .try_acquire(&options(Duration::from_secs(3)).keep_alive(ms(300)))
        .await
        .unwrap()
        .expect("free");
    // Someone removes the permit behind the holder's back (an operator, a store that lost
    // it): its next renewal finds it gone.
    let key = permit_key(&ns, "lost");
    let permit = store.permits(&key).await.unwrap().remove(0);
    assert_eq!(
        store.release_permit(&key, &permit.holder).await.unwrap(),
        Release::Removed
    );
    tokio::time::timeout(Duration::from_secs(10), guard.lost())
        .await
        .expect("lost fires");
    assert!(guard.is_lost());
    assert_eq!(guard.release().await, ReleaseOutcome::Expired);
}

/// A client with fewer permits than are held is refused, and nothing held is revoked.
pub async fn lowering_the_permits_revokes_nothing(h: &SemaphoreHarness) {
    let ns = fresh_namespace();
    let store = h.open().await;
    let three = semaphore(Arc::clone(&store), &ns, "n", 3);
    let one = semaphore(store, &ns, "n", 1);
    let opts = options(Duration::from_secs(30));
    let a = three.try_acquire(&opts).await.unwrap().expect("free");
    let b = three.try_acquire(&opts).await.unwrap().expect("free");
    assert!(
        one.try_acquire(&opts).await.unwrap().is_none(),
        "two are held, and this client allows one"
    );
    assert_eq!(one.holders().await.unwrap().len(), 2, "nothing was revoked");
    let c = three
        .try_acquire(&opts)
        .await
        .unwrap()
        .expect("the third of three");
    for guard in [a, b, c] {
        assert_eq!(guard.release().await, ReleaseOutcome::Released);
    }
    let only = one.try_acquire(&opts).await.unwrap().expect("free");
    only.release().await;
}

/// Under concurrent waiters, no more than N hold a permit at once.
pub async fn never_more_than_n_holders_at_once(h: &SemaphoreHarness) {
    let ns = fresh_namespace();
    let store = h.open().await;
    let permits = 3;
    let inside = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..12 {
        let sem = semaphore(Arc::clone(&store), &ns, "c", permits);
        let (inside, most) = (Arc::clone(&inside), Arc::clone(&most));
        tasks.push(tokio::spawn(async move {
            for _ in 0..3 {
                let opts = options(Duration::from_secs(30)).wait(Duration::from_secs(60));
                let guard = sem.acquire(&opts).await.expect("a permit within the wait");
                let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                sleep(ms(5)).await;
                inside.fetch_sub(1, Ordering::SeqCst);
                assert_eq!(guard.release().await, ReleaseOutcome::Released);
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let most = most.load(Ordering::SeqCst);
    assert!(
        most <= permits as usize,
        "{most} holders of {permits} permits"
    );
    assert!(most >= 2, "the permits were shared: at most {most} at once");
}

/// `holders` lists the live permits, oldest fence first.
pub async fn holders_are_the_live_permits_oldest_first(h: &SemaphoreHarness) {
    let ns = fresh_namespace();
    let sem = semaphore(h.open().await, &ns, "list", 3);
    assert!(sem.holders().await.unwrap().is_empty());
    let a = sem
        .try_acquire(&options(Duration::from_secs(30)))
        .await
        .unwrap()
        .expect("free");
    let b = sem
        .try_acquire(&options(Duration::from_secs(30)))
        .await
        .unwrap()
        .expect("free");
    let holders = sem.holders().await.unwrap();
    assert_eq!(holders.len(), 2);
    assert_eq!(holders[0].fence, a.fence());
    assert_eq!(holders[1].fence, b.fence());
    assert!(
        holders
            .iter()
            .all(|p| p.remaining <= Duration::from_secs(30))
    );
    assert!(holders.iter().all(|p| p.key == permit_key(&ns, "list")));
    a.release().await;
    let holders = sem.holders().await.unwrap();
    assert_eq!(holders.len(), 1);
    assert_eq!(holders[0].fence, b.fence());
    b.release().await;
}

/// `list_permits` lists the live permits of the keys under a qualified prefix, by key and
/// then fence, each with the N of its claim; `limit` counts keys, and a listed key has all its
/// permits.
pub async fn list_permits_lists_keys_of_the_prefix_with_their_n(h: &SemaphoreHarness) {
    let (ns, other) = (fresh_namespace(), fresh_namespace());
    let store = h.open().await;
    let opts = options(Duration::from_secs(30));
    let mut held = Vec::new();
    // Acquired out of key order, so the listing's order is the store's.
    for (key, n, count) in [("jobs:b", 2, 1), ("jobs:a", 3, 2), ("other", 1, 1)] {
        let sem = semaphore(Arc::clone(&store), &ns, key, n);
        for _ in 0..count {
            held.push(sem.try_acquire(&opts).await.unwrap().expect("free"));
        }
    }
    // Another N for the same key: each permit records the N of its own claim.
    let wider = semaphore(Arc::clone(&store), &ns, "jobs:b", 5);
    held.push(wider.try_acquire(&opts).await.unwrap().expect("free"));
    let outsider = semaphore(Arc::clone(&store), &other, "jobs:a", 1);
    let outside = outsider.try_acquire(&opts).await.unwrap().expect("free");
    let ended = semaphore(Arc::clone(&store), &ns, "jobs:c", 1)
        .try_acquire(&options(ms(200)))
        .await
        .unwrap()
        .expect("free");
    sleep(ms(400)).await;

    let prefix = ns.qualify_prefix(KeyKind::Semaphore, "jobs:").unwrap();
    let listed = store.list_permits(&prefix, 10).await.unwrap();
    let seen: Vec<(&str, Option<u32>)> = listed
        .iter()
        .map(|p| (p.grant.key.user_key(), p.permits))
        .collect();
    assert_eq!(
        seen,
        [
            ("jobs:a", Some(3)),
            ("jobs:a", Some(3)),
            ("jobs:b", Some(2)),
            ("jobs:b", Some(5)),
        ],
        "by key, then fence; the ended permit of jobs:c is not listed: {listed:?}"
    );
    assert!(listed[0].grant.fence < listed[1].grant.fence);
    assert!(listed[2].grant.fence < listed[3].grant.fence);
    assert!(
        listed
            .iter()
            .all(|p| p.grant.remaining <= Duration::from_secs(30)
                && p.grant.remaining > Duration::ZERO
                && p.grant.reason.is_empty())
    );
    let fences = |permits: &[PermitInfo]| -> Vec<(StoreKey, u64)> {
        permits
            .iter()
            .map(|p| (p.grant.key.clone(), p.grant.fence.get()))
            .collect()
    };
    let first = store.list_permits(&prefix, 1).await.unwrap();
    assert_eq!(
        fences(&first),
        fences(&listed[..2]),
        "one key, with all its permits"
    );
    assert!(store.list_permits(&prefix, 0).await.unwrap().is_empty());
    let everything = ns.qualify_prefix(KeyKind::Semaphore, "").unwrap();
    assert_eq!(store.list_permits(&everything, 10).await.unwrap().len(), 5);

    let grouped = Semaphore::list(store.as_ref(), &ns, "jobs:", 10)
        .await
        .unwrap();
    let summary: Vec<(&str, Option<u32>, usize)> = grouped
        .iter()
        .map(|s| (s.key.as_str(), s.permits, s.holders.len()))
        .collect();
    assert_eq!(
        summary,
        [("jobs:a", Some(3), 2), ("jobs:b", Some(5), 2)],
        "N of the most recent grant"
    );

    for guard in held {
        guard.release().await;
    }
    outside.release().await;
    assert_eq!(ended.release().await, ReleaseOutcome::Expired);
    assert!(store.list_permits(&prefix, 10).await.unwrap().is_empty());
}

/// Permits of one key or namespace do not count against another.
pub async fn keys_and_namespaces_are_separate(h: &SemaphoreHarness) {
    let (ns, other) = (fresh_namespace(), fresh_namespace());
    let store = h.open().await;
    let opts = options(Duration::from_secs(30));
    let a = semaphore(Arc::clone(&store), &ns, "k", 1);
    let held = a.try_acquire(&opts).await.unwrap().expect("free");
    for sem in [
        semaphore(Arc::clone(&store), &ns, "k2", 1),
        semaphore(Arc::clone(&store), &other, "k", 1),
    ] {
        let guard = sem.try_acquire(&opts).await.unwrap().expect("another key");
        guard.release().await;
    }
    held.release().await;
}

/// 0 permits, more than `MAX_PERMITS` and a bad key are `InvalidInput` before any I/O.
pub async fn bad_permits_are_rejected_before_io(h: &SemaphoreHarness) {
    let ns = fresh_namespace();
    let store = h.open().await;
    for n in [0, MAX_PERMITS + 1, u32::MAX] {
        let err = Semaphore::new(Arc::clone(&store), ns.clone(), "k", n).expect_err("bad permits");
        assert_eq!(err.kind(), ErrorKind::InvalidInput, "{n}: {err}");
    }
    for key in ["", "a\u{1}b"] {
        let err = Semaphore::new(Arc::clone(&store), ns.clone(), key, 1).expect_err("bad key");
        assert_eq!(err.kind(), ErrorKind::InvalidInput, "{key:?}: {err}");
    }
    Semaphore::new(store, ns, "k", MAX_PERMITS).expect("the maximum is allowed");
}
