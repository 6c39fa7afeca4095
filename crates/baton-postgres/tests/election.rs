//! Elections on the PostgreSQL store: the conformance rules (on the test binary's shared
//! server, each rule in a namespace of its own), and candidates in several OS processes.

mod common;

use std::sync::Arc;

use baton_core::{Election, Namespace};
use baton_testkit::ElectionWorkload;
use baton_testkit::postgres::PostgresServer;
use common::*;

baton_core::election_conformance_tests!(harness());

/// Four OS processes, each with its store (and its LISTEN connection), campaign in turn: no
/// two of them believe they lead at once, and every term is larger than the one before.
#[test]
fn candidates_in_four_processes_lead_one_at_a_time() {
    let dir = tempfile::tempdir().unwrap();
    let url = PostgresServer::shared().url();
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
        // The default namespace: every process must reach the same key (the other tests on
        // the shared server use namespaces of their own).
        let store = Arc::new(connect(&url).await);
        Election::new(store, Namespace::default(), "history").unwrap()
    });
}
