//! `baton doctor` on a Redis Cluster (`baton_redis::doctor::diagnose_cluster`), against a
//! private cluster of this test binary (three masters, three replicas on loopback): the
//! slot map, then every master judged as one server is.

use baton_core::doctor::{Report, Verdict};
use baton_redis::doctor::diagnose_cluster;
use baton_testkit::redis_cluster::RedisCluster;

async fn cluster() -> RedisCluster {
    tokio::task::spawn_blocking(RedisCluster::start)
        .await
        .unwrap()
        .expect("a private Redis Cluster")
}

fn masters(cluster: &RedisCluster) -> Vec<u16> {
    let mut masters: Vec<u16> = cluster
        .ports()
        .into_iter()
        .filter(|p| cluster.replica_of(*p).is_ok())
        .collect();
    masters.sort_unstable();
    masters
}

/// The checks of `report` named `name` whose detail mentions `text`.
fn checks<'a>(report: &'a Report, name: &str, text: &str) -> Vec<&'a baton_core::doctor::Check> {
    report
        .checks
        .iter()
        .filter(|c| c.name == name && c.detail.contains(text))
        .collect()
}

fn redis_cli(port: u16, args: &[&str]) {
    let status = std::process::Command::new("redis-cli")
        .args(["-p", &port.to_string()])
        .args(args)
        .stdout(std::process::Stdio::null())
        .status()
        .expect("redis-cli");
    assert!(status.success(), "redis-cli {args:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_slot_and_every_master_is_checked_and_a_bad_master_is_named() {
    let cluster = cluster().await;
    let masters = masters(&cluster);
    assert_eq!(masters.len(), 3, "three masters: {masters:?}");

    let report = diagnose_cluster(&cluster.url()).await.unwrap();
    assert!(report.reachable, "{report:?}");
    let slots = checks(
        &report,
        "slots",
        "16384 of 16384 slots served by 3 master(s)",
    );
    assert_eq!(slots.len(), 1, "{report:?}");
    assert_eq!(slots[0].verdict, Verdict::Ok, "{:?}", slots[0]);
    for port in &masters {
        let address = format!("127.0.0.1:{port}");
        for name in ["server", "clock", "replication", "maxmemory-policy"] {
            let found = checks(&report, name, &address);
            assert_eq!(found.len(), 1, "{name} of master {address}: {report:?}");
        }
        let server = checks(&report, "server", &address)[0];
        assert_eq!(server.verdict, Verdict::Ok, "{server:?}");
        let replication = checks(&report, "replication", &address)[0];
        assert!(
            replication.detail.contains("1 replica(s)"),
            "{replication:?}"
        );
    }
    assert!(
        checks(&report, "maxmemory-policy", "")
            .iter()
            .all(|c| c.verdict == Verdict::Ok),
        "every master keeps keys: {report:?}"
    );

    // One master that may evict lock keys is a finding that names it.
    let bad = masters[1];
    redis_cli(bad, &["CONFIG", "SET", "maxmemory-policy", "allkeys-lru"]);
    let report = diagnose_cluster(&cluster.url()).await.unwrap();
    let findings: Vec<_> = report.findings().collect();
    assert_eq!(findings.len(), 1, "{findings:?}");
    assert_eq!(findings[0].name, "maxmemory-policy");
    assert!(
        findings[0].detail.starts_with(&format!(
            "master 127.0.0.1:{bad}: maxmemory-policy is allkeys-lru"
        )),
        "{:?}",
        findings[0]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_that_cannot_be_reached_is_a_report_and_a_bad_url_an_error() {
    // A port nobody listens on: the report says so, it is not an error.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    drop(listener);
    let url = format!("redis+cluster://:s3cret@127.0.0.1:{port}?connect_timeout=200ms");
    let report = diagnose_cluster(&url).await.unwrap();
    assert!(!report.reachable);
    let text = format!("{report:?}");
    assert!(!text.contains("s3cret"), "the password is redacted: {text}");

    let error = diagnose_cluster("redis+cluster://127.0.0.1:7000/3")
        .await
        .unwrap_err();
    assert_eq!(error.kind(), baton_core::ErrorKind::InvalidInput, "{error}");
}
