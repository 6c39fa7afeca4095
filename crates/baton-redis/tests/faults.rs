//! The Redis store under faults, each against private `redis-server` processes started by
//! `baton-testkit` (never a server someone else runs): a killed and restarted server, a
//! holder paused past its TTL, flushed scripts, a lost reply, a partition under keep-alive,
//! a killed pub/sub connection, and a server that may evict keys.
//!
//! No test here asserts speed. The only time bounds are the ones the contract states (a
//! call fails within its configured timeout; `lost()` fires by `valid_until`), each with a
//! slack for a loaded machine, and every wait fails the test after a generous deadline
//! instead of hanging.

#[path = "common/faults_support.rs"]
mod support;

use std::sync::Arc;
use std::time::Duration;

use baton_core::store::{Claim, LeaseRequest, LeaseStore, Release, Renewal};
use baton_core::telemetry::events;
use baton_core::{AcquireError, Fence, Holder, LockOptions, Locks, ReleaseOutcome, Ttl};
use baton_testkit::FencedRegister;
use baton_testkit::process::{self, ChildTest};
use baton_testkit::proxy::{FaultProxy, failures_until_ok};
use baton_testkit::redis::{RedisOptions, RedisServer};
use tokio::time::Instant;

use support::*;

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn ttl(d: Duration) -> Ttl {
    Ttl::new(d).expect("a valid ttl")
}

fn start_server() -> Arc<RedisServer> {
    Arc::new(RedisServer::start().expect("a private redis-server (apt-get install redis-server)"))
}

async fn granted(
    store: &dyn LeaseStore,
    key: &baton_core::StoreKey,
    holder: &Holder,
    t: Duration,
) -> Fence {
    match store.claim(key, LeaseRequest::new(holder, ttl(t))).await {
        Ok(Claim::Granted { fence }) => fence,
        other => panic!("expected a grant of {key}, got {other:?}"),
    }
}

/// The server dies while a lock is held: calls fail with `Unavailable` within the
/// configured timeout, the release reports `Faulted` (and says so in telemetry), and after
/// a restart the same store instance reconnects by itself and grants larger fences.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_server_fails_fast_and_the_store_recovers_after_restart() {
    capture_events();
    let server = start_server();
    let store = connect(&server.url()).await;
    let ns = namespace();
    let locks = Locks::with_namespace(store.clone(), ns.clone());
    let options = LockOptions::new(secs(30));
    let guard = within("acquire", locks.acquire("job", &options))
        .await
        .expect("an uncontended acquire");
    let before = guard.fence();

    let killed = Arc::clone(&server);
    blocking(move || killed.kill()).await;

    for (what, wait) in [
        ("one attempt", Duration::ZERO),
        ("a waiting acquire", secs(30)),
    ] {
        let started = Instant::now();
        let answer = within(what, locks.acquire("other", &options.clone().wait(wait))).await;
        let took = started.elapsed();
        assert!(
            matches!(answer, Err(AcquireError::Unavailable(ref e)) if e.is_unavailable()),
            "{what} against a dead server answered {answer:?}"
        );
        assert!(
            took <= CALL_DEADLINE + SLACK,
            "{what} took {took:?}; the store's calls end within {CALL_DEADLINE:?}"
        );
    }
    wait_for_event(&events::LOCK_UNAVAILABLE, |e| {
        e.key.starts_with(ns.as_str())
    })
    .await;

    let outcome = within("release", guard.release()).await;
    assert_eq!(outcome, ReleaseOutcome::Faulted);
    wait_for_event(&events::LOCK_RELEASE_FAULTED, |e| {
        e.key == lock_key(&ns, "job").as_str()
    })
    .await;

    let restarted = Arc::clone(&server);
    blocking(move || restarted.restart())
        .await
        .expect("the server restarts on its port");
    // No persistence: the grant and its fence counter are gone with the old process. The
    // same store instance reconnects on its own; fences keep increasing (seeded from the
    // server clock).
    let guard = eventually("the store to reconnect and grant", || async {
        locks.acquire("job", &options).await.ok()
    })
    .await;
    assert!(
        guard.fence() > before,
        "fence after restart {} is not above {before}",
        guard.fence()
    );
    assert_eq!(
        within("release", guard.release()).await,
        ReleaseOutcome::Released
    );
}

/// A waiter that has seen the key held rides out a restart of the server within its wait:
/// its claims fail while the server is down (`baton.lock.wait_faulted` says so once), and
/// the first claim after the restart grants, with a fence above the one before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_rides_out_a_server_restart_within_its_wait() {
    capture_events();
    let server = start_server();
    let store = connect(&server.url()).await;
    let ns = namespace();
    let locks = Locks::with_namespace(store.clone(), ns.clone());
    let held = within(
        "acquire",
        locks.acquire("waited", &LockOptions::new(secs(600))),
    )
    .await
    .expect("an uncontended acquire");
    let waiter = tokio::spawn({
        let locks = locks.clone();
        async move {
            locks
                .acquire("waited", &LockOptions::new(secs(30)).wait(secs(60)))
                .await
        }
    });
    // The waiter has claimed at least once and seen the key held.
    tokio::time::sleep(ms(300)).await;
    assert!(
        !waiter.is_finished(),
        "the waiter ended while the key was held"
    );

    let killed = Arc::clone(&server);
    blocking(move || killed.kill()).await;
    // Down for longer than a few of the waiter's retries.
    tokio::time::sleep(secs(2)).await;
    assert!(
        !waiter.is_finished(),
        "the waiter gave up while the server was down"
    );
    let restarted = Arc::clone(&server);
    blocking(move || restarted.restart())
        .await
        .expect("the server restarts on its port");

    // No persistence: the 10-minute grant is gone with the old process, so the waiter is
    // granted at its next claim.
    let guard = within("the waiter", waiter)
        .await
        .expect("the waiter's task")
        .expect("the waiter rode out the restart");
    assert!(guard.fence() > held.fence(), "fences keep increasing");
    wait_for_event(&events::LOCK_WAIT_FAULTED, |e| {
        e.key == lock_key(&ns, "waited").as_str()
    })
    .await;
    assert_eq!(
        within("release", guard.release()).await,
        ReleaseOutcome::Released
    );
    drop(held);
}

/// A holder paused (SIGSTOP) past its TTL, in a process of its own: another process takes
/// the lock; once resumed, the holder's `lost()` has fired, its late write to a fenced
/// resource is rejected, and its release answers `Expired` and spares the new holder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_holder_loses_the_lock_and_its_late_write_is_rejected() {
    let server = start_server();
    let dir = tempfile::tempdir().expect("a temporary directory");
    let ns = namespace();
    let register = FencedRegister::file("resource", dir.path().join("register.json"));

    let mut holder = ChildTest::new("paused_holder_child", "holder")
        .env("FAULTS_URL", server.url())
        .env("FAULTS_NS", ns.as_str())
        .env("FAULTS_DIR", dir.path())
        .spawn()
        .expect("start the holder process");
    let acquired = dir.path().join("acquired");
    blocking({
        let acquired = acquired.clone();
        move || process::wait_for_file(acquired, PATIENCE)
    })
    .await
    .unwrap_or_else(|e| panic!("{e}; holder output:\n{}", holder.output()));
    let old_fence: u64 = std::fs::read_to_string(&acquired)
        .expect("the holder's fence")
        .trim()
        .parse()
        .expect("a decimal fence");

    holder.pause().expect("SIGSTOP the holder");
    // The holder cannot renew now; the lock is free once its TTL lapses on Redis.
    let store = connect(&server.url()).await;
    let locks = Locks::with_namespace(store.clone(), ns.clone());
    let guard = within(
        "the takeover",
        locks.acquire("resource", &LockOptions::new(secs(30)).wait(secs(30))),
    )
    .await
    .expect("the lock once the paused holder's TTL lapsed");
    assert!(guard.fence().get() > old_fence);
    assert!(register.write(guard.fence(), 2).accepted);

    holder.resume().expect("SIGCONT the holder");
    std::fs::write(dir.path().join("go"), "").expect("signal the holder");
    blocking(move || {
        holder
            .wait_success(PATIENCE)
            .unwrap_or_else(|e| panic!("{e}"));
    })
    .await;

    let state = register.state();
    assert_eq!(
        state.value, 2,
        "the late write overwrote the new holder's: {state:?}"
    );
    assert_eq!(state.rejected, 1, "{state:?}");
    let info = store
        .inspect(&lock_key(&ns, "resource"))
        .await
        .expect("inspect")
        .expect("the new holder still holds the lock");
    assert_eq!(info.fence, guard.fence());
    assert_eq!(
        within("release", guard.release()).await,
        ReleaseOutcome::Released
    );
}

/// The holder process of [`paused_holder_loses_the_lock_and_its_late_write_is_rejected`].
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a child process of paused_holder_loses_the_lock_and_its_late_write_is_rejected"]
async fn paused_holder_child() {
    let Some(_) = process::role() else { return };
    let var = |name: &str| std::env::var(name).unwrap_or_else(|_| panic!("{name} is set"));
    let dir = std::path::PathBuf::from(var("FAULTS_DIR"));
    let ns = baton_core::Namespace::new(var("FAULTS_NS")).expect("a namespace");
    let register = FencedRegister::file("resource", dir.join("register.json"));
    let store = connect(&var("FAULTS_URL")).await;
    let locks = Locks::with_namespace(store, ns);
    // Keep-alive would hold the lock for as long as this process runs; the pause stops it.
    let options = LockOptions::new(secs(2)).keep_alive(ms(400));
    let guard = locks.acquire("resource", &options).await.expect("the lock");
    assert!(register.write(guard.fence(), 1).accepted);
    std::fs::write(dir.join("acquired"), guard.fence().get().to_string()).expect("report");

    // The parent pauses this process here, takes the lock over, resumes it and says go.
    let go = dir.join("go");
    within("the parent's go", async {
        while !go.exists() {
            tokio::time::sleep(ms(20)).await;
        }
    })
    .await;

    within("lost() to fire after the pause", guard.lost()).await;
    assert!(guard.is_lost());
    let late = register.write(guard.fence(), 3);
    assert!(
        !late.accepted,
        "the fenced resource accepted a stale write: {late:?}"
    );
    assert_eq!(
        within("release", guard.release()).await,
        ReleaseOutcome::Expired
    );
    println!("holder: lost, late write rejected, release Expired");
}

/// `SCRIPT FLUSH` before every call: EVALSHA answers NOSCRIPT, the store loads the script
/// again, and the answers are the real ones, so NOSCRIPT is never taken for not-holder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flushed_scripts_are_reloaded_and_never_read_as_not_holder() {
    let server = start_server();
    let store = connect(&server.url()).await;
    let ns = namespace();
    let key = lock_key(&ns, "flushed");
    let (a, b) = (Holder::random(), Holder::random());
    let flush = || {
        let reply = server
            .command_ok(&["SCRIPT", "FLUSH"])
            .expect("SCRIPT FLUSH");
        assert_eq!(reply.as_text().as_deref(), Some("OK"));
    };

    flush();
    let fence = granted(&*store, &key, &a, secs(30)).await;
    flush();
    assert_eq!(
        store.renew(&key, &a, ttl(secs(30))).await.expect("renew"),
        Renewal::Renewed
    );
    flush();
    match store
        .claim(&key, LeaseRequest::new(&b, ttl(secs(30))))
        .await
        .expect("claim")
    {
        Claim::Held { holder, .. } => assert_eq!(holder, a),
        other => panic!("expected Held by a, got {other:?}"),
    }
    flush();
    assert_eq!(
        store.renew(&key, &b, ttl(secs(30))).await.expect("renew"),
        Renewal::NotHeld
    );
    flush();
    assert_eq!(
        store.release(&key, &b).await.expect("release"),
        Release::Reclaimed { by: a.clone() }
    );
    flush();
    let info = store
        .inspect(&key)
        .await
        .expect("inspect")
        .expect("still held");
    assert_eq!((info.holder, info.fence), (a.clone(), fence));
    flush();
    assert_eq!(
        store.release(&key, &a).await.expect("release"),
        Release::Removed
    );
    flush();
    assert_eq!(
        store.release(&key, &a).await.expect("release"),
        Release::NoHolder
    );

    // Keep-alive renews across flushes without ever losing the lock.
    let locks = Locks::with_namespace(store.clone(), ns);
    let guard = locks
        .acquire("kept", &LockOptions::new(secs(2)).keep_alive(ms(200)))
        .await
        .expect("the lock");
    let until = Instant::now() + secs(3);
    while Instant::now() < until {
        flush();
        tokio::time::sleep(ms(100)).await;
        assert!(
            !guard.is_lost(),
            "a flushed script was taken for a lost lock"
        );
    }
    assert_eq!(
        within("release", guard.release()).await,
        ReleaseOutcome::Released
    );
}

/// The reply to a release is lost on the way back: the release ran, the client does not
/// know it. The same client acquires again, and a retry of the old release (same holder
/// token) must leave the new grant alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_release_whose_reply_was_lost_spares_the_new_grant() {
    let server = start_server();
    let proxy = FaultProxy::start(server.addr()).expect("a fault proxy");
    let store = connect(&format!("redis://{}", proxy.addr())).await;
    let direct = connect(&server.url()).await;
    let ns = namespace();
    let key = lock_key(&ns, "once");
    let (old, new) = (Holder::random(), Holder::random());

    let old_fence = granted(&*store, &key, &old, secs(30)).await;
    proxy.drop_replies();
    let lost = within("the release", store.release(&key, &old)).await;
    assert!(
        matches!(&lost, Err(e) if e.is_unavailable()),
        "a release without a reply answered {lost:?}"
    );
    assert!(proxy.dropped_bytes() > 0, "the proxy swallowed nothing");
    assert_eq!(
        direct.inspect(&key).await.expect("inspect"),
        None,
        "the release did not reach the server"
    );
    proxy.heal();

    // The same client acquires again (its connection was reset with the lost reply).
    let new_fence = eventually("the store to reconnect and grant", || async {
        match store
            .claim(&key, LeaseRequest::new(&new, ttl(secs(30))))
            .await
        {
            Ok(Claim::Granted { fence }) => Some(fence),
            Ok(other) => panic!("expected a grant, got {other:?}"),
            Err(_) => None,
        }
    })
    .await;
    assert!(new_fence > old_fence);

    // The old release, retried.
    let retried = within("the retried release", store.release(&key, &old))
        .await
        .expect("the retried release");
    assert_eq!(retried, Release::Reclaimed { by: new.clone() });
    let info = direct
        .inspect(&key)
        .await
        .expect("inspect")
        .expect("the new grant");
    assert_eq!((info.holder, info.fence), (new.clone(), new_fence));

    // The same through the lock API: the lost reply is `Faulted`, and the next guard of the
    // same client survives it.
    let locks = Locks::with_namespace(store.clone(), ns.clone());
    let options = LockOptions::new(secs(30));
    let first = locks.acquire("guarded", &options).await.expect("the lock");
    proxy.drop_replies();
    assert_eq!(
        within("release", first.release()).await,
        ReleaseOutcome::Faulted
    );
    proxy.heal();
    let second = eventually("the store to reconnect and grant", || async {
        locks.acquire("guarded", &options).await.ok()
    })
    .await;
    tokio::time::sleep(ms(200)).await;
    assert!(!second.is_lost());
    let info = direct
        .inspect(&lock_key(&ns, "guarded"))
        .await
        .expect("inspect")
        .expect("the second grant");
    assert_eq!(info.fence, second.fence());
    assert_eq!(
        within("release", second.release()).await,
        ReleaseOutcome::Released
    );
}

/// Keep-alive behind a partition (blackhole): no renewal gets through, so `lost()` fires by
/// `valid_until`; another client takes the lock; when the partition heals, the held
/// renewals reach Redis late and must not revive the old grant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_alive_under_a_blackhole_loses_by_valid_until_and_late_renewals_revive_nothing() {
    /// How late after `valid_until` the lost signal may be seen on a loaded machine.
    const LOST_SLACK: Duration = Duration::from_millis(750);
    let server = start_server();
    let proxy = FaultProxy::start(server.addr()).expect("a fault proxy");
    // Long timeouts on the partitioned client: a watchdog that waited for its renewal to
    // time out, rather than for `valid_until`, would be seconds late.
    let partitioned = Arc::new(
        baton_redis::RedisStore::connect(&format!(
            "redis://{}?connect_timeout=3s&response_timeout=3s",
            proxy.addr()
        ))
        .await
        .expect("connect through the proxy"),
    );
    let other = connect(&server.url()).await;
    let ns = namespace();
    let a = Locks::with_namespace(partitioned.clone(), ns.clone());
    let b = Locks::with_namespace(other.clone(), ns.clone());

    let kept = a
        .acquire(
            "partitioned",
            &LockOptions::new(secs(4)).keep_alive(secs(1)),
        )
        .await
        .expect("the lock");
    tokio::time::sleep(ms(2500)).await;
    assert!(!kept.is_lost(), "keep-alive lost the lock before any fault");

    proxy.blackhole();
    within("lost() under the blackhole", kept.lost()).await;
    let lost_at = Instant::now();
    let valid_until = kept.valid_until();
    assert!(
        lost_at <= valid_until + LOST_SLACK,
        "lost() fired {:?} after valid_until",
        lost_at - valid_until
    );
    assert!(
        lost_at + ms(1) >= valid_until,
        "lost() fired before valid_until without word from the store"
    );

    let taken = within(
        "the takeover",
        b.acquire("partitioned", &LockOptions::new(secs(30)).wait(secs(30))),
    )
    .await
    .expect("the lock after the partitioned grant expired");
    assert!(taken.fence() > kept.fence());

    let held = proxy.pending_bytes();
    assert!(held > 0, "no renewal was held by the blackhole");
    proxy.heal();
    eventually("the held renewals to reach redis", || async {
        (proxy.pending_bytes() == 0).then_some(())
    })
    .await;
    // Let Redis run what it was handed, then look: still the new grant, with its own TTL.
    tokio::time::sleep(ms(300)).await;
    let info = other
        .inspect(&lock_key(&ns, "partitioned"))
        .await
        .expect("inspect")
        .expect("the new grant");
    assert_eq!(info.fence, taken.fence());
    assert!(
        info.remaining > secs(10),
        "a late renewal shortened the new grant to {:?}",
        info.remaining
    );
    assert!(!taken.is_lost());

    // The partitioned client works again, and its release reports the expiry.
    eventually("the partitioned client to answer", || async {
        partitioned
            .inspect(&lock_key(&ns, "partitioned"))
            .await
            .ok()
    })
    .await;
    assert_eq!(
        within("release", kept.release()).await,
        ReleaseOutcome::Expired
    );
    assert_eq!(
        within("release", taken.release()).await,
        ReleaseOutcome::Released
    );
}

/// `CLIENT KILL TYPE pubsub` drops every store's pub/sub connection. Waiters in another
/// store still wake: by the release message once the store has subscribed again, and, for
/// a release made while it was down, by the re-check on resubscribe or the TTL fallback.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_wake_after_the_pubsub_connection_is_killed() {
    capture_events();
    let server = start_server();
    let holder_store = connect(&server.url()).await;
    let waiter_store = connect(&server.url()).await;
    let ns = namespace();
    let holder = Locks::with_namespace(holder_store.clone(), ns.clone());
    let waiter = Locks::with_namespace(waiter_store.clone(), ns.clone());
    let pubsub_clients = || {
        let list = server
            .command_ok(&["CLIENT", "LIST", "TYPE", "pubsub"])
            .expect("CLIENT LIST");
        list.as_text().unwrap_or_default().lines().count()
    };
    let kill_pubsub = || {
        let killed = server
            .command_ok(&["CLIENT", "KILL", "TYPE", "pubsub"])
            .expect("CLIENT KILL");
        assert!(
            killed.as_integer().is_some_and(|n| n >= 2),
            "killed {killed:?}"
        );
    };
    assert_eq!(pubsub_clients(), 2);

    // 1. Killed while a waiter waits; released after the store subscribed again. The
    // holder's TTL is far beyond the test's patience, so only the message can wake it.
    let long = LockOptions::new(secs(600));
    let guard = holder.acquire("k1", &long).await.expect("the lock");
    let waiting = tokio::spawn({
        let waiter = waiter.clone();
        async move {
            waiter
                .acquire("k1", &LockOptions::new(secs(30)).wait(secs(300)))
                .await
        }
    });
    tokio::time::sleep(ms(300)).await;
    kill_pubsub();
    let address = format!("127.0.0.1:{}", server.port());
    wait_for_event(&events::STORE_PUSH_LOST, |e| e.message.contains(&address)).await;
    eventually("both stores to subscribe again", || async {
        (pubsub_clients() == 2).then_some(())
    })
    .await;
    assert!(!waiting.is_finished(), "the waiter got a lock that is held");
    assert_eq!(guard.release().await, ReleaseOutcome::Released);
    let woken = within("the waiter to wake", waiting)
        .await
        .expect("the waiter task")
        .expect("the lock after the release");
    assert_eq!(woken.release().await, ReleaseOutcome::Released);

    // 2. Released while the waiter's pub/sub connection is down: the message is lost; the
    // waiter wakes by its re-check on resubscribe, or at the holder's TTL at the latest.
    let short = LockOptions::new(secs(3));
    let guard = holder.acquire("k2", &short).await.expect("the lock");
    let waiting = tokio::spawn({
        let waiter = waiter.clone();
        async move {
            waiter
                .acquire("k2", &LockOptions::new(secs(30)).wait(secs(300)))
                .await
        }
    });
    tokio::time::sleep(ms(300)).await;
    kill_pubsub();
    assert_eq!(guard.release().await, ReleaseOutcome::Released);
    let started = Instant::now();
    let woken = within("the waiter to wake", waiting)
        .await
        .expect("the waiter task")
        .expect("the lock after the release");
    assert!(
        started.elapsed() <= secs(3) + SLACK,
        "the waiter woke after {:?}, later than the holder's TTL",
        started.elapsed()
    );
    assert_eq!(woken.release().await, ReleaseOutcome::Released);
}

/// A server that may evict keys (any `maxmemory-policy` but `noeviction`) could drop a
/// held lock: connecting says so with a registered warning; a `noeviction` server does not
/// trigger it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_evicting_server_is_reported_on_connect() {
    capture_events();
    let evicting = blocking(|| {
        RedisServer::start_with(RedisOptions::new().args(["--maxmemory-policy", "allkeys-lru"]))
    })
    .await
    .expect("a private redis-server");
    let safe = start_server();
    let _evicting_store = connect(&evicting.url()).await;
    let _safe_store = connect(&safe.url()).await;
    let about = |server: &RedisServer| {
        let address = format!("127.0.0.1:{}", server.port());
        move |e: &Captured| e.message.contains(&address)
    };
    let warning = wait_for_event(&events::REDIS_EVICTION_POLICY_UNSAFE, about(&evicting)).await;
    assert!(warning.message.contains("allkeys-lru"), "{warning:?}");
    assert!(events(&events::REDIS_EVICTION_POLICY_UNSAFE, about(&safe)).is_empty());
    assert!(events(&events::REDIS_EVICTION_POLICY_UNKNOWN, about(&safe)).is_empty());
}

/// The store's connection dies without a word (a NAT or load balancer dropped its state: no
/// reset, no answer) while the server still takes new connections: calls time out for a
/// while, then the store is on a new connection and answers again, by itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silently_dead_connection_is_replaced() {
    capture_events();
    let server = start_server();
    let proxy = FaultProxy::start(server.addr()).expect("a fault proxy");
    let store = baton_redis::RedisStore::connect(&format!(
        "redis://{}?connect_timeout=1s&response_timeout=500ms",
        proxy.addr()
    ))
    .await
    .expect("connect through the proxy");
    let key = lock_key(&namespace(), "stranded");
    store
        .inspect(&key)
        .await
        .expect("an inspect through the proxy");

    proxy.strand_connections();
    let failures = failures_until_ok("the store gets a new connection", secs(45), || {
        store.inspect(&key)
    })
    .await;
    // The first timeout starts the replacement; calls sent before it is in place fail too.
    assert!(failures.len() <= 5, "{failures:#?}");
    let address = proxy.addr().to_string();
    wait_for_event(&events::STORE_CONNECTION_REPLACED, |e| {
        e.message.contains(&address)
    })
    .await;
    for _ in 0..20 {
        store
            .inspect(&key)
            .await
            .expect("an inspect after recovery");
    }
}
