//! Prometheus's own checker agrees with what baton writes: `promtool check rules` passes on
//! the output of `baton alerts`, and `promtool check metrics` (which also lints: counters
//! end in `_total`, every family has help) on the `/metrics` page of a running
//! `baton serve-metrics`; and every counter the rules use is on that page.
//!
//! The checks need `promtool` from Debian's `prometheus` package (`/usr/bin/promtool`, or
//! the binary named in `BATON_PROMTOOL`). They fail, naming the fix, when it is missing:
//! they are never skipped. `scripts/test` installs the package when run as root.

mod common;
mod http_support;

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

use common::*;
use http_support::{METRICS, get, serve};
use nix::sys::signal::Signal;

/// Debian's promtool, or the binary `BATON_PROMTOOL` names.
fn promtool() -> PathBuf {
    debian_tool("BATON_PROMTOOL", "/usr/bin/promtool", "prometheus")
}

/// Runs `promtool ARGS` with `input` on stdin and fails the test, with its output, unless it
/// passes.
fn assert_promtool_passes(args: &[&str], input: &str) {
    let mut child = Command::new(promtool())
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run promtool");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(input.as_bytes())
        .expect("write to promtool");
    let Output {
        status,
        stdout,
        stderr,
    } = child.wait_with_output().expect("wait for promtool");
    assert!(
        status.success(),
        "promtool {} failed ({status}):\n{}{}\ninput:\n{input}",
        args.join(" "),
        String::from_utf8_lossy(&stdout),
        String::from_utf8_lossy(&stderr),
    );
}

fn alerts(args: &[&str]) -> String {
    let mut command = bare_baton();
    command.arg("alerts").args(args);
    let out = Running::spawn(command).finish();
    out.assert_status(0);
    out.stdout
}

/// The `/metrics` page of a `baton serve-metrics` on an SQLite store, then its clean stop.
fn metrics_page() -> String {
    let env = Env::new();
    let (server, addr) = serve(
        env.baton(["serve-metrics", "--listen", "127.0.0.1:0"]),
        METRICS,
    );
    let (status, head, text) = get(&addr, "/metrics");
    assert_eq!(status, 200, "{head}");
    server.signal(Signal::SIGTERM);
    server.finish().assert_status(0);
    text
}

#[test]
fn the_alert_rules_pass_promtool_check_rules() {
    let dir = tempfile::Builder::new()
        .prefix("baton-promtool-")
        .tempdir()
        .unwrap();
    for (name, args) in [
        ("default.yml", &[][..]),
        ("named.yml", &["--group", "baton \"on-call\": 2"][..]),
    ] {
        let path = dir.path().join(name);
        std::fs::write(&path, alerts(args)).unwrap();
        assert_promtool_passes(&["check", "rules", path.to_str().unwrap()], "");
    }
}

#[test]
fn the_metrics_page_passes_promtool_check_metrics() {
    assert_promtool_passes(&["check", "metrics"], &metrics_page());
}

#[test]
fn every_counter_the_alert_rules_use_is_on_the_metrics_page() {
    let page = metrics_page();
    let rules = alerts(&[]);
    let used: Vec<&str> = rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("expr: increase(")?.split('[').next())
        .collect();
    assert!(!used.is_empty(), "no rule expressions in:\n{rules}");
    for name in used {
        let served = page.lines().any(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with(' '))
        });
        assert!(
            served,
            "the rules use {name}, which /metrics does not serve:\n{page}"
        );
        assert!(
            page.contains(&format!("# TYPE {name} counter\n")),
            "{name} is not a counter on /metrics:\n{page}"
        );
    }
}
