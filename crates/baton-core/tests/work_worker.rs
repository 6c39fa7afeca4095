//! A worker's handler can give its item back: [`Job::release_on_return`] releases the item
//! as soon as the handler returns, instead of when the shutdown grace ends.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use baton_core::MemoryStore;
use baton_core::conformance::fresh_namespace;
use baton_core::work::{EnqueueOptions, Job, Queue, QueueOptions, Worker};
use tokio::sync::mpsc;
use tokio::time::{sleep, timeout};
use tokio_util::sync::CancellationToken;

/// Far longer than any test may take: an item released only when the grace ends fails here.
const GRACE: Duration = Duration::from_secs(600);
/// How long a test waits for something that must happen (a loaded machine included).
const PATIENCE: Duration = Duration::from_secs(20);

fn queue() -> Queue {
    Queue::with_namespace(Arc::new(MemoryStore::new()), fresh_namespace(), "jobs").unwrap()
}

/// Three handlers run when the worker shuts down. Two stop their work (here: 100 ms of
/// cleanup, as a child process takes to exit) and give their items back, one answering
/// `Ok`, one `Err`; the third ignores the shutdown. Both given-back items are claimable
/// again, the attempt not counted, while the third still holds the worker in its grace.
#[tokio::test]
async fn items_given_back_at_shutdown_are_released_when_their_handlers_return() {
    let q = queue();
    for payload in ["ok", "err", "stuck"] {
        q.enqueue(payload, EnqueueOptions::new()).await.unwrap();
    }
    let shutdown = CancellationToken::new();
    let (started, mut started_rx) = mpsc::unbounded_channel();
    let worker = tokio::spawn({
        let (q, shutdown) = (q.clone(), shutdown.clone());
        Worker::new(q)
            .concurrency(3)
            .poll(Duration::from_millis(5), Duration::from_millis(20))
            .grace(GRACE)
            .shutdown(shutdown.clone())
            .run(move |job: Job| {
                let (shutdown, started) = (shutdown.clone(), started.clone());
                async move {
                    let _ = started.send(());
                    let payload = job.payload().to_vec();
                    if payload == b"stuck" {
                        std::future::pending::<()>().await;
                    }
                    shutdown.cancelled().await;
                    sleep(Duration::from_millis(100)).await;
                    job.release_on_return();
                    if payload == b"err" {
                        return Err("cut short".to_owned());
                    }
                    Ok(())
                }
            })
    });
    for _ in 0..3 {
        timeout(PATIENCE, started_rx.recv())
            .await
            .expect("three handlers starting")
            .unwrap();
    }
    shutdown.cancel();

    // Released one by one as their handlers return, not when the grace (10 minutes) ends.
    let other = q.clone();
    let mut again = timeout(PATIENCE, async move {
        let mut again = Vec::new();
        while again.len() < 2 {
            again.extend(other.claim(2).await.unwrap());
            sleep(Duration::from_millis(10)).await;
        }
        again
    })
    .await
    .expect("the given-back items to be claimable again long before the grace ends");
    again.sort_by_key(|item| item.payload().to_vec());
    assert_eq!(
        again
            .iter()
            .map(|item| (item.payload().to_vec(), item.attempt()))
            .collect::<Vec<_>>(),
        vec![(b"err".to_vec(), 1), (b"ok".to_vec(), 1)],
        "released, neither completed nor failed, the attempt not counted"
    );
    let stats = q.stats().await.unwrap();
    assert_eq!(stats.running, 3, "the stuck item is still held: {stats:?}");
    assert!(!worker.is_finished(), "the stuck handler keeps its grace");
    worker.abort();
    for item in again {
        item.complete().await.unwrap();
    }
}

/// The release is asked for, not forced: a handler that panics after asking still fails
/// its item (an attempt counted), so a crashing handler still runs out of attempts.
#[tokio::test]
async fn a_handler_that_panics_after_asking_still_fails_its_item() {
    let q = queue()
        .with_options(QueueOptions::new().max_attempts(1))
        .unwrap();
    q.enqueue("p", EnqueueOptions::new()).await.unwrap();
    let report = timeout(
        PATIENCE,
        Worker::new(q.clone())
            .exit_when_empty(true)
            .poll(Duration::from_millis(5), Duration::from_millis(20))
            .run(|job: Job| async move {
                job.release_on_return();
                if job.attempt() >= 1 {
                    panic!("the handler broke after asking for a release");
                }
                Ok::<(), String>(())
            }),
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(
        (report.panicked, report.dead_lettered, report.released),
        (1, 1, 0),
        "{report:?}"
    );
}

/// Outside shutdown too, a handler that gives its item back has it released (not
/// completed), the attempt not counted: the next claim runs attempt 1 again.
#[tokio::test]
async fn a_given_back_item_is_released_while_the_worker_runs() {
    let q = queue();
    q.enqueue("p", EnqueueOptions::new()).await.unwrap();
    let shutdown = CancellationToken::new();
    let (seen, mut seen_rx) = mpsc::unbounded_channel();
    let given_back = Arc::new(AtomicBool::new(false));
    let worker = tokio::spawn(
        Worker::new(q.clone())
            .poll(Duration::from_millis(5), Duration::from_millis(20))
            .shutdown(shutdown.clone())
            .run(move |job: Job| {
                let (seen, given_back) = (seen.clone(), given_back.clone());
                async move {
                    let _ = seen.send(job.attempt());
                    // Give it back the first time; complete it the second.
                    if !given_back.swap(true, Ordering::SeqCst) {
                        job.release_on_return();
                    }
                    Ok::<(), String>(())
                }
            }),
    );
    let mut attempts = Vec::new();
    for _ in 0..2 {
        attempts.push(timeout(PATIENCE, seen_rx.recv()).await.unwrap().unwrap());
    }
    assert_eq!(
        attempts,
        vec![1, 1],
        "the release did not count the attempt"
    );
    timeout(PATIENCE, async {
        while q.stats().await.unwrap().running > 0 {
            sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .unwrap();
    shutdown.cancel();
    let report = timeout(PATIENCE, worker).await.unwrap().unwrap().unwrap();
    assert_eq!(
        (report.claimed, report.released, report.completed),
        (2, 1, 1),
        "{report:?}"
    );
}
