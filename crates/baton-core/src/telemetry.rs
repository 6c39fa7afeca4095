//! The event registry and the one function that emits events.
//!
//! Every degradation baton knows about (a store fault, a release after expiry, a lost grant,
//! a process-local fallback) is an [`Event`] declared in [`events`] and listed in
//! [`REGISTRY`], with its level, what it means, and either an alarm rule or the reason it is
//! unmonitored. [`emit`] records a `tracing` event carrying a stable `event` field and bumps a
//! `metrics` counter of the same name. A contract test fails when the source emits an event
//! that is not registered or the registry lists an event nothing emits.
//!
//! For operators: [`recent_events`] keeps the last [`RECENT_EVENTS`] events of this process
//! (the `baton status` page shows them); [`prometheus_name`] maps a metric key to its
//! Prometheus name (`baton.lock.lost` → `baton_lock_lost_total` for the counter); and
//! [`describe_metrics`] describes every metric to the installed `metrics` recorder and
//! registers every event counter at zero, so alert rules on `increase()` see the first event.

use std::collections::VecDeque;
use std::fmt;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, SystemTime};

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
    /// A semaphore's permit was lost (the store no longer had it, or no renewal succeeded
    /// before it expired): more holders than the semaphore allows may now work at once.
    pub const SEMAPHORE_PERMIT_LOST: Event = Event {
        key: "baton.semaphore.permit_lost",
        level: Level::ERROR,
        help: "a semaphore permit was lost (the store no longer held it, or no renewal succeeded before it expired); the work it bounded may now run beyond the semaphore's number of permits",
        alarm: Alarm::AtLeast {
            count: 1,
            within: minutes(5),
        },
    };

    /// A reader-writer lock's read or write grant was lost (its permit or, for a writer, its
    /// gate was no longer held, or no renewal succeeded before it expired).
    pub const RWLOCK_LOST: Event = Event {
        key: "baton.rwlock.lost",
        level: Level::ERROR,
        help: "a reader-writer lock's read or write grant was lost (the store no longer held its permit or the writer's gate, or no renewal succeeded before it expired); a writer may no longer be alone, or a reader may overlap a writer",
        alarm: Alarm::AtLeast {
            count: 1,
            within: minutes(5),
        },
    };

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
    /// A waiting acquire met a store fault after the store had answered it, and claims again.
    pub const LOCK_WAIT_FAULTED: Event = Event {
        key: "baton.lock.wait_faulted",
        level: Level::WARN,
        help: "a waiting acquire met a store fault (a failover, a restart, a dropped connection) after the store had answered it, and keeps claiming with a backoff until its wait ends; it answers Unavailable (baton.lock.unavailable) only if the store is still failing then",
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
    /// A guard was kept until its TTL ends (`keep_until_expiry`, `keep_for`): keep-alive
    /// stopped, nothing released.
    pub const LOCK_KEPT_UNTIL_EXPIRY: Event = Event {
        key: "baton.lock.kept_until_expiry",
        level: Level::DEBUG,
        help: "a lock guard was kept until its TTL ends (keep_until_expiry or keep_for): its keep-alive stopped and the key stays held until the grant expires on the store",
        alarm: Alarm::Unmonitored {
            why: "holding a key for its TTL is a supported way to end a grant (a cooldown)",
        },
    };
    /// Setting the TTL of a kept guard (`keep_for`) failed; the grant keeps its TTL.
    pub const LOCK_KEEP_FAULTED: Event = Event {
        key: "baton.lock.keep_faulted",
        level: Level::WARN,
        help: "setting the TTL of a lock kept until expiry (keep_for) failed because the store could not be reached; the key stays held until its current TTL lapses",
        alarm: Alarm::AtLeast {
            count: 5,
            within: minutes(5),
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
        help: "the in-memory store was first written (a lock, a rate decision, an idempotency record, a queued item; once per store), and it coordinates only within this process; configure a shared store (sqlite://, redis://, postgres://) for cross-process coordination",
        alarm: Alarm::Unmonitored {
            why: "warned once per store at first use; expected in tests and single-process tools",
        },
    };
    /// A store's push channel for release wake-ups (Redis pub/sub, PostgreSQL LISTEN, the
    /// sockets beside an SQLite file) was lost or could not be set up.
    pub const STORE_PUSH_LOST: Event = Event {
        key: "baton.store.push_lost",
        level: Level::WARN,
        help: "the store's push channel for release wake-ups (Redis pub/sub, PostgreSQL LISTEN, the sockets beside an SQLite file) was lost or could not be set up; waiters re-check now and then wake at the holder's TTL or by polling until it is back, so handoffs are slower but nothing is missed",
        alarm: Alarm::AtLeast {
            count: 5,
            within: minutes(15),
        },
    };
    /// A store's push channel for release wake-ups is back after a loss.
    pub const STORE_PUSH_RESTORED: Event = Event {
        key: "baton.store.push_restored",
        level: Level::INFO,
        help: "the store's push channel for release wake-ups (Redis pub/sub, PostgreSQL LISTEN) is subscribed again after a loss; waiters re-checked in case a release was missed in the gap",
        alarm: Alarm::Unmonitored {
            why: "recovery notice; baton.store.push_lost carries the alarm",
        },
    };
    /// A store closed a connection that went unanswered, and uses a new one.
    pub const STORE_CONNECTION_REPLACED: Event = Event {
        key: "baton.store.connection_replaced",
        level: Level::WARN,
        help: "a request on one of the store's connections (Redis: its multiplexed connection; PostgreSQL: a pooled one whose statement was abandoned) went unanswered past response_timeout, so the store stopped using it and opened a new one; often a network path or middlebox that drops connections without a word, or a server too busy to answer in time",
        alarm: Alarm::AtLeast {
            count: 5,
            within: minutes(15),
        },
    };
    /// `baton run` / `baton worker` could not start, or lost, the watchdog that kills what
    /// COMMAND started if baton itself is killed.
    pub const SUPERVISOR_WATCHDOG_UNAVAILABLE: Event = Event {
        key: "baton.supervisor.watchdog_unavailable",
        level: Level::WARN,
        help: "baton could not start, or lost, its process-group watchdog: COMMAND itself still dies with baton (parent-death signal), but if baton is killed the processes COMMAND started keep running without the lock; check the process limits (ulimit -u, the cgroup's pids.max) and that /proc/self/exe is executable",
        alarm: Alarm::AtLeast {
            count: 1,
            within: minutes(15),
        },
    };
    /// COMMAND exited while processes it started still ran in its process group.
    pub const SUPERVISOR_GROUP_OUTLIVED_COMMAND: Event = Event {
        key: "baton.supervisor.group_outlived_command",
        level: Level::INFO,
        help: "COMMAND exited while processes it started still ran in its process group; baton sent them SIGTERM (SIGKILL after --grace) and kept the lock until the group was empty",
        alarm: Alarm::Unmonitored {
            why: "expected for commands that start background jobs; the lock stays held until they end, so exclusion holds",
        },
    };
    /// The SQLite store's file was deleted or replaced while the store had it open.
    pub const SQLITE_FILE_REPLACED: Event = Event {
        key: "baton.sqlite.file_replaced",
        level: Level::WARN,
        help: "the SQLite store's database file was deleted, or another file was moved over its path, while the store had it open; every grant in the old file is gone (their holders learn it at their next renewal), and the store now uses the file at the path; find what deletes or replaces the file (a cleanup job, a restore, a second deployment), and keep the -wal and -shm files with it",
        alarm: Alarm::AtLeast {
            count: 1,
            within: minutes(60),
        },
    };
    /// A PostgreSQL store behind a transaction pooler has no LISTEN connection and polls.
    pub const POSTGRES_LISTEN_UNAVAILABLE: Event = Event {
        key: "baton.postgres.listen_unavailable",
        level: Level::WARN,
        help: "a PostgreSQL store opened with pooler=transaction and no listen_url cannot LISTEN (a transaction pooler does not keep a session), so its waiters re-check every poll_interval instead of waking at a release, and broadcast subscriptions are refused; emitted once per store when it connects; give listen_url= a direct connection to the server for push wake-ups, or listen=off to say polling is meant",
        alarm: Alarm::Unmonitored {
            why: "a deployment choice, reported once per store at connect; handoffs are slower, nothing is missed",
        },
    };
    /// The Redis server may evict keys, lock keys included.
    pub const REDIS_EVICTION_POLICY_UNSAFE: Event = Event {
        key: "baton.redis.eviction_policy_unsafe",
        level: Level::WARN,
        help: "the Redis server's maxmemory-policy is not noeviction, so under memory pressure it may evict lock keys and hand a held lock to a second holder; set maxmemory-policy noeviction, or use a Redis dedicated to coordination",
        alarm: Alarm::AtLeast {
            count: 1,
            within: minutes(60),
        },
    };
    /// The Redis server's eviction policy could not be read (CONFIG is disabled).
    pub const REDIS_EVICTION_POLICY_UNKNOWN: Event = Event {
        key: "baton.redis.eviction_policy_unknown",
        level: Level::INFO,
        help: "CONFIG GET maxmemory-policy was refused (managed Redis services often disable CONFIG), so baton could not check that lock keys are safe from eviction; confirm in the provider's settings that maxmemory-policy is noeviction",
        alarm: Alarm::Unmonitored {
            why: "a fact of the deployment, reported once per connect; the policy must be checked where the server is configured",
        },
    };
    /// A Redis store opened through Sentinel followed the primary to another server.
    pub const REDIS_PRIMARY_CHANGED: Event = Event {
        key: "baton.redis.primary_changed",
        level: Level::WARN,
        help: "a Redis store opened with a redis+sentinel:// URL found its primary gone or demoted, asked the sentinels again and now sends everything to the new primary they named (a failover); grants the old primary had not replicated are gone unless the store uses min_replicas, and their holders' keep-alives fire lost() at their next renewal",
        alarm: Alarm::AtLeast {
            count: 3,
            within: minutes(60),
        },
    };
    /// A request to an etcd cluster went to a member that could not be reached, and was
    /// sent again.
    pub const ETCD_MEMBER_UNREACHABLE: Event = Event {
        key: "baton.etcd.member_unreachable",
        level: Level::WARN,
        help: "a request of an etcd store went to a member that refused the connection (down, restarting, or not listening on the address the URL names), so nothing was sent, and the store sent it again to a member the client picked again; the other members served it if they had a quorum; bring the member back or take it out of the URL",
        alarm: Alarm::AtLeast {
            count: 20,
            within: minutes(15),
        },
    };
    /// A Redis write was not confirmed by as many replicas as `min_replicas` asks for.
    pub const REDIS_REPLICATION_UNCONFIRMED: Event = Event {
        key: "baton.redis.replication_unconfirmed",
        level: Level::WARN,
        help: "a claim, renewal or release on a Redis store opened with min_replicas=N was not acknowledged by N replicas (WAIT) within the response timeout, so it was reported Unavailable (a claim's grant was freed again, best-effort); a replica is down, lagging or disconnected from the primary",
        alarm: Alarm::AtLeast {
            count: 5,
            within: minutes(15),
        },
    };
    /// An idempotency log call failed because the store could not be reached.
    pub const IDEMPOTENCY_UNAVAILABLE: Event = Event {
        key: "baton.idempotency.unavailable",
        level: Level::WARN,
        help: "an idempotency log call (acquire, renew or finalize) failed because the store could not be reached; the caller chose whether to run unguarded or refuse, and a failed finalize leaves the record pending until its lease lapses",
        alarm: Alarm::AtLeast {
            count: 5,
            within: minutes(5),
        },
    };
    /// A pending idempotency record whose owner's lease lapsed was taken over.
    pub const IDEMPOTENCY_TAKEOVER: Event = Event {
        key: "baton.idempotency.takeover",
        level: Level::WARN,
        help: "an attempt took over a pending idempotency record whose owner's lease lapsed before it finalized (a crash, a hang, or a lease shorter than the work); the side effect may have run twice, so check it for this key",
        alarm: Alarm::AtLeast {
            count: 1,
            within: minutes(15),
        },
    };
    /// A finalize or renewal came from an attempt that no longer owns its record.
    pub const IDEMPOTENCY_NOT_OWNER: Event = Event {
        key: "baton.idempotency.not_owner",
        level: Level::WARN,
        help: "an attempt finalized or renewed an idempotency record it no longer owns (another attempt took it over after its lease lapsed, or the record expired); its outcome was not recorded; lengthen the lease or renew it while the work runs",
        alarm: Alarm::AtLeast {
            count: 1,
            within: minutes(15),
        },
    };
    /// An attempt's keep-alive saw its lease pass without a successful renewal.
    pub const IDEMPOTENCY_LEASE_LAPSED: Event = Event {
        key: "baton.idempotency.lease_lapsed",
        level: Level::WARN,
        help: "an attempt's lease passed without a successful renewal (the store was unreachable or slower than the lease), so its keep-alive presumed it taken over and fired its lost signal; another attempt may run the side effect too, so check it for this key",
        alarm: Alarm::AtLeast {
            count: 1,
            within: minutes(15),
        },
    };
    /// An HTTP request with an idempotency key ran unguarded because the store faulted.
    pub const HTTP_IDEMPOTENCY_UNGUARDED: Event = Event {
        key: "baton.http.idempotency_unguarded",
        level: Level::WARN,
        help: "a request carrying an idempotency key ran without idempotency protection because the store could not be reached (the fail-open policy); a retry of it during the outage may run again",
        alarm: Alarm::AtLeast {
            count: 5,
            within: minutes(5),
        },
    };
    /// An HTTP request with an idempotency key was refused because the store faulted.
    pub const HTTP_IDEMPOTENCY_REFUSED: Event = Event {
        key: "baton.http.idempotency_refused",
        level: Level::WARN,
        help: "a request carrying an idempotency key was answered 503 because the store could not be reached (the fail-closed policy); clients retry later",
        alarm: Alarm::AtLeast {
            count: 5,
            within: minutes(5),
        },
    };
    /// The response of a guarded HTTP request could not be recorded.
    pub const HTTP_IDEMPOTENCY_NOT_RECORDED: Event = Event {
        key: "baton.http.idempotency_not_recorded",
        level: Level::ERROR,
        help: "a guarded request ran but its response could not be recorded (the store failed through every finalize retry, or the attempt had been taken over); a retry after the record's lease may run the request again",
        alarm: Alarm::AtLeast {
            count: 1,
            within: minutes(5),
        },
    };
    /// A rate-limit decision failed because the store faulted; nothing was admitted.
    pub const LIMIT_UNAVAILABLE: Event = Event {
        key: "baton.limit.unavailable",
        level: Level::WARN,
        help: "a rate-limit check failed because the store could not be reached; the limiter failed closed and admitted nothing, so the limited work was refused",
        alarm: Alarm::AtLeast {
            count: 5,
            within: minutes(5),
        },
    };
    /// A cache read or write failed because the store faulted; callers treat it as a miss.
    pub const CACHE_UNAVAILABLE: Event = Event {
        key: "baton.cache.unavailable",
        level: Level::WARN,
        help: "a cache get, set or delete failed because the store could not be reached; callers fall back to the source of truth, which takes the load the cache was absorbing",
        alarm: Alarm::AtLeast {
            count: 20,
            within: minutes(5),
        },
    };
    /// A cached value did not deserialize as the type the caller asked for.
    pub const CACHE_UNDECODABLE: Event = Event {
        key: "baton.cache.undecodable",
        level: Level::WARN,
        help: "a cached value did not deserialize as the type asked for: two writers store different types under one key (or a deploy changed the type); the read failed rather than return wrong data",
        alarm: Alarm::AtLeast {
            count: 1,
            within: minutes(15),
        },
    };
    /// Publishing a broadcast message failed because the store faulted.
    pub const BROADCAST_PUBLISH_FAILED: Event = Event {
        key: "baton.broadcast.publish_failed",
        level: Level::WARN,
        help: "publishing a broadcast message failed because the store could not be reached; subscribers did not get it (they see it as missed), so what it would have invalidated stays stale until its TTL",
        alarm: Alarm::AtLeast {
            count: 5,
            within: minutes(5),
        },
    };
    /// A broadcast subscription lost its connection to the store.
    pub const SUBSCRIPTION_DROPPED: Event = Event {
        key: "baton.subscription.dropped",
        level: Level::WARN,
        help: "a broadcast subscription lost its connection to the store; it resubscribes by itself, and messages published until then are lost to it (local caches stay stale until their TTL)",
        alarm: Alarm::AtLeast {
            count: 3,
            within: minutes(5),
        },
    };
    /// A broadcast subscription is subscribed again after a drop; the message names gap_ms.
    pub const SUBSCRIPTION_RESUBSCRIBED: Event = Event {
        key: "baton.subscription.resubscribed",
        level: Level::INFO,
        help: "a broadcast subscription is subscribed again after a drop; gap_ms says how long it was deaf, and its subscribers were sent a Gap event",
        alarm: Alarm::Unmonitored {
            why: "recovery notice; baton.subscription.dropped carries the alarm",
        },
    };
    /// A subscriber's sequence numbers show that messages of a publisher were lost.
    pub const BROADCAST_MISSED: Event = Event {
        key: "baton.broadcast.missed",
        level: Level::INFO,
        help: "a subscriber saw a publisher's sequence number jump: messages were lost (during a reconnect, a discarded backlog, or a failed publish) and the subscriber was sent a Missed event",
        alarm: Alarm::Unmonitored {
            why: "delivery is at most once by design; the causes alarm on their own (baton.subscription.dropped, baton.broadcast.lagged, baton.broadcast.publish_failed)",
        },
    };
    /// A subscriber's buffer was full, so messages were discarded.
    pub const BROADCAST_LAGGED: Event = Event {
        key: "baton.broadcast.lagged",
        level: Level::WARN,
        help: "a broadcast subscriber does not consume as fast as messages arrive, so its buffer filled and messages were discarded; consume faster or subscribe with a larger capacity",
        alarm: Alarm::AtLeast {
            count: 5,
            within: minutes(15),
        },
    };
    /// A subscriber dropped a message it had already seen.
    pub const BROADCAST_DUPLICATE: Event = Event {
        key: "baton.broadcast.duplicate",
        level: Level::DEBUG,
        help: "a broadcast subscriber dropped a message whose sequence number it had seen already (a publish retried after its connection dropped)",
        alarm: Alarm::Unmonitored {
            why: "the duplicate was dropped, so nothing was delivered twice",
        },
    };
    /// A subscriber skipped a message it could not decode.
    pub const BROADCAST_UNDECODABLE: Event = Event {
        key: "baton.broadcast.undecodable",
        level: Level::WARN,
        help: "a broadcast subscriber skipped a message that is not a baton envelope or whose payload is not the subscriber's type: publishers and subscribers of the channel disagree on the message type",
        alarm: Alarm::AtLeast {
            count: 1,
            within: minutes(15),
        },
    };
    /// An item was claimed from a queue.
    pub const WORK_CLAIMED: Event = Event {
        key: "baton.work.claimed",
        level: Level::DEBUG,
        help: "an item was claimed from a queue (one event per item); with baton.work.completed it shows a queue's throughput",
        alarm: Alarm::Unmonitored {
            why: "a throughput counter; baton.work.dead_lettered and baton.work.lease_lost carry the alarms",
        },
    };
    /// A claimed item was completed and removed from its queue.
    pub const WORK_COMPLETED: Event = Event {
        key: "baton.work.completed",
        level: Level::DEBUG,
        help: "a claimed item was completed by its owner and removed from the queue (its de-duplication id stays remembered for its window)",
        alarm: Alarm::Unmonitored {
            why: "a throughput counter; baton.work.dead_lettered and baton.work.lease_lost carry the alarms",
        },
    };
    /// An attempt of an item failed; the item will be retried after a backoff.
    pub const WORK_FAILED: Event = Event {
        key: "baton.work.failed",
        level: Level::INFO,
        help: "an attempt of a queue item failed and the item will be retried after its backoff; the message names the attempt and the error",
        alarm: Alarm::Unmonitored {
            why: "retries are expected; an item that runs out of attempts emits baton.work.dead_lettered",
        },
    };
    /// An item ran out of attempts (or was failed permanently) and was dead-lettered.
    pub const WORK_DEAD_LETTERED: Event = Event {
        key: "baton.work.dead_lettered",
        level: Level::ERROR,
        help: "a queue item was dead-lettered: its last attempt failed (or its handler failed it permanently, or its leases kept lapsing without a result); it stays in the queue's dead letters, never claimed again, until someone looks at it",
        alarm: Alarm::AtLeast {
            count: 1,
            within: minutes(15),
        },
    };
    /// A claimer lost an item it was working on: another claim took it.
    pub const WORK_LEASE_LOST: Event = Event {
        key: "baton.work.lease_lost",
        level: Level::WARN,
        help: "a claimer lost an item while working on it (its lease lapsed without an extension and, usually, another claim took the item); its result was discarded and the item may be processed twice; lengthen the lease or find what stalled the extensions",
        alarm: Alarm::AtLeast {
            count: 1,
            within: minutes(15),
        },
    };
    /// A queue call failed because the store could not be reached.
    pub const WORK_UNAVAILABLE: Event = Event {
        key: "baton.work.unavailable",
        level: Level::WARN,
        help: "a queue call (enqueue, claim, complete, fail, extend, release, stats) failed because the store could not be reached; workers back off and retry, and an item whose result could not be recorded is claimed again once its lease lapses (at least once)",
        alarm: Alarm::AtLeast {
            count: 5,
            within: minutes(5),
        },
    };
    /// Ticks of a schedule were missed while no scheduler ran them.
    pub const SCHEDULE_MISSED: Event = Event {
        key: "baton.schedule.missed",
        level: Level::WARN,
        help: "ticks of a schedule came due while no scheduler ran them (every replica was down or stalled); the schedule's missed policy skipped them or ran one catch-up, and the message says how many",
        alarm: Alarm::AtLeast {
            count: 1,
            within: minutes(60),
        },
    };
    /// A schedule's handler failed for one tick.
    pub const SCHEDULE_FAILED: Event = Event {
        key: "baton.schedule.failed",
        level: Level::WARN,
        help: "a schedule's handler returned an error or panicked; the tick is not run again, the next tick runs as scheduled",
        alarm: Alarm::AtLeast {
            count: 1,
            within: minutes(15),
        },
    };
    /// A scheduler could not reach the store.
    pub const SCHEDULE_UNAVAILABLE: Event = Event {
        key: "baton.schedule.unavailable",
        level: Level::WARN,
        help: "a scheduler could not reach the store to read or claim a tick; it retries with backoff, and a tick that stays unclaimed past the next one is handled by the missed policy",
        alarm: Alarm::AtLeast {
            count: 5,
            within: minutes(5),
        },
    };
    /// Enqueueing the records of a fan-out failed.
    pub const FANOUT_ENQUEUE_FAILED: Event = Event {
        key: "baton.fanout.enqueue_failed",
        level: Level::ERROR,
        help: "a fan-out could not enqueue its records because the store could not be reached; the records enqueued before the fault stay, and the next scan enqueues the rest (de-duplication skips those already there)",
        alarm: Alarm::AtLeast {
            count: 1,
            within: minutes(5),
        },
    };
    /// A migration's up() failed; it was rolled back or left failed.
    pub const MIGRATION_FAILED: Event = Event {
        key: "baton.migration.failed",
        level: Level::ERROR,
        help: "a migration's up() failed; down() undid it (rolled_back) or could not (failed), and the walk stopped; the next run retries it",
        alarm: Alarm::AtLeast {
            count: 1,
            within: minutes(5),
        },
    };
    /// A pending migration whose writer's lease lapsed was taken over.
    pub const MIGRATION_TAKEOVER: Event = Event {
        key: "baton.migration.takeover",
        level: Level::WARN,
        help: "a migration left pending by a writer whose lease lapsed (a crash, a kill, a stall), or by this run itself before a store fault, was taken over and is run again; its up() must tolerate a partial earlier run",
        alarm: Alarm::AtLeast {
            count: 1,
            within: minutes(15),
        },
    };
    /// A migration writer lost its record while running it.
    pub const MIGRATION_LEASE_LOST: Event = Event {
        key: "baton.migration.lease_lost",
        level: Level::ERROR,
        help: "a migration writer lost its record while running up() or down() (its heartbeats did not land in time and another writer took over); its result was not recorded; lengthen the migration lease",
        alarm: Alarm::AtLeast {
            count: 1,
            within: minutes(5),
        },
    };
    /// A leader lost its leadership (the store no longer had it, or no renewal succeeded
    /// before it expired).
    pub const ELECTION_LEADERSHIP_LOST: Event = Event {
        key: "baton.election.leadership_lost",
        level: Level::ERROR,
        help: "a leader lost its leadership (the store no longer held it, or no renewal succeeded before it expired); another candidate may be elected, and work the old leader still does is refused by its term only where the term is checked",
        alarm: Alarm::AtLeast {
            count: 1,
            within: minutes(5),
        },
    };
    /// An election observer may have missed notices (or could not subscribe to them) and
    /// reads the leader again.
    pub const ELECTION_OBSERVE_GAP: Event = Event {
        key: "baton.election.observe_gap",
        level: Level::WARN,
        help: "an election observer may have missed notices of a leader change (a lagging or interrupted subscription), or observes without them; it reads the leader again, so it sees the current leader late, never a wrong one",
        alarm: Alarm::Unmonitored {
            why: "the observer reads the leader again at once and at its poll interval, so a gap delays a change by at most that interval; store faults behind it have their own events",
        },
    };
    /// The migration coordinator could not reach the store or the lock.
    pub const MIGRATION_UNAVAILABLE: Event = Event {
        key: "baton.migration.unavailable",
        level: Level::WARN,
        help: "the migration coordinator could not reach the store (or the lock); it retries with bounded backoff, then fails the run",
        alarm: Alarm::AtLeast {
            count: 3,
            within: minutes(5),
        },
    };
}

/// Every registered event.
pub const REGISTRY: &[Event] = &[
    events::LOCK_UNAVAILABLE,
    events::LOCK_WAIT_FAULTED,
    events::LOCK_RELEASE_AFTER_EXPIRY,
    events::LOCK_RELEASE_FAULTED,
    events::LOCK_LOST,
    events::SEMAPHORE_PERMIT_LOST,
    events::ELECTION_LEADERSHIP_LOST,
    events::ELECTION_OBSERVE_GAP,
    events::RWLOCK_LOST,
    events::LOCK_RENEW_FAILED,
    events::LOCK_MAX_HOLD_REACHED,
    events::LOCK_KEPT_UNTIL_EXPIRY,
    events::LOCK_KEEP_FAULTED,
    events::LOCK_DROPPED_UNRELEASED,
    events::LOCK_DROPPED_WITHOUT_RUNTIME,
    events::LOCK_ACQUIRE_CANCELLED,
    events::LEASE_LOST,
    events::LEASE_RENEW_FAILED,
    events::LEASE_RECLAIM_DETECTED,
    events::LEASE_REMOVE_FAILED,
    events::STORE_PROCESS_LOCAL,
    events::STORE_PUSH_LOST,
    events::STORE_PUSH_RESTORED,
    events::SUPERVISOR_WATCHDOG_UNAVAILABLE,
    events::SUPERVISOR_GROUP_OUTLIVED_COMMAND,
    events::STORE_CONNECTION_REPLACED,
    events::SQLITE_FILE_REPLACED,
    events::POSTGRES_LISTEN_UNAVAILABLE,
    events::REDIS_EVICTION_POLICY_UNSAFE,
    events::REDIS_EVICTION_POLICY_UNKNOWN,
    events::REDIS_REPLICATION_UNCONFIRMED,
    events::REDIS_PRIMARY_CHANGED,
    events::ETCD_MEMBER_UNREACHABLE,
    events::IDEMPOTENCY_UNAVAILABLE,
    events::IDEMPOTENCY_TAKEOVER,
    events::IDEMPOTENCY_NOT_OWNER,
    events::IDEMPOTENCY_LEASE_LAPSED,
    events::HTTP_IDEMPOTENCY_UNGUARDED,
    events::HTTP_IDEMPOTENCY_REFUSED,
    events::HTTP_IDEMPOTENCY_NOT_RECORDED,
    events::LIMIT_UNAVAILABLE,
    events::CACHE_UNAVAILABLE,
    events::CACHE_UNDECODABLE,
    events::BROADCAST_PUBLISH_FAILED,
    events::SUBSCRIPTION_DROPPED,
    events::SUBSCRIPTION_RESUBSCRIBED,
    events::BROADCAST_MISSED,
    events::BROADCAST_LAGGED,
    events::BROADCAST_DUPLICATE,
    events::BROADCAST_UNDECODABLE,
    events::WORK_CLAIMED,
    events::WORK_COMPLETED,
    events::WORK_FAILED,
    events::WORK_DEAD_LETTERED,
    events::WORK_LEASE_LOST,
    events::WORK_UNAVAILABLE,
    events::SCHEDULE_MISSED,
    events::SCHEDULE_FAILED,
    events::SCHEDULE_UNAVAILABLE,
    events::FANOUT_ENQUEUE_FAILED,
    events::MIGRATION_FAILED,
    events::MIGRATION_TAKEOVER,
    events::MIGRATION_LEASE_LOST,
    events::MIGRATION_UNAVAILABLE,
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
    // DEBUG events are throughput counters (one per claimed item, say): remembering them
    // would push the warnings an operator looks for out of the recent-events buffer.
    if event.level != Level::DEBUG {
        remember(event, key, detail);
    }
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

/// The Prometheus name of a metric key: Prometheus does not allow dots in names, so every
/// dot becomes an underscore (`baton.lock.wait_seconds` → `baton_lock_wait_seconds`). A
/// counter's series also take the `_total` suffix: see [`Event::prometheus_counter`].
pub fn prometheus_name(key: &str) -> String {
    key.replace('.', "_")
}

impl Event {
    /// The Prometheus name of this event's counter: `baton.lock.lost` →
    /// `baton_lock_lost_total`.
    pub fn prometheus_counter(&self) -> String {
        format!("{}_total", prometheus_name(self.key))
    }
}

/// Describes every registered metric (events with their help text, the wait and hold
/// histograms) to the installed `metrics` recorder, and registers every event counter at
/// zero.
///
/// Call it once after installing a recorder (an exporter). A counter that first appears at 1
/// has no earlier sample to grow from, so `increase()` in an alert rule would miss the first
/// event; registered at zero, the first event is an increase like any other.
pub fn describe_metrics() {
    for event in REGISTRY {
        metrics::describe_counter!(event.key, event.help);
        metrics::counter!(event.key).increment(0);
    }
    metrics::describe_histogram!(
        LOCK_WAIT_SECONDS,
        metrics::Unit::Seconds,
        "seconds spent in acquire, by outcome (acquired, contended, failed)"
    );
    metrics::describe_histogram!(
        LOCK_HOLD_SECONDS,
        metrics::Unit::Seconds,
        "seconds a lock was held, from its grant to its release"
    );
}

/// How many events [`recent_events`] keeps.
pub const RECENT_EVENTS: usize = 256;

/// The longest `detail` a [`RecentEvent`] keeps, in bytes; longer ones are cut at a
/// character boundary and end in `…`.
const RECENT_DETAIL_BYTES: usize = 1024;

/// One emitted event, as kept for [`recent_events`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecentEvent {
    /// Position in this process's sequence of emitted events, from 1.
    pub seq: u64,
    /// When it was emitted (wall clock, for display only).
    pub at: SystemTime,
    /// The registered event.
    pub event: &'static Event,
    /// The qualified store key it is about, or `""`.
    pub key: String,
    /// The message it was emitted with.
    pub detail: String,
}

struct Recent {
    next_seq: u64,
    events: VecDeque<RecentEvent>,
}

static RECENT: Mutex<Recent> = Mutex::new(Recent {
    next_seq: 1,
    events: VecDeque::new(),
});

/// The last [`RECENT_EVENTS`] events this process emitted, oldest first. Events at `DEBUG`
/// level (throughput counters such as `baton.work.claimed`) are counted, not remembered.
pub fn recent_events() -> Vec<RecentEvent> {
    let recent = RECENT.lock().unwrap_or_else(PoisonError::into_inner);
    recent.events.iter().cloned().collect()
}

fn remember(event: &'static Event, key: &str, detail: fmt::Arguments<'_>) {
    let mut text = detail.to_string();
    if text.len() > RECENT_DETAIL_BYTES {
        let mut cut = RECENT_DETAIL_BYTES;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
        text.push('…');
    }
    let at = SystemTime::now();
    let mut recent = RECENT.lock().unwrap_or_else(PoisonError::into_inner);
    let seq = recent.next_seq;
    recent.next_seq += 1;
    if recent.events.len() == RECENT_EVENTS {
        recent.events.pop_front();
    }
    recent.events.push_back(RecentEvent {
        seq,
        at,
        event,
        key: key.to_owned(),
        detail: text,
    });
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
    fn debug_events_are_counted_but_not_remembered() {
        let key = format!("test:recent:{}", rand::random::<u64>());
        emit(&events::WORK_CLAIMED, Some(&key), format_args!("item 1"));
        emit(
            &events::LOCK_UNAVAILABLE,
            Some(&key),
            format_args!("store down"),
        );
        let mine: Vec<_> = recent_events()
            .into_iter()
            .filter(|e| e.key == key)
            .map(|e| e.event.key)
            .collect();
        assert_eq!(mine, vec![events::LOCK_UNAVAILABLE.key]);
    }

    #[test]
    fn prometheus_names_have_no_dots() {
        assert_eq!(
            prometheus_name(LOCK_WAIT_SECONDS),
            "baton_lock_wait_seconds"
        );
        for event in REGISTRY {
            let name = event.prometheus_counter();
            assert!(name.ends_with("_total"), "{name}");
            assert!(
                name.chars().all(|c| c.is_ascii_lowercase() || c == '_'),
                "{name}"
            );
        }
    }

    #[test]
    fn emitted_events_are_kept_for_the_status_page() {
        let long = "x".repeat(RECENT_DETAIL_BYTES + 10);
        emit(
            &events::LEASE_RECLAIM_DETECTED,
            Some("ns:lease:recent-test"),
            format_args!("{long}"),
        );
        let recent = recent_events();
        let kept = recent
            .iter()
            .rev()
            .find(|e| e.key == "ns:lease:recent-test")
            .expect("kept");
        assert_eq!(kept.event.key, events::LEASE_RECLAIM_DETECTED.key);
        assert!(kept.detail.ends_with('…') && kept.detail.len() <= RECENT_DETAIL_BYTES + 3);
        assert!(recent.windows(2).all(|w| w[0].seq < w[1].seq));
        for _ in 0..RECENT_EVENTS {
            emit(
                &events::LEASE_RECLAIM_DETECTED,
                None,
                format_args!("filler"),
            );
        }
        assert_eq!(recent_events().len(), RECENT_EVENTS);
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
