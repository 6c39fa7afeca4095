//! The idempotency log on the SQLite store: the conformance rules, and the races that need
//! several OS processes on one file (1,000 attempts from 2 processes of 8 tasks each; the
//! owner killed between acquire and finalize).
//!
//! The child processes are this test binary run again with a role (see
//! `baton_testkit::process`); their tests are `#[ignore]`d in ordinary runs.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use baton_core::Namespace;
use baton_core::idempotency::conformance::{IdempotencyHarness, race, race_until_attempt};
use baton_core::idempotency::{
    Acquire, AcquireOptions, IdempotencyLog, IdempotencyStore, Scope, Status, Takeover,
};
use baton_sqlite::{SqliteOptions, SqliteStore};
use baton_testkit::process::{self, ChildTest};

struct SqliteHarness {
    path: PathBuf,
    store: Mutex<Option<Arc<SqliteStore>>>,
    _dir: tempfile::TempDir,
}

async fn sqlite() -> SqliteHarness {
    let dir = tempfile::tempdir().expect("temp dir");
    SqliteHarness {
        path: dir.path().join("baton.db"),
        store: Mutex::new(None),
        _dir: dir,
    }
}

#[async_trait]
impl IdempotencyHarness for SqliteHarness {
    async fn open(&self) -> Arc<dyn IdempotencyStore> {
        let existing = self.store.lock().unwrap().clone();
        match existing {
            Some(store) => store,
            None => {
                let store = Arc::new(open(&self.path).await);
                self.store.lock().unwrap().get_or_insert(store).clone()
            }
        }
    }

    async fn reopen(&self) -> Option<Arc<dyn IdempotencyStore>> {
        drop(self.store.lock().unwrap().take());
        let store = Arc::new(open(&self.path).await);
        *self.store.lock().unwrap() = Some(store.clone());
        Some(store)
    }
}

baton_core::idempotency_conformance_tests!(sqlite());

async fn open(path: &Path) -> SqliteStore {
    SqliteStore::open(path, SqliteOptions::new())
        .await
        .expect("open the store")
}

const DAY: Duration = Duration::from_secs(86_400);
const CHILD_TIMEOUT: Duration = Duration::from_secs(300);

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} is set by the parent"))
}

fn the_scope() -> Scope {
    Scope::new("org-1", "charges", "order-42").unwrap()
}

fn log_in(store: SqliteStore, namespace: &str) -> IdempotencyLog {
    IdempotencyLog::with_namespace(Arc::new(store), Namespace::new(namespace).unwrap())
}

/// 1,008 attempts on one scope from 2 processes of 8 tasks each (504 per process) find
/// exactly one `Acquired` between them.
#[test]
fn a_thousand_attempts_from_two_processes_acquire_once() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("baton.db");
    let go = dir.path().join("go");
    let namespace = format!("t{:016x}", rand_u64());
    let mut children: Vec<_> = ["a", "b"]
        .iter()
        .map(|name| {
            ChildTest::new("racer", *name)
                .env("IDEM_DB", &db)
                .env("IDEM_GO", &go)
                .env("IDEM_NS", &namespace)
                .env("IDEM_OUT", dir.path().join(format!("won-{name}")))
                .env("IDEM_READY", dir.path().join(format!("ready-{name}")))
                .spawn()
                .unwrap()
        })
        .collect();
    for name in ["a", "b"] {
        process::wait_for_file(dir.path().join(format!("ready-{name}")), CHILD_TIMEOUT).unwrap();
    }
    std::fs::write(&go, "go").unwrap();
    for child in &mut children {
        child.wait_success(CHILD_TIMEOUT).unwrap();
    }
    let won: u32 = ["a", "b"]
        .iter()
        .map(|name| {
            let text = std::fs::read_to_string(dir.path().join(format!("won-{name}"))).unwrap();
            text.trim().parse::<u32>().unwrap()
        })
        .sum();
    assert_eq!(
        won, 1,
        "exactly one of 1,008 attempts in two processes acquires"
    );
    let record = runtime().block_on(async {
        log_in(open(&db).await, &namespace)
            .get(&the_scope())
            .await
            .unwrap()
            .unwrap()
    });
    assert_eq!((record.status(), record.attempt()), (Status::Pending, 1));
}

#[test]
#[ignore = "a child process of a_thousand_attempts_from_two_processes_acquire_once"]
fn racer() {
    let Some(_role) = process::role() else { return };
    runtime().block_on(async {
        let log = log_in(open(Path::new(&env("IDEM_DB"))).await, &env("IDEM_NS"));
        std::fs::write(env("IDEM_READY"), "ready").unwrap();
        process::wait_for_file(env("IDEM_GO"), CHILD_TIMEOUT).unwrap();
        let options = AcquireOptions::new(DAY).lease(Duration::from_secs(600));
        let won = race(&log, &the_scope(), &options, 8, 504).await;
        std::fs::write(env("IDEM_OUT"), won.len().to_string()).unwrap();
        // Leave the won attempt pending: the parent checks the record.
        std::mem::forget(won);
    });
}

/// The owner is killed between acquire and finalize; once its lease lapses, exactly one of
/// the attempts racing from two other processes (8 tasks each) takes the record over.
#[test]
fn killing_the_owner_leads_to_exactly_one_takeover_after_the_lease() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("baton.db");
    let namespace = format!("t{:016x}", rand_u64());
    let acquired = dir.path().join("acquired");
    let mut owner = ChildTest::new("owner", "owner")
        .env("IDEM_DB", &db)
        .env("IDEM_NS", &namespace)
        .env("IDEM_ACQUIRED", &acquired)
        .spawn()
        .unwrap();
    process::wait_for_file(&acquired, CHILD_TIMEOUT).unwrap();
    owner.kill().unwrap();
    let before = runtime().block_on(async {
        log_in(open(&db).await, &namespace)
            .get(&the_scope())
            .await
            .unwrap()
            .unwrap()
    });
    assert_eq!(
        (before.status(), before.attempt()),
        (Status::Pending, 1),
        "the dead owner's record"
    );

    let mut contenders: Vec<_> = ["c", "d"]
        .iter()
        .map(|name| {
            ChildTest::new("contender", *name)
                .env("IDEM_DB", &db)
                .env("IDEM_NS", &namespace)
                .env("IDEM_OUT", dir.path().join(format!("won-{name}")))
                .spawn()
                .unwrap()
        })
        .collect();
    for child in &mut contenders {
        child.wait_success(CHILD_TIMEOUT).unwrap();
    }
    let won: Vec<String> = ["c", "d"]
        .iter()
        .flat_map(|name| {
            let text = std::fs::read_to_string(dir.path().join(format!("won-{name}"))).unwrap();
            text.lines().map(str::to_owned).collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(won, ["2 LeaseLapsed"], "exactly one takeover, as attempt 2");
    let after = runtime().block_on(async {
        log_in(open(&db).await, &namespace)
            .get(&the_scope())
            .await
            .unwrap()
            .unwrap()
    });
    assert_eq!((after.status(), after.attempt()), (Status::Completed, 2));
    assert_eq!(after.metadata(), b"charged by the taker");
}

#[test]
#[ignore = "a child process of killing_the_owner_leads_to_exactly_one_takeover_after_the_lease"]
fn owner() {
    let Some(_role) = process::role() else { return };
    runtime().block_on(async {
        let log = log_in(open(Path::new(&env("IDEM_DB"))).await, &env("IDEM_NS"));
        let options = AcquireOptions::new(DAY).lease(Duration::from_secs(2));
        let Acquire::Acquired(attempt) =
            log.try_acquire_with(&the_scope(), &options).await.unwrap()
        else {
            panic!("the owner acquires first");
        };
        std::fs::write(env("IDEM_ACQUIRED"), attempt.number().to_string()).unwrap();
        // Killed here, between acquire and finalize.
        tokio::time::sleep(Duration::from_secs(3600)).await;
        drop(attempt);
    });
}

#[test]
#[ignore = "a child process of killing_the_owner_leads_to_exactly_one_takeover_after_the_lease"]
fn contender() {
    let Some(_role) = process::role() else { return };
    runtime().block_on(async {
        let log = log_in(open(Path::new(&env("IDEM_DB"))).await, &env("IDEM_NS"));
        let options = AcquireOptions::new(DAY).lease(Duration::from_secs(600));
        let won = race_until_attempt(&log, &the_scope(), &options, 8, 2).await;
        let mut lines = String::new();
        for attempt in &won {
            let takeover = attempt
                .takeover()
                .map_or("None".to_owned(), |t| format!("{t:?}"));
            lines.push_str(&format!("{} {takeover}\n", attempt.number()));
            assert_eq!(attempt.takeover(), Some(Takeover::LeaseLapsed));
            log.finalize(
                attempt,
                baton_core::idempotency::Outcome::Completed,
                b"charged by the taker",
            )
            .await
            .unwrap();
        }
        std::fs::write(env("IDEM_OUT"), lines).unwrap();
    });
}

fn rand_u64() -> u64 {
    use std::hash::{BuildHasher, RandomState};
    RandomState::new().hash_one(std::time::SystemTime::now())
}
