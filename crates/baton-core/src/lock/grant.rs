//! A held grant and its watchdog: the keep-alive and lost-grant detection shared by locks
//! and leases.
//!
//! Every held grant is watched. Without keep-alive the lost signal fires when the local
//! deadline (`valid_until`) passes; those grants share one timer task per [`Locks`]
//! ([`Deadlines`]), so an acquire costs an entry in a map, not a task. With keep-alive the
//! [keep-alive engine](crate::keepalive) renews it every interval; a renewal that the store
//! answers with not-held fires the lost signal at once, and a renewal that fails with a fault
//! is retried until `valid_until` passes, at which point the grant is presumed gone. `valid_until` is always
//! measured from the monotonic instant *before* the request that granted or renewed it was
//! sent, so it never outlasts the store's own expiry.
//!
//! [`Locks`]: crate::Locks

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep_until};
use tokio_util::sync::CancellationToken;

use crate::fence::Fence;
use crate::holder::Holder;
use crate::keepalive::{self, Events, Lifeline, Loss, Plan, RenewAtom};
use crate::key::StoreKey;
use crate::store::LeaseStore;
use crate::telemetry::Event;
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
    /// Its deadline and lost signal, kept by the keep-alive engine when it has keep-alive.
    life: Arc<Lifeline>,
    /// Fires when the grant is known or presumed gone (the lifeline's own token).
    pub(crate) lost: CancellationToken,
    /// The grant's entry in a shared deadline timer, when it has one (no keep-alive).
    deadline: Option<Entry>,
}

impl GrantState {
    /// A grant with no deadline entry: the caller watches it (a keep-alive, or a deadline
    /// timer that sets `deadline`).
    pub(crate) fn new(
        store: Arc<dyn LeaseStore>,
        key: StoreKey,
        holder: Holder,
        fence: Fence,
        sent_at: Instant,
        ttl: Ttl,
    ) -> Self {
        let life = Lifeline::new(
            key.as_str(),
            format!("grant with fence {fence}"),
            sent_at,
            ttl.get(),
        );
        GrantState {
            store,
            key,
            holder,
            fence,
            granted_at: sent_at,
            lost: life.lost().clone(),
            life,
            deadline: None,
        }
    }

    pub(crate) fn valid_until(&self) -> Instant {
        self.life.valid_until()
    }

    /// Stops watching the grant (it is being released, or its handle was dropped): the lost
    /// signal will not fire for it any more.
    pub(crate) fn stop(&self) {
        self.life.stop();
        if let Some(entry) = &self.deadline {
            entry.timer.remove(entry.at, entry.id);
        }
    }

    /// Stops watching the grant and waits until no renewal of it is in flight, so that the
    /// next request for it reaches the store after the keep-alive's last renewal.
    pub(crate) async fn stop_and_settle(&self) {
        self.stop();
        self.life.settled().await;
    }

    /// Fires the lost signal, unless the grant was stopped first.
    fn fire_lost(&self, event: &'static Event, why: &str) {
        self.life.fire_lost(Some(event), Loss::Expired, why);
    }
}

/// A grant's place in a [`Deadlines`] timer.
#[derive(Debug)]
struct Entry {
    timer: Arc<Timer>,
    at: Instant,
    id: u64,
}

/// One timer task for the deadlines of many grants that have no keep-alive: it fires each
/// grant's lost signal when its `valid_until` passes, unless the grant was stopped (released
/// or dropped) first.
///
/// A task per grant would cost a spawn, a timer registration and a wake-up on every acquire
/// and release; here an acquire adds an entry to a sorted map and a release removes it, and the
/// task wakes only when the earliest deadline comes (or an earlier one arrives). The task runs
/// on the runtime of the grant that started it; if that runtime is gone, the next grant starts
/// it again on its own.
pub(crate) struct Deadlines {
    timer: Arc<Timer>,
}

impl fmt::Debug for Deadlines {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Deadlines").finish_non_exhaustive()
    }
}

struct Timer {
    /// The event emitted when a grant is lost.
    lost_event: &'static Event,
    next_id: AtomicU64,
    state: Mutex<TimerState>,
    /// Wakes the task when an entry earlier than the one it sleeps for arrives.
    wake: Notify,
}

impl fmt::Debug for Timer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Timer").finish_non_exhaustive()
    }
}

#[derive(Default)]
struct TimerState {
    /// Live grants by deadline.
    entries: BTreeMap<(Instant, u64), Weak<GrantState>>,
    /// The instant the task sleeps until; `None` while it waits for an entry.
    armed: Option<Instant>,
    /// The latest deadline added since the task last looked: with no entry left, the task
    /// sleeps until it rather than idly waiting for the next entry. Most grants are released
    /// long before their deadline, and the next one's deadline is later than this, so adding
    /// it need not wake the task (otherwise every acquire on an idle map would).
    latest: Option<Instant>,
    task: Option<JoinHandle<()>>,
    /// The [`Deadlines`] is gone: no entry will be added, and the task ends with the last.
    closed: bool,
}

impl Deadlines {
    /// A timer whose grants emit `lost_event` when their deadline passes.
    pub(crate) fn new(lost_event: &'static Event) -> Self {
        Deadlines {
            timer: Arc::new(Timer {
                lost_event,
                next_id: AtomicU64::new(0),
                state: Mutex::new(TimerState::default()),
                wake: Notify::new(),
            }),
        }
    }

    /// A held grant without keep-alive, watched by this timer until it is stopped: its lost
    /// signal fires at its `valid_until`.
    pub(crate) fn watch(&self, mut grant: GrantState) -> Arc<GrantState> {
        let entry = Entry {
            timer: Arc::clone(&self.timer),
            at: grant.valid_until(),
            id: self.timer.next_id.fetch_add(1, Ordering::Relaxed),
        };
        let (at, id) = (entry.at, entry.id);
        grant.deadline = Some(entry);
        let grant = Arc::new(grant);
        self.timer.insert(at, id, Arc::downgrade(&grant));
        grant
    }
}

impl Drop for Deadlines {
    /// Grants outlive their `Locks`: the task keeps watching them, and ends once none is left.
    fn drop(&mut self) {
        let mut state = self.timer.state.lock().unwrap_or_else(|p| p.into_inner());
        state.closed = true;
        self.timer.wake.notify_one();
    }
}

impl Timer {
    fn insert(self: &Arc<Self>, at: Instant, id: u64, grant: Weak<GrantState>) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state.entries.insert((at, id), grant);
        state.latest = state.latest.max(Some(at));
        if state.task.as_ref().is_none_or(JoinHandle::is_finished) {
            // First grant, or the runtime that ran the task is gone.
            state.armed = None;
            state.task = Some(tokio::spawn(Arc::clone(self).run()));
        }
        // A task asleep until an instant no later than `at` looks again then; otherwise it
        // must re-arm now.
        if state.armed.is_none_or(|armed| at < armed) {
            self.wake.notify_one();
        }
    }

    fn remove(&self, at: Instant, id: u64) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state.entries.remove(&(at, id));
    }

    async fn run(self: Arc<Self>) {
        loop {
            let mut due = Vec::new();
            let (next, done) = {
                let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
                let now = now();
                while let Some(entry) = state.entries.first_entry() {
                    if entry.key().0 > now {
                        break;
                    }
                    due.push(entry.remove());
                }
                let latest = state.latest.take().filter(|latest| *latest > now);
                state.armed = state
                    .entries
                    .first_key_value()
                    .map(|((at, _), _)| *at)
                    .or(latest);
                (state.armed, state.closed && state.entries.is_empty())
            };
            for grant in due.iter().filter_map(Weak::upgrade) {
                grant.fire_lost(
                    self.lost_event,
                    "its TTL passed without a successful renewal",
                );
            }
            drop(due);
            if done {
                return;
            }
            match next {
                Some(at) => {
                    tokio::select! {
                        _ = sleep_until(at) => {}
                        _ = self.wake.notified() => {}
                    }
                }
                None => self.wake.notified().await,
            }
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

/// Keeps `grant` alive with the keep-alive engine on the current runtime, renewing it
/// through its store's [`LeaseStore::renew`].
pub(crate) fn spawn_watchdog(grant: Arc<GrantState>, watch: Watch) {
    let (store, key, holder, ttl) = (
        Arc::clone(&grant.store),
        grant.key.clone(),
        grant.holder.clone(),
        watch.ttl,
    );
    let renew: RenewAtom = Box::new(move || {
        let (store, key, holder) = (Arc::clone(&store), key.clone(), holder.clone());
        Box::pin(async move { store.renew(&key, &holder, ttl).await })
    });
    let plan = Plan {
        ttl: ttl.get(),
        every: watch.keep_alive.unwrap_or(ttl.get() / 3),
        max_hold: watch.max_hold,
        events: Events {
            not_held: Some(watch.lost_event),
            expired: Some(watch.lost_event),
            renew_failed: Some(watch.renew_failed_event),
            max_hold: watch.max_hold_event,
        },
    };
    keepalive::spawn(Arc::clone(&grant.life), plan, renew);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::MemoryStore;
    use crate::telemetry::events;

    fn grant(deadlines: &Deadlines, ttl: Duration) -> Arc<GrantState> {
        deadlines.watch(GrantState::new(
            Arc::new(MemoryStore::new()),
            StoreKey::from_stored("ns:lock:k".to_owned()),
            Holder::random(),
            Fence::new(1),
            now(),
            Ttl::new(ttl).unwrap(),
        ))
    }

    fn entries(deadlines: &Deadlines) -> usize {
        deadlines.timer.state.lock().unwrap().entries.len()
    }

    const S: Duration = Duration::from_secs(1);

    #[tokio::test(start_paused = true)]
    async fn lost_fires_at_valid_until_unless_stopped_first() {
        let deadlines = Deadlines::new(&events::LOCK_LOST);
        let kept = grant(&deadlines, 10 * S);
        let released = grant(&deadlines, 10 * S);
        released.stop();
        assert_eq!(entries(&deadlines), 1, "a stopped grant leaves the timer");
        let until = kept.valid_until();
        tokio::time::timeout(20 * S, kept.lost.cancelled())
            .await
            .expect("lost fires");
        assert!(now() >= until, "not before valid_until");
        assert!(now() < until + S, "promptly after valid_until");
        assert!(!released.lost.is_cancelled());
        assert_eq!(entries(&deadlines), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn an_earlier_deadline_wakes_the_timer() {
        let deadlines = Deadlines::new(&events::LOCK_LOST);
        let long = grant(&deadlines, 3600 * S);
        // Let the task arm its timer for the long grant.
        tokio::task::yield_now().await;
        let short = grant(&deadlines, S);
        tokio::time::timeout(2 * S, short.lost.cancelled())
            .await
            .expect("the shorter deadline is not missed behind the longer one");
        assert!(!long.lost.is_cancelled());
    }

    #[tokio::test(start_paused = true)]
    async fn grants_outlive_their_timer_owner() {
        let deadlines = Deadlines::new(&events::LOCK_LOST);
        let kept = grant(&deadlines, 5 * S);
        drop(deadlines);
        tokio::time::timeout(10 * S, kept.lost.cancelled())
            .await
            .expect("lost still fires after the Locks that made the grant is gone");
    }

    #[test]
    fn a_new_runtime_starts_the_timer_again() {
        let deadlines = Deadlines::new(&events::LOCK_LOST);
        let runtime = || {
            tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .start_paused(true)
                .build()
                .unwrap()
        };
        runtime().block_on(async {
            let _held = grant(&deadlines, 5 * S);
            tokio::task::yield_now().await;
        });
        // The first runtime, and the task it ran, are gone.
        runtime().block_on(async {
            let kept = grant(&deadlines, 5 * S);
            tokio::time::timeout(10 * S, kept.lost.cancelled())
                .await
                .expect("lost fires on the second runtime");
        });
    }
}
