//! `baton status --listen ADDR` over real HTTP (the page, its JSON, refusals), and once in
//! headless Chromium, which must render the page to a non-trivial screenshot.
//!
//! The screenshot test needs Debian's `chromium` package (`/usr/bin/chromium`, or the binary
//! named in `BATON_CHROMIUM`). It fails, naming the fix, when Chromium is missing: it is
//! never skipped. `scripts/test` installs the package when run as root.

mod common;
mod http_support;

use std::path::{Path, PathBuf};
use std::process::Command;

use baton_testkit::redis::{RedisOptions, RedisServer};
use common::*;
use http_support::{STATUS, get, request};
use nix::sys::signal::Signal;

/// Starts `baton status` and waits for the address it prints on stderr.
fn serve(command: Command) -> (Running, String) {
    http_support::serve(command, STATUS)
}

/// A `baton run` that holds lock `key` until the file `done` appears in `dir`.
fn hold_lock(base: Command, dir: &Path, key: &str) -> Running {
    hold(base, dir, "started", &["run", "--ttl", "1m", key])
}

/// `baton ARGS -- COMMAND` whose COMMAND touches `marker` in `dir`, then runs until the file
/// `done` appears there; returned once `marker` exists (so whatever ARGS take is held).
fn hold(base: Command, dir: &Path, marker: &str, args: &[&str]) -> Running {
    let mut command = base;
    let script = format!("touch {marker}; while [ ! -e done ]; do sleep 0.05; done");
    command
        .current_dir(dir)
        .args(args)
        .args(["--", "sh", "-c", &script]);
    let running = Running::spawn(command);
    eventually(&format!("{marker} to be held"), || {
        dir.join(marker).exists()
    });
    running
}

/// Holds, on `env`'s SQLite file: two permits of the semaphore `builders` of 3, two readers
/// of the reader-writer lock `model`, the writer of `schema`, and the leadership of the
/// election `scheduler` with a value that needs escaping.
fn hold_primitives(env: &Env) -> Vec<Running> {
    let dir = env.path("");
    let base = || env.baton(Vec::<&str>::new());
    let mut held = Vec::new();
    for marker in ["builder-1", "builder-2"] {
        held.push(hold(
            base(),
            &dir,
            marker,
            &["run", "--ttl", "1m", "--permits", "3", "builders"],
        ));
    }
    for marker in ["reader-1", "reader-2"] {
        held.push(hold(
            base(),
            &dir,
            marker,
            &["run", "--ttl", "1m", "--shared", "model"],
        ));
    }
    held.push(hold(
        base(),
        &dir,
        "writer",
        &["run", "--ttl", "1m", "--exclusive", "schema"],
    ));
    held.push(hold(
        base(),
        &dir,
        "leader",
        &[
            "elect",
            "--id",
            "pod-a",
            "--value",
            "<i>10.0.0.7</i>",
            "--ttl",
            "1m",
            "scheduler",
        ],
    ));
    held
}

/// Lets the holders of [`hold_primitives`] finish.
fn let_go(env: &Env, held: Vec<Running>) {
    std::fs::write(env.path("done"), "").unwrap();
    for running in held {
        running.finish().assert_status(0);
    }
}

#[test]
fn the_page_shows_semaphores_rwlocks_and_elections_with_their_holders() {
    let env = Env::new();
    let held = hold_primitives(&env);
    let (server, addr) = serve(env.baton(["status", "--listen", "127.0.0.1:0"]));

    let (status, head, json) = get(&addr, "/status.json");
    assert_eq!(status, 200, "{head}");
    let json: serde_json::Value = serde_json::from_str(&json).expect("JSON");
    assert_eq!(json["store_error"], serde_json::Value::Null, "{json}");

    let semaphores = json["semaphores"].as_array().expect("a semaphores section");
    assert_eq!(semaphores.len(), 1, "{json}");
    assert_eq!(semaphores[0]["key"], "builders");
    assert_eq!(semaphores[0]["holders"], 2);
    assert_eq!(semaphores[0]["permits"], 3, "N as the grants claimed it");
    let permits = semaphores[0]["held_by"].as_array().unwrap();
    assert_eq!(permits.len(), 2);
    let fences: Vec<u64> = permits
        .iter()
        .map(|p| p["fence"].as_u64().unwrap())
        .collect();
    assert!(fences[0] < fences[1], "oldest first: {fences:?}");
    for permit in permits {
        let remaining = permit["remaining_ms"].as_u64().unwrap();
        assert!(remaining > 0 && remaining <= 60_000, "{permit}");
    }
    assert_eq!(json["semaphores_truncated"], false);

    let rwlocks = json["rwlocks"].as_array().expect("an rwlocks section");
    let keys: Vec<&str> = rwlocks.iter().map(|r| r["key"].as_str().unwrap()).collect();
    assert_eq!(keys, ["model", "schema"], "{json}");
    let (model, schema) = (&rwlocks[0], &rwlocks[1]);
    assert!(model.get("writer").is_none(), "readers only: {model}");
    assert_eq!(model["readers"].as_array().unwrap().len(), 2, "{model}");
    let writer = &schema["writer"];
    assert_eq!(
        writer["holder"], schema["gate"]["holder"],
        "the writer is the gate's holder: {schema}"
    );
    assert!(writer["fence"].as_u64().unwrap() > 0, "{schema}");
    assert!(schema["readers"].as_array().unwrap().is_empty(), "{schema}");
    assert_eq!(json["rwlocks_truncated"], false);

    let elections = json["elections"].as_array().expect("an elections section");
    assert_eq!(elections.len(), 1, "{json}");
    assert_eq!(elections[0]["key"], "scheduler");
    assert_eq!(elections[0]["candidate"], "pod-a");
    assert_eq!(elections[0]["value"], "<i>10.0.0.7</i>");
    assert!(elections[0]["term"].as_u64().unwrap() > 0);
    let remaining = elections[0]["remaining_ms"].as_u64().unwrap();
    assert!(remaining > 0 && remaining <= 60_000, "{remaining}");
    assert_eq!(json["elections_truncated"], false);
    // None of them is a lock or a lease.
    assert!(json["locks"].as_array().unwrap().is_empty(), "{json}");
    assert!(json["leases"].as_array().unwrap().is_empty(), "{json}");

    let (_, _, page) = get(&addr, "/");
    for section in ["Semaphores", "Reader-writer locks", "Elections"] {
        assert!(page.contains(&format!("<h2>{section}</h2>")), "{page}");
    }
    assert!(page.contains("<td class=\"num\">2/3</td>"), "{page}");
    assert!(page.contains(&format!("(fence {}, ", fences[0])), "{page}");
    assert!(page.contains("<code>pod-a</code>"), "{page}");
    assert!(
        page.contains("&lt;i&gt;10.0.0.7&lt;/i&gt;") && !page.contains("<i>10.0.0.7"),
        "the leader's value is escaped:\n{page}"
    );
    let fence = writer["fence"].as_u64().unwrap();
    assert!(
        page.contains(&format!("<td class=\"num\">{fence}</td>")),
        "{page}"
    );
    assert!(
        page.contains("<div class=\"n\">2</div><div class=\"label\">semaphore permits held</div>"),
        "{page}"
    );

    let_go(&env, held);
    eventually("the released holders to leave the page", || {
        let (_, _, json) = get(&addr, "/status.json");
        let json: serde_json::Value = serde_json::from_str(&json).unwrap();
        ["semaphores", "rwlocks", "elections"]
            .iter()
            .all(|section| json[section].as_array().is_some_and(Vec::is_empty))
    });
    let (_, _, page) = get(&addr, "/");
    assert!(page.contains("No semaphore permit is held."), "{page}");
    assert!(page.contains("No reader-writer lock is held."), "{page}");
    assert!(page.contains("No election has a leader."), "{page}");
    server.signal(Signal::SIGTERM);
    server.finish().assert_status(0);
}

#[test]
fn lock_status_shows_the_semaphore_rwlock_and_election_of_the_key() {
    let env = Env::new();
    let held = hold_primitives(&env);
    let status = |key: &str| -> serde_json::Value {
        let out = env.run(["lock", "status", key, "--json"]);
        out.assert_status(0);
        serde_json::from_str(&out.stdout).expect("JSON")
    };

    let builders = status("builders");
    assert_eq!(
        builders["held"], false,
        "the lock itself is free: {builders}"
    );
    assert_eq!(
        builders["permits"].as_array().unwrap().len(),
        2,
        "{builders}"
    );
    assert!(builders.get("rwlock").is_none() && builders.get("leader").is_none());

    let model = status("model");
    let rwlock = &model["rwlock"];
    assert_eq!(rwlock["readers"].as_array().unwrap().len(), 2, "{model}");
    assert!(rwlock.get("writer").is_none(), "{model}");
    assert!(model.get("permits").is_none(), "{model}");

    let schema = status("schema");
    let rwlock = &schema["rwlock"];
    assert_eq!(
        rwlock["writer"]["holder"], rwlock["gate"]["holder"],
        "{schema}"
    );
    assert!(rwlock["readers"].as_array().unwrap().is_empty(), "{schema}");

    let scheduler = status("scheduler");
    assert_eq!(scheduler["leader"]["candidate"], "pod-a", "{scheduler}");
    assert_eq!(scheduler["leader"]["value"], "<i>10.0.0.7</i>");
    assert!(scheduler["leader"]["term"].as_u64().unwrap() > 0);

    // A key that is a prefix of the others shows none of theirs.
    let other = status("mode");
    assert_eq!(
        other,
        serde_json::json!({"key": "mode", "held": false}),
        "nothing of model's"
    );

    let text = env.run(["lock", "status", "model"]);
    text.assert_status(0);
    assert!(text.stdout.starts_with("model: free\n"), "{}", text.stdout);
    assert!(
        text.stdout.contains("rwlock model: no writer; 2 readers"),
        "{}",
        text.stdout
    );
    let text = env.run(["lock", "status", "schema"]).stdout;
    assert!(text.contains("rwlock schema: written by "), "{text}");
    let text = env.run(["lock", "status", "scheduler"]).stdout;
    assert!(
        text.contains("election scheduler: led by pod-a (term "),
        "{text}"
    );
    let text = env.run(["lock", "status", "builders"]).stdout;
    assert!(
        text.contains("semaphore builders: 2 permits held"),
        "{text}"
    );

    let_go(&env, held);
    assert_eq!(
        status("scheduler"),
        serde_json::json!({"key": "scheduler", "held": false})
    );
}

#[test]
fn the_page_and_its_json_show_locks_leases_and_refuse_writes() {
    let env = Env::new();
    env.run([
        "lease",
        "claim",
        "leader",
        "--holder",
        "node-a",
        "--ttl",
        "10m",
        "--reason",
        "<b>primary</b>",
    ])
    .assert_status(0);
    for payload in ["1", "2"] {
        env.run(["queue", "enqueue", "emails", payload])
            .assert_status(0);
    }
    let holder = hold_lock(
        env.baton(Vec::<&str>::new()),
        &env.path(""),
        "nightly-report",
    );
    let (server, addr) = serve(env.baton(["status", "--listen", "127.0.0.1:0", "--refresh", "2s"]));

    let (status, head, json) = get(&addr, "/status.json");
    assert_eq!(status, 200, "{head}");
    assert!(head.contains("Content-Type: application/json"), "{head}");
    let json: serde_json::Value = serde_json::from_str(&json).expect("JSON");
    assert_eq!(json["namespace"], "baton");
    assert_eq!(json["store"], env.url());
    assert_eq!(json["store_error"], serde_json::Value::Null);
    assert_eq!(json["refresh_ms"], 2000);
    let locks = json["locks"].as_array().unwrap();
    assert_eq!(locks.len(), 1, "{json}");
    assert_eq!(locks[0]["key"], "nightly-report");
    assert!(locks[0]["fence"].as_u64().unwrap() > 0);
    let remaining = locks[0]["remaining_ms"].as_u64().unwrap();
    assert!(remaining > 0 && remaining <= 60_000, "{remaining}");
    let leases = json["leases"].as_array().unwrap();
    assert_eq!(leases.len(), 1, "{json}");
    assert_eq!(leases[0]["holder"], "node-a");
    assert_eq!(leases[0]["reason"], "<b>primary</b>");
    assert!(json["events"].is_array());
    // SQLite keeps claimable work: its queues are on the page.
    let queues = json["queues"].as_array().expect("a queues section");
    assert_eq!(queues.len(), 1, "{json}");
    assert_eq!(queues[0]["queue"], "emails");
    assert_eq!(queues[0]["ready"], 2);
    assert_eq!(queues[0]["dead"], 0);
    assert_eq!(json["queues_truncated"], false);

    let (status, head, page) = get(&addr, "/");
    assert_eq!(status, 200, "{head}");
    assert!(
        head.contains("Content-Type: text/html; charset=utf-8"),
        "{head}"
    );
    assert!(
        head.contains("Content-Security-Policy: default-src 'none'"),
        "{head}"
    );
    assert!(
        page.contains("<meta http-equiv=\"refresh\" content=\"2\">"),
        "{page}"
    );
    assert!(page.contains("<code>nightly-report</code>"), "{page}");
    assert!(page.contains("<code>node-a</code>"), "{page}");
    assert!(
        page.contains("&lt;b&gt;primary&lt;/b&gt;"),
        "the reason is not escaped:\n{page}"
    );
    assert!(!page.contains("<b>primary</b>"));
    assert!(!page.contains("<script"), "the page has no script");
    assert!(page.contains("<h2>Queues</h2>"), "{page}");
    assert!(page.contains("<code>emails</code>"), "{page}");

    let (status, head, body) = request(&addr, "HEAD", "/");
    assert_eq!(status, 200, "{head}");
    assert_eq!(body, "", "a HEAD answer has no body");
    for path in ["/", "/status.json", "/locks"] {
        let (_, head, _) = get(&addr, path);
        assert!(
            head.contains("\r\nCache-Control: no-store"),
            "{path}: {head}"
        );
        assert!(
            head.contains("\r\nX-Content-Type-Options: nosniff"),
            "{path}: {head}"
        );
    }
    for (method, path) in [("POST", "/"), ("DELETE", "/status.json"), ("PUT", "/locks")] {
        let (status, head, _) = request(&addr, method, path);
        assert_eq!(status, 405, "{method} {path}: {head}");
        assert!(head.contains("\r\nAllow: GET, HEAD"), "{head}");
    }
    assert_eq!(get(&addr, "/locks").0, 404);

    // The page follows the store: the lock is released when its command ends.
    std::fs::write(env.path("done"), "").unwrap();
    holder.finish().assert_status(0);
    eventually("the released lock to leave the page", || {
        let (_, _, json) = get(&addr, "/status.json");
        let json: serde_json::Value = serde_json::from_str(&json).unwrap();
        json["locks"].as_array().is_some_and(Vec::is_empty)
    });
    server.signal(Signal::SIGTERM);
    server.finish().assert_status(0);
}

#[test]
fn a_store_without_claimable_work_has_no_queue_section() {
    let redis =
        RedisServer::start().expect("a private redis-server (apt-get install redis-server)");
    let dir = tempfile::Builder::new()
        .prefix("baton-status-redis-")
        .tempdir()
        .unwrap();
    let mut status = bare_baton();
    status
        .env("BATON_STORE", redis.url())
        .current_dir(dir.path())
        .args(["status", "--listen", "127.0.0.1:0"]);
    let (server, addr) = serve(status);
    let (code, head, json) = get(&addr, "/status.json");
    assert_eq!(code, 200, "{head}");
    let json: serde_json::Value = serde_json::from_str(&json).expect("JSON");
    assert_eq!(json["store_error"], serde_json::Value::Null, "{json}");
    assert!(json["locks"].is_array());
    assert!(
        json.get("queues").is_none() && json.get("queues_truncated").is_none(),
        "no queue section for a store without queues: {json}"
    );
    let (_, _, page) = get(&addr, "/");
    assert!(!page.contains("<h2>Queues</h2>"), "{page}");
    server.signal(Signal::SIGTERM);
    server.finish().assert_status(0);
}

#[test]
fn bad_arguments_are_usage_errors() {
    let env = Env::new();
    for args in [
        &["status"][..],
        &["status", "--listen", "nowhere"],
        &["status", "--listen", "127.0.0.1:0", "--refresh", "500ms"],
        &["serve-metrics", "--listen", "9464"],
    ] {
        env.run(args).assert_status(USAGE);
    }
}

/// Debian's Chromium, or the binary `BATON_CHROMIUM` names.
fn chromium() -> PathBuf {
    debian_tool("BATON_CHROMIUM", "/usr/bin/chromium", "chromium")
}

/// The width and height in a PNG's IHDR chunk.
fn png_size(png: &[u8]) -> (u32, u32) {
    assert!(
        png.len() > 24 && png.starts_with(b"\x89PNG\r\n\x1a\n"),
        "not a PNG"
    );
    assert_eq!(&png[12..16], b"IHDR");
    let be = |at: usize| u32::from_be_bytes(png[at..at + 4].try_into().unwrap());
    (be(16), be(20))
}

#[test]
fn headless_chromium_renders_the_page() {
    let chromium = chromium();
    // A Redis whose eviction policy is unsafe makes the status process emit an event of its
    // own at connect, so the page has something in every section.
    let redis =
        RedisServer::start_with(RedisOptions::new().args(["--maxmemory-policy", "allkeys-lru"]))
            .expect("a private redis-server (apt-get install redis-server)");
    let url = redis.url();
    let dir = tempfile::Builder::new()
        .prefix("baton-status-shot-")
        .tempdir()
        .unwrap();
    let on_redis = || {
        let mut command = bare_baton();
        command.env("BATON_STORE", &url).current_dir(dir.path());
        command
    };
    for (key, holder, reason) in [
        ("leader", "api-7f9c", "primary API replica"),
        ("billing-migration", "deploy-2291", "schema migration 42"),
    ] {
        let mut claim = on_redis();
        claim.args([
            "lease", "claim", key, "--holder", holder, "--ttl", "10m", "--reason", reason,
        ]);
        Running::spawn(claim).finish().assert_status(0);
    }
    let holder = hold_lock(on_redis(), dir.path(), "nightly-report");
    let mut status = on_redis();
    status.args(["status", "--listen", "127.0.0.1:0"]);
    let (server, addr) = serve(status);
    // The page shows what the screenshot should.
    let (_, _, page) = get(&addr, "/");
    assert!(
        page.contains("baton.redis.eviction_policy_unsafe"),
        "{page}"
    );
    assert!(page.contains("nightly-report") && page.contains("billing-migration"));

    let profile = tempfile::Builder::new()
        .prefix("baton-chromium-")
        .tempdir()
        .unwrap();
    let shot = dir.path().join("status.png");
    let mut browser = Command::new(&chromium);
    browser
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-dev-shm-usage",
            "--hide-scrollbars",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg(format!("--screenshot={}", shot.display()))
        .arg("--window-size=1200,800")
        .arg(format!("http://{addr}/"))
        .env("HOME", profile.path())
        .stdin(std::process::Stdio::null());
    let finished = Running::spawn(browser).finish();
    assert!(
        shot.exists(),
        "chromium wrote no screenshot (status {:?}):\n{}",
        finished.status,
        finished.stderr
    );
    let png = std::fs::read(&shot).unwrap();
    assert_eq!(png_size(&png), (1200, 800));
    // A blank 1200x800 page compresses to a few kilobytes; text and tables do not.
    assert!(
        png.len() > 20_000,
        "the screenshot is nearly empty ({} bytes)",
        png.len()
    );
    if let Some(keep) = std::env::var_os("BATON_KEEP_SCREENSHOT") {
        std::fs::copy(&shot, keep).unwrap();
    }

    std::fs::write(dir.path().join("done"), "").unwrap();
    holder.finish().assert_status(0);
    server.signal(Signal::SIGTERM);
    server.finish().assert_status(0);
}
