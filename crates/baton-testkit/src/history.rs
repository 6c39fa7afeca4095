//! Recorded histories: what every contender saw, per key, on one monotonic clock.
//!
//! Contenders append [`Op`]s to a [`Recorder`] (one per process, shared by its tasks) as
//! they acquire, release, write to a fenced resource and cause side effects. A child
//! process writes its recorder's ops as JSON lines ([`Recorder::write_jsonl`]); the parent
//! reads every file back ([`History::read_jsonl`]), merges them ([`History::merge`]) and
//! runs the [checkers](crate::check).
//!
//! A holder *believes* it holds a grant from the moment `acquire` returned until the
//! earlier of the moment it sent the release and the grant's `valid_until`; the history
//! keeps exactly those three times for every grant (see [`Grant`]).
//!
//! Every time is read so that it errs toward a *shorter* believed window: the acquire's
//! return is read after it returned, the release's send before it was sent, and
//! `valid_until` is converted never later than it is ([`MonoTime::from_instant`]). So an
//! overlap the checker reports really happened, by at least the reported amount.
//!
//! # Examples
//! ```no_run
//! # async fn run(locks: baton_core::Locks) {
//! use std::time::Duration;
//! use baton_core::LockOptions;
//! use baton_testkit::{FencedRegister, Recorder, check, time::MonoTime};
//!
//! let recorder = Recorder::for_this_process();
//! let register = FencedRegister::in_memory("k");
//! let log = recorder.contender(0);
//! let requested = MonoTime::now();
//! let guard = locks.acquire("k", &LockOptions::new(Duration::from_secs(10))).await.unwrap();
//! log.acquired(&guard, requested);
//! log.write(&register, "k", guard.fence(), register.read() + 1);
//! log.release(guard).await;
//! check::assert_clean(&check::all(&recorder.history()));
//! # }
//! ```

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, BufRead, BufReader, BufWriter, Write};
use std::path::Path;
use std::sync::{Arc, Mutex};

use baton_core::{Fence, Leadership, LockGuard, ReleaseOutcome};
use serde::{Deserialize, Serialize};

use crate::register::{FencedRegister, WriteRecord};
use crate::time::MonoTime;

/// One recorded event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Op {
    /// The OS process (or any id that tells the recording processes apart).
    pub process: u32,
    /// The contender within the process.
    pub contender: u32,
    /// The key the event is about (the lock key as the caller gave it).
    pub key: String,
    /// When it happened; what "when" means depends on the kind (see [`OpKind`]).
    pub at: MonoTime,
    /// Recording order within the process: the program order of each contender.
    pub seq: u64,
    /// What happened.
    #[serde(flatten)]
    pub kind: OpKind,
}

/// What happened.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum OpKind {
    /// An acquire returned a grant; [`Op::at`] is when it returned.
    Acquired {
        /// The grant's fence.
        fence: u64,
        /// When the acquire was called.
        requested: MonoTime,
        /// The grant's local deadline (the guard's `valid_until`).
        valid_until: MonoTime,
    },
    /// A release of the grant with `fence`; [`Op::at`] is when it was *sent*.
    Released {
        /// The released grant's fence.
        fence: u64,
        /// What the release answered.
        outcome: Outcome,
        /// When the answer arrived, where the recorder saw it (histories recorded before
        /// this field have none: [`jepsen`](crate::jepsen) then takes the sending time).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        answered: Option<MonoTime>,
    },
    /// A write to a [`FencedRegister`]; [`Op::at`] is when it was sent.
    Write {
        /// The register's name.
        register: String,
        /// The fence the write carried.
        fence: u64,
        /// The register's own sequence number for this write (its linearization order).
        order: u64,
        /// The value written.
        value: u64,
        /// Whether the register accepted the write.
        accepted: bool,
    },
    /// A side effect that must happen exactly once per `id`.
    Effect {
        /// What the effect was, e.g. the counter value it produced or a job id.
        id: String,
    },
}

/// A release's answer, as recorded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// The grant was still held and is now free.
    Released,
    /// The grant had expired before the release arrived.
    Expired,
    /// The store could not be reached.
    Faulted,
    /// An outcome this version of the testkit does not know, as its debug text.
    Other(String),
}

impl From<&ReleaseOutcome> for Outcome {
    fn from(outcome: &ReleaseOutcome) -> Self {
        match outcome {
            ReleaseOutcome::Released => Outcome::Released,
            ReleaseOutcome::Expired => Outcome::Expired,
            ReleaseOutcome::Faulted => Outcome::Faulted,
        }
    }
}

/// One grant as a holder saw it, paired from its `Acquired` and `Released` ops.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    /// The holder's process.
    pub process: u32,
    /// The holder within its process.
    pub contender: u32,
    /// The key.
    pub key: String,
    /// The fence.
    pub fence: u64,
    /// When the acquire was called.
    pub requested: MonoTime,
    /// When the acquire returned: the start of the believed window.
    pub acquired: MonoTime,
    /// The grant's local deadline.
    pub valid_until: MonoTime,
    /// When the release was sent, if it was.
    pub released: Option<MonoTime>,
    /// The release's answer, if it was released.
    pub outcome: Option<Outcome>,
}

impl Grant {
    /// The end of the believed window: the earlier of the release and `valid_until`.
    pub fn believed_until(&self) -> MonoTime {
        match self.released {
            Some(released) => released.min(self.valid_until),
            None => self.valid_until,
        }
    }

    /// Whether the holder believed it held the grant for any time at all (a holder paused
    /// past `valid_until` before `acquire` returned never did).
    pub fn is_believed(&self) -> bool {
        self.believed_until() > self.acquired
    }

    /// Whether `other` is the same holder's grant (a re-claim that extended it).
    pub fn same_holder(&self, other: &Grant) -> bool {
        self.process == other.process
            && self.contender == other.contender
            && self.fence == other.fence
    }
}

impl std::fmt::Display for Grant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "fence {} held by p{}/c{} over [{}, {}) (requested {}, valid until {}, ",
            self.fence,
            self.process,
            self.contender,
            self.acquired,
            self.believed_until(),
            self.requested,
            self.valid_until,
        )?;
        match (&self.released, &self.outcome) {
            (Some(at), Some(outcome)) => write!(f, "release sent {at}: {outcome:?})"),
            _ => write!(f, "never released)"),
        }
    }
}

/// A list of ops from one or more processes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct History {
    ops: Vec<Op>,
}

impl History {
    /// A history of `ops`, in the order given.
    pub fn new(ops: Vec<Op>) -> Self {
        History { ops }
    }

    /// The ops.
    pub fn ops(&self) -> &[Op] {
        &self.ops
    }

    /// Merges the histories of several processes into one, ordered by time (then process
    /// and recording order).
    pub fn merge(histories: impl IntoIterator<Item = History>) -> Self {
        let mut ops: Vec<Op> = histories.into_iter().flat_map(|h| h.ops).collect();
        ops.sort_by_key(|op| (op.at, op.process, op.seq));
        History { ops }
    }

    /// Reads a history written as JSON lines.
    ///
    /// # Errors
    /// When the file cannot be read or a line is not an [`Op`] (naming the line).
    pub fn read_jsonl(path: impl AsRef<Path>) -> io::Result<Self> {
        let path = path.as_ref();
        let reader = BufReader::new(File::open(path)?);
        let mut ops = Vec::new();
        for (n, line) in reader.lines().enumerate() {
            let line = line?;
            if line.trim().is_empty() {
                continue;
            }
            let op = serde_json::from_str(&line).map_err(|e| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("{}:{}: not an op: {e}", path.display(), n + 1),
                )
            })?;
            ops.push(op);
        }
        Ok(History { ops })
    }

    /// Writes the history as JSON lines, one op a line, replacing `path`.
    ///
    /// # Errors
    /// When the file cannot be written.
    pub fn write_jsonl(&self, path: impl AsRef<Path>) -> io::Result<()> {
        let mut out = BufWriter::new(File::create(path)?);
        for op in &self.ops {
            serde_json::to_writer(&mut out, op)?;
            out.write_all(b"\n")?;
        }
        out.flush()
    }

    /// The grants, each paired with its release (matched by process, contender, key and
    /// fence), in the order they were acquired.
    pub fn grants(&self) -> Vec<Grant> {
        let mut grants: Vec<Grant> = Vec::new();
        let mut open: HashMap<(u32, u32, &str, u64), usize> = HashMap::new();
        for op in self.ordered() {
            match &op.kind {
                OpKind::Acquired {
                    fence,
                    requested,
                    valid_until,
                } => {
                    open.insert(
                        (op.process, op.contender, op.key.as_str(), *fence),
                        grants.len(),
                    );
                    grants.push(Grant {
                        process: op.process,
                        contender: op.contender,
                        key: op.key.clone(),
                        fence: *fence,
                        requested: *requested,
                        acquired: op.at,
                        valid_until: *valid_until,
                        released: None,
                        outcome: None,
                    });
                }
                OpKind::Released { fence, outcome, .. } => {
                    if let Some(i) =
                        open.remove(&(op.process, op.contender, op.key.as_str(), *fence))
                    {
                        grants[i].released = Some(op.at);
                        grants[i].outcome = Some(outcome.clone());
                    }
                }
                OpKind::Write { .. } | OpKind::Effect { .. } => {}
            }
        }
        grants.sort_by_key(|g| (g.acquired, g.process, g.contender));
        grants
    }

    /// The ids of every recorded effect, once per recording.
    pub fn effects(&self) -> Vec<&str> {
        self.ops
            .iter()
            .filter_map(|op| match &op.kind {
                OpKind::Effect { id } => Some(id.as_str()),
                _ => None,
            })
            .collect()
    }

    /// The ops in program order: by process, then recording order.
    pub(crate) fn ordered(&self) -> Vec<&Op> {
        let mut ops: Vec<&Op> = self.ops.iter().collect();
        ops.sort_by_key(|op| (op.process, op.seq));
        ops
    }
}

/// Records the ops of one process. Cheap to clone; share one per process.
#[derive(Debug, Clone)]
pub struct Recorder {
    process: u32,
    ops: Arc<Mutex<Vec<Op>>>,
}

impl Recorder {
    /// A recorder for the process with id `process`.
    pub fn new(process: u32) -> Self {
        Recorder {
            process,
            ops: Arc::new(Mutex::new(Vec::new())),
        }
    }

    /// A recorder for this OS process (its pid).
    pub fn for_this_process() -> Self {
        Recorder::new(std::process::id())
    }

    /// The process id the ops are recorded under.
    pub fn process(&self) -> u32 {
        self.process
    }

    /// Appends one op.
    pub fn record(&self, contender: u32, key: &str, at: MonoTime, kind: OpKind) {
        let mut ops = self.ops.lock().unwrap_or_else(|p| p.into_inner());
        let seq = ops.len() as u64;
        ops.push(Op {
            process: self.process,
            contender,
            key: key.to_owned(),
            at,
            seq,
            kind,
        });
    }

    /// The recording handle of contender `contender`.
    pub fn contender(&self, contender: u32) -> ContenderLog {
        ContenderLog {
            recorder: self.clone(),
            contender,
        }
    }

    /// A copy of what was recorded so far.
    pub fn history(&self) -> History {
        History::new(self.ops.lock().unwrap_or_else(|p| p.into_inner()).clone())
    }

    /// Writes what was recorded so far as JSON lines, replacing `path`.
    ///
    /// # Errors
    /// When the file cannot be written.
    pub fn write_jsonl(&self, path: impl AsRef<Path>) -> io::Result<()> {
        self.history().write_jsonl(path)
    }
}

/// What one contender records through, with the common events as methods.
#[derive(Debug, Clone)]
pub struct ContenderLog {
    recorder: Recorder,
    contender: u32,
}

impl ContenderLog {
    /// The contender's id.
    pub fn id(&self) -> u32 {
        self.contender
    }

    /// Records that `guard` was just acquired by an acquire called at `requested`.
    pub fn acquired(&self, guard: &LockGuard, requested: MonoTime) {
        let at = MonoTime::now();
        self.recorder.record(
            self.contender,
            guard.key(),
            at,
            OpKind::Acquired {
                fence: guard.fence().get(),
                requested,
                valid_until: MonoTime::from_instant(guard.valid_until().into_std()),
            },
        );
    }

    /// Records that `leadership` of the election `name` was just won by a campaign started
    /// at `requested`: a grant whose fence is the term.
    pub fn elected(&self, name: &str, leadership: &Leadership, requested: MonoTime) {
        let at = MonoTime::now();
        self.recorder.record(
            self.contender,
            name,
            at,
            OpKind::Acquired {
                fence: leadership.term().get(),
                requested,
                valid_until: MonoTime::from_instant(leadership.valid_until().into_std()),
            },
        );
    }

    /// Resigns `leadership` of the election `name`, recording it as a release.
    pub async fn resign(&self, name: &str, leadership: Leadership) -> ReleaseOutcome {
        let fence = leadership.term().get();
        let sent = MonoTime::now();
        let outcome = leadership.resign().await;
        self.recorder.record(
            self.contender,
            name,
            sent,
            OpKind::Released {
                fence,
                outcome: Outcome::from(&outcome),
                answered: Some(MonoTime::now()),
            },
        );
        outcome
    }

    /// Releases `guard`, recording the time the release was sent and its outcome.
    pub async fn release(&self, guard: LockGuard) -> ReleaseOutcome {
        let key = guard.key().to_owned();
        let fence = guard.fence().get();
        let sent = MonoTime::now();
        let outcome = guard.release().await;
        self.recorder.record(
            self.contender,
            &key,
            sent,
            OpKind::Released {
                fence,
                outcome: Outcome::from(&outcome),
                answered: Some(MonoTime::now()),
            },
        );
        outcome
    }

    /// Writes `value` with `fence` to `register`, recording the write and its answer.
    pub fn write(
        &self,
        register: &FencedRegister,
        key: &str,
        fence: Fence,
        value: u64,
    ) -> WriteRecord {
        let sent = MonoTime::now();
        let record = register.write(fence, value);
        self.recorder.record(
            self.contender,
            key,
            sent,
            OpKind::Write {
                register: register.name().to_owned(),
                fence: record.fence,
                order: record.order,
                value: record.value,
                accepted: record.accepted,
            },
        );
        record
    }

    /// Records a side effect `id` on `key`, now.
    pub fn effect(&self, key: &str, id: impl Into<String>) {
        self.recorder.record(
            self.contender,
            key,
            MonoTime::now(),
            OpKind::Effect { id: id.into() },
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(ms: u64) -> MonoTime {
        MonoTime::from_nanos(ms * 1_000_000)
    }

    #[test]
    fn ops_round_trip_through_jsonl_and_merge_by_time() {
        let dir = tempfile::tempdir().unwrap();
        let a = Recorder::new(1);
        let b = Recorder::new(2);
        a.record(
            0,
            "k",
            t(10),
            OpKind::Acquired {
                fence: 1,
                requested: t(9),
                valid_until: t(100),
            },
        );
        b.record(3, "k", t(5), OpKind::Effect { id: "x".into() });
        a.record(
            0,
            "k",
            t(20),
            OpKind::Released {
                fence: 1,
                outcome: Outcome::Released,
                answered: None,
            },
        );
        b.record(
            3,
            "k",
            t(30),
            OpKind::Write {
                register: "r".into(),
                fence: 2,
                order: 0,
                value: 1,
                accepted: true,
            },
        );
        a.write_jsonl(dir.path().join("a.jsonl")).unwrap();
        b.write_jsonl(dir.path().join("b.jsonl")).unwrap();
        let first = std::fs::read_to_string(dir.path().join("a.jsonl")).unwrap();
        assert!(
            first.starts_with(
                r#"{"process":1,"contender":0,"key":"k","at":10000000,"seq":0,"op":"acquired""#
            ),
            "{first}"
        );

        let merged = History::merge([
            History::read_jsonl(dir.path().join("a.jsonl")).unwrap(),
            History::read_jsonl(dir.path().join("b.jsonl")).unwrap(),
        ]);
        let times: Vec<_> = merged.ops().iter().map(|op| op.at).collect();
        assert_eq!(times, [t(5), t(10), t(20), t(30)]);
        assert_eq!(merged.effects(), ["x"]);
        let grants = merged.grants();
        assert_eq!(grants.len(), 1);
        assert_eq!(grants[0].believed_until(), t(20));
    }

    #[test]
    fn a_bad_line_names_the_file_and_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("h.jsonl");
        std::fs::write(&path, "\n{\"nonsense\":1}\n").unwrap();
        let err = History::read_jsonl(&path).unwrap_err();
        assert!(err.to_string().contains("h.jsonl:2"), "{err}");
    }

    #[test]
    fn believed_window_ends_at_release_or_valid_until() {
        let r = Recorder::new(1);
        r.record(
            0,
            "k",
            t(10),
            OpKind::Acquired {
                fence: 1,
                requested: t(9),
                valid_until: t(40),
            },
        );
        r.record(
            0,
            "k",
            t(50),
            OpKind::Released {
                fence: 1,
                outcome: Outcome::Expired,
                answered: None,
            },
        );
        r.record(
            1,
            "k",
            t(60),
            OpKind::Acquired {
                fence: 2,
                requested: t(55),
                valid_until: t(58),
            },
        );
        r.record(
            2,
            "k",
            t(70),
            OpKind::Acquired {
                fence: 3,
                requested: t(65),
                valid_until: t(90),
            },
        );
        let grants = r.history().grants();
        assert_eq!(grants[0].believed_until(), t(40));
        assert!(
            !grants[1].is_believed(),
            "valid_until passed before acquire returned"
        );
        assert_eq!(grants[2].believed_until(), t(90));
        assert!(grants[2].released.is_none());
        assert!(
            grants[0].to_string().contains("fence 1 held by p1/c0"),
            "{}",
            grants[0]
        );
    }
}
