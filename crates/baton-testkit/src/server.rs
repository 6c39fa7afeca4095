//! What the private servers ([`redis`](crate::redis), [`postgres`](crate::postgres),
//! [`pgbouncer`](crate::pgbouncer), [`sentinel`](crate::sentinel)) share: a process of the
//! testkit's own on a loopback port, in a temporary directory, started on a free port,
//! waited for with a bound, and killed when dropped.
//!
//! Each server module says how its program is started and when it is ready;
//! [`ServerProcess`] keeps the child, answers the accessors every server has (port, address,
//! directory, pid, running) and turns an exit or a timeout during startup into an error that
//! quotes the log.

use std::ffi::OsStr;
use std::fmt;
use std::fs::OpenOptions;
use std::io;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tempfile::TempDir;

/// The ports of the machine's own Redis and PostgreSQL, which tests never use.
const SHARED_PORTS: [u16; 2] = [6379, 5432];

/// How many times a server is started on a fresh free port before its error is final.
const PORT_ATTEMPTS: u32 = 5;

/// How many lines of a log an error quotes.
const LOG_TAIL: usize = 20;

/// How often a starting server is asked whether it is ready.
const READY_POLL: Duration = Duration::from_millis(10);

/// One server process on a loopback port, with the temporary directory it works in.
///
/// Dropping it kills the process (SIGKILL), then removes the directory.
pub(crate) struct ServerProcess {
    /// The program's name in messages: `redis-server`.
    name: &'static str,
    /// The one-line fix for a machine without the program.
    install_hint: &'static str,
    port: u16,
    /// The name of the log file in `dir`, whose tail the errors quote; `None` for a program
    /// that logs to stderr.
    log: Option<&'static str>,
    dir: TempDir,
    child: Mutex<Option<Child>>,
}

impl fmt::Debug for ServerProcess {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServerProcess")
            .field("name", &self.name)
            .field("port", &self.port)
            .field("dir", &self.dir.path())
            .field("pid", &self.pid())
            .finish()
    }
}

impl fmt::Display for ServerProcess {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} on port {}", self.name, self.port)
    }
}

impl ServerProcess {
    /// A process of program `name`, not started yet, on `port`, in a new temporary
    /// directory (`baton-<name>-...`) with its log in file `log` there, or in its stderr when
    /// `log` is `None`. A missing program is an error with the `install_hint`.
    pub(crate) fn new(
        name: &'static str,
        install_hint: &'static str,
        port: u16,
        log: Option<&'static str>,
    ) -> io::Result<ServerProcess> {
        let prefix = format!("baton-{name}-");
        Ok(ServerProcess {
            name,
            install_hint,
            port,
            log,
            dir: tempfile::Builder::new().prefix(&prefix).tempdir()?,
            child: Mutex::new(None),
        })
    }

    pub(crate) fn port(&self) -> u16 {
        self.port
    }

    /// Moves the process, while it is not running, to another port.
    pub(crate) fn set_port(&mut self, port: u16) {
        self.port = port;
    }

    pub(crate) fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.port))
    }

    pub(crate) fn dir(&self) -> &Path {
        self.dir.path()
    }

    pub(crate) fn log_path(&self) -> PathBuf {
        match self.log {
            Some(log) => self.dir.path().join(log),
            None => self.stderr_path(),
        }
    }

    /// The file the process's stderr is appended to.
    fn stderr_path(&self) -> PathBuf {
        self.dir.path().join(format!("{}.stderr", self.name))
    }

    /// [`spawn`](Self::spawn)s `command`, then [`wait_ready`](Self::wait_ready)s; kills the
    /// process when it does not become ready.
    ///
    /// # Errors
    /// As those two.
    pub(crate) fn start(
        &self,
        command: &mut Command,
        timeout: Duration,
        what: &str,
        ready: impl FnMut() -> Result<(), String>,
    ) -> io::Result<()> {
        self.spawn(command)?;
        self.wait_ready(timeout, what, ready)
            .inspect_err(|_| self.kill())
    }

    /// Starts `command` as this process, its stdin and stdout null and its stderr appended
    /// to a file that an exit during startup quotes.
    ///
    /// # Errors
    /// When it cannot be started: a missing program with the install hint.
    pub(crate) fn spawn(&self, command: &mut Command) -> io::Result<()> {
        assert!(
            !SHARED_PORTS.contains(&self.port),
            "tests never use the machine's own Redis or PostgreSQL"
        );
        let stderr = OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.stderr_path())?;
        let child = command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .map_err(|e| spawn_error(e, command.get_program(), self.install_hint))?;
        *self.child() = Some(child);
        Ok(())
    }

    /// The process id, while the process runs.
    pub(crate) fn pid(&self) -> Option<u32> {
        self.child().as_ref().map(Child::id)
    }

    /// Whether the process is running (a paused process is running).
    pub(crate) fn is_running(&self) -> bool {
        let mut child = self.child();
        match child.as_mut().map(Child::try_wait) {
            Some(Ok(None)) => true,
            Some(_) => {
                *child = None;
                false
            }
            None => false,
        }
    }

    /// The process id of the running process.
    ///
    /// # Errors
    /// When it is not running.
    pub(crate) fn running_pid(&self) -> io::Result<u32> {
        self.pid()
            .ok_or_else(|| io::Error::other(format!("{} is not running", self.name)))
    }

    /// Kills the process (SIGKILL) and reaps it; nothing happens if it is not running.
    pub(crate) fn kill(&self) {
        if let Some(mut child) = self.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// The child, for a caller that stops it in its own way; the process counts as not
    /// running from now on.
    pub(crate) fn take(&self) -> Option<Child> {
        self.child().take()
    }

    /// Waits, polling every 10 ms for at most `timeout`, until `ready` answers `Ok`; `ready`
    /// answers `Err` with what it saw instead. `what` is what the program was to do, for the
    /// error: `answer PING`.
    ///
    /// # Errors
    /// When the process exits meanwhile, or `timeout` passes ([`io::ErrorKind::TimedOut`]);
    /// both quote the log. The process is left as it is: the caller stops it.
    pub(crate) fn wait_ready(
        &self,
        timeout: Duration,
        what: &str,
        mut ready: impl FnMut() -> Result<(), String>,
    ) -> io::Result<()> {
        poll_until(
            timeout,
            READY_POLL,
            || {
                if let Some(status) = self.exited() {
                    return Err(io::Error::other(format!(
                        "{self} exited with {status} during startup; {}",
                        self.diagnostics()
                    )));
                }
                Ok(match ready() {
                    Ok(()) => ControlFlow::Break(()),
                    Err(seen) => ControlFlow::Continue(seen),
                })
            },
            |seen| {
                format!(
                    "{self} did not {what} within {timeout:?} (last: {seen}); {}",
                    self.diagnostics()
                )
            },
        )
    }

    /// The exit status, with what the process wrote to stderr when that is not its log, if
    /// it has exited (and forgets it).
    fn exited(&self) -> Option<String> {
        let mut slot = self.child();
        let status = slot.as_mut()?.try_wait().ok().flatten()?;
        *slot = None;
        let stderr = match self.log {
            Some(_) => std::fs::read_to_string(self.stderr_path()).unwrap_or_default(),
            // It is in the log, which the error quotes anyway.
            None => String::new(),
        };
        Some(match stderr.trim() {
            "" => status.to_string(),
            stderr => format!("{status} (stderr: {stderr:?})"),
        })
    }

    /// The tail of the process's log.
    pub(crate) fn diagnostics(&self) -> String {
        let log = std::fs::read_to_string(self.log_path()).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        format!(
            "its log ({}):\n{}",
            self.log_path().display(),
            lines[lines.len().saturating_sub(LOG_TAIL)..].join("\n")
        )
    }

    fn child(&self) -> MutexGuard<'_, Option<Child>> {
        self.child.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The error for `binary` that cannot be started: a missing one says so with the
/// `install_hint`.
pub(crate) fn spawn_error(e: io::Error, binary: &OsStr, install_hint: &str) -> io::Error {
    let binary = binary.to_string_lossy();
    if e.kind() == io::ErrorKind::NotFound {
        io::Error::new(
            io::ErrorKind::NotFound,
            format!(
                "{binary} was not found; the tests that need it are never skipped: {install_hint}"
            ),
        )
    } else {
        io::Error::new(e.kind(), format!("cannot run {binary}: {e}"))
    }
}

/// A port that was free a moment ago.
pub(crate) fn free_port() -> io::Result<u16> {
    loop {
        let port = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?
            .local_addr()?
            .port();
        if !SHARED_PORTS.contains(&port) {
            return Ok(port);
        }
    }
}

/// Calls `launch` with a free port until it succeeds, five times at most: someone else can
/// take a free port between our probe and the server's bind.
///
/// # Errors
/// The fifth error, or at once a missing program ([`io::ErrorKind::NotFound`]).
pub(crate) fn on_a_free_port<T>(mut launch: impl FnMut(u16) -> io::Result<T>) -> io::Result<T> {
    let mut attempt = 1;
    loop {
        match launch(free_port()?) {
            Ok(value) => return Ok(value),
            Err(e) if e.kind() == io::ErrorKind::NotFound || attempt == PORT_ATTEMPTS => {
                return Err(e);
            }
            Err(_) => attempt += 1,
        }
    }
}

/// Calls `attempt` every `pause` until it succeeds, for at most `timeout`: for a bind that a
/// lingering socket of an old process can delay briefly.
///
/// # Errors
/// The last error when the time is up, or at once a missing program
/// ([`io::ErrorKind::NotFound`]).
pub(crate) fn retry<T>(
    timeout: Duration,
    pause: Duration,
    mut attempt: impl FnMut() -> io::Result<T>,
) -> io::Result<T> {
    let deadline = Instant::now() + timeout;
    loop {
        match attempt() {
            Ok(value) => return Ok(value),
            Err(e) if e.kind() == io::ErrorKind::NotFound || Instant::now() >= deadline => {
                return Err(e);
            }
            Err(_) => std::thread::sleep(pause),
        }
    }
}

/// Calls `check` every `pause` until it breaks with a value, and returns that value; `check`
/// continues with what it saw.
///
/// # Errors
/// An error of `check`, at once; after `timeout`, [`io::ErrorKind::TimedOut`] with the message
/// `timed_out` makes of what `check` saw last.
pub(crate) fn poll_until<T, S>(
    timeout: Duration,
    pause: Duration,
    mut check: impl FnMut() -> io::Result<ControlFlow<T, S>>,
    timed_out: impl FnOnce(S) -> String,
) -> io::Result<T> {
    let deadline = Instant::now() + timeout;
    loop {
        let seen = match check()? {
            ControlFlow::Break(value) => return Ok(value),
            ControlFlow::Continue(seen) => seen,
        };
        if Instant::now() >= deadline {
            return Err(io::Error::new(io::ErrorKind::TimedOut, timed_out(seen)));
        }
        std::thread::sleep(pause);
    }
}

/// A `sh` process that cleans up after a server when this test process exits without
/// dropping it (a `static` server, or a test process that was killed). Dropping the
/// `Watchdog` kills it.
#[derive(Debug)]
pub(crate) struct Watchdog(Child);

impl Watchdog {
    /// Runs the shell script `cleanup` once this process has exited, polling for it every
    /// half second; `$1` in the script is this process's id, `$2`, `$3`, ... are `args`. The
    /// process is named `name` (its `$0`).
    pub(crate) fn spawn(name: &str, cleanup: &str, args: &[&OsStr]) -> io::Result<Watchdog> {
        let script = format!("while kill -0 \"$1\" 2>/dev/null; do sleep 0.5; done\n{cleanup}");
        Command::new("sh")
            .arg("-c")
            .arg(script)
            .arg(name)
            .arg(std::process::id().to_string())
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map(Watchdog)
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
