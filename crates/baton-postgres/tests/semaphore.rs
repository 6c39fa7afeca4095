//! Semaphores on the PostgreSQL store: the conformance rules (on the test binary's shared
//! server, each rule in a namespace of its own), and permits shared by several stores, as
//! several processes would share them.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use baton_core::conformance::{Opens, fresh_namespace};
use baton_core::{LockOptions, Semaphore, SemaphoreStore};

use baton_testkit::PermitWorkload;
use baton_testkit::postgres::PostgresServer;
use common::*;

baton_core::semaphore_conformance_tests!(harness());

/// Three stores (three processes' worth of pools and LISTEN connections), four tasks each,
/// two permits: never more than two hold at once, and a release in one store wakes the
/// waiters of the others (through `baton_released`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stores_share_the_permits() {
    let namespace = fresh_namespace();
    let permits = 2;
    let inside = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..3 {
        let store: Arc<dyn SemaphoreStore> = harness().await.open().await;
        for _ in 0..4 {
            let sem =
                Semaphore::new(Arc::clone(&store), namespace.clone(), "shared", permits).unwrap();
            let (inside, most) = (Arc::clone(&inside), Arc::clone(&most));
            tasks.push(tokio::spawn(async move {
                for _ in 0..3 {
                    let options =
                        LockOptions::new(Duration::from_secs(30)).wait(Duration::from_secs(60));
                    let permit = sem.acquire(&options).await.expect("a permit in time");
                    let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    inside.fetch_sub(1, Ordering::SeqCst);
                    permit.release().await;
                }
            }));
        }
    }
    for task in tasks {
        task.await.unwrap();
    }
    let most = most.load(Ordering::SeqCst);
    assert!(
        most <= permits as usize,
        "{most} holders of {permits} permits"
    );
}

/// Four OS processes, each with its store (and its LISTEN connection), share two permits:
/// the merged history never has more than two holders believing they hold at once, and no
/// two permits share a fence.
#[test]
fn four_processes_never_hold_more_than_the_permits() {
    let dir = tempfile::tempdir().unwrap();
    let url = PostgresServer::shared().url();
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
        // The default namespace: every process must reach the same key (the other tests on
        // the shared server use namespaces of their own).
        let store: Arc<dyn SemaphoreStore> = Arc::new(connect(&url).await);
        Semaphore::new(store, baton_core::Namespace::default(), "history", 2).unwrap()
    });
}
