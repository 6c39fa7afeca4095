//! Faults of a three-member cluster whose members are behind fault proxies, met by three OS
//! processes contending for one lock: the leader killed (SIGKILL) and restarted, the leader
//! or a follower paused (SIGSTOP) and resumed, the leader cut off by the network and healed,
//! and the clients' own connections reset. Each merged history keeps every rule of the
//! checkers: no two holders believing they hold the lock at once, fences strictly
//! increasing, no stale fence accepted by the fenced register, every increment of it made
//! once. Then a holder paused past its lease: its grant ends on the cluster, another process
//! is granted a greater fence, and the paused holder, once resumed, is told it lost the lock
//! and its late release that the grant was not its own any more.
//!
//! Every test starts a cluster of its own and runs alone in this binary ([`ONE_AT_A_TIME`]):
//! three members, six proxies and three contender processes are a load of their own on a
//! small CI machine. Acquires that fail while a member is out are tried again by the
//! contenders (`run_as_child_through_faults`); the checkers judge the result.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use baton_core::{LockOptions, Locks, Namespace, ReleaseOutcome};
use baton_etcd::EtcdStore;
use baton_testkit::etcd::EtcdCluster;
use baton_testkit::process::{self, ChildTest};
use baton_testkit::time::MonoTime;
use baton_testkit::{FencedRegister, History, LockWorkload, Recorder, check};

const KEY: &str = "contended";
const PROCESSES: u32 = 3;
const ROUNDS: u32 = 40;
/// The lock's TTL: a release lost to a fault holds the lock up this long at most.
const TTL: Duration = Duration::from_secs(2);
/// How long a member stays paused or cut off: long enough for the two others to elect a
/// leader and grant while clients still send some requests to the missing member, each of
/// which waits out the response timeout, and a holder whose keep-alive went to that member
/// loses its lease (the TTL plus etcd's second). 5 s left a paused leader's test without a
/// grant once in a full `./scripts/test` run, where the members share two cores with the
/// other test binaries.
const OUTAGE: Duration = Duration::from_secs(8);
const PATIENCE: Duration = Duration::from_secs(60);

/// One fault test at a time in this binary.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn alone() -> MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner())
}

/// A proxied cluster of the test's own and the directory of its contender processes.
struct Contended {
    cluster: Arc<EtcdCluster>,
    dir: tempfile::TempDir,
}

/// What a contended run under a fault recorded.
struct Run {
    history: History,
    register: FencedRegister,
    /// When the fault began and ended.
    began: MonoTime,
    ended: MonoTime,
}

impl Contended {
    fn start() -> Self {
        Contended {
            cluster: Arc::new(
                EtcdCluster::start_behind_proxies().expect("a private etcd cluster behind proxies"),
            ),
            dir: tempfile::tempdir().unwrap(),
        }
    }

    /// Runs [`PROCESSES`] contender processes on the cluster (through its client proxies)
    /// and, once they contend, `fault` on it.
    fn run(&self, fault: impl FnOnce(&EtcdCluster) + Send + 'static) -> Run {
        let faulting = std::thread::spawn({
            let (cluster, go) = (Arc::clone(&self.cluster), self.dir.path().join("go"));
            move || {
                process::wait_for_file(go, PATIENCE).expect("the contenders start");
                // A few grants first, so the fault meets held and contended grants.
                std::thread::sleep(Duration::from_millis(300));
                let began = MonoTime::now();
                fault(&cluster);
                (began, MonoTime::now())
            }
        });
        let url = format!(
            "{}?connect_timeout=1s&response_timeout=1s",
            self.cluster.url()
        );
        let (history, register) = LockWorkload::run_in_processes(
            "contender",
            PROCESSES,
            self.dir.path(),
            &[("STORE_URL", &url)],
        );
        let (began, ended) = faulting.join().expect("the fault");
        Run {
            history,
            register,
            began,
            ended,
        }
    }
}

impl Run {
    /// Every rule held, every round was granted, and the contenders met the fault: an
    /// acquire was under way while it lasted.
    fn assert_every_rule(&self) {
        LockWorkload::assert_every_rule(&self.history, &self.register);
        let grants = self.history.grants();
        assert_eq!(
            grants.len(),
            (PROCESSES * ROUNDS) as usize,
            "every round was granted"
        );
        assert!(
            grants
                .iter()
                .any(|g| g.requested < self.ended && g.acquired > self.began),
            "no acquire was under way during the fault ({:?} to {:?})",
            self.began,
            self.ended
        );
    }

    /// How many grants were made while the fault lasted.
    fn granted_during(&self) -> usize {
        self.history
            .grants()
            .iter()
            .filter(|g| g.acquired > self.began && g.acquired < self.ended)
            .count()
    }
}

/// The member that leads now.
fn leader(cluster: &EtcdCluster) -> usize {
    cluster
        .wait_for_leader(PATIENCE)
        .expect("the cluster has a leader")
}

/// Runs the contenders on a cluster of the test's own through `fault`, which keeps one
/// member out for a while: every rule held, and grants went on while the member was out
/// (`what`).
fn keeps_every_rule_and_grants_while(
    what: &str,
    fault: impl FnOnce(&EtcdCluster) + Send + 'static,
) {
    let _alone = alone();
    // Kept until the end: its directory holds the register the checks read.
    let contended = Contended::start();
    let run = contended.run(fault);
    run.assert_every_rule();
    assert!(run.granted_during() > 0, "no grant while {what}");
}

/// SIGKILL of the leader while the lock is held and contended, and its restart: grants
/// go on through the two members left (failover.rs shows fences increasing across a kill of
/// each member in turn, one holder at a time).
#[test]
fn the_leader_killed_under_contention_keeps_every_rule() {
    keeps_every_rule_and_grants_while("the leader was down", |cluster| {
        let victim = leader(cluster);
        cluster.kill(victim);
        std::thread::sleep(OUTAGE);
        cluster
            .restart(victim)
            .unwrap_or_else(|e| panic!("member {victim} restarts: {e}"));
    });
}

/// SIGSTOP of the leader for longer than an election: the others elect a new one and grant
/// on; the old leader, resumed, steps down.
#[test]
fn the_leader_paused_under_contention_keeps_every_rule() {
    keeps_every_rule_and_grants_while("the leader was paused", |cluster| {
        let victim = leader(cluster);
        cluster.pause(victim).expect("SIGSTOP the leader");
        std::thread::sleep(OUTAGE);
        cluster.resume(victim).expect("SIGCONT the leader");
    });
}

/// SIGSTOP of a follower: the leader and the other follower are a quorum, and grant on.
#[test]
fn a_follower_paused_under_contention_keeps_every_rule() {
    keeps_every_rule_and_grants_while("a follower was paused", |cluster| {
        let victim = (leader(cluster) + 1) % cluster.len();
        cluster.pause(victim).expect("SIGSTOP a follower");
        std::thread::sleep(OUTAGE);
        cluster.resume(victim).expect("SIGCONT the follower");
    });
}

/// The leader cut off by the network (its client and peer proxies blackholed): the other
/// two elect a leader and grant on; healed, the old leader's late messages change nothing.
#[test]
fn the_leader_partitioned_under_contention_keeps_every_rule() {
    keeps_every_rule_and_grants_while("the leader was cut off", |cluster| {
        let victim = leader(cluster);
        cluster.partition(victim);
        std::thread::sleep(OUTAGE);
        cluster.heal(victim);
    });
}

/// The clients' own connections reset (TCP RST) on every member, again and again, under
/// contention: requests in flight fail, the clients connect again, and no rule breaks.
#[test]
fn the_clients_connections_reset_under_contention_keeps_every_rule() {
    let _alone = alone();
    let contended = Contended::start();
    let run = contended.run(|cluster| {
        for _ in 0..6 {
            for index in 0..cluster.len() {
                cluster
                    .client_proxy(index)
                    .expect("members behind proxies")
                    .kill_connections();
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    });
    run.assert_every_rule();
    let reconnected: u64 = (0..contended.cluster.len())
        .map(|i| contended.cluster.client_proxy(i).unwrap().accepted())
        .sum();
    assert!(
        reconnected > u64::from(PROCESSES) * 3,
        "the clients connected again after the resets ({reconnected} connections)"
    );
}

/// The store a contender or holder process opens, on the cluster the parent names.
async fn open_store() -> Arc<EtcdStore> {
    let url = process::parent_env("STORE_URL");
    Arc::new(
        EtcdStore::connect(&url)
            .await
            .unwrap_or_else(|e| panic!("connect {url}: {e}")),
    )
}

#[test]
#[ignore = "a child process of this file's tests"]
fn contender() {
    LockWorkload::new(KEY)
        .contenders(1, 0)
        .rounds(ROUNDS)
        .ttl(TTL)
        .wait(PATIENCE)
        .hold(Duration::from_millis(15), Duration::from_millis(5))
        .run_as_child_through_faults(|| async { Locks::new(open_store().await) });
}

/// A holder process, its lock kept alive, paused (SIGSTOP) past its TTL: the cluster ends
/// the grant (no keep-alive reaches it), this process is granted the lock with a greater
/// fence, and the holder, resumed, finds `lost()` fired, its late write to the fenced
/// register rejected, and its release answered `Expired` (the grant was not its own any
/// more), which spares the new holder. The two processes' merged history keeps every rule.
#[test]
fn a_holder_paused_past_its_lease_loses_it_to_a_greater_fence() {
    let _alone = alone();
    let cluster = EtcdCluster::start_behind_proxies().expect("a private etcd cluster");
    let dir = tempfile::tempdir().unwrap();
    let url = format!("{}?connect_timeout=1s&response_timeout=1s", cluster.url());
    let register = FencedRegister::file("resource", dir.path().join("register.json"));

    let mut holder = ChildTest::new("paused_holder", "holder")
        .env("STORE_URL", &url)
        .env("HOLDER_DIR", dir.path())
        .spawn()
        .expect("start the holder process");
    let acquired = dir.path().join("acquired");
    process::wait_for_file(&acquired, PATIENCE)
        .unwrap_or_else(|e| panic!("{e}; holder output:\n{}", holder.output()));
    let old_fence: u64 = std::fs::read_to_string(&acquired)
        .expect("the holder's fence")
        .trim()
        .parse()
        .expect("a decimal fence");

    holder.pause().expect("SIGSTOP the holder");
    let paused = MonoTime::now();
    let recorder = Recorder::for_this_process();
    let log = recorder.contender(1);
    let runtime = process::child_runtime();
    let locks = runtime.block_on(async {
        let store = Arc::new(EtcdStore::connect(&url).await.expect("connect"));
        Locks::with_namespace(store, Namespace::default())
    });
    let guard = runtime.block_on(async {
        let requested = MonoTime::now();
        let guard = locks
            .acquire(
                KEY,
                &LockOptions::new(Duration::from_secs(30)).wait(PATIENCE),
            )
            .await
            .expect("the lock once the paused holder's lease ended");
        log.acquired(&guard, requested);
        guard
    });
    let taken = MonoTime::now();
    assert!(
        guard.fence().get() > old_fence,
        "fence {} after {old_fence}",
        guard.fence()
    );
    assert!(
        taken.saturating_since(paused) >= Duration::from_millis(900),
        "taken over {:?} after the pause, before the holder's 2s lease could end",
        taken.saturating_since(paused)
    );
    assert!(log.write(&register, KEY, guard.fence(), 2).accepted);

    holder.resume().expect("SIGCONT the holder");
    std::fs::write(dir.path().join("go"), "").expect("signal the holder");
    holder
        .wait_success(PATIENCE)
        .unwrap_or_else(|e| panic!("{e}"));

    let state = register.state();
    assert_eq!(state.value, 2, "the late write landed: {state:?}");
    assert_eq!(state.rejected, 1, "{state:?}");
    let info = runtime
        .block_on(locks.inspect(KEY))
        .expect("inspect")
        .expect("the new holder still holds the lock");
    assert_eq!(info.fence, guard.fence());
    assert_eq!(
        runtime.block_on(log.release(guard)),
        ReleaseOutcome::Released
    );
    let history = History::merge([
        History::read_jsonl(dir.path().join("holder.jsonl")).expect("the holder's history"),
        recorder.history(),
    ]);
    baton_testkit::jepsen::export_this_test(&history);
    check::assert_clean(&check::all(&history));
    assert_eq!(history.grants().len(), 2);
}

/// The holder process of [`a_holder_paused_past_its_lease_loses_it_to_a_greater_fence`].
#[test]
#[ignore = "a child process of a_holder_paused_past_its_lease_loses_it_to_a_greater_fence"]
fn paused_holder() {
    let Some(_) = process::role() else { return };
    let dir = std::path::PathBuf::from(process::parent_env("HOLDER_DIR"));
    let register = FencedRegister::file("resource", dir.join("register.json"));
    let recorder = Recorder::for_this_process();
    let log = recorder.contender(0);
    process::child_runtime().block_on(async {
        let locks = Locks::new(open_store().await);
        // Keep-alive would hold the lock for as long as this process runs; the pause stops
        // it.
        let options = LockOptions::new(TTL).keep_alive(Duration::from_millis(400));
        let requested = MonoTime::now();
        let guard = locks.acquire(KEY, &options).await.expect("the lock");
        log.acquired(&guard, requested);
        assert!(log.write(&register, KEY, guard.fence(), 1).accepted);
        std::fs::write(dir.join("acquired"), guard.fence().get().to_string()).expect("report");

        // The parent pauses this process here, takes the lock over, resumes it and says go.
        process::wait_until_async("the parent's go", PATIENCE, || dir.join("go").exists())
            .await
            .expect("the parent's go");
        tokio::time::timeout(Duration::from_secs(10), guard.lost())
            .await
            .expect("lost() fires once the holder runs again");
        assert!(guard.is_lost());
        let late = log.write(&register, KEY, guard.fence(), 3);
        assert!(!late.accepted, "a stale write was accepted: {late:?}");
        assert_eq!(log.release(guard).await, ReleaseOutcome::Expired);
    });
    recorder
        .write_jsonl(dir.join("holder.jsonl"))
        .expect("write the history");
    println!("holder: lost, late write rejected, release Expired");
}

/// A lock of one second kept alive every 200ms while every round trip to the cluster takes
/// 200ms (100ms of latency each way at the client proxies), as on a loaded machine or a
/// distant cluster: each renewal must be answered within the time its grant has left, so it
/// may cost about two round trips, and the lock is held throughout. (A renewal that cost a
/// read, a new keep-alive stream and another read lost such a lock within a second.)
#[test]
fn keep_alive_holds_a_one_second_lock_across_slow_round_trips() {
    let _alone = alone();
    let cluster = EtcdCluster::start_behind_proxies().expect("a private etcd cluster");
    let url = format!("{}?connect_timeout=2s&response_timeout=2s", cluster.url());
    process::child_runtime().block_on(async {
        let locks = Locks::new(Arc::new(EtcdStore::connect(&url).await.expect("connect")));
        for index in 0..cluster.len() {
            cluster
                .client_proxy(index)
                .expect("members behind proxies")
                .set_latency(Duration::from_millis(100));
        }
        let options =
            LockOptions::new(Duration::from_secs(1)).keep_alive(Duration::from_millis(200));
        let guard = locks.acquire(KEY, &options).await.expect("the lock");
        let first_deadline = guard.valid_until();
        tokio::select! {
            () = guard.lost() => panic!("keep-alive lost the lock behind 200ms round trips"),
            () = tokio::time::sleep(Duration::from_secs(4)) => {}
        }
        assert!(
            guard.valid_until() > first_deadline,
            "renewals moved valid_until"
        );
        assert_eq!(guard.release().await, ReleaseOutcome::Released);
    });
}
