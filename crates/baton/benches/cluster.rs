//! Redis Cluster benchmark: uncontended acquire+release pairs per second at C = 64 over many
//! keys spread across the cluster's three masters, against the raw `SET NX PX` +
//! compare-and-delete pair on the same cluster, and against baton on one single Redis server
//! on the same machine, in one run (DESIGN §9).
//!
//! ```text
//! cargo bench -p baton --bench cluster              # full run (about a minute)
//! cargo bench -p baton --bench cluster -- --quick   # short run (or BATON_BENCH_QUICK=1)
//! ```
//!
//! `TASKS` tasks take and give back locks, one pair after another, each task cycling through
//! `KEYS_PER_TASK` keys of its own, so nobody waits and the keys' slots cover the three
//! masters. The raw pair is the same workload with the redis crate's cluster client and no
//! baton in between: a `SET key token NX PX ttl`, then a Lua compare-and-delete, each routed
//! to the key's master. The three subjects run in alternating slices, the order rotating each
//! round; a figure is the median of its slices and a ratio the median of the per-round
//! ratios. Benchmarks are not tests: nothing here asserts.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use baton::Baton;
use baton::lock::LockOptions;
use baton_testkit::redis::RedisServer;
use baton_testkit::redis_cluster::RedisCluster;
use baton_testkit::stats::{BenchArgs, median, thousands};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;

/// Tasks taking pairs at once (the issue's C = 64).
const TASKS: usize = 64;
/// The keys each task cycles through: 64 × 16 keys hash to slots on every master.
const KEYS_PER_TASK: usize = 16;
/// The TTL of every grant: far above any pair, so nothing expires.
const TTL: Duration = Duration::from_secs(30);

/// The raw pair's release: delete the key only if it still holds this token.
const COMPARE_AND_DELETE: &str = "\
if redis.call('GET', KEYS[1]) == ARGV[1] then
    return redis.call('DEL', KEYS[1])
end
return 0
";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Subject {
    /// baton on the cluster.
    Cluster,
    /// The raw pair on the cluster.
    Raw,
    /// baton on one single server.
    Single,
}

fn main() {
    let args = BenchArgs::from_env();
    let (slices, slice) = if args.quick() {
        (3, Duration::from_millis(500))
    } else {
        (7, Duration::from_secs(2))
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let cluster = RedisCluster::start().expect("a private Redis Cluster");
    let single = RedisServer::start().expect("a private redis-server");
    println!(
        "Redis Cluster (3 masters, 3 replicas) against one server: {TASKS} tasks, {KEYS_PER_TASK} keys each, {slices} alternating slices of {slice:?}; load average {}",
        std::fs::read_to_string("/proc/loadavg")
            .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
            .unwrap_or_default()
    );
    let (cluster_rate, raw_rate, single_rate, to_raw, to_single) = runtime.block_on(async {
        let on_cluster = baton::connect(&cluster.url())
            .await
            .expect("baton on the cluster");
        let on_single = baton::connect(&single.url())
            .await
            .expect("baton on one server");
        let seeds: Vec<String> = cluster
            .ports()
            .iter()
            .map(|p| format!("redis://127.0.0.1:{p}"))
            .collect();
        let raw = ClusterClientBuilder::new(seeds)
            .build()
            .expect("a cluster client")
            .get_async_connection()
            .await
            .expect("connect to the cluster");
        compare(&on_cluster, &raw, &on_single, slices, slice).await
    });
    println!();
    println!("| subject | pairs/s | baton on the cluster against it |");
    println!("|---|---:|---:|");
    println!("| baton on the cluster | {} | — |", thousands(cluster_rate));
    println!(
        "| raw `SET NX PX` + compare-and-delete on the cluster (floor) | {} | {to_raw:.2}x |",
        thousands(raw_rate)
    );
    println!(
        "| baton on one server | {} | {to_single:.2}x |",
        thousands(single_rate)
    );
}

/// The three subjects in alternating slices: each one's median pairs/s, and the median
/// per-round ratios of baton on the cluster to the raw pair and to one server.
async fn compare(
    on_cluster: &Baton,
    raw: &ClusterConnection,
    on_single: &Baton,
    slices: usize,
    slice: Duration,
) -> (f64, f64, f64, f64, f64) {
    let subjects = [Subject::Cluster, Subject::Raw, Subject::Single];
    let mut rates: [Vec<f64>; 3] = Default::default();
    let (mut to_raw, mut to_single) = (Vec::new(), Vec::new());
    for round in 0..slices {
        let mut this = [0.0; 3];
        for i in 0..subjects.len() {
            let subject = subjects[(round + i) % subjects.len()];
            this[subject as usize] = match subject {
                Subject::Cluster => baton_pairs(on_cluster, round, slice).await,
                Subject::Raw => raw_pairs(raw, round, slice).await,
                Subject::Single => baton_pairs(on_single, round, slice).await,
            };
        }
        for (rate, figure) in rates.iter_mut().zip(this) {
            rate.push(figure);
        }
        to_raw.push(this[0] / this[1]);
        to_single.push(this[0] / this[2]);
    }
    (
        median(&rates[0]),
        median(&rates[1]),
        median(&rates[2]),
        median(&to_raw),
        median(&to_single),
    )
}

/// The key a task uses for its `n`th pair in `round`.
fn key(round: usize, task: usize, n: u64) -> String {
    format!("bench-{round}-{task}-{}", n % KEYS_PER_TASK as u64)
}

/// Pairs per second of `TASKS` tasks taking and giving back locks through `baton`.
async fn baton_pairs(baton: &Baton, round: usize, slice: Duration) -> f64 {
    let pairs = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for task in 0..TASKS {
        let (baton, pairs) = (baton.clone(), Arc::clone(&pairs));
        tasks.push(tokio::spawn(async move {
            let options = LockOptions::new(TTL);
            let mut n = 0;
            while started.elapsed() < slice {
                let guard = baton
                    .locks()
                    .acquire(&key(round, task, n), &options)
                    .await
                    .expect("free");
                guard.release().await;
                n += 1;
                pairs.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    for task in tasks {
        task.await.expect("a bench task");
    }
    pairs.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64()
}

/// Pairs per second of `TASKS` tasks running the raw pair on the cluster, on as many keys
/// as baton's subject uses, each its own hash tag (so spread over the slots as those are).
async fn raw_pairs(raw: &ClusterConnection, round: usize, slice: Duration) -> f64 {
    let pairs = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for task in 0..TASKS {
        let (mut conn, pairs) = (raw.clone(), Arc::clone(&pairs));
        tasks.push(tokio::spawn(async move {
            let release = redis::Script::new(COMPARE_AND_DELETE);
            let token = format!("raw-{task}");
            let mut n = 0;
            while started.elapsed() < slice {
                let key = format!("{{raw:{}}}", key(round, task, n));
                let taken: Option<String> = redis::cmd("SET")
                    .arg(&key)
                    .arg(&token)
                    .arg("NX")
                    .arg("PX")
                    .arg(TTL.as_millis() as u64)
                    .query_async(&mut conn)
                    .await
                    .expect("SET NX PX");
                assert!(taken.is_some(), "the raw pair's key was taken");
                let removed: i64 = release
                    .key(&key)
                    .arg(&token)
                    .invoke_async(&mut conn)
                    .await
                    .expect("compare-and-delete");
                assert_eq!(removed, 1);
                n += 1;
                pairs.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    for task in tasks {
        task.await.expect("a bench task");
    }
    pairs.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64()
}
