//! The bounded soak: every store (and the Redis Sentinel, Redis Cluster and etcd
//! topologies) for 30 seconds (etcd 60) with a fixed seed, asserting that nothing was violated, that
//! every kind of fault the store is subjected to was injected, and that every kind of
//! operation the store offers happened (locks, leases, idempotency, rate limits, semaphores,
//! reader-writer locks and elections; etcd keeps no idempotency records or rate limits). The
//! six runs take turns (about 35 to 70 s each, about four minutes in all); the full soak runs
//! by hand for as long as asked (`dev/soak.md`).
//!
//! A missing `redis-server`, `redis-cli`, PostgreSQL or `etcd` fails these tests with the
//! install hint, never skips them; so does a missing `baton` binary beside `soak` (the
//! supervisors run it: `cargo build -p baton-cli`, which `cargo test --workspace` does).

use std::path::Path;
use std::process::{Command, Output};
use std::sync::Mutex;

use baton_soak::plan::StoreKind;
use serde_json::Value;

const SEED: &str = "7";
/// How long each store runs. etcd runs longer: each of its grants is several round trips
/// (a reader-writer grant takes the gate, claims a permit and gives the gate back), so in a
/// debug build on a loaded two-core machine 30 s did not always complete five writes or
/// show two readers at once.
fn seconds(store: &str) -> &'static str {
    if store == StoreKind::Etcd.name() {
        "60"
    } else {
        "30"
    }
}

/// The runs take turns: three at once would share two cores with twelve workers.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn soak(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_soak"))
        .args(args)
        .output()
        .expect("the soak binary runs")
}

fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

fn plan_only(store: &str, seed: &str) -> String {
    let output = soak(&[
        "--store",
        store,
        "--seconds",
        seconds(store),
        "--seed",
        seed,
        "--plan-only",
    ]);
    assert!(output.status.success(), "{}", text(&output));
    String::from_utf8(output.stdout).expect("utf-8")
}

fn bounded(store: StoreKind) {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("summary.json");
    let output = soak(&[
        "--store",
        store.name(),
        "--seconds",
        seconds(store.name()),
        "--seed",
        SEED,
        "--summary-json",
        json.to_str().unwrap(),
    ]);
    let printed = text(&output);
    assert_eq!(
        output.status.code(),
        Some(0),
        "the soak of {store} failed:\n{printed}"
    );
    assert!(
        printed.starts_with(&plan_only(store.name(), SEED)),
        "the run did not print the plan --plan-only prints for the same seed:\n{printed}"
    );
    let summary = read(&json);

    assert_eq!(summary["violations"], 0, "{printed}");
    assert_eq!(summary["passed"], true, "{printed}");

    // Every kind of fault this store suffers was injected, as planned.
    let faults = summary["faults"].as_object().unwrap();
    for kind in store.fault_kinds() {
        assert!(
            faults.get(kind.name()).and_then(Value::as_u64).unwrap_or(0) >= 1,
            "no {kind} fault was injected:\n{printed}"
        );
    }
    let applied: u64 = faults.values().filter_map(Value::as_u64).sum();
    assert_eq!(
        applied,
        summary["faults_planned"].as_u64().unwrap(),
        "{printed}"
    );

    // Every kind of operation happened, and the checkers had material.
    let ok = |op: &str| -> u64 {
        summary["operations"]
            .as_array()
            .unwrap()
            .iter()
            .find(|row| row["op"] == op)
            .and_then(|row| row["ok"].as_u64())
            .unwrap_or(0)
    };
    let budgets = store.keeps_budgets();
    for (op, at_least) in [
        ("lock.acquire", 50),
        ("lock.write", 20),
        ("lock.release", 20),
        ("lease.claim", 10),
        ("lease.renew", 10),
        ("lease.write", 1),
        ("lease.release", 10),
        ("idem.acquire", 20),
        ("idem.effect", 20),
        ("idem.finalize", 20),
        ("rate.acquire", 500),
        ("sem.acquire", 50),
        ("sem.release", 20),
        ("rw.read", 20),
        ("rw.read.release", 10),
        ("rw.write", 5),
        ("rw.write.release", 5),
        ("elect.campaign", 10),
        ("elect.resign", 10),
    ] {
        if !budgets && op.starts_with("rate.") {
            // Not offered (etcd): not run, and not shown.
            assert!(
                summary["operations"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .all(|row| row["op"] != op),
                "{op} ran on {store}:\n{printed}"
            );
            continue;
        }
        assert!(
            ok(op) >= at_least,
            "only {} {op} completed, expected at least {at_least}:\n{printed}",
            ok(op)
        );
    }
    let checks = summary["checks"].as_array().unwrap();
    for checker in [
        "well-formed",
        "no-overlap",
        "fences-increase",
        "stale-fence",
        "lost-update",
        "idem-attempts",
        "idem-takeover",
        "idem-finalize",
        "idem-effects-once",
        "idem-final-state",
        "rate-limit",
        "permits-at-most",
        "permit-fences",
        "rw-writers-alone",
        "rw-writer-fence",
        "leaders-no-overlap",
        "terms-increase",
        "command-in-lock",
        "supervisor-death",
    ] {
        let offered = budgets || !checker.starts_with("rate-");
        assert_eq!(
            checks.iter().any(|c| c["checker"] == checker),
            offered,
            "checker {checker} ran: {}, expected {offered}:\n{printed}",
            !offered
        );
    }
    if budgets {
        assert!(summary["stats"]["rate units admitted"].as_u64().unwrap() > 0);
    }
    // The permits and the reads were shared, not taken one at a time.
    for shared in ["most permit holders at once", "most rw readers at once"] {
        assert!(
            summary["stats"][shared].as_u64().unwrap_or(0) >= 2,
            "{shared}: {printed}"
        );
    }
    // `baton run` took turns on the supervised lock, also after supervisors were killed.
    assert!(
        summary["stats"]["supervised COMMANDs"]
            .as_u64()
            .unwrap_or(0)
            >= 5,
        "{printed}"
    );

    // A Redis restart without persistence, a replica promoted without min_replicas and a
    // killed cluster master's replica taking over are reported as documented unsafe
    // windows; a reshard, and every fault of PostgreSQL, SQLite and etcd, opens none.
    let windows = summary["unsafe_windows"].as_array().unwrap();
    let window = |what: &str| {
        windows
            .iter()
            .any(|w| w["what"].as_str().unwrap_or("").contains(what))
    };
    match store {
        StoreKind::Redis => assert!(!windows.is_empty(), "{printed}"),
        StoreKind::RedisSentinel => assert!(window("replica promoted"), "{printed}"),
        StoreKind::RedisCluster => {
            assert!(window("cluster master killed"), "{printed}");
            assert_eq!(
                windows.len() as u64,
                faults["kill-master"].as_u64().unwrap(),
                "one window per killed master, none for a reshard:\n{printed}"
            );
        }
        StoreKind::Postgres | StoreKind::Sqlite | StoreKind::Etcd => {
            assert!(windows.is_empty(), "{printed}")
        }
    }
}

fn read(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
fn redis_bounded_soak_has_no_violation() {
    bounded(StoreKind::Redis);
}

#[test]
fn postgres_bounded_soak_has_no_violation() {
    bounded(StoreKind::Postgres);
}

#[test]
fn sqlite_bounded_soak_has_no_violation() {
    bounded(StoreKind::Sqlite);
}

/// One primary, one replica and three sentinels; the workers follow the primary through a
/// `redis+sentinel://` URL while the primary is killed and the replica promoted.
#[test]
fn redis_sentinel_bounded_soak_has_no_violation() {
    bounded(StoreKind::RedisSentinel);
}

/// Three masters and three replicas; the workers follow the slot map through a
/// `redis+cluster://` URL while the master of a contended key is killed (its replica takes
/// over) and a contended key's slot moves to another master.
#[test]
fn redis_cluster_bounded_soak_has_no_violation() {
    bounded(StoreKind::RedisCluster);
}

/// Three etcd members; the leader is killed and restarted, members are paused, and nothing
/// is excused: etcd keeps its promises through member failures.
#[test]
fn etcd_bounded_soak_has_no_violation() {
    bounded(StoreKind::Etcd);
}

#[test]
fn the_same_seed_prints_the_same_fault_schedule() {
    for store in StoreKind::ALL.map(StoreKind::name) {
        let first = plan_only(store, "42");
        assert_eq!(first, plan_only(store, "42"), "{store}");
        assert_ne!(first, plan_only(store, "43"), "{store}");
        assert!(first.contains(" faults\n  #1 "), "{first}");
    }
}

#[test]
fn a_missing_server_binary_fails_loudly_with_the_install_hint() {
    let output = Command::new(env!("CARGO_BIN_EXE_soak"))
        .args(["--store", "redis", "--seconds", "5", "--seed", "1"])
        .env("BATON_REDIS_SERVER", "/nonexistent/redis-server")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2), "{}", text(&output));
    assert!(
        text(&output).contains("apt-get install redis-server"),
        "{}",
        text(&output)
    );
}
