//! PostgreSQL lock benchmarks against a private server (started by `baton-testkit`, with
//! `fsync` on as in production): uncontended acquire+release throughput as a ratio to a
//! raw-SQL baseline, and contended handoff latency with and without `LISTEN`/`NOTIFY`
//! (DESIGN §9).
//!
//! ```text
//! cargo bench -p baton-postgres --bench postgres_locks              # full run (about 2 minutes)
//! cargo bench -p baton-postgres --bench postgres_locks -- --quick   # short run (or BATON_BENCH_QUICK=1)
//! ```
//!
//! Uncontended: C tasks (C = 1, 16) share one store, each taking and giving back a key of
//! its own, as fast as it can. Subjects:
//! - `baton::lock::Locks` acquire + `LockGuard::release` (options check, guard, watchdog task,
//!   telemetry, the store's claim and release statements);
//! - the store's atoms, `LeaseStore::claim` + `release` with a fresh holder per pair (the
//!   statements, their parsing and the per-call deadline, without the policy layer);
//! - the baseline: the same two statements (`baton_postgres::sql::CLAIM`, `RELEASE`) bound
//!   and run by hand over a sqlx pool configured like the store's (same size, no test before
//!   acquire), at the same concurrency. Both subjects are reported as a ratio to it.
//!
//! Commit cost: the floor under a handoff, measured on the same server in the same run. One
//! connection runs, interleaved, a `SELECT 1` (a round trip), and a one-row `UPDATE` with
//! `synchronous_commit` on and off; the difference of the two updates is what one WAL flush
//! costs a commit here and now.
//!
//! Contended: 8 contenders on one key, each with connections of its own (as 8 replicas),
//! holding 1 ms and staying away 1 ms between attempts. Handoff latency is the time from
//! one holder sending its release to the next grant returning to a *different* contender.
//! Rows:
//! - `baton::lock::Locks` over 8 stores, woken by `NOTIFY`, with the store's default commits (a
//!   grant waits for its WAL flush, a release does not: one flush per handoff);
//! - the baseline, the same round trips by hand: `sql::CLAIM`, a wait for the key's
//!   notification on a LISTEN connection of its own (or the holder's remaining TTL), and
//!   `sql::RELEASE`, over a pool like the store's;
//! - the same by hand with the release committed synchronously (`sql::RELEASE` without
//!   `sql::ASYNC_COMMIT`, as the store released before): two flushes per handoff, so the
//!   change is measured in the same run;
//! - `baton::lock::Locks` with `durable_grants=off` (nothing in a handoff waits for the disk; the
//!   relaxed setting whose risk `docs/postgres.md` states);
//! - `baton::lock::Locks` with `listen=off` (waiters poll every `poll_interval`, 200 ms by default,
//!   jittered to 50–100 %), with default and with relaxed commits.
//!
//! The rows take turns in slices (3 rounds of 2.5 s each, 1 of 2 s with `--quick`), and
//! each row's samples are pooled.
//!
//! Poolers: the store's atoms (claim + release) at C = 1 and 16 over three stores, in
//! alternating slices, as a ratio to the first: the store as it runs directly (statements
//! named and cached); `pooler=transaction` straight to the server (every statement unnamed in
//! a transaction of its own: the statement form's cost alone); and `pooler=transaction`
//! through a private PgBouncer in `pool_mode = transaction` (what a user behind one pays,
//! the pooler's hop included).
//!
//! Subjects run in alternating slices, so drift on a loaded machine hits all of them; an
//! uncontended throughput figure is the median of its slices, a ratio the median of
//! per-round ratios.
//! Benchmarks are not tests: nothing here asserts.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use baton_core::store::{Claim, LeaseRequest, LeaseStore};
use baton_core::{Holder, Key, KeyKind, LockOptions, Locks, Namespace, StoreKey, Ttl};
use baton_postgres::{PostgresStore, sql};
use baton_testkit::pgbouncer::{PgBouncer, PgBouncerOptions, PoolMode};
use baton_testkit::postgres::{PostgresOptions, PostgresServer};
use baton_testkit::stats::{BenchArgs, median, min_max, percentile};
use sqlx::postgres::{PgConnectOptions, PgListener, PgPoolOptions};
use sqlx::{PgPool, Row};

#[path = "shared/raw_pool.rs"]
mod raw_pool;
use raw_pool::raw_pool;
use tokio::sync::watch;

/// Concurrency levels of the uncontended run.
const CONCURRENCY: [usize; 2] = [1, 16];
/// Contenders in the handoff run.
const CONTENDERS: usize = 8;
const HOLD: Duration = Duration::from_millis(1);
const AWAY: Duration = Duration::from_millis(1);
/// The TTL of every grant: far above any hold, so nothing expires.
const TTL: Duration = Duration::from_secs(30);
/// Pool size of store and baseline alike, so 16 tasks each have a connection.
const POOL: u32 = 16;
/// The store's default: grants wait for their WAL flush, releases do not.
const DEFAULT_COMMITS: &str = "durable grants, asynchronous release (default)";
/// Grants and releases both wait for their flush: two per handoff.
const SYNCHRONOUS_COMMITS: &str = "durable grants, synchronous release";
/// `durable_grants=off`: nothing in a handoff waits for the disk.
const RELAXED_COMMITS: &str = "`durable_grants=off`: nothing waits for the disk";

struct Settings {
    rounds: usize,
    slice: Duration,
    /// The length of one handoff slice; each row runs `handoff_rounds` slices, the rows
    /// taking turns.
    handoff_for: Duration,
    handoff_rounds: usize,
    /// Samples of each statement in the commit-cost probe.
    probes: usize,
}

impl Settings {
    fn from_args() -> Settings {
        if BenchArgs::from_env().quick() {
            Settings {
                rounds: 3,
                slice: Duration::from_millis(500),
                handoff_for: Duration::from_secs(2),
                handoff_rounds: 1,
                probes: 100,
            }
        } else {
            Settings {
                rounds: 7,
                slice: Duration::from_secs(1),
                handoff_for: Duration::from_millis(2500),
                handoff_rounds: 3,
                probes: 400,
            }
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Subject {
    Locks,
    Atoms,
    Raw,
}

impl Subject {
    fn name(self) -> &'static str {
        match self {
            Subject::Locks => "`baton::lock::Locks`",
            Subject::Atoms => "store atoms",
            Subject::Raw => "raw SQL, same statements",
        }
    }
}

fn main() {
    let settings = Settings::from_args();
    let server = PostgresServer::start_with(PostgresOptions::new().durable())
        .expect("a private PostgreSQL server (apt-get install postgresql)");
    let pooler = PgBouncer::start_with(
        &server,
        PgBouncerOptions::new(PoolMode::Transaction).pool_size(POOL),
    )
    .expect("a private PgBouncer (apt-get install pgbouncer)");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        tokio::spawn(run(server.url(), pooler.url(), settings))
            .await
            .expect("the benchmark panicked")
    });
}

async fn run(url: String, pooler_url: String, settings: Settings) {
    let store = Arc::new(
        PostgresStore::connect(&format!("{url}?max_connections={POOL}"))
            .await
            .expect("the store"),
    );
    let raw = raw_pool(&url, POOL).await;

    println!("## Uncontended acquire + release (pairs/s)\n");
    println!("| concurrency | subject | pairs/s (median) | slices min..max | ratio to raw |");
    println!("|---:|---|---:|---:|---:|");
    for concurrency in CONCURRENCY {
        let subjects = [Subject::Locks, Subject::Atoms, Subject::Raw];
        let mut rates: Vec<Vec<f64>> = vec![Vec::new(); subjects.len()];
        for round in 0..settings.rounds {
            for k in 0..subjects.len() {
                let i = (k + round) % subjects.len();
                let rate = slice(subjects[i], concurrency, &store, &raw, settings.slice).await;
                rates[i].push(rate);
            }
        }
        let raw_rates = &rates[2];
        for (i, subject) in subjects.iter().enumerate() {
            let ratios: Vec<f64> = rates[i].iter().zip(raw_rates).map(|(s, r)| s / r).collect();
            let (min, max) = min_max(&rates[i]);
            println!(
                "| {concurrency} | {} | {:.0} | {:.0}..{:.0} | **{:.2}** |",
                subject.name(),
                median(&rates[i]),
                min,
                max,
                median(&ratios)
            );
        }
    }

    poolers(&url, &pooler_url, &store, &raw, &settings).await;

    println!("\n## Commit cost on this server (one connection, interleaved)\n");
    println!("| statement | p50 | p90 |");
    println!("|---|---:|---:|");
    let probe = commit_costs(&raw, settings.probes).await;
    for (name, mut samples) in [
        ("`SELECT 1` (a round trip)", probe.round_trip),
        (
            "one-row `UPDATE`, `synchronous_commit=off`",
            probe.asynchronous,
        ),
        (
            "one-row `UPDATE`, `synchronous_commit=on` (waits for the flush)",
            probe.synchronous,
        ),
    ] {
        samples.sort();
        println!(
            "| {name} | {} | {} |",
            ms(percentile(&samples, 0.50)),
            ms(percentile(&samples, 0.90))
        );
    }

    println!(
        "\n## Handoff, {CONTENDERS} contenders in {CONTENDERS} stores, hold 1 ms, away 1 ms\n"
    );
    println!(
        "| contenders | wake-ups | commits | grants/s | handoffs | handoff p50 | p99 | max | acquire p50 | acquire p99 |"
    );
    println!("|---|---|---|---:|---:|---:|---:|---:|---:|---:|");
    let runs = HandoffRun::all();
    let mut results: Vec<HandoffResult> = runs.iter().map(|_| HandoffResult::default()).collect();
    for round in 0..settings.handoff_rounds {
        for k in 0..runs.len() {
            let i = (k + round) % runs.len();
            let result = handoff(&url, runs[i], settings.handoff_for).await;
            results[i].add(result);
        }
    }
    for (run, result) in runs.iter().zip(&mut results) {
        result.latencies.sort();
        result.waits.sort();
        println!(
            "| {} | {} | {} | {:.0} | {} | {} | {} | {} | {} | {} |",
            run.contenders.name(),
            run.wakeups,
            run.commits,
            result.grants as f64 / result.elapsed.as_secs_f64(),
            result.latencies.len(),
            ms(percentile(&result.latencies, 0.50)),
            ms(percentile(&result.latencies, 0.99)),
            ms(result.latencies.last().copied().unwrap_or_default()),
            ms(percentile(&result.waits, 0.50)),
            ms(percentile(&result.waits, 0.99)),
        );
    }
}

/// Who contends in a handoff run.
#[derive(Clone, Copy, Debug)]
enum Contenders {
    /// `baton::lock::Locks`, each over a `PostgresStore` of its own.
    Locks,
    /// The baseline: the store's round trips by hand, each contender with a pool and a
    /// LISTEN connection of its own (`sql::CLAIM`, wait for the key's notification or the
    /// holder's remaining TTL, hold, release). With `synchronous_release`, the release
    /// statement is `sql::RELEASE` without `sql::ASYNC_COMMIT`: how the store released
    /// before releases were committed asynchronously, so a handoff waited for two flushes.
    ByHand { synchronous_release: bool },
}

impl Contenders {
    fn name(self) -> &'static str {
        match self {
            Contenders::Locks => "`baton::lock::Locks`",
            Contenders::ByHand {
                synchronous_release: false,
            } => "by hand, the store's statements",
            Contenders::ByHand {
                synchronous_release: true,
            } => "by hand, release committed synchronously (as before)",
        }
    }
}

/// One row of the handoff table.
#[derive(Clone, Copy, Debug)]
struct HandoffRun {
    contenders: Contenders,
    wakeups: &'static str,
    commits: &'static str,
    /// baton's options for the stores' URLs.
    query: &'static str,
}

impl HandoffRun {
    fn all() -> [HandoffRun; 6] {
        const NOTIFY: &str = "LISTEN/NOTIFY";
        const POLLING: &str = "polling (listen=off, poll_interval 200ms)";
        [
            HandoffRun {
                contenders: Contenders::Locks,
                wakeups: NOTIFY,
                commits: DEFAULT_COMMITS,
                query: "listen=on",
            },
            HandoffRun {
                contenders: Contenders::ByHand {
                    synchronous_release: false,
                },
                wakeups: NOTIFY,
                commits: DEFAULT_COMMITS,
                query: "",
            },
            HandoffRun {
                contenders: Contenders::ByHand {
                    synchronous_release: true,
                },
                wakeups: NOTIFY,
                commits: SYNCHRONOUS_COMMITS,
                query: "",
            },
            HandoffRun {
                contenders: Contenders::Locks,
                wakeups: NOTIFY,
                commits: RELAXED_COMMITS,
                query: "listen=on&durable_grants=off",
            },
            HandoffRun {
                contenders: Contenders::Locks,
                wakeups: POLLING,
                commits: DEFAULT_COMMITS,
                query: "listen=off",
            },
            HandoffRun {
                contenders: Contenders::Locks,
                wakeups: POLLING,
                commits: RELAXED_COMMITS,
                query: "listen=off&durable_grants=off",
            },
        ]
    }
}

/// What the slices of one handoff row measured, pooled.
#[derive(Default)]
struct HandoffResult {
    grants: u64,
    elapsed: Duration,
    /// Release sent -> next grant returned to a different contender.
    latencies: Vec<Duration>,
    /// Acquire called -> granted.
    waits: Vec<Duration>,
}

impl HandoffResult {
    fn add(&mut self, other: HandoffResult) {
        self.grants += other.grants;
        self.elapsed += other.elapsed;
        self.latencies.extend(other.latencies);
        self.waits.extend(other.waits);
    }
}

/// What the contenders share: the last release (when it was sent and by whom), and the
/// samples.
#[derive(Default)]
struct Shared {
    last: Mutex<Option<(Instant, usize)>>,
    latencies: Mutex<Vec<Duration>>,
    waits: Mutex<Vec<Duration>>,
}

impl Shared {
    /// Records a grant to contender `me`, asked for at `asked`.
    fn granted(&self, me: usize, asked: Instant) {
        let granted = Instant::now();
        self.waits.lock().unwrap().push(granted - asked);
        let previous = *self.last.lock().unwrap();
        if let Some((sent, by)) = previous
            && by != me
            && granted >= sent
        {
            self.latencies.lock().unwrap().push(granted - sent);
        }
    }

    /// Records that contender `me` sends its release now.
    fn releasing(&self, me: usize) {
        *self.last.lock().unwrap() = Some((Instant::now(), me));
    }
}

/// The per-pair cost of `pooler=transaction`, directly and through PgBouncer, as a ratio to
/// the store on a direct connection, in alternating slices of the same run.
async fn poolers(
    url: &str,
    pooler_url: &str,
    direct: &Arc<PostgresStore>,
    raw: &PgPool,
    settings: &Settings,
) {
    let unnamed = Arc::new(
        PostgresStore::connect(&format!(
            "{url}?max_connections={POOL}&pooler=transaction&listen=off"
        ))
        .await
        .expect("the store with pooler=transaction"),
    );
    let through = Arc::new(
        PostgresStore::connect(&format!(
            "{pooler_url}?max_connections={POOL}&pooler=transaction&listen=off"
        ))
        .await
        .expect("the store through PgBouncer"),
    );
    println!("\n## Poolers: store atoms, claim + release (pairs/s)\n");
    println!("| concurrency | store | pairs/s (median) | slices min..max | ratio to direct |");
    println!("|---:|---|---:|---:|---:|");
    let stores = [
        ("direct (named, cached statements)", Arc::clone(direct)),
        ("`pooler=transaction`, direct to the server", unnamed),
        (
            "`pooler=transaction` through PgBouncer 1.18 (transaction mode)",
            through,
        ),
    ];
    for concurrency in CONCURRENCY {
        let mut rates: Vec<Vec<f64>> = vec![Vec::new(); stores.len()];
        for round in 0..settings.rounds {
            for k in 0..stores.len() {
                let i = (k + round) % stores.len();
                let rate = slice(
                    Subject::Atoms,
                    concurrency,
                    &stores[i].1,
                    raw,
                    settings.slice,
                )
                .await;
                rates[i].push(rate);
            }
        }
        for (i, (name, _)) in stores.iter().enumerate() {
            let ratios: Vec<f64> = rates[i].iter().zip(&rates[0]).map(|(s, d)| s / d).collect();
            let (min, max) = min_max(&rates[i]);
            println!(
                "| {concurrency} | {name} | {:.0} | {:.0}..{:.0} | **{:.2}** |",
                median(&rates[i]),
                min,
                max,
                median(&ratios)
            );
        }
    }
}

fn namespace() -> Namespace {
    Namespace::new(format!("bench{:08x}", rand::random::<u32>())).unwrap()
}

fn store_key(ns: &Namespace, key: &str) -> StoreKey {
    ns.qualify(KeyKind::Lock, &Key::new(key).unwrap())
}

/// Pairs per second of `subject` at `concurrency` over `length`.
async fn slice(
    subject: Subject,
    concurrency: usize,
    store: &Arc<PostgresStore>,
    raw: &PgPool,
    length: Duration,
) -> f64 {
    let ns = namespace();
    let deadline = Instant::now() + length;
    let started = Instant::now();
    let tasks: Vec<_> = (0..concurrency)
        .map(|t| {
            let (store, raw, ns) = (Arc::clone(store), raw.clone(), ns.clone());
            tokio::spawn(async move {
                let key = format!("k{t}");
                let qualified = store_key(&ns, &key);
                let locks = Locks::with_namespace(store.clone(), ns);
                let ttl = Ttl::new(TTL).unwrap();
                let options = LockOptions::new(TTL);
                let mut pairs = 0u64;
                while Instant::now() < deadline {
                    match subject {
                        Subject::Locks => {
                            let guard = locks.acquire(&key, &options).await.expect("acquire");
                            guard.release().await;
                        }
                        Subject::Atoms => {
                            let holder = Holder::random();
                            let claim = store
                                .claim(&qualified, LeaseRequest::new(&holder, ttl))
                                .await;
                            assert!(matches!(claim, Ok(Claim::Granted { .. })), "{claim:?}");
                            store.release(&qualified, &holder).await.expect("release");
                        }
                        Subject::Raw => {
                            let holder = Holder::random();
                            sqlx::query(sql::CLAIM)
                                .bind(qualified.as_str())
                                .bind(holder.as_str())
                                .bind(TTL.as_millis() as i64)
                                .bind("")
                                .bind(None::<i32>)
                                .bind(false)
                                .fetch_optional(&raw)
                                .await
                                .expect("claim");
                            sqlx::query(sql::RELEASE)
                                .bind(qualified.as_str())
                                .bind(holder.as_str())
                                .fetch_one(&raw)
                                .await
                                .expect("release");
                        }
                    }
                    pairs += 1;
                }
                pairs
            })
        })
        .collect();
    let mut pairs = 0;
    for task in tasks {
        pairs += task.await.expect("a task panicked");
    }
    pairs as f64 / started.elapsed().as_secs_f64()
}

/// One slice of `run`: 8 contenders on one key for `length`.
async fn handoff(url: &str, run: HandoffRun, length: Duration) -> HandoffResult {
    let ns = namespace();
    let key = store_key(&ns, "hot");
    let shared = Arc::new(Shared::default());
    let sep = if run.query.is_empty() { "" } else { "&" };
    let store_url = format!("{url}?max_connections=2{sep}{}", run.query);
    let mut tasks = Vec::new();
    // Everybody connects first, then the clock starts.
    let mut contenders = Vec::new();
    for _ in 0..CONTENDERS {
        contenders.push(match run.contenders {
            Contenders::Locks => Contender::Locks(Locks::with_namespace(
                Arc::new(
                    PostgresStore::connect(&store_url)
                        .await
                        .expect("a contender's store"),
                ),
                ns.clone(),
            )),
            Contenders::ByHand {
                synchronous_release,
            } => Contender::ByHand(ByHand::connect(url, &key, synchronous_release).await),
        });
    }
    let started = Instant::now();
    let deadline = started + length;
    for (me, contender) in contenders.into_iter().enumerate() {
        let shared = Arc::clone(&shared);
        tasks.push(tokio::spawn(async move {
            let mut grants = 0u64;
            match contender {
                Contender::Locks(locks) => {
                    let options = LockOptions::new(TTL).wait(Duration::from_secs(60));
                    while Instant::now() < deadline {
                        let asked = Instant::now();
                        let Ok(guard) = locks.acquire("hot", &options).await else {
                            continue;
                        };
                        shared.granted(me, asked);
                        grants += 1;
                        tokio::time::sleep(HOLD).await;
                        shared.releasing(me);
                        guard.release().await;
                        tokio::time::sleep(AWAY).await;
                    }
                }
                Contender::ByHand(mut by_hand) => {
                    while Instant::now() < deadline {
                        let asked = Instant::now();
                        let token = by_hand.acquire().await;
                        shared.granted(me, asked);
                        grants += 1;
                        tokio::time::sleep(HOLD).await;
                        shared.releasing(me);
                        by_hand.release(&token).await;
                        tokio::time::sleep(AWAY).await;
                    }
                }
            }
            grants
        }));
    }
    let mut grants = 0;
    for task in tasks {
        grants += task.await.expect("a contender panicked");
    }
    let elapsed = started.elapsed();
    HandoffResult {
        grants,
        elapsed,
        latencies: std::mem::take(&mut *shared.latencies.lock().unwrap()),
        waits: std::mem::take(&mut *shared.waits.lock().unwrap()),
    }
}

enum Contender {
    Locks(Locks),
    ByHand(ByHand),
}

/// A contender doing the store's round trips by hand (see [`Contenders::ByHand`]).
struct ByHand {
    pool: PgPool,
    key: String,
    release_sql: &'static str,
    /// Bumped by the listening task at each notification of `key`.
    released: watch::Receiver<u64>,
    listening: tokio::task::JoinHandle<()>,
}

impl Drop for ByHand {
    fn drop(&mut self) {
        self.listening.abort();
    }
}

impl ByHand {
    async fn connect(url: &str, key: &StoreKey, synchronous_release: bool) -> ByHand {
        let options = url.parse::<PgConnectOptions>().expect("url");
        let pool = PgPoolOptions::new()
            .max_connections(2)
            .test_before_acquire(false)
            .connect_with(options.clone().application_name("baton-bench-by-hand"))
            .await
            .expect("a by-hand pool");
        let mut listener = PgListener::connect_with(&pool).await.expect("a listener");
        listener.listen(sql::CHANNEL).await.expect("LISTEN");
        let (sender, released) = watch::channel(0u64);
        let watched = key.as_str().to_owned();
        let listening = tokio::spawn(async move {
            while let Ok(notification) = listener.recv().await {
                if notification.payload() == watched {
                    sender.send_modify(|generation| *generation += 1);
                }
            }
        });
        let release_sql = if synchronous_release {
            synchronous_release_statement()
        } else {
            sql::RELEASE
        };
        ByHand {
            pool,
            key: key.as_str().to_owned(),
            release_sql,
            released,
            listening,
        }
    }

    /// Claims the key with a fresh token, waiting for releases (or the holder's TTL) while
    /// it is held; returns the token.
    async fn acquire(&mut self) -> String {
        let token = format!("{:032x}", rand::random::<u128>());
        loop {
            // Subscribe before the attempt, as the core does.
            self.released.borrow_and_update();
            let row = sqlx::query(sql::CLAIM)
                .bind(&self.key)
                .bind(&token)
                .bind(TTL.as_millis() as i64)
                .bind("")
                .bind(None::<i32>)
                .bind(false)
                .fetch_optional(&self.pool)
                .await
                .expect("claim");
            let Some(row) = row else { continue };
            if row.get::<bool, _>("claimed") {
                return token;
            }
            let remaining = Duration::from_micros(row.get::<i64, _>("remaining_us").max(0) as u64);
            tokio::select! {
                _ = self.released.changed() => {}
                _ = tokio::time::sleep(remaining + Duration::from_millis(1)) => {}
            }
        }
    }

    async fn release(&self, token: &str) {
        sqlx::query(self.release_sql)
            .bind(&self.key)
            .bind(token)
            .fetch_one(&self.pool)
            .await
            .expect("release");
    }
}

/// `sql::RELEASE` never setting `sql::ASYNC_COMMIT`: the release as the store ran it before
/// releases were committed asynchronously.
fn synchronous_release_statement() -> &'static str {
    static STATEMENT: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    STATEMENT.get_or_init(|| {
        let asynchronous = format!("CASE WHEN n.pid IS NULL THEN {}", sql::ASYNC_COMMIT);
        assert!(sql::RELEASE.contains(&asynchronous), "{}", sql::RELEASE);
        sql::RELEASE.replace(
            &asynchronous,
            &format!("CASE WHEN false THEN {}", sql::ASYNC_COMMIT),
        )
    })
}

/// Latencies of the commit-cost probe.
struct CommitCosts {
    round_trip: Vec<Duration>,
    asynchronous: Vec<Duration>,
    synchronous: Vec<Duration>,
}

/// `samples` of each: a round trip, and a one-row update committed without and with waiting
/// for the WAL flush, interleaved on one connection of `pool`.
async fn commit_costs(pool: &PgPool, samples: usize) -> CommitCosts {
    let mut conn = pool.acquire().await.expect("a probe connection");
    for statement in [
        "CREATE TABLE IF NOT EXISTS baton_bench_probe (id int PRIMARY KEY, n bigint NOT NULL)",
        "INSERT INTO baton_bench_probe VALUES (1, 0) ON CONFLICT (id) DO NOTHING",
    ] {
        sqlx::query(statement)
            .execute(&mut *conn)
            .await
            .expect("probe table");
    }
    let mut costs = CommitCosts {
        round_trip: Vec::with_capacity(samples),
        asynchronous: Vec::with_capacity(samples),
        synchronous: Vec::with_capacity(samples),
    };
    let update = "UPDATE baton_bench_probe SET n = n + 1 WHERE id = 1";
    for _ in 0..samples {
        let started = Instant::now();
        sqlx::query("SELECT 1")
            .execute(&mut *conn)
            .await
            .expect("round trip");
        costs.round_trip.push(started.elapsed());
        for (setting, into) in [
            ("off", &mut costs.asynchronous),
            ("on", &mut costs.synchronous),
        ] {
            sqlx::query("SELECT set_config('synchronous_commit', $1, false)")
                .bind(setting)
                .execute(&mut *conn)
                .await
                .expect("set synchronous_commit");
            let started = Instant::now();
            sqlx::query(update)
                .execute(&mut *conn)
                .await
                .expect("probe update");
            into.push(started.elapsed());
        }
    }
    sqlx::query("RESET synchronous_commit")
        .execute(&mut *conn)
        .await
        .expect("reset");
    costs
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}
