//! PostgreSQL lock benchmarks against a private server (started by `baton-testkit`, with
//! `fsync` on as in production): uncontended acquire+release throughput as a ratio to a
//! raw-SQL baseline, and contended handoff latency with and without `LISTEN`/`NOTIFY`
//! (DESIGN §9).
//!
//! ```text
//! cargo bench -p baton-postgres --bench postgres_locks              # full run (about 1.5 minutes)
//! cargo bench -p baton-postgres --bench postgres_locks -- --quick   # short run (or BATON_BENCH_QUICK=1)
//! ```
//!
//! Uncontended: C tasks (C = 1, 16) share one store, each taking and giving back a key of
//! its own, as fast as it can. Subjects:
//! - `baton::Locks` acquire + `LockGuard::release` (options check, guard, watchdog task,
//!   telemetry, the store's claim and release statements);
//! - the store's atoms, `LeaseStore::claim` + `release` with a fresh holder per pair (the
//!   statements, their parsing and the per-call deadline, without the policy layer);
//! - the baseline: the same two statements (`baton_postgres::sql::CLAIM`, `RELEASE`) bound
//!   and run by hand over a sqlx pool configured like the store's (same size, no test before
//!   acquire), at the same concurrency. Both subjects are reported as a ratio to it.
//!
//! Contended: 8 contenders on one key, each in a store of its own (as 8 replicas), holding
//! 1 ms and staying away 1 ms between attempts, for a few seconds. Handoff latency is the
//! time from one holder sending its release to the next grant returning to a *different*
//! contender. Runs: `listen=on` (waiters woken by `NOTIFY`) and `listen=off` (waiters poll
//! every `poll_interval`, 200 ms by default, jittered to 50–100 %), each with synchronous
//! commits (the default: every release and grant waits for its WAL flush, so a handoff
//! costs two disk flushes) and with `synchronous_commit=off` set on the connections, which
//! leaves the wake-up path and the statements without the disk.
//!
//! Subjects run in alternating slices, so drift on a loaded machine hits all of them; a
//! throughput figure is the median of its slices, a ratio the median of per-round ratios.
//! Benchmarks are not tests: nothing here asserts.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use baton_core::store::{Claim, LeaseStore};
use baton_core::{Holder, Key, KeyKind, LockOptions, Locks, Namespace, StoreKey, Ttl};
use baton_postgres::{PostgresStore, sql};
use baton_testkit::postgres::{PostgresOptions, PostgresServer};
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

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

struct Settings {
    rounds: usize,
    slice: Duration,
    handoff_for: Duration,
}

impl Settings {
    fn from_args() -> Settings {
        let quick = std::env::args().any(|a| a == "--quick")
            || std::env::var("BATON_BENCH_QUICK").is_ok_and(|v| !v.is_empty() && v != "0");
        if quick {
            Settings {
                rounds: 3,
                slice: Duration::from_millis(500),
                handoff_for: Duration::from_secs(2),
            }
        } else {
            Settings {
                rounds: 7,
                slice: Duration::from_secs(1),
                handoff_for: Duration::from_secs(5),
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
            Subject::Locks => "`baton::Locks`",
            Subject::Atoms => "store atoms",
            Subject::Raw => "raw SQL, same statements",
        }
    }
}

fn main() {
    let settings = Settings::from_args();
    let server = PostgresServer::start_with(PostgresOptions::new().durable())
        .expect("a private PostgreSQL server (apt-get install postgresql)");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        tokio::spawn(run(server.url(), settings))
            .await
            .expect("the benchmark panicked")
    });
}

async fn run(url: String, settings: Settings) {
    let store = Arc::new(
        PostgresStore::connect(&format!("{url}?max_connections={POOL}"))
            .await
            .expect("the store"),
    );
    let raw = PgPoolOptions::new()
        .max_connections(POOL)
        .test_before_acquire(false)
        .connect_with(
            url.parse::<PgConnectOptions>()
                .expect("url")
                .application_name("baton-bench-raw"),
        )
        .await
        .expect("the baseline pool");

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

    println!(
        "\n## Handoff, {CONTENDERS} contenders in {CONTENDERS} stores, hold 1 ms, away 1 ms\n"
    );
    println!(
        "| wake-ups | commits | grants/s | handoffs | handoff p50 | p99 | max | acquire p50 | acquire p99 |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|");
    for (name, commits, query) in [
        ("LISTEN/NOTIFY", "synchronous", "listen=on"),
        (
            "LISTEN/NOTIFY",
            "asynchronous",
            "listen=on&options=-csynchronous_commit%3Doff",
        ),
        (
            "polling (listen=off, poll_interval 200ms)",
            "synchronous",
            "listen=off",
        ),
        (
            "polling (listen=off, poll_interval 200ms)",
            "asynchronous",
            "listen=off&options=-csynchronous_commit%3Doff",
        ),
    ] {
        let (grants, mut latencies, mut waits) =
            handoff(&format!("{url}?{query}"), settings.handoff_for).await;
        latencies.sort();
        waits.sort();
        println!(
            "| {name} | {commits} | {:.0} | {} | {} | {} | {} | {} | {} |",
            grants as f64 / settings.handoff_for.as_secs_f64(),
            latencies.len(),
            ms(percentile(&latencies, 0.50)),
            ms(percentile(&latencies, 0.99)),
            ms(latencies.last().copied().unwrap_or_default()),
            ms(percentile(&waits, 0.50)),
            ms(percentile(&waits, 0.99)),
        );
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
                            let claim = store.claim(&qualified, &holder, ttl, "").await;
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

/// Grants, handoff latencies and acquire durations (call to grant) of 8 contenders, each
/// with its own store on `url`.
async fn handoff(url: &str, length: Duration) -> (u64, Vec<Duration>, Vec<Duration>) {
    let ns = namespace();
    let mut stores = Vec::new();
    for _ in 0..CONTENDERS {
        stores.push(Arc::new(
            PostgresStore::connect(&format!("{url}&max_connections=2"))
                .await
                .expect("a contender's store"),
        ));
    }
    // The last release: when it was sent and by whom.
    let last: Arc<Mutex<Option<(Instant, usize)>>> = Arc::new(Mutex::new(None));
    let latencies = Arc::new(Mutex::new(Vec::new()));
    let waits = Arc::new(Mutex::new(Vec::new()));
    let deadline = Instant::now() + length;
    let tasks: Vec<_> = stores
        .into_iter()
        .enumerate()
        .map(|(me, store)| {
            let (ns, last, latencies, waits) = (
                ns.clone(),
                Arc::clone(&last),
                Arc::clone(&latencies),
                Arc::clone(&waits),
            );
            tokio::spawn(async move {
                let locks = Locks::with_namespace(store, ns);
                let options = LockOptions::new(TTL).wait(Duration::from_secs(60));
                let mut grants = 0u64;
                while Instant::now() < deadline {
                    let asked = Instant::now();
                    let Ok(guard) = locks.acquire("hot", &options).await else {
                        continue;
                    };
                    let granted = Instant::now();
                    waits.lock().unwrap().push(granted - asked);
                    grants += 1;
                    let previous = *last.lock().unwrap();
                    if let Some((sent, by)) = previous
                        && by != me
                        && granted >= sent
                    {
                        latencies.lock().unwrap().push(granted - sent);
                    }
                    tokio::time::sleep(HOLD).await;
                    *last.lock().unwrap() = Some((Instant::now(), me));
                    guard.release().await;
                    tokio::time::sleep(AWAY).await;
                }
                grants
            })
        })
        .collect();
    let mut grants = 0;
    for task in tasks {
        grants += task.await.expect("a contender panicked");
    }
    let latencies = latencies.lock().unwrap().clone();
    let waits = waits.lock().unwrap().clone();
    (grants, latencies, waits)
}

fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len();
    match n {
        0 => f64::NAN,
        _ if n % 2 == 1 => sorted[n / 2],
        _ => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

fn min_max(values: &[f64]) -> (f64, f64) {
    values
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
            (lo.min(*v), hi.max(*v))
        })
}

/// The `q` quantile (0..=1) of sorted `values`, nearest-rank.
fn percentile(sorted: &[Duration], q: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}
