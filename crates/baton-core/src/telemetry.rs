//! The event registry and the one function that emits events.
//!
//! Every degradation baton knows about (a store fault, a release after expiry, a lost grant,
//! a process-local fallback) is an [`Event`] declared in [`events`] and listed in
//! [`REGISTRY`], with its level, what it means, and either an alarm rule or the reason it is
//! unmonitored. [`emit`] records a `tracing` event carrying a stable `event` field and bumps a
//! `metrics` counter of the same name. A contract test fails when the source emits an event
//! that is not registered or the registry lists an event nothing emits.

use std::fmt;
use std::time::Duration;

use tracing::Level;

/// When an event should page someone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Alarm {
    /// Alert when at least `count` events happen within `within`.
    AtLeast {
        /// Threshold.
        count: u32,
        /// Window.
        within: Duration,
    },
    /// Counted, never alerted on, for the stated reason.
    Unmonitored {
        /// Why no alarm is needed.
        why: &'static str,
    },
}

/// A registered event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Event {
    /// Stable key, also the metric name: `baton.<area>.<what>`.
    pub key: &'static str,
    /// Log level of the `tracing` event.
    pub level: Level,
    /// What happened and what to do about it.
    pub help: &'static str,
    /// Alert rule.
    pub alarm: Alarm,
}

const fn minutes(n: u64) -> Duration {
    Duration::from_secs(n * 60)
}

/// Every event baton emits.
pub mod events {
    use super::{Alarm, Event, minutes};
    use tracing::Level;

    /// A lock could not be acquired because the store faulted.
    pub const LOCK_UNAVAILABLE: Event = Event {
        key: "baton.lock.unavailable",
        level: Level::WARN,
        help: "acquiring a lock failed because the store could not be reached; the guarded work did not run",
        alarm: Alarm::AtLeast {
            count: 5,
            within: minutes(5),
        },
    };
    /// A lock was released after its grant had expired: the section was not exclusive
    /// throughout.
    pub const LOCK_RELEASE_AFTER_EXPIRY: Event = Event {
        key: "baton.lock.release_after_expiry",
        level: Level::WARN,
        help: "a lock was released after its TTL lapsed, so the section was not exclusive for all of it; raise the TTL or enable keep-alive",
        alarm: Alarm::AtLeast {
            count: 1,
            within: minutes(15),
        },
    };
    /// Releasing a lock failed; its TTL will free it.
    pub const LOCK_RELEASE_FAULTED: Event = Event {
        key: "baton.lock.release_faulted",
        level: Level::WARN,
        help: "releasing a lock failed because the store could not be reached; the key stays held until its TTL lapses",
        alarm: Alarm::AtLeast {
            count: 5,
            within: minutes(5),
        },
    };
    /// A held lock is known or presumed gone while its guard was alive.
    pub const LOCK_LOST: Event = Event {
        key: "baton.lock.lost",
        level: Level::ERROR,
        help: "a held lock was lost (the store reported another holder, or no renewal succeeded before the grant expired); the guarded work is no longer exclusive",
        alarm: Alarm::AtLeast {
            count: 1,
            within: minutes(5),
        },
    };
    /// A keep-alive renewal failed with a store fault; it will be retried until the grant
    /// expires.
    pub const LOCK_RENEW_FAILED: Event = Event {
        key: "baton.lock.renew_failed",
        level: Level::WARN,
        help: "a lock keep-alive renewal failed because the store could not be reached; it is retried until the grant expires",
        alarm: Alarm::AtLeast {
            count: 3,
            within: minutes(5),
        },
    };
    /// Keep-alive stopped renewing because the hold reached `max_hold`.
    pub const LOCK_MAX_HOLD_REACHED: Event = Event {
        key: "baton.lock.max_hold_reached",
        level: Level::WARN,
        help: "a lock reached its max_hold and keep-alive stopped renewing it; the grant expires at the end of its current TTL",
        alarm: Alarm::AtLeast {
            count: 1,
            within: minutes(15),
        },
    };
    /// A guard was dropped without `release`; a background release was scheduled.
    pub const LOCK_DROPPED_UNRELEASED: Event = Event {
        key: "baton.lock.dropped_unreleased",
        level: Level::DEBUG,
        help: "a lock guard was dropped without release(); a best-effort release runs in the background and the TTL is the backstop",
        alarm: Alarm::Unmonitored {
            why: "dropping a guard is a supported way to release; a failed background release reports baton.lock.release_faulted",
        },
    };
    /// A guard was dropped outside a tokio runtime, so only the TTL frees the key.
    pub const LOCK_DROPPED_WITHOUT_RUNTIME: Event = Event {
        key: "baton.lock.dropped_without_runtime",
        level: Level::WARN,
        help: "a lock guard was dropped outside a tokio runtime, so no release could be scheduled; the key stays held until its TTL lapses",
        alarm: Alarm::Unmonitored {
            why: "happens at process shutdown; the TTL frees the key",
        },
    };
    /// An acquire was cancelled while its claim was in flight; the possible grant was
    /// released in the background.
    pub const LOCK_ACQUIRE_CANCELLED: Event = Event {
        key: "baton.lock.acquire_cancelled",
        level: Level::DEBUG,
        help: "an acquire was cancelled while its request was in flight; the grant it may have made is released in the background",
        alarm: Alarm::Unmonitored {
            why: "cancellation is normal control flow; the TTL is the backstop",
        },
    };
    /// A lease keep-alive found the lease gone.
    pub const LEASE_LOST: Event = Event {
        key: "baton.lease.lost",
        level: Level::ERROR,
        help: "a kept-alive lease was lost (another holder has it, or no renewal succeeded before it expired)",
        alarm: Alarm::AtLeast {
            count: 1,
            within: minutes(5),
        },
    };
    /// A lease keep-alive renewal failed with a store fault.
    pub const LEASE_RENEW_FAILED: Event = Event {
        key: "baton.lease.renew_failed",
        level: Level::WARN,
        help: "a lease keep-alive renewal failed because the store could not be reached; it is retried until the lease expires",
        alarm: Alarm::AtLeast {
            count: 3,
            within: minutes(5),
        },
    };
    /// A lease release found another holder: a sibling re-claimed it.
    pub const LEASE_RECLAIM_DETECTED: Event = Event {
        key: "baton.lease.reclaim_detected",
        level: Level::INFO,
        help: "a lease release found that another holder had re-claimed the lease (cross-instance handoff)",
        alarm: Alarm::Unmonitored {
            why: "informational: handoff is expected; the caller skips the owner-only effect",
        },
    };
    /// A lease release failed with a store fault.
    pub const LEASE_REMOVE_FAILED: Event = Event {
        key: "baton.lease.remove_failed",
        level: Level::ERROR,
        help: "releasing a lease failed because the store could not be reached; the caller could not learn whether it still owned it",
        alarm: Alarm::AtLeast {
            count: 1,
            within: minutes(5),
        },
    };
    /// The first grant made by a process-local store.
    pub const STORE_PROCESS_LOCAL: Event = Event {
        key: "baton.store.process_local",
        level: Level::WARN,
        help: "a lock was taken through the in-memory store, which excludes only within this process; configure a shared store (sqlite://, redis://, postgres://) for cross-process exclusion",
        alarm: Alarm::Unmonitored {
            why: "warned once per store at first use; expected in tests and single-process tools",
        },
    };
}

/// Every registered event.
pub const REGISTRY: &[Event] = &[
    events::LOCK_UNAVAILABLE,
    events::LOCK_RELEASE_AFTER_EXPIRY,
    events::LOCK_RELEASE_FAULTED,
    events::LOCK_LOST,
    events::LOCK_RENEW_FAILED,
    events::LOCK_MAX_HOLD_REACHED,
    events::LOCK_DROPPED_UNRELEASED,
    events::LOCK_DROPPED_WITHOUT_RUNTIME,
    events::LOCK_ACQUIRE_CANCELLED,
    events::LEASE_LOST,
    events::LEASE_RENEW_FAILED,
    events::LEASE_RECLAIM_DETECTED,
    events::LEASE_REMOVE_FAILED,
    events::STORE_PROCESS_LOCAL,
];

/// Histogram of seconds spent waiting in `acquire`, labelled by outcome.
pub const LOCK_WAIT_SECONDS: &str = "baton.lock.wait_seconds";
/// Histogram of seconds a lock was held, from grant to release.
pub const LOCK_HOLD_SECONDS: &str = "baton.lock.hold_seconds";

/// Looks up a registered event by key.
pub fn lookup(key: &str) -> Option<&'static Event> {
    REGISTRY.iter().find(|e| e.key == key)
}

/// Emits `event` about `key` (the qualified store key, when there is one): a `tracing`
/// event with the stable `event` field, and a `metrics` counter named after the event.
pub fn emit(event: &'static Event, key: Option<&str>, detail: fmt::Arguments<'_>) {
    metrics::counter!(event.key).increment(1);
    let key = key.unwrap_or("");
    macro_rules! at {
        ($level:expr) => {
            tracing::event!(
                $level,
                event = event.key,
                key = key,
                help = event.help,
                "{}",
                detail
            )
        };
    }
    match event.level {
        Level::ERROR => at!(Level::ERROR),
        Level::WARN => at!(Level::WARN),
        Level::INFO => at!(Level::INFO),
        Level::DEBUG => at!(Level::DEBUG),
        _ => at!(Level::TRACE),
    }
}

/// Records a lock's wait time.
pub(crate) fn record_wait(seconds: f64, outcome: &'static str) {
    metrics::histogram!(LOCK_WAIT_SECONDS, "outcome" => outcome).record(seconds);
}

/// Records a lock's hold time.
pub(crate) fn record_hold(seconds: f64) {
    metrics::histogram!(LOCK_HOLD_SECONDS).record(seconds);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn keys_are_unique_and_well_formed() {
        let mut seen = HashSet::new();
        for event in REGISTRY {
            assert!(seen.insert(event.key), "duplicate key {}", event.key);
            assert!(event.key.starts_with("baton."), "{}", event.key);
            assert!(
                event
                    .key
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c == '.' || c == '_'),
                "{}",
                event.key
            );
            assert!(!event.help.is_empty());
            match event.alarm {
                Alarm::AtLeast { count, within } => assert!(count > 0 && !within.is_zero()),
                Alarm::Unmonitored { why } => assert!(!why.is_empty()),
            }
        }
    }

    #[test]
    fn lookup_finds_registered_keys() {
        assert_eq!(
            lookup("baton.lock.lost").map(|e| e.level),
            Some(Level::ERROR)
        );
        assert!(lookup("baton.nope").is_none());
    }
}
