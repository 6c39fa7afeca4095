//! Helpers for the tests of the `baton` binary: a private SQLite store per test, commands
//! with timeouts, and polling instead of sleeping.
//!
//! Every wait is a poll with a generous deadline, so the tests hold on a loaded 2-core
//! machine; nothing asserts how fast anything happened.

#![allow(dead_code, unreachable_pub)]

use std::ffi::OsStr;
use std::fs;
use std::io::Read;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tempfile::TempDir;

/// Longest any single baton command may take before the test fails.
pub const TIMEOUT: Duration = Duration::from_secs(120);

/// The exit statuses `baton` documents.
pub const USAGE: i32 = 64;
pub const UNAVAILABLE: i32 = 69;
pub const CONTENDED: i32 = 75;
pub const LOCK_LOST: i32 = 79;
pub const CANNOT_EXECUTE: i32 = 126;
pub const NOT_FOUND: i32 = 127;

/// A temporary directory with a private SQLite store in it.
pub struct Env {
    dir: TempDir,
    url: String,
}

impl Env {
    pub fn new() -> Self {
        let dir = tempfile::Builder::new()
            .prefix("baton-cli-test-")
            .tempdir()
            .expect("temp dir");
        let url = format!("sqlite://{}", dir.path().join("baton.db").display());
        Env { dir, url }
    }

    /// The store's URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// A path inside the temporary directory.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// `baton --store <this store> ARGS...`, with a clean environment for baton's variables.
    pub fn baton<I, S>(&self, args: I) -> Command
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut command = bare_baton();
        command.arg("--store").arg(&self.url).args(args);
        command.current_dir(self.dir.path());
        command
    }

    /// Runs `baton ARGS...` to completion.
    pub fn run<I, S>(&self, args: I) -> Finished
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        Running::spawn(self.baton(args)).finish()
    }

    /// Reads a file in the temporary directory ("" when it does not exist yet).
    pub fn read(&self, name: &str) -> String {
        fs::read_to_string(self.path(name)).unwrap_or_default()
    }

    /// Creates an empty file in the temporary directory.
    pub fn touch(&self, name: &str) {
        fs::write(self.path(name), "").expect("touch");
    }

    /// `baton lock status KEY --json`, parsed.
    pub fn lock_status(&self, key: &str) -> serde_json::Value {
        let out = self.run(["lock", "status", key, "--json"]);
        out.assert_status(0);
        out.json()
    }
}

/// `baton` with none of its environment variables inherited from the test runner.
pub fn bare_baton() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_baton"));
    for var in [
        "BATON_STORE",
        "BATON_NAMESPACE",
        "BATON_HOLDER",
        "BATON_KEY",
        "BATON_FENCE",
    ] {
        command.env_remove(var);
    }
    command.env("BATON_LOG", "warn");
    command.stdin(Stdio::null());
    command
}

/// A `baton` process whose stdout and stderr are collected while it runs.
pub struct Running {
    child: Child,
    stdout: Arc<Mutex<Vec<u8>>>,
    stderr: Arc<Mutex<Vec<u8>>>,
}

/// A `baton` process that has exited.
#[derive(Debug)]
pub struct Finished {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl Running {
    pub fn spawn(mut command: Command) -> Self {
        command.stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = command.spawn().expect("spawn baton");
        let stdout = collect(child.stdout.take().expect("stdout"));
        let stderr = collect(child.stderr.take().expect("stderr"));
        Running {
            child,
            stdout,
            stderr,
        }
    }

    pub fn pid(&self) -> Pid {
        Pid::from_raw(self.child.id() as i32)
    }

    /// Sends `signal` to baton itself (not to COMMAND).
    pub fn signal(&self, signal: Signal) {
        kill(self.pid(), signal).expect("signal baton");
    }

    /// What baton has written to stdout so far.
    pub fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.stdout.lock().unwrap()).into_owned()
    }

    /// What baton has written to stderr so far.
    pub fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.stderr.lock().unwrap()).into_owned()
    }

    /// Whether baton is still running.
    pub fn is_running(&mut self) -> bool {
        self.child.try_wait().expect("try_wait").is_none()
    }

    /// Waits for baton to exit, killing it and failing the test after [`TIMEOUT`].
    pub fn finish(mut self) -> Finished {
        let started = Instant::now();
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                break status;
            }
            if started.elapsed() > TIMEOUT {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!(
                    "baton did not exit within {TIMEOUT:?}; stderr so far:\n{}",
                    self.stderr()
                );
            }
            thread::sleep(Duration::from_millis(20));
        };
        // The pipes close when the last process holding them exits; COMMAND's own children
        // may hold them a little longer, so give the readers a moment rather than blocking.
        let drained = Instant::now();
        while Arc::strong_count(&self.stdout) + Arc::strong_count(&self.stderr) > 2
            && drained.elapsed() < Duration::from_secs(10)
        {
            thread::sleep(Duration::from_millis(10));
        }
        Finished {
            status,
            stdout: String::from_utf8_lossy(&self.stdout.lock().unwrap()).into_owned(),
            stderr: String::from_utf8_lossy(&self.stderr.lock().unwrap()).into_owned(),
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = kill(self.pid(), Signal::SIGCONT);
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn collect(mut pipe: impl Read + Send + 'static) -> Arc<Mutex<Vec<u8>>> {
    let buffer = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&buffer);
    thread::spawn(move || {
        let mut chunk = [0u8; 4096];
        while let Ok(n) = pipe.read(&mut chunk) {
            if n == 0 {
                break;
            }
            sink.lock().unwrap().extend_from_slice(&chunk[..n]);
        }
        drop(sink);
    });
    buffer
}

impl Finished {
    pub fn code(&self) -> Option<i32> {
        self.status.code()
    }

    #[track_caller]
    pub fn assert_status(&self, expected: i32) {
        assert_eq!(
            self.status.code(),
            Some(expected),
            "expected exit status {expected}\nstdout:\n{}\nstderr:\n{}",
            self.stdout,
            self.stderr
        );
    }

    #[track_caller]
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("stdout is not JSON ({e}):\n{}", self.stdout))
    }
}

/// Polls `condition` until it holds, failing the test with `what` after [`TIMEOUT`].
#[track_caller]
pub fn eventually(what: &str, mut condition: impl FnMut() -> bool) {
    let started = Instant::now();
    while !condition() {
        assert!(
            started.elapsed() < TIMEOUT,
            "timed out after {TIMEOUT:?} waiting for {what}"
        );
        thread::sleep(Duration::from_millis(25));
    }
}

/// A `sh -c SCRIPT` COMMAND line for `baton run ... --`.
pub fn sh(script: &str) -> [&str; 3] {
    ["sh", "-c", script]
}

/// The arguments of `baton worker QUEUE OPTIONS... --exit-when-empty -- sh -c SCRIPT`: one
/// worker that stops once the queue has nothing claimable.
pub fn worker_until_empty<'a>(
    queue: &'a str,
    options: &[&'a str],
    script: &'a str,
) -> Vec<&'a str> {
    let mut args = vec!["worker", queue];
    args.extend_from_slice(options);
    args.extend(["--exit-when-empty", "--", "sh", "-c", script]);
    args
}

/// `baton ARGS...` with `BATON_STORE=url`, in `dir`.
pub fn baton_on(url: &str, dir: &std::path::Path, args: &[&str]) -> Command {
    let mut command = bare_baton();
    command.env("BATON_STORE", url).current_dir(dir).args(args);
    command
}

/// The `baton run` scenario shared by the networked stores: against the store at `url`,
/// several processes exclude each other with increasing fences, a contender that cannot
/// wait exits 75 without running its COMMAND, and once `stop` has taken the server down a
/// run exits 69 without running its COMMAND. `prefix` names the temporary directory.
pub fn run_excludes_reports_contention_and_a_down_server(
    url: &str,
    prefix: &str,
    stop: impl FnOnce(),
) {
    let dir = tempfile::Builder::new()
        .prefix(prefix)
        .tempdir()
        .expect("temp dir");
    let read = |name: &str| std::fs::read_to_string(dir.path().join(name)).unwrap_or_default();

    // Processes exclude each other: every run's start and end lines are adjacent, and
    // fences strictly increase in the order the runs held the lock.
    let script = r#"echo "start $BATON_FENCE $$" >> events; sleep 0.2; echo "end $BATON_FENCE $$" >> events"#;
    let runs: Vec<Running> = (0..4)
        .map(|_| {
            Running::spawn(baton_on(
                url,
                dir.path(),
                &[
                    "run",
                    "--wait",
                    "2m",
                    "--ttl",
                    "10s",
                    "shared-job",
                    "--",
                    "sh",
                    "-c",
                    script,
                ],
            ))
        })
        .collect();
    for run in runs {
        run.finish().assert_status(0);
    }
    let events = read("events");
    let lines: Vec<Vec<&str>> = events
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(lines.len(), 8, "every run wrote start and end:\n{events}");
    let mut last_fence = 0u64;
    for pair in lines.chunks(2) {
        assert_eq!(
            (pair[0][0], pair[1][0]),
            ("start", "end"),
            "runs overlapped:\n{events}"
        );
        assert_eq!(pair[0][1..], pair[1][1..], "runs overlapped:\n{events}");
        let fence: u64 = pair[0][1].parse().expect("BATON_FENCE is decimal");
        assert!(fence > last_fence, "fences did not increase:\n{events}");
        last_fence = fence;
    }

    // A held lock: a run that cannot wait exits 75 and does not run its COMMAND.
    let hold = r#"touch held; while [ ! -e done ]; do sleep 0.05; done"#;
    let holder = Running::spawn(baton_on(
        url,
        dir.path(),
        &["run", "--ttl", "10s", "held-job", "--", "sh", "-c", hold],
    ));
    eventually("the holder's COMMAND to start", || {
        dir.path().join("held").exists()
    });
    for wait in ["0s", "300ms"] {
        let out = Running::spawn(baton_on(
            url,
            dir.path(),
            &["run", "--wait", wait, "held-job", "--", "touch", "ran"],
        ))
        .finish();
        out.assert_status(CONTENDED);
        assert!(
            !dir.path().join("ran").exists(),
            "COMMAND ran without the lock"
        );
    }
    std::fs::write(dir.path().join("done"), "").expect("end the holder");
    holder.finish().assert_status(0);

    // The server is down: 69, and COMMAND does not run.
    stop();
    let out = Running::spawn(baton_on(
        url,
        dir.path(),
        &["run", "shared-job", "--", "touch", "ran"],
    ))
    .finish();
    out.assert_status(UNAVAILABLE);
    assert!(
        !dir.path().join("ran").exists(),
        "COMMAND ran without a store"
    );
}

/// A program from a Debian package that a test drives: `default` (`/usr/bin/chromium`), or
/// the binary the environment variable `var` names. A missing one fails the test with a
/// one-line hint (scripts/test installs the package when run as root): never a silent skip.
pub fn debian_tool(var: &str, default: &str, package: &str) -> PathBuf {
    let binary = std::env::var_os(var)
        .filter(|b| !b.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(default));
    assert!(
        binary.exists(),
        "{} is missing: install Debian's {package} package (apt-get install -y {package}; \
         scripts/test installs it when run as root), or name the binary in {var}",
        binary.display()
    );
    binary
}
