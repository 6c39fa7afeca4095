//! Rate-limiter benchmark against a private `redis-server` (started by `baton-testkit`):
//! decisions per second on one hot key and across 10,000 keys, as a ratio to sending the
//! same script by hand (DESIGN §9).
//!
//! ```text
//! cargo bench -p baton-redis --bench limit              # full run (about 1.5 minutes)
//! cargo bench -p baton-redis --bench limit -- --quick   # short run (or BATON_BENCH_QUICK=1)
//! ```
//!
//! Subjects, each at concurrency C (tasks sharing one client) on one key pattern:
//! - `baton::limit::RateLimiter::try_acquire` (input validation, key qualification, the store's
//!   per-call deadline and retry, reply parsing);
//! - the store's atom, `RateStore::admit`, with a pre-qualified key and a validated quota;
//! - the baseline: `EVALSHA` of the very same script (`baton_redis::limit::script()`) with
//!   the same keys and arguments, sent by hand over the same kind of client (the `redis`
//!   crate's `ConnectionManager`, one multiplexed connection, `TCP_NODELAY`, the same
//!   timeouts). Both subjects are reported as a ratio to it.
//!
//! Key patterns: one hot key (quota 1,000 per second, so most decisions are denials once
//! the window fills), and 10,000 keys taken round robin (quota 100 per second per key, so
//! most decisions admit). Subjects and baseline use separate keys of the same shape.
//!
//! Subjects run in alternating slices (the order rotates each round) after a warm-up, so
//! drift on a loaded machine hits all of them; a throughput is the median of its slices
//! and a ratio the median of the per-round ratios. Benchmarks are not tests: nothing here
//! asserts.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use baton_core::{Key, KeyKind, Namespace, Quota, RateLimiter, RateStore, StoreKey};
use baton_redis::RedisStore;
use baton_redis::limit::{arguments, redis_keys, script};
use baton_testkit::redis::RedisServer;
use baton_testkit::stats::{BenchArgs, median, thousands};
use redis::Value;
use redis::aio::ConnectionManager;

#[path = "shared/client.rs"]
mod client;

/// Concurrency levels.
const CONCURRENCY: [usize; 2] = [1, 64];
/// Keys of the spread pattern.
const SPREAD_KEYS: usize = 10_000;
/// Connect and response timeouts of store and baseline alike (the store's defaults).
const TIMEOUT: Duration = Duration::from_secs(2);

#[derive(Debug, Clone, Copy)]
enum Pattern {
    Hot,
    Spread,
}

impl Pattern {
    fn name(self) -> &'static str {
        match self {
            Pattern::Hot => "1 hot key",
            Pattern::Spread => "10,000 keys",
        }
    }

    fn quota(self) -> Quota {
        let max = match self {
            Pattern::Hot => 1000,
            Pattern::Spread => 100,
        };
        Quota::new(max, Duration::from_secs(1)).expect("a valid quota")
    }

    /// The user key of the `n`-th decision.
    fn key(self, n: u64) -> String {
        match self {
            Pattern::Hot => "hot".to_owned(),
            Pattern::Spread => format!("k{}", n % SPREAD_KEYS as u64),
        }
    }
}

struct Settings {
    quick: bool,
    rounds: usize,
    slice: Duration,
}

impl Settings {
    fn from_args() -> Settings {
        let quick = BenchArgs::from_env().quick();
        let (rounds, slice) = if quick {
            (3, Duration::from_millis(300))
        } else {
            (7, Duration::from_secs(1))
        };
        Settings {
            quick,
            rounds,
            slice,
        }
    }
}

/// What one decision runs.
#[derive(Clone)]
enum Subject {
    Limiter(RateLimiter),
    Atom(Arc<dyn RateStore>, Namespace),
    Raw(ConnectionManager, Namespace),
}

impl Subject {
    fn name(&self) -> &'static str {
        match self {
            Subject::Limiter(_) => "RateLimiter::try_acquire",
            Subject::Atom(..) => "RateStore::admit (store atom)",
            Subject::Raw(..) => "raw EVALSHA, same script",
        }
    }

    async fn decide(&self, pattern: Pattern, n: u64) {
        let quota = pattern.quota();
        let key = pattern.key(n);
        match self {
            Subject::Limiter(limiter) => {
                let _ = limiter
                    .with_quota(quota)
                    .try_acquire(&key, 1)
                    .await
                    .expect("a decision");
            }
            Subject::Atom(store, ns) => {
                let _ = store
                    .admit(&qualify(ns, &key), 1, quota)
                    .await
                    .expect("a decision");
            }
            Subject::Raw(conn, ns) => {
                let [log, units] = redis_keys(&qualify(ns, &key));
                let mut evalsha = redis::cmd("EVALSHA");
                evalsha.arg(script().get_hash()).arg(2).arg(log).arg(units);
                for argument in arguments(1, quota) {
                    evalsha.arg(argument);
                }
                let mut conn = conn.clone();
                let reply: Value = evalsha.query_async(&mut conn).await.expect("a decision");
                std::hint::black_box(reply);
            }
        }
    }

    /// Decisions per second of `concurrency` tasks over one slice.
    async fn slice(&self, pattern: Pattern, concurrency: usize, length: Duration) -> f64 {
        let counter = Arc::new(AtomicU64::new(0));
        let start = Instant::now();
        let stop = start + length;
        let tasks: Vec<_> = (0..concurrency)
            .map(|_| {
                let subject = self.clone();
                let counter = Arc::clone(&counter);
                tokio::spawn(async move {
                    while Instant::now() < stop {
                        let n = counter.fetch_add(1, Ordering::Relaxed);
                        subject.decide(pattern, n).await;
                    }
                })
            })
            .collect();
        for task in tasks {
            task.await.expect("a benchmark task panicked");
        }
        counter.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64()
    }
}

fn qualify(ns: &Namespace, key: &str) -> StoreKey {
    ns.qualify(KeyKind::Limit, &Key::new(key).expect("a valid key"))
}

fn namespace(name: &str) -> Namespace {
    Namespace::new(format!("bench-{name}")).expect("a valid namespace")
}

/// A client configured as the store configures its own.
async fn raw_connection(url: &str) -> ConnectionManager {
    let mut conn = client::connect_as_the_store(url, TIMEOUT).await;
    redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(baton_redis::limit::LIMIT)
        .query_async::<String>(&mut conn)
        .await
        .expect("SCRIPT LOAD");
    conn
}

fn main() {
    let settings = Settings::from_args();
    let server =
        RedisServer::start().expect("a private redis-server (apt-get install redis-server)");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    // Run on a worker thread, as a service's request handlers do.
    let url = server.url();
    runtime
        .block_on(runtime.spawn(run(settings, url)))
        .expect("the benchmark panicked");
    drop(server);
}

async fn run(settings: Settings, url: String) {
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!(
        "baton rate-limiter benchmark: private redis-server (loopback, no persistence), {cores} cores, \
         tokio multi-thread runtime with 2 workers, {} run ({} rounds of {:?} slices per subject)",
        if settings.quick { "quick" } else { "full" },
        settings.rounds,
        settings.slice,
    );
    let store = Arc::new(RedisStore::connect(&url).await.expect("connect the store"));
    let subjects = [
        Subject::Limiter(RateLimiter::with_namespace(
            store.clone(),
            namespace("limiter"),
            Pattern::Hot.quota(),
        )),
        Subject::Atom(store.clone(), namespace("atom")),
        Subject::Raw(raw_connection(&url).await, namespace("raw")),
    ];
    println!();
    println!("| keys | tasks | subject | decisions/s (median) | slices min..max | ratio to raw |");
    println!("|---|---:|---|---:|---:|---:|");
    for pattern in [Pattern::Hot, Pattern::Spread] {
        for concurrency in CONCURRENCY {
            // Warm-up: fill the windows and the connection.
            for subject in &subjects {
                subject
                    .slice(pattern, concurrency, settings.slice / 2)
                    .await;
            }
            let mut rates: Vec<Vec<f64>> = vec![Vec::new(); subjects.len()];
            for round in 0..settings.rounds {
                for i in 0..subjects.len() {
                    let which = (i + round) % subjects.len();
                    let rate = subjects[which]
                        .slice(pattern, concurrency, settings.slice)
                        .await;
                    rates[which].push(rate);
                }
            }
            let raw = subjects.len() - 1;
            for (which, subject) in subjects.iter().enumerate() {
                let ratios: Vec<f64> = rates[which]
                    .iter()
                    .zip(&rates[raw])
                    .map(|(subject, raw)| subject / raw)
                    .collect();
                let min = rates[which].iter().copied().fold(f64::INFINITY, f64::min);
                let max = rates[which].iter().copied().fold(0.0, f64::max);
                println!(
                    "| {} | {concurrency} | {} | {} | {}..{} | {} |",
                    pattern.name(),
                    subject.name(),
                    thousands(median(&rates[which])),
                    thousands(min),
                    thousands(max),
                    if which == raw {
                        "1.00".to_owned()
                    } else {
                        format!("**{:.2}**", median(&ratios))
                    },
                );
            }
        }
    }
}
