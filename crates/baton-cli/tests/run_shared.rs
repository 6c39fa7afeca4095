//! `baton run --shared KEY -- COMMAND`: COMMAND runs under a read lock of the reader-writer
//! lock KEY, beside other readers and never beside a writer (here, one taken through the
//! library on the same SQLite file).

mod common;

use std::time::Duration;

use baton::lock::LockOptions;
use common::*;

/// The fences of the lines of `events` that start with `word` (`word FENCE`).
fn fences(events: &str, word: &str) -> Vec<u64> {
    events
        .lines()
        .filter_map(|line| line.strip_prefix(word)?.trim().parse().ok())
        .collect()
}

/// Two `--shared` runs hold at once; a writer waiting for them keeps a third out (75,
/// naming the read lock) and gets in when they end, with a fence above theirs; a reader after
/// the writer runs with a fence above the writer's.
#[test]
fn shared_runs_read_together_and_a_writer_keeps_new_ones_out() {
    let env = Env::new();
    env.touch("hold");
    let script = r#"echo "started $BATON_FENCE" >> events; while [ -e hold ]; do sleep 0.05; done"#;
    let readers: Vec<Running> = (0..2)
        .map(|_| {
            Running::spawn(
                env.baton(
                    ["run", "--shared", "--wait", "1m", "model", "--"]
                        .into_iter()
                        .chain(sh(script)),
                ),
            )
        })
        .collect();
    eventually("both readers to start", || {
        fences(&env.read("events"), "started").len() == 2
    });
    let read_fences = fences(&env.read("events"), "started");
    assert_ne!(
        read_fences[0], read_fences[1],
        "each read has its own fence"
    );

    let runtime = tokio::runtime::Runtime::new().unwrap();
    let baton = runtime.block_on(baton::connect(env.url())).unwrap();
    let model = baton.rwlock("model").unwrap();
    let options = LockOptions::new(Duration::from_secs(30))
        .wait(Duration::from_secs(60))
        .keep_alive(Duration::from_secs(5));
    let writing = {
        let model = model.clone();
        runtime.spawn(async move { model.write(&options).await })
    };
    eventually("the writer to wait at the gate", || {
        runtime.block_on(model.holders()).unwrap().gate.is_some()
    });
    let out = env.run(["run", "--shared", "model", "--", "touch", "ran"]);
    out.assert_status(CONTENDED);
    assert!(out.stderr.contains("read lock \"model\""), "{}", out.stderr);
    assert!(
        !env.path("ran").exists(),
        "a reader passed a waiting writer"
    );

    std::fs::remove_file(env.path("hold")).unwrap();
    for reader in readers {
        reader.finish().assert_status(0);
    }
    let writer = runtime
        .block_on(writing)
        .unwrap()
        .expect("the writer gets in");
    assert!(read_fences.iter().all(|&f| writer.fence().get() > f));
    let out = env.run([
        "run", "--shared", "--wait", "200ms", "model", "--", "touch", "ran",
    ]);
    out.assert_status(CONTENDED);
    assert!(!env.path("ran").exists(), "a reader beside the writer");
    let writer_fence = writer.fence().get();
    runtime.block_on(writer.release());

    let out = env.run(
        ["run", "--shared", "model", "--"]
            .into_iter()
            .chain(sh(r#"echo "read $BATON_FENCE" >> events"#)),
    );
    out.assert_status(0);
    let after = fences(&env.read("events"), "read");
    assert!(after[0] > writer_fence, "{after:?} after {writer_fence}");
}

/// `--shared` and `--permits` together are a usage error, before any store is touched.
#[test]
fn shared_and_permits_are_a_usage_error() {
    let env = Env::new();
    let out = env.run([
        "run",
        "--shared",
        "--permits",
        "2",
        "model",
        "--",
        "touch",
        "ran",
    ]);
    out.assert_status(USAGE);
    assert!(
        out.stderr.contains("--shared") && out.stderr.contains("--permits"),
        "{}",
        out.stderr
    );
    assert!(!env.path("ran").exists());
    assert!(!env.path("baton.db").exists(), "no store file was created");
}

/// `--exclusive` is the writer beside `--shared` readers: it waits for a reader to end (75
/// when the reader outlasts `--wait`), runs alone with a fence above the reader's, and a
/// reader during its run gives up.
#[test]
fn exclusive_runs_wait_for_shared_ones_and_run_alone() {
    let env = Env::new();
    env.touch("hold");
    let reader = Running::spawn(
        env.baton(["run", "--shared", "model", "--"].into_iter().chain(sh(
            r#"echo "read $BATON_FENCE" >> events; while [ -e hold ]; do sleep 0.05; done"#,
        ))),
    );
    eventually("the reader to start", || {
        !fences(&env.read("events"), "read").is_empty()
    });
    let out = env.run([
        "run",
        "--exclusive",
        "--wait",
        "200ms",
        "model",
        "--",
        "touch",
        "ran",
    ]);
    out.assert_status(CONTENDED);
    assert!(
        out.stderr.contains("write lock \"model\""),
        "{}",
        out.stderr
    );
    assert!(!env.path("ran").exists(), "a writer beside a reader");

    env.touch("writing");
    let writer = Running::spawn(
        env.baton(
            ["run", "--exclusive", "--wait", "1m", "model", "--"]
                .into_iter()
                .chain(sh(r#"echo "write $BATON_FENCE" >> events; while [ -e writing ]; do sleep 0.05; done"#)),
        ),
    );
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        fences(&env.read("events"), "write").is_empty(),
        "the writer ran beside the reader"
    );
    std::fs::remove_file(env.path("hold")).unwrap();
    reader.finish().assert_status(0);
    eventually("the writer to start", || {
        !fences(&env.read("events"), "write").is_empty()
    });
    let (read, write) = (
        fences(&env.read("events"), "read")[0],
        fences(&env.read("events"), "write")[0],
    );
    assert!(write > read, "write fence {write} after read fence {read}");
    let out = env.run([
        "run", "--shared", "--wait", "200ms", "model", "--", "touch", "ran",
    ]);
    out.assert_status(CONTENDED);
    std::fs::remove_file(env.path("writing")).unwrap();
    writer.finish().assert_status(0);
    assert!(!env.path("ran").exists(), "a reader beside the writer");
}

/// `--exclusive` with `--shared`, `--permits` or `--cooldown` is a usage error.
#[test]
fn exclusive_with_other_modes_is_a_usage_error() {
    let env = Env::new();
    for extra in [["--shared", ""], ["--permits", "2"], ["--cooldown", "1m"]] {
        let args: Vec<&str> = ["run", "--exclusive"]
            .into_iter()
            .chain(extra.into_iter().filter(|a| !a.is_empty()))
            .chain(["model", "--", "touch", "ran"])
            .collect();
        let out = env.run(args);
        out.assert_status(USAGE);
        assert!(out.stderr.contains("--exclusive"), "{}", out.stderr);
    }
    assert!(!env.path("ran").exists());
    assert!(!env.path("baton.db").exists(), "no store file was created");
}
