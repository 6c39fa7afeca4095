//! The keep-alive engine, written once: the loop that keeps a lease-like grant alive and says
//! when it is gone.
//!
//! Every kept grant of baton runs this loop: a lock's grant kept alive, a lease's
//! keep-alive, a work item's lease while its handler runs, a migration record's lease while
//! `up()` runs, an idempotency attempt's lease while its side effect runs. Each of them gives
//! the engine a **renew atom** (one renewal request to the store, answering [`Renewal`]) and
//! gets back a [`Lifeline`]: the grant's local deadline and its lost signal.
//!
//! ## Behavior
//! - `valid_until` starts at the instant *before* the request that granted the grant was
//!   sent, plus its TTL, and moves to the instant before each successful renewal was sent,
//!   plus the TTL: it never outlasts the store's own expiry.
//! - A renewal is sent every interval after the last successful one (the first one interval
//!   after the grant).
//! - A renewal answered [`Renewal::NotHeld`] fires the lost signal at once (once), and the
//!   loop ends: nothing is renewed any more.
//! - A renewal that fails (a store fault) is retried sooner than the interval: after a
//!   quarter of it, jittered ([`retry::jitter`]), at least 5 ms; each failure is reported.
//! - When `valid_until` passes without a successful renewal (faults all along, or a renewal
//!   still in flight), the grant is presumed gone: the lost signal fires and the loop ends.
//! - An optional `max_hold` stops the renewals once the grant has been held that long; the
//!   grant then runs out at its `valid_until`.
//! - Stopping the lifeline (a release, a dropped handle) ends the loop at its next wait; a
//!   renewal already sent is let finish (it is bounded by `valid_until`), so that
//!   [`Lifeline::settled`] can wait until no renewal of this grant is on its way to the store
//!   any more. The lost signal does not fire after a stop.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::{Instant, sleep_until};
use tokio_util::sync::CancellationToken;

use crate::error::Result;
use crate::retry;
use crate::store::Renewal;
use crate::telemetry::{self, Event};

/// The monotonic now of the policy layer; `tokio::time::pause` controls it in tests.
fn now() -> Instant {
    Instant::now()
}

/// One renewal request, as the engine sends it.
pub(crate) type RenewFuture = Pin<Box<dyn Future<Output = Result<Renewal>> + Send>>;

/// The renew atom: sends one renewal request each time it is called.
pub(crate) type RenewAtom = Box<dyn FnMut() -> RenewFuture + Send>;

/// Why a grant was lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Loss {
    /// The store answered that the grant is not held any more.
    NotHeld,
    /// `valid_until` passed without a successful renewal: presumed gone.
    Expired,
}

/// A kept grant's local state: its deadline and lost signal, shared by the engine's loop and
/// the handle the user holds.
pub(crate) struct Lifeline {
    /// The key events about this grant are reported under.
    key: String,
    /// What is kept, for messages: "grant with fence 7", "item 12".
    what: String,
    granted_at: Instant,
    valid_until: Mutex<Instant>,
    lost: CancellationToken,
    loss: Mutex<Option<Loss>>,
    stopped: AtomicBool,
    stop: CancellationToken,
    /// Held while a renewal is on its way to the store.
    in_flight: tokio::sync::Mutex<()>,
}

impl fmt::Debug for Lifeline {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lifeline")
            .field("key", &self.key)
            .field("what", &self.what)
            .field("valid_until", &self.valid_until())
            .field("lost", &self.lost.is_cancelled())
            .finish()
    }
}

impl Lifeline {
    /// The lifeline of a grant made by a request sent at `sent_at` for `ttl`.
    pub(crate) fn new(
        key: impl Into<String>,
        what: impl Into<String>,
        sent_at: Instant,
        ttl: Duration,
    ) -> Arc<Self> {
        Arc::new(Lifeline {
            key: key.into(),
            what: what.into(),
            granted_at: sent_at,
            valid_until: Mutex::new(sent_at + ttl),
            lost: CancellationToken::new(),
            loss: Mutex::new(None),
            stopped: AtomicBool::new(false),
            stop: CancellationToken::new(),
            in_flight: tokio::sync::Mutex::new(()),
        })
    }

    /// The local deadline: the grant is valid until then at most.
    pub(crate) fn valid_until(&self) -> Instant {
        *self.valid_until.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn extend(&self, until: Instant) {
        let mut v = self.valid_until.lock().unwrap_or_else(|p| p.into_inner());
        if until > *v {
            *v = until;
        }
    }

    /// The lost signal itself (cancelled when the grant is known or presumed gone).
    pub(crate) fn lost(&self) -> &CancellationToken {
        &self.lost
    }

    /// Why the grant was lost, once it was.
    pub(crate) fn loss(&self) -> Option<Loss> {
        *self.loss.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Stops keeping the grant (it is being released, or its handle was dropped): the loop
    /// ends and the lost signal will not fire any more.
    pub(crate) fn stop(&self) {
        self.stopped.store(true, Ordering::Release);
        self.stop.cancel();
    }

    /// Once [`Lifeline::stop`] was called: waits until no renewal of this grant is in flight
    /// (one already sent has been answered), so that a request sent after this one reaches
    /// the store after every renewal of the engine.
    pub(crate) async fn settled(&self) {
        drop(self.in_flight.lock().await);
    }

    /// Sleeps until `at`; false when the lifeline was stopped first.
    async fn sleep_until(&self, at: Instant) -> bool {
        tokio::select! {
            biased;
            _ = self.stop.cancelled() => false,
            _ = sleep_until(at) => true,
        }
    }

    /// Whether [`Lifeline::stop`] was called.
    pub(crate) fn is_stopped(&self) -> bool {
        self.stopped.load(Ordering::Acquire)
    }

    /// Fires the lost signal for `loss`, emitting `event` when given, unless the lifeline was
    /// stopped or already lost. Whether it fired now.
    pub(crate) fn fire_lost(&self, event: Option<&'static Event>, loss: Loss, why: &str) -> bool {
        {
            let mut seen = self.loss.lock().unwrap_or_else(|p| p.into_inner());
            if self.is_stopped() || seen.is_some() {
                return false;
            }
            *seen = Some(loss);
        }
        if let Some(event) = event {
            telemetry::emit(
                event,
                Some(&self.key),
                format_args!("{} lost: {why}", self.what),
            );
        }
        self.lost.cancel();
        true
    }
}

/// Which registered events a kept grant reports. `None` where the renew atom reports the
/// case itself.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Events {
    /// A renewal answered not-held.
    pub(crate) not_held: Option<&'static Event>,
    /// `valid_until` passed without a successful renewal.
    pub(crate) expired: Option<&'static Event>,
    /// A renewal failed with a fault (retried sooner).
    pub(crate) renew_failed: Option<&'static Event>,
    /// `max_hold` was reached: no further renewals.
    pub(crate) max_hold: Option<&'static Event>,
}

/// How a grant is kept.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Plan {
    /// The TTL each renewal asks for.
    pub(crate) ttl: Duration,
    /// The time between renewals.
    pub(crate) every: Duration,
    /// No renewals after the grant has been held this long.
    pub(crate) max_hold: Option<Duration>,
    /// What is reported.
    pub(crate) events: Events,
}

impl Plan {
    /// Renews `ttl` every `every`, reporting `events`, without a `max_hold`.
    pub(crate) fn new(ttl: Duration, every: Duration, events: Events) -> Self {
        Plan {
            ttl,
            every,
            max_hold: None,
            events,
        }
    }

    /// The wait before retrying a renewal that failed.
    fn retry_after_fault(&self) -> Duration {
        retry::jitter(self.every / 4).max(Duration::from_millis(5))
    }
}

/// Keeps `life` on the current runtime with `renew` until it is stopped or lost.
pub(crate) fn spawn(life: Arc<Lifeline>, plan: Plan, renew: RenewAtom) {
    tokio::spawn(run(life, plan, renew));
}

/// The engine's loop: keeps `life` until it is stopped or lost.
pub(crate) async fn run(life: Arc<Lifeline>, plan: Plan, renew: RenewAtom) {
    if let Some((loss, why)) = keep(&life, plan, renew).await {
        let event = match loss {
            Loss::NotHeld => plan.events.not_held,
            Loss::Expired => plan.events.expired,
        };
        life.fire_lost(event, loss, why);
    }
}

/// Renews until the grant is lost (returning how and why) or the lifeline is stopped
/// (returning `None`).
async fn keep(life: &Lifeline, plan: Plan, mut renew: RenewAtom) -> Option<(Loss, &'static str)> {
    let mut next_renewal = Some(life.granted_at + plan.every);
    loop {
        let deadline = life.valid_until();
        let Some(renew_at) = next_renewal.filter(|at| *at < deadline) else {
            if !life.sleep_until(deadline).await {
                return None;
            }
            if life.valid_until() <= now() {
                return Some((Loss::Expired, "its TTL passed without a successful renewal"));
            }
            continue;
        };
        if !life.sleep_until(renew_at).await {
            return None;
        }
        if let Some(max_hold) = plan.max_hold
            && now() >= life.granted_at + max_hold
        {
            if let Some(event) = plan.events.max_hold {
                telemetry::emit(
                    event,
                    Some(&life.key),
                    format_args!(
                        "held for max_hold {}; no further renewals",
                        crate::time::format_duration(max_hold)
                    ),
                );
            }
            next_renewal = None;
            continue;
        }
        let _in_flight = life.in_flight.lock().await;
        if life.is_stopped() {
            return None;
        }
        let sent = now();
        let answer = tokio::select! {
            answer = renew() => answer,
            _ = sleep_until(deadline) => {
                return Some((Loss::Expired, "its TTL passed while a renewal was in flight"));
            }
        };
        match answer {
            Ok(Renewal::Renewed) => {
                life.extend(sent + plan.ttl);
                next_renewal = Some(sent + plan.every);
            }
            Ok(Renewal::NotHeld) => {
                return Some((
                    Loss::NotHeld,
                    "the store reports it is no longer the holder",
                ));
            }
            Err(error) => {
                if let Some(event) = plan.events.renew_failed {
                    telemetry::emit(
                        event,
                        Some(&life.key),
                        format_args!("renewal of {} failed, retrying: {error}", life.what),
                    );
                }
                // Retry sooner than the interval: the grant is running out.
                next_renewal = Some(now() + plan.retry_after_fault());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicU32;

    use super::*;
    use crate::error::Error;
    use crate::telemetry::events;

    const MS: Duration = Duration::from_millis(1);

    /// A renew atom answering from `script` in turn (the last answer repeats), each after
    /// `latency`, recording when each request was sent.
    fn scripted(
        script: Vec<Option<Renewal>>,
        latency: Duration,
        sent: Arc<Mutex<Vec<Instant>>>,
    ) -> RenewAtom {
        let calls = Arc::new(AtomicU32::new(0));
        Box::new(move || {
            let n = calls.fetch_add(1, Ordering::SeqCst) as usize;
            let answer = script[n.min(script.len() - 1)];
            sent.lock().unwrap().push(now());
            Box::pin(async move {
                tokio::time::sleep(latency).await;
                answer.ok_or_else(|| Error::unavailable("injected fault"))
            })
        })
    }

    fn plan(ttl: Duration, every: Duration) -> Plan {
        Plan::new(
            ttl,
            every,
            Events {
                not_held: Some(&events::LEASE_LOST),
                expired: Some(&events::LEASE_LOST),
                renew_failed: Some(&events::LEASE_RENEW_FAILED),
                max_hold: None,
            },
        )
    }

    #[tokio::test(start_paused = true)]
    async fn valid_until_is_measured_from_before_the_request() {
        let start = now();
        let life = Lifeline::new("k", "test grant", start, 1000 * MS);
        assert_eq!(life.valid_until(), start + 1000 * MS);
        let sent = Arc::new(Mutex::new(Vec::new()));
        let renew = scripted(vec![Some(Renewal::Renewed)], 80 * MS, Arc::clone(&sent));
        spawn(Arc::clone(&life), plan(1000 * MS, 300 * MS), renew);
        tokio::time::sleep(300 * MS + 100 * MS).await;
        let first = sent.lock().unwrap()[0];
        assert_eq!(first, start + 300 * MS, "the first renewal one interval in");
        assert_eq!(
            life.valid_until(),
            first + 1000 * MS,
            "from before the request, not from its answer 80 ms later"
        );
        life.stop();
    }

    #[tokio::test(start_paused = true)]
    async fn not_held_fires_lost_once_and_stops_renewing() {
        let life = Lifeline::new("k", "test grant", now(), 1000 * MS);
        let sent = Arc::new(Mutex::new(Vec::new()));
        let renew = scripted(vec![Some(Renewal::NotHeld)], MS, Arc::clone(&sent));
        spawn(Arc::clone(&life), plan(1000 * MS, 100 * MS), renew);
        tokio::time::timeout(200 * MS, life.lost().cancelled())
            .await
            .expect("lost fires at the first not-held answer");
        assert_eq!(life.loss(), Some(Loss::NotHeld));
        assert!(!life.fire_lost(None, Loss::Expired, "again"), "fires once");
        assert_eq!(life.loss(), Some(Loss::NotHeld));
        tokio::time::sleep(2000 * MS).await;
        assert_eq!(sent.lock().unwrap().len(), 1, "no renewal after the loss");
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_renewal_is_retried_sooner_than_the_interval() {
        let life = Lifeline::new("k", "test grant", now(), 1000 * MS);
        let sent = Arc::new(Mutex::new(Vec::new()));
        let renew = scripted(
            vec![None, Some(Renewal::Renewed)],
            Duration::ZERO,
            Arc::clone(&sent),
        );
        spawn(Arc::clone(&life), plan(1000 * MS, 200 * MS), renew);
        tokio::time::sleep(300 * MS).await;
        let sent = sent.lock().unwrap().clone();
        assert!(sent.len() >= 2, "retried within 100 ms: {sent:?}");
        let gap = sent[1] - sent[0];
        assert!(
            gap >= 25 * MS && gap <= 50 * MS,
            "retried after a quarter of the interval, jittered: {gap:?}"
        );
        assert_eq!(life.valid_until(), sent[1] + 1000 * MS);
        assert!(!life.lost().is_cancelled());
        life.stop();
    }

    #[tokio::test(start_paused = true)]
    async fn lost_fires_when_valid_until_passes_during_faults() {
        let start = now();
        let life = Lifeline::new("k", "test grant", start, 500 * MS);
        let sent = Arc::new(Mutex::new(Vec::new()));
        let renew = scripted(vec![None], 5 * MS, Arc::clone(&sent));
        spawn(Arc::clone(&life), plan(500 * MS, 100 * MS), renew);
        tokio::time::timeout(2000 * MS, life.lost().cancelled())
            .await
            .expect("presumed lost at valid_until");
        assert_eq!(life.loss(), Some(Loss::Expired));
        assert!(now() >= start + 500 * MS, "not before valid_until");
        assert!(now() < start + 510 * MS, "promptly at valid_until");
        assert!(sent.lock().unwrap().len() > 4, "kept retrying until then");
    }

    #[tokio::test(start_paused = true)]
    async fn a_stopped_lifeline_neither_renews_nor_fires() {
        let life = Lifeline::new("k", "test grant", now(), 300 * MS);
        let sent = Arc::new(Mutex::new(Vec::new()));
        let renew = scripted(vec![None], MS, Arc::clone(&sent));
        spawn(Arc::clone(&life), plan(300 * MS, 100 * MS), renew);
        life.stop();
        tokio::time::sleep(1000 * MS).await;
        assert!(!life.lost().is_cancelled());
        assert!(sent.lock().unwrap().is_empty());
    }

    /// A stop while a renewal is in flight lets it finish, and `settled` returns only after it
    /// was answered: a request sent after `settled` (a last TTL, a release) is never
    /// overtaken by the engine's renewal.
    #[tokio::test(start_paused = true)]
    async fn settled_waits_for_the_renewal_in_flight() {
        let life = Lifeline::new("k", "test grant", now(), 300 * MS);
        let answered = Arc::new(AtomicU32::new(0));
        let counter = Arc::clone(&answered);
        let renew: RenewAtom = Box::new(move || {
            let counter = Arc::clone(&counter);
            Box::pin(async move {
                tokio::time::sleep(50 * MS).await;
                counter.fetch_add(1, Ordering::SeqCst);
                Ok(Renewal::Renewed)
            })
        });
        spawn(Arc::clone(&life), plan(300 * MS, 100 * MS), renew);
        // The first renewal is sent at 100 ms and answered at 150 ms.
        tokio::time::sleep(120 * MS).await;
        life.stop();
        assert_eq!(answered.load(Ordering::SeqCst), 0, "still in flight");
        life.settled().await;
        assert_eq!(
            answered.load(Ordering::SeqCst),
            1,
            "answered before settled"
        );
        tokio::time::sleep(1000 * MS).await;
        assert_eq!(
            answered.load(Ordering::SeqCst),
            1,
            "nothing sent after the stop"
        );
        assert!(!life.lost().is_cancelled());
    }

    #[tokio::test(start_paused = true)]
    async fn max_hold_stops_renewals_and_the_grant_runs_out() {
        let start = now();
        let life = Lifeline::new("k", "test grant", start, 300 * MS);
        let sent = Arc::new(Mutex::new(Vec::new()));
        let renew = scripted(
            vec![Some(Renewal::Renewed)],
            Duration::ZERO,
            Arc::clone(&sent),
        );
        let mut plan = plan(300 * MS, 100 * MS);
        plan.max_hold = Some(250 * MS);
        spawn(Arc::clone(&life), plan, renew);
        tokio::time::timeout(2000 * MS, life.lost().cancelled())
            .await
            .expect("runs out after max_hold");
        assert_eq!(
            sent.lock().unwrap().len(),
            2,
            "renewed at 100 and 200 ms only"
        );
        assert_eq!(life.loss(), Some(Loss::Expired));
        assert!(now() >= start + 500 * MS);
    }
}
