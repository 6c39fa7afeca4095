//! `baton exec-guard` (internal, Linux): how `baton run` and `baton worker` start COMMAND so
//! that it cannot outlive them.
//!
//! A supervisor killed with SIGKILL (by the OOM killer, `kill -9`, a crashed node agent)
//! runs no code on its way out, so it cannot stop COMMAND; the kernel can. The supervisor
//! spawns its own binary as `baton exec-guard --parent PID --report-fd FD -- COMMAND...`,
//! already in COMMAND's new process group and with COMMAND's environment and stdio. The
//! guard, which is one process that becomes COMMAND:
//! 1. asks the kernel to send it SIGKILL when its parent dies (`PR_SET_PDEATHSIG`); the
//!    setting survives `exec`, so COMMAND inherits it;
//! 2. checks that its parent is still the supervisor PID: a supervisor that died before
//!    step 1 left the guard to another parent, and the guard exits without running COMMAND;
//! 3. replaces itself with COMMAND (`exec`), keeping its pid and process group.
//!
//! `FD` is the write end of a pipe the supervisor reads: `exec` closes it (the guard reopens
//! it close-on-exec), so an empty report means COMMAND started. When `exec` fails, the
//! guard writes the status a shell would give (127 not found, 126 not executable) and the
//! reason, and exits with that status: the supervisor tells "COMMAND could not start" from
//! "COMMAND exited".
//!
//! ## Behavior
//! - The parent-death signal fires when the *thread* that spawned the guard exits; baton
//!   spawns from its main thread (see [`crate::child`]), which lives as long as baton.
//! - The kernel clears the signal when COMMAND is a set-user-ID or set-group-ID program, or
//!   one with file capabilities: such a COMMAND (`sudo ...`) is not stopped this way.
//! - Only COMMAND itself gets the signal, not the processes it started: those are reached
//!   by the group watchdog ([`watch`]), which kills every group baton still had running
//!   when baton is gone.

use std::ffi::OsString;
use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::process::CommandExt;
use std::process::Command;

use clap::Parser;
use nix::fcntl::OFlag;
use nix::sys::prctl::set_pdeathsig;
use nix::sys::signal::Signal;
use nix::unistd::{Pid, getppid};

use crate::args::CommandLine;
use crate::child::spawn_failure;
use crate::exit::{INTERNAL, SIGNAL_BASE, USAGE};

/// The first argument that selects the guard; it is not part of baton's documented grammar.
pub(crate) const SUBCOMMAND: &str = "exec-guard";
/// The first argument that selects the group watchdog (see [`watch`]).
pub(crate) const WATCH_SUBCOMMAND: &str = "group-watch";

/// Runs the internal subcommand `args` (baton's arguments) name, if they name one; answers
/// its exit status.
pub(crate) fn internal(mut args: impl Iterator<Item = OsString>) -> Option<u8> {
    let first = args.next()?;
    if first == SUBCOMMAND {
        Some(run(args))
    } else if first == WATCH_SUBCOMMAND {
        Some(watch())
    } else {
        None
    }
}

/// The group watchdog (`baton group-watch`): one per `baton run` or `baton worker`, in a
/// process group of its own, reading `+PGID` and `-PGID` lines on stdin as COMMANDs' groups
/// start and empty. At end of file — baton exited, however it died — it sends SIGKILL to
/// every group still listed: the processes COMMAND started, which the parent-death signal
/// does not reach. baton's end of the pipe is close-on-exec, so no COMMAND holds it open.
pub(crate) fn watch() -> u8 {
    use std::collections::BTreeSet;
    use std::io::BufRead;

    let mut groups = BTreeSet::new();
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        let (sign, group) = line.split_at(line.len().min(1));
        match (sign, group.parse::<i32>()) {
            ("+", Ok(group)) if group > 1 => {
                groups.insert(group);
            }
            ("-", Ok(group)) => {
                groups.remove(&group);
            }
            _ => say!("baton: group watchdog: ignoring {line:?}"),
        }
    }
    for &group in &groups {
        let _ = nix::sys::signal::killpg(Pid::from_raw(group), Signal::SIGKILL);
    }
    if !groups.is_empty() {
        say!(
            "baton: exited while {} COMMAND process group(s) still ran; sent them SIGKILL",
            groups.len()
        );
    }
    0
}

/// `baton exec-guard`.
#[derive(Debug, Parser)]
#[command(name = SUBCOMMAND, no_binary_name = true)]
pub(crate) struct ExecGuardArgs {
    /// The supervisor's pid: COMMAND runs only while it is the guard's parent.
    #[arg(long, value_name = "PID")]
    parent: i32,
    /// The write end of the supervisor's report pipe (above 2).
    #[arg(long, value_name = "FD", value_parser = clap::value_parser!(i32).range(3..))]
    report_fd: i32,
    #[command(flatten)]
    command: CommandLine,
}

/// Runs the guard with `args` (the arguments after `exec-guard`); returns only when COMMAND
/// could not be started, with the exit status.
fn run(args: impl IntoIterator<Item = OsString>) -> u8 {
    let args = match ExecGuardArgs::try_parse_from(args) {
        Ok(args) => args,
        Err(error) => {
            let _ = error.print();
            return USAGE;
        }
    };
    // The report pipe as a close-on-exec file, and the inherited descriptor closed, so that
    // COMMAND does not hold the pipe open. Without /proc there is no report: a COMMAND that
    // cannot start then looks like one that exited with 127 or 126.
    let report = OpenOptions::new()
        .write(true)
        .custom_flags(OFlag::O_NONBLOCK.bits())
        .open(format!("/proc/self/fd/{}", args.report_fd))
        .ok();
    let _ = nix::unistd::close(args.report_fd);

    if let Err(e) = set_pdeathsig(Signal::SIGKILL) {
        return report_failure(
            report,
            INTERNAL,
            &format!("cannot ask the kernel to stop COMMAND with baton: {e}"),
        );
    }
    // After the signal is set, so that a supervisor dying now is seen by one or the other.
    if getppid() != Pid::from_raw(args.parent) {
        say!(
            "baton: the supervisor (pid {}) exited before COMMAND started; COMMAND did not run",
            args.parent
        );
        return SIGNAL_BASE + Signal::SIGKILL as u8;
    }
    let (program, rest) = args
        .command
        .argv
        .split_first()
        .expect("clap requires COMMAND");
    let error = Command::new(program).args(rest).exec();
    let failure = spawn_failure(&program.to_string_lossy(), &error);
    report_failure(report, failure.status, &failure.message)
}

/// Writes `status` and `message` to the report pipe (or, without one, to stderr); answers
/// `status`.
fn report_failure(report: Option<std::fs::File>, status: u8, message: &str) -> u8 {
    let written = report.is_some_and(|mut pipe| {
        pipe.write_all(format!("{status}\n{message}").as_bytes())
            .is_ok()
    });
    if !written {
        say!("baton: {message}");
    }
    status
}

/// Parses a report read from the pipe: `None` when it is empty (COMMAND started), else the
/// status and the message.
pub(crate) fn parse_report(report: &[u8]) -> Option<(u8, String)> {
    if report.is_empty() {
        return None;
    }
    let text = String::from_utf8_lossy(report);
    let (status, message) = text.split_once('\n').unwrap_or(("", &text));
    Some((status.parse().unwrap_or(INTERNAL), message.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_round_trip() {
        assert_eq!(parse_report(b""), None);
        assert_eq!(
            parse_report(b"127\ncannot run x: command not found"),
            Some((127, "cannot run x: command not found".to_owned()))
        );
        assert_eq!(
            parse_report(b"garbled"),
            Some((INTERNAL, "garbled".to_owned()))
        );
    }

    #[test]
    fn the_report_descriptor_is_never_stdio() {
        for fd in ["0", "1", "2"] {
            let parsed =
                ExecGuardArgs::try_parse_from(["--parent", "1", "--report-fd", fd, "--", "true"]);
            assert!(parsed.is_err(), "fd {fd} accepted");
        }
        ExecGuardArgs::try_parse_from(["--parent", "1", "--report-fd", "3", "--", "true"]).unwrap();
    }
}
