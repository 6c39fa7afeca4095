//! Lease keep-alive streams, one per kept grant, reused by every renewal of it.
//!
//! etcd renews a lease over a `LeaseKeepAlive` stream. Opening one for each renewal costs a
//! new stream on the connection and a goroutine on the member every time, and the renewal
//! waited for it on top of its reads. Here the first renewal of a grant opens the stream
//! (one exchange), and every later renewal sends its keep-alive on it and reads the answer:
//! one round trip. The client's `LeaseKeeper` is bound to one lease, hence one stream per
//! grant, not one per store; each is closed when its grant is released, lost or moved to
//! another lease, and one whose lease has surely ended is dropped when a new stream is kept.
//!
//! A stream that fails (its member died, the connection was reset) or does not answer
//! within the response timeout is dropped, and the keep-alive is sent again on a new
//! stream within the same timeout: a keep-alive may be sent twice, as it only moves the
//! lease's expiry to TTL from when the leader receives it.
//!
//! The kept stream also says which lease the key's grant was on when it was last renewed,
//! so a renewal sends its keep-alive and its read of the key at once (see
//! [`grants`](crate::grants)).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use baton_core::{Holder, Result};
use etcd_client::{LeaseKeepAliveStream, LeaseKeeper};
use tokio::time::Instant;

use crate::EtcdStore;
use crate::error::is_lease_not_found;
use crate::requests::Fault;

/// How many kept streams a store holds before it drops the ones whose lease has surely
/// ended.
const PRUNE_ABOVE: usize = 64;

/// The kept streams of a store, by etcd key.
#[derive(Default)]
pub(crate) struct Keepers {
    by_key: Mutex<HashMap<String, Arc<tokio::sync::Mutex<Kept>>>>,
}

/// One grant's stream.
struct Kept {
    holder: Holder,
    lease: i64,
    /// The lease's TTL, in seconds.
    seconds: i64,
    /// Until when the lease surely lasts no longer: the last keep-alive plus its TTL.
    until: Instant,
    /// `None` once the stream failed: the next keep-alive opens another.
    stream: Option<(LeaseKeeper, LeaseKeepAliveStream)>,
}

impl Keepers {
    /// The lease that `holder`'s grant at `key` was on when it was last renewed by this
    /// store, with a lease of `seconds`.
    pub(crate) fn known_lease(&self, key: &str, holder: &Holder, seconds: i64) -> Option<i64> {
        let kept = self.lock().get(key).cloned()?;
        let kept = kept.try_lock().ok()?;
        (kept.holder == *holder && kept.seconds == seconds && kept.stream.is_some())
            .then_some(kept.lease)
    }

    /// Closes the stream of `key`'s grant, if there is one.
    pub(crate) fn forget(&self, key: &str) {
        self.lock().remove(key);
    }

    /// The stream entry of `key`, made now if it has none.
    fn entry(
        &self,
        key: &str,
        holder: &Holder,
        lease: i64,
        seconds: i64,
    ) -> Arc<tokio::sync::Mutex<Kept>> {
        let mut by_key = self.lock();
        if let Some(kept) = by_key.get(key) {
            return Arc::clone(kept);
        }
        if by_key.len() >= PRUNE_ABOVE {
            let now = Instant::now();
            by_key.retain(|_, kept| kept.try_lock().map_or(true, |k| k.until > now));
        }
        let kept = Arc::new(tokio::sync::Mutex::new(Kept {
            holder: holder.clone(),
            lease,
            seconds,
            until: Instant::now() + Duration::from_secs(u64::try_from(seconds).unwrap_or(0)),
            stream: None,
        }));
        by_key.insert(key.to_owned(), Arc::clone(&kept));
        kept
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<tokio::sync::Mutex<Kept>>>> {
        self.by_key.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl EtcdStore {
    /// One keep-alive of `lease`, the lease of `holder`'s grant at `key`, on the grant's
    /// kept stream (opened now if it has none): whether the cluster still knows the lease.
    pub(crate) async fn keep_alive(
        &self,
        key: &str,
        holder: &Holder,
        lease: i64,
        seconds: i64,
    ) -> Result<bool> {
        let within = self.options.get_response_timeout();
        let deadline = Instant::now() + within;
        let entry = self.keepers.entry(key, holder, lease, seconds);
        let mut kept = entry.lock().await;
        if kept.lease != lease || kept.holder != *holder || kept.seconds != seconds {
            // The key's grant is another now (a new grant, or moved to another lease): the
            // old stream is closed.
            kept.holder = holder.clone();
            (kept.lease, kept.seconds, kept.stream) = (lease, seconds, None);
        }
        let sent = Instant::now();
        if let Some((keeper, answers)) = kept.stream.as_mut() {
            let answer = tokio::time::timeout_at(deadline, async {
                keeper.keep_alive().await?;
                answers.message().await
            })
            .await;
            match answer {
                Ok(Ok(Some(answer))) if answer.id() == lease => {
                    if answer.ttl() <= 0 {
                        drop(kept);
                        self.keepers.forget(key);
                        return Ok(false);
                    }
                    kept.until =
                        sent + Duration::from_secs(u64::try_from(answer.ttl()).unwrap_or(0));
                    return Ok(true);
                }
                // Failed, ended, timed out or out of step: open another below.
                _ => kept.stream = None,
            }
        }
        let remaining = deadline.saturating_duration_since(Instant::now());
        let opened = self
            .send_within("lease keep-alive", remaining, || {
                let mut leases = self.client.lease_client();
                async move { leases.keep_alive(lease).await }
            })
            .await;
        match opened {
            Ok(stream) => {
                kept.stream = Some(stream);
                kept.until = sent + Duration::from_secs(u64::try_from(seconds).unwrap_or(0));
                Ok(true)
            }
            Err(Fault::Etcd(e)) if is_lease_not_found(&e) => {
                drop(kept);
                self.keepers.forget(key);
                Ok(false)
            }
            Err(fault) => Err(self.failed("lease keep-alive", fault)),
        }
    }
}
