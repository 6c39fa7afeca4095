//! Redis lock benchmarks against a private `redis-server` (started by `baton-testkit`):
//! uncontended acquire+release throughput as a ratio to a hand-written baseline, and
//! contended handoff latency, throughput, Redis commands per handoff and fairness
//! (DESIGN §9).
//!
//! ```text
//! cargo bench -p baton-redis --bench redis_locks              # full run (about 2 minutes)
//! cargo bench -p baton-redis --bench redis_locks -- --quick   # short run (or BATON_BENCH_QUICK=1)
//! cargo bench -p baton-redis --bench redis_locks -- --only handoff   # or --only uncontended
//! cargo bench -p baton-redis --bench redis_locks -- --only uncontended --subjects locks --concurrency 16
//!     # diagnostic: only these uncontended subjects (locks, atoms, scripts) beside the
//!     # baseline, only at these concurrency levels
//! cargo bench -p baton-redis --bench redis_locks -- --replica --store-options min_replicas=1
//!     # the server gets a replica (every subject and the baseline write to a primary
//!     # that replicates), and the store is opened with these URL options
//! ```
//!
//! Uncontended: C tasks (C = 1, 16, 64) share one store instance, each taking and giving
//! back a key of its own, as fast as it can. Subjects:
//! - `baton::lock::Locks` acquire + `LockGuard::release` (options check, guard, watchdog task,
//!   release task, telemetry, the store's claim and release scripts);
//! - the store's atoms, `LeaseStore::claim` + `release` with a fresh holder per pair (the
//!   scripts and the store's per-call deadline, without the policy layer);
//! - (diagnostic) the store's `claim.lua` and `release.lua` sent by hand over the same kind
//!   of client: the scripts' cost without the store's Rust layer;
//! - the baseline (`redis_locks/raw.rs`): raw `SET NX PX` + `EVALSHA` compare-and-delete
//!   over the same client (`redis::aio::ConnectionManager`, one multiplexed connection) at
//!   the same concurrency. Every subject is reported as a ratio to it.
//!
//! Contended: 8 contenders on one key, each holding 1 ms and staying away 1 ms between
//! attempts. Handoff latency is the time from one holder sending its release to the next
//! grant to a *different* contender. Commands per handoff come from the server's
//! `INFO commandstats` delta over the run: client requests (`EVALSHA`/`EVAL`) and every
//! command including those the scripts call. Two shapes: one store instance shared by the 8
//! tasks (one service replica: its waiters queue FIFO in the core, and the store hands the key
//! to its own next waiter), and 8 store instances (8 replicas: they queue in Redis and are
//! woken one at a time over pub/sub).
//!
//! Subjects run in alternating slices, so drift on a loaded machine hits all of them; each
//! figure is the median of its slices. Benchmarks are not tests: nothing here asserts.

#[path = "shared/client.rs"]
mod client;
#[path = "redis_locks/raw.rs"]
mod raw;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use baton_core::store::{Claim, LeaseRequest, LeaseStore, Release};
use baton_core::{Holder, Key, KeyKind, LockOptions, Locks, Namespace, StoreKey, Ttl};
use baton_redis::RedisStore;
use baton_testkit::redis::RedisServer;
use baton_testkit::stats::{BenchArgs, median, ms, percentile, thousands};

use raw::{RawLocks, RawScripts};

/// Concurrency levels of the uncontended run.
const CONCURRENCY: [usize; 3] = [1, 16, 64];
/// Contenders in the handoff run.
const CONTENDERS: usize = 8;
/// How long each holder holds, and stays away between attempts.
const HOLD: Duration = Duration::from_millis(1);
const AWAY: Duration = Duration::from_millis(1);
/// The TTL of every grant: far above any hold, so nothing expires.
const TTL: Duration = Duration::from_secs(30);
/// Connect and response timeouts of store and baseline alike (the store's defaults).
const TIMEOUT: Duration = Duration::from_secs(2);

/// Commands a client sends itself; everything else in `INFO commandstats` during a
/// handoff run is called from inside the scripts.
const REQUESTS: [&str; 2] = ["evalsha", "eval"];

#[derive(Debug, Clone)]
struct Settings {
    quick: bool,
    only: Option<String>,
    /// `--subjects locks,atoms,...`: the uncontended subjects to run (a diagnostic, for
    /// profiling one of them); the baseline always runs.
    subjects: Option<Vec<String>>,
    /// `--pairs N`: run exactly N pairs of each of `--subjects` (the baseline only if
    /// listed) one after another on one task, print nothing, and exit: a diagnostic, to count
    /// what a pair costs from outside (`perf stat -e probe_libc:malloc`, with runs of N and
    /// 2N pairs subtracted).
    pairs: Option<u64>,
    /// `--concurrency 16,64`: the uncontended concurrency levels to run (default 1, 16, 64).
    concurrency: Vec<usize>,
    slices: usize,
    slice: Duration,
    handoff_for: Duration,
    /// `--replica`: start a replica of the server.
    replica: bool,
    /// `--store-options a=b&c=d`: the query of the store's URL.
    store_options: Option<String>,
}

impl Settings {
    fn from_args() -> Settings {
        let args = BenchArgs::from_env();
        let (quick, only) = (args.quick(), args.value("--only"));
        let subjects = args
            .value("--subjects")
            .map(|list| list.split(',').map(str::to_owned).collect());
        let pairs = args.value("--pairs").and_then(|n| n.parse().ok());
        let concurrency = args
            .value("--concurrency")
            .map(|list| list.split(',').filter_map(|c| c.parse().ok()).collect())
            .unwrap_or_else(|| CONCURRENCY.to_vec());
        let (slices, slice, handoff_for) = if quick {
            (3, Duration::from_millis(300), Duration::from_secs(1))
        } else {
            (7, Duration::from_secs(1), Duration::from_secs(5))
        };
        let replica = args.flag("--replica");
        let store_options = args.value("--store-options");
        Settings {
            replica,
            store_options,
            quick,
            only,
            subjects,
            pairs,
            concurrency,
            slices,
            slice,
            handoff_for,
        }
    }

    fn runs(&self, part: &str) -> bool {
        self.only.as_deref().is_none_or(|only| only == part)
    }

    /// Whether the uncontended subject `name` runs (the baseline always does).
    fn runs_subject(&self, name: &str) -> bool {
        name == "raw"
            || self
                .subjects
                .as_ref()
                .is_none_or(|list| list.iter().any(|s| s == name))
    }
}

fn main() {
    let settings = Settings::from_args();
    let server = Arc::new(
        RedisServer::start().expect("a private redis-server (apt-get install redis-server)"),
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    // Run on a worker thread, as a service's request handlers do.
    runtime
        .block_on(runtime.spawn(run(settings, server)))
        .expect("the benchmark panicked");
}

async fn run(settings: Settings, server: Arc<RedisServer>) {
    let _replica = settings.replica.then(|| {
        RedisServer::start_replica_of(&server, baton_testkit::redis::RedisOptions::new())
            .expect("a private replica")
    });
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let version = server
        .info("server")
        .ok()
        .and_then(|info| {
            info.lines()
                .find_map(|l| l.strip_prefix("redis_version:"))
                .map(|v| v.trim().to_owned())
        })
        .unwrap_or_else(|| "?".to_owned());
    println!(
        "baton Redis lock benchmarks: redis-server {version} (private, loopback, no persistence{}), \
         {cores} cores, tokio multi-thread runtime with 2 workers, {} run \
         ({} alternating slices of {:?} per throughput figure, handoff for {:?}){}",
        if settings.replica {
            ", with a replica"
        } else {
            ""
        },
        if settings.quick { "quick" } else { "full" },
        settings.slices,
        settings.slice,
        settings.handoff_for,
        settings
            .store_options
            .as_deref()
            .map_or(String::new(), |o| format!("; store options {o}")),
    );
    let url = server.url();
    let store_url = match &settings.store_options {
        Some(options) => format!("{url}?{options}"),
        None => url.clone(),
    };
    let store = Arc::new(
        RedisStore::connect(&store_url)
            .await
            .expect("connect the store"),
    );
    if let Some(pairs) = settings.pairs {
        let hand = Hand {
            scripts: Arc::new(RawScripts::connect(&url, TIMEOUT).await),
            raw: Arc::new(RawLocks::connect(&url, TIMEOUT).await),
        };
        for (name, subject) in SUBJECT_KEYS.iter().zip(subjects(&store, &hand)) {
            if settings
                .subjects
                .as_ref()
                .is_some_and(|l| l.iter().any(|s| s == name))
            {
                for _ in 0..pairs {
                    subject.pair(0).await;
                }
            }
        }
        return;
    }

    if settings.runs("uncontended") {
        let hand = Hand {
            scripts: Arc::new(RawScripts::connect(&url, TIMEOUT).await),
            raw: Arc::new(RawLocks::connect(&url, TIMEOUT).await),
        };
        let mut rows = Vec::new();
        for &concurrency in &settings.concurrency {
            rows.push(uncontended(&settings, &server, concurrency, &store, &hand).await);
        }
        print_uncontended(&rows);
    }

    if settings.runs("handoff") {
        let raw = RawLocks::connect(&url, TIMEOUT).await;
        let floor = floor(&settings, &raw).await;
        let mut runs = Vec::new();
        let shared = Locks::with_namespace(store.clone(), namespace("one-store"));
        runs.push(
            handoff(
                "1 store, 8 tasks",
                &settings,
                &server,
                vec![shared; CONTENDERS],
            )
            .await,
        );
        let ns = namespace("eight-stores");
        let mut separate = Vec::new();
        for _ in 0..CONTENDERS {
            let store = RedisStore::connect(&store_url)
                .await
                .expect("connect a store");
            separate.push(Locks::with_namespace(Arc::new(store), ns.clone()));
        }
        runs.push(handoff("8 stores, 1 task each", &settings, &server, separate).await);
        print_handoffs(&runs, &floor);
    }
}

fn namespace(name: &str) -> Namespace {
    Namespace::new(format!("bench-{name}")).expect("a valid namespace")
}

/// What one slice of acquire+release pairs runs.
#[derive(Clone)]
enum Subject {
    /// `Locks::acquire` + `LockGuard::release`.
    Locks(Locks),
    /// `LeaseStore::claim` + `release` with a fresh holder per pair.
    Atoms(Arc<RedisStore>, Namespace),
    /// The store's claim and release scripts sent by hand.
    Scripts(Arc<RawScripts>),
    /// `SET NX PX` + `EVALSHA` compare-and-delete by hand.
    Raw(Arc<RawLocks>),
}

impl Subject {
    /// One acquire+release pair by worker `worker`, on a key of its own.
    async fn pair(&self, worker: usize) {
        match self {
            Subject::Locks(locks) => {
                let guard = locks
                    .acquire(&format!("bench-{worker}"), &LockOptions::new(TTL))
                    .await
                    .expect("an uncontended acquire");
                guard.release().await;
            }
            Subject::Atoms(store, ns) => {
                let key: StoreKey = ns.qualify(
                    KeyKind::Lock,
                    &Key::new(format!("atoms-{worker}")).expect("a valid key"),
                );
                let holder = Holder::random();
                let ttl = Ttl::new(TTL).expect("a valid ttl");
                match store.claim(&key, LeaseRequest::new(&holder, ttl)).await {
                    Ok(Claim::Granted { .. }) => {}
                    other => panic!("uncontended claim answered {other:?}"),
                }
                match store.release(&key, &holder).await {
                    Ok(Release::Removed) => {}
                    other => panic!("release answered {other:?}"),
                }
            }
            Subject::Scripts(scripts) => {
                let key = format!("bench-scripts:lock:scripts-{worker}");
                scripts.pair(&key, Holder::random().as_str(), TTL).await;
            }
            Subject::Raw(raw) => {
                let key = format!("{{bench-raw:lock:raw-{worker}}}");
                raw.pair(&key, Holder::random().as_str(), TTL).await;
            }
        }
    }

    /// Pairs per second of `concurrency` tasks over one slice, and the CPU each pair cost.
    async fn slice(
        &self,
        concurrency: usize,
        length: Duration,
        server: &Arc<RedisServer>,
    ) -> Slice {
        let cpu_before = Cpu::now(server).await;
        let start = Instant::now();
        let stop = start + length;
        let tasks: Vec<_> = (0..concurrency)
            .map(|worker| {
                let subject = self.clone();
                tokio::spawn(async move {
                    let mut pairs = 0u64;
                    while Instant::now() < stop {
                        subject.pair(worker).await;
                        pairs += 1;
                    }
                    pairs
                })
            })
            .collect();
        let mut pairs = 0;
        for task in tasks {
            pairs += task.await.expect("a benchmark task panicked");
        }
        let elapsed = start.elapsed();
        let cpu = Cpu::now(server).await.since(&cpu_before);
        let per_pair = |seconds: f64| seconds * 1e6 / pairs.max(1) as f64;
        Slice {
            per_sec: pairs as f64 / elapsed.as_secs_f64(),
            client_us: per_pair(cpu.client),
            redis_us: per_pair(cpu.redis),
            ratio: f64::NAN,
        }
    }
}

/// One slice's figures.
#[derive(Debug, Clone, Copy)]
struct Slice {
    per_sec: f64,
    /// CPU time of this process per pair, in microseconds.
    client_us: f64,
    /// CPU time of the redis-server per pair, in microseconds.
    redis_us: f64,
    /// Throughput as a ratio to the baseline's slice of the same round; in a summary, the
    /// median of those.
    ratio: f64,
}

/// CPU seconds used so far by this process (all threads) and by the redis-server.
#[derive(Debug, Clone, Copy)]
struct Cpu {
    client: f64,
    redis: f64,
}

impl Cpu {
    async fn now(server: &Arc<RedisServer>) -> Cpu {
        let server = Arc::clone(server);
        tokio::task::spawn_blocking(move || Cpu {
            client: client_cpu_seconds(),
            redis: redis_cpu_seconds(&server),
        })
        .await
        .expect("CPU readings")
    }

    fn since(&self, before: &Cpu) -> Cpu {
        Cpu {
            client: self.client - before.client,
            redis: self.redis - before.redis,
        }
    }
}

/// `utime + stime` of this process from `/proc/self/stat`, in seconds (USER_HZ = 100).
fn client_cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // The fields after the parenthesised command name; utime and stime are the 14th and
    // 15th fields of the line, the 12th and 13th after the name.
    let after_name = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (ticks(11) + ticks(12)) / 100.0
}

/// `used_cpu_sys + used_cpu_user` of the redis-server, from `INFO cpu`.
fn redis_cpu_seconds(server: &RedisServer) -> f64 {
    let info = server.info("cpu").expect("INFO cpu");
    let field = |name: &str| {
        info.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    field("used_cpu_sys:") + field("used_cpu_user:")
}

/// The uncontended figures at one concurrency: the median slice of each subject, in the
/// order of [`SUBJECTS`].
struct Uncontended {
    concurrency: usize,
    subjects: Vec<Slice>,
}

/// The uncontended subjects, as `--subjects` names them, in the order of [`SUBJECTS`].
const SUBJECT_KEYS: [&str; 4] = ["locks", "atoms", "scripts", "raw"];

/// The uncontended subjects, as the table names them; the last is the baseline.
const SUBJECTS: [&str; 4] = [
    "baton::lock::Locks acquire+release",
    "store atoms claim+release",
    "store scripts by hand (claim.lua + release.lua)",
    "baseline: SET NX PX + EVALSHA compare-and-delete",
];

async fn uncontended(
    settings: &Settings,
    server: &Arc<RedisServer>,
    concurrency: usize,
    store: &Arc<RedisStore>,
    hand: &Hand,
) -> Uncontended {
    let subjects = subjects(store, hand);
    let runs: Vec<bool> = SUBJECT_KEYS
        .iter()
        .map(|name| settings.runs_subject(name))
        .collect();
    // Warm up: connections, script cache, allocator.
    for (subject, _) in subjects.iter().zip(&runs).filter(|(_, runs)| **runs) {
        subject.slice(concurrency, settings.slice / 4, server).await;
    }
    let mut results: Vec<Vec<Slice>> = vec![Vec::new(); subjects.len()];
    let baseline = subjects.len() - 1;
    for round in 0..settings.slices {
        // Rotate who goes first, so no subject always follows the same one.
        for i in (0..subjects.len()).map(|i| (i + round) % subjects.len()) {
            if runs[i] {
                results[i].push(subjects[i].slice(concurrency, settings.slice, server).await);
            }
        }
        // Each subject's throughput against the baseline's in the same round: the rounds
        // are a few seconds long, so these ratios shrug off the load drifting between rounds.
        let base = results[baseline][round].per_sec;
        for result in results.iter_mut().filter(|r| r.len() > round) {
            result[round].ratio = result[round].per_sec / base;
        }
    }
    let summary = |slices: &[Slice]| {
        let of = |f: fn(&Slice) -> f64| median(&slices.iter().map(f).collect::<Vec<_>>());
        Slice {
            per_sec: of(|s| s.per_sec),
            client_us: of(|s| s.client_us),
            redis_us: of(|s| s.redis_us),
            ratio: of(|s| s.ratio),
        }
    };
    Uncontended {
        concurrency,
        subjects: results.iter().map(|r| summary(r)).collect(),
    }
}

/// The uncontended subjects, in the order of [`SUBJECTS`].
fn subjects(store: &Arc<RedisStore>, hand: &Hand) -> [Subject; 4] {
    [
        Subject::Locks(Locks::with_namespace(store.clone(), namespace("locks"))),
        Subject::Atoms(Arc::clone(store), namespace("atoms")),
        Subject::Scripts(Arc::clone(&hand.scripts)),
        Subject::Raw(Arc::clone(&hand.raw)),
    ]
}

/// The clients that send requests by hand.
struct Hand {
    scripts: Arc<RawScripts>,
    raw: Arc<RawLocks>,
}

/// One grant seen by a contender.
struct Grant {
    contender: usize,
    granted: Instant,
    release_sent: Instant,
    /// When the release returned to the holder.
    released: Instant,
}

/// The contended figures of one shape.
struct Handoff {
    shape: &'static str,
    grants: usize,
    per_sec: f64,
    handoffs: Vec<Duration>,
    /// For each handoff, how long the holder's `release` took to return (a diagnostic: the
    /// first of the handoff's two round trips, as the releasing holder sees it).
    releases: Vec<Duration>,
    regrants: usize,
    requests: u64,
    /// Microseconds the server spent running the requests (scripts included).
    usec: u64,
    commands: u64,
    by_command: BTreeMap<String, u64>,
    shares: Vec<u64>,
}

/// The latency of a raw `SET NX PX` + compare-and-delete pair, one at a time: the two
/// round trips a release-then-claim handoff needs at least, on this machine, now.
async fn floor(settings: &Settings, raw: &RawLocks) -> Vec<Duration> {
    let stop = Instant::now() + settings.handoff_for;
    let mut pairs = Vec::new();
    while Instant::now() < stop {
        let started = Instant::now();
        raw.pair("{bench-floor:lock:floor}", Holder::random().as_str(), TTL)
            .await;
        pairs.push(started.elapsed());
        // Paced like a contender, so the runtime idles between pairs as it does there.
        tokio::time::sleep(HOLD).await;
    }
    pairs.sort();
    pairs
}

async fn command_calls(server: &Arc<RedisServer>) -> BTreeMap<String, u64> {
    let server = Arc::clone(server);
    tokio::task::spawn_blocking(move || server.command_calls())
        .await
        .expect("INFO commandstats")
        .expect("INFO commandstats")
}

/// Microseconds the server has spent running client requests (`EVALSHA`/`EVAL`, scripts
/// included), from the `usec` fields of `INFO commandstats`.
async fn request_usec(server: &Arc<RedisServer>) -> u64 {
    let server = Arc::clone(server);
    let info = tokio::task::spawn_blocking(move || server.info("commandstats"))
        .await
        .expect("INFO commandstats")
        .expect("INFO commandstats");
    info.lines()
        .filter(|l| {
            REQUESTS
                .iter()
                .any(|r| l.starts_with(&format!("cmdstat_{r}:")))
        })
        .filter_map(|l| {
            l.split(',')
                .find_map(|field| field.strip_prefix("usec="))
                .and_then(|usec| usec.parse::<u64>().ok())
        })
        .sum()
}

async fn handoff(
    shape: &'static str,
    settings: &Settings,
    server: &Arc<RedisServer>,
    contenders: Vec<Locks>,
) -> Handoff {
    let options = LockOptions::new(TTL).wait(Duration::from_secs(60));
    let before = command_calls(server).await;
    let usec_before = request_usec(server).await;
    let start = Instant::now();
    let stop_at = start + settings.handoff_for;
    let mut tasks = Vec::new();
    for (contender, locks) in contenders.into_iter().enumerate() {
        let options = options.clone();
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
                let released = Instant::now();
                grants.push(Grant {
                    contender,
                    granted,
                    release_sent,
                    released,
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
    let after = command_calls(server).await;
    let usec = request_usec(server).await - usec_before;
    let by_command: BTreeMap<String, u64> = after
        .iter()
        .filter(|(name, _)| name.as_str() != "info")
        .map(|(name, &n)| (name.clone(), n - before.get(name).copied().unwrap_or(0)))
        .filter(|(_, n)| *n > 0)
        .collect();
    grants.sort_by_key(|g| g.granted);

    let mut handoffs = Vec::new();
    let mut releases = Vec::new();
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
            releases.push(
                pair[0]
                    .released
                    .saturating_duration_since(pair[0].release_sent),
            );
        }
    }
    handoffs.sort();
    releases.sort();
    let mut shares = vec![0u64; CONTENDERS];
    for grant in &grants {
        shares[grant.contender] += 1;
    }
    Handoff {
        shape,
        grants: grants.len(),
        per_sec: grants.len() as f64 / elapsed.as_secs_f64(),
        handoffs,
        releases,
        regrants,
        requests: REQUESTS.iter().filter_map(|r| by_command.get(*r)).sum(),
        usec,
        commands: by_command.values().sum(),
        by_command,
        shares,
    }
}

fn print_uncontended(rows: &[Uncontended]) {
    println!(
        "\nUncontended acquire+release pairs/s, C tasks through one client, a key per task; \
         ratio to the baseline at the same C; CPU microseconds per pair, this process + redis-server"
    );
    let baseline = SUBJECTS.len() - 1;
    println!(
        "{:<52} {:>4} {:>10} {:>6} {:>8} {:>12}",
        "subject", "C", "pairs/s", "ratio", "by round", "CPU us/pair"
    );
    for row in rows {
        let base = row.subjects[baseline].per_sec;
        for (name, slice) in SUBJECTS.iter().zip(&row.subjects) {
            if slice.per_sec.is_nan() {
                continue; // not run (--subjects)
            }
            println!(
                "{name:<52} {:>4} {:>10} {:>6.2} {:>8.2} {:>12}",
                row.concurrency,
                thousands(slice.per_sec),
                slice.per_sec / base,
                slice.ratio,
                format!("{:.0}+{:.0}", slice.client_us, slice.redis_us),
            );
        }
    }
    println!(
        "baseline: raw SET key token NX PX + EVALSHA compare-and-delete over the same redis \
         ConnectionManager (one multiplexed connection) at the same concurrency; \
         ratio: of the median slices; by round: the median of each round's ratio to the \
         baseline's slice of the same round; target for baton::lock::Locks: ratio >= 0.80"
    );
}

fn print_handoffs(runs: &[Handoff], floor: &[Duration]) {
    println!(
        "\nContended: {CONTENDERS} contenders on one key, hold {}, {} away between attempts",
        ms(HOLD),
        ms(AWAY)
    );
    println!(
        "{:<22} {:>9} {:>7} {:>8} {:>9} {:>9} {:>9} {:>9} {:>10} {:>9}  share per contender (%)",
        "shape",
        "grants/s",
        "grants",
        "handoffs",
        "p50",
        "p99",
        "max",
        "req/hand",
        "cmds/hand",
        "min share",
    );
    for run in runs {
        let total: u64 = run.shares.iter().sum();
        let shares: Vec<String> = run
            .shares
            .iter()
            .map(|&s| format!("{:.1}", 100.0 * s as f64 / total.max(1) as f64))
            .collect();
        let fair = total as f64 / CONTENDERS as f64;
        let min_share = run.shares.iter().copied().min().unwrap_or(0) as f64 / fair.max(1.0);
        let per_handoff = |n: u64| n as f64 / run.handoffs.len().max(1) as f64;
        println!(
            "{:<22} {:>9} {:>7} {:>8} {:>9} {:>9} {:>9} {:>9.2} {:>10.2} {:>8.0}%  {}",
            run.shape,
            thousands(run.per_sec),
            run.grants,
            run.handoffs.len(),
            ms(percentile(&run.handoffs, 0.50)),
            ms(percentile(&run.handoffs, 0.99)),
            ms(percentile(&run.handoffs, 1.0)),
            per_handoff(run.requests),
            per_handoff(run.commands),
            100.0 * min_share,
            shares.join(" "),
        );
        let breakdown: Vec<String> = run
            .by_command
            .iter()
            .map(|(name, &n)| format!("{name} {:.2}", per_handoff(n)))
            .collect();
        println!("    per handoff: {}", breakdown.join(", "));
        println!(
            "    server time running the requests: {:.1} us per handoff; the release returned \
             to its holder after p50 {}",
            per_handoff(run.usec),
            ms(percentile(&run.releases, 0.50)),
        );
        if run.regrants > 0 {
            println!(
                "    ({} grants went back to the contender that had just released)",
                run.regrants
            );
        }
    }
    println!(
        "floor: a raw SET NX PX + compare-and-delete pair (the two round trips of a release \
         then a claim), one at a time on this machine during this run: p50 {}, p99 {}, max {} \
         ({} pairs)",
        ms(percentile(floor, 0.50)),
        ms(percentile(floor, 0.99)),
        ms(percentile(floor, 1.0)),
        floor.len()
    );
    println!(
        "req/hand: client requests (EVALSHA/EVAL) per handoff; cmds/hand: every command in INFO \
         commandstats, including those the scripts call; min share: the smallest contender's \
         grants as a share of the fair 1/{CONTENDERS}. Targets: p50 <= 0.3ms, p99 <= 2ms, \
         <= 4 commands per handoff, min share >= 50%."
    );
}
