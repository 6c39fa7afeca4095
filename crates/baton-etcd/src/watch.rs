//! Wake-ups on etcd: each process that waits for a lock queues once, and watches only the
//! process queued just before it, as etcd's own `concurrency.Mutex` waits on its
//! predecessor: a release wakes one process, not every process that waits.
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
//! ## Semaphores: a watch on the permits
//! A `Held` permit claim watches every slot of the semaphore (the prefix `k\0`) for deletes,
//! and wakes this process's waiters at each one.
//!
//! ## Behavior
//! - A watch (and a queue entry) lives while some waiter of this process waits for its key
//!   (checked after each event and every [`IDLE_CHECK`]), and stops with the store; a stopped
//!   store's entry is gone when its lease ends.
//! - The queue never decides who is granted: a claim still decides. A process that is not
//!   the head still claims when its waiters' timers fire (at the holder's remaining TTL),
//!   and a newcomer's first claim may take a free key before the head's.
//! - A watch that fails (its member died, the start revision was compacted, the cluster
//!   cancelled it), or a queue entry that cannot be made, wakes the key's waiters, which claim
//!   again: a `Held` answer starts over, a fault is the lock policy's to ride out. No delete
//!   is missed in between, because the new watch starts after the new claim's read.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use baton_core::signals::ReleaseHub;
use baton_core::{CancellationToken, StoreKey};
use etcd_client::{
    Client, GetOptions, PutOptions, SortOrder, SortTarget, WatchFilterType, WatchOptions,
    WatchStream,
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

/// What a watch covers.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Range {
    /// The waited key itself (a lock's or lease's grant), through the queue of processes.
    Key,
    /// The permits of the waited key (a semaphore's), the keys under its prefix.
    Permits,
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

/// Why a watch of the queue ended.
enum Ended {
    /// Nobody in this process waits any more, or the watch failed: leave.
    Leave,
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

    /// Makes sure `range` is watched for deletes from `revision` on, waking the waiters for
    /// `key`.
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
                () = watches.run(&key, range, id, revision, &granted) => {}
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

    async fn run(&self, key: &StoreKey, range: Range, id: u64, revision: i64, granted: &Notify) {
        match range {
            Range::Permits => {
                let options = WatchOptions::new()
                    .with_start_revision(revision)
                    .with_filters([WatchFilterType::NoPut])
                    .with_prefix();
                let mut client = self.client.watch_client();
                let Ok(mut stream) = client
                    .watch(crate::permits::prefix(key), Some(options))
                    .await
                else {
                    return;
                };
                while self.wake_on_deletes(key, id, &mut stream).await {}
            }
            Range::Key => self.queue(key, id, revision, granted).await,
        }
    }

    /// Waits for the next answer of `stream` (at most [`IDLE_CHECK`]), waking `key`'s waiters
    /// on deletes; whether to go on (somebody still waits and the stream is fine).
    async fn wake_on_deletes(&self, key: &StoreKey, id: u64, stream: &mut WatchStream) -> bool {
        match tokio::time::timeout(IDLE_CHECK, stream.message()).await {
            Ok(Ok(Some(answer))) => {
                if answer.canceled() {
                    return false;
                }
                if !answer.events().is_empty() {
                    self.hub.notify(key);
                }
            }
            // The stream ended or failed.
            Ok(Ok(None) | Err(_)) => return false,
            Err(_idle) => {}
        }
        self.still_waited(key, id)
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

    /// Queues this process for `key` until nobody in it waits, queueing again after each
    /// grant.
    async fn queue(&self, key: &StoreKey, id: u64, revision: i64, granted: &Notify) {
        let mut from = revision;
        loop {
            let Some((lease, place)) = self.enqueue(key).await else {
                return;
            };
            let ended = self
                .wait_in_queue(key, id, from, lease, place, granted)
                .await;
            // Leaving deletes the entry: the process behind is woken by its delete.
            let mut leases = self.client.lease_client();
            let _ = tokio::time::timeout(IDLE_CHECK, leases.revoke(lease)).await;
            match ended {
                Ended::Granted if self.still_waited(key, id) => {
                    // Behind everyone queued now; the key is this process's, so its next
                    // delete is after now.
                    from = 0;
                }
                _ => return,
            }
        }
    }

    /// Puts this process's queue entry for `key` on a lease of its own: the lease and the
    /// entry's create revision, or `None` when the cluster did not answer.
    async fn enqueue(&self, key: &StoreKey) -> Option<(i64, i64)> {
        let mut leases = self.client.lease_client();
        let lease = tokio::time::timeout(IDLE_CHECK, leases.grant(QUEUE_LEASE, None))
            .await
            .ok()?
            .ok()?
            .id();
        let mut kv = self.client.kv_client();
        let entry = format!("{}{}", queue_prefix(key), self.id);
        let put = kv.put(
            entry,
            QUEUE_VALUE,
            Some(PutOptions::new().with_lease(lease)),
        );
        match tokio::time::timeout(IDLE_CHECK, put).await {
            Ok(Ok(answer)) => Some((lease, answer.header()?.revision())),
            _ => {
                let _ = tokio::time::timeout(IDLE_CHECK, leases.revoke(lease)).await;
                None
            }
        }
    }

    /// The entry just older than `place` in `key`'s queue (`None` for the head), and the
    /// revision it was read at.
    async fn predecessor(&self, key: &StoreKey, place: i64) -> Option<(Option<String>, i64)> {
        let options = GetOptions::new()
            .with_prefix()
            .with_max_create_revision(place - 1)
            .with_sort(SortTarget::Create, SortOrder::Descend)
            .with_limit(1)
            .with_keys_only();
        let mut kv = self.client.kv_client();
        let mut answer = tokio::time::timeout(IDLE_CHECK, kv.get(queue_prefix(key), Some(options)))
            .await
            .ok()?
            .ok()?;
        let revision = answer.header()?.revision();
        let before = answer
            .take_kvs()
            .into_iter()
            .next()
            .map(|kv| String::from_utf8_lossy(kv.key()).into_owned());
        Some((before, revision))
    }

    /// Waits in `key`'s queue at `place`, keeping the entry's `lease` alive: watches the
    /// predecessor until this process is the head, then `key` itself from `from` (0: from
    /// now), waking the waiters when it may be free.
    async fn wait_in_queue(
        &self,
        key: &StoreKey,
        id: u64,
        mut from: i64,
        lease: i64,
        place: i64,
        granted: &Notify,
    ) -> Ended {
        let mut leases = self.client.lease_client();
        let Ok((mut keeper, mut answers)) = leases.keep_alive(lease).await else {
            return Ended::Leave;
        };
        let mut keep_alive = tokio::time::interval(IDLE_CHECK);
        let mut moved_up = false;
        loop {
            let Some((before, read_at)) = self.predecessor(key, place).await else {
                return Ended::Leave;
            };
            let (watched, start) = match &before {
                Some(entry) => (entry.clone(), read_at + 1),
                None => {
                    if moved_up {
                        // Head now: the key may have been free since; claim once.
                        self.hub.notify(key);
                        from = read_at + 1;
                    }
                    let start = if from > 0 { from } else { read_at + 1 };
                    (key.as_str().to_owned(), start)
                }
            };
            let options = WatchOptions::new()
                .with_start_revision(start)
                .with_filters([WatchFilterType::NoPut]);
            let mut client = self.client.watch_client();
            let Ok(mut stream) = client.watch(watched, Some(options)).await else {
                return Ended::Leave;
            };
            loop {
                tokio::select! {
                    answer = stream.message() => match answer {
                        Ok(Some(answer)) if answer.canceled() => return Ended::Leave,
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
                        Ok(None) | Err(_) => return Ended::Leave,
                    },
                    () = granted.notified() => return Ended::Granted,
                    _ = keep_alive.tick() => {
                        if keeper.keep_alive().await.is_err() {
                            return Ended::Leave;
                        }
                    }
                    // The keep-alives' answers are read so they never pile up; a lease that
                    // is gone (TTL 0) or a failed stream ends the wait.
                    answer = answers.message() => match answer {
                        Ok(Some(answer)) if answer.ttl() > 0 => {}
                        _ => return Ended::Leave,
                    },
                }
                if !self.still_waited(key, id) {
                    return Ended::Leave;
                }
            }
        }
    }
}
