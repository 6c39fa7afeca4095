//! `baton serve-metrics --listen ADDR` over real HTTP: Prometheus text with every registered
//! event's counter (from zero, with help), store gauges that follow what is held, the
//! exporter's own events (a Redis with an evicting policy counts
//! `baton.redis.eviction_policy_unsafe` once), and a clean stop on SIGTERM.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::Duration;

use baton::telemetry::REGISTRY;
use baton_testkit::redis::{RedisOptions, RedisServer};
use common::*;
use nix::sys::signal::Signal;

/// A `GET` over a fresh connection: `(status, head, body)`.
fn get(addr: &str, path: &str) -> (u16, String, String) {
    let mut stream = TcpStream::connect(addr).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    write!(stream, "GET {path} HTTP/1.1\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).expect("read the answer");
    let (head, body) = answer.split_once("\r\n\r\n").expect("a head");
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("a status");
    (status, head.to_owned(), body.to_owned())
}

/// Starts `command` and waits for the address it prints on stderr after `prefix`.
fn serve(command: Command, prefix: &str) -> (Running, String) {
    let mut running = Running::spawn(command);
    let mut addr = String::new();
    eventually("the server's address on stderr", || {
        assert!(running.is_running(), "it exited:\n{}", running.stderr());
        let stderr = running.stderr();
        match stderr.lines().find_map(|l| l.strip_prefix(prefix)) {
            Some(rest) => {
                addr = rest.split('/').next().unwrap_or_default().to_owned();
                true
            }
            None => false,
        }
    });
    (running, addr)
}

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
