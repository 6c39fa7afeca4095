//! Elections on the etcd store: the conformance rules on the test binary's private cluster,
//! and candidates in several OS processes.
//!
//! Every rule runs except `proclaim_after_the_leadership_ended_fails_and_elects_nobody`,
//! which expects a 300ms leadership to be gone from the store 400ms later: etcd leases are
//! whole seconds, so `a_proclaim_after_the_cluster_ended_the_term_elects_nobody` checks the
//! same with a one-second leadership.

mod common;

use std::sync::Arc;
use std::time::Duration;

use baton_core::{Election, ErrorKind, LockOptions, Namespace};
use baton_etcd::EtcdStore;
use baton_testkit::ElectionWorkload;

baton_core::__conformance_rules!(baton_core::election::conformance; common::harness();
    one_leader_at_a_time_and_terms_increase,
    leader_reports_candidate_value_and_term,
    proclaim_replaces_the_value_and_keeps_the_term,
    a_waiting_candidate_is_elected_with_its_value_when_the_leader_resigns,
    an_expired_leader_is_told_before_another_is_elected,
    keep_alive_keeps_the_leadership_across_ttls,
    observe_yields_each_settled_change,
    a_dropped_leadership_resigns,
    elections_namespaces_and_locks_are_separate,
    bad_input_is_rejected_before_io,
);

/// `proclaim_after_the_leadership_ended_fails_and_elects_nobody` at etcd's scale: a
/// one-second leadership without keep-alive is told it is lost, the cluster ends its term
/// (its lease expires), and a proclaim then fails, elects nobody and keeps the old value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proclaim_after_the_cluster_ended_the_term_elects_nobody() {
    let store = common::store(&*common::cluster().await).await;
    let e = Election::new(
        Arc::new(store),
        baton_core::conformance::fresh_namespace(),
        "ended",
    )
    .unwrap();
    let a = e
        .campaign("a", "old", &LockOptions::new(Duration::from_secs(1)))
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(5), a.lost())
        .await
        .expect("lost after its TTL");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while e.leader().await.unwrap().is_some() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the cluster kept the term"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let err = a.proclaim("new").await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Timeout, "{err}");
    assert_eq!(e.leader().await.unwrap(), None, "a proclaim elected nobody");
    assert_eq!(a.value(), "old");
}

/// Four OS processes, each with its store, campaign in turn: no two of them believe they
/// lead at once, and every term is larger than the one before.
#[test]
fn candidates_in_four_processes_lead_one_at_a_time() {
    let cluster = baton_testkit::etcd::EtcdCluster::start().expect("a private etcd cluster");
    let dir = tempfile::tempdir().unwrap();
    ElectionWorkload::new().run_in_processes(
        "candidate_process",
        4,
        dir.path(),
        &[("STORE_URL", &cluster.url())],
    );
}

#[test]
#[ignore = "a child process of candidates_in_four_processes_lead_one_at_a_time"]
fn candidate_process() {
    ElectionWorkload::new().run_as_child(|| async {
        let url = baton_testkit::process::parent_env("STORE_URL");
        let store = EtcdStore::connect(&url)
            .await
            .unwrap_or_else(|e| panic!("connect {url}: {e}"));
        Election::new(Arc::new(store), Namespace::default(), "history").unwrap()
    });
}
