//! `baton lock status KEY` and `baton lock list`: who holds which lock, with which fence, for
//! how much longer.
//!
//! A lock's holder is the random token of one acquisition (one `baton run`), not a host name.
//! Both commands exit 0 whether or not anything is held; read the output to find out.

use serde::Serialize;

use crate::cli::{GlobalArgs, ListArgs, LockCommand};
use crate::exit::{Failure, SUCCESS};
use crate::output::{
    human_duration, millis, print_json, print_line, print_rows, print_table, write_failure,
};
use crate::store;

/// One held lock, as printed by status and list, and shown by `baton status`.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct LockRow {
    pub(crate) key: String,
    pub(crate) holder: String,
    pub(crate) fence: u64,
    pub(crate) remaining_ms: u64,
}

/// `baton lock status --json`: `held`, and the holder's fields when held.
#[derive(Debug, Serialize)]
struct LockStatus {
    key: String,
    held: bool,
    #[serde(flatten)]
    lock: Option<LockFields>,
}

/// The fields of a held lock in [`LockStatus`].
#[derive(Debug, Serialize)]
struct LockFields {
    holder: String,
    fence: u64,
    remaining_ms: u64,
}

const HEADER: [&str; 4] = ["KEY", "HOLDER", "FENCE", "REMAINING"];

/// Runs `baton lock ...`; returns baton's exit status.
pub(crate) async fn run(global: &GlobalArgs, command: &LockCommand) -> Result<u8, Failure> {
    let baton = store::connect(global).await?;
    match command {
        LockCommand::Status { key } => {
            let row = baton.locks().inspect(key).await?.map(LockRow::from);
            if global.json {
                let status = LockStatus {
                    key: key.clone(),
                    held: row.is_some(),
                    lock: row.map(|row| LockFields {
                        holder: row.holder,
                        fence: row.fence,
                        remaining_ms: row.remaining_ms,
                    }),
                };
                print_json(&status).map_err(write_failure)?;
            } else {
                match row {
                    Some(row) => print_table(&HEADER, &[cells(&row)]),
                    None => print_line(&format!("{key}: free")),
                }
                .map_err(write_failure)?;
            }
        }
        LockCommand::List(ListArgs { prefix, limit }) => {
            let rows: Vec<LockRow> = baton
                .locks()
                .list(prefix, *limit)
                .await?
                .into_iter()
                .map(LockRow::from)
                .collect();
            print_rows(global.json, &HEADER, &rows, cells)?;
        }
    }
    Ok(SUCCESS)
}

impl From<baton::store::HolderInfo> for LockRow {
    fn from(info: baton::store::HolderInfo) -> Self {
        LockRow {
            key: info.key.user_key().to_owned(),
            holder: info.holder.as_str().to_owned(),
            fence: info.fence.get(),
            remaining_ms: millis(info.remaining),
        }
    }
}

fn cells(row: &LockRow) -> Vec<String> {
    vec![
        row.key.clone(),
        row.holder.clone(),
        row.fence.to_string(),
        human_duration(std::time::Duration::from_millis(row.remaining_ms)),
    ]
}
