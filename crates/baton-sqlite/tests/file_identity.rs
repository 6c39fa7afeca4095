//! The store follows its file, not an open inode: a holder whose database file is deleted
//! or replaced learns at its next operation that its grant is gone, fences of a key never
//! restart in a new file, and a file that is not baton's is refused before anything in it
//! is changed.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use baton_core::store::{Claim, LeaseRequest, LeaseStore, Renewal};
use baton_core::{ErrorKind, Holder, Key, KeyKind, LockOptions, Locks, Namespace, StoreKey, Ttl};
use baton_sqlite::{SqliteOptions, SqliteStore};
use tokio::time::timeout;

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
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("baton.db");
    let first = SqliteStore::open(&path, SqliteOptions::new())
        .await
        .unwrap();
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

    delete_all(&path);
    let second = SqliteStore::open(&path, SqliteOptions::new())
        .await
        .unwrap();
    let next = grant(&second, &k, &Holder::random()).await;
    assert!(
        next > held,
        "a new file handed out fence {next} for a key whose fence had been {held}"
    );

    assert_eq!(
        first
            .renew(&k, &holder, ttl(Duration::from_secs(60)))
            .await
            .unwrap(),
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
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("baton.db");
    let store = SqliteStore::open(&path, SqliteOptions::new())
        .await
        .unwrap();
    let k = key("k");
    let holder = Holder::random();
    let held = grant(&store, &k, &holder).await;

    // Another baton file, closed, moved over the path (as a restore from a backup would).
    let other = dir.path().join("other.db");
    drop(
        SqliteStore::open(&other, SqliteOptions::new())
            .await
            .unwrap(),
    );
    delete_all(&path);
    std::fs::rename(&other, &path).unwrap();

    assert_eq!(
        store
            .renew(&k, &holder, ttl(Duration::from_secs(60)))
            .await
            .unwrap(),
        Renewal::NotHeld
    );
    assert!(store.inspect(&k).await.unwrap().is_none());
    let next = grant(&store, &k, &Holder::random()).await;
    assert!(next > held, "fence {next} after {held}");
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
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("baton.db");
    let store = Arc::new(
        SqliteStore::open(&path, SqliteOptions::new())
            .await
            .unwrap(),
    );
    let locks = Locks::new(store);
    let guard = locks
        .acquire(
            "job",
            &LockOptions::new(Duration::from_secs(30)).keep_alive(Duration::from_millis(100)),
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(250)).await;
    assert!(!guard.is_lost(), "renewals succeed at first");
    delete_all(&path);
    timeout(Duration::from_secs(5), guard.lost())
        .await
        .expect("lost() fired at the next renewal after the file was deleted");
}

/// Deleting only the main file leaves the `-wal` and `-shm` files of the old database: a new
/// file must not be read through them. The holder cannot renew, nobody else can take the key
/// until they are removed, and then fences go on above the old ones.
#[tokio::test]
async fn deleting_only_the_main_file_is_noticed_and_no_file_is_built_on_its_log() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("baton.db");
    let store = SqliteStore::open(&path, SqliteOptions::new())
        .await
        .unwrap();
    let k = key("k");
    let holder = Holder::random();
    let held = grant(&store, &k, &holder).await;
    std::fs::remove_file(&path).unwrap();
    let err = store
        .renew(&k, &holder, ttl(Duration::from_secs(60)))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(err.message().contains("baton.db-wal"), "{err}");
    let err = SqliteStore::open(&path, SqliteOptions::new())
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(err.message().contains("remove"), "{err}");
    assert!(!path.exists(), "no file was created on the old log");

    delete_all(&path);
    let other = SqliteStore::open(&path, SqliteOptions::new())
        .await
        .unwrap();
    let next = grant(&other, &k, &Holder::random()).await;
    assert!(next > held, "fence {next} after {held}");
    assert_eq!(
        store
            .renew(&k, &holder, ttl(Duration::from_secs(60)))
            .await
            .unwrap(),
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
    let dir = tempfile::tempdir().unwrap();
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
        let path = dir.path().join(name);
        {
            let conn = rusqlite::Connection::open(&path).unwrap();
            conn.execute_batch(setup).unwrap();
        }
        let before = std::fs::read(&path).unwrap();
        let err = SqliteStore::open(&path, SqliteOptions::new())
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Internal, "{name}: {err}");
        assert!(
            std::fs::read(&path).unwrap() == before,
            "{name} was changed"
        );
        for companion in &with_companions(&path)[1..] {
            assert!(!companion.exists(), "{} was created", companion.display());
        }
        assert_eq!(journal_mode(&path), "delete", "{name}");
    }
}

/// When renewals cannot reach any file (only the main file was deleted, and no new one may be
/// built on the old log), the lock is lost by its `valid_until`.
#[tokio::test]
async fn a_lock_whose_renewals_fail_is_lost_by_valid_until() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("baton.db");
    let store = Arc::new(
        SqliteStore::open(&path, SqliteOptions::new())
            .await
            .unwrap(),
    );
    let locks = Locks::new(store);
    let guard = locks
        .acquire(
            "job",
            &LockOptions::new(Duration::from_secs(1)).keep_alive(Duration::from_millis(200)),
        )
        .await
        .unwrap();
    std::fs::remove_file(&path).unwrap();
    timeout(Duration::from_secs(10), guard.lost())
        .await
        .expect("lost() fired by valid_until");
    assert!(tokio::time::Instant::now() >= guard.valid_until());
}
