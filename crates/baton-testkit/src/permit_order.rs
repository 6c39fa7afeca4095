//! Permit order across stores: the rules a store keeps when it queues its waiters for
//! permits and reserves a released permit for the store that waited longest (SQLite, Redis,
//! PostgreSQL). Each store's test target calls them with stores of its own and its own way
//! of counting the stores queued for a key; SQLite, whose stores in one process share one
//! queue entry, runs the second rule across OS processes instead.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use baton_core::store::{Claim, LeaseRequest, Release};
use baton_core::{Holder, LockOptions, Namespace, Semaphore, SemaphoreStore, StoreKey, Ttl};

/// How long a step that takes milliseconds when it works may take here.
const PATIENCE: Duration = Duration::from_secs(20);

/// The permit `a` releases is reserved for `b`, which queued for it: a claim from `a` (the
/// releaser asking again at once) finds the key held by the reservation (`handoff:...`,
/// ending within 250 ms), the reservation is no holder, and `b`'s next claim takes it. `key`
/// is a qualified key of kind `semaphore` nobody else uses.
///
/// # Panics
/// When a rule is broken or a store faults.
pub async fn a_released_permit_is_reserved_for_the_store_that_queued(
    a: &dyn SemaphoreStore,
    b: &dyn SemaphoreStore,
    key: &StoreKey,
) {
    let ttl = Ttl::new(Duration::from_secs(60)).expect("a valid ttl");
    let (first, waiting, again) = (Holder::random(), Holder::random(), Holder::random());
    let claim = async |store: &dyn SemaphoreStore, holder: &Holder| {
        store
            .claim_permit(key, LeaseRequest::new(holder, ttl), 1)
            .await
            .expect("a permit claim")
    };
    assert!(matches!(claim(a, &first).await, Claim::Granted { .. }));
    // A waiter of b's process waits for the key: b's claim queues b.
    let _waits = b.permit_wakeups().hub.subscribe(key);
    assert!(matches!(claim(b, &waiting).await, Claim::Held { .. }));
    assert_eq!(
        a.release_permit(key, &first).await.expect("a release"),
        Release::Removed
    );
    match claim(a, &again).await {
        Claim::Held { holder, remaining } => {
            assert!(
                holder.as_str().starts_with("handoff:"),
                "held by the reservation, not {holder}"
            );
            assert!(remaining <= Duration::from_millis(250), "{remaining:?}");
        }
        other => panic!("the releaser cut in before the queued store: {other:?}"),
    }
    assert!(
        a.permits(key).await.expect("the holders").is_empty(),
        "a reservation is not a holder"
    );
    assert!(matches!(claim(b, &waiting).await, Claim::Granted { .. }));
    assert_eq!(
        b.release_permit(key, &waiting).await.expect("a release"),
        Release::Removed
    );
}

/// Stores take permits in the order they queued. With the only permit of `key` (in `ns`)
/// held through a store from `open`, three other stores from `open` queue one after another
/// (`queued` counts the stores queued for the key); the holder gives its permit back and asks
/// again at once, and still comes last: the fences of the four grants follow that order.
///
/// # Panics
/// When the order is broken, a waiter is not served within 30 s, or a store faults.
pub async fn stores_take_permits_in_the_order_they_queued<O, OF, Q, QF>(
    open: O,
    ns: &Namespace,
    key: &str,
    queued: Q,
) where
    O: Fn() -> OF,
    OF: Future<Output = Arc<dyn SemaphoreStore>>,
    Q: Fn() -> QF,
    QF: Future<Output = usize>,
{
    let sem = |store| Semaphore::new(store, ns.clone(), key, 1).expect("a valid semaphore");
    let long = LockOptions::new(Duration::from_secs(60));
    let mine = sem(open().await);
    let held = mine
        .try_acquire(&long)
        .await
        .expect("a claim")
        .expect("free");
    let mut waiters = Vec::new();
    for n in 1..=3 {
        let other = sem(open().await);
        let wait = long.clone().wait(Duration::from_secs(30));
        waiters.push(tokio::spawn(async move {
            let got = other.acquire(&wait).await.expect("its turn");
            let fence = got.fence().get();
            got.release().await;
            fence
        }));
        let deadline = tokio::time::Instant::now() + PATIENCE;
        while queued().await != n {
            assert!(tokio::time::Instant::now() < deadline, "{n} stores queued");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    held.release().await;
    let again = mine
        .acquire(&long.clone().wait(Duration::from_secs(30)))
        .await
        .expect("a permit after the others");
    let mut fences = Vec::new();
    for waiter in waiters {
        fences.push(waiter.await.expect("a waiter task"));
    }
    assert!(
        fences.windows(2).all(|w| w[0] < w[1]),
        "permits follow the order of queueing: {fences:?}"
    );
    assert!(
        again.fence().get() > fences[2],
        "the releaser asked again at once and still came last: {} before {fences:?}",
        again.fence()
    );
    again.release().await;
}
