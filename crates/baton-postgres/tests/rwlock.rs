//! Reader-writer locks on the PostgreSQL store: the conformance rules (on the test binary's
//! shared server, each rule in a namespace of its own), and four OS processes reading and
//! writing one lock.

mod common;

use std::sync::Arc;

use baton_core::store::LeaseStore;
use baton_core::{RwLock, SemaphoreStore};

use baton_testkit::RwLockWorkload;
use baton_testkit::postgres::PostgresServer;
use common::*;

baton_core::rwlock_conformance_tests!(harness());

/// Four OS processes, each with its store (and its LISTEN connection), read and write one
/// lock: in the merged history no writer overlaps any reader or writer, and every writer's
/// fence is above every earlier grant's.
#[test]
fn four_processes_never_write_beside_anyone() {
    let dir = tempfile::tempdir().unwrap();
    let url = PostgresServer::shared().url();
    RwLockWorkload::new().run_in_processes(
        "rwlock_contender_process",
        4,
        dir.path(),
        &[("STORE_URL", &url)],
    );
}

#[test]
#[ignore = "a child process of four_processes_never_write_beside_anyone"]
fn rwlock_contender_process() {
    RwLockWorkload::new().run_as_child(|| async {
        let url = baton_testkit::process::parent_env("STORE_URL");
        // The default namespace: every process must reach the same key (the other tests on
        // the shared server use namespaces of their own).
        let store = Arc::new(connect(&url).await);
        let leases: Arc<dyn LeaseStore> = store.clone();
        let permits: Arc<dyn SemaphoreStore> = store;
        RwLock::new(leases, permits, baton_core::Namespace::default(), "history").unwrap()
    });
}
