//! Semaphores on the SQLite store: the conformance rules on a temporary file, and permits
//! shared by several stores on one file (as several processes would share them).

mod common;

use std::sync::Arc;
use std::time::Duration;

use baton_core::conformance::fresh_namespace;
use baton_core::{LockOptions, Semaphore, SemaphoreStore};
use baton_sqlite::{SqliteOptions, SqliteStore};
use baton_testkit::process::{self, ChildTest};
use baton_testkit::{PermitWorkload, most_permit_holders};

baton_core::semaphore_conformance_tests!(common::harness());

/// Four stores on one file (four processes' worth of connections), three tasks each, two
/// permits: never more than two hold at once across all of them, and waiters in one store
/// take the permits released in another (they look again every `poll_interval`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stores_on_one_file_share_the_permits() {
    let harness = common::harness().await;
    let mut stores: Vec<Arc<dyn SemaphoreStore>> = Vec::new();
    for _ in 0..4 {
        stores.push(Arc::new(
            SqliteStore::open(&harness.opener.path, SqliteOptions::new())
                .await
                .unwrap(),
        ));
    }
    let most = most_permit_holders(stores, &fresh_namespace(), "shared", 2, 3).await;
    assert!(most <= 2, "{most} holders of 2 permits");
}

/// Pruning the key's counter row does not send its fences back: the next permit's fence is
/// above every earlier one.
#[tokio::test]
async fn fences_survive_a_pruned_counter() {
    let harness = common::harness().await;
    let store = Arc::new(
        SqliteStore::open(&harness.opener.path, SqliteOptions::new())
            .await
            .unwrap(),
    );
    let sem = Semaphore::new(store, fresh_namespace(), "f", 1).unwrap();
    let options = LockOptions::new(Duration::from_secs(30));
    let first = sem.try_acquire(&options).await.unwrap().expect("free");
    let fence = first.fence();
    first.release().await;
    let conn = rusqlite::Connection::open(&harness.opener.path).unwrap();
    let deleted = conn
        .execute("DELETE FROM baton_grant WHERE key LIKE '%:semaphore:f'", [])
        .unwrap();
    assert_eq!(deleted, 1, "the key's counter row");
    let next = sem.try_acquire(&options).await.unwrap().expect("free");
    assert!(next.fence() > fence, "{} after {fence}", next.fence());
    next.release().await;
}

/// Four OS processes share two permits of one file: the merged history never has more than
/// two holders believing they hold at once, and no two permits share a fence.
#[test]
fn four_processes_never_hold_more_than_the_permits() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("baton.db").display());
    PermitWorkload::new(2).run_in_processes(
        "permit_contender_process",
        4,
        dir.path(),
        &[("STORE_URL", &url)],
    );
}

#[test]
#[ignore = "a child process of four_processes_never_hold_more_than_the_permits"]
fn permit_contender_process() {
    PermitWorkload::new(2).run_as_child(|| async {
        let url = baton_testkit::process::parent_env("STORE_URL");
        let store: Arc<dyn SemaphoreStore> = Arc::new(SqliteStore::connect(&url).await.unwrap());
        Semaphore::new(store, baton_core::Namespace::default(), "history", 2).unwrap()
    });
}

/// A store on `db` that polls only every 10 s, so a waiter that gets a permit within its
/// seconds of waiting was woken by a release.
async fn slow_polling(db: &std::path::Path) -> Semaphore {
    let store = common::open_with(
        db,
        SqliteOptions::new().poll_interval(Duration::from_secs(10)),
    )
    .await;
    Semaphore::new(Arc::new(store), baton_core::Namespace::default(), "fifo", 1).unwrap()
}

/// Processes take permits in the order they queued. With the only permit held here, three
/// processes queue one after another; this process gives its permit back and asks again at
/// once, and still comes last: each released permit is reserved for the process that waited
/// longest, and only that process's claim takes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processes_take_permits_in_the_order_they_queued() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("baton.db");
    let mine = slow_polling(&db).await;
    let hold = LockOptions::new(Duration::from_secs(60));
    let held = mine.try_acquire(&hold).await.unwrap().expect("free");
    let names = ["one", "two", "three"];
    let mut children = Vec::new();
    for (i, name) in names.iter().enumerate() {
        children.push(
            ChildTest::new("permit_waiter_process", *name)
                .env("DB", &db)
                .spawn()
                .unwrap(),
        );
        common::until_queued(&db, i + 1).await;
    }
    held.release().await;
    let again = mine
        .acquire(&hold.clone().wait(Duration::from_secs(20)))
        .await
        .expect("a permit after the others");
    let fences: Vec<u64> = names
        .iter()
        .map(|name| {
            std::fs::read_to_string(db.with_file_name(format!("{name}.acquired")))
                .expect("every earlier waiter had its permit first")
                .parse()
                .unwrap()
        })
        .collect();
    assert!(
        fences.windows(2).all(|w| w[0] < w[1]),
        "permits follow the order of queueing: {names:?} got fences {fences:?}"
    );
    assert!(
        again.fence().get() > fences[2],
        "the releaser asked again at once and still came last: {} before {fences:?}",
        again.fence()
    );
    again.release().await;
    for mut child in children {
        child.wait_success(Duration::from_secs(20)).unwrap();
    }
}

#[test]
#[ignore = "a child process of processes_take_permits_in_the_order_they_queued"]
fn permit_waiter_process() {
    let Some(name) = process::role() else { return };
    let db = std::path::PathBuf::from(process::parent_env("DB"));
    process::child_runtime().block_on(async {
        let semaphore = slow_polling(&db).await;
        let wait = LockOptions::new(Duration::from_secs(60)).wait(Duration::from_secs(20));
        let permit = semaphore.acquire(&wait).await.expect("its turn");
        std::fs::write(
            db.with_file_name(format!("{name}.acquired")),
            permit.fence().get().to_string(),
        )
        .unwrap();
        permit.release().await;
    });
}
