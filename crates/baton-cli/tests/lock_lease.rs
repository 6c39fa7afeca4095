//! `baton lock status|list` and `baton lease claim|renew|release|status|list`: output, JSON
//! and exit statuses.

mod common;

use common::*;

/// Starts `baton run KEY` whose COMMAND writes its fence to `fence-KEY` and runs until the
/// file `hold` is removed.
fn hold_lock(env: &Env, key: &str) -> (Running, u64) {
    env.touch("hold");
    let file = format!("fence-{}", key.replace('/', "_"));
    let script = format!(
        r#"echo "$BATON_FENCE" > {file}.tmp; mv {file}.tmp {file}; while [ -e hold ]; do sleep 0.05; done"#
    );
    let run = Running::spawn(env.baton(["run", key, "--", "sh", "-c", &script]));
    eventually("the holder to start", || !env.read(&file).is_empty());
    let fence = env.read(&file).trim().parse().expect("fence");
    (run, fence)
}

#[test]
fn lock_status_and_list_show_holder_fence_and_remaining_time() {
    let env = Env::new();
    let (a, fence_a) = hold_lock(&env, "jobs/a");
    let (b, fence_b) = hold_lock(&env, "jobs/b");
    let (other, _) = hold_lock(&env, "other");

    // Status: a table row.
    let out = env.run(["lock", "status", "jobs/a"]);
    out.assert_status(0);
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{}", out.stdout);
    assert!(lines[0].starts_with("KEY"), "{}", out.stdout);
    for column in ["HOLDER", "FENCE", "REMAINING"] {
        assert!(lines[0].contains(column), "{}", out.stdout);
    }
    let cells: Vec<&str> = lines[1].split_whitespace().collect();
    assert_eq!(cells[0], "jobs/a");
    assert_eq!(cells[2], fence_a.to_string());

    // Status: JSON.
    let status = env.lock_status("jobs/a");
    assert_eq!(status["key"], "jobs/a");
    assert_eq!(status["held"], true);
    assert_eq!(status["fence"], fence_a);
    assert_eq!(status["holder"], cells[1]);
    let remaining = status["remaining_ms"].as_u64().expect("remaining_ms");
    assert!(remaining > 0 && remaining <= 30_000, "{status}");

    // List, with and without a prefix.
    let out = env.run(["lock", "list", "--prefix", "jobs/", "--json"]);
    out.assert_status(0);
    let list = out.json();
    let mut keys: Vec<&str> = list
        .as_array()
        .expect("array")
        .iter()
        .map(|l| l["key"].as_str().unwrap())
        .collect();
    keys.sort();
    assert_eq!(keys, ["jobs/a", "jobs/b"]);
    let fences: Vec<u64> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["fence"].as_u64().unwrap())
        .collect();
    assert!(fences.contains(&fence_a) && fences.contains(&fence_b));

    let out = env.run(["lock", "list"]);
    out.assert_status(0);
    assert_eq!(out.stdout.lines().count(), 4, "{}", out.stdout);

    // Another namespace sees none of them.
    let out = env.run(["--namespace", "elsewhere", "lock", "list", "--json"]);
    assert_eq!(out.json(), serde_json::json!([]));

    std::fs::remove_file(env.path("hold")).unwrap();
    for run in [a, b, other] {
        run.finish().assert_status(0);
    }
    let out = env.run(["lock", "status", "jobs/a"]);
    out.assert_status(0);
    assert_eq!(out.stdout.trim(), "jobs/a: free");
    assert_eq!(
        env.lock_status("jobs/a"),
        serde_json::json!({"key": "jobs/a", "held": false})
    );
    let out = env.run(["lock", "list"]);
    assert_eq!(
        out.stdout.lines().count(),
        1,
        "only the header: {}",
        out.stdout
    );
}

#[test]
fn lease_claim_renew_release_and_status() {
    let env = Env::new();
    let lease = |args: &[&str]| env.run(["lease"].iter().chain(args));

    // Claim: Claimed, then HeldBy (75) for another holder, then Claimed again (idempotent)
    // for the same holder, keeping the fence.
    let out = lease(&[
        "claim", "stream-1", "--holder", "node-a", "--ttl", "1m", "--reason", "rewind",
    ]);
    out.assert_status(0);
    assert!(
        out.stdout
            .starts_with("Claimed stream-1 holder=node-a fence="),
        "{}",
        out.stdout
    );
    let out = lease(&[
        "claim", "stream-1", "--holder", "node-a", "--ttl", "1m", "--reason", "rewind", "--json",
    ]);
    out.assert_status(0);
    let claimed = out.json();
    assert_eq!(claimed["result"], "Claimed");
    assert_eq!(claimed["ttl_ms"], 60_000);
    let fence = claimed["fence"].as_u64().expect("fence");

    let out = lease(&["claim", "stream-1", "--holder", "node-b"]);
    out.assert_status(CONTENDED);
    assert!(
        out.stdout.starts_with("HeldBy stream-1 holder=node-a"),
        "{}",
        out.stdout
    );
    let out = lease(&["claim", "stream-1", "--holder", "node-b", "--json"]);
    out.assert_status(CONTENDED);
    let held = out.json();
    assert_eq!(held["result"], "HeldBy");
    assert_eq!(held["holder"], "node-a");
    assert!(held["remaining_ms"].as_u64().unwrap() > 0);

    // Status and list.
    let out = lease(&["status", "stream-1"]);
    out.assert_status(0);
    let row: Vec<&str> = out
        .stdout
        .lines()
        .nth(1)
        .unwrap()
        .split_whitespace()
        .collect();
    assert_eq!(row[0], "stream-1");
    assert_eq!(row[1], "node-a");
    assert_eq!(row[2], fence.to_string());
    assert_eq!(row[4], "rewind");
    let out = lease(&["status", "stream-1", "--json"]);
    let status = out.json();
    assert_eq!(status["held"], true);
    assert_eq!(status["holder"], "node-a");
    assert_eq!(status["fence"], fence);
    assert_eq!(status["reason"], "rewind");
    let out = lease(&["list", "--json"]);
    assert_eq!(out.json().as_array().unwrap().len(), 1);

    // Renew: Renewed for the holder, NotHolder (75) for anyone else.
    let out = lease(&["renew", "stream-1", "--holder", "node-a", "--ttl", "2m"]);
    out.assert_status(0);
    assert!(
        out.stdout.starts_with("Renewed stream-1 holder=node-a"),
        "{}",
        out.stdout
    );
    let out = lease(&["renew", "stream-1", "--holder", "node-b", "--json"]);
    out.assert_status(CONTENDED);
    assert_eq!(out.json()["result"], "NotHolder");

    // Release: Reclaimed (75) for a holder that does not own it, Removed for the owner,
    // then NoHolder (0: release is idempotent).
    let out = lease(&["release", "stream-1", "--holder", "node-b"]);
    out.assert_status(CONTENDED);
    assert!(
        out.stdout.starts_with("Reclaimed stream-1 by=node-a"),
        "{}",
        out.stdout
    );
    let out = lease(&["release", "stream-1", "--holder", "node-a", "--json"]);
    out.assert_status(0);
    assert_eq!(
        out.json(),
        serde_json::json!({"result": "Removed", "key": "stream-1", "holder": "node-a"})
    );
    let out = lease(&["release", "stream-1", "--holder", "node-a"]);
    out.assert_status(0);
    assert_eq!(out.stdout.trim(), "NoHolder stream-1");

    let out = lease(&["status", "stream-1", "--json"]);
    assert_eq!(
        out.json(),
        serde_json::json!({"key": "stream-1", "held": false})
    );
    // A renewal never revives a released lease.
    let out = lease(&["renew", "stream-1", "--holder", "node-a"]);
    out.assert_status(CONTENDED);
    assert!(out.stdout.starts_with("NotHolder"), "{}", out.stdout);

    // A new claim gets a larger fence.
    let out = lease(&["claim", "stream-1", "--holder", "node-b", "--json"]);
    out.assert_status(0);
    assert!(out.json()["fence"].as_u64().unwrap() > fence);
}

#[test]
fn lease_holder_comes_from_baton_holder() {
    let env = Env::new();
    let mut c = env.baton(["lease", "claim", "k"]);
    c.env("BATON_HOLDER", "from-env");
    let out = Running::spawn(c).finish();
    out.assert_status(0);
    assert!(out.stdout.contains("holder=from-env"), "{}", out.stdout);
}

#[test]
fn locks_and_leases_do_not_share_keys() {
    let env = Env::new();
    env.run(["lease", "claim", "same", "--holder", "h"])
        .assert_status(0);
    env.run(["run", "same", "--", "true"]).assert_status(0);
    assert_eq!(env.lock_status("same")["held"], false);
}
