//! The rules of the policy layer through a store: [`Queue`] and [`Item`] (validation,
//! de-duplication, retries, dead letters, zombies), [`Worker`] (settling, lease extension,
//! lost items, shutdown), [`Scheduler`] (missed ticks, listings) and fan-out.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::{Instant, sleep, timeout};
use tokio_util::sync::CancellationToken;

use crate::conformance::{eventually, fresh_namespace, ms};
use crate::error::{Error, ErrorKind, Result};
use crate::holder::Holder;
use crate::key::{Namespace, StoreKey};
use crate::store::Renewal;
use crate::time::Ttl;
use crate::{Locks, MemoryStore};

use super::super::store::{
    ClaimRequest, ClaimedItem, DeadItem, Enqueued, FailPlan, ItemRef, NewItem, QueueStats,
    QueueStore, Settle, WorkStore,
};
use super::super::{
    Backoff, Enqueue, EnqueueOptions, Failure, Item, Job, MAX_BATCH, MAX_PAYLOAD_BYTES,
    MigrationContext, MigrationFn, Migrations, Missed, Queue, QueueOptions, ReturnContended,
    Scheduler, Tick, Worker,
};
use super::{FaultyWorkStore, LONG, PATIENCE, WorkHarness, schedule_key};
use crate::work::store::NewSchedule;

pub(super) fn queue(store: Arc<dyn WorkStore>, ns: &Namespace, name: &str) -> Queue {
    Queue::with_namespace(store, ns.clone(), name).expect("valid queue")
}

/// Claims one item through `queue`, retrying until one comes (a lapsed lease, a backoff).
pub(super) async fn claim_item_eventually(queue: &Queue) -> Item {
    let start = Instant::now();
    loop {
        if let Some(item) = queue.claim(1).await.expect("claim").pop() {
            return item;
        }
        assert!(
            start.elapsed() < PATIENCE,
            "nothing in {} became claimable within {PATIENCE:?}",
            queue.key()
        );
        sleep(ms(10)).await;
    }
}

async fn claim_now(queue: &Queue) -> Item {
    let mut items = queue.claim(1).await.expect("claim");
    assert_eq!(items.len(), 1, "expected an item claimable at once");
    items.pop().expect("one")
}

/// Through [`Queue`]: enqueue answers added or duplicate, `enqueue_many` answers in order,
/// and claimed [`Item`]s carry what was enqueued.
pub async fn queue_enqueue_and_claim(h: &WorkHarness) {
    let ns = fresh_namespace();
    let q = queue(h.open().await, &ns, "emails");
    let first = q
        .enqueue(b"hello", EnqueueOptions::dedup("signup-1"))
        .await
        .unwrap();
    assert!(first.is_added());
    let again = q
        .enqueue(b"hello again", EnqueueOptions::dedup("signup-1"))
        .await
        .unwrap();
    assert_eq!(again, Enqueue::Duplicate(first.id()));
    let many = q
        .enqueue_many(&[
            (&b"a"[..], EnqueueOptions::new()),
            (&b"b"[..], EnqueueOptions::dedup("x").max_attempts(9)),
            (&b"c"[..], EnqueueOptions::dedup("x")),
            (&b"d"[..], EnqueueOptions::dedup("signup-1")),
        ])
        .await
        .unwrap();
    assert!(many[0].is_added() && many[1].is_added());
    assert_eq!(many[2], Enqueue::Duplicate(many[1].id()));
    assert_eq!(many[3], Enqueue::Duplicate(first.id()));
    let stats = q.stats().await.unwrap();
    assert_eq!((stats.ready, stats.running), (3, 0));

    let items = q.claim(10).await.unwrap();
    assert_eq!(items.len(), 3);
    assert_eq!(items[0].id(), first.id());
    assert_eq!(items[0].payload(), b"hello");
    assert_eq!(items[0].dedup_id(), Some("signup-1"));
    assert_eq!((items[0].attempt(), items[0].max_attempts()), (1, 5));
    assert_eq!(items[2].max_attempts(), 9);
    assert!(items[0].valid_until() > Instant::now());
    assert_eq!(items[0].token(), items[1].token(), "one token per claim");
    for item in items {
        assert_eq!(item.complete().await.unwrap(), Settle::Settled);
    }
    let stats = q.stats().await.unwrap();
    assert_eq!((stats.ready, stats.running, stats.dead), (0, 0, 0));
}

/// A failed attempt is retried after the backoff with its error kept, and the last
/// attempt's failure dead-letters the item; `dead_letter` does so at once.
pub async fn queue_retries_with_backoff_then_dead_letters(h: &WorkHarness) {
    let ns = fresh_namespace();
    let q = queue(h.open().await, &ns, "jobs")
        .with_options(
            QueueOptions::new()
                .max_attempts(3)
                .backoff(Backoff::exponential(ms(20), ms(30)).without_jitter()),
        )
        .unwrap();
    let id = q.enqueue(b"p", EnqueueOptions::new()).await.unwrap().id();
    let first = claim_now(&q).await;
    assert!(!first.is_last_attempt());
    assert_eq!(
        first.fail("first").await.unwrap(),
        Failure::Retrying { after: ms(20) }
    );
    let second = claim_item_eventually(&q).await;
    assert_eq!((second.id(), second.attempt()), (id, 2));
    assert_eq!(second.last_error(), "first");
    assert_eq!(
        second.fail("second").await.unwrap(),
        Failure::Retrying { after: ms(30) },
        "doubled, capped"
    );
    let third = claim_item_eventually(&q).await;
    assert!(third.is_last_attempt());
    assert_eq!(
        third.fail(Error::internal("third")).await.unwrap(),
        Failure::DeadLettered
    );
    let dead = q.dead_letters(10).await.unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!((dead[0].id, dead[0].attempts), (id, 3));
    assert_eq!(dead[0].error, "internal: third");
    assert!(q.claim(10).await.unwrap().is_empty());

    let poison = q.enqueue(b"bad", EnqueueOptions::new()).await.unwrap().id();
    let item = claim_now(&q).await;
    assert_eq!(
        item.dead_letter("malformed").await.unwrap(),
        Failure::DeadLettered
    );
    let dead = q.dead_letters(10).await.unwrap();
    assert_eq!(
        dead.iter().map(|d| (d.id, d.attempts)).collect::<Vec<_>>(),
        vec![(id, 3), (poison, 1)]
    );
    assert_eq!(q.stats().await.unwrap().dead, 2);
}

/// A claimer whose item was claimed again after its lease lapsed gets `NotOwner` from every
/// call, and the new claimer is untouched.
pub async fn queue_zombie_gets_not_owner(h: &WorkHarness) {
    let ns = fresh_namespace();
    let store = h.open().await;
    let short = queue(store.clone(), &ns, "jobs")
        .with_options(QueueOptions::new().lease(ms(50)))
        .unwrap();
    let long = queue(store, &ns, "jobs")
        .with_options(QueueOptions::new().lease(LONG))
        .unwrap();
    for p in ["a", "b", "c"] {
        short.enqueue(p, EnqueueOptions::new()).await.unwrap();
    }
    let zombies = short.claim(3).await.unwrap();
    assert_eq!(zombies.len(), 3);
    let mut heirs = Vec::new();
    for _ in 0..3 {
        let heir = claim_item_eventually(&long).await;
        assert_eq!(heir.attempt(), 2);
        heirs.push(heir);
    }
    let mut zombies = zombies.into_iter();
    let (a, b, c) = (
        zombies.next().unwrap(),
        zombies.next().unwrap(),
        zombies.next().unwrap(),
    );
    assert_eq!(a.extend().await.unwrap(), Renewal::NotHeld);
    assert_eq!(a.complete().await.unwrap(), Settle::NotOwner);
    assert_eq!(b.fail("late").await.unwrap(), Failure::NotOwner);
    assert_eq!(c.release().await.unwrap(), Settle::NotOwner);
    let stats = long.stats().await.unwrap();
    assert_eq!(
        (stats.running, stats.ready, stats.dead),
        (3, 0, 0),
        "{stats:?}"
    );
    for heir in heirs {
        assert_eq!(heir.extend().await.unwrap(), Renewal::Renewed);
        assert_eq!(heir.complete().await.unwrap(), Settle::Settled);
    }
}

/// An item whose every lease lapsed without a result (its handler crashes its process) is
/// dead-lettered by the claim that finds it past its last attempt, not handed out again.
pub async fn queue_dead_letters_items_whose_leases_keep_lapsing(h: &WorkHarness) {
    let ns = fresh_namespace();
    let q = queue(h.open().await, &ns, "jobs")
        .with_options(QueueOptions::new().lease(ms(30)).max_attempts(2))
        .unwrap();
    let id = q
        .enqueue(b"crash", EnqueueOptions::new())
        .await
        .unwrap()
        .id();
    drop(claim_now(&q).await);
    drop(claim_item_eventually(&q).await);
    eventually(PATIENCE, "the third claim dead-lettering the item", || {
        let q = &q;
        async move {
            assert!(q.claim(1).await.unwrap().is_empty(), "never handed out");
            q.stats().await.unwrap().dead == 1
        }
    })
    .await;
    let dead = q.dead_letters(1).await.unwrap();
    assert_eq!((dead[0].id, dead[0].attempts), (id, 3));
    assert!(dead[0].error.contains("lapsed"), "{}", dead[0].error);
}

/// `exit_when_empty` returns while a failed item waits out its retry backoff;
/// `exit_when_settled` returns only once that item was retried and settled. Setting both is
/// invalid input.
pub async fn worker_drains_until_settled(h: &WorkHarness) {
    let ns = fresh_namespace();
    let q = queue(h.open().await, &ns, "settling")
        .with_options(
            QueueOptions::new()
                .max_attempts(3)
                .backoff(Backoff::fixed(ms(400))),
        )
        .unwrap();
    q.enqueue(b"flaky", EnqueueOptions::new()).await.unwrap();
    q.enqueue(b"ok", EnqueueOptions::new()).await.unwrap();
    let handler = |job: Job| async move {
        if job.payload() == b"flaky" && job.attempt() == 1 {
            return Err("the first attempt fails");
        }
        Ok(())
    };
    let empty = timeout(
        PATIENCE,
        Worker::new(q.clone())
            .poll(ms(5), ms(20))
            .exit_when_empty(true)
            .run(handler),
    )
    .await
    .expect("exit_when_empty returns")
    .unwrap();
    assert_eq!((empty.completed, empty.retried), (1, 1), "{empty:?}");
    let stats = q.stats().await.unwrap();
    assert_eq!(stats.scheduled, 1, "the retry is still waiting: {stats:?}");
    assert_eq!(
        stats.queue(),
        "settling",
        "the name the queue was opened with"
    );
    assert_eq!(
        stats.key.as_str(),
        format!("{}:queue:settling", ns.as_str())
    );

    let settled = timeout(
        PATIENCE,
        Worker::new(q.clone())
            .poll(ms(5), ms(20))
            .exit_when_settled(true)
            .run(handler),
    )
    .await
    .expect("exit_when_settled returns once the retry settled")
    .unwrap();
    assert_eq!(settled.completed, 1, "the retry ran: {settled:?}");
    let stats = q.stats().await.unwrap();
    assert_eq!(
        (
            stats.ready,
            stats.scheduled,
            stats.running,
            stats.expired,
            stats.dead
        ),
        (0, 0, 0, 0, 0),
        "{stats:?}"
    );

    // A settled queue: the worker returns at once.
    let idle = Worker::new(q.clone())
        .exit_when_settled(true)
        .run(handler)
        .await
        .unwrap();
    assert_eq!(idle.claimed, 0);

    let err = Worker::new(q)
        .exit_when_empty(true)
        .exit_when_settled(true)
        .run(handler)
        .await
        .unwrap_err();
    assert!(err.is_invalid_input(), "{err}");
}

/// A [`Worker`] completes what its handler answers `Ok` for, retries what it fails (and
/// what panics), and dead-letters after the last attempt; with `exit_when_empty` it returns
/// once the queue is drained.
pub async fn worker_settles_by_the_handler_answer(h: &WorkHarness) {
    let ns = fresh_namespace();
    let q = queue(h.open().await, &ns, "jobs")
        .with_options(
            QueueOptions::new()
                .max_attempts(2)
                .backoff(Backoff::fixed(Duration::ZERO)),
        )
        .unwrap();
    let mut payloads: Vec<String> = (0..16).map(|i| format!("ok-{i}")).collect();
    payloads.extend(["bad-1", "bad-2", "flaky-1", "panic-1"].map(String::from));
    let batch: Vec<(&[u8], EnqueueOptions)> = payloads
        .iter()
        .map(|p| (p.as_bytes(), EnqueueOptions::new()))
        .collect();
    q.enqueue_many(&batch).await.unwrap();
    let calls = Arc::new(Mutex::new(HashMap::<String, u32>::new()));
    let seen = Arc::clone(&calls);
    let report = timeout(
        2 * PATIENCE,
        Worker::new(q.clone())
            .concurrency(4)
            .batch(3)
            .poll(ms(5), ms(50))
            .exit_when_empty(true)
            .run(move |job: Job| {
                let seen = Arc::clone(&seen);
                async move {
                    let payload = String::from_utf8(job.payload().to_vec()).unwrap();
                    *seen.lock().unwrap().entry(payload.clone()).or_default() += 1;
                    if payload.starts_with("panic") {
                        panic!("the handler panics on {payload}");
                    }
                    if payload.starts_with("bad")
                        || (payload.starts_with("flaky") && job.attempt() == 1)
                    {
                        return Err(format!("{payload} failed on attempt {}", job.attempt()));
                    }
                    Ok(())
                }
            }),
    )
    .await
    .expect("the worker drains the queue")
    .unwrap();
    assert_eq!(report.claimed, 20 + 4, "{report:?}");
    assert_eq!(report.completed, 17, "{report:?}");
    assert_eq!(report.retried, 4, "{report:?}");
    assert_eq!(report.dead_lettered, 3, "{report:?}");
    assert_eq!(report.panicked, 2, "{report:?}");
    assert_eq!(
        (report.lease_lost, report.released, report.store_faults),
        (0, 0, 0)
    );
    let calls = calls.lock().unwrap().clone();
    assert!(
        payloads
            .iter()
            .all(|p| calls[p] == if p.starts_with("ok") { 1 } else { 2 })
    );
    let dead = q.dead_letters(10).await.unwrap();
    assert_eq!(dead.len(), 3);
    assert!(
        dead.iter()
            .any(|d| d.payload == b"bad-1" && d.error == "bad-1 failed on attempt 2")
    );
    assert!(
        dead.iter()
            .any(|d| d.payload == b"panic-1" && d.error.contains("panicked"))
    );
    let stats = q.stats().await.unwrap();
    assert_eq!((stats.ready, stats.running, stats.dead), (0, 0, 3));
}

/// While a handler runs longer than the lease, the worker keeps extending it: nobody else
/// can claim the item, and it completes on its first attempt.
pub async fn worker_extends_leases_while_handlers_run(h: &WorkHarness) {
    let ns = fresh_namespace();
    let store = h.open().await;
    let q = queue(store.clone(), &ns, "slow")
        .with_options(QueueOptions::new().lease(ms(300)))
        .unwrap();
    let thief = queue(h.open().await, &ns, "slow");
    q.enqueue(b"slow", EnqueueOptions::new()).await.unwrap();
    let started = Arc::new(AtomicBool::new(false));
    let finish = CancellationToken::new();
    let shutdown = CancellationToken::new();
    let worker = tokio::spawn({
        let (q, started, finish, shutdown) =
            (q.clone(), started.clone(), finish.clone(), shutdown.clone());
        async move {
            Worker::new(q)
                .poll(ms(5), ms(20))
                .shutdown(shutdown)
                .run(move |job: Job| {
                    let (started, finish) = (started.clone(), finish.clone());
                    async move {
                        assert_eq!(job.attempt(), 1);
                        started.store(true, Ordering::SeqCst);
                        finish.cancelled().await;
                        if job.is_lost() {
                            return Err("lost");
                        }
                        Ok(())
                    }
                })
                .await
        }
    });
    eventually(PATIENCE, "the handler starting", || {
        let started = &started;
        async move { started.load(Ordering::SeqCst) }
    })
    .await;
    let until = Instant::now() + ms(1_200);
    while Instant::now() < until {
        assert!(
            thief.claim(1).await.unwrap().is_empty(),
            "the extended item is not claimable"
        );
        sleep(ms(25)).await;
    }
    finish.cancel();
    eventually(PATIENCE, "the item completing", || {
        let q = &q;
        async move { q.stats().await.unwrap().running == 0 }
    })
    .await;
    shutdown.cancel();
    let report = worker.await.unwrap().unwrap();
    assert_eq!(
        (report.completed, report.lease_lost, report.claimed),
        (1, 0, 1),
        "{report:?}"
    );
}

/// A queue store whose `extend` always faults, so a worker's lease runs out under it.
#[derive(Debug)]
struct ExtendFails(Arc<dyn WorkStore>);

#[async_trait]
impl QueueStore for ExtendFails {
    async fn enqueue(&self, queue: &StoreKey, items: &[NewItem<'_>]) -> Result<Vec<Enqueued>> {
        self.0.enqueue(queue, items).await
    }

    async fn claim(&self, queue: &StoreKey, request: ClaimRequest<'_>) -> Result<Vec<ClaimedItem>> {
        self.0.claim(queue, request).await
    }

    async fn complete(&self, item: ItemRef<'_>) -> Result<Settle> {
        self.0.complete(item).await
    }

    async fn fail(&self, item: ItemRef<'_>, plan: FailPlan, error: &str) -> Result<Settle> {
        self.0.fail(item, plan, error).await
    }

    async fn extend(&self, _item: ItemRef<'_>, _lease: Ttl) -> Result<Renewal> {
        Err(Error::unavailable("injected extend fault"))
    }

    async fn release(&self, item: ItemRef<'_>) -> Result<Settle> {
        self.0.release(item).await
    }

    async fn stats(&self, prefix: &str) -> Result<Vec<QueueStats>> {
        self.0.stats(prefix).await
    }

    async fn dead_letters(&self, queue: &StoreKey, limit: u32) -> Result<Vec<DeadItem>> {
        self.0.dead_letters(queue, limit).await
    }
}

/// When no extension lands before the lease runs out and another claim takes the item, the
/// worker fires the job's `lost` signal, discards the handler's result (`NotOwner`), and
/// counts the item as lost; the new claimer owns it undisturbed.
pub async fn worker_discards_the_result_of_a_lost_item(h: &WorkHarness) {
    let ns = fresh_namespace();
    let store = h.open().await;
    let q = Queue::with_namespace(Arc::new(ExtendFails(store.clone())), ns.clone(), "jobs")
        .unwrap()
        .with_options(QueueOptions::new().lease(ms(150)))
        .unwrap();
    let thief = queue(store, &ns, "jobs");
    q.enqueue(b"p", EnqueueOptions::new()).await.unwrap();
    let stolen = CancellationToken::new();
    let started = CancellationToken::new();
    let saw_lost = Arc::new(AtomicBool::new(false));
    let worker = tokio::spawn({
        let (q, stolen, saw_lost, started) =
            (q.clone(), stolen.clone(), saw_lost.clone(), started.clone());
        async move {
            Worker::new(q)
                .poll(ms(5), ms(20))
                .exit_when_empty(true)
                .run(move |job: Job| {
                    let (stolen, saw_lost) = (stolen.clone(), saw_lost.clone());
                    started.cancel();
                    async move {
                        timeout(PATIENCE, job.lost())
                            .await
                            .expect("lost fires when the lease runs out without extensions");
                        saw_lost.store(true, Ordering::SeqCst);
                        timeout(PATIENCE, stolen.cancelled())
                            .await
                            .expect("the thief claims the item");
                        Ok::<(), String>(())
                    }
                })
                .await
        }
    });
    timeout(PATIENCE, started.cancelled())
        .await
        .expect("the worker claims the item");
    let taken = claim_item_eventually(&thief).await;
    assert_eq!(taken.attempt(), 2);
    stolen.cancel();
    let report = timeout(PATIENCE, worker).await.unwrap().unwrap().unwrap();
    assert!(saw_lost.load(Ordering::SeqCst));
    assert_eq!((report.lease_lost, report.completed), (1, 0), "{report:?}");
    assert_eq!(taken.complete().await.unwrap(), Settle::Settled);
}

/// At shutdown a worker stops claiming, lets handlers in flight finish within the grace,
/// then aborts the rest and releases their items (claimable at once, the attempt not
/// counted).
pub async fn worker_shuts_down_gracefully(h: &WorkHarness) {
    let ns = fresh_namespace();
    let store = h.open().await;
    let q = queue(store.clone(), &ns, "jobs");
    for i in 0..3 {
        q.enqueue(format!("p{i}"), EnqueueOptions::new())
            .await
            .unwrap();
    }
    let started = Arc::new(AtomicUsize::new(0));
    let shutdown = CancellationToken::new();
    let worker = tokio::spawn({
        let (q, started, shutdown) = (q.clone(), started.clone(), shutdown.clone());
        async move {
            Worker::new(q)
                .concurrency(2)
                .poll(ms(5), ms(20))
                .grace(PATIENCE)
                .shutdown(shutdown)
                .run(move |_job: Job| {
                    let started = started.clone();
                    async move {
                        started.fetch_add(1, Ordering::SeqCst);
                        sleep(ms(300)).await;
                        Ok::<(), String>(())
                    }
                })
                .await
        }
    });
    eventually(PATIENCE, "two handlers starting", || {
        let started = &started;
        async move { started.load(Ordering::SeqCst) == 2 }
    })
    .await;
    shutdown.cancel();
    let report = timeout(PATIENCE, worker).await.unwrap().unwrap().unwrap();
    assert_eq!((report.completed, report.released), (2, 0), "{report:?}");
    let stats = q.stats().await.unwrap();
    assert_eq!(
        (stats.ready, stats.running),
        (1, 0),
        "the third was never claimed"
    );

    // A handler that does not finish within the grace is aborted; its item released.
    let shutdown = CancellationToken::new();
    let started = Arc::new(AtomicUsize::new(0));
    let worker = tokio::spawn({
        let (q, started, shutdown) = (q.clone(), started.clone(), shutdown.clone());
        async move {
            Worker::new(q)
                .poll(ms(5), ms(20))
                .grace(ms(100))
                .shutdown(shutdown)
                .run(move |_job: Job| {
                    let started = started.clone();
                    async move {
                        started.fetch_add(1, Ordering::SeqCst);
                        std::future::pending::<()>().await;
                        Ok::<(), String>(())
                    }
                })
                .await
        }
    });
    eventually(PATIENCE, "the stuck handler starting", || {
        let started = &started;
        async move { started.load(Ordering::SeqCst) == 1 }
    })
    .await;
    shutdown.cancel();
    let report = timeout(PATIENCE, worker).await.unwrap().unwrap().unwrap();
    assert_eq!((report.released, report.completed), (1, 0), "{report:?}");
    let again = claim_now(&q).await;
    assert_eq!(again.attempt(), 1, "a release is not an attempt");
    assert_eq!(again.complete().await.unwrap(), Settle::Settled);
}

/// Bad input is rejected with `InvalidInput` naming the problem, before any I/O.
pub async fn invalid_input_is_rejected_before_io(h: &WorkHarness) {
    let ns = fresh_namespace();
    let faulty = Arc::new(FaultyWorkStore::new(h.open().await));
    let store: Arc<dyn WorkStore> = faulty.clone();
    let invalid = |e: Error, needle: &str| {
        assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
        assert!(e.message().contains(needle), "{needle:?} not in {e}");
    };
    for (name, needle) in [
        ("", "empty"),
        (&*"q".repeat(201), "201 bytes"),
        ("a\u{0}b", "control character"),
    ] {
        invalid(
            Queue::with_namespace(store.clone(), ns.clone(), name).unwrap_err(),
            needle,
        );
    }
    assert!(Queue::with_namespace(store.clone(), ns.clone(), &"q".repeat(200)).is_ok());
    let q = queue(store.clone(), &ns, "jobs");
    invalid(
        q.enqueue(vec![0u8; MAX_PAYLOAD_BYTES + 1], EnqueueOptions::new())
            .await
            .unwrap_err(),
        "payload",
    );
    for (options, needle) in [
        (EnqueueOptions::dedup(""), "dedup id is empty"),
        (
            EnqueueOptions::dedup("d".repeat(257)),
            "dedup id is 257 bytes",
        ),
        (EnqueueOptions::dedup("a\nb"), "control character"),
        (
            EnqueueOptions::new().delay(Duration::from_secs(31 * 86_400)),
            "delay",
        ),
        (EnqueueOptions::new().max_attempts(0), "max_attempts"),
        (
            EnqueueOptions::dedup("d").dedup_window(ms(1)),
            "dedup window",
        ),
    ] {
        invalid(q.enqueue(b"p", options).await.unwrap_err(), needle);
    }
    let empty: &[(&[u8], EnqueueOptions)] = &[];
    invalid(q.enqueue_many(empty).await.unwrap_err(), "from 1 to 1000");
    let too_many: Vec<(&[u8], EnqueueOptions)> = (0..=MAX_BATCH)
        .map(|_| (&b"p"[..], EnqueueOptions::new()))
        .collect();
    invalid(q.enqueue_many(&too_many).await.unwrap_err(), "1001");
    let one_bad = [
        (&b"ok"[..], EnqueueOptions::new()),
        (&b"bad"[..], EnqueueOptions::dedup("")),
    ];
    invalid(q.enqueue_many(&one_bad).await.unwrap_err(), "dedup id");
    invalid(q.claim(0).await.unwrap_err(), "claim batch is 0");
    invalid(q.claim(MAX_BATCH + 1).await.unwrap_err(), "1001");
    invalid(q.dead_letters(0).await.unwrap_err(), "limit");
    for (options, needle) in [
        (QueueOptions::new().lease(ms(5)), "lease"),
        (QueueOptions::new().max_attempts(0), "max_attempts"),
        (
            QueueOptions::new().dedup_window(Duration::from_secs(31 * 86_400)),
            "dedup window",
        ),
        (
            QueueOptions::new().backoff(Backoff::exponential(ms(10), ms(5))),
            "backoff",
        ),
    ] {
        invalid(q.clone().with_options(options).unwrap_err(), needle);
    }
    invalid(
        q.fan_out([("ok", b"p".to_vec()), ("", b"q".to_vec())])
            .await
            .unwrap_err(),
        "dedup id is empty",
    );
    let worker = Worker::new(q.clone()).concurrency(0);
    invalid(
        worker
            .run(|_: Job| async { Ok::<(), String>(()) })
            .await
            .unwrap_err(),
        "concurrency",
    );
    let worker = Worker::new(q.clone()).batch(MAX_BATCH + 1);
    invalid(
        worker
            .run(|_: Job| async { Ok::<(), String>(()) })
            .await
            .unwrap_err(),
        "batch",
    );

    let scheduler = Scheduler::with_namespace(store.clone(), ns.clone());
    for (name, spec, needle) in [
        ("s", "* * *", "3 fields"),
        ("s", "61 * * * *", "invalid"),
        ("s", "not a cron", "3 fields"),
        ("s", "0 0 30 2 *", "never fires"),
        ("", "* * * * *", "schedule name is empty"),
        ("s\t", "* * * * *", "control character"),
    ] {
        invalid(
            scheduler
                .register(name, spec, Missed::Skip, |_: Tick| async {
                    Ok::<(), String>(())
                })
                .await
                .unwrap_err(),
            needle,
        );
    }

    let locks = Locks::with_namespace(Arc::new(MemoryStore::new()), ns.clone());
    invalid(
        Migrations::new(store.clone(), locks.clone(), "").unwrap_err(),
        "migration set is empty",
    );
    let noop = |name: &str| MigrationFn::new(name, |_: MigrationContext| async { Ok(()) });
    let twice = Migrations::new(store.clone(), locks.clone(), "app")
        .unwrap()
        .migration(noop("001"))
        .migration(noop("001"));
    invalid(twice.run(ReturnContended).await.unwrap_err(), "added twice");
    let unnamed = Migrations::new(store.clone(), locks.clone(), "app")
        .unwrap()
        .migration(noop(""));
    invalid(
        unnamed.run(ReturnContended).await.unwrap_err(),
        "migration name is empty",
    );
    let short = Migrations::new(store.clone(), locks, "app")
        .unwrap()
        .migration(noop("001"))
        .lease(ms(5));
    invalid(short.run(ReturnContended).await.unwrap_err(), "lease");

    assert_eq!(faulty.calls(), 0, "no I/O for bad input");
}

/// Through the policy layer too, a store fault is an `Unavailable` error: never an empty
/// claim, a duplicate, `NotOwner` or a lost tick; what was claimed before still settles
/// once the store is back.
pub async fn policy_store_faults_are_errors(h: &WorkHarness) {
    let ns = fresh_namespace();
    let faulty = Arc::new(FaultyWorkStore::new(h.open().await));
    let store: Arc<dyn WorkStore> = faulty.clone();
    let q = queue(store.clone(), &ns, "jobs");
    q.enqueue(b"p", EnqueueOptions::new()).await.unwrap();
    let item = claim_now(&q).await;
    let scheduler = Scheduler::with_namespace(store.clone(), ns.clone());
    scheduler
        .register("s", "* * * * *", Missed::Skip, |_: Tick| async {
            Ok::<(), String>(())
        })
        .await
        .unwrap();

    faulty.set_failing(true);
    let unavailable = |e: Error| assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    unavailable(q.enqueue(b"q", EnqueueOptions::new()).await.unwrap_err());
    unavailable(q.claim(5).await.expect_err("a fault is not an empty claim"));
    unavailable(q.stats().await.unwrap_err());
    unavailable(q.dead_letters(5).await.unwrap_err());
    unavailable(item.extend().await.unwrap_err());
    unavailable(q.fan_out([("r1", b"1".to_vec())]).await.unwrap_err());
    unavailable(
        scheduler
            .register("t", "* * * * *", Missed::Skip, |_: Tick| async {
                Ok::<(), String>(())
            })
            .await
            .unwrap_err(),
    );
    unavailable(scheduler.list().await.unwrap_err());
    let migrations = Migrations::new(
        store.clone(),
        Locks::with_namespace(Arc::new(MemoryStore::new()), ns.clone()),
        "app",
    )
    .unwrap()
    .migration(MigrationFn::new("001", |_: MigrationContext| async {
        Ok(())
    }))
    .unavailable_retries(1);
    unavailable(migrations.run(ReturnContended).await.unwrap_err());
    let calls = faulty.calls();
    let shutdown = CancellationToken::new();
    let worker = tokio::spawn(
        Worker::new(q.clone())
            .poll(ms(5), ms(10))
            .exit_when_empty(true)
            .shutdown(shutdown.clone())
            .run(|_: Job| async { Ok::<(), String>(()) }),
    );
    sleep(ms(100)).await;
    shutdown.cancel();
    let report = worker.await.unwrap().expect("faults are not errors of run");
    assert!(report.store_faults >= 1, "{report:?}");
    assert_eq!(
        report.claimed, 0,
        "a fault is not an empty queue to exit on"
    );
    assert!(faulty.calls() > calls, "the worker kept trying");
    faulty.set_failing(false);
    assert_eq!(
        item.complete().await.unwrap(),
        Settle::Settled,
        "the item is still ours"
    );
    let migrations = migrations.unavailable_retries(0);
    assert!(
        matches!(
            migrations.run(ReturnContended).await.unwrap().outcome,
            super::super::MigrationOutcome::Completed
        ),
        "the faults left nothing behind"
    );
}

/// Ticks missed while no scheduler ran: `Skip` moves past them without running, counting
/// them; the row's next tick is in the future.
pub async fn scheduler_skips_missed_ticks(h: &WorkHarness) {
    missed_ticks(h, Missed::Skip).await;
}

/// Ticks missed while no scheduler ran: `CatchUpOnce` runs once, for the oldest missed
/// tick, told how many later ticks it stands for.
pub async fn scheduler_catches_up_once(h: &WorkHarness) {
    missed_ticks(h, Missed::CatchUpOnce).await;
}

async fn missed_ticks(h: &WorkHarness, policy: Missed) {
    let ns = fresh_namespace();
    let store = h.open().await;
    let name = schedule_key(&ns, "minutely");
    let now = store.now_ms().await.unwrap();
    let minute = now - now.rem_euclid(60_000);
    let due = minute - 5 * 60_000;
    store
        .register_schedule(NewSchedule::new(&name, "* * * * *", due))
        .await
        .unwrap();
    let scheduler = Scheduler::with_namespace(store.clone(), ns.clone());
    let ticks = Arc::new(Mutex::new(Vec::<Tick>::new()));
    let info = scheduler
        .register("minutely", "* * * * *", policy, {
            let ticks = ticks.clone();
            move |tick: Tick| {
                let ticks = ticks.clone();
                async move {
                    ticks.lock().unwrap().push(tick);
                    Ok::<(), String>(())
                }
            }
        })
        .await
        .unwrap();
    assert_eq!(info.next_due_ms, due, "the same spec keeps the stored tick");
    let shutdown = CancellationToken::new();
    let running = tokio::spawn({
        let (scheduler, shutdown) = (scheduler.clone(), shutdown.clone());
        async move { scheduler.run(shutdown).await }
    });
    eventually(PATIENCE, "the row moving to a future tick", || {
        let (store, name) = (&store, &name);
        async move { store.schedule(name).await.unwrap().unwrap().due_at_ms > now }
    })
    .await;
    if policy == Missed::CatchUpOnce {
        eventually(PATIENCE, "the catch-up run", || {
            let ticks = &ticks;
            async move { !ticks.lock().unwrap().is_empty() }
        })
        .await;
    }
    shutdown.cancel();
    let report = running.await.unwrap().unwrap();
    let ticks = ticks.lock().unwrap().clone();
    let old: Vec<&Tick> = ticks.iter().filter(|t| t.due_ms() < minute).collect();
    match policy {
        Missed::Skip => {
            assert!(old.is_empty(), "skipped ticks do not run: {old:?}");
            assert!((6..=7).contains(&report.missed), "{report:?}");
        }
        Missed::CatchUpOnce => {
            assert_eq!(old.len(), 1, "one catch-up run: {old:?}");
            assert_eq!(old[0].due_ms(), due);
            assert!(old[0].is_catch_up());
            assert!((5..=6).contains(&old[0].missed()), "{:?}", old[0]);
            assert_eq!(report.missed, old[0].missed(), "{report:?}");
        }
    }
    // Only a tick of a minute that began during the test may have run besides.
    assert!(ticks.iter().all(|t| t.due_ms() == due || t.due_ms() > now));
    let row = store.schedule(&name).await.unwrap().unwrap();
    assert!(row.due_at_ms > now && row.due_at_ms.rem_euclid(60_000) == 0);
    assert_eq!(row.runs, ticks.len() as u64);
}

/// `list` shows every schedule of the namespace as stored; `remove` deletes one.
pub async fn scheduler_lists_and_removes_schedules(h: &WorkHarness) {
    let ns = fresh_namespace();
    let store = h.open().await;
    let holder = Holder::new("replica-a").unwrap();
    let scheduler =
        Scheduler::with_namespace(store.clone(), ns.clone()).with_holder(holder.clone());
    let now = store.now_ms().await.unwrap();
    for (name, spec) in [("nightly", "0 3 * * *"), ("often", "*/5 * * * * *")] {
        let info = scheduler
            .register(name, spec, Missed::Skip, |_: Tick| async {
                Ok::<(), String>(())
            })
            .await
            .unwrap();
        assert_eq!((info.name.as_str(), info.spec.as_str()), (name, spec));
        assert!(info.next_due_ms > now - 1_000, "{info:?}");
    }
    invalid_twice(&scheduler).await;
    let listed = scheduler.list().await.unwrap();
    assert_eq!(
        listed.iter().map(|i| i.name.as_str()).collect::<Vec<_>>(),
        vec!["nightly", "often"]
    );
    assert!(listed[0].next_due_ms.rem_euclid(86_400_000) == 3 * 3_600_000);
    assert!(listed.iter().all(|i| i.runs == 0 && i.last_run.is_none()));
    let other = Scheduler::with_namespace(store.clone(), fresh_namespace());
    assert!(
        other.list().await.unwrap().is_empty(),
        "namespaces are apart"
    );

    // The five-second schedule runs under this holder.
    let shutdown = CancellationToken::new();
    let running = tokio::spawn({
        let (scheduler, shutdown) = (scheduler.clone(), shutdown.clone());
        async move { scheduler.run(shutdown).await }
    });
    eventually(PATIENCE, "a tick of the five-second schedule", || {
        let scheduler = &scheduler;
        async move { scheduler.list().await.unwrap()[1].runs > 0 }
    })
    .await;
    shutdown.cancel();
    running.await.unwrap().unwrap();
    let often = &scheduler.list().await.unwrap()[1];
    assert_eq!(often.last_run.as_ref().map(|(h, _)| h), Some(&holder));
    assert!(scheduler.remove("often").await.unwrap());
    assert!(!scheduler.remove("often").await.unwrap());
    assert_eq!(scheduler.list().await.unwrap().len(), 1);
}

async fn invalid_twice(scheduler: &Scheduler) {
    let e = scheduler
        .register("nightly", "0 3 * * *", Missed::Skip, |_: Tick| async {
            Ok::<(), String>(())
        })
        .await
        .unwrap_err();
    assert!(e.message().contains("already registered"), "{e}");
}

/// A fan-out enqueues one item per record in chunks, and a second scan of the same records
/// adds only the new ones.
pub async fn fan_out_reports_added_and_duplicates(h: &WorkHarness) {
    let ns = fresh_namespace();
    let q = queue(h.open().await, &ns, "per-record");
    let records = |range: std::ops::Range<u32>| {
        range.map(|i| (format!("record-{i}"), i.to_be_bytes().to_vec()))
    };
    let first = q.fan_out(records(0..1_200)).await.unwrap();
    assert_eq!((first.added, first.duplicates), (1_200, 0));
    let second = q.fan_out(records(1_100..1_300)).await.unwrap();
    assert_eq!((second.added, second.duplicates), (100, 100));
    let items = q.claim(MAX_BATCH).await.unwrap();
    assert_eq!(items[0].dedup_id(), Some("record-0"));
    assert_eq!(items[0].payload(), 0u32.to_be_bytes());
    assert_eq!(q.stats().await.unwrap().ready + items.len() as u64, 1_300);
    for item in items {
        item.complete().await.unwrap();
    }
    let third = q.fan_out(records(0..10)).await.unwrap();
    assert_eq!(
        (third.added, third.duplicates),
        (0, 10),
        "processed records stay de-duplicated within the window"
    );
}
