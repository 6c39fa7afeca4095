//! `baton cache get|set|delete`: JSON values shared through the store, exit 1 on a miss, 64
//! for a value that is not JSON.

mod common;

use std::thread;
use std::time::Duration;

use common::*;

#[test]
fn set_get_delete() {
    let env = Env::new();
    let out = env.run(["cache", "get", "user:1"]);
    out.assert_status(1);
    assert!(out.stdout.is_empty(), "{}", out.stdout);

    let out = env.run([
        "cache",
        "set",
        "user:1",
        r#"{"name":"Ada","tags":["a","ü"]}"#,
    ]);
    out.assert_status(0);
    assert_eq!(out.stdout.trim(), "Set user:1 ttl=1h");

    let out = env.run(["cache", "get", "user:1"]);
    out.assert_status(0);
    let value: serde_json::Value = serde_json::from_str(out.stdout.trim()).unwrap();
    assert_eq!(
        value,
        serde_json::json!({"name": "Ada", "tags": ["a", "ü"]})
    );

    let out = env.run(["cache", "get", "user:1", "--json"]);
    out.assert_status(0);
    assert_eq!(out.json()["hit"], true);
    assert_eq!(out.json()["value"]["name"], "Ada");

    // Another namespace does not see it.
    env.run(["--namespace", "elsewhere", "cache", "get", "user:1"])
        .assert_status(1);

    let out = env.run(["cache", "delete", "user:1"]);
    out.assert_status(0);
    assert_eq!(out.stdout.trim(), "Deleted user:1");
    let out = env.run(["cache", "delete", "user:1", "--json"]);
    out.assert_status(0);
    assert_eq!(out.json()["result"], "Absent");
    let out = env.run(["cache", "get", "user:1", "--json"]);
    out.assert_status(1);
    assert_eq!(out.json()["hit"], false);
}

#[test]
fn values_expire() {
    let env = Env::new();
    env.run(["cache", "set", "k", "42", "--ttl", "300ms"])
        .assert_status(0);
    eventually("the value to expire", || {
        thread::sleep(Duration::from_millis(50));
        env.run(["cache", "get", "k"]).code() == Some(1)
    });
}

#[test]
fn invalid_values_and_arguments_exit_64() {
    let env = Env::new();
    for args in [
        &["cache", "set", "k", "not json"][..],
        &["cache", "set", "k", "{"],
        &["cache", "set", "k"],
        &["cache", "set", "", "1"],
        &["cache", "set", "k", "1", "--ttl", "5ms"],
        &["cache", "get"],
        &["cache", "frobnicate", "k"],
    ] {
        env.run(args).assert_status(USAGE);
    }
    env.run(["cache", "get", "k"]).assert_status(1);
}

/// Numbers keep every digit through the cache: beyond 64 bits, and beyond f64's precision.
#[test]
fn numbers_keep_their_exact_value() {
    let env = Env::new();
    let value = r#"{"big": 12345678901234567890123, "fine": 0.1000000000000000055511151231257827, "small": -9223372036854775809}"#;
    env.run(["cache", "set", "n", value]).assert_status(0);
    let out = env.run(["cache", "get", "n"]);
    out.assert_status(0);
    assert_eq!(
        out.stdout.trim(),
        r#"{"big":12345678901234567890123,"fine":0.1000000000000000055511151231257827,"small":-9223372036854775809}"#
    );
    let out = env.run(["cache", "get", "n", "--json"]);
    out.assert_status(0);
    assert!(
        out.stdout.contains(r#""big":12345678901234567890123"#),
        "{}",
        out.stdout
    );
}
