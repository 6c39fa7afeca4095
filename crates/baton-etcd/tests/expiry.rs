//! Expiry on etcd: the cluster ends a grant whose lease is not kept alive, at the lease's
//! whole-second TTL, on its own clock. These are the conformance rules about expiry that
//! `tests/conformance.rs` leaves out (they expect 30–50ms grants), with one-second grants.

mod common;

use std::time::Duration;

use baton_core::conformance::fresh_namespace;
use baton_core::store::{Claim, LeaseRequest, LeaseStore, Release, Renewal};
use baton_core::{Holder, Key, KeyKind, StoreKey, Ttl};
use baton_core::{LockOptions, Locks, ReleaseOutcome};
use tokio::time::{Instant, sleep};

const SECOND: Duration = Duration::from_secs(1);

fn key(name: &str) -> StoreKey {
    fresh_namespace().qualify(KeyKind::Lock, &Key::new(name).unwrap())
}

fn ttl(d: Duration) -> Ttl {
    Ttl::new(d).unwrap()
}

async fn granted(store: &dyn LeaseStore, key: &StoreKey, holder: &Holder, t: Duration) -> u64 {
    match store
        .claim(key, LeaseRequest::new(holder, ttl(t)))
        .await
        .unwrap()
    {
        Claim::Granted { fence } => fence.get(),
        other => panic!("expected a grant of {key}, got {other:?}"),
    }
}

/// Waits (at most 5s) until `key` has no live grant; how long that took.
async fn until_gone(store: &dyn LeaseStore, key: &StoreKey) -> Duration {
    let started = Instant::now();
    while store.inspect(key).await.unwrap().is_some() {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{key} outlived its lease by far"
        );
        sleep(Duration::from_millis(20)).await;
    }
    started.elapsed()
}

/// A grant that is not kept alive is ended by the cluster at its lease's TTL: still held
/// (by another client's reckoning too) well into its second, gone soon after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cluster_ends_a_grant_that_is_not_kept_alive() {
    let cluster = common::cluster().await;
    let (holder_store, other_store) =
        (common::store(&cluster).await, common::store(&cluster).await);
    let key = key("k");
    let (a, b) = (Holder::random(), Holder::random());
    let claimed = Instant::now();
    granted(&holder_store, &key, &a, SECOND).await;
    // The holder's process does nothing more. Another client sees the grant held...
    sleep(Duration::from_millis(500)).await;
    match other_store
        .claim(&key, LeaseRequest::new(&b, ttl(SECOND)))
        .await
        .unwrap()
    {
        Claim::Held { holder, remaining } => {
            assert_eq!(holder, a);
            assert!(remaining <= SECOND, "{remaining:?}");
        }
        other => panic!("a grant in its first second is held, got {other:?}"),
    }
    // ...until the cluster revokes the lease, with no help from either client.
    until_gone(&other_store, &key).await;
    let lasted = claimed.elapsed();
    assert!(
        lasted >= Duration::from_millis(900),
        "ended early: {lasted:?}"
    );
    assert!(lasted < Duration::from_secs(4), "ended late: {lasted:?}");
    granted(&other_store, &key, &b, SECOND).await;
}

/// `fences_increase_after_expiry`, with one-second grants.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fences_increase_after_expiry() {
    let store = common::store(&*common::cluster().await).await;
    let key = key("k");
    let first = granted(&store, &key, &Holder::random(), SECOND).await;
    until_gone(&store, &key).await;
    let second = granted(&store, &key, &Holder::random(), SECOND).await;
    assert!(second > first, "{second} after {first}");
}

/// `late_renewal_never_revives`, with one-second grants.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_renewal_never_revives() {
    let store = common::store(&*common::cluster().await).await;
    let key = key("k");
    let a = Holder::random();
    granted(&store, &key, &a, SECOND).await;
    until_gone(&store, &key).await;
    assert_eq!(
        store.renew(&key, &a, ttl(SECOND)).await.unwrap(),
        Renewal::NotHeld
    );
    assert!(store.inspect(&key).await.unwrap().is_none(), "revived");
}

/// `lease_release_reports_ownership` after expiry, with one-second grants: the expired
/// holder's release finds nobody, then the new holder, and removes neither.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_after_expiry_reports_ownership_and_spares_the_new_holder() {
    let store = common::store(&*common::cluster().await).await;
    let key = key("k");
    let (a, b) = (Holder::random(), Holder::random());
    granted(&store, &key, &a, SECOND).await;
    until_gone(&store, &key).await;
    assert_eq!(store.release(&key, &a).await.unwrap(), Release::NoHolder);
    granted(&store, &key, &b, Duration::from_secs(10)).await;
    assert_eq!(
        store.release(&key, &a).await.unwrap(),
        Release::Reclaimed { by: b.clone() }
    );
    assert_eq!(store.inspect(&key).await.unwrap().unwrap().holder, b);
    assert_eq!(store.release(&key, &b).await.unwrap(), Release::Removed);
}

/// `release_after_expiry_is_expired_and_spares_the_new_holder` through the lock policy,
/// and `inspect_and_list`'s expired grant: an expired lock is not listed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_lock_releases_as_expired_and_is_not_listed() {
    let store = std::sync::Arc::new(common::store(&*common::cluster().await).await);
    let ns = fresh_namespace();
    let locks = Locks::with_namespace(store.clone(), ns.clone());
    let old = locks
        .acquire("jobs:old", &LockOptions::new(SECOND))
        .await
        .unwrap();
    let kept = locks
        .acquire("jobs:kept", &LockOptions::new(Duration::from_secs(10)))
        .await
        .unwrap();
    let key = ns.qualify(KeyKind::Lock, &Key::new("jobs:old").unwrap());
    until_gone(&*store, &key).await;
    let listed: Vec<String> = locks
        .list("jobs:", 10)
        .await
        .unwrap()
        .into_iter()
        .map(|i| i.key.user_key().to_owned())
        .collect();
    assert_eq!(listed, ["jobs:kept"]);
    let new = locks
        .acquire("jobs:old", &LockOptions::new(Duration::from_secs(10)))
        .await
        .expect("an expired lock can be taken");
    assert!(new.fence() > old.fence());
    assert_eq!(old.release().await, ReleaseOutcome::Expired);
    assert!(
        locks.inspect("jobs:old").await.unwrap().is_some(),
        "the new holder keeps it"
    );
    assert_eq!(new.release().await, ReleaseOutcome::Released);
    assert_eq!(kept.release().await, ReleaseOutcome::Released);
}
