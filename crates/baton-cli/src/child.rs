//! COMMAND as a child process: spawned in its own process group so that it dies with baton,
//! signalled as a group, waited for until its whole group is gone, and its exit status
//! translated the way shells do.
//!
//! Why its own group: a lost lock must stop *all* of COMMAND's work, and COMMAND is often a
//! shell script whose real work runs in grandchildren; signalling the group reaches them.
//! It also keeps Ctrl-C from reaching COMMAND twice (once from the terminal, once forwarded
//! by baton): the terminal signals only baton's group, and baton forwards exactly once.
//! The cost: COMMAND is not in the terminal's foreground group, so an interactive COMMAND
//! that reads from the terminal is stopped with SIGTTIN. `baton run` is meant for jobs.
//!
//! ## Behavior
//! - **Supervisor death:** on Linux COMMAND is started through `baton exec-guard` (see
//!   [`crate::guard_cmd`]), so the kernel sends it SIGKILL when baton dies, even by
//!   SIGKILL. The signal is tied to the thread that spawned COMMAND: [`Child::spawn_with`]
//!   refuses to spawn from any thread but baton's main one. Other platforms spawn COMMAND
//!   directly and keep no such promise.
//! - **The whole group:** [`Child::wait`] returns once COMMAND has exited *and* its process
//!   group is empty. Processes COMMAND left running in its group get SIGTERM when it exits,
//!   then SIGKILL after the grace; a termination already under way keeps its deadline.
//!   Exited processes that nobody reaped (zombies) do not count: they run nothing.
//! - A process that left COMMAND's group (`setsid`, `setpgid`) is out of baton's reach.
//!
//! `baton worker` runs one COMMAND per claimed item the same way, with the payload on a
//! piped stdin ([`Child::spawn_with`], [`Child::take_stdin`]), and marks each child
//! [`kill_group_on_drop`](Child::kill_group_on_drop) so that a COMMAND whose supervising
//! task is dropped (the worker gave up waiting for it) never outlives baton's interest in it.

use std::ffi::OsString;
use std::future::pending;
use std::io;
use std::os::unix::process::ExitStatusExt;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use baton::telemetry::{self, events};
use nix::errno::Errno;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::process::{Child as TokioChild, ChildStdin, Command};
use tokio::time::{Instant, sleep, sleep_until};

use crate::exit::{CANNOT_EXECUTE, Failure, NOT_FOUND, SIGNAL_BASE};
use crate::output::human_duration;

/// How soon an exited COMMAND's group is checked again for processes still running in it;
/// the pause doubles after each check, up to [`GROUP_POLL_MAX`].
const GROUP_POLL: Duration = Duration::from_millis(10);
/// The longest pause between two checks of a group (each one reads `/proc` on Linux).
const GROUP_POLL_MAX: Duration = Duration::from_millis(500);

/// A running COMMAND, the leader of its own process group.
pub(crate) struct Child {
    process: TokioChild,
    group: Pid,
    name: String,
    /// How COMMAND is named in baton's messages: its name, or more (the worker's item).
    label: String,
    /// Time between SIGTERM and SIGKILL.
    grace: Duration,
    /// COMMAND's status once [`Child::wait`] has reaped it.
    status: Option<ExitStatus>,
    /// When SIGKILL goes to the group, while a termination is under way.
    kill_at: Option<Instant>,
    /// Whether the group was seen empty: from then on its id may be reused, and nothing is
    /// sent to it.
    group_empty: bool,
    /// Whether dropping a child whose group is not empty sends SIGKILL to the group.
    kill_on_drop: bool,
}

impl Child {
    /// Spawns `command` (program and arguments) with `env` added to baton's environment, in
    /// a new process group, inheriting stdin, stdout and stderr; SIGKILL follows SIGTERM
    /// after `grace`.
    ///
    /// # Errors
    /// Status 127 when the program was not found, 126 when it could not be executed.
    pub(crate) async fn spawn(
        command: &[OsString],
        env: &[(&str, String)],
        grace: Duration,
    ) -> Result<Self, Failure> {
        Child::spawn_with(command, grace, |process| {
            process.envs(env.iter().map(|(k, v)| (k, v)));
        })
        .await
    }

    /// As [`Child::spawn`], after `configure` has changed the command (environment, stdin,
    /// stdout); COMMAND runs in its own process group whatever `configure` does.
    ///
    /// # Errors
    /// As [`Child::spawn`]; status 70 when called from a thread other than baton's main one
    /// (COMMAND would be killed when that thread exits).
    pub(crate) async fn spawn_with(
        command: &[OsString],
        grace: Duration,
        configure: impl FnOnce(&mut Command),
    ) -> Result<Self, Failure> {
        let (program, args) = command
            .split_first()
            .ok_or_else(|| Failure::usage("no COMMAND given after --"))?;
        let name = program.to_string_lossy().into_owned();
        let (process, report) = launch(program, args, configure).map_err(|e| match e {
            Launch::Spawn(e) => spawn_failure(&name, &e),
            Launch::Failed(failure) => failure,
        })?;
        let pid = process
            .id()
            .ok_or_else(|| Failure::new(CANNOT_EXECUTE, format!("{name} exited at once")))?;
        let group = Pid::from_raw(i32::try_from(pid).map_err(|_| {
            Failure::new(CANNOT_EXECUTE, format!("{name} has pid {pid} out of range"))
        })?);
        watch('+', group);
        let mut child = Child {
            process,
            group,
            label: name.clone(),
            name,
            grace,
            status: None,
            kill_at: None,
            group_empty: false,
            kill_on_drop: false,
        };
        if let Some((status, message)) = report.started().await {
            // The guard could not exec COMMAND and is exiting: reap it.
            let _ = child.process.wait().await;
            child.emptied();
            return Err(Failure::new(status, message));
        }
        Ok(child)
    }

    /// The same child, which SIGKILLs its process group when dropped before the group was
    /// seen empty. For a supervising task that may be aborted: nobody would be left to stop
    /// COMMAND.
    pub(crate) fn kill_group_on_drop(mut self) -> Self {
        self.kill_on_drop = true;
        self
    }

    /// The same child, named `label` in baton's messages.
    pub(crate) fn labelled(mut self, label: String) -> Self {
        self.label = label;
        self
    }

    /// COMMAND's stdin, when it was spawned with a piped one (once).
    pub(crate) fn take_stdin(&mut self) -> Option<ChildStdin> {
        self.process.stdin.take()
    }

    /// The program's name, as given.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// Sends `signal` to COMMAND's process group. A group that is already gone is not an
    /// error: COMMAND is exiting anyway. Once [`Child::wait`] has seen the group empty,
    /// nothing is sent (its id may belong to someone else by then).
    pub(crate) fn signal(&self, signal: Signal) {
        if self.group_empty {
            return;
        }
        match killpg(self.group, signal) {
            Ok(()) => tracing::debug!(group = self.group.as_raw(), %signal, "signalled COMMAND"),
            Err(e) => {
                tracing::debug!(group = self.group.as_raw(), %signal, "signal not delivered: {e}")
            }
        }
    }

    /// Sends SIGTERM to the group, and SIGKILL after the grace (from [`Child::wait`]). A
    /// termination already under way keeps its earlier SIGKILL.
    pub(crate) fn terminate(&mut self) {
        self.signal(Signal::SIGTERM);
        let at = Instant::now() + self.grace;
        self.kill_at = Some(self.kill_at.map_or(at, |earlier| earlier.min(at)));
    }

    /// Sends SIGKILL to the group now.
    pub(crate) fn kill(&mut self) {
        self.signal(Signal::SIGKILL);
        self.kill_at = None;
    }

    /// Waits for COMMAND to exit and then for its process group to be empty; answers
    /// COMMAND's status. When COMMAND exits with processes left in its group, they get
    /// SIGTERM, and SIGKILL after the grace; a SIGKILL scheduled by [`Child::terminate`] is
    /// sent from here. Cancel safe: every step is recorded in `self`.
    pub(crate) async fn wait(&mut self) -> io::Result<ExitStatus> {
        loop {
            let kill_at = self.kill_at;
            let kill_timer = async move {
                match kill_at {
                    Some(at) => sleep_until(at).await,
                    None => pending().await,
                }
            };
            match self.status {
                Some(status) if self.group_empty => return Ok(status),
                Some(_) => {
                    let group = self.group;
                    tokio::select! {
                        () = group_emptied(group) => self.emptied(),
                        () = kill_timer => self.kill_due(),
                    }
                }
                None => {
                    tokio::select! {
                        status = self.process.wait() => self.exited(status?),
                        () = kill_timer => self.kill_due(),
                    }
                }
            }
        }
    }

    /// COMMAND was reaped: terminate what it left in its group.
    fn exited(&mut self, status: ExitStatus) {
        self.status = Some(status);
        if !group_has_members(self.group) {
            self.emptied();
        } else if self.kill_at.is_none() {
            say!(
                "baton: {} exited; processes it started still run in its process group: sent SIGTERM, SIGKILL follows in {}",
                self.label,
                human_duration(self.grace)
            );
            telemetry::emit(
                &events::SUPERVISOR_GROUP_OUTLIVED_COMMAND,
                None,
                format_args!("{} exited before its process group emptied", self.label),
            );
            self.terminate();
        }
    }

    /// The group was seen empty: nothing is sent to it any more.
    fn emptied(&mut self) {
        self.group_empty = true;
        watch('-', self.group);
    }

    /// The grace after SIGTERM is over.
    fn kill_due(&mut self) {
        self.kill_at = None;
        say!(
            "baton: {} still running {} after SIGTERM; sending SIGKILL to its process group",
            self.label,
            human_duration(self.grace)
        );
        self.signal(Signal::SIGKILL);
    }
}

impl Drop for Child {
    /// With [`Child::kill_group_on_drop`], SIGKILLs a group that was not seen empty.
    /// Sending a signal does not block; tokio reaps the process in the background. Without
    /// it, the group stays with the watchdog, which kills it when baton exits.
    fn drop(&mut self) {
        if self.kill_on_drop && !self.group_empty {
            tracing::debug!(
                group = self.group.as_raw(),
                "dropped while running; killing COMMAND's process group"
            );
            let _ = killpg(self.group, Signal::SIGKILL);
            watch('-', self.group);
        }
    }
}

/// This baton's group watchdog (Linux, see [`crate::guard_cmd::watch`]).
#[cfg(target_os = "linux")]
enum Watchdog {
    /// No COMMAND has run yet.
    NotStarted,
    /// Its stdin: `+PGID` and `-PGID` lines.
    Running(std::process::ChildStdin),
    /// It could not be started, or is gone: said once on stderr.
    Failed,
}

#[cfg(target_os = "linux")]
static WATCHDOG: std::sync::Mutex<Watchdog> = std::sync::Mutex::new(Watchdog::NotStarted);

/// Tells the watchdog that `group` may now hold COMMAND's processes (`+`), or no longer
/// does (`-`); starts it with the first group. It kills the groups still listed when baton
/// is gone, so that what COMMAND started dies with baton too.
#[cfg(target_os = "linux")]
fn watch(sign: char, group: Pid) {
    use std::io::Write;
    use std::os::unix::process::CommandExt;

    let mut watchdog = WATCHDOG
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if matches!(*watchdog, Watchdog::NotStarted) {
        // In a group of its own: the signals sent to baton's group or to COMMAND's do not
        // reach it.
        let started = std::process::Command::new("/proc/self/exe")
            .arg0("baton")
            .arg(crate::guard_cmd::WATCH_SUBCOMMAND)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .process_group(0)
            .spawn()
            .and_then(|mut child| {
                child
                    .stdin
                    .take()
                    .ok_or_else(|| io::Error::other("no stdin"))
            });
        *watchdog = match started {
            Ok(stdin) => Watchdog::Running(stdin),
            Err(e) => {
                telemetry::emit(
                    &events::SUPERVISOR_WATCHDOG_UNAVAILABLE,
                    None,
                    format_args!("cannot start the group watchdog: {e}"),
                );
                Watchdog::Failed
            }
        };
    }
    if let Watchdog::Running(stdin) = &mut *watchdog
        && let Err(e) = writeln!(stdin, "{sign}{}", group.as_raw())
    {
        telemetry::emit(
            &events::SUPERVISOR_WATCHDOG_UNAVAILABLE,
            None,
            format_args!("the group watchdog is gone: {e}"),
        );
        *watchdog = Watchdog::Failed;
    }
}

/// No watchdog where there is no parent-death signal either.
#[cfg(not(target_os = "linux"))]
fn watch(_sign: char, _group: Pid) {}

/// Why COMMAND did not start.
enum Launch {
    /// The process could not be spawned.
    Spawn(io::Error),
    /// baton refused to spawn it (Linux only: from a thread other than the main one).
    #[cfg_attr(not(target_os = "linux"), allow(dead_code))]
    Failed(Failure),
}

/// Spawns `program` in a new process group: on Linux through `baton exec-guard`, which
/// reports through the returned [`Report`] whether COMMAND started.
#[cfg(target_os = "linux")]
fn launch(
    program: &OsString,
    args: &[OsString],
    configure: impl FnOnce(&mut Command),
) -> Result<(TokioChild, Report), Launch> {
    use nix::fcntl::{FcntlArg, FdFlag, OFlag, fcntl};
    use std::os::fd::AsRawFd;

    // The parent-death signal fires when the spawning *thread* exits, not the process.
    if nix::unistd::gettid() != nix::unistd::getpid() {
        return Err(Launch::Failed(Failure::new(
            crate::exit::INTERNAL,
            "COMMAND must be started from baton's main thread, which lives as long as baton",
        )));
    }
    let (read, write) =
        nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(|e| Launch::Spawn(io::Error::from(e)))?;
    let mut process = Command::new("/proc/self/exe");
    process
        .arg0("baton")
        .arg(crate::guard_cmd::SUBCOMMAND)
        .arg("--parent")
        .arg(std::process::id().to_string())
        .arg("--report-fd")
        .arg(write.as_raw_fd().to_string())
        .arg("--")
        .arg(program)
        .args(args)
        .stdin(Stdio::inherit())
        .stdout(Stdio::inherit())
        .stderr(Stdio::inherit());
    configure(&mut process);
    // Only this spawn inherits the write end: baton spawns from its main thread alone, and
    // nothing runs between here and `drop(write)`.
    fcntl(&write, FcntlArg::F_SETFD(FdFlag::empty()))
        .map_err(|e| Launch::Spawn(io::Error::from(e)))?;
    let spawned = process.process_group(0).spawn();
    drop(write);
    let process = spawned.map_err(Launch::Spawn)?;
    let report = tokio::net::unix::pipe::Receiver::from_owned_fd(read).map_err(Launch::Spawn)?;
    Ok((process, Report(Some(report))))
}

/// Spawns `program` in a new process group. Without a parent-death signal, COMMAND
/// outlives a baton killed with SIGKILL on this platform.
#[cfg(not(target_os = "linux"))]
fn launch(
    program: &OsString,
    args: &[OsString],
    configure: impl FnOnce(&mut Command),
) -> Result<(TokioChild, Report), Launch> {
    let mut process = Command::new(program);
    process
        .args(args)
        .stdin(Stdio::inherit())
        .stdout(Stdio::inherit())
        .stderr(Stdio::inherit());
    configure(&mut process);
    let process = process.process_group(0).spawn().map_err(Launch::Spawn)?;
    Ok((process, Report(None)))
}

/// The read end of `baton exec-guard`'s report pipe.
#[cfg(target_os = "linux")]
type ReportPipe = tokio::net::unix::pipe::Receiver;
/// No report pipe: COMMAND is spawned directly.
#[cfg(not(target_os = "linux"))]
type ReportPipe = std::convert::Infallible;

/// Whether COMMAND started, as the guard reports it (no pipe: spawning was enough).
struct Report(Option<ReportPipe>);

impl Report {
    /// `None` once COMMAND has started; the status and reason when it could not.
    async fn started(self) -> Option<(u8, String)> {
        let pipe = self.0?;
        #[cfg(target_os = "linux")]
        {
            use tokio::io::AsyncReadExt;
            let mut pipe = pipe;
            let mut report = Vec::new();
            match pipe.read_to_end(&mut report).await {
                Ok(_) => crate::guard_cmd::parse_report(&report),
                Err(e) => Some((
                    crate::exit::INTERNAL,
                    format!("cannot read whether COMMAND started: {e}"),
                )),
            }
        }
        #[cfg(not(target_os = "linux"))]
        match pipe {}
    }
}

/// Whether a process that can still run is in `group`.
fn group_has_members(group: Pid) -> bool {
    match killpg(group, None) {
        Err(Errno::ESRCH) => false,
        // Members baton may not signal (EPERM) are members all the same.
        Err(_) => true,
        Ok(()) => live_member(group),
    }
}

/// Resolves once no process that can still run is in `group`.
async fn group_emptied(group: Pid) {
    let mut pause = GROUP_POLL;
    while group_has_members(group) {
        sleep(pause).await;
        pause = (pause * 2).min(GROUP_POLL_MAX);
    }
}

/// Whether a process of `group` is not a zombie. A zombie keeps its group alive for
/// `kill`, but runs nothing; its parent (or init, which in some containers never does) has
/// yet to reap it.
#[cfg(target_os = "linux")]
fn live_member(group: Pid) -> bool {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return true;
    };
    entries.flatten().any(|entry| {
        let is_pid = entry
            .file_name()
            .to_str()
            .is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()));
        is_pid
            && std::fs::read_to_string(entry.path().join("stat"))
                .ok()
                .and_then(|stat| parse_stat(&stat))
                .is_some_and(|(state, pgrp)| pgrp == group.as_raw() && !matches!(state, 'Z' | 'X'))
    })
}

/// Elsewhere `kill` is the only view: init reaps orphans there.
#[cfg(not(target_os = "linux"))]
fn live_member(_group: Pid) -> bool {
    true
}

/// The state and process group in a `/proc/PID/stat` line: `PID (COMM) STATE PPID PGRP ...`,
/// where COMM may hold spaces and parentheses.
#[cfg(target_os = "linux")]
fn parse_stat(stat: &str) -> Option<(char, i32)> {
    let (_, rest) = stat.rsplit_once(')')?;
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let _ppid = fields.next()?;
    let pgrp = fields.next()?.parse().ok()?;
    Some((state, pgrp))
}

/// The status a shell would report for `status`: the exit code, or 128 + the signal.
pub(crate) fn shell_status(status: ExitStatus) -> u8 {
    match (status.code(), status.signal()) {
        (Some(code), _) => u8::try_from(code & 0xff).unwrap_or(u8::MAX),
        (None, Some(signal)) => SIGNAL_BASE.saturating_add(u8::try_from(signal).unwrap_or(0)),
        (None, None) => SIGNAL_BASE,
    }
}

/// How a shell reports a command it could not start.
pub(crate) fn spawn_failure(name: &str, error: &io::Error) -> Failure {
    match error.kind() {
        io::ErrorKind::NotFound => {
            Failure::new(NOT_FOUND, format!("cannot run {name}: command not found"))
        }
        _ => Failure::new(CANNOT_EXECUTE, format!("cannot run {name}: {error}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_as_shells_report_them() {
        assert_eq!(shell_status(ExitStatus::from_raw(0)), 0);
        assert_eq!(shell_status(ExitStatus::from_raw(3 << 8)), 3);
        assert_eq!(shell_status(ExitStatus::from_raw(255 << 8)), 255);
        // Killed by SIGTERM (15) and SIGKILL (9).
        assert_eq!(shell_status(ExitStatus::from_raw(15)), 143);
        assert_eq!(shell_status(ExitStatus::from_raw(9)), 137);
    }

    #[test]
    fn spawn_failures_as_shells_report_them() {
        let not_found = io::Error::from(io::ErrorKind::NotFound);
        assert_eq!(spawn_failure("x", &not_found).status, NOT_FOUND);
        let denied = io::Error::from(io::ErrorKind::PermissionDenied);
        assert_eq!(spawn_failure("x", &denied).status, CANNOT_EXECUTE);
    }

    /// The parent-death signal would fire when the spawning thread exits: from any thread
    /// but the main one, COMMAND is refused.
    #[cfg(target_os = "linux")]
    #[test]
    fn commands_are_spawned_only_from_the_main_thread() {
        let failure = std::thread::spawn(|| {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime
                .block_on(Child::spawn(
                    &[OsString::from("true")],
                    &[],
                    Duration::from_secs(1),
                ))
                .err()
                .expect("spawned from a thread that is not the main one")
        })
        .join()
        .unwrap();
        assert_eq!(failure.status, crate::exit::INTERNAL, "{failure}");
        assert!(failure.message.contains("main thread"), "{failure}");
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn stat_lines_with_odd_names_parse() {
        assert_eq!(
            parse_stat("4242 (sleep) S 1 4240 4240 0 -1 4194560"),
            Some(('S', 4240))
        );
        assert_eq!(parse_stat("4243 (a) b) (c) Z 1 77 77 0"), Some(('Z', 77)));
        assert_eq!(parse_stat("garbage"), None);
    }
}
