//! `baton run KEY -- COMMAND`: run COMMAND while holding the lock KEY.
//!
//! What a user sees — acquiring and waiting, the environment COMMAND gets, signals, a lost
//! lock, `--cooldown`, process supervision, every exit status — is specified once, in
//! docs/cli.md ("`baton run`"); the options' help is the clap text of [`RunArgs`]. In the
//! code: the lock is a [`LockGuard`] kept alive every [`keep_alive_interval`] (`ttl / 3`);
//! COMMAND and its process group are [`crate::child`]'s; the signals baton forwards are
//! [`crate::signals`]'s; a lost lock or an expired release makes the status 79.

use std::time::Duration;

use baton::CancellationToken;
use baton::Ttl;
use baton::lock::{AcquireError, KeepOutcome, LockGuard, LockOptions, ReleaseOutcome};
use baton::rwlock::WriteGuard;

use clap::{Args, ValueEnum};

use crate::args;
use crate::child::{Child, shell_status};
use crate::cli::GlobalArgs;
use crate::exit::{CONTENDED, Failure, INTERNAL, LOCK_LOST, SIGNAL_BASE};
use crate::output::human_duration;
use crate::signals::Forwarded;
use crate::store;

/// Default `--wait`: one attempt.
const DEFAULT_WAIT: &str = "0s";

/// `baton run`.
#[derive(Debug, Args)]
pub(crate) struct RunArgs {
    /// How long the lock survives without a renewal (10ms to 30d). baton renews it every
    /// ttl / 3 while COMMAND runs, so a renewal can fail once and be retried before the lock
    /// expires. It is how long the others wait for the lock after this machine dies: short
    /// enough to recover quickly, long enough to ride out a slow store.
    #[arg(long, value_name = "DUR", default_value = args::DEFAULT_TTL, value_parser = args::ttl)]
    pub(crate) ttl: Duration,

    /// How long to wait for the current holder before giving up with status 75 (at most
    /// 1d); 0s is exactly one attempt.
    #[arg(long, value_name = "DUR", default_value = DEFAULT_WAIT, value_parser = args::wait)]
    pub(crate) wait: Duration,

    /// Keep the lock for DUR after COMMAND ends, whatever its status, instead of releasing
    /// it (10ms to 30d): a cooldown, so that another `baton run` of KEY within DUR finds it
    /// held (75). --ttl still bounds the lock while COMMAND runs; at COMMAND's end the grant
    /// is set to end DUR later (shorter or longer than --ttl) and renewals stop. A lock lost
    /// while COMMAND ran is not kept (79).
    #[arg(long, value_name = "DUR", value_parser = args::ttl)]
    pub(crate) cooldown: Option<Duration>,

    /// What to do to COMMAND when the lock is lost while it runs: term (SIGTERM, then
    /// SIGKILL after --grace), kill (SIGKILL at once), ignore (let it finish; baton still
    /// exits 79).
    #[arg(long, value_name = "ACTION", value_enum, default_value_t = OnLost::Term)]
    pub(crate) on_lost: OnLost,

    /// With --on-lost term: how long COMMAND has between SIGTERM and SIGKILL (at most 1h);
    /// also how long the processes COMMAND leaves in its process group have.
    #[arg(long, value_name = "DUR", default_value = args::DEFAULT_GRACE, value_parser = args::grace)]
    pub(crate) grace: Duration,

    /// Run COMMAND while holding one of N permits of the semaphore KEY instead of its lock:
    /// at most N machines run it at once (1 to 10000). Exit 75 when none is free after
    /// --wait; BATON_FENCE is the permit's fence, larger than every earlier permit's of KEY.
    #[arg(long, value_name = "N", value_parser = args::permits)]
    pub(crate) permits: Option<u32>,

    /// Run COMMAND while holding a read (shared) lock of the reader-writer lock KEY instead
    /// of its lock: any number of machines run it at once, but none while a writer holds or
    /// waits for KEY (a waiting writer keeps new readers out). Exit 75 when a writer kept it
    /// for the whole --wait; BATON_FENCE is the read grant's fence. Not with --permits.
    #[arg(long, conflicts_with = "permits")]
    pub(crate) shared: bool,

    /// Run COMMAND while holding the write (exclusive) lock of the reader-writer lock KEY
    /// instead of its lock: alone, with no --shared run of KEY beside it. Waits (within
    /// --wait) for the readers to finish, keeping new ones out meanwhile; exit 75 when they
    /// outlast --wait. BATON_FENCE is larger than every earlier read or write grant's of KEY.
    /// A plain `baton run KEY` takes the lock KEY, which readers do not see: use --exclusive
    /// beside --shared. Not with --permits, --shared or --cooldown.
    #[arg(long, conflicts_with_all = ["permits", "shared", "cooldown"])]
    pub(crate) exclusive: bool,

    /// The lock's key (the semaphore's, with --permits; the reader-writer lock's, with
    /// --shared or --exclusive).
    #[arg(value_name = "KEY", value_parser = args::key)]
    pub(crate) key: String,

    #[command(flatten)]
    pub(crate) command: args::CommandLine,
}

/// What `baton run` does to COMMAND when the lock is lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum OnLost {
    /// SIGTERM to COMMAND's process group, SIGKILL after --grace.
    Term,
    /// SIGKILL to COMMAND's process group at once.
    Kill,
    /// Let COMMAND finish; baton still exits 79.
    Ignore,
}

/// How often the lock is renewed while COMMAND runs: a third of the TTL. The library
/// requires an interval below `ttl / 2`, so that one failed renewal can be retried before
/// the grant expires; a third leaves room for two.
pub(crate) fn keep_alive_interval(ttl: Duration) -> Duration {
    ttl / 3
}

/// `<host>:<pid>`: prefixed to each acquisition's random token so that `lock status` and the
/// "held by" line name the machine and process that holds a lock.
pub(crate) fn holder_label() -> String {
    let host = nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .filter(|h| !h.is_empty() && !h.chars().any(char::is_control))
        .unwrap_or_else(|| "unknown-host".to_owned());
    let mut label = format!("{host}:{}", std::process::id());
    if label.len() > baton::lock::MAX_LABEL_BYTES {
        let mut cut = baton::lock::MAX_LABEL_BYTES;
        while !label.is_char_boundary(cut) {
            cut -= 1;
        }
        label.truncate(cut);
    }
    label
}

/// Runs `baton run`; returns baton's exit status.
pub(crate) async fn run(global: &GlobalArgs, args: &RunArgs) -> Result<u8, Failure> {
    let options = LockOptions::new(args.ttl)
        .wait(args.wait)
        .keep_alive(keep_alive_interval(args.ttl))
        .holder_label(holder_label());
    options.validate()?;
    // Catch signals before anything is held, so that none can end baton between taking the
    // lock and handing the signal on.
    let mut signals = Forwarded::install()
        .map_err(|e| Failure::new(INTERNAL, format!("cannot install signal handlers: {e}")))?;

    let what = match (args.permits, args.shared, args.exclusive) {
        (Some(n), _, _) => format!("semaphore {:?} ({n} permits)", args.key),
        (None, true, _) => format!("read lock {:?}", args.key),
        (None, false, true) => format!("write lock {:?}", args.key),
        (None, false, false) => format!("lock {:?}", args.key),
    };
    let acquire = async {
        let baton = store::connect(global).await?;
        let acquired = match (args.permits, args.shared, args.exclusive) {
            (Some(n), _, _) => baton
                .semaphore(&args.key, n)?
                .acquire(&options)
                .await
                .map(Grant::Lock),
            (None, true, _) => baton
                .rwlock(&args.key)?
                .read(&options)
                .await
                .map(Grant::Lock),
            (None, false, true) => baton
                .rwlock(&args.key)?
                .write(&options)
                .await
                .map(Grant::Write),
            (None, false, false) => baton
                .locks()
                .acquire(&args.key, &options)
                .await
                .map(Grant::Lock),
        };
        acquired.map_err(|e| acquire_failure(&what, args.wait, e))
    };
    let guard = tokio::select! {
        guard = acquire => guard?,
        signal = signals.recv() => {
            return Err(Failure::new(
                SIGNAL_BASE + signal as u8,
                format!("{signal} received while waiting for {what}; COMMAND did not run"),
            ));
        }
    };

    let env = [
        ("BATON_KEY", args.key.clone()),
        ("BATON_FENCE", guard.fence().to_string()),
    ];
    let child = match Child::spawn(&args.command.argv, &env, args.grace).await {
        Ok(child) => child,
        Err(failure) => {
            guard.release().await;
            return Err(failure);
        }
    };
    tracing::debug!(key = %args.key, fence = %guard.fence(), command = child.name(), "running");
    let held = Held {
        what,
        ttl: args.ttl,
        on_lost: args.on_lost,
        grace: args.grace,
    };
    let ran = supervise(
        child,
        &mut signals,
        guard.lost_token(),
        guard.fence(),
        &held,
    )
    .await;
    let fence = guard.fence();
    let ended = match (args.cooldown, guard) {
        // A lost lock is not ours to keep.
        (Some(cooldown), Grant::Lock(guard)) if !ran.lost => {
            let cooldown = Ttl::new(cooldown)?;
            Ended::Kept(guard.keep_for(cooldown).await)
        }
        (_, guard) => Ended::Released(guard.release().await),
    };
    finish(&held, fence, ran, ended)
}

/// What `baton run` holds while COMMAND runs: a lock, a permit or a read lock (each a
/// [`LockGuard`]), or a reader-writer lock's write lock.
enum Grant {
    Lock(LockGuard),
    Write(WriteGuard),
}

impl Grant {
    fn fence(&self) -> baton::Fence {
        match self {
            Grant::Lock(guard) => guard.fence(),
            Grant::Write(guard) => guard.fence(),
        }
    }

    fn lost_token(&self) -> CancellationToken {
        match self {
            Grant::Lock(guard) => guard.lost_token(),
            Grant::Write(guard) => guard.lost_token(),
        }
    }

    async fn release(self) -> ReleaseOutcome {
        match self {
            Grant::Lock(guard) => guard.release().await,
            Grant::Write(guard) => guard.release().await,
        }
    }
}

/// What COMMAND runs under, as [`supervise`] and [`finish`] speak of it: a lock, a permit, a
/// leadership.
pub(crate) struct Held {
    /// `lock "nightly"`, `leadership of "scheduler"`.
    pub(crate) what: String,
    /// Its TTL.
    pub(crate) ttl: Duration,
    /// What to do to COMMAND when it is lost.
    pub(crate) on_lost: OnLost,
    /// How long COMMAND has between SIGTERM and SIGKILL.
    pub(crate) grace: Duration,
}

/// How the lock ended after COMMAND: released, or kept for `--cooldown`.
pub(crate) enum Ended {
    Released(ReleaseOutcome),
    Kept(KeepOutcome),
}

/// How COMMAND's run ended.
pub(crate) struct Ran {
    /// COMMAND's status as a shell reports it, or why it is unknown.
    status: Result<u8, Failure>,
    /// Whether the lock was lost while COMMAND ran.
    lost: bool,
    /// COMMAND's name.
    name: String,
}

/// Waits for COMMAND to exit and its process group to be empty, forwarding signals and
/// acting on a lost lock.
pub(crate) async fn supervise(
    mut child: Child,
    signals: &mut Forwarded,
    lost: CancellationToken,
    fence: baton::Fence,
    held: &Held,
) -> Ran {
    let mut lost_seen = false;
    let status = loop {
        tokio::select! {
            status = child.wait() => break status,
            signal = signals.recv() => child.signal(signal),
            () = lost.cancelled(), if !lost_seen => {
                lost_seen = true;
                let action = match held.on_lost {
                    OnLost::Term => {
                        child.terminate();
                        format!("sent SIGTERM to {}, SIGKILL follows in {}", child.name(), human_duration(held.grace))
                    }
                    OnLost::Kill => {
                        child.kill();
                        format!("sent SIGKILL to {}", child.name())
                    }
                    OnLost::Ignore => format!("letting {} finish (--on-lost ignore)", child.name()),
                };
                say!(
                    "baton: lost the {} (fence {fence}) while {} ran; {action}",
                    held.what, child.name()
                );
            }
        }
    };
    Ran {
        status: status.map(shell_status).map_err(|e| {
            Failure::new(
                INTERNAL,
                format!(
                    "lost track of {}: {e}; the {} is released",
                    child.name(),
                    held.what
                ),
            )
        }),
        lost: lost_seen,
        name: child.name().to_owned(),
    }
}

/// baton's exit status once COMMAND has exited and the lock was released.
pub(crate) fn finish(
    held: &Held,
    fence: baton::Fence,
    ran: Ran,
    ended: Ended,
) -> Result<u8, Failure> {
    let status = ran.status?;
    if ran.lost {
        return Err(Failure::new(
            LOCK_LOST,
            format!(
                "{} exited with status {status} after the {} was lost; exiting with {LOCK_LOST}",
                ran.name, held.what
            ),
        ));
    }
    match ended {
        Ended::Released(ReleaseOutcome::Expired) | Ended::Kept(KeepOutcome::Expired) => {
            Err(Failure::new(
                LOCK_LOST,
                format!(
                    "the {} (fence {fence}) had expired before {} exited with status {status}: the run was not exclusive throughout; exiting with {LOCK_LOST}",
                    held.what, ran.name
                ),
            ))
        }
        Ended::Released(ReleaseOutcome::Faulted) => {
            say!(
                "baton: could not release the {}; it stays held until its TTL ({}) lapses",
                held.what,
                human_duration(held.ttl)
            );
            Ok(status)
        }
        Ended::Kept(KeepOutcome::Faulted) => {
            say!(
                "baton: could not set the {} to end after the cooldown; it stays held until its TTL ({}) lapses",
                held.what,
                human_duration(held.ttl)
            );
            Ok(status)
        }
        Ended::Released(ReleaseOutcome::Released) | Ended::Kept(KeepOutcome::Kept { .. }) => {
            Ok(status)
        }
    }
}

/// How a contended `baton run` or `baton elect` ended its `--wait`: `gave up at once (--wait
/// 0s)`, `gave up after waiting 5s` (`doing` is what it did meanwhile).
pub(crate) fn gave_up(wait: Duration, doing: &str) -> String {
    if wait.is_zero() {
        "gave up at once (--wait 0s)".to_owned()
    } else {
        format!("gave up after {doing} {}", human_duration(wait))
    }
}

/// The failure for a lock (or a semaphore's permit, or a read lock) `baton run` could not
/// take; `what` names it: `lock "nightly"`, `semaphore "builds" (4 permits)`,
/// `read lock "model"`.
fn acquire_failure(what: &str, wait: Duration, error: AcquireError) -> Failure {
    match error {
        AcquireError::Contended { holder, remaining } => {
            let holder = match holder {
                Some(holder) => format!("held by {holder}"),
                None => "held elsewhere".to_owned(),
            };
            let expires = match remaining {
                Some(remaining) => format!(
                    ", which expires in {} unless renewed",
                    human_duration(remaining)
                ),
                None => String::new(),
            };
            let waited = gave_up(wait, "waiting");
            Failure::new(
                CONTENDED,
                format!("{what} is still {holder}{expires}; {waited}; COMMAND did not run"),
            )
        }
        AcquireError::Unavailable(error) | AcquireError::InvalidInput(error) => {
            let mut failure = Failure::from(error);
            failure.message = format!("cannot acquire {what}: {}", failure.message);
            failure
        }
        other => Failure::new(INTERNAL, format!("cannot acquire {what}: {other}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exit::{UNAVAILABLE, USAGE};
    use baton::time::Ttl;

    #[test]
    fn the_keep_alive_interval_is_valid_for_every_ttl() {
        for ms in [10, 11, 29, 30, 500, 30_000, 2_592_000_000] {
            let ttl = Duration::from_millis(ms);
            Ttl::new(ttl).unwrap();
            LockOptions::new(ttl)
                .keep_alive(keep_alive_interval(ttl))
                .validate()
                .unwrap_or_else(|e| panic!("ttl {ms}ms: {e}"));
        }
    }

    #[test]
    fn contention_names_the_holder() {
        let failure = acquire_failure(
            "job",
            Duration::ZERO,
            AcquireError::Contended {
                holder: Some("abc123".into()),
                remaining: Some(Duration::from_millis(27_500)),
            },
        );
        assert_eq!(failure.status, CONTENDED);
        assert!(failure.message.contains("held by abc123"), "{failure}");
        assert!(failure.message.contains("27.5s"), "{failure}");
    }

    #[test]
    fn acquire_errors_keep_their_status() {
        let unavailable = acquire_failure(
            "job",
            Duration::ZERO,
            AcquireError::Unavailable(baton::Error::unavailable("down")),
        );
        assert_eq!(unavailable.status, UNAVAILABLE);
        let invalid = acquire_failure(
            "job",
            Duration::ZERO,
            AcquireError::InvalidInput(baton::Error::invalid_input("bad")),
        );
        assert_eq!(invalid.status, USAGE);
    }
}
