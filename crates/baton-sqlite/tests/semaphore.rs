//! Semaphores on the SQLite store: the conformance rules on a temporary file, and permits
//! shared by several stores on one file (as several processes would share them).

mod common;

use std::sync::Arc;
use std::time::Duration;

use baton_core::conformance::fresh_namespace;
use baton_core::{LockOptions, Semaphore, SemaphoreStore};
use baton_sqlite::{SqliteOptions, SqliteStore};
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
