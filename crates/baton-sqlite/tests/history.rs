//! Recorded-history tests of locks over the SQLite store: many contenders in one process,
//! and contenders in several OS processes sharing one database file, every acquire,
//! release and fenced write recorded, the histories merged and checked for overlapping
//! holders, fence order, stale writes and lost or doubled effects.
//!
//! The multi-process test re-runs this test binary: `sqlite_contender_process` is its
//! child, ignored in ordinary runs and run by the parent with a role (see
//! `LockWorkload::run_in_processes`).

use std::sync::Arc;
use std::time::Duration;

use baton_core::Locks;
use baton_sqlite::SqliteStore;
use baton_testkit::process;
use baton_testkit::{FencedRegister, LockWorkload, Recorder, WorkloadReport, check};

const KEY: &str = "history";
/// Contenders in the single-process test.
const CONTENDERS: u32 = 8;
/// Processes in the multi-process test, and contenders in each.
const PROCESSES: u32 = 8;
const PER_PROCESS: u32 = 1;
const ROUNDS: u32 = 15;

async fn open_locks(url: &str) -> Locks {
    let store = SqliteStore::connect(url)
        .await
        .unwrap_or_else(|e| panic!("open {url}: {e}"));
    Locks::new(Arc::new(store))
}

/// Runs `workload` over locks on a fresh file, recorded, its holders writing to an
/// in-memory register; the run itself had no errors.
async fn run_on_a_fresh_file(
    workload: LockWorkload,
) -> (WorkloadReport, Recorder, Arc<FencedRegister>) {
    let dir = tempfile::tempdir().unwrap();
    let locks = open_locks(&format!(
        "sqlite://{}",
        dir.path().join("baton.db").display()
    ))
    .await;
    let (report, recorder, register) = workload.run_recorded(&locks).await;
    report.assert_no_errors();
    (report, recorder, register)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_contenders_in_one_process_keep_every_rule() {
    let (report, recorder, register) = run_on_a_fresh_file(
        LockWorkload::new(KEY)
            .contenders(CONTENDERS, 0)
            .rounds(ROUNDS),
    )
    .await;
    let wanted = u64::from(CONTENDERS * ROUNDS);
    report.assert_every_round_held(wanted);
    LockWorkload::assert_every_grant_landed(&recorder.history(), &register, wanted);
}

/// Holders that overstay their TTL lose the lock to the next contender; their believed
/// window ends at `valid_until`, the next grant has a larger fence, and their late writes
/// are rejected by the register rather than accepted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holders_that_overstay_their_ttl_are_fenced_off() {
    let (report, recorder, _) = run_on_a_fresh_file(
        LockWorkload::new(KEY)
            .contenders(CONTENDERS, 0)
            .rounds(4)
            .ttl(Duration::from_millis(60))
            .overstay(2, Duration::from_millis(120)),
    )
    .await;
    check::assert_clean(&check::all(&recorder.history()));
    assert_eq!(report.grants, u64::from(CONTENDERS * 4), "{report:?}");
    assert!(
        report.expired > 0,
        "no holder overstayed its TTL: {report:?}"
    );
}

#[test]
fn contenders_in_eight_processes_on_one_file_keep_every_rule() {
    let file = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", file.path().join("baton.db").display());
    let (history, register) = LockWorkload::run_in_processes(
        "sqlite_contender_process",
        PROCESSES,
        file.path(),
        &[("STORE_URL", &url)],
    );
    let wanted = u64::from(PROCESSES * PER_PROCESS * ROUNDS);
    LockWorkload::assert_every_grant_landed(&history, &register, wanted);
    let processes: std::collections::HashSet<u32> =
        history.grants().iter().map(|g| g.process).collect();
    assert_eq!(
        processes.len(),
        PROCESSES as usize,
        "every process was granted the lock"
    );
}

#[test]
#[ignore = "a child process of contenders_in_eight_processes_on_one_file_keep_every_rule"]
fn sqlite_contender_process() {
    LockWorkload::new(KEY)
        .contenders(PER_PROCESS, 0)
        .rounds(ROUNDS)
        .run_as_child(|| async { open_locks(&process::parent_env("STORE_URL")).await });
}
