//! `baton serve-metrics --listen ADDR` over real HTTP: Prometheus text with every registered
//! event's counter (from zero, with help), store gauges that follow what is held, the
//! exporter's own events (a Redis with an evicting policy counts
//! `baton.redis.eviction_policy_unsafe` once), and a clean stop on SIGTERM.

mod common;
mod http_support;

use baton::telemetry::REGISTRY;
use baton_testkit::redis::{RedisOptions, RedisServer};
use common::*;
use http_support::{get, serve};
use nix::sys::signal::Signal;

/// The value of the series `name` (exact, labels included) in Prometheus text.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.parse().ok())
}

#[test]
fn metrics_on_sqlite_follow_the_store_and_cover_every_event() {
    let env = Env::new();
    let (server, addr) = serve(
        env.baton(["serve-metrics", "--listen", "127.0.0.1:0"]),
        "baton serve-metrics: serving http://",
    );

    let (status, head, text) = get(&addr, "/metrics");
    assert_eq!(status, 200, "{head}");
    assert!(
        head.contains("Content-Type: text/plain; version=0.0.4"),
        "{head}"
    );
    for event in REGISTRY {
        let name = event.prometheus_counter();
        assert!(
            text.contains(&format!("# HELP {name} ")),
            "no help for {name}"
        );
        assert!(
            text.contains(&format!("# TYPE {name} counter\n")),
            "no type for {name}"
        );
        assert_eq!(
            sample(&text, &name),
            Some(0.0),
            "{name} is not at zero:\n{text}"
        );
    }
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let name = line.split(['{', ' ']).next().unwrap_or_default();
        assert!(
            name.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':'),
            "not a Prometheus name: {line}"
        );
    }
    assert_eq!(
        sample(&text, "baton_store_up{namespace=\"baton\"}"),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        sample(&text, "baton_store_leases_held{namespace=\"baton\"}"),
        Some(0.0)
    );

    env.run([
        "lease", "claim", "leader", "--holder", "node-a", "--ttl", "10m",
    ])
    .assert_status(0);
    let (_, _, text) = get(&addr, "/metrics");
    assert_eq!(
        sample(&text, "baton_store_leases_held{namespace=\"baton\"}"),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        sample(&text, "baton_store_locks_held{namespace=\"baton\"}"),
        Some(0.0),
        "{text}"
    );

    assert_eq!(get(&addr, "/nope").0, 404);
    server.signal(Signal::SIGTERM);
    server.finish().assert_status(0);
}

#[test]
fn the_exporter_counts_its_own_events() {
    let lru =
        RedisServer::start_with(RedisOptions::new().args(["--maxmemory-policy", "allkeys-lru"]))
            .expect("a private redis-server (apt-get install redis-server)");
    let mut command = bare_baton();
    command.args([
        "--store",
        &lru.url(),
        "serve-metrics",
        "--listen",
        "127.0.0.1:0",
    ]);
    let (server, addr) = serve(command, "baton serve-metrics: serving http://");
    let (status, _, text) = get(&addr, "/metrics");
    assert_eq!(status, 200);
    assert_eq!(
        sample(&text, "baton_redis_eviction_policy_unsafe_total"),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        sample(&text, "baton_store_up{namespace=\"baton\"}"),
        Some(1.0)
    );

    // The store goes away: the endpoint still answers, and says so.
    lru.kill();
    eventually("baton_store_up 0", || {
        let (_, _, text) = get(&addr, "/metrics");
        sample(&text, "baton_store_up{namespace=\"baton\"}") == Some(0.0)
    });
    server.signal(Signal::SIGINT);
    server.finish().assert_status(0);
}
