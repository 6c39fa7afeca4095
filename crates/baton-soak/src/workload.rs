//! The worker process: contenders doing locks, leases, idempotent effects, rate-limit
//! decisions, semaphore permits, reader-writer locks and elections against the store until
//! the run's deadline, journaling every operation.
//!
//! A worker is the `soak` binary itself, started by the parent with the hidden `worker`
//! subcommand. It connects through the [`baton`] facade to the URL it is given (through
//! the fault proxy for the network stores), says it is ready, waits for the parent's go
//! (a file holding the start and the deadline), and runs:
//!
//! - **lock contenders** ([`LOCK_CONTENDERS`]): acquire one of [`LOCK_KEYS`] (waiting up to
//!   [`LOCK_WAIT`], keep-alive every [`LOCK_KEEP_ALIVE`]), read the key's fenced register,
//!   hold a moment (now and then longer than the TTL, so keep-alive has to renew), write
//!   the value plus one with the grant's fence, release. A quarter of the writes skip the
//!   "is my grant still valid?" check, as a holder paused between the check and the write
//!   would, so the register's fence check is exercised;
//! - **lease contenders** ([`LEASE_CONTENDERS`]): claim one of [`LEASE_KEYS`] as a holder
//!   of their own, renew it every [`LEASE_RENEW_EVERY`] for a while with fenced writes in
//!   between, release;
//! - **idempotency contenders** ([`IDEM_CONTENDERS`], on every store that keeps idempotency
//!   records, so not on etcd): try to acquire the request id of the
//!   current [`IDEM_BUCKET`] (so contenders in every process race for it), do the effect,
//!   finalize it as completed; retry ids they saw pending, so lapsed attempts are taken over;
//! - **rate contenders** ([`RATE_CONTENDERS`], likewise not on etcd): ask for 1 to 3 units of [`RATE_KEY`] under
//!   [`RATE_MAX`] per [`RATE_WINDOW`], all the time;
//! - **permit contenders** ([`SEM_CONTENDERS`]): take one of the [`SEM_PERMITS`] permits of
//!   [`SEM_KEY`] (waiting up to [`GRANT_WAIT`], kept alive), hold it a moment (now and
//!   then longer than the TTL), release;
//! - **reader-writer contenders** ([`RW_CONTENDERS`]): read [`RW_KEY`], or, one time in
//!   [`RW_WRITE_ONE_IN`], write it, hold and release, as the permit contenders;
//! - **candidates** ([`ELECT_CANDIDATES`]): campaign in the election [`ELECT_NAME`] (waiting
//!   up to [`GRANT_WAIT`] to be elected), lead a moment (kept alive), resign.
//!
//! A permit, read, write or leadership holder stops holding early when its `lost()` fires.
//!
//! Once the deadline passes every contender finishes its operation, releases what it
//! holds, and the worker exits.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use baton::election::Leadership;
use baton::idempotency::{Acquire, AcquireOptions, Finalize, Outcome, Scope};
use baton::lease::{ClaimResult, LeaseOptions, RemoveResult, Renewal};
use baton::lock::{AcquireError, LockGuard, LockOptions, ReleaseOutcome};
use baton::rwlock::WriteGuard;
use baton::{Baton, Fence};
use baton_testkit::{FencedRegister, MonoTime};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::journal::{Detail, Journal, Op, Phase};
use crate::plan::StoreKind;

/// The lock keys every lock contender of every process competes for.
pub const LOCK_KEYS: [&str; 2] = ["lock-0", "lock-1"];
/// Lock contenders per worker.
pub const LOCK_CONTENDERS: u32 = 3;
/// The lock TTL.
pub const LOCK_TTL: Duration = Duration::from_millis(1_500);
/// The lock keep-alive interval.
pub const LOCK_KEEP_ALIVE: Duration = Duration::from_millis(400);
/// How long a lock acquire waits for the holder.
pub const LOCK_WAIT: Duration = Duration::from_secs(2);

/// The lease keys.
pub const LEASE_KEYS: [&str; 2] = ["lease-0", "lease-1"];
/// Lease contenders per worker.
pub const LEASE_CONTENDERS: u32 = 2;
/// The lease TTL.
pub const LEASE_TTL: Duration = Duration::from_millis(1_500);
/// How often a lease holder renews.
pub const LEASE_RENEW_EVERY: Duration = Duration::from_millis(400);

/// Idempotency contenders per worker.
pub const IDEM_CONTENDERS: u32 = 2;
/// The owner's lease of an idempotency attempt: after it, a pending record is taken over.
pub const IDEM_LEASE: Duration = Duration::from_secs(1);
/// Request ids change this often; every contender of every process tries the current one.
pub const IDEM_BUCKET: Duration = Duration::from_millis(300);
/// The scope's organisation.
pub const IDEM_ORG: &str = "soak";
/// The scope's domain.
pub const IDEM_DOMAIN: &str = "effects";

/// Rate contenders per worker.
pub const RATE_CONTENDERS: u32 = 2;
/// The rate-limited key.
pub const RATE_KEY: &str = "rate-0";
/// At most this many units ...
pub const RATE_MAX: u32 = 20;
/// ... in any window of this length.
pub const RATE_WINDOW: Duration = Duration::from_secs(1);

/// The semaphore every permit contender of every process takes permits of.
pub const SEM_KEY: &str = "sem-0";
/// Its permits: fewer than its contenders across the workers, so they queue.
pub const SEM_PERMITS: u32 = 3;
/// Permit contenders per worker.
pub const SEM_CONTENDERS: u32 = 2;

/// The reader-writer lock every reader-writer contender of every process takes.
pub const RW_KEY: &str = "rw-0";
/// Reader-writer contenders per worker.
pub const RW_CONTENDERS: u32 = 2;
/// One acquire in this many is a write, the rest reads.
pub const RW_WRITE_ONE_IN: u32 = 4;

/// The election every candidate of every process campaigns in.
pub const ELECT_NAME: &str = "elect-0";
/// Candidates per worker.
pub const ELECT_CANDIDATES: u32 = 1;

/// The TTL of permits, reads, writes and leaderships.
pub const GRANT_TTL: Duration = Duration::from_millis(1_500);
/// Their keep-alive interval.
pub const GRANT_KEEP_ALIVE: Duration = Duration::from_millis(400);
/// How long an acquire, read, write or campaign waits.
pub const GRANT_WAIT: Duration = Duration::from_secs(2);

/// The first contender id of each family, so ids tell the family.
const LEASE_BASE: u32 = 100;
const IDEM_BASE: u32 = 200;
const RATE_BASE: u32 = 300;
const SEM_BASE: u32 = 400;
const RW_BASE: u32 = 500;
const ELECT_BASE: u32 = 600;

/// The layout of a run directory, shared by the parent and the workers.
#[derive(Debug, Clone)]
pub struct RunDir {
    root: PathBuf,
}

impl RunDir {
    /// The run directory at `root`.
    pub fn new(root: impl Into<PathBuf>) -> RunDir {
        RunDir { root: root.into() }
    }

    /// Creates the subdirectories.
    ///
    /// # Errors
    /// When they cannot be created.
    pub fn create(&self) -> std::io::Result<()> {
        for dir in [self.journals(), self.registers(), self.logs(), self.ready()] {
            std::fs::create_dir_all(dir)?;
        }
        Ok(())
    }

    /// The root.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Where the journals are (`<pid>.jsonl`).
    pub fn journals(&self) -> PathBuf {
        self.root.join("journal")
    }

    /// Where the fenced registers are.
    pub fn registers(&self) -> PathBuf {
        self.root.join("registers")
    }

    /// Where the workers' output goes.
    pub fn logs(&self) -> PathBuf {
        self.root.join("logs")
    }

    fn ready(&self) -> PathBuf {
        self.root.join("ready")
    }

    /// The marker a worker writes once connected.
    pub fn ready_marker(&self, worker: u32, incarnation: u32) -> PathBuf {
        self.ready().join(format!("w{worker}.{incarnation}"))
    }

    /// The go file: the start and the deadline.
    pub fn go(&self) -> PathBuf {
        self.root.join("go.json")
    }

    /// The fenced register of lock or lease `key` (`family` is `lock` or `lease`).
    pub fn register(&self, family: &str, key: &str) -> FencedRegister {
        FencedRegister::file(
            register_name(family, key),
            self.registers().join(format!("{family}-{key}.json")),
        )
    }
}

/// The name of the register of `family` key `key`, as histories record it.
pub fn register_name(family: &str, key: &str) -> String {
    format!("{family}:{key}")
}

/// What the go file says.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct Go {
    /// When the run started.
    pub start: MonoTime,
    /// When contenders stop starting operations.
    pub deadline: MonoTime,
}

/// How one worker process was started.
#[derive(Debug, Clone)]
pub struct WorkerArgs {
    /// The store under test: which contenders run.
    pub store: StoreKind,
    /// The store URL.
    pub url: String,
    /// The run directory.
    pub dir: PathBuf,
    /// The worker slot.
    pub worker: u32,
    /// Which process of the slot this is (0 first, 1 after a kill, ...).
    pub incarnation: u32,
    /// The run's seed (the contenders' random choices derive from it).
    pub seed: u64,
    /// How long idempotency records live.
    pub record_ttl: Duration,
}

/// Runs a worker process to the deadline.
///
/// # Errors
/// When the store cannot be reached within a minute, or the run directory is unusable.
pub fn run_worker(args: WorkerArgs) -> Result<(), String> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start a runtime: {e}"))?;
    runtime.block_on(worker(args))
}

async fn worker(args: WorkerArgs) -> Result<(), String> {
    let dir = RunDir::new(&args.dir);
    let baton = connect(&args.url).await?;
    let pid = std::process::id();
    let journal = Arc::new(
        Journal::create(
            &dir.journals().join(format!("{pid}.jsonl")),
            pid,
            args.worker,
        )
        .map_err(|e| format!("cannot open the journal: {e}"))?,
    );
    std::fs::write(
        dir.ready_marker(args.worker, args.incarnation),
        pid.to_string(),
    )
    .map_err(|e| format!("cannot write the ready marker: {e}"))?;
    let go = wait_for_go(&dir).await?;

    let shared = Arc::new(Shared {
        baton,
        journal,
        dir,
        deadline: go.deadline,
        start: go.start,
        record_ttl: args.record_ttl,
    });
    let seed = args
        .seed
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add(u64::from(args.worker) << 40 | u64::from(args.incarnation) << 20);
    let mut tasks = Vec::new();
    let rng = |c: u32| ChaCha8Rng::seed_from_u64(seed.wrapping_add(u64::from(c)));
    for c in 0..LOCK_CONTENDERS {
        tasks.push(tokio::spawn(lock_contender(shared.clone(), c, rng(c))));
    }
    for c in LEASE_BASE..LEASE_BASE + LEASE_CONTENDERS {
        tasks.push(tokio::spawn(lease_contender(shared.clone(), c, rng(c))));
    }
    for c in IDEM_BASE..IDEM_BASE + IDEM_CONTENDERS {
        tasks.push(tokio::spawn(idem_contender(shared.clone(), c, rng(c))));
    }
    // etcd keeps no rate limits (it answers `Unsupported`): its workers run the rest.
    if args.store.keeps_budgets() {
        for c in RATE_BASE..RATE_BASE + RATE_CONTENDERS {
            tasks.push(tokio::spawn(rate_contender(shared.clone(), c, rng(c))));
        }
    }
    for c in SEM_BASE..SEM_BASE + SEM_CONTENDERS {
        tasks.push(tokio::spawn(permit_contender(shared.clone(), c, rng(c))));
    }
    for c in RW_BASE..RW_BASE + RW_CONTENDERS {
        tasks.push(tokio::spawn(rw_contender(shared.clone(), c, rng(c))));
    }
    for c in ELECT_BASE..ELECT_BASE + ELECT_CANDIDATES {
        tasks.push(tokio::spawn(candidate(shared.clone(), c, rng(c))));
    }
    for task in tasks {
        task.await
            .map_err(|e| format!("a contender panicked: {e}"))?;
    }
    Ok(())
}

/// Connects, retrying for a minute: a replacement worker may start while the server is
/// away.
async fn connect(url: &str) -> Result<Baton, String> {
    let deadline = MonoTime::now() + Duration::from_secs(60);
    loop {
        match baton::connect(url).await {
            Ok(baton) => return Ok(baton),
            Err(e) if MonoTime::now() < deadline && e.is_retryable() => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => return Err(format!("cannot connect to {url}: {e}")),
        }
    }
}

async fn wait_for_go(dir: &RunDir) -> Result<Go, String> {
    let deadline = MonoTime::now() + Duration::from_secs(300);
    loop {
        if let Ok(text) = std::fs::read_to_string(dir.go())
            && let Ok(go) = serde_json::from_str::<Go>(&text)
        {
            return Ok(go);
        }
        if MonoTime::now() > deadline {
            return Err("the parent never said go".into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

struct Shared {
    baton: Baton,
    journal: Arc<Journal>,
    dir: RunDir,
    start: MonoTime,
    deadline: MonoTime,
    record_ttl: Duration,
}

impl Shared {
    fn over(&self) -> bool {
        MonoTime::now() >= self.deadline
    }
}

fn mono(instant: tokio::time::Instant) -> MonoTime {
    MonoTime::from_instant(instant.into_std())
}

fn ms(rng: &mut ChaCha8Rng, low: u64, high: u64) -> Duration {
    Duration::from_millis(rng.random_range(low..=high))
}

async fn read_register(register: &Arc<FencedRegister>) -> u64 {
    let register = Arc::clone(register);
    tokio::task::spawn_blocking(move || register.read())
        .await
        .expect("the register is readable")
}

/// One write to a fenced register.
struct FencedWrite<'a> {
    op: Op,
    key: &'a str,
    register: &'a Arc<FencedRegister>,
    fence: Fence,
    value: u64,
    /// The writer's current deadline, journaled with the write.
    valid_until: MonoTime,
}

/// Performs `write`, journaled (the invocation before the register is touched, so a write
/// cut short by a kill is known as indeterminate).
async fn fenced_write(shared: &Shared, contender: u32, write: FencedWrite<'_>) {
    let call = shared.journal.invoke(
        contender,
        write.op,
        write.key,
        Detail {
            fence: Some(write.fence.get()),
            value: Some(write.value),
            valid_until: Some(write.valid_until),
            ..Detail::default()
        },
    );
    let target = Arc::clone(write.register);
    let (fence, value) = (write.fence, write.value);
    let record = tokio::task::spawn_blocking(move || target.write(fence, value))
        .await
        .expect("the register is writable");
    shared.journal.complete(
        call,
        Phase::Ok,
        Detail {
            accepted: Some(record.accepted),
            order: Some(record.order),
            ..Detail::default()
        },
    );
}

async fn lock_contender(shared: Arc<Shared>, c: u32, mut rng: ChaCha8Rng) {
    let registers: Vec<Arc<FencedRegister>> = LOCK_KEYS
        .iter()
        .map(|k| Arc::new(shared.dir.register("lock", k)))
        .collect();
    let options = LockOptions::new(LOCK_TTL)
        .wait(LOCK_WAIT)
        .keep_alive(LOCK_KEEP_ALIVE);
    let journal = &shared.journal;
    while !shared.over() {
        let k = rng.random_range(0..LOCK_KEYS.len());
        let key = LOCK_KEYS[k];
        let call = journal.invoke(c, Op::LockAcquire, key, Detail::default());
        let guard = match shared.baton.locks().acquire(key, &options).await {
            Ok(guard) => {
                journal.complete(
                    call,
                    Phase::Ok,
                    Detail {
                        fence: Some(guard.fence().get()),
                        valid_until: Some(mono(guard.valid_until())),
                        ..Detail::default()
                    },
                );
                guard
            }
            Err(AcquireError::Contended { .. }) => {
                journal.complete(call, Phase::Fail, outcome("contended"));
                continue;
            }
            Err(e) => {
                journal.complete(call, Phase::Info, error(&e));
                tokio::time::sleep(ms(&mut rng, 20, 100)).await;
                continue;
            }
        };
        let value = read_register(&registers[k]).await + 1;
        let hold = if rng.random_bool(0.08) {
            ms(&mut rng, 500, 2_500)
        } else {
            ms(&mut rng, 0, 20)
        };
        tokio::time::sleep(hold).await;
        let careless = rng.random_bool(0.25);
        let valid = guard.valid_until() > tokio::time::Instant::now() && !guard.is_lost();
        if careless || valid {
            let valid_until = mono(guard.valid_until());
            let write = FencedWrite {
                op: Op::LockWrite,
                key,
                register: &registers[k],
                fence: guard.fence(),
                value,
                valid_until,
            };
            fenced_write(&shared, c, write).await;
        }
        release(&shared, c, Op::LockRelease, key, guard).await;
        tokio::time::sleep(ms(&mut rng, 0, 20)).await;
    }
}

async fn lease_contender(shared: Arc<Shared>, c: u32, mut rng: ChaCha8Rng) {
    let registers: Vec<Arc<FencedRegister>> = LEASE_KEYS
        .iter()
        .map(|k| Arc::new(shared.dir.register("lease", k)))
        .collect();
    let holder = format!("p{}-c{c}", std::process::id());
    let leases = shared.baton.leases();
    let journal = &shared.journal;
    while !shared.over() {
        let k = rng.random_range(0..LEASE_KEYS.len());
        let key = LEASE_KEYS[k];
        let call = journal.invoke(c, Op::LeaseClaim, key, Detail::default());
        let (fence, mut valid_until) = match leases
            .claim(key, &holder, &LeaseOptions::new(LEASE_TTL).reason("soak"))
            .await
        {
            Ok(ClaimResult::Claimed { fence, until, .. }) => {
                let valid_until = mono(until);
                journal.complete(
                    call,
                    Phase::Ok,
                    Detail {
                        fence: Some(fence.get()),
                        valid_until: Some(valid_until),
                        ..Detail::default()
                    },
                );
                (fence, valid_until)
            }
            Ok(ClaimResult::HeldBy { .. }) => {
                journal.complete(call, Phase::Fail, outcome("held"));
                tokio::time::sleep(ms(&mut rng, 10, 100)).await;
                continue;
            }
            Err(e) => {
                journal.complete(call, Phase::Info, error(&e));
                tokio::time::sleep(ms(&mut rng, 20, 100)).await;
                continue;
            }
        };
        let hold_until = MonoTime::now() + ms(&mut rng, 0, 2_000);
        loop {
            let now = MonoTime::now();
            if now >= hold_until || shared.over() || valid_until <= now {
                break;
            }
            tokio::time::sleep(LEASE_RENEW_EVERY.min(hold_until.saturating_since(now))).await;
            if rng.random_bool(0.5) {
                let careless = rng.random_bool(0.25);
                if careless || valid_until > MonoTime::now() {
                    let value = read_register(&registers[k]).await + 1;
                    let write = FencedWrite {
                        op: Op::LeaseWrite,
                        key,
                        register: &registers[k],
                        fence,
                        value,
                        valid_until,
                    };
                    fenced_write(&shared, c, write).await;
                }
            }
            if valid_until <= MonoTime::now() {
                break;
            }
            let call = journal.invoke(
                c,
                Op::LeaseRenew,
                key,
                Detail {
                    fence: Some(fence.get()),
                    ..Detail::default()
                },
            );
            let sent = call.at;
            match leases.renew(key, &holder, LEASE_TTL).await {
                Ok(Renewal::Renewed) => {
                    valid_until = valid_until.max(sent + LEASE_TTL);
                    journal.complete(
                        call,
                        Phase::Ok,
                        Detail {
                            valid_until: Some(valid_until),
                            ..Detail::default()
                        },
                    );
                }
                Ok(Renewal::NotHeld) => {
                    journal.complete(call, Phase::Fail, outcome("not_holder"));
                    break;
                }
                Err(e) => journal.complete(call, Phase::Info, error(&e)),
            }
        }
        let call = journal.invoke(
            c,
            Op::LeaseRelease,
            key,
            Detail {
                fence: Some(fence.get()),
                valid_until: Some(valid_until),
                ..Detail::default()
            },
        );
        match leases.release(key, &holder).await {
            Ok(RemoveResult::Removed { .. }) => {
                journal.complete(call, Phase::Ok, outcome("removed"))
            }
            Ok(RemoveResult::Reclaimed { .. }) => {
                journal.complete(call, Phase::Ok, outcome("reclaimed"));
            }
            Ok(RemoveResult::NoHolder) => journal.complete(call, Phase::Ok, outcome("no_holder")),
            Err(e) => journal.complete(call, Phase::Info, error(&e)),
        }
        tokio::time::sleep(ms(&mut rng, 10, 100)).await;
    }
}

/// The request id of the bucket `now` falls in.
fn bucket_key(start: MonoTime, now: MonoTime) -> String {
    let bucket = now.saturating_since(start).as_nanos() / IDEM_BUCKET.as_nanos();
    format!("req-{bucket}")
}

/// The scope of request id `key`.
pub fn idem_scope(key: &str) -> Scope {
    Scope::new(IDEM_ORG, IDEM_DOMAIN, key).expect("a valid scope")
}

async fn idem_contender(shared: Arc<Shared>, c: u32, mut rng: ChaCha8Rng) {
    let log = shared
        .baton
        .idempotency()
        .expect("every store of the soak keeps idempotency records");
    let options = AcquireOptions::new(shared.record_ttl).lease(IDEM_LEASE);
    let journal = &shared.journal;
    // Ids seen pending or unanswered, to try again once an owner's lease could have lapsed.
    let mut retry: VecDeque<(String, MonoTime, u32)> = VecDeque::new();
    while !shared.over() {
        let now = MonoTime::now();
        let (key, tries) = match retry.front() {
            Some((_, at, _)) if *at <= now => {
                let (key, _, tries) = retry.pop_front().expect("a front");
                (key, tries)
            }
            _ => (bucket_key(shared.start, now), 0),
        };
        let scope = idem_scope(&key);
        let call = journal.invoke(c, Op::IdemAcquire, &key, Detail::default());
        let mut again = None;
        match log.try_acquire_with(&scope, &options).await {
            Ok(Acquire::Acquired(attempt)) => {
                let number = attempt.number();
                journal.complete(
                    call,
                    Phase::Ok,
                    Detail {
                        attempt: Some(number),
                        takeover: Some(attempt.takeover().is_some()),
                        ..Detail::default()
                    },
                );
                // Now and then a slow effect, so that pauses and kills land inside it.
                let effect = if rng.random_bool(0.2) {
                    ms(&mut rng, 150, 600)
                } else {
                    ms(&mut rng, 0, 30)
                };
                tokio::time::sleep(effect).await;
                journal.happened(
                    c,
                    Op::IdemEffect,
                    &key,
                    Detail {
                        attempt: Some(number),
                        ..Detail::default()
                    },
                );
                let mut finalized = false;
                for _ in 0..3 {
                    let call = journal.invoke(
                        c,
                        Op::IdemFinalize,
                        &key,
                        Detail {
                            attempt: Some(number),
                            ..Detail::default()
                        },
                    );
                    match log.finalize(&attempt, Outcome::Completed, b"").await {
                        Ok(Finalize::Finalized(record)) => {
                            journal.complete(
                                call,
                                Phase::Ok,
                                Detail {
                                    attempt: Some(record.attempt()),
                                    outcome: Some(record.status().as_str().to_owned()),
                                    ..Detail::default()
                                },
                            );
                            finalized = true;
                            break;
                        }
                        Ok(Finalize::NotOwner) => {
                            journal.complete(call, Phase::Fail, outcome("not_owner"));
                            finalized = true;
                            break;
                        }
                        Err(e) => {
                            journal.complete(call, Phase::Info, error(&e));
                            tokio::time::sleep(ms(&mut rng, 50, 200)).await;
                        }
                    }
                }
                if !finalized {
                    again = Some(IDEM_LEASE + Duration::from_millis(200));
                }
            }
            Ok(Acquire::Duplicate(record)) => {
                let status = record.status().as_str();
                journal.complete(
                    call,
                    Phase::Fail,
                    Detail {
                        attempt: Some(record.attempt()),
                        outcome: Some(format!("duplicate:{status}")),
                        ..Detail::default()
                    },
                );
                if status == "pending" {
                    again = Some(record.lease_remaining() + Duration::from_millis(100));
                } else if tries == 0 {
                    // Done: wait for the next request id.
                    let now = MonoTime::now();
                    let into =
                        now.saturating_since(shared.start).as_nanos() % IDEM_BUCKET.as_nanos();
                    let rest = IDEM_BUCKET.saturating_sub(Duration::from_nanos(into as u64));
                    tokio::time::sleep(rest + ms(&mut rng, 0, 20)).await;
                }
            }
            Err(e) => {
                journal.complete(call, Phase::Info, error(&e));
                again = Some(Duration::from_millis(300));
            }
        }
        if let Some(after) = again
            && tries < 4
        {
            retry.push_back((key, MonoTime::now() + after, tries + 1));
        }
        tokio::time::sleep(ms(&mut rng, 10, 50)).await;
    }
}

async fn rate_contender(shared: Arc<Shared>, c: u32, mut rng: ChaCha8Rng) {
    let limiter = shared
        .baton
        .rate_limiter(baton::limit::Quota::new(RATE_MAX, RATE_WINDOW).expect("a valid quota"))
        .expect("every store of the soak keeps rate limits");
    let journal = &shared.journal;
    while !shared.over() {
        let units = rng.random_range(1..=3u32);
        let call = journal.invoke(
            c,
            Op::RateAcquire,
            RATE_KEY,
            Detail {
                value: Some(u64::from(units)),
                ..Detail::default()
            },
        );
        match limiter.try_acquire(RATE_KEY, units).await {
            Ok(decision) => journal.complete(
                call,
                Phase::Ok,
                Detail {
                    accepted: Some(decision.allowed),
                    ..Detail::default()
                },
            ),
            Err(e) => journal.complete(call, Phase::Info, error(&e)),
        }
        tokio::time::sleep(ms(&mut rng, 5, 25)).await;
    }
}

/// What a contender holds: a lock, permit or read guard, a write guard, a leadership.
trait Held: Send {
    /// The grant's fence (a leadership's term).
    fn fence(&self) -> Fence;
    /// Its current deadline, moved forward by keep-alive.
    fn valid_until(&self) -> tokio::time::Instant;
    /// Resolves when it is known or presumed gone.
    fn lost(&self) -> impl Future<Output = ()> + Send + 'static;
    /// Gives it back.
    fn release(self) -> impl Future<Output = ReleaseOutcome> + Send;
}

/// A guard whose own methods are [`Held`]'s.
macro_rules! held_guard {
    ($guard:ty) => {
        impl Held for $guard {
            fn fence(&self) -> Fence {
                <$guard>::fence(self)
            }
            fn valid_until(&self) -> tokio::time::Instant {
                <$guard>::valid_until(self)
            }
            fn lost(&self) -> impl Future<Output = ()> + Send + 'static {
                <$guard>::lost(self)
            }
            fn release(self) -> impl Future<Output = ReleaseOutcome> + Send {
                <$guard>::release(self)
            }
        }
    };
}

held_guard!(LockGuard);
held_guard!(WriteGuard);

impl Held for Leadership {
    fn fence(&self) -> Fence {
        self.term()
    }
    fn valid_until(&self) -> tokio::time::Instant {
        Leadership::valid_until(self)
    }
    fn lost(&self) -> impl Future<Output = ()> + Send + 'static {
        Leadership::lost(self)
    }
    fn release(self) -> impl Future<Output = ReleaseOutcome> + Send {
        self.resign()
    }
}

/// The `ok` detail of a grant: its fence and deadline.
fn granted(held: &impl Held) -> Detail {
    Detail {
        fence: Some(held.fence().get()),
        valid_until: Some(mono(held.valid_until())),
        ..Detail::default()
    }
}

/// Releases `held`, journaled as `op` with its fence and last deadline (read just before the
/// release is sent, so the believed window ends no later than the release).
async fn release(shared: &Shared, c: u32, op: Op, key: &str, held: impl Held) {
    let call = shared.journal.invoke(c, op, key, granted(&held));
    let (phase, answer) = match held.release().await {
        ReleaseOutcome::Released => (Phase::Ok, "released".to_owned()),
        ReleaseOutcome::Expired => (Phase::Ok, "expired".to_owned()),
        other => (Phase::Info, format!("{other:?}").to_lowercase()),
    };
    shared.journal.complete(call, phase, outcome(&answer));
}

/// One round of a permit, read, write or campaign contender: journals the invocation of
/// `ops.0` on `ops.2`, awaits `acquire` (not started until then), and once granted holds it
/// a moment — 0 to `short` ms, one time in twelve 0.5–2.5 s, so keep-alive has to renew it —
/// or until its lost signal fires, then releases it as `ops.1`. Contention is a `fail`;
/// anything else is indeterminate, followed by a short pause.
async fn round<H: Held>(
    shared: &Shared,
    c: u32,
    rng: &mut ChaCha8Rng,
    (op, release_op, key): (Op, Op, &str),
    short: u64,
    acquire: impl Future<Output = Result<H, AcquireError>>,
) {
    let journal = &shared.journal;
    let call = journal.invoke(c, op, key, Detail::default());
    let held = match acquire.await {
        Ok(held) => {
            journal.complete(call, Phase::Ok, granted(&held));
            held
        }
        Err(AcquireError::Contended { .. }) => {
            journal.complete(call, Phase::Fail, outcome("contended"));
            return;
        }
        Err(e) => {
            journal.complete(call, Phase::Info, error(&e));
            tokio::time::sleep(ms(rng, 20, 100)).await;
            return;
        }
    };
    let hold = if rng.random_bool(0.08) {
        ms(rng, 500, 2_500)
    } else {
        ms(rng, 0, short)
    };
    tokio::select! {
        () = tokio::time::sleep(hold) => {}
        () = held.lost() => {}
    }
    release(shared, c, release_op, key, held).await;
}

fn grant_options() -> LockOptions {
    LockOptions::new(GRANT_TTL)
        .wait(GRANT_WAIT)
        .keep_alive(GRANT_KEEP_ALIVE)
}

async fn permit_contender(shared: Arc<Shared>, c: u32, mut rng: ChaCha8Rng) {
    let semaphore = shared
        .baton
        .semaphore(SEM_KEY, SEM_PERMITS)
        .expect("every store of the soak keeps semaphores");
    let options = grant_options();
    let ops = (Op::SemAcquire, Op::SemRelease, SEM_KEY);
    while !shared.over() {
        round(&shared, c, &mut rng, ops, 50, semaphore.acquire(&options)).await;
        tokio::time::sleep(ms(&mut rng, 0, 20)).await;
    }
}

async fn rw_contender(shared: Arc<Shared>, c: u32, mut rng: ChaCha8Rng) {
    let lock = shared
        .baton
        .rwlock(RW_KEY)
        .expect("every store of the soak keeps reader-writer locks");
    let options = grant_options();
    while !shared.over() {
        if rng.random_ratio(1, RW_WRITE_ONE_IN) {
            let ops = (Op::RwWrite, Op::RwWriteRelease, RW_KEY);
            round(&shared, c, &mut rng, ops, 20, lock.write(&options)).await;
        } else {
            let ops = (Op::RwRead, Op::RwReadRelease, RW_KEY);
            round(&shared, c, &mut rng, ops, 40, lock.read(&options)).await;
        }
        tokio::time::sleep(ms(&mut rng, 0, 20)).await;
    }
}

async fn candidate(shared: Arc<Shared>, c: u32, mut rng: ChaCha8Rng) {
    let election = shared
        .baton
        .election(ELECT_NAME)
        .expect("every store of the soak holds elections");
    let id = format!("p{}-c{c}", std::process::id());
    let options = grant_options();
    let ops = (Op::ElectCampaign, Op::ElectResign, ELECT_NAME);
    while !shared.over() {
        let campaign = async {
            match election.try_campaign(&id, "soak", &options).await {
                Ok(Some(leadership)) => Ok(leadership),
                Ok(None) => Err(AcquireError::Contended {
                    holder: None,
                    remaining: None,
                }),
                Err(e) => Err(AcquireError::Unavailable(e)),
            }
        };
        round(&shared, c, &mut rng, ops, 300, campaign).await;
        tokio::time::sleep(ms(&mut rng, 0, 20)).await;
    }
}

fn outcome(text: &str) -> Detail {
    Detail {
        outcome: Some(text.to_owned()),
        ..Detail::default()
    }
}

fn error(e: &dyn std::fmt::Display) -> Detail {
    Detail {
        error: Some(e.to_string()),
        ..Detail::default()
    }
}
