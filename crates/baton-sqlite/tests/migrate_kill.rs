//! The boot-migration coordinator (`baton_core::work::Migrations`) on one SQLite file, its
//! runner killed with SIGKILL in the middle of a migration: a real OS process, not an
//! aborted task (the in-process version is the conformance rule
//! `migration_runner_killed_mid_up_is_taken_over`).
//!
//! The child process is this test binary run again with a role (see
//! `baton_testkit::process`); its test is `#[ignore]`d in ordinary runs.

use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use baton_core::Locks;
use baton_core::work::store::{MigrationEnd, Writer};
use baton_core::work::{
    MigrationContext, MigrationError, MigrationFn, MigrationOutcome, MigrationRecord,
    MigrationState, MigrationStore, Migrations, ReturnContended, Settle, WaitForConvergence,
};
use baton_sqlite::{SqliteOptions, SqliteStore};
use baton_testkit::process::{self, ChildTest};
use baton_testkit::process::{child_runtime, parent_env};

const SET: &str = "app";
/// The record lease and the orchestration lock's TTL, of the child and of the parent.
const LEASE: Duration = Duration::from_secs(1);
const LOCK_TTL: Duration = Duration::from_secs(1);
/// Generous: the children are debug builds on a loaded two-core machine.
const CHILD_TIMEOUT: Duration = Duration::from_secs(300);
const CONVERGENCE: Duration = Duration::from_secs(30);

async fn open(path: &Path) -> Arc<SqliteStore> {
    Arc::new(
        SqliteStore::open(path, SqliteOptions::new())
            .await
            .expect("open the store"),
    )
}

/// A coordinator of `SET` over a fresh open of `db`, its locks and records in one store.
async fn coordinator(db: &Path) -> Migrations {
    let store = open(db).await;
    Migrations::new(store.clone(), Locks::new(store), SET)
        .unwrap()
        .lease(LEASE)
        .lock_ttl(LOCK_TTL)
}

/// Appends `line` to the calls file shared by both processes: every `up()` run, in order.
fn log_call(calls: &Path, line: &str) {
    let mut file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(calls)
        .unwrap();
    writeln!(file, "{line}").unwrap();
}

fn read_calls(calls: &Path) -> Vec<String> {
    std::fs::read_to_string(calls)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// A migration that only logs its run to the calls file.
fn logged(name: &'static str, who: &'static str, calls: &Path) -> MigrationFn {
    let calls = calls.to_owned();
    MigrationFn::new(name, move |_: MigrationContext| {
        log_call(&calls, &format!("{who} {name}"));
        async { Ok::<(), MigrationError>(()) }
    })
}

fn record<'a>(records: &'a [MigrationRecord], name: &str) -> &'a MigrationRecord {
    records
        .iter()
        .find(|r| r.name == name)
        .unwrap_or_else(|| panic!("no record of {name}: {records:?}"))
}

/// What the parent's `m2` saw when it ran.
#[derive(Debug, Clone)]
struct SecondRun {
    attempt: u32,
    previous: Option<MigrationState>,
    takeover: bool,
    started: Instant,
}

/// A child runs `m1` and enters `m2`, which never returns; SIGKILLed there, it leaves `m1`
/// completed and `m2` pending under its writer. While it lives, a `ReturnContended` run
/// answers "contended" with its lock holder. A coordinator of the parent then waits out the
/// lock's TTL, takes `m2` over once its lease lapsed (attempt 2), runs the new `m3`, and
/// reports the set completed; `m1` ran once in all; the dead writer can record nothing.
#[test]
fn a_runner_killed_mid_migration_is_taken_over_by_the_next_process() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("baton.db");
    let marker = dir.path().join("m2-started");
    let calls = dir.path().join("calls");
    let mut child = ChildTest::new("migration_runner", "runner")
        .env("MIG_DB", &db)
        .env("MIG_MARKER", &marker)
        .env("MIG_CALLS", &calls)
        .spawn()
        .unwrap();
    if let Err(e) = process::wait_for_file(&marker, CHILD_TIMEOUT) {
        panic!("{e}; the child's output:\n{}", child.output());
    }
    // The writer that claimed m2, as the child read it from inside up().
    let child_writer = std::fs::read_to_string(&marker).unwrap();
    assert!(!child_writer.is_empty());
    let rt = child_runtime();

    // While the child lives (in m2's up(), its lock kept alive), an admin-style run of a
    // second coordinator answers at once that another replica is migrating.
    let (contended, lock_holder) = rt.block_on(async {
        let admin = coordinator(&db)
            .await
            .migration(logged("m1", "admin", &calls))
            .migration(logged("m2", "admin", &calls));
        // Bounded: if the child's lock were lost, this run would walk and wait on m2.
        let report = tokio::time::timeout(Duration::from_secs(60), admin.run(ReturnContended))
            .await
            .expect("a ReturnContended run answers without waiting")
            .unwrap();
        let holder = Locks::new(open(&db).await)
            .inspect(&admin.lock_key())
            .await
            .unwrap()
            .expect("the live child holds the orchestration lock");
        (report, holder)
    });
    match &contended.outcome {
        MigrationOutcome::Contended(c) => {
            assert_eq!(
                c.holder.as_deref(),
                Some(lock_holder.holder.as_str()),
                "{c:?}"
            );
            assert!(c.remaining.is_some_and(|r| r > Duration::ZERO), "{c:?}");
        }
        other => panic!("expected Contended, got {other:?}"),
    }
    assert!(
        contended.ran.is_empty() && contended.skipped.is_empty() && !contended.waited,
        "{contended:?}"
    );

    // SIGKILL, mid-m2.
    let status = child.kill().unwrap();
    assert_eq!(status.signal(), Some(9), "killed by SIGKILL: {status:?}");
    assert!(
        !child.output().contains("the child returned"),
        "the child never leaves m2:\n{}",
        child.output()
    );

    let (before, lock_free_after, lease_free_after, lock_after_kill) = rt.block_on(async {
        let observer = coordinator(&db).await;
        let locks = Locks::new(open(&db).await);
        let asked = Instant::now();
        let lock = locks.inspect(&observer.lock_key()).await.unwrap();
        // The store's expiry is at least `asked` + the remaining time it reported (one
        // CLOCK_MONOTONIC for the store, the processes and `Instant`).
        let lock_free_after = asked + lock.as_ref().map_or(Duration::ZERO, |l| l.remaining);
        let asked = Instant::now();
        let records = observer.records().await.unwrap();
        let lease_free_after = asked + record(&records, "m2").lease_remaining;
        (records, lock_free_after, lease_free_after, lock)
    });
    let m1 = record(&before, "m1");
    assert_eq!(
        (m1.state, m1.attempt),
        (MigrationState::Completed, 1),
        "{before:?}"
    );
    let m2 = record(&before, "m2");
    assert_eq!(
        (m2.state, m2.attempt),
        (MigrationState::Pending, 1),
        "{before:?}"
    );
    assert_eq!(
        m2.claimed_by.as_str(),
        child_writer,
        "m2 is claimed by the dead child's writer"
    );
    assert!(m2.lease_remaining <= LEASE, "{m2:?}");
    assert_eq!(before.len(), 2, "the child knew no m3: {before:?}");
    assert_eq!(read_calls(&calls), ["child m1", "child m2"]);
    let zombie = m2.claimed_by.clone();

    // The next boot: m2 now completes, and m3 is new.
    let second: Arc<Mutex<Vec<SecondRun>>> = Arc::default();
    let (report, after, late) = rt.block_on(async {
        let seen = Arc::clone(&second);
        let m2_calls = calls.clone();
        let boot = coordinator(&db)
            .await
            .migration(logged("m1", "parent", &calls))
            .migration(MigrationFn::new("m2", move |ctx: MigrationContext| {
                seen.lock().unwrap().push(SecondRun {
                    attempt: ctx.attempt(),
                    previous: ctx.previous(),
                    takeover: ctx.is_takeover(),
                    started: Instant::now(),
                });
                log_call(&m2_calls, "parent m2");
                async { Ok::<(), MigrationError>(()) }
            }))
            .migration(logged("m3", "parent", &calls));
        let report = boot
            .run(WaitForConvergence {
                timeout: CONVERGENCE,
            })
            .await
            .unwrap();
        let after = boot.records().await.unwrap();
        // The dead writer, were it resumed, could record nothing.
        let store = open(&db).await;
        let late = store
            .finish_migration(
                Writer::new(boot.set_key(), "m2", &zombie),
                MigrationEnd::Failed("late"),
            )
            .await
            .unwrap();
        (report, after, late)
    });
    println!(
        "lock after the kill: {lock_after_kill:?}; the next boot waited for it: {}",
        report.waited
    );

    assert_eq!(report.outcome, MigrationOutcome::Completed, "{report:?}");
    assert_eq!(report.skipped, ["m1"], "{report:?}");
    assert_eq!(report.ran, ["m2", "m3"], "{report:?}");
    assert_eq!(report.took_over, ["m2"], "{report:?}");
    assert_eq!(
        read_calls(&calls),
        ["child m1", "child m2", "parent m2", "parent m3"],
        "m1 ran once in all; m2 once in each process; m3 once"
    );

    let runs = second.lock().unwrap().clone();
    assert_eq!(runs.len(), 1, "{runs:?}");
    let run = &runs[0];
    assert_eq!(
        (run.attempt, run.previous, run.takeover),
        (2, Some(MigrationState::Pending), true),
        "the second run takes over a pending record: {run:?}"
    );
    assert!(
        run.started >= lock_free_after,
        "the next boot walked before the dead child's lock expired"
    );
    assert!(
        run.started >= lease_free_after,
        "m2 was taken over before the dead child's lease lapsed"
    );

    assert_eq!(late, Settle::NotOwner, "the dead writer's late finish");
    assert_eq!(after.len(), 3, "{after:?}");
    let m1 = record(&after, "m1");
    assert_eq!((m1.state, m1.attempt), (MigrationState::Completed, 1));
    let m2 = record(&after, "m2");
    assert_eq!((m2.state, m2.attempt), (MigrationState::Completed, 2));
    assert_ne!(m2.claimed_by, zombie, "the taker's writer recorded m2");
    assert!(m2.error.is_empty(), "{m2:?}");
    let m3 = record(&after, "m3");
    assert_eq!((m3.state, m3.attempt), (MigrationState::Completed, 1));
    assert_eq!(m3.claimed_by, m2.claimed_by, "one walk ran m2 and m3");
}

#[test]
#[ignore = "a child process of a_runner_killed_mid_migration_is_taken_over_by_the_next_process"]
fn migration_runner() {
    let Some(_role) = process::role() else { return };
    let db = parent_env("MIG_DB");
    let marker = parent_env("MIG_MARKER");
    let calls = parent_env("MIG_CALLS");
    child_runtime().block_on(async {
        let coordinator = coordinator(Path::new(&db)).await;
        let set = coordinator.set_key().clone();
        let observer = open(Path::new(&db)).await;
        let m2_calls = calls.clone();
        let report = coordinator
            .migration(logged("m1", "child", Path::new(&calls)))
            .migration(MigrationFn::new("m2", move |ctx: MigrationContext| {
                let (observer, set) = (Arc::clone(&observer), set.clone());
                let (marker, calls) = (marker.clone(), m2_calls.clone());
                async move {
                    assert_eq!((ctx.attempt(), ctx.previous()), (1, None));
                    log_call(Path::new(&calls), "child m2");
                    // Tell the parent which writer claimed m2, written whole (renamed in).
                    let records = observer.migrations(&set).await?;
                    let writer = record(&records, "m2").claimed_by.as_str().to_owned();
                    let partial = format!("{marker}.partial");
                    std::fs::write(&partial, writer)?;
                    std::fs::rename(&partial, &marker)?;
                    // "m2 started": killed here.
                    std::future::pending::<()>().await;
                    Ok::<(), MigrationError>(())
                }
            }))
            .run(WaitForConvergence {
                timeout: CHILD_TIMEOUT,
            })
            .await;
        println!("the child returned: {report:?}");
    });
}
