//! The exit statuses that do not need COMMAND to run: 64 for invalid input (nothing runs,
//! nothing is written) and 69 for a store that cannot be opened; and where the default
//! store lives.

mod common;

use common::*;

#[test]
fn invalid_input_exits_64_and_runs_nothing() {
    let env = Env::new();
    let cases: &[&[&str]] = &[
        // Durations: no unit, fractions, unknown units, below the minimum TTL, over the
        // maximum wait.
        &["run", "--ttl", "30", "job", "--", "touch", "ran"],
        &["run", "--ttl", "1.5s", "job", "--", "touch", "ran"],
        &["run", "--ttl", "5ms", "job", "--", "touch", "ran"],
        &["run", "--wait", "soon", "job", "--", "touch", "ran"],
        &["run", "--wait", "2d", "job", "--", "touch", "ran"],
        &["run", "--grace", "-1s", "job", "--", "touch", "ran"],
        &["run", "--on-lost", "panic", "job", "--", "touch", "ran"],
        // Keys: empty, control characters, too long.
        &["run", "", "--", "touch", "ran"],
        &["run", "a\u{1}b", "--", "touch", "ran"],
        &["run", "line\nbreak", "--", "touch", "ran"],
        // No COMMAND.
        &["run", "job"],
        &["run", "job", "--"],
        // COMMAND without `--`.
        &["run", "job", "touch", "ran"],
        // Namespaces.
        &["--namespace", "a:b", "run", "job", "--", "touch", "ran"],
        &["--namespace", "", "run", "job", "--", "touch", "ran"],
        // clap usage errors (clap's own status would be 2).
        &["run", "--no-such-option", "job", "--", "touch", "ran"],
        &["no-such-command"],
        &[],
        &["lock", "status"],
        &["lease", "claim", "k"],
        &["lease", "claim", "k", "--holder", "a\tb"],
        &["lease", "claim", "k", "--holder", "h", "--ttl", "0s"],
    ];
    for args in cases {
        let out = env.run(*args);
        assert_eq!(
            out.code(),
            Some(USAGE),
            "{args:?}\nstdout: {}\nstderr: {}",
            out.stdout,
            out.stderr
        );
        assert!(!out.stderr.is_empty(), "{args:?}: no message");
        assert!(!env.path("ran").exists(), "{args:?}: COMMAND ran");
    }
    let long_key = "k".repeat(513);
    env.run(["run", &long_key, "--", "touch", "ran"])
        .assert_status(USAGE);
    // Nothing above got as far as opening the store.
    assert!(!env.path("baton.db").exists());

    // Input only the library checks, after the store is open: still 64.
    let long_reason = "r".repeat(65);
    env.run([
        "lease",
        "claim",
        "k",
        "--holder",
        "h",
        "--reason",
        &long_reason,
    ])
    .assert_status(USAGE);
}

#[test]
fn unknown_store_schemes_exit_64() {
    let env = Env::new();
    for url in [
        "mysql://localhost/db",
        "no-scheme-at-all",
        "memory://with-a-path",
    ] {
        let out = Running::spawn({
            let mut c = bare_baton();
            c.args(["--store", url, "run", "job", "--", "touch"])
                .arg(env.path("ran"));
            c
        })
        .finish();
        out.assert_status(USAGE);
        // Rejected while parsing, as every other bad argument.
        assert!(out.stderr.contains("invalid --store"), "{}", out.stderr);
    }
    assert!(!env.path("ran").exists());
}

#[test]
fn help_and_version_exit_0() {
    for args in [
        &["--help"][..],
        &["--version"],
        &["run", "--help"],
        &["help", "lease"],
    ] {
        let out = Running::spawn({
            let mut c = bare_baton();
            c.args(args);
            c
        })
        .finish();
        out.assert_status(0);
        assert!(!out.stdout.is_empty());
    }
}

#[test]
fn a_store_that_cannot_be_opened_exits_69() {
    let env = Env::new();
    // An SQLite path under a regular file: the directory can never exist.
    env.touch("not-a-directory");
    let url = format!(
        "sqlite://{}",
        env.path("not-a-directory").join("baton.db").display()
    );
    for args in [
        &["run", "job", "--", "touch", "ran"][..],
        &["lock", "status", "job"],
        &["lock", "list"],
        &["lease", "claim", "k", "--holder", "h"],
        &["lease", "status", "k"],
    ] {
        let out = Running::spawn({
            let mut c = bare_baton();
            c.current_dir(env.path(""))
                .arg("--store")
                .arg(&url)
                .args(args);
            c
        })
        .finish();
        out.assert_status(UNAVAILABLE);
        assert!(out.stderr.contains("baton: "), "{}", out.stderr);
    }
    assert!(!env.path("ran").exists(), "COMMAND ran without a lock");
}

#[test]
fn the_store_comes_from_baton_store() {
    let env = Env::new();
    let mut c = bare_baton();
    c.env("BATON_STORE", env.url())
        .args(["lease", "claim", "k", "--holder", "h"]);
    Running::spawn(c).finish().assert_status(0);
    // The same store, named with --store, sees the lease.
    let out = env.run(["lease", "status", "k", "--json"]);
    assert_eq!(out.json()["holder"], "h");
}

#[test]
fn the_default_store_is_created_under_the_state_directory() {
    let env = Env::new();
    let state = env.path("state");
    let mut c = bare_baton();
    c.env("XDG_STATE_HOME", &state)
        .args(["run", "job", "--", "true"]);
    Running::spawn(c).finish().assert_status(0);
    assert!(state.join("baton").join("baton.db").exists());

    let home = env.path("home");
    std::fs::create_dir(&home).unwrap();
    let mut c = bare_baton();
    c.env_remove("XDG_STATE_HOME")
        .env("HOME", &home)
        .args(["lease", "claim", "k", "--holder", "h"]);
    Running::spawn(c).finish().assert_status(0);
    assert!(home.join(".local/state/baton/baton.db").exists());
}
