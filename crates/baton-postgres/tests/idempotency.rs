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

baton_testkit::idempotency_races!(
    {
        let server = PostgresServer::start().expect("a private PostgreSQL server");
        let url = server.url();
        (server, url)
    },
    open_log
);
