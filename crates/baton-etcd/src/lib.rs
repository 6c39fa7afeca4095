//! The etcd store of baton. Not for direct use; see `baton`, which opens it for
//! `etcd://host:port[,host:port...]` and `etcds://` (TLS) URLs when built with its `etcd`
//! feature.
//!
//! Use it when a lock's exclusion must survive the failure of any one server: etcd keeps its
//! data on a quorum of members (Raft), so a grant it acknowledged is not lost when the
//! member that answered dies, and its revisions — baton's fences here — never go back.
//!
//! What is here:
//! - [`EtcdStore`]: locks and leases ([`LeaseStore`](baton_core::store::LeaseStore)); each
//!   grant is a key attached to an etcd lease whose TTL is the grant's, so the cluster
//!   decides expiry ([`grants`] says how each atom maps to etcd, and why the fence is the
//!   grant's create revision). Elections are lock grants (`baton-core` builds them on this
//!   atom): the term is the leader key's create revision, as in etcd's own election.
//! - Semaphores ([`SemaphoreStore`](baton_core::SemaphoreStore)): each permit is one of N
//!   slot keys, created only while no slot from N on is taken ([`permits`]); reader-writer
//!   locks are built on them and the lock atom.
//! - Idempotency records ([`IdempotencyStore`](baton_core::idempotency::IdempotencyStore)):
//!   a record key on an etcd lease for its TTL and an owner key on one for the owner's lease,
//!   changed only by transactions that see both keys unchanged ([`idempotency`]).
//! - The cache ([`CacheStore`](baton_core::CacheStore)): a key per value on an etcd lease of
//!   its own ([`cache`]).
//! - [`EtcdOptions`]: timeouts and the TLS files, also given in the URL's query.
//! - Wake-ups: each process that waits for a lock or a permit queues once and watches only
//!   the process queued before it, so a release wakes one process ([`watch`]); for permits
//!   the queue also decides who takes a free one, so processes get them in FIFO order.
//! - Requests that went to a member that is down are sent again to another.
//!
//! Every other capability answers `Unsupported` when it is asked for, with the reason and
//! the stores that offer it: rate limits because an exact limit is computed on the store's
//! clock and etcd has none a transaction can read; claimable work because it is not built on
//! etcd yet.
//!
//! ## Behavior
//! - TTLs are whole seconds on etcd: a grant's lease is its TTL rounded up to the next
//!   second (at least 1s), and the cluster may raise it to its minimum lease TTL. A holder's
//!   own `valid_until` still uses the TTL it asked for, so it never believes it holds longer
//!   than the cluster keeps the grant; other waiters may wait up to the rounded TTL.
//! - Idempotency records expire, and owners' leases lapse, never before the time asked and
//!   at most about two seconds after it; cached values may be read up to about a second and
//!   a half past their TTL (whole-second leases, swept by the leader).
//! - A member that fails mid-request fails that request (`Unavailable`); the client sends
//!   the next one to another member.
//! - `etcds://` talks TLS (rustls) to every member, trusting the URL's `ca_file` or the
//!   platform's roots, with a client certificate from `cert_file` and `key_file` if given;
//!   the files are checked before any connection (`InvalidInput` naming the option). The
//!   `tls` cargo feature (on by default) brings it; without it `etcds://` is `Unsupported`.
//! - A value larger than one etcd request (`--max-request-bytes`, 1.5 MiB by default) is
//!   `InvalidInput`.

#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

use std::fmt;
use std::sync::Arc;

use baton_core::signals::ReleaseHub;
use baton_core::store::{Capability, Store};
use baton_core::{Error, Result};
use etcd_client::{Client, ConnectOptions, GetOptions};

pub mod broadcast;
pub mod cache;
mod error;
pub mod grants;
pub mod idempotency;
mod keepers;
mod options;
pub mod permits;
mod requests;
mod tls;
mod url;
pub mod watch;

pub use options::{DEFAULT_CONNECT_TIMEOUT, DEFAULT_RESPONSE_TIMEOUT, EtcdOptions};

use crate::broadcast::Channels;
use crate::url::Target;
use crate::watch::Watches;

/// Why the etcd store does not offer claimable work yet.
const NOT_YET: &str = "claimable work is not built on etcd yet";

/// Why the etcd store keeps no rate limits.
const NO_CLOCK: &str = "an exact limit is computed on the store's clock, and etcd has none that a transaction can read (its only server time is whole-second lease expiry)";

/// A store on an etcd cluster. See the [crate docs](crate).
///
/// Cheap to share behind an `Arc`; the client multiplexes every request over one
/// connection per member.
pub struct EtcdStore {
    client: Client,
    target: Target,
    options: EtcdOptions,
    hub: Arc<ReleaseHub>,
    watches: Arc<Watches>,
    channels: Arc<Channels>,
    keepers: keepers::Keepers,
}

impl fmt::Debug for EtcdStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdStore")
            .field("cluster", &self.target.redacted)
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl EtcdStore {
    /// Opens the store that `url` names, with the options in its query:
    /// `etcd://[user:password@]host[:port][,host[:port]...][?connect_timeout=..&response_timeout=..]`,
    /// or `etcds://...` with TLS (`&ca_file=..&cert_file=..&key_file=..`).
    ///
    /// Returns once a member has answered a read that needs the cluster's quorum, so a
    /// cluster that cannot serve is refused here rather than at the first claim.
    ///
    /// # Errors
    /// `InvalidInput` for a malformed URL or a TLS file that cannot be read or holds no PEM
    /// item of its kind (before any I/O); `Unsupported` for `etcds://` without the `tls`
    /// feature; `Unavailable` when no member answers within the connect and response
    /// timeouts, the TLS handshake fails (the message says what to check), or the
    /// credentials are refused.
    pub async fn connect(url: &str) -> Result<EtcdStore> {
        let (target, options) = url::parse(url)?;
        EtcdStore::open(target, options).await
    }

    /// Checks `url` as [`EtcdStore::connect`] reads it, without connecting.
    ///
    /// # Errors
    /// As [`EtcdStore::connect`], except `Unavailable`.
    pub fn check_url(url: &str) -> Result<()> {
        let (target, options) = url::parse(url)?;
        tls::settings(&target, &options).map(|_| ())
    }

    async fn open(target: Target, options: EtcdOptions) -> Result<EtcdStore> {
        let tls = tls::settings(&target, &options)?;
        let mut connect = ConnectOptions::new()
            .with_connect_timeout(options.get_connect_timeout())
            .with_require_leader(true);
        #[cfg(feature = "tls")]
        if let Some(tls) = tls {
            connect = connect.with_tls(tls);
        }
        #[cfg(not(feature = "tls"))]
        let _ = tls;
        if let Some((user, password)) = &target.credentials {
            connect = connect.with_user(user.clone(), password.clone());
        }
        let cluster = target.redacted.clone();
        let deadline = options.call_deadline();
        let endpoints = target.endpoints.clone();
        let client = tokio::time::timeout(deadline, Client::connect(endpoints, Some(connect)))
            .await
            .map_err(|_| error::timed_out("connect", &cluster, deadline))?
            .map_err(|e| opening_failed(&target, e, &cluster))?;
        let hub = Arc::new(ReleaseHub::new());
        let watches = Watches::new(client.clone(), Arc::clone(&hub));
        let channels = Channels::new(client.clone());
        let store = EtcdStore {
            client,
            target,
            options,
            hub,
            watches,
            channels,
            keepers: keepers::Keepers::default(),
        };
        // A linearizable read goes through the leader's quorum: a cluster without one fails
        // here. The probe key is never written.
        store
            .send_within("connect", deadline, || {
                let mut kv = store.client.kv_client();
                async move {
                    kv.get("baton\u{0}probe", Some(GetOptions::new().with_count_only()))
                        .await
                }
            })
            .await
            .map_err(|fault| match fault {
                requests::Fault::Etcd(e) => opening_failed(&store.target, e, store.cluster()),
                fault => store.failed("connect", fault),
            })?;
        Ok(store)
    }

    /// The cluster's URL with the password replaced by `***`, as messages name it.
    pub fn cluster(&self) -> &str {
        &self.target.redacted
    }

    /// The options the store was opened with.
    pub fn options(&self) -> &EtcdOptions {
        &self.options
    }
}

impl Drop for EtcdStore {
    fn drop(&mut self) {
        self.watches.stop();
        self.channels.stop();
    }
}

/// The error of a failed first contact, with what to check when it looks like the TLS
/// handshake.
fn opening_failed(target: &Target, e: etcd_client::Error, cluster: &str) -> Error {
    let hint = tls::handshake_hint(target, &e);
    error::hinted(e, "connect", cluster, hint)
}

impl Store for EtcdStore {
    fn name(&self) -> &'static str {
        "etcd"
    }

    fn rate_store(self: Arc<Self>) -> Result<Arc<dyn baton_core::RateStore>> {
        Err(Capability::RateLimits.unsupported(self.name(), Some(NO_CLOCK)))
    }

    fn work_store(self: Arc<Self>) -> Result<Arc<dyn baton_core::work::WorkStore>> {
        Err(Capability::Work.unsupported(self.name(), Some(NOT_YET)))
    }

    baton_core::offers!(
        semaphore_store,
        broadcast_store,
        idempotency_store,
        cache_store
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds() {
        fn is_shared<T: Send + Sync + 'static>() {}
        is_shared::<EtcdStore>();
        is_shared::<EtcdOptions>();
    }

    #[test]
    fn check_url_reads_without_connecting() {
        assert!(EtcdStore::check_url("etcd://127.0.0.1:1,127.0.0.1:2").is_ok());
        let e = EtcdStore::check_url("etcd://h:0").unwrap_err();
        assert!(e.is_invalid_input(), "{e}");
        assert!(EtcdStore::check_url("etcds://u:hunter2@h").is_ok());
        // The TLS files are read: a missing one is named, the password is not.
        let e =
            EtcdStore::check_url("etcds://u:hunter2@h?ca_file=/nonexistent/ca.pem").unwrap_err();
        assert!(e.is_invalid_input(), "{e}");
        assert!(
            e.message()
                .contains("ca_file \"/nonexistent/ca.pem\" cannot be read"),
            "{e}"
        );
        assert!(!e.message().contains("hunter2"), "{e}");
    }

    #[tokio::test]
    async fn no_member_answering_is_unavailable_within_the_timeouts() {
        // Port 1 on loopback: nothing listens there.
        let started = std::time::Instant::now();
        let e = EtcdStore::connect(
            "etcd://u:hunter2@127.0.0.1:1?connect_timeout=100ms&response_timeout=100ms",
        )
        .await
        .unwrap_err();
        assert!(e.is_unavailable(), "{e}");
        assert!(!e.message().contains("hunter2"), "{e}");
        assert!(e.message().contains("etcd://u:***@127.0.0.1:1"), "{e}");
        assert!(started.elapsed() < std::time::Duration::from_secs(2));
    }
}
