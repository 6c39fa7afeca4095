//! Semaphores on Redis: the permits of a key in a sorted set by when they end (on the server's
//! clock) beside a hash of their fences, each operation one Lua script on the key's hash slot.
//!
//! The layout and the scripts are in `scripts/permit_prelude.lua` (and [`crate::scripts`]).
//! Fences come from the key's counter as a lock grant's do, so they increase across every
//! permit of the key, also after a restart without persistence and after a replica that missed
//! the last grants is promoted; with `min_replicas`, a claim, renewal or release counts only
//! once replicas confirm it, as for locks.
//!
//! ## Waking waiters
//! A claim that finds every permit held while a waiter of this process waits queues the store
//! in the key's queue, as a lock's claim does. A release that gave back a live permit reserves
//! it for the store that waited longest and tells that store (`p<Q>` on its channel, see
//! [`crate::wakeups`]), which wakes the first of its waiters; that waiter's claim takes the
//! reservation. Meanwhile the reservation counts as a held permit, so a claim from elsewhere
//! (the releaser asking again at once, a newcomer) finds the key full and queues behind:
//! stores take permits in the order they queued. A reservation nobody claims ends after
//! [`HANDOFF_RESERVATION`](baton_core::signals::HANDOFF_RESERVATION). With nobody queued a
//! release reserves and publishes nothing.

use async_trait::async_trait;
use baton_core::semaphore::PermitInfo;
use baton_core::signals::ReleaseHub;
use baton_core::store::{Claim, HolderInfo, LeaseRequest, LeaseStore, Release, Renewal, Wakeups};
use baton_core::{Holder, Result, SemaphoreStore, StoreKey, Ttl};
use redis::Value;

use crate::keys;
use crate::locks::{
    RedisStore, fence, int, parse_claim, remaining, send_unconfirmed_give_back, text,
};
use crate::scripts::{Evalsha, SCRIPTS};

/// What the permit release script answered: the release, and whether this store's own
/// waiter is the one to wake.
pub(crate) fn parse_release(value: &Value) -> Option<(Release, bool)> {
    match int(value)? {
        0 => Some((Release::Removed, false)),
        1 => Some((Release::Removed, true)),
        2 => Some((Release::NoHolder, false)),
        _ => None,
    }
}

/// The answer of the list script: holder, fence, remaining ms and the claim's N (0: not
/// recorded), for each live permit; sorted here by fence (oldest first).
pub(crate) fn parse_permits(key: &StoreKey, value: &Value) -> Option<Vec<PermitInfo>> {
    let Value::Array(items) = value else {
        return None;
    };
    if items.len() % 4 != 0 {
        return None;
    }
    let mut permits = items
        .chunks(4)
        .map(|p| {
            Some(PermitInfo {
                grant: HolderInfo {
                    key: key.clone(),
                    holder: Holder::from_stored(text(&p[0])?),
                    fence: fence(&p[1])?,
                    remaining: remaining(&p[2])?,
                    reason: String::new(),
                },
                permits: u32::try_from(int(&p[3])?).ok().filter(|n| *n > 0),
            })
        })
        .collect::<Option<Vec<_>>>()?;
    permits.sort_by_key(|p| p.grant.fence);
    Some(permits)
}

/// The qualified key of a semaphore's `{Q}:permits`, or `None` for any other Redis key.
pub(crate) fn from_permits_key(redis_key: &str) -> Option<StoreKey> {
    keys::from_grant_key(redis_key.strip_suffix(":permits")?)
}

/// The `SCAN MATCH` pattern of the `{Q}:permits` keys whose qualified key starts with
/// `prefix`.
pub(crate) fn permits_pattern(prefix: &str) -> String {
    let mut pattern = keys::grant_pattern(prefix);
    pattern.push_str(":permits");
    pattern
}

// The calls of the permit scripts, built once for the single server's store and a cluster
// store alike: each declares every key its script touches, so a cluster routes it by them.

/// A permit claim of up to `permits` permits. With `store` (the store's channel, when a waiter
/// of this process waits for a permit) the claim also queues the store if every permit is held.
pub(crate) fn claim_call(
    key: &StoreKey,
    request: &LeaseRequest<'_>,
    permits: u32,
    store: Option<&str>,
) -> Evalsha<'static> {
    let holder = request.holder.as_str();
    let size = 4 * key.as_str().len() + holder.len() + store.map_or(0, str::len) + 64;
    let keys = if store.is_some() { 4 } else { 3 };
    let mut invocation = Evalsha::new(&SCRIPTS.permit_claim, keys, size);
    invocation
        .arg(keys::permits(key))
        .arg(keys::fences(key))
        .arg(keys::fence(key));
    if store.is_some() {
        invocation.arg(keys::queue(key));
    }
    invocation
        .arg(holder)
        .arg(request.ttl.as_millis())
        .arg(permits);
    if let Some(store) = store {
        invocation.arg(store);
    }
    invocation
}

/// A renewal of `holder`'s permit for `ttl`.
pub(crate) fn renew_call(key: &StoreKey, holder: &Holder, ttl: Ttl) -> Evalsha<'static> {
    let mut invocation = Evalsha::new(&SCRIPTS.permit_renew, 2, 2 * key.as_str().len() + 64);
    invocation
        .arg(keys::permits(key))
        .arg(keys::fences(key))
        .arg(holder.as_str())
        .arg(ttl.as_millis());
    invocation
}

/// The answer of the permit renewal script.
pub(crate) fn parse_renewal(value: &Value) -> Option<Renewal> {
    match int(value)? {
        1 => Some(Renewal::Renewed),
        0 => Some(Renewal::NotHeld),
        _ => None,
    }
}

/// A release of `holder`'s permit; `store` is `1` or `0` (a waiter of this process waits for
/// a permit) followed by the store's channel.
pub(crate) fn release_call(key: &StoreKey, holder: &str, store: &str) -> Evalsha<'static> {
    let size = 3 * key.as_str().len() + holder.len() + store.len() + 32;
    let mut invocation = Evalsha::new(&SCRIPTS.permit_release, 3, size);
    invocation
        .arg(keys::permits(key))
        .arg(keys::fences(key))
        .arg(keys::queue(key))
        .arg(holder)
        .arg(store);
    invocation
}

/// Tells this process what a permit release did, and answers the release: when a waiter of
/// this process is next (`to_this_store`), which no message wakes, or the push connection is
/// down (`push_healthy` false) and this process's waiters would not hear of other releases,
/// they look again.
pub(crate) fn tell_permit_release(
    hub: &ReleaseHub,
    key: &StoreKey,
    release: Release,
    to_this_store: bool,
    push_healthy: bool,
) -> Release {
    if to_this_store || (release == Release::Removed && !push_healthy) {
        hub.notify(key);
    }
    release
}

/// A reading of the live permits of `key` ([`parse_permits`] reads the answer).
pub(crate) fn list_call(key: &StoreKey) -> Evalsha<'static> {
    let mut invocation = Evalsha::new(&SCRIPTS.permit_list, 2, 2 * key.as_str().len());
    invocation.arg(keys::permits(key)).arg(keys::fences(key));
    invocation
}

/// The live permits of the first `limit` of `candidates` (keys found by a scan) that still
/// have any, read one key at a time with `permits_of`: a key whose permits all ended since
/// the scan is not listed.
pub(crate) async fn first_with_permits<'a, F, Fut>(
    candidates: impl IntoIterator<Item = &'a StoreKey>,
    limit: usize,
    permits_of: F,
) -> Result<Vec<PermitInfo>>
where
    F: Fn(&'a StoreKey) -> Fut,
    Fut: std::future::Future<Output = Result<Vec<PermitInfo>>>,
{
    let (mut listed, mut keys) = (Vec::new(), 0);
    for key in candidates {
        let permits = permits_of(key).await?;
        if !permits.is_empty() {
            listed.extend(permits);
            keys += 1;
            if keys == limit {
                break;
            }
        }
    }
    Ok(listed)
}

impl RedisStore {
    /// The live permits of `key`, oldest fence first, with the N of each claim.
    async fn permits_of(&self, key: &StoreKey) -> Result<Vec<PermitInfo>> {
        let what = || format!("permits of {key}");
        self.call(what, &list_call(key), |v| parse_permits(key, v), |_| true)
            .await
    }

    /// Gives back `holder`'s permit of `key`, a permit the replicas did not confirm, before the
    /// claim answers (as a lock's grant, see `RedisStore::give_back_unconfirmed`): a later
    /// claim of the same holder must not be answered as extended while this is in flight.
    async fn give_back_unconfirmed_permit(&self, key: &StoreKey, holder: &str) {
        let invocation = release_call(key, holder, &self.release_idle);
        send_unconfirmed_give_back(&self.link, self.options().call_deadline(), key, &invocation)
            .await;
    }
}

#[async_trait]
impl SemaphoreStore for RedisStore {
    async fn claim_permit(
        &self,
        key: &StoreKey,
        request: LeaseRequest<'_>,
        permits: u32,
    ) -> Result<Claim> {
        // As for a lock: a waiter of this process subscribes before it claims, and only then
        // does the claim carry the queue and the store's channel.
        let waiting = self.hub.has_waiters(key);
        let holder = request.holder.as_str();
        let mut invocation = claim_call(
            key,
            &request,
            permits,
            waiting.then_some(self.channel.as_str()),
        );
        self.confirm(&mut invocation);
        let what = || format!("permit claim of {key}");
        // A claim that ran and was retried comes back as an extension: a permit either way.
        let (claim, replicas) = self
            .call_confirmed(what, &invocation, parse_claim, |_| true)
            .await?;
        if let Claim::Granted { .. } | Claim::Extended { .. } = claim
            && let Some(e) = self.unconfirmed(&what(), replicas)
        {
            // A permit that a failover could lose is not handed out: it is given back. A
            // holder's own permit that was extended stays as it was.
            if let Claim::Granted { .. } = claim {
                self.give_back_unconfirmed_permit(key, holder).await;
            }
            return Err(e);
        }
        Ok(claim)
    }

    async fn renew_permit(&self, key: &StoreKey, holder: &Holder, ttl: Ttl) -> Result<Renewal> {
        let mut invocation = renew_call(key, holder, ttl);
        let what = || format!("permit renewal of {key}");
        self.confirm(&mut invocation);
        let (renew, replicas) = self
            .call_confirmed(what, &invocation, parse_renewal, |_| true)
            .await?;
        if renew == Renewal::Renewed
            && let Some(e) = self.unconfirmed(&what(), replicas)
        {
            return Err(e);
        }
        Ok(renew)
    }

    async fn release_permit(&self, key: &StoreKey, holder: &Holder) -> Result<Release> {
        let store = if self.hub.has_waiters(key) {
            &self.release_waiting
        } else {
            &self.release_idle
        };
        let mut invocation = release_call(key, holder.as_str(), store);
        let what = || format!("permit release of {key}");
        // A release retried after its connection dropped answers NoHolder if the first
        // attempt had removed the permit: that would report an expiry that did not happen,
        // so the fault is reported instead.
        let trust = |r: &(Release, bool)| r.0 != Release::NoHolder;
        self.confirm(&mut invocation);
        let confirmed = self
            .call_confirmed(what, &invocation, parse_release, trust)
            .await
            .and_then(|(released, replicas)| match released.0 {
                Release::Removed => match self.unconfirmed(&what(), replicas) {
                    Some(e) => Err(e),
                    None => Ok(released),
                },
                _ => Ok(released),
            });
        let (release, to_this_store) = match confirmed {
            Ok(released) => released,
            Err(e) => {
                // The release may have run and chosen a waiter of this process, which no
                // message would wake: have this process's waiters look again.
                self.hub.notify(key);
                return Err(e);
            }
        };
        Ok(tell_permit_release(
            &self.hub,
            key,
            release,
            to_this_store,
            self.push.is_healthy(),
        ))
    }

    async fn permits(&self, key: &StoreKey) -> Result<Vec<HolderInfo>> {
        Ok(self
            .permits_of(key)
            .await?
            .into_iter()
            .map(|p| p.grant)
            .collect())
    }

    /// Scans for the keys' `{Q}:permits` (as the lock listing scans for grants), then reads
    /// each key's live permits with the list script, in key order, until `limit` keys had
    /// some: one round trip per key read.
    async fn list_permits(&self, prefix: &str, limit: usize) -> Result<Vec<PermitInfo>> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let candidates = self
            .scan_matching(&permits_pattern(prefix), prefix, from_permits_key)
            .await?;
        first_with_permits(&candidates, limit, |key| self.permits_of(key)).await
    }

    fn permit_wakeups(&self) -> Wakeups {
        LeaseStore::wakeups(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    use baton_core::Fence;

    use std::sync::Arc;

    use baton_core::signals::ReleaseHub;
    use baton_testkit::redis::RedisServer;

    use baton_testkit::redis::calls as ran;

    /// The calls the permit scripts make on the paths the semaphore benchmark measures (an
    /// uncontended claim and release), and on a release that wakes another store, pinned so
    /// that a change that adds work there is a decision.
    #[tokio::test]
    async fn the_permit_scripts_make_only_the_calls_their_paths_need() {
        let server = Arc::new(
            tokio::task::spawn_blocking(RedisServer::start)
                .await
                .unwrap()
                .expect("a private redis-server"),
        );
        let a = RedisStore::connect(&server.url()).await.unwrap();
        let b = RedisStore::connect(&server.url()).await.unwrap();
        let key = StoreKey::from_stored("t:semaphore:calls".to_owned());
        let ttl = Ttl::new(Duration::from_secs(10)).unwrap();
        async fn claim(store: &RedisStore, key: &StoreKey, holder: &Holder) -> Claim {
            let ttl = Ttl::new(Duration::from_secs(10)).unwrap();
            store
                .claim_permit(key, LeaseRequest::new(holder, ttl), 1)
                .await
                .unwrap()
        }
        // The first permit of a key creates its keys and their expiry.
        let first = Holder::random();
        assert!(matches!(
            claim(&a, &key, &first).await,
            Claim::Granted { .. }
        ));
        assert_eq!(
            a.release_permit(&key, &first).await.unwrap(),
            Release::Removed
        );
        let held = Holder::random();
        assert!(matches!(
            claim(&a, &key, &held).await,
            Claim::Granted { .. }
        ));

        let holder = Holder::random();
        let (_, calls) = server.commands_during(a.release_permit(&key, &held)).await;
        assert_eq!(
            calls,
            ran(&[
                ("evalsha", 1),
                ("zscore", 1),
                ("time", 1),
                ("zrem", 1),
                ("hdel", 1),
                ("zrange", 1),
            ])
        );
        // The key was emptied and deleted: this claim creates it again (and sets its expiry).
        assert!(matches!(
            claim(&a, &key, &first).await,
            Claim::Granted { .. }
        ));
        assert_eq!(
            a.release_permit(&key, &first).await.unwrap(),
            Release::Removed
        );
        let other = Holder::random();
        assert!(matches!(
            claim(&a, &key, &other).await,
            Claim::Granted { .. }
        ));
        assert_eq!(
            a.release_permit(&key, &other).await.unwrap(),
            Release::Removed
        );
        let (granted, calls) = server
            .commands_during({
                let store = &a as &dyn SemaphoreStore;
                store.claim_permit(&key, LeaseRequest::new(&holder, ttl), 1)
            })
            .await;
        assert!(matches!(granted.unwrap(), Claim::Granted { .. }));
        assert_eq!(
            calls,
            ran(&[
                ("evalsha", 1),
                ("time", 1),
                ("zadd", 1),
                ("zcount", 1),
                ("set", 1),
                ("hset", 1),
                ("pttl", 1),
                ("pexpire", 2),
                ("zrangebyscore", 1),
            ])
        );
        // A second claim while the key's expiry is long enough: no PEXPIRE, no sweep.
        let (extended, calls) = server
            .commands_during({
                let store = &a as &dyn SemaphoreStore;
                store.claim_permit(&key, LeaseRequest::new(&holder, ttl), 1)
            })
            .await;
        assert!(matches!(extended.unwrap(), Claim::Extended { .. }));
        assert_eq!(
            calls,
            ran(&[
                ("evalsha", 1),
                ("time", 1),
                ("zadd", 2),
                ("zscore", 1),
                ("pttl", 1),
                ("hget", 1),
            ])
        );

        // A waiter of another store queues; the release reserves the permit for that store and
        // tells it alone.
        let hub: &ReleaseHub = &b.hub;
        let _waiting = hub.subscribe(&key);
        let waiter = Holder::random();
        let (held, calls) = server
            .commands_during({
                let store = &b as &dyn SemaphoreStore;
                store.claim_permit(&key, LeaseRequest::new(&waiter, ttl), 1)
            })
            .await;
        assert!(matches!(held.unwrap(), Claim::Held { .. }));
        assert_eq!(
            calls,
            ran(&[
                ("evalsha", 1),
                ("time", 2),
                ("zadd", 2),
                ("zcount", 1),
                // Its own reservation, if a release made one, and its permit again.
                ("zrem", 2),
                ("zrangebyscore", 2),
                ("pttl", 1),
                ("pexpire", 1),
            ])
        );
        let (release, calls) = server
            .commands_during(a.release_permit(&key, &holder))
            .await;
        assert_eq!(release.unwrap(), Release::Removed);
        assert_eq!(
            calls,
            ran(&[
                ("evalsha", 1),
                ("zscore", 1),
                ("time", 1),
                ("zrem", 2),
                ("hdel", 1),
                ("zrange", 1),
                ("publish", 1),
                // The permit reserved for the store told.
                ("zadd", 1),
            ])
        );
    }

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn replies() {
        assert_eq!(
            parse_release(&Value::Int(0)),
            Some((Release::Removed, false))
        );
        assert_eq!(
            parse_release(&Value::Int(1)),
            Some((Release::Removed, true))
        );
        assert_eq!(
            parse_release(&Value::Int(2)),
            Some((Release::NoHolder, false))
        );
        assert_eq!(parse_release(&Value::Int(3)), None);
        let key = StoreKey::from_stored("ns:semaphore:k".into());
        let permits = parse_permits(
            &key,
            &Value::Array(vec![
                bulk("b"),
                bulk("9"),
                Value::Int(100),
                bulk("0"),
                bulk("a"),
                bulk("7"),
                Value::Int(2500),
                bulk("3"),
            ]),
        )
        .unwrap();
        assert_eq!(permits.len(), 2);
        assert_eq!(permits[0].grant.holder.as_str(), "a");
        assert_eq!(permits[0].grant.fence, Fence::new(7));
        assert_eq!(permits[0].grant.remaining, Duration::from_millis(2500));
        assert_eq!(permits[0].permits, Some(3));
        assert_eq!(permits[1].grant.fence, Fence::new(9));
        assert_eq!(permits[1].permits, None, "not recorded");
        assert_eq!(
            from_permits_key("{ns:semaphore:a}:fences}:permits"),
            Some(StoreKey::from_stored("ns:semaphore:a}:fences".into()))
        );
        assert_eq!(from_permits_key("{ns:semaphore:a}:fences"), None);
        assert_eq!(parse_permits(&key, &Value::Array(vec![])), Some(vec![]));
        assert_eq!(parse_permits(&key, &Value::Array(vec![bulk("a")])), None);
        assert_eq!(parse_permits(&key, &Value::Int(1)), None);
    }
}
