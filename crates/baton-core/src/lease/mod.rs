//! Leases: long-lived claims by a stable holder, with a rich release result.
//!
//! Use a lease when the holder is an identity that outlives one call (an instance id, a
//! connection id) and needs to know on release whether it still owned the resource, for
//! example to skip an effect only the genuine owner may fire. Re-claiming by the same holder
//! is idempotent and extends the lease. Use [`Locks`](crate::Locks) for short critical
//! sections: their holder is a fresh token per acquisition.
//!
//! Stream locks (a lease per `(stream, perspective)` taken by an instance for a `rewind`,
//! `bootstrap` or `purge`) are leases keyed by [`stream_key`], claimed and kept alive with
//! [`Leases::claim_and_keep`].

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

use crate::error::{Error, Result};
use crate::fence::Fence;
use crate::holder::Holder;
use crate::key::{Key, KeyKind, Namespace, StoreKey, check_text};
use crate::lock::grant::{GrantState, Watch, now, spawn_watchdog};
use crate::store::{Claim, HolderInfo, LeaseRequest, LeaseStore, Release, Renewal};
use crate::telemetry::{self, events};
use crate::time::{Ttl, check_keep_alive};

#[cfg(feature = "conformance")]
pub(crate) mod conformance;
pub(crate) mod memory;
pub(crate) mod store;

/// Longest lease reason, in bytes.
pub const MAX_REASON_BYTES: usize = 64;

/// The answer of [`Leases::claim`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimResult {
    /// The lease is ours (newly granted, or re-claimed and extended).
    Claimed {
        /// The grant's fence; a re-claim keeps the fence of the grant it extends.
        fence: Fence,
        /// Monotonic deadline, measured from before the claim was sent.
        until: Instant,
        /// `true` for a new grant (the lease was free or expired), `false` when the holder
        /// already held it and the claim extended it.
        new: bool,
    },
    /// Another holder has it.
    HeldBy {
        /// The current holder.
        holder: String,
        /// When its lease runs out unless renewed (monotonic, approximate).
        until: Instant,
        /// Its remaining time on the store's clock, as the store answered.
        remaining: Duration,
    },
}

/// How a lease is claimed and kept: its TTL, the reason recorded with it, and how often a
/// keep-alive renews it, given once and validated together before any I/O.
///
/// # Examples
/// ```
/// use std::time::Duration;
/// use baton_core::LeaseOptions;
///
/// let options = LeaseOptions::new(Duration::from_secs(30))
///     .reason("rewind")
///     .keep_alive(Duration::from_secs(10));
/// assert_eq!(options.interval(), Duration::from_secs(10));
/// // Without keep_alive, a keep-alive renews every third of the TTL.
/// assert_eq!(LeaseOptions::new(Duration::from_secs(30)).interval(), Duration::from_secs(10));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub struct LeaseOptions {
    ttl: Duration,
    reason: String,
    keep_alive: Option<Duration>,
}

impl LeaseOptions {
    /// A lease of `ttl`, no reason, kept alive (when it is) every third of `ttl`.
    pub fn new(ttl: Duration) -> Self {
        LeaseOptions {
            ttl,
            reason: String::new(),
            keep_alive: None,
        }
    }

    /// The reason recorded with the claim (at most [`MAX_REASON_BYTES`] bytes).
    pub fn reason(mut self, reason: impl Into<String>) -> Self {
        self.reason = reason.into();
        self
    }

    /// Renew every `interval` while kept alive (more than zero, less than `ttl / 2`).
    pub fn keep_alive(mut self, interval: Duration) -> Self {
        self.keep_alive = Some(interval);
        self
    }

    /// The TTL.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// The keep-alive interval: as set, or a third of the TTL.
    pub fn interval(&self) -> Duration {
        self.keep_alive.unwrap_or(self.ttl / 3)
    }

    /// Every rule, before any I/O.
    fn checked(&self) -> Result<(Ttl, Duration)> {
        let ttl = Ttl::new(self.ttl)?;
        check_reason(&self.reason)?;
        let interval = self.interval();
        check_keep_alive(interval, ttl)?;
        Ok((ttl, interval))
    }
}

/// The answer of [`Leases::claim_and_keep`].
#[derive(Debug)]
pub enum KeptClaim {
    /// The lease is ours and kept alive until the handle is stopped or dropped.
    Kept {
        /// The running keep-alive: fence, deadline and lost signal.
        keep_alive: LeaseKeepAlive,
        /// `true` for a new grant, `false` when the holder already held it.
        new: bool,
    },
    /// Another holder has it; nothing is kept.
    HeldBy {
        /// The current holder.
        holder: String,
        /// When its lease runs out unless renewed (monotonic, approximate).
        until: Instant,
        /// Its remaining time on the store's clock.
        remaining: Duration,
    },
}

/// The answer of [`Leases::release`]: did we still own the lease?
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RemoveResult {
    /// We held it, and it is now free.
    Removed {
        /// The holder that released (ours).
        holder: String,
    },
    /// Another holder re-claimed it after ours lapsed; it was left alone (emits
    /// [`baton.lease.reclaim_detected`](crate::telemetry::events::LEASE_RECLAIM_DETECTED)).
    Reclaimed {
        /// The current holder.
        by: String,
    },
    /// Nobody holds it: ours expired and nobody re-claimed it, or it was already released.
    NoHolder,
}

/// A live lease as [`Leases::inspect`] and [`Leases::list`] report it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseInfo {
    /// The key as the caller gave it.
    pub key: String,
    /// The holder.
    pub holder: String,
    /// The grant's fence.
    pub fence: Fence,
    /// Remaining time on the store's clock.
    pub remaining: Duration,
    /// The reason given at claim.
    pub reason: String,
}

impl From<HolderInfo> for LeaseInfo {
    fn from(info: HolderInfo) -> Self {
        LeaseInfo {
            key: info.key.user_key().to_owned(),
            holder: info.holder.as_str().to_owned(),
            fence: info.fence,
            remaining: info.remaining,
            reason: info.reason,
        }
    }
}

/// The key of a stream lock: `<stream>/<perspective>`.
///
/// # Errors
/// `InvalidInput` when either part is empty or the result breaks the key rules.
pub fn stream_key(stream: &str, perspective: &str) -> Result<String> {
    check_text("stream", stream, crate::key::MAX_KEY_BYTES)?;
    check_text("perspective", perspective, crate::key::MAX_KEY_BYTES)?;
    let key = format!("{stream}/{perspective}");
    Key::new(key.clone())?;
    Ok(key)
}

/// Checks a lease's reason as [`Leases::claim`] does, before any I/O: at most
/// [`MAX_REASON_BYTES`] bytes, no control characters. For front ends (the CLI) that reject
/// bad input before they open a store.
///
/// # Errors
/// `InvalidInput` naming the rule broken.
pub fn check_reason(reason: &str) -> Result<()> {
    if reason.len() > MAX_REASON_BYTES {
        return Err(Error::invalid_input(format!(
            "reason is {} bytes long; the limit is {MAX_REASON_BYTES} bytes",
            reason.len()
        )));
    }
    if reason.chars().any(char::is_control) {
        return Err(Error::invalid_input(
            "reason contains a control character; control characters are not allowed",
        ));
    }
    Ok(())
}

/// The lease client over one store. Cheap to clone.
///
/// # Examples
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), baton_core::Error> {
/// use std::{sync::Arc, time::Duration};
/// use baton_core::{ClaimResult, LeaseOptions, Leases, MemoryStore, RemoveResult};
///
/// let leases = Leases::new(Arc::new(MemoryStore::new()));
/// let session = LeaseOptions::new(Duration::from_secs(30)).reason("connected");
/// assert!(matches!(leases.claim("session:7", "instance-a", &session).await?, ClaimResult::Claimed { .. }));
/// assert!(matches!(leases.claim("session:7", "instance-b", &session).await?, ClaimResult::HeldBy { .. }));
/// match leases.release("session:7", "instance-a").await? {
///     RemoveResult::Removed { .. } => { /* we owned it: fire the owner-only effect */ }
///     RemoveResult::Reclaimed { .. } | RemoveResult::NoHolder => { /* skip it */ }
/// }
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct Leases {
    store: Arc<dyn LeaseStore>,
    namespace: Namespace,
}

impl Leases {
    /// Leases in the default namespace.
    pub fn new(store: Arc<dyn LeaseStore>) -> Self {
        Leases::with_namespace(store, Namespace::default())
    }

    /// Leases in `namespace`.
    pub fn with_namespace(store: Arc<dyn LeaseStore>, namespace: Namespace) -> Self {
        Leases { store, namespace }
    }

    fn qualify(&self, key: &str) -> Result<StoreKey> {
        Ok(self.namespace.qualify(KeyKind::Lease, &Key::new(key)?))
    }

    /// Claims `key` for `holder` for the TTL of `options`, recording its reason. Claiming
    /// again as the same holder is idempotent: it extends the lease and keeps its fence.
    /// `options` is checked whole (its keep-alive interval too), as
    /// [`claim_and_keep`](Leases::claim_and_keep) checks it.
    ///
    /// # Errors
    /// `InvalidInput` before any I/O; `Unavailable` when the store faulted.
    pub async fn claim(
        &self,
        key: &str,
        holder: &str,
        options: &LeaseOptions,
    ) -> Result<ClaimResult> {
        let key = self.qualify(key)?;
        let holder = Holder::new(holder)?;
        let (ttl, _) = options.checked()?;
        let sent = now();
        let request = LeaseRequest::new(&holder, ttl).reason(&options.reason);
        Ok(match self.store.claim(&key, request).await? {
            Claim::Granted { fence } => ClaimResult::Claimed {
                fence,
                until: sent + ttl.get(),
                new: true,
            },
            Claim::Extended { fence } => ClaimResult::Claimed {
                fence,
                until: sent + ttl.get(),
                new: false,
            },
            // Leases do not wait, so no store hands one over; were it to, its TTL runs from
            // `since`.
            Claim::HandedOver { fence, since } => ClaimResult::Claimed {
                fence,
                until: since.min(sent) + ttl.get(),
                new: true,
            },
            Claim::Held { holder, remaining } => ClaimResult::HeldBy {
                holder: holder.as_str().to_owned(),
                until: now() + remaining,
                remaining,
            },
        })
    }

    /// Claims `key` for `holder` and keeps it alive, in one call: the TTL, reason and
    /// keep-alive interval come from `options`, checked together before any I/O.
    ///
    /// # Errors
    /// `InvalidInput` before any I/O (a bad key, holder, TTL, reason, or an interval that is
    /// zero or not less than `ttl / 2`); `Unavailable` when the store faulted.
    ///
    /// # Examples
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), baton_core::Error> {
    /// use std::{sync::Arc, time::Duration};
    /// use baton_core::{KeptClaim, LeaseOptions, Leases, MemoryStore};
    /// # async fn rewind() {}
    ///
    /// let leases = Leases::new(Arc::new(MemoryStore::new()));
    /// let options = LeaseOptions::new(Duration::from_secs(30)).reason("rewind").keep_alive(Duration::from_secs(10));
    /// match leases.claim_and_keep("orders/Totals", "instance-a", &options).await? {
    ///     KeptClaim::Kept { keep_alive, new } => {
    ///         assert!(new);
    ///         tokio::select! {
    ///             () = rewind() => {}
    ///             _ = keep_alive.lost() => { /* another instance has it now: stop */ }
    ///         }
    ///         leases.release("orders/Totals", "instance-a").await?;
    ///     }
    ///     KeptClaim::HeldBy { holder, remaining, .. } => println!("{holder} has it for {remaining:?}"),
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn claim_and_keep(
        &self,
        key: &str,
        holder: &str,
        options: &LeaseOptions,
    ) -> Result<KeptClaim> {
        let qualified = self.qualify(key)?;
        let holder_id = Holder::new(holder)?;
        let (ttl, interval) = options.checked()?;
        Ok(match self.claim(key, holder, options).await? {
            // `until` is measured from before the claim was sent, as the keep-alive is.
            ClaimResult::Claimed { fence, until, new } => {
                let sent = until - ttl.get();
                let keep_alive = self.keep(qualified, holder_id, fence, sent, ttl, interval);
                KeptClaim::Kept { keep_alive, new }
            }
            ClaimResult::HeldBy {
                holder,
                until,
                remaining,
            } => KeptClaim::HeldBy {
                holder,
                until,
                remaining,
            },
        })
    }

    fn keep(
        &self,
        key: StoreKey,
        holder: Holder,
        fence: Fence,
        sent: Instant,
        ttl: Ttl,
        interval: Duration,
    ) -> LeaseKeepAlive {
        let store = Arc::clone(&self.store);
        let grant = Arc::new(GrantState::new(store, key, holder, fence, sent, ttl));
        spawn_watchdog(
            Arc::clone(&grant),
            Watch {
                ttl,
                keep_alive: Some(interval),
                max_hold: None,
                lost_event: &events::LEASE_LOST,
                renew_failed_event: &events::LEASE_RENEW_FAILED,
                max_hold_event: None,
            },
        );
        LeaseKeepAlive { grant }
    }

    /// Extends `holder`'s lease of `key` to `ttl` from now. Never revives a lapsed lease.
    ///
    /// # Errors
    /// `InvalidInput` before any I/O; `Unavailable` when the store faulted.
    pub async fn renew(&self, key: &str, holder: &str, ttl: Duration) -> Result<Renewal> {
        let key = self.qualify(key)?;
        let holder = Holder::new(holder)?;
        let ttl = Ttl::new(ttl)?;
        Ok(match self.store.renew(&key, &holder, ttl).await? {
            Renewal::Renewed => Renewal::Renewed,
            Renewal::NotHeld => Renewal::NotHeld,
        })
    }

    /// Releases `key` if `holder` holds it, and says whether it did.
    ///
    /// # Errors
    /// `InvalidInput` before any I/O; `Unavailable` when the store faulted (emits
    /// [`baton.lease.remove_failed`](crate::telemetry::events::LEASE_REMOVE_FAILED)): the
    /// caller cannot know whether it still owned the lease, and should skip owner-only
    /// effects.
    pub async fn release(&self, key: &str, holder: &str) -> Result<RemoveResult> {
        let key = self.qualify(key)?;
        let holder = Holder::new(holder)?;
        match self.store.release(&key, &holder).await {
            Ok(Release::Removed) => Ok(RemoveResult::Removed {
                holder: holder.as_str().to_owned(),
            }),
            Ok(Release::Reclaimed { by }) => {
                telemetry::emit(
                    &events::LEASE_RECLAIM_DETECTED,
                    Some(key.as_str()),
                    format_args!("{holder} released, but {by} had re-claimed the lease"),
                );
                Ok(RemoveResult::Reclaimed {
                    by: by.as_str().to_owned(),
                })
            }
            Ok(Release::NoHolder) => Ok(RemoveResult::NoHolder),
            Err(error) => {
                telemetry::emit(
                    &events::LEASE_REMOVE_FAILED,
                    Some(key.as_str()),
                    format_args!("release by {holder} failed: {error}"),
                );
                Err(error)
            }
        }
    }

    /// Keeps `holder`'s lease of `key`, claimed earlier, alive: renews it at once for
    /// `options`' TTL, then every `options`' interval until the handle is stopped or
    /// dropped. `None` when the lease is not held by `holder` (it lapsed, was released, or
    /// another holder has it): nothing is kept, and nothing was changed. To claim and keep
    /// in one call, use [`Leases::claim_and_keep`].
    ///
    /// The handle's [`lost`](LeaseKeepAlive::lost) signal fires when a renewal finds another
    /// holder, or when the lease's TTL passes without a successful renewal.
    ///
    /// # Errors
    /// `InvalidInput` before any I/O (as [`Leases::claim_and_keep`]); `Unavailable` when the
    /// first renewal faulted.
    pub async fn keep_alive(
        &self,
        key: &str,
        holder: &str,
        options: &LeaseOptions,
    ) -> Result<Option<LeaseKeepAlive>> {
        let key = self.qualify(key)?;
        let holder = Holder::new(holder)?;
        let (ttl, interval) = options.checked()?;
        let sent = now();
        if self.store.renew(&key, &holder, ttl).await? == Renewal::NotHeld {
            return Ok(None);
        }
        let Some(fence) = self
            .store
            .inspect(&key)
            .await?
            .filter(|info| info.holder == holder)
            .map(|info| info.fence)
        else {
            // Renewed, then gone before the fence could be read: not held any more.
            return Ok(None);
        };
        Ok(Some(self.keep(key, holder, fence, sent, ttl, interval)))
    }

    /// The live lease of `key`, if any.
    ///
    /// # Errors
    /// `InvalidInput` for a bad key; `Unavailable` when the store faulted.
    pub async fn inspect(&self, key: &str) -> Result<Option<LeaseInfo>> {
        let key = self.qualify(key)?;
        Ok(self.store.inspect(&key).await?.map(LeaseInfo::from))
    }

    /// Live leases whose key starts with `prefix`, at most `limit`.
    ///
    /// # Errors
    /// `InvalidInput` for a bad prefix; `Unavailable` when the store faulted.
    pub async fn list(&self, prefix: &str, limit: usize) -> Result<Vec<LeaseInfo>> {
        let prefix = self.namespace.qualify_prefix(KeyKind::Lease, prefix)?;
        Ok(self
            .store
            .list(&prefix, limit)
            .await?
            .into_iter()
            .map(LeaseInfo::from)
            .collect())
    }
}

/// A running lease keep-alive. Stops renewing when stopped or dropped; it never releases
/// the lease (release it with [`Leases::release`] to learn whether you still owned it).
#[must_use = "dropping the handle stops the keep-alive at once"]
pub struct LeaseKeepAlive {
    grant: Arc<GrantState>,
}

impl LeaseKeepAlive {
    /// Resolves when the lease is known or presumed lost (another holder has it, or its TTL
    /// passed without a successful renewal). An owned future: await it, or make it a
    /// `tokio::select!` branch.
    pub fn lost(&self) -> WaitForCancellationFutureOwned {
        self.grant.lost.clone().cancelled_owned()
    }

    /// The lost signal as a [`CancellationToken`] (a child of the lease's own: cancelling it
    /// changes nothing for the lease).
    pub fn lost_token(&self) -> CancellationToken {
        self.grant.lost.child_token()
    }

    /// Whether the lost signal has fired.
    pub fn is_lost(&self) -> bool {
        self.grant.lost.is_cancelled()
    }

    /// The monotonic deadline of the last successful renewal.
    pub fn valid_until(&self) -> Instant {
        self.grant.valid_until()
    }

    /// The fence of the lease being kept.
    pub fn fence(&self) -> Fence {
        self.grant.fence
    }

    /// Stops renewing.
    pub fn stop(self) {}
}

impl Drop for LeaseKeepAlive {
    fn drop(&mut self) {
        self.grant.stop();
    }
}

impl fmt::Debug for LeaseKeepAlive {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeaseKeepAlive")
            .field("key", &self.grant.key)
            .field("holder", &self.grant.holder)
            .field("lost", &self.is_lost())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_keys() {
        assert_eq!(stream_key("order-1", "Orders").unwrap(), "order-1/Orders");
        assert!(stream_key("", "Orders").is_err());
        assert!(stream_key("s", "").is_err());
    }

    #[test]
    fn reasons() {
        assert!(check_reason("").is_ok());
        assert!(check_reason("rewind").is_ok());
        assert!(check_reason(&"r".repeat(65)).is_err());
        assert!(check_reason("a\nb").is_err());
    }
}
