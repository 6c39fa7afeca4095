//! The idempotency log on the SQLite store: the conformance rules, and the races that need
//! several OS processes on one file (1,000 attempts from 2 processes of 8 tasks each; the
//! owner killed between acquire and finalize).
//!
//! The child processes are this test binary run again with a role (see
//! `baton_testkit::process`); their tests are `#[ignore]`d in ordinary runs.

mod common;

use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;

use baton_core::Namespace;
use baton_core::idempotency::IdempotencyLog;
use baton_testkit::idempotency as races;

baton_core::idempotency_conformance_tests!(common::harness());

/// How every process of the races reaches the file.
fn open_log(
    path: String,
    namespace: Namespace,
) -> Pin<Box<dyn Future<Output = IdempotencyLog> + Send>> {
    Box::pin(async move {
        IdempotencyLog::with_namespace(Arc::new(common::open(Path::new(&path)).await), namespace)
    })
}

/// 1,008 attempts on one scope from 2 processes of 8 tasks each find exactly one `Acquired`.
#[test]
fn a_thousand_attempts_from_two_processes_acquire_once() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("baton.db");
    races::two_processes_acquire_once(&db.to_string_lossy(), open_log);
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
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("baton.db");
    races::killed_owner_is_taken_over_once(&db.to_string_lossy(), open_log);
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
