//! `baton lock status KEY` and `baton lock list`: who holds which lock, with which fence, for
//! how much longer; `status` also shows who holds the permits of the semaphore KEY, the
//! reader-writer lock KEY (its gate, writer and readers) and the leader of the election KEY.
//!
//! The rows of semaphores, reader-writer locks and elections are defined here once, for
//! `lock status` and the status page (`baton status`) alike.
//!
//! A lock's holder is the random token of one acquisition (one `baton run`), not a host name.
//! Both commands exit 0 whether or not anything is held; read the output to find out.

use std::sync::Arc;
use std::time::Duration;

use baton::election::Leader;
use baton::rwlock::{RwLock, RwLockInfo};
use baton::semaphore::SemaphoreInfo;
use baton::store::HolderInfo;
use clap::Subcommand;
use serde::Serialize;

use crate::args::{self, ListArgs};
use crate::cli::GlobalArgs;
use crate::exit::{Failure, SUCCESS};
use crate::output::{
    Cell, Fields, Keyed, Kind, Output, human_duration, millis, print_line, write_failure,
};
use crate::store;

/// `baton lock ...`.
#[derive(Debug, Subcommand)]
pub(crate) enum LockCommand {
    /// Show the holder of lock KEY, its fence and remaining time; and, when there are any,
    /// the holders of the permits of semaphore KEY (`baton run --permits N KEY`), of the
    /// reader-writer lock KEY (`baton run --shared/--exclusive KEY`) and the leader of the
    /// election KEY (`baton elect KEY`).
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
            let mut related = Related {
                permits: Vec::new(),
                rwlock: None,
                leader: None,
            };
            // The permits of the semaphore KEY and the reader-writer lock KEY, on stores that
            // keep semaphores (the number of permits does not change who holds one).
            match Arc::clone(baton.store()).semaphore_store() {
                Ok(permits) => {
                    related.permits = baton
                        .semaphore(key, 1)?
                        .holders()
                        .await?
                        .into_iter()
                        .map(lock_row)
                        .collect();
                    // The listing of keys from KEY on, of which KEY is the first when held.
                    let leases = baton.locks().store();
                    related.rwlock = RwLock::list(&**leases, &*permits, baton.namespace(), key, 1)
                        .await?
                        .into_iter()
                        .find(|lock| lock.key == *key)
                        .map(|lock| rwlock_row(lock).of);
                }
                Err(e) if e.kind() == baton::ErrorKind::Unsupported => {}
                Err(e) => return Err(e.into()),
            }
            related.leader = baton.election(key)?.leader().await?.map(held_election);
            output.held_with(key, row, &related, || related.print(key, output))?;
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
pub(crate) fn lock_row(info: HolderInfo) -> LockRow {
    Keyed {
        key: info.key.user_key().to_owned(),
        of: held_lock(info),
    }
}

/// A grant's holder, fence and remaining time.
fn held_lock(info: HolderInfo) -> HeldLock {
    HeldLock {
        holder: info.holder.as_str().to_owned(),
        fence: info.fence.get(),
        remaining_ms: millis(info.remaining),
    }
}

impl HeldLock {
    /// `holder (fence 7, 27.5s)`: one holder in a cell of a table.
    fn brief(&self) -> String {
        format!(
            "{} (fence {}, {})",
            self.holder,
            self.fence,
            human_duration(Duration::from_millis(self.remaining_ms))
        )
    }
}

/// What `lock status KEY` shows beside the lock KEY: the other primitives of that key that
/// are held. Each is left out of the JSON when there is none.
#[derive(Debug, Serialize)]
struct Related {
    /// The live permits of the semaphore KEY.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    permits: Vec<LockRow>,
    /// The reader-writer lock KEY, when held.
    #[serde(skip_serializing_if = "Option::is_none")]
    rwlock: Option<HeldRwLock>,
    /// The leader of the election KEY, when it has one.
    #[serde(skip_serializing_if = "Option::is_none")]
    leader: Option<HeldElection>,
}

impl Related {
    /// The text after the lock's own line or table.
    fn print(&self, key: &str, output: Output) -> Result<(), Failure> {
        output.permits(key, &self.permits)?;
        if let Some(rwlock) = &self.rwlock {
            let writer = match (&rwlock.writer, &rwlock.gate) {
                (Some(writer), _) => format!("written by {}", writer.brief()),
                (None, Some(gate)) => format!("gate held by {}", gate.brief()),
                (None, None) => "no writer".to_owned(),
            };
            print_line(&format!(
                "rwlock {key}: {writer}; {} readers",
                rwlock.readers.len()
            ))
            .map_err(write_failure)?;
            let readers: Vec<LockRow> = rwlock
                .readers
                .iter()
                .map(|reader| Keyed {
                    key: key.to_owned(),
                    of: reader.clone(),
                })
                .collect();
            if !readers.is_empty() {
                output.rows(&readers)?;
            }
        }
        if let Some(leader) = &self.leader {
            print_line(&format!("election {key}: led by {}", leader.describe()))
                .map_err(write_failure)?;
        }
        Ok(())
    }
}

/// A semaphore with live permits: how many hold out of how many, and who.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct HeldSemaphore {
    /// How many live permits.
    pub(crate) holders: usize,
    /// The N of the most recent grant; absent when it was not recorded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) permits: Option<u32>,
    /// Each permit, oldest first.
    pub(crate) held_by: Vec<HeldLock>,
}

/// One semaphore.
pub(crate) type SemaphoreRow = Keyed<HeldSemaphore>;

impl Fields for HeldSemaphore {
    const HEADER: &'static [&'static str] = &["KEY", "HOLDERS", "HELD_BY"];

    fn cells(&self) -> Vec<Cell> {
        let of = self
            .permits
            .map_or_else(|| "?".to_owned(), |n| n.to_string());
        let held_by: Vec<String> = self.held_by.iter().map(HeldLock::brief).collect();
        vec![
            Cell::new(Kind::Number, format!("{}/{of}", self.holders)),
            Cell::new(Kind::Code, held_by.join(", ")),
        ]
    }
}

/// The row of a semaphore.
pub(crate) fn semaphore_row(semaphore: SemaphoreInfo) -> SemaphoreRow {
    Keyed {
        key: semaphore.key,
        of: HeldSemaphore {
            holders: semaphore.holders.len(),
            permits: semaphore.permits,
            held_by: semaphore
                .holders
                .into_iter()
                .map(|p| held_lock(p.grant))
                .collect(),
        },
    }
}

/// A held reader-writer lock: its writer, its gate and its readers.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct HeldRwLock {
    /// The writer: the gate's holder, with the write permit's fence and remaining time.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) writer: Option<HeldLock>,
    /// The gate's holder: the writer, one waiting for the readers to leave, or a reader on
    /// its way in.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) gate: Option<HeldLock>,
    /// The readers' permits, oldest first.
    pub(crate) readers: Vec<HeldLock>,
}

/// One reader-writer lock.
pub(crate) type RwLockRow = Keyed<HeldRwLock>;

impl Fields for HeldRwLock {
    const HEADER: &'static [&'static str] = &["KEY", "WRITER", "FENCE", "READERS"];

    fn cells(&self) -> Vec<Cell> {
        let writer = match (&self.writer, &self.gate) {
            (Some(writer), _) => writer.holder.clone(),
            (None, Some(gate)) => format!("(gate: {})", gate.holder),
            (None, None) => "-".to_owned(),
        };
        vec![
            Cell::new(Kind::Code, writer),
            Cell::new(
                Kind::Number,
                self.writer
                    .as_ref()
                    .map_or_else(|| "-".to_owned(), |w| w.fence.to_string()),
            ),
            Cell::new(Kind::Number, self.readers.len().to_string()),
        ]
    }
}

/// The row of a reader-writer lock.
pub(crate) fn rwlock_row(lock: RwLockInfo) -> RwLockRow {
    let writer = match (lock.writer(), &lock.write) {
        (Some(gate), Some(write)) => Some(HeldLock {
            holder: gate.holder.as_str().to_owned(),
            fence: write.fence.get(),
            remaining_ms: millis(write.remaining),
        }),
        _ => None,
    };
    Keyed {
        key: lock.key,
        of: HeldRwLock {
            writer,
            gate: lock.gate.map(held_lock),
            readers: lock.readers.into_iter().map(held_lock).collect(),
        },
    }
}

/// An election's leader.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct HeldElection {
    pub(crate) candidate: String,
    pub(crate) value: String,
    pub(crate) term: u64,
    pub(crate) remaining_ms: u64,
}

impl HeldElection {
    /// `pod-a (term 4, value "10.0.0.7", for another 12s unless renewed)`, as `baton
    /// leader` and `lock status` print a leader.
    pub(crate) fn describe(&self) -> String {
        let value = if self.value.is_empty() {
            String::new()
        } else {
            format!(", value {:?}", self.value)
        };
        format!(
            "{} (term {}{value}, for another {} unless renewed)",
            self.candidate,
            self.term,
            human_duration(Duration::from_millis(self.remaining_ms))
        )
    }
}

/// One election with a leader.
pub(crate) type ElectionRow = Keyed<HeldElection>;

impl Fields for HeldElection {
    const HEADER: &'static [&'static str] = &["ELECTION", "LEADER", "VALUE", "TERM", "REMAINING"];

    fn cells(&self) -> Vec<Cell> {
        vec![
            Cell::new(Kind::Code, self.candidate.clone()),
            Cell::new(Kind::Text, self.value.clone()),
            Cell::new(Kind::Number, self.term.to_string()),
            Cell::new(
                Kind::Number,
                human_duration(Duration::from_millis(self.remaining_ms)),
            ),
        ]
    }
}

/// An election's leader, as shown.
pub(crate) fn held_election(leader: Leader) -> HeldElection {
    HeldElection {
        candidate: leader.candidate,
        value: leader.value,
        term: leader.term.get(),
        remaining_ms: millis(leader.remaining),
    }
}

/// The row of an election with a leader.
pub(crate) fn election_row((name, leader): (String, Leader)) -> ElectionRow {
    Keyed {
        key: name,
        of: held_election(leader),
    }
}
