//! The SQLite store's own rules, beyond the conformance suite: URLs and options, creating
//! and checking the file, fences across re-opening and pruning, several stores on one file,
//! and clear errors for files that cannot be used.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use baton_core::store::{Claim, LeaseRequest, LeaseStore, Release};
use baton_core::{ErrorKind, Holder, Key, KeyKind, LockOptions, Locks, Namespace, StoreKey, Ttl};
use baton_sqlite::{SqliteOptions, SqliteStore, Synchronous, sql};
use tokio::time::{Instant, timeout};

mod common;
use common::{open, open_impatient, open_with, write_lock};

fn key(name: &str) -> StoreKey {
    Namespace::default().qualify(KeyKind::Lock, &Key::new(name).unwrap())
}

fn ttl(d: Duration) -> Ttl {
    Ttl::new(d).unwrap()
}

fn url(path: &Path) -> String {
    format!("sqlite://{}", path.display())
}

async fn grant(store: &SqliteStore, key: &StoreKey, holder: &Holder, d: Duration) -> u64 {
    match store
        .claim(key, LeaseRequest::new(holder, ttl(d)))
        .await
        .unwrap()
    {
        Claim::Granted { fence } => fence.get(),
        other => panic!("expected a grant, got {other:?}"),
    }
}

/// A connection of its own, as an operator's `sqlite3` shell would have.
fn operator(path: &Path) -> rusqlite::Connection {
    let conn = rusqlite::Connection::open(path).unwrap();
    conn.busy_timeout(Duration::from_secs(5)).unwrap();
    conn
}

#[tokio::test]
async fn connect_reads_the_path_and_options() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a.db");
    let store = SqliteStore::connect(&format!(
        "{}?busy_timeout=2s&synchronous=normal&poll_interval=40ms",
        url(&path)
    ))
    .await
    .unwrap();
    assert_eq!(store.path(), path);
    assert_eq!(store.options().get_busy_timeout(), Duration::from_secs(2));
    assert_eq!(store.options().get_synchronous(), Synchronous::Normal);
    assert_eq!(
        store.options().get_poll_interval(),
        Duration::from_millis(40)
    );
    assert_eq!(
        store.wakeups().poll,
        None,
        "releases are pushed across processes, so waiters do not poll"
    );
    assert!(path.exists());
    let defaults = SqliteStore::connect(&url(&dir.path().join("b.db")))
        .await
        .unwrap();
    assert_eq!(
        defaults.options().get_poll_interval(),
        Duration::from_millis(15)
    );
    assert_eq!(defaults.options(), &SqliteOptions::new());
}

#[tokio::test]
async fn relative_paths_are_relative_to_the_working_directory() {
    // A relative path from the working directory into a temporary directory, so the test
    // neither changes the working directory nor writes into the source tree.
    let dir = tempfile::tempdir().unwrap();
    let cwd = std::env::current_dir().unwrap();
    let mut relative = PathBuf::new();
    for _ in cwd.components().skip(1) {
        relative.push("..");
    }
    relative.push(dir.path().strip_prefix("/").unwrap());
    relative.push("rel.db");
    assert!(relative.is_relative());
    let store = SqliteStore::connect(&format!("sqlite://{}", relative.display()))
        .await
        .unwrap();
    assert_eq!(store.path(), relative);
    grant(&store, &key("k"), &Holder::random(), Duration::from_secs(5)).await;
    assert!(dir.path().join("rel.db").is_file());
}

#[tokio::test]
async fn bad_urls_and_options_are_invalid_input_and_create_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("never").join("x.db");
    for (query, needle) in [
        ("?journal=wal", "unknown sqlite:// option \"journal\""),
        ("?busy_timeout=soon", "duration \"soon\""),
        ("?busy_timeout=2h", "busy_timeout 2h is out of range"),
        ("?synchronous=extra", "synchronous=\"extra\""),
        ("?poll_interval", "has no value"),
    ] {
        let err = SqliteStore::connect(&format!("{}{query}", url(&path)))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidInput, "{query}: {err}");
        assert!(err.message().contains(needle), "{query}: {err}");
    }
    let err = SqliteStore::open(&path, SqliteOptions::new().poll_interval(Duration::ZERO))
        .await
        .unwrap_err();
    assert!(err.message().contains("poll_interval 0ms"), "{err}");
    assert!(!path.parent().unwrap().exists(), "nothing was created");
}

#[tokio::test]
async fn parent_directories_are_created() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a").join("b").join("c").join("baton.db");
    let store = open(&path).await;
    assert!(path.is_file());
    grant(&store, &key("k"), &Holder::random(), Duration::from_secs(5)).await;
}

#[tokio::test]
async fn a_directory_is_not_a_database_file() {
    let dir = tempfile::tempdir().unwrap();
    let err = SqliteStore::open(dir.path(), SqliteOptions::new())
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
    assert!(err.message().contains("is a directory"), "{err}");
    assert!(err.message().contains("baton.db"), "{err}");

    let file = dir.path().join("plain-file");
    std::fs::write(&file, b"").unwrap();
    let err = SqliteStore::open(file.join("baton.db"), SqliteOptions::new())
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(
        err.message().contains("cannot create the directory"),
        "{err}"
    );
    assert!(std::error::Error::source(&err).is_some());
}

#[cfg(unix)]
#[tokio::test]
async fn an_unreadable_file_is_unavailable() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("locked.db");
    drop(open(&path).await);
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o000)).unwrap();
    if std::fs::File::open(&path).is_ok() {
        // Running as root: permissions do not stop us. Nothing to check here.
        return;
    }
    let err = SqliteStore::open(&path, SqliteOptions::new())
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(err.message().contains(&*path.to_string_lossy()), "{err}");
}

fn header(path: &Path) -> (i32, i32, String) {
    let conn = operator(path);
    let app: i32 = conn
        .query_row("PRAGMA application_id", [], |r| r.get(0))
        .unwrap();
    let version: i32 = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    let mode: String = conn
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .unwrap();
    (app, version, mode)
}

#[tokio::test]
async fn opening_twice_keeps_the_schema_and_the_data() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("twice.db");
    let first = open(&path).await;
    let holder = Holder::random();
    let fence = grant(&first, &key("k"), &holder, Duration::from_secs(30)).await;
    let second = open(&path).await;
    let info = second
        .inspect(&key("k"))
        .await
        .unwrap()
        .expect("still held");
    assert_eq!((info.holder, info.fence.get()), (holder, fence));
    assert_eq!(
        header(&path),
        (sql::APPLICATION_ID, sql::SCHEMA_VERSION, "wal".to_owned())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_first_opens_of_one_file_all_succeed() {
    for round in 0..5 {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(format!("race-{round}.db"));
        let opens: Vec<_> = (0..8)
            .map(|_| {
                let path = path.clone();
                tokio::spawn(async move { SqliteStore::open(&path, SqliteOptions::new()).await })
            })
            .collect();
        let mut stores = Vec::new();
        for open in opens {
            stores.push(open.await.unwrap().expect("a concurrent open failed"));
        }
        assert_eq!(
            header(&path),
            (sql::APPLICATION_ID, sql::SCHEMA_VERSION, "wal".to_owned())
        );
        // One schema, usable by all of them.
        let k = key("k");
        let winner = Holder::random();
        grant(&stores[0], &k, &winner, Duration::from_secs(30)).await;
        for store in &stores[1..] {
            assert!(matches!(
                store.claim(&k, LeaseRequest::new(&Holder::random(), ttl(Duration::from_secs(30)))).await.unwrap(),
                Claim::Held { ref holder, .. } if *holder == winner
            ));
        }
    }
}

#[tokio::test]
async fn a_schema_from_a_newer_baton_is_refused_and_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("newer.db");
    drop(open(&path).await);
    operator(&path)
        .execute_batch("PRAGMA user_version = 2")
        .unwrap();
    let err = SqliteStore::open(&path, SqliteOptions::new())
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Internal, "{err}");
    assert!(err.message().contains("schema version 2"), "{err}");
    assert!(err.message().contains("newer"), "{err}");
    assert!(err.message().contains("upgrade baton"), "{err}");
    assert_eq!(header(&path).1, 2, "the file was not touched");
}

#[tokio::test]
async fn another_applications_database_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let theirs = dir.path().join("theirs.db");
    operator(&theirs)
        .execute_batch("CREATE TABLE orders (id INTEGER PRIMARY KEY)")
        .unwrap();
    let err = SqliteStore::open(&theirs, SqliteOptions::new())
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Internal, "{err}");
    assert!(err.message().contains("another application"), "{err}");
    let tables: i64 = operator(&theirs)
        .query_row("SELECT count(*) FROM sqlite_schema", [], |r| r.get(0))
        .unwrap();
    assert_eq!(tables, 1, "no baton table was added");

    let tagged = dir.path().join("tagged.db");
    operator(&tagged)
        .execute_batch("PRAGMA application_id = 42")
        .unwrap();
    let err = SqliteStore::open(&tagged, SqliteOptions::new())
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Internal, "{err}");
    assert!(err.message().contains("not a baton store"), "{err}");

    let garbage = dir.path().join("garbage.db");
    std::fs::write(&garbage, vec![0x5a; 8192]).unwrap();
    let err = SqliteStore::open(&garbage, SqliteOptions::new())
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Internal, "{err}");
    assert!(err.message().contains("not an SQLite database"), "{err}");
}

#[tokio::test]
async fn fences_survive_reopen_prune_and_operator_deletes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fences.db");
    let k = key("k");
    let mut last = 0;
    for _ in 0..3 {
        let store = open(&path).await;
        let holder = Holder::random();
        let fence = grant(&store, &k, &holder, Duration::from_secs(30)).await;
        assert!(fence > last, "fence {fence} after {last}");
        last = fence;
        assert_eq!(store.release(&k, &holder).await.unwrap(), Release::Removed);
    }

    let store = open(&path).await;
    // Another key with a high fence, then both pruned: a re-created key starts above both.
    let other = key("other");
    for _ in 0..5 {
        let h = Holder::random();
        grant(&store, &other, &h, Duration::from_secs(30)).await;
        store.release(&other, &h).await.unwrap();
    }
    // The first claim of this store swept k's free row already (sql::SWEEP).
    assert_eq!(store.prune().await.unwrap(), 1);
    let fence = grant(&store, &k, &Holder::random(), Duration::from_secs(30)).await;
    assert!(fence > 5 && fence > last, "fence {fence} after pruning");
    last = fence;

    // An operator deletes the live row by hand.
    let deleted = operator(&path)
        .execute("DELETE FROM baton_grant WHERE key = ?1", [k.as_str()])
        .unwrap();
    assert_eq!(deleted, 1);
    drop(store);
    let store = open(&path).await;
    let fence = grant(&store, &k, &Holder::random(), Duration::from_secs(30)).await;
    assert!(
        fence > last,
        "fence {fence} after an operator's delete of {last}"
    );
}

#[tokio::test]
async fn prune_keeps_live_grants() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("p.db"), SqliteOptions::new())
        .await
        .unwrap();
    let live = Holder::random();
    grant(&store, &key("live"), &live, Duration::from_secs(30)).await;
    grant(
        &store,
        &key("short"),
        &Holder::random(),
        Duration::from_millis(10),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(30)).await;
    assert_eq!(store.prune().await.unwrap(), 1, "only the expired row");
    assert_eq!(
        store.inspect(&key("live")).await.unwrap().unwrap().holder,
        live
    );
}

#[tokio::test]
async fn evict_frees_a_live_grant_and_keeps_its_fence() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("e.db"), SqliteOptions::new())
        .await
        .unwrap();
    let k = key("stuck");
    let first = grant(&store, &k, &Holder::random(), Duration::from_secs(60)).await;
    assert!(store.evict(&k).await.unwrap());
    assert!(!store.evict(&k).await.unwrap(), "nothing left to evict");
    assert!(store.inspect(&k).await.unwrap().is_none());
    let second = grant(&store, &k, &Holder::random(), Duration::from_secs(60)).await;
    assert!(second > first);
}

#[tokio::test]
async fn keys_with_like_wildcards_are_listed_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("l.db"), SqliteOptions::new())
        .await
        .unwrap();
    for name in ["a%", "a%b", "a_", "a_b", "ab", "aXb", "b"] {
        grant(
            &store,
            &key(name),
            &Holder::random(),
            Duration::from_secs(30),
        )
        .await;
    }
    let prefix = |p: &str| format!("baton:lock:{p}");
    let names = |infos: Vec<baton_core::HolderInfo>| -> Vec<String> {
        infos
            .into_iter()
            .map(|i| i.key.user_key().to_owned())
            .collect()
    };
    assert_eq!(
        names(store.list(&prefix("a%"), 10).await.unwrap()),
        ["a%", "a%b"]
    );
    assert_eq!(
        names(store.list(&prefix("a_"), 10).await.unwrap()),
        ["a_", "a_b"]
    );
    assert_eq!(names(store.list(&prefix("a"), 3).await.unwrap()).len(), 3);
    assert_eq!(store.list(&prefix(""), 100).await.unwrap().len(), 7);
    assert_eq!(store.list("", 100).await.unwrap().len(), 7);
    assert!(store.list("", 0).await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_stores_on_one_file_exclude_and_wake_each_other() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shared.db");
    // Polling so slow that only a pushed wake-up explains a quick handoff.
    let slow = SqliteOptions::new().poll_interval(Duration::from_secs(10));
    let a = Arc::new(SqliteStore::open(&path, slow.clone()).await.unwrap());
    let b = Arc::new(SqliteStore::open(&path, slow).await.unwrap());
    let k = key("k");
    let (x, y) = (Holder::random(), Holder::random());
    let fence = grant(&a, &k, &x, Duration::from_secs(60)).await;
    match b
        .claim(&k, LeaseRequest::new(&y, ttl(Duration::from_secs(60))))
        .await
        .unwrap()
    {
        Claim::Held { holder, remaining } => {
            assert_eq!(holder, x);
            assert!(remaining <= Duration::from_secs(60));
        }
        other => panic!("the second store must see the first's grant: {other:?}"),
    }
    assert_eq!(
        b.release(&k, &y).await.unwrap(),
        Release::Reclaimed { by: x.clone() }
    );
    assert_eq!(a.release(&k, &x).await.unwrap(), Release::Removed);
    assert!(grant(&b, &k, &y, Duration::from_secs(60)).await > fence);
    assert_eq!(b.release(&k, &y).await.unwrap(), Release::Removed);

    let locks_a = Locks::new(a.clone());
    let locks_b = Locks::new(b.clone());
    let held = locks_a
        .acquire("job", &LockOptions::new(Duration::from_secs(60)))
        .await
        .unwrap();
    let waiter = tokio::spawn(async move {
        locks_b
            .acquire(
                "job",
                &LockOptions::new(Duration::from_secs(60)).wait(Duration::from_secs(30)),
            )
            .await
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        !waiter.is_finished(),
        "the lock is held through the other store"
    );
    let released_at = Instant::now();
    held.release().await;
    let next = timeout(Duration::from_secs(8), waiter)
        .await
        .expect("woken by the release, not by the 10s poll nor the 60s TTL")
        .unwrap()
        .unwrap();
    assert!(released_at.elapsed() < Duration::from_secs(8));
    next.release().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn where_wake_ups_cannot_be_set_up_waiters_poll() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("poll.db");
    // A regular file where the wake-up directory would be.
    std::fs::write(dir.path().join("poll.db-wake"), b"").unwrap();
    let store = Arc::new(
        open_with(
            &path,
            SqliteOptions::new().poll_interval(Duration::from_millis(20)),
        )
        .await,
    );
    assert_eq!(store.wakeups().poll, Some(Duration::from_millis(20)));
    assert!(
        baton_core::telemetry::recent_events().into_iter().any(|e| {
            e.event.key == baton_core::telemetry::events::STORE_PUSH_LOST.key
                && e.detail.contains("poll.db-wake")
        }),
        "the store says why its waiters poll"
    );
    let k = key("job");
    grant(&store, &k, &Holder::random(), Duration::from_secs(60)).await;
    let locks = Locks::new(store.clone());
    let waiter = tokio::spawn(async move {
        locks
            .acquire(
                "job",
                &LockOptions::new(Duration::from_secs(60)).wait(Duration::from_secs(30)),
            )
            .await
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!waiter.is_finished());
    // An operator frees it: no signal reaches this process.
    let freed = tokio::task::spawn_blocking(move || {
        operator(&path)
            .execute(
                "UPDATE baton_grant SET holder = NULL WHERE key = ?1",
                [k.as_str()],
            )
            .unwrap()
    })
    .await
    .unwrap();
    assert_eq!(freed, 1);
    let guard = timeout(Duration::from_secs(20), waiter)
        .await
        .expect("found by polling long before the 60s TTL")
        .unwrap()
        .unwrap();
    guard.release().await;
}

#[tokio::test]
async fn a_file_locked_past_busy_timeout_is_unavailable_then_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("busy.db");
    let store = open_impatient(&path, Duration::from_millis(50)).await;
    let blocker = write_lock(&path);
    let k = key("k");
    let err = store
        .claim(
            &k,
            LeaseRequest::new(&Holder::random(), ttl(Duration::from_secs(5))),
        )
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(err.is_retryable());
    assert!(err.message().contains("claim on SQLite file"), "{err}");
    assert!(err.message().contains("busy_timeout"), "{err}");
    // Readers are not blocked by a writer in WAL mode.
    assert!(store.inspect(&k).await.unwrap().is_none());
    blocker.execute_batch("ROLLBACK").unwrap();
    grant(&store, &k, &Holder::random(), Duration::from_secs(5)).await;
}

#[tokio::test]
async fn stored_times_are_the_monotonic_clock() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("clock.db");
    let store = open(&path).await;
    let before = baton_sqlite::clock::now();
    grant(
        &store,
        &key("k"),
        &Holder::random(),
        Duration::from_secs(30),
    )
    .await;
    let after = baton_sqlite::clock::now();
    let (expires_at, updated_at): (i64, i64) = operator(&path)
        .query_row(
            "SELECT expires_at, updated_at FROM baton_grant WHERE key = ?1",
            [key("k").as_str()],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert!(before <= updated_at && updated_at <= after);
    assert_eq!(expires_at - updated_at, 30_000_000_000);
}

/// After a reboot every holder is gone and the clock restarted: the first open frees every
/// grant and keeps the fences.
#[cfg(target_os = "linux")]
#[tokio::test]
async fn grants_of_an_earlier_boot_are_freed_on_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("boot.db");
    let store = open(&path).await;
    let k = key("k");
    let old = grant(&store, &k, &Holder::random(), Duration::from_secs(600)).await;
    drop(store);
    // Pretend the file was last used in another boot.
    operator(&path)
        .execute(
            "UPDATE baton_meta SET value = 'an-earlier-boot' WHERE name = 'boot_id'",
            [],
        )
        .unwrap();
    let store = open(&path).await;
    assert!(
        store.inspect(&k).await.unwrap().is_none(),
        "the grant was freed"
    );
    let new = grant(&store, &k, &Holder::random(), Duration::from_secs(600)).await;
    assert!(new > old);
    // Opening again in the same boot frees nothing.
    let again = open(&path).await;
    assert_eq!(again.inspect(&k).await.unwrap().unwrap().fence.get(), new);
}

#[test]
fn a_store_dropped_outside_a_runtime_closes_quietly() {
    let dir = tempfile::tempdir().unwrap();
    let path: PathBuf = dir.path().join("drop.db");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let store = runtime
        .block_on(SqliteStore::open(&path, SqliteOptions::new()))
        .unwrap();
    drop(runtime);
    drop(store);
    assert_eq!(header(&path).1, sql::SCHEMA_VERSION);
}

fn rows(path: &Path) -> i64 {
    operator(path)
        .query_row("SELECT count(*) FROM baton_grant", [], |r| r.get(0))
        .unwrap()
}

/// Per-tick keys (`report:<tick>`) do not pile up rows: claims sweep the rows of expired and
/// free keys, a bounded number at a time, and a swept key claimed again keeps a larger fence.
#[tokio::test]
async fn claims_sweep_expired_rows_and_fences_survive() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ticks.db");
    let store = open(&path).await;
    let live = Holder::random();
    grant(&store, &key("live"), &live, Duration::from_secs(60)).await;
    let first_tick = grant(
        &store,
        &key("tick:0"),
        &Holder::random(),
        Duration::from_millis(10),
    )
    .await;
    for tick in 1..20 {
        let k = key(&format!("tick:{tick}"));
        grant(&store, &k, &Holder::random(), Duration::from_millis(10)).await;
    }
    assert_eq!(rows(&path), 21);
    tokio::time::sleep(Duration::from_millis(30)).await;

    // One claim in SWEEP_EVERY sweeps: the next sweep comes within that many claims.
    let mut claims = 0;
    while rows(&path) > 2 {
        claims += 1;
        assert!(
            claims <= sql::SWEEP_EVERY,
            "no sweep within {claims} claims"
        );
        let h = Holder::random();
        grant(&store, &key("busy"), &h, Duration::from_secs(60)).await;
        assert_eq!(
            store.release(&key("busy"), &h).await.unwrap(),
            Release::Removed
        );
    }
    // The live grant is kept, with its holder; the busy key's free row is left or swept.
    assert_eq!(
        store.inspect(&key("live")).await.unwrap().unwrap().holder,
        live
    );

    // A new store on the file sweeps at its first claim.
    for tick in 20..30 {
        let k = key(&format!("tick:{tick}"));
        grant(&store, &k, &Holder::random(), Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(30)).await;
    drop(store);
    let store = open(&path).await;
    let again = grant(
        &store,
        &key("tick:0"),
        &Holder::random(),
        Duration::from_secs(60),
    )
    .await;
    assert_eq!(rows(&path), 2, "live and tick:0 are left");
    assert!(
        again > first_tick,
        "fence {again} after a swept {first_tick}"
    );
    let floor: i64 = operator(&path)
        .query_row(
            "SELECT value FROM baton_meta WHERE name = 'fence_floor'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert!(
        floor as u64 >= first_tick,
        "the swept fences are in fence_floor"
    );
}
