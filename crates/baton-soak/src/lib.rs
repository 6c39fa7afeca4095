//! The soak and fault suite of baton. Not for direct use: run the `soak` binary.
//!
//! ```text
//! cargo run -p baton-soak --release -- --store redis --seconds 60 --seed 7
//! ```
//!
//! Contenders in several worker processes take locks, claim and renew leases, run
//! idempotent effects, ask a rate limiter for units, take semaphore permits, read and write
//! a reader-writer lock and campaign in an election, against a real store, while a
//! nemesis injects faults on a schedule derived from the seed: server kill and restart, a
//! Redis primary or Redis Cluster master killed and its replica taking over, a slot moved
//! between cluster masters, the etcd leader killed and members paused, SIGSTOP/SIGCONT and
//! SIGKILL of workers, proxy latency, blackhole, reset and dropped replies, `SCRIPT FLUSH`,
//! connection kills. Every operation is journaled (invoke / ok /
//! fail / info, process, key, fence, monotonic times); afterwards the checkers look for
//! overlapping holders, more permit holders than permits, a writer beside a reader or
//! writer, two leaders at once, fences and terms out of order, stale fences accepted, lost
//! updates, idempotent effects not exactly once and the rate limit exceeded, and a summary table
//! says what ran, what was injected and what was found. See `dev/soak.md`.
//!
//! - [`plan`]: the fault schedule, from the seed alone.
//! - [`workload`]: the worker process and its contenders.
//! - [`journal`]: the operation journal.
//! - [`cluster`], [`workers`], [`nemesis`]: the store, the worker processes and the faults.
//! - [`supervisors`]: `baton run` processes taking turns on a lock, some killed with SIGKILL,
//!   and the check that COMMAND never outlives its lock.
//! - [`check`]: the checkers.
//! - [`run`]: one run, from plan to summary.

#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

pub mod check;
pub mod cluster;
pub mod journal;
pub mod nemesis;
pub mod plan;
pub mod run;
pub mod supervisors;
pub mod workers;
pub mod workload;
