//! No password appears in anything baton prints: every subcommand, at `BATON_LOG=trace`,
//! against every store scheme with a password in the URL (in the user part and as
//! `?password=`), against servers that accept it, servers that are down, and URLs too
//! malformed to parse. Stdout, stderr, the status page and the metrics endpoint are all
//! searched for the password.

mod common;
mod http_support;

use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use baton_testkit::postgres::PostgresServer;
use baton_testkit::redis::RedisServer;
use common::*;
use http_support::{METRICS, STATUS, get, serve};
use nix::sys::signal::Signal;

/// The password every URL carries.
const SECRET: &str = "Zq7SecretPw";

/// How long a command that serves or waits (status, worker, subscribe) runs before it is
/// stopped and its output searched.
const SERVING: Duration = Duration::from_millis(1500);

/// Every subcommand, with arguments that reach the store.
const COMMANDS: &[&[&str]] = &[
    &["run", "job", "--", "true"],
    &["lock", "status", "job"],
    &["lock", "list"],
    &["lease", "claim", "l", "--holder", "h"],
    &["lease", "renew", "l", "--holder", "h"],
    &["lease", "status", "l"],
    &["lease", "list"],
    &["lease", "release", "l", "--holder", "h"],
    &["limit", "k", "--max", "5", "--window", "1s"],
    &["cache", "set", "k", "1"],
    &["cache", "get", "k"],
    &["cache", "delete", "k"],
    &["publish", "ch", "1"],
    &["subscribe", "ch", "--count", "1"],
    &["queue", "enqueue", "q", "1"],
    &["queue", "stats"],
    &["schedule", "list"],
    &["worker", "q", "--exit-when-empty", "--", "true"],
    &["doctor"],
    &["--json", "doctor"],
];

/// Fails the test when `text` holds the password, plain or percent-encoded.
#[track_caller]
fn assert_clean(what: &str, text: &str) {
    assert!(
        !text.contains(SECRET) && !text.contains("Zq7Secret"),
        "{what} shows the password:\n{text}"
    );
}

/// Runs `command`, stopping it after [`SERVING`] if it is still running; returns its
/// stdout and stderr.
fn output_of(command: Command) -> String {
    let mut running = Running::spawn(command);
    let started = Instant::now();
    while running.is_running() && started.elapsed() < SERVING {
        thread::sleep(Duration::from_millis(20));
    }
    if running.is_running() {
        running.signal(Signal::SIGTERM);
    }
    let finished = running.finish();
    format!("{}{}", finished.stdout, finished.stderr)
}

fn traced(url: &str, dir: &std::path::Path, args: &[&str]) -> Command {
    let mut command = baton_on(url, dir, args);
    command.env("BATON_LOG", "trace");
    command
}

/// The store at `url` works: the searched output is that of commands that did their job.
fn assert_usable(url: &str) {
    let dir = tempfile::tempdir().unwrap();
    let claimed = Running::spawn(traced(
        url,
        dir.path(),
        &["lease", "claim", "usable", "--holder", "h"],
    ))
    .finish();
    claimed.assert_status(0);
    assert_clean(
        "a lease claim",
        &format!("{}{}", claimed.stdout, claimed.stderr),
    );
}

/// Every subcommand against `url`, several at a time.
fn every_command_keeps_the_secret(url: &str) {
    let dir = tempfile::tempdir().unwrap();
    thread::scope(|scope| {
        for chunk in COMMANDS.chunks(5) {
            let dir = dir.path();
            scope.spawn(move || {
                for args in chunk {
                    let text = output_of(traced(url, dir, args));
                    assert_clean(&format!("baton {} on {url:?}", args.join(" ")), &text);
                }
            });
        }
    });
}

/// The status page, its JSON and the metrics endpoint over `url`.
fn the_pages_keep_the_secret(url: &str) {
    let dir = tempfile::tempdir().unwrap();
    for (args, prefix, paths) in [
        (
            &["status", "--listen", "127.0.0.1:0"][..],
            STATUS,
            &["/", "/status.json"][..],
        ),
        (
            &["serve-metrics", "--listen", "127.0.0.1:0"],
            METRICS,
            &["/metrics"],
        ),
    ] {
        let (running, addr) = serve(traced(url, dir.path(), args), prefix);
        for path in paths {
            let (_, head, body) = get(&addr, path);
            assert_clean(&format!("{path} of {args:?}"), &format!("{head}{body}"));
        }
        running.signal(Signal::SIGTERM);
        let finished = running.finish();
        assert_clean(
            &format!("{args:?} on {url:?}"),
            &format!("{}{}", finished.stdout, finished.stderr),
        );
    }
}

#[test]
fn redis_with_a_password_never_shows_it() {
    let server = RedisServer::start().expect("a private redis-server (apt-get install redis)");
    server
        .command_ok(&["CONFIG", "SET", "requirepass", SECRET])
        .expect("set a password");
    let port = server.port();
    let good = format!("redis://:{SECRET}@127.0.0.1:{port}/0");
    // The right password, in the user part with a user name too, and a wrong one.
    assert_usable(&good);
    for url in [
        good.clone(),
        format!("redis://default:{SECRET}@127.0.0.1:{port}"),
        format!("redis://:{SECRET}x@127.0.0.1:{port}"),
    ] {
        every_command_keeps_the_secret(&url);
    }
    the_pages_keep_the_secret(&good);
}

#[test]
fn postgres_with_a_password_never_shows_it() {
    let server =
        PostgresServer::start().expect("a private PostgreSQL server (apt-get install postgresql)");
    let port = server.port();
    let in_user_part = format!("postgres://postgres:{SECRET}@127.0.0.1:{port}/postgres");
    assert_usable(&in_user_part);
    for url in [
        in_user_part.clone(),
        format!("postgresql://postgres@127.0.0.1:{port}/postgres?password={SECRET}"),
    ] {
        every_command_keeps_the_secret(&url);
    }
    the_pages_keep_the_secret(&in_user_part);
}

/// Servers that are down, and URLs too malformed to parse: every error keeps the secret.
#[test]
fn down_servers_and_malformed_urls_never_show_it() {
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let urls = [
        format!("redis://:{SECRET}@127.0.0.1:{closed}/0?connect_timeout=300ms"),
        format!("rediss://user:{SECRET}@127.0.0.1:{closed}?connect_timeout=300ms"),
        format!("redis+sentinel://:{SECRET}@127.0.0.1:{closed}/mymaster?connect_timeout=300ms"),
        format!("postgres://u:{SECRET}@127.0.0.1:{closed}/db?connect_timeout=1s"),
        format!("postgresql://u@127.0.0.1:{closed}/db?password={SECRET}&connect_timeout=1s"),
        format!("redis:/:{SECRET}@h"),
        format!("redis:{SECRET}@h"),
        format!("postgres//u:{SECRET}@h/db"),
        format!("redis://:{SECRET}@"),
        format!("redis://:{SECRET}@h:notaport"),
        format!("postgres://u:{SECRET}@h:99999/db"),
        format!("redis://:{SECRET}@h/0#fragment"),
        format!("redis://:{SECRET}@h/0?bogus=1"),
        format!("postgres://u@h/db?password={SECRET}&bogus=1"),
        format!("sqlite:///tmp/baton-secrets-test.db?password={SECRET}"),
        format!("memory://:{SECRET}@x"),
        format!("etcd://:{SECRET}@h:2379"),
        format!("nosuch://:{SECRET}@h"),
    ];
    thread::scope(|scope| {
        for url in &urls {
            scope.spawn(move || {
                let dir = tempfile::tempdir().unwrap();
                for args in [
                    &["lock", "list"][..],
                    &["run", "job", "--", "true"],
                    &["doctor"],
                ] {
                    let text = output_of(traced(url, dir.path(), args));
                    assert_clean(&format!("baton {} on {url:?}", args.join(" ")), &text);
                }
            });
        }
    });
}
