//! `baton run` with `BATON_STORE=redis://...` (and `redis+cluster://...`), against a private
//! `redis-server` (or Redis Cluster) started by `baton-testkit`: several processes exclude
//! each other, a contender that cannot wait exits 75, and a server that is down gives 69.

mod common;

use baton_testkit::redis::RedisServer;
use common::baton_on;

#[test]
fn baton_run_on_redis_excludes_reports_contention_and_a_down_server() {
    let server =
        RedisServer::start().expect("a private redis-server (apt-get install redis-server)");
    let url = format!("{}?connect_timeout=1s&response_timeout=1s", server.url());
    common::run_excludes_reports_contention_and_a_down_server(&url, "baton-cli-redis-", || {
        server.kill()
    });
}

/// The same through a `redis+cluster://` URL, against a private cluster of three masters and
/// three replicas: the four runs queue for the key on its master and are woken over sharded
/// pub/sub; with every node killed, a run exits 69.
#[test]
fn baton_run_on_a_redis_cluster_excludes_reports_contention_and_a_down_cluster() {
    let cluster = baton_testkit::redis_cluster::RedisCluster::start()
        .expect("a private Redis Cluster (apt-get install redis-server)");
    let url = format!("{}?connect_timeout=1s&response_timeout=1s", cluster.url());
    common::run_excludes_reports_contention_and_a_down_server(
        &url,
        "baton-cli-redis-cluster-",
        || {
            for port in cluster.ports() {
                cluster.kill(port).expect("kill a cluster node");
            }
        },
    );
}

/// `baton run` across the promotion of a replica that missed grants: three runs replicated,
/// the replica cut off, three more runs on the primary, the primary killed and the replica
/// promoted; the runs against the promoted replica get fences above all six.
#[test]
fn baton_run_fences_never_repeat_after_a_lagging_replica_is_promoted() {
    use baton_testkit::redis::RedisOptions;
    use std::time::Duration;

    let primary =
        RedisServer::start().expect("a private redis-server (apt-get install redis-server)");
    let replica =
        RedisServer::start_replica_of(&primary, RedisOptions::new()).expect("a private replica");
    let dir = tempfile::Builder::new()
        .prefix("baton-cli-redis-promote-")
        .tempdir()
        .expect("temp dir");
    let fences = |url: &str, times: usize| -> Vec<u64> {
        (0..times)
            .map(|_| {
                let out = baton_on(
                    url,
                    dir.path(),
                    &["run", "promoted-job", "--", "sh", "-c", "echo $BATON_FENCE"],
                )
                .output()
                .expect("baton run");
                assert!(
                    out.status.success(),
                    "baton run failed: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
                String::from_utf8_lossy(&out.stdout)
                    .trim()
                    .parse()
                    .expect("BATON_FENCE is decimal")
            })
            .collect()
    };
    let mut before = fences(&primary.url(), 3);
    assert_eq!(
        primary
            .wait_for_replicas(1, Duration::from_secs(3))
            .unwrap(),
        1
    );
    replica.cut_off_replication().unwrap();
    before.extend(fences(&primary.url(), 3));
    primary.kill();
    replica.promote().unwrap();
    let after = fences(&replica.url(), 3);
    let last = *before.iter().max().unwrap();
    assert!(
        after.iter().all(|f| *f > last),
        "fences repeated across the promotion: before {before:?}, after {after:?}"
    );
}

/// A Sentinel URL without a master name, with an empty host list, or with an unknown option
/// is a usage error (64) naming the problem, before any I/O; the password never shows.
#[test]
fn bad_sentinel_urls_exit_64_without_showing_the_password() {
    let dir = tempfile::tempdir().expect("temp dir");
    for (url, needle) in [
        (
            "redis+sentinel://u:hunter2@127.0.0.1:1",
            "has no master name",
        ),
        (
            "redis+sentinel://u:hunter2@/mymaster",
            "has no Sentinel host",
        ),
        (
            "rediss+sentinel://u:hunter2@127.0.0.1:1/mymaster?nope=1",
            "unknown redis:// option \"nope\"",
        ),
    ] {
        let out = baton_on(url, dir.path(), &["run", "job", "--", "true"])
            .output()
            .expect("baton run");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{url}: {stderr}");
        assert!(stderr.contains(needle), "{url}: {stderr}");
        assert!(
            !stderr.contains("hunter2"),
            "{url}: password shown: {stderr}"
        );
        assert!(!String::from_utf8_lossy(&out.stdout).contains("hunter2"));
    }
}
