//! Claimable work reports its degradations: each registered work event is emitted, naming
//! the queue, schedule or migration set it is about.

use std::sync::Arc;
use std::time::Duration;

use baton_core::conformance::fresh_namespace;
use baton_core::telemetry::events;
use baton_core::work::conformance::FaultyWorkStore;
use baton_core::work::store::NewSchedule;
use baton_core::work::{
    Backoff, EnqueueOptions, Failure, MigrationContext, MigrationError, MigrationFn,
    MigrationOutcome, MigrationStore, Migrations, Missed, Queue, QueueOptions, ReturnContended,
    ScheduleStore, Scheduler, Settle, Tick, WorkStore,
};
use baton_core::{Key, KeyKind, Locks, MemoryStore, Namespace};
use baton_testkit::capture::{capture_events, events as captured, wait_for_event};
use tokio_util::sync::CancellationToken;

fn queue(store: Arc<dyn WorkStore>, options: QueueOptions) -> Queue {
    Queue::with_namespace(store, fresh_namespace(), "jobs")
        .unwrap()
        .with_options(options)
        .unwrap()
}

/// The migration set `app` over `store` (its locks in a memory store of their own) with one
/// migration, `001`, that fails with `failure` or else succeeds.
fn one_migration(
    store: Arc<dyn MigrationStore>,
    ns: &Namespace,
    failure: Option<&'static str>,
) -> Migrations {
    let locks = Locks::with_namespace(Arc::new(MemoryStore::new()), ns.clone());
    Migrations::new(store, locks, "app")
        .unwrap()
        .migration(MigrationFn::new(
            "001",
            move |_: MigrationContext| async move {
                match failure {
                    None => Ok(()),
                    Some(why) => Err::<(), MigrationError>(why.into()),
                }
            },
        ))
}

#[tokio::test]
async fn queue_events_name_the_queue() {
    capture_events();
    let q = queue(
        Arc::new(MemoryStore::new()),
        QueueOptions::new()
            .max_attempts(2)
            .backoff(Backoff::fixed(Duration::ZERO))
            .lease(Duration::from_millis(30)),
    );
    let key = q.key().as_str().to_owned();
    q.enqueue(b"p", EnqueueOptions::new()).await.unwrap();
    let first = q.claim(1).await.unwrap().pop().unwrap();
    wait_for_event(&events::WORK_CLAIMED, |c| c.key == key).await;
    assert_eq!(
        first.fail("boom").await.unwrap(),
        Failure::Retrying {
            after: Duration::ZERO
        }
    );
    let failed = wait_for_event(&events::WORK_FAILED, |c| c.key == key).await;
    assert!(failed.message.contains("boom"), "{failed:?}");
    let second = q.claim(1).await.unwrap().pop().unwrap();
    assert_eq!(second.fail("again").await.unwrap(), Failure::DeadLettered);
    let dead = wait_for_event(&events::WORK_DEAD_LETTERED, |c| c.key == key).await;
    assert!(dead.message.contains("again"), "{dead:?}");

    // A zombie's settle is reported as a lost lease.
    q.enqueue(b"q", EnqueueOptions::new()).await.unwrap();
    let zombie = q.claim(1).await.unwrap().pop().unwrap();
    let heir = loop {
        if let Some(item) = q.claim(1).await.unwrap().pop() {
            break item;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert_eq!(zombie.complete().await.unwrap(), Settle::NotOwner);
    wait_for_event(&events::WORK_LEASE_LOST, |c| c.key == key).await;
    assert_eq!(heir.complete().await.unwrap(), Settle::Settled);
    wait_for_event(&events::WORK_COMPLETED, |c| c.key == key).await;
}

#[tokio::test]
async fn store_faults_are_reported() {
    capture_events();
    let faulty = Arc::new(FaultyWorkStore::new(Arc::new(MemoryStore::new())));
    let q = queue(faulty.clone(), QueueOptions::new());
    let key = q.key().as_str().to_owned();
    faulty.set_failing(true);
    assert!(q.claim(1).await.unwrap_err().is_unavailable());
    wait_for_event(&events::WORK_UNAVAILABLE, |c| c.key == key).await;
    assert!(
        q.fan_out([("r-1", b"1".to_vec())])
            .await
            .unwrap_err()
            .is_unavailable()
    );
    let failed = wait_for_event(&events::FANOUT_ENQUEUE_FAILED, |c| c.key == key).await;
    assert!(failed.message.contains("0 of 1 records"), "{failed:?}");

    let ns = fresh_namespace();
    let scheduler = Scheduler::with_namespace(faulty.clone(), ns.clone());
    assert!(
        scheduler
            .register("s", "* * * * *", Missed::Skip, |_: Tick| async {
                Ok::<(), String>(())
            })
            .await
            .unwrap_err()
            .is_unavailable()
    );
    let schedule_key = ns
        .qualify(KeyKind::Schedule, &Key::new("s").unwrap())
        .as_str()
        .to_owned();
    wait_for_event(&events::SCHEDULE_UNAVAILABLE, |c| c.key == schedule_key).await;

    let migrations = one_migration(faulty.clone(), &ns, None).unavailable_retries(1);
    assert!(
        migrations
            .run(ReturnContended)
            .await
            .unwrap_err()
            .is_unavailable()
    );
    let set = migrations.set_key().as_str().to_owned();
    assert!(captured(&events::MIGRATION_UNAVAILABLE, |c| c.key == set).len() >= 2);
}

#[tokio::test]
async fn schedule_and_migration_events() {
    capture_events();
    let store = Arc::new(MemoryStore::new());
    let ns = fresh_namespace();
    let key = ns.qualify(KeyKind::Schedule, &Key::new("minutely").unwrap());
    let now = store.now_ms().await.unwrap();
    store
        .register_schedule(NewSchedule::new(
            &key,
            "* * * * *",
            now - now.rem_euclid(60_000) - 180_000,
        ))
        .await
        .unwrap();
    let scheduler = Scheduler::with_namespace(store.clone(), ns.clone());
    scheduler
        .register(
            "minutely",
            "* * * * *",
            Missed::CatchUpOnce,
            |_: Tick| async { Err::<(), String>("the report failed".into()) },
        )
        .await
        .unwrap();
    let shutdown = CancellationToken::new();
    let running = tokio::spawn({
        let (scheduler, shutdown) = (scheduler.clone(), shutdown.clone());
        async move { scheduler.run(shutdown).await }
    });
    let missed = wait_for_event(&events::SCHEDULE_MISSED, |c| c.key == key.as_str()).await;
    assert!(missed.message.contains("CatchUpOnce"), "{missed:?}");
    let failed = wait_for_event(&events::SCHEDULE_FAILED, |c| c.key == key.as_str()).await;
    assert!(failed.message.contains("the report failed"), "{failed:?}");
    shutdown.cancel();
    let report = running.await.unwrap().unwrap();
    assert_eq!((report.ran, report.failed), (1, 1), "{report:?}");

    let migrations = one_migration(store.clone(), &ns, Some("no such table"));
    let report = migrations.run(ReturnContended).await.unwrap();
    assert!(matches!(report.outcome, MigrationOutcome::Failed(_)));
    let set = migrations.set_key().as_str().to_owned();
    let failed = wait_for_event(&events::MIGRATION_FAILED, |c| c.key == set).await;
    assert!(failed.message.contains("no such table"), "{failed:?}");
}
