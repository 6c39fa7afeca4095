//! `baton schedule list`: the cron schedules of the namespace, as stored — their spec, next
//! due tick, how many ticks ran, and which replica ran the last one, when.
//!
//! Schedules are registered by services through [`baton::work::Scheduler`]; every replica
//! registers the same ones and each tick runs on exactly one of them. This command only
//! reads the rows (also those registered by other replicas or versions), so it works while
//! the services run. It exits 0 whether or not there are schedules; a `redis://` store exits
//! 64 (Redis keeps no claimable work) and a store fault 69.
//!
//! Times are UTC, as cron is evaluated: `2026-11-30T03:00:00Z` in the table, unix
//! milliseconds (`*_unix_ms`) in JSON.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use baton::work::ScheduleInfo;
use clap::Subcommand;
use serde::Serialize;

use crate::cli::GlobalArgs;
use crate::exit::{Failure, SUCCESS};
use crate::output::{Cell, Kind, Row, utc_token};
use crate::queue_cmd::connect_work;

/// `baton schedule ...`.
#[derive(Debug, Subcommand)]
pub(crate) enum ScheduleCommand {
    /// List the schedules of the namespace: name, cron spec, next due tick (UTC), runs, and
    /// the holder and time of the last run.
    List,
}

/// One schedule, as printed.
#[derive(Debug, Serialize)]
struct ScheduleRow {
    name: String,
    spec: String,
    next_due_unix_ms: i64,
    runs: u64,
    /// The holder that ran the last tick; `null` before the first run.
    last_holder: Option<String>,
    /// When the last tick was claimed; `null` before the first run.
    last_run_unix_ms: Option<i64>,
}

impl ScheduleRow {
    fn of(info: ScheduleInfo) -> Self {
        let (last_holder, last_run_unix_ms) = match info.last_run {
            Some((holder, at)) => (Some(holder.as_str().to_owned()), Some(at)),
            None => (None, None),
        };
        ScheduleRow {
            name: info.name,
            spec: info.spec,
            next_due_unix_ms: info.next_due_ms,
            runs: info.runs,
            last_holder,
            last_run_unix_ms,
        }
    }
}

impl Row for ScheduleRow {
    const HEADER: &'static [&'static str] = &[
        "NAME",
        "SPEC",
        "NEXT_DUE",
        "RUNS",
        "LAST_HOLDER",
        "LAST_RUN",
    ];

    fn cells(&self) -> Vec<Cell> {
        vec![
            Cell::new(Kind::Key, self.name.clone()),
            Cell::new(Kind::Code, self.spec.clone()),
            Cell::new(Kind::Number, utc_token(at_ms(self.next_due_unix_ms))),
            Cell::new(Kind::Number, self.runs.to_string()),
            Cell::new(
                Kind::Code,
                self.last_holder.clone().unwrap_or_else(|| "-".to_owned()),
            ),
            Cell::new(
                Kind::Number,
                self.last_run_unix_ms
                    .map_or_else(|| "-".to_owned(), |ms| utc_token(at_ms(ms))),
            ),
        ]
    }
}

/// Runs `baton schedule ...`; returns baton's exit status.
pub(crate) async fn run(global: &GlobalArgs, command: &ScheduleCommand) -> Result<u8, Failure> {
    match command {
        ScheduleCommand::List => {
            let (baton, _) = connect_work(global).await?;
            let rows: Vec<ScheduleRow> = baton
                .scheduler()?
                .list()
                .await?
                .into_iter()
                .map(ScheduleRow::of)
                .collect();
            global.output().rows(&rows)?;
        }
    }
    Ok(SUCCESS)
}

/// Unix milliseconds as a time (the epoch for earlier ones, which cron never produces).
fn at_ms(ms: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_schedule_that_never_ran_shows_dashes() {
        let row = ScheduleRow {
            name: "nightly".into(),
            spec: "0 3 * * *".into(),
            next_due_unix_ms: 1_796_094_000_000,
            runs: 0,
            last_holder: None,
            last_run_unix_ms: None,
        };
        let texts: Vec<String> = row.cells().into_iter().map(|cell| cell.text).collect();
        assert_eq!(
            texts,
            [
                "nightly",
                "0 3 * * *",
                "2026-12-01T03:00:00Z",
                "0",
                "-",
                "-"
            ]
        );
    }
}
