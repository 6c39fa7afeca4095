//! Elections on the Redis store: the conformance rules (on the test binary's private
//! server, each rule in a namespace of its own), and candidates in several OS processes.

mod common;

use std::sync::Arc;

use baton_core::{Election, Namespace};
use baton_redis::RedisStore;
use baton_testkit::ElectionWorkload;

baton_core::election_conformance_tests!(common::harness());

/// Four OS processes, each with its store (and its pub/sub connection), campaign in turn:
/// no two of them believe they lead at once, and every term is larger than the one before.
#[test]
fn candidates_in_four_processes_lead_one_at_a_time() {
    let server = baton_testkit::redis::RedisServer::start().expect("a private redis-server");
    let dir = tempfile::tempdir().unwrap();
    ElectionWorkload::new().run_in_processes(
        "candidate_process",
        4,
        dir.path(),
        &[("STORE_URL", &server.url())],
    );
}

#[test]
#[ignore = "a child process of candidates_in_four_processes_lead_one_at_a_time"]
fn candidate_process() {
    ElectionWorkload::new().run_as_child(|| async {
        let url = baton_testkit::process::parent_env("STORE_URL");
        let store = RedisStore::connect(&url)
            .await
            .unwrap_or_else(|e| panic!("connect {url}: {e}"));
        Election::new(Arc::new(store), Namespace::default(), "history").unwrap()
    });
}
