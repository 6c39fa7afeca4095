//! Claimable-work benchmark for the SQLite store: claim+complete items per second with 1, 8
//! and 32 workers at batch sizes 1 and 100, through the store's atoms
//! ([`QueueStore::claim`] + [`QueueStore::complete`]) and through a raw rusqlite loop that
//! runs the very same statements by hand; each figure is a ratio against that baseline,
//! measured in the same run (DESIGN §9). A last table times the enqueue of 10,000 items in
//! one call.
//!
//! ```text
//! cargo bench -p baton-sqlite --bench work              # full run (a few minutes)
//! cargo bench -p baton-sqlite --bench work -- --quick   # short run (or BATON_BENCH_QUICK=1)
//! cargo bench -p baton-sqlite --bench work -- --only 32x1 --sync normal --rounds 9
//! cargo bench -p baton-sqlite --bench work -- --only enqueue
//! ```
//!
//! The raw loop uses the same driver build, statements (`baton_sqlite::work::sql`: [`PEEK`]
//! then [`CLAIM`] in `BEGIN IMMEDIATE`; [`COMPLETE`] in its own), pragmas
//! (`baton_sqlite::sql::pragmas`), open flags and statement cache, clocks, and the same
//! async-to-blocking hop: one `spawn_blocking` per operation, with the one write connection
//! handed over by an async mutex (the store queues its writers on an async semaphore). What
//! it leaves out is what the store adds: input types, the connection pool, busy-deadline
//! bookkeeping, error mapping, and building the `ClaimedItem`s.
//!
//! A slice fills the queue with `K` items (not timed) and times the workers draining it:
//! each worker claims a batch with a fresh token, completes the items one by one, and stops
//! when a claim comes back empty. `K` is calibrated per configuration so a slice lasts about
//! the slice length. Subject and baseline run in alternating slices (order rotating each
//! round) on files of their own; a figure is the median of its slices, a ratio the median of
//! the per-round ratios. Process CPU time per item is reported too: on a busy machine it
//! compares the two far more steadily than wall-clock rates. Everything runs in tasks on a 2-worker tokio runtime, as a
//! service's handlers do. Benchmarks are not tests: nothing here asserts speed.
//!
//! With `synchronous=FULL` (the default) every commit syncs the log, so those rows measure
//! the disk's fsync as much as baton; `NORMAL` rows show the CPU cost. `BATON_BENCH_DIR`
//! chooses where the files go (default: the system temp dir).
//!
//! [`PEEK`]: baton_sqlite::work::sql::PEEK
//! [`CLAIM`]: baton_sqlite::work::sql::CLAIM
//! [`COMPLETE`]: baton_sqlite::work::sql::COMPLETE

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use baton_core::work::QueueStore;
use baton_core::work::store::{ClaimRequest, Enqueued, ItemRef, NewItem, Settle};
use baton_core::{Holder, Key, KeyKind, Namespace, StoreKey, Ttl};
use baton_sqlite::work::{sql as work_sql, wall_ms};
use baton_sqlite::{SqliteOptions, SqliteStore, Synchronous, clock, sql};
use baton_testkit::stats::{BenchArgs, median, thousands};
use rusqlite::{Connection, OpenFlags, params};
use tokio::sync::Mutex;

const WORKERS: [usize; 3] = [1, 8, 32];
const BATCHES: [u32; 2] = [1, 100];
/// Far above any slice: nothing lapses.
const LEASE: Duration = Duration::from_secs(600);
const PAYLOAD: &[u8] = &[0x42; 64];
const ENQUEUE_BATCH: usize = 10_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Only {
    Drain(usize, u32),
    Enqueue,
}

#[derive(Debug, Clone)]
struct Settings {
    quick: bool,
    rounds: usize,
    slice: Duration,
    /// `--only WxB`: just this many workers at this batch size (and no enqueue table);
    /// `--only enqueue`: just the enqueue table.
    only: Option<Only>,
    /// `--sync full|normal`: just this `synchronous` setting.
    sync: Option<Synchronous>,
}

impl Settings {
    fn from_args() -> Settings {
        let args = BenchArgs::from_env();
        let value = |flag: &str| args.value(flag);
        let quick = args.quick();
        let only = value("--only").map(|text| {
            if text == "enqueue" {
                return Only::Enqueue;
            }
            let (workers, batch) = text
                .split_once('x')
                .expect("--only WORKERSxBATCH (e.g. 32x1) or --only enqueue");
            Only::Drain(
                workers.parse().expect("a number of workers"),
                batch.parse().expect("a batch size"),
            )
        });
        let sync = value("--sync").map(|text| match text.as_str() {
            "full" => Synchronous::Full,
            "normal" => Synchronous::Normal,
            other => panic!("--sync full|normal, not {other:?}"),
        });
        let (rounds, slice) = if quick {
            (3, Duration::from_millis(300))
        } else {
            (5, Duration::from_secs(1))
        };
        Settings {
            quick,
            rounds: value("--rounds").map_or(rounds, |r| r.parse().expect("a number of rounds")),
            slice,
            only,
            sync,
        }
    }

    fn runs(&self, workers: usize, batch: u32) -> bool {
        self.only
            .is_none_or(|only| only == Only::Drain(workers, batch))
    }

    fn runs_enqueue(&self) -> bool {
        self.only.is_none_or(|only| only == Only::Enqueue)
    }
}

fn main() {
    let settings = Settings::from_args();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    runtime
        .block_on(runtime.spawn(run(settings)))
        .expect("the benchmark panicked");
}

async fn run(settings: Settings) {
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!(
        "baton SQLite claimable-work benchmark: {cores} cores, tokio multi-thread runtime with 2 \
         workers, {} run ({} alternating rounds, slices of about {:?})",
        if settings.quick { "quick" } else { "full" },
        settings.rounds,
        settings.slice,
    );
    let dir = match std::env::var_os("BATON_BENCH_DIR") {
        Some(dir) => tempfile::tempdir_in(dir),
        None => tempfile::tempdir(),
    }
    .expect("a temporary directory");
    let queue = Namespace::default().qualify(KeyKind::Queue, &Key::new("bench").unwrap());

    let mut rows = Vec::new();
    let mut enqueues = Vec::new();
    for synchronous in [Synchronous::Full, Synchronous::Normal] {
        if settings.sync.is_some_and(|only| only != synchronous) {
            continue;
        }
        let options = SqliteOptions::new().synchronous(synchronous);
        let tag = synchronous.as_sql().to_lowercase();
        let store = Arc::new(
            SqliteStore::open(dir.path().join(format!("store-{tag}.db")), options.clone())
                .await
                .expect("open the store"),
        );
        let raw_path = dir.path().join(format!("raw-{tag}.db"));
        // The raw loop's file is created (schema and all) by a store, then used by hand.
        drop(
            SqliteStore::open(&raw_path, options.clone())
                .await
                .expect("create the raw loop's file"),
        );
        let raw = Arc::new(Raw::open(&raw_path, &options));
        let subjects = [Subject::Store(store), Subject::Raw(raw)];
        for workers in WORKERS {
            for batch in BATCHES {
                if !settings.runs(workers, batch) {
                    continue;
                }
                let run = Config { workers, batch };
                let figures = drain_rounds(&settings, &subjects, &queue, run).await;
                rows.push(Row {
                    synchronous,
                    run,
                    store: figures[0].clone(),
                    raw: figures[1].clone(),
                });
            }
        }
        if settings.runs_enqueue() {
            enqueues.push((synchronous, enqueue_rounds(&settings, &subjects).await));
        }
    }
    print_rows(&rows);
    print_enqueues(&enqueues);
}

#[derive(Debug, Clone, Copy)]
struct Config {
    workers: usize,
    batch: u32,
}

/// What runs the claims and completes.
#[derive(Clone)]
enum Subject {
    /// The store's atoms.
    Store(Arc<SqliteStore>),
    /// The same statements by hand.
    Raw(Arc<Raw>),
}

impl Subject {
    /// Enqueues `n` items (not timed by the throughput slices).
    async fn fill(&self, queue: &StoreKey, n: usize) {
        match self {
            Subject::Store(store) => {
                let items = vec![
                    NewItem {
                        payload: PAYLOAD,
                        dedup: None,
                        delay: Duration::ZERO,
                        max_attempts: 3,
                    };
                    n
                ];
                let answers = store.enqueue(queue, &items).await.expect("enqueue");
                assert!(answers.iter().all(|a| matches!(a, Enqueued::Added(_))));
            }
            Subject::Raw(raw) => raw.enqueue(queue.as_str(), n).await,
        }
    }

    /// Deletes every item of `queue` with a connection of its own (not a store operation;
    /// the same for both subjects, since a write by another connection makes the next
    /// transaction re-read its pages).
    async fn clear(&self, queue: &StoreKey) {
        let path = match self {
            Subject::Store(store) => store.path().to_owned(),
            Subject::Raw(raw) => raw.path.clone(),
        };
        let queue = queue.as_str().to_owned();
        tokio::task::spawn_blocking(move || {
            let conn = Connection::open(path).expect("an admin connection");
            conn.busy_timeout(Duration::from_secs(10)).unwrap();
            conn.execute("DELETE FROM baton_work_item WHERE queue = ?1", [queue])
                .expect("clear");
        })
        .await
        .expect("the blocking task");
    }

    /// One worker: claims and completes until a claim comes back empty. Returns the items
    /// it completed.
    async fn work(self, queue: StoreKey, batch: u32) -> u64 {
        let lease = Ttl::new(LEASE).unwrap();
        let mut done = 0;
        loop {
            let token = Holder::random();
            match &self {
                Subject::Store(store) => {
                    let request = ClaimRequest {
                        token: &token,
                        batch,
                        lease,
                    };
                    let items = store.claim(&queue, request).await.expect("claim");
                    if items.is_empty() {
                        return done;
                    }
                    for item in items {
                        let settled = store
                            .complete(ItemRef::new(&queue, item.id, &token))
                            .await
                            .expect("complete");
                        assert_eq!(settled, Settle::Settled);
                        done += 1;
                    }
                }
                Subject::Raw(raw) => {
                    let ids = raw
                        .claim(queue.as_str(), token.as_str(), lease_ns(lease), batch)
                        .await;
                    if ids.is_empty() {
                        return done;
                    }
                    for id in ids {
                        raw.complete(queue.as_str(), id, token.as_str()).await;
                        done += 1;
                    }
                }
            }
        }
    }

    /// Fills the queue with `n` items, then times `workers` draining it; items per second.
    async fn slice(&self, queue: &StoreKey, run: Config, n: usize) -> Sample {
        self.fill(queue, n).await;
        let (start, cpu) = (Instant::now(), cpu_seconds());
        let tasks: Vec<_> = (0..run.workers)
            .map(|_| tokio::spawn(self.clone().work(queue.clone(), run.batch)))
            .collect();
        let mut done = 0;
        for task in tasks {
            done += task.await.expect("a worker panicked");
        }
        assert_eq!(done, n as u64, "every item was completed once");
        Sample::new(done, start, cpu)
    }
}

/// One slice: items per second, and CPU microseconds per item.
#[derive(Debug, Clone, Copy)]
struct Sample {
    rate: f64,
    cpu_us: f64,
}

impl Sample {
    fn new(items: u64, start: Instant, cpu: f64) -> Sample {
        Sample {
            rate: items as f64 / start.elapsed().as_secs_f64(),
            cpu_us: (cpu_seconds() - cpu) * 1e6 / items as f64,
        }
    }
}

/// CPU time (user + system) this process used so far, in seconds, from `/proc/self/stat`
/// at the usual 100 ticks a second (NaN where there is no `/proc`). Load from other processes
/// barely changes it, so it compares the store with the raw loop where wall-clock rates on
/// a busy machine cannot; the rest of this process idles during a slice.
fn cpu_seconds() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return f64::NAN;
    };
    // The fields after the command name, which is in parentheses and may hold spaces.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or("", |(_, rest)| rest)
        .split_whitespace()
        .collect();
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<f64>().ok());
    match (ticks(11), ticks(12)) {
        (Some(user), Some(system)) => (user + system) / 100.0,
        _ => f64::NAN,
    }
}

fn lease_ns(lease: Ttl) -> i64 {
    lease.as_millis() as i64 * 1_000_000
}

/// A row as [`work_sql::CLAIM`] returns it, `run_at` first: `run_at, id, payload, attempts,
/// max_attempts, dedup_id, last_error`.
type ClaimedRow = (i64, i64, Vec<u8>, i64, i64, Option<String>, String);

/// The store's write path by hand: one connection, handed to one blocking task at a time.
struct Raw {
    conn: Arc<Mutex<Connection>>,
    path: PathBuf,
}

impl Raw {
    /// Opens a connection the way the store opens its connections.
    fn open(path: &Path, options: &SqliteOptions) -> Raw {
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let conn = Connection::open_with_flags(path, flags).expect("open the raw connection");
        conn.set_prepared_statement_cache_capacity(32);
        conn.execute_batch(&sql::pragmas(options))
            .expect("the store's pragmas");
        Raw {
            conn: Arc::new(Mutex::new(conn)),
            path: path.to_owned(),
        }
    }

    /// Runs `op` with the connection on a blocking thread.
    async fn run<T: Send + 'static>(
        &self,
        op: impl FnOnce(&Connection) -> T + Send + 'static,
    ) -> T {
        let conn = Arc::clone(&self.conn).lock_owned().await;
        tokio::task::spawn_blocking(move || op(&conn))
            .await
            .expect("the blocking task")
    }

    fn begin(conn: &Connection) {
        conn.prepare_cached(sql::BEGIN_IMMEDIATE)
            .and_then(|mut s| s.execute([]))
            .expect("begin");
    }

    fn commit(conn: &Connection) {
        conn.prepare_cached(sql::COMMIT)
            .and_then(|mut s| s.execute([]))
            .expect("commit");
    }

    /// [`work_sql::PURGE_DEDUP`] then `n` × [`work_sql::INSERT_ITEM`], in one transaction.
    async fn enqueue(&self, queue: &str, n: usize) {
        let queue = queue.to_owned();
        self.run(move |conn| {
            Raw::begin(conn);
            let wall = wall_ms();
            conn.prepare_cached(work_sql::PURGE_DEDUP)
                .and_then(|mut s| s.execute(params![wall, 64]))
                .expect("purge");
            let mut insert = conn.prepare_cached(work_sql::INSERT_ITEM).expect("insert");
            for _ in 0..n {
                let id: i64 = insert
                    .query_row(params![queue, wall, PAYLOAD, None::<String>, 3u32], |r| {
                        r.get(0)
                    })
                    .expect("insert");
                assert!(id > 0);
            }
            drop(insert);
            Raw::commit(conn);
        })
        .await
    }

    /// [`work_sql::PEEK`]; then [`work_sql::CLAIM`] in `BEGIN IMMEDIATE`, reading every
    /// returned column as the store does. Returns the ids, oldest first.
    async fn claim(&self, queue: &str, token: &str, lease: i64, batch: u32) -> Vec<i64> {
        let (queue, token) = (queue.to_owned(), token.to_owned());
        self.run(move |conn| {
            let any: bool = conn
                .prepare_cached(work_sql::PEEK)
                .and_then(|mut s| {
                    s.query_row(params![queue, wall_ms(), clock::now()], |r| r.get(0))
                })
                .expect("peek");
            if !any {
                return Vec::new();
            }
            Raw::begin(conn);
            let (wall, mono) = (wall_ms(), clock::now());
            let mut rows: Vec<ClaimedRow> = conn
                .prepare_cached(work_sql::CLAIM)
                .and_then(|mut s| {
                    s.query_map(params![queue, wall, mono, token, lease, batch], |r| {
                        Ok((
                            r.get(1)?,
                            r.get(0)?,
                            r.get(2)?,
                            r.get(3)?,
                            r.get(4)?,
                            r.get(5)?,
                            r.get(6)?,
                        ))
                    })?
                    .collect()
                })
                .expect("claim");
            Raw::commit(conn);
            rows.sort_unstable_by_key(|(run_at, id, ..)| (*run_at, *id));
            rows.into_iter().map(|(_, id, ..)| id).collect()
        })
        .await
    }

    /// [`work_sql::COMPLETE`] in `BEGIN IMMEDIATE`.
    async fn complete(&self, queue: &str, id: i64, token: &str) {
        let (queue, token) = (queue.to_owned(), token.to_owned());
        let changed = self
            .run(move |conn| {
                Raw::begin(conn);
                let changed = conn
                    .prepare_cached(work_sql::COMPLETE)
                    .and_then(|mut s| s.execute(params![id, queue, token]))
                    .expect("complete");
                Raw::commit(conn);
                changed
            })
            .await;
        assert_eq!(changed, 1, "the owner completes");
    }
}

/// A subject's slices (in round order) and their median.
#[derive(Debug, Clone)]
struct Figure {
    slices: Vec<f64>,
    median: f64,
}

impl Figure {
    fn new(slices: Vec<f64>) -> Figure {
        Figure {
            median: median(&slices),
            slices,
        }
    }
}

/// A subject's rates and CPU costs over the rounds.
#[derive(Debug, Clone)]
struct Measured {
    rate: Figure,
    cpu_us: Figure,
}

impl Measured {
    fn new(samples: Vec<Sample>) -> Measured {
        Measured {
            rate: Figure::new(samples.iter().map(|s| s.rate).collect()),
            cpu_us: Figure::new(samples.iter().map(|s| s.cpu_us).collect()),
        }
    }
}

/// The median over rounds of `subject / baseline` within each round.
fn paired_ratio(subject: &Figure, baseline: &Figure) -> f64 {
    let ratios: Vec<f64> = subject
        .slices
        .iter()
        .zip(&baseline.slices)
        .map(|(s, b)| s / b)
        .collect();
    median(&ratios)
}

/// Calibrates the slice size on the store, then runs the rounds.
async fn drain_rounds(
    settings: &Settings,
    subjects: &[Subject],
    queue: &StoreKey,
    run: Config,
) -> Vec<Measured> {
    let per_round = run.workers * run.batch as usize;
    // Warm up both, and measure the store's rate to size the slices.
    let warm = per_round.max(100);
    let rate = subjects[0].slice(queue, run, warm).await.rate;
    subjects[1].slice(queue, run, warm).await;
    let target = (rate * settings.slice.as_secs_f64()) as usize;
    let n = target.div_ceil(per_round).max(2) * per_round;
    let mut results = vec![Vec::new(); subjects.len()];
    for round in 0..settings.rounds {
        for i in (0..subjects.len()).map(|i| (i + round) % subjects.len()) {
            results[i].push(subjects[i].slice(queue, run, n).await);
        }
    }
    let measured: Vec<Measured> = results.into_iter().map(Measured::new).collect();
    println!(
        "  {:>2} workers, batch {:>3}: {n} items per slice, store {:.0}/s, raw {:.0}/s",
        run.workers, run.batch, measured[0].rate.median, measured[1].rate.median
    );
    measured
}

/// Times the enqueue of 10,000 items in one call (into a queue of its own, emptied by hand
/// afterwards, not timed); items per second.
async fn enqueue_rounds(settings: &Settings, subjects: &[Subject]) -> Vec<Measured> {
    let queue = Namespace::default().qualify(KeyKind::Queue, &Key::new("bench-enqueue").unwrap());
    let mut results = vec![Vec::new(); subjects.len()];
    for round in 0..settings.rounds {
        for i in (0..subjects.len()).map(|i| (i + round) % subjects.len()) {
            let (start, cpu) = (Instant::now(), cpu_seconds());
            subjects[i].fill(&queue, ENQUEUE_BATCH).await;
            results[i].push(Sample::new(ENQUEUE_BATCH as u64, start, cpu));
            subjects[i].clear(&queue).await;
        }
    }
    results.into_iter().map(Measured::new).collect()
}

struct Row {
    synchronous: Synchronous,
    run: Config,
    store: Measured,
    raw: Measured,
}

fn sync_name(synchronous: Synchronous) -> &'static str {
    match synchronous {
        Synchronous::Normal => "NORMAL",
        _ => "FULL (default)",
    }
}

fn print_rows(rows: &[Row]) {
    if rows.is_empty() {
        return;
    }
    println!(
        "\nClaim+complete: items/s (median of the slices) and store/raw (median of per-round \
         ratios); CPU µs per item (process user+sys) and raw/store CPU (1.00: the store costs \
         what its SQL costs)"
    );
    println!(
        "{:<16} {:>7} {:>5} {:>10} {:>10} {:>9} {:>10} {:>10} {:>9}",
        "synchronous",
        "workers",
        "batch",
        "store/s",
        "raw/s",
        "ratio",
        "store µs",
        "raw µs",
        "CPU ratio"
    );
    for row in rows {
        println!(
            "{:<16} {:>7} {:>5} {:>10} {:>10} {:>9.2} {:>10.1} {:>10.1} {:>9.2}",
            sync_name(row.synchronous),
            row.run.workers,
            row.run.batch,
            thousands(row.store.rate.median),
            thousands(row.raw.rate.median),
            paired_ratio(&row.store.rate, &row.raw.rate),
            row.store.cpu_us.median,
            row.raw.cpu_us.median,
            paired_ratio(&row.raw.cpu_us, &row.store.cpu_us),
        );
    }
}

fn print_enqueues(runs: &[(Synchronous, Vec<Measured>)]) {
    if runs.is_empty() {
        return;
    }
    println!(
        "\nEnqueue of {ENQUEUE_BATCH} items in one call (one transaction): items/s, store/raw, \
         ms per call, CPU µs per item, raw/store CPU"
    );
    println!(
        "{:<16} {:>10} {:>10} {:>9} {:>9} {:>10} {:>10} {:>9}",
        "synchronous", "store/s", "raw/s", "ratio", "store ms", "store µs", "raw µs", "CPU ratio"
    );
    for (synchronous, m) in runs {
        println!(
            "{:<16} {:>10} {:>10} {:>9.2} {:>9.1} {:>10.2} {:>10.2} {:>9.2}",
            sync_name(*synchronous),
            thousands(m[0].rate.median),
            thousands(m[1].rate.median),
            paired_ratio(&m[0].rate, &m[1].rate),
            ENQUEUE_BATCH as f64 / m[0].rate.median * 1e3,
            m[0].cpu_us.median,
            m[1].cpu_us.median,
            paired_ratio(&m[1].cpu_us, &m[0].cpu_us),
        );
    }
}
