//! The seed's other two lock consumers beside the idempotency filter, as recipes with
//! tests (their code is shown in `docs/idempotency.md`):
//!
//! - **single-use token redemption**: read, compare and burn the token under a lock on it;
//!   a redemption that cannot take the lock is answered as an invalid token;
//! - **a per-(session, user) cap**: count-then-insert serialized under a lock on the pair;
//!   a submit that cannot take the lock gets the same "cap reached" answer the count would
//!   have given.
//!
//! Both run on the memory store and on two connections to one SQLite file (two replicas).
//! The application data (tokens, questions) is a shared table whose read and write are
//! separate steps with an await between them, as with a real database: without the lock,
//! concurrent callers would interleave there.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use baton::Baton;
use baton::lock::{AcquireError, LockOptions, Locks};

/// The application's token table: token -> (user, burned).
#[derive(Default)]
struct Tokens(Mutex<HashMap<String, (String, bool)>>);

impl Tokens {
    async fn read(&self, token: &str) -> Option<(String, bool)> {
        tokio::task::yield_now().await;
        self.0.lock().unwrap().get(token).cloned()
    }

    async fn burn(&self, token: &str) {
        tokio::time::sleep(Duration::from_millis(2)).await;
        if let Some(entry) = self.0.lock().unwrap().get_mut(token) {
            entry.1 = true;
        }
    }
}

#[derive(Debug, PartialEq, Eq)]
enum Redeem {
    Valid { user: String },
    Invalid,
}

/// Redeems a single-use token: read, compare and burn under `lock:<token>` (10 s TTL, 5 s
/// wait). Contention and store faults are both answered as an invalid token: a single-use
/// token must never be accepted twice, and the client can ask for a new one.
async fn redeem(locks: &Locks, tokens: &Tokens, token: &str) -> Redeem {
    let options = LockOptions::new(Duration::from_secs(10)).wait(Duration::from_secs(5));
    let guard = match locks.acquire(&format!("token:{token}"), &options).await {
        Ok(guard) => guard,
        Err(AcquireError::Contended { .. } | AcquireError::Unavailable(_)) => {
            return Redeem::Invalid;
        }
        Err(e) => panic!("a token is a valid key: {e}"),
    };
    let answer = match tokens.read(token).await {
        Some((user, false)) => {
            tokens.burn(token).await;
            Redeem::Valid { user }
        }
        _ => Redeem::Invalid,
    };
    guard.release().await;
    answer
}

/// The application's questions table: (session, user) -> questions.
#[derive(Default)]
struct Questions(Mutex<HashMap<(String, String), Vec<String>>>);

impl Questions {
    async fn count(&self, session: &str, user: &str) -> usize {
        tokio::task::yield_now().await;
        let key = (session.to_owned(), user.to_owned());
        self.0.lock().unwrap().get(&key).map_or(0, Vec::len)
    }

    async fn insert(&self, session: &str, user: &str, text: &str) {
        tokio::time::sleep(Duration::from_millis(2)).await;
        let key = (session.to_owned(), user.to_owned());
        self.0
            .lock()
            .unwrap()
            .entry(key)
            .or_default()
            .push(text.to_owned());
    }
}

#[derive(Debug, PartialEq, Eq)]
enum Submit {
    Accepted,
    CapReached,
}

/// Submits a question under the per-(session, user) cap of open questions: the count and
/// the insert run under `session-question:submit:<session>:<user>` (30 s TTL, 2 s wait). A
/// submit that cannot take the lock in time is answered as the count would have answered
/// it (cap reached), so contention never surfaces as a fault.
async fn submit(
    locks: &Locks,
    questions: &Questions,
    session: &str,
    user: &str,
    text: &str,
    cap: usize,
) -> Submit {
    let options = LockOptions::new(Duration::from_secs(30)).wait(Duration::from_secs(2));
    let key = format!("session-question:submit:{session}:{user}");
    let Ok(guard) = locks.acquire(&key, &options).await else {
        return Submit::CapReached;
    };
    let answer = if questions.count(session, user).await >= cap {
        Submit::CapReached
    } else {
        questions.insert(session, user, text).await;
        Submit::Accepted
    };
    guard.release().await;
    answer
}

/// Two replicas: two connections to one store (for memory, the same connection twice).
async fn replicas(store: &str) -> [Baton; 2] {
    match store {
        "memory://" => {
            let one = baton::connect(store).await.unwrap();
            [one.clone(), one]
        }
        _ => [
            baton::connect(store).await.unwrap(),
            baton::connect(store).await.unwrap(),
        ],
    }
}

async fn one_redemption_of_sixteen(store: &str) {
    let replicas = replicas(store).await;
    let tokens = Arc::new(Tokens::default());
    tokens
        .0
        .lock()
        .unwrap()
        .insert("reset-7f3a".into(), ("ada".into(), false));
    let tasks: Vec<_> = (0..16)
        .map(|i| {
            let (locks, tokens) = (replicas[i % 2].locks().clone(), tokens.clone());
            tokio::spawn(async move { redeem(&locks, &tokens, "reset-7f3a").await })
        })
        .collect();
    let mut answers = Vec::new();
    for task in tasks {
        answers.push(task.await.unwrap());
    }
    let valid: Vec<_> = answers.iter().filter(|a| **a != Redeem::Invalid).collect();
    assert_eq!(
        valid,
        [&Redeem::Valid { user: "ada".into() }],
        "{answers:?}"
    );
    assert_eq!(
        redeem(replicas[0].locks(), &tokens, "no-such-token").await,
        Redeem::Invalid
    );
}

async fn the_cap_holds_under_concurrent_submits(store: &str) {
    let replicas = replicas(store).await;
    let questions = Arc::new(Questions::default());
    let tasks: Vec<_> = (0..20)
        .map(|i| {
            let (locks, questions) = (replicas[i % 2].locks().clone(), questions.clone());
            tokio::spawn(async move {
                submit(&locks, &questions, "s1", "ada", &format!("question {i}"), 3).await
            })
        })
        .collect();
    let mut accepted = 0;
    for task in tasks {
        if task.await.unwrap() == Submit::Accepted {
            accepted += 1;
        }
    }
    assert_eq!(accepted, 3, "exactly the cap was accepted");
    assert_eq!(questions.count("s1", "ada").await, 3);
    let other = submit(replicas[1].locks(), &questions, "s1", "bob", "hi", 3).await;
    assert_eq!(other, Submit::Accepted, "the cap is per (session, user)");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_redemption_is_single_use_on_memory() {
    one_redemption_of_sixteen("memory://").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_redemption_is_single_use_across_sqlite_replicas() {
    let dir = tempfile::tempdir().unwrap();
    one_redemption_of_sixteen(&format!("sqlite://{}", dir.path().join("t.db").display())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_user_cap_holds_on_memory() {
    the_cap_holds_under_concurrent_submits("memory://").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_user_cap_holds_across_sqlite_replicas() {
    let dir = tempfile::tempdir().unwrap();
    the_cap_holds_under_concurrent_submits(&format!(
        "sqlite://{}",
        dir.path().join("c.db").display()
    ))
    .await;
}

/// A redemption that cannot take the lock (held elsewhere for the whole wait) is invalid,
/// and leaves the token unburned for the holder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redemption_that_cannot_take_the_lock_is_invalid() {
    let baton = baton::connect("memory://").await.unwrap();
    let tokens = Tokens::default();
    tokens
        .0
        .lock()
        .unwrap()
        .insert("t".into(), ("ada".into(), false));
    let held = baton
        .locks()
        .acquire("token:t", &LockOptions::new(Duration::from_secs(30)))
        .await
        .unwrap();
    let impatient = LockOptions::new(Duration::from_secs(10));
    assert!(
        baton
            .locks()
            .acquire("token:t", &impatient)
            .await
            .unwrap_err()
            .is_contended()
    );
    // `redeem` waits 5 s for the holder, then answers invalid.
    assert_eq!(redeem(baton.locks(), &tokens, "t").await, Redeem::Invalid);
    assert_eq!(
        tokens.read("t").await,
        Some(("ada".into(), false)),
        "not burned"
    );
    held.release().await;
    assert_eq!(
        redeem(baton.locks(), &tokens, "t").await,
        Redeem::Valid { user: "ada".into() }
    );
}
