//! Multi-replica scenarios through the policy layer: four schedulers over eight ticks,
//! three workers over a fan-out of 10,000 records scanned twice, and the migration
//! coordinator (order, failure, a runner killed in the middle of `up()`, loser policies).
//!
//! Each replica opens its own store ([`WorkHarness::open`]). The migration scenarios take
//! their orchestration lock from an in-memory lock store shared by the replicas of the
//! rule: the lock only saves duplicate work, and what the rules check — one writer per
//! migration, takeover after a lapsed lease, a zombie's finish refused — is the store's
//! record compare-and-set.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::{sleep, timeout};
use tokio_util::sync::CancellationToken;

use crate::conformance::{eventually, fresh_namespace, ms};
use crate::error::ErrorKind;
use crate::holder::Holder;
use crate::key::Namespace;
use crate::{Locks, MemoryStore};

use super::super::store::{MigrationEnd, MigrationState, Settle, WorkStore, Writer};
use super::super::{
    Job, MigrationContext, MigrationError, MigrationFn, MigrationOutcome, Migrations, Missed,
    ReturnContended, Scheduler, Tick, WaitForConvergence, Worker,
};
use super::policy::queue;
use super::{PATIENCE, WorkHarness, migration_key, record, schedule_key};

/// Four schedulers (four replicas, each on its own store) register one per-second schedule
/// and run for at least eight ticks: every tick runs exactly once — no tick twice, and
/// every tick between the first and the last either ran or was reported missed by the run
/// after it.
pub async fn four_schedulers_run_every_tick_exactly_once(h: &WorkHarness) {
    let ns = fresh_namespace();
    let ticks = Arc::new(Mutex::new(Vec::<(usize, Tick)>::new()));
    let shutdown = CancellationToken::new();
    let mut replicas = Vec::new();
    for replica in 0..4 {
        let scheduler = Scheduler::with_namespace(h.open().await, ns.clone())
            .with_holder(Holder::new(format!("replica-{replica}")).unwrap());
        let ticks = Arc::clone(&ticks);
        scheduler
            .register(
                "every-second",
                "* * * * * *",
                Missed::CatchUpOnce,
                move |tick: Tick| {
                    let ticks = Arc::clone(&ticks);
                    async move {
                        ticks.lock().unwrap().push((replica, tick));
                        Ok::<(), String>(())
                    }
                },
            )
            .await
            .unwrap();
        let shutdown = shutdown.clone();
        replicas.push(tokio::spawn(async move { scheduler.run(shutdown).await }));
    }
    eventually(2 * PATIENCE, "eight ticks", || {
        let ticks = &ticks;
        async move { ticks.lock().unwrap().len() >= 8 }
    })
    .await;
    shutdown.cancel();
    let mut ran = 0;
    for replica in replicas {
        let report = replica
            .await
            .expect("scheduler task")
            .expect("scheduler run");
        assert_eq!(report.failed, 0, "{report:?}");
        ran += report.ran;
    }
    let ticks = ticks.lock().unwrap().clone();
    assert_eq!(ran, ticks.len() as u64, "every claimed tick ran once");
    let mut dues: Vec<(i64, u64)> = ticks
        .iter()
        .map(|(_, t)| (t.due_ms(), t.missed()))
        .collect();
    dues.sort_unstable();
    for pair in dues.windows(2) {
        let ((a, _), (b, missed)) = (pair[0], pair[1]);
        assert_ne!(a, b, "the tick due at {a} ran twice: {ticks:?}");
        assert_eq!(
            (b - a) / 1000 - 1,
            missed as i64,
            "the ticks between {a} and {b} neither ran nor were reported missed"
        );
    }
    assert!(dues.iter().all(|(due, _)| due.rem_euclid(1000) == 0));
    let store = h.open().await;
    let row = store
        .schedule(&schedule_key(&ns, "every-second"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(row.runs, ticks.len() as u64);
}

/// The cron-tickle fan-out: two replicas enqueue the same scan of 10,000 records at once (a
/// tick that ran twice) while three workers on three replicas process the queue; every
/// record is enqueued once and processed exactly once, and a later scan adds nothing.
pub async fn fan_out_to_three_replicas_processes_each_record_once(h: &WorkHarness) {
    const RECORDS: usize = 10_000;
    let ns = fresh_namespace();
    let processed = Arc::new(Mutex::new(HashMap::<Vec<u8>, u32>::new()));
    let shutdown = CancellationToken::new();
    let mut workers = Vec::new();
    for _ in 0..3 {
        let q = queue(h.open().await, &ns, "records");
        let processed = Arc::clone(&processed);
        workers.push(tokio::spawn(
            Worker::new(q)
                .concurrency(8)
                .batch(32)
                .poll(ms(5), ms(50))
                .shutdown(shutdown.clone())
                .run(move |job: Job| {
                    let processed = Arc::clone(&processed);
                    async move {
                        *processed
                            .lock()
                            .unwrap()
                            .entry(job.payload().to_vec())
                            .or_default() += 1;
                        Ok::<(), String>(())
                    }
                }),
        ));
    }
    let records: Vec<(String, Vec<u8>)> = (0..RECORDS)
        .map(|i| (format!("record-{i}"), format!("record-{i}").into_bytes()))
        .collect();
    let (scan_a, scan_b) = (
        queue(h.open().await, &ns, "records"),
        queue(h.open().await, &ns, "records"),
    );
    let (a, b) = tokio::join!(
        scan_a.fan_out(records.clone()),
        scan_b.fan_out(records.clone())
    );
    let (a, b) = (a.expect("fan-out a"), b.expect("fan-out b"));
    assert_eq!(a.added + b.added, RECORDS as u64, "{a:?} {b:?}");
    assert_eq!(a.duplicates + b.duplicates, RECORDS as u64, "{a:?} {b:?}");
    let limit = Duration::from_secs(600);
    eventually(limit, "every record processed", || {
        let processed = &processed;
        async move { processed.lock().unwrap().len() == RECORDS }
    })
    .await;
    let later = scan_a.fan_out(records).await.unwrap();
    assert_eq!((later.added, later.duplicates), (0, RECORDS as u64));
    eventually(limit, "the queue drained", || {
        let q = &scan_b;
        async move {
            let s = q.stats().await.unwrap();
            s.ready + s.running + s.expired + s.scheduled == 0
        }
    })
    .await;
    shutdown.cancel();
    let (mut completed, mut claimed) = (0, 0);
    for worker in workers {
        let report = worker.await.expect("worker task").expect("worker run");
        assert_eq!((report.lease_lost, report.retried), (0, 0), "{report:?}");
        completed += report.completed;
        claimed += report.claimed;
    }
    assert_eq!((completed, claimed), (RECORDS as u64, RECORDS as u64));
    let processed = processed.lock().unwrap();
    let twice: Vec<_> = processed.iter().filter(|(_, n)| **n != 1).collect();
    assert!(twice.is_empty(), "processed more than once: {twice:?}");
}

fn counted(name: &str, calls: &Arc<Mutex<Vec<String>>>) -> MigrationFn {
    let calls = Arc::clone(calls);
    let label = name.to_owned();
    MigrationFn::new(name, move |_: MigrationContext| {
        let (calls, label) = (Arc::clone(&calls), label.clone());
        async move {
            calls.lock().unwrap().push(label);
            Ok::<(), MigrationError>(())
        }
    })
}

fn coordinator(
    store: Arc<dyn WorkStore>,
    locks: &Arc<MemoryStore>,
    ns: &Namespace,
    set: &str,
) -> Migrations {
    Migrations::new(store, Locks::with_namespace(locks.clone(), ns.clone()), set)
        .expect("valid set")
        .poll(ms(20))
        .lock_ttl(Duration::from_secs(2))
}

fn wait() -> WaitForConvergence {
    WaitForConvergence {
        timeout: 2 * PATIENCE,
    }
}

/// Two coordinators boot at once: every migration runs exactly once, in order; one of them
/// ran them, the other waited; a later run finds them all completed.
pub async fn migrations_run_once_in_order(h: &WorkHarness) {
    let ns = fresh_namespace();
    let locks = Arc::new(MemoryStore::new());
    let calls = Arc::new(Mutex::new(Vec::new()));
    let build = |store| {
        coordinator(store, &locks, &ns, "app")
            .migration(counted("001", &calls))
            .migration(counted("002", &calls))
            .migration(counted("003", &calls))
    };
    let (a, b) = (build(h.open().await), build(h.open().await));
    let (ra, rb) = tokio::join!(a.run(wait()), b.run(wait()));
    let (ra, rb) = (ra.unwrap(), rb.unwrap());
    assert_eq!(
        (&ra.outcome, &rb.outcome),
        (&MigrationOutcome::Completed, &MigrationOutcome::Completed)
    );
    assert_eq!(
        *calls.lock().unwrap(),
        ["001", "002", "003"],
        "each once, in order"
    );
    let mut ran = ra.ran.clone();
    ran.extend(rb.ran.clone());
    assert_eq!(ran, ["001", "002", "003"], "{ra:?} {rb:?}");
    assert!(ra.took_over.is_empty() && rb.took_over.is_empty());
    let records = a.records().await.unwrap();
    assert!(
        records
            .iter()
            .all(|r| r.state == MigrationState::Completed && r.attempt == 1)
    );
    let again = build(h.open().await).run(ReturnContended).await.unwrap();
    assert_eq!(again.outcome, MigrationOutcome::Completed);
    assert!(again.ran.is_empty());
    assert_eq!(again.skipped, ["001", "002", "003"]);
    assert_eq!(calls.lock().unwrap().len(), 3);
}

fn failing(name: &str, down: Option<bool>, downs: &Arc<AtomicUsize>) -> MigrationFn {
    let m = MigrationFn::new(name, |_: MigrationContext| async {
        Err::<(), MigrationError>("boom".into())
    });
    match down {
        None => m,
        Some(ok) => {
            let downs = Arc::clone(downs);
            m.down(move |ctx: MigrationContext| {
                let downs = Arc::clone(&downs);
                async move {
                    assert!(!ctx.is_lost());
                    downs.fetch_add(1, Ordering::SeqCst);
                    if ok {
                        Ok(())
                    } else {
                        Err("cannot undo".into())
                    }
                }
            })
        }
    }
}

/// A failed `up()` runs `down()` and records `rolled_back` (or `failed` when `down()` fails
/// or is missing); the walk stops there; the next run retries it; a waiting loser reports
/// the failure without running anything.
pub async fn migration_failure_rolls_back_and_stops_the_walk(h: &WorkHarness) {
    let ns = fresh_namespace();
    let locks = Arc::new(MemoryStore::new());
    let calls = Arc::new(Mutex::new(Vec::new()));
    let downs = Arc::new(AtomicUsize::new(0));
    let store = h.open().await;
    let set = migration_key(&ns, "app");
    let report = coordinator(store.clone(), &locks, &ns, "app")
        .migration(counted("001", &calls))
        .migration(failing("002", Some(true), &downs))
        .migration(counted("003", &calls))
        .run(wait())
        .await
        .unwrap();
    let MigrationOutcome::Failed(failure) = &report.outcome else {
        panic!("expected a failure: {report:?}");
    };
    assert_eq!(
        (failure.name.as_str(), failure.state, failure.error.as_str()),
        ("002", MigrationState::RolledBack, "up: boom")
    );
    assert_eq!(report.ran, ["001"]);
    assert_eq!(downs.load(Ordering::SeqCst), 1);
    let records = store.migrations(&set).await.unwrap();
    assert_eq!(
        records
            .iter()
            .map(|r| (r.name.as_str(), r.state))
            .collect::<Vec<_>>(),
        [
            ("001", MigrationState::Completed),
            ("002", MigrationState::RolledBack)
        ],
        "003 never ran"
    );
    assert_eq!(records[1].error, "up: boom");

    // Fixed, the next run retries it and goes on.
    let retry = coordinator(h.open().await, &locks, &ns, "app")
        .migration(counted("001", &calls))
        .migration(counted("002", &calls))
        .migration(counted("003", &calls))
        .run(wait())
        .await
        .unwrap();
    assert_eq!(retry.outcome, MigrationOutcome::Completed);
    assert_eq!(
        (retry.skipped.clone(), retry.ran.clone()),
        (
            vec!["001".to_owned()],
            vec!["002".to_owned(), "003".to_owned()]
        )
    );
    assert_eq!(record(&*store, &set, "002").await.attempt, 2);
    assert_eq!(*calls.lock().unwrap(), ["001", "002", "003"]);

    for (set, down, needle) in [
        ("no-down", None, "up: boom"),
        ("down-fails", Some(false), "up: boom; down: cannot undo"),
    ] {
        let report = coordinator(h.open().await, &locks, &ns, set)
            .migration(failing("001", down, &downs))
            .run(ReturnContended)
            .await
            .unwrap();
        match report.outcome {
            MigrationOutcome::Failed(f) => {
                assert_eq!(
                    (f.state, f.error.as_str()),
                    (MigrationState::Failed, needle)
                );
            }
            other => panic!("{set}: {other:?}"),
        }
        let r = record(&*store, &migration_key(&ns, set), "001").await;
        assert_eq!(r.state, MigrationState::Failed);
    }

    // A loser waiting for convergence reports the winner's failure and runs nothing.
    let gate = CancellationToken::new();
    let entered = CancellationToken::new();
    let winner =
        coordinator(h.open().await, &locks, &ns, "gated").migration(MigrationFn::new("001", {
            let (gate, entered) = (gate.clone(), entered.clone());
            move |_: MigrationContext| {
                let (gate, entered) = (gate.clone(), entered.clone());
                async move {
                    entered.cancel();
                    gate.cancelled().await;
                    Err::<(), MigrationError>("broken".into())
                }
            }
        }));
    let winner = tokio::spawn(async move { winner.run(wait()).await });
    timeout(PATIENCE, entered.cancelled())
        .await
        .expect("the winner runs 001");
    let loser_calls = Arc::new(Mutex::new(Vec::new()));
    let loser =
        coordinator(h.open().await, &locks, &ns, "gated").migration(counted("001", &loser_calls));
    let loser = tokio::spawn(async move { loser.run(wait()).await });
    sleep(ms(100)).await;
    gate.cancel();
    let (w, l) = (
        winner.await.unwrap().unwrap(),
        loser.await.unwrap().unwrap(),
    );
    assert!(
        matches!(&w.outcome, MigrationOutcome::Failed(f) if f.name == "001"),
        "{w:?}"
    );
    assert!(l.waited, "{l:?}");
    assert!(
        matches!(&l.outcome, MigrationOutcome::Failed(f) if f.name == "001" && f.error == "up: broken"),
        "{l:?}"
    );
    assert!(loser_calls.lock().unwrap().is_empty());
}

/// A runner killed in the middle of `up()` (its task aborted, so its heartbeat stops)
/// leaves the migration pending; a second coordinator takes it over once the lease lapses
/// and completes the set; the killed writer's late finish is refused (`NotOwner`).
pub async fn migration_runner_killed_mid_up_is_taken_over(h: &WorkHarness) {
    let ns = fresh_namespace();
    let locks = Arc::new(MemoryStore::new());
    let calls = Arc::new(Mutex::new(Vec::new()));
    let entered = CancellationToken::new();
    let second_calls = Arc::new(AtomicUsize::new(0));
    let build = |store| {
        let (entered, second_calls) = (entered.clone(), second_calls.clone());
        coordinator(store, &locks, &ns, "app")
            .lease(Duration::from_secs(1))
            .lock_ttl(ms(600))
            .migration(counted("001", &calls))
            .migration(MigrationFn::new("002", move |ctx: MigrationContext| {
                let (entered, second_calls) = (entered.clone(), second_calls.clone());
                async move {
                    if second_calls.fetch_add(1, Ordering::SeqCst) == 0 {
                        assert!(!ctx.is_takeover());
                        entered.cancel();
                        std::future::pending::<()>().await;
                    }
                    assert!(ctx.is_takeover(), "the second run knows it takes over");
                    assert_eq!(ctx.attempt(), 2);
                    Ok::<(), MigrationError>(())
                }
            }))
            .migration(counted("003", &calls))
    };
    let store = h.open().await;
    let set = migration_key(&ns, "app");
    let first = build(h.open().await);
    let killed = tokio::spawn(async move { first.run(wait()).await });
    timeout(PATIENCE, entered.cancelled())
        .await
        .expect("the first runner enters up() of 002");
    // While up() runs, the heartbeat keeps the record pending and its lease alive.
    sleep(Duration::from_millis(2_500)).await;
    let pending = record(&*store, &set, "002").await;
    assert_eq!(pending.state, MigrationState::Pending);
    assert!(
        pending.lease_remaining > Duration::ZERO,
        "the heartbeat renews the lease"
    );
    let zombie = pending.claimed_by.clone();

    killed.abort();
    assert!(killed.await.unwrap_err().is_cancelled());
    let report = timeout(2 * PATIENCE, build(h.open().await).run(wait()))
        .await
        .expect("the second coordinator finishes")
        .unwrap();
    assert_eq!(report.outcome, MigrationOutcome::Completed, "{report:?}");
    assert_eq!(report.skipped, ["001"]);
    assert_eq!(report.ran, ["002", "003"]);
    assert_eq!(report.took_over, ["002"]);
    assert_eq!(second_calls.load(Ordering::SeqCst), 2);
    assert_eq!(*calls.lock().unwrap(), ["001", "003"]);

    // The killed writer, resumed, cannot record anything.
    assert_eq!(
        store
            .finish_migration(
                Writer::new(&set, "002", &zombie),
                MigrationEnd::Failed("late")
            )
            .await
            .unwrap(),
        Settle::NotOwner
    );
    let done = record(&*store, &set, "002").await;
    assert_eq!((done.state, done.attempt), (MigrationState::Completed, 2));
    assert_ne!(done.claimed_by, zombie);
}

/// While another replica migrates: `ReturnContended` answers at once with the lock's
/// holder; `WaitForConvergence` gives up with `Timeout` after its timeout, or — given
/// enough — returns `Completed` once the other replica is done, having run nothing.
pub async fn migration_loser_policies(h: &WorkHarness) {
    let ns = fresh_namespace();
    let locks = Arc::new(MemoryStore::new());
    let gate = CancellationToken::new();
    let entered = CancellationToken::new();
    let winner_calls = Arc::new(Mutex::new(Vec::new()));
    let winner = coordinator(h.open().await, &locks, &ns, "app")
        .migration(MigrationFn::new("001", {
            let (gate, entered) = (gate.clone(), entered.clone());
            move |_: MigrationContext| {
                let (gate, entered) = (gate.clone(), entered.clone());
                async move {
                    entered.cancel();
                    gate.cancelled().await;
                    Ok::<(), MigrationError>(())
                }
            }
        }))
        .migration(counted("002", &winner_calls));
    let winner = tokio::spawn(async move { winner.run(wait()).await });
    timeout(PATIENCE, entered.cancelled())
        .await
        .expect("the winner runs 001");

    let loser_calls = Arc::new(Mutex::new(Vec::new()));
    let loser_store = h.open().await;
    let loser = || {
        coordinator(Arc::clone(&loser_store), &locks, &ns, "app")
            .migration(counted("001", &loser_calls))
            .migration(counted("002", &loser_calls))
    };
    let contended = loser().run(ReturnContended).await.unwrap();
    match &contended.outcome {
        MigrationOutcome::Contended(c) => {
            assert!(c.holder.is_some(), "{c:?}");
            assert!(c.remaining.is_some_and(|r| r > Duration::ZERO), "{c:?}");
        }
        other => panic!("expected Contended, got {other:?}"),
    }
    assert!(contended.ran.is_empty() && !contended.waited);

    let e = loser()
        .run(WaitForConvergence { timeout: ms(300) })
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");

    let waiting = loser();
    let waiter = tokio::spawn(async move { waiting.run(wait()).await });
    sleep(ms(100)).await;
    gate.cancel();
    let won = winner.await.unwrap().unwrap();
    assert_eq!(won.outcome, MigrationOutcome::Completed);
    assert_eq!(won.ran, ["001", "002"]);
    assert!(!won.waited);
    let waited = waiter.await.unwrap().unwrap();
    assert_eq!(waited.outcome, MigrationOutcome::Completed, "{waited:?}");
    assert!(waited.waited && waited.ran.is_empty(), "{waited:?}");
    assert_eq!(waited.skipped, ["001", "002"]);
    assert!(loser_calls.lock().unwrap().is_empty(), "losers ran nothing");
}
