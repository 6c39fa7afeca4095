//! `baton run` with `BATON_STORE=redis://...`, against a private `redis-server` started by
//! `baton-testkit`: several processes exclude each other, a contender that cannot wait
//! exits 75, and a server that is down gives 69.

mod common;

use baton_testkit::redis::RedisServer;

#[test]
fn baton_run_on_redis_excludes_reports_contention_and_a_down_server() {
    let server =
        RedisServer::start().expect("a private redis-server (apt-get install redis-server)");
    let url = format!("{}?connect_timeout=1s&response_timeout=1s", server.url());
    common::run_excludes_reports_contention_and_a_down_server(&url, "baton-cli-redis-", || {
        server.kill()
    });
}
