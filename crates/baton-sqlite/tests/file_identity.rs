//! The store follows its file, not an open inode: a holder whose database file is deleted
//! or replaced learns at its next operation that its grant is gone, fences of a key never
//! restart in a new file, and a file that is not baton's is refused before anything in it
//! is changed.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use baton_core::store::{Claim, LeaseRequest, LeaseStore, Renewal};
use baton_core::{
    ErrorKind, Holder, Key, KeyKind, LockGuard, LockOptions, Locks, Namespace, Result, StoreKey,
    Ttl,
};
use baton_sqlite::{SqliteOptions, SqliteStore};
use tokio::time::timeout;

mod common;
use common::{TempFile, open};

fn key(name: &str) -> StoreKey {
    Namespace::default().qualify(KeyKind::Lock, &Key::new(name).unwrap())
}

fn ttl(d: Duration) -> Ttl {
    Ttl::new(d).unwrap()
}

async fn grant(store: &SqliteStore, key: &StoreKey, holder: &Holder) -> u64 {
    match store
        .claim(key, LeaseRequest::new(holder, ttl(Duration::from_secs(60))))
        .await
        .unwrap()
    {
        Claim::Granted { fence } => fence.get(),
        other => panic!("expected a grant, got {other:?}"),
    }
}

/// A store on a fresh file, and a holder granted key `k` in it.
struct Held {
    file: TempFile,
    store: SqliteStore,
    k: StoreKey,
    holder: Holder,
    fence: u64,
}

async fn held() -> Held {
    let file = TempFile::new("baton.db");
    let store = open(&file.path).await;
    let (k, holder) = (key("k"), Holder::random());
    let fence = grant(&store, &k, &holder).await;
    Held {
        file,
        store,
        k,
        holder,
        fence,
    }
}

/// The next grant of `key` in `store` has a fence above `held`.
async fn assert_fences_go_on(store: &SqliteStore, key: &StoreKey, held: u64) {
    let next = grant(store, key, &Holder::random()).await;
    assert!(
        next > held,
        "a new file handed out fence {next} for a key whose fence had been {held}"
    );
}

/// A renewal for another minute.
async fn renew(store: &SqliteStore, key: &StoreKey, holder: &Holder) -> Result<Renewal> {
    store.renew(key, holder, ttl(Duration::from_secs(60))).await
}

/// A lock on a store at `path`, renewed every `keep_alive`.
async fn kept_alive_lock(path: &Path, ttl: Duration, keep_alive: Duration) -> LockGuard {
    let locks = Locks::new(Arc::new(open(path).await));
    locks
        .acquire("job", &LockOptions::new(ttl).keep_alive(keep_alive))
        .await
        .unwrap()
}

/// The file and the `-wal` and `-shm` files beside it.
fn with_companions(path: &Path) -> [PathBuf; 3] {
    let named = |suffix: &str| {
        let mut name = path.as_os_str().to_owned();
        name.push(suffix);
        PathBuf::from(name)
    };
    [path.to_owned(), named("-wal"), named("-shm")]
}

fn delete_all(path: &Path) {
    for file in with_companions(path) {
        match std::fs::remove_file(&file) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => panic!("removing {}: {e}", file.display()),
        }
    }
}

#[tokio::test]
async fn a_holder_learns_that_its_file_was_deleted_and_fences_do_not_restart() {
    let file = TempFile::new("baton.db");
    let path = &file.path;
    let first = open(path).await;
    let k = key("k");
    let mut old = 0;
    for _ in 0..4 {
        let h = Holder::random();
        old = grant(&first, &k, &h).await;
        first.release(&k, &h).await.unwrap();
    }
    let holder = Holder::random();
    let held = grant(&first, &k, &holder).await;
    assert!(held > old);

    delete_all(path);
    assert_fences_go_on(&open(path).await, &k, held).await;

    assert_eq!(
        renew(&first, &k, &holder).await.unwrap(),
        Renewal::NotHeld,
        "the holder of a deleted file still renewed"
    );
    // The first store now works on the file at the path, as a new store would.
    assert!(matches!(
        first
            .claim(
                &k,
                LeaseRequest::new(&Holder::random(), ttl(Duration::from_secs(60)))
            )
            .await
            .unwrap(),
        Claim::Held { .. }
    ));
}

#[tokio::test]
async fn a_holder_learns_that_its_file_was_replaced() {
    let held = held().await;
    let path = &held.file.path;

    // Another baton file, closed, moved over the path (as a restore from a backup would).
    let other = path.with_file_name("other.db");
    drop(open(&other).await);
    delete_all(path);
    std::fs::rename(&other, path).unwrap();

    assert_eq!(
        renew(&held.store, &held.k, &held.holder).await.unwrap(),
        Renewal::NotHeld
    );
    assert!(held.store.inspect(&held.k).await.unwrap().is_none());
    assert_fences_go_on(&held.store, &held.k, held.fence).await;
    let said = baton_core::telemetry::recent_events().into_iter().any(|e| {
        e.event.key == baton_core::telemetry::events::SQLITE_FILE_REPLACED.key
            && e.detail.contains(&*path.to_string_lossy())
    });
    assert!(
        said,
        "the file-replaced event was emitted for {}",
        path.display()
    );
}

/// A lock with keep-alive fires `lost()` at its next renewal after the file is gone.
#[tokio::test]
async fn a_kept_alive_lock_is_lost_when_its_file_is_deleted() {
    let file = TempFile::new("baton.db");
    let path = &file.path;
    let guard = kept_alive_lock(path, Duration::from_secs(30), Duration::from_millis(100)).await;
    tokio::time::sleep(Duration::from_millis(250)).await;
    assert!(!guard.is_lost(), "renewals succeed at first");
    delete_all(path);
    timeout(Duration::from_secs(5), guard.lost())
        .await
        .expect("lost() fired at the next renewal after the file was deleted");
}

/// Deleting only the main file leaves the `-wal` and `-shm` files of the old database: a new
/// file must not be read through them. The holder cannot renew, nobody else can take the key
/// until they are removed, and then fences go on above the old ones.
#[tokio::test]
async fn deleting_only_the_main_file_is_noticed_and_no_file_is_built_on_its_log() {
    let held = held().await;
    let path = &held.file.path;
    std::fs::remove_file(path).unwrap();
    let err = renew(&held.store, &held.k, &held.holder).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(err.message().contains("baton.db-wal"), "{err}");
    let err = SqliteStore::open(path, SqliteOptions::new())
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(err.message().contains("remove"), "{err}");
    assert!(!path.exists(), "no file was created on the old log");

    delete_all(path);
    assert_fences_go_on(&open(path).await, &held.k, held.fence).await;
    assert_eq!(
        renew(&held.store, &held.k, &held.holder).await.unwrap(),
        Renewal::NotHeld
    );
}

fn journal_mode(path: &Path) -> String {
    let conn = rusqlite::Connection::open(path).unwrap();
    conn.query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .unwrap()
}

/// Another application's database keeps its bytes and its journal mode.
#[tokio::test]
async fn a_file_that_is_not_batons_is_refused_before_anything_changes() {
    for (name, setup) in [
        (
            "theirs.db",
            "PRAGMA journal_mode = DELETE; CREATE TABLE orders (id INTEGER PRIMARY KEY); INSERT INTO orders VALUES (7);",
        ),
        (
            "tagged.db",
            "PRAGMA journal_mode = DELETE; PRAGMA application_id = 42;",
        ),
    ] {
        let file = TempFile::new(name);
        let path = &file.path;
        {
            let conn = rusqlite::Connection::open(path).unwrap();
            conn.execute_batch(setup).unwrap();
        }
        let before = std::fs::read(path).unwrap();
        let err = SqliteStore::open(path, SqliteOptions::new())
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Internal, "{name}: {err}");
        assert!(std::fs::read(path).unwrap() == before, "{name} was changed");
        for companion in &with_companions(path)[1..] {
            assert!(!companion.exists(), "{} was created", companion.display());
        }
        assert_eq!(journal_mode(path), "delete", "{name}");
    }
}

/// When renewals cannot reach any file (only the main file was deleted, and no new one may be
/// built on the old log), the lock is lost by its `valid_until`.
#[tokio::test]
async fn a_lock_whose_renewals_fail_is_lost_by_valid_until() {
    let file = TempFile::new("baton.db");
    let path = &file.path;
    let guard = kept_alive_lock(path, Duration::from_secs(1), Duration::from_millis(200)).await;
    std::fs::remove_file(path).unwrap();
    timeout(Duration::from_secs(10), guard.lost())
        .await
        .expect("lost() fired by valid_until");
    assert!(tokio::time::Instant::now() >= guard.valid_until());
}
