//! The idempotency atoms as Lua scripts: one script per call, on one hash per record.
//!
//! A record of qualified key `Q` is the hash `{Q}` (the same wrapping as a lock grant, see
//! `docs/redis.md`; the `idempotency` segment of `Q` keeps it apart from grants), with a
//! `PX` expiry of the record's TTL:
//!
//! | field | holds |
//! |---|---|
//! | `status` | `pending`, `completed` or `failed` |
//! | `owner` | the owning attempt's random token |
//! | `attempt` | the owning attempt's number, from 1 |
//! | `fingerprint` | the request fingerprint (may be empty) |
//! | `metadata` | what finalize stored (bytes) |
//! | `lease_until` | end of the owner's lease: server `TIME`, milliseconds |
//! | `previous` | the status the owning attempt took over (empty for a new record) |
//!
//! Expiry and leases are both on the server's clock. Each script is sent with `EVALSHA` and
//! loaded again on `NOSCRIPT`, like the lock scripts. Every call is safe to retry after a
//! dropped connection: a retried acquire finds its own token and answers acquired again, a
//! retried finalize finds the record finalized by its owner and answers the same.

use std::sync::LazyLock;
use std::time::Duration;

use async_trait::async_trait;
use baton_core::idempotency::Status;
use baton_core::idempotency::store::{
    AcquireAnswer, AcquireRequest, AttemptEnd, FinalizeAnswer, IdempotencyStore, StoredRecord,
};
use baton_core::store::Renewal;
use baton_core::{Holder, Result, StoreKey, Ttl};
use redis::{Script, Value};

use crate::keys;
use crate::locks::RedisStore;
use crate::scripts::Evalsha;

/// Inserts a pending record, takes over a lapsed or failed one, or reports the record.
pub const ACQUIRE: &str = include_str!("../scripts/idempotency_acquire.lua");
/// Finalizes the owner's pending record.
pub const FINALIZE: &str = include_str!("../scripts/idempotency_finalize.lua");
/// Restarts the owner's lease.
pub const RENEW: &str = include_str!("../scripts/idempotency_renew.lua");
/// Reads the live record.
pub const GET: &str = include_str!("../scripts/idempotency_get.lua");

struct Scripts {
    acquire: Script,
    finalize: Script,
    renew: Script,
    get: Script,
}

static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| Scripts {
    acquire: Script::new(ACQUIRE),
    finalize: Script::new(FINALIZE),
    renew: Script::new(RENEW),
    get: Script::new(GET),
});

// The calls of the scripts, built once for the single server's store and a cluster store
// alike (each declares the record, its only key), with their parsers below.

/// An acquire of the record `key`.
pub(crate) fn acquire_call(key: &StoreKey, request: &AcquireRequest<'_>) -> Evalsha<'static> {
    let mut invocation = Evalsha::new(&SCRIPTS.acquire, 1, 128 + request.fingerprint.len());
    invocation
        .arg(keys::grant(key))
        .arg(request.attempt.as_str())
        .arg(request.fingerprint)
        .arg(request.ttl.as_millis())
        .arg(request.lease.as_millis())
        .arg(if request.retry_failed { "1" } else { "0" });
    invocation
}

/// A renewal of `owner`'s lease on the record `key`.
pub(crate) fn renew_call(key: &StoreKey, owner: &Holder, lease: Ttl) -> Evalsha<'static> {
    let mut invocation = Evalsha::new(&SCRIPTS.renew, 1, 128);
    invocation
        .arg(keys::grant(key))
        .arg(owner.as_str())
        .arg(lease.as_millis());
    invocation
}

/// The renewal script's answer.
pub(crate) fn parse_renewal(value: &Value) -> Option<Renewal> {
    match int(value)? {
        1 => Some(Renewal::Renewed),
        0 => Some(Renewal::NotHeld),
        _ => None,
    }
}

/// A finalize of the record `key` by `end`'s owner.
pub(crate) fn finalize_call(key: &StoreKey, end: &AttemptEnd<'_>) -> Evalsha<'static> {
    let mut invocation = Evalsha::new(&SCRIPTS.finalize, 1, 128 + end.metadata.len());
    invocation
        .arg(keys::grant(key))
        .arg(end.owner.as_str())
        .arg(end.outcome.status().as_str())
        .arg(end.metadata);
    invocation
}

/// A reading of the live record `key`.
pub(crate) fn get_call(key: &StoreKey) -> Evalsha<'static> {
    let mut invocation = Evalsha::new(&SCRIPTS.get, 1, 64);
    invocation.arg(keys::grant(key));
    invocation
}

/// The scripts of the log, for loading them on a cluster's masters.
pub(crate) fn scripts() -> [&'static Script; 4] {
    [
        &SCRIPTS.acquire,
        &SCRIPTS.finalize,
        &SCRIPTS.renew,
        &SCRIPTS.get,
    ]
}

/// The text of one of the log's scripts, by its hash.
pub(crate) fn text_of(script: &Script) -> Option<&'static str> {
    scripts()
        .into_iter()
        .zip([ACQUIRE, FINALIZE, RENEW, GET])
        .find(|(s, _)| s.get_hash() == script.get_hash())
        .map(|(_, text)| text)
}

#[async_trait]
impl IdempotencyStore for RedisStore {
    async fn acquire(&self, key: &StoreKey, request: AcquireRequest<'_>) -> Result<AcquireAnswer> {
        let what = || format!("idempotency acquire of {key}");
        let invocation = acquire_call(key, &request);
        self.call(what, &invocation, parse_acquire, |_| true).await
    }

    async fn renew(&self, key: &StoreKey, owner: &Holder, lease: Ttl) -> Result<Renewal> {
        let what = || format!("idempotency renewal of {key}");
        let invocation = renew_call(key, owner, lease);
        self.call(what, &invocation, parse_renewal, |_| true).await
    }

    async fn finalize(&self, key: &StoreKey, end: AttemptEnd<'_>) -> Result<FinalizeAnswer> {
        let what = || format!("idempotency finalize of {key}");
        let invocation = finalize_call(key, &end);
        let parse = |v: &Value| parse_finalize(v, end.owner, end.metadata);
        self.call(what, &invocation, parse, |_| true).await
    }

    async fn get(&self, key: &StoreKey) -> Result<Option<StoredRecord>> {
        let what = || format!("idempotency read of {key}");
        self.call(what, &get_call(key), parse_get, |_| true).await
    }
}

/// `{kind, previous, status, owner, attempt, fingerprint, metadata, pttl, lease ms}`.
pub(crate) fn parse_acquire(value: &Value) -> Option<AcquireAnswer> {
    let Value::Array(items) = value else {
        return None;
    };
    if items.len() != 9 {
        return None;
    }
    let record = StoredRecord {
        status: Status::parse(&text(&items[2])?)?,
        owner: Holder::from_stored(text(&items[3])?),
        attempt: attempt(&items[4])?,
        fingerprint: text(&items[5])?,
        metadata: bytes(&items[6])?,
        expires_in: millis(&items[7])?,
        lease_remaining: millis(&items[8])?,
    };
    match int(&items[0])? {
        0 => {
            let previous = text(&items[1])?;
            let previous = if previous.is_empty() {
                None
            } else {
                Some(Status::parse(&previous)?)
            };
            Some(AcquireAnswer::Acquired { record, previous })
        }
        2 => Some(AcquireAnswer::Duplicate(record)),
        _ => None,
    }
}

/// `{1}` or `{0, changed, status, attempt, fingerprint, pttl, metadata}`.
pub(crate) fn parse_finalize(value: &Value, owner: &Holder, sent: &[u8]) -> Option<FinalizeAnswer> {
    let Value::Array(items) = value else {
        return None;
    };
    match (int(items.first()?)?, items.len()) {
        (1, 1) => Some(FinalizeAnswer::NotOwner),
        (0, 7) => {
            let changed = int(&items[1])? == 1;
            Some(FinalizeAnswer::Finalized(StoredRecord {
                status: Status::parse(&text(&items[2])?)?,
                owner: owner.clone(),
                attempt: attempt(&items[3])?,
                fingerprint: text(&items[4])?,
                expires_in: millis(&items[5])?,
                metadata: if changed {
                    sent.to_vec()
                } else {
                    bytes(&items[6])?
                },
                lease_remaining: Duration::ZERO,
            }))
        }
        _ => None,
    }
}

/// nil, or `{status, owner, attempt, fingerprint, metadata, pttl, lease ms}`.
pub(crate) fn parse_get(value: &Value) -> Option<Option<StoredRecord>> {
    match value {
        Value::Nil => Some(None),
        Value::Array(items) if items.len() == 7 => Some(Some(StoredRecord {
            status: Status::parse(&text(&items[0])?)?,
            owner: Holder::from_stored(text(&items[1])?),
            attempt: attempt(&items[2])?,
            fingerprint: text(&items[3])?,
            metadata: bytes(&items[4])?,
            expires_in: millis(&items[5])?,
            lease_remaining: millis(&items[6])?,
        })),
        _ => None,
    }
}

fn int(value: &Value) -> Option<i64> {
    match value {
        Value::Int(n) => Some(*n),
        Value::BulkString(b) => std::str::from_utf8(b).ok()?.parse().ok(),
        _ => None,
    }
}

fn bytes(value: &Value) -> Option<Vec<u8>> {
    match value {
        Value::BulkString(b) => Some(b.clone()),
        Value::SimpleString(s) => Some(s.as_bytes().to_vec()),
        Value::Nil => Some(Vec::new()),
        _ => None,
    }
}

fn text(value: &Value) -> Option<String> {
    String::from_utf8(bytes(value)?).ok()
}

fn attempt(value: &Value) -> Option<u32> {
    u32::try_from(int(value)?).ok().filter(|a| *a >= 1)
}

/// A non-negative number of milliseconds (a `PTTL` of a live record, or a lease).
fn millis(value: &Value) -> Option<Duration> {
    Some(Duration::from_millis(u64::try_from(int(value)?).ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn scripts_take_keys_and_values_only_as_arguments() {
        for text in [ACQUIRE, FINALIZE, RENEW, GET] {
            assert!(text.contains("KEYS[1]"));
            assert!(!text.contains("{{"));
        }
    }

    #[test]
    fn replies() {
        let acquired = Value::Array(vec![
            Value::Int(0),
            bulk("failed"),
            bulk("pending"),
            bulk("tok"),
            Value::Int(3),
            bulk("fp"),
            bulk(""),
            Value::Int(1000),
            Value::Int(500),
        ]);
        let Some(AcquireAnswer::Acquired { record, previous }) = parse_acquire(&acquired) else {
            panic!("parsed");
        };
        assert_eq!(previous, Some(Status::Failed));
        assert_eq!((record.attempt, record.owner.as_str()), (3, "tok"));
        assert_eq!(record.lease_remaining, Duration::from_millis(500));
        let mut bad = acquired.clone();
        if let Value::Array(items) = &mut bad {
            items[7] = Value::Int(-2);
        }
        assert!(parse_acquire(&bad).is_none(), "a record without expiry");
        assert_eq!(
            parse_finalize(&Value::Array(vec![Value::Int(1)]), &Holder::random(), b""),
            Some(FinalizeAnswer::NotOwner)
        );
        assert_eq!(parse_get(&Value::Nil), Some(None));
        assert!(parse_get(&Value::Int(3)).is_none());
    }
}
