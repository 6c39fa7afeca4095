//! `baton run` on the default SQLite store when the database file is deleted or replaced
//! under it: the run learns at its next renewal that its lock is gone (COMMAND is stopped,
//! status 79), and the next run gets a larger fence than the one handed out before.

mod common;

use std::path::PathBuf;

use common::{Env, LOCK_LOST, Running, eventually, sh};

fn companions(env: &Env) -> [PathBuf; 3] {
    ["baton.db", "baton.db-wal", "baton.db-shm"].map(|name| env.path(name))
}

fn fence_of(env: &Env, marker: &str) -> u64 {
    env.read(marker).trim().parse().expect("a fence")
}

/// Starts `baton run job` whose COMMAND writes its fence to `marker` and sleeps.
fn holder(env: &Env, marker: &str) -> Running {
    let script = format!("echo $BATON_FENCE > {marker}; exec sleep 60");
    let running = Running::spawn(
        env.baton(
            ["run", "--ttl", "3s", "job", "--"]
                .into_iter()
                .chain(sh(&script)),
        ),
    );
    eventually("the holder's COMMAND to start", || {
        !env.read(marker).trim().is_empty()
    });
    running
}

#[test]
fn a_run_whose_file_was_deleted_exits_79_and_fences_go_on() {
    let env = Env::new();
    // A few earlier runs, so the key's fence is not the first.
    for _ in 0..3 {
        env.run(["run", "job", "--", "true"]).assert_status(0);
    }
    let first = holder(&env, "first");
    let held = fence_of(&env, "first");
    for file in companions(&env) {
        let _ = std::fs::remove_file(file);
    }
    let finished = first.finish();
    finished.assert_status(LOCK_LOST);

    let next = env.run(["run", "job", "--", "sh", "-c", "echo $BATON_FENCE > next"]);
    next.assert_status(0);
    let after = fence_of(&env, "next");
    assert!(after > held, "fence {after} in a new file after {held}");
}

#[test]
fn a_run_whose_file_was_replaced_exits_79() {
    let env = Env::new();
    let other = Env::new();
    other.run(["run", "job", "--", "true"]).assert_status(0);
    let first = holder(&env, "first");
    for file in companions(&env) {
        let _ = std::fs::remove_file(file);
    }
    std::fs::rename(other.path("baton.db"), env.path("baton.db")).unwrap();
    first.finish().assert_status(LOCK_LOST);
}
