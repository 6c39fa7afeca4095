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

baton_testkit::idempotency_races!(
    {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("baton.db").to_string_lossy().into_owned();
        (dir, db)
    },
    open_log
);
