//! `baton limit`: exit 0 when admitted, 75 when denied (with the retry-after), 64 when the
//! cost can never fit or an argument is invalid, 69 when the store is down. Each call is a
//! process of its own, so the budget is shared across processes through the store.

mod common;

use common::*;

#[test]
fn admits_up_to_max_then_denies_with_the_retry_after() {
    let env = Env::new();
    for left in [2, 1, 0] {
        let out = env.run(["limit", "api", "--max", "3", "--window", "1h"]);
        out.assert_status(0);
        assert_eq!(
            out.stdout.trim(),
            format!("Admitted api cost=1 remaining={left}")
        );
    }
    let out = env.run(["limit", "api", "--max", "3", "--window", "1h"]);
    out.assert_status(CONTENDED);
    assert!(
        out.stdout
            .starts_with("Denied api cost=1 remaining=0 retry_after="),
        "{}",
        out.stdout
    );

    let out = env.run(["limit", "api", "--max", "3", "--window", "1h", "--json"]);
    out.assert_status(CONTENDED);
    let json = out.json();
    assert_eq!(json["result"], "Denied");
    let retry = json["retry_after_ms"].as_u64().expect("retry_after_ms");
    assert!(retry > 3_000_000 && retry <= 3_604_000, "{json}");

    // Another key and another namespace have their own budgets.
    env.run(["limit", "other", "--max", "3", "--window", "1h"])
        .assert_status(0);
    env.run([
        "--namespace",
        "elsewhere",
        "limit",
        "api",
        "--max",
        "3",
        "--window",
        "1h",
    ])
    .assert_status(0);
}

#[test]
fn costs_and_waiting() {
    let env = Env::new();
    let out = env.run([
        "limit", "k", "--max", "5", "--window", "1s", "--cost", "5", "--json",
    ]);
    out.assert_status(0);
    assert_eq!(out.json()["remaining"], 0);
    // The window is full for about a second: --wait 30s waits for it.
    let out = env.run([
        "limit", "k", "--max", "5", "--window", "1s", "--cost", "2", "--wait", "30s",
    ]);
    out.assert_status(0);
    assert!(
        out.stdout.starts_with("Admitted k cost=2"),
        "{}",
        out.stdout
    );
    // A wait too short to help answers at once.
    env.run([
        "limit", "day", "--max", "5", "--window", "1d", "--cost", "5",
    ])
    .assert_status(0);
    env.run([
        "limit", "day", "--max", "5", "--window", "1d", "--wait", "1m",
    ])
    .assert_status(CONTENDED);
}

#[test]
fn a_cost_that_can_never_fit_and_invalid_arguments_exit_64() {
    let env = Env::new();
    let out = env.run(["limit", "k", "--max", "3", "--window", "1s", "--cost", "4"]);
    out.assert_status(USAGE);
    assert!(out.stderr.contains("never"), "{}", out.stderr);
    for args in [
        &["limit", "k", "--max", "0", "--window", "1s"][..],
        &["limit", "k", "--max", "3", "--window", "5ms"],
        &["limit", "k", "--max", "3", "--window", "31d"],
        &["limit", "k", "--max", "3"],
        &["limit", "k", "--window", "1s"],
        &["limit", "", "--max", "3", "--window", "1s"],
        &["limit", "k", "--max", "3", "--window", "1s", "--cost", "0"],
        &["limit", "k", "--max", "3", "--window", "soon"],
    ] {
        env.run(args).assert_status(USAGE);
    }
    // Nothing was taken by the refused calls.
    let out = env.run(["limit", "k", "--max", "3", "--window", "1h", "--cost", "3"]);
    out.assert_status(0);
}

#[test]
fn a_store_that_is_down_exits_69_and_admits_nothing() {
    let out = Running::spawn({
        let mut command = bare_baton();
        command.args([
            "--store",
            "redis://127.0.0.1:1?connect_timeout=200ms",
            "limit",
            "k",
            "--max",
            "3",
            "--window",
            "1s",
        ]);
        command
    })
    .finish();
    out.assert_status(UNAVAILABLE);
    assert!(out.stdout.is_empty(), "{}", out.stdout);
}
