//! `baton run` with `BATON_STORE=etcd://...`, against a private three-member etcd cluster
//! started by `baton-testkit`: several processes exclude each other with strictly increasing
//! `BATON_FENCE`, a contender that cannot wait exits 75, no member answering gives 69, and
//! fences keep increasing across a SIGKILL of the leader member.

mod common;

use baton_testkit::etcd::EtcdCluster;
use common::baton_on;

fn cluster() -> EtcdCluster {
    EtcdCluster::start().expect("a private three-member etcd cluster (apt-get install etcd-server)")
}

#[test]
fn baton_run_on_etcd_excludes_reports_contention_and_no_member_answering() {
    let cluster = cluster();
    let url = format!("{}?connect_timeout=1s&response_timeout=1s", cluster.url());
    common::run_excludes_reports_contention_and_a_down_server(&url, "baton-cli-etcd-", || {
        for member in 0..cluster.len() {
            cluster.kill(member);
        }
    });
}

/// Runs one `baton run` that prints its fence, and returns it.
fn fence_of_one_run(url: &str, dir: &std::path::Path) -> u64 {
    let out = baton_on(
        url,
        dir,
        &[
            "run",
            "--wait",
            "30s",
            "failover-job",
            "--",
            "sh",
            "-c",
            "echo $BATON_FENCE",
        ],
    )
    .output()
    .expect("baton run");
    assert!(
        out.status.success(),
        "baton run failed ({:?}): {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .expect("BATON_FENCE is decimal")
}

/// Three runs, the leader member killed, three runs on the two members left, the member
/// back, three more runs: every run's fence is above every earlier one's, because fences
/// are the cluster's revisions, which a member's death does not take back.
#[test]
fn baton_run_fences_strictly_increase_across_a_sigkill_of_the_leader() {
    let cluster = cluster();
    let url = format!("{}?connect_timeout=1s&response_timeout=2s", cluster.url());
    let dir = tempfile::Builder::new()
        .prefix("baton-cli-etcd-failover-")
        .tempdir()
        .expect("temp dir");
    let mut fences: Vec<u64> = (0..3).map(|_| fence_of_one_run(&url, dir.path())).collect();
    let leader = cluster.leader().expect("a leader");
    cluster.kill(leader);
    cluster
        .wait_for_leader(std::time::Duration::from_secs(30))
        .expect("the two members left elect a leader");
    fences.extend((0..3).map(|_| fence_of_one_run(&url, dir.path())));
    cluster
        .restart(leader)
        .expect("the killed member comes back");
    fences.extend((0..3).map(|_| fence_of_one_run(&url, dir.path())));
    assert!(
        fences.windows(2).all(|w| w[0] < w[1]),
        "fences must strictly increase: {fences:?}"
    );
}
