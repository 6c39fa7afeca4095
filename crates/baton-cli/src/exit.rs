//! Exit statuses of `baton`, all in one place, and the failure type that carries them.
//!
//! The numbers follow `sysexits.h` where one fits, so that cron, systemd and shell scripts
//! can tell "someone else has it" from "the store is down" from "you typed it wrong":
//!
//! | status | constant | meaning |
//! |---|---|---|
//! | COMMAND's own | | `baton run`: COMMAND ran while the lock was held throughout |
//! | 0 | [`SUCCESS`] | the other commands: done |
//! | 1 | [`MISS`] | `baton cache get`: no value under the key (as `grep` finds nothing) |
//! | 64 | [`USAGE`] | invalid arguments or input (`EX_USAGE`); nothing was changed |
//! | 69 | [`UNAVAILABLE`] | the store could not be opened or did not answer (`EX_UNAVAILABLE`) |
//! | 70 | [`INTERNAL`] | baton itself failed: no signal handlers, lost track of COMMAND (`EX_SOFTWARE`) |
//! | 75 | [`CONTENDED`] | held by another holder, or a rate limit denied (`EX_TEMPFAIL`: try again later) |
//! | 78 | [`FINDINGS`] | `baton doctor` found something to fix (`EX_CONFIG`) |
//! | 79 | [`LOCK_LOST`] | `baton run`: the lock was lost while COMMAND ran |
//! | 126 | [`CANNOT_EXECUTE`] | COMMAND was found but could not be executed (as shells do) |
//! | 127 | [`NOT_FOUND`] | COMMAND was not found (as shells do) |
//! | 128+N | [`SIGNAL_BASE`] | COMMAND was killed by signal N (as shells do) |
//! | 141 | [`BROKEN_PIPE`] | the reader of stdout went away (`baton lease list \| head`); nothing is printed on stderr |

use std::fmt;

use baton::{Error, ErrorKind};

/// Done.
pub(crate) const SUCCESS: u8 = 0;
/// `baton cache get` found no value.
pub(crate) const MISS: u8 = 1;
/// Invalid arguments or input: a clap usage error, a bad duration, key, holder, namespace or
/// store URL, a store scheme this build does not support, a missing COMMAND.
pub(crate) const USAGE: u8 = 64;
/// The store could not be opened or did not answer.
pub(crate) const UNAVAILABLE: u8 = 69;
/// baton itself failed: it could not install its signal handlers, or lost track of COMMAND.
pub(crate) const INTERNAL: u8 = 70;
/// Another holder holds the key (a lock still held after `--wait`; a lease held by someone
/// else, or no longer ours).
pub(crate) const CONTENDED: u8 = 75;
/// `baton doctor` found something to fix (`EX_CONFIG`: a configuration error).
pub(crate) const FINDINGS: u8 = 78;
/// The lock was lost (or had expired) while COMMAND ran: the run was not exclusive
/// throughout.
pub(crate) const LOCK_LOST: u8 = 79;
/// COMMAND exists but could not be executed (permission denied, not an executable).
pub(crate) const CANNOT_EXECUTE: u8 = 126;
/// COMMAND was not found.
pub(crate) const NOT_FOUND: u8 = 127;
/// COMMAND was killed by signal N: the status is `SIGNAL_BASE + N`.
pub(crate) const SIGNAL_BASE: u8 = 128;

/// stdout's reader closed the pipe: 128 + SIGPIPE, the status a shell reports for a tool
/// that SIGPIPE ended.
pub(crate) const BROKEN_PIPE: u8 = SIGNAL_BASE + 13;

/// Why a subcommand stopped early: an exit status and one line for stderr.
#[derive(Debug)]
pub(crate) struct Failure {
    /// The exit status.
    pub(crate) status: u8,
    /// The line printed on stderr after `baton: `.
    pub(crate) message: String,
}

impl Failure {
    /// A failure with `status`.
    pub(crate) fn new(status: u8, message: impl Into<String>) -> Self {
        Failure {
            status,
            message: message.into(),
        }
    }

    /// A failure that says nothing on stderr: the reason is already plain to the user
    /// (the reader of stdout went away).
    pub(crate) fn quiet(status: u8) -> Self {
        Failure::new(status, "")
    }

    /// Whether nothing should be printed for this failure.
    pub(crate) fn is_quiet(&self) -> bool {
        self.message.is_empty()
    }

    /// Invalid arguments or input.
    pub(crate) fn usage(message: impl Into<String>) -> Self {
        Failure::new(USAGE, message)
    }
}

impl From<Error> for Failure {
    /// Maps a library error to its exit status: input the library rejected, and a store
    /// this build cannot open, are usage errors (running again will not help); everything
    /// else means the store could not be used.
    fn from(error: Error) -> Self {
        let status = match error.kind() {
            ErrorKind::InvalidInput | ErrorKind::Unsupported => USAGE,
            _ => UNAVAILABLE,
        };
        Failure::new(status, error.to_string())
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn library_errors_map_to_statuses() {
        assert_eq!(Failure::from(Error::invalid_input("x")).status, USAGE);
        assert_eq!(Failure::from(Error::unsupported("x")).status, USAGE);
        assert_eq!(Failure::from(Error::unavailable("x")).status, UNAVAILABLE);
        assert_eq!(Failure::from(Error::internal("x")).status, UNAVAILABLE);
    }

    #[test]
    fn statuses_are_distinct() {
        let all = [
            SUCCESS,
            MISS,
            USAGE,
            UNAVAILABLE,
            INTERNAL,
            CONTENDED,
            LOCK_LOST,
            FINDINGS,
            CANNOT_EXECUTE,
            NOT_FOUND,
            SIGNAL_BASE,
            BROKEN_PIPE,
        ];
        for (i, a) in all.iter().enumerate() {
            for b in &all[i + 1..] {
                assert_ne!(a, b);
            }
        }
    }
}
