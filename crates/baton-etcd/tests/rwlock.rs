//! Reader-writer locks on the etcd store (the lock atom for the gate, the permit atom for
//! the readers and the writer): the conformance rules on the test binary's private cluster,
//! and four OS processes reading and writing one lock.
//!
//! Every rule runs except `release_outcomes`, which expects 200ms grants to be gone from the
//! store 600ms later: etcd leases are whole seconds, so
//! `a_release_after_the_cluster_ended_the_grant_is_expired` checks the same with one-second
//! grants.

mod common;

use std::sync::Arc;
use std::time::Duration;

use baton_core::store::LeaseStore;
use baton_core::{LockOptions, ReleaseOutcome, RwLock, SemaphoreStore};
use baton_etcd::EtcdStore;
use baton_testkit::RwLockWorkload;

baton_core::__conformance_rules!(baton_core::rwlock::conformance; common::harness();
    readers_share,
    a_writer_excludes_readers_and_writers,
    a_waiting_writer_blocks_new_readers_and_enters_when_they_leave,
    readers_queued_before_a_writer_enter_first,
    a_writer_s_fence_is_above_every_earlier_grant_s,
    a_grant_past_its_ttl_fires_lost,
    a_writer_whose_gate_is_lost_is_told,
    keep_alive_holds_a_writer_across_ttls,
    try_read_and_try_write_answer_contention,
    list_shows_writers_and_readers_by_key,
    bad_input_is_rejected_before_io,
);

/// `release_outcomes` at etcd's scale: a read and a write released normally are
/// `Released`; a one-second read and a one-second write released after the cluster ended
/// them (their leases expired) are `Expired`, and the lock is free after each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_after_the_cluster_ended_the_grant_is_expired() {
    let store = Arc::new(common::store(&*common::cluster().await).await);
    let leases: Arc<dyn LeaseStore> = store.clone();
    let permits: Arc<dyn SemaphoreStore> = store;
    let rw = RwLock::new(
        leases,
        permits,
        baton_core::conformance::fresh_namespace(),
        "out",
    )
    .unwrap();
    let long = LockOptions::new(Duration::from_secs(30));
    let reader = rw.read(&long).await.unwrap();
    assert_eq!(reader.release().await, ReleaseOutcome::Released);
    let writer = rw.write(&long).await.unwrap();
    assert_eq!(writer.release().await, ReleaseOutcome::Released);
    let short = LockOptions::new(Duration::from_secs(1));
    let until_free = || async {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while !rw.holders().await.unwrap().is_free() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the cluster kept the grant"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    let reader = rw.read(&short).await.unwrap();
    until_free().await;
    assert_eq!(reader.release().await, ReleaseOutcome::Expired);
    let writer = rw.write(&short).await.unwrap();
    until_free().await;
    assert_eq!(writer.release().await, ReleaseOutcome::Expired);
    assert!(rw.holders().await.unwrap().is_free());
}

/// How long each read of the four processes holds: long enough for readers of different
/// processes to overlap despite the round trips to a Raft quorum that each hand-over of the
/// gate costs.
const READ_HOLD: Duration = Duration::from_millis(300);

/// Four OS processes, each with its store, read and write one lock: in the merged history no
/// writer overlaps any reader or writer, and every writer's fence is above every earlier
/// grant's.

#[test]
fn four_processes_never_write_beside_anyone() {
    let cluster = baton_testkit::etcd::EtcdCluster::start().expect("a private etcd cluster");
    let dir = tempfile::tempdir().unwrap();
    RwLockWorkload::new().read_hold(READ_HOLD).run_in_processes(
        "rwlock_contender_process",
        4,
        dir.path(),
        &[("STORE_URL", &cluster.url())],
    );
}

#[test]
#[ignore = "a child process of four_processes_never_write_beside_anyone"]
fn rwlock_contender_process() {
    RwLockWorkload::new()
        .read_hold(READ_HOLD)
        .run_as_child(|| async {
            let url = baton_testkit::process::parent_env("STORE_URL");
            let store = Arc::new(
                EtcdStore::connect(&url)
                    .await
                    .unwrap_or_else(|e| panic!("connect {url}: {e}")),
            );
            let leases: Arc<dyn LeaseStore> = store.clone();
            let permits: Arc<dyn SemaphoreStore> = store;
            RwLock::new(leases, permits, baton_core::Namespace::default(), "history").unwrap()
        });
}
