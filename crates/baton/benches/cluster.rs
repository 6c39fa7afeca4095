//! Redis Cluster benchmark: uncontended acquire+release pairs per second at C = 64 over many
//! keys spread across the cluster's three masters, against the raw `SET NX PX` +
//! compare-and-delete pair on the same cluster, against two fenced pairs by hand on the same
//! cluster, and against baton on one single Redis server on the same machine, in one run
//! (DESIGN §9).
//!
//! ```text
//! cargo bench -p baton --bench cluster              # full run (about a minute and a half)
//! cargo bench -p baton --bench cluster -- --quick   # short run (or BATON_BENCH_QUICK=1)
//! cargo bench -p baton --bench cluster -- --only raw # one subject: cluster, raw, bare,
//!                                                    # counted or single
//! ```
//!
//! `--only` runs one subject for every slice and prints its rate alone: for reading one
//! subject's CPU time or profile with nothing else running.
//!
//! `TASKS` tasks take and give back locks, one pair after another, each task cycling through
//! `KEYS_PER_TASK` keys of its own, so nobody waits and the keys' slots cover the three
//! masters. The raw pair is the same workload with the redis crate's cluster client and no
//! baton in between: a `SET key token NX PX ttl`, then a Lua compare-and-delete, each routed
//! to the key's master. The two fenced pairs by hand are the same with a claim script in place
//! of the `SET`, over the same client and with nothing of baton:
//! - the bare fenced pair ([`BARE_FENCED_CLAIM`]) takes the master's clock as the fence and
//!   writes it into the grant with `SET NX PX`: the least any lock that hands out fences must
//!   do on the server;
//! - the counted fenced pair ([`COUNTED_FENCED_CLAIM`]) also keeps the key's fence counter,
//!   as baton's rule does (the larger of the counter plus one and the clock, so fences do not
//!   repeat after the clock steps back or a failover): the least a lock with baton's fence
//!   guarantee must do.
//!
//! Their ratios to the raw pair bound what baton's can be on the machine. The subjects run in
//! alternating slices, the order rotating each round; a figure is the median of its slices
//! and a ratio the median of the per-round ratios. Benchmarks are not tests: nothing here
//! asserts.

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

/// The bare fenced claim: the fence is the master's clock in microseconds (`TIME`), written
/// into the grant with `SET NX PX`. It keeps no fence counter, so it may repeat a fence after
/// the clock steps back: the floor of any fenced claim made by one script, not a lock to use.
const BARE_FENCED_CLAIM: &str = "\
local t = redis.call('TIME')
local fence = tonumber(t[1]) * 1000000 + tonumber(t[2])
if redis.call('SET', KEYS[1], string.format('%d:%s', fence, ARGV[1]), 'NX', 'PX', ARGV[2]) then
    return fence
end
return 0
";

/// The counted fenced claim: the bare one with baton's fence rule, the larger of the key's
/// counter (`KEYS[2]`) plus one and the clock, written back to the counter with `SET ... GET`
/// (its common path is the same calls as baton's claim of a free key; the counter's life is
/// baton's too, the grant's TTL plus an hour).
const COUNTED_FENCED_CLAIM: &str = "\
local t = redis.call('TIME')
local fence = tonumber(t[1]) * 1000000 + tonumber(t[2])
local keep = string.format('%d', tonumber(ARGV[2]) + 3600000)
local last = redis.call('SET', KEYS[2], string.format('%d', fence), 'PX', keep, 'GET')
if last and tonumber(last) >= fence then
    fence = tonumber(last) + 1
    redis.call('SET', KEYS[2], string.format('%d', fence), 'PX', keep)
end
if redis.call('SET', KEYS[1], string.format('%d:%s', fence, ARGV[1]), 'NX', 'PX', ARGV[2]) then
    return fence
end
return 0
";

/// How a pair by hand takes its key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum HandClaim {
    /// `SET key token NX PX ttl`.
    Plain,
    /// [`BARE_FENCED_CLAIM`].
    Bare,
    /// [`COUNTED_FENCED_CLAIM`].
    Counted,
}

impl HandClaim {
    /// The claim's script, none for the plain `SET`.
    fn script(self) -> Option<redis::Script> {
        match self {
            HandClaim::Plain => None,
            HandClaim::Bare => Some(redis::Script::new(BARE_FENCED_CLAIM)),
            HandClaim::Counted => Some(redis::Script::new(COUNTED_FENCED_CLAIM)),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Subject {
    /// baton on the cluster.
    Cluster,
    /// The raw pair on the cluster.
    Raw,
    /// baton on one single server.
    Single,
    /// The bare fenced pair by hand on the cluster ([`BARE_FENCED_CLAIM`], then the raw
    /// compare-and-delete): what a fence costs at least, whoever makes it.
    Bare,
    /// The counted fenced pair by hand on the cluster ([`COUNTED_FENCED_CLAIM`], then the
    /// raw compare-and-delete): what baton's fence rule costs at least.
    Counted,
}

fn main() {
    let args = BenchArgs::from_env();
    let (slices, slice) = if args.quick() {
        (3, Duration::from_millis(500))
    } else {
        (7, Duration::from_secs(2))
    };
    let only = args.value("--only").map(|name| match name.as_str() {
        "cluster" => Subject::Cluster,
        "raw" => Subject::Raw,
        "single" => Subject::Single,
        "bare" => Subject::Bare,
        "counted" => Subject::Counted,
        other => panic!("--only takes cluster, raw, bare, counted or single, not {other:?}"),
    });
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
    let compared = runtime.block_on(async {
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
        let subjects = (&on_cluster, &raw, &on_single);
        if let Some(subject) = only {
            let rates = run_one(subjects, subject, slices, slice).await;
            println!("{subject:?} alone: {} pairs/s", thousands(median(&rates)));
            return None;
        }
        Some(compare(subjects, slices, slice).await)
    });
    let Some(Compared {
        rates,
        ratios,
        to_raw,
    }) = compared
    else {
        return;
    };
    println!();
    println!("| subject | pairs/s | baton on the cluster against it | against the raw pair |");
    println!("|---|---:|---:|---:|");
    for (name, s) in [
        ("baton on the cluster", Subject::Cluster),
        (
            "raw `SET NX PX` + compare-and-delete on the cluster (floor)",
            Subject::Raw,
        ),
        ("bare fenced pair by hand on the cluster", Subject::Bare),
        (
            "counted fenced pair by hand on the cluster",
            Subject::Counted,
        ),
        ("baton on one server", Subject::Single),
    ] {
        let ratio = |of: Subject, figures: &[f64]| {
            if s == of {
                "—".to_owned()
            } else {
                format!("{:.2}x", figures[s as usize])
            }
        };
        println!(
            "| {name} | {} | {} | {} |",
            thousands(rates[s as usize]),
            ratio(Subject::Cluster, &ratios),
            ratio(Subject::Raw, &to_raw)
        );
    }
}

/// What [`compare`] measured, indexed by `Subject as usize`: each subject's median pairs/s,
/// the median per-round ratio of baton on the cluster to each subject, and the median
/// per-round ratio of each subject to the raw pair.
struct Compared {
    rates: [f64; SUBJECTS.len()],
    ratios: [f64; SUBJECTS.len()],
    to_raw: [f64; SUBJECTS.len()],
}

/// Every subject, in the order of their indices.
const SUBJECTS: [Subject; 5] = [
    Subject::Cluster,
    Subject::Raw,
    Subject::Single,
    Subject::Bare,
    Subject::Counted,
];

/// The subjects in alternating slices, the order rotating each round.
async fn compare(
    on: (&Baton, &ClusterConnection, &Baton),
    slices: usize,
    slice: Duration,
) -> Compared {
    let mut rates: [Vec<f64>; SUBJECTS.len()] = Default::default();
    let mut ratios: [Vec<f64>; SUBJECTS.len()] = Default::default();
    let mut to_raw: [Vec<f64>; SUBJECTS.len()] = Default::default();
    for round in 0..slices {
        let mut this = [0.0; SUBJECTS.len()];
        for i in 0..SUBJECTS.len() {
            let subject = SUBJECTS[(round + i) % SUBJECTS.len()];
            this[subject as usize] = pairs(on, subject, round, slice).await;
        }
        for (i, figure) in this.into_iter().enumerate() {
            rates[i].push(figure);
            ratios[i].push(this[Subject::Cluster as usize] / figure);
            to_raw[i].push(figure / this[Subject::Raw as usize]);
        }
    }
    Compared {
        rates: rates.map(|r| median(&r)),
        ratios: ratios.map(|r| median(&r)),
        to_raw: to_raw.map(|r| median(&r)),
    }
}

/// One subject's pairs/s in each of `slices` slices, nothing else running.
async fn run_one(
    on: (&Baton, &ClusterConnection, &Baton),
    subject: Subject,
    slices: usize,
    slice: Duration,
) -> Vec<f64> {
    let mut rates = Vec::new();
    for round in 0..slices {
        rates.push(pairs(on, subject, round, slice).await);
    }
    rates
}

/// One slice of `subject`'s pairs/s.
async fn pairs(
    (on_cluster, raw, on_single): (&Baton, &ClusterConnection, &Baton),
    subject: Subject,
    round: usize,
    slice: Duration,
) -> f64 {
    match subject {
        Subject::Cluster => baton_pairs(on_cluster, round, slice).await,
        Subject::Raw => hand_pairs(raw, round, slice, HandClaim::Plain).await,
        Subject::Single => baton_pairs(on_single, round, slice).await,
        Subject::Bare => hand_pairs(raw, round, slice, HandClaim::Bare).await,
        Subject::Counted => hand_pairs(raw, round, slice, HandClaim::Counted).await,
    }
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

/// Pairs per second of `TASKS` tasks running a pair by hand on the cluster, on as many keys
/// as baton's subject uses, each its own hash tag (so spread over the slots as those are):
/// `how` takes the key, the compare-and-delete gives it back.
async fn hand_pairs(raw: &ClusterConnection, round: usize, slice: Duration, how: HandClaim) -> f64 {
    let pairs = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for task in 0..TASKS {
        let (mut conn, pairs) = (raw.clone(), Arc::clone(&pairs));
        tasks.push(tokio::spawn(async move {
            let release = redis::Script::new(COMPARE_AND_DELETE);
            let claim = how.script();
            let token = format!("raw-{task}");
            let mut n = 0;
            while started.elapsed() < slice {
                let key = format!("{{raw:{}}}", key(round, task, n));
                let value = if let Some(claim) = &claim {
                    let mut call = claim.key(&key);
                    if how == HandClaim::Counted {
                        call.key(format!("{key}:fence"));
                    }
                    let fence: u64 = call
                        .arg(&token)
                        .arg(TTL.as_millis() as u64)
                        .invoke_async(&mut conn)
                        .await
                        .expect("the fenced claim");
                    assert!(fence > 0, "the fenced pair's key was taken");
                    format!("{fence}:{token}")
                } else {
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
                    token.clone()
                };
                let removed: i64 = release
                    .key(&key)
                    .arg(&value)
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
