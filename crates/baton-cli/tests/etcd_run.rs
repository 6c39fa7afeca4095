//! `baton run` with `BATON_STORE=etcd://...`, against a private three-member etcd cluster
//! started by `baton-testkit`: several processes exclude each other with strictly increasing
//! `BATON_FENCE`, a contender that cannot wait exits 75, no member answering gives 69, and
//! fences keep increasing across a SIGKILL of the leader member.

mod common;

use baton_testkit::etcd::EtcdCluster;
use common::{CONTENDED, Running, baton_on, eventually};

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

/// `--shared` and `--exclusive` on etcd (the reader-writer lock over the permit slots): two
/// readers run at once, a writer that cannot wait for them exits 75 without running, and a
/// writer that waits runs after them with a fence above both of theirs.
#[test]
fn shared_runs_read_together_and_an_exclusive_one_runs_alone_after_them() {
    let cluster = cluster();
    let url = format!("{}?connect_timeout=1s&response_timeout=2s", cluster.url());
    let dir = tempfile::Builder::new()
        .prefix("baton-cli-etcd-shared-")
        .tempdir()
        .expect("temp dir");
    let path = |name: &str| dir.path().join(name);
    let fences = |word: &str| -> Vec<u64> {
        std::fs::read_to_string(path("events"))
            .unwrap_or_default()
            .lines()
            .filter_map(|line| line.strip_prefix(word)?.trim().parse().ok())
            .collect()
    };
    std::fs::write(path("hold"), "").unwrap();
    let read = r#"echo "read $BATON_FENCE" >> events; while [ -e hold ]; do sleep 0.05; done"#;
    let readers: Vec<Running> = (0..2)
        .map(|_| {
            Running::spawn(baton_on(
                &url,
                dir.path(),
                &[
                    "run", "--shared", "--wait", "1m", "model", "--", "sh", "-c", read,
                ],
            ))
        })
        .collect();
    eventually("both readers to run at once", || fences("read ").len() == 2);

    let out = Running::spawn(baton_on(
        &url,
        dir.path(),
        &[
            "run",
            "--exclusive",
            "--wait",
            "300ms",
            "model",
            "--",
            "touch",
            "ran",
        ],
    ))
    .finish();
    out.assert_status(CONTENDED);
    assert!(!path("ran").exists(), "a writer ran beside readers");

    let writer = Running::spawn(baton_on(
        &url,
        dir.path(),
        &[
            "run",
            "--exclusive",
            "--wait",
            "1m",
            "model",
            "--",
            "sh",
            "-c",
            r#"echo "write $BATON_FENCE" >> events"#,
        ],
    ));
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert!(fences("write ").is_empty(), "the writer ran beside readers");
    std::fs::remove_file(path("hold")).unwrap();
    for reader in readers {
        reader.finish().assert_status(0);
    }
    writer.finish().assert_status(0);
    let (reads, write) = (fences("read "), fences("write "));
    assert_eq!(write.len(), 1);
    assert!(
        reads.iter().all(|&r| write[0] > r),
        "write fence {write:?} after read fences {reads:?}"
    );
}
