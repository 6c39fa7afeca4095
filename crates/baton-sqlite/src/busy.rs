//! Waiting for another connection's write lock: a short spin, then bounded sleeps, up to
//! `busy_timeout`.
//!
//! SQLite's own busy handler (what `PRAGMA busy_timeout` installs) sleeps 1, 2, 5, 10, ...
//! up to 100ms between retries. Baton's transactions hold the lock for microseconds (or one
//! disk sync), so a waiter that sleeps 100ms lets others overtake it again and again: with
//! four processes on one file, single operations took up to a second, long enough to make a
//! keep-alive miss its lease. Even a first sleep of 50µs costs more than it saves: a claim
//! that queues holds the lock for about 50µs, and a release that found it so slept 50µs, then
//! 100µs, and handed its key on about 150µs late (measured with 8 processes on one key). So
//! this handler first yields the thread and retries at once, for [`SPIN`] from the lock
//! attempt's first busy answer, then sleeps as long as it has waited so far (doubling), at
//! most [`LONGEST_SLEEP`], until the operation's `busy_timeout` has passed, and then gives up
//! (`Unavailable`).
//!
//! The handler is a plain function (SQLite's callback carries no state of ours), so the
//! deadline of the operation running on this thread is kept in a thread local, set by
//! [`within`] around every use of a connection, and when the current lock attempt was first
//! refused in another, set by the handler itself at each attempt's first refusal.

use std::cell::Cell;
use std::time::{Duration, Instant};

thread_local! {
    static DEADLINE: Cell<Option<Instant>> = const { Cell::new(None) };
    static REFUSED_SINCE: Cell<Option<Instant>> = const { Cell::new(None) };
}

/// How long a refused lock attempt is retried at once (the thread yields in between) before
/// the handler sleeps: longer than a claim that queues holds the lock.
const SPIN: Duration = Duration::from_micros(100);
/// The longest sleep between retries.
const LONGEST_SLEEP: Duration = Duration::from_millis(2);

/// Runs `f` with `timeout` as the busy timeout of every statement it runs on this thread.
pub(crate) fn within<T>(timeout: Duration, f: impl FnOnce() -> T) -> T {
    let outer = DEADLINE.replace(Some(Instant::now() + timeout));
    let result = f();
    DEADLINE.set(outer);
    result
}

/// The busy handler installed on every connection: `true` to retry, `false` to give up.
/// `retries` counts the refusals of the current lock attempt, from 0.
pub(crate) fn handler(retries: i32) -> bool {
    let Some(deadline) = DEADLINE.get() else {
        return false;
    };
    let now = Instant::now();
    if now >= deadline {
        return false;
    }
    let since = refused_since(retries, now, REFUSED_SINCE.get());
    REFUSED_SINCE.set(Some(since));
    match pause(now - since) {
        None => std::thread::yield_now(),
        Some(pause) => std::thread::sleep(pause.min(deadline - now)),
    }
    true
}

/// When the current lock attempt was first refused: `now` at its first refusal (`retries`
/// 0), else what `recorded` says.
fn refused_since(retries: i32, now: Instant, recorded: Option<Instant>) -> Instant {
    match recorded {
        Some(since) if retries > 0 => since,
        _ => now,
    }
}

/// What to do before the next retry of a lock attempt refused for `waited` so far: retry at
/// once (`None`) during the spin, then sleep as long as it has waited (so the waits double),
/// at most [`LONGEST_SLEEP`].
fn pause(waited: Duration) -> Option<Duration> {
    (waited >= SPIN).then(|| waited.min(LONGEST_SLEEP))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spin_then_sleeps_doubling_to_two_milliseconds() {
        let us = Duration::from_micros;
        assert_eq!(pause(Duration::ZERO), None);
        assert_eq!(pause(us(99)), None);
        let pauses = [100, 200, 400, 1600, 3200, 60_000]
            .map(|waited| pause(us(waited)).map(|p| p.as_micros()));
        assert_eq!(
            pauses,
            [100, 200, 400, 1600, 2000, 2000].map(Some),
            "each sleep as long as the wait so far, at most 2ms"
        );
    }

    #[test]
    fn each_lock_attempt_counts_from_its_first_refusal() {
        let t = Instant::now();
        let us = Duration::from_micros;
        assert_eq!(refused_since(0, t, None), t);
        // Later retries of the same attempt keep its start, and sleep once past the spin.
        assert_eq!(refused_since(3, t + us(150), Some(t)), t);
        assert_eq!(pause(us(150)), Some(us(150)));
        // A new attempt (retries from 0) starts again, with a spin.
        assert_eq!(refused_since(0, t + us(900), Some(t)), t + us(900));
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
