//! [`SqliteStore`]: the lease atoms over one SQLite file.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use baton_core::store::{Claim, HolderInfo, LeaseRequest, LeaseStore, Release, Renewal, Wakeups};
use baton_core::{Error, Fence, Holder, Result, StoreKey, Ttl, prefix_upper_bound};
use rusqlite::{Connection, OptionalExtension, Row, params};

use crate::busy;
use crate::clock;
use crate::connection::{Database, Role};
use crate::error::OpError;
use crate::options::SqliteOptions;
use crate::schema::{self, immediate};
use crate::sql;
use crate::url;
use crate::wakeups::{self, FileWakeups, Handover};

/// The embedded store: leases and locks in one SQLite file, safe across the processes of
/// one host.
///
/// Use it when every replica runs on one machine (several workers, cron jobs and CLI
/// invocations on one host), or as the zero-setup default: it needs no server, and grants
/// and fences survive restarts. For replicas on several hosts use the Redis or PostgreSQL
/// store; for tests in one process, `memory://`.
///
/// Most code opens it through `baton::connect("sqlite:///path/to/file.db")`.
///
/// ## Behavior
/// - Each claim, renew and release is one short `BEGIN IMMEDIATE` transaction; processes
///   that find the file locked wait up to `busy_timeout` (then `Unavailable`).
/// - Expiry is decided by the host's monotonic clock, read inside the transaction; wall
///   clock steps change nothing (see [`clock`]).
/// - Fences are kept in the file, per key, across releases, expiry, prune, and re-opening;
///   each is also at least the wall clock in microseconds, so a key starts above its earlier
///   fences in a new file (see [`clock::wall_micros`]).
/// - Every operation first checks that the path still names the file its connection is on.
///   When the file was deleted or replaced, the store moves to the file now at the path
///   (creating it if needed) and emits `baton.sqlite.file_replaced`: a holder's next renewal
///   answers `NotHeld`. Where only the main file was deleted and its `-wal` or `-shm` file
///   is left, no file is built on them: operations fail with `Unavailable` until they are
///   removed.
/// - A release wakes the waiter that has waited longest, in any process on the host, at
///   once: through Unix datagram sockets in the directory `<file>-wake` beside the file (see
///   `wakeups`). Where they cannot be set up, waiters poll every
///   [`poll_interval`](SqliteOptions::poll_interval) instead, and `baton.store.push_lost`
///   says why.
/// - Statements run on tokio's blocking threads; the store must be used inside a tokio
///   runtime.
/// - Store faults are [`ErrorKind::Unavailable`](baton_core::ErrorKind::Unavailable) (busy,
///   I/O) or `Internal` (a corrupt file, a schema from a newer baton), with the SQLite error
///   as the source.
///
/// # Examples
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use baton_core::{Locks, LockOptions};
/// use baton_sqlite::SqliteStore;
///
/// # let dir = tempfile::tempdir().unwrap();
/// # let url = format!("sqlite://{}/baton.db", dir.path().display());
/// let store = SqliteStore::connect(&url).await?; // e.g. "sqlite:///var/lib/app/baton.db"
/// let locks = Locks::new(std::sync::Arc::new(store));
/// let guard = locks.acquire("nightly-report", &LockOptions::new(Duration::from_secs(30))).await?;
/// // ... work, passing guard.fence() to what you write ...
/// guard.release().await;
/// # Ok(()) }
/// ```
pub struct SqliteStore {
    db: Arc<Database>,
    /// Claims made through this store, counted for [`sql::SWEEP`].
    claims: AtomicU64,
}

impl fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqliteStore")
            .field("path", &self.db.path)
            .field("options", &self.db.options)
            .finish()
    }
}

impl SqliteStore {
    /// The open file, for the other capabilities' atoms in this crate.
    pub(crate) fn database(&self) -> &Arc<Database> {
        &self.db
    }

    /// Opens the store named by a `sqlite://` URL: `sqlite:///absolute/path.db` or
    /// `sqlite://relative/path.db`, with options in the query
    /// (`?busy_timeout=5s&synchronous=normal&poll_interval=15ms`, see [`SqliteOptions`]).
    ///
    /// # Errors
    /// `InvalidInput` for a malformed URL, an empty path, or an unknown or bad option; then
    /// as [`open`](Self::open).
    pub async fn connect(url: &str) -> Result<Self> {
        let (path, options) = url::parse(url)?;
        SqliteStore::open(path, options).await
    }

    /// Checks `url` as [`connect`](Self::connect) reads it, path and options, without
    /// touching the file system: how a command line rejects a bad `--store` before it does
    /// anything.
    ///
    /// # Errors
    /// `InvalidInput`, as [`connect`](Self::connect) for the same URL.
    pub fn check_url(url: &str) -> Result<()> {
        let (_path, options) = url::parse(url)?;
        options.validate()
    }

    /// Opens (creating it and its parent directories if needed) the store in the file at
    /// `path`.
    ///
    /// # Errors
    /// - `InvalidInput`: bad options, or `path` is a directory;
    /// - `Unavailable`: the directory or file cannot be created or opened, the file stays
    ///   locked longer than the busy timeout, or the file is missing while the `-wal` or
    ///   `-shm` file of a deleted database is left beside it;
    /// - `Internal`: the file is corrupt, belongs to another application (refused before
    ///   anything in it is changed), or has a schema from a newer baton;
    /// - `Unsupported`: the platform has no monotonic clock shared by processes (not unix).
    pub async fn open(path: impl AsRef<Path>, options: SqliteOptions) -> Result<Self> {
        options.validate()?;
        if !clock::SUPPORTED {
            return Err(Error::unsupported(
                "the SQLite store needs the host's monotonic clock (CLOCK_MONOTONIC), which this platform does not offer; use memory:// or a server store",
            ));
        }
        let path = path.as_ref().to_owned();
        let opened = tokio::task::spawn_blocking(move || open_blocking(path, options)).await;
        match opened {
            Ok(result) => result,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(e) => {
                Err(Error::unavailable("opening the SQLite store was cancelled").with_source(e))
            }
        }
    }

    /// The path of the database file, as given.
    pub fn path(&self) -> &Path {
        &self.db.path
    }

    /// The options the store was opened with.
    pub fn options(&self) -> &SqliteOptions {
        &self.db.options
    }

    /// Frees `key` whoever holds it, as an operator breaking a stuck lock would; the fence
    /// is kept. Its holder learns of it at its next renewal. Returns whether a live grant
    /// was freed.
    ///
    /// # Errors
    /// `Unavailable` or `Internal`, as every operation.
    pub async fn evict(&self, key: &StoreKey) -> Result<bool> {
        let key = key.clone();
        self.db
            .run(Role::Write, "evict", move |conn, db| {
                let (evicted, handover) = immediate(conn, |conn| {
                    let now = clock::now();
                    let evicted = conn
                        .prepare_cached(sql::EVICT)?
                        .execute(params![key.as_str(), now])?
                        == 1;
                    let handover = if evicted {
                        reserve(conn, &key, now, &db.wakeups)?
                    } else {
                        None
                    };
                    Ok((evicted, handover))
                })?;
                if let Some(handover) = handover {
                    db.wakeups.deliver(handover);
                }
                if evicted {
                    db.wakeups.released(&key);
                }
                Ok(evicted)
            })
            .await
    }

    /// Deletes the rows of free and expired keys, and returns how many. The file keeps one
    /// row per key until it is free or expired (so that its fence survives); claims delete
    /// a bounded number of such rows now and then ([`sql::SWEEP`]), and this deletes all of
    /// them at once, for a maintenance job after a burst of short-lived keys. Fences stay strictly
    /// increasing: a pruned key that is claimed again starts above every pruned fence.
    ///
    /// # Errors
    /// `Unavailable` or `Internal`, as every operation.
    pub async fn prune(&self) -> Result<u64> {
        self.db
            .run(Role::Write, "prune", |conn, _| {
                immediate(conn, |conn| {
                    Ok(conn.prepare_cached(sql::PRUNE)?.execute([clock::now()])? as u64)
                })
            })
            .await
    }
}

fn open_blocking(path: PathBuf, options: SqliteOptions) -> Result<SqliteStore> {
    if path.is_dir() {
        return Err(Error::invalid_input(format!(
            "SQLite store path {} is a directory; name the database file, e.g. {}",
            path.display(),
            path.join("baton.db").display()
        )));
    }
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(|e| {
            Error::unavailable(format!(
                "cannot create the directory {} for the SQLite file {}",
                parent.display(),
                path.display()
            ))
            .with_source(e)
        })?;
    }
    let writer = busy::within(options.get_busy_timeout(), || {
        schema::connect(&path, &options)
            .and_then(|(conn, file, _)| schema::prepare(&conn).map(|()| (conn, file)))
    })
    .map_err(|e| e.into_error("opening the store", &path))?;
    let canonical = std::fs::canonicalize(&path).map_err(|e| {
        Error::unavailable(format!(
            "cannot resolve the path of SQLite file {}",
            path.display()
        ))
        .with_source(e)
    })?;
    let wakeups = wakeups::for_file(&canonical);
    let db = Arc::new(Database::new(path, options, Arc::clone(&wakeups), writer));
    wakeups.attach(&db);
    Ok(SqliteStore {
        db,
        claims: AtomicU64::new(0),
    })
}

fn ttl_nanos(ttl: Ttl) -> i64 {
    // At most 30 days: far inside i64 nanoseconds.
    ttl.as_millis() as i64 * 1_000_000
}

fn remaining(expires_at: i64, now: i64) -> Duration {
    Duration::from_nanos(expires_at.saturating_sub(now).max(0) as u64)
}

fn fence(raw: i64) -> Result<Fence, OpError> {
    if raw < 1 {
        return Err(OpError::Corrupt(format!(
            "a stored fence is {raw}; fences start at 1"
        )));
    }
    Ok(Fence::new(raw as u64))
}

/// The row of a key as [`sql::CURRENT`] reads it.
struct Current {
    holder: Option<String>,
    expires_at: i64,
    reason: String,
}

impl Current {
    fn read(conn: &Connection, key: &str) -> Result<Option<Current>, OpError> {
        Ok(conn
            .prepare_cached(sql::CURRENT)?
            .query_row([key], |r| {
                Ok(Current {
                    holder: r.get(0)?,
                    expires_at: r.get(1)?,
                    reason: r.get(2)?,
                })
            })
            .optional()?)
    }

    /// The live holder and its expiry, if any.
    fn live_holder(self, now: i64) -> Option<(String, i64)> {
        match self.holder {
            Some(holder) if self.expires_at > now => Some((holder, self.expires_at)),
            _ => None,
        }
    }

    /// The live holder, or the process the key is reserved for (`handoff:<process>`), and
    /// when that ends.
    fn live_holder_or_reservation(self, now: i64) -> Option<(String, i64)> {
        if self.holder.is_none()
            && self.expires_at > now
            && self.reason.starts_with(wakeups::HANDOFF_PREFIX)
        {
            return Some((self.reason, self.expires_at));
        }
        self.live_holder(now)
    }
}

/// One claim in one write transaction, taking a reservation for this process
/// (`wakeups.handoff()`); queues the process inside it when the key is found held, naming
/// `holder` in its entry when `hand_over` (a release may then grant it the key).
#[allow(clippy::too_many_arguments)]
fn claim(
    conn: &Connection,
    key: &StoreKey,
    holder: &Holder,
    ttl: i64,
    reason: &str,
    sweep: bool,
    hand_over: bool,
    wakeups: &FileWakeups,
) -> Result<Claim, OpError> {
    let waiter = hand_over.then_some((holder, ttl));
    let holder = holder.as_str();
    let queue_key = key;
    let key = key.as_str();
    let handoff = wakeups.handoff();
    immediate(conn, |conn| {
        let now = clock::now();
        if sweep {
            conn.prepare_cached(sql::SWEEP)?
                .execute(params![now, sql::SWEEP_LIMIT])?;
        }
        let granted: Option<i64> = conn
            .prepare_cached(sql::GRANT)?
            .query_row(
                params![key, holder, now, ttl, reason, clock::wall_micros(), handoff],
                |r| r.get(0),
            )
            .optional()?;
        if let Some(raw) = granted {
            return Ok(Claim::Granted { fence: fence(raw)? });
        }
        // GRANT found the key live or reserved for another process; the write lock keeps it
        // so until we commit.
        let Some((current, expires_at)) =
            Current::read(conn, key)?.and_then(|c| c.live_holder_or_reservation(now))
        else {
            return Err(OpError::Corrupt(format!(
                "the grant of {key:?} is neither free nor live"
            )));
        };
        if current == holder {
            let extended: i64 = conn
                .prepare_cached(sql::EXTEND)?
                .query_row(params![key, holder, now, ttl, reason], |r| r.get(0))?;
            return Ok(Claim::Extended {
                fence: fence(extended)?,
            });
        }
        // Before the commit: a release cannot come between this answer and the queue.
        wakeups.held(queue_key, waiter);
        Ok(Claim::Held {
            holder: Holder::from_stored(current),
            remaining: remaining(expires_at, now),
        })
    })
}

fn renew(conn: &Connection, key: &str, holder: &str, ttl: i64) -> Result<Renewal, OpError> {
    immediate(conn, |conn| {
        let now = clock::now();
        let renewed = conn
            .prepare_cached(sql::RENEW)?
            .execute(params![key, holder, now, ttl])?;
        Ok(if renewed == 1 {
            Renewal::Renewed
        } else {
            Renewal::NotHeld
        })
    })
}

/// One release in one write transaction, then what it handed over delivered: the key is
/// granted to the waiting holder of the process next in line, or reserved for that process;
/// either is told.
pub(crate) fn release_and_hand_over(
    conn: &Connection,
    key: &StoreKey,
    holder: &str,
    wakeups: &FileWakeups,
) -> Result<Release, OpError> {
    let (released, handover) = release(conn, key, holder, wakeups)?;
    if let Some(handover) = handover {
        wakeups.deliver(handover);
    }
    Ok(released)
}

/// One release in one write transaction. When it freed the key, the key is handed to the
/// process next in line ([`reserve`]); a grant to be told after the commit is returned.
fn release(
    conn: &Connection,
    key: &StoreKey,
    holder: &str,
    wakeups: &FileWakeups,
) -> Result<(Release, Option<Handover>), OpError> {
    immediate(conn, |conn| {
        let now = clock::now();
        if conn
            .prepare_cached(sql::RELEASE)?
            .execute(params![key.as_str(), holder, now])?
            == 1
        {
            let handover = reserve(conn, key, now, wakeups)?;
            return Ok((Release::Removed, handover));
        }
        let released = match Current::read(conn, key.as_str())?.and_then(|c| c.live_holder(now)) {
            // RELEASE spares only a live grant of someone else.
            Some((by, _)) if by != holder => Release::Reclaimed {
                by: Holder::from_stored(by),
            },
            _ => Release::NoHolder,
        };
        Ok((released, None))
    })
}

/// Inside the transaction that freed `key`: hands it to the process next in line. When its
/// entry names a waiting holder, the key is granted to that holder (with the next fence and
/// its TTL), and the grant is returned, to be told after the commit; otherwise the key is
/// reserved for the process, which is told now.
fn reserve(
    conn: &Connection,
    key: &StoreKey,
    now: i64,
    wakeups: &FileWakeups,
) -> Result<Option<Handover>, OpError> {
    let Some(line) = wakeups.next_in_line(key) else {
        return Ok(None);
    };
    if let Some((holder, ttl)) = line.waiter() {
        let granted: Option<i64> = conn
            .prepare_cached(sql::GRANT)?
            .query_row(
                params![
                    key.as_str(),
                    holder.as_str(),
                    now,
                    ttl,
                    "",
                    clock::wall_micros(),
                    None::<&str>
                ],
                |r| r.get(0),
            )
            .optional()?;
        if let Some(raw) = granted {
            return Ok(Some(wakeups.granted_to(line, fence(raw)?)));
        }
    }
    let reservation = wakeups::HANDOFF_RESERVATION.as_nanos() as i64;
    conn.prepare_cached(sql::RESERVE)?.execute(params![
        key.as_str(),
        now,
        reservation,
        line.handoff()
    ])?;
    wakeups.hand_over(line);
    Ok(None)
}

/// A live grant's columns as [`sql::INSPECT`] and [`sql::LIST`] read them.
struct LiveRow {
    holder: String,
    fence: i64,
    expires_at: i64,
    reason: String,
}

impl LiveRow {
    /// Reads `holder, fence, expires_at, reason` starting at column `first`.
    fn read(row: &Row<'_>, first: usize) -> rusqlite::Result<Self> {
        Ok(LiveRow {
            holder: row.get(first)?,
            fence: row.get(first + 1)?,
            expires_at: row.get(first + 2)?,
            reason: row.get(first + 3)?,
        })
    }

    fn into_info(self, key: StoreKey, now: i64) -> Result<HolderInfo, OpError> {
        Ok(HolderInfo {
            key,
            holder: Holder::from_stored(self.holder),
            fence: fence(self.fence)?,
            remaining: remaining(self.expires_at, now),
            reason: self.reason,
        })
    }
}

fn list(conn: &Connection, prefix: &str, limit: i64) -> Result<Vec<HolderInfo>, OpError> {
    let now = clock::now();
    let rows = match prefix_upper_bound(prefix) {
        Some(upper) => {
            let mut stmt = conn.prepare_cached(sql::LIST)?;
            let rows = stmt.query_map(params![prefix, upper, now, limit], |r| {
                Ok((r.get::<_, String>(0)?, LiveRow::read(r, 1)?))
            })?;
            rows.collect::<rusqlite::Result<Vec<_>>>()?
        }
        None => {
            let mut stmt = conn.prepare_cached(sql::LIST_FROM)?;
            let rows = stmt.query_map(params![prefix, now, limit], |r| {
                Ok((r.get::<_, String>(0)?, LiveRow::read(r, 1)?))
            })?;
            rows.collect::<rusqlite::Result<Vec<_>>>()?
        }
    };
    rows.into_iter()
        .map(|(key, row)| row.into_info(StoreKey::from_stored(key), now))
        .collect()
}

#[async_trait]
impl LeaseStore for SqliteStore {
    async fn claim(&self, key: &StoreKey, request: LeaseRequest<'_>) -> Result<Claim> {
        let (holder, ttl, reason) = (request.holder, request.ttl, request.reason);
        let handoffs = self.db.wakeups.handoffs();
        if let Some(handed) = handoffs.take(key, holder) {
            // Trusted from memory while at least half its TTL is left; an older one is
            // confirmed by the claim below, which finds the key this holder's and extends it.
            if handed.since.elapsed() < ttl.get() / 2 {
                return Ok(Claim::HandedOver {
                    fence: handed.fence,
                    since: handed.since,
                });
            }
        }
        let hand_over = self.db.wakeups.may_hand_over(key, holder);
        if hand_over {
            handoffs.queueing(key, holder, tokio::time::Instant::now());
        }
        let (key, holder, reason) = (key.clone(), holder.clone(), reason.to_owned());
        let sweep = self
            .claims
            .fetch_add(1, Ordering::Relaxed)
            .is_multiple_of(sql::SWEEP_EVERY);
        self.db
            .run(Role::Write, "claim", move |conn, db| {
                let claimed = claim(
                    conn,
                    &key,
                    &holder,
                    ttl_nanos(ttl),
                    &reason,
                    sweep,
                    hand_over,
                    &db.wakeups,
                )?;
                if !matches!(claimed, Claim::Held { .. }) {
                    db.wakeups.granted(&key);
                    db.wakeups.handoffs().granted(&key, &holder);
                }
                Ok(claimed)
            })
            .await
    }

    async fn renew(&self, key: &StoreKey, holder: &Holder, ttl: Ttl) -> Result<Renewal> {
        let (key, holder) = (key.clone(), holder.clone());
        self.db
            .run(Role::Write, "renew", move |conn, _| {
                renew(conn, key.as_str(), holder.as_str(), ttl_nanos(ttl))
            })
            .await
    }

    async fn release(&self, key: &StoreKey, holder: &Holder) -> Result<Release> {
        let (key, holder) = (key.clone(), holder.clone());
        self.db
            .run(Role::Write, "release", move |conn, db| {
                let released = release_and_hand_over(conn, &key, holder.as_str(), &db.wakeups)?;
                if released == Release::Removed {
                    // Here rather than after the await: a caller that stops waiting for the
                    // answer must not leave the waiters asleep.
                    db.wakeups.released(&key);
                }
                Ok(released)
            })
            .await
    }

    async fn inspect(&self, key: &StoreKey) -> Result<Option<HolderInfo>> {
        let key = key.clone();
        self.db
            .run(Role::Read, "inspect", move |conn, _| {
                let now = clock::now();
                let row = conn
                    .prepare_cached(sql::INSPECT)?
                    .query_row(params![key.as_str(), now], |r| LiveRow::read(r, 0))
                    .optional()?;
                row.map(|row| row.into_info(key, now)).transpose()
            })
            .await
    }

    async fn list(&self, prefix: &str, limit: usize) -> Result<Vec<HolderInfo>> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let prefix = prefix.to_owned();
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.db
            .run(Role::Read, "list", move |conn, _| {
                list(conn, &prefix, limit)
            })
            .await
    }

    fn wakeups(&self) -> Wakeups {
        Wakeups {
            hub: Arc::clone(self.db.wakeups.hub()),
            poll: self.db.wakeups.poll(self.db.options.get_poll_interval()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The range query and `starts_with` agree, in SQLite's own order, on keys that a LIKE
    /// would get wrong and on the edges of the code space.
    #[test]
    fn prefix_ranges_match_exactly_the_keys_with_the_prefix() {
        let keys = [
            "a",
            "a%",
            "a_",
            "a%b",
            "a_b",
            "ab",
            "a\u{7f}",
            "a\u{80}",
            "a\u{D7FF}",
            "a\u{E000}",
            "a\u{FFFF}",
            "a\u{10000}",
            "a\u{10FFFF}",
            "a\u{10FFFF}x",
            "b",
            "%",
            "_",
            "\u{10FFFF}",
            "\u{10FFFF}\u{10FFFF}z",
        ];
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch("CREATE TABLE k (key TEXT PRIMARY KEY) WITHOUT ROWID")
            .unwrap();
        for key in keys {
            conn.execute("INSERT INTO k VALUES (?1)", [key]).unwrap();
        }
        let prefixes = [
            "",
            "a",
            "a%",
            "a_",
            "a\u{D7FF}",
            "a\u{FFFF}",
            "a\u{10FFFF}",
            "\u{10FFFF}",
            "%",
            "zz",
        ];
        for prefix in prefixes {
            let found: Vec<String> = match prefix_upper_bound(prefix) {
                Some(upper) => {
                    let mut s = conn
                        .prepare("SELECT key FROM k WHERE key >= ?1 AND key < ?2 ORDER BY key")
                        .unwrap();
                    s.query_map([prefix, &upper], |r| r.get(0))
                        .unwrap()
                        .map(|r| r.unwrap())
                        .collect()
                }
                None => {
                    let mut s = conn
                        .prepare("SELECT key FROM k WHERE key >= ?1 ORDER BY key")
                        .unwrap();
                    s.query_map([prefix], |r| r.get(0))
                        .unwrap()
                        .map(|r| r.unwrap())
                        .collect()
                }
            };
            let mut expected: Vec<String> = keys
                .iter()
                .filter(|k| k.starts_with(prefix))
                .map(|k| k.to_string())
                .collect();
            expected.sort();
            assert_eq!(found, expected, "prefix {prefix:?}");
        }
    }
}
