//! The `baton` command line.
//!
//! Its main job is `baton run KEY -- COMMAND`: run COMMAND on exactly one machine at a time,
//! for cron jobs that must not run on every replica. `baton lock` and `baton lease` inspect
//! and drive the same locks and leases the library uses; `baton queue` and `baton worker`
//! put work items into queues and run a command per item. The user guide is `docs/cli.md`.
//!
//! The modules, in the order a command flows through them:
//! - [`cli`]: the top of the grammar (global options, the subcommands), and [`args`]: the
//!   value parsers every subcommand's arguments share, so every argument is validated while
//!   parsing, before any I/O;
//! - [`store`]: which store to open (`--store`, `BATON_STORE`, the default SQLite file);
//! - [`run`], [`lock_cmd`], [`lease_cmd`], [`limit_cmd`], [`cache_cmd`], [`broadcast_cmd`]: the
//!   subcommands;
//! - [`queue_cmd`], [`worker_cmd`], [`schedule_cmd`]: claimable work (queues, a worker that
//!   runs COMMAND per item, cron schedules);
//! - [`child`], [`signals`]: COMMAND's process group, and the signals baton forwards to it;
//!   `guard_cmd`: the internal `baton exec-guard` that makes COMMAND die with baton (Linux);
//! - [`ops`]: the operator commands (`doctor`, `alerts`, `serve-metrics`, `status`);
//! - [`output`]: tables and JSON;
//! - [`exit`]: every exit status, in one place.

#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

/// `eprintln!` in one write (see [`output::say`]): a line baton prints to stderr is never
/// split by what COMMAND, which shares stderr, prints at the same moment.
macro_rules! say {
    ($($arg:tt)*) => {
        $crate::output::say(::std::format_args!($($arg)*))
    };
}

mod args;
mod broadcast_cmd;
mod cache_cmd;
mod child;
mod cli;
mod elect_cmd;
mod exit;
#[cfg(target_os = "linux")]
mod guard_cmd;
mod lease_cmd;
mod limit_cmd;
mod lock_cmd;
mod ops;
mod output;
mod queue_cmd;
#[cfg(test)]
mod reference;
mod run;
mod schedule_cmd;
mod signals;
mod store;
mod worker_cmd;

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::Parser;
use tracing_subscriber::EnvFilter;

use crate::cli::{Cli, Command};
use crate::exit::{Failure, INTERNAL, SUCCESS, USAGE};

/// The environment variable that sets baton's log level (a `tracing` filter).
const LOG_ENV: &str = "BATON_LOG";
/// The log level when [`LOG_ENV`] is unset: baton's warnings (a lost lock, a release after
/// expiry, a store fault) are always visible.
const DEFAULT_LOG: &str = "warn";

fn main() -> ExitCode {
    // COMMAND's guard and the group watchdog, spawned by `baton run` and `baton worker`:
    // parsed apart from the grammar (their environment is COMMAND's, whatever BATON_*
    // variables that holds).
    #[cfg(target_os = "linux")]
    if let Some(status) = guard_cmd::internal(std::env::args_os().skip(1)) {
        return ExitCode::from(status);
    }
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) => {
            // Help and version go to stdout with status 0; every usage error is status 64
            // (clap's own default is 2).
            let status = if error.use_stderr() { USAGE } else { SUCCESS };
            let _ = error.print();
            return ExitCode::from(status);
        }
    };
    init_logging();
    let status = match execute(&cli) {
        Ok(status) => status,
        Err(failure) => {
            if !failure.is_quiet() {
                say!("baton: {failure}");
            }
            failure.status
        }
    };
    ExitCode::from(status)
}

/// Runs the parsed command on a single-threaded runtime; returns baton's exit status.
fn execute(cli: &Cli) -> Result<u8, Failure> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Failure::new(INTERNAL, format!("cannot start the async runtime: {e}")))?;
    runtime.block_on(async {
        match &cli.command {
            Command::Run(args) => run::run(&cli.global, args).await,
            Command::Elect(args) => elect_cmd::elect(&cli.global, args).await,
            Command::Leader(args) => elect_cmd::leader(&cli.global, args).await,
            Command::Lock(command) => lock_cmd::run(&cli.global, command).await,
            Command::Lease(command) => lease_cmd::run(&cli.global, command).await,
            Command::Doctor => ops::doctor::run(&cli.global).await,
            Command::Alerts(args) => ops::alerts::run(args),
            Command::ServeMetrics(args) => ops::metrics_cmd::run(&cli.global, args).await,
            Command::Status(args) => ops::status::run(&cli.global, args).await,
            Command::Limit(args) => limit_cmd::run(&cli.global, args).await,
            Command::Cache(command) => cache_cmd::run(&cli.global, command).await,
            Command::Publish(args) => broadcast_cmd::publish(&cli.global, args).await,
            Command::Subscribe(args) => broadcast_cmd::subscribe(&cli.global, args).await,
            Command::Queue(command) => queue_cmd::run(&cli.global, command).await,
            Command::Worker(args) => worker_cmd::run(&cli.global, args).await,
            Command::Schedule(command) => schedule_cmd::run(&cli.global, command).await,
        }
    })
}

/// Logs to stderr, filtered by `BATON_LOG` (default `warn`).
fn init_logging() {
    let filter = match std::env::var(LOG_ENV) {
        Ok(directives) if !directives.trim().is_empty() => EnvFilter::try_new(&directives)
            .unwrap_or_else(|e| {
                say!("baton: ignoring {LOG_ENV}={directives:?}: {e}; logging at {DEFAULT_LOG}");
                EnvFilter::new(DEFAULT_LOG)
            }),
        _ => EnvFilter::new(DEFAULT_LOG),
    };
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_target(false)
        .init();
}
