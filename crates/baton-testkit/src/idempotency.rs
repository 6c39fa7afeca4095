//! The idempotency races that need several OS processes on one store, written once for every
//! store crate: 1,008 attempts from 2 processes of 8 tasks each acquire once; the owner killed
//! between acquire and finalize is taken over exactly once after its lease.
//!
//! A store's test binary gives an [`OpenLog`] (how a process reaches the store: a server URL
//! or a file path, the *target*) and keeps three `#[ignore]`d child tests named `racer`,
//! `owner` and `contender` that call [`racer`], [`owner`] and [`contender`]; the parents are
//! [`two_processes_acquire_once`] and [`killed_owner_is_taken_over_once`]. The children are
//! the test binary run again with a role (see [`crate::process`]).
//! [`idempotency_races!`](crate::idempotency_races) writes the five tests.

use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::time::Duration;

use baton_core::idempotency::IdempotencyStore;
use baton_core::idempotency::conformance::{race, race_until_attempt};
use baton_core::idempotency::store::{AcquireAnswer, AcquireRequest};
use baton_core::idempotency::{
    Acquire, AcquireOptions, IdempotencyLog, Outcome, Scope, Status, Takeover,
};
use baton_core::{Holder, Key, KeyKind, Namespace, Ttl};

use crate::process::{self, ChildTest, child_runtime, parent_env};

/// Opens the idempotency log of `namespace` on the store at a target (a URL or a path).
pub type OpenLog = fn(String, Namespace) -> Pin<Box<dyn Future<Output = IdempotencyLog> + Send>>;

const DAY: Duration = Duration::from_secs(86_400);
const CHILD_TIMEOUT: Duration = Duration::from_secs(300);

fn the_scope() -> Scope {
    Scope::new("org-1", "charges", "order-42").unwrap()
}

fn log(open: OpenLog, target: &str, namespace: &str) -> impl Future<Output = IdempotencyLog> {
    open(target.to_owned(), Namespace::new(namespace).unwrap())
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap()
}

/// Parent: 1,008 attempts on one scope from 2 processes of 8 tasks each (504 per process)
/// find exactly one `Acquired` between them, and the record is pending at attempt 1.
pub fn two_processes_acquire_once(target: &str, open: OpenLog) {
    let dir = tempfile::tempdir().unwrap();
    let go = dir.path().join("go");
    let namespace = baton_core::conformance::fresh_namespace()
        .as_str()
        .to_owned();
    let mut children: Vec<_> = ["a", "b"]
        .iter()
        .map(|name| {
            ChildTest::new("racer", *name)
                .env("IDEM_TARGET", target)
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
            let text = read(&dir.path().join(format!("won-{name}")));
            text.trim().parse::<u32>().unwrap()
        })
        .sum();
    assert_eq!(
        won, 1,
        "exactly one of 1,008 attempts in two processes acquires"
    );
    let record = child_runtime().block_on(async {
        let log = log(open, target, &namespace).await;
        log.get(&the_scope()).await.unwrap().unwrap()
    });
    assert_eq!((record.status(), record.attempt()), (Status::Pending, 1));
}

/// Child of [`two_processes_acquire_once`]: 8 tasks racing 504 attempts.
pub fn racer(open: OpenLog) {
    let Some(_role) = process::role() else { return };
    child_runtime().block_on(async {
        let log = log(open, &parent_env("IDEM_TARGET"), &parent_env("IDEM_NS")).await;
        std::fs::write(parent_env("IDEM_READY"), "ready").unwrap();
        process::wait_for_file(parent_env("IDEM_GO"), CHILD_TIMEOUT).unwrap();
        let options = AcquireOptions::new(DAY).lease(Duration::from_secs(600));
        let won = race(&log, &the_scope(), &options, 8, 504).await;
        std::fs::write(parent_env("IDEM_OUT"), won.len().to_string()).unwrap();
        // Leave the won attempt pending: the parent checks the record.
        std::mem::forget(won);
    });
}

/// Parent: the owner is killed between acquire and finalize; once its lease lapses, exactly
/// one of the attempts racing from two other processes (8 tasks each) takes the record over,
/// as attempt 2, and its finalize is what the record keeps.
pub fn killed_owner_is_taken_over_once(target: &str, open: OpenLog) {
    let dir = tempfile::tempdir().unwrap();
    let namespace = baton_core::conformance::fresh_namespace()
        .as_str()
        .to_owned();
    let acquired = dir.path().join("acquired");
    let mut owner = ChildTest::new("owner", "owner")
        .env("IDEM_TARGET", target)
        .env("IDEM_NS", &namespace)
        .env("IDEM_ACQUIRED", &acquired)
        .spawn()
        .unwrap();
    process::wait_for_file(&acquired, CHILD_TIMEOUT).unwrap();
    owner.kill().unwrap();
    let before = child_runtime().block_on(async {
        let log = log(open, target, &namespace).await;
        log.get(&the_scope()).await.unwrap().unwrap()
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
                .env("IDEM_TARGET", target)
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
            let text = read(&dir.path().join(format!("won-{name}")));
            text.lines().map(str::to_owned).collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(won, ["2 LeaseLapsed"], "exactly one takeover, as attempt 2");
    let after = child_runtime().block_on(async {
        let log = log(open, target, &namespace).await;
        log.get(&the_scope()).await.unwrap().unwrap()
    });
    assert_eq!((after.status(), after.attempt()), (Status::Completed, 2));
    assert_eq!(after.metadata(), b"charged by the taker");
}

/// Child of [`killed_owner_is_taken_over_once`]: acquires with a 2 s lease, then waits to be
/// killed between acquire and finalize.
pub fn owner(open: OpenLog) {
    let Some(_role) = process::role() else { return };
    child_runtime().block_on(async {
        let log = log(open, &parent_env("IDEM_TARGET"), &parent_env("IDEM_NS")).await;
        let options = AcquireOptions::new(DAY).lease(Duration::from_secs(2));
        let Acquire::Acquired(attempt) =
            log.try_acquire_with(&the_scope(), &options).await.unwrap()
        else {
            panic!("the owner acquires first");
        };
        std::fs::write(parent_env("IDEM_ACQUIRED"), attempt.number().to_string()).unwrap();
        // Killed here, between acquire and finalize.
        tokio::time::sleep(Duration::from_secs(3600)).await;
        drop(attempt);
    });
}

/// Child of [`killed_owner_is_taken_over_once`]: 8 tasks racing until attempt 2 exists; the
/// winner finalizes.
pub fn contender(open: OpenLog) {
    let Some(_role) = process::role() else { return };
    child_runtime().block_on(async {
        let log = log(open, &parent_env("IDEM_TARGET"), &parent_env("IDEM_NS")).await;
        let options = AcquireOptions::new(DAY).lease(Duration::from_secs(600));
        let won = race_until_attempt(&log, &the_scope(), &options, 8, 2).await;
        let mut lines = String::new();
        for attempt in &won {
            let takeover = attempt
                .takeover()
                .map_or("None".to_owned(), |t| format!("{t:?}"));
            lines.push_str(&format!("{} {takeover}\n", attempt.number()));
            assert_eq!(attempt.takeover(), Some(Takeover::LeaseLapsed));
            log.finalize(attempt, Outcome::Completed, b"charged by the taker")
                .await
                .unwrap();
        }
        std::fs::write(parent_env("IDEM_OUT"), lines).unwrap();
    });
}

/// Generates the idempotency races of a store's test binary: the two parent tests
/// (`a_thousand_attempts_from_two_processes_acquire_once`,
/// `killing_the_owner_leads_to_exactly_one_takeover_after_the_lease`) and their child roles
/// (`racer`, `owner`, `contender`, `#[ignore]`d in ordinary runs). `$target` is evaluated
/// once in each parent test to `(keep, target)`: what must live for the test (a private
/// server, a temp dir) and the target string the processes hand to `$open`, an [`OpenLog`].
#[macro_export]
macro_rules! idempotency_races {
    ($target:expr, $open:expr) => {
        /// 1,008 attempts on one scope from 2 processes of 8 tasks each find exactly one
        /// `Acquired`.
        #[test]
        fn a_thousand_attempts_from_two_processes_acquire_once() {
            let (_keep, target) = $target;
            $crate::idempotency::two_processes_acquire_once(&target, $open);
        }

        #[test]
        #[ignore = "a child process of a_thousand_attempts_from_two_processes_acquire_once"]
        fn racer() {
            $crate::idempotency::racer($open);
        }

        /// The owner is killed between acquire and finalize; once its lease lapses, exactly
        /// one of the attempts racing from two other processes takes the record over.
        #[test]
        fn killing_the_owner_leads_to_exactly_one_takeover_after_the_lease() {
            let (_keep, target) = $target;
            $crate::idempotency::killed_owner_is_taken_over_once(&target, $open);
        }

        #[test]
        #[ignore = "a child process of killing_the_owner_leads_to_exactly_one_takeover_after_the_lease"]
        fn owner() {
            $crate::idempotency::owner($open);
        }

        #[test]
        #[ignore = "a child process of killing_the_owner_leads_to_exactly_one_takeover_after_the_lease"]
        fn contender() {
            $crate::idempotency::contender($open);
        }
    };
}

/// For stores whose acquire recognises its own attempt token (Redis, etcd): an acquire sent
/// again after its first try ran (its answer lost with the connection) is answered as
/// acquired again, with the same owner, attempt and takeover, not as a duplicate of itself.
///
/// # Panics
/// When either answer is not `Acquired`, or they differ.
pub async fn own_token_is_acquired_again(store: &dyn IdempotencyStore) {
    let key = baton_core::conformance::fresh_namespace()
        .qualify(KeyKind::Idempotency, &Key::new("o:d:k").unwrap());
    let token = Holder::random();
    let ttl = Ttl::new(Duration::from_secs(60)).unwrap();
    let request = AcquireRequest {
        attempt: &token,
        fingerprint: "f",
        ttl,
        lease: ttl,
        retry_failed: false,
    };
    let first = store.acquire(&key, request).await.unwrap();
    let again = store.acquire(&key, request).await.unwrap();
    let (
        AcquireAnswer::Acquired { record: a, .. },
        AcquireAnswer::Acquired {
            record: b,
            previous,
        },
    ) = (first, again)
    else {
        panic!("both answers are Acquired");
    };
    assert_eq!((a.owner, a.attempt), (b.owner, b.attempt));
    assert_eq!(previous, None);
    assert!(b.lease_remaining > Duration::ZERO && b.lease_remaining <= ttl.get());
}
