//! `baton worker QUEUE -- COMMAND [ARGS...]`: run COMMAND once per item claimed from QUEUE,
//! through [`baton::work::Worker`].
//!
//! What a user sees — the environment COMMAND gets, how its status settles the item, lost
//! leases, stopping and draining, the exit statuses, the summary line — is specified once,
//! in docs/cli.md ("`baton worker`"); the options' help is the clap text below. This module
//! adds what only the code needs to say:
//!
//! - each COMMAND runs in its own process group ([`crate::child`]), started through the
//!   exec guard on Linux ([`crate::guard_cmd`]), and its item is settled only once the group
//!   is empty;
//! - store faults while running are retried (claims back off; a settle is tried three
//!   times, then left to the lease) and counted in `store_faults`;
//! - a `redis://` URL is refused before connecting ([`crate::queue_cmd::connect_work`]).

use std::ffi::OsString;
use std::fmt;
use std::os::fd::AsFd;
use std::process::{ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use baton::work::{Backoff, Job, MAX_BATCH, MAX_CONCURRENCY, QueueOptions, Worker, WorkerReport};
use clap::Args;
use nix::sys::signal::Signal;
use serde::Serialize;
use tokio::io::AsyncWriteExt;
use tokio::process::ChildStdin;
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep_until};
use tokio_util::sync::CancellationToken;

use crate::args::{self, CommandLine, DEFAULT_GRACE};
use crate::child::{Child, shell_status};
use crate::cli::GlobalArgs;
use crate::exit::{Failure, INTERNAL, SUCCESS};
use crate::output::human_duration;
use crate::queue_cmd::connect_work;
use crate::signals::Forwarded;

/// Default `--lease`: the library's.
const DEFAULT_LEASE: &str = "30s";
/// Default `--backoff`: the delay before the first retry.
const DEFAULT_BACKOFF: &str = "1s";
/// The longest delay between retries when `--backoff-max` is not given (or `--backoff`, if
/// that is longer).
const DEFAULT_BACKOFF_MAX: Duration = Duration::from_secs(300);
/// Default `--drain`: how long running COMMANDs may finish after a stop signal.
const DEFAULT_DRAIN: &str = "30s";
/// Time for COMMANDs killed at the end of `--grace` to be reaped. Each item is released as
/// soon as its COMMAND has exited; the library's grace (`--drain` + `--grace` + this) only
/// bounds the wait for COMMANDs that are slow to be reaped.
const RELEASE_MARGIN: Duration = Duration::from_secs(1);

/// `baton worker`.
#[derive(Debug, Args)]
#[command(mut_arg("argv", |arg| {
    arg.help("The command and its arguments, after `--`. It gets the payload on stdin")
}))]
pub(crate) struct WorkerArgs {
    /// How many COMMANDs run at once (1 to 1024).
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = parse_concurrency)]
    pub(crate) concurrency: usize,

    /// The most items one claim takes (1 to 1000) [default: --concurrency]. A claim never
    /// takes more items than there are free slots.
    #[arg(long, value_name = "N", value_parser = parse_batch)]
    pub(crate) batch: Option<u32>,

    /// How long a claim owns an item without an extension (10ms to 30d). baton extends it
    /// every third of it while COMMAND runs; a machine that dies leaves its items to be
    /// claimed again this long after its last extension.
    #[arg(long, value_name = "DUR", default_value = DEFAULT_LEASE, value_parser = args::lease)]
    pub(crate) lease: Duration,

    /// The delay before the first retry of a failed item; it doubles after each further
    /// failure, up to --backoff-max, and is jittered. 0s retries at once.
    #[arg(long, value_name = "DUR", default_value = DEFAULT_BACKOFF, value_parser = args::backoff)]
    pub(crate) backoff: Duration,

    /// The longest delay between retries (at most 30d) [default: 5m, or --backoff if
    /// longer].
    #[arg(long, value_name = "DUR", value_parser = args::backoff)]
    pub(crate) backoff_max: Option<Duration>,

    /// After SIGINT or SIGTERM: how long the running COMMANDs may finish before they are
    /// terminated and their items released (at most 12h).
    #[arg(long, value_name = "DUR", default_value = DEFAULT_DRAIN, value_parser = args::drain)]
    pub(crate) drain: Duration,

    /// How long a COMMAND has between SIGTERM and SIGKILL, when it is terminated because
    /// its lease was lost or --drain ran out (at most 1h).
    #[arg(long, value_name = "DUR", default_value = DEFAULT_GRACE, value_parser = args::grace)]
    pub(crate) grace: Duration,

    /// Exit 0 once nothing is claimable and no COMMAND runs (items waiting for a delay or a
    /// backoff are left for later).
    #[arg(long)]
    pub(crate) exit_when_empty: bool,

    /// The queue's name.
    #[arg(value_name = "QUEUE", value_parser = args::queue)]
    pub(crate) queue: String,

    #[command(flatten)]
    pub(crate) command: CommandLine,
}

/// Why the worker stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StoppedBy {
    /// `--exit-when-empty`: nothing was claimable and no COMMAND ran.
    Empty,
    /// A signal asked baton to stop.
    Signal(Signal),
    /// COMMAND could not be started.
    CommandError,
}

impl fmt::Display for StoppedBy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoppedBy::Empty => f.write_str("empty"),
            StoppedBy::Signal(signal) => f.write_str(signal.as_str()),
            StoppedBy::CommandError => f.write_str("command-error"),
        }
    }
}

/// The line (or JSON document) printed at exit.
#[derive(Debug, Serialize)]
struct Summary<'a> {
    result: &'static str,
    queue: &'a str,
    stopped_by: String,
    claimed: u64,
    completed: u64,
    /// Every failed attempt: `retried` + `dead_lettered`.
    failed: u64,
    retried: u64,
    dead_lettered: u64,
    released: u64,
    lost: u64,
    store_faults: u64,
}

impl<'a> Summary<'a> {
    fn of(queue: &'a str, stopped_by: StoppedBy, report: &WorkerReport) -> Self {
        Summary {
            result: "Stopped",
            queue,
            stopped_by: stopped_by.to_string(),
            claimed: report.claimed,
            completed: report.completed,
            failed: report.retried + report.dead_lettered,
            retried: report.retried,
            dead_lettered: report.dead_lettered,
            released: report.released,
            lost: report.lease_lost,
            store_faults: report.store_faults,
        }
    }

    fn line(&self) -> String {
        format!(
            "Stopped {} by={} claimed={} completed={} failed={} dead_lettered={} released={} lost={} store_faults={}",
            self.queue,
            self.stopped_by,
            self.claimed,
            self.completed,
            self.failed,
            self.dead_lettered,
            self.released,
            self.lost,
            self.store_faults
        )
    }
}

/// What every item's task shares.
struct Context {
    queue: String,
    command: Vec<OsString>,
    /// `--json`: COMMAND's stdout goes to baton's stderr.
    stdout_to_stderr: bool,
    grace: Duration,
    /// Fires to stop claiming (a signal, or a COMMAND that cannot run).
    shutdown: CancellationToken,
    /// Fires when `--drain` is over: running COMMANDs are terminated.
    terminate: CancellationToken,
    /// COMMANDs running now.
    running: AtomicUsize,
    /// The exit status and message of a COMMAND that could not be started.
    fatal: Mutex<Option<Failure>>,
}

impl Context {
    fn running(&self) -> usize {
        self.running.load(Ordering::SeqCst)
    }

    /// COMMAND's stdout: baton's, or with `--json` baton's stderr.
    fn stdout(&self) -> Stdio {
        if self.stdout_to_stderr {
            match std::io::stderr().as_fd().try_clone_to_owned() {
                Ok(fd) => return Stdio::from(fd),
                Err(e) => tracing::warn!("cannot send COMMAND's stdout to stderr: {e}"),
            }
        }
        Stdio::inherit()
    }

    /// Records that COMMAND could not be started and stops the claiming; answers the error
    /// the item is failed with.
    fn cannot_run(&self, job: &Job, failure: Failure) -> String {
        say!(
            "baton: {}; item {} of queue {} failed (attempt {} of {})",
            failure.message,
            job.id(),
            self.queue,
            job.attempt(),
            job.max_attempts()
        );
        let mut fatal = self.fatal.lock().unwrap_or_else(|p| p.into_inner());
        if fatal.is_none() {
            say!(
                "baton: no more items are claimed: every one would fail the same way; exiting with {} once the running COMMANDs are done",
                failure.status
            );
            *fatal = Some(Failure::new(
                failure.status,
                format!(
                    "{}; stopped claiming from queue {}",
                    failure.message, self.queue
                ),
            ));
        }
        self.shutdown.cancel();
        failure.message
    }
}

/// Counts one running COMMAND while alive.
struct RunningGuard<'a>(&'a AtomicUsize);

impl<'a> RunningGuard<'a> {
    fn new(count: &'a AtomicUsize) -> Self {
        count.fetch_add(1, Ordering::SeqCst);
        RunningGuard(count)
    }
}

impl Drop for RunningGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Aborts the task writing COMMAND's stdin when the item's task ends (COMMAND's children
/// may keep the pipe open after COMMAND exited).
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Runs `baton worker`; returns baton's exit status.
pub(crate) async fn run(global: &GlobalArgs, args: &WorkerArgs) -> Result<u8, Failure> {
    let options = queue_options(args)?;
    // Catch signals before anything is claimed, so that none can end baton while a COMMAND
    // runs; one that arrives while connecting stops the worker before its first claim.
    let mut signals = Forwarded::install()
        .map_err(|e| Failure::new(INTERNAL, format!("cannot install signal handlers: {e}")))?;
    let (baton, _) = connect_work(global).await?;
    let queue = baton.queue(&args.queue)?.with_options(options)?;

    let context = Arc::new(Context {
        queue: args.queue.clone(),
        command: args.command.argv.clone(),
        stdout_to_stderr: global.output().is_json(),
        grace: args.grace,
        shutdown: CancellationToken::new(),
        terminate: CancellationToken::new(),
        running: AtomicUsize::new(0),
        fatal: Mutex::new(None),
    });
    let mut worker = Worker::new(queue)
        .concurrency(args.concurrency)
        .exit_when_empty(args.exit_when_empty)
        // A COMMAND terminated at the end of the drain releases its item as soon as it has
        // exited (`Job::release_on_return`): at SIGTERM, or at SIGKILL --grace later. The
        // library's grace only bounds the wait for a COMMAND slow to be reaped.
        .grace(args.drain + args.grace + RELEASE_MARGIN)
        .shutdown(context.shutdown.clone());
    if let Some(batch) = args.batch {
        worker = worker.batch(batch);
    }
    let handler_context = Arc::clone(&context);
    let work = worker.run(move |job: Job| run_item(Arc::clone(&handler_context), job));
    tokio::pin!(work);

    let mut stopped_by = StoppedBy::Empty;
    let mut drain_until: Option<Instant> = None;
    let report = loop {
        let draining = drain_until.is_some() && !context.terminate.is_cancelled();
        tokio::select! {
            report = &mut work => break report?,
            signal = signals.recv() => {
                if drain_until.is_none() {
                    stopped_by = StoppedBy::Signal(signal);
                    drain_until = Some(Instant::now() + args.drain);
                    context.shutdown.cancel();
                    let running = context.running();
                    if running > 0 {
                        say!(
                            "baton: {signal} received: no more claims; {running} running COMMAND(s) may finish within --drain {}",
                            human_duration(args.drain)
                        );
                    }
                } else if !context.terminate.is_cancelled() {
                    say!("baton: {signal} received again: ending the drain now");
                    end_drain(&context);
                }
            }
            () = context.shutdown.cancelled(), if drain_until.is_none() => {
                // A COMMAND that cannot run stopped the claiming.
                stopped_by = StoppedBy::CommandError;
                drain_until = Some(Instant::now() + args.drain);
            }
            () = sleep_until(drain_until.unwrap_or_else(Instant::now)), if draining => {
                end_drain(&context);
            }
        }
    };

    let summary = Summary::of(&args.queue, stopped_by, &report);
    global.output().line(&summary, || summary.line())?;
    let fatal = context
        .fatal
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .take();
    match fatal {
        Some(failure) => Err(failure),
        None => Ok(SUCCESS),
    }
}

/// Ends the drain: the running COMMANDs are terminated and their items released.
fn end_drain(context: &Context) {
    let running = context.running();
    if running > 0 {
        say!(
            "baton: terminating {running} running COMMAND(s) (SIGTERM, SIGKILL after --grace {}); their items are released",
            human_duration(context.grace)
        );
    }
    context.terminate.cancel();
}

/// The queue's options from the arguments.
///
/// # Errors
/// Status 64 when `--backoff` is above `--backoff-max`.
fn queue_options(args: &WorkerArgs) -> Result<QueueOptions, Failure> {
    let cap = args
        .backoff_max
        .unwrap_or_else(|| DEFAULT_BACKOFF_MAX.max(args.backoff));
    let options = QueueOptions::new()
        .lease(args.lease)
        .backoff(Backoff::exponential(args.backoff, cap));
    options.validate().map_err(|e| {
        Failure::usage(format!(
            "--backoff {} with --backoff-max {}: {}",
            human_duration(args.backoff),
            human_duration(cap),
            e.message()
        ))
    })?;
    Ok(options)
}

/// Why baton stopped a COMMAND.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stopped {
    /// The item's lease was lost.
    LeaseLost,
    /// `--drain` ran out (or a second signal ended it).
    Drained,
}

/// Runs COMMAND for one item: `Ok` completes it, `Err` fails it. A COMMAND terminated
/// because the drain ran out has its item released once it has exited, whatever its exit
/// status: it did not get to finish.
async fn run_item(context: Arc<Context>, job: Job) -> Result<(), String> {
    let id = job.id();
    let env = [
        ("BATON_QUEUE", context.queue.clone()),
        ("BATON_ITEM_ID", id.to_string()),
        ("BATON_ATTEMPT", job.attempt().to_string()),
        ("BATON_MAX_ATTEMPTS", job.max_attempts().to_string()),
    ];
    let stdout = context.stdout();
    // Counted from before the spawn: COMMAND may already run while the spawn still waits to
    // hear that its exec succeeded, and a SIGTERM then must find it counted.
    let _running = RunningGuard::new(&context.running);
    let spawned = Child::spawn_with(&context.command, context.grace, |command| {
        command
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::piped())
            .stdout(stdout);
        match job.dedup_id() {
            Some(dedup) => command.env("BATON_DEDUP_ID", dedup),
            // Not inherited from baton's own environment.
            None => command.env_remove("BATON_DEDUP_ID"),
        };
    })
    .await;
    let mut child = match spawned {
        Ok(child) => {
            let label = format!("{} (item {id})", child.name());
            child.kill_group_on_drop().labelled(label)
        }
        Err(failure) => return Err(context.cannot_run(&job, failure)),
    };
    tracing::debug!(queue = %context.queue, item = %id, attempt = job.attempt(), command = child.name(), "running");
    let _writer = AbortOnDrop(tokio::spawn(write_payload(
        child.take_stdin(),
        job.payload().to_vec(),
    )));

    let lost = job.lost_token();
    let mut stopped: Option<Stopped> = None;
    let status = loop {
        tokio::select! {
            status = child.wait() => break status,
            () = lost.cancelled(), if stopped.is_none() => {
                stopped = Some(Stopped::LeaseLost);
                child.terminate();
                say!(
                    "baton: lost the lease of item {id} of queue {} (attempt {}) while {} ran; sent SIGTERM to {}, SIGKILL follows in {}",
                    context.queue,
                    job.attempt(),
                    child.name(),
                    child.name(),
                    human_duration(context.grace)
                );
            }
            () = context.terminate.cancelled(), if stopped.is_none() => {
                stopped = Some(Stopped::Drained);
                child.terminate();
            }
        }
    };
    let name = child.name().to_owned();
    match stopped {
        Some(Stopped::Drained) => {
            tracing::debug!(queue = %context.queue, item = %id, "terminated at the end of the drain; releasing the item");
            job.release_on_return();
            return Ok(());
        }
        Some(Stopped::LeaseLost) => {
            return Err(format!(
                "the lease was lost while {name} ran; {name} was terminated"
            ));
        }
        None => {}
    }
    let status = status.map_err(|e| format!("lost track of {name}: {e}"))?;
    if status.success() {
        return Ok(());
    }
    let error = describe_exit(&name, status);
    let next = if job.is_last_attempt() {
        "that was its last attempt: it is dead-lettered"
    } else {
        "it will be retried after a backoff"
    };
    say!(
        "baton: item {id} of queue {} (attempt {} of {}): {error}; {next}",
        context.queue,
        job.attempt(),
        job.max_attempts()
    );
    Err(error)
}

/// Writes the payload to COMMAND's stdin and closes it. A COMMAND that does not read its
/// stdin may exit first: the broken pipe is not an error.
async fn write_payload(stdin: Option<ChildStdin>, payload: Vec<u8>) {
    // Dropping `stdin` at the end closes the pipe: COMMAND reads end of file.
    if let Some(mut stdin) = stdin
        && let Err(e) = stdin.write_all(&payload).await
    {
        tracing::debug!("COMMAND did not read its whole payload: {e}");
    }
}

/// `sh exited with status 3`, `sh was killed by signal 9 (status 137)`.
fn describe_exit(name: &str, status: ExitStatus) -> String {
    let code = shell_status(status);
    match status.code() {
        Some(code) => format!("{name} exited with status {code}"),
        None => format!(
            "{name} was killed by signal {} (status {code})",
            code.saturating_sub(crate::exit::SIGNAL_BASE)
        ),
    }
}

fn parse_concurrency(text: &str) -> Result<usize, String> {
    args::number_in(text, 1, MAX_CONCURRENCY, "the concurrency")
}

fn parse_batch(text: &str) -> Result<u32, String> {
    args::number_in(text, 1, MAX_BATCH, "the batch")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::ExitStatusExt;

    #[test]
    fn arguments_are_checked_by_the_library_rules() {
        assert_eq!(parse_concurrency("4"), Ok(4));
        assert!(parse_concurrency("0").is_err());
        assert!(parse_concurrency("1025").is_err());
        assert!(parse_concurrency("-1").is_err());
        assert!(parse_batch("0").is_err());
        assert!(parse_batch("1001").is_err());
        assert!(args::lease("5ms").unwrap_err().contains("lease"));
        assert!(args::lease("1m").is_ok());
        assert!(args::backoff("0s").is_ok());
        assert!(args::backoff("31d").is_err());
        assert!(args::drain("13h").is_err());
        assert!(args::grace("soon").is_err());
    }

    #[test]
    fn exits_are_described_as_shells_report_them() {
        assert_eq!(
            describe_exit("sh", ExitStatus::from_raw(3 << 8)),
            "sh exited with status 3"
        );
        assert_eq!(
            describe_exit("sh", ExitStatus::from_raw(9)),
            "sh was killed by signal 9 (status 137)"
        );
    }

    #[test]
    fn the_summary_counts_every_failed_attempt() {
        let mut report = WorkerReport::default();
        report.claimed = 4;
        report.completed = 1;
        report.retried = 2;
        report.dead_lettered = 1;
        let summary = Summary::of("emails", StoppedBy::Signal(Signal::SIGTERM), &report);
        assert_eq!(
            summary.line(),
            "Stopped emails by=SIGTERM claimed=4 completed=1 failed=3 dead_lettered=1 released=0 lost=0 store_faults=0"
        );
    }
}
