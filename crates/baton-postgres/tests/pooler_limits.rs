//! What a transaction pooler changes beyond the conformance rules, and the bound on every
//! call: wake-ups through a direct `listen_url` (and the polling fallback, said once),
//! broadcast past the pooler, the store through PgBouncer in session mode (LISTEN included),
//! and connects and calls that end within `connect_timeout +
//! response_timeout` when another session holds the schema migration lock, when a pool of
//! one is exhausted (the pooler's or the store's own), and when the server refuses for lack
//! of connection slots, each with an `Unavailable` error that names the cause.
//!
//! The bounds are asserted with a margin of seconds for a loaded machine: what is tested is
//! that a call ends, not how fast.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use baton_core::telemetry::events;
use baton_core::{ErrorKind, Key, LockOptions, Locks, Namespace};
use baton_postgres::PostgresStore;
use baton_testkit::pgbouncer::{PgBouncer, PgBouncerOptions, PoolMode};
use baton_testkit::postgres::{PostgresOptions, PostgresServer};
use sqlx::Connection;

use baton_core::store::LeaseRequest;
use common::*;

/// `connect_timeout + response_timeout` of the stores opened here.
const DEADLINE: Duration = Duration::from_secs(2);
/// What a loaded machine may add to it.
const SLACK: Duration = Duration::from_secs(3);

fn short(url: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}connect_timeout=1s&response_timeout=1s")
}

/// Opens `url`, failing the test if that takes longer than the bound allows; returns the
/// answer and how long it took.
async fn timed_connect(url: &str) -> (baton_core::Result<PostgresStore>, Duration) {
    let started = Instant::now();
    let answer = tokio::time::timeout(DEADLINE + SLACK + SLACK, PostgresStore::connect(url))
        .await
        .unwrap_or_else(|_| panic!("connect to {url} did not end within {:?}", DEADLINE + SLACK));
    (answer, started.elapsed())
}

/// A waiter on `waiter`'s store is woken by the release of a lock held through `holder`'s
/// store: by NOTIFY, well before its ten-second poll.
async fn assert_release_wakes_the_waiter(
    holder: Arc<PostgresStore>,
    waiter: Arc<PostgresStore>,
    ns: &Namespace,
) {
    let started = Instant::now();
    let handoff = hold_while_waiting(
        &Locks::with_namespace(holder, ns.clone()),
        Locks::with_namespace(waiter, ns.clone()),
        Duration::from_secs(5),
        Duration::from_secs(60),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    handoff.hand_over("the waiter woken by the release").await;
    assert!(
        started.elapsed() < Duration::from_secs(9),
        "the waiter was woken by NOTIFY, not by its 10 s poll"
    );
}

fn percent_encoded(url: &str) -> String {
    url::form_urlencoded::byte_serialize(url.as_bytes()).collect()
}

/// Through the transaction pooler with `listen_url` straight to the server, a waiter in
/// another store wakes at the release (not by polling: the poll interval is ten minutes
/// away), and broadcasts arrive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listen_url_gives_push_wake_ups_and_broadcast_behind_the_pooler() {
    let direct = shared().await.url();
    let pooled = format!(
        "{}&listen_url={}&poll_interval=10s",
        pooled_url().await,
        percent_encoded(&direct)
    );
    let holder = Arc::new(PostgresStore::connect(&pooled).await.unwrap());
    let waiter = Arc::new(PostgresStore::connect(&pooled).await.unwrap());
    assert!(waiter.is_listening(), "LISTEN goes to listen_url");
    assert_eq!(baton_core::store::LeaseStore::wakeups(&*waiter).poll, None);

    let ns = namespace();
    assert_release_wakes_the_waiter(holder.clone(), waiter.clone(), &ns).await;

    let channel = ns.qualify(baton_core::KeyKind::Broadcast, &Key::new("news").unwrap());
    let mut subscription = baton_core::BroadcastStore::subscribe(&*waiter, &channel, 16)
        .await
        .expect("subscribing through listen_url");
    baton_core::BroadcastStore::publish(&*holder, &channel, b"hello".to_vec())
        .await
        .expect("NOTIFY through the pooler");
    let got = within("the broadcast", subscription.recv()).await;
    assert!(
        matches!(got, Some(baton_core::broadcast::RawEvent::Message(ref m)) if m == b"hello"),
        "the message arrived: {got:?}"
    );
}

/// Behind the transaction pooler (statements through PgBouncer, LISTEN straight to the
/// server), a waiting store queues by its LISTEN backend and the release hands the key to it:
/// the queue entry is there while it waits and gone once it holds the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_the_pooler_a_release_hands_the_key_to_the_queued_store() {
    let direct = shared().await.url();
    let pooled = format!(
        "{}&listen_url={}&poll_interval=10s",
        pooled_url().await,
        percent_encoded(&direct)
    );
    let ns = namespace();
    let key = lock_key(&ns, "k");
    let holding = Locks::with_namespace(
        Arc::new(PostgresStore::connect(&pooled).await.unwrap()),
        ns.clone(),
    );
    let waiting = Locks::with_namespace(
        Arc::new(PostgresStore::connect(&pooled).await.unwrap()),
        ns.clone(),
    );
    let handoff = hold_while_waiting(
        &holding,
        waiting,
        Duration::from_secs(30),
        Duration::from_secs(300),
    )
    .await;
    let pool = sqlx::PgPool::connect(&direct).await.unwrap();
    let queued = || {
        let (pool, key) = (pool.clone(), key.clone());
        async move {
            sqlx::query_scalar::<_, i64>("SELECT count(*) FROM baton_wait WHERE key = $1")
                .bind(key.as_str())
                .fetch_one(&pool)
                .await
                .unwrap()
        }
    };
    eventually("the waiting store in the queue", || {
        let queued = queued();
        async move { (queued.await == 1).then_some(()) }
    })
    .await;
    let first = handoff.guard.fence();
    let next = handoff
        .release_to_waiter("the hand-over behind the pooler")
        .await;
    assert!(next.fence() > first);
    assert_eq!(queued().await, 0);
    next.release().await;
}

/// Without `listen_url`, the store polls and says so once, at connect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_listen_url_the_store_polls_and_says_so_once() {
    capture_events();
    let port = format!(":{}/", transaction_pooler().await.port());
    let store = PostgresStore::connect(&format!("{}&poll_interval=50ms", pooled_url().await))
        .await
        .unwrap();
    assert!(!store.is_listening());
    assert_eq!(
        baton_core::store::LeaseStore::wakeups(&store).poll,
        Some(Duration::from_millis(50))
    );
    let said = events(&events::POSTGRES_LISTEN_UNAVAILABLE, |e| {
        e.message.contains(&port)
    });
    assert_eq!(said.len(), 1, "once per store: {said:?}");
    assert!(
        said[0].message.contains("listen_url"),
        "{}",
        said[0].message
    );
    let quiet = PostgresStore::connect(&format!("{}&listen=off", pooled_url().await))
        .await
        .unwrap();
    drop(quiet);
    let said = events(&events::POSTGRES_LISTEN_UNAVAILABLE, |e| {
        e.message.contains(&port)
    });
    assert_eq!(said.len(), 1, "listen=off says polling is meant: {said:?}");
    let channel = namespace().qualify(baton_core::KeyKind::Broadcast, &Key::new("n").unwrap());
    let refused = baton_core::BroadcastStore::subscribe(&store, &channel, 1)
        .await
        .expect_err("no LISTEN, no subscription");
    assert_eq!(refused.kind(), ErrorKind::Unsupported, "{refused}");
    assert!(refused.message().contains("listen_url"), "{refused}");
}

/// Another session holds the schema migration lock while a store connects to a database
/// whose schema needs a step (here: the idempotency table is missing, as after an upgrade
/// from a baton without it). Connect ends within the bound, naming the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_ends_in_time_while_another_session_holds_the_schema_lock() {
    let server = shared().await;
    let db = blocking(|| PostgresServer::shared().create_database("held_lock"))
        .await
        .unwrap();
    let _ = db;
    let direct = server.url_for("held_lock");
    drop(connect(&direct).await);
    let mut operator = raw(&direct).await;
    execute(&mut operator, "DROP TABLE baton_idempotency").await;
    sqlx::query("SELECT pg_advisory_lock($1)")
        .bind(baton_postgres::sql::MIGRATION_LOCK)
        .execute(&mut operator)
        .await
        .unwrap();

    let through_pooler = short(&format!(
        "{}?pooler=transaction",
        transaction_pooler().await.url_for("held_lock")
    ));
    for url in [short(&direct), through_pooler] {
        let (answer, took) = timed_connect(&url).await;
        let e = answer.expect_err("the lock is held");
        assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
        assert!(
            e.message()
                .contains("schema migration lock held by another session"),
            "{e}"
        );
        assert!(took <= DEADLINE + SLACK, "{url}: took {took:?}");
    }
    execute(&mut operator, "SELECT pg_advisory_unlock_all()").await;
    drop(connect(&direct).await);
}

/// A pooler whose one server connection another client holds (an open transaction): the
/// store's connect ends within the bound with `Unavailable`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_and_calls_end_in_time_when_the_poolers_pool_of_one_is_taken() {
    let server = shared().await;
    drop(connect(&server.url()).await);
    let pooler = blocking(|| {
        PgBouncer::start_with(
            PostgresServer::shared(),
            PgBouncerOptions::new(PoolMode::Transaction).pool_size(1),
        )
        .expect("a private PgBouncer")
    })
    .await;
    let url = short(&format!("{}?pooler=transaction", pooler.url()));
    let store = PostgresStore::connect(&url).await.expect("a free pooler");
    let locks = Locks::with_namespace(Arc::new(store), namespace());

    let hog_options: sqlx::postgres::PgConnectOptions = pooler.url().parse().unwrap();
    let mut hog = sqlx::PgConnection::connect_with(&hog_options.extra_float_digits(None))
        .await
        .unwrap();
    execute(&mut hog, "BEGIN").await;
    execute(&mut hog, "SELECT 1").await;

    let (answer, took) = timed_connect(&url).await;
    let e = answer.expect_err("no server connection to be had");
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    assert!(took <= DEADLINE + SLACK, "connect took {took:?}");

    let started = Instant::now();
    let listed = tokio::time::timeout(DEADLINE + SLACK + SLACK, locks.list("", 10))
        .await
        .expect("lock list ends");
    assert!(listed.is_err(), "nothing can answer: {listed:?}");
    assert!(started.elapsed() <= DEADLINE + SLACK);
    execute(&mut hog, "COMMIT").await;
    eventually("the store to recover", || async {
        locks.list("", 10).await.ok()
    })
    .await;
}

/// The store's own pool of one is busy with a call that waits for a row lock: the next call
/// ends within the bound, saying the pool is exhausted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_ends_in_time_when_the_stores_pool_of_one_is_exhausted() {
    let direct = shared().await.url();
    let url = short(&format!("{direct}?max_connections=1&listen=off"));
    let store = Arc::new(PostgresStore::connect(&url).await.unwrap());
    let ns = namespace();
    let key = lock_key(&ns, "k");
    let holder = baton_core::Holder::from_stored("the-holder".to_owned());
    let ttl = baton_core::Ttl::new(Duration::from_secs(600)).unwrap();
    baton_core::store::LeaseStore::claim(&*store, &key, LeaseRequest::new(&holder, ttl))
        .await
        .unwrap();
    let mut operator = row_locked(&direct, &key).await;
    // Takes the one connection: the renewal's UPDATE waits for the row lock until its
    // deadline.
    let busy = tokio::spawn({
        let store = store.clone();
        let key = key.clone();
        async move { baton_core::store::LeaseStore::renew(&*store, &key, &holder, ttl).await }
    });
    let blocked = tokio::spawn({
        let locks = Locks::with_namespace(store.clone(), ns.clone());
        async move {
            tokio::time::sleep(Duration::from_millis(200)).await;
            locks
                .try_acquire("k", &LockOptions::new(Duration::from_secs(5)))
                .await
        }
    });
    let started = Instant::now();
    let answer = within("the blocked call", blocked).await.unwrap();
    let busy = within("the busy call", busy).await.unwrap();
    let e = answer
        .err()
        .unwrap_or_else(|| panic!("no connection to be had; the busy call answered {busy:?}"));
    assert!(e.to_string().contains("connection pool exhausted"), "{e}");
    assert!(started.elapsed() <= DEADLINE + SLACK);
    execute(&mut operator, "ROLLBACK").await;
}

/// A server whose every connection slot is taken: connect ends within the bound, saying the
/// server refused for lack of connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_server_is_named_as_such() {
    let server = blocking(|| {
        PostgresServer::start_with(
            PostgresOptions::new()
                .setting("max_connections", "3")
                .setting("superuser_reserved_connections", "0"),
        )
        .expect("a private PostgreSQL server")
    })
    .await;
    let mut taken = Vec::new();
    while let Ok(conn) = sqlx::PgConnection::connect(&server.url()).await {
        taken.push(conn);
        assert!(taken.len() <= 3, "max_connections is 3");
    }
    let (answer, took) = timed_connect(&short(&server.url())).await;
    let e = answer.expect_err("no slot left");
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    assert!(
        e.message().contains("server refused: too many connections"),
        "{e}"
    );
    assert!(took <= DEADLINE + SLACK, "took {took:?}");
}

/// Through PgBouncer in session mode the store works as on a direct connection, LISTEN
/// included: a waiter in another store is woken by the release through the pooler.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_pooling_works_as_a_direct_connection() {
    let pooler = blocking(|| PgBouncer::shared(PoolMode::Session)).await;
    let url = with_timeouts(&format!(
        "{}?pooler=session&poll_interval=10s",
        pooler.url()
    ));
    let holder = Arc::new(PostgresStore::connect(&url).await.unwrap());
    let waiter = Arc::new(PostgresStore::connect(&url).await.unwrap());
    assert!(
        waiter.is_listening(),
        "LISTEN works through a session pooler"
    );
    assert_release_wakes_the_waiter(holder, waiter, &namespace()).await;
}
