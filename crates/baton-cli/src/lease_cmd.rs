//! `baton lease claim|renew|release|status|list`: leases held by a stable holder id, from
//! shell scripts.
//!
//! Each command prints the library's answer by its variant name, and its exit status
//! answers "may I act as the owner?" ([`Answer::status`]); the table of answers and statuses
//! is in docs/cli.md ("`baton lease ...`"), once.

use std::time::Duration;

use baton::lease::{ClaimResult, LeaseInfo, LeaseOptions, RemoveResult, Renewal};
use clap::{Args, Subcommand};
use serde::Serialize;

use crate::args::{self, ListArgs};
use crate::cli::GlobalArgs;
use crate::exit::{CONTENDED, Failure, SUCCESS};
use crate::lock_cmd::HeldLock;
use crate::output::{Cell, Fields, Keyed, Kind, human_duration, millis};
use crate::store;

/// `baton lease ...`.
#[derive(Debug, Subcommand)]
pub(crate) enum LeaseCommand {
    /// Claim lease KEY for --holder: prints Claimed, or HeldBy (status 75).
    ///
    /// Claiming again as the same holder is idempotent: it extends the lease and keeps its
    /// fence.
    Claim {
        #[command(flatten)]
        lease: LeaseHolder,
        /// How long the lease lasts without a renewal.
        #[arg(long, value_name = "DUR", default_value = args::DEFAULT_TTL, value_parser = args::ttl)]
        ttl: Duration,
        /// Why the lease is held, shown by status and list (at most 64 bytes).
        #[arg(long, value_name = "TEXT", default_value = "", value_parser = args::reason)]
        reason: String,
    },
    /// Extend --holder's lease KEY to --ttl from now: prints Renewed, or NotHolder
    /// (status 75).
    Renew {
        #[command(flatten)]
        lease: LeaseHolder,
        /// The new time to live, from now.
        #[arg(long, value_name = "DUR", default_value = args::DEFAULT_TTL, value_parser = args::ttl)]
        ttl: Duration,
    },
    /// Release --holder's lease KEY: prints Removed, NoHolder, or Reclaimed (status 75).
    Release {
        #[command(flatten)]
        lease: LeaseHolder,
    },
    /// Show the holder of lease KEY, its fence, remaining time and reason.
    Status {
        /// The lease's key.
        #[arg(value_name = "KEY", value_parser = args::key)]
        key: String,
    },
    /// List live leases.
    List(args::ListArgs),
}

/// The lease KEY and the `--holder` that claims, renews or releases it.
#[derive(Debug, Args)]
pub(crate) struct LeaseHolder {
    /// The lease's key.
    #[arg(value_name = "KEY", value_parser = args::key)]
    pub(crate) key: String,
    #[command(flatten)]
    pub(crate) holder: args::HolderArg,
}

/// The answer of one lease command, as printed.
#[derive(Debug, Serialize)]
#[serde(tag = "result")]
enum Answer {
    Claimed {
        key: String,
        holder: String,
        fence: u64,
        ttl_ms: u64,
    },
    HeldBy {
        key: String,
        holder: String,
        remaining_ms: u64,
    },
    Renewed {
        key: String,
        holder: String,
        ttl_ms: u64,
    },
    NotHolder {
        key: String,
        holder: String,
    },
    Removed {
        key: String,
        holder: String,
    },
    Reclaimed {
        key: String,
        by: String,
    },
    NoHolder {
        key: String,
    },
}

impl Answer {
    /// The exit status of this answer (see the module docs).
    fn status(&self) -> u8 {
        match self {
            Answer::Claimed { .. }
            | Answer::Renewed { .. }
            | Answer::Removed { .. }
            | Answer::NoHolder { .. } => SUCCESS,
            Answer::HeldBy { .. } | Answer::NotHolder { .. } | Answer::Reclaimed { .. } => {
                CONTENDED
            }
        }
    }

    /// One line for people: the variant, the key, then `name=value` fields.
    fn line(&self) -> String {
        let ms = Duration::from_millis;
        match self {
            Answer::Claimed {
                key,
                holder,
                fence,
                ttl_ms,
            } => format!(
                "Claimed {key} holder={holder} fence={fence} ttl={}",
                human_duration(ms(*ttl_ms))
            ),
            Answer::HeldBy {
                key,
                holder,
                remaining_ms,
            } => format!(
                "HeldBy {key} holder={holder} remaining={}",
                human_duration(ms(*remaining_ms))
            ),
            Answer::Renewed {
                key,
                holder,
                ttl_ms,
            } => format!(
                "Renewed {key} holder={holder} ttl={}",
                human_duration(ms(*ttl_ms))
            ),
            Answer::NotHolder { key, holder } => format!("NotHolder {key} holder={holder}"),
            Answer::Removed { key, holder } => format!("Removed {key} holder={holder}"),
            Answer::Reclaimed { key, by } => format!("Reclaimed {key} by={by}"),
            Answer::NoHolder { key } => format!("NoHolder {key}"),
        }
    }
}

/// A live lease's fields, as printed by status and list, and shown by `baton status`: a held
/// lock's, and the reason.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct HeldLease {
    #[serde(flatten)]
    pub(crate) held: HeldLock,
    pub(crate) reason: String,
}

/// One live lease.
pub(crate) type LeaseRow = Keyed<HeldLease>;

impl Fields for HeldLease {
    const HEADER: &'static [&'static str] = &["KEY", "HOLDER", "FENCE", "REMAINING", "REASON"];

    fn cells(&self) -> Vec<Cell> {
        let mut cells = self.held.cells();
        cells.push(Cell::new(Kind::Text, self.reason.clone()));
        cells
    }
}

/// The row of a live lease.
pub(crate) fn lease_row(info: LeaseInfo) -> LeaseRow {
    Keyed {
        key: info.key,
        of: HeldLease {
            held: HeldLock {
                holder: info.holder,
                fence: info.fence.get(),
                remaining_ms: millis(info.remaining),
            },
            reason: info.reason,
        },
    }
}

/// Runs `baton lease ...`; returns baton's exit status.
pub(crate) async fn run(global: &GlobalArgs, command: &LeaseCommand) -> Result<u8, Failure> {
    let baton = store::connect(global).await?;
    let leases = baton.leases();
    let output = global.output();
    let answer = match command {
        LeaseCommand::Claim {
            lease: LeaseHolder { key, holder },
            ttl,
            reason,
        } => match leases
            .claim(key, &holder.id, &LeaseOptions::new(*ttl).reason(reason))
            .await?
        {
            ClaimResult::Claimed { fence, .. } => Answer::Claimed {
                key: key.clone(),
                holder: holder.id.clone(),
                fence: fence.get(),
                ttl_ms: millis(*ttl),
            },
            ClaimResult::HeldBy {
                holder, remaining, ..
            } => Answer::HeldBy {
                key: key.clone(),
                holder,
                remaining_ms: millis(remaining),
            },
        },
        LeaseCommand::Renew {
            lease: LeaseHolder { key, holder },
            ttl,
        } => match leases.renew(key, &holder.id, *ttl).await? {
            Renewal::Renewed => Answer::Renewed {
                key: key.clone(),
                holder: holder.id.clone(),
                ttl_ms: millis(*ttl),
            },
            Renewal::NotHeld => Answer::NotHolder {
                key: key.clone(),
                holder: holder.id.clone(),
            },
        },
        LeaseCommand::Release {
            lease: LeaseHolder { key, holder },
        } => match leases.release(key, &holder.id).await? {
            RemoveResult::Removed { holder } => Answer::Removed {
                key: key.clone(),
                holder,
            },
            RemoveResult::Reclaimed { by } => Answer::Reclaimed {
                key: key.clone(),
                by,
            },
            RemoveResult::NoHolder => Answer::NoHolder { key: key.clone() },
        },
        LeaseCommand::Status { key } => {
            let none: &[LeaseRow] = &[];
            output.held(key, leases.inspect(key).await?.map(lease_row), none)?;
            return Ok(SUCCESS);
        }
        LeaseCommand::List(ListArgs { prefix, limit }) => {
            let rows: Vec<LeaseRow> = leases
                .list(prefix, *limit)
                .await?
                .into_iter()
                .map(lease_row)
                .collect();
            output.rows(&rows)?;
            return Ok(SUCCESS);
        }
    };
    output.line(&answer, || answer.line())?;
    Ok(answer.status())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contention_answers_exit_75() {
        let key = || "k".to_owned();
        let holder = || "h".to_owned();
        let held = Answer::HeldBy {
            key: key(),
            holder: holder(),
            remaining_ms: 1,
        };
        assert_eq!(held.status(), CONTENDED);
        assert_eq!(
            Answer::NotHolder {
                key: key(),
                holder: holder()
            }
            .status(),
            CONTENDED
        );
        assert_eq!(
            Answer::Reclaimed {
                key: key(),
                by: holder()
            }
            .status(),
            CONTENDED
        );
        assert_eq!(Answer::NoHolder { key: key() }.status(), SUCCESS);
    }

    #[test]
    fn answers_print_their_variant() {
        let answer = Answer::Claimed {
            key: "k".into(),
            holder: "h".into(),
            fence: 7,
            ttl_ms: 30_000,
        };
        assert_eq!(answer.line(), "Claimed k holder=h fence=7 ttl=30s");
        let json = serde_json::to_value(&answer).unwrap();
        assert_eq!(json["result"], "Claimed");
        assert_eq!(json["fence"], 7);
    }
}
