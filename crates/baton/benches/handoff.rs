//! Hand-offs across processes: 8 OS processes, as 8 replicas, contend for one key, against
//! each database's own primitive on the same workload, in one run.
//!
//! ```text
//! cargo bench -p baton --bench handoff              # full run (about 2 minutes)
//! cargo bench -p baton --bench handoff -- --quick   # short run (or BATON_BENCH_QUICK=1)
//! cargo bench -p baton --bench handoff -- --only redis
//! ```
//!
//! Each of the 8 processes (this binary started again, with `--child`) opens its own
//! connection, then from a common start: takes the lock (wait up to 5 s, TTL 10 s), holds it
//! for 1 ms (`std::thread::sleep`, as blocking work would), gives it back, stays away 1 ms,
//! until a common stop. Each grant is recorded as two readings of the host's
//! `CLOCK_MONOTONIC`, so the parent can merge the processes' grants into one timeline.
//!
//! Figures of a subject:
//! - `acq/s`: grants over all processes per second of the run;
//! - handoff: the next grant to a *different* process minus the time the previous holder
//!   sent its release (p50, p99);
//! - smallest share: the process with the fewest grants, as a share of a fair 1/8;
//! - re-grants: a grant to the process that released just before it, over all grants
//!   (while 7 others wait, each one is a waiter passed over);
//! - cost per grant: on PostgreSQL, statements run (`pg_stat_statements`), commits that
//!   wrote (transaction ids assigned), commits in all (`pg_stat_database`: they include the
//!   read-only transaction in which each listening backend reads a `NOTIFY`) and WAL flushes
//!   (`pg_stat_wal`); commands (`INFO stats`) on Redis.
//!
//! Subjects, alternated in rounds (the order rotating each round), on private servers
//! started by `baton-testkit`, with `fsync` on:
//! - baton on PostgreSQL, against `pg_advisory_lock` / `pg_advisory_unlock` on a session of
//!   its own per process through the same driver (sqlx), blocking in the server;
//! - baton on SQLite (one file, `synchronous=FULL`), against a blocking `flock` on one file
//!   (the host's floor), and the in-run latency of two durable commits of a file like the
//!   store's;
//! - baton on Redis, against the latency of one raw `SET NX PX` + compare-and-delete pair,
//!   sent one at a time by one client.
//!
//! Benchmarks are not tests: nothing here asserts a speed.

use std::fs::File;
use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use baton::lock::LockOptions;
use baton_testkit::MonoTime;
use baton_testkit::postgres::{PostgresOptions, PostgresServer};
use baton_testkit::process;
use baton_testkit::redis::RedisServer;
use baton_testkit::stats::{
    BenchArgs, ProcessGrant, handoffs, ms, percentile, run_contender_processes,
};
use nix::fcntl::{Flock, FlockArg};

/// OS processes per subject.
const PROCESSES: usize = 8;
/// How long each holder holds, and stays away between attempts.
const HOLD: Duration = Duration::from_millis(1);
const AWAY: Duration = Duration::from_millis(1);
/// The TTL of every grant, and how long an acquire may wait.
const TTL: Duration = Duration::from_secs(10);
const WAIT: Duration = Duration::from_secs(5);
/// The key every process contends for.
const KEY: &str = "handoff";
/// The advisory lock's key.
const ADVISORY_KEY: i64 = 17;
/// Time the children get to start and connect before the common start.
const STARTUP: Duration = Duration::from_secs(3);

#[derive(Debug, Clone)]
struct Settings {
    only: Option<String>,
    rounds: usize,
    run_for: Duration,
}

impl Settings {
    fn from_args(args: &BenchArgs) -> Settings {
        let only = args.value("--only");
        let (rounds, run_for) = if args.quick() {
            (1, Duration::from_secs(2))
        } else {
            (3, Duration::from_secs(5))
        };
        Settings {
            only,
            rounds,
            run_for,
        }
    }
}

/// What one process contends with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// `baton::connect(target)` and its locks.
    Baton,
    /// `pg_advisory_lock` on the database `target`.
    Advisory,
    /// A blocking `flock` on the file `target`.
    Flock,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Baton => "baton",
            Kind::Advisory => "advisory",
            Kind::Flock => "flock",
        }
    }

    fn parse(name: &str) -> Kind {
        match name {
            "baton" => Kind::Baton,
            "advisory" => Kind::Advisory,
            "flock" => Kind::Flock,
            other => panic!("unknown kind {other:?}"),
        }
    }
}

/// One subject: what its processes contend with, and on what.
#[derive(Debug, Clone)]
struct Subject {
    name: &'static str,
    /// Which `--only` selects it.
    family: &'static str,
    kind: Kind,
    target: String,
}

/// One grant, as recorded by its process.
type Grant = ProcessGrant;

/// What a subject's runs add up to.
#[derive(Debug, Default)]
struct Figures {
    grants: usize,
    seconds: f64,
    handoffs: Vec<Duration>,
    regrants: usize,
    shares: Vec<u64>,
    failures: usize,
    /// (statements, transaction ids, commits, WAL flushes) on PostgreSQL, or (commands, 0, 0,
    /// 0) on Redis, over all runs.
    cost: Option<[u64; 4]>,
}

impl Figures {
    fn per_sec(&self) -> f64 {
        self.grants as f64 / self.seconds.max(f64::EPSILON)
    }

    fn p(&self, q: f64) -> Duration {
        percentile(&self.handoffs, q)
    }

    fn smallest_share(&self) -> f64 {
        let total: u64 = self.shares.iter().sum();
        let fair = total as f64 / PROCESSES as f64;
        let least = self.shares.iter().copied().min().unwrap_or(0);
        least as f64 / fair.max(f64::EPSILON)
    }

    fn regrant_share(&self) -> f64 {
        self.regrants as f64 / self.grants.max(1) as f64
    }

    fn add(&mut self, grants: &[Grant], seconds: f64, failures: usize) {
        self.grants += grants.len();
        self.seconds += seconds;
        self.failures += failures;
        if self.shares.is_empty() {
            self.shares = vec![0; PROCESSES];
        }
        for grant in grants {
            self.shares[grant.process] += 1;
        }
        self.regrants += grants
            .windows(2)
            .filter(|pair| pair[0].process == pair[1].process)
            .count();
        self.handoffs.extend(handoffs(grants));
        self.handoffs.sort();
    }
}

fn main() {
    let args = BenchArgs::from_env();
    if let Some(child_args) = args.after("--child") {
        child(child_args);
        return;
    }
    let settings = Settings::from_args(&args);
    let wanted = |family: &str| settings.only.as_deref().is_none_or(|only| only == family);

    let dir = tempfile::tempdir().expect("a temporary directory");
    let postgres = wanted("postgres").then(|| {
        PostgresServer::start_with(
            PostgresOptions::new()
                .durable()
                .setting("shared_preload_libraries", "pg_stat_statements"),
        )
        .expect("a private PostgreSQL server")
    });
    let redis = wanted("redis").then(|| RedisServer::start().expect("a private Redis server"));
    let mut subjects = Vec::new();
    if let Some(server) = &postgres {
        subjects.push(Subject {
            name: "baton on PostgreSQL",
            family: "postgres",
            kind: Kind::Baton,
            target: server.url(),
        });
        subjects.push(Subject {
            name: "pg_advisory_lock (floor)",
            family: "postgres",
            kind: Kind::Advisory,
            target: server.url(),
        });
    }
    if wanted("sqlite") {
        subjects.push(Subject {
            name: "baton on SQLite",
            family: "sqlite",
            kind: Kind::Baton,
            target: format!("sqlite://{}", dir.path().join("baton.db").display()),
        });
        subjects.push(Subject {
            name: "flock on one file (floor)",
            family: "sqlite",
            kind: Kind::Flock,
            target: dir.path().join("flock").display().to_string(),
        });
    }
    if let Some(server) = &redis {
        subjects.push(Subject {
            name: "baton on Redis",
            family: "redis",
            kind: Kind::Baton,
            target: server.url(),
        });
    }
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    println!(
        "hand-offs across {PROCESSES} processes: hold {HOLD:?}, away {AWAY:?}, {} round(s) of \
         {:?} per subject, subjects alternated; load average {}",
        settings.rounds,
        settings.run_for,
        load_average()
    );

    let mut figures: Vec<Figures> = subjects.iter().map(|_| Figures::default()).collect();
    for round in 0..settings.rounds {
        for step in 0..subjects.len() {
            let i = (step + round) % subjects.len();
            let subject = &subjects[i];
            let before = runtime.block_on(cost_reading(subject));
            let (grants, seconds, failures) = run_subject(subject, &settings, dir.path());
            let after = runtime.block_on(cost_reading(subject));
            figures[i].add(&grants, seconds, failures);
            if let (Some(before), Some(after)) = (before, after) {
                let mut cost = figures[i].cost.unwrap_or_default();
                for (sum, (after, before)) in cost.iter_mut().zip(after.iter().zip(before)) {
                    *sum += after - before;
                }
                figures[i].cost = Some(cost);
            }
        }
    }

    let commits = wanted("sqlite").then(|| two_durable_commits(&dir.path().join("commit.db")));
    let pair = redis
        .as_ref()
        .map(|server| runtime.block_on(raw_redis_pair(&server.url(), settings.run_for)));

    print_table(&subjects, &figures, pair.as_deref());
    print_ratios(&subjects, &figures, commits, pair.as_deref());
}

/// Runs one subject's processes from a common start to a common stop; returns their grants
/// in order, the length of the run in seconds and the failed acquires.
fn run_subject(subject: &Subject, settings: &Settings, dir: &Path) -> (Vec<Grant>, f64, usize) {
    let (grants, failures, seconds) = run_contender_processes(
        &["--child", subject.kind.name(), &subject.target],
        PROCESSES,
        STARTUP,
        settings.run_for,
        dir,
    );
    (grants, seconds, failures)
}

/// A contender process: `KIND TARGET START STOP OUT`.
fn child(args: &[String]) {
    let [kind, target, start, stop, out] = args else {
        panic!("--child KIND TARGET START STOP OUT, got {args:?}");
    };
    let kind = Kind::parse(kind);
    let (start, stop): (u64, u64) = (start.parse().expect("START"), stop.parse().expect("STOP"));
    let mut out = std::io::BufWriter::new(File::create(out).expect("create OUT"));
    let lines = match kind {
        Kind::Baton => contend(start, stop, BatonLock::connect(target)),
        Kind::Advisory => contend(start, stop, AdvisoryLock::connect(target)),
        Kind::Flock => contend(start, stop, FileLock::open(target)),
    };
    for line in lines {
        writeln!(out, "{line}").expect("write a grant");
    }
    out.flush().expect("flush the grants");
}

fn now() -> u64 {
    MonoTime::now().as_nanos()
}

/// Sleeps until the monotonic reading `at`.
fn sleep_until(at: u64) {
    let now = now();
    if at > now {
        std::thread::sleep(Duration::from_nanos(at - now));
    }
}

/// One process's side of a subject: take the lock (blocking until granted or the wait runs
/// out), give it back.
trait Contender {
    fn take(&mut self) -> Result<(), String>;
    fn give(&mut self);
}

/// The workload, written once for every subject: from `start` to `stop`, take, hold, give,
/// stay away; one line per grant (`granted release_sent`), or `failed`.
fn contend(start: u64, stop: u64, mut lock: impl Contender) -> Vec<String> {
    let mut lines = Vec::new();
    sleep_until(start);
    while now() < stop {
        match lock.take() {
            Ok(()) => {
                let granted = now();
                std::thread::sleep(HOLD);
                let release_sent = now();
                lock.give();
                lines.push(format!("{granted} {release_sent}"));
            }
            Err(e) => {
                eprintln!("{e}");
                lines.push("failed".to_owned());
            }
        }
        std::thread::sleep(AWAY);
    }
    lines
}

/// baton's lock, through `baton::connect`.
struct BatonLock {
    runtime: tokio::runtime::Runtime,
    baton: baton::Baton,
    options: LockOptions,
    held: Option<baton::lock::LockGuard>,
}

impl BatonLock {
    fn connect(url: &str) -> BatonLock {
        // The workload's own sleeps block the main thread, not a runtime worker.
        let runtime = process::child_runtime();
        let baton = runtime
            .block_on(baton::connect(url))
            .unwrap_or_else(|e| panic!("connect {url}: {e}"));
        BatonLock {
            runtime,
            baton,
            options: LockOptions::new(TTL).wait(WAIT),
            held: None,
        }
    }
}

impl Contender for BatonLock {
    fn take(&mut self) -> Result<(), String> {
        let acquired = self
            .runtime
            .block_on(self.baton.locks().acquire(KEY, &self.options));
        self.held = Some(acquired.map_err(|e| format!("acquire: {e}"))?);
        Ok(())
    }

    fn give(&mut self) {
        let guard = self.held.take().expect("a held guard");
        self.runtime.block_on(guard.release());
    }
}

/// `pg_advisory_lock` on a session of its own, waiting in the server.
struct AdvisoryLock {
    runtime: tokio::runtime::Runtime,
    conn: sqlx::PgConnection,
}

impl AdvisoryLock {
    fn connect(url: &str) -> AdvisoryLock {
        use sqlx::Connection;
        let runtime = process::child_runtime();
        let conn = runtime.block_on(async {
            let mut conn = sqlx::PgConnection::connect(url)
                .await
                .unwrap_or_else(|e| panic!("connect {url}: {e}"));
            sqlx::query(&format!("SET lock_timeout = '{}ms'", WAIT.as_millis()))
                .execute(&mut conn)
                .await
                .expect("SET lock_timeout");
            conn
        });
        AdvisoryLock { runtime, conn }
    }

    fn call(&mut self, function: &str) -> Result<(), sqlx::Error> {
        let statement = format!("SELECT {function}($1)");
        let query = sqlx::query(&statement).bind(ADVISORY_KEY);
        self.runtime
            .block_on(query.execute(&mut self.conn))
            .map(drop)
    }
}

impl Contender for AdvisoryLock {
    fn take(&mut self) -> Result<(), String> {
        self.call("pg_advisory_lock")
            .map_err(|e| format!("pg_advisory_lock: {e}"))
    }

    fn give(&mut self) {
        self.call("pg_advisory_unlock").expect("pg_advisory_unlock");
    }
}

/// A blocking `flock` on one file.
enum FileLock {
    Open(File),
    Held(Flock<File>),
    Moving,
}

impl FileLock {
    fn open(path: &str) -> FileLock {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)
            .expect("open the flock file");
        FileLock::Open(file)
    }
}

impl Contender for FileLock {
    fn take(&mut self) -> Result<(), String> {
        let FileLock::Open(file) = std::mem::replace(self, FileLock::Moving) else {
            panic!("flock taken twice");
        };
        // A blocking flock fails only on a broken file: the run cannot go on.
        let held = Flock::lock(file, FlockArg::LockExclusive)
            .unwrap_or_else(|(_, e)| panic!("flock: {e}"));
        *self = FileLock::Held(held);
        Ok(())
    }

    fn give(&mut self) {
        let FileLock::Held(held) = std::mem::replace(self, FileLock::Moving) else {
            panic!("flock given back unheld");
        };
        *self = FileLock::Open(held.unlock().unwrap_or_else(|(_, e)| panic!("unlock: {e}")));
    }
}

/// The counters a grant costs on the subject's server: statements, transaction ids, commits
/// and WAL flushes on PostgreSQL, commands processed (then zeros) on Redis; `None` for a
/// subject without a server.
async fn cost_reading(subject: &Subject) -> Option<[u64; 4]> {
    if subject.family == "postgres" {
        use sqlx::{Connection, Row};
        let mut conn = sqlx::PgConnection::connect(&subject.target).await.ok()?;
        sqlx::query("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            .execute(&mut conn)
            .await
            .expect("pg_stat_statements (the server preloads it)");
        let row = sqlx::query(
            "SELECT (SELECT sum(calls)::bigint FROM pg_stat_statements), \
             txid_snapshot_xmax(txid_current_snapshot()), \
             (SELECT sum(xact_commit)::bigint FROM pg_stat_database), \
             (SELECT wal_sync FROM pg_stat_wal)",
        )
        .fetch_one(&mut conn)
        .await
        .expect("read pg_stat_statements, pg_stat_database and pg_stat_wal");
        let counters: [i64; 4] = [row.get(0), row.get(1), row.get(2), row.get(3)];
        conn.close().await.ok();
        Some(counters.map(|c| c as u64))
    } else if subject.family == "redis" {
        let client = redis::Client::open(subject.target.as_str()).ok()?;
        let mut conn = client.get_multiplexed_async_connection().await.ok()?;
        let info: String = redis::cmd("INFO")
            .arg("stats")
            .query_async(&mut conn)
            .await
            .expect("INFO stats");
        info.lines()
            .find_map(|l| l.strip_prefix("total_commands_processed:"))
            .and_then(|v| v.trim().parse().ok())
            .map(|commands| [commands, 0, 0, 0])
    } else {
        None
    }
}

/// Deletes `KEYS[1]` only if it still holds `ARGV[1]`.
const COMPARE_AND_DELETE: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
    return redis.call('DEL', KEYS[1])
end
return 0
";

/// Latencies of a raw `SET NX PX` + compare-and-delete pair, one at a time, for `run_for`.
async fn raw_redis_pair(url: &str, run_for: Duration) -> Vec<Duration> {
    let client = redis::Client::open(url).expect("a Redis URL");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("connect to Redis");
    let release = redis::Script::new(COMPARE_AND_DELETE);
    let mut latencies = Vec::new();
    let stop = Instant::now() + run_for;
    while Instant::now() < stop {
        let started = Instant::now();
        let taken: Option<String> = redis::cmd("SET")
            .arg("raw-pair")
            .arg("token")
            .arg("NX")
            .arg("PX")
            .arg(TTL.as_millis() as u64)
            .query_async(&mut conn)
            .await
            .expect("SET NX PX");
        assert!(taken.is_some(), "the raw pair's key was taken");
        let removed: i64 = release
            .key("raw-pair")
            .arg("token")
            .invoke_async(&mut conn)
            .await
            .expect("compare-and-delete");
        assert_eq!(removed, 1);
        latencies.push(started.elapsed());
    }
    latencies.sort();
    latencies
}

/// The median latency of two durable commits (`synchronous=FULL`, WAL, one-row update) of a
/// file like the store's, in this run.
fn two_durable_commits(path: &Path) -> Duration {
    let conn = rusqlite::Connection::open(path).expect("open the commit file");
    conn.execute_batch(
        "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL;
         CREATE TABLE t (k INTEGER PRIMARY KEY, v INTEGER);
         INSERT INTO t VALUES (1, 0);",
    )
    .expect("set up the commit file");
    let mut pairs = Vec::new();
    for _ in 0..200 {
        let started = Instant::now();
        for _ in 0..2 {
            conn.execute_batch("BEGIN IMMEDIATE; UPDATE t SET v = v + 1 WHERE k = 1; COMMIT;")
                .expect("a durable commit");
        }
        pairs.push(started.elapsed());
    }
    pairs.sort();
    percentile(&pairs, 0.5)
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split(' ').take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".to_owned())
}

fn print_table(subjects: &[Subject], figures: &[Figures], pair: Option<&[Duration]>) {
    println!();
    println!(
        "| subject | acq/s | handoff p50 | p99 | smallest share | re-grants | failed | cost per grant |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---|");
    for (subject, f) in subjects.iter().zip(figures) {
        let cost = match (subject.family, f.cost) {
            ("postgres", Some(cost)) => {
                let [statements, writes, commits, flushes] =
                    cost.map(|c| c as f64 / f.grants.max(1) as f64);
                format!(
                    "{statements:.1} statements, {writes:.1} writing commits \
                     ({commits:.1} commits in all), {flushes:.2} WAL flushes"
                )
            }
            ("redis", Some([commands, ..])) => {
                format!("{:.1} commands", commands as f64 / f.grants.max(1) as f64)
            }
            _ => "—".to_owned(),
        };
        println!(
            "| {} | {:.0} | {} | {} | {:.0} % | {:.1} % | {} | {} |",
            subject.name,
            f.per_sec(),
            ms(f.p(0.50)),
            ms(f.p(0.99)),
            100.0 * f.smallest_share(),
            100.0 * f.regrant_share(),
            f.failures,
            cost
        );
    }
    if let Some(pair) = pair {
        println!(
            "| raw Redis SET NX PX + compare-and-delete pair, one at a time (floor) | — | {} | {} | — | — | — | 2 commands |",
            ms(percentile(pair, 0.50)),
            ms(percentile(pair, 0.99))
        );
    }
}

fn print_ratios(
    subjects: &[Subject],
    figures: &[Figures],
    commits: Option<Duration>,
    pair: Option<&[Duration]>,
) {
    let find = |name: &str| {
        subjects
            .iter()
            .position(|s| s.name == name)
            .map(|i| &figures[i])
    };
    println!();
    if let (Some(baton), Some(floor)) = (
        find("baton on PostgreSQL"),
        find("pg_advisory_lock (floor)"),
    ) {
        println!(
            "PostgreSQL: acq/s {:.2}x pg_advisory_lock's (target >= 0.9), handoff p50 {:.2}x its \
             p50 (target <= 1.5), smallest share {:.0} % (target >= 90 %)",
            baton.per_sec() / floor.per_sec(),
            baton.p(0.5).as_secs_f64() / floor.p(0.5).as_secs_f64(),
            100.0 * baton.smallest_share()
        );
    }
    if let (Some(baton), Some(floor)) = (find("baton on SQLite"), find("flock on one file (floor)"))
    {
        let bound = commits.map(|c| c + Duration::from_micros(200));
        println!(
            "SQLite: acq/s {:.2}x flock's (target >= 0.6), handoff p50 {} against two \
             durable commits + 0.2 ms = {} (target <=), smallest share {:.0} % (target >= 90 %), \
             re-grants {:.1} % (target <= 5 %)",
            baton.per_sec() / floor.per_sec(),
            ms(baton.p(0.5)),
            bound.map_or("—".to_owned(), ms),
            100.0 * baton.smallest_share(),
            100.0 * baton.regrant_share()
        );
    }
    if let (Some(baton), Some(pair)) = (find("baton on Redis"), pair) {
        println!(
            "Redis: handoff p50 {:.2}x the raw pair's p50 (target <= 2), p99 {} (target <= \
             1 ms), smallest share {:.0} %",
            baton.p(0.5).as_secs_f64() / percentile(pair, 0.5).as_secs_f64(),
            ms(baton.p(0.99)),
            100.0 * baton.smallest_share()
        );
    }
}
