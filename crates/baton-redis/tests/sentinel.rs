//! The Redis store through Sentinel, against a private topology started by
//! `baton_testkit::sentinel` (one primary, one replica, three sentinels on loopback): the
//! primary is killed (SIGKILL) while processes contend, and the store follows the primary
//! the sentinels promote, without a restart of the process.
//!
//! The multi-process tests re-run this test binary: `sentinel_contender_process` is their
//! child, ignored in ordinary runs and run by the parent with a role (see
//! `baton_testkit::process`).

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use baton_core::broadcast::Event;
use baton_core::store::{Claim, LeaseRequest, LeaseStore};
use baton_core::telemetry::events;
use baton_core::{Broadcast, ErrorKind, Holder, Key, KeyKind, LockOptions, Locks, Namespace, Ttl};
use baton_redis::RedisStore;
use baton_testkit::process::{self, ChildTest};
use baton_testkit::sentinel::SentinelTopology;
use baton_testkit::time::MonoTime;
use baton_testkit::{FencedRegister, History, LockWorkload, Recorder, check};
use tokio::time::{Instant, sleep, timeout};

const KEY: &str = "failover";
const PROCESSES: u32 = 4;
/// Rounds per batch: the children contend in batches until the parent tells them to stop.
const ROUNDS: u32 = 5;
/// How long the run goes on once the new primary can take grants.
const AFTER_FAILOVER: Duration = Duration::from_secs(3);
/// The store's timeouts in these tests: a client continues within the failover plus one
/// connect timeout.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
const RESPONSE_TIMEOUT: Duration = Duration::from_millis(1000);
/// Generous: the children are debug builds on a loaded two-core machine.
const CHILD_TIMEOUT: Duration = Duration::from_secs(300);
const FAILOVER_PATIENCE: Duration = Duration::from_secs(60);

fn options(min_replicas: u32) -> String {
    format!(
        "connect_timeout={}ms&response_timeout={}ms&min_replicas={min_replicas}",
        CONNECT_TIMEOUT.as_millis(),
        RESPONSE_TIMEOUT.as_millis()
    )
}

async fn topology() -> Arc<SentinelTopology> {
    Arc::new(
        tokio::task::spawn_blocking(SentinelTopology::start)
            .await
            .unwrap()
            .expect("a private Sentinel topology (apt-get install redis-sentinel)"),
    )
}

/// Kills the primary on `old` and waits until the sentinels promoted the replica; returns
/// the new primary's port.
async fn fail_over(topology: &Arc<SentinelTopology>, old: u16) -> u16 {
    let topology = Arc::clone(topology);
    tokio::task::spawn_blocking(move || {
        topology.kill(old).unwrap();
        topology.wait_for_failover(old, FAILOVER_PATIENCE)
    })
    .await
    .unwrap()
    .unwrap_or_else(|e| panic!("{e}"))
}

fn history_file(dir: &Path, process: u32) -> PathBuf {
    dir.join(format!("history-{process}.jsonl"))
}

/// What one failover run saw.
struct Run {
    history: History,
    /// What each child wrote to its stdout and stderr.
    outputs: Vec<String>,
    /// When the primary was killed.
    killed: MonoTime,
    /// When every sentinel named the promoted replica.
    failed_over: MonoTime,
}

/// Four processes contend on one key through the Sentinel URL; a second into the run the
/// primary is killed. With `min_replicas`, the old primary is started again once the
/// sentinels promoted the replica, so that the new primary gets a replica to confirm its
/// writes (the sentinels make it one).
fn contend_through_a_failover(min_replicas: u32) -> Run {
    let topology = SentinelTopology::start()
        .expect("a private Sentinel topology (apt-get install redis-sentinel)");
    let url = format!("{}?{}", topology.url(), options(min_replicas));
    let dir = tempfile::tempdir().unwrap();
    let mut children: Vec<_> = (0..PROCESSES)
        .map(|i| {
            ChildTest::new("sentinel_contender_process", "contender")
                .env("SENTINEL_URL", &url)
                .env("HISTORY_DIR", dir.path())
                .env("HISTORY_PROCESS", i.to_string())
                .spawn()
                .expect("spawn a child process")
        })
        .collect();
    for i in 0..PROCESSES {
        let ready = dir.path().join(format!("ready-{i}"));
        if let Err(e) = process::wait_for_file(&ready, CHILD_TIMEOUT) {
            panic!("{e}; child output:\n{}", children[i as usize].output());
        }
    }
    std::fs::write(dir.path().join("go"), "").unwrap();
    std::thread::sleep(Duration::from_secs(1));
    let old = topology.primary_port().unwrap();
    topology.kill(old).unwrap();
    let killed = MonoTime::now();
    let new = topology
        .wait_for_failover(old, FAILOVER_PATIENCE)
        .unwrap_or_else(|e| panic!("{e}"));
    let failed_over = MonoTime::now();
    assert_ne!(new, old);
    if min_replicas > 0 {
        topology.restart(old).unwrap();
        topology
            .server(old)
            .unwrap()
            .wait_replicating(FAILOVER_PATIENCE)
            .unwrap_or_else(|e| panic!("the old primary did not become a replica: {e}"));
    }
    std::thread::sleep(AFTER_FAILOVER);
    std::fs::write(dir.path().join("stop"), "").unwrap();
    for child in &mut children {
        child
            .wait_success(CHILD_TIMEOUT)
            .unwrap_or_else(|e| panic!("{e}"));
    }
    let history = History::merge(
        (0..PROCESSES)
            .map(|i| History::read_jsonl(history_file(dir.path(), i)).expect("a child's history")),
    );
    baton_testkit::jepsen::export_this_test(&history);
    Run {
        history,
        outputs: children.iter().map(|c| c.output()).collect(),
        killed,
        failed_over,
    }
}

/// Every process was granted the key after the failover, and the first grant after the
/// kill came within the failover time plus one connect timeout (and a response timeout for
/// the request that found the new primary).
fn assert_clients_continued(run: &Run) {
    let grants = run.history.grants();
    let before = grants.iter().filter(|g| g.acquired < run.killed).count();
    assert!(before > 0, "no grant before the kill");
    let resumed = grants
        .iter()
        .filter(|g| g.acquired > run.killed)
        .map(|g| g.acquired)
        .min()
        .expect("no grant after the kill");
    let bound = run.failed_over + CONNECT_TIMEOUT + RESPONSE_TIMEOUT;
    assert!(
        resumed <= bound,
        "the first grant after the kill came {:?} after the failover",
        resumed.saturating_since(run.failed_over)
    );
    // Each process runs one contender, whose id is the process's index.
    for process in 0..PROCESSES {
        assert!(
            grants
                .iter()
                .any(|g| g.contender == process && g.acquired > run.failed_over),
            "process {process} was not granted the key after the failover; its output:\n{}",
            run.outputs[process as usize]
        );
    }
}

#[test]
fn a_killed_primary_is_followed_and_fences_increase_across_the_failover() {
    let run = contend_through_a_failover(0);
    // Without min_replicas a grant the replica had not received is lost with the primary,
    // and its holder may overlap the next: only the fences are promised.
    check::assert_clean(&check::fences_increase(&run.history));
    check::assert_clean(&check::well_formed(&run.history));
    assert_clients_continued(&run);
}

#[test]
fn with_min_replicas_no_two_holders_overlap_across_the_failover() {
    let run = contend_through_a_failover(1);
    check::assert_clean(&check::all(&run.history));
    let grants = run.history.grants();
    assert!(
        grants.iter().any(|g| g.acquired > run.failed_over),
        "no grant after the failover"
    );
}

#[test]
#[ignore = "a child process of the failover tests"]
fn sentinel_contender_process() {
    if process::role().is_none() {
        return;
    }
    let url = process::parent_env("SENTINEL_URL");
    let dir = PathBuf::from(process::parent_env("HISTORY_DIR"));
    let index: u32 = process::parent_env("HISTORY_PROCESS")
        .parse()
        .expect("HISTORY_PROCESS is a number");
    process::child_runtime().block_on(async {
        let store = RedisStore::connect(&url)
            .await
            .unwrap_or_else(|e| panic!("open {url}: {e}"));
        let locks = Locks::new(Arc::new(store));
        let recorder = Recorder::for_this_process();
        let register = Arc::new(FencedRegister::file("counter", dir.join("register.json")));
        std::fs::write(dir.join(format!("ready-{index}")), "").unwrap();
        process::wait_until_async("the parent's go", CHILD_TIMEOUT, || dir.join("go").exists())
            .await
            .unwrap();
        let mut grants = 0;
        while !dir.join("stop").exists() {
            let report = LockWorkload::new(KEY)
                .contenders(1, index)
                .rounds(ROUNDS)
                .ttl(Duration::from_secs(3))
                .wait(Duration::from_secs(60))
                .hold(Duration::from_millis(10), Duration::from_millis(5))
                .run(&locks, &recorder, &register)
                .await;
            grants += report.grants;
            if let Some(last) = report.errors.last() {
                eprintln!("{} acquires failed; the last: {last}", report.errors.len());
                // No primary yet: acquires fail at once; look again shortly.
                sleep(Duration::from_millis(20)).await;
            }
        }
        recorder
            .write_jsonl(history_file(&dir, index))
            .expect("write the history");
        assert!(grants > 0, "never granted");
    });
}

/// A keep-alive and a broadcast subscription opened before the failover carry on against
/// the new primary; a waiter queued before it is granted after it; the store says it moved.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_alives_waiters_and_subscriptions_carry_on_after_the_failover() {
    let events = common::Events::capture();
    let topology = topology().await;
    let url = format!("{}?{}", topology.url(), options(0));
    let a = Arc::new(RedisStore::connect(&url).await.unwrap());
    let b = Arc::new(RedisStore::connect(&url).await.unwrap());
    let locks_a = Locks::new(a.clone());
    let locks_b = Locks::new(b.clone());
    // The kept grant outlives the slowest failover seen on a loaded machine (a sentinel
    // election that fails is retried only after failover-timeout), so that the keep-alive,
    // not the clock, decides whether it survives.
    let ttl = Duration::from_secs(20);
    let guard = locks_a
        .acquire(
            "kept",
            &LockOptions::new(ttl).keep_alive(Duration::from_secs(1)),
        )
        .await
        .unwrap();
    let short = locks_a
        .acquire("waited-for", &LockOptions::new(Duration::from_secs(2)))
        .await
        .unwrap();
    // A waiter rides out the failover in one acquire: its claims fail while the primary is
    // gone, and it is granted on the new one within its wait.
    let waiter = tokio::spawn(async move {
        let options = LockOptions::new(Duration::from_secs(3)).wait(Duration::from_secs(60));
        locks_b
            .acquire("waited-for", &options)
            .await
            .expect("one acquire carried on through the failover")
    });
    let broadcast_a = Broadcast::new(a.clone());
    let broadcast_b = Broadcast::new(b.clone());
    let mut sub = broadcast_a.subscribe::<u32>("news").await.unwrap();
    broadcast_b.publish("news", &1u32).await.unwrap();
    assert!(matches!(
        timeout(Duration::from_secs(10), sub.next()).await.unwrap(),
        Some(Event::Message(m)) if m.payload == 1
    ));
    sleep(Duration::from_millis(200)).await;

    let old = topology.primary_port().unwrap();
    // The grants are on the replica before the primary dies.
    assert_eq!(
        topology
            .server(old)
            .unwrap()
            .wait_for_replicas(1, Duration::from_secs(3))
            .unwrap(),
        1
    );
    let new = fail_over(&topology, old).await;

    // The waiter is granted once the grant it waited for expires on the new primary (its
    // holder's release went to the dead one).
    drop(short);
    let waited = timeout(Duration::from_secs(60), waiter)
        .await
        .expect("the waiter was granted")
        .unwrap();
    assert!(waited.fence() > guard.fence());
    // The keep-alive renewed on the new primary: the grant is still this holder's there,
    // and its remaining time went up between two looks (only a renewal raises it).
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut before: Option<(Duration, Instant)> = None;
    loop {
        let info = a
            .inspect(
                &Namespace::new("baton")
                    .unwrap()
                    .qualify(KeyKind::Lock, &Key::new("kept").unwrap()),
            )
            .await;
        match info {
            Ok(Some(info)) => {
                assert_eq!(info.fence, guard.fence());
                let now = Instant::now();
                if let Some((remaining, at)) = before {
                    // Without a renewal it would be `remaining - (now - at)` or less.
                    if info.remaining + (now - at) > remaining + Duration::from_millis(300) {
                        break;
                    }
                }
                before = Some((info.remaining, now));
            }
            Ok(None) => panic!(
                "the kept grant is gone from the new primary (lost: {})",
                guard.is_lost()
            ),
            Err(_) => {}
        }
        assert!(
            Instant::now() < deadline,
            "the keep-alive did not renew on the new primary (lost: {})",
            guard.is_lost()
        );
        sleep(Duration::from_millis(100)).await;
    }
    assert!(
        !guard.is_lost(),
        "the keep-alive fired lost() though the grant survived"
    );

    // The subscription resumed on the new primary.
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut n = 2u32;
    'delivered: loop {
        assert!(Instant::now() < deadline, "the subscription never resumed");
        let _ = broadcast_b.publish("news", &n).await;
        n += 1;
        while let Ok(Some(event)) = timeout(Duration::from_millis(200), sub.next()).await {
            if matches!(event, Event::Message(m) if m.payload >= 2) {
                break 'delivered;
            }
        }
    }
    let moved = format!("to 127.0.0.1:{new}");
    assert!(
        events
            .all()
            .iter()
            .any(|(k, m)| k == events::REDIS_PRIMARY_CHANGED.key && m.contains(&moved)),
        "{:?}",
        events.all()
    );
    guard.release().await;
    waited.release().await;
}

/// `SCRIPT FLUSH` and `CLIENT KILL` on the new primary are survived as on a single server:
/// the scripts are loaded again, and a killed connection is replaced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn script_flush_and_client_kill_on_the_new_primary_are_survived() {
    let topology = topology().await;
    let url = format!("{}?{}", topology.url(), options(0));
    let store = RedisStore::connect(&url).await.unwrap();
    let key = Namespace::new("t")
        .unwrap()
        .qualify(KeyKind::Lock, &Key::new("flushed").unwrap());
    let ttl = Ttl::new(Duration::from_secs(10)).unwrap();
    let old = topology.primary_port().unwrap();
    let new = fail_over(&topology, old).await;
    let primary = topology.server(new).unwrap();

    let holder = Holder::random();
    let (claim, _) = until_ok(|| store.claim(&key, LeaseRequest::new(&holder, ttl))).await;
    assert!(matches!(claim, Claim::Granted { .. }), "{claim:?}");
    store.release(&key, &holder).await.unwrap();

    primary.command_ok(&["SCRIPT", "FLUSH"]).unwrap();
    let holder = Holder::random();
    assert!(matches!(
        store
            .claim(&key, LeaseRequest::new(&holder, ttl))
            .await
            .unwrap(),
        Claim::Granted { .. }
    ));
    store.release(&key, &holder).await.unwrap();

    primary
        .command_ok(&["CLIENT", "KILL", "TYPE", "normal"])
        .unwrap();
    let holder = Holder::random();
    let (claim, failures) = until_ok(|| store.claim(&key, LeaseRequest::new(&holder, ttl))).await;
    assert!(matches!(claim, Claim::Granted { .. }), "{claim:?}");
    assert!(failures <= 1, "{failures} calls failed after CLIENT KILL");
}

/// Calls `call` every 50 ms until it succeeds (every failure must be `Unavailable`), within
/// 30 s; answers the value and how many calls failed.
async fn until_ok<T, F, Fut>(mut call: F) -> (T, usize)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = baton_core::Result<T>>,
{
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut failures = 0;
    loop {
        match call().await {
            Ok(value) => return (value, failures),
            Err(e) => {
                assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
                assert!(Instant::now() < deadline, "no call succeeded: {e}");
                failures += 1;
                sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// A store opened with a plain URL on a replica refuses it at connect, naming the role.
#[tokio::test]
async fn a_plain_url_naming_a_replica_is_refused() {
    let topology = topology().await;
    let replica = &topology.servers()[1];
    let err = RedisStore::connect(&replica.url()).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(err.message().contains("reports itself a replica"), "{err}");
}

/// A lock granted while the replica is cut off from the primary is not on the replica; the
/// primary is killed and the sentinels promote the replica. The holder's keep-alive finds
/// the store's answer on the new primary (not the holder) at its next renewal there and
/// fires `lost()` with `baton.lock.lost`, long before the grant's `valid_until`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keep_alive_that_cannot_renew_on_the_new_primary_fires_lost() {
    let events = common::Events::capture();
    let topology = topology().await;
    let url = format!("{}?{}", topology.url(), options(0));
    let store = Arc::new(RedisStore::connect(&url).await.unwrap());
    let locks = Locks::new(store.clone());
    let old = topology.primary_port().unwrap();
    let replica = topology
        .servers()
        .iter()
        .find(|s| s.port() != old)
        .expect("a replica");
    let replica_port = replica.port();
    replica.cut_off_replication().unwrap();
    // Long enough that a lost() fired by the TTL could not be mistaken for one fired by
    // the new primary's answer.
    let ttl = Duration::from_secs(30);
    let guard = locks
        .acquire(
            "unreplicated",
            &LockOptions::new(ttl).keep_alive(Duration::from_millis(500)),
        )
        .await
        .unwrap();
    // The sentinels would point the replica back at the primary after their
    // failover-timeout; the primary is killed well before that.
    let new = fail_over(&topology, old).await;
    assert_eq!(
        new, replica_port,
        "the sentinels promoted the cut-off replica"
    );
    let failed_over = Instant::now();

    let lost = guard.lost_token();
    timeout(Duration::from_secs(20), lost.cancelled())
        .await
        .expect("lost() fired after the failover");
    let fired = Instant::now();
    assert!(
        fired + Duration::from_secs(5) < guard.valid_until(),
        "lost() fired {:?} after the failover, near the grant's valid_until: the TTL fired it, not the new primary",
        fired - failed_over
    );
    let fence = format!("fence {} lost", guard.fence());
    let lost_events: Vec<String> = events
        .all()
        .into_iter()
        .filter(|(k, m)| k == events::LOCK_LOST.key && m.contains(&fence))
        .map(|(_, m)| m)
        .collect();
    assert!(
        lost_events
            .iter()
            .any(|m| m.contains("no longer the holder")),
        "no baton.lock.lost naming the new primary's answer: {lost_events:?}"
    );
    // The new primary never had the grant: the key is free there.
    let key = Namespace::new("baton")
        .unwrap()
        .qualify(KeyKind::Lock, &Key::new("unreplicated").unwrap());
    let (info, _) = until_ok(|| store.inspect(&key)).await;
    assert!(info.is_none(), "{info:?}");
    guard.release().await;
}
