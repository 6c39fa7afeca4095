//! The command line grammar: every subcommand, option, default and environment variable.
//!
//! Every argument is validated here, while parsing and before any store is opened, with the
//! library's own rules (key, holder, namespace, TTL, wait), so a typo exits with status 64
//! and changes nothing. Durations are read by [`baton::time::parse_duration`]: `500ms`, `30s`,
//! `5m`, `1h`, `2d`.

use std::ffi::OsString;
use std::time::Duration;

use baton::Namespace;
use baton::time::{Ttl, WaitTime};
use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::output::human_duration;

/// Default `--ttl` of `baton run` and of lease claims and renewals.
pub(crate) const DEFAULT_TTL: &str = "30s";
/// Default `--wait` of `baton run`: one attempt.
pub(crate) const DEFAULT_WAIT: &str = "0s";
/// Default `--grace` of `baton run` and `baton worker`: time between SIGTERM and SIGKILL.
pub(crate) const DEFAULT_GRACE: &str = "10s";
/// The longest `--grace` of `baton run` and `baton worker`.
pub(crate) const MAX_GRACE: Duration = Duration::from_secs(3600);
/// Default `--limit` of the list commands.
pub(crate) const DEFAULT_LIST_LIMIT: usize = 1000;

/// Cluster coordination from the shell: run a command on exactly one machine at a time,
/// inspect locks and leases, and queue work for workers on every machine.
#[derive(Debug, Parser)]
#[command(
    name = "baton",
    version,
    propagate_version = true,
    arg_required_else_help = true
)]
#[command(
    after_help = "Exit statuses: 64 invalid arguments or input, 69 store unavailable, \
70 internal error, 75 held by another holder or rate-limited, 78 doctor findings, 79 lock lost \
while COMMAND ran, 1 cache miss; `baton run` otherwise exits with COMMAND's status (127 not \
found, 126 not executable, 128+N killed by signal N); `baton worker` exits 0 when stopped or \
drained, 127/126 when COMMAND cannot be started. See docs/cli.md."
)]
pub(crate) struct Cli {
    #[command(flatten)]
    pub(crate) global: GlobalArgs,
    #[command(subcommand)]
    pub(crate) command: Command,
}

/// Options every subcommand takes.
#[derive(Debug, Args)]
#[command(next_help_heading = "Global options")]
pub(crate) struct GlobalArgs {
    /// The store: sqlite:///path/to/file.db, redis://host:6379/0, rediss://...,
    /// postgres://user@host/db, memory://. [default: the SQLite file
    /// $XDG_STATE_HOME/baton/baton.db, else ~/.local/state/baton/baton.db, created with its
    /// directories on first use]
    #[arg(long, env = "BATON_STORE", global = true, value_name = "URL")]
    pub(crate) store: Option<String>,

    /// The namespace every key is qualified with, so applications sharing a store never
    /// see each other's keys.
    #[arg(
        long,
        env = "BATON_NAMESPACE",
        global = true,
        value_name = "NS",
        default_value = baton::store::DEFAULT_NAMESPACE,
        value_parser = parse_namespace,
    )]
    pub(crate) namespace: Namespace,

    /// Print data as JSON (one document on stdout).
    #[arg(long, global = true)]
    pub(crate) json: bool,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Run COMMAND while holding the lock KEY: on exactly one machine at a time.
    ///
    /// Acquires the lock (waiting up to --wait for a current holder), runs COMMAND with
    /// BATON_KEY and BATON_FENCE in its environment, renews the lock every ttl/3 while it
    /// runs, releases it when COMMAND exits (or, with --cooldown, keeps it for that long),
    /// and exits with COMMAND's status.
    Run(RunArgs),
    /// Inspect locks.
    #[command(subcommand)]
    Lock(LockCommand),
    /// Claim, renew, release and inspect leases: claims by a stable holder id.
    #[command(subcommand)]
    Lease(LeaseCommand),
    /// Check the store's deployment: connectivity, clocks, eviction policy, persistence,
    /// file and permissions. One line per check; exits 78 when there is a finding.
    Doctor,
    /// Print Prometheus alerting rules (YAML) for baton's events, from its registry.
    Alerts(crate::ops::alerts::AlertsArgs),
    /// Serve Prometheus metrics at http://ADDR/metrics until stopped.
    ServeMetrics(crate::ops::metrics_cmd::ServeMetricsArgs),
    /// Serve a read-only status page of held locks, leases, queue depths and recent events
    /// at http://ADDR/ (JSON at /status.json) until stopped.
    Status(crate::ops::status::StatusArgs),
    /// Take --cost units of the rate limit KEY, at most --max per --window across every
    /// process on the store: exits 0 when admitted, 75 when not now (printing the
    /// retry-after), 64 when the cost can never fit.
    Limit(crate::limit_cmd::LimitArgs),
    /// Get, set and delete cached values (JSON) shared through the store.
    #[command(subcommand)]
    Cache(crate::cache_cmd::CacheCommand),
    /// Publish one JSON message to every subscriber of CHANNEL (at most once).
    Publish(crate::broadcast_cmd::PublishArgs),
    /// Print CHANNEL's messages and connection events as JSON lines until stopped.
    Subscribe(crate::broadcast_cmd::SubscribeArgs),
    /// Add work items (JSON) to a queue, and count the items of queues.
    #[command(subcommand)]
    Queue(crate::queue_cmd::QueueCommand),
    /// Run COMMAND once per item claimed from QUEUE, with the payload on stdin.
    ///
    /// Exit 0 completes the item; any other status fails it (retried after a backoff,
    /// dead-lettered after its last attempt). COMMAND gets BATON_QUEUE, BATON_ITEM_ID,
    /// BATON_ATTEMPT, BATON_MAX_ATTEMPTS and BATON_DEDUP_ID (when set). SIGINT or SIGTERM
    /// stops claiming, lets running COMMANDs finish within --drain, releases the rest and
    /// exits 0; a COMMAND that cannot be started fails its item and exits 127 (126).
    Worker(crate::worker_cmd::WorkerArgs),
    /// Inspect the cron schedules services registered.
    #[command(subcommand)]
    Schedule(crate::schedule_cmd::ScheduleCommand),
}

/// `baton run`.
#[derive(Debug, Args)]
pub(crate) struct RunArgs {
    /// How long the lock survives without a renewal. baton renews it every ttl/3 while
    /// COMMAND runs, so this bounds how long others wait after this machine dies.
    #[arg(long, value_name = "DUR", default_value = DEFAULT_TTL, value_parser = parse_ttl)]
    pub(crate) ttl: Duration,

    /// How long to wait for a current holder before giving up with status 75; 0s is one
    /// attempt.
    #[arg(long, value_name = "DUR", default_value = DEFAULT_WAIT, value_parser = parse_wait)]
    pub(crate) wait: Duration,

    /// Keep the lock for DUR after COMMAND ends, whatever its status, instead of releasing
    /// it: a cooldown, so that another `baton run` of KEY within DUR finds it held. --ttl
    /// still bounds the lock while COMMAND runs; at COMMAND's end the grant is set to end
    /// DUR later (shorter or longer than --ttl) and renewals stop.
    #[arg(long, value_name = "DUR", value_parser = parse_ttl)]
    pub(crate) cooldown: Option<Duration>,

    /// What to do to COMMAND when the lock is lost while it runs.
    #[arg(long, value_name = "ACTION", value_enum, default_value_t = OnLost::Term)]
    pub(crate) on_lost: OnLost,

    /// With --on-lost term: how long COMMAND has between SIGTERM and SIGKILL.
    #[arg(long, value_name = "DUR", default_value = DEFAULT_GRACE, value_parser = parse_grace)]
    pub(crate) grace: Duration,

    /// The lock's key.
    #[arg(value_name = "KEY", value_parser = parse_key)]
    pub(crate) key: String,

    #[command(flatten)]
    pub(crate) command: CommandLine,
}

/// COMMAND and its arguments, after `--`: what `baton run`, `baton worker` and the exec guard
/// start.
#[derive(Debug, Args)]
pub(crate) struct CommandLine {
    /// The command and its arguments, after `--`.
    #[arg(
        value_name = "COMMAND",
        last = true,
        required = true,
        num_args = 1..,
        allow_hyphen_values = true
    )]
    pub(crate) argv: Vec<OsString>,
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

/// `baton lock ...`.
#[derive(Debug, Subcommand)]
pub(crate) enum LockCommand {
    /// Show the holder of lock KEY, its fence and remaining time.
    Status {
        /// The lock's key.
        #[arg(value_name = "KEY", value_parser = parse_key)]
        key: String,
    },
    /// List held locks.
    List(ListArgs),
}

/// `baton lease ...`.
#[derive(Debug, Subcommand)]
pub(crate) enum LeaseCommand {
    /// Claim lease KEY for --holder: prints Claimed, or HeldBy (status 75).
    ///
    /// Claiming again as the same holder is idempotent: it extends the lease and keeps its
    /// fence.
    Claim {
        #[command(flatten)]
        lease: HeldLease,
        /// How long the lease lasts without a renewal.
        #[arg(long, value_name = "DUR", default_value = DEFAULT_TTL, value_parser = parse_ttl)]
        ttl: Duration,
        /// Why the lease is held, shown by status and list (at most 64 bytes).
        #[arg(long, value_name = "TEXT", default_value = "", value_parser = parse_reason)]
        reason: String,
    },
    /// Extend --holder's lease KEY to --ttl from now: prints Renewed, or NotHolder
    /// (status 75).
    Renew {
        #[command(flatten)]
        lease: HeldLease,
        /// The new time to live, from now.
        #[arg(long, value_name = "DUR", default_value = DEFAULT_TTL, value_parser = parse_ttl)]
        ttl: Duration,
    },
    /// Release --holder's lease KEY: prints Removed, NoHolder, or Reclaimed (status 75).
    Release {
        #[command(flatten)]
        lease: HeldLease,
    },
    /// Show the holder of lease KEY, its fence, remaining time and reason.
    Status {
        /// The lease's key.
        #[arg(value_name = "KEY", value_parser = parse_key)]
        key: String,
    },
    /// List live leases.
    List(ListArgs),
}

/// The lease KEY and the `--holder` that claims, renews or releases it.
#[derive(Debug, Args)]
pub(crate) struct HeldLease {
    /// The lease's key.
    #[arg(value_name = "KEY", value_parser = parse_key)]
    pub(crate) key: String,
    #[command(flatten)]
    pub(crate) holder: HolderArg,
}

/// `--holder`.
#[derive(Debug, Args)]
pub(crate) struct HolderArg {
    /// The holder id: a stable identity such as a host or instance name.
    #[arg(long = "holder", env = "BATON_HOLDER", value_name = "ID", value_parser = parse_holder)]
    pub(crate) id: String,
}

/// Options of the list commands.
#[derive(Debug, Args)]
pub(crate) struct ListArgs {
    /// Only keys that start with this prefix.
    #[arg(long, value_name = "P", default_value = "", value_parser = parse_prefix)]
    pub(crate) prefix: String,
    /// At most this many entries.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_LIST_LIMIT)]
    pub(crate) limit: usize,
}

/// `text` itself, once `check` (one of the library's rules) accepts it; otherwise the
/// library's message.
pub(crate) fn checked_text<'a, T>(
    text: &'a str,
    check: impl FnOnce(&'a str) -> baton::Result<T>,
) -> Result<String, String> {
    check(text)
        .map(|_| text.to_owned())
        .map_err(|e| e.message().to_owned())
}

/// `text` read as a duration, once `check` (one of the library's rules) accepts it;
/// otherwise the library's message.
pub(crate) fn checked_duration<T>(
    text: &str,
    check: impl FnOnce(Duration) -> baton::Result<T>,
) -> Result<Duration, String> {
    let duration = parse_duration(text)?;
    check(duration)
        .map(|_| duration)
        .map_err(|e| e.message().to_owned())
}

pub(crate) fn parse_key(text: &str) -> Result<String, String> {
    checked_text(text, baton::Key::new)
}

fn parse_reason(text: &str) -> Result<String, String> {
    checked_text(text, baton::lease::check_reason)
}

/// A key prefix for listing: empty, or what a key could start with.
fn parse_prefix(text: &str) -> Result<String, String> {
    checked_text(text, |prefix| {
        baton::Namespace::default().qualify_prefix(baton::store::KeyKind::Lock, prefix)
    })
}

fn parse_holder(text: &str) -> Result<String, String> {
    checked_text(text, baton::lease::Holder::new)
}

fn parse_namespace(text: &str) -> Result<Namespace, String> {
    Namespace::new(text).map_err(|e| e.message().to_owned())
}

pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
    baton::time::parse_duration(text).map_err(|e| e.message().to_owned())
}

pub(crate) fn parse_ttl(text: &str) -> Result<Duration, String> {
    checked_duration(text, Ttl::new)
}

pub(crate) fn parse_wait(text: &str) -> Result<Duration, String> {
    checked_duration(text, WaitTime::new)
}

/// A duration of at most `max`: the rule of every duration flag whose bound is the CLI's own
/// (`--grace`, `--drain`) rather than the library's.
pub(crate) fn parse_at_most(text: &str, max: Duration) -> Result<Duration, String> {
    let d = parse_duration(text)?;
    if d > max {
        return Err(format!(
            "{text:?} is above the maximum of {}",
            human_duration(max)
        ));
    }
    Ok(d)
}

/// `--grace` of `baton run` and `baton worker`: at most [`MAX_GRACE`].
pub(crate) fn parse_grace(text: &str) -> Result<Duration, String> {
    parse_at_most(text, MAX_GRACE)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;
    use clap::error::ErrorKind;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("baton").chain(args.iter().copied()))
    }

    #[test]
    fn the_grammar_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn run_defaults() {
        let cli = parse(&["run", "job", "--", "echo", "-n", "hi"]).unwrap();
        let Command::Run(run) = cli.command else {
            panic!("not run")
        };
        assert_eq!(run.ttl, Duration::from_secs(30));
        assert_eq!(run.wait, Duration::ZERO);
        assert_eq!(run.grace, Duration::from_secs(10));
        assert_eq!(run.on_lost, OnLost::Term);
        assert_eq!(run.key, "job");
        assert_eq!(run.command.argv, ["echo", "-n", "hi"]);
        assert_eq!(cli.global.namespace.as_str(), "baton");
    }

    #[test]
    fn options_after_the_command_belong_to_the_command() {
        let cli = parse(&["run", "--ttl", "5m", "job", "--", "cmd", "--ttl", "1s"]).unwrap();
        let Command::Run(run) = cli.command else {
            panic!("not run")
        };
        assert_eq!(run.ttl, Duration::from_secs(300));
        assert_eq!(run.command.argv, ["cmd", "--ttl", "1s"]);
    }

    #[test]
    fn worker_defaults_and_command() {
        let cli = parse(&["worker", "emails", "--", "./send", "--dry-run"]).unwrap();
        let Command::Worker(worker) = cli.command else {
            panic!("not worker")
        };
        assert_eq!(worker.queue, "emails");
        assert_eq!(worker.concurrency, 1);
        assert_eq!(worker.batch, None);
        assert_eq!(worker.lease, Duration::from_secs(30));
        assert_eq!(worker.drain, Duration::from_secs(30));
        assert_eq!(worker.grace, Duration::from_secs(10));
        assert!(!worker.exit_when_empty);
        assert_eq!(worker.command.argv, ["./send", "--dry-run"]);
    }

    #[test]
    fn global_options_go_anywhere() {
        let cli = parse(&["lock", "list", "--json", "--namespace", "app"]).unwrap();
        assert!(cli.global.json);
        assert_eq!(cli.global.namespace.as_str(), "app");
    }

    #[test]
    fn bad_input_is_rejected_while_parsing() {
        for args in [
            &["run", "job"][..],
            &["run", "job", "--"],
            &["run", "job", "echo"],
            &["run", "", "--", "true"],
            &["run", "a\u{1}b", "--", "true"],
            &["run", "--ttl", "30", "job", "--", "true"],
            &["run", "--ttl", "5ms", "job", "--", "true"],
            &["run", "--wait", "2d", "job", "--", "true"],
            &["run", "--cooldown", "0s", "job", "--", "true"],
            &["run", "--cooldown", "31d", "job", "--", "true"],
            &["run", "--cooldown", "soon", "job", "--", "true"],
            &["run", "--grace", "soon", "job", "--", "true"],
            &["run", "--grace", "2h", "job", "--", "true"],
            &["run", "--grace", "100000000d", "job", "--", "true"],
            &["worker", "q", "--grace", "2h", "--", "true"],
            &["limit", "k", "--max", "1", "--window", "1s", "--wait", "2d"],
            &["run", "--on-lost", "panic", "job", "--", "true"],
            &["--namespace", "a:b", "lock", "list"],
            &["lease", "claim", "k"],
            &["lease", "claim", "k", "--holder", ""],
            &["queue", "enqueue", "q", "not json"],
            &["queue", "enqueue", "", "1"],
            &["queue", "enqueue", "q", "1", "--delay", "soon"],
            &["queue", "enqueue", "q", "1", "--dedup-window", "1h"],
            &["queue", "stats", "q", "--prefix", "a"],
            &["worker", "q"],
            &["worker", "q", "--concurrency", "0", "--", "true"],
            &["worker", "q", "--lease", "1ms", "--", "true"],
            &["worker", "", "--", "true"],
            &["schedule", "list", "extra"],
        ] {
            let err = parse(args).expect_err(&format!("{args:?} parsed"));
            assert!(err.use_stderr(), "{args:?}: {err}");
            assert_ne!(err.kind(), ErrorKind::DisplayHelp);
        }
    }
}
