//! A held grant and its watchdog: the keep-alive and lost-grant detection shared by locks
//! and leases.
//!
//! The watchdog runs for every held grant. Without keep-alive it fires the lost signal when
//! the local deadline (`valid_until`) passes. With keep-alive it renews every interval; a
//! renewal that the store answers with not-holder fires the lost signal at once, and a
//! renewal that fails with a fault is retried until `valid_until` passes, at which point the
//! grant is presumed gone. `valid_until` is always measured from the monotonic instant
//! *before* the request that granted or renewed it was sent, so it never outlasts the
//! store's own expiry.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::{Instant, sleep_until};
use tokio_util::sync::CancellationToken;

use crate::fence::Fence;
use crate::holder::Holder;
use crate::key::StoreKey;
use crate::store::{LeaseStore, Renew};
use crate::telemetry::{self, Event};
use crate::time::Ttl;

/// The monotonic now of the policy layer; `tokio::time::pause` controls it in tests.
pub(crate) fn now() -> Instant {
    Instant::now()
}

/// What a watchdog needs to know about the grant it keeps.
#[derive(Debug)]
pub(crate) struct GrantState {
    pub(crate) store: Arc<dyn LeaseStore>,
    pub(crate) key: StoreKey,
    pub(crate) holder: Holder,
    pub(crate) fence: Fence,
    pub(crate) granted_at: Instant,
    valid_until: Mutex<Instant>,
    /// Fires when the grant is known or presumed gone.
    pub(crate) lost: CancellationToken,
    /// Stops the watchdog (release, drop).
    pub(crate) stop: CancellationToken,
}

impl GrantState {
    pub(crate) fn new(
        store: Arc<dyn LeaseStore>,
        key: StoreKey,
        holder: Holder,
        fence: Fence,
        sent_at: Instant,
        ttl: Ttl,
    ) -> Arc<Self> {
        Arc::new(GrantState {
            store,
            key,
            holder,
            fence,
            granted_at: sent_at,
            valid_until: Mutex::new(sent_at + ttl.get()),
            lost: CancellationToken::new(),
            stop: CancellationToken::new(),
        })
    }

    pub(crate) fn valid_until(&self) -> Instant {
        *self.valid_until.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn extend(&self, until: Instant) {
        let mut v = self.valid_until.lock().unwrap_or_else(|p| p.into_inner());
        if until > *v {
            *v = until;
        }
    }
}

/// How a watchdog renews, and which events it reports.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Watch {
    pub(crate) ttl: Ttl,
    pub(crate) keep_alive: Option<Duration>,
    pub(crate) max_hold: Option<Duration>,
    pub(crate) lost_event: &'static Event,
    pub(crate) renew_failed_event: &'static Event,
    pub(crate) max_hold_event: Option<&'static Event>,
}

/// Spawns the watchdog of `grant` on the current runtime.
pub(crate) fn spawn_watchdog(grant: Arc<GrantState>, watch: Watch) {
    tokio::spawn(run_watchdog(grant, watch));
}

async fn run_watchdog(grant: Arc<GrantState>, watch: Watch) {
    let stop = grant.stop.clone();
    tokio::select! {
        biased;
        _ = stop.cancelled() => {}
        reason = keep(&grant, watch) => {
            if !grant.stop.is_cancelled() {
                telemetry::emit(watch.lost_event, Some(grant.key.as_str()), format_args!("grant with fence {} lost: {reason}", grant.fence));
                grant.lost.cancel();
            }
        }
    }
}

/// Keeps the grant until it is lost; returns why it was lost.
async fn keep(grant: &GrantState, watch: Watch) -> &'static str {
    let mut next_renewal = watch.keep_alive.map(|interval| grant.granted_at + interval);
    loop {
        let deadline = grant.valid_until();
        let renewal = next_renewal.filter(|at| *at < deadline);
        let Some(renew_at) = renewal else {
            sleep_until(deadline).await;
            if grant.valid_until() <= now() {
                return "its TTL passed without a successful renewal";
            }
            continue;
        };
        sleep_until(renew_at).await;
        if let (Some(max_hold), Some(event)) = (watch.max_hold, watch.max_hold_event)
            && now() >= grant.granted_at + max_hold
        {
            telemetry::emit(
                event,
                Some(grant.key.as_str()),
                format_args!(
                    "held for max_hold {}; no further renewals",
                    crate::time::format_duration(max_hold)
                ),
            );
            next_renewal = None;
            continue;
        }
        let interval = watch.keep_alive.unwrap_or(watch.ttl.get() / 3);
        let sent = now();
        let answer = tokio::select! {
            answer = grant.store.renew(&grant.key, &grant.holder, watch.ttl) => answer,
            _ = sleep_until(deadline) => {
                return "its TTL passed while a renewal was in flight";
            }
        };
        match answer {
            Ok(Renew::Renewed) => {
                grant.extend(sent + watch.ttl.get());
                next_renewal = Some(sent + interval);
            }
            Ok(Renew::NotHolder) => return "the store reports it is no longer the holder",
            Err(error) => {
                telemetry::emit(
                    watch.renew_failed_event,
                    Some(grant.key.as_str()),
                    format_args!("renewal failed, retrying: {error}"),
                );
                // Retry sooner than the interval: the grant is running out.
                let retry = (interval / 4).max(Duration::from_millis(5));
                next_renewal = Some(now() + retry);
            }
        }
    }
}
