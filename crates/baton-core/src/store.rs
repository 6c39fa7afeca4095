//! The store interface: the small atomic operations every store implements.
//!
//! Policy lives once in `baton-core` (waiting, keep-alive, lost-grant detection, guards,
//! validation, telemetry); a store implements only these atoms, each of which must be atomic
//! on the store and decide expiry on the store's own clock. A new store is a few hundred lines
//! plus a green [conformance suite](crate::conformance) run.
//!
//! The atom under both locks and leases is one [`LeaseStore`]: a lock is a lease whose holder
//! is a fresh random token per acquisition.
//!
//! This module gathers the whole store interface (SPI): the lease atom, the capability trait
//! a store implements once ([`Store`]), and each primitive's atom trait, which lives beside
//! its policy in the primitive's module (`limit/store.rs`, `cache/store.rs`, ...).

pub use crate::broadcast::BroadcastStore;
pub use crate::cache::CacheStore;
pub use crate::capability::{Capability, Store};
pub use crate::idempotency::IdempotencyStore;
pub use crate::lease::store::*;
pub use crate::limit::RateStore;
pub use crate::work::WorkStore;
