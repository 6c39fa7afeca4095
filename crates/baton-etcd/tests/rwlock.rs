//! Reader-writer locks on the etcd store (the lock atom for the gate, the permit atom for
//! the readers and the writer): the conformance rules on the test binary's private cluster,
//! and four OS processes reading and writing one lock.

mod common;

use std::sync::Arc;

use baton_core::store::LeaseStore;
use baton_core::{RwLock, SemaphoreStore};
use baton_etcd::EtcdStore;
use baton_testkit::RwLockWorkload;

baton_core::rwlock_conformance_tests!(common::harness());

/// Four OS processes, each with its store, read and write one lock: in the merged history no
/// writer overlaps any reader or writer, and every writer's fence is above every earlier
/// grant's.
#[test]
fn four_processes_never_write_beside_anyone() {
    let cluster = baton_testkit::etcd::EtcdCluster::start().expect("a private etcd cluster");
    let dir = tempfile::tempdir().unwrap();
    RwLockWorkload::new().run_in_processes(
        "rwlock_contender_process",
        4,
        dir.path(),
        &[("STORE_URL", &cluster.url())],
    );
}

#[test]
#[ignore = "a child process of four_processes_never_write_beside_anyone"]
fn rwlock_contender_process() {
    RwLockWorkload::new().run_as_child(|| async {
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
