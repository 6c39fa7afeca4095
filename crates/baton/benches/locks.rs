//! Lock benchmarks: uncontended acquire+release throughput and contended handoff, for the
//! memory and SQLite stores, each figure a ratio against a baseline measured in the same
//! run (DESIGN §9).
//!
//! ```text
//! cargo bench -p baton --bench locks              # full run (about a minute)
//! cargo bench -p baton --bench locks -- --quick   # short run (or BATON_BENCH_QUICK=1)
//! cargo bench -p baton --bench locks -- --only sqlite
//! ```
//!
//! Baselines:
//! - uncontended memory: the store's own atoms (`claim` + `release` on the `LeaseStore`,
//!   a fresh holder token per pair, as a lock uses) — the ratio is the cost of the policy
//!   layer (options check, guard, watchdog task, release task);
//! - uncontended SQLite: a raw rusqlite loop running the store's SQL with its pragmas,
//!   transaction shape and async-to-blocking hop, by hand — the ratio store/raw is the
//!   store's overhead over its driver (target >= 0.8);
//! - contended: handoff latency is absolute (time from a release being sent to the next
//!   grant to a *different* contender); the memory store is the reference for SQLite.
//!
//! Subject and baseline run in alternating slices (the order rotating each round), so drift
//! on a loaded machine hits both; a throughput figure is the median of its slices, and a
//! ratio is the median of the per-round ratios. Everything runs in a task on a runtime
//! worker, as a service's handlers do. Benchmarks are not tests: nothing here asserts.
//!
//! `BATON_BENCH_DIR` chooses where the SQLite files go (default: the system temp dir); the
//! SQLite figures with `synchronous=FULL` measure that disk's fsync as much as baton.

#[path = "locks/raw_sqlite.rs"]
mod raw_sqlite;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use baton::lock::{LockOptions, Locks};
use baton::store::MemoryStore;
use baton::store::{Claim, HolderInfo, LeaseRequest, LeaseStore, Release, Renewal, Wakeups};
use baton::{Baton, Namespace};
use baton_core::time::Ttl;
use baton_core::{Holder, Key, KeyKind, StoreKey};
use baton_sqlite::{SqliteOptions, SqliteStore, Synchronous};
use baton_testkit::stats::{BenchArgs, jain, median, ms, percentile, thousands};

use raw_sqlite::RawSqlite;

/// Contenders in the handoff run.
const CONTENDERS: usize = 8;
/// How long each holder holds, and stays away between attempts.
const HOLD: Duration = Duration::from_millis(1);
const AWAY: Duration = Duration::from_millis(1);
/// The TTL of every grant: far above any hold, so nothing expires.
const TTL: Duration = Duration::from_secs(30);

#[derive(Debug, Clone)]
struct Settings {
    quick: bool,
    only: Option<String>,
    /// Alternating slices per throughput figure.
    slices: usize,
    slice: Duration,
    handoff_for: Duration,
}

impl Settings {
    fn from_args() -> Settings {
        let args = BenchArgs::from_env();
        let (quick, only) = (args.quick(), args.value("--only"));
        if quick {
            Settings {
                quick,
                only,
                slices: 3,
                slice: Duration::from_millis(300),
                handoff_for: Duration::from_secs(1),
            }
        } else {
            Settings {
                quick,
                only,
                slices: 7,
                slice: Duration::from_secs(1),
                handoff_for: Duration::from_secs(5),
            }
        }
    }

    fn runs(&self, store: &str) -> bool {
        self.only.as_deref().is_none_or(|only| only == store)
    }
}

fn main() {
    let settings = Settings::from_args();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    // Run on a worker thread, as a service's request handlers do: from `block_on` every
    // task the lock spawns (watchdog, release) would be a cross-thread hop.
    runtime
        .block_on(runtime.spawn(run(settings)))
        .expect("the benchmark panicked");
}

async fn run(settings: Settings) {
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!(
        "baton lock benchmarks: {cores} cores, tokio multi-thread runtime with 2 workers, {} run \
         ({} alternating slices of {:?} per throughput figure, handoff for {:?})",
        if settings.quick { "quick" } else { "full" },
        settings.slices,
        settings.slice,
        settings.handoff_for,
    );
    let mut throughput = Vec::new();
    let mut handoffs = Vec::new();

    if settings.runs("memory") {
        let store = Arc::new(MemoryStore::new());
        add_group(&mut throughput, uncontended_memory(&settings, &store).await);
        handoffs.push(handoff("memory", &settings, store).await);
    }

    if settings.runs("sqlite") {
        let dir = match std::env::var_os("BATON_BENCH_DIR") {
            Some(dir) => tempfile::tempdir_in(dir),
            None => tempfile::tempdir(),
        }
        .expect("a temporary directory");
        for synchronous in [Synchronous::Full, Synchronous::Normal] {
            let options = SqliteOptions::new().synchronous(synchronous);
            add_group(
                &mut throughput,
                uncontended_sqlite(&settings, dir.path(), &options).await,
            );
        }
        let store = SqliteStore::open(dir.path().join("handoff.db"), SqliteOptions::new())
            .await
            .expect("open the SQLite store");
        handoffs.push(handoff("sqlite, FULL", &settings, Arc::new(store)).await);
    }

    print_throughput(&throughput);
    print_handoffs(&handoffs);
}

/// Appends a group of rows whose baselines index into the group.
fn add_group(rows: &mut Vec<Row>, group: Vec<Row>) {
    let offset = rows.len();
    rows.extend(group.into_iter().map(|mut row| {
        row.baseline = row.baseline.map(|i| i + offset);
        row
    }));
}

/// A subject's slices (in round order), their median and their range.
#[derive(Debug, Clone)]
struct Figure {
    slices: Vec<f64>,
    median: f64,
    min: f64,
    max: f64,
}

/// One throughput figure.
struct Row {
    store: &'static str,
    subject: &'static str,
    figure: Figure,
    /// Index of the row this one is a ratio of (within its group, see [`add_group`]).
    baseline: Option<usize>,
}

/// What one slice of acquire+release pairs runs.
enum Pairs<'a> {
    /// `Locks::acquire` + `LockGuard::release`.
    Locks(&'a Locks),
    /// `LeaseStore::claim` + `LeaseStore::release` with a fresh holder per pair.
    Atoms(&'a dyn LeaseStore, &'a StoreKey),
    /// The store's SQL by hand.
    Raw(&'a RawSqlite),
}

impl Pairs<'_> {
    async fn pair(&self) {
        match self {
            Pairs::Locks(locks) => {
                let guard = locks
                    .acquire("bench", &LockOptions::new(TTL))
                    .await
                    .expect("uncontended acquire");
                guard.release().await;
            }
            Pairs::Atoms(store, key) => {
                let holder = Holder::random();
                let ttl = Ttl::new(TTL).expect("valid ttl");
                match store.claim(key, LeaseRequest::new(&holder, ttl)).await {
                    Ok(Claim::Granted { .. }) => {}
                    other => panic!("uncontended claim answered {other:?}"),
                }
                match store.release(key, &holder).await {
                    Ok(Release::Removed) => {}
                    other => panic!("release answered {other:?}"),
                }
            }
            Pairs::Raw(raw) => {
                let ttl = Ttl::new(TTL).expect("valid ttl");
                raw.pair(
                    Holder::random().as_str().to_owned(),
                    ttl.as_millis() as i64 * 1_000_000,
                )
                .await;
            }
        }
    }

    /// Pairs per second over one slice.
    async fn slice(&self, length: Duration) -> f64 {
        let start = Instant::now();
        let mut pairs = 0u64;
        while start.elapsed() < length {
            for _ in 0..8 {
                self.pair().await;
            }
            pairs += 8;
        }
        pairs as f64 / start.elapsed().as_secs_f64()
    }
}

/// Runs every subject in alternating slices; the median per subject.
async fn alternate(settings: &Settings, subjects: &[Pairs<'_>]) -> Vec<Figure> {
    // Warm up: caches, the database file, the allocator.
    for subject in subjects {
        subject.slice(settings.slice / 4).await;
    }
    let mut results = vec![Vec::new(); subjects.len()];
    for round in 0..settings.slices {
        // Rotate who goes first, so no subject always follows the same one.
        for i in (0..subjects.len()).map(|i| (i + round) % subjects.len()) {
            results[i].push(subjects[i].slice(settings.slice).await);
        }
    }
    results
        .iter()
        .map(|r| Figure {
            slices: r.clone(),
            median: median(r),
            min: r.iter().copied().fold(f64::INFINITY, f64::min),
            max: r.iter().copied().fold(0.0, f64::max),
        })
        .collect()
}

fn lock_key(key: &str) -> StoreKey {
    Namespace::default().qualify(KeyKind::Lock, &Key::new(key).expect("valid key"))
}

async fn uncontended_memory(settings: &Settings, store: &Arc<MemoryStore>) -> Vec<Row> {
    let baton = Baton::from_store(Arc::clone(store), Namespace::default());
    let key = lock_key("bench-atoms");
    let figures = alternate(
        settings,
        &[Pairs::Locks(baton.locks()), Pairs::Atoms(&**store, &key)],
    )
    .await;
    vec![
        Row {
            store: "memory",
            subject: "baton::lock::Locks acquire+release",
            figure: figures[0].clone(),
            baseline: Some(1),
        },
        Row {
            store: "memory",
            subject: "store atoms claim+release",
            figure: figures[1].clone(),
            baseline: None,
        },
    ]
}

async fn uncontended_sqlite(settings: &Settings, dir: &Path, options: &SqliteOptions) -> Vec<Row> {
    let store_name = match options.get_synchronous() {
        Synchronous::Normal => "sqlite, synchronous=NORMAL",
        _ => "sqlite, synchronous=FULL (default)",
    };
    let tag = options.get_synchronous().as_sql().to_lowercase();
    let store = Arc::new(
        SqliteStore::open(dir.join(format!("store-{tag}.db")), options.clone())
            .await
            .expect("open the SQLite store"),
    );
    let baton = Baton::from_store(Arc::clone(&store), Namespace::default());
    let key = lock_key("bench-atoms");
    // The raw loop gets a file of its own, created (schema and all) by the store.
    let raw_path = dir.join(format!("raw-{tag}.db"));
    drop(
        SqliteStore::open(&raw_path, options.clone())
            .await
            .expect("create the raw loop's file"),
    );
    let raw = RawSqlite::open(&raw_path, options, lock_key("bench-raw").as_str());
    let figures = alternate(
        settings,
        &[
            Pairs::Locks(baton.locks()),
            Pairs::Atoms(&*store, &key),
            Pairs::Raw(&raw),
        ],
    )
    .await;
    vec![
        Row {
            store: store_name,
            subject: "baton::lock::Locks acquire+release",
            figure: figures[0].clone(),
            baseline: Some(2),
        },
        Row {
            store: store_name,
            subject: "store atoms claim+release",
            figure: figures[1].clone(),
            baseline: Some(2),
        },
        Row {
            store: store_name,
            subject: "raw rusqlite, same SQL and hops",
            figure: figures[2].clone(),
            baseline: None,
        },
    ]
}

/// A store that counts the atoms the policy layer calls.
#[derive(Debug)]
struct Counting {
    inner: Arc<dyn LeaseStore>,
    calls: AtomicU64,
}

#[async_trait]
impl LeaseStore for Counting {
    async fn claim(&self, key: &StoreKey, request: LeaseRequest<'_>) -> baton::Result<Claim> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.inner.claim(key, request).await
    }

    async fn renew(&self, key: &StoreKey, holder: &Holder, ttl: Ttl) -> baton::Result<Renewal> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.inner.renew(key, holder, ttl).await
    }

    async fn release(&self, key: &StoreKey, holder: &Holder) -> baton::Result<Release> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.inner.release(key, holder).await
    }

    async fn inspect(&self, key: &StoreKey) -> baton::Result<Option<HolderInfo>> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.inner.inspect(key).await
    }

    async fn list(&self, prefix: &str, limit: usize) -> baton::Result<Vec<HolderInfo>> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.inner.list(prefix, limit).await
    }

    fn wakeups(&self) -> Wakeups {
        self.inner.wakeups()
    }
}

/// One grant seen by a contender.
struct Grant {
    contender: usize,
    granted: Instant,
    release_sent: Instant,
}

/// The contended figures of one store.
struct Handoff {
    store: &'static str,
    grants: usize,
    per_sec: f64,
    handoffs: Vec<Duration>,
    regrants: usize,
    calls_per_grant: f64,
    shares: Vec<u64>,
}

async fn handoff(
    store_name: &'static str,
    settings: &Settings,
    store: Arc<dyn LeaseStore>,
) -> Handoff {
    let counting = Arc::new(Counting {
        inner: store,
        calls: AtomicU64::new(0),
    });
    let locks = Locks::new(Arc::clone(&counting) as Arc<dyn LeaseStore>);
    let options = LockOptions::new(TTL).wait(Duration::from_secs(60));
    let start = Instant::now();
    let stop_at = start + settings.handoff_for;
    let mut tasks = Vec::new();
    for contender in 0..CONTENDERS {
        let (locks, options) = (locks.clone(), options.clone());
        tasks.push(tokio::spawn(async move {
            let mut grants = Vec::new();
            while Instant::now() < stop_at {
                let guard = locks
                    .acquire("handoff", &options)
                    .await
                    .expect("a contended acquire within 60 s");
                let granted = Instant::now();
                tokio::time::sleep(HOLD).await;
                let release_sent = Instant::now();
                guard.release().await;
                grants.push(Grant {
                    contender,
                    granted,
                    release_sent,
                });
                tokio::time::sleep(AWAY).await;
            }
            grants
        }));
    }
    let mut grants = Vec::new();
    for task in tasks {
        grants.extend(task.await.expect("a contender panicked"));
    }
    let elapsed = start.elapsed();
    grants.sort_by_key(|g| g.granted);

    let mut handoffs = Vec::new();
    let mut regrants = 0;
    for pair in grants.windows(2) {
        if pair[0].contender == pair[1].contender {
            regrants += 1;
        } else {
            handoffs.push(
                pair[1]
                    .granted
                    .saturating_duration_since(pair[0].release_sent),
            );
        }
    }
    handoffs.sort();
    let mut shares = vec![0u64; CONTENDERS];
    for grant in &grants {
        shares[grant.contender] += 1;
    }
    Handoff {
        store: store_name,
        grants: grants.len(),
        per_sec: grants.len() as f64 / elapsed.as_secs_f64(),
        handoffs,
        regrants,
        calls_per_grant: counting.calls.load(Ordering::Relaxed) as f64 / grants.len().max(1) as f64,
        shares,
    }
}

/// The median over rounds of `subject / baseline` within each round: the slices of one
/// round run back to back, so drift on a loaded machine (or a slow disk's bad second)
/// mostly cancels.
fn paired_ratio(subject: &Figure, baseline: &Figure) -> f64 {
    let ratios: Vec<f64> = subject
        .slices
        .iter()
        .zip(&baseline.slices)
        .map(|(s, b)| s / b)
        .collect();
    median(&ratios)
}

fn print_throughput(rows: &[Row]) {
    if rows.is_empty() {
        return;
    }
    println!(
        "\nUncontended acquire+release pairs/s (one task, one key; median of the slices, and their range)"
    );
    println!(
        "{:<34} {:<32} {:>10} {:>21}  ratio (median of per-round ratios)",
        "store", "subject", "pairs/s", "slices min..max"
    );
    for row in rows {
        let ratio = match row.baseline {
            Some(i) => {
                let ratio = paired_ratio(&row.figure, &rows[i].figure);
                format!("{ratio:.2} of {}", rows[i].subject)
            }
            None => "baseline".to_owned(),
        };
        println!(
            "{:<34} {:<32} {:>10} {:>21}  {ratio}",
            row.store,
            row.subject,
            thousands(row.figure.median),
            format!(
                "{}..{}",
                thousands(row.figure.min),
                thousands(row.figure.max)
            ),
        );
    }
}

fn print_handoffs(runs: &[Handoff]) {
    if runs.is_empty() {
        return;
    }
    println!(
        "\nContended: {CONTENDERS} contenders on one key, hold {}, {} away between attempts",
        ms(HOLD),
        ms(AWAY)
    );
    println!(
        "{:<12} {:>9} {:>8} {:>9} {:>10} {:>10} {:>10} {:>11} {:>6}  share per contender (%)",
        "store", "grants/s", "grants", "handoffs", "p50", "p99", "max", "calls/grant", "Jain",
    );
    let reference = runs.iter().find(|r| r.store == "memory");
    for run in runs {
        let total: u64 = run.shares.iter().sum();
        let shares: Vec<String> = run
            .shares
            .iter()
            .map(|&s| format!("{:.1}", 100.0 * s as f64 / total.max(1) as f64))
            .collect();
        println!(
            "{:<12} {:>9} {:>8} {:>9} {:>10} {:>10} {:>10} {:>11.2} {:>6.3}  {}",
            run.store,
            thousands(run.per_sec),
            run.grants,
            run.handoffs.len(),
            ms(percentile(&run.handoffs, 0.50)),
            ms(percentile(&run.handoffs, 0.99)),
            ms(percentile(&run.handoffs, 1.0)),
            run.calls_per_grant,
            jain(&run.shares),
            shares.join(" "),
        );
        if run.regrants > 0 {
            println!(
                "        ({} grants went back to the contender that had just released)",
                run.regrants
            );
        }
    }
    if let Some(reference) = reference {
        for run in runs.iter().filter(|r| r.store != "memory") {
            println!(
                "{}: grants/s {:.2} of memory, handoff p50 {:.2}x memory's",
                run.store,
                run.per_sec / reference.per_sec,
                percentile(&run.handoffs, 0.5).as_secs_f64()
                    / percentile(&reference.handoffs, 0.5).as_secs_f64(),
            );
        }
    }
}
