//! COMMAND as a child process: spawned in its own process group, signalled as a group, and
//! its exit status translated the way shells do.
//!
//! Why its own group: a lost lock must stop *all* of COMMAND's work, and COMMAND is often a
//! shell script whose real work runs in grandchildren; signalling the group reaches them.
//! It also keeps Ctrl-C from reaching COMMAND twice (once from the terminal, once forwarded
//! by baton): the terminal signals only baton's group, and baton forwards exactly once.
//! The cost: COMMAND is not in the terminal's foreground group, so an interactive COMMAND
//! that reads from the terminal is stopped with SIGTTIN. `baton run` is meant for jobs.
//!
//! `baton worker` runs one COMMAND per claimed item the same way, with the payload on a
//! piped stdin ([`Child::spawn_with`], [`Child::take_stdin`]), and marks each child
//! [`kill_group_on_drop`](Child::kill_group_on_drop) so that a COMMAND whose supervising
//! task is dropped (the worker gave up waiting for it) never outlives baton's interest in it.

use std::ffi::OsString;
use std::io;
use std::os::unix::process::ExitStatusExt;
use std::process::{ExitStatus, Stdio};

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::process::{Child as TokioChild, ChildStdin, Command};

use crate::exit::{CANNOT_EXECUTE, Failure, NOT_FOUND, SIGNAL_BASE};

/// A running COMMAND, the leader of its own process group.
pub(crate) struct Child {
    process: TokioChild,
    group: Pid,
    name: String,
    /// Whether [`Child::wait`] has reaped COMMAND (its pid may then be reused).
    reaped: bool,
    /// Whether dropping an unreaped child sends SIGKILL to its group.
    kill_on_drop: bool,
}

impl Child {
    /// Spawns `command` (program and arguments) with `env` added to baton's environment, in
    /// a new process group, inheriting stdin, stdout and stderr.
    ///
    /// # Errors
    /// Status 127 when the program was not found, 126 when it could not be executed.
    pub(crate) fn spawn(command: &[OsString], env: &[(&str, String)]) -> Result<Self, Failure> {
        Child::spawn_with(command, |process| {
            process.envs(env.iter().map(|(k, v)| (k, v)));
        })
    }

    /// As [`Child::spawn`], after `configure` has changed the command (environment, stdin,
    /// stdout); COMMAND runs in its own process group whatever `configure` does.
    ///
    /// # Errors
    /// As [`Child::spawn`].
    pub(crate) fn spawn_with(
        command: &[OsString],
        configure: impl FnOnce(&mut Command),
    ) -> Result<Self, Failure> {
        let (program, args) = command
            .split_first()
            .ok_or_else(|| Failure::usage("no COMMAND given after --"))?;
        let name = program.to_string_lossy().into_owned();
        let mut process = Command::new(program);
        process
            .args(args)
            .stdin(Stdio::inherit())
            .stdout(Stdio::inherit())
            .stderr(Stdio::inherit());
        configure(&mut process);
        let process = process
            .process_group(0)
            .spawn()
            .map_err(|e| spawn_failure(&name, &e))?;
        let pid = process
            .id()
            .ok_or_else(|| Failure::new(CANNOT_EXECUTE, format!("{name} exited at once")))?;
        let group = Pid::from_raw(i32::try_from(pid).map_err(|_| {
            Failure::new(CANNOT_EXECUTE, format!("{name} has pid {pid} out of range"))
        })?);
        Ok(Child {
            process,
            group,
            name,
            reaped: false,
            kill_on_drop: false,
        })
    }

    /// The same child, which SIGKILLs its process group when dropped before it was reaped.
    /// For a supervising task that may be aborted: nobody would be left to stop COMMAND.
    pub(crate) fn kill_group_on_drop(mut self) -> Self {
        self.kill_on_drop = true;
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
    /// error: COMMAND is exiting anyway.
    ///
    /// Only call this before [`Child::wait`] has returned: until COMMAND is reaped its pid,
    /// which is the group id, cannot be reused.
    pub(crate) fn signal(&self, signal: Signal) {
        match killpg(self.group, signal) {
            Ok(()) => tracing::debug!(group = self.group.as_raw(), %signal, "signalled COMMAND"),
            Err(e) => {
                tracing::debug!(group = self.group.as_raw(), %signal, "signal not delivered: {e}")
            }
        }
    }

    /// Waits for COMMAND to exit. Cancel safe.
    pub(crate) async fn wait(&mut self) -> io::Result<ExitStatus> {
        let status = self.process.wait().await;
        if status.is_ok() {
            self.reaped = true;
        }
        status
    }
}

impl Drop for Child {
    /// With [`Child::kill_group_on_drop`], SIGKILLs the group of a COMMAND that was not
    /// reaped. Sending a signal does not block; tokio reaps the process in the background.
    fn drop(&mut self) {
        if self.kill_on_drop && !self.reaped {
            tracing::debug!(
                group = self.group.as_raw(),
                "dropped while running; killing COMMAND"
            );
            let _ = killpg(self.group, Signal::SIGKILL);
        }
    }
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
fn spawn_failure(name: &str, error: &io::Error) -> Failure {
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
}
