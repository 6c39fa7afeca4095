//! The PostgreSQL store's own behavior beyond the conformance suite: the schema (created
//! once by replicas starting together, refused when it is from a newer baton or not
//! baton's), URLs through the facade, a server that is down, `listen=off`, and the
//! stream-lock recipe over `Leases`.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use baton_core::store::{Claim, LeaseRequest, LeaseStore};
use baton_core::{
    ClaimResult, ErrorKind, Holder, LeaseOptions, Leases, LockOptions, Locks, RemoveResult, Ttl,
};
use baton_postgres::{PostgresOptions, PostgresStore, sql};

use common::*;

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// A database of this test's own on the shared server.
async fn database(name: &str) -> String {
    let server = shared().await;
    let name = format!("{name}_{:08x}", rand_suffix());
    let name2 = name.clone();
    blocking(move || server.create_database(&name2))
        .await
        .unwrap_or_else(|e| panic!("create database {name}: {e}"))
}

fn rand_suffix() -> u32 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos()
        ^ std::process::id()
}

/// Eight replicas connect to a new database at the same moment: one creates the schema,
/// the others wait for it under the migration lock and find it done; all of them work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_starting_together_create_the_schema_once() {
    let url = database("together").await;
    let connecting: Vec<_> = (0..8)
        .map(|_| {
            let url = url.clone();
            tokio::spawn(async move { PostgresStore::connect(&with_timeouts(&url)).await })
        })
        .collect();
    let mut stores = Vec::new();
    for task in connecting {
        stores.push(
            within("connect", task)
                .await
                .unwrap()
                .expect("every replica connects"),
        );
    }
    let mut conn = raw(&url).await;
    let version: i32 = sqlx::query_scalar("SELECT version FROM baton_schema")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(version, sql::SCHEMA_VERSION);
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM baton_schema")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(rows, 1);
    let key = lock_key(&namespace(), "k");
    let holder = Holder::random();
    assert!(matches!(
        stores[7]
            .claim(&key, LeaseRequest::new(&holder, Ttl::new(secs(5)).unwrap()))
            .await
            .unwrap(),
        Claim::Granted { .. }
    ));
    // Connecting again is idempotent.
    connect(&url).await;
}

/// A schema from a newer baton, or a `baton_lease` table that no baton created, is refused
/// with `Internal` and left as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_and_future_schemas_are_refused_and_left_alone() {
    let url = database("future").await;
    connect(&url).await;
    let mut conn = raw(&url).await;
    execute(&mut conn, "UPDATE baton_schema SET version = 99").await;
    let err = refused(&url, "a schema from the future").await;
    assert_eq!(err.kind(), ErrorKind::Internal, "{err}");
    assert!(err.message().contains("version 99"), "{err}");
    assert!(err.message().contains("upgrade baton"), "{err}");
    let version: i32 = sqlx::query_scalar("SELECT version FROM baton_schema")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(version, 99, "left untouched");

    let url = database("foreign").await;
    let mut conn = raw(&url).await;
    execute(&mut conn, "CREATE TABLE baton_lease (id int)").await;
    let err = refused(&url, "a table baton did not create").await;
    assert_eq!(err.kind(), ErrorKind::Internal, "{err}");
    assert!(err.message().contains("not created by baton"), "{err}");
}

/// `?options=-csearch_path=...` keeps baton's tables in a schema of their own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_search_path_chooses_the_schema() {
    let url = database("schemas").await;
    let mut conn = raw(&url).await;
    execute(&mut conn, "CREATE SCHEMA coordination").await;
    let store = connect(&format!("{url}?options=-csearch_path%3Dcoordination")).await;
    let leases = Leases::new(Arc::new(store));
    leases
        .claim("k", "a", &LeaseOptions::new(secs(5)))
        .await
        .unwrap();
    let found: String = sqlx::query_scalar(
        "SELECT table_schema::text FROM information_schema.tables WHERE table_name = 'baton_lease'",
    )
    .fetch_one(&mut conn)
    .await
    .unwrap();
    assert_eq!(found, "coordination");
}

/// `postgres://` and `postgresql://` URLs open through the facade.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_facade_opens_postgres_urls() {
    let url = shared().await.url();
    for url in [url.clone(), url.replacen("postgres://", "postgresql://", 1)] {
        let baton = baton::connect(&with_timeouts(&url)).await.unwrap();
        assert_eq!(baton.store().name(), "PostgreSQL");
        let guard = baton
            .locks()
            .acquire(
                &format!("facade-{}", rand_suffix()),
                &LockOptions::new(secs(5)),
            )
            .await
            .unwrap();
        guard.release().await;
    }
    let err = baton::connect("postgres://h/d?nonsense=1")
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
}

/// A server that is not there: connecting fails with `Unavailable` within the configured
/// timeouts, and says where it tried.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_is_down_is_unavailable() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!(
        "postgres://postgres@127.0.0.1:{port}/postgres?connect_timeout=1s&response_timeout=1s"
    );
    let started = Instant::now();
    let err = PostgresStore::connect(&url).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(err.message().contains(&port.to_string()), "{err}");
    assert!(err.is_retryable());
    assert!(
        started.elapsed() < secs(30),
        "connecting gave up after {:?}",
        started.elapsed()
    );
    let err = PostgresStore::open(&url, PostgresOptions::new())
        .await
        .unwrap_err();
    assert!(
        err.is_invalid_input(),
        "options in the URL and as PostgresOptions: {err}"
    );
}

/// With `listen=off` there is no LISTEN connection; a waiter in another process is woken by
/// polling at `poll_interval`, long before the holder's TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_listen_waiters_poll() {
    let url = shared().await.url();
    let quiet = connect(&format!("{url}?listen=off&poll_interval=50ms")).await;
    assert!(!quiet.is_listening());
    assert_eq!(
        quiet.wakeups().poll,
        Some(Duration::from_millis(50)),
        "waiters poll"
    );
    let loud = connect(&url).await;
    assert!(loud.is_listening());
    assert_eq!(loud.wakeups().poll, None, "every release is pushed");

    let ns = namespace();
    let holder = Locks::with_namespace(Arc::new(loud), ns.clone());
    let waiter = Locks::with_namespace(Arc::new(quiet), ns.clone());
    let handoff = hold_while_waiting(&holder, waiter, secs(5), secs(60)).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    handoff
        .hand_over("polling finding the release long before the 10 minute TTL")
        .await;
}

/// The stream-lock recipe over `Leases`: a lease per (stream, perspective) keyed by
/// `stream_key`, claimed by an instance id with a reason, kept alive with a validated
/// interval, skipped by another instance while held, and released in the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_locks_as_leases_skip_when_held_and_keep_alive() {
    let store = Arc::new(connect(&shared().await.url()).await);
    let leases = Leases::with_namespace(store, namespace());
    let key = baton_core::stream_key("order-42", "OrderPerspective").unwrap();
    let (ttl, interval) = (secs(3), Duration::from_millis(500));

    let ClaimResult::Claimed { fence, .. } = leases
        .claim(&key, "instance-a", &LeaseOptions::new(ttl).reason("rewind"))
        .await
        .unwrap()
    else {
        panic!("a free stream lock is claimed")
    };
    // Keep-alive options are validated: interval < ttl / 2.
    let bad = leases
        .keep_alive(
            &key,
            "instance-a",
            &LeaseOptions::new(ttl).keep_alive(Duration::from_millis(1500)),
        )
        .await
        .unwrap_err();
    assert!(bad.is_invalid_input(), "{bad}");
    let keep = leases
        .keep_alive(
            &key,
            "instance-a",
            &LeaseOptions::new(ttl).keep_alive(interval),
        )
        .await
        .unwrap()
        .expect("the lease is held");
    assert_eq!(keep.fence(), fence);
    // Longer than the TTL: the keep-alive holds the lock, another instance skips it.
    tokio::time::sleep(secs(4)).await;
    assert!(!keep.is_lost());
    match leases
        .claim(
            &key,
            "instance-b",
            &LeaseOptions::new(ttl).reason("bootstrap"),
        )
        .await
        .unwrap()
    {
        ClaimResult::HeldBy { holder, .. } => assert_eq!(holder, "instance-a"),
        other => panic!("instance-b must skip the stream: {other:?}"),
    }
    let info = leases.inspect(&key).await.unwrap().unwrap();
    assert_eq!(
        (info.holder.as_str(), info.reason.as_str()),
        ("instance-a", "rewind")
    );
    // Re-claiming by the same instance is idempotent and keeps the fence.
    let ClaimResult::Claimed { fence: again, .. } = leases
        .claim(&key, "instance-a", &LeaseOptions::new(ttl).reason("rewind"))
        .await
        .unwrap()
    else {
        panic!("re-claim by the holder")
    };
    assert_eq!(again, fence);
    drop(keep);
    assert_eq!(
        leases.release(&key, "instance-a").await.unwrap(),
        RemoveResult::Removed {
            holder: "instance-a".into()
        }
    );
    // The next cycle, instance-b gets it, with a larger fence.
    let ClaimResult::Claimed { fence: next, .. } = leases
        .claim(
            &key,
            "instance-b",
            &LeaseOptions::new(ttl).reason("bootstrap"),
        )
        .await
        .unwrap()
    else {
        panic!("the released stream lock is claimed")
    };
    assert!(next > fence);
}

/// A claim of a held key, and a renewal or release by someone who is not the holder,
/// neither lock nor write anything: no transaction id is assigned, so nothing is committed
/// to the WAL. Many waiters woken at once cost reads, not commits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn atoms_that_change_nothing_write_nothing() {
    let url = shared().await.url();
    let store = connect(&url).await;
    let key = lock_key(&namespace(), "quiet");
    let owner = Holder::random();
    assert!(matches!(
        store
            .claim(&key, LeaseRequest::new(&owner, Ttl::new(secs(60)).unwrap()))
            .await
            .unwrap(),
        Claim::Granted { .. }
    ));
    let mut conn = raw(&url).await;
    let mut tx = sqlx::Connection::begin(&mut conn).await.unwrap();
    let held = sqlx::query(sql::CLAIM)
        .bind(key.as_str())
        .bind("someone-else")
        .bind(5_000_i64)
        .bind("")
        .bind(None::<i32>)
        .bind(false)
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    assert!(!sqlx::Row::get::<bool, _>(&held, "claimed"));
    let renewed = sqlx::query(sql::RENEW)
        .bind(key.as_str())
        .bind("someone-else")
        .bind(5_000_i64)
        .execute(&mut *tx)
        .await
        .unwrap();
    assert_eq!(renewed.rows_affected(), 0);
    sqlx::query(sql::RELEASE)
        .bind(key.as_str())
        .bind("someone-else")
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    let xid: Option<i64> = sqlx::query_scalar("SELECT txid_current_if_assigned()")
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    assert_eq!(
        xid, None,
        "a statement that changed nothing wrote something"
    );
    tx.rollback().await.unwrap();
}

/// `sslmode=require` against a server that offers no TLS fails with `Unavailable` instead of
/// connecting in clear text; `sslmode=prefer` (the default) falls back to it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_is_required_when_the_url_says_so() {
    let url = shared().await.url();
    let err = PostgresStore::connect(&with_timeouts(&format!("{url}?sslmode=require")))
        .await
        .expect_err("the test server has no TLS");
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    connect(&format!("{url}?sslmode=prefer")).await;
}

/// With `listen=on-demand` a store opens no LISTEN connection until it first waits; the
/// first wait starts it, and the waiter is woken by a release from another store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listen_on_demand_opens_the_connection_at_the_first_wait() {
    let server = shared().await;
    let url = server.url();
    let lazy = Arc::new(connect(&format!("{url}?listen=on-demand")).await);
    assert!(!lazy.is_listening(), "nothing listens before a wait");
    let loud = connect(&url).await;
    let ns = namespace();
    let holder = Locks::with_namespace(Arc::new(loud), ns.clone());
    let waiter = Locks::with_namespace(lazy.clone(), ns.clone());
    let handoff = hold_while_waiting(&holder, waiter, secs(5), secs(60)).await;
    eventually("the first wait to start LISTEN", || async {
        lazy.is_listening().then_some(())
    })
    .await;
    handoff.hand_over("the waiter woken by the release").await;
}

async fn lease_rows(conn: &mut sqlx::PgConnection) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM baton_lease")
        .fetch_one(conn)
        .await
        .unwrap()
}

async fn granted(store: &PostgresStore, key: &baton_core::StoreKey, t: Duration) -> u64 {
    match store
        .claim(
            key,
            LeaseRequest::new(&Holder::random(), Ttl::new(t).unwrap()),
        )
        .await
        .unwrap()
    {
        Claim::Granted { fence } => fence.get(),
        other => panic!("expected a grant, got {other:?}"),
    }
}

/// Per-tick keys (`report:<tick>`) do not pile up rows: claims sweep, in the background and a
/// bounded number at a time, the rows of keys free for an hour, and a swept key claimed
/// again draws a larger fence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_sweep_old_expired_rows_and_fences_survive() {
    let url = database("sweep").await;
    let store = connect(&url).await;
    let ns = namespace();
    let key = |name: &str| lock_key(&ns, name);
    granted(&store, &key("live"), secs(600)).await;
    let first_tick = granted(&store, &key("tick:0"), Duration::from_millis(10)).await;
    for tick in 1..20 {
        granted(
            &store,
            &key(&format!("tick:{tick}")),
            Duration::from_millis(10),
        )
        .await;
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    let mut conn = raw(&url).await;
    assert_eq!(
        lease_rows(&mut conn).await,
        21,
        "expired rows younger than an hour stay"
    );
    // The ticks ended more than an hour ago, as the sweep's margin requires.
    let age = "UPDATE baton_lease SET updated_at = updated_at - interval '2 hours' \
               WHERE expires_at <= clock_timestamp()";
    execute(&mut conn, age).await;

    // Within SWEEP_EVERY claims one sweeps; the sweep runs in the background.
    for n in 0..sql::SWEEP_EVERY {
        granted(&store, &key(&format!("new:{n}")), secs(600)).await;
    }
    let deadline = Instant::now() + secs(30);
    while lease_rows(&mut conn).await > 1 + sql::SWEEP_EVERY as i64 {
        assert!(Instant::now() < deadline, "the expired rows were not swept");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let live: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM baton_lease WHERE key = $1 AND holder IS NOT NULL",
    )
    .bind(key("live").as_str())
    .fetch_one(&mut conn)
    .await
    .unwrap();
    assert_eq!(live, 1, "a live grant is never swept");
    let again = granted(&store, &key("tick:0"), secs(600)).await;
    assert!(
        again > first_tick,
        "fence {again} after a swept {first_tick}"
    );
}
