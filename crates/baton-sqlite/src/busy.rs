//! Waiting for another connection's write lock: short, bounded sleeps up to `busy_timeout`.
//!
//! SQLite's own busy handler (what `PRAGMA busy_timeout` installs) sleeps 1, 2, 5, 10, ...
//! up to 100ms between retries. Baton's transactions hold the lock for microseconds (or one
//! disk sync), so a waiter that sleeps 100ms lets others overtake it again and again: with
//! four processes on one file, single operations took up to a second, long enough to make a
//! keep-alive miss its lease. This handler retries after 50µs, doubling up to 2ms, until the
//! operation's `busy_timeout` has passed, and then gives up (`Unavailable`).
//!
//! The handler is a plain function (SQLite's callback carries no state of ours), so the
//! deadline of the operation running on this thread is kept in a thread local, set by
//! [`within`] around every use of a connection.

use std::cell::Cell;
use std::time::{Duration, Instant};

thread_local! {
    static DEADLINE: Cell<Option<Instant>> = const { Cell::new(None) };
}

const FIRST_SLEEP: Duration = Duration::from_micros(50);
const LONGEST_SLEEP: Duration = Duration::from_millis(2);

/// Runs `f` with `timeout` as the busy timeout of every statement it runs on this thread.
pub(crate) fn within<T>(timeout: Duration, f: impl FnOnce() -> T) -> T {
    let outer = DEADLINE.replace(Some(Instant::now() + timeout));
    let result = f();
    DEADLINE.set(outer);
    result
}

/// The busy handler installed on every connection: `true` to retry, `false` to give up.
pub(crate) fn handler(retries: i32) -> bool {
    let Some(deadline) = DEADLINE.get() else {
        return false;
    };
    let now = Instant::now();
    if now >= deadline {
        return false;
    }
    std::thread::sleep(pause(retries).min(deadline - now));
    true
}

/// The sleep before retry number `retries` (from 0): 50µs, doubling, at most 2ms.
fn pause(retries: i32) -> Duration {
    let doublings = retries.clamp(0, 16) as u32;
    FIRST_SLEEP
        .saturating_mul(1 << doublings)
        .min(LONGEST_SLEEP)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_sleeps_doubling_to_two_milliseconds() {
        let pauses: Vec<u128> = (0..8).map(|n| pause(n).as_micros()).collect();
        assert_eq!(pauses, [50, 100, 200, 400, 800, 1600, 2000, 2000]);
        assert_eq!(pause(i32::MAX), LONGEST_SLEEP);
    }

    #[test]
    fn gives_up_outside_an_operation_and_after_the_deadline() {
        assert!(!handler(0), "no operation, no waiting");
        within(Duration::from_millis(20), || {
            let start = Instant::now();
            let mut retries = 0;
            while handler(retries) {
                retries += 1;
            }
            let waited = start.elapsed();
            assert!(waited >= Duration::from_millis(20), "{waited:?}");
        });
        assert!(!handler(0), "the deadline ends with the operation");
    }

    #[test]
    fn nested_operations_restore_the_outer_deadline() {
        within(Duration::from_secs(60), || {
            within(Duration::ZERO, || assert!(!handler(0)));
            assert!(handler(0));
        });
    }
}
