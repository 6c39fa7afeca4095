//! Wake-ups on etcd: each process that waits for a lock or a semaphore's permit queues
//! once, and watches only the process queued just before it, as etcd's own
//! `concurrency.Mutex` waits on its predecessor: a release wakes one process, not every
//! process that waits.
//!
//! ## Locks and leases: a queue of processes
//! When a claim answers `Held`, the store makes sure its process is queued for the key `k`:
//! it puts a queue entry `k\0q\0<store id>` on a short lease of its own ([`QUEUE_LEASE`],
//! kept alive while the process waits), whose create revision is its place. Then:
//! - the process whose entry has no older one (the **head**) watches `k` itself for deletes,
//!   from the revision just after the one its claim read, and wakes its waiters when `k` is
//!   deleted (a release, or the cluster expiring the holder's lease);
//! - every other process watches only the entry just older than its own (its
//!   **predecessor**). When that entry is deleted (its process was granted, gave up, or died
//!   and its lease expired), it looks for its predecessor again, and when it is the head it
//!   wakes its waiters once, to claim, and watches `k`.
//!
//! A process granted the key leaves the queue (deletes its entry, so the next process is the
//! head), and if some of its waiters still wait it queues again at the end: processes take
//! turns. The waiters of one process take turns among themselves through the store's
//! [`ReleaseHub`].
//!
//! ## Semaphores: the same queue, which decides
//! A process waiting for a permit of `k` queues the same way, with entries
//! `k\u{1}q\0<store id>` (outside the range of the permits' slots, `k\0`..). The head
//! watches the permits (the prefix `k\0`) for deletes; when it becomes the head it reads
//! the permits in the same request as its predecessor and wakes its waiters at once if one
//! is free for its claim's N (a permit may have been free since, and only the head may take
//! it). Every other process watches its predecessor only. Here the queue decides: while
//! anybody is queued only the head's claim may take a free permit, enforced in the claim's
//! transaction ([`permits`](crate::permits) says how), and the head leaves the queue in the
//! transaction that grants it.
//!
//! ## Behavior
//! - A watch (and a queue entry) lives while some waiter of this process waits for its key
//!   (checked after each event and every [`IDLE_CHECK`]), and stops with the store; a stopped
//!   store's entry is gone when its lease ends.
//! - For locks and leases the queue never decides who is granted: a claim still decides. A
//!   process that is not the head still claims when its waiters' timers fire (at the
//!   holder's remaining TTL), and a newcomer's first claim may take a free key before the
//!   head's. For permits the queue decides (above); the timers of processes that are not the
//!   head only ever find `Held`.
//! - A process that dies while queued holds up the ones behind it until its entry's lease
//!   ends: at most [`QUEUE_LEASE`] seconds, plus up to half a second for the cluster's leader
//!   to sweep the expired lease. A shorter lease would free them sooner but would also drop
//!   live processes to the back of the queue whenever their keep-alives (every
//!   [`IDLE_CHECK`]) are late, e.g. across a leader election of the cluster.
//! - A watch that fails (its member died, the start revision was compacted, the cluster
//!   cancelled it), or a queue entry that cannot be made or kept, is reported as
//!   `baton.store.push_lost` and wakes the key's waiters, which claim again: a `Held` answer
//!   queues the process again, at the end, a fault is the lock policy's to ride out. No
//!   delete is missed in between, because the new watch starts after the new claim's read.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use baton_core::signals::ReleaseHub;
use baton_core::telemetry::{self, events};
use baton_core::{CancellationToken, StoreKey};
use etcd_client::{
    Client, GetOptions, PutOptions, SortOrder, SortTarget, Txn, TxnOp, TxnOpResponse,
    WatchFilterType, WatchOptions,
};
use tokio::sync::Notify;

/// How often a watch with no events checks whether anybody still waits for its key, and
/// keeps its queue entry's lease alive.
pub const IDLE_CHECK: Duration = Duration::from_secs(1);

/// The TTL of a queue entry's lease, in seconds: how long the processes behind a process
/// that died while queued wait for its entry to go.
pub const QUEUE_LEASE: i64 = 5;

/// The value of a queue entry.
const QUEUE_VALUE: &str = "baton:queue:v1";

/// What a process waits for, through its key's queue of processes.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Range {
    /// The waited key itself (a lock's or lease's grant).
    Key,
    /// A permit of the waited key (a semaphore's), of a claim with `permits` (its N).
    Permits { permits: u32 },
}

impl Range {
    /// The prefix of the queue entries of `key` for this range.
    fn queue_prefix(self, key: &StoreKey) -> String {
        match self {
            Range::Key => queue_prefix(key),
            Range::Permits { .. } => permit_queue_prefix(key),
        }
    }
}

/// The watch of one key.
#[derive(Debug)]
struct Watch {
    id: u64,
    /// Told when this process was granted the key: leave the queue (and queue again if some
    /// waiter still waits).
    granted: Arc<Notify>,
}

/// The watches of one store.
#[derive(Debug, Default)]
struct Active {
    keys: HashMap<StoreKey, Watch>,
    last: u64,
}

impl Active {
    /// Forgets watch `id` of `key`, unless a newer watch took its place.
    fn remove(&mut self, key: &StoreKey, id: u64) {
        if self.keys.get(key).is_some_and(|w| w.id == id) {
            self.keys.remove(key);
        }
    }
}

/// The prefix of `key`'s queue entries.
pub(crate) fn queue_prefix(key: &StoreKey) -> String {
    format!("{}\u{0}q\u{0}", key.as_str())
}

/// The prefix of the queue entries of the processes that wait for a permit of `key`: `key`,
/// the byte 1, `q` and NUL. No key holds a control character, so these entries are outside
/// the range of `key`'s permits (`key` and NUL up to `key` and the byte 1, exclusive) and of
/// every other key's permits and queue.
pub(crate) fn permit_queue_prefix(key: &StoreKey) -> String {
    format!("{}\u{1}q\u{0}", key.as_str())
}

/// The end of the range of the queue entries of `key`'s permits.
pub(crate) fn permit_queue_end(key: &StoreKey) -> String {
    format!("{}\u{1}q\u{1}", key.as_str())
}

pub(crate) struct Watches {
    client: Client,
    hub: Arc<ReleaseHub>,
    /// This store's queue entries' name (random per store).
    id: String,
    /// The keys watched now.
    active: Mutex<Active>,
    stopped: CancellationToken,
}

impl std::fmt::Debug for Watches {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watches")
            .field("keys", &self.active().keys.len())
            .finish_non_exhaustive()
    }
}

/// This process's entry in a queue: its lease, and its create revision (its place).
#[derive(Debug, Clone, Copy)]
struct Entry {
    lease: i64,
    place: i64,
}

/// What a queued process reads of its queue: see [`Watches::predecessor`].
struct Turn {
    before: Option<String>,
    free: bool,
    revision: i64,
}

/// Why a watch of the queue ended.
enum Ended {
    /// Nobody in this process waits any more: leave.
    Leave,
    /// A request, the watch or the entry's lease failed: leave, and the waiters claim again.
    Failed(&'static str),
    /// This process was granted the key: queue again if some waiter still waits.
    Granted,
}

impl Watches {
    pub(crate) fn new(client: Client, hub: Arc<ReleaseHub>) -> Arc<Watches> {
        Arc::new(Watches {
            client,
            hub,
            id: format!("{:032x}", rand::random::<u128>()),
            active: Mutex::new(Active::default()),
            stopped: CancellationToken::new(),
        })
    }

    fn active(&self) -> MutexGuard<'_, Active> {
        self.active.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Makes sure this process is queued for `key` and woken when its turn may have come,
    /// from `revision` on (see the module docs). Must be called within a Tokio runtime.
    pub(crate) fn ensure(self: &Arc<Self>, key: &StoreKey, revision: i64) {
        self.ensure_range(key, Range::Key, revision);
    }

    /// This process's queue entry for a permit of `key` (whether it is queued or not).
    pub(crate) fn permit_entry(&self, key: &StoreKey) -> String {
        format!("{}{}", permit_queue_prefix(key), self.id)
    }

    /// Makes sure this process is queued for `range` of `key` and woken when its turn may
    /// have come, from `revision` on (a lock's key; a permit's head reads the permits
    /// afresh).
    pub(crate) fn ensure_range(self: &Arc<Self>, key: &StoreKey, range: Range, revision: i64) {
        // A waiter subscribes to the hub before its claim, so a `Held` answer that nobody in
        // this process waits on (a `try_acquire` without a wait) queues nothing.
        if self.stopped.is_cancelled() || !self.hub.has_waiters(key) {
            return;
        }
        let (id, granted) = {
            let mut active = self.active();
            if active.keys.contains_key(key) {
                return;
            }
            active.last += 1;
            let id = active.last;
            let granted = Arc::new(Notify::new());
            active.keys.insert(
                key.clone(),
                Watch {
                    id,
                    granted: Arc::clone(&granted),
                },
            );
            (id, granted)
        };
        let watches = Arc::clone(self);
        let key = key.clone();
        tokio::spawn(async move {
            tokio::select! {
                failed = watches.queue(&key, range, id, revision, &granted) => {
                    if let Some(why) = failed {
                        telemetry::emit(
                            &events::STORE_PUSH_LOST,
                            Some(key.as_str()),
                            format_args!(
                                "etcd: this process left the queue for {key} ({why}); its waiters claim again, queue again at the end, and wake at the holder's TTL meanwhile"
                            ),
                        );
                    }
                }
                () = watches.stopped.cancelled() => {}
            }
            watches.active().remove(&key, id);
            // Waiters re-check: a watch that ended for any reason may have missed a delete.
            watches.hub.notify(&key);
        });
    }

    /// This process was granted `key`: it leaves the key's queue, so the process behind it is
    /// the head (and queues again at the end while waiters of its own still wait).
    pub(crate) fn granted(&self, key: &StoreKey) {
        if let Some(watch) = self.active().keys.get(key) {
            watch.granted.notify_one();
        }
    }

    /// Stops every watch.
    pub(crate) fn stop(&self) {
        self.stopped.cancel();
    }

    /// Whether some waiter still waits for `key`; if not, forgets watch `id` while holding
    /// the map's lock, so that a claim that finds this watch running never relies on one
    /// that is leaving.
    fn still_waited(&self, key: &StoreKey, id: u64) -> bool {
        let mut active = self.active();
        if self.hub.has_waiters(key) {
            return true;
        }
        active.remove(key, id);
        false
    }

    /// Queues this process for `range` of `key` until nobody in it waits, queueing again
    /// after each grant. Why it failed, if it did while waiters still wait.
    async fn queue(
        &self,
        key: &StoreKey,
        range: Range,
        id: u64,
        revision: i64,
        granted: &Notify,
    ) -> Option<&'static str> {
        let mut from = revision;
        loop {
            let Some(entry) = self.enqueue(key, range).await else {
                return self
                    .still_waited(key, id)
                    .then_some("its queue entry could not be made");
            };
            let ended = self
                .wait_in_queue(key, range, id, from, entry, granted)
                .await;
            // Leaving deletes the entry: the process behind is woken by its delete.
            let mut leases = self.client.lease_client();
            let _ = tokio::time::timeout(IDLE_CHECK, leases.revoke(entry.lease)).await;
            match ended {
                Ended::Granted if self.still_waited(key, id) => {
                    // Behind everyone queued now; the key is this process's, so its next
                    // delete is after now.
                    from = 0;
                }
                Ended::Failed(why) if self.still_waited(key, id) => return Some(why),
                _ => return None,
            }
        }
    }

    /// Puts this process's queue entry for `key` on a lease of its own: the lease and the
    /// entry's create revision, or `None` when the cluster did not answer.
    async fn enqueue(&self, key: &StoreKey, range: Range) -> Option<Entry> {
        let mut leases = self.client.lease_client();
        let lease = tokio::time::timeout(IDLE_CHECK, leases.grant(QUEUE_LEASE, None))
            .await
            .ok()?
            .ok()?
            .id();
        let mut kv = self.client.kv_client();
        let entry = format!("{}{}", range.queue_prefix(key), self.id);
        let put = kv.put(
            entry,
            QUEUE_VALUE,
            Some(PutOptions::new().with_lease(lease).with_prev_key()),
        );
        match tokio::time::timeout(IDLE_CHECK, put).await {
            // An entry left by an earlier wait of this process whose lease has not ended yet
            // (its revoke failed) keeps its create revision: that is the place, not the put's
            // revision, or the entry would be its own predecessor.
            Ok(Ok(answer)) => Some(Entry {
                lease,
                place: match answer.prev_key() {
                    Some(earlier) => earlier.create_revision(),
                    None => answer.header()?.revision(),
                },
            }),
            _ => {
                let _ = tokio::time::timeout(IDLE_CHECK, leases.revoke(lease)).await;
                None
            }
        }
    }

    /// The entry just older than `place` in the queue of `range` of `key` (`None` for the
    /// head), whether a permit is free (a semaphore's queue; else `false`), and the revision
    /// both were read at, in one request.
    async fn predecessor(&self, key: &StoreKey, range: Range, place: i64) -> Option<Turn> {
        let options = GetOptions::new()
            .with_prefix()
            .with_max_create_revision(place - 1)
            .with_sort(SortTarget::Create, SortOrder::Descend)
            .with_limit(1)
            .with_keys_only();
        let mut reads = vec![TxnOp::get(range.queue_prefix(key), Some(options))];
        if let Range::Permits { .. } = range {
            let slots = GetOptions::new().with_prefix().with_keys_only();
            reads.push(TxnOp::get(crate::permits::prefix(key), Some(slots)));
        }
        let mut kv = self.client.kv_client();
        let txn = kv.txn(Txn::new().and_then(reads));
        let answer = tokio::time::timeout(IDLE_CHECK, txn).await.ok()?.ok()?;
        let revision = answer.header()?.revision();
        let mut gets = answer.op_responses().into_iter().filter_map(|r| match r {
            TxnOpResponse::Get(mut get) => Some(get.take_kvs()),
            _ => None,
        });
        let before = gets
            .next()?
            .into_iter()
            .next()
            .map(|kv| String::from_utf8_lossy(kv.key()).into_owned());
        let free = match range {
            Range::Key => false,
            Range::Permits { permits } => crate::permits::has_free_slot(&gets.next()?, permits),
        };
        Some(Turn {
            before,
            free,
            revision,
        })
    }

    /// Waits in the queue of `range` of `key` with `entry`, keeping the entry's lease alive:
    /// watches the predecessor until this process is the head, then what it waits for,
    /// waking the waiters when it may be free: a lock's key from `from` (0: from now), or
    /// a semaphore's permits, which the head reads first to wake its waiters at once when
    /// one is free.
    async fn wait_in_queue(
        &self,
        key: &StoreKey,
        range: Range,
        id: u64,
        mut from: i64,
        entry: Entry,
        granted: &Notify,
    ) -> Ended {
        let mut leases = self.client.lease_client();
        let Ok((mut keeper, mut answers)) = leases.keep_alive(entry.lease).await else {
            return Ended::Failed("the keep-alive of its queue entry could not start");
        };
        let mut keep_alive = tokio::time::interval(IDLE_CHECK);
        let mut moved_up = false;
        loop {
            let Some(Turn {
                before,
                free,
                revision: read_at,
            }) = self.predecessor(key, range, entry.place).await
            else {
                return Ended::Failed("the queue could not be read");
            };
            let (watched, start, prefix) = match (&before, range) {
                (Some(ahead), _) => (ahead.clone(), read_at + 1, false),
                (None, Range::Key) => {
                    if moved_up {
                        // Head now: the key may have been free since; claim once.
                        self.hub.notify(key);
                        from = read_at + 1;
                    }
                    let start = if from > 0 { from } else { read_at + 1 };
                    (key.as_str().to_owned(), start, false)
                }
                (None, Range::Permits { .. }) => {
                    // Head now (or from the start): a permit may be free already, and only
                    // this process's claims may take it; claim once if one is.
                    if free {
                        self.hub.notify(key);
                    }
                    (crate::permits::prefix(key), read_at + 1, true)
                }
            };
            let mut options = WatchOptions::new()
                .with_start_revision(start)
                .with_filters([WatchFilterType::NoPut]);
            if prefix {
                options = options.with_prefix();
            }
            let mut client = self.client.watch_client();
            let Ok(mut stream) = client.watch(watched, Some(options)).await else {
                return Ended::Failed("its watch could not start");
            };
            loop {
                tokio::select! {
                    answer = stream.message() => match answer {
                        Ok(Some(answer)) if answer.canceled() => {
                            return Ended::Failed("the cluster cancelled its watch");
                        }
                        Ok(Some(answer)) => {
                            if answer.events().is_empty() {
                                continue;
                            }
                            if before.is_some() {
                                // The predecessor left: find the next one, or lead.
                                moved_up = true;
                                break;
                            }
                            self.hub.notify(key);
                        }
                        Ok(None) | Err(_) => return Ended::Failed("its watch failed"),
                    },
                    () = granted.notified() => return Ended::Granted,
                    _ = keep_alive.tick() => {
                        if keeper.keep_alive().await.is_err() {
                            return Ended::Failed("a keep-alive of its queue entry failed");
                        }
                    }
                    // The keep-alives' answers are read so they never pile up; a lease that
                    // is gone (TTL 0) or a failed stream ends the wait.
                    answer = answers.message() => match answer {
                        Ok(Some(answer)) if answer.ttl() > 0 => {}
                        _ => return Ended::Failed("its queue entry's lease ended"),
                    },
                }
                if !self.still_waited(key, id) {
                    return Ended::Leave;
                }
            }
        }
    }
}
