//! Recorded-history tests of locks over the SQLite store: many contenders in one process,
//! and contenders in several OS processes sharing one database file, every acquire,
//! release and fenced write recorded, the histories merged and checked for overlapping
//! holders, fence order, stale writes and lost or doubled effects.
//!
//! The multi-process test re-runs this test binary: `sqlite_contender_process` is its
//! child, ignored in ordinary runs and run by the parent with a role (see
//! `baton_testkit::process`).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use baton_core::Locks;
use baton_sqlite::SqliteStore;
use baton_testkit::process::{self, ChildTest};
use baton_testkit::{FencedRegister, History, LockWorkload, Recorder, WorkloadReport, check};

const KEY: &str = "history";
/// Contenders in the single-process test.
const CONTENDERS: u32 = 8;
/// Processes in the multi-process test, and contenders in each.
const PROCESSES: u32 = 4;
const PER_PROCESS: u32 = 2;
const ROUNDS: u32 = 15;
/// Generous: the children are debug builds on a loaded two-core machine.
const CHILD_TIMEOUT: Duration = Duration::from_secs(300);

async fn open_locks(db: &Path) -> Locks {
    let url = format!("sqlite://{}", db.display());
    let store = SqliteStore::connect(&url)
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
    let locks = open_locks(&dir.path().join("baton.db")).await;
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

fn history_file(dir: &Path, process: u32) -> PathBuf {
    dir.join(format!("history-{process}.jsonl"))
}

#[test]
fn contenders_in_four_processes_on_one_file_keep_every_rule() {
    let dir = tempfile::tempdir().unwrap();
    let go = dir.path().join("go");
    let mut children: Vec<_> = (0..PROCESSES)
        .map(|i| {
            ChildTest::new("sqlite_contender_process", "contender")
                .env("HISTORY_DIR", dir.path())
                .env("HISTORY_PROCESS", i.to_string())
                .spawn()
                .expect("spawn a child process")
        })
        .collect();
    // Let every child open the store first, then start them together.
    for i in 0..PROCESSES {
        let ready = dir.path().join(format!("ready-{i}"));
        if let Err(e) = process::wait_for_file(&ready, CHILD_TIMEOUT) {
            panic!("{e}; child output:\n{}", children[i as usize].output());
        }
    }
    std::fs::write(&go, "").unwrap();
    for child in &mut children {
        child
            .wait_success(CHILD_TIMEOUT)
            .unwrap_or_else(|e| panic!("{e}"));
    }

    let history = History::merge(
        (0..PROCESSES)
            .map(|i| History::read_jsonl(history_file(dir.path(), i)).expect("a child's history")),
    );
    let register = FencedRegister::file("counter", dir.path().join("register.json"));
    let wanted = u64::from(PROCESSES * PER_PROCESS * ROUNDS);
    LockWorkload::assert_every_grant_landed(&history, &register, wanted);
    let grants = history.grants();
    let processes: std::collections::HashSet<u32> = grants.iter().map(|g| g.process).collect();
    assert_eq!(
        processes.len(),
        PROCESSES as usize,
        "every process was granted the lock"
    );
}

#[test]
#[ignore = "a child process of contenders_in_four_processes_on_one_file_keep_every_rule"]
fn sqlite_contender_process() {
    if process::role().is_none() {
        return;
    }
    let dir = PathBuf::from(process::parent_env("HISTORY_DIR"));
    let index: u32 = process::parent_env("HISTORY_PROCESS")
        .parse()
        .expect("HISTORY_PROCESS is a number");
    process::child_runtime().block_on(async {
        let locks = open_locks(&dir.join("baton.db")).await;
        let recorder = Recorder::for_this_process();
        let register = Arc::new(FencedRegister::file("counter", dir.join("register.json")));
        std::fs::write(dir.join(format!("ready-{index}")), "").unwrap();
        process::wait_until_async("the parent's go", CHILD_TIMEOUT, || dir.join("go").exists())
            .await
            .unwrap();
        let report = LockWorkload::new(KEY)
            .contenders(PER_PROCESS, index * PER_PROCESS)
            .rounds(ROUNDS)
            .run(&locks, &recorder, &register)
            .await;
        recorder
            .write_jsonl(history_file(&dir, index))
            .expect("write the history");
        report.assert_no_errors();
        assert_eq!(report.grants, u64::from(PER_PROCESS * ROUNDS), "{report:?}");
    });
}
