//! The requests the atoms make, each bounded by the response timeout and sent again to
//! another member when the member it went to could not be reached.
//!
//! The client spreads requests over the members the URL names. A request sent to a member
//! that is down fails at once (`tcp connect error`: nothing was written, so nothing can
//! have happened), even while the other members serve. Such a request is sent again —
//! the client picks a member again — as long as the response timeout allows, and each
//! such miss is reported as
//! [`baton.etcd.member_unreachable`](baton_core::telemetry::events::ETCD_MEMBER_UNREACHABLE).
//! Every other failure is final for the request: a request that may have reached the
//! cluster is never sent twice.

use std::error::Error as _;
use std::future::Future;
use std::time::Duration;

use baton_core::Result;
use baton_core::telemetry::{self, events};
use etcd_client::{
    Error as EtcdError, GetOptions, GetResponse, LeaseTimeToLiveResponse, Txn, TxnResponse,
};
use tokio::time::Instant;

use crate::EtcdStore;
use crate::error::{self, is_lease_not_found};

/// How many times one request is sent at most (each to a member the client picks again).
const MAX_SENDS: usize = 8;

/// Why a request failed.
pub(crate) enum Fault {
    /// The cluster (or the client) answered with an error.
    Etcd(EtcdError),
    /// No answer within the response timeout.
    TimedOut(Duration),
}

/// Whether `e` says the request never left this process: the member it was sent to refused
/// the connection (or none could be made). hyper's connector names that failure
/// `tcp connect error`; a refused connection is also seen as the I/O error itself.
pub(crate) fn never_sent(e: &EtcdError) -> bool {
    let EtcdError::GRpcStatus(status) = e else {
        return false;
    };
    let mut cause = status.source();
    while let Some(e) = cause {
        if e.to_string() == "tcp connect error"
            || e.downcast_ref::<std::io::Error>()
                .is_some_and(|io| io.kind() == std::io::ErrorKind::ConnectionRefused)
        {
            return true;
        }
        cause = e.source();
    }
    false
}

impl EtcdStore {
    /// Sends the request `send` makes until it is answered, fails in a way that may have
    /// reached the cluster, or `within` has passed.
    pub(crate) async fn send_within<T, F, Fut>(
        &self,
        what: &str,
        within: Duration,
        mut send: F,
    ) -> std::result::Result<T, Fault>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = std::result::Result<T, EtcdError>>,
    {
        let deadline = Instant::now() + within;
        let mut sends = 0;
        loop {
            sends += 1;
            match tokio::time::timeout_at(deadline, send()).await {
                Ok(Ok(answer)) => return Ok(answer),
                Ok(Err(e)) if never_sent(&e) && sends < MAX_SENDS => {
                    telemetry::emit(
                        &events::ETCD_MEMBER_UNREACHABLE,
                        None,
                        format_args!("{}: {what}: {e}; sending it again", self.cluster()),
                    );
                }
                Ok(Err(e)) => return Err(Fault::Etcd(e)),
                Err(_) => return Err(Fault::TimedOut(within)),
            }
        }
    }

    /// [`EtcdStore::send_within`] the response timeout, as a baton error.
    pub(crate) async fn call<T, F, Fut>(&self, what: &str, send: F) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = std::result::Result<T, EtcdError>>,
    {
        let within = self.options.get_response_timeout();
        self.send_within(what, within, send)
            .await
            .map_err(|fault| self.failed(what, fault))
    }

    /// The baton error of `fault`.
    pub(crate) fn failed(&self, what: &str, fault: Fault) -> baton_core::Error {
        match fault {
            Fault::Etcd(e) => error::etcd_error(e, what, self.cluster()),
            Fault::TimedOut(after) => error::timed_out(what, self.cluster(), after),
        }
    }

    /// The value of `key` (with `options`).
    pub(crate) async fn get(
        &self,
        what: &str,
        key: &str,
        options: Option<GetOptions>,
    ) -> Result<GetResponse> {
        self.call(what, || {
            let mut kv = self.client.kv_client();
            let (key, options) = (key.to_owned(), options.clone());
            async move { kv.get(key, options).await }
        })
        .await
    }

    /// One transaction.
    pub(crate) async fn txn(&self, what: &str, txn: Txn) -> Result<TxnResponse> {
        self.call(what, || {
            let mut kv = self.client.kv_client();
            let txn = txn.clone();
            async move { kv.txn(txn).await }
        })
        .await
    }

    /// A new lease of `seconds`.
    pub(crate) async fn grant_lease(&self, seconds: i64) -> Result<i64> {
        let answer = self
            .call("lease grant", || {
                let mut leases = self.client.lease_client();
                async move { leases.grant(seconds, None).await }
            })
            .await?;
        Ok(answer.id())
    }

    /// Revokes `lease`, deleting the keys attached to it; a lease already gone is fine.
    pub(crate) async fn revoke(&self, lease: i64) -> Result<()> {
        let within = self.options.get_response_timeout();
        let revoked = self
            .send_within("lease revoke", within, || {
                let mut leases = self.client.lease_client();
                async move { leases.revoke(lease).await }
            })
            .await;
        match revoked {
            Ok(_) => Ok(()),
            Err(Fault::Etcd(e)) if is_lease_not_found(&e) => Ok(()),
            Err(fault) => Err(self.failed("lease revoke", fault)),
        }
    }

    /// Revokes a lease nobody uses, without waiting: its TTL removes it if this fails.
    pub(crate) fn revoke_in_background(&self, lease: i64) {
        let mut leases = self.client.lease_client();
        let within = self.options.get_response_timeout();
        tokio::spawn(async move {
            let _ = tokio::time::timeout(within, leases.revoke(lease)).await;
        });
    }

    /// The time-to-live of `lease`.
    pub(crate) async fn lease_time_to_live(&self, lease: i64) -> Result<LeaseTimeToLiveResponse> {
        self.call("lease time-to-live", || {
            let mut leases = self.client.lease_client();
            async move { leases.time_to_live(lease, None).await }
        })
        .await
    }
}
