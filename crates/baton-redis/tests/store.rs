//! The Redis store's own behaviour, against private redis-server processes: URLs and
//! credentials, timeouts, the key layout, fences across data loss, `SCRIPT FLUSH`, the
//! eviction-policy check, pub/sub loss, the facade, and a recorded history of eight OS
//! processes contending for one key.

mod common;

use std::net::TcpListener;
use std::time::Duration;

use baton_core::store::{Claim, LeaseRequest, LeaseStore, Release, Renewal};
use baton_core::telemetry::events;
use baton_core::{ErrorKind, Holder, Key, KeyKind, LockOptions, Locks, Namespace, StoreKey, Ttl};
use baton_redis::{RedisOptions, RedisStore};
use baton_testkit::redis::RedisOptions as ServerOptions;
use tokio::time::{Instant, sleep, timeout};

fn key(user: &str) -> StoreKey {
    Namespace::new("t")
        .unwrap()
        .qualify(KeyKind::Lock, &Key::new(user).unwrap())
}

fn ttl(d: Duration) -> Ttl {
    Ttl::new(d).unwrap()
}

const TEN_S: Duration = Duration::from_secs(10);

async fn granted(store: &RedisStore, key: &StoreKey, holder: &Holder) -> u64 {
    match store
        .claim(key, LeaseRequest::new(holder, ttl(TEN_S)))
        .await
        .unwrap()
    {
        Claim::Granted { fence } => fence.get(),
        other => panic!("expected a grant of {key}, got {other:?}"),
    }
}

/// Key `name`, granted to a new holder.
async fn grant_to_someone(store: &RedisStore, name: &str) -> (StoreKey, Holder) {
    let (k, a) = (key(name), Holder::random());
    granted(store, &k, &a).await;
    (k, a)
}

async fn connect(url: &str) -> RedisStore {
    RedisStore::connect(url)
        .await
        .unwrap_or_else(|e| panic!("connect to {url}: {e}"))
}

/// A port nobody listens on.
fn closed_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[tokio::test]
async fn bad_urls_are_invalid_input_before_any_io() {
    for (url, needle) in [
        ("redis://127.0.0.1:1/abc", "is not a number"),
        ("redis://127.0.0.1:1/-2", "is not a number"),
        (
            "redis://127.0.0.1:1/0?db=2",
            "unknown redis:// option \"db\"",
        ),
        (
            "redis://127.0.0.1:1/0?connect_timeout=fast",
            "connect_timeout",
        ),
        ("redis://u:hunter2@127.0.0.1:1/x", "is not a number"),
        ("redis://", "has no host"),
    ] {
        // Port 1 refuses connections: an I/O attempt would give Unavailable, not InvalidInput.
        let err = RedisStore::connect(url).await.expect_err(url);
        assert_eq!(err.kind(), ErrorKind::InvalidInput, "{url}: {err}");
        assert!(err.message().contains(needle), "{url}: {err}");
        assert!(
            !err.to_string().contains("hunter2"),
            "password shown: {err}"
        );
    }
    let both = RedisStore::open(
        "redis://127.0.0.1:1/0?connect_timeout=1s",
        RedisOptions::new(),
    )
    .await
    .unwrap_err();
    assert!(both.is_invalid_input(), "{both}");
    let bad = RedisStore::open(
        "redis://127.0.0.1:1/0",
        RedisOptions::new().response_timeout(Duration::ZERO),
    )
    .await
    .unwrap_err();
    assert!(bad.message().contains("response_timeout 0ms"), "{bad}");
}

/// `err` is `Unavailable`, and came within two seconds of `started`.
fn assert_unavailable_soon(err: &baton_core::Error, started: Instant) {
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn nothing_listening_is_unavailable_at_once() {
    let url = format!(
        "redis://127.0.0.1:{}/0?connect_timeout=500ms",
        closed_port()
    );
    let started = Instant::now();
    let err = RedisStore::connect(&url).await.unwrap_err();
    assert!(err.message().contains("connection refused"), "{err}");
    assert!(
        std::error::Error::source(&err).is_some(),
        "the redis error is the source"
    );
    assert_unavailable_soon(&err, started);
}

#[tokio::test]
async fn a_silent_server_is_unavailable_within_the_connect_timeout() {
    // Accepts TCP connections (the kernel completes the handshake) and never answers.
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!(
        "redis://{}/0?connect_timeout=300ms&response_timeout=300ms",
        silent.local_addr().unwrap()
    );
    let started = Instant::now();
    let err = timeout(Duration::from_secs(5), RedisStore::connect(&url))
        .await
        .expect("connect must not hang")
        .unwrap_err();
    assert_unavailable_soon(&err, started);
}

#[tokio::test]
async fn a_paused_server_times_out_and_the_store_recovers() {
    let server = common::server().await;
    let store = connect(&format!(
        "{}?connect_timeout=300ms&response_timeout=300ms",
        server.url()
    ))
    .await;
    let (k, a) = grant_to_someone(&store, "paused").await;
    server.pause().unwrap();
    let started = Instant::now();
    let err = store.renew(&k, &a, ttl(TEN_S)).await.unwrap_err();
    server.resume().unwrap();
    assert_unavailable_soon(&err, started);
    assert_eq!(
        store.renew(&k, &a, ttl(TEN_S)).await.unwrap(),
        Renewal::Renewed
    );
}

/// The answer to `command key`, asked through `raw` (as an operator's `redis-cli` would).
async fn ask<T: redis::FromRedisValue>(
    raw: &mut redis::aio::MultiplexedConnection,
    command: &str,
    key: &str,
) -> T {
    redis::cmd(command).arg(key).query_async(raw).await.unwrap()
}

#[tokio::test]
async fn user_password_and_database_from_the_url() {
    let server = common::server().await;
    server
        .command_ok(&[
            "ACL", "SETUSER", "app", "on", ">s3cret", "~*", "&*", "+@all",
        ])
        .unwrap();
    let url = format!("redis://app:s3cret@{}/3?response_timeout=1s", server.addr());
    let store = RedisStore::connect(&url).await.unwrap();
    grant_to_someone(&store, "job").await;
    let mut db3 = common::raw(&format!("redis://app:s3cret@{}/3", server.addr())).await;
    let in_db3: i64 = ask(&mut db3, "EXISTS", "{t:lock:job}").await;
    assert_eq!(in_db3, 1, "the grant lives in database 3");
    let mut db0 = common::raw(&server.url()).await;
    let in_db0: i64 = ask(&mut db0, "EXISTS", "{t:lock:job}").await;
    assert_eq!(in_db0, 0);
    assert!(format!("{store:?}").contains("app:***@"), "{store:?}");
    assert!(!format!("{store:?}").contains("s3cret"), "{store:?}");

    let wrong = format!("redis://app:wrong-pw@{}/0", server.addr());
    let err = RedisStore::connect(&wrong).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(err.message().contains("credentials"), "{err}");
    assert!(!err.message().contains("wrong-pw"), "password shown: {err}");
}

#[tokio::test]
async fn keys_share_a_hash_tag_and_the_counter_outlives_the_grant() {
    let server = common::server().await;
    let store = common::store(&server).await;
    let mut raw = common::raw(&server.url()).await;
    let (k, a) = (key("jobs:{nightly}"), Holder::random());
    let fence = granted(&store, &k, &a).await;
    let grant_ttl: i64 = ask(&mut raw, "PTTL", "{t:lock:jobs:{nightly}}").await;
    let counter_ttl: i64 = ask(&mut raw, "PTTL", "{t:lock:jobs:{nightly}}:fence").await;
    assert!(grant_ttl > 9_000 && grant_ttl <= 10_000, "{grant_ttl}");
    let retention = baton_redis::FENCE_RETENTION.as_millis() as i64;
    assert!(counter_ttl > retention, "{counter_ttl}");
    let counter: u64 = ask(&mut raw, "GET", "{t:lock:jobs:{nightly}}:fence").await;
    assert_eq!(counter, fence);
    // That both keys hash to one Redis Cluster slot is checked by the unit tests of the
    // key layout (this server has cluster support disabled, so CLUSTER KEYSLOT is refused).
    // Fences are server microseconds (or above): comparable with the memory store's.
    assert!(fence > 1_600_000_000_000_000, "{fence}");
}

#[tokio::test]
async fn fences_increase_after_the_data_is_lost() {
    let server = common::server().await;
    let store = common::store(&server).await;
    let k = key("k");
    let first = granted(&store, &k, &Holder::random()).await;
    // A restart without persistence, as far as the data goes.
    server.command_ok(&["FLUSHALL"]).unwrap();
    let second = granted(&store, &k, &Holder::random()).await;
    assert!(second > first, "{second} after {first}");

    // And after a real restart: the store reconnects by itself.
    server.kill();
    let down = store
        .claim(&k, LeaseRequest::new(&Holder::random(), ttl(TEN_S)))
        .await;
    assert_eq!(down.unwrap_err().kind(), ErrorKind::Unavailable);
    // Blocks this test's thread for the few milliseconds the server needs to start.
    server.restart().unwrap();
    let third = granted(&store, &k, &Holder::random()).await;
    assert!(third > second, "{third} after {second}");
}

#[tokio::test]
async fn script_flush_between_calls_is_not_mistaken_for_not_holder() {
    let server = common::server().await;
    let store = common::store(&server).await;
    let (k, a, b) = (key("flushed"), Holder::random(), Holder::random());
    let fence = granted(&store, &k, &a).await;
    server.command_ok(&["SCRIPT", "FLUSH"]).unwrap();
    assert_eq!(
        store.renew(&k, &a, ttl(TEN_S)).await.unwrap(),
        Renewal::Renewed
    );
    server.command_ok(&["SCRIPT", "FLUSH"]).unwrap();
    match store
        .claim(&k, LeaseRequest::new(&b, ttl(TEN_S)))
        .await
        .unwrap()
    {
        Claim::Held { holder, .. } => assert_eq!(holder, a),
        other => panic!("{other:?}"),
    }
    server.command_ok(&["SCRIPT", "FLUSH"]).unwrap();
    let info = store.inspect(&k).await.unwrap().unwrap();
    assert_eq!(info.fence.get(), fence);
    server.command_ok(&["SCRIPT", "FLUSH"]).unwrap();
    assert_eq!(store.list("t:lock:", 10).await.unwrap().len(), 1);
    server.command_ok(&["SCRIPT", "FLUSH"]).unwrap();
    assert_eq!(store.release(&k, &a).await.unwrap(), Release::Removed);
    assert!(store.inspect(&k).await.unwrap().is_none());
}

#[tokio::test]
async fn list_takes_braces_and_glob_characters_literally() {
    let server = common::server().await;
    let store = common::store(&server).await;
    let holder = Holder::random();
    for user in ["x*", "x*y", "xy", "a}b", "{c}", "q?", "q[1]", "q\\"] {
        granted(&store, &key(user), &holder).await;
    }
    let users = |prefix: &'static str| {
        let store = &store;
        async move {
            store
                .list(&format!("t:lock:{prefix}"), 100)
                .await
                .unwrap()
                .into_iter()
                .map(|i| i.key.user_key().to_owned())
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(users("x*").await, ["x*", "x*y"]);
    assert_eq!(users("x").await, ["x*", "x*y", "xy"]);
    assert_eq!(users("a}").await, ["a}b"]);
    assert_eq!(users("{").await, ["{c}"]);
    assert_eq!(users("q").await, ["q?", "q[1]", "q\\"]);
    assert_eq!(users("q[").await, ["q[1]"]);
    assert_eq!(users("").await.len(), 8);
    assert_eq!(store.list("t:lock:", 3).await.unwrap().len(), 3);
    assert!(store.list("t:lock:", 0).await.unwrap().is_empty());
    let info = store.inspect(&key("a}b")).await.unwrap().unwrap();
    assert_eq!(info.holder, holder);
}

#[tokio::test]
async fn claim_extends_for_the_same_holder_with_the_same_fence() {
    let server = common::server().await;
    let store = common::store(&server).await;
    let (k, a) = (key("lease"), Holder::new("instance-1").unwrap());
    let fence = match store
        .claim(
            &k,
            LeaseRequest::new(&a, ttl(Duration::from_millis(500))).reason("rewind"),
        )
        .await
        .unwrap()
    {
        Claim::Granted { fence } => fence,
        other => panic!("{other:?}"),
    };
    match store
        .claim(&k, LeaseRequest::new(&a, ttl(TEN_S)).reason("purge"))
        .await
        .unwrap()
    {
        Claim::Extended { fence: again } => assert_eq!(again, fence),
        other => panic!("{other:?}"),
    }
    let info = store.inspect(&k).await.unwrap().unwrap();
    assert_eq!(info.reason, "purge");
    assert!(
        info.remaining > Duration::from_secs(9),
        "{:?}",
        info.remaining
    );
}

/// A value baton did not write (another program's key, the hash layout of an older build, a
/// counter that is not a number) is an `Internal` error, never read as a holder or a grant.
#[tokio::test]
async fn foreign_values_are_internal_errors_not_answers() {
    let server = common::server().await;
    let store = common::store(&server).await;
    let mut raw = common::raw(&server.url()).await;
    let a = Holder::random();
    for (what, setup) in [
        (
            "a foreign string",
            vec!["SET", "{t:lock:foreign}", "hello:world"],
        ),
        ("a hash", vec!["HSET", "{t:lock:foreign}", "holder", "x"]),
        (
            "a corrupt counter",
            vec!["SET", "{t:lock:foreign}:fence", "x"],
        ),
    ] {
        let _: () = redis::cmd("DEL")
            .arg("{t:lock:foreign}")
            .arg("{t:lock:foreign}:fence")
            .query_async(&mut raw)
            .await
            .unwrap();
        let mut cmd = redis::cmd(setup[0]);
        for arg in &setup[1..] {
            cmd.arg(*arg);
        }
        let _: redis::Value = cmd.query_async(&mut raw).await.unwrap();
        let err = store
            .claim(&key("foreign"), LeaseRequest::new(&a, ttl(TEN_S)))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Internal, "{what}: {err}");
        if what != "a corrupt counter" {
            let err = store.release(&key("foreign"), &a).await.unwrap_err();
            assert_eq!(err.kind(), ErrorKind::Internal, "{what}: {err}");
        }
    }
}

/// With an evicting policy the store warns; with CONFIG disabled it says it cannot tell.
#[tokio::test]
async fn the_eviction_policy_is_checked_at_connect() {
    let events = common::Events::capture();
    let safe = common::server().await;
    let store = common::store(&safe).await;
    assert_eq!(
        store
            .server_info()
            .await
            .unwrap()
            .maxmemory_policy
            .as_deref(),
        Some("noeviction")
    );
    assert_eq!(
        store.server_info().await.unwrap().eviction_safe(),
        Some(true)
    );
    assert!(store.server_info().await.unwrap().version.is_some());
    let at = |server: &baton_testkit::redis::RedisServer| server.addr().to_string();
    assert_eq!(
        events.count(events::REDIS_EVICTION_POLICY_UNSAFE.key, &at(&safe)),
        0
    );
    assert_eq!(
        events.count(events::REDIS_EVICTION_POLICY_UNKNOWN.key, &at(&safe)),
        0
    );

    let lru =
        common::server_with(ServerOptions::new().args(["--maxmemory-policy", "allkeys-lru"])).await;
    let store = common::store(&lru).await;
    assert_eq!(
        events.count(events::REDIS_EVICTION_POLICY_UNSAFE.key, &at(&lru)),
        1
    );
    assert_eq!(
        store.server_info().await.unwrap().eviction_safe(),
        Some(false)
    );

    let no_config =
        common::server_with(ServerOptions::new().args(["--rename-command", "CONFIG", ""])).await;
    let store = common::store(&no_config).await;
    assert_eq!(
        events.count(events::REDIS_EVICTION_POLICY_UNKNOWN.key, &at(&no_config)),
        1
    );
    assert_eq!(store.server_info().await.unwrap().maxmemory_policy, None);
    // The store works all the same.
    granted(&store, &key("k"), &Holder::random()).await;
}

/// Killing the pub/sub connection wakes waiters at once (they re-check), and a release
/// made while it was down is not missed: the resubscription wakes them again.
#[tokio::test]
async fn waiters_wake_after_the_pubsub_connection_is_killed() {
    let events = common::Events::capture();
    let server = common::server().await;
    let holder_store = std::sync::Arc::new(common::store(&server).await);
    let waiter_store = std::sync::Arc::new(common::store(&server).await);
    let ns = Namespace::new("pubsub").unwrap();
    let holders = Locks::with_namespace(holder_store.clone(), ns.clone());
    let waiters = Locks::with_namespace(waiter_store.clone(), ns.clone());
    let long = LockOptions::new(Duration::from_secs(60)).wait(Duration::from_secs(30));

    for round in 0..3 {
        let guard = holders.acquire("k", &long).await.unwrap();
        let waiter = {
            let waiters = waiters.clone();
            let long = long.clone();
            tokio::spawn(async move { waiters.acquire("k", &long).await })
        };
        sleep(Duration::from_millis(100)).await;
        let killed = server
            .command_ok(&["CLIENT", "KILL", "TYPE", "pubsub"])
            .unwrap();
        assert_eq!(
            killed.as_integer(),
            Some(2),
            "both stores' pub/sub connections"
        );
        if round == 1 {
            // Release inside the gap, before the connections are back.
            guard.release().await;
        } else {
            sleep(Duration::from_millis(300)).await;
            guard.release().await;
        }
        let next = timeout(Duration::from_secs(10), waiter)
            .await
            .expect("the waiter woke long before the 60s TTL")
            .unwrap()
            .expect("the waiter got the lock");
        next.release().await;
    }
    // Each store lost and regained its connection once per round.
    let deadline = Instant::now() + Duration::from_secs(5);
    let at = server.addr().to_string();
    while events.count(events::STORE_PUSH_RESTORED.key, &at) < 6 && Instant::now() < deadline {
        sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        events.count(events::STORE_PUSH_LOST.key, &at),
        6,
        "{:?}",
        events.all()
    );
    assert_eq!(
        events.count(events::STORE_PUSH_RESTORED.key, &at),
        6,
        "{:?}",
        events.all()
    );
    assert!(
        waiter_store.wakeups().poll.is_none(),
        "healthy again: no polling"
    );
}

/// A release wakes a waiter in another store (another process) through pub/sub alone, and
/// only the store whose turn it is: stores take turns in the order they started waiting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stores_take_turns_in_the_order_they_started_waiting() {
    let server = common::server().await;
    let mut stores = Vec::new();
    for _ in 0..4 {
        stores.push(common::locks(&server, "turns").await);
    }
    let long = LockOptions::new(Duration::from_secs(60)).wait(Duration::from_secs(30));
    let first = stores[0].acquire("k", &long).await.unwrap();
    // Stores 3, 1, 2 start waiting, in that order.
    let (order, mut done) = tokio::sync::mpsc::unbounded_channel();
    for (queued, i) in [3, 1, 2].into_iter().enumerate() {
        let (locks, long, order) = (stores[i].clone(), long.clone(), order.clone());
        tokio::spawn(async move {
            let guard = locks.acquire("k", &long).await.unwrap();
            order.send((i, guard)).unwrap();
        });
        // Its first claim has queued it before the next one starts.
        wait_for_queue(
            &server,
            "{turns:lock:k}:queue",
            queued + 1,
            &format!("store {i}"),
        )
        .await;
    }
    first.release().await;
    for expected in [3, 1, 2] {
        let (i, guard) = timeout(Duration::from_secs(10), done.recv())
            .await
            .expect("a release wakes the next store long before the 60s TTL")
            .unwrap();
        assert_eq!(i, expected, "turns follow the order of waiting");
        // Nobody else got the lock meanwhile.
        sleep(Duration::from_millis(50)).await;
        assert!(done.try_recv().is_err());
        guard.release().await;
    }
    assert!(queue(&server, "{turns:lock:k}:queue").await.is_empty());
}

/// The stores queued for `queue_key`, oldest first.
/// `locks` waiting for `key` with `options`, in a task of its own.
fn spawn_acquire(
    locks: &Locks,
    key: &'static str,
    options: LockOptions,
) -> tokio::task::JoinHandle<Result<baton_core::LockGuard, baton_core::AcquireError>> {
    let locks = locks.clone();
    tokio::spawn(async move { locks.acquire(key, &options).await })
}

/// The grant `waiter` gets within `limit`; `what` names it if it does not.
async fn granted_within(
    limit: Duration,
    waiter: tokio::task::JoinHandle<Result<baton_core::LockGuard, baton_core::AcquireError>>,
    what: &str,
) -> baton_core::LockGuard {
    timeout(limit, waiter)
        .await
        .unwrap_or_else(|_| panic!("{what}: no grant within {limit:?}"))
        .expect("the waiter panicked")
        .unwrap_or_else(|e| panic!("{what}: {e}"))
}

/// Waits (up to ten seconds) until the queue at `queue_key` has at least `len` stores; if
/// not, fails saying `what` did not queue.
async fn wait_for_queue(
    server: &baton_testkit::redis::RedisServer,
    queue_key: &str,
    len: usize,
    what: &str,
) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while queue(server, queue_key).await.len() < len {
        assert!(Instant::now() < deadline, "{what} did not queue");
        sleep(Duration::from_millis(5)).await;
    }
}

async fn queue(server: &baton_testkit::redis::RedisServer, queue_key: &str) -> Vec<String> {
    let mut raw = common::raw(&server.url()).await;
    redis::cmd("ZRANGE")
        .arg(queue_key)
        .arg(0)
        .arg(-1)
        .query_async(&mut raw)
        .await
        .unwrap()
}

/// How many PUBLISH commands the server has run.
fn publishes(server: &baton_testkit::redis::RedisServer) -> u64 {
    server
        .command_calls()
        .unwrap()
        .get("publish")
        .copied()
        .unwrap_or(0)
}

/// A release nobody waits for publishes nothing; one that somebody waits for publishes one
/// message, to that waiter's store alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_release_somebody_waits_for_publishes() {
    let server = common::server().await;
    let (a, b) = (
        common::locks(&server, "quiet").await,
        common::locks(&server, "quiet").await,
    );
    let options = LockOptions::new(TEN_S);
    let before = publishes(&server);
    for _ in 0..20 {
        a.acquire("k", &options).await.unwrap().release().await;
        b.acquire("k", &options.clone().wait(TEN_S))
            .await
            .unwrap()
            .release()
            .await;
    }
    assert_eq!(publishes(&server), before, "nobody waited");

    let guard = a.acquire("k", &options).await.unwrap();
    let waiter = spawn_acquire(&b, "k", LockOptions::new(TEN_S).wait(TEN_S));
    wait_for_queue(&server, "{quiet:lock:k}:queue", 1, "the waiter").await;
    guard.release().await;
    let next = granted_within(Duration::from_secs(5), waiter, "the waiter").await;
    assert_eq!(
        publishes(&server),
        before + 1,
        "one message, to the waiter's store"
    );
    next.release().await;
}

/// A waiter that gave up leaves its store in the queue; when its turn comes, the store
/// passes it on at once instead of holding the key for the reservation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_whose_waiter_gave_up_passes_its_turn_on() {
    let server = common::server().await;
    let open = || common::locks(&server, "gaveup");
    let (a, b, c) = (open().await, open().await, open().await);
    let guard = a
        .acquire("k", &LockOptions::new(Duration::from_secs(60)))
        .await
        .unwrap();
    // b waits 300ms and gives up; c waits after it.
    let gave_up = b
        .acquire(
            "k",
            &LockOptions::new(TEN_S).wait(Duration::from_millis(300)),
        )
        .await;
    assert!(
        matches!(gave_up, Err(baton_core::AcquireError::Contended { .. })),
        "{gave_up:?}"
    );
    let waiter = spawn_acquire(&c, "k", LockOptions::new(TEN_S).wait(TEN_S));
    wait_for_queue(&server, "{gaveup:lock:k}:queue", 2, "b and c (both)").await;
    let released = Instant::now();
    guard.release().await;
    let next = granted_within(Duration::from_secs(5), waiter, "the waiter").await;
    // Not a speed bound: a turn left to lapse takes the whole reservation (see the stalled
    // store below); a turn passed on takes a few round trips.
    assert!(
        released.elapsed() < baton_redis::wakeups::HANDOFF_RESERVATION,
        "b passed its turn on instead of letting it lapse: {:?}",
        released.elapsed()
    );
    next.release().await;
    assert!(queue(&server, "{gaveup:lock:k}:queue").await.is_empty());
}

/// How many `EVALSHA` calls (script runs) the server has answered.
fn script_calls(server: &baton_testkit::redis::RedisServer) -> u64 {
    server
        .command_calls()
        .unwrap()
        .get("evalsha")
        .copied()
        .unwrap_or(0)
}

/// Waits (up to ten seconds) until `{Q}:who` names `len` waiting holders; if not, fails
/// saying `what` did not.
async fn wait_for_who(
    server: &baton_testkit::redis::RedisServer,
    who_key: &str,
    len: usize,
    what: &str,
) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut raw = common::raw(&server.url()).await;
        let named: usize = redis::cmd("HLEN")
            .arg(who_key)
            .query_async(&mut raw)
            .await
            .unwrap();
        if named >= len {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what} did not name its waiting holder"
        );
        sleep(Duration::from_millis(5)).await;
    }
}

/// With the key held by store A and a holder of store B waiting, A's release grants B's
/// holder the key itself: B's holder gets it with no claim of its own (one script call
/// between the release and B's grant, the release), and with a larger fence than A's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_hands_the_key_to_the_waiting_holder_of_another_store() {
    let server = common::server().await;
    let (a, b) = (
        common::locks(&server, "handover").await,
        common::locks(&server, "handover").await,
    );
    let guard = a.acquire("k", &LockOptions::new(TEN_S)).await.unwrap();
    let held = guard.fence();
    let waiter = spawn_acquire(&b, "k", LockOptions::new(TEN_S).wait(TEN_S));
    wait_for_queue(&server, "{handover:lock:k}:queue", 1, "b").await;
    wait_for_who(&server, "{handover:lock:k}:who", 1, "b").await;
    let before = script_calls(&server);
    guard.release().await;
    let next = granted_within(Duration::from_secs(5), waiter, "b's waiter").await;
    assert_eq!(
        script_calls(&server),
        before + 1,
        "the release alone: b's holder did not claim"
    );
    assert!(next.fence() > held, "{:?} after {held:?}", next.fence());
    // The grant is the server's: b's holder holds the key there, and its release frees it.
    next.release().await;
    let mut raw = common::raw(&server.url()).await;
    let left: Option<String> = ask(&mut raw, "GET", "{handover:lock:k}").await;
    assert_eq!(left, None);
    let who: i64 = ask(&mut raw, "EXISTS", "{handover:lock:k}:who").await;
    assert_eq!(who, 0, "nobody is named as waiting any more");
}

/// When the store next in line is the releasing store itself, the release's answer carries
/// the grant for its waiting holder: no message, and no claim from the waiter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_hands_the_key_to_a_waiting_holder_of_its_own_store() {
    let server = common::server().await;
    let locks = common::locks(&server, "own").await;
    let guard = locks.acquire("k", &LockOptions::new(TEN_S)).await.unwrap();
    let held = guard.fence();
    let waiter = spawn_acquire(&locks, "k", LockOptions::new(TEN_S).wait(TEN_S));
    wait_for_who(&server, "{own:lock:k}:who", 1, "the waiter").await;
    let (scripts, messages) = (script_calls(&server), publishes(&server));
    guard.release().await;
    let next = granted_within(Duration::from_secs(5), waiter, "the waiter").await;
    assert_eq!(script_calls(&server), scripts + 1, "the release alone");
    assert_eq!(publishes(&server), messages, "no message to its own store");
    assert!(next.fence() > held);
    next.release().await;
}

/// A hand-over that reaches a store whose holder stopped waiting (it gave up) is given back
/// at once by that store, and the release of it hands the key to the next store's waiter,
/// which again takes it without a claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_over_to_a_holder_that_stopped_waiting_reaches_the_next_store() {
    let server = common::server().await;
    let open = || common::locks(&server, "givenback");
    let (a, b, c) = (open().await, open().await, open().await);
    let guard = a
        .acquire("k", &LockOptions::new(Duration::from_secs(60)))
        .await
        .unwrap();
    // b waits 300ms and gives up; its store stays queued, naming its holder. c waits after it.
    let gave_up = b
        .acquire(
            "k",
            &LockOptions::new(TEN_S).wait(Duration::from_millis(300)),
        )
        .await;
    assert!(
        matches!(gave_up, Err(baton_core::AcquireError::Contended { .. })),
        "{gave_up:?}"
    );
    let waiter = spawn_acquire(&c, "k", LockOptions::new(TEN_S).wait(TEN_S));
    wait_for_queue(&server, "{givenback:lock:k}:queue", 2, "b and c (both)").await;
    wait_for_who(&server, "{givenback:lock:k}:who", 2, "b and c (both)").await;
    let before = script_calls(&server);
    let released = Instant::now();
    guard.release().await;
    let next = granted_within(Duration::from_secs(5), waiter, "c's waiter").await;
    // Not a speed bound: b's grant was given back long before its 10s TTL.
    assert!(
        released.elapsed() < Duration::from_secs(5),
        "b gave its grant back: {:?}",
        released.elapsed()
    );
    assert_eq!(
        script_calls(&server),
        before + 2,
        "a's release and b's give-back; c did not claim"
    );
    next.release().await;
    assert!(queue(&server, "{givenback:lock:k}:queue").await.is_empty());
}

/// A store that is reached but never claims (here: a bare subscriber standing in for a
/// paused process) holds the key for the reservation only; a store whose connection is gone
/// is skipped at once. Either way the next store gets the lock long before the holder's TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_or_dead_store_in_the_queue_costs_at_most_the_reservation() {
    use futures_util::StreamExt as _;

    let server = common::server().await;
    let (a, c) = (
        common::locks(&server, "stalled").await,
        common::locks(&server, "stalled").await,
    );
    let long = LockOptions::new(Duration::from_secs(60)).wait(Duration::from_secs(30));
    // A "process" that subscribed to its channel and then stopped reading.
    let client = redis::Client::open(server.url()).unwrap();
    let mut stalled = client.get_async_pubsub().await.unwrap();
    stalled
        .subscribe("baton:wake:0:stalled000000000")
        .await
        .unwrap();
    let mut raw = common::raw(&server.url()).await;

    // Stores are named by their channels in the queues.
    for (case, member) in [
        ("dead", "baton:wake:0:dead000000000000"),
        ("stalled", "baton:wake:0:stalled000000000"),
    ] {
        let guard = a.acquire(case, &long).await.unwrap();
        let queue_key = format!("{{stalled:lock:{case}}}:queue");
        // The stand-in waited first.
        let _: i64 = redis::cmd("ZADD")
            .arg(&queue_key)
            .arg(1)
            .arg(member)
            .query_async(&mut raw)
            .await
            .unwrap();
        let waiter = spawn_acquire(&c, case, long.clone());
        wait_for_queue(&server, &queue_key, 2, "c").await;
        let released = Instant::now();
        guard.release().await;
        let next = granted_within(
            Duration::from_secs(10),
            waiter,
            "the next store got the lock long before the 60s TTL",
        )
        .await;
        let took = released.elapsed();
        if case == "stalled" {
            assert!(
                took >= baton_redis::wakeups::HANDOFF_RESERVATION,
                "the stalled store had its reservation: {took:?}"
            );
        }
        next.release().await;
    }
    // The stand-in was told it was its turn, once.
    let message = timeout(Duration::from_secs(1), stalled.on_message().next())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(message.get_payload_bytes(), b"hstalled:lock:stalled");
}

#[tokio::test]
async fn the_facade_opens_redis_urls() {
    let server = common::server().await;
    let baton = baton::connect(&format!("{}/2?response_timeout=1s", server.url()))
        .await
        .unwrap();
    let options = LockOptions::new(TEN_S);
    let guard = baton.locks().acquire("facade", &options).await.unwrap();
    assert!(guard.fence().get() > 0);
    guard.release().await;

    // rediss:// is TLS: against a plain-text port the handshake fails, as Unavailable.
    let tls = format!(
        "rediss://127.0.0.1:{}/0?connect_timeout=500ms&response_timeout=500ms",
        server.port()
    );
    let err = timeout(Duration::from_secs(5), baton::connect(&tls))
        .await
        .expect("no hang")
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");

    let err = baton::connect("redis://127.0.0.1:1/zero")
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
}

/// The ACL that docs/redis.md recommends is enough for everything the store does.
#[tokio::test]
async fn a_least_privilege_acl_user_is_enough() {
    let server = common::server().await;
    server
        .command_ok(&[
            "ACL",
            "SETUSER",
            "locker",
            "on",
            ">pw",
            "resetkeys",
            "~{t:*",
            "resetchannels",
            "&baton:wake:*",
            "-@all",
            "+evalsha",
            "+eval",
            "+script|load",
            "+get",
            "+set",
            "+del",
            "+incr",
            "+pexpire",
            "+pttl",
            "+time",
            "+zadd",
            "+zscore",
            "+zrange",
            "+zpopmin",
            "+zrem",
            "+publish",
            "+subscribe",
            "+ping",
            "+scan",
            "+select",
            "+info",
            "+config|get",
        ])
        .unwrap();
    let url = format!("redis://locker:pw@{}/1?response_timeout=1s", server.addr());
    let store = RedisStore::connect(&url).await.unwrap();
    assert_eq!(
        store.server_info().await.unwrap().eviction_safe(),
        Some(true)
    );
    let (k, a) = grant_to_someone(&store, "acl").await;
    assert_eq!(
        store.renew(&k, &a, ttl(TEN_S)).await.unwrap(),
        Renewal::Renewed
    );
    assert_eq!(store.list("t:lock:", 10).await.unwrap().len(), 1);
    assert_eq!(store.release(&k, &a).await.unwrap(), Release::Removed);

    // A user that may not subscribe is told so at connect, not left polling silently.
    server
        .command_ok(&["ACL", "SETUSER", "locker", "resetchannels"])
        .unwrap();
    let err = RedisStore::connect(&url).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(err.message().contains("baton:wake:1:"), "{err}");
}

/// A connection reset between two calls costs nothing: the next call finds the connection
/// dropped before its request went out, and runs once more on a new one. The release is
/// still a release, not a fault that leaves the key held until its TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_after_a_connection_reset_run_on_a_new_connection() {
    use baton_testkit::proxy::FaultProxy;

    let server = common::server().await;
    let proxy = FaultProxy::start(server.addr()).unwrap();
    let store = connect(&format!(
        "redis://{}/0?connect_timeout=1s&response_timeout=1s",
        proxy.addr()
    ))
    .await;
    let (k, a) = grant_to_someone(&store, "reset").await;
    for call in ["release", "renew", "claim", "inspect"] {
        proxy.kill_connections();
        // Let the store's connection see the reset before the next request.
        sleep(Duration::from_millis(100)).await;
        match call {
            "release" => {
                assert_eq!(store.release(&k, &a).await.unwrap(), Release::Removed)
            }
            "renew" => assert_eq!(
                store.renew(&k, &a, ttl(TEN_S)).await.unwrap(),
                Renewal::NotHeld
            ),
            "claim" => {
                granted(&store, &k, &a).await;
            }
            _ => assert_eq!(store.inspect(&k).await.unwrap().unwrap().holder, a),
        }
    }
    // The pub/sub connection came back as well.
    let deadline = Instant::now() + Duration::from_secs(5);
    while store.wakeups().poll.is_some() {
        assert!(Instant::now() < deadline, "pub/sub did not come back");
        sleep(Duration::from_millis(20)).await;
    }
}

/// A release that hands the key on publishes the watch to the second store in line before the
/// turn to the first: Redis writes the output of the clients a command reached last in, first
/// out, so the turn leaves before the watch and the watch does not delay the handoff. The
/// order of the calls is what the server shows to `MONITOR`.
#[tokio::test]
async fn a_handoff_publishes_the_watch_before_the_turn() {
    use futures_util::StreamExt as _;

    let server = common::server().await;
    let store = common::store(&server).await;
    let key = key("order");
    let holder = Holder::random();
    granted(&store, &key, &holder).await;
    // Two stand-in stores queued, in this order, and the grant marked as a waiter's claim
    // would have marked it.
    let client = redis::Client::open(server.url()).unwrap();
    let mut raw = common::raw(&server.url()).await;
    let mut subscribers = Vec::new();
    for (score, channel) in [
        (1, "baton:wake:0:first0000000000"),
        (2, "baton:wake:0:second000000000"),
    ] {
        let mut subscriber = client.get_async_pubsub().await.unwrap();
        subscriber.subscribe(channel).await.unwrap();
        subscribers.push(subscriber);
        let _: i64 = redis::cmd("ZADD")
            .arg("{t:lock:order}:queue")
            .arg(score)
            .arg(channel)
            .query_async(&mut raw)
            .await
            .unwrap();
    }
    let value: String = ask(&mut raw, "GET", "{t:lock:order}").await;
    let _: () = redis::cmd("SET")
        .arg("{t:lock:order}")
        .arg(format!("*{value}"))
        .arg("KEEPTTL")
        .query_async(&mut raw)
        .await
        .unwrap();

    let monitor = client.get_async_monitor().await.unwrap();
    let mut lines = monitor.into_on_message::<String>();
    assert_eq!(
        store.release(&key, &holder).await.unwrap(),
        Release::Removed
    );
    let mut publishes = Vec::new();
    while publishes.len() < 2 {
        let line = timeout(Duration::from_secs(5), lines.next())
            .await
            .expect("MONITOR shows the release's calls")
            .expect("the monitor connection stays open");
        if line.contains("\"PUBLISH\"") || line.contains("\"publish\"") {
            publishes.push(line);
        }
    }
    assert!(
        publishes[0].contains("second000000000") && publishes[0].contains("\"w250:t:lock:order\""),
        "the watch goes out first: {publishes:?}"
    );
    assert!(
        publishes[1].contains("first0000000000") && publishes[1].contains("\"ht:lock:order\""),
        "the turn goes out second: {publishes:?}"
    );
    // Each stand-in got its own message.
    for (subscriber, expected) in subscribers
        .iter_mut()
        .zip([&b"ht:lock:order"[..], b"w250:t:lock:order"])
    {
        let message = timeout(Duration::from_secs(5), subscriber.on_message().next())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(message.get_payload_bytes(), expected);
    }
}

/// Eight processes, each with its store, contend for one key on one server: every rule
/// holds on the merged history, every grant's write landed once, and every process was
/// granted.
#[test]
fn contenders_in_eight_processes_keep_every_rule() {
    let server = baton_testkit::redis::RedisServer::start().expect("a private redis-server");
    let dir = tempfile::tempdir().unwrap();
    let (history, register) = baton_testkit::LockWorkload::run_in_processes(
        "redis_contender_process",
        8,
        dir.path(),
        &[("STORE_URL", &server.url())],
    );
    baton_testkit::LockWorkload::assert_every_grant_landed(&history, &register, 8 * 15);
    let processes: std::collections::HashSet<u32> =
        history.grants().iter().map(|g| g.process).collect();
    assert_eq!(processes.len(), 8, "every process was granted the lock");
}

#[test]
#[ignore = "a child process of contenders_in_eight_processes_keep_every_rule"]
fn redis_contender_process() {
    baton_testkit::LockWorkload::new("history")
        .contenders(1, 0)
        .rounds(15)
        .run_as_child(|| async {
            let url = baton_testkit::process::parent_env("STORE_URL");
            let store = RedisStore::connect(&url)
                .await
                .unwrap_or_else(|e| panic!("connect {url}: {e}"));
            Locks::new(std::sync::Arc::new(store))
        });
}
