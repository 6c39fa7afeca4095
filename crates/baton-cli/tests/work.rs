//! Claimable work from the shell, on a private SQLite file per test: `baton queue enqueue`
//! and `baton queue stats` (output, de-duplication, statuses), invalid input (64, nothing
//! changed), `baton worker` (exactly once across processes, retries and dead letters,
//! graceful stop and release, a COMMAND that cannot run), `baton schedule list` of a
//! schedule registered through the library, and Redis refused before connecting.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use baton::work::{Missed, Tick};
use common::*;
use nix::sys::signal::Signal;

/// The numbers of a `key=value` summary line, by key.
fn summary(stdout: &str) -> BTreeMap<String, String> {
    let line = stdout
        .lines()
        .find(|l| l.starts_with("Stopped "))
        .unwrap_or_else(|| panic!("no summary line in:\n{stdout}"));
    line.split_whitespace()
        .filter_map(|word| word.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

/// `baton queue enqueue ARGS...`.
fn enqueue(env: &Env, args: &[&str]) -> Finished {
    env.run(["queue", "enqueue"].iter().chain(args))
}

/// `baton queue stats QUEUE --json`, parsed.
fn stats(env: &Env, queue: &str) -> serde_json::Value {
    let out = env.run(["queue", "stats", queue, "--json"]);
    out.assert_status(0);
    out.json()
}

#[test]
fn enqueue_deduplicates_and_stats_count() {
    let env = Env::new();
    let out = enqueue(&env, &["emails", r#"{"to":"ada@example.com"}"#]);
    out.assert_status(0);
    assert_eq!(out.stdout.trim(), "Added emails item=1");

    let out = enqueue(&env, &["emails", r#"{"to":"bob"}"#, "--dedup", "signup-42"]);
    out.assert_status(0);
    assert_eq!(out.stdout.trim(), "Added emails item=2");
    // A duplicate is a no-op that says so, with status 0: the work is queued either way.
    let out = enqueue(&env, &["emails", r#"{"to":"bob"}"#, "--dedup", "signup-42"]);
    out.assert_status(0);
    assert_eq!(out.stdout.trim(), "Duplicate emails item=2 dedup=signup-42");
    let out = enqueue(&env, &["emails", "1", "--dedup", "signup-42", "--json"]);
    out.assert_status(0);
    assert_eq!(
        out.json(),
        serde_json::json!({"result": "Duplicate", "queue": "emails", "item": 2, "dedup": "signup-42"})
    );
    let out = enqueue(&env, &["emails", "\"later\"", "--delay", "1h", "--json"]);
    out.assert_status(0);
    assert_eq!(
        out.json(),
        serde_json::json!({"result": "Added", "queue": "emails", "item": 3})
    );
    enqueue(&env, &["reports", "[1,2]", "--max-attempts", "2"]).assert_status(0);
    // Another namespace has its own queues and de-duplication ids.
    let out = env.run([
        "--namespace",
        "billing",
        "queue",
        "enqueue",
        "emails",
        "{}",
        "--dedup",
        "signup-42",
    ]);
    out.assert_status(0);
    assert!(out.stdout.starts_with("Added emails"), "{}", out.stdout);

    let json = stats(&env, "emails");
    assert_eq!(json["queue"], "emails");
    assert_eq!(json["ready"], 2, "{json}");
    assert_eq!(json["scheduled"], 1, "the delayed item: {json}");
    assert_eq!(json["running"], 0);
    assert_eq!(json["dead"], 0);
    assert!(json["oldest_due_ms"].is_u64(), "{json}");
    let json = stats(&env, "nothing-here");
    assert_eq!(json["ready"], 0);
    assert_eq!(json["oldest_due_ms"], serde_json::Value::Null);

    let out = env.run(["queue", "stats"]);
    out.assert_status(0);
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(lines.len(), 3, "{}", out.stdout);
    assert!(
        lines[0].starts_with("QUEUE")
            && lines[0].contains("READY")
            && lines[0].contains("OLDEST_DUE"),
        "{}",
        out.stdout
    );
    let emails: Vec<&str> = lines[1].split_whitespace().collect();
    assert_eq!(
        emails[..6],
        ["emails", "2", "1", "0", "0", "0"],
        "{}",
        out.stdout
    );
    assert!(lines[2].starts_with("reports "), "{}", out.stdout);
    let out = env.run(["queue", "stats", "--json", "--prefix", "rep"]);
    out.assert_status(0);
    let rows = out.json();
    assert_eq!(rows.as_array().map(Vec::len), Some(1), "{rows}");
    assert_eq!(rows[0]["queue"], "reports");
    let out = env.run(["--namespace", "empty", "queue", "stats", "--json"]);
    out.assert_status(0);
    assert_eq!(out.json(), serde_json::json!([]));
}

#[test]
fn a_payload_can_come_from_stdin() {
    let env = Env::new();
    let mut command = env.baton(["queue", "enqueue", "big", "-"]);
    let file = env.path("payload.json");
    std::fs::write(&file, format!("{{\"blob\":\"{}\"}}\n", "x".repeat(200_000))).unwrap();
    command.stdin(std::fs::File::open(&file).unwrap());
    let out = Running::spawn(command).finish();
    out.assert_status(0);
    assert_eq!(out.stdout.trim(), "Added big item=1");
    // The worker hands the payload back byte for byte, larger than a pipe's buffer.
    let out = env.run(worker_until_empty("big", &[], "cat > got.json"));
    out.assert_status(0);
    assert_eq!(
        std::fs::read(env.path("got.json")).unwrap(),
        std::fs::read(&file).unwrap()
    );

    let mut command = env.baton(["queue", "enqueue", "big", "-"]);
    std::fs::write(&file, "not json").unwrap();
    command.stdin(std::fs::File::open(&file).unwrap());
    let out = Running::spawn(command).finish();
    out.assert_status(USAGE);
    assert!(out.stderr.contains("not JSON"), "{}", out.stderr);
}

#[test]
fn invalid_input_exits_64_and_changes_nothing() {
    let env = Env::new();
    for (args, says) in [
        (&["queue", "enqueue", "emails", "{to: ada}"][..], "not JSON"),
        (&["queue", "enqueue", "emails", "hello"], "not JSON"),
        (&["queue", "enqueue", "emails", ""], "not JSON"),
        (&["queue", "enqueue", "emails"], "JSON"),
        (
            &["queue", "enqueue", "emails", "1", "--delay", "soon"],
            "--delay",
        ),
        (
            &["queue", "enqueue", "emails", "1", "--delay", "31d"],
            "delay",
        ),
        (
            &["queue", "enqueue", "emails", "1", "--delay", "30"],
            "--delay",
        ),
        (
            &["queue", "enqueue", "emails", "1", "--max-attempts", "0"],
            "max_attempts",
        ),
        (
            &["queue", "enqueue", "emails", "1", "--dedup", ""],
            "dedup id",
        ),
        (&["queue", "enqueue", "", "1"], "queue name"),
        (&["queue", "enqueue", "a\u{7}b", "1"], "control character"),
        (&["queue", "stats", "--prefix", "a\tb"], "control character"),
        (
            &["worker", "emails", "--concurrency", "0", "--", "true"],
            "concurrency",
        ),
        (&["worker", "emails", "--batch", "0", "--", "true"], "batch"),
        (
            &["worker", "emails", "--lease", "5ms", "--", "true"],
            "lease",
        ),
        (
            &["worker", "emails", "--lease", "soon", "--", "true"],
            "--lease",
        ),
        (
            &["worker", "emails", "--drain", "1y", "--", "true"],
            "--drain",
        ),
        (
            &[
                "worker",
                "emails",
                "--backoff",
                "10m",
                "--backoff-max",
                "1m",
                "--",
                "true",
            ],
            "backoff",
        ),
        (&["worker", "", "--", "true"], "queue name"),
        (&["worker", "emails"], "COMMAND"),
        (&["worker", "emails", "true"], ""),
    ] {
        let out = env.run(args);
        out.assert_status(USAGE);
        assert!(out.stderr.contains(says), "{args:?}: {}", out.stderr);
    }
    assert!(
        !env.path("baton.db").exists(),
        "invalid input opened (and created) the store"
    );
    let out = env.run(["queue", "stats", "--json"]);
    out.assert_status(0);
    assert_eq!(out.json(), serde_json::json!([]));
}

#[test]
fn three_workers_process_every_item_exactly_once() {
    let env = Env::new();
    const ITEMS: usize = 24;
    for n in 0..ITEMS {
        enqueue(&env, &["jobs", &format!("{{\"n\":{n}}}")]).assert_status(0);
    }
    // Each COMMAND appends its payload (one write of one line) after a short pause, so
    // that the workers overlap.
    let script = r#"p=$(cat); sleep 0.05; echo "$p $BATON_ITEM_ID $BATON_ATTEMPT" >> done.log"#;
    let workers: Vec<Running> = (0..3)
        .map(|_| {
            Running::spawn(env.baton(worker_until_empty("jobs", &["--concurrency", "2"], script)))
        })
        .collect();
    let mut completed = 0;
    for worker in workers {
        let out = worker.finish();
        out.assert_status(0);
        let counts = summary(&out.stdout);
        assert_eq!(counts["by"], "empty", "{}", out.stdout);
        assert_eq!(counts["failed"], "0", "{}", out.stdout);
        completed += counts["completed"].parse::<usize>().unwrap();
    }
    assert_eq!(completed, ITEMS, "the summaries count every item once");
    let done = env.read("done.log");
    let mut seen: Vec<String> = done
        .lines()
        .map(|l| l.split_whitespace().next().unwrap().to_owned())
        .collect();
    seen.sort();
    let mut expected: Vec<String> = (0..ITEMS).map(|n| format!("{{\"n\":{n}}}")).collect();
    expected.sort();
    assert_eq!(seen, expected, "every payload exactly once:\n{done}");
    assert!(
        done.lines().all(|l| l.ends_with(" 1")),
        "every item on its first attempt:\n{done}"
    );
    let json = stats(&env, "jobs");
    assert_eq!(
        (
            json["ready"].as_u64(),
            json["running"].as_u64(),
            json["dead"].as_u64()
        ),
        (Some(0), Some(0), Some(0)),
        "{json}"
    );
}

#[test]
fn a_failing_command_is_retried_then_dead_lettered() {
    let env = Env::new();
    enqueue(
        &env,
        &["flaky", "{}", "--max-attempts", "3", "--dedup", "d-1"],
    )
    .assert_status(0);
    let script = r#"echo "$BATON_ATTEMPT/$BATON_MAX_ATTEMPTS $BATON_DEDUP_ID" >> attempts; echo "boom" >&2; exit 3"#;
    let out = env.run(worker_until_empty("flaky", &["--backoff", "0s"], script));
    out.assert_status(0);
    assert_eq!(env.read("attempts"), "1/3 d-1\n2/3 d-1\n3/3 d-1\n");
    let counts = summary(&out.stdout);
    assert_eq!(counts["claimed"], "3", "{}", out.stdout);
    assert_eq!(counts["completed"], "0", "{}", out.stdout);
    assert_eq!(counts["failed"], "3", "{}", out.stdout);
    assert_eq!(counts["dead_lettered"], "1", "{}", out.stdout);
    // COMMAND's stderr passes through; baton says what happened to the item.
    assert!(out.stderr.contains("boom"), "{}", out.stderr);
    assert!(
        out.stderr.contains("sh exited with status 3"),
        "{}",
        out.stderr
    );
    assert!(out.stderr.contains("it will be retried"), "{}", out.stderr);
    assert!(out.stderr.contains("dead-lettered"), "{}", out.stderr);
    let json = stats(&env, "flaky");
    assert_eq!(
        (json["dead"].as_u64(), json["ready"].as_u64()),
        (Some(1), Some(0)),
        "{json}"
    );

    // With the default backoff the retry waits, and --exit-when-empty leaves it for later.
    enqueue(&env, &["later", "{}", "--max-attempts", "2"]).assert_status(0);
    let out = env.run(["worker", "later", "--exit-when-empty", "--", "false"]);
    out.assert_status(0);
    let counts = summary(&out.stdout);
    assert_eq!(
        (counts["failed"].as_str(), counts["dead_lettered"].as_str()),
        ("1", "0")
    );
    let json = stats(&env, "later");
    assert_eq!(json["scheduled"], 1, "backing off: {json}");
}

#[test]
fn sigterm_lets_a_running_command_finish_within_the_drain() {
    let env = Env::new();
    enqueue(&env, &["slow", r#""one""#]).assert_status(0);
    enqueue(&env, &["slow", r#""two""#]).assert_status(0);
    let script = r#"touch started; while [ ! -e done ]; do sleep 0.05; done; cat >> out"#;
    let mut worker =
        Running::spawn(env.baton(["worker", "slow", "--drain", "2m", "--", "sh", "-c", script]));
    eventually("COMMAND to start", || env.path("started").exists());
    worker.signal(Signal::SIGTERM);
    eventually("baton to stop claiming", || {
        worker.stderr().contains("no more claims")
    });
    assert!(worker.is_running(), "baton did not wait for COMMAND");
    env.touch("done");
    let out = worker.finish();
    out.assert_status(0);
    // COMMAND was not signalled (its own process group): it finished and completed its
    // item; the second item was never claimed.
    assert_eq!(env.read("out"), "\"one\"");
    let counts = summary(&out.stdout);
    assert_eq!(counts["by"], "SIGTERM", "{}", out.stdout);
    assert_eq!(
        (
            counts["claimed"].as_str(),
            counts["completed"].as_str(),
            counts["released"].as_str()
        ),
        ("1", "1", "0"),
        "{}",
        out.stdout
    );
    assert_eq!(stats(&env, "slow")["ready"], 1);
}

#[test]
fn sigterm_during_a_long_command_releases_its_item_to_another_worker() {
    let env = Env::new();
    enqueue(&env, &["long", r#"{"id":7}"#]).assert_status(0);
    // COMMAND exits at the SIGTERM that ends the drain. --grace is long: the item must be
    // released when COMMAND has exited, not when --drain + --grace + 1s (61.2s) are over.
    let script = r#"echo $$ > pid; while :; do sleep 0.05; done"#;
    let worker = Running::spawn(env.baton([
        "worker", "long", "--drain", "200ms", "--grace", "1m", "--", "sh", "-c", script,
    ]));
    eventually("COMMAND to start", || !env.read("pid").trim().is_empty());
    assert_eq!(stats(&env, "long")["running"], 1);
    let signalled = Instant::now();
    worker.signal(Signal::SIGTERM);
    // Released: claimable at once (by any worker), the attempt not counted. 15s leaves a
    // loaded machine room for the 200ms drain and the `baton queue stats` runs, and is far
    // below the 61.2s of the library's grace.
    loop {
        let json = stats(&env, "long");
        if (json["ready"].as_u64(), json["running"].as_u64()) == (Some(1), Some(0)) {
            break;
        }
        assert!(
            signalled.elapsed() < Duration::from_secs(15),
            "the item was not released within 15s of SIGTERM (a 200ms drain, COMMAND exiting at SIGTERM): {json}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = worker.finish();
    assert!(
        signalled.elapsed() < Duration::from_secs(20),
        "baton took {:?} to exit after its last COMMAND",
        signalled.elapsed()
    );
    out.assert_status(0);
    assert!(
        out.stderr.contains("terminating 1 running COMMAND"),
        "{}",
        out.stderr
    );
    let counts = summary(&out.stdout);
    assert_eq!(counts["by"], "SIGTERM", "{}", out.stdout);
    assert_eq!(
        (
            counts["claimed"].as_str(),
            counts["completed"].as_str(),
            counts["failed"].as_str(),
            counts["released"].as_str()
        ),
        ("1", "0", "0", "1"),
        "{}",
        out.stdout
    );
    // COMMAND is gone.
    let pid: i32 = env.read("pid").trim().parse().unwrap();
    eventually("COMMAND to be gone", || {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_err()
    });
    let out = env.run(worker_until_empty(
        "long",
        &[],
        r#"echo "$BATON_ATTEMPT $(cat)" > out"#,
    ));
    out.assert_status(0);
    assert_eq!(env.read("out"), "1 {\"id\":7}\n");
    assert_eq!(summary(&out.stdout)["completed"], "1");
}

#[test]
fn a_command_whose_lease_is_lost_is_terminated() {
    let env = Env::new();
    enqueue(&env, &["q", r#""x""#]).assert_status(0);
    // COMMAND stops baton (its parent) so that no extension lands: the lease lapses and
    // another worker takes the item.
    let script = r#"echo $$ > pid; kill -STOP $PPID; while :; do sleep 0.05; done"#;
    let stalled = Running::spawn(env.baton([
        "worker", "q", "--lease", "500ms", "--grace", "1s", "--", "sh", "-c", script,
    ]));
    eventually("COMMAND to start", || !env.read("pid").trim().is_empty());
    eventually("the lease to lapse", || stats(&env, "q")["expired"] == 1);
    let out = env.run(worker_until_empty(
        "q",
        &[],
        r#"echo "$BATON_ATTEMPT" > second"#,
    ));
    out.assert_status(0);
    assert_eq!(
        env.read("second"),
        "2\n",
        "the second claim is the second attempt"
    );

    // Resumed, the stalled worker learns that the item is no longer its own and stops
    // COMMAND's process group.
    stalled.signal(Signal::SIGCONT);
    eventually("the lost lease to be noticed", || {
        stalled
            .stderr()
            .contains("lost the lease of item 1 of queue q")
    });
    let pid: i32 = env.read("pid").trim().parse().unwrap();
    eventually("COMMAND to be terminated", || {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_err()
    });
    stalled.signal(Signal::SIGTERM);
    let out = stalled.finish();
    out.assert_status(0);
    let counts = summary(&out.stdout);
    assert_eq!(
        (
            counts["lost"].as_str(),
            counts["completed"].as_str(),
            counts["failed"].as_str()
        ),
        ("1", "0", "0"),
        "{}",
        out.stdout
    );
}

#[test]
fn a_command_that_cannot_run_fails_its_item_and_stops_the_worker() {
    let env = Env::new();
    enqueue(&env, &["q", "1"]).assert_status(0);
    enqueue(&env, &["q", "2"]).assert_status(0);
    let out = env.run([
        "worker",
        "q",
        "--backoff",
        "1h",
        "--",
        "baton-no-such-command-xyz",
    ]);
    out.assert_status(NOT_FOUND);
    assert!(
        out.stderr
            .contains("cannot run baton-no-such-command-xyz: command not found"),
        "{}",
        out.stderr
    );
    let counts = summary(&out.stdout);
    assert_eq!(counts["by"], "command-error", "{}", out.stdout);
    assert_eq!(
        (counts["claimed"].as_str(), counts["failed"].as_str()),
        ("1", "1")
    );
    // The first item was failed (backing off, an attempt counted); the second never claimed.
    let json = stats(&env, "q");
    assert_eq!(
        (json["scheduled"].as_u64(), json["ready"].as_u64()),
        (Some(1), Some(1)),
        "{json}"
    );

    std::fs::write(env.path("not-executable"), "#!/bin/sh\n").unwrap();
    let out = env.run(["worker", "q", "--", "./not-executable"]);
    out.assert_status(CANNOT_EXECUTE);
}

#[test]
fn json_output_is_one_document_and_command_stdout_goes_to_stderr() {
    let env = Env::new();
    enqueue(&env, &["q", r#""payload-text""#]).assert_status(0);
    let out = env.run(["worker", "q", "--exit-when-empty", "--json", "--", "cat"]);
    out.assert_status(0);
    let json = out.json();
    assert_eq!(json["result"], "Stopped");
    assert_eq!(json["queue"], "q");
    assert_eq!(json["stopped_by"], "empty");
    assert_eq!(json["completed"], 1);
    assert_eq!(json["lost"], 0);
    assert!(out.stderr.contains("payload-text"), "{}", out.stderr);
}

#[test]
fn schedule_list_shows_schedules_registered_through_the_library() {
    let env = Env::new();
    let out = env.run(["schedule", "list"]);
    out.assert_status(0);
    assert_eq!(
        out.stdout.lines().count(),
        1,
        "only the header:\n{}",
        out.stdout
    );

    let runtime = tokio::runtime::Runtime::new().unwrap();
    let (nightly, every_second, shutdown, running) = runtime.block_on(async {
        let baton = baton::connect(env.url()).await.unwrap();
        let scheduler = baton
            .scheduler()
            .unwrap()
            .with_holder(baton::lease::Holder::new("test-host:42").unwrap());
        let nightly = scheduler
            .register(
                "nightly-report",
                "0 3 * * *",
                Missed::Skip,
                |_: Tick| async { Ok::<(), String>(()) },
            )
            .await
            .unwrap();
        let every_second = scheduler
            .register("heartbeat", "* * * * * *", Missed::Skip, |_: Tick| async {
                Ok::<(), String>(())
            })
            .await
            .unwrap();
        let shutdown = tokio_util::sync::CancellationToken::new();
        let running = tokio::spawn({
            let shutdown = shutdown.clone();
            async move { scheduler.run(shutdown).await }
        });
        (nightly, every_second, shutdown, running)
    });
    assert_eq!(every_second.runs, 0);

    let mut rows = serde_json::Value::Null;
    eventually("a heartbeat tick to run", || {
        let out = env.run(["schedule", "list", "--json"]);
        out.assert_status(0);
        rows = out.json();
        rows[0]["runs"].as_u64().unwrap_or(0) > 0
    });
    shutdown.cancel();
    runtime.block_on(running).unwrap().unwrap();

    // Ordered by name.
    assert_eq!(rows[0]["name"], "heartbeat", "{rows}");
    assert_eq!(rows[0]["spec"], "* * * * * *");
    assert_eq!(rows[0]["last_holder"], "test-host:42");
    assert!(rows[0]["last_run_unix_ms"].as_i64().unwrap() > 0, "{rows}");
    assert_eq!(rows[1]["name"], "nightly-report");
    assert_eq!(rows[1]["spec"], "0 3 * * *");
    assert_eq!(rows[1]["runs"], 0);
    assert_eq!(rows[1]["next_due_unix_ms"], nightly.next_due_ms);
    assert_eq!(rows[1]["last_holder"], serde_json::Value::Null);

    let out = env.run(["schedule", "list"]);
    out.assert_status(0);
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(lines.len(), 3, "{}", out.stdout);
    assert!(
        lines[0].starts_with("NAME") && lines[0].contains("NEXT_DUE"),
        "{}",
        out.stdout
    );
    assert!(lines[1].starts_with("heartbeat") && lines[1].contains("test-host:42"));
    assert!(
        lines[2].starts_with("nightly-report") && lines[2].contains("0 3 * * *"),
        "{}",
        out.stdout
    );
    assert!(
        lines[2].contains("T03:00:00Z"),
        "next due at 03:00 UTC:\n{}",
        out.stdout
    );
    let words: Vec<&str> = lines[2].split_whitespace().collect();
    assert_eq!(words[words.len() - 3..], ["0", "-", "-"], "{}", out.stdout);
    // Another namespace has none.
    let out = env.run(["--namespace", "other", "schedule", "list", "--json"]);
    out.assert_status(0);
    assert_eq!(out.json(), serde_json::json!([]));
}

#[test]
fn redis_is_refused_before_connecting() {
    // Nothing listens on port 1: an attempt to connect would exit 69, not 64.
    for args in [
        &["queue", "enqueue", "q", "1"][..],
        &["queue", "stats"],
        &["worker", "q", "--", "true"],
        &["schedule", "list"],
    ] {
        let mut command = bare_baton();
        command.args(["--store", "redis://127.0.0.1:1"]).args(args);
        let out = Running::spawn(command).finish();
        out.assert_status(USAGE);
        assert!(
            out.stderr
                .contains("the redis store keeps no claimable work"),
            "{args:?}: {}",
            out.stderr
        );
    }
}
