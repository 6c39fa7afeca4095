//! etcd benchmark: baton's cost per grant on etcd against etcd's own lock protocol, in one
//! run on one private three-member cluster (DESIGN §9).
//!
//! ```text
//! cargo bench -p baton-etcd --bench etcd_locks              # full run (about two minutes)
//! cargo bench -p baton-etcd --bench etcd_locks -- --quick   # short run (or BATON_BENCH_QUICK=1)
//! ```
//!
//! The baseline is the protocol of etcd's Go `concurrency.Mutex` on a `Session` of its own
//! per grant, done by hand with the same client (`etcd_client`): grant a lease; one
//! transaction that puts `<prefix><lease>` on it if its create revision is 0 and reads the
//! prefix's owner (the key created first); if the owner is not this key, wait for the
//! deletion of the key created just before it (a read, then a watch) and read the owner
//! again; to give it back, delete the key and revoke the lease. baton's lock, opened with
//! `baton::connect`, does a lease grant and a transaction to take, and a read, a
//! transaction and a lease revoke to give back.
//!
//! - **Uncontended**: `TASKS` tasks in this process take and give back locks, one pair after
//!   another, each on keys of its own, so nobody waits; pairs per second. The two subjects
//!   run in alternating slices, the order rotating each round; a figure is the median of its
//!   slices and the ratio the median of the per-round ratios.
//! - **Contended across processes**: `PROCESSES` OS processes (this binary started again,
//!   with `--child`) contend for one key from a common start to a common stop: take (waiting),
//!   hold 1 ms, give back, stay away 1 ms. Grants per second over all processes, and the
//!   hand-off: the next grant to a *different* process minus the time the previous holder
//!   sent its release (p50, p99), from readings of the host's `CLOCK_MONOTONIC`.
//!
//! Benchmarks are not tests: nothing here asserts a speed.

use std::fs::File;
use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use baton::lock::LockOptions;
use baton_testkit::MonoTime;
use baton_testkit::etcd::EtcdCluster;
use baton_testkit::stats::{
    BenchArgs, handoffs, median, ms, percentile, run_contender_processes, thousands,
};
use etcd_client::{
    Client, Compare, CompareOp, EventType, GetOptions, PutOptions, SortOrder, SortTarget, Txn,
    TxnOp, TxnOpResponse, WatchOptions,
};

/// Tasks taking uncontended pairs at once.
const TASKS: usize = 16;
/// OS processes contending for one key.
const PROCESSES: usize = 4;
/// The TTL of every grant (whole seconds on etcd): far above any pair.
const TTL: Duration = Duration::from_secs(10);
/// How long each contended holder holds, and stays away between attempts.
const HOLD: Duration = Duration::from_millis(1);
const AWAY: Duration = Duration::from_millis(1);
/// Time the children get to start and connect before the common start.
const STARTUP: Duration = Duration::from_secs(3);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Subject {
    /// baton's lock on etcd.
    Baton,
    /// etcd's Mutex protocol, by hand.
    Mutex,
}

impl Subject {
    const BOTH: [Subject; 2] = [Subject::Baton, Subject::Mutex];

    fn name(self) -> &'static str {
        match self {
            Subject::Baton => "baton",
            Subject::Mutex => "mutex",
        }
    }

    fn parse(name: &str) -> Subject {
        match name {
            "baton" => Subject::Baton,
            "mutex" => Subject::Mutex,
            other => panic!("unknown subject {other:?}"),
        }
    }
}

fn main() {
    let args = BenchArgs::from_env();
    if let Some(child_args) = args.after("--child") {
        child(child_args);
        return;
    }
    let (slices, slice, rounds, run_for) = if args.quick() {
        (3, Duration::from_millis(500), 1, Duration::from_secs(2))
    } else {
        (7, Duration::from_secs(2), 3, Duration::from_secs(5))
    };
    let cluster = EtcdCluster::start().expect("a private three-member etcd cluster");
    let url = cluster.url();
    println!(
        "etcd (3 members on loopback) — uncontended: {TASKS} tasks, {slices} alternating \
         slices of {slice:?}; contended: {PROCESSES} processes, hold {HOLD:?}, away {AWAY:?}, \
         {rounds} round(s) of {run_for:?}; load average {}",
        load_average()
    );

    let runtime = runtime();
    let (pairs, to_mutex) = runtime.block_on(async {
        let baton = baton::connect(&url).await.expect("baton on the cluster");
        let raw = connect_raw(&url).await;
        uncontended(&baton, &raw, slices, slice).await
    });

    let dir = tempfile::tempdir().expect("a temporary directory");
    let mut contended: [(usize, f64, Vec<Duration>); 2] = Default::default();
    for round in 0..rounds {
        for step in 0..Subject::BOTH.len() {
            let i = (step + round) % Subject::BOTH.len();
            let (grants, failures, seconds) = run_contender_processes(
                &["--child", Subject::BOTH[i].name(), &url],
                PROCESSES,
                STARTUP,
                run_for,
                dir.path(),
            );
            assert_eq!(failures, 0, "contenders write no failures: they panic");
            let figures = &mut contended[i];
            figures.0 += grants.len();
            figures.1 += seconds;
            figures.2.extend(handoffs(&grants));
        }
    }
    for figures in &mut contended {
        figures.2.sort();
    }

    println!();
    println!("| uncontended | pairs/s | baton against it |");
    println!("|---|---:|---:|");
    println!("| baton | {} | — |", thousands(pairs[0]));
    println!(
        "| etcd Mutex protocol, raw client | {} | {to_mutex:.2}x |",
        thousands(pairs[1])
    );
    println!();
    println!("| {PROCESSES} processes, one key | acq/s | handoff p50 | p99 |");
    println!("|---|---:|---:|---:|");
    for (subject, (grants, seconds, handoffs)) in ["baton", "etcd Mutex protocol, raw client"]
        .iter()
        .zip(&contended)
    {
        println!(
            "| {subject} | {:.0} | {} | {} |",
            *grants as f64 / seconds.max(f64::EPSILON),
            ms(percentile(handoffs, 0.5)),
            ms(percentile(handoffs, 0.99)),
        );
    }
    let rate = |i: usize| contended[i].0 as f64 / contended[i].1.max(f64::EPSILON);
    let p50 = |i: usize| percentile(&contended[i].2, 0.5).as_secs_f64();
    println!();
    println!(
        "baton against the Mutex protocol: uncontended pairs/s {to_mutex:.2}x; contended acq/s \
         {:.2}x, handoff p50 {:.2}x",
        rate(0) / rate(1),
        p50(0) / p50(1)
    );
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split(' ').take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".to_owned())
}

/// A raw client on the members an `etcd://` URL names.
async fn connect_raw(url: &str) -> Client {
    let members: Vec<&str> = url.trim_start_matches("etcd://").split(',').collect();
    Client::connect(members, None).await.expect("a raw client")
}

/// Both subjects in alternating slices: each one's median pairs/s, and the median per-round
/// ratio of baton's to the Mutex protocol's.
async fn uncontended(
    baton: &baton::Baton,
    raw: &Client,
    slices: usize,
    slice: Duration,
) -> ([f64; 2], f64) {
    let mut rates: [Vec<f64>; 2] = Default::default();
    let mut ratios = Vec::new();
    for round in 0..slices {
        let mut this = [0.0; 2];
        for step in 0..Subject::BOTH.len() {
            let i = (step + round) % Subject::BOTH.len();
            this[i] = pairs_per_second(Subject::BOTH[i], baton, raw, round, slice).await;
        }
        rates[0].push(this[0]);
        rates[1].push(this[1]);
        ratios.push(this[0] / this[1]);
    }
    ([median(&rates[0]), median(&rates[1])], median(&ratios))
}

/// Pairs per second of `TASKS` tasks taking and giving back locks of their own keys.
async fn pairs_per_second(
    subject: Subject,
    baton: &baton::Baton,
    raw: &Client,
    round: usize,
    slice: Duration,
) -> f64 {
    let pairs = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for task in 0..TASKS {
        let (baton, raw, pairs) = (baton.clone(), raw.clone(), Arc::clone(&pairs));
        tasks.push(tokio::spawn(async move {
            let options = LockOptions::new(TTL);
            let mut n = 0u64;
            while started.elapsed() < slice {
                let key = format!("bench-{round}-{task}-{}", n % 16);
                match subject {
                    Subject::Baton => {
                        let guard = baton.locks().acquire(&key, &options).await.expect("free");
                        guard.release().await;
                    }
                    Subject::Mutex => {
                        let held = mutex_lock(&raw, &format!("{key}/")).await;
                        mutex_unlock(&raw, held).await;
                    }
                }
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

/// A grant of the Mutex protocol: the holder's lease and key.
struct Held {
    lease: i64,
    key: String,
}

/// Takes the lock `prefix` as etcd's Go `concurrency.Mutex.Lock` does, on a lease of its own.
async fn mutex_lock(raw: &Client, prefix: &str) -> Held {
    let (mut kv, mut leases) = (raw.kv_client(), raw.lease_client());
    let lease = leases
        .grant(TTL.as_secs() as i64, None)
        .await
        .expect("lease grant")
        .id();
    let key = format!("{prefix}{lease:x}");
    let owner = || {
        TxnOp::get(
            prefix,
            Some(
                GetOptions::new()
                    .with_prefix()
                    .with_sort(SortTarget::Create, SortOrder::Ascend)
                    .with_limit(1),
            ),
        )
    };
    let answer = kv
        .txn(
            Txn::new()
                .when([Compare::create_revision(key.as_str(), CompareOp::Equal, 0)])
                .and_then([
                    TxnOp::put(key.as_str(), "", Some(PutOptions::new().with_lease(lease))),
                    owner(),
                ])
                .or_else([TxnOp::get(key.as_str(), None), owner()]),
        )
        .await
        .expect("the Mutex's transaction");
    let mut gets = answer.op_responses().into_iter().filter_map(|r| match r {
        TxnOpResponse::Get(get) => Some(get),
        _ => None,
    });
    let mine = if answer.succeeded() {
        answer.header().expect("a header").revision()
    } else {
        gets.next().expect("its own key").kvs()[0].create_revision()
    };
    let first = gets.next_back().expect("the owner").kvs()[0].create_revision();
    if first != mine {
        wait_for_predecessors(raw, prefix, mine).await;
    }
    Held { lease, key }
}

/// Waits until no key under `prefix` created before `mine` is left, as the Go Mutex's
/// `waitDeletes` does: read the newest such key, watch it until it is deleted, again.
async fn wait_for_predecessors(raw: &Client, prefix: &str, mine: i64) {
    let (mut kv, mut watch) = (raw.kv_client(), raw.watch_client());
    loop {
        let before = kv
            .get(
                prefix,
                Some(
                    GetOptions::new()
                        .with_prefix()
                        .with_sort(SortTarget::Create, SortOrder::Descend)
                        .with_limit(1)
                        .with_max_create_revision(mine - 1),
                ),
            )
            .await
            .expect("the predecessor");
        let Some(last) = before.kvs().first() else {
            return;
        };
        let revision = before.header().expect("a header").revision() + 1;
        let mut stream = watch
            .watch(
                last.key().to_vec(),
                Some(WatchOptions::new().with_start_revision(revision)),
            )
            .await
            .expect("a watch");
        'deleted: while let Some(answer) = stream.message().await.expect("a watch answer") {
            for event in answer.events() {
                if event.event_type() == EventType::Delete {
                    break 'deleted;
                }
            }
        }
    }
}

/// Gives the lock back as the Go Mutex's `Unlock` and the session's `Close` do.
async fn mutex_unlock(raw: &Client, held: Held) {
    raw.kv_client()
        .delete(held.key, None)
        .await
        .expect("the Mutex's delete");
    raw.lease_client()
        .revoke(held.lease)
        .await
        .expect("lease revoke");
}

/// A contender process: `SUBJECT URL START STOP OUT`, one line per grant
/// (`granted release_sent`).
fn child(args: &[String]) {
    let [subject, url, start, stop, out] = args else {
        panic!("--child SUBJECT URL START STOP OUT, got {args:?}");
    };
    let subject = Subject::parse(subject);
    let (start, stop): (u64, u64) = (start.parse().expect("START"), stop.parse().expect("STOP"));
    let runtime = runtime();
    let lines = runtime.block_on(async {
        let baton = baton::connect(url).await.expect("baton on the cluster");
        let raw = connect_raw(url).await;
        let options = LockOptions::new(TTL).wait(Duration::from_secs(30));
        let now = || MonoTime::now().as_nanos();
        tokio::time::sleep(Duration::from_nanos(start.saturating_sub(now()))).await;
        let mut lines = Vec::new();
        while now() < stop {
            let granted;
            let sent;
            match subject {
                Subject::Baton => {
                    let guard = baton
                        .locks()
                        .acquire("contended", &options)
                        .await
                        .expect("a grant");
                    granted = now();
                    std::thread::sleep(HOLD);
                    sent = now();
                    guard.release().await;
                }
                Subject::Mutex => {
                    let held = mutex_lock(&raw, "contended/").await;
                    granted = now();
                    std::thread::sleep(HOLD);
                    sent = now();
                    mutex_unlock(&raw, held).await;
                }
            }
            lines.push(format!("{granted} {sent}"));
            tokio::time::sleep(AWAY).await;
        }
        lines
    });
    let mut out = std::io::BufWriter::new(File::create(out).expect("create OUT"));
    for line in lines {
        writeln!(out, "{line}").expect("write a grant");
    }
    out.flush().expect("flush the grants");
}
