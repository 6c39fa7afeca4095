//! `baton run` with `BATON_STORE=postgres://...`, against a private PostgreSQL server started
//! by `baton-testkit`: several processes exclude each other, a contender that cannot wait
//! exits 75, and a server that is down gives 69 — directly, and through a private PgBouncer
//! in transaction mode (`pooler=transaction`). And one `baton` process takes one connection
//! of the server's (plus its LISTEN connection), however long it runs.

mod common;

use std::time::Duration;

use baton_testkit::pgbouncer::{PgBouncer, PoolMode};
use baton_testkit::postgres::{PostgresServer, Stop};
use common::*;

#[test]
fn baton_run_on_postgres_excludes_reports_contention_and_a_down_server() {
    let server =
        PostgresServer::start().expect("a private PostgreSQL server (apt-get install postgresql)");
    let url = format!("{}?connect_timeout=2s&response_timeout=2s", server.url());
    common::run_excludes_reports_contention_and_a_down_server(&url, "baton-cli-postgres-", || {
        server.stop(Stop::Immediate).expect("stop the server")
    });
}

#[test]
fn baton_run_through_a_transaction_pooler_excludes_reports_contention_and_a_down_server() {
    let server =
        PostgresServer::start().expect("a private PostgreSQL server (apt-get install postgresql)");
    let pooler = PgBouncer::start(&server, PoolMode::Transaction)
        .expect("a private PgBouncer (apt-get install pgbouncer)");
    let url = format!(
        "{}?pooler=transaction&poll_interval=50ms&connect_timeout=2s&response_timeout=2s",
        pooler.url()
    );
    common::run_excludes_reports_contention_and_a_down_server(&url, "baton-cli-pgbouncer-", || {
        server.stop(Stop::Immediate).expect("stop the server")
    });
}

/// While a `baton run` holds its lock and keeps it alive, the server sees one connection of
/// its pool (`application_name` `baton`) and its LISTEN connection, nothing more.
#[test]
fn one_baton_process_uses_one_pooled_connection() {
    let server =
        PostgresServer::start().expect("a private PostgreSQL server (apt-get install postgresql)");
    let dir = tempfile::tempdir().unwrap();
    let url = server.url();
    // Keep-alive renewals every second for three seconds, beside the LISTEN heartbeats.
    let run = Running::spawn(baton_on(
        &url,
        dir.path(),
        &[
            "run",
            "--ttl",
            "3s",
            "one-connection",
            "--",
            "sh",
            "-c",
            "touch running; sleep 4",
        ],
    ));
    eventually("the command to start", || {
        dir.path().join("running").exists()
    });
    let mut most = 0;
    for _ in 0..30 {
        let count: u32 = server
            .sql("SELECT count(*) FROM pg_stat_activity WHERE application_name = 'baton'")
            .unwrap()
            .parse()
            .unwrap();
        most = most.max(count);
        std::thread::sleep(Duration::from_millis(100));
    }
    run.finish().assert_status(0);
    assert_eq!(most, 1, "one pooled connection per baton process");
}
