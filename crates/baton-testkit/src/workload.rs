//! [`LockWorkload`]: the standard contention workload of the recorded-history tests.
//!
//! Every contender loops: acquire the key, read the [`FencedRegister`]'s counter, hold the
//! lock a moment, write the counter plus one with the grant's fence, record the new value
//! as an effect when the register accepted it, release, and stay away a moment. Everything
//! goes to a [`Recorder`], so the [checkers](crate::check) can judge the run afterwards:
//! with exclusion intact, every counter value is produced exactly once
//! ([`LockWorkload::expected_effects`]), and with it broken, the unfenced read-modify-write
//! doubles a value.
//!
//! The same workload runs over every store, in one process or in several (each with its
//! own contender ids), so a store's history test is a few lines.

use std::sync::Arc;
use std::time::Duration;

use baton_core::{AcquireError, LockOptions, Locks, RateLimiter, ReleaseOutcome};

use crate::check;
use crate::history::{History, Recorder};
use crate::process::{self, ChildTest};
use crate::register::FencedRegister;
use crate::time::MonoTime;

/// How many contenders loop how often, holding for how long.
#[derive(Debug, Clone)]
#[must_use = "a workload does nothing until run"]
pub struct LockWorkload {
    key: String,
    contenders: u32,
    first_contender: u32,
    rounds: u32,
    ttl: Duration,
    wait: Duration,
    hold: Duration,
    away: Duration,
    overstay: Option<(u32, Duration)>,
}

/// What a run did, beyond what its history shows.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WorkloadReport {
    /// Grants taken.
    pub grants: u64,
    /// Releases that answered `Released`.
    pub released: u64,
    /// Releases that answered `Expired`.
    pub expired: u64,
    /// Releases that answered `Faulted` (or an outcome this testkit does not know).
    pub faulted: u64,
    /// Acquires that ended contended (the wait ran out).
    pub contended: u64,
    /// Acquires that failed, with their errors.
    pub errors: Vec<String>,
}

impl WorkloadReport {
    /// Asserts that no acquire failed.
    ///
    /// # Panics
    /// When one did; the message lists their errors.
    pub fn assert_no_errors(&self) {
        assert!(self.errors.is_empty(), "acquires failed: {:?}", self.errors);
    }

    /// Asserts that no acquire failed and that each of the `rounds` was granted and released
    /// in time (no release found its grant expired).
    ///
    /// # Panics
    /// When one of these does not hold.
    pub fn assert_every_round_held(&self, rounds: u64) {
        self.assert_no_errors();
        assert_eq!(self.grants, rounds, "grants: {self:?}");
        assert_eq!(self.released, rounds, "releases in time: {self:?}");
    }

    fn add(&mut self, other: WorkloadReport) {
        self.grants += other.grants;
        self.released += other.released;
        self.expired += other.expired;
        self.faulted += other.faulted;
        self.contended += other.contended;
        self.errors.extend(other.errors);
    }
}

impl LockWorkload {
    /// Eight contenders, twenty rounds each, on `key`: TTL 10 s (never reached), wait up
    /// to 120 s, hold 1 ms, 1 ms away between rounds.
    pub fn new(key: impl Into<String>) -> Self {
        LockWorkload {
            key: key.into(),
            contenders: 8,
            first_contender: 0,
            rounds: 20,
            ttl: Duration::from_secs(10),
            wait: Duration::from_secs(120),
            hold: Duration::from_millis(1),
            away: Duration::from_millis(1),
            overstay: None,
        }
    }

    /// How many contenders run at once, and the id of the first (the others follow), so
    /// that several processes can use distinct ids.
    pub fn contenders(mut self, count: u32, first_id: u32) -> Self {
        self.contenders = count;
        self.first_contender = first_id;
        self
    }

    /// Rounds per contender.
    pub fn rounds(mut self, rounds: u32) -> Self {
        self.rounds = rounds;
        self
    }

    /// The lock's TTL.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// How long each acquire may wait.
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }

    /// How long each holder holds, and stays away between rounds.
    pub fn hold(mut self, hold: Duration, away: Duration) -> Self {
        self.hold = hold;
        self.away = away;
        self
    }

    /// Every `every`-th round of each contender holds for `hold` instead, ignoring its
    /// deadline the way a paused process would (choose `hold` above the TTL to force
    /// expiries). Counter values may then double: check effects only without overstays.
    pub fn overstay(mut self, every: u32, hold: Duration) -> Self {
        self.overstay = Some((every.max(1), hold));
        self
    }

    /// The effects a run with intact exclusion produces: every counter value from one to
    /// the register's final value, once.
    pub fn expected_effects(register: &FencedRegister) -> impl Iterator<Item = String> {
        (1..=register.read()).map(|v| v.to_string())
    }

    /// Asserts that `history` keeps every rule ([`check::all`]) and that
    /// its side effects are exactly the [`expected_effects`](LockWorkload::expected_effects)
    /// of `register`, each once.
    ///
    /// # Panics
    /// When there is a violation; the message lists them.
    pub fn assert_every_rule(history: &History, register: &FencedRegister) {
        let mut violations = check::all(history);
        violations.extend(check::effects(
            history,
            LockWorkload::expected_effects(register),
        ));
        check::assert_clean(&violations);
    }

    /// Asserts, of a run in which every holder finished its hold within its TTL, every rule
    /// of [`assert_every_rule`](LockWorkload::assert_every_rule), `grants` grants in
    /// `history`, and each grant's increment landed in `register` once, none rejected.
    ///
    /// # Panics
    /// When one of these does not hold.
    pub fn assert_every_grant_landed(history: &History, register: &FencedRegister, grants: u64) {
        LockWorkload::assert_every_rule(history, register);
        assert_eq!(
            history.grants().len() as u64,
            grants,
            "grants in the history"
        );
        assert_eq!(
            register.read(),
            grants,
            "every holder's increment landed once"
        );
        assert_eq!(
            register.state().rejected,
            0,
            "no holder's write was rejected"
        );
    }

    /// Runs the workload over `locks`, recorded for this process, its holders writing to a
    /// new in-memory register; returns the report, the recorder and the register.
    pub async fn run_recorded(
        &self,
        locks: &Locks,
    ) -> (WorkloadReport, Recorder, Arc<FencedRegister>) {
        let recorder = Recorder::for_this_process();
        let register = Arc::new(FencedRegister::in_memory("counter"));
        let report = self.run(locks, &recorder, &register).await;
        (report, recorder, register)
    }

    /// Runs the workload in `processes` OS processes, as replicas would: each is this test
    /// binary started again to run the (ignored) test `child_test`, which must call
    /// [`run_as_child`](LockWorkload::run_as_child), with `env` set for it. Every child opens
    /// its own store, and they start together once all are ready. The children's files (their
    /// histories, the register every holder writes to) go in `dir`, which must outlive the
    /// returned register. Returns the merged history and that register; each child has
    /// already checked that none of its acquires failed.
    ///
    /// # Panics
    /// When a child cannot be started, fails, or does not finish within five minutes.
    pub fn run_in_processes(
        child_test: &str,
        processes: u32,
        dir: &std::path::Path,
        env: &[(&str, &str)],
    ) -> (History, FencedRegister) {
        let history = run_children(child_test, processes, dir, env);
        let register = FencedRegister::file("counter", register_file(dir));
        (history, register)
    }

    /// The child side of a run through store faults (a master killed, no master for the
    /// key's slot until its replica is promoted): as [`run_as_child`](Self::run_as_child),
    /// but acquires that fail are tried again after a short pause until each contender was
    /// granted its rounds; the errors are printed, not fatal. The parent checks the history.
    ///
    /// # Panics
    /// When the store cannot be opened, or the history cannot be written.
    pub fn run_as_child_through_faults<F, Fut>(self, open: F)
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = Locks>,
    {
        let Some((dir, index)) = child_place() else {
            return;
        };
        let wanted = u64::from(self.rounds) * u64::from(self.contenders);
        let workload = LockWorkload {
            first_contender: index * self.contenders,
            ..self
        };
        process::child_runtime().block_on(async {
            let locks = open().await;
            let recorder = Recorder::for_this_process();
            let register = Arc::new(FencedRegister::file("counter", register_file(&dir)));
            ready_and_wait_for_go(&dir, index).await;
            let mut granted = 0;
            while granted < wanted {
                let left =
                    u32::try_from((wanted - granted).div_ceil(u64::from(workload.contenders)))
                        .unwrap_or(u32::MAX);
                let report = workload
                    .clone()
                    .rounds(left)
                    .run(&locks, &recorder, &register)
                    .await;
                granted += report.grants;
                if let Some(last) = report.errors.last() {
                    eprintln!("{} acquires failed; the last: {last}", report.errors.len());
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
            recorder
                .write_jsonl(history_file(&dir, index))
                .expect("write the history");
        });
    }

    /// The child side of [`run_in_processes`](LockWorkload::run_in_processes): opens locks
    /// with `open`, waits for the parent's go, runs the workload with its contenders numbered
    /// after those of the processes before it, writes the history for the parent and asserts
    /// that no acquire failed. Returns at once when this process is not such a child (an
    /// ordinary run of the ignored test).
    ///
    /// # Panics
    /// When an acquire failed, or the parent's files cannot be read or written.
    pub fn run_as_child<F, Fut>(self, open: F)
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = Locks>,
    {
        let Some((dir, index)) = child_place() else {
            return;
        };
        let workload = LockWorkload {
            first_contender: index * self.contenders,
            ..self
        };
        process::child_runtime().block_on(async {
            let locks = open().await;
            let recorder = Recorder::for_this_process();
            let register = Arc::new(FencedRegister::file("counter", register_file(&dir)));
            ready_and_wait_for_go(&dir, index).await;
            let report = workload.run(&locks, &recorder, &register).await;
            recorder
                .write_jsonl(history_file(&dir, index))
                .expect("write the history");
            report.assert_no_errors();
        });
    }

    /// Runs every contender to completion on the current runtime.
    ///
    /// # Panics
    /// When a contender task panics.
    pub async fn run(
        &self,
        locks: &Locks,
        recorder: &Recorder,
        register: &Arc<FencedRegister>,
    ) -> WorkloadReport {
        let mut tasks = Vec::new();
        for i in 0..self.contenders {
            let (workload, locks, register) = (self.clone(), locks.clone(), Arc::clone(register));
            let log = recorder.contender(self.first_contender + i);
            tasks.push(tokio::spawn(async move {
                workload.contend(&locks, &log, &register).await
            }));
        }
        let mut report = WorkloadReport::default();
        for task in tasks {
            report.add(task.await.expect("a contender panicked"));
        }
        report
    }

    async fn contend(
        &self,
        locks: &Locks,
        log: &crate::history::ContenderLog,
        register: &FencedRegister,
    ) -> WorkloadReport {
        let mut report = WorkloadReport::default();
        let options = LockOptions::new(self.ttl).wait(self.wait);
        for round in 1..=self.rounds {
            let requested = MonoTime::now();
            let guard = match locks.acquire(&self.key, &options).await {
                Ok(guard) => guard,
                Err(AcquireError::Contended { .. }) => {
                    report.contended += 1;
                    continue;
                }
                Err(error) => {
                    report.errors.push(error.to_string());
                    tokio::time::sleep(self.away).await;
                    continue;
                }
            };
            log.acquired(&guard, requested);
            report.grants += 1;
            let value = register.read() + 1;
            let hold = match self.overstay {
                Some((every, hold)) if round % every == 0 => hold,
                _ => self.hold,
            };
            tokio::time::sleep(hold).await;
            if log
                .write(register, &self.key, guard.fence(), value)
                .accepted
            {
                log.effect(&self.key, value.to_string());
            }
            match log.release(guard).await {
                ReleaseOutcome::Released => report.released += 1,
                ReleaseOutcome::Expired => report.expired += 1,
                _ => report.faulted += 1,
            }
            tokio::time::sleep(self.away).await;
        }
        report
    }
}

/// Runs `tasks` tasks on each of `limiters` at once (replicas sharing one budget), each asking
/// for one unit of `key` `attempts` times, and answers how many units were allowed in all.
///
/// # Panics
/// When a decision fails or a task panics.
pub async fn admitted_concurrently(
    limiters: &[RateLimiter],
    tasks: usize,
    attempts: usize,
    key: &str,
) -> u32 {
    let mut running = Vec::new();
    for limiter in limiters {
        for _ in 0..tasks {
            let (limiter, key) = (limiter.clone(), key.to_owned());
            running.push(tokio::spawn(async move {
                let mut admitted = 0;
                for _ in 0..attempts {
                    if limiter.try_acquire(&key, 1).await.unwrap().allowed {
                        admitted += 1;
                    }
                }
                admitted
            }));
        }
    }
    let mut admitted = 0;
    for task in running {
        admitted += task.await.unwrap();
    }
    admitted
}

/// Starts `processes` children running `child_test`, each told its directory and index;
/// waits until every one is ready (has opened its store), tells them to go, waits for them
/// to succeed, and merges their histories.
/// The child side the multi-process workloads share: when this process is one of
/// [`run_children`]'s (else it returns at once), opens what it contends for with `open`,
/// waits for the parent's go, runs `rounds` with its recorder and index, and writes the
/// recorded history where the parent reads it.
///
/// # Panics
/// When the parent's files cannot be read or written.
pub(crate) fn run_child<T, F, Fut>(open: F, rounds: impl AsyncFnOnce(&T, &Recorder, u32))
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = T>,
{
    let Some((dir, index)) = child_place() else {
        return;
    };
    process::child_runtime().block_on(async {
        let opened = open().await;
        let recorder = Recorder::for_this_process();
        ready_and_wait_for_go(&dir, index).await;
        rounds(&opened, &recorder, index).await;
        recorder
            .write_jsonl(history_file(&dir, index))
            .expect("write the history");
    });
}

/// [`run_children`] whose every process is granted `rounds` times: the merged history, checked
/// well formed and with every round granted.
pub(crate) fn run_rounds(
    child_test: &str,
    processes: u32,
    rounds: u32,
    dir: &std::path::Path,
    env: &[(&str, &str)],
) -> History {
    let history = run_children(child_test, processes, dir, env);
    assert_eq!(
        history.grants().len(),
        (processes * rounds) as usize,
        "every round of every process was granted"
    );
    crate::check::assert_clean(&crate::check::well_formed(&history));
    history
}

pub(crate) fn run_children(
    child_test: &str,
    processes: u32,
    dir: &std::path::Path,
    env: &[(&str, &str)],
) -> History {
    let mut children: Vec<_> = (0..processes)
        .map(|i| {
            let mut child = ChildTest::new(child_test, "contender")
                .env(DIR_ENV, dir)
                .env(INDEX_ENV, i.to_string());
            for (name, value) in env {
                child = child.env(name, value);
            }
            child.spawn().expect("spawn a contender process")
        })
        .collect();
    // Every child opens its store first; then they start together.
    for (i, child) in children.iter().enumerate() {
        if let Err(e) = process::wait_for_file(ready_file(dir, i as u32), CHILD_TIMEOUT) {
            panic!("{e}; child output:\n{}", child.output());
        }
    }
    std::fs::write(dir.join("go"), "").expect("write the go file");
    for child in &mut children {
        child
            .wait_success(CHILD_TIMEOUT)
            .unwrap_or_else(|e| panic!("{e}"));
    }
    let history = History::merge(
        (0..processes)
            .map(|i| History::read_jsonl(history_file(dir, i)).expect("a child's history")),
    );
    crate::jepsen::export_this_test(&history);
    history
}

/// This child's directory and index, from the parent's [`run_children`]; `None` when this
/// process is not such a child.
pub(crate) fn child_place() -> Option<(std::path::PathBuf, u32)> {
    process::role()?;
    let dir = std::path::PathBuf::from(process::parent_env(DIR_ENV));
    let index = process::parent_env(INDEX_ENV)
        .parse()
        .expect("the process index is a number");
    Some((dir, index))
}

/// Tells the parent this child is ready, and waits for its go.
pub(crate) async fn ready_and_wait_for_go(dir: &std::path::Path, index: u32) {
    std::fs::write(ready_file(dir, index), "").expect("write the ready file");
    process::wait_until_async("the parent's go", CHILD_TIMEOUT, || dir.join("go").exists())
        .await
        .expect("the parent's go");
}

/// Contenders that take and give back the permits of one semaphore, one per OS process:
/// the recorded history of a semaphore store, checked for never more than its permits at
/// once (see [`check::at_most`]).
#[derive(Debug, Clone, Copy)]
pub struct PermitWorkload {
    permits: u32,
    rounds: u32,
    hold: Duration,
}

impl PermitWorkload {
    /// Contenders for `permits` permits, 12 rounds each, holding each permit 3 ms.
    pub fn new(permits: u32) -> Self {
        PermitWorkload {
            permits,
            rounds: 12,
            hold: Duration::from_millis(3),
        }
    }

    /// How many permits each contender takes, one after another.
    pub fn rounds(self, rounds: u32) -> Self {
        PermitWorkload { rounds, ..self }
    }

    /// How long each contender holds each permit: longer than a handoff on the store, so
    /// that the permits are held at once (a store that hands released permits to waiting
    /// processes one after another needs more than the default's 3 ms).
    pub fn hold(self, hold: Duration) -> Self {
        PermitWorkload { hold, ..self }
    }

    /// The parent side: runs `child_test` (which calls [`run_as_child`](Self::run_as_child))
    /// in `processes` processes and checks the merged history: well formed, every round
    /// granted, never more than the permits believed at once, no fence given twice, and at
    /// some moment more than one holder (the permits were shared).
    ///
    /// # Panics
    /// When a child fails, or a rule is broken.
    pub fn run_in_processes(
        self,
        child_test: &str,
        processes: u32,
        dir: &std::path::Path,
        env: &[(&str, &str)],
    ) -> History {
        let history = run_rounds(child_test, processes, self.rounds, dir, env);
        crate::check::assert_clean(&crate::check::at_most(&history, self.permits as usize));
        let duplicates: Vec<_> = crate::check::fences_increase(&history)
            .into_iter()
            .filter(|v| v.rule == crate::check::Rule::DuplicateFence)
            .collect();
        crate::check::assert_clean(&duplicates);
        if self.permits > 1 {
            assert!(
                !crate::check::at_most(&history, 1).is_empty(),
                "never two holders at once: the run did not exercise the permits"
            );
        }
        history
    }

    /// The child side of [`run_in_processes`](Self::run_in_processes): opens the semaphore
    /// with `open`, waits for the parent's go, takes and gives back a permit `rounds` times
    /// (waiting up to a minute for each), and writes its history. Returns at once when this
    /// process is not such a child (an ordinary run of the ignored test).
    ///
    /// # Panics
    /// When an acquire failed, or the parent's files cannot be read or written.
    pub fn run_as_child<F, Fut>(self, open: F)
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = baton_core::Semaphore>,
    {
        run_child(open, async |semaphore, recorder, index| {
            let log = recorder.contender(index);
            for _ in 0..self.rounds {
                let requested = MonoTime::now();
                let options =
                    LockOptions::new(Duration::from_secs(10)).wait(Duration::from_secs(60));
                let permit = semaphore.acquire(&options).await.expect("a permit in time");
                log.acquired(&permit, requested);
                // Blocking, as work is: the runtime's other workers keep the permit alive.
                std::thread::sleep(self.hold);
                log.release(permit).await;
            }
        });
    }
}

/// Candidates of one election, one per OS process, each campaigning, leading a moment and
/// resigning, round after round: the recorded history of a store's elections, checked for
/// no two leaders believing they lead at once and terms strictly increasing (see
/// [`crate::check::no_overlap`] and [`crate::check::fences_increase`]).
#[derive(Debug, Clone, Copy)]
pub struct ElectionWorkload {
    rounds: u32,
    hold: Duration,
}

impl Default for ElectionWorkload {
    fn default() -> Self {
        ElectionWorkload::new()
    }
}

impl ElectionWorkload {
    /// Candidates that lead 8 times each, 3 ms every time.
    pub fn new() -> Self {
        ElectionWorkload {
            rounds: 8,
            hold: Duration::from_millis(3),
        }
    }

    /// How many times each candidate is elected, one after another.
    pub fn rounds(self, rounds: u32) -> Self {
        ElectionWorkload { rounds, ..self }
    }

    /// The parent side: runs `child_test` (which calls [`run_as_child`](Self::run_as_child))
    /// in `processes` processes and checks the merged history: well formed, every round
    /// elected, no two leaders at once, terms strictly increasing.
    ///
    /// # Panics
    /// When a child fails, or a rule is broken.
    pub fn run_in_processes(
        self,
        child_test: &str,
        processes: u32,
        dir: &std::path::Path,
        env: &[(&str, &str)],
    ) -> History {
        let history = run_rounds(child_test, processes, self.rounds, dir, env);
        crate::check::assert_clean(&crate::check::no_overlap(&history));
        crate::check::assert_clean(&crate::check::fences_increase(&history));
        history
    }

    /// The child side of [`run_in_processes`](Self::run_in_processes): opens the election
    /// with `open`, waits for the parent's go, campaigns (as `candidate-<index>`), leads for
    /// the hold and resigns, `rounds` times, and writes its history. Returns at once when
    /// this process is not such a child (an ordinary run of the ignored test).
    ///
    /// # Panics
    /// When a campaign failed, or the parent's files cannot be read or written.
    pub fn run_as_child<F, Fut>(self, open: F)
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = baton_core::Election>,
    {
        run_child(open, async |election, recorder, index| {
            let log = recorder.contender(index);
            let candidate = format!("candidate-{index}");
            for _ in 0..self.rounds {
                let requested = MonoTime::now();
                let options = LockOptions::new(Duration::from_secs(10));
                let leadership = tokio::time::timeout(
                    Duration::from_secs(60),
                    election.campaign(&candidate, "", &options),
                )
                .await
                .expect("elected within a minute")
                .expect("a campaign");
                log.elected(election.name(), &leadership, requested);
                // Blocking, as work is: the runtime's other workers keep the leadership.
                std::thread::sleep(self.hold);
                log.resign(election.name(), leadership).await;
            }
        });
    }
}

/// Runs `tasks` tasks on each of `stores` (several processes' worth of connections to one
/// store), each taking and giving back a permit of the semaphore `key` of `permits` permits
/// in `namespace` three times, and answers the most holders seen at once.
///
/// # Panics
/// When an acquire fails within a minute.
pub async fn most_permit_holders(
    stores: Vec<Arc<dyn baton_core::SemaphoreStore>>,
    namespace: &baton_core::Namespace,
    key: &str,
    permits: u32,
    tasks: usize,
) -> usize {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let inside = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let mut running = Vec::new();
    for store in stores {
        for _ in 0..tasks {
            let semaphore =
                baton_core::Semaphore::new(Arc::clone(&store), namespace.clone(), key, permits)
                    .expect("a valid semaphore");
            let (inside, most) = (Arc::clone(&inside), Arc::clone(&most));
            running.push(tokio::spawn(async move {
                for _ in 0..3 {
                    let options =
                        LockOptions::new(Duration::from_secs(30)).wait(Duration::from_secs(60));
                    let permit = semaphore.acquire(&options).await.expect("a permit in time");
                    let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    inside.fetch_sub(1, Ordering::SeqCst);
                    permit.release().await;
                }
            }));
        }
    }
    for task in running {
        task.await.expect("a permit task");
    }
    most.load(std::sync::atomic::Ordering::SeqCst)
}

/// How long a contender process may take to get ready, and to finish: generous, as the
/// children are debug builds on a loaded two-core machine.
const CHILD_TIMEOUT: Duration = Duration::from_secs(300);
/// The environment variables that tell a contender process its directory and index.
const DIR_ENV: &str = "BATON_TESTKIT_CONTENDER_DIR";
const INDEX_ENV: &str = "BATON_TESTKIT_CONTENDER_INDEX";

fn ready_file(dir: &std::path::Path, index: u32) -> std::path::PathBuf {
    dir.join(format!("ready-{index}"))
}

pub(crate) fn history_file(dir: &std::path::Path, index: u32) -> std::path::PathBuf {
    dir.join(format!("history-{index}.jsonl"))
}

fn register_file(dir: &std::path::Path) -> std::path::PathBuf {
    dir.join("register.json")
}
