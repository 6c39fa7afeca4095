//! `baton doctor` against real stores: a healthy SQLite file and one this user cannot
//! write; a private `redis-server` with `--maxmemory-policy allkeys-lru` (a finding naming
//! `maxmemory-policy`) and a healthy one (status 0); a server that is down (69); a private
//! PostgreSQL before and after baton created its schema (status 0) and with a schema from
//! a newer baton (a finding); its claimable-work schema absent, present, newer and
//! unrecorded; `durable_grants` on and off, and the server settings that undo it; the
//! memory store (a finding) and a malformed URL (64).

mod common;

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;

use baton_testkit::postgres::{PostgresOptions, PostgresServer};
use baton_testkit::redis::{RedisOptions, RedisServer};
use common::*;

/// The status of a run with findings.
const FINDINGS: i32 = 78;

fn doctor(url: &str, extra: &[&str]) -> Command {
    let mut command = bare_baton();
    command.args(["--store", url, "doctor"]).args(extra);
    command
}

/// `url` with a response timeout long enough that a loaded machine's slow round trip is
/// not a finding (the check flags round trips over half of it).
fn patient(url: &str) -> String {
    format!("{url}?response_timeout=60s")
}

fn run(command: Command) -> Finished {
    Running::spawn(command).finish()
}

/// The lines of stdout whose first word is `verdict` and second is `name`.
fn lines<'a>(out: &'a Finished, verdict: &str, name: &str) -> Vec<&'a str> {
    out.stdout
        .lines()
        .filter(|l| {
            let mut words = l.split_whitespace();
            words.next() == Some(verdict) && words.next() == Some(name)
        })
        .collect()
}

#[test]
fn a_healthy_sqlite_file_exits_0_and_a_missing_one_is_not_created() {
    let env = Env::new();
    // Not there yet: a note, no finding, and doctor does not create it.
    let out = run(doctor(env.url(), &[]));
    out.assert_status(0);
    assert_eq!(lines(&out, "note", "file").len(), 1, "{}", out.stdout);
    assert!(!env.path("baton.db").exists());

    env.run(["lock", "list"]).assert_status(0);
    let out = run(doctor(env.url(), &[]));
    out.assert_status(0);
    for name in [
        "file",
        "connect",
        "schema",
        "work-schema",
        "wal",
        "permissions",
        "durability",
        "clock",
    ] {
        assert_eq!(
            lines(&out, "ok", name).len(),
            1,
            "no ok {name}:\n{}",
            out.stdout
        );
    }
    assert!(
        out.stdout.ends_with("healthy: no findings\n"),
        "{}",
        out.stdout
    );

    let out = run(doctor(env.url(), &["--json"]));
    out.assert_status(0);
    let json = out.json();
    assert_eq!(json["healthy"], true);
    assert_eq!(json["reachable"], true);
    assert!(
        json["checks"]
            .as_array()
            .unwrap()
            .iter()
            .all(|c| c["verdict"] != "finding")
    );
}

#[test]
fn an_sqlite_file_this_user_cannot_write_is_a_finding() {
    let env = Env::new();
    env.run(["lock", "list"]).assert_status(0);
    let db = env.path("baton.db");
    let dir = db.parent().unwrap().to_owned();
    // As root, permission bits do not stop us: run doctor as an unprivileged user, who can
    // traverse to the file and read it but write neither it nor its directory.
    let root = fs::metadata(&db).unwrap().uid() == 0;
    fs::set_permissions(&db, fs::Permissions::from_mode(0o444)).unwrap();
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o555)).unwrap();
    // The binary may live where that user cannot reach it (a clone under /root): run a copy.
    let copies = tempfile::Builder::new()
        .prefix("baton-cli-bin-")
        .tempdir()
        .unwrap();
    let mut command = doctor(env.url(), &[]);
    if root {
        fs::set_permissions(copies.path(), fs::Permissions::from_mode(0o755)).unwrap();
        let copy = copies.path().join("baton");
        fs::copy(env!("CARGO_BIN_EXE_baton"), &copy).unwrap();
        fs::set_permissions(&copy, fs::Permissions::from_mode(0o755)).unwrap();
        let mut as_nobody = Command::new(&copy);
        as_nobody
            .env("BATON_LOG", "warn")
            .env_remove("BATON_STORE")
            .current_dir("/")
            .args(["--store", env.url(), "doctor"])
            .uid(65534)
            .gid(65534);
        command = as_nobody;
    }
    let out = run(command);
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).unwrap();
    fs::set_permissions(&db, fs::Permissions::from_mode(0o644)).unwrap();

    out.assert_status(FINDINGS);
    let findings = lines(&out, "finding", "permissions");
    assert!(
        !findings.is_empty(),
        "no permissions finding:\n{}",
        out.stdout
    );
    assert!(
        findings[0].contains("cannot open") && findings[0].contains("; fix: give every user"),
        "{}",
        out.stdout
    );
    assert!(
        findings.iter().any(|l| l.contains("-wal and -shm")),
        "the directory is not named:\n{}",
        out.stdout
    );
    // One line per finding, each with its fix.
    for line in out.stdout.lines().filter(|l| l.starts_with("finding")) {
        assert!(line.contains("; fix: "), "{line}");
    }
}

#[test]
fn redis_with_an_evicting_policy_is_a_finding_and_a_healthy_redis_exits_0() {
    let lru =
        RedisServer::start_with(RedisOptions::new().args(["--maxmemory-policy", "allkeys-lru"]))
            .expect("a private redis-server (apt-get install redis-server)");
    let out = run(doctor(&patient(&lru.url()), &[]));
    out.assert_status(FINDINGS);
    let findings = lines(&out, "finding", "maxmemory-policy");
    assert_eq!(findings.len(), 1, "{}", out.stdout);
    assert!(
        findings[0].contains("maxmemory-policy is allkeys-lru"),
        "{}",
        findings[0]
    );
    assert!(
        findings[0].contains("; fix: set maxmemory-policy noeviction"),
        "{}",
        findings[0]
    );
    assert_eq!(
        out.stdout
            .lines()
            .filter(|l| l.starts_with("finding"))
            .count(),
        1
    );
    assert!(out.stdout.ends_with("1 finding\n"), "{}", out.stdout);
    drop(lru);

    let healthy = RedisServer::start().expect("a private redis-server");
    let out = run(doctor(&patient(&healthy.url()), &[]));
    out.assert_status(0);
    for name in ["connect", "server", "clock", "maxmemory-policy"] {
        assert_eq!(
            lines(&out, "ok", name).len(),
            1,
            "no ok {name}:\n{}",
            out.stdout
        );
    }
    // The private server runs without persistence: what that means is a note, not a finding.
    let persistence = lines(&out, "note", "persistence");
    assert_eq!(persistence.len(), 1, "{}", out.stdout);
    assert!(
        persistence[0].contains("fences keep increasing"),
        "{}",
        persistence[0]
    );

    let json = run(doctor(&patient(&healthy.url()), &["--json"]));
    json.assert_status(0);
    assert_eq!(json.json()["healthy"], true);

    // Down: the store cannot be reached at all.
    let url = format!("{}?connect_timeout=1s&response_timeout=1s", healthy.url());
    healthy.kill();
    let out = run(doctor(&url, &[]));
    out.assert_status(UNAVAILABLE);
    assert_eq!(lines(&out, "finding", "connect").len(), 1, "{}", out.stdout);
}

#[test]
fn the_memory_store_is_a_finding_and_bad_urls_are_usage_errors() {
    let out = run(doctor("memory://", &[]));
    out.assert_status(FINDINGS);
    assert_eq!(lines(&out, "finding", "store").len(), 1, "{}", out.stdout);

    let out = run(doctor("mysql://x", &[]));
    out.assert_status(USAGE);
    assert!(out.stderr.contains("mysql"), "{}", out.stderr);
    let out = run(doctor("sqlite://", &[]));
    out.assert_status(USAGE);
}

#[test]
fn the_store_comes_from_the_environment_too() {
    let env = Env::new();
    let mut command = bare_baton();
    command
        .env("BATON_STORE", env.url())
        .current_dir(
            Path::new(env.url().trim_start_matches("sqlite://"))
                .parent()
                .unwrap(),
        )
        .arg("doctor");
    let out = run(command);
    out.assert_status(0);
    assert!(
        out.stdout.starts_with(&format!("store    {}\n", env.url())),
        "{}",
        out.stdout
    );
}

#[test]
fn postgres_before_and_after_the_schema_and_with_a_newer_one() {
    let server =
        PostgresServer::start().expect("a private PostgreSQL (apt-get install postgresql)");
    let url = patient(&server.url());
    let out = run(doctor(&url, &[]));
    out.assert_status(0);
    for name in ["connect", "server", "clock", "pooling"] {
        assert_eq!(
            lines(&out, "ok", name).len(),
            1,
            "no ok {name}:\n{}",
            out.stdout
        );
    }
    // Nothing created yet, and doctor creates nothing.
    assert_eq!(lines(&out, "note", "schema").len(), 1, "{}", out.stdout);
    assert!(
        !server
            .sql("SELECT to_regclass('baton_schema') IS NULL")
            .unwrap()
            .contains('f')
    );

    let mut list = bare_baton();
    list.args(["--store", &url, "lock", "list"]);
    run(list).assert_status(0);
    let out = run(doctor(&url, &[]));
    out.assert_status(0);
    assert_eq!(lines(&out, "ok", "schema").len(), 1, "{}", out.stdout);

    server.sql("UPDATE baton_schema SET version = 99").unwrap();
    let out = run(doctor(&url, &[]));
    out.assert_status(FINDINGS);
    let findings = lines(&out, "finding", "schema");
    assert_eq!(findings.len(), 1, "{}", out.stdout);
    assert!(findings[0].contains("version 99") && findings[0].contains("; fix: upgrade baton"));
}

/// The one line of `verdict name` in stdout.
fn only_line<'a>(out: &'a Finished, verdict: &str, name: &str) -> &'a str {
    let found = lines(out, verdict, name);
    assert_eq!(
        found.len(),
        1,
        "no single {verdict} {name}:\n{}",
        out.stdout
    );
    found[0]
}

#[test]
fn postgres_work_schema_absent_present_newer_and_unrecorded() {
    let server =
        PostgresServer::start().expect("a private PostgreSQL (apt-get install postgresql)");
    let url = patient(&server.url());
    let missing = |table: &str| {
        server
            .sql(&format!("SELECT to_regclass('{table}') IS NULL"))
            .unwrap()
            .trim()
            == "t"
    };

    // A new database: a note, and doctor creates nothing.
    let out = run(doctor(&url, &[]));
    out.assert_status(0);
    let note = only_line(&out, "note", "work-schema");
    assert!(note.contains("no baton_work_schema table"), "{note}");
    assert!(missing("baton_work_schema") && missing("baton_work_item"));
    // The test server runs with fsync=off: grants are not flushed, and the note says why.
    let durable = only_line(&out, "note", "durable-grants");
    assert!(durable.contains("fsync=off"), "{durable}");
    assert!(!durable.contains("durable_grants=off"), "{durable}");

    let mut enqueue = bare_baton();
    enqueue.args(["--store", &url, "queue", "enqueue", "doctor-q", "{}"]);
    run(enqueue).assert_status(0);
    let out = run(doctor(&url, &[]));
    out.assert_status(0);
    let ok = only_line(&out, "ok", "work-schema");
    assert!(ok.contains("baton work schema version "), "{ok}");

    server
        .sql("UPDATE baton_work_schema SET version = 99")
        .unwrap();
    let out = run(doctor(&url, &[]));
    out.assert_status(FINDINGS);
    let finding = only_line(&out, "finding", "work-schema");
    assert!(
        finding.contains("version 99, newer than version ")
            && finding.contains("; fix: upgrade baton"),
        "{finding}"
    );
    // The lease schema is still current: only the work schema is reported.
    assert_eq!(lines(&out, "ok", "schema").len(), 1, "{}", out.stdout);

    // A version no baton wrote: the store refuses it, so doctor does not promise a migration.
    server
        .sql("UPDATE baton_work_schema SET version = 0")
        .unwrap();
    let out = run(doctor(&url, &[]));
    out.assert_status(FINDINGS);
    let finding = only_line(&out, "finding", "work-schema");
    assert!(
        finding.contains("version 0, which no baton wrote"),
        "{finding}"
    );

    server.sql("DELETE FROM baton_work_schema").unwrap();
    let out = run(doctor(&url, &[]));
    out.assert_status(FINDINGS);
    let finding = only_line(&out, "finding", "work-schema");
    assert!(finding.contains("records no version"), "{finding}");

    // A database a baton without work tables left behind: a note again.
    server
        .sql("DROP TABLE baton_work_schema, baton_work_item, baton_work_dedup, baton_work_schedule, baton_work_migration")
        .unwrap();
    let out = run(doctor(&url, &[]));
    out.assert_status(0);
    only_line(&out, "note", "work-schema");
    only_line(&out, "ok", "schema");
}

#[test]
fn postgres_durable_grants_off_is_a_note_and_the_default_is_ok() {
    let server = PostgresServer::start_with(PostgresOptions::new().durable())
        .expect("a private PostgreSQL (apt-get install postgresql)");
    let url = patient(&server.url());
    let out = run(doctor(&url, &[]));
    out.assert_status(0);
    let ok = only_line(&out, "ok", "durable-grants");
    assert!(
        ok.contains("durable_grants=on") && ok.contains("flushed to the WAL"),
        "{ok}"
    );

    let relaxed = format!("{url}&durable_grants=off");
    let out = run(doctor(&relaxed, &[]));
    out.assert_status(0);
    let note = only_line(&out, "note", "durable-grants");
    assert!(
        note.contains("durable_grants=off in the store URL")
            && note.contains("a crash of the server or its host can lose an answered grant")
            && note.contains("; consider: remove durable_grants=off from the store URL"),
        "{note}"
    );
    assert!(!note.contains("fsync"), "{note}");
    let json = run(doctor(&relaxed, &["--json"])).json();
    let check = json["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "durable-grants")
        .cloned()
        .unwrap();
    assert_eq!(check["verdict"], "note");

    // The server can undo durable grants too: synchronous_commit off for the database.
    server
        .sql("ALTER DATABASE postgres SET synchronous_commit = off")
        .unwrap();
    let out = run(doctor(&url, &[]));
    out.assert_status(0);
    let note = only_line(&out, "note", "durable-grants");
    assert!(
        note.contains("synchronous_commit is off") && !note.contains("durable_grants=off"),
        "{note}"
    );
}

/// Behind PgBouncer in transaction mode, a URL without `pooler=transaction` is a finding
/// whose fix is `pooler=transaction` (also with `listen=off`, which does not help); with it
/// and a `listen_url` the pooling check is ok; without `listen_url` it is a note. The pool
/// size is reported against the server's `max_connections`.
#[test]
fn postgres_behind_a_transaction_pooler_gets_the_fix_that_works() {
    use baton_testkit::pgbouncer::{PgBouncer, PoolMode};
    let server =
        PostgresServer::start().expect("a private PostgreSQL (apt-get install postgresql)");
    let pooler = PgBouncer::start(&server, PoolMode::Transaction)
        .expect("a private PgBouncer (apt-get install pgbouncer)");
    let out = run(doctor(
        &format!("{}&listen=off", patient(&pooler.url())),
        &[],
    ));
    out.assert_status(FINDINGS);
    let finding = only_line(&out, "finding", "pooling");
    assert!(
        finding.contains("fix: add pooler=transaction"),
        "{}",
        out.stdout
    );

    let direct: String = server
        .url()
        .bytes()
        .map(|b| match b {
            b':' => "%3A".to_owned(),
            b'/' => "%2F".to_owned(),
            b'@' => "%40".to_owned(),
            b => (b as char).to_string(),
        })
        .collect();
    let url = format!(
        "{}&pooler=transaction&listen_url={direct}",
        patient(&pooler.url())
    );
    let out = run(doctor(&url, &[]));
    only_line(&out, "ok", "pooling");
    let connections = only_line(&out, "ok", "connections");
    assert!(connections.contains("max_connections=200"), "{connections}");

    let out = run(doctor(
        &format!("{}&pooler=transaction", patient(&pooler.url())),
        &[],
    ));
    assert!(
        only_line(&out, "note", "pooling").contains("listen_url"),
        "{}",
        out.stdout
    );
    let out = run(doctor(&patient(&server.url()), &[]));
    assert!(
        only_line(&out, "ok", "connections").contains("up to 11 connection(s)"),
        "{}",
        out.stdout
    );
}

/// Through Sentinel, `baton doctor` reads the primary the sentinels name and reports its
/// replication: role, connected replicas, lag, and what that means for grants and fences;
/// `min_replicas` above the online replicas is a finding.
#[test]
fn redis_through_sentinel_reports_replication() {
    use baton_testkit::sentinel::SentinelTopology;

    let topology = SentinelTopology::start()
        .expect("a private Sentinel topology (apt-get install redis-sentinel)");
    let out = run(doctor(&patient(&topology.url()), &[]));
    out.assert_status(0);
    let replication = lines(&out, "ok", "replication");
    assert_eq!(replication.len(), 1, "{}", out.stdout);
    let primary = topology.servers()[0].port();
    let replica = topology.servers()[1].port();
    for needle in [
        format!("primary of \"baton\" (through Sentinel) at 127.0.0.1:{primary}"),
        "role master, 1 replica(s)".to_owned(),
        format!("127.0.0.1:{replica} online (lag "),
        "min_replicas=0: replication is asynchronous".to_owned(),
        "fences never fall below the server clock".to_owned(),
    ] {
        assert!(
            replication[0].contains(&needle),
            "{needle}: {}",
            replication[0]
        );
    }

    let url = format!("{}&min_replicas=2", patient(&topology.url()));
    let out = run(doctor(&url, &[]));
    out.assert_status(FINDINGS);
    let finding = lines(&out, "finding", "replication");
    assert_eq!(finding.len(), 1, "{}", out.stdout);
    assert!(
        finding[0].contains("min_replicas=2, but 1 of 1 replicas are online"),
        "{}",
        finding[0]
    );
}
