//! Test-only helpers of baton. Not for direct use.
//!
//! What is here, and when to use it:
//! - [`time`]: [`MonoTime`], a reading of the host's `CLOCK_MONOTONIC` that is comparable
//!   across the processes of one host and serializable, for histories recorded by several
//!   OS processes.
//! - [`history`]: the [`Recorder`] of per-key events (acquired, released, written, effect)
//!   that contenders append to, written as JSON lines so child processes can hand their
//!   histories to the parent, which merges them into one [`History`].
//! - [`check`]: the checkers a history must pass — no two holders with overlapping
//!   believed validity, fences strictly increasing, no stale fence accepted, every side
//!   effect exactly once — each returning a list of [`Violation`]s.
//! - [`register`]: [`FencedRegister`], a resource that accepts a write only with a fence at
//!   least as large as every fence it has seen, in memory or in a file shared by processes.
//! - [`workload`]: [`LockWorkload`], the standard contention workload (acquire, hold,
//!   fenced read-modify-write, release) that every store's history test runs.
//! - [`process`]: child test processes (re-executing the test binary with a role), signals
//!   (SIGSTOP, SIGCONT, SIGKILL) and waiting for a condition with a timeout.
//! - [`redis`]: private `redis-server` processes on free loopback ports, to kill, pause and
//!   restart.
//! - [`sentinel`]: a private Redis Sentinel topology (primary, replica, three sentinels) for
//!   failover tests.
//! - [`redis_cluster`]: a private Redis Cluster (three masters, three replicas), once per test
//!   binary or of a test's own, with the helpers failover tests need (a key's master, its
//!   replica, `CLUSTER FAILOVER`, kill and restart of a node).
//! - [`proxy`]: a TCP fault proxy (latency, blackhole, reset, dropped replies).
//! - [`harness`]: [`Stores`](harness::Stores), the conformance harness every store's tests
//!   share (a store opened on first use, kept, and opened again on `reopen`).
//! - [`stats`]: the benchmarks' statistics (median, percentile, Jain's fairness index) and
//!   number formats.
//! - [`capture`]: bounded waiting and capture of baton's telemetry events in tests.
//! - [`tls`]: a private CA and server certificate for TLS tests, made with `openssl`.
//! - [`postgres`]: private PostgreSQL servers (`initdb` + `postgres` in a temp dir, as the
//!   `postgres` user when the tests run as root), to stop, crash and restart.
//! - [`pgbouncer`]: private PgBouncer poolers in front of them, in transaction or session
//!   mode.
//! - [`etcd`]: a private three-member etcd cluster on loopback, whose members can be killed,
//!   paused and restarted, and, each behind a client and a peer fault proxy, cut off.
//!
//! # Examples
//! ```
//! use baton_testkit::{History, OpKind, Outcome, Recorder, check};
//! use baton_testkit::time::MonoTime;
//!
//! let recorder = Recorder::new(1);
//! let t = MonoTime::from_nanos(1_000);
//! let ms = std::time::Duration::from_millis(1);
//! recorder.record(0, "k", t, OpKind::Acquired { fence: 7, requested: t, valid_until: t + 10 * ms });
//! recorder.record(0, "k", t + ms, OpKind::Released { fence: 7, outcome: Outcome::Released, answered: None });
//! let history: History = recorder.history();
//! assert!(check::all(&history).is_empty());
//! ```

#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

pub mod capture;
pub mod check;
pub mod etcd;
pub mod harness;
pub mod history;
pub mod idempotency;
pub mod jepsen;
pub mod permit_order;
pub mod pgbouncer;
pub mod postgres;
pub mod process;
pub mod proxy;
pub mod redis;
pub mod redis_cluster;
pub mod register;
pub mod rw_workload;
pub mod sentinel;
mod server;
pub mod stats;
pub mod time;
pub mod tls;
pub mod workload;

pub use check::Violation;
pub use history::{ContenderLog, Grant, History, Op, OpKind, Outcome, Recorder};
pub use register::{FencedRegister, WriteRecord};
pub use rw_workload::RwLockWorkload;
pub use time::MonoTime;
pub use workload::{
    ElectionWorkload, LockWorkload, PermitWorkload, WorkloadReport, most_permit_holders,
};
