//! `soak`: the soak and fault suite of baton. See `dev/soak.md`.

#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::time::Duration;

use baton_soak::plan::StoreKind;
use baton_soak::run::{RunOptions, recheck, run};
use baton_soak::workload::{WorkerArgs, run_worker};
use clap::{Parser, Subcommand};

/// Contenders in several processes against a real store while a seeded nemesis injects
/// faults; the recorded history is checked afterwards. Exit status 0: no violation; 1:
/// violations; 2: the run itself failed.
#[derive(Debug, Parser)]
#[command(name = "soak", args_conflicts_with_subcommands = true)]
struct Cli {
    /// The store under test.
    #[arg(long, value_enum)]
    store: Option<StoreKind>,
    /// How long the contenders run.
    #[arg(long, default_value_t = 60)]
    seconds: u64,
    /// The seed of the fault schedule (the same seed gives the same schedule).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Worker processes.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=64))]
    workers: u32,
    /// Print the fault schedule and exit.
    #[arg(long)]
    plan_only: bool,
    /// Keep the journals, registers and logs in this directory (created if missing).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Keep the temporary run directory even when the run passes.
    #[arg(long)]
    keep: bool,
    /// Also write the summary as JSON to this file.
    #[arg(long)]
    summary_json: Option<PathBuf>,
    /// The `baton` binary the supervisors run [default: the one beside this binary].
    #[arg(long, value_name = "PATH")]
    baton: Option<PathBuf>,
    /// Check the run kept in this directory again, without running anything.
    #[arg(long, conflicts_with_all = ["store", "plan_only", "dir", "keep"])]
    recheck: Option<PathBuf>,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// One worker process (started by the parent).
    #[command(hide = true)]
    Worker {
        #[arg(long, value_enum)]
        store: StoreKind,
        #[arg(long)]
        url: String,
        #[arg(long)]
        dir: PathBuf,
        #[arg(long)]
        worker: u32,
        #[arg(long)]
        incarnation: u32,
        #[arg(long)]
        seed: u64,
        #[arg(long)]
        record_ttl_secs: u64,
    },
    /// The COMMAND the supervisors run under `baton run`.
    #[command(hide = true)]
    Command {
        #[arg(long)]
        journal: PathBuf,
        #[arg(long)]
        hold_ms: u64,
    },
}

fn main() {
    let cli = Cli::parse();
    if let Some(Command::Command { journal, hold_ms }) = &cli.command {
        if let Err(e) =
            baton_soak::supervisors::command_main(journal, Duration::from_millis(*hold_ms))
        {
            eprintln!("supervised command: {e}");
            std::process::exit(2);
        }
        return;
    }
    if let Some(Command::Worker {
        store,
        url,
        dir,
        worker,
        incarnation,
        seed,
        record_ttl_secs,
    }) = cli.command
    {
        // baton's warnings (lost locks, faulted releases) go to the worker's log.
        tracing_subscriber::fmt()
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_from_env("BATON_SOAK_LOG")
                    .unwrap_or_else(|_| "warn".into()),
            )
            .with_writer(std::io::stderr)
            .init();
        let args = WorkerArgs {
            store,
            url,
            dir,
            worker,
            incarnation,
            seed,
            record_ttl: Duration::from_secs(record_ttl_secs),
        };
        if let Err(e) = run_worker(args) {
            eprintln!("worker w{worker}.{incarnation}: {e}");
            std::process::exit(2);
        }
        return;
    }
    if let Some(dir) = cli.recheck {
        std::process::exit(recheck(&dir, &mut std::io::stdout()));
    }
    let Some(store) = cli.store else {
        eprintln!(
            "soak: --store redis|postgres|sqlite|redis-sentinel|redis-cluster|etcd (or --recheck DIR) is required"
        );
        std::process::exit(2);
    };
    let options = RunOptions {
        store,
        seconds: cli.seconds,
        seed: cli.seed,
        workers: cli.workers,
        plan_only: cli.plan_only,
        dir: cli.dir,
        keep: cli.keep,
        summary_json: cli.summary_json,
        baton: cli.baton,
    };
    let code = run(&options, &mut std::io::stdout());
    std::process::exit(code);
}
