//! Idempotency records on etcd: each atom of [`IdempotencyStore`] as reads and one
//! transaction, with expiry and the owner's lease kept by etcd leases.
//!
//! ## A record
//! The record of qualified key `Q` is two etcd keys:
//!
//! - `Q` holds the record, attached to an etcd lease for the record's TTL (the cluster
//!   deletes it when the TTL has run out):
//!
//!   ```text
//!   baton:idempotency:v1\n<status>\n<owner>\n<attempt>\n<previous>\n<fingerprint>\n<metadata>
//!   ```
//!
//!   (`previous` is the status the owning attempt took over, empty for a new record; the
//!   metadata is the raw bytes after the sixth newline — nothing before it holds a newline).
//! - `Q\0owner` holds the owner's token while its lease runs, attached to an etcd lease of
//!   the lease's length. Its absence is a lapsed lease; a finalize deletes it.
//!
//! ## Time is the cluster's
//! etcd has no clock a transaction can read; its leases are its clock, kept by the leader
//! and reported in whole seconds, rounded down. So each etcd lease is granted one second
//! longer than the TTL (or lease) rounded up to whole seconds, and a lease the cluster
//! reports with 0 seconds left counts as run out: that is never before the time asked for,
//! and at most about two seconds after it. Remaining times are reported as the cluster
//! reports them (whole seconds).
//!
//! A lease's time to live decides nothing on its own. A member answers it from its own
//! lessor, and a member back from a pause can still believe it leads and answer "unknown"
//! for a lease granted while it was away, or "run out" for one the new leader kept alive.
//! The cluster deletes a key when its lease runs out, so a key that a read finds while its
//! lease reads as run out is read again every 50 ms, for up to the call deadline, until it
//! is gone or its lease reads as live; an acquire that still finds it so answers
//! `Unavailable`, and the other atoms answer from the last read.
//!
//! ## The atoms
//! - `acquire`: read both keys (one transaction) and the remaining time of their leases;
//!   decide as the contract says (insert, take over, own retried acquire, or duplicate),
//!   where a record counts as ended, or its owner's lease as lapsed, only once its key is gone
//!   (see below);
//!   to write, grant the two leases and put both keys in one transaction that holds only if
//!   neither key changed since the read (their mod revisions). A lost race reads again.
//! - `renew`: if the record is the owner's and pending, put `Q\0owner` on a new lease in a
//!   transaction that holds only if `Q` did not change.
//! - `finalize`: if the record is the owner's and pending, re-put `Q` with the outcome on
//!   its own lease (`ignore_lease`, so its expiry stays) and delete `Q\0owner`, in one
//!   transaction that holds only if `Q` did not change.
//! - `get`: the read, with the remaining times.
//!
//! Leases left without keys (a record's old lease after a takeover, an owner's old lease
//! after a renewal) are revoked in the background; their TTL removes them otherwise. A
//! request that may have reached the cluster is never sent twice. An acquire whose
//! transaction fails or loses its answer revokes the two leases it was granted, so a record
//! it did write is deleted again: the caller, told `Unavailable`, leaves no record owned by
//! an attempt nobody runs. An acquire that finds its own token answers `Acquired` again.

use std::time::Duration;

use async_trait::async_trait;
use baton_core::idempotency::Status;
use baton_core::idempotency::store::{
    AcquireAnswer, AcquireRequest, AttemptEnd, FinalizeAnswer, IdempotencyStore, StoredRecord,
};
use baton_core::store::Renewal;
use baton_core::{Error, Holder, Result, StoreKey, Ttl};
use etcd_client::{Compare, CompareOp, KeyValue, PutOptions, Txn, TxnOp, TxnOpResponse};

use crate::EtcdStore;
use crate::error;
use crate::grants::{RACE_ATTEMPTS, lease_seconds};

/// How often an atom reads a record again while a key of it outlives its lease (see
/// [`Seen::expiring`]).
const EXPIRING_POLL: Duration = Duration::from_millis(50);

/// The first line of a record's value.
const TAG: &str = "baton:idempotency:v1";

/// The key that holds the owner's lease of the record `key`.
fn owner_key(key: &StoreKey) -> String {
    format!("{}\u{0}owner", key.as_str())
}

/// The seconds of the etcd lease for `ttl`: one more than its whole seconds rounded up, so
/// that a lease reported with 0 seconds left has run at least `ttl`.
fn seconds_for(ttl: Ttl) -> i64 {
    lease_seconds(ttl).saturating_add(1)
}

/// A record as stored in `Q`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Stored {
    status: Status,
    owner: Holder,
    attempt: u32,
    previous: Option<Status>,
    fingerprint: String,
    metadata: Vec<u8>,
}

impl Stored {
    fn encode(&self) -> Vec<u8> {
        let previous = self.previous.map_or("", Status::as_str);
        let mut value = format!(
            "{TAG}\n{}\n{}\n{}\n{previous}\n{}\n",
            self.status.as_str(),
            self.owner.as_str(),
            self.attempt,
            self.fingerprint
        )
        .into_bytes();
        value.extend_from_slice(&self.metadata);
        value
    }

    fn decode(value: &[u8]) -> Option<Stored> {
        let mut parts = value.splitn(7, |b| *b == b'\n');
        let mut text = || std::str::from_utf8(parts.next()?).ok();
        if text()? != TAG {
            return None;
        }
        let status = Status::parse(text()?)?;
        let owner = Holder::new(text()?).ok()?;
        let attempt = text()?.parse().ok().filter(|a| *a >= 1)?;
        let previous = match text()? {
            "" => None,
            previous => Some(Status::parse(previous)?),
        };
        let fingerprint = text()?.to_owned();
        let metadata = parts.next()?.to_vec();
        Some(Stored {
            status,
            owner,
            attempt,
            previous,
            fingerprint,
            metadata,
        })
    }

    /// The record as the contract reads it, with the remaining times.
    fn read(&self, expires_in: Duration, lease_remaining: Duration) -> StoredRecord {
        StoredRecord {
            status: self.status,
            owner: self.owner.clone(),
            attempt: self.attempt,
            fingerprint: self.fingerprint.clone(),
            metadata: self.metadata.clone(),
            expires_in,
            lease_remaining: if self.status == Status::Pending {
                lease_remaining
            } else {
                Duration::ZERO
            },
        }
    }
}

/// What one read of a record's two keys found.
struct Seen {
    /// `Q`'s record, mod revision and lease, if the key exists and its lease has time left.
    record: Option<(Stored, i64, i64)>,
    /// `Q`'s mod revision (0 when absent), whatever its lease says.
    record_revision: i64,
    /// `Q\0owner`'s mod revision (0 when absent) and lease.
    owner_revision: i64,
    owner_lease: Option<i64>,
    /// Time left until the record expires, as the cluster reports it.
    expires_in: Duration,
    /// Time left on the owner's lease, as the cluster reports it: zero when lapsed.
    lease_remaining: Duration,
}

impl Seen {
    fn record(&self) -> Option<StoredRecord> {
        let (stored, _, _) = self.record.as_ref()?;
        Some(stored.read(self.expires_in, self.lease_remaining))
    }

    /// Whether a key this read found is still there although its lease reads as run out:
    /// the record's, or the owner's of a pending record. The cluster deletes a key when its
    /// lease runs out, so such a key is either about to go or alive with its lease answered
    /// wrongly: a member answers a lease's time to live from its own lessor, which after a
    /// pause of that member can still believe it leads and know nothing of the leases
    /// granted meanwhile. Nothing is decided on such a read (see [`EtcdStore::see_settled`]).
    fn expiring(&self) -> bool {
        let record_out = self.record.is_none() && self.record_revision != 0;
        let owner_out = matches!(&self.record, Some((stored, _, _)) if stored.status == Status::Pending)
            && self.owner_revision != 0
            && self.lease_remaining == Duration::ZERO;
        record_out || owner_out
    }

    /// The compares that hold only while neither key changed since this read.
    fn unchanged(&self, key: &StoreKey) -> [Compare; 2] {
        [
            Compare::mod_revision(key.as_str(), CompareOp::Equal, self.record_revision),
            Compare::mod_revision(owner_key(key), CompareOp::Equal, self.owner_revision),
        ]
    }
}

/// The time a lease reported with `seconds` left has: `None` for one that has run out (or
/// that the cluster no longer knows, -1).
fn time_left(seconds: i64) -> Option<Duration> {
    u64::try_from(seconds)
        .ok()
        .filter(|s| *s > 0)
        .map(Duration::from_secs)
}

impl EtcdStore {
    /// Reads the record `key` and the remaining times of its leases.
    async fn see(&self, key: &StoreKey, what: &str) -> Result<Seen> {
        let owner = owner_key(key);
        let txn = Txn::new().and_then([
            TxnOp::get(key.as_str(), None),
            TxnOp::get(owner.as_str(), None),
        ]);
        let answer = self.txn(what, txn).await?;
        let mut kvs = answer.op_responses().into_iter().map(|r| match r {
            TxnOpResponse::Get(mut get) => get.take_kvs().into_iter().next(),
            _ => None,
        });
        let (record, owner) = (kvs.next().flatten(), kvs.next().flatten());
        let record_revision = record.as_ref().map_or(0, KeyValue::mod_revision);
        let owner_revision = owner.as_ref().map_or(0, KeyValue::mod_revision);
        let owner_lease = owner.as_ref().map(KeyValue::lease);
        let mut seen = Seen {
            record: None,
            record_revision,
            owner_revision,
            owner_lease,
            expires_in: Duration::ZERO,
            lease_remaining: Duration::ZERO,
        };
        let Some(record) = record else {
            return Ok(seen);
        };
        let stored = Stored::decode(record.value()).ok_or_else(|| {
            error::unexpected(
                what,
                self.cluster(),
                format_args!("the key {key} holds a value that is not a baton idempotency record"),
            )
        })?;
        let (expires, lease) = match owner_lease {
            Some(owner_lease) => {
                let (expires, lease) =
                    tokio::join!(self.lease_ttl(record.lease()), self.lease_ttl(owner_lease));
                (expires?.0, lease?.0)
            }
            None => (self.lease_ttl(record.lease()).await?.0, 0),
        };
        if let Some(expires_in) = time_left(expires) {
            seen.expires_in = expires_in;
            seen.lease_remaining = time_left(lease).unwrap_or(Duration::ZERO);
            seen.record = Some((stored, record_revision, record.lease()));
        }
        Ok(seen)
    }

    /// [`see`](Self::see), read again every [`EXPIRING_POLL`] while the read is
    /// [expiring](Seen::expiring), for at most the call deadline (`connect_timeout +
    /// response_timeout`): so a record or an owner's lease counts as ended only once the
    /// cluster deleted its key, never on a lease's time to live alone. The last read, and
    /// whether it is still expiring.
    async fn see_settled(&self, key: &StoreKey, what: &str) -> Result<(Seen, bool)> {
        let deadline = tokio::time::Instant::now() + self.options.call_deadline();
        loop {
            let seen = self.see(key, what).await?;
            if !seen.expiring() {
                return Ok((seen, false));
            }
            if tokio::time::Instant::now() + EXPIRING_POLL > deadline {
                return Ok((seen, true));
            }
            tokio::time::sleep(EXPIRING_POLL).await;
        }
    }

    /// Two new leases, of `first` and `second` seconds; neither when one fails.
    async fn grant_two(&self, first: i64, second: i64) -> Result<(i64, i64)> {
        match tokio::join!(self.grant_lease(first), self.grant_lease(second)) {
            (Ok(a), Ok(b)) => Ok((a, b)),
            (Ok(lease), Err(e)) | (Err(e), Ok(lease)) => {
                self.revoke_in_background(lease);
                Err(e)
            }
            (Err(e), Err(_)) => Err(e),
        }
    }

    /// The `Unavailable` error of an atom on `key` that lost every race.
    fn raced(&self, what: &str, key: &StoreKey) -> Error {
        Error::unavailable(format!(
            "{}: {what} of {key} failed: the record changed under {RACE_ATTEMPTS} attempts in a row",
            self.cluster()
        ))
    }
}

#[async_trait]
impl IdempotencyStore for EtcdStore {
    async fn acquire(&self, key: &StoreKey, request: AcquireRequest<'_>) -> Result<AcquireAnswer> {
        const WHAT: &str = "idempotency acquire";
        for _ in 0..RACE_ATTEMPTS {
            let (seen, expiring) = self.see_settled(key, WHAT).await?;
            if expiring {
                // Neither a new attempt nor a takeover is started on a lease's word alone.
                return Err(Error::unavailable(format!(
                    "{}: {WHAT} of {key} failed: a key of the record outlived its lease and the cluster has not deleted it within the call deadline",
                    self.cluster()
                )));
            }
            let (attempt, previous, old_record_lease) = match &seen.record {
                None => (1, None, None),
                Some((stored, _, _)) if stored.owner == *request.attempt => {
                    // This attempt's own acquire ran before (its answer was lost).
                    let record = seen.record().expect("a live record");
                    return Ok(AcquireAnswer::Acquired {
                        record,
                        previous: stored.previous,
                    });
                }
                Some((stored, _, lease)) => {
                    // Lapsed: the owner's key is gone, which the cluster does when its lease
                    // runs out (a settled read never shows it present with no time left).
                    let lapsed = stored.status == Status::Pending && seen.owner_revision == 0;
                    let retry = stored.status == Status::Failed && request.retry_failed;
                    if stored.fingerprint != request.fingerprint || !(lapsed || retry) {
                        let record = seen.record().expect("a live record");
                        return Ok(AcquireAnswer::Duplicate(record));
                    }
                    (
                        stored.attempt.saturating_add(1),
                        Some(stored.status),
                        Some(*lease),
                    )
                }
            };
            let stored = Stored {
                status: Status::Pending,
                owner: request.attempt.clone(),
                attempt,
                previous,
                fingerprint: request.fingerprint.to_owned(),
                metadata: Vec::new(),
            };
            let (record_lease, owner_lease) = self
                .grant_two(seconds_for(request.ttl), seconds_for(request.lease))
                .await?;
            let txn = Txn::new().when(seen.unchanged(key)).and_then([
                TxnOp::put(
                    key.as_str(),
                    stored.encode(),
                    Some(PutOptions::new().with_lease(record_lease)),
                ),
                TxnOp::put(
                    owner_key(key),
                    request.attempt.as_str(),
                    Some(PutOptions::new().with_lease(owner_lease)),
                ),
            ]);
            let written = self.txn("idempotency acquire (txn)", txn).await;
            if !matches!(&written, Ok(answer) if answer.succeeded()) {
                self.revoke_in_background(record_lease);
                self.revoke_in_background(owner_lease);
                written?;
                continue;
            }
            // The leases the record and its owner key had before are left without keys.
            for lease in old_record_lease.into_iter().chain(seen.owner_lease) {
                self.revoke_in_background(lease);
            }
            return Ok(AcquireAnswer::Acquired {
                record: stored.read(request.ttl.get(), request.lease.get()),
                previous,
            });
        }
        Err(self.raced("idempotency acquire", key))
    }

    async fn renew(&self, key: &StoreKey, owner: &Holder, lease: Ttl) -> Result<Renewal> {
        const WHAT: &str = "idempotency renewal";
        for _ in 0..RACE_ATTEMPTS {
            let (seen, _) = self.see_settled(key, WHAT).await?;
            match &seen.record {
                Some((stored, _, _))
                    if stored.owner == *owner && stored.status == Status::Pending => {}
                _ => return Ok(Renewal::NotHeld),
            }
            let new_lease = self.grant_lease(seconds_for(lease)).await?;
            let txn = Txn::new()
                .when([Compare::mod_revision(
                    key.as_str(),
                    CompareOp::Equal,
                    seen.record_revision,
                )])
                .and_then([TxnOp::put(
                    owner_key(key),
                    owner.as_str(),
                    Some(PutOptions::new().with_lease(new_lease)),
                )]);
            let written = self.txn("idempotency renewal (txn)", txn).await;
            if !matches!(&written, Ok(answer) if answer.succeeded()) {
                self.revoke_in_background(new_lease);
                written?;
                continue;
            }
            if let Some(old) = seen.owner_lease {
                self.revoke_in_background(old);
            }
            return Ok(Renewal::Renewed);
        }
        Err(self.raced(WHAT, key))
    }

    async fn finalize(&self, key: &StoreKey, end: AttemptEnd<'_>) -> Result<FinalizeAnswer> {
        const WHAT: &str = "idempotency finalize";
        for _ in 0..RACE_ATTEMPTS {
            let (seen, _) = self.see_settled(key, WHAT).await?;
            let stored = match &seen.record {
                Some((stored, _, _)) if stored.owner == *end.owner => stored,
                _ => return Ok(FinalizeAnswer::NotOwner),
            };
            if stored.status != Status::Pending {
                // A retried finalize: the record as the first one left it.
                return Ok(FinalizeAnswer::Finalized(
                    seen.record().expect("a live record"),
                ));
            }
            let finalized = Stored {
                status: end.outcome.status(),
                metadata: end.metadata.to_vec(),
                ..stored.clone()
            };
            let txn = Txn::new()
                .when([Compare::mod_revision(
                    key.as_str(),
                    CompareOp::Equal,
                    seen.record_revision,
                )])
                .and_then([
                    TxnOp::put(
                        key.as_str(),
                        finalized.encode(),
                        Some(PutOptions::new().with_ignore_lease()),
                    ),
                    TxnOp::delete(owner_key(key), None),
                ]);
            if !self
                .txn("idempotency finalize (txn)", txn)
                .await?
                .succeeded()
            {
                continue;
            }
            if let Some(old) = seen.owner_lease {
                self.revoke_in_background(old);
            }
            return Ok(FinalizeAnswer::Finalized(
                finalized.read(seen.expires_in, Duration::ZERO),
            ));
        }
        Err(self.raced(WHAT, key))
    }

    async fn get(&self, key: &StoreKey) -> Result<Option<StoredRecord>> {
        Ok(self.see_settled(key, "idempotency read").await?.0.record())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_with_any_metadata() {
        let stored = Stored {
            status: Status::Failed,
            owner: Holder::random(),
            attempt: 3,
            previous: Some(Status::Pending),
            fingerprint: "fp:1 2".to_owned(),
            metadata: (0..=255u8).chain([b'\n', b'\n']).collect(),
        };
        assert_eq!(Stored::decode(&stored.encode()), Some(stored.clone()));
        let fresh = Stored {
            previous: None,
            fingerprint: String::new(),
            metadata: Vec::new(),
            ..stored
        };
        assert_eq!(Stored::decode(&fresh.encode()), Some(fresh));
    }

    #[test]
    fn values_baton_did_not_write_are_refused() {
        for value in [
            &b"baton:v1\nholder\n5\nreason"[..],
            b"baton:idempotency:v1\nsideways\nh\n1\n\n\n",
            b"baton:idempotency:v1\npending\nh\n0\n\n\n",
            b"baton:idempotency:v1\npending\nh\n1\n\n",
        ] {
            assert_eq!(Stored::decode(value), None, "{value:?}");
        }
    }

    /// A read that finds a key whose lease reads as run out decides nothing: the soak saw a
    /// member just back from a pause answer a live record's lease as unknown (-1), and an
    /// acquire then wrote attempt 1 over a completed record, so its effect ran twice.
    #[test]
    fn a_key_that_outlives_its_lease_is_expiring_not_ended() {
        let stored = |status| Stored {
            status,
            owner: Holder::random(),
            attempt: 1,
            previous: None,
            fingerprint: String::new(),
            metadata: Vec::new(),
        };
        let seen = |record: Option<Stored>, record_revision, owner_revision, lease_left| Seen {
            record: record.map(|r| (r, record_revision, 1)),
            record_revision,
            owner_revision,
            owner_lease: (owner_revision != 0).then_some(2),
            expires_in: Duration::from_secs(5),
            lease_remaining: Duration::from_secs(lease_left),
        };
        // The record's key is there, its lease read as run out or unknown.
        assert!(seen(None, 7, 0, 0).expiring());
        // A pending record whose owner key is there, its lease read as run out.
        assert!(seen(Some(stored(Status::Pending)), 7, 8, 0).expiring());
        // Settled reads: absent, a lapsed owner (its key is gone), a live owner, an outcome.
        assert!(!seen(None, 0, 0, 0).expiring());
        assert!(!seen(Some(stored(Status::Pending)), 7, 0, 0).expiring());
        assert!(!seen(Some(stored(Status::Pending)), 7, 8, 3).expiring());
        assert!(!seen(Some(stored(Status::Completed)), 7, 0, 0).expiring());
    }

    #[test]
    fn leases_are_a_second_longer_and_run_out_at_zero() {
        let ttl = |ms| Ttl::new(Duration::from_millis(ms)).unwrap();
        assert_eq!(seconds_for(ttl(300)), 2);
        assert_eq!(seconds_for(ttl(1000)), 2);
        assert_eq!(seconds_for(ttl(1500)), 3);
        assert_eq!(time_left(-1), None);
        assert_eq!(time_left(0), None);
        assert_eq!(time_left(7), Some(Duration::from_secs(7)));
    }
}
