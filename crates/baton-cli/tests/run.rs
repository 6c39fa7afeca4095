//! `baton run` against a real SQLite file shared by several `baton` processes: exclusion,
//! COMMAND's environment and status, contention, lost locks and signals.

mod common;

use common::*;
use nix::sys::signal::{Signal, killpg};
use std::os::unix::process::CommandExt;

/// The lines of `events` whose first word is `word`.
fn lines_starting(text: &str, word: &str) -> Vec<String> {
    text.lines()
        .filter(|line| line.split_whitespace().next() == Some(word))
        .map(str::to_owned)
        .collect()
}

/// The fence in a line `word FENCE`.
fn fence_of(line: &str) -> u64 {
    line.split_whitespace()
        .nth(1)
        .and_then(|f| f.parse().ok())
        .unwrap_or_else(|| panic!("no fence in {line:?}"))
}

#[test]
fn runs_on_one_sqlite_file_exclude_each_other() {
    let env = Env::new();
    let script = r#"echo "start $BATON_FENCE $$" >> events; sleep 0.2; echo "end $BATON_FENCE $$" >> events"#;
    let runs: Vec<Running> = (0..6)
        .map(|_| {
            Running::spawn(
                env.baton(
                    ["run", "--wait", "2m", "--ttl", "10s", "shared-job", "--"]
                        .into_iter()
                        .chain(sh(script)),
                ),
            )
        })
        .collect();
    for run in runs {
        run.finish().assert_status(0);
    }
    let events = env.read("events");
    let lines: Vec<&str> = events.lines().collect();
    assert_eq!(lines.len(), 12, "every run wrote start and end:\n{events}");
    let mut last_fence = 0;
    for pair in lines.chunks(2) {
        let start: Vec<&str> = pair[0].split_whitespace().collect();
        let end: Vec<&str> = pair[1].split_whitespace().collect();
        assert_eq!(start[0], "start", "runs overlapped:\n{events}");
        assert_eq!(end[0], "end", "runs overlapped:\n{events}");
        assert_eq!(start[1..], end[1..], "runs overlapped:\n{events}");
        let fence: u64 = start[1].parse().expect("fence");
        assert!(
            fence > last_fence,
            "fences did not strictly increase:\n{events}"
        );
        last_fence = fence;
    }
}

#[test]
fn command_gets_the_key_and_the_fence() {
    let env = Env::new();
    let key = "reports: nightly/eu";
    let script = r#"printf '%s\n%s\n' "$BATON_KEY" "$BATON_FENCE" >> seen"#;
    for _ in 0..2 {
        env.run(["run", key, "--"].into_iter().chain(sh(script)))
            .assert_status(0);
    }
    let seen = env.read("seen");
    let lines: Vec<&str> = seen.lines().collect();
    assert_eq!(lines.len(), 4, "{seen}");
    assert_eq!(lines[0], key);
    assert_eq!(lines[2], key);
    let first: u64 = lines[1].parse().expect("BATON_FENCE is decimal");
    let second: u64 = lines[3].parse().expect("BATON_FENCE is decimal");
    assert!(first > 0 && second > first, "{seen}");
}

#[test]
fn command_status_passes_through_and_the_lock_is_released() {
    let env = Env::new();
    for (script, expected) in [
        ("exit 0", 0),
        ("exit 3", 3),
        ("exit 255", 255),
        // Killed by a signal: 128 + the signal, as shells report it.
        ("kill -TERM $$", 128 + 15),
        ("kill -KILL $$", 128 + 9),
    ] {
        // Each run would exit 75 if the previous one had left the lock held.
        let out = env.run(["run", "job", "--"].into_iter().chain(sh(script)));
        out.assert_status(expected);
    }
    assert_eq!(env.lock_status("job")["held"], false);
}

#[test]
fn command_that_cannot_be_spawned_exits_like_a_shell() {
    let env = Env::new();
    let out = env.run(["run", "job", "--", "./no-such-command", "arg"]);
    out.assert_status(NOT_FOUND);
    assert!(out.stderr.contains("no-such-command"), "{}", out.stderr);

    env.touch("not-executable");
    let out = env.run(["run", "job", "--", "./not-executable"]);
    out.assert_status(CANNOT_EXECUTE);

    assert_eq!(env.lock_status("job")["held"], false);
}

/// Starts `baton run KEY` whose COMMAND appends `started FENCE` to `events` and runs until
/// the file `hold` is removed; returns once it is running.
fn start_holder(env: &Env, key: &str, extra: &[&str]) -> (Running, u64) {
    env.touch("hold");
    let script = r#"trap 'echo term >> events; exit 0' TERM
trap 'echo int >> events' INT
echo "started $BATON_FENCE" >> events
while [ -e hold ]; do sleep 0.05; done
echo finished >> events"#;
    let holder = Running::spawn(
        env.baton(
            ["run"]
                .iter()
                .chain(extra)
                .chain(&[key, "--"])
                .copied()
                .chain(sh(script)),
        ),
    );
    eventually("the holder's COMMAND to start", || {
        env.read("events").contains("started")
    });
    let fence = fence_of(&lines_starting(&env.read("events"), "started")[0]);
    (holder, fence)
}

#[test]
fn a_held_lock_exits_75_naming_the_holder() {
    let env = Env::new();
    let (holder, fence) = start_holder(&env, "job", &[]);
    let status = env.lock_status("job");
    assert_eq!(status["held"], true);
    assert_eq!(status["fence"], fence);
    let holder_id = status["holder"].as_str().expect("holder").to_owned();

    for wait in ["0s", "300ms"] {
        let out = env.run(["run", "--wait", wait, "job", "--", "touch", "ran"]);
        out.assert_status(CONTENDED);
        assert!(out.stderr.contains(&holder_id), "{}", out.stderr);
        assert_eq!(out.stderr.lines().count(), 1, "{}", out.stderr);
        assert!(!env.path("ran").exists(), "COMMAND ran without the lock");
    }

    // A waiter gets the lock once the holder is done.
    let waiter = Running::spawn(env.baton(["run", "--wait", "2m", "job", "--", "touch", "ran"]));
    std::fs::remove_file(env.path("hold")).unwrap();
    holder.finish().assert_status(0);
    waiter.finish().assert_status(0);
    assert!(env.path("ran").exists());
}

#[test]
fn a_waiting_run_can_be_interrupted() {
    let env = Env::new();
    let (holder, _) = start_holder(&env, "job", &[]);
    let waiter = Running::spawn(env.baton(["run", "--wait", "10m", "job", "--", "touch", "ran"]));
    // Give it a moment to install its handlers; a signal before that ends it the default
    // way, which this test also accepts: what matters is that COMMAND did not run.
    std::thread::sleep(std::time::Duration::from_millis(500));
    waiter.signal(Signal::SIGTERM);
    let out = waiter.finish();
    assert!(
        out.code() == Some(128 + 15) || out.status.code().is_none(),
        "{out:?}"
    );
    assert!(!env.path("ran").exists());
    std::fs::remove_file(env.path("hold")).unwrap();
    holder.finish().assert_status(0);
}

/// Loses the lock of a running `baton run --on-lost POLICY`: stops baton (not COMMAND) past
/// its TTL, lets another run take and release the lock, and resumes it; the stopped run must
/// exit 79. Returns the stopped run's result, the events COMMAND wrote, and the fences of
/// both runs.
#[track_caller]
fn lose_the_lock(on_lost: &str) -> (Finished, String, u64, u64) {
    let env = &Env::new();
    let (holder, fence) = start_holder(
        env,
        "job",
        &["--ttl", "3s", "--grace", "1m", "--on-lost", on_lost],
    );
    holder.signal(Signal::SIGSTOP);
    eventually("the stopped holder's lock to expire", || {
        env.lock_status("job")["held"] == false
    });
    let taker = env.run(
        ["run", "job", "--"]
            .into_iter()
            .chain(sh(r#"echo "taker $BATON_FENCE" >> events"#)),
    );
    taker.assert_status(0);
    holder.signal(Signal::SIGCONT);
    if on_lost == "ignore" {
        eventually("baton to notice the lost lock", || {
            holder.stderr().contains("lost the lock")
        });
        std::fs::remove_file(env.path("hold")).unwrap();
    }
    let out = holder.finish();
    out.assert_status(LOCK_LOST);
    let events = env.read("events");
    let taker_fence = fence_of(&lines_starting(&events, "taker")[0]);
    (out, events, fence, taker_fence)
}

#[test]
fn a_lost_lock_terminates_command_and_exits_79() {
    let (out, events, fence, taker_fence) = lose_the_lock("term");
    assert!(out.stderr.contains("lost the lock"), "{}", out.stderr);
    assert!(events.contains("term"), "COMMAND got no SIGTERM:\n{events}");
    assert!(!events.contains("finished"), "{events}");
    assert!(taker_fence > fence, "{events}");
}

#[test]
fn on_lost_kill_kills_command_at_once() {
    let (_, events, _, _) = lose_the_lock("kill");
    assert!(!events.contains("term"), "COMMAND got SIGTERM:\n{events}");
    assert!(!events.contains("finished"), "{events}");
}

#[test]
fn on_lost_ignore_lets_command_finish_and_still_exits_79() {
    let (_, events, _, _) = lose_the_lock("ignore");
    assert!(!events.contains("term"), "COMMAND got SIGTERM:\n{events}");
    assert!(events.contains("finished"), "{events}");
}

#[test]
fn sigterm_is_forwarded_and_the_lock_released_after_command_exits() {
    let env = Env::new();
    env.touch("hold");
    let script = r#"trap 'echo term >> events; while [ -e hold ]; do sleep 0.05; done; exit 7' TERM
echo "started $BATON_FENCE" >> events
while :; do sleep 0.05; done"#;
    let holder = Running::spawn(env.baton(["run", "job", "--"].into_iter().chain(sh(script))));
    eventually("COMMAND to start", || {
        env.read("events").contains("started")
    });
    holder.signal(Signal::SIGTERM);
    eventually("COMMAND to get SIGTERM", || {
        env.read("events").contains("term")
    });
    // COMMAND is still cleaning up: the lock is still held.
    assert_eq!(env.lock_status("job")["held"], true);
    std::fs::remove_file(env.path("hold")).unwrap();
    let out = holder.finish();
    out.assert_status(7);
    assert_eq!(lines_starting(&env.read("events"), "term").len(), 1);
    assert_eq!(env.lock_status("job")["held"], false);
}

#[test]
fn ctrl_c_reaches_command_exactly_once() {
    let env = Env::new();
    env.touch("hold");
    let script = r#"trap 'echo int >> events; rm -f hold' INT
echo "started $BATON_FENCE" >> events
while [ -e hold ]; do sleep 0.05; done
exit 5"#;
    // A terminal's Ctrl-C signals the whole foreground process group: put baton in a group
    // of its own and signal that group.
    let mut command = env.baton(["run", "job", "--"].into_iter().chain(sh(script)));
    command.process_group(0);
    let holder = Running::spawn(command);
    eventually("COMMAND to start", || {
        env.read("events").contains("started")
    });
    killpg(holder.pid(), Signal::SIGINT).expect("signal baton's group");
    let out = holder.finish();
    out.assert_status(5);
    assert_eq!(lines_starting(&env.read("events"), "int").len(), 1);
}

#[test]
fn cooldown_keeps_the_lock_after_command_ends() {
    let env = Env::new();
    // COMMAND fails: the cooldown holds whatever its status.
    let started = std::time::Instant::now();
    env.run(
        ["run", "--cooldown", "5s", "--ttl", "30s", "tick", "--"]
            .into_iter()
            .chain(sh("exit 3")),
    )
    .assert_status(3);
    // The cooldown began when COMMAND ended, before that run returned.
    let returned = std::time::Instant::now();
    let status = env.lock_status("tick");
    assert_eq!(status["held"], true, "{status}");
    // A second run of the key within the cooldown finds it held and does not run.
    let out = env.run(
        ["run", "tick", "--"]
            .into_iter()
            .chain(sh("echo ran >> ran")),
    );
    out.assert_status(CONTENDED);
    assert!(!env.path("ran").exists());
    assert!(
        started.elapsed() < std::time::Duration::from_secs(5),
        "too slow to check the cooldown"
    );
    // After the cooldown (5 s, not the 30 s TTL), the key is free.
    std::thread::sleep(std::time::Duration::from_secs(5).saturating_sub(returned.elapsed()));
    std::thread::sleep(std::time::Duration::from_millis(300));
    env.run(
        ["run", "tick", "--"]
            .into_iter()
            .chain(sh("echo ran >> ran")),
    )
    .assert_status(0);
    assert_eq!(env.read("ran"), "ran\n");
    assert_eq!(env.lock_status("tick")["held"], false);
}

#[test]
fn cooldown_is_validated_before_anything_is_opened() {
    let env = Env::new();
    for bad in ["0s", "31d", "soon"] {
        let out = env.run(["run", "--cooldown", bad, "tick", "--", "true"]);
        out.assert_status(USAGE);
        assert!(out.stderr.contains("--cooldown"), "{bad}: {}", out.stderr);
    }
    assert!(!env.path("baton.db").exists(), "no store file was created");
}

/// `baton run --permits 2`: two runs hold a permit each at once, a third exits 75 naming a
/// holder, `baton lock status` lists the permits, and a waiter runs once one is released.
#[test]
fn permits_let_n_runs_hold_at_once() {
    let env = Env::new();
    env.touch("hold");
    let script = r#"echo "started $BATON_FENCE" >> events; while [ -e hold ]; do sleep 0.05; done"#;
    let holders: Vec<Running> = (0..2)
        .map(|_| {
            Running::spawn(
                env.baton(
                    ["run", "--permits", "2", "--wait", "1m", "builds", "--"]
                        .into_iter()
                        .chain(sh(script)),
                ),
            )
        })
        .collect();
    eventually("both holders to start", || {
        lines_starting(&env.read("events"), "started").len() == 2
    });
    let fences: Vec<u64> = lines_starting(&env.read("events"), "started")
        .iter()
        .map(|line| fence_of(line))
        .collect();
    assert_ne!(fences[0], fences[1], "each permit has its own fence");

    let out = env.run(["run", "--permits", "2", "builds", "--", "touch", "ran"]);
    out.assert_status(CONTENDED);
    assert!(
        out.stderr.contains("semaphore \"builds\" (2 permits)"),
        "{}",
        out.stderr
    );
    assert!(!env.path("ran").exists(), "COMMAND ran beyond the permits");

    let status = env.run(["lock", "status", "builds", "--json"]);
    status.assert_status(0);
    let status = status.json();
    assert_eq!(status["held"], false, "no lock of that key: {status}");
    let permits = status["permits"].as_array().expect("permits");
    let mut listed: Vec<u64> = permits
        .iter()
        .map(|p| p["fence"].as_u64().unwrap())
        .collect();
    let mut expected = fences.clone();
    listed.sort_unstable();
    expected.sort_unstable();
    assert_eq!(listed, expected, "{status}");
    let table = env.run(["lock", "status", "builds"]);
    assert!(
        table.stdout.contains("semaphore builds: 2 permits held"),
        "{}",
        table.stdout
    );

    let waiter = Running::spawn(env.baton([
        "run",
        "--permits",
        "2",
        "--wait",
        "2m",
        "builds",
        "--",
        "touch",
        "ran",
    ]));
    std::fs::remove_file(env.path("hold")).unwrap();
    for holder in holders {
        holder.finish().assert_status(0);
    }
    waiter.finish().assert_status(0);
    assert!(env.path("ran").exists());
    let free = env.run(["lock", "status", "builds", "--json"]).json();
    assert!(free.get("permits").is_none(), "{free}");
}
