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
//! The policy (whom the store queued, which hand-over is answered, when one is given back)
//! is the core's [`Handoffs`]; this module is its transport on PostgreSQL.
//!
//! ## Behavior
//! - A store queues itself only for a holder that [waits](ReleaseHub::subscribe_as) for
//!   the key, and only while its LISTEN connection listens (the pid is the address).
//! - A hand-over is taken only for a holder this store queued and that has not been granted
//!   the key by a claim since (a late notification of a grant its own claim already took is
//!   ignored), so the only holder ever told "handed over" is one whose grant the store made.
//! - A hand-over to a holder whose wait has ended (it gave up, or its acquire was dropped)
//!   is released at once, handing the key to the next store in line; one whose waiter does
//!   not take it within [`HANDOFF_RESERVATION`](baton_core::signals::HANDOFF_RESERVATION) is released then if the waiter is gone.
//! - The grant's TTL runs from the instant before the holder's first queueing claim was sent,
//!   earlier than the release that made it: `valid_until` never outlasts the server's expiry.
//!   A hand-over older than half its TTL is confirmed by a claim (which extends it) before it
//!   is trusted.
//! - A notification lost with the LISTEN connection leaves the grant to the holder's next
//!   claim, which finds the key its own and extends it; the holder's waiter claims again when
//!   the connection is back.

use std::sync::Arc;

use baton_core::signals::{Handoffs, ReleaseHub};
use baton_core::telemetry::{self, events};
use baton_core::{Fence, Holder, StoreKey};

use crate::connection::Db;
use crate::locks;
#[cfg(doc)]
use crate::sql;

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

/// The hand-overs of a store with pool `db`: the core's [`Handoffs`], whose address is the
/// LISTEN backend's pid, giving a grant back by releasing it.
pub(crate) fn new(hub: Arc<ReleaseHub>, db: Db) -> Handoffs {
    Handoffs::new(hub, move |_, key, holder| {
        give_back(db.clone(), key, holder)
    })
}

/// The pid to queue this store under: `Some` while the LISTEN connection listens.
pub(crate) fn pid(handoffs: &Handoffs) -> Option<i32> {
    handoffs.address().and_then(|pid| i32::try_from(pid).ok())
}

/// The LISTEN connection listens on backend `pid`.
pub(crate) fn connected(handoffs: &Handoffs, pid: i32) {
    match u64::try_from(pid) {
        Ok(address) if address != 0 => handoffs.connected(address),
        _ => handoffs.disconnected(),
    }
}

/// A notification `payload` for which [`is_handover`] holds, read by the LISTEN
/// connection's task.
pub(crate) fn arrived(handoffs: &Arc<Handoffs>, payload: &str) {
    let Some(notice) = Notice::parse(payload) else {
        return;
    };
    let Ok(address) = u64::try_from(notice.pid) else {
        return;
    };
    handoffs.arrived(
        address,
        StoreKey::from_stored(notice.key.to_owned()),
        Holder::from_stored(notice.holder.to_owned()),
        Fence::new(notice.fence),
    );
}

/// Releases the grant handed to `holder`, who will never use it, in the background: the
/// release hands the key to the next store in line.
fn give_back(db: Db, key: StoreKey, holder: Holder) {
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
