//! Locks: [`Baton::locks`](crate::Baton::locks) and the types it hands out (re-exported from
//! `baton-core`).
//!
//! A lock is a lease whose holder is a fresh random token per acquisition: non-reentrant,
//! fenced, with a lost signal and a monotonic `valid_until` on every [`LockGuard`]. See
//! `docs/locks-and-leases.md`.

pub use baton_core::{
    AcquireError, KeepOutcome, LockGuard, LockHandle, LockOptions, Locks, MAX_HOLD_LIMIT,
    MAX_LABEL_BYTES, ReleaseOutcome,
};
