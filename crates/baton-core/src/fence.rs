//! Fencing tokens.
//!
//! Every grant of a key carries a [`Fence`] that is strictly larger than the fence of every
//! earlier grant of that key, including grants that expired and grants made before the store
//! was restarted. Pass it to the resource you protect and have the resource reject writes
//! carrying a fence smaller than the largest it has seen: that keeps the resource correct
//! even when a paused holder wakes up after its lease expired.

use std::fmt;

/// A fencing token: strictly increasing per key across all grants.
///
/// # The assumption that remains
/// Where a store can lose its record of the last fence (the Redis store after a restart
/// without persistence, or after a replica that missed the last grants is promoted), the
/// next fence comes from the server's clock: every fence is at least the server's time in
/// microseconds when it was handed out. Fences then keep increasing as long as the clock of
/// the server handing out the next fence is not behind the clock of the one that handed out
/// the last by more than the time between the two grants (at least the outage, seconds). A
/// server whose clock is wrong by more can hand out a smaller fence; a resource that checks
/// fences rejects that write, so the failure is loud. See `docs/redis.md`, "Fences".
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Fence(u64);

impl Fence {
    /// Wraps a raw fence value read from a store.
    pub const fn new(value: u64) -> Self {
        Fence(value)
    }

    /// The raw value.
    pub const fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for Fence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}
