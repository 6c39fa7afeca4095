//! Child test processes, signals, and waiting with a timeout.
//!
//! A multi-process test re-executes its own test binary to run one named test in a child
//! process with a *role* (an environment variable), so the child's code sits in the same
//! file as the parent's:
//!
//! ```no_run
//! use std::time::Duration;
//! use baton_testkit::process::{self, ChildTest};
//!
//! #[test]
//! fn parent() {
//!     let mut child = ChildTest::new("child", "worker")
//!         .env("WORK_DIR", "/tmp/x")
//!         .spawn()
//!         .unwrap();
//!     child.wait_success(Duration::from_secs(60)).unwrap();
//! }
//!
//! #[test]
//! #[ignore = "a child process of `parent`"]
//! fn child() {
//!     let Some(role) = process::role() else { return };
//!     // ... the child's work, for `role` ...
//! }
//! ```
//!
//! The child's stdout and stderr go to a temporary file that [`Child::output`] reads back
//! and every error of [`Child::wait_success`] quotes. A [`Child`] dropped while running is
//! killed, so a failing parent leaves no orphans.

use std::ffi::OsString;
use std::fmt;
use std::fs::OpenOptions;
use std::io;
use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// The environment variable that carries a child's role.
pub const ROLE_ENV: &str = "BATON_TESTKIT_ROLE";

/// This process's role, when it was started by [`ChildTest::spawn`]; `None` in the parent.
pub fn role() -> Option<String> {
    std::env::var(ROLE_ENV).ok().filter(|r| !r.is_empty())
}

/// The value of `name`, which the parent set for this child process (see
/// [`ChildTest::env`]); panics when it is missing.
pub fn parent_env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} is set by the parent"))
}

/// The runtime a child process drives its work on: multi-threaded with two workers, I/O and
/// time enabled.
pub fn child_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// How to start one test of this test binary in a child process.
#[derive(Debug, Clone)]
#[must_use = "a ChildTest does nothing until spawned"]
pub struct ChildTest {
    test: String,
    role: String,
    envs: Vec<(OsString, OsString)>,
}

impl ChildTest {
    /// The test named `test` (its full path in the binary, e.g. `module::name`), run with
    /// `role` in [`ROLE_ENV`]. Ignored tests are run too, so the child's test can be
    /// `#[ignore]`d in ordinary runs.
    pub fn new(test: impl Into<String>, role: impl Into<String>) -> Self {
        ChildTest {
            test: test.into(),
            role: role.into(),
            envs: Vec::new(),
        }
    }

    /// Sets an environment variable of the child.
    pub fn env(mut self, key: impl Into<OsString>, value: impl Into<OsString>) -> Self {
        self.envs.push((key.into(), value.into()));
        self
    }

    /// Starts the child.
    ///
    /// # Errors
    /// When the test binary cannot be found or started, or the output file cannot be made.
    pub fn spawn(self) -> io::Result<Child> {
        let exe = std::env::current_exe()?;
        let output = tempfile::NamedTempFile::new()?;
        // Separate append-mode descriptions: the child's writes never share an offset with
        // our reads.
        let append = || OpenOptions::new().append(true).open(output.path());
        let child = Command::new(exe)
            .args([
                self.test.as_str(),
                "--exact",
                "--include-ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(ROLE_ENV, &self.role)
            .envs(self.envs.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(append()?)
            .stderr(append()?)
            .spawn()?;
        Ok(Child {
            name: format!("{} ({})", self.test, self.role),
            child,
            output,
        })
    }
}

/// A running child test process.
#[derive(Debug)]
pub struct Child {
    name: String,
    child: std::process::Child,
    output: tempfile::NamedTempFile,
}

/// Why [`Child::wait_success`] failed, with the child's output.
#[derive(Debug)]
pub struct ChildError {
    /// What went wrong.
    pub reason: String,
    /// Everything the child printed.
    pub output: String,
}

impl fmt::Display for ChildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}; its output:\n{}", self.reason, self.output)
    }
}

impl std::error::Error for ChildError {}

impl Child {
    /// The child's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Suspends the child (SIGSTOP).
    ///
    /// # Errors
    /// When the signal cannot be sent (the child is gone).
    pub fn pause(&self) -> nix::Result<()> {
        pause(self.pid())
    }

    /// Resumes the child (SIGCONT).
    ///
    /// # Errors
    /// When the signal cannot be sent.
    pub fn resume(&self) -> nix::Result<()> {
        resume(self.pid())
    }

    /// Kills the child (SIGKILL) and reaps it.
    ///
    /// # Errors
    /// When it cannot be killed or waited for.
    pub fn kill(&mut self) -> io::Result<ExitStatus> {
        if let Some(status) = self.child.try_wait()? {
            return Ok(status);
        }
        self.child.kill()?;
        self.child.wait()
    }

    /// Everything the child printed so far.
    pub fn output(&self) -> String {
        match std::fs::read(self.output.path()) {
            Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
            Err(e) => format!("(the child's output cannot be read: {e})"),
        }
    }

    /// Waits up to `timeout` for the child to exit; `None` if it is still running.
    ///
    /// # Errors
    /// When it cannot be waited for.
    pub fn wait_timeout(&mut self, timeout: Duration) -> io::Result<Option<ExitStatus>> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait()? {
                return Ok(Some(status));
            }
            if Instant::now() >= deadline {
                return Ok(None);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Waits up to `timeout` for the child to exit after running its one test
    /// successfully; kills it when the time is up.
    ///
    /// # Errors
    /// When it timed out, failed, or its test filter matched no test, with its output.
    pub fn wait_success(&mut self, timeout: Duration) -> Result<(), ChildError> {
        let fail = |child: &Child, reason: String| ChildError {
            reason: format!("child {}: {reason}", child.name),
            output: child.output(),
        };
        let status = match self.wait_timeout(timeout) {
            Ok(Some(status)) => status,
            Ok(None) => {
                let _ = self.kill();
                return Err(fail(
                    self,
                    format!("still running after {timeout:?}; killed"),
                ));
            }
            Err(e) => return Err(fail(self, format!("cannot be waited for: {e}"))),
        };
        if !status.success() {
            return Err(fail(self, format!("exited with {status}")));
        }
        if !self.output().contains("test result: ok. 1 passed") {
            return Err(fail(
                self,
                "ran no test; is the test name exact?".to_owned(),
            ));
        }
        Ok(())
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.kill();
    }
}

fn signal(pid: u32, signal: Signal) -> nix::Result<()> {
    let pid = i32::try_from(pid).map_err(|_| nix::errno::Errno::ESRCH)?;
    kill(Pid::from_raw(pid), signal)
}

/// Suspends process `pid` (SIGSTOP), as a long GC pause or a stalled VM would.
///
/// # Errors
/// When the signal cannot be sent.
pub fn pause(pid: u32) -> nix::Result<()> {
    signal(pid, Signal::SIGSTOP)
}

/// Resumes process `pid` (SIGCONT).
///
/// # Errors
/// When the signal cannot be sent.
pub fn resume(pid: u32) -> nix::Result<()> {
    signal(pid, Signal::SIGCONT)
}

/// Kills process `pid` (SIGKILL) without reaping it.
///
/// # Errors
/// When the signal cannot be sent.
pub fn kill_hard(pid: u32) -> nix::Result<()> {
    signal(pid, Signal::SIGKILL)
}

/// A condition that did not become true in time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimedOut {
    /// What was waited for.
    pub what: String,
    /// How long.
    pub waited: Duration,
}

impl fmt::Display for TimedOut {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} did not happen within {:?}", self.what, self.waited)
    }
}

impl std::error::Error for TimedOut {}

/// Polls `condition` every 10 ms until it holds or `timeout` passes, blocking the thread.
///
/// # Errors
/// [`TimedOut`] naming `what`.
pub fn wait_until(
    what: &str,
    timeout: Duration,
    mut condition: impl FnMut() -> bool,
) -> Result<(), TimedOut> {
    let deadline = Instant::now() + timeout;
    while !condition() {
        if Instant::now() >= deadline {
            return Err(TimedOut {
                what: what.to_owned(),
                waited: timeout,
            });
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(())
}

/// [`wait_until`] for async tests: polls without blocking the runtime.
///
/// # Errors
/// [`TimedOut`] naming `what`.
pub async fn wait_until_async(
    what: &str,
    timeout: Duration,
    mut condition: impl FnMut() -> bool,
) -> Result<(), TimedOut> {
    let deadline = Instant::now() + timeout;
    while !condition() {
        if Instant::now() >= deadline {
            return Err(TimedOut {
                what: what.to_owned(),
                waited: timeout,
            });
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(())
}

/// Waits until `path` exists.
///
/// # Errors
/// [`TimedOut`] naming the path.
pub fn wait_for_file(path: impl AsRef<Path>, timeout: Duration) -> Result<(), TimedOut> {
    let path = path.as_ref();
    wait_until(&format!("{} to appear", path.display()), timeout, || {
        path.exists()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn child_runs_one_test_with_its_role_and_env() {
        let dir = tempfile::tempdir().unwrap();
        let marker = dir.path().join("marker");
        let mut child = ChildTest::new("process::tests::child_writes_marker", "marker")
            .env("MARKER", &marker)
            .spawn()
            .unwrap();
        child.wait_success(Duration::from_secs(60)).unwrap();
        assert_eq!(std::fs::read_to_string(&marker).unwrap(), "marker");
        assert!(
            child.output().contains("child_writes_marker"),
            "{}",
            child.output()
        );
    }

    #[test]
    #[ignore = "a child process of child_runs_one_test_with_its_role_and_env"]
    fn child_writes_marker() {
        let Some(role) = role() else { return };
        let marker = std::env::var_os("MARKER").expect("MARKER is set");
        std::fs::write(marker, role).unwrap();
    }

    #[test]
    #[ignore = "a child process of paused_children_make_no_progress_until_resumed_and_can_be_killed"]
    fn child_ticks() {
        let Some(_) = role() else { return };
        let path = std::env::var_os("TICKS").expect("TICKS is set");
        for n in 0u64.. {
            std::fs::write(&path, n.to_string()).unwrap();
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn paused_children_make_no_progress_until_resumed_and_can_be_killed() {
        let dir = tempfile::tempdir().unwrap();
        let ticks = dir.path().join("ticks");
        let mut child = ChildTest::new("process::tests::child_ticks", "ticker")
            .env("TICKS", &ticks)
            .spawn()
            .unwrap();
        wait_for_file(&ticks, Duration::from_secs(60)).unwrap();
        let read = || std::fs::read_to_string(&ticks).unwrap_or_default();
        child.pause().unwrap();
        std::thread::sleep(Duration::from_millis(50));
        let frozen = read();
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(read(), frozen, "a stopped child wrote");
        child.resume().unwrap();
        wait_until("the child to tick again", Duration::from_secs(30), || {
            read() != frozen
        })
        .unwrap();
        let status = child.kill().unwrap();
        assert!(!status.success());
        let err = child.wait_success(Duration::from_secs(1)).unwrap_err();
        assert!(err.reason.contains("exited with"), "{err}");
    }

    #[test]
    fn a_filter_that_matches_nothing_is_an_error() {
        let mut child = ChildTest::new("no::such::test", "x").spawn().unwrap();
        let err = child.wait_success(Duration::from_secs(60)).unwrap_err();
        assert!(err.reason.contains("ran no test"), "{err}");
    }

    #[test]
    fn waiting_times_out_with_a_name() {
        let err = wait_until("nothing", Duration::from_millis(30), || false).unwrap_err();
        assert_eq!(err.to_string(), "nothing did not happen within 30ms");
        assert!(wait_for_file("/", Duration::from_millis(1)).is_ok());
    }
}
