//! Elections on the SQLite store: the conformance rules, and candidates in several OS
//! processes sharing one file.

mod common;

use std::sync::Arc;

use baton_core::{Election, Namespace};
use baton_sqlite::SqliteStore;
use baton_testkit::ElectionWorkload;

baton_core::election_conformance_tests!(common::harness());

/// Four OS processes campaign in turn on one file: no two of them believe they lead at
/// once, and every term is larger than the one before.
#[test]
fn candidates_in_four_processes_lead_one_at_a_time() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("baton.db").display());
    ElectionWorkload::new().run_in_processes(
        "candidate_process",
        4,
        dir.path(),
        &[("STORE_URL", &url)],
    );
}

#[test]
#[ignore = "a child process of candidates_in_four_processes_lead_one_at_a_time"]
fn candidate_process() {
    ElectionWorkload::new().run_as_child(|| async {
        let url = baton_testkit::process::parent_env("STORE_URL");
        let store = Arc::new(SqliteStore::connect(&url).await.unwrap());
        Election::new(store, Namespace::default(), "history").unwrap()
    });
}
