//! Locks on a Redis Cluster with four OS processes contending for one key while the cluster
//! changes under them: the key's slot moves between masters, live, and the key's master
//! hands over to its replica (`CLUSTER FAILOVER`). The recorded history keeps every rule (no
//! two holders, fences strictly increasing, every holder's increment landed once in the
//! fenced register), and grants were made while the change was under way.
//!
//! Each test starts a cluster of its own (three masters, three replicas on loopback). The
//! slot moves one key at a time (`RedisCluster::migrate_slot`), so the contenders meet `ASK`
//! and `TRYAGAIN` answers, which the cluster client follows and retries.

use std::sync::Arc;
use std::time::Duration;

use baton_core::{Key, KeyKind, Locks, Namespace};
use baton_redis::RedisClusterStore;
use baton_testkit::LockWorkload;
use baton_testkit::process;
use baton_testkit::redis_cluster::RedisCluster;
use baton_testkit::time::MonoTime;

const KEY: &str = "resharded";
const PROCESSES: u32 = 4;
const ROUNDS: u32 = 60;
/// How long the slot stays half moved after each key goes over.
const PER_KEY: Duration = Duration::from_millis(150);
const PATIENCE: Duration = Duration::from_secs(60);

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
    let cluster = Arc::new(RedisCluster::start().expect("a private Redis Cluster"));
    let dir = tempfile::tempdir().unwrap();
    let qualified = Namespace::default().qualify(KeyKind::Lock, &Key::new(KEY).unwrap());
    let slot = cluster
        .slot_of(&format!("{{{}}}", qualified.as_str()))
        .unwrap();
    let home = cluster.master_of_slot(slot).unwrap();
    let away = cluster
        .ports()
        .into_iter()
        .find(|&p| p != home && cluster.replica_of(p).is_ok())
        .expect("another master");

    // Once the contenders have started, the slot moves away and back.
    let go = dir.path().join("go");
    let reshard = std::thread::spawn({
        let cluster = Arc::clone(&cluster);
        move || {
            contending(&cluster, &go, slot, home);
            let started = MonoTime::now();
            let there = cluster
                .migrate_slot(slot, away, PER_KEY, PATIENCE)
                .unwrap_or_else(|e| panic!("moving slot {slot} to {away}: {e}"));
            let moved = cluster.master_of_slot(slot).unwrap();
            let back = cluster
                .migrate_slot(slot, home, PER_KEY, PATIENCE)
                .unwrap_or_else(|e| panic!("moving slot {slot} back to {home}: {e}"));
            (started, MonoTime::now(), moved, there, back)
        }
    });
    let (history, register) = LockWorkload::run_in_processes(
        "cluster_contender",
        PROCESSES,
        dir.path(),
        &[(
            "CLUSTER_URL",
            &format!("{}?response_timeout=2s", cluster.url()),
        )],
    );
    let (started, ended, moved, there, back) = reshard.join().expect("the reshard");
    assert!(
        there > 0 && back > 0,
        "the key's data moved with its slot ({there} keys there, {back} back)"
    );
    assert_eq!(moved, away, "the slot was on the other master in between");
    LockWorkload::assert_every_grant_landed(&history, &register, u64::from(PROCESSES * ROUNDS));
    let during = history
        .grants()
        .iter()
        .filter(|g| started < g.acquired && g.acquired < ended)
        .count();
    assert!(
        during > 0,
        "grants were made while the slot moved ({:?} to {:?})",
        started,
        ended
    );
    assert_eq!(cluster.master_of_slot(slot).unwrap(), home);
}

#[test]
fn four_processes_exclude_each_other_through_a_coordinated_failover_of_the_keys_master() {
    let cluster = Arc::new(RedisCluster::start().expect("a private Redis Cluster"));
    let dir = tempfile::tempdir().unwrap();
    let qualified = Namespace::default().qualify(KeyKind::Lock, &Key::new(KEY).unwrap());
    let slot = cluster
        .slot_of(&format!("{{{}}}", qualified.as_str()))
        .unwrap();
    let master = cluster.master_of_slot(slot).unwrap();
    let replica = cluster.replica_of(master).unwrap();
    let go = dir.path().join("go");
    let failover = std::thread::spawn({
        let cluster = Arc::clone(&cluster);
        move || {
            contending(&cluster, &go, slot, master);
            let started = MonoTime::now();
            cluster
                .failover(replica, PATIENCE)
                .unwrap_or_else(|e| panic!("failing {master} over to {replica}: {e}"));
            (started, cluster.master_of_slot(slot).unwrap())
        }
    });
    let (history, register) = LockWorkload::run_in_processes(
        "cluster_contender",
        PROCESSES,
        dir.path(),
        &[(
            "CLUSTER_URL",
            &format!("{}?response_timeout=2s", cluster.url()),
        )],
    );
    let (started, now) = failover.join().expect("the failover");
    assert_eq!(now, replica, "the replica serves the key's slot now");
    LockWorkload::assert_every_grant_landed(&history, &register, u64::from(PROCESSES * ROUNDS));
    let after = history
        .grants()
        .iter()
        .filter(|g| g.acquired > started)
        .count();
    assert!(after > 0, "grants were made after the failover began");
}

#[test]
#[ignore = "a child process of this file's tests"]
fn cluster_contender() {
    LockWorkload::new(KEY)
        .contenders(1, 0)
        .rounds(ROUNDS)
        .ttl(Duration::from_secs(5))
        .wait(PATIENCE)
        .hold(Duration::from_millis(10), Duration::from_millis(5))
        .run_as_child(|| async {
            let url = process::parent_env("CLUSTER_URL");
            let store = RedisClusterStore::connect(&url)
                .await
                .unwrap_or_else(|e| panic!("connect {url}: {e}"));
            Locks::new(Arc::new(store))
        });
}
