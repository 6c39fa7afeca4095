//! Leases: [`Baton::leases`](crate::Baton::leases) and the types it hands out (re-exported
//! from `baton-core`).
//!
//! A lease has a caller-chosen stable [`Holder`] (an instance id), so a re-claim by the same
//! holder extends it. Stream locks are leases keyed by [`stream_key`] with a reason checked
//! by [`check_reason`]. See `docs/locks-and-leases.md`.

pub use baton_core::{
    ClaimResult, Holder, LeaseInfo, LeaseKeepAlive, Leases, MAX_HOLDER_BYTES, MAX_REASON_BYTES,
    RemoveResult, RenewResult, check_reason, stream_key,
};
