//! Hand-overs: a release gives the key to the store that waited longest, and that store's
//! waiting holder takes it without a claim of its own.
//!
//! A grant then costs two statements, as `pg_advisory_lock` and `pg_advisory_unlock` do:
//! the waiter's claim that found the key held and queued its store ([`sql::CLAIM`]), and
//! the holder's release that made the grant ([`sql::RELEASE`]). The release notifies
//! `U+001F pid U+001F fence U+001F holder U+001F key` on the channel of the store whose
//! LISTEN backend is `pid` ([`sql::HANDOFF_CHANNEL`]); that store reads it here and wakes
//! the holder's waiter, whose next claim answers [`Claim::HandedOver`](baton_core::store::Claim::HandedOver) from memory.
//!
//! ## Behavior
//! - A store queues itself only for a holder that [waits](ReleaseHub::subscribe_as) for
//!   the key, and only while its LISTEN connection listens (the pid is the address).
//! - A hand-over is taken only for a holder this store queued and that has not been granted
//!   the key by a claim since (a late notification of a grant its own claim already took is
//!   ignored), so the only holder ever told "handed over" is one whose grant the store made.
//! - A hand-over to a holder whose wait has ended (it gave up, or its acquire was dropped)
//!   is released at once, handing the key to the next store in line; one whose waiter does
//!   not take it within [`HANDOFF_RESERVATION`] is released then if the waiter is gone.
//! - The grant's TTL runs from the instant before the holder's first queueing claim was sent,
//!   earlier than the release that made it: `valid_until` never outlasts the server's expiry.
//!   A hand-over older than half its TTL is confirmed by a claim (which extends it) before it
//!   is trusted.
//! - A notification lost with the LISTEN connection leaves the grant to the holder's next
//!   claim, which finds the key its own and extends it; the holder's waiter claims again when
//!   the connection is back.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use baton_core::signals::{HANDOFF_RESERVATION, ReleaseHub};
use baton_core::telemetry::{self, events};
use baton_core::{Fence, Holder, StoreKey};
use tokio::time::Instant;

use crate::connection::Db;
use crate::locks;
#[cfg(doc)]
use crate::sql;

/// How long a holder this store queued, whose wait has ended, is remembered while its
/// store's entry may still be read by a release in flight.
const FORGET_AFTER: Duration = Duration::from_secs(60);

/// The hand-overs of one store: whom it queued, and the grants handed to them.
#[derive(Debug)]
pub(crate) struct Handoffs {
    hub: Arc<ReleaseHub>,
    db: Db,
    /// The LISTEN backend's pid while the connection listens; 0 otherwise.
    pid: AtomicI32,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// The holders this store queued for each key, with the instant before the first claim
    /// that queued each.
    queued: HashMap<StoreKey, Vec<(Holder, Instant)>>,
    /// Grants handed to a waiting holder of this store and not taken yet, one per key.
    handed: HashMap<StoreKey, Handed>,
}

/// A grant a release handed to one of this store's holders.
#[derive(Debug, Clone)]
pub(crate) struct Handed {
    pub(crate) holder: Holder,
    pub(crate) fence: Fence,
    /// The instant before the claim that queued the holder was sent.
    pub(crate) since: Instant,
}

/// A hand-over notification's fields.
struct Notice<'a> {
    pid: i32,
    fence: u64,
    holder: &'a str,
    key: &'a str,
}

impl Notice<'_> {
    /// The fields of a hand-over payload (`U+001F pid U+001F fence U+001F holder U+001F
    /// key`); `None` for a plain release (the key alone) or a payload baton did not send.
    fn parse(payload: &str) -> Option<Notice<'_>> {
        let mut fields = payload.strip_prefix('\u{1f}')?.splitn(4, '\u{1f}');
        let pid = fields.next()?.parse().ok()?;
        let fence = fields.next()?.parse().ok()?;
        let holder = fields.next()?;
        let key = fields.next()?;
        Some(Notice {
            pid,
            fence,
            holder,
            key,
        })
    }
}

/// Whether a notification payload is a hand-over rather than a plain release.
pub(crate) fn is_handover(payload: &str) -> bool {
    payload.starts_with('\u{1f}')
}

impl Handoffs {
    pub(crate) fn new(hub: Arc<ReleaseHub>, db: Db) -> Self {
        Handoffs {
            hub,
            db,
            pid: AtomicI32::new(0),
            state: Mutex::new(State::default()),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The pid to queue this store under: `Some` while the LISTEN connection listens.
    pub(crate) fn pid(&self) -> Option<i32> {
        Some(self.pid.load(Ordering::Acquire)).filter(|pid| *pid != 0)
    }

    /// The LISTEN connection listens on backend `pid`. Entries queued under an earlier
    /// backend will never be answered here: they are forgotten (the server deletes them at
    /// the next release, as its backend is gone).
    pub(crate) fn connected(&self, pid: i32) {
        let previous = self.pid.swap(pid, Ordering::AcqRel);
        if previous != pid {
            self.state().queued.clear();
        }
    }

    /// The LISTEN connection was lost: nothing is queued until it is back.
    pub(crate) fn disconnected(&self) {
        self.pid.store(0, Ordering::Release);
    }

    /// The grant handed to `holder` for `key`, taken (it is answered once).
    pub(crate) fn take(&self, key: &StoreKey, holder: &Holder) -> Option<Handed> {
        let mut state = self.state();
        match state.handed.get(key) {
            Some(handed) if handed.holder == *holder => state.handed.remove(key),
            _ => None,
        }
    }

    /// `holder` is about to claim `key` and be queued if it is held; `sent` is the instant
    /// before the claim is sent. Its first queueing is kept: the hand-over's TTL runs from it.
    pub(crate) fn queueing(&self, key: &StoreKey, holder: &Holder, sent: Instant) {
        let mut state = self.state();
        let queued = state.queued.entry(key.clone()).or_default();
        queued.retain(|(queued, at)| {
            queued == holder
                || self.hub.is_waiting(key, queued)
                || sent.saturating_duration_since(*at) < FORGET_AFTER
        });
        if !queued.iter().any(|(queued, _)| queued == holder) {
            queued.push((holder.clone(), sent));
        }
    }

    /// A claim granted or extended `key` to `holder`: it is no longer queued, and a
    /// hand-over of that grant that arrives late (or arrived while the claim was in flight)
    /// is not answered again.
    pub(crate) fn granted(&self, key: &StoreKey, holder: &Holder) {
        let mut state = self.state();
        if let Some(queued) = state.queued.get_mut(key) {
            // The claim deleted this store's entry: holders whose wait ended are done with.
            queued.retain(|(queued, _)| queued != holder && self.hub.is_waiting(key, queued));
            if queued.is_empty() {
                state.queued.remove(key);
            }
        }
        if state.handed.get(key).is_some_and(|h| h.holder == *holder) {
            state.handed.remove(key);
        }
    }

    /// A notification `payload` for which [`is_handover`] holds, read by the LISTEN
    /// connection's task.
    pub(crate) fn arrived(self: &Arc<Self>, payload: &str) {
        let Some(notice) = Notice::parse(payload) else {
            return;
        };
        if Some(notice.pid) != self.pid() {
            // Another store's turn.
            return;
        }
        let key = StoreKey::from_stored(notice.key.to_owned());
        let holder = Holder::from_stored(notice.holder.to_owned());
        let handed = {
            let mut state = self.state();
            let Some(queued) = state.queued.get_mut(&key) else {
                return;
            };
            let Some(at) = queued.iter().position(|(queued, _)| *queued == holder) else {
                // Not queued (any more): the holder's own claim took this grant already.
                return;
            };
            let (_, since) = queued.remove(at);
            if queued.is_empty() {
                state.queued.remove(&key);
            }
            let handed = Handed {
                holder: holder.clone(),
                fence: Fence::new(notice.fence),
                since,
            };
            if !self.hub.is_waiting(&key, &holder) {
                // Its wait ended before its turn came: pass the turn on.
                drop(state);
                self.give_back(key, holder);
                return;
            }
            state.handed.insert(key.clone(), handed.clone());
            handed
        };
        self.hub.notify(&key);
        let this = Arc::clone(self);
        tokio::spawn(async move { this.watch(key, handed).await });
    }

    /// Releases a hand-over its waiter does not take, once that waiter's wait has ended.
    async fn watch(self: Arc<Self>, key: StoreKey, handed: Handed) {
        loop {
            tokio::time::sleep(HANDOFF_RESERVATION).await;
            let mut state = self.state();
            match state.handed.get(&key) {
                Some(h) if h.holder == handed.holder && h.fence == handed.fence => {
                    if self.hub.is_waiting(&key, &handed.holder) {
                        continue;
                    }
                    state.handed.remove(&key);
                }
                // Taken, or replaced by a later hand-over.
                _ => return,
            }
            drop(state);
            self.give_back(key, handed.holder);
            return;
        }
    }

    /// Releases the grant handed to `holder`, who will never use it, in the background: the
    /// release hands the key to the next store in line.
    fn give_back(&self, key: StoreKey, holder: Holder) {
        let db = self.db.clone();
        tokio::spawn(async move {
            if let Err(error) = locks::release(&db, &key, &holder).await {
                telemetry::emit(
                    &events::LOCK_RELEASE_FAULTED,
                    Some(key.as_str()),
                    format_args!(
                        "a grant handed to a waiter that stopped waiting could not be released, \
                         so the key stays held until its TTL: {error}"
                    ),
                );
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hand_over_payloads_are_told_from_plain_releases() {
        let notice = Notice::parse("\u{1f}4242\u{1f}17\u{1f}tok:en\u{1f}ns:lock:a\u{1f}b").unwrap();
        assert_eq!(
            (notice.pid, notice.fence, notice.holder, notice.key),
            (4242, 17, "tok:en", "ns:lock:a\u{1f}b")
        );
        assert!(is_handover("\u{1f}1\u{1f}2\u{1f}h\u{1f}k"));
        assert!(!is_handover("ns:lock:a"));
        assert!(Notice::parse("ns:lock:a").is_none());
        assert!(Notice::parse("\u{1f}x\u{1f}2\u{1f}h\u{1f}k").is_none());
        assert!(Notice::parse("\u{1f}1\u{1f}2\u{1f}h").is_none());
    }
}
