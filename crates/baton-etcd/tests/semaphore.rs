//! Semaphores on the etcd store: the conformance rules (on the test binary's private
//! three-member cluster, each rule in a namespace of its own), permits shared by several
//! stores (as several processes would share them), a release waking a waiter of another
//! store, and four OS processes' history.
//!
//! Every rule runs except `list_permits_lists_keys_of_the_prefix_with_their_n`, which
//! expects a 200ms permit to be gone 400ms later: etcd leases are whole seconds, so
//! `listing_leaves_out_ended_permits` checks the same with a one-second permit.

mod common;

use std::sync::Arc;
use std::time::Duration;

use baton_core::conformance::fresh_namespace;
use baton_core::{KeyKind, LockOptions, Namespace, Semaphore, SemaphoreStore};
use baton_etcd::EtcdStore;
use baton_testkit::{PermitWorkload, most_permit_holders};

baton_core::__conformance_rules!(baton_core::semaphore::conformance; common::harness();
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
    keys_and_namespaces_are_separate,
    bad_permits_are_rejected_before_io,
);

/// `list_permits_lists_keys_of_the_prefix_with_their_n` at etcd's scale: the permits of the
/// keys under a prefix, by key and then fence, each with the N of its claim; `limit` counts
/// keys; a key whose only permit has ended (its one-second lease expired) is not listed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listing_leaves_out_ended_permits() {
    let store: Arc<dyn SemaphoreStore> = Arc::new(common::store(&*common::cluster().await).await);
    let ns = fresh_namespace();
    let sem = |key: &str, n: u32| Semaphore::new(Arc::clone(&store), ns.clone(), key, n).unwrap();
    let long = LockOptions::new(Duration::from_secs(30));
    let mut held = Vec::new();
    for (key, n) in [("jobs:a", 3), ("jobs:a", 3), ("jobs:b", 2), ("jobs:b", 5)] {
        held.push(sem(key, n).try_acquire(&long).await.unwrap().expect("free"));
    }
    let ended = sem("jobs:0", 1)
        .try_acquire(&LockOptions::new(Duration::from_secs(1)))
        .await
        .unwrap()
        .expect("free");
    let prefix = ns.qualify_prefix(KeyKind::Semaphore, "jobs:").unwrap();
    let listed = |limit| {
        let store = Arc::clone(&store);
        let prefix = prefix.clone();
        async move {
            store
                .list_permits(&prefix, limit)
                .await
                .unwrap()
                .into_iter()
                .map(|p| (p.grant.key.user_key().to_owned(), p.permits, p.grant.fence))
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(
        listed(10).await.len(),
        5,
        "the one-second permit is live at first"
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while listed(10).await.len() == 5 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the ended permit is still listed"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let all = listed(10).await;
    let keys: Vec<(&str, Option<u32>)> = all.iter().map(|(k, n, _)| (k.as_str(), *n)).collect();
    assert_eq!(
        keys,
        [
            ("jobs:a", Some(3)),
            ("jobs:a", Some(3)),
            ("jobs:b", Some(2)),
            ("jobs:b", Some(5))
        ]
    );
    assert!(
        all[0].2 < all[1].2 && all[2].2 < all[3].2,
        "by fence within a key: {all:?}"
    );
    let first: Vec<String> = listed(1).await.into_iter().map(|(k, _, _)| k).collect();
    assert_eq!(
        first,
        ["jobs:a", "jobs:a"],
        "limit counts keys, each with all its permits"
    );
    assert_eq!(ended.release().await, baton_core::ReleaseOutcome::Expired);
    for guard in held {
        guard.release().await;
    }
}

/// Four stores (four processes' worth of connections and watches), three tasks each, two
/// permits: never more than two hold at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stores_on_one_cluster_share_the_permits() {
    let cluster = common::cluster().await;
    let mut stores: Vec<Arc<dyn SemaphoreStore>> = Vec::new();
    for _ in 0..4 {
        stores.push(Arc::new(common::store(&cluster).await));
    }
    let most = most_permit_holders(stores, &fresh_namespace(), "shared", 2, 3).await;
    assert!(most <= 2, "{most} holders of 2 permits");
}

/// A waiter in another store is woken by the release itself (through its watch), not by its
/// timer: the permit it waits for would not end for a minute.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_wakes_a_waiter_of_another_store() {
    let cluster = common::cluster().await;
    let ns = fresh_namespace();
    let a = Semaphore::new(Arc::new(common::store(&cluster).await), ns.clone(), "w", 1).unwrap();
    let b = Semaphore::new(Arc::new(common::store(&cluster).await), ns, "w", 1).unwrap();
    let held = a
        .try_acquire(&LockOptions::new(Duration::from_secs(60)))
        .await
        .unwrap()
        .expect("free");
    let waiter = tokio::spawn(async move {
        let started = tokio::time::Instant::now();
        let got = b
            .acquire(&LockOptions::new(Duration::from_secs(60)).wait(Duration::from_secs(30)))
            .await
            .expect("the released permit");
        (got, started.elapsed())
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let fence = held.fence();
    held.release().await;
    let (got, waited) = waiter.await.unwrap();
    assert!(got.fence() > fence);
    assert!(
        waited < Duration::from_secs(20),
        "woken by the release, after {waited:?}"
    );
    got.release().await;
}

/// Four OS processes, each with its store, share two permits: the merged history never has
/// more than two holders believing they hold at once, and no two permits share a fence.
///
/// Each permit is held 100 ms: waiting processes take released permits in the order they
/// queued, one handoff after another, and a handoff (a watch event and three requests) can
/// take longer than the workload's default 3 ms hold on a busy machine, so the two permits
/// would seldom be held at once.
#[test]
fn four_processes_never_hold_more_than_the_permits() {
    let cluster = baton_testkit::etcd::EtcdCluster::start().expect("a private etcd cluster");
    let dir = tempfile::tempdir().unwrap();
    workload().run_in_processes(
        "permit_contender_process",
        4,
        dir.path(),
        &[("STORE_URL", &cluster.url())],
    );
}

#[test]
#[ignore = "a child process of four_processes_never_hold_more_than_the_permits"]
fn permit_contender_process() {
    workload().run_as_child(|| async {
        let url = baton_testkit::process::parent_env("STORE_URL");
        let store: Arc<dyn SemaphoreStore> = Arc::new(EtcdStore::connect(&url).await.unwrap());
        Semaphore::new(store, Namespace::default(), "history", 2).unwrap()
    });
}

/// The permit workload of the processes above.
fn workload() -> PermitWorkload {
    PermitWorkload::new(2).hold(Duration::from_millis(100))
}
