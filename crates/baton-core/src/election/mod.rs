//! Leader election: at most one leader of a name at a time, with a term that fences it, a
//! value it proclaims, and a stream of the changes for everyone else.
//!
//! Use an election when one replica must act for all of them for as long as it is alive
//! (the one that runs the scheduler, the one that owns a partition) and the others need to
//! know which one it is (its address, as its value). Use a [lock](crate::Locks) for a
//! critical section that ends, and a [lease](crate::Leases) when the holder is a stable
//! identity that claims the same thing again.
//!
//! Leadership is a lock grant of the election's name, taken and kept by the lock policy, so
//! it has the lock's guarantees and caveats, written once:
//!
//! - **Terms** are the grant's fence: strictly increasing across leaders of a name, also
//!   after expiry and restarts. Hand the term to what the leader writes and have it reject
//!   smaller ones: a leader paused past its TTL is then refused, not obeyed.
//! - **Lost leadership is told first**: [`Leadership::lost`] fires at the leader's
//!   `valid_until`, which is measured from before the request that granted or renewed it,
//!   so no other candidate can be elected before a leader that kept time has been told.
//!   Campaign with keep-alive ([`LockOptions::keep_alive`]) to stay leader for longer than a
//!   TTL; a lost leadership is reported as
//!   [`baton.election.leadership_lost`](crate::telemetry::events::ELECTION_LEADERSHIP_LOST).
//! - **The value** is kept with the grant (at most [`MAX_VALUE_BYTES`]) and replaced by
//!   [`Leadership::proclaim`] without a new term.
//! - **Observing** ([`Election::observe`]) reads the leader again whenever it may have
//!   changed: on a notice that a new leader, a proclaim or a resignation publishes (on
//!   stores that broadcast: memory, Redis, PostgreSQL), when the current leader's time runs
//!   out, and at a poll interval (every 250 ms where nothing is pushed, the SQLite store;
//!   every 5 s as a backstop elsewhere). It yields the state, not every step: a change that
//!   is undone before it is read is not seen. Notices lost on the way are reported as
//!   [`baton.election.observe_gap`](crate::telemetry::events::ELECTION_OBSERVE_GAP) and
//!   answered by reading the leader again.

#[cfg(feature = "conformance")]
pub mod conformance;

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::{Instant, sleep_until};
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

use crate::broadcast::{Broadcast, Subscription};
use crate::capability::Store;
use crate::error::{Error, ErrorKind, Result};
use crate::fence::Fence;
use crate::key::{Key, KeyKind, Namespace, StoreKey, check_text};
use crate::lock::grant::now;
use crate::lock::{AcquireError, LockGuard, LockOptions, Locks, MAX_LABEL_BYTES, ReleaseOutcome};
use crate::signals::ReleaseWaiter;
use crate::store::{Claim, HolderInfo, LeaseRequest, LeaseStore};
use crate::telemetry::{self, events};
use crate::time::MAX_WAIT;

/// The longest value a leader may proclaim, in bytes.
pub const MAX_VALUE_BYTES: usize = 1024;

/// The longest candidate id, in bytes (a lock's holder label).
pub const MAX_CANDIDATE_BYTES: usize = MAX_LABEL_BYTES;

/// How often an observer reads the leader when the store pushes notices: a backstop.
const POLL_WITH_NOTICES: Duration = Duration::from_secs(5);

/// How often an observer reads the leader when nothing is pushed (the SQLite store).
const POLL_WITHOUT_NOTICES: Duration = Duration::from_millis(250);

/// The leader of an election, as [`Election::leader`] and [`Observer::next`] report it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leader {
    /// The candidate id it campaigned with.
    pub candidate: String,
    /// The value it campaigned with or last proclaimed.
    pub value: String,
    /// Its term: strictly larger than every earlier leader's of this election.
    pub term: Fence,
    /// Its remaining time on the store's clock, when it was read.
    pub remaining: Duration,
}

impl Leader {
    fn from_holder(info: HolderInfo) -> Leader {
        // A campaign's holder is `<candidate>/<random token>` (a lock's labelled holder).
        let holder = info.holder.as_str();
        let candidate = holder.rsplit_once('/').map_or(holder, |(id, _)| id);
        Leader {
            candidate: candidate.to_owned(),
            value: info.reason,
            term: info.fence,
            remaining: info.remaining,
        }
    }

    /// Whether `other` is the same leadership in the same state (its remaining time aside).
    fn same_as(&self, other: &Leader) -> bool {
        self.term == other.term && self.candidate == other.candidate && self.value == other.value
    }
}

/// One election of a name on one store. Cheap to clone.
///
/// # Examples
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> baton_core::Result<()> {
/// use std::{sync::Arc, time::Duration};
/// use baton_core::{Election, LockOptions, MemoryStore, Namespace};
///
/// let election = Election::new(Arc::new(MemoryStore::new()), Namespace::default(), "scheduler")?;
/// let options = LockOptions::new(Duration::from_secs(15)).keep_alive(Duration::from_secs(5));
/// let leadership = election.campaign("pod-a", "10.0.0.7:8080", &options).await?;
/// let leader = election.leader().await?.expect("a leader");
/// assert_eq!((leader.candidate.as_str(), leader.term), ("pod-a", leadership.term()));
/// leadership.proclaim("10.0.0.7:9090").await?;
/// assert_eq!(election.leader().await?.unwrap().value, "10.0.0.7:9090");
/// leadership.resign().await;
/// assert!(election.leader().await?.is_none());
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Election {
    inner: Arc<Inner>,
}

struct Inner {
    name: String,
    key: StoreKey,
    locks: Locks,
    /// Where leaders publish notices of change, on stores that broadcast.
    notices: Option<Broadcast>,
    poll: Duration,
}

impl fmt::Debug for Election {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Election")
            .field("key", &self.inner.key)
            .field("notices", &self.inner.notices.is_some())
            .finish_non_exhaustive()
    }
}

impl Election {
    /// The election `name` on `store`, its key qualified with `namespace`. Observers are
    /// pushed notices when the store broadcasts, and poll otherwise.
    ///
    /// # Errors
    /// `InvalidInput` for a bad name.
    pub fn new(store: Arc<dyn Store>, namespace: Namespace, name: &str) -> Result<Election> {
        let key = namespace.qualify(KeyKind::Election, &Key::new(name)?);
        let notices = Arc::clone(&store)
            .broadcast_store()
            .ok()
            .map(|broadcast| Broadcast::of_kind(broadcast, namespace.clone(), KeyKind::Election));
        let poll = match notices {
            Some(_) => POLL_WITH_NOTICES,
            None => POLL_WITHOUT_NOTICES,
        };
        let leases: Arc<dyn LeaseStore> = store;
        Ok(Election {
            inner: Arc::new(Inner {
                name: name.to_owned(),
                key,
                locks: Locks::claiming_only(
                    leases,
                    namespace,
                    KeyKind::Election,
                    &events::ELECTION_LEADERSHIP_LOST,
                ),
                notices,
                poll,
            }),
        })
    }

    /// The election's name, as given.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// Campaigns as `candidate` with `value` until elected, however long that takes, and
    /// returns the leadership. `options` gives the leadership's TTL and keep-alive; its
    /// `wait` is not used (see [`Election::try_campaign`]). Candidates of one process are
    /// elected in the order they campaigned; across processes, a leader's end wakes every
    /// waiting candidate and the first claim to arrive wins (a store's hand-over to the
    /// waiter whose turn it is carries no value, so campaigns always claim).
    ///
    /// # Errors
    /// `InvalidInput` before any I/O for a bad candidate, value or options; `Unavailable`
    /// when the store faulted before it answered (a campaign that has had an answer rides
    /// out the faults that follow, as a waiting lock does).
    ///
    /// # Cancel safety
    /// As for [`Locks::acquire`]: a leadership an in-flight claim may have taken is given
    /// back in the background.
    pub async fn campaign(
        &self,
        candidate: &str,
        value: &str,
        options: &LockOptions,
    ) -> Result<Leadership> {
        let options = options.clone().wait(MAX_WAIT);
        loop {
            if let Some(leadership) = self.try_campaign(candidate, value, &options).await? {
                return Ok(leadership);
            }
        }
    }

    /// Campaigns as `candidate` with `value`, waiting up to the options' `wait` to be
    /// elected (a zero wait, the default, is one attempt); `Ok(None)` when another candidate
    /// led for the whole wait.
    ///
    /// # Errors
    /// As [`Election::campaign`].
    pub async fn try_campaign(
        &self,
        candidate: &str,
        value: &str,
        options: &LockOptions,
    ) -> Result<Option<Leadership>> {
        check_candidate(candidate)?;
        check_value(value)?;
        let labelled = options.clone().holder_label(candidate);
        let ttl = labelled.checked()?.ttl;
        let holder = labelled.new_holder();
        let guard = match self
            .inner
            .locks
            .acquire_as(&self.inner.name, &labelled, holder, value)
            .await
        {
            Ok(guard) => guard,
            Err(AcquireError::Contended { .. }) => return Ok(None),
            Err(AcquireError::Unavailable(e) | AcquireError::InvalidInput(e)) => return Err(e),
        };
        let leadership = Leadership {
            election: self.clone(),
            candidate: candidate.to_owned(),
            value: Mutex::new(value.to_owned()),
            ttl,
            guard: Some(guard),
        };
        leadership.notify().await;
        Ok(Some(leadership))
    }

    /// The current leader, or `None` when there is none.
    ///
    /// # Errors
    /// `Unavailable` when the store faulted.
    pub async fn leader(&self) -> Result<Option<Leader>> {
        Ok(self
            .inner
            .locks
            .store()
            .inspect(&self.inner.key)
            .await?
            .map(Leader::from_holder))
    }

    /// The elections of `namespace` whose name starts with `prefix` and that have a leader,
    /// in name order, at most `limit` of them: each election's name and its leader, read
    /// from `leases` (the store's lease atom, where a leadership is a grant).
    ///
    /// # Errors
    /// `InvalidInput` for a prefix no name could start with; `Unavailable` when the store
    /// faulted.
    pub async fn list(
        leases: &dyn LeaseStore,
        namespace: &Namespace,
        prefix: &str,
        limit: usize,
    ) -> Result<Vec<(String, Leader)>> {
        let qualified = namespace.qualify_prefix(KeyKind::Election, prefix)?;
        Ok(leases
            .list(&qualified, limit)
            .await?
            .into_iter()
            .map(|info| (info.key.user_key().to_owned(), Leader::from_holder(info)))
            .collect())
    }

    /// A stream of the election's leaders: the first [`Observer::next`] answers the current
    /// leader (or none), and every later one the next change (a new leader, a new value, no
    /// leader).
    ///
    /// # Errors
    /// `Unavailable` when the store faulted.
    pub async fn observe(&self) -> Result<Observer> {
        let released = self
            .inner
            .locks
            .store()
            .wakeups()
            .hub
            .subscribe(&self.inner.key);
        let notices = match &self.inner.notices {
            Some(broadcast) => match broadcast.subscribe::<u64>(&self.inner.name).await {
                Ok(subscription) => Some(subscription),
                Err(error) => {
                    telemetry::emit(
                        &events::ELECTION_OBSERVE_GAP,
                        Some(self.inner.key.as_str()),
                        format_args!(
                            "observing without notices (reading the leader every {:?}): {error}",
                            self.inner.poll
                        ),
                    );
                    None
                }
            },
            None => None,
        };
        Ok(Observer {
            watcher: Some(Watcher {
                election: self.clone(),
                last: None,
                released,
                notices,
            }),
            pending: None,
        })
    }
}

/// The leadership of one election, won by [`Election::campaign`]. Resign with
/// [`Leadership::resign`]; dropping it resigns in the background (and tells observers).
#[must_use = "dropping a Leadership resigns at once; bind it to a variable for as long as this process leads"]
pub struct Leadership {
    election: Election,
    candidate: String,
    value: Mutex<String>,
    ttl: crate::time::Ttl,
    /// `None` only once resigned.
    guard: Option<LockGuard>,
}

impl fmt::Debug for Leadership {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Leadership")
            .field("election", &self.election.inner.key)
            .field("candidate", &self.candidate)
            .field("term", &self.term())
            .field("lost", &self.is_lost())
            .finish()
    }
}

impl Leadership {
    fn guard(&self) -> &LockGuard {
        self.guard
            .as_ref()
            .expect("a leadership holds its grant until resigned")
    }

    /// The term: strictly larger than every earlier leader's of this election. Pass it to
    /// what the leader writes and have it reject smaller terms.
    pub fn term(&self) -> Fence {
        self.guard().fence()
    }

    /// The candidate id this leadership was won with.
    pub fn candidate(&self) -> &str {
        &self.candidate
    }

    /// The value last proclaimed.
    pub fn value(&self) -> String {
        self.value
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The monotonic instant until which this process is certainly the leader, measured from
    /// before the request that elected it (or last renewed it) was sent.
    pub fn valid_until(&self) -> Instant {
        self.guard().valid_until()
    }

    /// Resolves when the leadership is known or presumed gone: stop acting as leader.
    pub fn lost(&self) -> WaitForCancellationFutureOwned {
        self.guard().lost()
    }

    /// The lost signal as a [`CancellationToken`] (a child: cancelling it changes nothing).
    pub fn lost_token(&self) -> CancellationToken {
        self.guard().lost_token()
    }

    /// Whether the lost signal has fired.
    pub fn is_lost(&self) -> bool {
        self.guard().is_lost()
    }

    /// Replaces the leader's value, keeping the term, and tells observers.
    ///
    /// # Errors
    /// `InvalidInput` before any I/O for a bad value; `Timeout` when this process is no
    /// longer the leader (nothing was changed); `Unavailable` when the store faulted (the
    /// value may or may not have been replaced).
    pub async fn proclaim(&self, value: &str) -> Result<()> {
        check_value(value)?;
        let grant = self.guard().grant();
        let not_leader = || {
            Error::new(
                ErrorKind::Timeout,
                format!(
                    "{} no longer leads {:?} (term {}); nothing was proclaimed",
                    self.candidate,
                    self.election.name(),
                    self.term()
                ),
            )
        };
        if self.is_lost() {
            return Err(not_leader());
        }
        let request = LeaseRequest::new(&grant.holder, self.ttl).reason(value);
        match grant.store.claim(&grant.key, request).await? {
            Claim::Extended { fence } if fence == grant.fence => {
                *self.value.lock().unwrap_or_else(PoisonError::into_inner) = value.to_owned();
                self.notify().await;
                Ok(())
            }
            Claim::Granted { .. } | Claim::Extended { .. } | Claim::HandedOver { .. } => {
                // The grant had ended and this claim took the name again, in a new term that
                // nobody campaigned for: give it back.
                let _ = grant.store.release(&grant.key, &grant.holder).await;
                Err(not_leader())
            }
            Claim::Held { .. } => Err(not_leader()),
        }
    }

    /// Gives the leadership up, if this process still holds it, and tells observers.
    pub async fn resign(mut self) -> ReleaseOutcome {
        let guard = self
            .guard
            .take()
            .expect("a leadership holds its grant until resigned");
        let term = guard.fence().get();
        let outcome = guard.release().await;
        self.publish(term).await;
        outcome
    }

    /// Publishes a notice that the leader changed, on stores that broadcast. Best effort: an
    /// observer that misses it reads the leader again at its poll interval, and a failed
    /// publish is reported by the broadcast itself.
    async fn notify(&self) {
        self.publish(self.term().get()).await;
    }

    async fn publish(&self, term: u64) {
        if let Some(broadcast) = &self.election.inner.notices {
            let _ = broadcast.publish(self.election.name(), &term).await;
        }
    }
}

impl Drop for Leadership {
    /// Resigns in the background, then tells observers, on the current tokio runtime; outside
    /// any runtime the grant's own drop leaves the name to its TTL and says so.
    fn drop(&mut self) {
        let Some(guard) = self.guard.take() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            drop(guard);
            return;
        };
        let notices = self.election.inner.notices.clone();
        let name = self.election.inner.name.clone();
        runtime.spawn(async move {
            let term = guard.fence().get();
            guard.release().await;
            if let Some(broadcast) = notices {
                let _ = broadcast.publish(&name, &term).await;
            }
        });
    }
}

/// The changes of one election's leader, from [`Election::observe`]: [`Observer::next`], or
/// a [`Stream`](futures_core::Stream) of the same answers (which never ends: a store fault
/// is an `Err` item, and the next item reads again).
pub struct Observer {
    /// The state between changes; `None` while `pending` has it.
    watcher: Option<Watcher>,
    /// The wait for the next change, kept across polls (and across a dropped `next`).
    pending: Option<Pending>,
}

type Pending = Pin<Box<dyn Future<Output = (Watcher, Result<Option<Leader>>)> + Send>>;

struct Watcher {
    election: Election,
    /// What the last change answered; `None` before the first.
    last: Option<Option<Leader>>,
    released: ReleaseWaiter,
    notices: Option<Subscription<u64>>,
}

impl fmt::Debug for Observer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Observer")
            .field("waiting", &self.pending.is_some())
            .finish_non_exhaustive()
    }
}

impl Observer {
    /// The current leader on the first call; afterwards, waits until the leader differs from
    /// the one last answered (another term, another value, or none) and answers it.
    ///
    /// # Errors
    /// `Unavailable` when the store faulted; the next call reads again.
    ///
    /// # Cancel safety
    /// Cancel safe: the wait goes on inside the observer, and the next call continues it.
    pub async fn next(&mut self) -> Result<Option<Leader>> {
        std::future::poll_fn(|cx| self.poll_change(cx)).await
    }

    fn poll_change(&mut self, cx: &mut Context<'_>) -> Poll<Result<Option<Leader>>> {
        let pending = match &mut self.pending {
            Some(pending) => pending,
            None => {
                let watcher = self
                    .watcher
                    .take()
                    .expect("an observer has its watcher while nothing is pending");
                self.pending.insert(Box::pin(watcher.change()))
            }
        };
        match pending.as_mut().poll(cx) {
            Poll::Ready((watcher, answer)) => {
                self.watcher = Some(watcher);
                self.pending = None;
                Poll::Ready(answer)
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

impl futures_core::Stream for Observer {
    type Item = Result<Option<Leader>>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.get_mut().poll_change(cx).map(Some)
    }
}

impl Watcher {
    /// Waits for the next change (the current state, the first time) and answers it, with
    /// the watcher back for the one after.
    async fn change(mut self) -> (Watcher, Result<Option<Leader>>) {
        loop {
            let current = match self.election.leader().await {
                Ok(current) => current,
                Err(error) => return (self, Err(error)),
            };
            let changed = match (&self.last, &current) {
                (None, _) => true,
                (Some(Some(last)), Some(now)) => !last.same_as(now),
                (Some(last), now) => last.is_some() != now.is_some(),
            };
            if changed {
                self.last = Some(current.clone());
                return (self, Ok(current));
            }
            let mut wake_at = now() + self.election.inner.poll;
            if let Some(leader) = &current {
                // An expiry publishes nothing: look again when the leader's time runs out.
                wake_at = wake_at.min(now() + leader.remaining + Duration::from_millis(1));
            }
            self.wait(wake_at).await;
        }
    }

    /// Waits for a sign that the leader may have changed, or until `wake_at`.
    async fn wait(&mut self, wake_at: Instant) {
        let key = &self.election.inner.key;
        match &mut self.notices {
            Some(notices) => tokio::select! {
                notice = notices.next() => match notice {
                    Some(notice) if notice.may_have_lost_messages() => telemetry::emit(
                        &events::ELECTION_OBSERVE_GAP,
                        Some(key.as_str()),
                        format_args!("notices of the election may have been lost ({notice:?}); reading the leader again"),
                    ),
                    Some(_) => {}
                    None => self.notices = None,
                },
                _ = self.released.released() => {}
                () = sleep_until(wake_at) => {}
            },
            None => tokio::select! {
                _ = self.released.released() => {}
                () = sleep_until(wake_at) => {}
            },
        }
    }
}

/// The rule of a candidate id: a lock's holder label (1 to [`MAX_CANDIDATE_BYTES`] bytes, no
/// control characters).
///
/// # Errors
/// `InvalidInput` naming the rule broken.
pub fn check_candidate(candidate: &str) -> Result<()> {
    check_text("candidate id", candidate, MAX_CANDIDATE_BYTES)
}

/// The rule of a leader's value: at most [`MAX_VALUE_BYTES`] bytes, no control characters;
/// it may be empty.
///
/// # Errors
/// `InvalidInput` naming the rule broken.
pub fn check_value(value: &str) -> Result<()> {
    if value.is_empty() {
        return Ok(());
    }
    check_text("leader value", value, MAX_VALUE_BYTES)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::memory::MemoryStore;

    fn election() -> Election {
        Election::new(Arc::new(MemoryStore::new()), Namespace::default(), "e").unwrap()
    }

    async fn poll_next(observer: &mut Observer) -> Option<Result<Option<Leader>>> {
        std::future::poll_fn(|cx| futures_core::Stream::poll_next(Pin::new(&mut *observer), cx))
            .await
    }

    /// The observer is a stream of the same answers as `next`.
    #[tokio::test]
    async fn an_observer_is_a_stream_of_changes() {
        let election = election();
        let mut observer = election.observe().await.unwrap();
        assert_eq!(poll_next(&mut observer).await.unwrap().unwrap(), None);
        let leadership = election
            .campaign("a", "v", &LockOptions::new(Duration::from_secs(30)))
            .await
            .unwrap();
        let leader = poll_next(&mut observer)
            .await
            .unwrap()
            .unwrap()
            .expect("a leads");
        assert_eq!(
            (leader.candidate.as_str(), leader.term),
            ("a", leadership.term())
        );
        leadership.resign().await;
    }

    /// A `next` dropped while it waits loses nothing: the next call answers the change that
    /// happened meanwhile.
    #[tokio::test]
    async fn a_dropped_next_loses_no_change() {
        let election = election();
        let mut observer = election.observe().await.unwrap();
        assert_eq!(observer.next().await.unwrap(), None);
        let waited = tokio::time::timeout(Duration::from_millis(50), observer.next()).await;
        assert!(waited.is_err(), "nothing changed yet");
        let leadership = election
            .campaign("a", "v", &LockOptions::new(Duration::from_secs(30)))
            .await
            .unwrap();
        let leader = tokio::time::timeout(Duration::from_secs(5), observer.next())
            .await
            .expect("the change is answered")
            .unwrap()
            .expect("a leads");
        assert_eq!(leader.term, leadership.term());
        leadership.resign().await;
    }
}
