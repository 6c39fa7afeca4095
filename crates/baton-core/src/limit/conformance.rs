//! The rate-limit conformance rules: written once, run by every store that implements
//! [`RateStore`].
//!
//! A store's test target implements [`Opens`] for its store (the
//! [`LimitHarness`]) and expands
//! [`rate_limit_conformance_tests!`](crate::rate_limit_conformance_tests)
//! (`baton_core::rate_limit_conformance_tests!(my_harness())`), which generates one
//! `#[tokio::test]` per rule. Each rule uses a fresh random namespace, so rules may share a
//! server. Every wait is generous and no rule asserts how fast anything happened.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::{Instant, sleep};

use super::{Decision, LimitError, Quota, RateLimiter, RateStore};
use crate::conformance::{Faulty, Opens, fresh_namespace, ms};
use crate::error::Result;
use crate::key::StoreKey;

/// What a store's test target provides to the rate-limit rules: the store under test, as
/// [`RateStore`].
pub type LimitHarness = dyn Opens<dyn RateStore>;

/// Generates one `#[tokio::test]` per rate-limit rule. `$harness` is an expression that
/// evaluates to a future of a [`LimitHarness`]; it is evaluated once per test.
#[macro_export]
macro_rules! rate_limit_conformance_tests {
    ($harness:expr) => {
        $crate::__conformance_rules!($crate::limit::conformance; $harness;
            admits_up_to_max_then_denies,
            costs_count_units,
            retry_after_is_honoured,
            no_burst_at_window_edges,
            keys_and_namespaces_are_separate,
            never_over_admits_under_concurrency,
            acquire_waits_until_admitted,
            never_and_invalid_input_are_rejected_before_io,
            store_faults_fail_closed,
        );
    };
}

async fn limiter(h: &LimitHarness) -> RateLimiter {
    limiter_on(h.open().await)
}

/// A limiter in a fresh namespace; each rule binds its quotas with [`quota`].
fn limiter_on(store: Arc<dyn RateStore>) -> RateLimiter {
    RateLimiter::with_namespace(store, fresh_namespace(), quota(1, Duration::from_secs(1)))
}

fn quota(max: u32, window: Duration) -> Quota {
    Quota::new(max, window).unwrap_or_else(|e| panic!("quota {max} per {window:?}: {e}"))
}

async fn take(limiter: &RateLimiter, key: &str, n: u32, max: u32, window: Duration) -> Decision {
    limiter
        .with_quota(quota(max, window))
        .try_acquire(key, n)
        .await
        .unwrap_or_else(|e| panic!("try_acquire({key}, {n}, {max}, {window:?}): {e}"))
}

/// `max` single units are admitted with `remaining` counting down; the next is denied with a
/// `retry_after` inside the window.
pub async fn admits_up_to_max_then_denies(h: &LimitHarness) {
    let limiter = limiter(h).await;
    let window = Duration::from_secs(30);
    for left in (0..5).rev() {
        let d = take(&limiter, "k", 1, 5, window).await;
        assert!(d.allowed, "{d:?}");
        assert_eq!(d.remaining, left);
        assert_eq!(d.retry_after, Duration::ZERO);
    }
    let d = take(&limiter, "k", 1, 5, window).await;
    assert!(!d.allowed, "the sixth unit in the window was admitted");
    assert_eq!(d.remaining, 0);
    // At most the window plus one slot (units count from the end of their slot).
    let slot = Duration::from_micros(super::window::resolution(window.as_micros() as u64));
    assert!(
        d.retry_after > Duration::ZERO && d.retry_after <= window + slot,
        "{d:?}"
    );
}

/// A request of `n` units takes `n` units, and is denied whole when they do not all fit.
pub async fn costs_count_units(h: &LimitHarness) {
    let limiter = limiter(h).await;
    let window = Duration::from_secs(30);
    let d = take(&limiter, "k", 7, 10, window).await;
    assert!(d.allowed && d.remaining == 3, "{d:?}");
    let d = take(&limiter, "k", 4, 10, window).await;
    assert!(!d.allowed && d.remaining == 3, "denied whole: {d:?}");
    let d = take(&limiter, "k", 3, 10, window).await;
    assert!(d.allowed && d.remaining == 0, "{d:?}");
}

/// Waiting `retry_after` after a denial is enough for the units to fit.
pub async fn retry_after_is_honoured(h: &LimitHarness) {
    let limiter = limiter(h).await;
    let window = ms(400);
    assert!(take(&limiter, "k", 3, 3, window).await.allowed);
    let d = take(&limiter, "k", 2, 3, window).await;
    assert!(!d.allowed, "{d:?}");
    assert!(d.retry_after <= window + ms(5), "{d:?}");
    sleep(d.retry_after).await;
    let d = take(&limiter, "k", 2, 3, window).await;
    assert!(d.allowed, "denied again after waiting retry_after: {d:?}");
}

/// A full burst blocks the key for the whole window: the log does not refill gradually
/// (GCRA would admit again after `window / max`), so there is no second burst at the edge.
pub async fn no_burst_at_window_edges(h: &LimitHarness) {
    let limiter = limiter(h).await;
    let window = Duration::from_secs(2);
    let started = Instant::now();
    assert!(take(&limiter, "k", 4, 4, window).await.allowed);
    sleep(ms(600)).await;
    let d = take(&limiter, "k", 1, 4, window).await;
    if started.elapsed() < window - ms(100) {
        assert!(
            !d.allowed,
            "admitted again inside the burst's window: {d:?}"
        );
        // The burst leaves at once, at the end of its window.
        assert!(d.retry_after >= ms(100), "{d:?}");
    }
}

/// Keys, and the same key in another namespace, have separate budgets.
pub async fn keys_and_namespaces_are_separate(h: &LimitHarness) {
    let store = h.open().await;
    let a = limiter_on(Arc::clone(&store));
    let b = limiter_on(store);
    let window = Duration::from_secs(30);
    assert!(take(&a, "k", 2, 2, window).await.allowed);
    assert!(!take(&a, "k", 1, 2, window).await.allowed);
    assert!(take(&a, "other", 2, 2, window).await.allowed);
    assert!(take(&b, "k", 2, 2, window).await.allowed);
}

/// One admission as the client saw it: sent at `sent`, answered at `answered`. The store
/// decided somewhere in between.
#[derive(Debug, Clone, Copy)]
struct Seen {
    sent: Instant,
    answered: Instant,
    units: u32,
}

/// Units of the admissions that surely happened within one window: for each admission `a`
/// (by send time), those sent no earlier than `a` and answered before `a.sent + window`.
/// Their store times all lie in `[a.sent, a.sent + window)`, whatever the clocks' offset.
fn most_in_one_window(seen: &[Seen], window: Duration) -> u32 {
    let mut most = 0;
    for a in seen {
        let units = seen
            .iter()
            .filter(|b| b.sent >= a.sent && b.answered < a.sent + window)
            .map(|b| b.units)
            .sum();
        most = most.max(units);
    }
    most
}

/// 64 tasks hammering one key never get more than `max` units admitted in any window.
pub async fn never_over_admits_under_concurrency(h: &LimitHarness) {
    let limiter = limiter(h).await;
    let (max, window) = (12, Duration::from_secs(1));
    let run_for = Duration::from_secs(3);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for task in 0..64u32 {
        let limiter = limiter.clone();
        tasks.push(tokio::spawn(async move {
            let mut seen = Vec::new();
            let mut denied = 0usize;
            let mut round = 0u32;
            while started.elapsed() < run_for {
                let units = 1 + (task + round) % 3;
                round += 1;
                let sent = Instant::now();
                let d = limiter
                    .with_quota(quota(max, window))
                    .try_acquire("hot", units)
                    .await
                    .expect("no store fault");
                let answered = Instant::now();
                if d.allowed {
                    seen.push(Seen {
                        sent,
                        answered,
                        units,
                    });
                } else {
                    denied += 1;
                }
                sleep(ms(u64::from(task % 4))).await;
            }
            (seen, denied)
        }));
    }
    let mut seen = Vec::new();
    let mut denied = 0;
    for task in tasks {
        let (mine, no) = task.await.expect("task");
        seen.extend(mine);
        denied += no;
    }
    seen.sort_by_key(|s| s.sent);
    let admitted: u32 = seen.iter().map(|s| s.units).sum();
    assert!(
        denied > 0,
        "64 tasks were never denied: the test proved nothing"
    );
    assert!(
        admitted >= max,
        "only {admitted} units admitted in {run_for:?}"
    );
    let most = most_in_one_window(&seen, window);
    assert!(
        most <= max,
        "{most} units admitted within one window of {window:?}; the quota is {max}"
    );
}

/// `acquire` sleeps until the units fit, then takes them.
pub async fn acquire_waits_until_admitted(h: &LimitHarness) {
    let limiter = limiter(h).await;
    let window = ms(300);
    let started = Instant::now();
    assert!(take(&limiter, "k", 2, 2, window).await.allowed);
    let d = limiter
        .with_quota(quota(2, window))
        .acquire("k", 2, Duration::from_secs(30))
        .await
        .expect("admitted within the wait");
    assert!(d.allowed);
    // The first units were admitted after `started` and counted for the whole window.
    assert!(started.elapsed() >= ms(250), "{:?}", started.elapsed());
    // A wait that cannot be enough is answered at once.
    let day = Duration::from_secs(86_400);
    assert!(take(&limiter, "full", 2, 2, day).await.allowed);
    let started = Instant::now();
    match limiter
        .with_quota(quota(2, day))
        .acquire("full", 1, Duration::from_secs(60))
        .await
    {
        Err(LimitError::Denied { retry_after, .. }) => {
            assert!(retry_after > Duration::from_secs(60))
        }
        other => panic!("expected Denied, got {other:?}"),
    }
    assert!(
        started.elapsed() < Duration::from_secs(50),
        "slept through a hopeless wait"
    );
}

/// "Never" (a cost above `max`) and invalid input are answered without touching the store.
pub async fn never_and_invalid_input_are_rejected_before_io(h: &LimitHarness) {
    let store = Arc::new(FaultyRateStore::new(h.open().await));
    let limiter = limiter_on(store.clone());
    let second = Duration::from_secs(1);
    match limiter
        .with_quota(quota(5, second))
        .try_acquire("k", 6)
        .await
    {
        Err(LimitError::InsufficientCapacity { cost: 6, max: 5 }) => {}
        other => panic!("expected InsufficientCapacity, got {other:?}"),
    }
    match limiter
        .with_quota(quota(5, second))
        .acquire("k", 6, second)
        .await
    {
        Err(LimitError::InsufficientCapacity { .. }) => {}
        other => panic!("expected InsufficientCapacity, got {other:?}"),
    }
    let limiter = limiter.with_quota(quota(5, second));
    for (key, n) in [("", 1), ("a\nb", 1), ("k", 0)] {
        match limiter.try_acquire(key, n).await {
            Err(LimitError::InvalidInput(e)) => assert!(e.is_invalid_input()),
            other => panic!("({key:?}, {n}): expected InvalidInput, got {other:?}"),
        }
    }
    // A bad quota cannot be built, so no limiter ever holds one.
    for (max, window) in [
        (0, second),
        (5, ms(9)),
        (5, Duration::from_secs(31 * 24 * 3600)),
    ] {
        let e = Quota::new(max, window).unwrap_err();
        assert!(e.is_invalid_input(), "{max} per {window:?}: {e}");
    }
    assert_eq!(store.calls(), 0, "rejected input reached the store");
}

/// A store fault is `Unavailable` and admits nothing; the budget is whole afterwards.
pub async fn store_faults_fail_closed(h: &LimitHarness) {
    let store = Arc::new(FaultyRateStore::new(h.open().await));
    let limiter = limiter_on(store.clone());
    let window = Duration::from_secs(30);
    store.set_failing(true);
    for _ in 0..3 {
        match limiter
            .with_quota(quota(3, window))
            .try_acquire("k", 1)
            .await
        {
            Err(e @ LimitError::Unavailable(_)) => assert!(e.is_retryable()),
            other => panic!("expected Unavailable, got {other:?}"),
        }
    }
    match limiter
        .with_quota(quota(3, window))
        .acquire("k", 1, Duration::from_secs(1))
        .await
    {
        Err(LimitError::Unavailable(_)) => {}
        other => panic!("acquire: expected Unavailable, got {other:?}"),
    }
    store.set_failing(false);
    let d = take(&limiter, "k", 3, 3, window).await;
    assert!(d.allowed, "faulted calls took units: {d:?}");
}

/// A [`RateStore`] wrapper that counts calls and fails them on demand.
pub type FaultyRateStore = Faulty<dyn RateStore>;

#[async_trait]
impl RateStore for FaultyRateStore {
    async fn admit(&self, key: &StoreKey, cost: u32, quota: Quota) -> Result<Decision> {
        self.enter()?;
        self.inner.admit(key, cost, quota).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_window_check_counts_only_sure_overlaps() {
        let t0 = Instant::now();
        let at = |sent: u64, answered: u64| Seen {
            sent: t0 + ms(sent),
            answered: t0 + ms(answered),
            units: 1,
        };
        let window = ms(100);
        // Both surely inside [0, 100).
        assert_eq!(most_in_one_window(&[at(0, 10), at(50, 60)], window), 2);
        // The second may have been decided at 100 or later.
        assert_eq!(most_in_one_window(&[at(0, 10), at(50, 150)], window), 1);
    }
}
