//! `baton run` with `BATON_STORE=postgres://...`, against a private PostgreSQL server started
//! by `baton-testkit`: several processes exclude each other, a contender that cannot wait
//! exits 75, and a server that is down gives 69.

mod common;

use baton_testkit::postgres::{PostgresServer, Stop};

#[test]
fn baton_run_on_postgres_excludes_reports_contention_and_a_down_server() {
    let server =
        PostgresServer::start().expect("a private PostgreSQL server (apt-get install postgresql)");
    let url = format!("{}?connect_timeout=2s&response_timeout=2s", server.url());
    common::run_excludes_reports_contention_and_a_down_server(&url, "baton-cli-postgres-", || {
        server.stop(Stop::Immediate).expect("stop the server")
    });
}
