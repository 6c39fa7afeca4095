//! The signals `baton run` catches and forwards to COMMAND, and that `baton worker` catches
//! as requests to stop gracefully.
//!
//! COMMAND runs in its own process group (see [`crate::child`]), so a signal sent to baton —
//! by `kill`, systemd, Kubernetes, or Ctrl-C in a terminal, which reaches only the terminal's
//! foreground group — does not reach COMMAND by itself. baton catches SIGINT, SIGTERM,
//! SIGHUP and SIGQUIT, forwards each one once to COMMAND's group, and keeps the lock until
//! COMMAND has exited. Without this, SIGHUP (a closed terminal) would kill baton and leave
//! COMMAND running without a lock.
//!
//! `baton worker` catches the same four, so that none of them ends baton while its COMMANDs
//! run: the first one stops the claiming and lets the running COMMANDs finish (see
//! [`crate::worker_cmd`]); it does not forward them.

use std::io;

use nix::sys::signal::Signal;
use tokio::signal::unix::{self, SignalKind, signal};

/// Catches SIGINT, SIGTERM, SIGHUP and SIGQUIT from the moment it is created.
pub(crate) struct Forwarded {
    interrupt: unix::Signal,
    terminate: unix::Signal,
    hangup: unix::Signal,
    quit: unix::Signal,
}

impl Forwarded {
    /// Installs the handlers. From now on these signals no longer end baton.
    ///
    /// # Errors
    /// When a handler cannot be installed (outside a tokio runtime with signals enabled).
    pub(crate) fn install() -> io::Result<Self> {
        Ok(Forwarded {
            interrupt: signal(SignalKind::interrupt())?,
            terminate: signal(SignalKind::terminate())?,
            hangup: signal(SignalKind::hangup())?,
            quit: signal(SignalKind::quit())?,
        })
    }

    /// The next caught signal. Cancel safe: a signal that arrives while nobody is waiting is
    /// kept for the next call.
    pub(crate) async fn recv(&mut self) -> Signal {
        tokio::select! {
            Some(()) = self.interrupt.recv() => Signal::SIGINT,
            Some(()) = self.terminate.recv() => Signal::SIGTERM,
            Some(()) = self.hangup.recv() => Signal::SIGHUP,
            Some(()) = self.quit.recv() => Signal::SIGQUIT,
            else => std::future::pending().await,
        }
    }
}
