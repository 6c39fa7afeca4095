//! The operation journal: every operation of every worker process, as JSON lines.
//!
//! Each operation is recorded when it is invoked and again when it completes, as `ok`
//! (it happened, with its answer), `fail` (it certainly did not take effect: contended, a
//! duplicate, not the holder, held by another) or `indeterminate` (the store faulted and the
//! operation may or may not have taken effect). An invocation without a completion — the
//! process was killed, or the run ended in the middle of it — is indeterminate too.
//!
//! Every line is written with one `write` to a file opened for appending, the moment it is
//! recorded, so a worker killed with SIGKILL loses nothing it recorded. Times are
//! [`MonoTime`]s (`CLOCK_MONOTONIC` in nanoseconds), comparable across the processes of one
//! host. What the fields of one line mean depends on the operation; see [`Op`].

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{self, BufRead, BufReader, Write};
use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use baton_testkit::MonoTime;
use serde::{Deserialize, Serialize};

/// What an operation was.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Op {
    /// `locks().acquire(key)` with wait and keep-alive; ok: `fence`, `valid_until`.
    #[serde(rename = "lock.acquire")]
    LockAcquire,
    /// A write of `value` with `fence` to the key's fenced register (recorded before the
    /// register is touched); ok: `accepted`, `order`.
    #[serde(rename = "lock.write")]
    LockWrite,
    /// `guard.release()`; invoke: `fence` and the guard's last `valid_until`; ok or indeterminate:
    /// `outcome`.
    #[serde(rename = "lock.release")]
    LockRelease,
    /// `leases().claim(key, holder)`; ok: `fence`, `valid_until`; fail: held by another.
    #[serde(rename = "lease.claim")]
    LeaseClaim,
    /// `leases().renew(key, holder)`; ok: the new `valid_until`; fail: not the holder.
    #[serde(rename = "lease.renew")]
    LeaseRenew,
    /// A fenced register write by a lease holder, as [`Op::LockWrite`].
    #[serde(rename = "lease.write")]
    LeaseWrite,
    /// `leases().release(key, holder)`; invoke: `fence`, `valid_until`; ok: `outcome`.
    #[serde(rename = "lease.release")]
    LeaseRelease,
    /// `idempotency().try_acquire(scope)`; ok: acquired as `attempt` (`takeover`); fail: a
    /// duplicate, `outcome` its status and `attempt` the record's attempt.
    #[serde(rename = "idem.acquire")]
    IdemAcquire,
    /// The side effect of `attempt`, done: recorded once, as ok, when it happened.
    #[serde(rename = "idem.effect")]
    IdemEffect,
    /// `idempotency().finalize(attempt, Completed)`; ok: `outcome` the record's status and
    /// `attempt` its attempt; fail: not the owner.
    #[serde(rename = "idem.finalize")]
    IdemFinalize,
    /// `rate_limiter(quota).try_acquire(key, value)`; ok: `accepted` whether the `value` units
    /// were admitted.
    #[serde(rename = "rate.acquire")]
    RateAcquire,
    /// `semaphore(key, permits).acquire()` with wait and keep-alive; ok: `fence`,
    /// `valid_until`; fail: every permit held for the whole wait.
    #[serde(rename = "sem.acquire")]
    SemAcquire,
    /// `permit.release()`; invoke: `fence` and the permit's last `valid_until`; ok or
    /// indeterminate: `outcome`.
    #[serde(rename = "sem.release")]
    SemRelease,
    /// `rwlock(key).read()`; ok: `fence`, `valid_until`; fail: a writer held or waited for
    /// the whole wait.
    #[serde(rename = "rw.read")]
    RwRead,
    /// The read guard's `release()`, as [`Op::SemRelease`].
    #[serde(rename = "rw.read.release")]
    RwReadRelease,
    /// `rwlock(key).write()`; ok: `fence`, `valid_until`; fail: the gate held, or readers
    /// inside, for the whole wait.
    #[serde(rename = "rw.write")]
    RwWrite,
    /// The write guard's `release()`, as [`Op::SemRelease`].
    #[serde(rename = "rw.write.release")]
    RwWriteRelease,
    /// `election(name).try_campaign(candidate)` with a wait; ok: `fence` the term,
    /// `valid_until`; fail: another candidate led for the whole wait.
    #[serde(rename = "elect.campaign")]
    ElectCampaign,
    /// `leadership.resign()`; invoke: `fence` the term and the leadership's last
    /// `valid_until`; ok or indeterminate: `outcome`.
    #[serde(rename = "elect.resign")]
    ElectResign,
}

impl Op {
    /// Every operation, in report order.
    pub const ALL: [Op; 19] = [
        Op::LockAcquire,
        Op::LockWrite,
        Op::LockRelease,
        Op::LeaseClaim,
        Op::LeaseRenew,
        Op::LeaseWrite,
        Op::LeaseRelease,
        Op::IdemAcquire,
        Op::IdemEffect,
        Op::IdemFinalize,
        Op::RateAcquire,
        Op::SemAcquire,
        Op::SemRelease,
        Op::RwRead,
        Op::RwReadRelease,
        Op::RwWrite,
        Op::RwWriteRelease,
        Op::ElectCampaign,
        Op::ElectResign,
    ];

    /// Whether the operation is a rate-limit one, which only stores that keep rate limits run
    /// (see [`crate::plan::StoreKind::keeps_budgets`]).
    pub fn needs_budgets(self) -> bool {
        matches!(self, Op::RateAcquire)
    }

    /// The name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Op::LockAcquire => "lock.acquire",
            Op::LockWrite => "lock.write",
            Op::LockRelease => "lock.release",
            Op::LeaseClaim => "lease.claim",
            Op::LeaseRenew => "lease.renew",
            Op::LeaseWrite => "lease.write",
            Op::LeaseRelease => "lease.release",
            Op::IdemAcquire => "idem.acquire",
            Op::IdemEffect => "idem.effect",
            Op::IdemFinalize => "idem.finalize",
            Op::RateAcquire => "rate.acquire",
            Op::SemAcquire => "sem.acquire",
            Op::SemRelease => "sem.release",
            Op::RwRead => "rw.read",
            Op::RwReadRelease => "rw.read.release",
            Op::RwWrite => "rw.write",
            Op::RwWriteRelease => "rw.write.release",
            Op::ElectCampaign => "elect.campaign",
            Op::ElectResign => "elect.resign",
        }
    }
}

/// Where in its life an operation is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Called.
    Invoke,
    /// Completed and took effect.
    Ok,
    /// Completed and certainly took no effect.
    Fail,
    /// Completed with a fault: may or may not have taken effect (Jepsen's `info`).
    #[serde(rename = "indeterminate")]
    Info,
}

/// The operation-specific fields of an event; unset ones are left out of the line.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Detail {
    /// A grant's fence.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fence: Option<u64>,
    /// A grant's local deadline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub valid_until: Option<MonoTime>,
    /// A value written, or units asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<u64>,
    /// A register's order of the write.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub order: Option<u64>,
    /// Whether a write or a rate decision was accepted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accepted: Option<bool>,
    /// An idempotency attempt number.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt: Option<u32>,
    /// Whether an idempotency attempt took over a lapsed one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub takeover: Option<bool>,
    /// An answer in words (`released`, `expired`, `contended`, `duplicate:completed`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<String>,
    /// The error of an indeterminate completion.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// One line of the journal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// The OS process id of the worker.
    pub process: u32,
    /// The worker slot the process runs in (a replaced worker keeps its slot).
    pub worker: u32,
    /// The contender within the process.
    pub contender: u32,
    /// Recording order within the process.
    pub seq: u64,
    /// The operation id within the process: an invocation and its completion share it.
    pub id: u64,
    /// When: invocations before the call, completions after it returned.
    pub at: MonoTime,
    /// The operation.
    pub op: Op,
    /// The phase.
    pub phase: Phase,
    /// The key (lock, lease, idempotency, rate-limit, semaphore or reader-writer lock key, or
    /// election name).
    pub key: String,
    /// The operation-specific fields.
    #[serde(flatten)]
    pub detail: Detail,
}

/// The journal of one worker process. Shared by its contenders.
#[derive(Debug)]
pub struct Journal {
    file: Mutex<File>,
    process: u32,
    worker: u32,
    seq: AtomicU64,
    ids: AtomicU64,
}

/// An invoked operation, to complete.
#[derive(Debug, Clone)]
#[must_use = "complete the operation, or it is recorded as indeterminate"]
pub struct Invocation {
    contender: u32,
    id: u64,
    op: Op,
    key: String,
    /// When it was invoked.
    pub at: MonoTime,
}

impl Journal {
    /// A journal appending to `path` (created if missing) for process `process` in slot
    /// `worker`.
    ///
    /// # Errors
    /// When the file cannot be opened.
    pub fn create(path: &Path, process: u32, worker: u32) -> io::Result<Journal> {
        let file = OpenOptions::new().create(true).append(true).open(path)?;
        Ok(Journal {
            file: Mutex::new(file),
            process,
            worker,
            seq: AtomicU64::new(0),
            ids: AtomicU64::new(0),
        })
    }

    /// Records the invocation of `op` on `key`, now.
    pub fn invoke(&self, contender: u32, op: Op, key: &str, detail: Detail) -> Invocation {
        let id = self.ids.fetch_add(1, Ordering::Relaxed);
        let at = MonoTime::now();
        self.write(contender, id, at, op, Phase::Invoke, key, detail);
        Invocation {
            contender,
            id,
            op,
            key: key.to_owned(),
            at,
        }
    }

    /// Records the completion of `invocation`, now.
    pub fn complete(&self, invocation: Invocation, phase: Phase, detail: Detail) {
        let at = MonoTime::now();
        self.write(
            invocation.contender,
            invocation.id,
            at,
            invocation.op,
            phase,
            &invocation.key,
            detail,
        );
    }

    /// Records an operation that has no separate invocation (an effect), now, as ok.
    pub fn happened(&self, contender: u32, op: Op, key: &str, detail: Detail) {
        let id = self.ids.fetch_add(1, Ordering::Relaxed);
        self.write(contender, id, MonoTime::now(), op, Phase::Ok, key, detail);
    }

    #[allow(clippy::too_many_arguments)]
    fn write(
        &self,
        contender: u32,
        id: u64,
        at: MonoTime,
        op: Op,
        phase: Phase,
        key: &str,
        detail: Detail,
    ) {
        // The sequence number is taken under the file's lock, so the file is in order.
        let mut file = self.file.lock().unwrap_or_else(|p| p.into_inner());
        let event = Event {
            process: self.process,
            worker: self.worker,
            contender,
            seq: self.seq.fetch_add(1, Ordering::Relaxed),
            id,
            at,
            op,
            phase,
            key: key.to_owned(),
            detail,
        };
        let mut line = serde_json::to_vec(&event).expect("an event serializes");
        line.push(b'\n');
        // One write of the whole line: a process killed after it returns loses nothing.
        file.write_all(&line)
            .unwrap_or_else(|e| panic!("cannot append to the journal: {e}"));
    }
}

/// The events of every journal in a directory (`*.jsonl`), in (process, seq) order.
#[derive(Debug, Clone, Default)]
pub struct Events {
    /// The events.
    pub events: Vec<Event>,
    /// Lines that could not be read: a line cut short by a kill, at the end of a file.
    pub torn_lines: usize,
}

impl Events {
    /// Reads every `*.jsonl` file in `dir`.
    ///
    /// # Errors
    /// When a file cannot be read, or a line other than a file's last is not an event.
    pub fn read_dir(dir: &Path) -> io::Result<Events> {
        let mut paths: Vec<_> = std::fs::read_dir(dir)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "jsonl"))
            .collect();
        paths.sort();
        let mut all = Events::default();
        for path in paths {
            let lines: Vec<String> = BufReader::new(File::open(&path)?)
                .lines()
                .collect::<Result<_, _>>()?;
            let last = lines.len().saturating_sub(1);
            for (n, line) in lines.iter().enumerate() {
                if line.trim().is_empty() {
                    continue;
                }
                match serde_json::from_str::<Event>(line) {
                    Ok(event) => all.events.push(event),
                    Err(_) if n == last => all.torn_lines += 1,
                    Err(e) => {
                        return Err(io::Error::new(
                            io::ErrorKind::InvalidData,
                            format!("{}:{}: not an event: {e}", path.display(), n + 1),
                        ));
                    }
                }
            }
        }
        all.events.sort_by_key(|e| (e.process, e.seq));
        Ok(all)
    }

    /// The events paired into operations, in (process, invocation order).
    pub fn operations(&self) -> Vec<Operation<'_>> {
        let mut by_id: BTreeMap<(u32, u64), Operation<'_>> = BTreeMap::new();
        let mut order: Vec<(u32, u64)> = Vec::new();
        for event in &self.events {
            let id = (event.process, event.id);
            match event.phase {
                Phase::Invoke => {
                    order.push(id);
                    by_id.insert(
                        id,
                        Operation {
                            invoke: Some(event),
                            done: None,
                        },
                    );
                }
                _ => match by_id.get_mut(&id) {
                    Some(op) => op.done = Some(event),
                    None => {
                        order.push(id);
                        by_id.insert(
                            id,
                            Operation {
                                invoke: None,
                                done: Some(event),
                            },
                        );
                    }
                },
            }
        }
        order
            .into_iter()
            .filter_map(|id| by_id.remove(&id))
            .collect()
    }
}

/// One operation: its invocation and its completion, either of which may be missing (an
/// effect has no invocation; a killed process's last call has no completion).
#[derive(Debug, Clone, Copy)]
pub struct Operation<'a> {
    /// The invocation.
    pub invoke: Option<&'a Event>,
    /// The completion.
    pub done: Option<&'a Event>,
}

impl<'a> Operation<'a> {
    /// Whichever event there is, for the fields every event has.
    pub fn any(&self) -> &'a Event {
        self.invoke
            .or(self.done)
            .expect("an operation has an event")
    }

    /// How it ended: the completion's phase, or `Info` when it never completed.
    pub fn phase(&self) -> Phase {
        self.done.map_or(Phase::Info, |e| e.phase)
    }

    /// Whether it completed `ok`.
    pub fn is_ok(&self) -> bool {
        self.phase() == Phase::Ok
    }

    /// When it was invoked (for an effect: when it happened).
    pub fn invoked(&self) -> MonoTime {
        self.any().at
    }

    /// When it completed, if it did.
    pub fn completed(&self) -> Option<MonoTime> {
        self.done.map(|e| e.at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invocations_and_completions_pair_up_and_torn_last_lines_are_counted() {
        let dir = tempfile::tempdir().unwrap();
        let journal = Journal::create(&dir.path().join("a.jsonl"), 11, 0).unwrap();
        let call = journal.invoke(2, Op::LockAcquire, "k", Detail::default());
        journal.complete(
            call,
            Phase::Ok,
            Detail {
                fence: Some(5),
                ..Detail::default()
            },
        );
        let _lost = journal.invoke(2, Op::LockRelease, "k", Detail::default());
        journal.happened(3, Op::IdemEffect, "req-1", Detail::default());
        std::fs::write(dir.path().join("b.jsonl"), "{\"process\":12,\"wor").unwrap();

        let events = Events::read_dir(dir.path()).unwrap();
        assert_eq!(events.events.len(), 4);
        assert_eq!(events.torn_lines, 1);
        let text = std::fs::read_to_string(dir.path().join("a.jsonl")).unwrap();
        assert!(
            text.contains(r#""op":"lock.acquire","phase":"ok","key":"k","fence":5"#),
            "{text}"
        );
        let ops = events.operations();
        assert_eq!(ops.len(), 3);
        assert!(ops[0].is_ok());
        assert_eq!(ops[0].done.unwrap().detail.fence, Some(5));
        assert_eq!(ops[1].phase(), Phase::Info, "never completed");
        assert!(ops[2].invoke.is_none() && ops[2].is_ok());
    }

    #[test]
    fn a_bad_line_in_the_middle_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.jsonl"), "nonsense").unwrap();
        std::fs::write(dir.path().join("b.jsonl"), "nonsense\n{}\n").unwrap();
        let err = Events::read_dir(dir.path()).unwrap_err();
        assert!(err.to_string().contains("b.jsonl:1"), "{err}");
    }
}
