//! Release wake-ups across OS processes on one file: a release in one process wakes the
//! waiter of another at once, in the order they started waiting, and a waiter that is
//! gone, paused or no longer waiting does not hold the key up.
//!
//! Every store here polls only every 10 s and every grant lives 60 s, so a waiter that gets
//! the key within its few seconds of waiting was woken by the release.
//!
//! The children are `waiter_process`, run by the parents with a role (see
//! `baton_testkit::process`).

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use baton_core::{LockOptions, Locks};
use baton_sqlite::{SqliteOptions, SqliteStore};
use baton_testkit::process::{self, Child, ChildTest, wait_for_file, wait_until_async};
use common::{queued, until_queued};

const KEY: &str = "job";
const HOLD: Duration = Duration::from_secs(60);
/// How long the parent gives a step that takes milliseconds when it works.
const PATIENCE: Duration = Duration::from_secs(20);

fn slow_polling() -> SqliteOptions {
    SqliteOptions::new().poll_interval(Duration::from_secs(10))
}

async fn locks_on(db: &Path) -> Locks {
    let store = SqliteStore::open(db, slow_polling()).await.unwrap();
    Locks::new(Arc::new(store))
}

fn waiting(wait: Duration) -> LockOptions {
    LockOptions::new(HOLD).wait(wait)
}

/// Starts a child that waits `wait` for the key; it writes `<name>.acquired` (holding its
/// fence) and `<name>.waited` (how long, in ms), or
/// `<name>.gave-up` beside the file, and with `stay` waits for `exit` before it ends.
fn spawn_waiter(db: &Path, name: &str, wait: Duration, stay: bool) -> Child {
    spawn_waiter_for(db, name, wait, HOLD, stay)
}

/// [`spawn_waiter`] whose grant lives `ttl`.
fn spawn_waiter_for(db: &Path, name: &str, wait: Duration, ttl: Duration, stay: bool) -> Child {
    ChildTest::new("waiter_process", name)
        .env("DB", db)
        .env("WAIT_MS", wait.as_millis().to_string())
        .env("TTL_MS", ttl.as_millis().to_string())
        .env("STAY", if stay { "1" } else { "" })
        .spawn()
        .unwrap()
}

/// A fresh file, locks on it, and the key held through them for [`HOLD`]; the directory
/// lives as long as the returned guard of it.
async fn held_on_a_fresh_file() -> (tempfile::TempDir, PathBuf, Locks, baton_core::LockGuard) {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("baton.db");
    let locks = locks_on(&db).await;
    let held = locks.acquire(KEY, &LockOptions::new(HOLD)).await.unwrap();
    (dir, db, locks, held)
}

/// A waiter in this process, waiting up to 4 s, once it is queued as the `n`th process.
async fn queue_here(
    locks: Locks,
    db: &Path,
    n: usize,
) -> tokio::task::JoinHandle<Result<baton_core::LockGuard, baton_core::AcquireError>> {
    let waiter =
        tokio::spawn(async move { locks.acquire(KEY, &waiting(Duration::from_secs(4))).await });
    until_queued(db, n).await;
    waiter
}

fn marker(db: &Path, name: &str, what: &str) -> PathBuf {
    db.with_file_name(format!("{name}.{what}"))
}

#[test]
#[ignore = "a child process of the tests in this file"]
fn waiter_process() {
    let Some(name) = process::role() else { return };
    let db = PathBuf::from(process::parent_env("DB"));
    let wait = Duration::from_millis(process::parent_env("WAIT_MS").parse().unwrap());
    let ttl = Duration::from_millis(process::parent_env("TTL_MS").parse().unwrap());
    let stay = !process::parent_env("STAY").is_empty();
    process::child_runtime().block_on(async {
        let locks = locks_on(&db).await;
        std::fs::write(marker(&db, &name, "waiting"), b"").unwrap();
        let started = std::time::Instant::now();
        match locks
            .try_acquire(KEY, &LockOptions::new(ttl).wait(wait))
            .await
            .unwrap()
        {
            Some(guard) => {
                let waited = started.elapsed().as_millis().to_string();
                std::fs::write(marker(&db, &name, "waited"), waited).unwrap();
                std::fs::write(
                    marker(&db, &name, "acquired"),
                    guard.fence().get().to_string(),
                )
                .unwrap();
                guard.release().await;
            }
            None => std::fs::write(marker(&db, &name, "gave-up"), b"").unwrap(),
        }
        if stay {
            let exit = db.with_file_name("exit");
            tokio::task::spawn_blocking(move || wait_for_file(exit, Duration::from_secs(60)))
                .await
                .unwrap()
                .unwrap();
        }
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_in_another_process_wakes_its_waiter_at_once() {
    let (_dir, db, _locks, held) = held_on_a_fresh_file().await;
    let mut child = spawn_waiter(&db, "a", Duration::from_secs(4), false);
    wait_for_file(marker(&db, "a", "waiting"), PATIENCE).unwrap();
    // Time for its claim to find the key held.
    tokio::time::sleep(Duration::from_millis(300)).await;
    held.release().await;
    child.wait_success(PATIENCE).unwrap();
    let waited: u64 = std::fs::read_to_string(marker(&db, "a", "waited"))
        .expect("the waiter gave up: the release did not reach it")
        .parse()
        .unwrap();
    // Its last claim, as its 4 s ran out, would have found the key free too.
    assert!(
        waited < 3_500,
        "the waiter took the key only as its wait ran out ({waited} ms): the release did not wake it"
    );
    assert_eq!(queued(&db), 0, "the granted process left the queue");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_waiter_is_skipped_and_its_entry_deleted() {
    let (_dir, db, _locks, held) = held_on_a_fresh_file().await;
    let mut first = spawn_waiter(&db, "first", Duration::from_secs(30), false);
    until_queued(&db, 1).await;
    first.kill().unwrap();
    // Another store of the file in this process, as another replica would be.
    let waiter = queue_here(locks_on(&db).await, &db, 2).await;
    held.release().await;
    let guard = waiter
        .await
        .unwrap()
        .expect("the turn skips the killed process and reaches the next");
    assert_eq!(queued(&db), 0, "the killed process's entry is deleted");
    guard.release().await;
}

/// A paused process is handed the key as any waiting process is (the release cannot tell it
/// is paused): the key is its holder's, as if it had claimed it just before the pause, and
/// the next in line takes it when that grant's TTL ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_waiter_holds_the_key_up_only_until_its_grant_ends() {
    let (_dir, db, locks, held) = held_on_a_fresh_file().await;
    let ttl = Duration::from_secs(1);
    let mut paused = spawn_waiter_for(&db, "paused", Duration::from_secs(30), ttl, false);
    until_queued(&db, 1).await;
    paused.pause().unwrap();
    let waiter = queue_here(locks.clone(), &db, 2).await;
    // The key goes to the paused process's holder; the next one is told it is next, looks
    // again, finds it held, and claims again when that grant ends.
    held.release().await;
    let (holder, reason): (Option<String>, String) = rusqlite::Connection::open(&db)
        .unwrap()
        .query_row(
            "SELECT holder, reason FROM baton_grant WHERE key = 'baton:lock:job'",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert!(
        holder.is_some() && reason.is_empty(),
        "the release granted the key to the waiting holder itself, not a reservation: {holder:?} {reason:?}"
    );
    let guard = waiter
        .await
        .unwrap()
        .expect("the next in line took the key its paused predecessor did not claim");
    paused.resume().unwrap();
    // Its turn came while it was paused: resumed, it claims, finds the key held, and waits.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!marker(&db, "paused", "acquired").exists());
    guard.release().await;
    paused.wait_success(PATIENCE).unwrap();
    assert!(
        marker(&db, "paused", "acquired").exists(),
        "the resumed process is woken by the next release"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_that_stopped_waiting_passes_its_turn_on() {
    let (_dir, db, _locks, held) = held_on_a_fresh_file().await;
    let mut quitter = spawn_waiter(&db, "quitter", Duration::from_millis(500), true);
    until_queued(&db, 1).await;
    let gave_up = marker(&db, "quitter", "gave-up");
    wait_until_async("the first waiter gives up", PATIENCE, || gave_up.exists())
        .await
        .unwrap();
    let mut next = spawn_waiter(&db, "next", Duration::from_secs(4), false);
    until_queued(&db, 2).await;
    held.release().await;
    next.wait_success(PATIENCE).unwrap();
    assert!(marker(&db, "next", "acquired").exists());
    // The quitter deleted its entry when it passed the turn on, though it still runs.
    until_queued(&db, 0).await;
    std::fs::write(db.with_file_name("exit"), b"").unwrap();
    quitter.wait_success(PATIENCE).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processes_take_turns_in_the_order_they_started_waiting() {
    let (_dir, db, locks, held) = held_on_a_fresh_file().await;
    let names = ["one", "two", "three"];
    let mut children = Vec::new();
    for (i, name) in names.iter().enumerate() {
        children.push(spawn_waiter(&db, name, Duration::from_secs(10), false));
        until_queued(&db, i + 1).await;
    }
    // This process, last in line, asks again right after its release: it must not cut in.
    held.release().await;
    let mine = locks
        .acquire(KEY, &waiting(Duration::from_secs(10)))
        .await
        .unwrap();
    let fences: Vec<u64> = names
        .iter()
        .map(|name| {
            std::fs::read_to_string(marker(&db, name, "acquired"))
                .expect("every earlier waiter had its turn first")
                .parse()
                .unwrap()
        })
        .collect();
    assert!(
        fences.windows(2).all(|w| w[0] < w[1]),
        "turns follow the order of waiting: {names:?} got fences {fences:?}"
    );
    assert!(
        mine.fence().get() > fences[2],
        "the releaser asked again at once and still came last"
    );
    mine.release().await;
    for mut child in children {
        child.wait_success(PATIENCE).unwrap();
    }
}
