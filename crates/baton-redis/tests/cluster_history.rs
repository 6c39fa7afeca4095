//! Locks on a Redis Cluster with four OS processes contending for one key while the cluster
//! changes under them: the key's slot moves between masters, live, and the key's master
//! hands over to its replica (`CLUSTER FAILOVER`). The recorded history keeps every rule (no
//! two holders, fences strictly increasing, every holder's increment landed once in the
//! fenced register), and acquires were under way while the change was.
//!
//! A master killed with SIGKILL is the exception: only the fence rules hold through it,
//! unless the store is opened with `min_replicas=1`, and then every rule holds again.
//!
//! Each test starts a cluster of its own (three masters, three replicas on loopback). The
//! slot moves one key at a time (`RedisCluster::migrate_slot`), so the contenders meet `ASK`
//! and `TRYAGAIN` answers, which the cluster client follows and retries.

use std::sync::Arc;
use std::time::Duration;

use baton_core::{Key, KeyKind, Locks, Namespace};
use baton_redis::RedisClusterStore;
use baton_testkit::process;
use baton_testkit::redis_cluster::RedisCluster;
use baton_testkit::time::MonoTime;
use baton_testkit::{FencedRegister, History, LockWorkload};

const KEY: &str = "resharded";
const PROCESSES: u32 = 4;
const ROUNDS: u32 = 60;
/// How long the slot stays half moved after each key goes over.
const PER_KEY: Duration = Duration::from_millis(150);
const PATIENCE: Duration = Duration::from_secs(60);

/// A cluster of the test's own, contended for `KEY` by [`PROCESSES`] processes while a change
/// is made to it.
struct Contended {
    cluster: Arc<RedisCluster>,
    dir: tempfile::TempDir,
    /// The slot of `KEY`'s grant, and the master that served it at the start.
    slot: u16,
    master: u16,
}

impl Contended {
    fn start() -> Self {
        let cluster = Arc::new(RedisCluster::start().expect("a private Redis Cluster"));
        let qualified = Namespace::default().qualify(KeyKind::Lock, &Key::new(KEY).unwrap());
        let slot = cluster
            .slot_of(&format!("{{{}}}", qualified.as_str()))
            .unwrap();
        let master = cluster.master_of_slot(slot).unwrap();
        Contended {
            cluster,
            dir: tempfile::tempdir().unwrap(),
            slot,
            master,
        }
    }

    /// Runs the contender processes (`child`, the store URL's options `options`) and, once
    /// they contend, `change` on the cluster; answers their history and register, when the
    /// change began, and what it answered.
    fn run<T: Send + 'static>(
        &self,
        child: &str,
        options: &str,
        change: impl FnOnce(&RedisCluster) -> T + Send + 'static,
    ) -> (History, FencedRegister, MonoTime, T) {
        let changing = std::thread::spawn({
            let (cluster, go) = (Arc::clone(&self.cluster), self.dir.path().join("go"));
            let (slot, master) = (self.slot, self.master);
            move || {
                contending(&cluster, &go, slot, master);
                let began = MonoTime::now();
                (began, change(&cluster))
            }
        });
        let url = format!("{}?{options}", self.cluster.url());
        let (history, register) = LockWorkload::run_in_processes(
            child,
            PROCESSES,
            self.dir.path(),
            &[("CLUSTER_URL", &url)],
        );
        let (began, changed) = changing.join().expect("the change to the cluster");
        (history, register, began, changed)
    }
}

/// Waits until the contenders have started (`go`) and the key has data on its master
/// (`CLUSTER COUNTKEYSINSLOT`), then a little longer, so that the change meets contention.
fn contending(cluster: &RedisCluster, go: &std::path::Path, slot: u16, master: u16) {
    process::wait_for_file(go, PATIENCE).expect("the contenders start");
    let node = cluster.node(master).expect("the key's master");
    process::wait_until("the key's data on its master", PATIENCE, || {
        node.command_ok(&["CLUSTER", "COUNTKEYSINSLOT", &slot.to_string()])
            .ok()
            .and_then(|r| r.as_integer())
            .is_some_and(|n| n > 0)
    })
    .expect("the contenders claim the key");
    std::thread::sleep(Duration::from_millis(100));
}

#[test]
fn four_processes_exclude_each_other_while_the_keys_slot_moves_and_moves_back() {
    let contended = Contended::start();
    let (slot, home) = (contended.slot, contended.master);
    let away = contended
        .cluster
        .ports()
        .into_iter()
        .find(|&p| p != home && contended.cluster.replica_of(p).is_ok())
        .expect("another master");
    // Once the contenders contend, the slot moves away and back.
    let (history, register, started, (ended, moved, there, back)) =
        contended.run("cluster_contender", "response_timeout=2s", move |cluster| {
            let there = cluster
                .migrate_slot(slot, away, PER_KEY, PATIENCE)
                .unwrap_or_else(|e| panic!("moving slot {slot} to {away}: {e}"));
            let moved = cluster.master_of_slot(slot).unwrap();
            let back = cluster
                .migrate_slot(slot, home, PER_KEY, PATIENCE)
                .unwrap_or_else(|e| panic!("moving slot {slot} back to {home}: {e}"));
            (MonoTime::now(), moved, there, back)
        });
    assert!(
        there > 0 && back > 0,
        "the key's data moved with its slot ({there} keys there, {back} back)"
    );
    assert_eq!(moved, away, "the slot was on the other master in between");
    LockWorkload::assert_every_grant_landed(&history, &register, u64::from(PROCESSES * ROUNDS));
    // Contention went on through the move: acquires were under way while the slot moved,
    // and grants came after it.
    let grants = history.grants();
    assert!(
        grants
            .iter()
            .any(|g| g.requested < ended && g.acquired > started),
        "acquires were under way while the slot moved ({started:?} to {ended:?})"
    );
    assert!(
        grants.iter().any(|g| g.acquired > ended),
        "grants came after the slot moved back"
    );
    assert_eq!(contended.cluster.master_of_slot(slot).unwrap(), home);
}

#[test]
fn four_processes_exclude_each_other_through_a_coordinated_failover_of_the_keys_master() {
    let contended = Contended::start();
    let (slot, master) = (contended.slot, contended.master);
    let replica = contended.cluster.replica_of(master).unwrap();
    let (history, register, started, now) =
        contended.run("cluster_contender", "response_timeout=2s", move |cluster| {
            cluster
                .failover(replica, PATIENCE)
                .unwrap_or_else(|e| panic!("failing {master} over to {replica}: {e}"));
            cluster.master_of_slot(slot).unwrap()
        });
    assert_eq!(now, replica, "the replica serves the key's slot now");
    LockWorkload::assert_every_grant_landed(&history, &register, u64::from(PROCESSES * ROUNDS));
    let after = history
        .grants()
        .iter()
        .filter(|g| g.acquired > started)
        .count();
    assert!(after > 0, "grants were made after the failover began");
}

/// A master killed with SIGKILL loses the grants its replica had not received, and their
/// keys can be granted again beside the old holders (documented): so without `min_replicas`
/// only the fence rules are checked here, never the exclusion.
#[test]
fn fences_keep_increasing_when_the_keys_master_is_killed_under_four_processes() {
    let (history, killed) = kill_the_keys_master("response_timeout=1s&connect_timeout=1s");
    let mut violations = baton_testkit::check::well_formed(&history);
    violations.extend(baton_testkit::check::fences_increase(&history));
    baton_testkit::check::assert_clean(&violations);
    assert_granted_through(&history, killed);
}

/// With `min_replicas=1` a grant is acknowledged only once the master's replica has it, so
/// the replica that takes over from a SIGKILLed master knows every grant a holder was told
/// of: every rule holds, exclusion too.
#[test]
fn with_min_replicas_four_processes_exclude_each_other_when_the_keys_master_is_killed() {
    let (history, killed) =
        kill_the_keys_master("min_replicas=1&response_timeout=1s&connect_timeout=1s");
    baton_testkit::check::assert_clean(&baton_testkit::check::all(&history));
    assert_granted_through(&history, killed);
}

/// Kills the key's master with SIGKILL while [`PROCESSES`] processes contend with the store
/// URL's `options`, waits for its replica to take over, and restarts it; answers the history
/// and when the kill began.
fn kill_the_keys_master(options: &str) -> (History, MonoTime) {
    let contended = Contended::start();
    let (slot, master) = (contended.slot, contended.master);
    let replica = contended.cluster.replica_of(master).unwrap();
    let (history, _, killed, now) = contended.run(
        "cluster_contender_through_faults",
        options,
        move |cluster| {
            cluster.kill(master).unwrap();
            cluster
                .wait_healthy(PATIENCE)
                .unwrap_or_else(|e| panic!("the replica of {master} takes over: {e}"));
            let now = cluster.master_of_slot(slot).unwrap();
            // Restarted, the old master rejoins as the new one's replica, which confirms
            // writes again (with `min_replicas=1` nothing is granted until then).
            cluster.restart(master).unwrap();
            cluster
                .wait_healthy(PATIENCE)
                .unwrap_or_else(|e| panic!("{master} rejoins as a replica: {e}"));
            now
        },
    );
    assert_eq!(now, replica, "the replica serves the key's slot now");
    (history, killed)
}

/// Every round was granted, some after `killed`.
fn assert_granted_through(history: &History, killed: MonoTime) {
    assert_eq!(
        history.grants().len(),
        (PROCESSES * ROUNDS) as usize,
        "every round was granted"
    );
    assert!(
        history.grants().iter().any(|g| g.acquired > killed),
        "grants were made after the kill"
    );
}

/// What each contender process does: one contender, [`ROUNDS`] grants.
fn workload() -> LockWorkload {
    LockWorkload::new(KEY)
        .contenders(1, 0)
        .rounds(ROUNDS)
        .ttl(Duration::from_secs(5))
        .wait(PATIENCE)
        .hold(Duration::from_millis(10), Duration::from_millis(5))
}

/// The contender's locks, on the cluster the parent names.
async fn open() -> Locks {
    let url = process::parent_env("CLUSTER_URL");
    let store = RedisClusterStore::connect(&url)
        .await
        .unwrap_or_else(|e| panic!("connect {url}: {e}"));
    Locks::new(Arc::new(store))
}

#[test]
#[ignore = "a child process of this file's tests"]
fn cluster_contender() {
    workload().run_as_child(open);
}

#[test]
#[ignore = "a child process of this file's tests"]
fn cluster_contender_through_faults() {
    workload().run_as_child_through_faults(open);
}
