//! `baton lock status KEY` and `baton lock list`: who holds which lock, with which fence, for
//! how much longer; `status` also shows who holds the permits of the semaphore KEY.
//!
//! A lock's holder is the random token of one acquisition (one `baton run`), not a host name.
//! Both commands exit 0 whether or not anything is held; read the output to find out.

use std::time::Duration;

use clap::Subcommand;
use serde::Serialize;

use crate::args::{self, ListArgs};
use crate::cli::GlobalArgs;
use crate::exit::{Failure, SUCCESS};
use crate::output::{Cell, Fields, Keyed, Kind, human_duration, millis};
use crate::store;

/// `baton lock ...`.
#[derive(Debug, Subcommand)]
pub(crate) enum LockCommand {
    /// Show the holder of lock KEY, its fence and remaining time, and the holders of the
    /// permits of semaphore KEY (`baton run --permits N KEY`) when there are any.
    Status {
        /// The lock's key.
        #[arg(value_name = "KEY", value_parser = args::key)]
        key: String,
    },
    /// List held locks.
    List(args::ListArgs),
}

/// A held lock's fields, as printed by status and list, and shown by `baton status`.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct HeldLock {
    pub(crate) holder: String,
    pub(crate) fence: u64,
    pub(crate) remaining_ms: u64,
}

/// One held lock.
pub(crate) type LockRow = Keyed<HeldLock>;

impl Fields for HeldLock {
    const HEADER: &'static [&'static str] = &["KEY", "HOLDER", "FENCE", "REMAINING"];

    fn cells(&self) -> Vec<Cell> {
        vec![
            Cell::new(Kind::Code, self.holder.clone()),
            Cell::new(Kind::Number, self.fence.to_string()),
            Cell::new(
                Kind::Number,
                human_duration(Duration::from_millis(self.remaining_ms)),
            ),
        ]
    }
}

/// Runs `baton lock ...`; returns baton's exit status.
pub(crate) async fn run(global: &GlobalArgs, command: &LockCommand) -> Result<u8, Failure> {
    let baton = store::connect(global).await?;
    let output = global.output();
    match command {
        LockCommand::Status { key } => {
            let row = baton.locks().inspect(key).await?.map(lock_row);
            // The permits of the semaphore KEY, on stores that keep semaphores (the number
            // of permits does not change who holds one).
            let permits: Vec<LockRow> = match baton.semaphore(key, 1) {
                Ok(semaphore) => semaphore
                    .holders()
                    .await?
                    .into_iter()
                    .map(lock_row)
                    .collect(),
                Err(e) if e.kind() == baton::ErrorKind::Unsupported => Vec::new(),
                Err(e) => return Err(e.into()),
            };
            output.held(key, row, &permits)?;
        }
        LockCommand::List(ListArgs { prefix, limit }) => {
            let rows: Vec<LockRow> = baton
                .locks()
                .list(prefix, *limit)
                .await?
                .into_iter()
                .map(lock_row)
                .collect();
            output.rows(&rows)?;
        }
    }
    Ok(SUCCESS)
}

/// The row of a held lock.
pub(crate) fn lock_row(info: baton::store::HolderInfo) -> LockRow {
    Keyed {
        key: info.key.user_key().to_owned(),
        of: HeldLock {
            holder: info.holder.as_str().to_owned(),
            fence: info.fence.get(),
            remaining_ms: millis(info.remaining),
        },
    }
}
