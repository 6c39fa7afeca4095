//! The manners of a command-line tool: a closed stdout ends a command quietly with the
//! status of a tool SIGPIPE ended (141), and every invalid argument exits 64 before any
//! file, directory or connection is made.

mod common;

use std::process::Stdio;

use common::*;

/// SIGPIPE's number on Linux: a tool ended by it exits 128 + 13 in a shell.
const BROKEN_PIPE: i32 = 141;

#[test]
fn a_closed_stdout_ends_a_command_quietly_with_status_141() {
    let env = Env::new();
    for n in 0..3 {
        env.run(["lease", "claim", &format!("l{n}"), "--holder", "h"])
            .assert_status(0);
    }
    env.run(["cache", "set", "k", "[1,2,3]"]).assert_status(0);
    for args in [
        &["lease", "list"][..],
        &["lease", "list", "--json"],
        &["cache", "get", "k"],
        &["alerts"],
    ] {
        let mut command = env.baton(args);
        // The reader is gone before baton writes a byte.
        command.stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = command.spawn().expect("spawn baton");
        drop(child.stdout.take());
        let out = child.wait_with_output().expect("wait for baton");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            out.status.code(),
            Some(BROKEN_PIPE),
            "{args:?}: stderr:\n{stderr}"
        );
        assert!(stderr.is_empty(), "{args:?} said something:\n{stderr}");
    }
}

/// Invalid invocations against the default store (the SQLite file under
/// `$XDG_STATE_HOME`): each exits 64, and the state directory is never created.
#[test]
fn invalid_arguments_create_nothing() {
    let env = Env::new();
    let state = env.path("state");
    let long_reason = "r".repeat(65);
    let invalid: &[&[&str]] = &[
        &["lease", "claim", "k", "--holder", "h", "--reason", "a\nb"],
        &[
            "lease",
            "claim",
            "k",
            "--holder",
            "h",
            "--reason",
            &long_reason,
        ],
        &["lease", "claim", "k", "--holder", ""],
        &["lease", "renew", "k", "--holder", "h", "--ttl", "1ms"],
        &["lease", "list", "--prefix", "a\nb"],
        &["lock", "list", "--prefix", "a\nb"],
        &["lock", "status", ""],
        &["queue", "enqueue", "q", "not json"],
        &["queue", "enqueue", "q", "1", "--dedup", ""],
        &["queue", "enqueue", "q", "1", "--max-attempts", "0"],
        &["queue", "stats", "--prefix", "a\nb"],
        &["schedule", "list", "--prefix", "a\nb"],
        &["limit", "k", "--max", "0", "--window", "1s"],
        &["limit", "k", "--max", "5", "--window", "1s", "--cost", "6"],
        &["cache", "set", "k", "not json"],
        &["cache", "set", "k", "1", "--ttl", "0s"],
        &["publish", "ch", "not json"],
        &["subscribe", ""],
        &["worker", "", "--", "true"],
        &["worker", "q", "--concurrency", "0", "--", "true"],
        &["run", "", "--", "true"],
        &["run", "k", "--ttl", "1ms", "--", "true"],
        &["status", "--listen", "127.0.0.1:0", "--prefix", "a\nb"],
        &["--namespace", "", "lock", "list"],
        &["--store", "sqlite://", "lock", "list"],
    ];
    for args in invalid {
        let mut command = bare_baton();
        command
            .env("XDG_STATE_HOME", &state)
            .current_dir(env.path(""))
            .args(*args);
        let out = Running::spawn(command).finish();
        out.assert_status(USAGE);
        assert!(
            !state.exists(),
            "{args:?} exited 64 but created {}",
            state.display()
        );
    }
}
