//! Semaphore benchmark: acquire+release pairs per second of a semaphore's permits against the
//! same store's lock at the same concurrency, in one run (DESIGN §9).
//!
//! ```text
//! cargo bench -p baton --bench semaphore              # full run (about a minute)
//! cargo bench -p baton --bench semaphore -- --quick   # short run (or BATON_BENCH_QUICK=1)
//! cargo bench -p baton --bench semaphore -- --only redis      # or memory, sqlite, postgres
//! ```
//!
//! `TASKS` tasks take and give back, one pair after another: for the lock, each task its own
//! key (so nobody waits); for the semaphore, permits of one key with as many permits as
//! tasks (so nobody waits either). The ratio semaphore/lock is the cost of counting permits
//! instead of owning a row. Subject and baseline run in alternating slices, the order
//! rotating each round; a figure is the median of its slices and the ratio the median of the
//! per-round ratios. Benchmarks are not tests: nothing here asserts.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use baton::Baton;
use baton::lock::LockOptions;
use baton_testkit::postgres::PostgresServer;
use baton_testkit::redis::RedisServer;
use baton_testkit::stats::{BenchArgs, median, thousands};

/// Tasks taking pairs at once, and the semaphore's permits.
const TASKS: u32 = 8;
/// The TTL of every grant: far above any pair, so nothing expires.
const TTL: Duration = Duration::from_secs(30);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Subject {
    Lock,
    Semaphore,
}

fn main() {
    let args = BenchArgs::from_env();
    let (slices, slice) = if args.quick() {
        (3, Duration::from_millis(300))
    } else {
        (7, Duration::from_secs(1))
    };
    let only = args.value("--only");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let dir = tempfile::tempdir().expect("a temp dir");
    let server = only
        .as_deref()
        .is_none_or(|o| o == "postgres")
        .then(|| PostgresServer::start().expect("a private PostgreSQL server"));
    let redis = only
        .as_deref()
        .is_none_or(|o| o == "redis")
        .then(|| RedisServer::start().expect("a private redis-server"));
    let mut stores = vec![
        ("memory", "memory://".to_owned()),
        (
            "sqlite",
            format!("sqlite://{}", dir.path().join("bench.db").display()),
        ),
    ];
    if let Some(server) = &redis {
        stores.push(("redis", server.url()));
    }
    if let Some(server) = &server {
        stores.push(("postgres", server.url()));
    }
    println!(
        "semaphore against lock: {TASKS} tasks, {slices} alternating slices of {slice:?}; load average {}",
        std::fs::read_to_string("/proc/loadavg")
            .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
            .unwrap_or_default()
    );
    println!();
    println!("| store | lock pairs/s | semaphore pairs/s | semaphore / lock |");
    println!("|---|---:|---:|---:|");
    for (name, url) in stores {
        if only.as_deref().is_some_and(|o| o != name) {
            continue;
        }
        let (lock, semaphore, ratio) = runtime.block_on(async {
            let baton = baton::connect(&url).await.expect("the store");
            compare(&baton, slices, slice).await
        });
        println!(
            "| {name} | {} | {} | {ratio:.2}x |",
            thousands(lock),
            thousands(semaphore)
        );
    }
}

/// Both subjects in alternating slices: their median pairs/s and the median per-round ratio.
async fn compare(baton: &Baton, slices: usize, slice: Duration) -> (f64, f64, f64) {
    let (mut locks, mut semaphores, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..slices {
        let order = if round % 2 == 0 {
            [Subject::Lock, Subject::Semaphore]
        } else {
            [Subject::Semaphore, Subject::Lock]
        };
        let mut this = [0.0; 2];
        for subject in order {
            let rate = pairs_per_second(baton, subject, round, slice).await;
            this[subject as usize] = rate;
        }
        locks.push(this[0]);
        semaphores.push(this[1]);
        ratios.push(this[1] / this[0]);
    }
    (median(&locks), median(&semaphores), median(&ratios))
}

/// Pairs per second of `TASKS` tasks taking and giving back `subject` for `slice`.
async fn pairs_per_second(baton: &Baton, subject: Subject, round: usize, slice: Duration) -> f64 {
    let pairs = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for task in 0..TASKS {
        let (baton, pairs) = (baton.clone(), Arc::clone(&pairs));
        tasks.push(tokio::spawn(async move {
            let options = LockOptions::new(TTL);
            let semaphore = baton
                .semaphore(&format!("bench-{round}"), TASKS)
                .expect("the store keeps semaphores");
            let key = format!("bench-{round}-{task}");
            while started.elapsed() < slice {
                let guard = match subject {
                    Subject::Lock => baton.locks().acquire(&key, &options).await,
                    Subject::Semaphore => semaphore.acquire(&options).await,
                }
                .expect("free");
                guard.release().await;
                pairs.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    for task in tasks {
        task.await.expect("a bench task");
    }
    pairs.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64()
}
