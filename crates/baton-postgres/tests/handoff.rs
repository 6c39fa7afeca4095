//! The handoff path's commits: a release commits without waiting for the disk and still
//! wakes waiters everywhere; a claim and a renewal wait for it (unless the store was opened
//! with `durable_grants=off`); and a release lost in a server crash only keeps the key held
//! until its TTL, with fences still increasing.
//!
//! Whether a commit waited for the WAL flush is read from the server: on a quiet server the
//! WAL is flushed up to where it was written (`pg_current_wal_flush_lsn() =
//! pg_current_wal_insert_lsn()`); a synchronous commit moves the flush position past its own
//! record before it answers, an asynchronous one leaves it behind until the WAL writer runs.
//! The servers here run with `wal_writer_delay = 10s`, so that gap stays open for seconds;
//! a reading that other WAL traffic got into (the listener's heartbeat commits every 5 s) is
//! taken again.
//!
//! And eight OS processes, as eight replicas with a store each, contend for one key with
//! every acquire, release and fenced write recorded; their merged history keeps every rule.
//!
//! No test here asserts speed.

mod common;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use baton_core::store::{Claim, LeaseRequest, LeaseStore, Release, Renewal};
use baton_core::{AcquireError, Fence, Holder, LockGuard, LockOptions, Locks, StoreKey, Ttl};
use baton_postgres::PostgresStore;
use baton_postgres::sql;
use baton_testkit::LockWorkload;
use baton_testkit::postgres::{PostgresOptions as ServerOptions, PostgresServer, Stop};
use sqlx::PgConnection;

use common::*;

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

fn ttl(d: Duration) -> Ttl {
    Ttl::new(d).expect("a valid ttl")
}

fn holder(name: &str) -> Holder {
    Holder::new(name).expect("a valid holder")
}

/// A private server whose WAL writer waits 10 s between rounds, so an asynchronous commit
/// stays unflushed long enough to be seen (and to be lost in a crash).
async fn lazy_wal_writer() -> PostgresServer {
    blocking(|| {
        PostgresServer::start_with(ServerOptions::new().setting("wal_writer_delay", "10s"))
            .expect("a private PostgreSQL server")
    })
    .await
}

async fn granted(store: &dyn LeaseStore, key: &StoreKey, holder: &Holder, t: Duration) -> Fence {
    match store.claim(key, LeaseRequest::new(holder, ttl(t))).await {
        Ok(Claim::Granted { fence }) => fence,
        other => panic!("expected a grant of {key}, got {other:?}"),
    }
}

/// The WAL insert and flush positions, in bytes.
async fn wal(conn: &mut PgConnection) -> (i64, i64) {
    sqlx::query_as(
        "SELECT (pg_current_wal_insert_lsn() - '0/0')::bigint, \
                (pg_current_wal_flush_lsn() - '0/0')::bigint",
    )
    .fetch_one(conn)
    .await
    .expect("WAL positions")
}

/// Waits until the WAL is flushed as far as it is written, and returns that position. A
/// synchronous commit of a write (as this connection's are) flushes whatever is pending; a
/// commit that wrote nothing but its own record (`txid_current()`, a `NOTIFY`) would not.
async fn quiet(conn: &mut PgConnection) -> i64 {
    sqlx::query("CREATE TABLE IF NOT EXISTS handoff_quiet (n bigint)")
        .execute(&mut *conn)
        .await
        .expect("the table of flushing writes");
    let mut last = (0, 0);
    for _ in 0..100 {
        sqlx::query("INSERT INTO handoff_quiet VALUES (1)")
            .execute(&mut *conn)
            .await
            .expect("a flushing commit");
        let (insert, flush) = wal(conn).await;
        if insert == flush {
            return flush;
        }
        last = (insert, flush);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("the WAL never caught up with its writes: insert and flush at {last:?}");
}

/// How a write committed, as far as the WAL positions tell.
#[derive(Debug, PartialEq, Eq)]
enum Commit {
    /// The flush position did not move: the commit answered before reaching the disk.
    Unflushed,
    /// The flush position moved past the quiet point: by this commit, or by other WAL
    /// traffic in between.
    Flushed,
}

/// Runs `setup`, waits for a quiet WAL, and reads the WAL positions around `write`, which
/// must write. Neither may use `conn`.
async fn commit_of(
    conn: &mut PgConnection,
    setup: &mut impl AsyncFnMut(),
    write: &mut impl AsyncFnMut(),
) -> Commit {
    setup().await;
    let before = quiet(conn).await;
    write().await;
    let (insert, flush) = wal(conn).await;
    assert!(insert > before, "the write wrote no WAL");
    if flush == before {
        Commit::Unflushed
    } else {
        Commit::Flushed
    }
}

/// Asserts that `write` commits without waiting for the disk: one reading without other WAL
/// traffic in between shows it unflushed.
async fn assert_asynchronous(
    what: &str,
    conn: &mut PgConnection,
    mut setup: impl AsyncFnMut(),
    mut write: impl AsyncFnMut(),
) {
    for _ in 0..10 {
        if commit_of(conn, &mut setup, &mut write).await == Commit::Unflushed {
            return;
        }
    }
    panic!("{what} was flushed before it answered, in each of 10 readings");
}

/// Asserts that `write` waits for its flush: a synchronous commit can never leave the flush
/// position where it was.
async fn assert_synchronous(
    what: &str,
    conn: &mut PgConnection,
    mut setup: impl AsyncFnMut(),
    mut write: impl AsyncFnMut(),
) {
    for _ in 0..3 {
        assert_eq!(
            commit_of(conn, &mut setup, &mut write).await,
            Commit::Flushed,
            "{what} answered before its commit was flushed"
        );
    }
}

/// By default a claim and a renewal answer after their commit is flushed, and a release
/// before; with `durable_grants=off` none waits. An evict (an operator's action) waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn releases_commit_asynchronously_and_grants_durably_unless_relaxed() {
    let server = lazy_wal_writer().await;
    let mut conn = raw(&server.url()).await;
    let ns = namespace();
    let key = lock_key(&ns, "k");
    let t = secs(60);

    let durable = connect(&server.url()).await;
    assert!(durable.options().get_durable_grants());
    let a = holder("a");
    let free = async || {
        durable.release(&key, &a).await.unwrap();
    };
    let claim = async || {
        granted(&durable, &key, &a, t).await;
    };
    // A new grant whether or not the key is held now.
    let reclaim = async || {
        durable.release(&key, &a).await.unwrap();
        granted(&durable, &key, &a, t).await;
    };
    let renew = async || {
        assert_eq!(
            durable.renew(&key, &a, ttl(t)).await.unwrap(),
            Renewal::Renewed
        );
    };
    let release = async || {
        assert_eq!(durable.release(&key, &a).await.unwrap(), Release::Removed);
    };
    let evict = async || {
        assert!(durable.evict(&key).await.unwrap());
    };
    let nothing = async || {};
    assert_synchronous("a claim", &mut conn, free, claim).await;
    assert_synchronous("a renewal", &mut conn, nothing, renew).await;
    assert_asynchronous("a release", &mut conn, reclaim, release).await;
    assert_synchronous("an evict", &mut conn, reclaim, evict).await;

    let relaxed = connect(&format!("{}?durable_grants=off", server.url())).await;
    assert!(!relaxed.options().get_durable_grants());
    let b = holder("b");
    let free = async || {
        relaxed.release(&key, &b).await.unwrap();
    };
    let claim = async || {
        granted(&relaxed, &key, &b, t).await;
    };
    let reclaim = async || {
        relaxed.release(&key, &b).await.unwrap();
        granted(&relaxed, &key, &b, t).await;
    };
    let renew = async || {
        assert_eq!(
            relaxed.renew(&key, &b, ttl(t)).await.unwrap(),
            Renewal::Renewed
        );
    };
    assert_asynchronous("a relaxed claim", &mut conn, free, claim).await;
    assert_asynchronous("a relaxed renewal", &mut conn, nothing, renew).await;
    assert_asynchronous("a relaxed release", &mut conn, reclaim, free).await;
}

/// The release sets `synchronous_commit` for its own transaction only: the connection's
/// setting is untouched afterwards, while inside a larger transaction it lasts until that
/// transaction ends (as `sql::RELEASE` documents).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_release_changes_no_session_setting() {
    let url = shared().await.url();
    let store = connect(&url).await;
    let ns = namespace();
    let key = lock_key(&ns, "k");
    let a = holder("a");
    let mut conn = raw(&url).await;
    let setting = async |conn: &mut PgConnection| -> String {
        sqlx::query_scalar("SHOW synchronous_commit")
            .fetch_one(conn)
            .await
            .unwrap()
    };
    let release = async |conn: &mut PgConnection| -> i64 {
        // The first column is `removed`.
        sqlx::query_scalar::<_, i64>(sql::RELEASE)
            .bind(key.as_str())
            .bind(a.as_str())
            .fetch_one(conn)
            .await
            .unwrap()
    };

    granted(&store, &key, &a, secs(60)).await;
    assert_eq!(release(&mut conn).await, 1);
    assert_eq!(setting(&mut conn).await, "on");

    granted(&store, &key, &a, secs(60)).await;
    execute(&mut conn, "BEGIN").await;
    assert_eq!(release(&mut conn).await, 1);
    assert_eq!(setting(&mut conn).await, "off");
    execute(&mut conn, "COMMIT").await;
    assert_eq!(setting(&mut conn).await, "on");

    // A release that frees nothing changes nothing, the setting included.
    execute(&mut conn, "BEGIN").await;
    assert_eq!(release(&mut conn).await, 0);
    assert_eq!(setting(&mut conn).await, "on");
    execute(&mut conn, "ROLLBACK").await;
}

/// An asynchronously committed release still sends its `NOTIFY`: a waiter in another store
/// (another process, as far as wake-ups go) whose holder's TTL is ten minutes is woken by
/// the release, with durable and with relaxed grants.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_asynchronous_release_wakes_waiters_in_other_stores() {
    let url = shared().await.url();
    for query in ["", "?durable_grants=off"] {
        let ns = namespace();
        let holding = Arc::new(connect(&format!("{url}{query}")).await);
        let waiting = Arc::new(connect(&format!("{url}{query}")).await);
        assert!(waiting.is_listening());
        assert_eq!(
            waiting.wakeups().poll,
            None,
            "no polling: only NOTIFY can wake"
        );
        let holder = Locks::with_namespace(holding, ns.clone());
        let waiter = Locks::with_namespace(waiting, ns.clone());
        let handoff = hold_while_waiting(&holder, waiter, secs(30), secs(300)).await;
        let first = handoff.guard.fence();
        // Let the waiter find the key held and start waiting.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let next = handoff
            .release_to_waiter("the waiter woken by NOTIFY long before the 10 minute TTL")
            .await;
        assert!(next.fence() > first, "{query}");
        next.release().await;
    }
}

/// A release lost in a server crash (it answered before reaching the disk, and the crash
/// came first) brings the key back held by the releasing holder, with its fence, until the
/// grant's TTL; another claimer gets it then, with a larger fence. A claim answered before
/// the crash survives it. Whether the release was lost depends on the WAL writer's timing;
/// both outcomes are checked, and with a 10 s WAL writer delay the loss is the usual one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_lost_in_a_crash_keeps_the_key_at_most_until_its_ttl() {
    let server = Arc::new(lazy_wal_writer().await);
    let store = connect(&server.url()).await;
    let ns = namespace();
    let (key, kept) = (lease_key(&ns, "released"), lease_key(&ns, "kept"));
    let (a, b, c) = (
        holder("instance-a"),
        holder("instance-b"),
        holder("instance-c"),
    );
    let t = secs(4);

    let kept_fence = granted(&store, &kept, &c, secs(600)).await;
    let fence = granted(&store, &key, &a, t).await;
    assert_eq!(store.release(&key, &a).await.unwrap(), Release::Removed);
    let crashing = Arc::clone(&server);
    blocking(move || crashing.restart(Stop::Immediate))
        .await
        .expect("the server restarts after the crash");

    // The claim was durable: it survives, fence and all.
    let info = within("inspect after the crash", store.inspect(&kept))
        .await
        .unwrap()
        .expect("an answered claim survives a crash");
    assert_eq!((info.holder.as_str(), info.fence), (c.as_str(), kept_fence));

    let lost = match store.inspect(&key).await.unwrap() {
        Some(info) => {
            // The release was lost: the key is back with its last holder and fence, and
            // no longer than the grant's TTL.
            assert_eq!((info.holder.as_str(), info.fence), (a.as_str(), fence));
            assert!(info.remaining <= t, "{info:?}");
            match store
                .claim(&key, LeaseRequest::new(&b, ttl(t)))
                .await
                .unwrap()
            {
                Claim::Held { holder, remaining } => {
                    assert_eq!(holder.as_str(), a.as_str());
                    assert!(remaining <= t);
                }
                // The TTL ran out between the two statements.
                Claim::Granted { fence: next } => {
                    assert!(next > fence);
                    store.release(&key, &b).await.unwrap();
                }
                other => panic!("{other:?}"),
            }
            true
        }
        None => false,
    };
    // Either way another holder has the key by the TTL at the latest, above the old fence.
    let next = eventually("another holder's grant", async || {
        match store
            .claim(&key, LeaseRequest::new(&b, ttl(t)))
            .await
            .unwrap()
        {
            Claim::Granted { fence } => Some(fence),
            Claim::Held { .. } => None,
            other => panic!("{other:?}"),
        }
    })
    .await;
    assert!(next > fence, "fence {next} after {fence}");
    eprintln!("release lost in the crash: {lost}");
}

/// The key's queue of waiting stores, oldest first: each entry's LISTEN backend and the
/// transaction that last wrote it (`xmin`, which a claim that queues again would change).
async fn queue(pool: &sqlx::PgPool, key: &StoreKey) -> Vec<(i32, String)> {
    sqlx::query_as("SELECT pid, xmin::text FROM baton_wait WHERE key = $1 ORDER BY since, pid")
        .bind(key.as_str())
        .fetch_all(pool)
        .await
        .expect("the queue of waiting stores")
}

type Waiting = tokio::task::JoinHandle<Result<LockGuard, AcquireError>>;

/// Lock `k` held for ten minutes through a store of its own, and a waiter in each of
/// `stores` other stores (other processes, as far as wake-ups go), queued one after another:
/// each store is in `baton_wait` before the next one's waiter starts. Each waits up to five
/// minutes for a grant of a minute.
struct Queued {
    pool: sqlx::PgPool,
    key: StoreKey,
    holding: Locks,
    guard: LockGuard,
    stores: Vec<Arc<PostgresStore>>,
    waiters: Vec<Waiting>,
}

async fn queued(stores: usize) -> Queued {
    let url = shared().await.url();
    let ns = namespace();
    let key = lock_key(&ns, "k");
    let pool = sqlx::PgPool::connect(&url)
        .await
        .expect("a pool for reading");
    let holding = Locks::with_namespace(Arc::new(connect(&url).await), ns.clone());
    let guard = holding
        .acquire("k", &LockOptions::new(secs(600)))
        .await
        .expect("an uncontended acquire");
    let (mut queued, mut waiters) = (Vec::new(), Vec::new());
    for n in 1..=stores {
        let store = Arc::new(connect(&url).await);
        assert!(store.is_listening());
        let locks = Locks::with_namespace(Arc::clone(&store) as Arc<dyn LeaseStore>, ns.clone());
        let options = LockOptions::new(secs(60)).wait(secs(300));
        waiters.push(tokio::spawn(
            async move { locks.acquire("k", &options).await },
        ));
        eventually("the waiter's store in the queue", || {
            let (pool, key) = (pool.clone(), key.clone());
            async move { (queue(&pool, &key).await.len() == n).then_some(()) }
        })
        .await;
        queued.push(store);
    }
    Queued {
        pool,
        key,
        holding,
        guard,
        stores: queued,
        waiters,
    }
}

/// The grant `waiter` was waiting for.
async fn grant(what: &str, waiter: Waiting) -> LockGuard {
    within(what, waiter)
        .await
        .expect("the waiter panicked")
        .unwrap_or_else(|e| panic!("{what}: {e}"))
}

/// Waits until the backend `pid` has ended (its store was dropped).
async fn backend_ended(pool: &sqlx::PgPool, pid: i32) {
    eventually("the gone store's backend ended", || {
        let pool = pool.clone();
        async move {
            let left: i64 =
                sqlx::query_scalar("SELECT count(*) FROM pg_stat_activity WHERE pid = $1")
                    .bind(pid)
                    .fetch_one(&pool)
                    .await
                    .unwrap();
            (left == 0).then_some(())
        }
    })
    .await;
}

/// Ends `waiter`'s wait, as a dropped acquire (a timeout, a cancelled request) does.
async fn give_up(waiter: Waiting) {
    waiter.abort();
    let _ = waiter.await;
}

/// Waiters in three stores queue in turn for a key held in a fourth. Each release hands the
/// key to the store that waited longest, which takes it without a claim of its own; the
/// stores whose turn it is not are not woken (their entries are not written again), and the
/// grant's fence is the lease row's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_hands_the_key_to_the_store_that_waited_longest_and_wakes_no_other() {
    let Queued {
        pool,
        key,
        mut guard,
        waiters,
        ..
    } = queued(3).await;
    let mut before = queue(&pool, &key).await;
    for next in waiters {
        let fence = guard.fence();
        guard.release().await;
        guard = grant("the hand-over to the store that waited longest", next).await;
        assert!(guard.fence() > fence);
        let row: i64 = sqlx::query_scalar("SELECT fence FROM baton_lease WHERE key = $1")
            .bind(key.as_str())
            .fetch_one(&pool)
            .await
            .unwrap();
        assert_eq!(row as u64, guard.fence().get());
        // The others kept their places, untouched: not woken, they claimed nothing.
        before.remove(0);
        assert_eq!(queue(&pool, &key).await, before);
    }
    guard.release().await;
}

/// The WAL insert position only.
async fn wal_written(conn: &mut PgConnection) -> i64 {
    wal(conn).await.0
}

/// A claim that finds the key held takes no lock on the key's row (it answers while an
/// operator's transaction holds one) and writes no table WAL: without a waiting holder it
/// writes nothing at all; with one, it queues the store in the unlogged `baton_wait`, whose
/// transaction logs only its commit record and does not wait for a flush.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_that_finds_the_key_held_locks_no_row_and_writes_no_table_wal() {
    let server = lazy_wal_writer().await;
    let mut conn = raw(&server.url()).await;
    let ns = namespace();
    let key = lock_key(&ns, "k");
    let (a, b) = (holder("a"), holder("b"));
    let holding = connect(&server.url()).await;
    let waiting = connect(&server.url()).await;
    granted(&holding, &key, &a, secs(600)).await;
    let held = async || match waiting
        .claim(&key, LeaseRequest::new(&b, ttl(secs(60))))
        .await
        .unwrap()
    {
        Claim::Held { holder, .. } => assert_eq!(holder.as_str(), a.as_str()),
        other => panic!("expected the key held by a, got {other:?}"),
    };

    // Without a waiter: not a byte. (The listeners' heartbeats write WAL every 5 s; one
    // reading free of them is enough.)
    let mut writes = Vec::new();
    for _ in 0..10 {
        quiet(&mut conn).await;
        let before = wal_written(&mut conn).await;
        held().await;
        writes.push(wal_written(&mut conn).await - before);
        if writes.last() == Some(&0) {
            break;
        }
    }
    assert_eq!(
        writes.last(),
        Some(&0),
        "WAL written by each claim: {writes:?}"
    );

    // A waiting holder's claim queues the store: its commit record only, unflushed.
    let _waiting = waiting.wakeups().hub.subscribe_as(&key, &b);
    let nothing = async || {};
    assert_asynchronous("a queueing claim", &mut conn, nothing, held).await;
    let queued: i64 = sqlx::query_scalar("SELECT count(*) FROM baton_wait WHERE key = $1")
        .bind(key.as_str())
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(queued, 1);

    // And neither takes the row's lock: both answer while another transaction holds it.
    let operator = row_locked(&server.url(), &key).await;
    within("a queueing claim while the row is locked", held()).await;
    drop(_waiting);
    within("a claim while the row is locked", held()).await;
    drop(operator);
}

/// The entry of a store that is gone (its LISTEN connection closed, as when its process
/// dies) is passed over and deleted: the release hands the key to the next live store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_passes_over_a_store_that_is_gone() {
    let Queued {
        pool,
        key,
        guard,
        stores,
        mut waiters,
        ..
    } = queued(2).await;
    let gone = queue(&pool, &key).await[0].0;
    // The first store dies: its waiter and store are dropped, its backend ends.
    drop(stores);
    give_up(waiters.remove(0)).await;
    backend_ended(&pool, gone).await;
    assert_eq!(
        queue(&pool, &key).await.len(),
        2,
        "the gone store is still listed"
    );

    guard.release().await;
    let next = grant("the hand-over to the live store", waiters.remove(0)).await;
    assert!(
        queue(&pool, &key).await.is_empty(),
        "the gone store's entry is deleted"
    );
    next.release().await;
}

/// A release looks up the backends of the queue only up to the first live store, however
/// many wait: the entry of a store that is gone behind it is left alone, and deleted once it
/// reaches the head.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_looks_at_the_queue_only_up_to_the_first_live_store() {
    let Queued {
        pool,
        key,
        guard,
        mut stores,
        mut waiters,
        ..
    } = queued(2).await;
    let gone = queue(&pool, &key).await[1].0;
    // The second store dies: its waiter and store are dropped, its backend ends.
    drop(stores.remove(1));
    give_up(waiters.remove(1)).await;
    backend_ended(&pool, gone).await;

    guard.release().await;
    let next = grant("the hand-over to the head", waiters.remove(0)).await;
    let left: Vec<i32> = queue(&pool, &key).await.iter().map(|e| e.0).collect();
    assert_eq!(left, [gone], "the entry behind the head was not looked at");
    next.release().await;
    assert!(
        queue(&pool, &key).await.is_empty(),
        "at the head, the gone store's entry is deleted"
    );
    drop(stores);
}

/// A hand-over to a store whose waiter stopped waiting (its acquire was dropped; the store
/// still listens) is given back at once, and that release hands the key to the next store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_over_to_a_waiter_that_gave_up_goes_to_the_next_store() {
    let Queued {
        pool,
        key,
        holding,
        guard,
        stores,
        mut waiters,
    } = queued(2).await;
    give_up(waiters.remove(0)).await;
    assert!(stores[0].is_listening());

    guard.release().await;
    let next = grant(
        "the hand-over passed on to the next store",
        waiters.remove(0),
    )
    .await;
    let info = holding.inspect("k").await.unwrap().expect("held");
    assert_eq!(info.fence, next.fence());
    assert!(queue(&pool, &key).await.is_empty());
    next.release().await;
}

/// Eight processes, each with its store (and its LISTEN connection), contend for one key:
/// every rule holds on the merged history, every grant's write landed once, and every
/// process was granted.
#[test]
fn contenders_in_eight_processes_keep_every_rule() {
    let dir = tempfile::tempdir().unwrap();
    let url = PostgresServer::shared().url();
    let (history, register) = LockWorkload::run_in_processes(
        "postgres_contender_process",
        8,
        dir.path(),
        &[("STORE_URL", &url)],
    );
    LockWorkload::assert_every_grant_landed(&history, &register, 8 * 15);
    let processes: HashSet<u32> = history.grants().iter().map(|g| g.process).collect();
    assert_eq!(processes.len(), 8, "every process was granted the lock");
}

#[test]
#[ignore = "a child process of contenders_in_eight_processes_keep_every_rule"]
fn postgres_contender_process() {
    LockWorkload::new("history")
        .contenders(1, 0)
        .rounds(15)
        .run_as_child(|| async {
            let url = baton_testkit::process::parent_env("STORE_URL");
            // The default namespace: every process must reach the same key (the other tests
            // on the shared server use namespaces of their own).
            Locks::new(Arc::new(connect(&url).await))
        });
}

/// A role with only the grants `docs/postgres.md` lists (no `CREATE` on the schema), on a
/// database whose objects an earlier connection created, connects, and its stores queue and
/// hand a lock over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_role_with_the_documented_grants_queues_and_hands_over() {
    let server = shared().await;
    // The first connection, as the owner, creates the objects.
    let owner = connect(&server.url()).await;
    drop(owner);
    let role = format!("baton_app_{:08x}", rand::random::<u32>());
    let mut admin = raw(&server.url()).await;
    for statement in [
        format!("CREATE ROLE {role} LOGIN"),
        format!("GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {role}"),
        format!("GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO {role}"),
    ] {
        execute(&mut admin, &statement).await;
    }
    let url = format!(
        "postgres://{role}@127.0.0.1:{}/postgres",
        server.addr().port()
    );
    let ns = namespace();
    let holding = Locks::with_namespace(Arc::new(connect(&url).await), ns.clone());
    let waiting = Locks::with_namespace(Arc::new(connect(&url).await), ns.clone());
    let handoff = hold_while_waiting(&holding, waiting, secs(30), secs(300)).await;
    let key = lock_key(&ns, "k");
    let pool = sqlx::PgPool::connect(&server.url()).await.unwrap();
    eventually("the waiter's store in the queue", || {
        let (pool, key) = (pool.clone(), key.clone());
        async move { (queue(&pool, &key).await.len() == 1).then_some(()) }
    })
    .await;
    let first = handoff.guard.fence();
    let next = handoff
        .release_to_waiter("the hand-over between the role's stores")
        .await;
    assert!(next.fence() > first);
    next.release().await;
}
