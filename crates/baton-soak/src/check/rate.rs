//! The rate limit: no window of [`RATE_WINDOW`] ever holds more than [`RATE_MAX`] admitted
//! units.
//!
//! The store decided each admission at some moment between the call's invocation and its
//! completion. A set of admissions certainly fell inside one window when the latest
//! completion among them came less than the window (minus [`CLOCK_TOLERANCE`]) after the
//! earliest invocation; the checker looks, for every admission in invocation order, at the
//! admissions invoked after it that completed inside such a window, and reports the first
//! such set whose units exceed the limit. Calls that failed or never completed are not
//! counted: the limiter fails closed, and a unit it may have counted without telling anyone
//! only makes it stricter.

use baton_testkit::MonoTime;

use super::{CLOCK_TOLERANCE, CheckReport, Losses};
use crate::journal::{Op, Operation};
use crate::workload::{RATE_MAX, RATE_WINDOW};

/// One admission: invoked, completed, units.
#[derive(Debug, Clone, Copy)]
struct Admission {
    invoked: MonoTime,
    completed: MonoTime,
    units: u64,
}

/// Runs the rate-limit checker.
pub fn check(operations: &[Operation<'_>], losses: &Losses, report: &mut CheckReport) {
    let mut decisions = 0u64;
    let mut admitted: Vec<Admission> = Vec::new();
    for op in operations {
        let event = op.any();
        if event.op != Op::RateAcquire || !op.is_ok() {
            continue;
        }
        decisions += 1;
        let (Some(invoke), Some(done)) = (op.invoke, op.done) else {
            continue;
        };
        if done.detail.accepted == Some(true) {
            admitted.push(Admission {
                invoked: invoke.at,
                completed: done.at,
                units: invoke.detail.value.unwrap_or(1),
            });
        }
    }
    report.stat("rate decisions", decisions);
    report.stat(
        "rate units admitted",
        admitted.iter().map(|a| a.units).sum(),
    );
    report.checked(
        "rate-limit",
        format!(
            "{} admissions in {decisions} decisions, at most {RATE_MAX} units per {}ms",
            admitted.len(),
            RATE_WINDOW.as_millis()
        ),
    );
    for (key, window_end, set) in
        over_limit(admitted, RATE_MAX.into(), RATE_WINDOW - CLOCK_TOLERANCE)
    {
        let units: u64 = set.iter().map(|a| a.units).sum();
        let first = set.iter().map(|a| a.invoked).min().expect("a set");
        let last = set.iter().map(|a| a.completed).max().expect("a set");
        report.find(
            "rate-limit",
            crate::workload::RATE_KEY,
            format!(
                "{units} units in {} admissions inside [+{:.3}s, +{:.3}s), limit {RATE_MAX}",
                set.len(),
                super::secs(key, losses.start),
                super::secs(window_end, losses.start),
            ),
            losses.explain(first, last),
        );
    }
}

/// The windows holding more than `max` units: (window start, window end, admissions).
fn over_limit(
    mut admitted: Vec<Admission>,
    max: u64,
    window: std::time::Duration,
) -> Vec<(MonoTime, MonoTime, Vec<Admission>)> {
    admitted.sort_by_key(|a| a.invoked);
    let mut found = Vec::new();
    let mut i = 0;
    while i < admitted.len() {
        let start = admitted[i].invoked;
        let end = start + window;
        let set: Vec<Admission> = admitted[i..]
            .iter()
            .take_while(|a| a.invoked < end)
            .filter(|a| a.completed < end)
            .copied()
            .collect();
        if set.iter().map(|a| a.units).sum::<u64>() > max {
            found.push((start, end, set));
            // One report per burst: go on after this window.
            i = admitted.partition_point(|a| a.invoked < end);
        } else {
            i += 1;
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn a(invoked_ms: u64, completed_ms: u64, units: u64) -> Admission {
        Admission {
            invoked: MonoTime::from_nanos(invoked_ms * 1_000_000),
            completed: MonoTime::from_nanos(completed_ms * 1_000_000),
            units,
        }
    }

    #[test]
    fn the_limit_spread_over_a_window_passes_and_one_unit_more_fails() {
        let w = Duration::from_millis(1_000);
        // 4 units in one window, then 4 more a window later: fine for max 4.
        let ok = vec![a(0, 5, 2), a(10, 20, 2), a(1_000, 1_010, 4)];
        assert!(over_limit(ok, 4, w).is_empty());
        let over = vec![a(0, 5, 2), a(10, 20, 2), a(990, 995, 1)];
        let found = over_limit(over, 4, w);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].2.len(), 3);
    }

    #[test]
    fn an_admission_that_may_have_been_decided_outside_the_window_is_not_counted() {
        let w = Duration::from_millis(1_000);
        // The third call completed after the window: the store may have admitted it later.
        let slow = vec![a(0, 5, 2), a(10, 20, 2), a(500, 1_200, 1)];
        assert!(over_limit(slow, 4, w).is_empty());
    }
}
