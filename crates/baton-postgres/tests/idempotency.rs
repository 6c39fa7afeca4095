//! The idempotency log on the PostgreSQL store: the conformance rules on the test binary's
//! shared private server, and the races that need several OS processes on one database
//! (1,000 attempts from 2 processes of 8 tasks each; the owner killed between acquire and
//! finalize), each on a private server of its own.
//!
//! `reopen` is a new `PostgresStore` (new pool) on the same database. The child processes
//! are this test binary run again with a role (see `baton_testkit::process`); their tests
//! are `#[ignore]`d in ordinary runs.

mod common;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use baton_core::Namespace;
use baton_core::idempotency::IdempotencyLog;
use baton_testkit::idempotency as races;
use baton_testkit::postgres::PostgresServer;

baton_core::idempotency_conformance_tests!(common::harness());

/// How every process of the races reaches the private server.
fn open_log(
    url: String,
    namespace: Namespace,
) -> Pin<Box<dyn Future<Output = IdempotencyLog> + Send>> {
    Box::pin(async move {
        let store = common::connect(&url).await;
        IdempotencyLog::with_namespace(Arc::new(store), namespace)
    })
}

/// 1,008 attempts on one scope from 2 processes of 8 tasks each find exactly one `Acquired`.
#[test]
fn a_thousand_attempts_from_two_processes_acquire_once() {
    let server = PostgresServer::start().expect("a private PostgreSQL server");
    races::two_processes_acquire_once(&server.url(), open_log);
}

#[test]
#[ignore = "a child process of a_thousand_attempts_from_two_processes_acquire_once"]
fn racer() {
    races::racer(open_log);
}

/// The owner is killed between acquire and finalize; once its lease lapses, exactly one of
/// the attempts racing from two other processes takes the record over.
#[test]
fn killing_the_owner_leads_to_exactly_one_takeover_after_the_lease() {
    let server = PostgresServer::start().expect("a private PostgreSQL server");
    races::killed_owner_is_taken_over_once(&server.url(), open_log);
}

#[test]
#[ignore = "a child process of killing_the_owner_leads_to_exactly_one_takeover_after_the_lease"]
fn owner() {
    races::owner(open_log);
}

#[test]
#[ignore = "a child process of killing_the_owner_leads_to_exactly_one_takeover_after_the_lease"]
fn contender() {
    races::contender(open_log);
}
