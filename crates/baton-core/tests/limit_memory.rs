//! Rate limits on the in-memory store: the conformance rules, and property tests of the
//! algorithm with a fake clock.
//!
//! The properties: whatever the quota and however requests arrive, no window of length
//! `window` ever holds more than `max` admitted units; and `retry_after` is exact (the
//! request fits after exactly that long, not a microsecond earlier, if nothing else is
//! admitted meanwhile).

use std::sync::Arc;
use std::time::Duration;

use baton_core::limit::window::{SlidingLog, resolution};
use baton_core::time::ManualClock;
use baton_core::{MemoryStore, Quota, RateLimiter};
use baton_testkit::harness::Kept;
use proptest::prelude::*;

baton_core::rate_limit_conformance_tests!(async { Kept::new(MemoryStore::new()) });

/// One request: how far the clock moves first (a fraction of the window, in thousandths;
/// zero for bursts) and how many units it asks for.
fn requests() -> impl Strategy<Value = Vec<(u64, u32)>> {
    prop::collection::vec(
        (
            prop_oneof![2 => Just(0u64), 5 => 0u64..600, 1 => 600u64..2500],
            1u32..=8,
        ),
        1..400,
    )
}

/// Units admitted at each time, and the most that any window `(t - window, t]` ending at
/// an admission holds.
fn most_in_any_window(admitted: &[(u64, u32)], window: u64) -> u64 {
    admitted
        .iter()
        .map(|&(t, _)| {
            admitted
                .iter()
                .filter(|&&(s, _)| s + window > t && s <= t)
                .map(|&(_, units)| u64::from(units))
                .sum()
        })
        .max()
        .unwrap_or(0)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// The algorithm alone, on exact microsecond times.
    #[test]
    fn the_log_never_admits_more_than_max_in_any_window(
        max in 1u32..=16,
        window_ms in 10u64..=5_000,
        start_us in 0u64..10_000_000,
        requests in requests(),
    ) {
        let quota = Quota::new(max, Duration::from_millis(window_ms)).unwrap();
        let window = quota.window_us();
        let mut log = SlidingLog::new();
        let mut now = start_us;
        let mut admitted = Vec::new();
        for (advance, cost) in requests {
            now += window * advance / 1000;
            let cost = cost.min(max);
            let decision = log.admit(now, cost, quota);
            if decision.allowed {
                admitted.push((now, cost));
                prop_assert_eq!(decision.retry_after, Duration::ZERO);
            } else {
                prop_assert!(decision.retry_after > Duration::ZERO);
                prop_assert!(decision.retry_after <= quota.window() + Duration::from_micros(resolution(window)));
                // retry_after is exact: one microsecond earlier still does not fit, and at
                // retry_after it does (on a copy, so the history is not changed).
                let wait = decision.retry_after.as_micros() as u64;
                let mut early = log.clone();
                prop_assert!(!early.admit(now + wait - 1, cost, quota).allowed);
                let mut on_time = log.clone();
                prop_assert!(on_time.admit(now + wait, cost, quota).allowed);
            }
            prop_assert!(log.entries().len() as u64 <= 1001, "the log is bounded");
        }
        let most = most_in_any_window(&admitted, window);
        prop_assert!(most <= u64::from(max), "{} units in one window of {}µs; max {}", most, window, max);
    }

    /// The whole memory store, through `RateLimiter`, on a fake clock.
    #[test]
    fn the_memory_limiter_never_admits_more_than_max_in_any_window(
        max in 1u32..=10,
        window_ms in 10u64..=2_000,
        requests in requests(),
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let clock = ManualClock::new();
        let window = Duration::from_millis(window_ms);
        let limiter = RateLimiter::new(
            Arc::new(MemoryStore::with_clock(Arc::new(clock.clone()))),
            Quota::new(max, window).unwrap(),
        );
        let window_us = window.as_micros() as u64;
        let mut now = 0u64;
        let mut admitted = Vec::new();
        runtime.block_on(async {
            for (advance, cost) in requests {
                let step = window_us * advance / 1000;
                clock.advance(Duration::from_micros(step));
                now += step;
                let cost = cost.min(max);
                let decision = limiter.try_acquire("k", cost).await.unwrap();
                if decision.allowed {
                    admitted.push((now, cost));
                }
            }
        });
        let most = most_in_any_window(&admitted, window_us);
        prop_assert!(most <= u64::from(max), "{} units in one window; max {}", most, max);
    }
}

/// GCRA's signature burst-then-refill is refused: after a burst of `max`, nothing more is
/// admitted until the burst's window has passed, so a window never holds `2 * max - 1`.
#[test]
fn a_burst_then_steady_traffic_stays_within_max() {
    let quota = Quota::new(10, Duration::from_secs(1)).unwrap();
    let mut log = SlidingLog::new();
    let mut admitted = Vec::new();
    // A burst of 10 at t = 0, then one request every 1/10 s.
    for _ in 0..10 {
        assert!(log.admit(0, 1, quota).allowed);
        admitted.push((0, 1));
    }
    for i in 1..40u64 {
        let t = i * 100_000;
        if log.admit(t, 1, quota).allowed {
            admitted.push((t, 1));
        }
    }
    assert_eq!(most_in_any_window(&admitted, 1_000_000), 10);
    // The burst left at t = 1 s; after that the steady rate is admitted.
    assert!(
        admitted
            .iter()
            .filter(|(t, _)| *t > 0)
            .all(|(t, _)| *t >= 1_000_000)
    );
    assert!(admitted.len() >= 10 + 29, "{}", admitted.len());
}
