//! The rate-limit algorithm: a sliding log of admissions, rounded against the caller.
//!
//! This is the one definition of what a store's rate-limit atom computes. The memory and
//! SQLite stores run this code; the Redis script (`baton-redis/scripts/limit.lua`) is a
//! line-by-line transcription of it, and the conformance suite checks that every store
//! answers alike.
//!
//! ## Why not GCRA
//! GCRA (a leaky bucket in virtual time) allows a burst of `max` and then refills at
//! `max / window`; after an idle period it admits `2 * max - 1` units within one window (the
//! burst, then the refill). The contract here is stricter: **no window of length `window`
//! ever holds more than `max` admitted units**, also at the edges. To know when a burst's
//! units leave the window, a limiter must remember when they were admitted: a log.
//!
//! ## The log
//! Time is split into slots of [`resolution`] microseconds (1 ms, or `window / 1000` for
//! windows over one second). Admitted units are recorded against the *end* of the slot
//! they were admitted in, so each unit is remembered for at least `window` after its true
//! admission time and at most one slot longer. The log holds one `(slot end, units)` entry
//! per slot that admitted something, so at most `SLOTS + 1` entries, whatever `max` is.
//!
//! A request of `n` units at time `now`:
//! 1. forgets entries whose `end + window <= now` (they left every window containing `now`);
//! 2. admits when `live + n <= max`, adding `n` to the entry of the current slot;
//! 3. otherwise denies, with `retry_after` the time until enough of the oldest units leave.
//!
//! ## Guarantee
//! Every unit admitted in `(now - window, now]` is still in the log at `now` (its slot end
//! is no earlier than its admission), so an admission never lifts the count of any
//! half-open window `[t, t + window)` above `max`. The rounding only errs towards denying:
//! a unit may be counted up to one slot longer than it needs to be.
//!
//! If the store's clock steps back, new units join the newest entry (the log stays ordered)
//! and old units leave later than they would have: the limiter denies more, never admits more.

use std::collections::VecDeque;
use std::time::Duration;

use super::Decision;
use super::quota::Quota;

/// Most slots one window is divided into.
pub const SLOTS: u64 = 1000;
/// Finest slot, in microseconds.
pub const MIN_RESOLUTION_US: u64 = 1000;

/// The slot length for a window of `window_us` microseconds: 1 ms, or `window / 1000`
/// rounded up for windows over one second.
pub fn resolution(window_us: u64) -> u64 {
    window_us.div_ceil(SLOTS).max(MIN_RESOLUTION_US)
}

/// The admissions of one key that may still count: `(slot end in µs, units)`, oldest first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SlidingLog {
    entries: VecDeque<(u64, u64)>,
    total: u64,
}

impl SlidingLog {
    /// An empty log.
    pub fn new() -> Self {
        SlidingLog::default()
    }

    /// A log from stored entries, oldest first. Entries out of order or with zero units are
    /// refused (`None`): the store holds something this code did not write.
    pub fn from_entries(entries: impl IntoIterator<Item = (u64, u64)>) -> Option<Self> {
        let mut log = SlidingLog::new();
        for (end, units) in entries {
            if units == 0 || log.entries.back().is_some_and(|&(last, _)| last >= end) {
                return None;
            }
            log.total = log.total.checked_add(units)?;
            log.entries.push_back((end, units));
        }
        Some(log)
    }

    /// The entries, oldest first.
    pub fn entries(&self) -> impl ExactSizeIterator<Item = (u64, u64)> + '_ {
        self.entries.iter().copied()
    }

    /// Units in the log (some may have left the window since the last step).
    pub fn total(&self) -> u64 {
        self.total
    }

    /// Whether the log is empty.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// When every entry will have left the window: the store may forget the key then.
    pub fn forgettable_at(&self, window_us: u64) -> Option<u64> {
        self.entries.back().map(|&(end, _)| end + window_us)
    }

    /// One decision for `cost` units at `now_us` (microseconds on the store's clock).
    /// The caller has checked `1 <= cost <= quota.max()`.
    pub fn admit(&mut self, now_us: u64, cost: u32, quota: Quota) -> Decision {
        let window = quota.window_us();
        let max = u64::from(quota.max());
        let cost = u64::from(cost);
        while let Some(&(end, units)) = self.entries.front() {
            if end + window > now_us {
                break;
            }
            self.entries.pop_front();
            self.total -= units;
        }
        if self.total + cost <= max {
            let slot = resolution(window);
            let end = now_us.div_ceil(slot) * slot;
            match self.entries.back_mut() {
                // The clock stepped back, or the same slot: join the newest entry.
                Some((last, units)) if *last >= end => *units += cost,
                _ => self.entries.push_back((end, cost)),
            }
            self.total += cost;
            return Decision {
                allowed: true,
                remaining: clamp(max - self.total),
                retry_after: Duration::ZERO,
            };
        }
        // `cost <= max`, so `need <= total`: the walk always ends inside the log.
        let need = self.total + cost - max;
        let mut freed = 0;
        let mut free_at = now_us;
        for &(end, units) in &self.entries {
            freed += units;
            if freed >= need {
                free_at = end + window;
                break;
            }
        }
        Decision {
            allowed: false,
            remaining: clamp(max.saturating_sub(self.total)),
            retry_after: Duration::from_micros(free_at.saturating_sub(now_us)),
        }
    }
}

fn clamp(units: u64) -> u32 {
    u32::try_from(units).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quota(max: u32, window_ms: u64) -> Quota {
        Quota::new(max, Duration::from_millis(window_ms)).unwrap()
    }

    #[test]
    fn resolutions() {
        assert_eq!(resolution(10_000), 1000);
        assert_eq!(resolution(1_000_000), 1000);
        assert_eq!(resolution(1_000_001), 1001);
        assert_eq!(resolution(86_400_000_000), 86_400_000);
    }

    #[test]
    fn burst_then_nothing_until_the_burst_leaves() {
        let q = quota(3, 1000);
        let mut log = SlidingLog::new();
        let t0 = 5_000_000;
        for left in [2, 1, 0] {
            let d = log.admit(t0, 1, q);
            assert!(d.allowed);
            assert_eq!(d.remaining, left);
        }
        // GCRA would admit again at t0 + window/max; the window still holds 3.
        let d = log.admit(t0 + 400_000, 1, q);
        assert!(!d.allowed);
        assert_eq!(d.remaining, 0);
        assert_eq!(d.retry_after, Duration::from_millis(600));
        assert!(!log.admit(t0 + 999_999, 1, q).allowed);
        let d = log.admit(t0 + 1_000_000, 3, q);
        assert!(d.allowed, "{d:?}");
        assert_eq!(log.total(), 3);
    }

    #[test]
    fn retry_after_waits_for_enough_units_to_leave() {
        let q = quota(4, 1000);
        let mut log = SlidingLog::new();
        assert!(log.admit(1_000_000, 1, q).allowed);
        assert!(log.admit(1_100_000, 1, q).allowed);
        assert!(log.admit(1_200_000, 2, q).allowed);
        // 3 more units need 3 of the 4 to leave: the entries of 1, 1 and 2 units, so the
        // third entry's end plus the window.
        let d = log.admit(1_300_000, 3, q);
        assert!(!d.allowed);
        assert_eq!(d.retry_after, Duration::from_millis(900));
        let d = log.admit(1_300_000, 1, q);
        assert_eq!(d.retry_after, Duration::from_millis(700));
        assert!(log.admit(2_000_000, 1, q).allowed);
    }

    #[test]
    fn units_are_rounded_up_to_their_slot_end() {
        let q = quota(1, 1000);
        let mut log = SlidingLog::new();
        assert!(log.admit(1_000_001, 1, q).allowed);
        assert_eq!(log.entries().collect::<Vec<_>>(), [(1_001_000, 1)]);
        let d = log.admit(2_000_001, 1, q);
        assert!(!d.allowed, "counted until its slot end plus the window");
        assert_eq!(d.retry_after, Duration::from_micros(999));
        assert!(log.admit(2_001_000, 1, q).allowed);
    }

    #[test]
    fn a_clock_stepping_back_never_admits_more() {
        let q = quota(2, 1000);
        let mut log = SlidingLog::new();
        assert!(log.admit(10_000_000, 1, q).allowed);
        assert!(log.admit(9_000_000, 1, q).allowed);
        assert_eq!(log.entries().count(), 1, "joined the newest entry");
        assert!(!log.admit(10_500_000, 1, q).allowed);
        assert!(log.admit(11_000_000, 2, q).allowed);
    }

    #[test]
    fn stored_entries_are_checked() {
        assert!(SlidingLog::from_entries([(1, 2), (3, 4)]).is_some());
        assert!(SlidingLog::from_entries([(3, 2), (3, 4)]).is_none());
        assert!(SlidingLog::from_entries([(3, 0)]).is_none());
        assert_eq!(
            SlidingLog::from_entries([(1, 2), (3, 4)]).unwrap().total(),
            6
        );
    }
}
