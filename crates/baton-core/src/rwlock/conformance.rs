//! The reader-writer lock conformance rules: written once, run by every store that keeps
//! locks ([`LeaseStore`]) and semaphores ([`SemaphoreStore`]), the two atoms an
//! [`RwLock`] is made of.
//!
//! A store's test target implements [`Opens`] for its store as both atoms (the
//! [`RwLockHarness`]) and expands
//! [`rwlock_conformance_tests!`](crate::rwlock_conformance_tests)
//! (`baton_core::rwlock_conformance_tests!(my_harness())`), which generates one
//! `#[tokio::test]` per rule. Each rule uses a fresh random namespace, so rules may share a
//! server. Every wait is generous and no rule asserts how fast anything happened.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::{sleep, timeout};

use super::{RwLock, RwLockInfo};
use crate::ErrorKind;
use crate::conformance::{FaultyStore, Opens, eventually, fresh_namespace, ms};
use crate::key::{KeyKind, Namespace};
use crate::lock::{LockOptions, ReleaseOutcome};
use crate::semaphore::SemaphoreStore;
use crate::store::{LeaseStore, Release};

/// Both atoms of a store, as a reader-writer lock needs them; every harness that opens the
/// store as a [`LeaseStore`] and as a [`SemaphoreStore`] is one.
pub trait RwLockStores: Opens<dyn LeaseStore> + Opens<dyn SemaphoreStore> {}

impl<T: Opens<dyn LeaseStore> + Opens<dyn SemaphoreStore> + ?Sized> RwLockStores for T {}

/// What a store's test target provides to the reader-writer lock rules.
pub type RwLockHarness = dyn RwLockStores;

/// Generates one `#[tokio::test]` per reader-writer lock rule. `$harness` is an expression
/// that evaluates to a future of an [`RwLockHarness`]; it is evaluated once per test.
#[macro_export]
macro_rules! rwlock_conformance_tests {
    ($harness:expr) => {
        $crate::__conformance_rules!($crate::rwlock::conformance; $harness;
            readers_share,
            a_writer_excludes_readers_and_writers,
            a_waiting_writer_blocks_new_readers_and_enters_when_they_leave,
            readers_queued_before_a_writer_enter_first,
            a_writer_s_fence_is_above_every_earlier_grant_s,
            a_grant_past_its_ttl_fires_lost,
            a_writer_whose_gate_is_lost_is_told,
            keep_alive_holds_a_writer_across_ttls,
            release_outcomes,
            try_read_and_try_write_answer_contention,
            list_shows_writers_and_readers_by_key,
            bad_input_is_rejected_before_io,
        );
    };
}

async fn stores(h: &RwLockHarness) -> (Arc<dyn LeaseStore>, Arc<dyn SemaphoreStore>) {
    (
        Opens::<dyn LeaseStore>::open(h).await,
        Opens::<dyn SemaphoreStore>::open(h).await,
    )
}

async fn rwlock(h: &RwLockHarness, ns: &Namespace, key: &str) -> RwLock {
    let (leases, permits) = stores(h).await;
    RwLock::new(leases, permits, ns.clone(), key).expect("valid rwlock")
}

fn options(ttl: Duration) -> LockOptions {
    LockOptions::new(ttl)
}

const LONG: Duration = Duration::from_secs(30);

/// `RwLock::list` lists the held locks of a prefix in key order: a writer as the gate's
/// holder beside its write permit, readers by their permits; at most `limit` keys.
pub async fn list_shows_writers_and_readers_by_key(h: &RwLockHarness) {
    let ns = fresh_namespace();
    let (leases, permits) = stores(h).await;
    let opts = options(LONG);
    let read = rwlock(h, &ns, "jobs:read").await;
    let readers = [
        read.read(&opts).await.expect("a reader"),
        read.read(&opts).await.expect("another"),
    ];
    let written = rwlock(h, &ns, "jobs:write").await;
    let writer = written.write(&opts).await.expect("the writer");
    let outside = rwlock(h, &ns, "other")
        .await
        .read(&opts)
        .await
        .expect("a reader");
    let list = |limit| {
        let (leases, permits, ns) = (Arc::clone(&leases), Arc::clone(&permits), ns.clone());
        async move {
            RwLock::list(leases.as_ref(), permits.as_ref(), &ns, "jobs:", limit)
                .await
                .unwrap()
        }
    };
    let listed: Vec<RwLockInfo> = list(10).await;
    let keys: Vec<&str> = listed.iter().map(|l| l.key.as_str()).collect();
    assert_eq!(keys, ["jobs:read", "jobs:write"], "{listed:?}");
    let (r, w) = (&listed[0], &listed[1]);
    assert!(r.writer().is_none() && r.write.is_none(), "{r:?}");
    assert_eq!(r.readers.len(), 2, "{r:?}");
    assert!(r.readers[0].fence < r.readers[1].fence);
    assert!(w.readers.is_empty(), "{w:?}");
    assert_eq!(
        w.write.as_ref().map(|p| p.fence),
        Some(writer.fence()),
        "{w:?}"
    );
    assert_eq!(
        w.writer(),
        w.gate.as_ref(),
        "the writer is the gate's holder"
    );
    assert!(w.writer().is_some());
    let first = list(1).await;
    assert_eq!(first.len(), 1);
    assert_eq!(first[0].key, "jobs:read");
    for reader in readers {
        reader.release().await;
    }
    writer.release().await;
    outside.release().await;
    assert!(list(10).await.is_empty());
}

/// Readers hold at once, each with its own fence; nobody writes meanwhile.
pub async fn readers_share(h: &RwLockHarness) {
    let ns = fresh_namespace();
    let rw = rwlock(h, &ns, "model").await;
    let opts = options(LONG);
    let a = rw.read(&opts).await.expect("a reader");
    let b = rw
        .read(&opts)
        .await
        .expect("a second reader beside the first");
    let c = rw.try_read(&opts).await.unwrap().expect("and a third");
    assert!(b.fence() > a.fence() && c.fence() > b.fence());
    let holders = rw.holders().await.unwrap();
    assert_eq!(holders.permits.len(), 3, "{holders:?}");
    assert!(
        holders.gate.is_none(),
        "readers give the gate back: {holders:?}"
    );
    assert!(
        rw.try_write(&opts).await.unwrap().is_none(),
        "readers are in"
    );
    for guard in [a, b, c] {
        assert_eq!(guard.release().await, ReleaseOutcome::Released);
    }
    assert!(rw.holders().await.unwrap().is_free());
}

/// While a writer holds, no reader and no other writer gets in, also after waiting; once it
/// releases, both can.
pub async fn a_writer_excludes_readers_and_writers(h: &RwLockHarness) {
    let ns = fresh_namespace();
    let rw = rwlock(h, &ns, "model").await;
    let other = rwlock(h, &ns, "model").await;
    let opts = options(LONG);
    let writer = rw.write(&opts).await.expect("free");
    let waiting = opts.clone().wait(ms(200));
    for lock in [&rw, &other] {
        let err = lock.read(&waiting).await.expect_err("a writer is in");
        assert!(err.is_contended(), "{err}");
        let err = lock.write(&waiting).await.expect_err("a writer is in");
        assert!(err.is_contended(), "{err}");
    }
    let holders = rw.holders().await.unwrap();
    assert!(holders.gate.is_some(), "{holders:?}");
    assert_eq!(holders.permits.len(), 1, "the writer's own: {holders:?}");
    assert_eq!(holders.permits[0].fence, writer.fence());
    assert_eq!(writer.release().await, ReleaseOutcome::Released);
    // A store that hands the gate over to a queued waiter may hand it to one whose wait
    // ended; it is given back at once, but not before this claim can be sent.
    let again = opts.clone().wait(Duration::from_secs(10));
    let reader = other.read(&again).await.expect("free again");
    reader.release().await;
    let writer = other.write(&again).await.expect("free again");
    writer.release().await;
}

/// A writer that waits for readers to leave keeps new readers out, and gets in when the
/// readers inside have left.
pub async fn a_waiting_writer_blocks_new_readers_and_enters_when_they_leave(h: &RwLockHarness) {
    let ns = fresh_namespace();
    let rw = rwlock(h, &ns, "model").await;
    let opts = options(LONG);
    let reader = rw.read(&opts).await.expect("free");
    let writing = {
        let rw = rwlock(h, &ns, "model").await;
        let opts = opts.clone().wait(Duration::from_secs(20));
        tokio::spawn(async move { rw.write(&opts).await })
    };
    eventually(
        Duration::from_secs(10),
        "the writer to take the gate",
        || async { rw.holders().await.unwrap().gate.is_some() },
    )
    .await;
    assert!(
        rw.try_read(&opts).await.unwrap().is_none(),
        "a new reader entered past a waiting writer"
    );
    let err = rw
        .read(&opts.clone().wait(ms(200)))
        .await
        .expect_err("still waiting");
    assert!(err.is_contended(), "{err}");
    assert!(!writing.is_finished(), "the writer got in beside a reader");
    let read_fence = reader.fence();
    assert_eq!(reader.release().await, ReleaseOutcome::Released);
    let writer = timeout(Duration::from_secs(15), writing)
        .await
        .expect("the writer enters once the reader left")
        .unwrap()
        .expect("the writer's grant");
    assert!(writer.fence() > read_fence);
    writer.release().await;
}

/// Readers that queued at the gate before a writer asked go in before it; the writer then
/// waits for them to leave.
pub async fn readers_queued_before_a_writer_enter_first(h: &RwLockHarness) {
    let ns = fresh_namespace();
    let rw = rwlock(h, &ns, "model").await;
    let opts = options(LONG).wait(Duration::from_secs(20));
    let first = rw.write(&opts).await.expect("free");
    let order = Arc::new(Mutex::new(Vec::new()));
    let reader = {
        let (rw, opts, order) = (rw.clone(), opts.clone(), Arc::clone(&order));
        tokio::spawn(async move {
            let guard = rw.read(&opts).await.expect("the reader gets in");
            order.lock().unwrap().push(("read", guard.fence().get()));
            sleep(ms(300)).await;
            order
                .lock()
                .unwrap()
                .push(("read done", guard.fence().get()));
            guard.release().await;
        })
    };
    // Give the reader time to queue at the gate before the writer does.
    sleep(ms(300)).await;
    let writer = {
        let (rw, opts, order) = (rw.clone(), opts.clone(), Arc::clone(&order));
        tokio::spawn(async move {
            let guard = rw.write(&opts).await.expect("the writer gets in");
            order.lock().unwrap().push(("write", guard.fence().get()));
            guard.release().await;
        })
    };
    sleep(ms(300)).await;
    assert!(
        order.lock().unwrap().is_empty(),
        "nobody beside the first writer"
    );
    first.release().await;
    timeout(Duration::from_secs(20), reader)
        .await
        .expect("the reader finishes")
        .unwrap();
    timeout(Duration::from_secs(20), writer)
        .await
        .expect("the writer finishes")
        .unwrap();
    let order = order.lock().unwrap().clone();
    let names: Vec<&str> = order.iter().map(|(name, _)| *name).collect();
    assert_eq!(names, ["read", "read done", "write"], "{order:?}");
    assert!(order[2].1 > order[0].1, "{order:?}");
}

/// Every write grant's fence is larger than every earlier read or write grant's of the key;
/// reads after a write are above it too.
pub async fn a_writer_s_fence_is_above_every_earlier_grant_s(h: &RwLockHarness) {
    let ns = fresh_namespace();
    let rw = rwlock(h, &ns, "f").await;
    let opts = options(LONG);
    let mut highest = 0;
    for round in 0..3 {
        let readers = [rw.read(&opts).await.unwrap(), rw.read(&opts).await.unwrap()];
        for reader in &readers {
            assert!(reader.fence().get() > highest, "round {round}");
            highest = highest.max(reader.fence().get());
        }
        for reader in readers {
            reader.release().await;
        }
        let writer = rw.write(&opts).await.unwrap();
        assert!(
            writer.fence().get() > highest,
            "round {round}: writer {} after {highest}",
            writer.fence()
        );
        highest = writer.fence().get();
        writer.release().await;
    }
}

/// A read or a write without keep-alive fires `lost()` once its TTL has passed, and its
/// release answers `Expired`.
pub async fn a_grant_past_its_ttl_fires_lost(h: &RwLockHarness) {
    let ns = fresh_namespace();
    let rw = rwlock(h, &ns, "ttl").await;
    let opts = options(ms(300));
    let reader = rw.read(&opts).await.unwrap();
    timeout(Duration::from_secs(10), reader.lost())
        .await
        .expect("the read's lost fires");
    assert!(reader.is_lost());
    // `lost()` fires at `valid_until`, measured from before the claim was sent, so a little
    // before the store's own expiry: the release answers Expired once the store agrees.
    eventually(
        Duration::from_secs(5),
        "the store ends the read",
        || async { rw.holders().await.unwrap().permits.is_empty() },
    )
    .await;
    assert_eq!(reader.release().await, ReleaseOutcome::Expired);
    let writer = rw.write(&opts).await.unwrap();
    timeout(Duration::from_secs(10), writer.lost())
        .await
        .expect("the write's lost fires");
    assert!(writer.is_lost());
    assert!(writer.lost_token().is_cancelled());
    // Another writer (or a reader) may be in now, on the store's clock.
    let next = rwlock(h, &ns, "ttl")
        .await
        .write(&options(LONG).wait(Duration::from_secs(10)))
        .await
        .expect("the expired writer is gone");
    assert_eq!(writer.release().await, ReleaseOutcome::Expired);
    next.release().await;
}

/// A writer whose gate the store no longer holds (an operator removed it; with keep-alive
/// the next renewal says so) is told through `lost()`, even though its permit lives on, and
/// its release answers `Expired`. Readers may take the gate then: the writer's validity has
/// ended.
pub async fn a_writer_whose_gate_is_lost_is_told(h: &RwLockHarness) {
    let ns = fresh_namespace();
    let (leases, _) = stores(h).await;
    let rw = rwlock(h, &ns, "gate").await;
    let opts = options(Duration::from_secs(3)).keep_alive(ms(200));
    let writer = rw.write(&opts).await.unwrap();
    let gate = rw.holders().await.unwrap().gate.expect("the writer's gate");
    let gate_key = ns.qualify(KeyKind::RwGate, &crate::Key::new("gate").unwrap());
    assert_eq!(gate.key, gate_key);
    assert_eq!(
        leases.release(&gate_key, &gate.holder).await.unwrap(),
        Release::Removed,
        "the gate removed behind the writer's back"
    );
    timeout(Duration::from_secs(10), writer.lost())
        .await
        .expect("the writer's lost fires");
    assert!(writer.is_lost());
    let reader = rw
        .read(&options(LONG).wait(Duration::from_secs(5)))
        .await
        .expect("readers take the free gate");
    assert_eq!(writer.release().await, ReleaseOutcome::Expired);
    reader.release().await;
}

/// With keep-alive, a writer holds across many TTLs: nobody else gets in, and its release
/// finds it still held.
pub async fn keep_alive_holds_a_writer_across_ttls(h: &RwLockHarness) {
    let ns = fresh_namespace();
    let rw = rwlock(h, &ns, "kept").await;
    let opts = options(ms(400)).keep_alive(ms(100));
    let writer = rw.write(&opts).await.unwrap();
    sleep(ms(1500)).await;
    assert!(!writer.is_lost(), "renewed");
    assert!(writer.valid_until() > tokio::time::Instant::now());
    assert!(rw.try_read(&options(LONG)).await.unwrap().is_none());
    assert!(rw.try_write(&options(LONG)).await.unwrap().is_none());
    assert_eq!(writer.release().await, ReleaseOutcome::Released);
    let reader = rw.read(&opts).await.expect("free");
    sleep(ms(1000)).await;
    assert!(!reader.is_lost(), "a reader is renewed too");
    assert_eq!(reader.release().await, ReleaseOutcome::Released);
}

/// Releases answer `Released` in time and `Expired` after the TTL, for reads and writes; a
/// released key is free.
pub async fn release_outcomes(h: &RwLockHarness) {
    let ns = fresh_namespace();
    let rw = rwlock(h, &ns, "out").await;
    let reader = rw.read(&options(LONG)).await.unwrap();
    assert_eq!(reader.release().await, ReleaseOutcome::Released);
    let writer = rw.write(&options(LONG)).await.unwrap();
    assert_eq!(writer.release().await, ReleaseOutcome::Released);
    assert!(rw.holders().await.unwrap().is_free());
    let short = options(ms(200));
    let reader = rw.read(&short).await.unwrap();
    sleep(ms(600)).await;
    assert_eq!(reader.release().await, ReleaseOutcome::Expired);
    let writer = rw.write(&short).await.unwrap();
    sleep(ms(600)).await;
    assert_eq!(writer.release().await, ReleaseOutcome::Expired);
    assert!(rw.holders().await.unwrap().is_free());
}

/// `try_read` and `try_write` answer contention as `None`; a writer that found readers in
/// gives the gate back, so readers still get in.
pub async fn try_read_and_try_write_answer_contention(h: &RwLockHarness) {
    let ns = fresh_namespace();
    let rw = rwlock(h, &ns, "try").await;
    let opts = options(LONG);
    let reader = rw.try_read(&opts).await.unwrap().expect("free");
    assert!(
        rw.try_write(&opts).await.unwrap().is_none(),
        "a reader is in"
    );
    assert!(
        rw.holders().await.unwrap().gate.is_none(),
        "the gate was given back"
    );
    let second = rw
        .try_read(&opts)
        .await
        .unwrap()
        .expect("readers still get in");
    second.release().await;
    reader.release().await;
    let writer = rw.try_write(&opts).await.unwrap().expect("free");
    assert!(
        rw.try_read(&opts).await.unwrap().is_none(),
        "a writer is in"
    );
    assert!(
        rw.try_write(&opts).await.unwrap().is_none(),
        "a writer is in"
    );
    writer.release().await;
    rw.try_write(&opts)
        .await
        .unwrap()
        .expect("free again")
        .release()
        .await;
}

/// Bad keys and bad options are `InvalidInput`, and reach no store.
pub async fn bad_input_is_rejected_before_io(h: &RwLockHarness) {
    let ns = fresh_namespace();
    let (leases, permits) = stores(h).await;
    for key in ["", "a\u{1}b"] {
        let err = RwLock::new(Arc::clone(&leases), Arc::clone(&permits), ns.clone(), key)
            .expect_err("bad key");
        assert_eq!(err.kind(), ErrorKind::InvalidInput, "{key:?}: {err}");
    }
    let faulty = Arc::new(FaultyStore::new(leases));
    faulty.set_failing(true);
    let rw = RwLock::new(faulty.clone(), permits, ns, "k").unwrap();
    let s = Duration::from_secs;
    for bad in [
        options(ms(5)),
        options(s(30)).keep_alive(s(15)),
        options(s(30)).wait(s(86_401)),
        options(s(30)).max_hold(s(60)),
        options(s(30)).holder_label("a\u{1}b"),
    ] {
        let err = rw.read(&bad).await.expect_err("bad options");
        assert!(
            matches!(err, crate::AcquireError::InvalidInput(_)),
            "{bad:?}: {err}"
        );
        let err = rw.write(&bad).await.expect_err("bad options");
        assert!(
            matches!(err, crate::AcquireError::InvalidInput(_)),
            "{bad:?}: {err}"
        );
        let err = rw.try_write(&bad).await.expect_err("bad options");
        assert_eq!(err.kind(), ErrorKind::InvalidInput);
    }
    assert_eq!(faulty.calls(), 0, "bad input reached the store");
}
