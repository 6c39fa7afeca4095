//! The top of the command line grammar: the `baton` command, its global options and the list
//! of subcommands.
//!
//! Each subcommand declares its own arguments next to its code (`run::RunArgs`,
//! `lease_cmd::LeaseCommand`, ...), with the value parsers of [`crate::args`], so every
//! argument is validated while parsing, before any store is opened: a typo exits with status
//! 64 and changes nothing.

use baton::Namespace;
use clap::{Args, Parser, Subcommand};

use crate::args;
use crate::output::Output;

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
    #[arg(long, env = "BATON_STORE", global = true, value_name = "URL", value_parser = args::StoreUrl)]
    pub(crate) store: Option<String>,

    /// The namespace every key is qualified with, so applications sharing a store never
    /// see each other's keys.
    #[arg(
        long,
        env = "BATON_NAMESPACE",
        global = true,
        value_name = "NS",
        default_value = baton::store::DEFAULT_NAMESPACE,
        value_parser = args::namespace,
    )]
    pub(crate) namespace: Namespace,

    /// Print data as JSON (one document on stdout).
    #[arg(long, global = true)]
    pub(crate) json: bool,
}

impl GlobalArgs {
    /// Where the command's data goes, by `--json`.
    pub(crate) fn output(&self) -> Output {
        Output::new(self.json)
    }
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
    Run(crate::run::RunArgs),
    /// Run COMMAND while this process is the leader of the election NAME.
    ///
    /// Campaigns as --id with --value (waiting as long as needed, or up to --wait), runs
    /// COMMAND with BATON_KEY, BATON_FENCE (the leader's term) and BATON_LEADER_ID in its
    /// environment, renews the leadership every ttl/3 while it runs, resigns when COMMAND
    /// exits, and exits with COMMAND's status; 79 when the leadership was lost meanwhile.
    Elect(crate::elect_cmd::ElectArgs),
    /// Print the leader of the election NAME (candidate id, value, term); with --watch,
    /// then every change, one line each, until stopped.
    Leader(crate::elect_cmd::LeaderArgs),
    /// Inspect locks.
    #[command(subcommand)]
    Lock(crate::lock_cmd::LockCommand),
    /// Claim, renew, release and inspect leases: claims by a stable holder id.
    #[command(subcommand)]
    Lease(crate::lease_cmd::LeaseCommand),
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::run::OnLost;
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
        assert!(!run.shared);
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
    fn a_rejected_store_url_never_shows_its_password() {
        for url in [
            "redis://:hunter2@127.0.0.1:6379/0?response_timeout=soon",
            "postgres://app:hunter2@db/app?nope=1",
            "mysql://app:hunter2@db/app",
        ] {
            let err = parse(&["--store", url, "lock", "list"]).expect_err(url);
            let shown = err.to_string();
            assert!(!shown.contains("hunter2"), "{shown}");
            assert!(shown.contains("--store"), "{shown}");
        }
        let cli = parse(&["--store", "sqlite:///tmp/x.db", "lock", "list"]).unwrap();
        assert_eq!(cli.global.store.as_deref(), Some("sqlite:///tmp/x.db"));
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
            &["run", "--permits", "0", "job", "--", "true"],
            &["run", "--permits", "10001", "job", "--", "true"],
            &["run", "--permits", "many", "job", "--", "true"],
            &["run", "--shared", "--permits", "2", "job", "--", "true"],
            &["run", "--shared=yes", "job", "--", "true"],
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
            &["--store", "nowhere", "lock", "list"],
            &["--store", "mysql://db/app", "lock", "list"],
            &["--store", "memory://x", "lock", "list"],
            &["--store", "sqlite://", "lock", "list"],
            &[
                "--store",
                "sqlite:///tmp/x.db?synchronous=sometimes",
                "lock",
                "list",
            ],
            &[
                "--store",
                "redis://127.0.0.1:6379/0?response_timeout=soon",
                "lock",
                "list",
            ],
            &["--store", "postgres://u@h/db?listen=maybe", "lock", "list"],
            &["status", "--listen", "127.0.0.1:0", "--refresh", "500ms"],
            &["status", "--listen", "127.0.0.1:0", "--prefix", "a\u{1}"],
        ] {
            let err = parse(args).expect_err(&format!("{args:?} parsed"));
            assert!(err.use_stderr(), "{args:?}: {err}");
            assert_ne!(err.kind(), ErrorKind::DisplayHelp);
        }
    }
}
