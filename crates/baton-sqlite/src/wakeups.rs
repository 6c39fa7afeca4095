//! Release wake-ups across the processes that share one file, through Unix datagram
//! sockets in a directory beside it.
//!
//! Every process keeps one [`FileWakeups`] per database file (found by the file's canonical
//! path, shared by every store on the file in the process), with a [`ReleaseHub`] for its
//! waiters and, where it can be set up, a datagram socket `p.<id>` in the directory
//! `<file>-wake` (`<id>` is the process id and a random number). A thread per file and
//! process receives on it.
//!
//! ## The queue
//! - A claim that finds the key held while a waiter of this process waits for it (the head
//!   of the process's queue for the key, see `Locks::acquire`) puts the process in the key's
//!   queue: an empty file `<hash>.<time>.<id>` in the directory, where `<hash>` is a 64-bit
//!   FNV-1a hash of the key and `<time>` the host's monotonic clock. It is created inside the
//!   claim's write transaction, so a release (which needs the same write lock) cannot fall
//!   between the claim and the entry: no wake-up is missed.
//! - A release, inside its write transaction, lists the key's entries oldest first and finds
//!   the first process that is there (a datagram `connect` to its socket succeeds, which
//!   does not wake it; this process's own entry counts when one of its waiters still waits),
//!   and **reserves** the key for it for
//!   [`HANDOFF_RESERVATION`]: the row keeps no holder, and its `reason` is
//!   `handoff:<process>` ([`sql::RESERVE`](crate::sql::RESERVE)). Only a claim of that
//!   process takes the key meanwhile; others find it held by `handoff:<process>` and queue.
//!   So a replica that releases and asks again at once cannot take the key back from one
//!   that waited.
//! - Before its commit, the release sends that process "your turn" (`h<entry>`; a turn for
//!   this process's own entry is given without a message): its thread wakes its waiters
//!   through [`ReleaseHub::notify`], and in the core only the first of them claims. So a
//!   release wakes one waiter in one process, and processes take turns in the order they
//!   started waiting.
//! - **Hand-over.** A lock waiter's claim also writes, into its process's entry, which holder
//!   waits and its TTL (`<ttl ns>\n<holder>`). A release that finds such an entry at the head
//!   does not reserve the key: it grants it to that holder, with the next fence and the
//!   holder's TTL, in its own transaction, and after the commit sends the process
//!   `g<entry>\n<fence>\n<holder>` (a grant to this process's own waiter is given without a
//!   message). The core's [`Handoffs`] wakes the holder's waiter, whose next claim answers
//!   `HandedOver` from memory: a hand-over costs the release's commit and one message, where
//!   a turn costs a second commit, the woken process's claim. A grant to a holder that is no
//!   longer waiting (it gave up since its claim) is given back at once by its process (a
//!   release as that holder, which hands the key on). Entries without a holder (an
//!   election's campaigns, which must claim to record their value; a permit's waiters) get
//!   the reservation above.
//! - The process's entry stays until one of its waiters is granted the key.
//! - The next process reached is told it is next (`w<entry>`) and keeps a timer of
//!   [`NEXT_IN_LINE_WATCH`]: when it fires with no turn in between, its waiters claim again.
//!   A process that was reached but never claims (paused, killed after the message) so
//!   delays the key by at most the reservation; the waiters' own timers at the holder's
//!   remaining TTL stay the backstop.
//! - An entry whose process is gone (the socket refuses, or is missing) is deleted and the
//!   next is tried; a process whose receive queue is full (paused) keeps its entry and the
//!   next is tried. A process told it is its turn while none of its waiters wants the key
//!   any more (they gave up or were cancelled) deletes its entry and passes the turn on,
//!   unreserved: the next process takes the key when the reservation made for the first
//!   ends.
//!
//! ## When it is unavailable
//! Where the directory or the socket cannot be made (a read-only directory, a path longer
//! than a socket address allows, a platform without Unix sockets), or sending or receiving
//! fails later, the file's waiters in this process poll every
//! [`poll_interval`](crate::SqliteOptions::poll_interval) from then on (for as long as a
//! store on the file is open in the process), releases also wake this process's waiters
//! directly, and [`baton.store.push_lost`](baton_core::telemetry::events::STORE_PUSH_LOST)
//! says why, once.
//!
//! A process of an earlier baton on the same file neither queues nor sends turns: its
//! releases reach this process's waiters at the holder's TTL, not at once.

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

pub(crate) use baton_core::signals::HANDOFF_RESERVATION;
use baton_core::signals::{Handoffs, ReleaseHub, WATCH_SLACK};
use baton_core::telemetry::{self, events};
use baton_core::{Fence, Holder, StoreKey};
use tokio::runtime::Handle;

use crate::clock;
use crate::connection::{Database, Role};

#[cfg(unix)]
use std::os::unix::net::UnixDatagram;

/// Where there are no Unix sockets the store refuses to open (see `clock`); this keeps the
/// crate building there, every socket failing to be made.
#[cfg(not(unix))]
#[derive(Debug)]
struct UnixDatagram;

#[cfg(not(unix))]
impl UnixDatagram {
    fn unsupported<T>() -> io::Result<T> {
        Err(io::ErrorKind::Unsupported.into())
    }
    fn bind(_: PathBuf) -> io::Result<Self> {
        Self::unsupported()
    }
    fn unbound() -> io::Result<Self> {
        Self::unsupported()
    }
    fn set_nonblocking(&self, _: bool) -> io::Result<()> {
        Self::unsupported()
    }
    fn set_read_timeout(&self, _: Option<Duration>) -> io::Result<()> {
        Self::unsupported()
    }
    fn send_to(&self, _: &[u8], _: PathBuf) -> io::Result<usize> {
        Self::unsupported()
    }
    fn connect(&self, _: PathBuf) -> io::Result<()> {
        Self::unsupported()
    }
    fn recv(&self, _: &mut [u8]) -> io::Result<usize> {
        Self::unsupported()
    }
}

/// How long the process told it is next in line waits for its turn before its waiters
/// claim again anyway: until just after the reservation made for the process before it
/// ([`HANDOFF_RESERVATION`]) has ended.
pub(crate) const NEXT_IN_LINE_WATCH: Duration = HANDOFF_RESERVATION.saturating_add(WATCH_SLACK);

/// The `reason` of a reserved row starts with this, followed by the process's id.
pub(crate) const HANDOFF_PREFIX: &str = "handoff:";

/// The largest message: a kind byte, an entry name (a few dozen bytes), and for a hand-over
/// a fence and a holder of at most [`MAX_HANDED_HOLDER`] bytes.
const MAX_MESSAGE: usize = 1024;

/// The longest holder an entry names for a hand-over (baton's random lock holders are 32
/// bytes); a waiter with a longer one is reserved for instead.
const MAX_HANDED_HOLDER: usize = 512;

/// This process's address for [`Handoffs`]: every hand-over message reaching its socket is
/// for it, so one constant address serves while its wake-ups work.
const ADDRESS: u64 = 1;

fn registry() -> &'static Mutex<HashMap<PathBuf, Weak<FileWakeups>>> {
    static FILES: OnceLock<Mutex<HashMap<PathBuf, Weak<FileWakeups>>>> = OnceLock::new();
    FILES.get_or_init(Default::default)
}

/// The wake-ups of the file at `canonical` (a path from `std::fs::canonicalize`) in this
/// process.
pub(crate) fn for_file(canonical: &Path) -> Arc<FileWakeups> {
    let mut files = registry().lock().unwrap_or_else(|p| p.into_inner());
    if let Some(file) = files.get(canonical).and_then(Weak::upgrade) {
        return file;
    }
    files.retain(|_, file| file.strong_count() > 0);
    let file = Arc::new(FileWakeups::open(canonical));
    files.insert(canonical.to_owned(), Arc::downgrade(&file));
    file
}

/// One file's release wake-ups in this process.
#[derive(Debug)]
pub(crate) struct FileWakeups {
    shared: Arc<Shared>,
    /// The receiving thread, told to stop when the last store on the file is dropped.
    listener: Option<std::thread::JoinHandle<()>>,
}

/// What the stores and the receiving thread share.
#[derive(Debug)]
struct Shared {
    hub: Arc<ReleaseHub>,
    /// The grants releases handed to this process's waiting holders.
    handoffs: Arc<Handoffs>,
    /// The stores on the file in this process, each with the runtime it was opened in: how
    /// a grant is given back, and the runtime [`Handoffs`] needs for the receiving thread.
    attached: Attached,
    /// The file, for messages.
    file: PathBuf,
    /// Set from the start, or once sending or receiving failed: waiters poll, and releases
    /// wake this process's waiters directly.
    polling: AtomicBool,
    /// `None` where the directory or socket could not be made.
    push: Option<Push>,
}

#[derive(Debug)]
struct Push {
    dir: PathBuf,
    /// This process's name in entries and its socket's (`p.<id>`).
    id: String,
    /// The reservation its claims name: `handoff:<id>`.
    handoff: String,
    /// Unbound, non-blocking: sends turns.
    sender: UnixDatagram,
    queued: Mutex<Queued>,
}

/// This process's entries, one per key at most.
#[derive(Debug, Default)]
struct Queued {
    by_key: HashMap<StoreKey, String>,
    by_entry: HashMap<String, StoreKey>,
}

impl Queued {
    fn remove_entry(&mut self, entry: &str) -> Option<StoreKey> {
        let key = self.by_entry.remove(entry)?;
        self.by_key.remove(&key);
        Some(key)
    }
}

/// The stores on one file in this process, each with the runtime it was opened in.
type Attached = Arc<Mutex<Vec<(Weak<Database>, Handle)>>>;

/// The first store on the file that is still open, with its runtime.
fn attached_store(attached: &Attached) -> Option<(Arc<Database>, Handle)> {
    let mut stores = attached.lock().unwrap_or_else(|p| p.into_inner());
    stores.retain(|(db, _)| db.strong_count() > 0);
    stores
        .iter()
        .find_map(|(db, handle)| Some((db.upgrade()?, handle.clone())))
}

/// Gives back a grant handed to `holder` of this process, who will never use it: a release
/// as that holder, in the background, which hands the key on. Where no store on the file is
/// open any more, or the release fails, the key stays held until the grant's TTL ends.
fn give_back(attached: &Attached, key: StoreKey, holder: Holder) {
    let Some((db, handle)) = attached_store(attached) else {
        return;
    };
    handle.spawn(async move {
        let given = db
            .run(Role::Write, "give back a hand-over", move |conn, db| {
                crate::locks::release_and_hand_over(conn, &key, holder.as_str(), &db.wakeups)
            })
            .await;
        if let Err(error) = given {
            telemetry::emit(
                &events::LOCK_RELEASE_FAULTED,
                None,
                format_args!(
                    "a grant handed to a waiter that stopped waiting could not be released, so the key stays held until its TTL: {error}"
                ),
            );
        }
    });
}

/// A message between processes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// "Your turn": the key was released and this entry is the oldest reached.
    Turn,
    /// "Yours": the key was granted to the holder this entry names (`<entry>\n<fence>\n<holder>`).
    Granted,
    /// "You are next": look again after [`NEXT_IN_LINE_WATCH`] if no turn came.
    Next,
    /// Sent by a process to its own socket: stop receiving.
    Stop,
}

impl Kind {
    fn byte(self) -> u8 {
        match self {
            Kind::Turn => b'h',
            Kind::Granted => b'g',
            Kind::Next => b'w',
            Kind::Stop => b'q',
        }
    }

    fn parse(message: &[u8]) -> Option<(Kind, &str)> {
        let (&kind, rest) = message.split_first()?;
        let kind = match kind {
            b'h' => Kind::Turn,
            b'g' => Kind::Granted,
            b'w' => Kind::Next,
            b'q' => Kind::Stop,
            _ => return None,
        };
        Some((kind, std::str::from_utf8(rest).ok()?))
    }
}

/// The 64-bit FNV-1a hash of `key`, as 16 hex digits: the prefix of its entries.
fn key_hash(key: &StoreKey) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in key.as_str().bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{hash:016x}")
}

/// The process id in an entry name `<hash>.<time>.<id>`.
fn owner_of(entry: &str) -> Option<&str> {
    let mut parts = entry.splitn(3, '.');
    let (hash, time, id) = (parts.next()?, parts.next()?, parts.next()?);
    (hash.len() == 16 && time.len() == 16 && !id.is_empty()).then_some(id)
}

fn socket_name(id: &str) -> String {
    format!("p.{id}")
}

/// The directory of the file's sockets and queue entries: `<file>-wake`.
fn directory_of(file: &Path) -> PathBuf {
    let mut name = file.as_os_str().to_owned();
    name.push("-wake");
    PathBuf::from(name)
}

impl FileWakeups {
    fn open(file: &Path) -> FileWakeups {
        let hub = Arc::new(ReleaseHub::new());
        let attached: Attached = Arc::default();
        let handoffs = Arc::new({
            let attached = Arc::clone(&attached);
            Handoffs::new(Arc::clone(&hub), move |_, key, holder| {
                give_back(&attached, key, holder)
            })
        });
        let dir = directory_of(file);
        let id = format!("{}-{:016x}", std::process::id(), rand_u64());
        let set_up = (|| -> io::Result<(UnixDatagram, UnixDatagram)> {
            match std::fs::create_dir(&dir) {
                Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return Err(e),
                _ => {}
            }
            let receiver = UnixDatagram::bind(dir.join(socket_name(&id)))?;
            let sender = UnixDatagram::unbound()?;
            sender.set_nonblocking(true)?;
            Ok((receiver, sender))
        })();
        let (push, receiver) = match set_up {
            Ok((receiver, sender)) => (
                Some(Push {
                    dir,
                    handoff: format!("{HANDOFF_PREFIX}{id}"),
                    id,
                    sender,
                    queued: Mutex::default(),
                }),
                Some(receiver),
            ),
            Err(e) => {
                unavailable(file, &dir, &e);
                (None, None)
            }
        };
        let shared = Arc::new(Shared {
            hub,
            handoffs,
            attached,
            file: file.to_owned(),
            polling: AtomicBool::new(push.is_none()),
            push,
        });
        if shared.push.is_some() {
            shared.handoffs.connected(ADDRESS);
        }
        if let Some(push) = &shared.push {
            push.sweep();
        }
        let listener = receiver.and_then(|receiver| {
            let thread_shared = Arc::clone(&shared);
            let spawned = std::thread::Builder::new()
                .name("baton-sqlite-wake".into())
                .spawn(move || thread_shared.receive(receiver));
            match spawned {
                Ok(handle) => Some(handle),
                Err(e) => {
                    shared.degrade("cannot start the thread that receives them", &e);
                    None
                }
            }
        });
        FileWakeups { shared, listener }
    }

    /// The hub this process's waiters on the file subscribe to.
    pub(crate) fn hub(&self) -> &Arc<ReleaseHub> {
        &self.shared.hub
    }

    /// The grants releases handed to this process's waiting holders.
    pub(crate) fn handoffs(&self) -> &Arc<Handoffs> {
        &self.shared.handoffs
    }

    /// Records a store opened on the file, in the current runtime: grants handed to holders
    /// that stopped waiting are given back through it.
    pub(crate) fn attach(&self, db: &Arc<Database>) {
        if let Ok(handle) = Handle::try_current() {
            let mut stores = self
                .shared
                .attached
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            stores.retain(|(db, _)| db.strong_count() > 0);
            stores.push((Arc::downgrade(db), handle));
        }
    }

    /// Whether a claim of `key` by `holder` may be answered by a hand-over: the holder
    /// waits for it, and this process takes turns.
    pub(crate) fn may_hand_over(&self, key: &StoreKey, holder: &Holder) -> bool {
        self.handoff().is_some()
            && self.shared.handoffs.address().is_some()
            && holder.as_str().len() <= MAX_HANDED_HOLDER
            && self.shared.hub.is_waiting(key, holder)
    }

    /// `Some(poll_interval)` when waiters must poll: the wake-ups are unavailable.
    pub(crate) fn poll(&self, poll_interval: Duration) -> Option<Duration> {
        self.shared
            .polling
            .load(Ordering::Relaxed)
            .then_some(poll_interval)
    }

    /// Called inside a claim's write transaction that found `key` held: queues this process
    /// for `key` when one of its waiters waits for it. `waiter` names the waiting holder and
    /// its TTL (ns) when the key may be handed to it ([`may_hand_over`](Self::may_hand_over)):
    /// the entry then says so, and a release grants the key to that holder.
    pub(crate) fn held(&self, key: &StoreKey, waiter: Option<(&Holder, i64)>) {
        let shared = &self.shared;
        let Some(push) = shared.push.as_ref() else {
            return;
        };
        if shared.polling.load(Ordering::Relaxed) || !shared.hub.has_waiters(key) {
            return;
        }
        let mut queued = push.queued.lock().unwrap_or_else(|p| p.into_inner());
        let written = match queued.by_key.get(key) {
            // Queued already: the entry keeps its place and names the holder waiting now.
            Some(entry) => match waiter {
                Some(waiter) => std::fs::write(push.dir.join(entry), waiter_text(waiter)),
                None => Ok(()),
            },
            None => {
                let time = u64::try_from(clock::now()).unwrap_or(0);
                let entry = format!("{}.{time:016x}.{}", key_hash(key), push.id);
                let made =
                    std::fs::File::create_new(push.dir.join(&entry)).and_then(
                        |mut f| match waiter {
                            Some(waiter) => {
                                io::Write::write_all(&mut f, waiter_text(waiter).as_bytes())
                            }
                            None => Ok(()),
                        },
                    );
                if made.is_ok() {
                    queued.by_key.insert(key.clone(), entry.clone());
                    queued.by_entry.insert(entry, key.clone());
                }
                made
            }
        };
        if let Err(e) = written {
            drop(queued);
            shared.degrade("cannot queue a waiter", &e);
        }
    }

    /// Called after a claim granted (or extended) `key`: this process leaves its queue.
    pub(crate) fn granted(&self, key: &StoreKey) {
        let Some(push) = self.shared.push.as_ref() else {
            return;
        };
        let mut queued = push.queued.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(entry) = queued.by_key.remove(key) {
            queued.by_entry.remove(&entry);
            drop(queued);
            push.delete(&entry);
        }
    }

    /// The reservation this process's claims name (`handoff:<id>`), `None` while it takes
    /// no turns (polling).
    pub(crate) fn handoff(&self) -> Option<&str> {
        let push = self.shared.push.as_ref()?;
        (!self.shared.polling.load(Ordering::Relaxed)).then_some(push.handoff.as_str())
    }

    /// Called inside the write transaction of a release that freed `key`: the process
    /// whose turn it is (reachable now, or this one with a waiter), and the rest of the
    /// queue behind it. The release reserves the key for it, and
    /// [`hand_over`](Self::hand_over) tells it.
    pub(crate) fn next_in_line(&self, key: &StoreKey) -> Option<Line> {
        let shared = &self.shared;
        let push = shared.push.as_ref()?;
        if shared.polling.load(Ordering::Relaxed) {
            return None;
        }
        let mut entries = match push.entries(&format!("{}.", key_hash(key))) {
            Ok(entries) => entries.into_iter(),
            Err(e) => {
                shared.degrade("cannot list the waiting processes", &e);
                return None;
            }
        };
        while let Some(entry) = entries.next() {
            let Some(owner) = owner_of(&entry).map(str::to_owned) else {
                continue;
            };
            let reachable = if owner == push.id {
                let wanted = shared
                    .key_of(&entry)
                    .is_some_and(|k| shared.hub.has_waiters(&k));
                if !wanted {
                    shared.leave(&entry);
                }
                wanted
            } else {
                // Does the process live? Its socket answers a connect without being woken.
                match push.probe(&entry, &owner) {
                    Ok(reachable) => reachable,
                    Err(e) => {
                        shared.degrade("cannot reach a waiting process", &e);
                        return None;
                    }
                }
            };
            if reachable {
                let waiter = push.waiter_of(&entry).filter(|(holder, _)| {
                    // This process's own holder must still wait: one that gave up since its
                    // claim gets a reservation (its process's next waiter claims).
                    owner != push.id || shared.hub.is_waiting(key, holder)
                });
                return Some(Line {
                    key: key.clone(),
                    entry,
                    owner,
                    waiter,
                    rest: entries.collect(),
                });
            }
        }
        None
    }

    /// Called inside the write transaction of a release that granted `line`'s key to the
    /// holder its entry names, with `fence`: the hand-over, which the caller delivers after
    /// the commit (a grant told before it commits could be lost with it).
    pub(crate) fn granted_to(&self, line: Line, fence: Fence) -> Handover {
        let (holder, _) = line
            .waiter
            .expect("a line granted to the holder its entry names");
        Handover {
            key: line.key,
            entry: line.entry,
            owner: line.owner,
            holder,
            fence,
            rest: line.rest,
        }
    }

    /// Called after the commit of a release that handed its key over: tells the holder's
    /// process (this one without a message), then the next process reached that it is next
    /// (second, so that its wake-up does not delay the hand-over's). A process gone since it
    /// was reached leaves the grant to its TTL, as a holder that died does.
    pub(crate) fn deliver(&self, handover: Handover) {
        let shared = &self.shared;
        let Some(push) = shared.push.as_ref() else {
            return;
        };
        let rest = handover.rest;
        if handover.owner == push.id {
            // Granted: the process leaves the queue, as after a claim that granted (see
            // `forget`).
            shared.forget(&handover.entry);
            shared.take_grant(handover.key, handover.holder, handover.fence);
            shared.send_first(Kind::Next, &mut rest.iter());
            shared.delete(&handover.entry);
            return;
        }
        let text = format!(
            "{}\n{}\n{}",
            handover.entry,
            handover.fence.get(),
            handover.holder.as_str()
        );
        match push.send(Some(Kind::Granted), &text, &handover.owner) {
            // Gone or full since it was reached: the grant ends with its TTL, as the grant of
            // a holder that died does.
            Ok(_) => {}
            Err(e) => return shared.degrade("cannot tell a process it was handed a key", &e),
        }
        shared.send_first(Kind::Next, &mut rest.iter());
    }

    /// Called after the commit of a release that freed `key`: while polling, wakes this
    /// process's waiters (the others poll).
    pub(crate) fn released(&self, key: &StoreKey) {
        if self.shared.polling.load(Ordering::Relaxed) {
            self.shared.hub.notify(key);
        }
    }

    /// Called inside the write transaction of a release, once it reserved the key for
    /// `line`: tells that process it is its turn, and the next one reached that it is next.
    ///
    /// Sent before the commit: the woken process's claim then waits for the write lock,
    /// which the commit frees, so its wake-up overlaps the commit's sync instead of
    /// following it. Should the commit fail, that claim finds the key still held and waits
    /// again, in its place.
    pub(crate) fn hand_over(&self, line: Line) {
        let shared = &self.shared;
        let Some(push) = shared.push.as_ref() else {
            return;
        };
        if line.owner == push.id {
            shared.hub.notify(&line.key);
        } else if let Err(e) = push.send(Some(Kind::Turn), &line.entry, &line.owner) {
            // Gone since it was reached: the next in line looks again after the reservation.
            shared.degrade("cannot wake a waiting process", &e);
        }
        shared.send_first(Kind::Next, &mut line.rest.iter());
    }
}

/// The process a released key is reserved for, and the queue behind it.
#[derive(Debug)]
pub(crate) struct Line {
    key: StoreKey,
    entry: String,
    owner: String,
    /// The holder the entry names, and its TTL (ns): the key may be granted to it.
    waiter: Option<(Holder, i64)>,
    rest: Vec<String>,
}

/// A grant a release made to a waiting holder of another process (or of this one), to be
/// told once the release has committed ([`Handover::deliver`]).
#[derive(Debug)]
#[must_use = "a hand-over must be delivered after the commit"]
pub(crate) struct Handover {
    key: StoreKey,
    entry: String,
    owner: String,
    holder: Holder,
    fence: Fence,
    /// The queue behind it, to tell the next process reached that it is next.
    rest: Vec<String>,
}

impl Line {
    /// The holder the entry names and its TTL (ns), when the key may be granted to it.
    pub(crate) fn waiter(&self) -> Option<&(Holder, i64)> {
        self.waiter.as_ref()
    }

    /// The `reason` of the reservation: `handoff:<process>`.
    pub(crate) fn handoff(&self) -> String {
        format!("{HANDOFF_PREFIX}{}", self.owner)
    }
}

impl Drop for FileWakeups {
    fn drop(&mut self) {
        let Some(push) = self.shared.push.as_ref() else {
            return;
        };
        let socket = push.dir.join(socket_name(&push.id));
        if let Some(listener) = self.listener.take() {
            // The listener ends at this message; if it cannot be sent the thread is left
            // blocked, holding only the socket.
            if push
                .sender
                .send_to(&[Kind::Stop.byte()], socket.clone())
                .is_ok()
            {
                let _ = listener.join();
            }
        }
        let entries: Vec<String> = {
            let mut queued = push.queued.lock().unwrap_or_else(|p| p.into_inner());
            queued.by_key.clear();
            queued.by_entry.drain().map(|(entry, _)| entry).collect()
        };
        for entry in entries {
            push.delete(&entry);
        }
        let _ = std::fs::remove_file(socket);
    }
}

impl Push {
    fn delete(&self, entry: &str) {
        let _ = std::fs::remove_file(self.dir.join(entry));
    }

    /// The waiting holder and its TTL (ns) that `entry` names, if it names one.
    fn waiter_of(&self, entry: &str) -> Option<(Holder, i64)> {
        let text = std::fs::read_to_string(self.dir.join(entry)).ok()?;
        let (ttl, holder) = text.split_once('\n')?;
        let ttl: i64 = ttl.parse().ok().filter(|t| *t > 0)?;
        let valid = !holder.is_empty()
            && holder.len() <= MAX_HANDED_HOLDER
            && !holder.chars().any(char::is_control);
        valid.then(|| (Holder::from_stored(holder.to_owned()), ttl))
    }

    /// The names in the directory that start with `prefix`, in order.
    fn entries(&self, prefix: &str) -> io::Result<Vec<String>> {
        let mut names = Vec::new();
        for dirent in std::fs::read_dir(&self.dir)? {
            if let Some(name) = dirent?.file_name().to_str()
                && name.starts_with(prefix)
            {
                names.push(name.to_owned());
            }
        }
        names.sort_unstable();
        Ok(names)
    }

    /// Sends `kind` for `entry` to its process. `Ok(true)` when it was delivered,
    /// `Ok(false)` when that process cannot take it now (gone: the entry is deleted; its
    /// queue full: the entry is kept).
    /// `None` sends an empty message, which only tells whether the process is there.
    fn send(&self, kind: Option<Kind>, entry: &str, owner: &str) -> io::Result<bool> {
        let mut message = Vec::with_capacity(1 + entry.len());
        if let Some(kind) = kind {
            message.push(kind.byte());
            message.extend_from_slice(entry.as_bytes());
        }
        let sent = self
            .sender
            .send_to(&message, self.dir.join(socket_name(owner)));
        match sent {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(false),
            sent => self.reached(sent.map(|_| ()), entry, owner),
        }
    }

    /// Whether `owner`'s socket is bound by a live process: a datagram `connect` to it,
    /// which the kernel answers without waking the process. `Ok(false)` when it is gone (its
    /// entry and socket are deleted).
    fn probe(&self, entry: &str, owner: &str) -> io::Result<bool> {
        let probe = UnixDatagram::unbound()?;
        let connected = probe.connect(self.dir.join(socket_name(owner)));
        self.reached(connected, entry, owner)
    }

    /// What reaching `owner`'s socket answered: `Ok(true)` reached; `Ok(false)` when the
    /// process is gone (refused, or no socket), whose entry and socket are then deleted;
    /// other errors as they are.
    fn reached(&self, answer: io::Result<()>, entry: &str, owner: &str) -> io::Result<bool> {
        match answer {
            Ok(()) => Ok(true),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::ConnectionRefused | io::ErrorKind::NotFound
                ) =>
            {
                // The process is gone: forget its entry and its socket.
                self.delete(entry);
                let _ = std::fs::remove_file(self.dir.join(socket_name(owner)));
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }

    /// Deletes the sockets (and so, lazily, the entries) of processes that are gone: an
    /// empty message reaches a live process's thread, which ignores it.
    fn sweep(&self) {
        let Ok(sockets) = self.entries("p.") else {
            return;
        };
        for socket in sockets {
            let path = self.dir.join(&socket);
            if let Err(e) = self.sender.send_to(&[], path.clone())
                && e.kind() == io::ErrorKind::ConnectionRefused
            {
                let _ = std::fs::remove_file(path);
            }
        }
    }
}

impl Shared {
    fn degrade(&self, what: &str, error: &io::Error) {
        if !self.polling.swap(true, Ordering::Relaxed) {
            self.handoffs.disconnected();
            telemetry::emit(
                &events::STORE_PUSH_LOST,
                None,
                format_args!(
                    "release wake-ups across processes on SQLite file {} stopped: {what}: {error}; waiters in this process poll from now on",
                    self.file.display()
                ),
            );
            self.hub.notify_all();
        }
    }

    /// Passes the turn for the key whose entries start with `hash` on, unreserved (the
    /// reservation made for this process runs out on its own): to the oldest process that
    /// takes it, and tells the next one reached that it is next.
    fn pass_turn(&self, hash: &str) {
        let Some(push) = self.push.as_ref() else {
            return;
        };
        let entries = match push.entries(&format!("{hash}.")) {
            Ok(entries) => entries,
            Err(e) => return self.degrade("cannot list the waiting processes", &e),
        };
        let mut entries = entries.iter();
        if self.send_first(Kind::Turn, &mut entries) {
            self.send_first(Kind::Next, &mut entries);
        }
    }

    /// Sends `kind` to the first of `entries` whose process takes it, leaving the rest of
    /// the iterator for a next message. Whether one took it.
    fn send_first<'a>(&self, kind: Kind, entries: &mut impl Iterator<Item = &'a String>) -> bool {
        let Some(push) = self.push.as_ref() else {
            return false;
        };
        for entry in entries {
            let Some(owner) = owner_of(entry) else {
                continue;
            };
            match push.send(Some(kind), entry, owner) {
                Ok(true) => return true,
                Ok(false) => {}
                Err(e) => {
                    self.degrade("cannot wake a waiting process", &e);
                    return false;
                }
            }
        }
        false
    }

    /// Deletes this process's `entry`.
    fn leave(&self, entry: &str) {
        self.forget(entry);
        self.delete(entry);
    }

    /// Takes this process's `entry` out of its queue records, not yet off the disk; answers
    /// its key, `None` for an entry it does not know.
    ///
    /// A process granted a key by a hand-over forgets the entry, wakes the waiter, and only
    /// then deletes the file ([`delete`](Self::delete)), so the wake-up does not wait for the
    /// unlink (about 20 µs). Forgotten first, because a grant that ended while this process
    /// was paused sends the waiter to claim, and a claim that finds the key held must queue
    /// anew, under a new entry, not write into the one being deleted. Until the file is gone
    /// a release may still find it, but only a release of this process (the key is granted
    /// to its holder), which passes over an entry of its own that no waiter wants
    /// (`next_in_line`).
    fn forget(&self, entry: &str) -> Option<StoreKey> {
        self.push
            .as_ref()?
            .queued
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove_entry(entry)
    }

    /// Deletes the file of this process's `entry`.
    fn delete(&self, entry: &str) {
        if let Some(push) = self.push.as_ref() {
            push.delete(entry);
        }
    }

    /// The receiving thread: turns messages into wake-ups until told to stop.
    fn receive(&self, socket: UnixDatagram) {
        let mut watches: HashMap<String, Instant> = HashMap::new();
        let mut buffer = [0u8; MAX_MESSAGE];
        loop {
            let timeout = watches
                .values()
                .min()
                .map(|at| at.saturating_duration_since(Instant::now()))
                .map(|left| left.max(Duration::from_millis(1)));
            if let Err(e) = socket.set_read_timeout(timeout) {
                return self.degrade("cannot wait for messages", &e);
            }
            match socket.recv(&mut buffer) {
                Ok(n) => match Kind::parse(&buffer[..n]) {
                    Some((Kind::Stop, _)) => return,
                    Some((Kind::Turn, entry)) => {
                        watches.remove(entry);
                        self.turn(entry);
                    }
                    Some((Kind::Granted, text)) => {
                        if let Some((entry, fence, holder)) = parse_grant(text) {
                            watches.remove(entry);
                            // Granted: the process leaves the queue, as after a claim that
                            // granted (see `forget`).
                            if let Some(key) = self.forget(entry) {
                                self.take_grant(key, holder, fence);
                                self.delete(entry);
                            }
                        }
                    }
                    Some((Kind::Next, entry)) => {
                        watches.insert(entry.to_owned(), Instant::now() + NEXT_IN_LINE_WATCH);
                    }
                    // Empty (a sweep asking whether this process lives) or unknown.
                    None => {}
                },
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock
                            | io::ErrorKind::TimedOut
                            | io::ErrorKind::Interrupted
                    ) => {}
                Err(e) => return self.degrade("cannot receive messages", &e),
            }
            let now = Instant::now();
            watches.retain(|entry, at| {
                if *at > now {
                    return true;
                }
                if let Some(key) = self.key_of(entry) {
                    self.hub.notify(&key);
                }
                false
            });
        }
    }

    /// A release granted `key` to `holder` of this process with `fence`: the core's
    /// [`Handoffs`] wakes its waiter, or, when the holder no longer waits, the grant is given
    /// back (a release as that holder, which hands the key on).
    fn take_grant(&self, key: StoreKey, holder: Holder, fence: Fence) {
        if !self.hub.is_waiting(&key, &holder) {
            give_back(&self.attached, key, holder);
            return;
        }
        // Handoffs keeps a timer per hand-over: it runs in a runtime of this process's stores.
        match Handle::try_current()
            .ok()
            .or_else(|| attached_store(&self.attached).map(|(_, h)| h))
        {
            Some(handle) => {
                let _entered = handle.enter();
                self.handoffs.arrived(ADDRESS, key, holder, fence);
            }
            None => give_back(&self.attached, key, holder),
        }
    }

    fn key_of(&self, entry: &str) -> Option<StoreKey> {
        let push = self.push.as_ref()?;
        let queued = push.queued.lock().unwrap_or_else(|p| p.into_inner());
        queued.by_entry.get(entry).cloned()
    }

    /// A turn for this process's `entry`, from another process: wakes its waiters, or
    /// passes the turn on when none wants the key any more.
    fn turn(&self, entry: &str) {
        if let Some(key) = self.key_of(entry)
            && self.hub.has_waiters(&key)
        {
            self.hub.notify(&key);
            return;
        }
        self.leave(entry);
        if let Some(hash) = entry.split('.').next() {
            self.pass_turn(hash);
        }
    }
}

/// The text of an entry that names its waiting holder: `<ttl ns>\n<holder>`.
fn waiter_text((holder, ttl): (&Holder, i64)) -> String {
    format!("{ttl}\n{}", holder.as_str())
}

/// The fields of a hand-over message's text: `<entry>\n<fence>\n<holder>`.
fn parse_grant(text: &str) -> Option<(&str, Fence, Holder)> {
    let mut fields = text.splitn(3, '\n');
    let (entry, fence, holder) = (fields.next()?, fields.next()?, fields.next()?);
    let fence: u64 = fence.parse().ok().filter(|f| *f > 0)?;
    (owner_of(entry).is_some() && !holder.is_empty()).then(|| {
        (
            entry,
            Fence::new(fence),
            Holder::from_stored(holder.to_owned()),
        )
    })
}

/// A random number for this process's id: the pid alone may be reused by a later process
/// while an entry of the earlier one is left.
fn rand_u64() -> u64 {
    use std::collections::hash_map::RandomState;
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = RandomState::new().build_hasher();
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    hasher.finish()
}

fn unavailable(file: &Path, dir: &Path, error: &io::Error) {
    telemetry::emit(
        &events::STORE_PUSH_LOST,
        None,
        format_args!(
            "release wake-ups across processes on SQLite file {} are unavailable: cannot set up {}: {error}; waiters in this process poll",
            file.display(),
            dir.display()
        ),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(s: &str) -> StoreKey {
        StoreKey::from_stored(s.to_owned())
    }

    #[test]
    fn one_instance_per_path_while_in_use() {
        let dir = tempfile::tempdir().unwrap();
        let (a_path, b_path) = (dir.path().join("a.db"), dir.path().join("b.db"));
        let a = for_file(&a_path);
        let again = for_file(&a_path);
        assert!(Arc::ptr_eq(&a, &again));
        let b = for_file(&b_path);
        assert!(!Arc::ptr_eq(&a, &b));
        assert!(
            directory_of(&a_path)
                .join(socket_name(&a.shared.push.as_ref().unwrap().id))
                .exists()
        );
        drop((a, again));
        let fresh = for_file(&dir.path().join("c.db"));
        let files = registry().lock().unwrap();
        assert!(!files.contains_key(&a_path), "unused instances are dropped");
        drop((files, b, fresh));
        assert_eq!(
            std::fs::read_dir(directory_of(&a_path)).unwrap().count(),
            0,
            "a dropped instance deletes its socket"
        );
    }

    #[test]
    fn entry_names_carry_their_owner() {
        let entry = format!("{}.{:016x}.123-abc", key_hash(&key("ns:lock:a")), 42u64);
        assert_eq!(owner_of(&entry), Some("123-abc"));
        assert_eq!(owner_of("p.123-abc"), None);
        assert_eq!(owner_of("short.0000000000000001.x"), None);
        assert_ne!(key_hash(&key("ns:lock:a")), key_hash(&key("ns:lock:b")));
    }

    #[test]
    fn a_path_too_long_for_a_socket_address_means_polling() {
        let dir = tempfile::tempdir().unwrap();
        let deep = dir.path().join("d".repeat(110));
        std::fs::create_dir(&deep).unwrap();
        let wakeups = for_file(&deep.join("x.db"));
        assert_eq!(
            wakeups.poll(Duration::from_secs(1)),
            Some(Duration::from_secs(1))
        );
        assert_eq!(wakeups.handoff(), None, "a polling process takes no turns");
    }

    #[test]
    fn a_directory_that_cannot_be_made_means_polling() {
        let dir = tempfile::tempdir().unwrap();
        // A regular file where the directory would be.
        let file = dir.path().join("x.db");
        std::fs::write(directory_of(&file), b"").unwrap();
        let wakeups = for_file(&file);
        assert_eq!(
            wakeups.poll(Duration::from_millis(15)),
            Some(Duration::from_millis(15))
        );
        // Releases still wake this process's waiters.
        let mut waiter = wakeups.hub().subscribe(&key("k"));
        wakeups.released(&key("k"));
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        runtime.block_on(async {
            tokio::time::timeout(Duration::from_secs(5), waiter.released())
                .await
                .expect("a local release wakes a local waiter while polling");
        });
    }
}
