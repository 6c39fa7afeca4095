//! Reader-writer locks on the SQLite store: the conformance rules on a temporary file, and
//! four OS processes reading and writing one lock of one file.

mod common;

use std::sync::Arc;

use baton_core::store::LeaseStore;
use baton_core::{RwLock, SemaphoreStore};
use baton_sqlite::SqliteStore;
use baton_testkit::RwLockWorkload;

baton_core::rwlock_conformance_tests!(common::harness());

/// Four OS processes read and write one lock of one file: in the merged history no writer
/// overlaps any reader or writer, and every writer's fence is above every earlier grant's.
#[test]
fn four_processes_never_write_beside_anyone() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("baton.db").display());
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
        let store = Arc::new(SqliteStore::connect(&url).await.unwrap());
        let leases: Arc<dyn LeaseStore> = store.clone();
        let permits: Arc<dyn SemaphoreStore> = store;
        RwLock::new(leases, permits, baton_core::Namespace::default(), "history").unwrap()
    });
}
