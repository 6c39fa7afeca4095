//! `baton elect` and `baton leader` against a real SQLite file shared by several `baton`
//! processes: one leader at a time with increasing terms, contention, the leader's value
//! and term as printed, a watched change, and bad input refused before the store is opened.

mod common;

use std::os::unix::process::CommandExt;

use common::*;
use nix::sys::signal::Signal;

/// Four candidates in four processes: each runs COMMAND only while it leads, the runs never
/// overlap, and every term is larger than the one before.
#[test]
fn candidates_in_several_processes_lead_one_at_a_time() {
    let env = Env::new();
    let script = r#"echo "start $BATON_FENCE $BATON_LEADER_ID" >> events; sleep 0.2; echo "end $BATON_FENCE $BATON_LEADER_ID" >> events"#;
    let runs: Vec<Running> = (0..4)
        .map(|i| {
            let id = format!("pod-{i}");
            Running::spawn(
                env.baton(
                    ["elect", "--id", &id, "--ttl", "10s", "scheduler", "--"]
                        .into_iter()
                        .map(str::to_owned)
                        .chain(sh(script).map(str::to_owned)),
                ),
            )
        })
        .collect();
    for run in runs {
        run.finish().assert_status(0);
    }
    let events = env.read("events");
    let lines: Vec<&str> = events.lines().collect();
    assert_eq!(
        lines.len(),
        8,
        "every leader wrote start and end:\n{events}"
    );
    let mut last_term = 0;
    for pair in lines.chunks(2) {
        let start: Vec<&str> = pair[0].split_whitespace().collect();
        let end: Vec<&str> = pair[1].split_whitespace().collect();
        assert_eq!(
            (start[0], end[0]),
            ("start", "end"),
            "leaders overlapped:\n{events}"
        );
        assert_eq!(start[1..], end[1..], "leaders overlapped:\n{events}");
        let term: u64 = start[1].parse().expect("term");
        assert!(term > last_term, "terms did not increase:\n{events}");
        last_term = term;
    }
    let out = env.run(["leader", "scheduler", "--json"]);
    out.assert_status(0);
    assert_eq!(out.json()["leader"], false, "every leader resigned");
}

/// While one candidate leads, `baton leader` prints it (id, value, term) and another
/// candidate with `--wait` gives up with status 75, naming the leader; COMMAND never runs.
#[test]
fn a_led_election_is_printed_and_refuses_another_candidate() {
    let env = Env::new();
    env.touch("stop");
    let leader = Running::spawn(env.baton([
        "elect",
        "--id",
        "pod-a",
        "--value",
        "10.0.0.7:8080",
        "jobs",
        "--",
        "sh",
        "-c",
        r#"echo "$BATON_FENCE" > term; while [ -e stop ]; do sleep 0.05; done"#,
    ]));
    eventually("pod-a leads", || !env.read("term").is_empty());
    let term: u64 = env.read("term").trim().parse().expect("term");

    let out = env.run(["leader", "jobs", "--json"]);
    out.assert_status(0);
    let json = out.json();
    assert_eq!(json["election"], "jobs");
    assert_eq!(json["leader"], true);
    assert_eq!(json["candidate"], "pod-a");
    assert_eq!(json["value"], "10.0.0.7:8080");
    assert_eq!(json["term"], term);
    assert!(json["remaining_ms"].as_u64().unwrap() > 0);
    let out = env.run(["leader", "jobs"]);
    assert!(
        out.stdout.starts_with(&format!(
            "jobs: led by pod-a (term {term}, value \"10.0.0.7:8080\""
        )),
        "{}",
        out.stdout
    );

    let out = env.run([
        "elect", "--id", "pod-b", "--wait", "200ms", "jobs", "--", "touch", "ran",
    ]);
    out.assert_status(CONTENDED);
    assert!(out.stderr.contains("is led by pod-a"), "{}", out.stderr);
    assert!(!env.path("ran").exists(), "COMMAND ran without leading");

    std::fs::remove_file(env.path("stop")).unwrap();
    leader.finish().assert_status(0);
    let out = env.run(["leader", "jobs"]);
    assert_eq!(out.stdout.trim(), "jobs: no leader");
}

/// `baton leader --watch` prints the leader now and then each change: a new leader, and no
/// leader once it resigned.
#[test]
fn leader_watch_prints_each_change() {
    let env = Env::new();
    let mut command = env.baton(["leader", "--watch", "--json", "w"]);
    command.process_group(0);
    let watch = Running::spawn(command);
    eventually("the watcher prints the first state", || {
        !watch_lines(&watch).is_empty()
    });
    env.run([
        "elect", "--id", "pod-a", "--value", "v1", "w", "--", "sleep", "0.5",
    ])
    .assert_status(0);
    eventually("the watcher sees pod-a come and go", || {
        watch_lines(&watch).len() >= 3
    });
    watch.signal(Signal::SIGINT);
    let out = watch.finish();
    out.assert_status(0);
    let lines: Vec<serde_json::Value> = out
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    assert_eq!(lines[0]["leader"], false, "{}", out.stdout);
    assert_eq!(lines[1]["candidate"], "pod-a", "{}", out.stdout);
    assert_eq!(lines[1]["value"], "v1", "{}", out.stdout);
    assert_eq!(lines[2]["leader"], false, "{}", out.stdout);
}

fn watch_lines(watch: &Running) -> Vec<String> {
    watch.stdout().lines().map(str::to_owned).collect()
}

/// Bad ids, values and names are refused with status 64 before any store is opened.
#[test]
fn bad_input_is_refused_before_the_store_is_opened() {
    let env = Env::new();
    let long_value = "v".repeat(1025);
    let long_id = "i".repeat(201);
    let cases: [&[&str]; 6] = [
        &["elect", "--id", "", "e", "--", "true"],
        &["elect", "--id", &long_id, "e", "--", "true"],
        &["elect", "--id", "a\tb", "e", "--", "true"],
        &[
            "elect",
            "--id",
            "a",
            "--value",
            &long_value,
            "e",
            "--",
            "true",
        ],
        &["elect", "--id", "a", "--ttl", "0s", "e", "--", "true"],
        &["leader", ""],
    ];
    for args in cases {
        let out = env.run(args);
        out.assert_status(USAGE);
        assert!(!out.stderr.is_empty());
    }
    let out = env.run(["elect", "e", "--", "true"]);
    out.assert_status(USAGE);
    assert!(out.stderr.contains("--id"), "{}", out.stderr);
    assert!(!env.path("baton.db").exists(), "the store was opened");
}
