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

/// The connections of the server's that `application_name` holds now.
fn connections(server: &PostgresServer, application: &str) -> u32 {
    server
        .sql(&format!(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = '{application}'"
        ))
        .unwrap()
        .parse()
        .unwrap()
}

/// While a `baton run` holds its lock and keeps it alive, the server sees one connection of
/// its pool (`application_name` `baton`) and no LISTEN connection: it never waited. A run
/// that waits for the lock adds its LISTEN connection (`baton-listen`), one, while it waits.
#[test]
fn one_baton_process_uses_one_connection_and_a_second_only_to_wait() {
    let server =
        PostgresServer::start().expect("a private PostgreSQL server (apt-get install postgresql)");
    let dir = tempfile::tempdir().unwrap();
    let url = server.url();
    // Keep-alive renewals every second until the test says done.
    let holder = Running::spawn(baton_on(
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
            "touch running; while [ ! -e done ]; do sleep 0.05; done",
        ],
    ));
    eventually("the command to start", || {
        dir.path().join("running").exists()
    });
    let (mut pooled, mut listening) = (0, 0);
    for _ in 0..15 {
        pooled = pooled.max(connections(&server, "baton"));
        listening = listening.max(connections(&server, "baton-listen"));
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(pooled, 1, "one pooled connection per baton process");
    assert_eq!(
        listening, 0,
        "no LISTEN connection for a run that did not wait"
    );

    let waiter = Running::spawn(baton_on(
        &url,
        dir.path(),
        &["run", "--wait", "30s", "one-connection", "--", "true"],
    ));
    eventually("the waiter's LISTEN connection", || {
        connections(&server, "baton-listen") == 1
    });
    assert!(
        connections(&server, "baton") <= 2,
        "one pooled connection each"
    );
    std::fs::write(dir.path().join("done"), "").unwrap();
    holder.finish().assert_status(0);
    waiter.finish().assert_status(0);
}
