//! Recorded lock histories in the JSON form of Jepsen's checkers (Knossos, Elle), so that a
//! checker outside baton can read what baton's own [checkers](crate::check) read.
//!
//! One operation is two JSON objects, one per line: its invocation and its completion,
//!
//! ```text
//! {"index":0,"type":"invoke","f":"acquire","process":0,"time":1000,"value":null,"key":"k"}
//! {"index":1,"type":"ok","f":"acquire","process":0,"time":1500,"value":7,"key":"k"}
//! ```
//!
//! - `f` is `acquire` or `release` (an election's campaign and resignation are recorded as
//!   acquires and releases of the election's name); `value` is the grant's fence, `null` on an
//!   acquire's invocation.
//! - `type` is `invoke`, then `ok` (it happened), `fail` (it certainly did not: a release
//!   answered that the grant had already ended) or `info` (unknown: the store faulted).
//!   Only acquires that were granted were recorded, so every acquire is `ok`: an acquire that
//!   was refused changed nothing, and leaving it out leaves the history's meaning whole.
//! - `time` is nanoseconds on the recording host's monotonic clock, the same clock across
//!   the recording processes ([`MonoTime`]). An acquire is invoked when it was called and
//!   completes when it returned; a release is invoked when it was sent and completes when
//!   its answer came (or, in a history recorded without that time, when it was sent).
//! - `process` is a Jepsen process: one contender (a task of one OS process) that does one
//!   thing at a time. After an `info` completion Jepsen considers a process crashed, so the
//!   contender's later operations get a new `process` number, as Jepsen's own clients do.
//!   `os_process` and `contender` say which recording it came from.
//! - `key` names the lock. Jepsen's lock models check one lock, so a checker reads the
//!   operations of one key at a time (`jq 'select(.key == "k")'`).
//! - `index` numbers the lines in time order, which is the order they are written in.
//!
//! Writes to a fenced register and side effects are not exported: they are baton's own
//! checks ([`check`](crate::check)), not a lock model's.
//!
//! The multi-process tests that record a history (every `run_in_processes` of
//! [`LockWorkload`](crate::workload::LockWorkload),
//! [`PermitWorkload`](crate::workload::PermitWorkload),
//! [`ElectionWorkload`](crate::workload::ElectionWorkload) and
//! [`RwLockWorkload`](crate::rw_workload::RwLockWorkload), and the failover tests) call
//! [`export_this_test`]: with `BATON_JEPSEN_DIR` set, the merged history is written there as
//! `<test binary>.<test name>.jsonl`. For example,
//!
//! ```text
//! BATON_JEPSEN_DIR=/tmp/histories cargo test -p baton-redis --test sentinel
//! jq -c 'select(.key == "job")' /tmp/histories/sentinel.*.jsonl
//! ```

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::history::{History, OpKind, Outcome};
use crate::time::MonoTime;

/// The environment variable naming the directory that [`export_if_asked`] writes to.
pub const DIR_VARIABLE: &str = "BATON_JEPSEN_DIR";

/// One line of the export.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Event {
    /// Position in the export, in time order.
    pub index: usize,
    /// `invoke`, `ok`, `fail` or `info`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// `acquire` or `release`.
    pub f: &'static str,
    /// The Jepsen process: a contender until it saw an `info`.
    pub process: u32,
    /// Nanoseconds on the recording host's monotonic clock.
    pub time: u64,
    /// The grant's fence; `None` (null) on an acquire's invocation.
    pub value: Option<u64>,
    /// The lock.
    pub key: String,
    /// The OS process that recorded it.
    pub os_process: u32,
    /// The contender within that OS process.
    pub contender: u32,
}

/// The events of `history`: each recorded acquire and release as an invocation and a
/// completion, in time order (see the module docs).
pub fn events(history: &History) -> Vec<Event> {
    // Jepsen processes: one per contender, numbered in order of first appearance, and a new
    // one after every `info`.
    let mut numbers: HashMap<(u32, u32), u32> = HashMap::new();
    let mut next = 0u32;
    let mut events = Vec::new();
    for op in ordered(history) {
        let who = (op.process, op.contender);
        let process = *numbers.entry(who).or_insert_with(|| {
            next += 1;
            next - 1
        });
        let event = |kind, f, time: MonoTime, value| Event {
            index: 0,
            kind,
            f,
            process,
            time: time.as_nanos(),
            value,
            key: op.key.clone(),
            os_process: op.process,
            contender: op.contender,
        };
        match &op.kind {
            OpKind::Acquired {
                fence, requested, ..
            } => {
                events.push(event("invoke", "acquire", *requested, None));
                events.push(event("ok", "acquire", op.at, Some(*fence)));
            }
            OpKind::Released {
                fence,
                outcome,
                answered,
            } => {
                let completion = match outcome {
                    Outcome::Released => "ok",
                    Outcome::Expired => "fail",
                    Outcome::Faulted | Outcome::Other(_) => "info",
                };
                events.push(event("invoke", "release", op.at, Some(*fence)));
                let answered = answered.unwrap_or(op.at).max(op.at);
                events.push(event(completion, "release", answered, Some(*fence)));
                if completion == "info" {
                    numbers.insert(who, next);
                    next += 1;
                }
            }
            OpKind::Write { .. } | OpKind::Effect { .. } => {}
        }
    }
    // Stable: an invocation and a completion at one instant stay in that order.
    events.sort_by_key(|e| e.time);
    for (index, event) in events.iter_mut().enumerate() {
        event.index = index;
    }
    events
}

/// The ops in each contender's program order, contender after contender: the order in which
/// Jepsen process numbers are given.
fn ordered(history: &History) -> Vec<&crate::history::Op> {
    let mut ops: Vec<_> = history.ops().iter().collect();
    ops.sort_by_key(|op| (op.process, op.contender, op.seq));
    ops
}

/// Writes the events of `history` to `path`, one JSON object a line, replacing it.
///
/// # Errors
/// When the file cannot be written.
pub fn write(history: &History, path: impl AsRef<Path>) -> io::Result<()> {
    let mut out = BufWriter::new(File::create(path)?);
    for event in events(history) {
        serde_json::to_writer(&mut out, &event)?;
        out.write_all(b"\n")?;
    }
    out.flush()
}

/// [`export_if_asked`] under the name of the running test: its test binary (without
/// Cargo's hash) and the test's name, as `<binary>.<test>`.
pub fn export_this_test(history: &History) -> Option<PathBuf> {
    let binary = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.file_stem().map(|s| s.to_string_lossy().into_owned()))
        .unwrap_or_default();
    let binary = match binary.rsplit_once('-') {
        Some((name, hash)) if hash.chars().all(|c| c.is_ascii_hexdigit()) => name.to_owned(),
        _ => binary,
    };
    let thread = std::thread::current();
    let test = thread.name().unwrap_or("history").replace("::", ".");
    export_if_asked(&format!("{binary}.{test}"), history)
}

/// Writes `history` as `<BATON_JEPSEN_DIR>/<name>.jsonl` when that variable names a directory
/// (created if missing), and returns the path written; does nothing and returns `None` when
/// it is unset.
///
/// # Panics
/// When the variable is set and the file cannot be written: the run was asked for it.
pub fn export_if_asked(name: &str, history: &History) -> Option<PathBuf> {
    let dir = std::env::var_os(DIR_VARIABLE).filter(|d| !d.is_empty())?;
    let dir = PathBuf::from(dir);
    let path = dir.join(format!("{name}.jsonl"));
    std::fs::create_dir_all(&dir)
        .and_then(|()| write(history, &path))
        .unwrap_or_else(|e| panic!("{DIR_VARIABLE}: cannot write {}: {e}", path.display()));
    Some(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::Recorder;

    fn t(ms: u64) -> MonoTime {
        MonoTime::from_nanos(ms * 1_000_000)
    }

    fn acquired(r: &Recorder, contender: u32, fence: u64, requested: u64, at: u64) {
        r.record(
            contender,
            "k",
            t(at),
            OpKind::Acquired {
                fence,
                requested: t(requested),
                valid_until: t(at + 1000),
            },
        );
    }

    fn released(r: &Recorder, contender: u32, fence: u64, at: u64, outcome: Outcome) {
        r.record(
            contender,
            "k",
            t(at),
            OpKind::Released {
                fence,
                outcome,
                answered: Some(t(at + 1)),
            },
        );
    }

    #[test]
    fn every_operation_is_an_invocation_and_a_completion_in_time_order() {
        let a = Recorder::new(10);
        let b = Recorder::new(20);
        acquired(&a, 0, 7, 1, 2);
        released(&a, 0, 7, 5, Outcome::Released);
        acquired(&b, 3, 8, 3, 7);
        released(&b, 3, 8, 9, Outcome::Expired);
        let history = History::merge([a.history(), b.history()]);
        let lines: Vec<String> = events(&history)
            .iter()
            .map(|e| serde_json::to_string(e).unwrap())
            .collect();
        assert_eq!(
            lines[0],
            r#"{"index":0,"type":"invoke","f":"acquire","process":0,"time":1000000,"value":null,"key":"k","os_process":10,"contender":0}"#
        );
        let summary: Vec<(&str, &str, u32, u64)> = events(&history)
            .iter()
            .map(|e| (e.kind, e.f, e.process, e.time / 1_000_000))
            .collect();
        assert_eq!(
            summary,
            [
                ("invoke", "acquire", 0, 1),
                ("ok", "acquire", 0, 2),
                ("invoke", "acquire", 1, 3),
                ("invoke", "release", 0, 5),
                ("ok", "release", 0, 6),
                ("ok", "acquire", 1, 7),
                ("invoke", "release", 1, 9),
                // A release after the grant ended did not happen.
                ("fail", "release", 1, 10),
            ]
        );
    }

    #[test]
    fn a_contender_that_saw_an_indeterminate_answer_continues_as_a_new_process() {
        let r = Recorder::new(1);
        acquired(&r, 0, 1, 0, 1);
        released(&r, 0, 1, 2, Outcome::Faulted);
        acquired(&r, 0, 2, 4, 5);
        acquired(&r, 1, 3, 6, 7);
        let processes: Vec<(u32, &str, &str)> = events(&r.history())
            .iter()
            .map(|e| (e.process, e.kind, e.f))
            .collect();
        assert_eq!(
            processes,
            [
                (0, "invoke", "acquire"),
                (0, "ok", "acquire"),
                (0, "invoke", "release"),
                (0, "info", "release"),
                // Contender 0 again, as a new process.
                (1, "invoke", "acquire"),
                (1, "ok", "acquire"),
                (2, "invoke", "acquire"),
                (2, "ok", "acquire"),
            ]
        );
    }

    #[test]
    fn a_release_recorded_without_its_answer_completes_when_it_was_sent() {
        let r = Recorder::new(1);
        acquired(&r, 0, 1, 0, 1);
        r.record(
            0,
            "k",
            t(4),
            OpKind::Released {
                fence: 1,
                outcome: Outcome::Released,
                answered: None,
            },
        );
        let last = events(&r.history()).pop().unwrap();
        assert_eq!((last.kind, last.time), ("ok", t(4).as_nanos()));
    }

    #[test]
    fn the_export_is_one_json_object_a_line() {
        let dir = tempfile::tempdir().unwrap();
        let r = Recorder::new(1);
        acquired(&r, 0, 1, 0, 1);
        released(&r, 0, 1, 2, Outcome::Released);
        let path = dir.path().join("h.jsonl");
        write(&r.history(), &path).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.lines().count(), 4);
        for line in text.lines() {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            assert!(v["type"].is_string() && v["f"].is_string() && v["time"].is_u64());
        }
    }
}
