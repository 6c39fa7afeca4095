//! Claimable-work benchmark against a private PostgreSQL server (started by `baton-testkit`
//! with `fsync` on, as in production): items claimed and completed per second through the
//! store's atoms, as a ratio to `pgbench` running the very same two statements
//! ([`sql::CLAIM`], [`sql::COMPLETE`]) against the same server (DESIGN §9).
//!
//! ```text
//! cargo bench -p baton-postgres --bench work              # full run (about 10 minutes on 2 cores)
//! cargo bench -p baton-postgres --bench work -- --quick   # short run (or BATON_BENCH_QUICK=1)
//! ```
//!
//! For each number of workers W (1, 8, 32) and claim batch B (1, 100), each subject runs W
//! workers that claim up to B items with a fresh token and complete each claimed item, one
//! `COMPLETE` per item, as fast as they can, on a queue prefilled for the whole slice:
//! - **store atoms**: `QueueStore::claim` and `QueueStore::complete` on one
//!   `PostgresStore` with a pool of W connections (`listen=off`), W tokio tasks on a
//!   2-thread runtime (the statements, their binding and decoding, and the per-call
//!   deadline, without any policy layer);
//! - **raw sqlx**: the same two statements bound and run by hand over a sqlx pool
//!   configured like the store's (W connections, no test before acquire), on the same
//!   runtime: what the driver and the runtime cost, without baton's code;
//! - **pgbench** (the baseline): `pgbench -n -M prepared -c W -j min(W, 2) -T <slice>`
//!   running a custom script of the same SQL texts, their `$n` parameters replaced by
//!   pgbench variables (`-M prepared`, like sqlx, prepares each statement once per
//!   connection).
//!
//! Batch 1: every worker claims from one shared queue (`FOR UPDATE SKIP LOCKED` between
//! them); pgbench takes the claimed id with `\gset`. Batch 100: pgbench cannot read 100
//! rows into variables, so every worker has a queue of its own, prefilled with consecutive
//! ids, and the script computes the 100 ids its claim took (`\set` arithmetic over
//! `:client_id` and a per-client counter) for its 100 `COMPLETE`s; the store subject uses
//! the same per-worker queues. Every slice is checked afterwards: the items gone from the
//! queues must match the completions counted (a pgbench client that ran dry, or completed
//! ids its claim did not take, would count transactions without completions), else the
//! slice runs again with a larger prefill.
//!
//! Subjects run in rotating order round by round, with the table vacuumed between slices,
//! so drift on a loaded machine hits all of them; a throughput figure is the median of its
//! slices (with the range of its slices), a ratio the median of per-round ratios to
//! pgbench. Benchmarks are not tests: nothing here asserts.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use baton_core::work::store::{
    ClaimRequest, Enqueued, ItemId, ItemRef, NewItem, QueueStore, Settle,
};
use baton_core::{Holder, StoreKey, Ttl};
use baton_postgres::PostgresStore;
use baton_postgres::work::sql;
use baton_testkit::postgres::{PostgresOptions, PostgresServer};
use baton_testkit::stats::{BenchArgs, median, min_max};
use sqlx::postgres::PgPoolOptions;
use sqlx::{PgPool, Row};

#[path = "shared/raw_pool.rs"]
mod raw_pool;
use raw_pool::raw_pool;

const WORKERS: [usize; 3] = [1, 8, 32];
const BATCHES: [u32; 2] = [1, 100];
/// The lease of every claim: far above any slice, so nothing lapses.
const LEASE_MS: u64 = 60_000;
/// Items per `ENQUEUE` statement while prefilling.
const CHUNK: usize = 10_000;
/// How often a slice that ran dry is run again with twice the prefill.
const REFILLS: usize = 4;

struct Settings {
    rounds: usize,
    slice_secs: u64,
    workers: Vec<usize>,
    batches: Vec<u32>,
}

impl Settings {
    /// `--quick` (or `BATON_BENCH_QUICK=1`) for a short run; `BATON_BENCH_ROUNDS=n`,
    /// `BATON_BENCH_WORKERS=1,8` and `BATON_BENCH_BATCHES=1` narrow a run to look closer.
    fn from_args() -> Settings {
        let quick = BenchArgs::from_env().quick();
        let list = |name: &str| -> Option<Vec<u64>> {
            let text = std::env::var(name).ok()?;
            Some(
                text.split(',')
                    .map(|n| n.trim().parse().unwrap_or_else(|_| panic!("{name}={text}")))
                    .collect(),
            )
        };
        let (rounds, slice_secs) = if quick { (2, 2) } else { (3, 5) };
        Settings {
            rounds: list("BATON_BENCH_ROUNDS").map_or(rounds, |r| r[0] as usize),
            slice_secs,
            workers: list("BATON_BENCH_WORKERS").map_or(WORKERS.to_vec(), |w| {
                w.into_iter().map(|n| n as usize).collect()
            }),
            batches: list("BATON_BENCH_BATCHES").map_or(BATCHES.to_vec(), |b| {
                b.into_iter().map(|n| n as u32).collect()
            }),
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Subject {
    Atoms,
    Sqlx,
    Pgbench,
}

const SUBJECTS: [Subject; 3] = [Subject::Atoms, Subject::Sqlx, Subject::Pgbench];

/// What one slice measured.
struct Slice {
    items: u64,
    elapsed: Duration,
    /// The queue ran out of items before the slice ended (the figure is not valid).
    ran_dry: bool,
}

impl Slice {
    fn rate(&self) -> f64 {
        self.items as f64 / self.elapsed.as_secs_f64()
    }
}

/// The queues of one slice and their prefilled items.
struct Fill {
    /// The shared queue (batch 1), or one queue per worker (batch 100).
    queues: Vec<StoreKey>,
    /// Per-worker queues: the first id of worker 0's queue and the items per worker, ids
    /// being consecutive across the workers' queues.
    first_id: i64,
    per_worker: u64,
    total: u64,
    /// The number the queue names start at (`qbase`, `qbase + 1`, ...).
    qbase: u64,
}

fn main() {
    let settings = Settings::from_args();
    let server = PostgresServer::start_with(PostgresOptions::new().durable())
        .expect("a private PostgreSQL server (apt-get install postgresql)");
    let pgbench = find_pgbench(server.bin_dir());
    let scripts = tempfile::tempdir().expect("a directory for the pgbench scripts");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let url = server.url();
    let port = server.port();
    let dir = scripts.path().to_owned();
    runtime.block_on(async move {
        tokio::spawn(run(url, port, pgbench, dir, settings))
            .await
            .expect("the benchmark panicked")
    });
}

fn find_pgbench(bin_dir: &Path) -> PathBuf {
    let beside = bin_dir.join("pgbench");
    if beside.exists() {
        return beside;
    }
    let usual = PathBuf::from("/usr/bin/pgbench");
    if usual.exists() {
        return usual;
    }
    PathBuf::from("pgbench")
}

fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

async fn run(url: String, port: u16, pgbench: PathBuf, dir: PathBuf, settings: Settings) {
    // Creates the schema; also the prefilling store.
    let admin = PostgresStore::connect(&format!("{url}?listen=off&max_connections=4"))
        .await
        .expect("the store");
    let maintenance = PgPoolOptions::new()
        .max_connections(2)
        .connect(&url)
        .await
        .expect("a maintenance pool");
    let scripts = Scripts::write(&dir);
    let version = Command::new(&pgbench)
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", pgbench.display()));
    println!(
        "## Claim + complete (items/s), fsync on, {}s slices, {} rounds, lease {}s\n",
        settings.slice_secs,
        settings.rounds,
        LEASE_MS / 1000
    );
    println!("baseline: {version}; load at start: {}\n", load());
    println!(
        "| workers | batch | queues | store atoms | raw sqlx | pgbench | atoms / pgbench | sqlx / pgbench |"
    );
    println!("|---:|---:|---|---:|---:|---:|---:|---:|");
    for &workers in &settings.workers {
        let store = Arc::new(
            PostgresStore::connect(&format!("{url}?listen=off&max_connections={workers}"))
                .await
                .expect("the store"),
        );
        let pool = raw_pool(&url, workers as u32).await;
        for &batch in &settings.batches {
            // A first guess of the rate, to size the prefill; raised to every rate seen.
            let mut expected_rate: f64 = if batch == 1 { 4_000.0 } else { 20_000.0 };
            let mut rates = [Vec::new(), Vec::new(), Vec::new()];
            let mut ratios = [Vec::new(), Vec::new()];
            for round in 0..settings.rounds {
                let mut round_rates = [0.0; 3];
                for k in 0..SUBJECTS.len() {
                    let subject = SUBJECTS[(k + round) % SUBJECTS.len()];
                    let mut refill = 1.5;
                    let slice = loop {
                        let want = expected_rate * settings.slice_secs as f64 * refill;
                        let fill = prefill(&admin, workers, batch, want as u64).await;
                        let slice = match subject {
                            Subject::Atoms => {
                                atoms(&store, &fill, workers, batch, settings.slice_secs).await
                            }
                            Subject::Sqlx => {
                                raw_sqlx(&pool, &fill, workers, batch, settings.slice_secs).await
                            }
                            Subject::Pgbench => pgbench_slice(
                                &pgbench, &scripts, port, &fill, workers, batch, &settings,
                            ),
                        };
                        let left = cleanup(&maintenance, &fill).await;
                        let gone = fill.total - left;
                        let counted_ok = gone.abs_diff(slice.items) <= (workers as u64) * 100;
                        if !slice.ran_dry && counted_ok {
                            break slice;
                        }
                        refill *= 2.0;
                        assert!(
                            refill <= 1.5 * 2f64.powi(REFILLS as i32),
                            "{subject:?} W={workers} B={batch}: the slice kept running dry ({} items counted, {gone} gone)",
                            slice.items
                        );
                    };
                    let rate = slice.rate();
                    expected_rate = expected_rate.max(rate);
                    rates[subject as usize].push(rate);
                    round_rates[subject as usize] = rate;
                }
                ratios[0].push(round_rates[0] / round_rates[2]);
                ratios[1].push(round_rates[1] / round_rates[2]);
            }
            let figure = |rates: &[f64]| {
                let (min, max) = min_max(rates);
                format!("{:.0} ({min:.0}..{max:.0})", median(rates))
            };
            let queues = if batch == 1 {
                "one shared"
            } else {
                "one per worker"
            };
            println!(
                "| {workers} | {batch} | {queues} | {} | {} | {} | **{:.2}** | {:.2} |",
                figure(&rates[0]),
                figure(&rates[1]),
                figure(&rates[2]),
                median(&ratios[0]),
                median(&ratios[1]),
            );
        }
    }
    println!("\nload at end: {}", load());
}

/// A fresh queue number range per slice, so slices never see each other's items.
fn next_qbase() -> u64 {
    static SLICES: AtomicU64 = AtomicU64::new(1);
    SLICES.fetch_add(1, Ordering::Relaxed) * 1_000_000
}

/// Enqueues at least `want` items: into one shared queue for batch 1, or `workers` queues
/// of consecutive ids (a multiple of 100 each) for batch 100.
async fn prefill(store: &PostgresStore, workers: usize, batch: u32, want: u64) -> Fill {
    let qbase = next_qbase();
    let payload = [7u8; 64];
    let item = NewItem {
        payload: &payload,
        dedup: None,
        delay: Duration::ZERO,
        max_attempts: 3,
    };
    if batch == 1 {
        let queue = StoreKey::from_stored(qbase.to_string());
        let total = want.max(1_000);
        let mut left = total;
        while left > 0 {
            let n = left.min(CHUNK as u64) as usize;
            store
                .enqueue(&queue, &vec![item; n])
                .await
                .expect("prefill");
            left -= n as u64;
        }
        return Fill {
            queues: vec![queue],
            first_id: 0,
            per_worker: 0,
            total,
            qbase,
        };
    }
    let per_worker = (want / workers as u64).div_ceil(100).max(10) * 100;
    let mut queues = Vec::new();
    let mut first_id = None;
    let mut next_expected = None;
    for w in 0..workers {
        let queue = StoreKey::from_stored((qbase + w as u64).to_string());
        let mut left = per_worker;
        while left > 0 {
            let n = left.min(CHUNK as u64) as usize;
            let answers = store
                .enqueue(&queue, &vec![item; n])
                .await
                .expect("prefill");
            for answer in answers {
                let Enqueued::Added(ItemId(id)) = answer else {
                    unreachable!("no de-duplication ids")
                };
                first_id.get_or_insert(id);
                if let Some(expected) = next_expected {
                    assert_eq!(id, expected, "prefilled ids must be consecutive");
                }
                next_expected = Some(id + 1);
            }
            left -= n as u64;
        }
        queues.push(queue);
    }
    Fill {
        queues,
        first_id: first_id.expect("items"),
        per_worker,
        total: per_worker * workers as u64,
        qbase,
    }
}

/// Deletes what is left of the slice's queues, vacuums, and answers how many items were
/// left.
async fn cleanup(raw: &PgPool, fill: &Fill) -> u64 {
    let names: Vec<String> = fill.queues.iter().map(|q| q.as_str().to_owned()).collect();
    let left = sqlx::query("DELETE FROM baton_work_item WHERE queue = ANY($1)")
        .bind(&names)
        .execute(raw)
        .await
        .expect("cleanup")
        .rows_affected();
    sqlx::query("VACUUM baton_work_item")
        .execute(raw)
        .await
        .expect("vacuum");
    left
}

async fn atoms(
    store: &Arc<PostgresStore>,
    fill: &Fill,
    workers: usize,
    batch: u32,
    secs: u64,
) -> Slice {
    let lease = Ttl::new(Duration::from_millis(LEASE_MS)).expect("lease");
    let start = Instant::now();
    let deadline = start + Duration::from_secs(secs);
    let tasks: Vec<_> = (0..workers)
        .map(|w| {
            let store = Arc::clone(store);
            let queue = fill.queues[w % fill.queues.len()].clone();
            tokio::spawn(async move {
                let mut items = 0u64;
                while Instant::now() < deadline {
                    let token = Holder::random();
                    let claimed = store
                        .claim(
                            &queue,
                            ClaimRequest {
                                token: &token,
                                batch,
                                lease,
                            },
                        )
                        .await
                        .expect("claim");
                    if claimed.is_empty() {
                        return (items, true);
                    }
                    for item in claimed {
                        let settled = store
                            .complete(ItemRef::new(&queue, item.id, &token))
                            .await
                            .expect("complete");
                        assert_eq!(settled, Settle::Settled);
                        items += 1;
                    }
                }
                (items, false)
            })
        })
        .collect();
    collect(start, tasks).await
}

/// The store subject's loop, with [`sql::CLAIM`] and [`sql::COMPLETE`] bound and run by
/// hand over `pool`.
async fn raw_sqlx(pool: &PgPool, fill: &Fill, workers: usize, batch: u32, secs: u64) -> Slice {
    let start = Instant::now();
    let deadline = start + Duration::from_secs(secs);
    let tasks: Vec<_> = (0..workers)
        .map(|w| {
            let pool = pool.clone();
            let queue = fill.queues[w % fill.queues.len()].as_str().to_owned();
            tokio::spawn(async move {
                let mut items = 0u64;
                while Instant::now() < deadline {
                    let token = Holder::random();
                    let ids: Vec<i64> = sqlx::query(sql::CLAIM)
                        .bind(&queue)
                        .bind(i64::from(batch))
                        .bind(token.as_str())
                        .bind(LEASE_MS as i64)
                        .fetch_all(&pool)
                        .await
                        .expect("claim")
                        .iter()
                        .map(|row| row.get::<i64, _>("id"))
                        .collect();
                    if ids.is_empty() {
                        return (items, true);
                    }
                    for id in ids {
                        let done = sqlx::query(sql::COMPLETE)
                            .bind(&queue)
                            .bind(id)
                            .bind(token.as_str())
                            .execute(&pool)
                            .await
                            .expect("complete")
                            .rows_affected();
                        assert_eq!(done, 1);
                        items += 1;
                    }
                }
                (items, false)
            })
        })
        .collect();
    collect(start, tasks).await
}

/// Sums the workers' counts of a slice that started at `start`.
async fn collect(start: Instant, tasks: Vec<tokio::task::JoinHandle<(u64, bool)>>) -> Slice {
    let mut slice = Slice {
        items: 0,
        elapsed: Duration::ZERO,
        ran_dry: false,
    };
    for task in tasks {
        let (items, dry) = task.await.expect("worker");
        slice.items += items;
        slice.ran_dry |= dry;
    }
    slice.elapsed = start.elapsed();
    slice
}

/// The two pgbench scripts, written once.
struct Scripts {
    shared: PathBuf,
    per_worker: PathBuf,
}

/// `statement` with `$1`, `$2`, ... replaced by the pgbench variables `names[0]`, ...
fn with_variables(statement: &str, names: &[&str]) -> String {
    let mut text = statement.to_owned();
    // Highest first, so `$1` never eats the start of `$10`.
    for (i, name) in names.iter().enumerate().rev() {
        text = text.replace(&format!("${}", i + 1), &format!(":{name}"));
    }
    assert!(!text.contains('$'), "a parameter was left: {text}");
    text
}

impl Scripts {
    fn write(dir: &Path) -> Scripts {
        let claim = with_variables(sql::CLAIM, &["q", "batch", "tok", "lease"]);
        let complete = with_variables(sql::COMPLETE, &["q", "id", "tok"]);
        let token = "\\set tok random(1, 9223372036854775806)\n";

        // Batch 1, one shared queue: the claimed id comes back through \gset (a claim that
        // finds nothing fails the \gset and aborts the client: a dry run shows).
        let shared = format!("{token}{claim} \\gset\n{complete};\n");

        // Batch 100, a queue per client holding consecutive ids: claim k of client c takes
        // ids first + c * per + (k - 1) * 100 ... + 99, in id order (one enqueue each, so
        // one run_at).
        let mut per_worker = String::new();
        per_worker.push_str("\\set q :qbase + :client_id\n");
        per_worker.push_str("\\set k :k + 1\n");
        per_worker.push_str("\\set base :first + :client_id * :per + (:k - 1) * 100\n");
        per_worker.push_str(token);
        per_worker.push_str(&claim);
        per_worker.push_str(";\n");
        let complete_i = with_variables(sql::COMPLETE, &["q", "id", "tok"]);
        for i in 0..100 {
            per_worker.push_str(&format!("\\set id :base + {i}\n"));
            per_worker.push_str(&complete_i);
            per_worker.push_str(";\n");
        }
        let scripts = Scripts {
            shared: dir.join("claim_complete_shared.pgbench"),
            per_worker: dir.join("claim_complete_per_worker.pgbench"),
        };
        std::fs::write(&scripts.shared, shared).expect("write a pgbench script");
        std::fs::write(&scripts.per_worker, per_worker).expect("write a pgbench script");
        scripts
    }
}

fn pgbench_slice(
    pgbench: &Path,
    scripts: &Scripts,
    port: u16,
    fill: &Fill,
    workers: usize,
    batch: u32,
    settings: &Settings,
) -> Slice {
    let mut command = Command::new(pgbench);
    command
        .args(["-h", "127.0.0.1", "-U", "postgres", "-n", "-M", "prepared"])
        .arg("-p")
        .arg(port.to_string())
        .arg("-c")
        .arg(workers.to_string())
        .arg("-j")
        .arg(workers.min(2).to_string())
        .arg("-T")
        .arg(settings.slice_secs.to_string())
        .arg("-D")
        .arg(format!("batch={batch}"))
        .arg("-D")
        .arg(format!("lease={LEASE_MS}"));
    if batch == 1 {
        command
            .arg("-D")
            .arg(format!("q={}", fill.queues[0].as_str()))
            .arg("-f")
            .arg(&scripts.shared);
    } else {
        command
            .args(["-D", "k=0"])
            .arg("-D")
            .arg(format!("qbase={}", fill.qbase))
            .arg("-D")
            .arg(format!("first={}", fill.first_id))
            .arg("-D")
            .arg(format!("per={}", fill.per_worker))
            .arg("-f")
            .arg(&scripts.per_worker);
    }
    command.arg("postgres");
    let output = command
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", pgbench.display()));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    let field = |prefix: &str| -> Option<f64> {
        stdout.lines().find_map(|line| {
            let rest = line.trim().strip_prefix(prefix)?;
            rest.split_whitespace()
                .next()?
                .split('/')
                .next()?
                .parse()
                .ok()
        })
    };
    let aborted = !output.status.success() || stderr.contains("aborted");
    let transactions = field("number of transactions actually processed:");
    let tps = field("tps =");
    match (transactions, tps) {
        (Some(transactions), Some(tps)) => {
            let items = transactions as u64 * u64::from(batch);
            Slice {
                items,
                elapsed: Duration::from_secs_f64(items as f64 / (tps * f64::from(batch))),
                ran_dry: aborted,
            }
        }
        _ => panic!("pgbench failed ({}):\n{stdout}\n{stderr}", output.status),
    }
}
