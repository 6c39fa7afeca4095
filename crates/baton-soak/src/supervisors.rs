//! Supervised COMMANDs: `baton run` processes taking turns on one lock, each running a
//! COMMAND that journals when it starts and ends, and the nemesis's `kill-supervisor` fault,
//! which kills a `baton run` with SIGKILL while its COMMAND runs and records when that
//! COMMAND was gone.
//!
//! The promise under test is the CLI's: **COMMAND never outlives its lock**. The checker
//! ([`check`]) orders the runs of the key by fence and finds every run that was still alive
//! when the next holder's COMMAND started, and every COMMAND that outlived its killed
//! supervisor by more than [`DEATH_DEADLINE`].
//!
//! The supervisors talk to the store directly, not through the fault proxy: proxy faults
//! make a lock lost on purpose, and a COMMAND that baton kills for a lost lock cannot say
//! when it died. A Redis restart without persistence still loses their lock; a finding it
//! explains is documented, as for the other checkers.

use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use baton_testkit::MonoTime;
use serde::{Deserialize, Serialize};

use crate::check::{CheckReport, Losses, secs};

/// How many `baton run` loops contend for the supervised lock.
pub const SUPERVISORS: u32 = 2;
/// The supervised lock's key.
pub const KEY: &str = "soak-supervised";
/// The lock's TTL: the next holder waits this long after a supervisor is killed.
const TTL: &str = "1s";
/// How soon a COMMAND must be gone after its supervisor was killed (the kernel's
/// parent-death signal is immediate).
pub const DEATH_DEADLINE: Duration = Duration::from_secs(1);
/// How long a long COMMAND runs: well past the TTL.
const LONG_HOLD_MS: u64 = 2_500;
/// How long the nemesis waits for a supervisor to be running a COMMAND.
const RUNNING_TIMEOUT: Duration = Duration::from_secs(20);

/// One line of the supervised journal (`supervised.jsonl` in the run directory).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "ev", rename_all = "kebab-case")]
pub enum Line {
    /// COMMAND started, holding the lock with `fence`.
    Start {
        /// The lock's key.
        key: String,
        /// `BATON_FENCE`.
        fence: u64,
        /// COMMAND's pid.
        pid: u32,
        /// When.
        t: MonoTime,
    },
    /// COMMAND is about to exit by itself.
    End {
        /// COMMAND's pid.
        pid: u32,
        /// When.
        t: MonoTime,
    },
    /// The nemesis killed COMMAND's supervisor at `killed`; COMMAND was seen gone at `t`.
    Gone {
        /// COMMAND's pid.
        pid: u32,
        /// When the supervisor was sent SIGKILL.
        killed: MonoTime,
        /// When COMMAND was first seen gone (an upper bound of its death).
        t: MonoTime,
    },
}

/// The supervised journal of a run directory.
pub fn journal(root: &Path) -> PathBuf {
    root.join("supervised.jsonl")
}

/// Appends `line` to the journal at `path`, in one write.
fn append(path: &Path, line: &Line) -> io::Result<()> {
    let mut text = serde_json::to_string(line).map_err(io::Error::other)?;
    text.push('\n');
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?
        .write_all(text.as_bytes())
}

/// The supervised COMMAND (`soak command`): journals its start with `BATON_FENCE`, holds
/// for `hold`, journals its end and exits 0.
///
/// # Errors
/// When `BATON_FENCE` is missing or the journal cannot be written.
pub fn command_main(path: &Path, hold: Duration) -> Result<(), String> {
    let fence = std::env::var("BATON_FENCE")
        .ok()
        .and_then(|f| f.parse().ok())
        .ok_or("BATON_FENCE is not set: run me under baton run")?;
    let key = std::env::var("BATON_KEY").unwrap_or_default();
    let pid = std::process::id();
    let write = |line: Line| append(path, &line).map_err(|e| format!("journal: {e}"));
    write(Line::Start {
        key,
        fence,
        pid,
        t: MonoTime::now(),
    })?;
    std::thread::sleep(hold);
    write(Line::End {
        pid,
        t: MonoTime::now(),
    })
}

/// What starts a supervisor.
#[derive(Debug, Clone)]
pub struct SupervisorCommand {
    /// The `baton` binary.
    pub baton: PathBuf,
    /// The `soak` binary (the COMMAND).
    pub soak: PathBuf,
    /// The store, directly.
    pub url: String,
    /// The run directory.
    pub root: PathBuf,
}

/// The `baton run` loops of a run.
pub struct Supervisors {
    /// The pid of each slot's current `baton run`.
    current: Arc<Mutex<Vec<Option<u32>>>>,
    threads: Vec<JoinHandle<Vec<String>>>,
    journal: PathBuf,
}

impl Supervisors {
    /// Starts [`SUPERVISORS`] loops that run `baton run` until `deadline`.
    ///
    /// # Errors
    /// When the `baton` binary is missing.
    pub fn start(command: SupervisorCommand, deadline: MonoTime) -> Result<Supervisors, String> {
        if !command.baton.is_file() {
            return Err(format!(
                "the baton binary is missing at {}: build it (cargo build -p baton-cli) or pass --baton PATH",
                command.baton.display()
            ));
        }
        let current = Arc::new(Mutex::new(vec![None; SUPERVISORS as usize]));
        let journal = journal(&command.root);
        let threads = (0..SUPERVISORS)
            .map(|slot| {
                let command = command.clone();
                let current = Arc::clone(&current);
                let journal = journal.clone();
                std::thread::spawn(move || supervise(slot, &command, &journal, &current, deadline))
            })
            .collect();
        Ok(Supervisors {
            current,
            threads,
            journal,
        })
    }

    /// Kills the `baton run` of slot `slot`, or of the first other slot whose COMMAND runs
    /// (under store faults one slot may keep the lock for a while), with SIGKILL once its
    /// COMMAND runs, and journals when that COMMAND was gone; answers a note on what
    /// happened.
    ///
    /// # Errors
    /// When no supervisor ran a COMMAND within a timeout, or the kill failed.
    pub fn kill(&self, slot: u32) -> io::Result<String> {
        let waited = MonoTime::now();
        let (baton, command) = 'found: loop {
            let current = self
                .current
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone();
            let slots = current.len();
            for baton in (0..slots).filter_map(|i| current[(slot as usize + i) % slots]) {
                if let Some(command) = running_command(baton) {
                    break 'found (baton, command);
                }
            }
            if MonoTime::now().saturating_since(waited) > RUNNING_TIMEOUT {
                return Err(io::Error::other(format!(
                    "no supervisor ran a COMMAND within {RUNNING_TIMEOUT:?}"
                )));
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        let killed = MonoTime::now();
        baton_testkit::process::kill_hard(baton).map_err(io::Error::from)?;
        let deadline = killed + Duration::from_secs(10);
        while alive(command) && MonoTime::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        let t = MonoTime::now();
        append(
            &self.journal,
            &Line::Gone {
                pid: command,
                killed,
                t,
            },
        )?;
        Ok(format!(
            "baton pid {baton} killed, COMMAND pid {command} gone after {:.1}ms",
            t.saturating_since(killed).as_secs_f64() * 1e3
        ))
    }

    /// Waits for the loops to end (at the deadline); answers their errors.
    pub fn wait_all(self) -> Vec<String> {
        self.threads
            .into_iter()
            .flat_map(|t| {
                t.join()
                    .unwrap_or_else(|_| vec!["a supervisor thread panicked".to_owned()])
            })
            .collect()
    }
}

/// One slot's loop: `baton run` after `baton run` until `deadline`; answers its errors.
fn supervise(
    slot: u32,
    command: &SupervisorCommand,
    journal: &Path,
    current: &Mutex<Vec<Option<u32>>>,
    deadline: MonoTime,
) -> Vec<String> {
    let mut errors = Vec::new();
    let mut turn: u64 = 0;
    while MonoTime::now() < deadline {
        turn += 1;
        // 50 to 300 ms of work per turn, varied without a generator; every third turn
        // outlasts the TTL (baton renews the lock meanwhile), so that a COMMAND orphaned by
        // a killed supervisor would still run when the next holder starts.
        let hold_ms = if turn.is_multiple_of(3) {
            LONG_HOLD_MS
        } else {
            50 + (turn * 97 + u64::from(slot) * 61) % 250
        };
        let log = command.root.join("logs").join(format!("s{slot}.log"));
        let stderr = OpenOptions::new().create(true).append(true).open(&log);
        let mut run = Command::new(&command.baton);
        run.args([
            "--store",
            &command.url,
            "run",
            "--ttl",
            TTL,
            "--wait",
            "20s",
        ])
        .args(["--on-lost", "kill", KEY, "--"])
        .arg(&command.soak)
        .arg("command")
        .arg("--journal")
        .arg(journal)
        .arg("--hold-ms")
        .arg(hold_ms.to_string())
        .env("BATON_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null());
        if let Ok(file) = stderr {
            run.stderr(file);
        }
        let mut child = match run.spawn() {
            Ok(child) => child,
            Err(e) => {
                errors.push(format!("supervisor s{slot}: cannot start baton run: {e}"));
                break;
            }
        };
        current.lock().unwrap_or_else(|p| p.into_inner())[slot as usize] = Some(child.id());
        let status = child.wait();
        current.lock().unwrap_or_else(|p| p.into_inner())[slot as usize] = None;
        match status.map(|s| s.code()) {
            // Done; lost the lock (checked from the journal); held too long by others; the
            // store was down (a server restart); killed by the nemesis.
            Ok(Some(0 | 79 | 75 | 69) | None) => {}
            Ok(Some(code)) => errors.push(format!(
                "supervisor s{slot}: baton run exited {code} (see {})",
                log.display()
            )),
            Err(e) => errors.push(format!("supervisor s{slot}: {e}")),
        }
    }
    errors
}

/// The pid of the supervised COMMAND `baton` runs, once it runs (its program is `soak`, not
/// baton's own guard).
fn running_command(baton: u32) -> Option<u32> {
    let tasks = std::fs::read_dir(format!("/proc/{baton}/task")).ok()?;
    tasks
        .flatten()
        .filter_map(|task| std::fs::read_to_string(task.path().join("children")).ok())
        .flat_map(|list| {
            list.split_whitespace()
                .filter_map(|pid| pid.parse::<u32>().ok())
                .collect::<Vec<_>>()
        })
        .find(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == "soak")
        })
}

/// Whether `pid` can still run: it exists and is not a zombie.
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X")
    })
}

/// One COMMAND's run, from the journal.
#[derive(Debug, Default)]
struct Run {
    key: String,
    fence: u64,
    start: Option<MonoTime>,
    /// When it ended by itself, or was seen gone after its supervisor was killed.
    end: Option<MonoTime>,
    /// When its supervisor was killed.
    killed: Option<MonoTime>,
}

/// The `command-in-lock` and `supervisor-death` checks over the journal in `root`.
pub fn check(root: &Path, losses: &Losses, report: &mut CheckReport) {
    let text = std::fs::read_to_string(journal(root)).unwrap_or_default();
    let mut runs: BTreeMap<u32, Run> = BTreeMap::new();
    for line in text.lines() {
        // A line cut short by a kill says nothing.
        let Ok(line) = serde_json::from_str::<Line>(line) else {
            continue;
        };
        match line {
            Line::Start { key, fence, pid, t } => {
                let run = runs.entry(pid).or_default();
                (run.key, run.fence, run.start) = (key, fence, Some(t));
            }
            Line::End { pid, t } => runs.entry(pid).or_default().end = Some(t),
            Line::Gone { pid, killed, t } => {
                let run = runs.entry(pid).or_default();
                run.end = Some(t);
                run.killed = Some(killed);
            }
        }
    }
    let mut by_key: BTreeMap<&str, Vec<&Run>> = BTreeMap::new();
    for run in runs.values().filter(|r| r.start.is_some()) {
        by_key.entry(&run.key).or_default().push(run);
    }
    let mut unended = 0;
    for (key, runs) in &mut by_key {
        runs.sort_by_key(|r| r.fence);
        for pair in runs.windows(2) {
            let (a, b) = (pair[0], pair[1]);
            let (Some(a_start), Some(b_start)) = (a.start, b.start) else {
                continue;
            };
            let Some(a_end) = a.end else {
                // Killed by baton for a lost lock: when it died is not recorded.
                unended += 1;
                continue;
            };
            if a_end > b_start {
                report.find(
                    "command-in-lock",
                    *key,
                    format!(
                        "COMMAND of fence {} ran until +{:.3}s{}, after COMMAND of fence {} started at +{:.3}s",
                        a.fence,
                        secs(a_end, losses.start),
                        if a.killed.is_some() { " (its supervisor was killed)" } else { "" },
                        b.fence,
                        secs(b_start, losses.start)
                    ),
                    losses.explain(a_start, b_start),
                );
            }
        }
    }
    let killed: Vec<&Run> = runs.values().filter(|r| r.killed.is_some()).collect();
    for run in &killed {
        let (Some(killed), Some(end)) = (run.killed, run.end) else {
            continue;
        };
        let outlived = end.saturating_since(killed);
        if outlived > DEATH_DEADLINE {
            report.find(
                "supervisor-death",
                &run.key,
                format!(
                    "COMMAND of fence {} still ran {:.3}s after its supervisor was killed",
                    run.fence,
                    outlived.as_secs_f64()
                ),
                None,
            );
        }
    }
    let started = runs.values().filter(|r| r.start.is_some()).count();
    report.checked(
        "command-in-lock",
        format!("{started} supervised COMMANDs ({unended} ended by a lost lock, unchecked)"),
    );
    report.checked(
        "supervisor-death",
        format!("{} supervisors killed", killed.len()),
    );
    report.stat("supervised COMMANDs", started as u64);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(ms: u64) -> MonoTime {
        MonoTime::from_nanos(ms * 1_000_000)
    }

    fn checked(lines: &[Line]) -> CheckReport {
        let dir = tempfile::tempdir().unwrap();
        for line in lines {
            append(&journal(dir.path()), line).unwrap();
        }
        let mut report = CheckReport::default();
        check(dir.path(), &Losses::none(t(0)), &mut report);
        report
    }

    fn start(fence: u64, pid: u32, at: u64) -> Line {
        Line::Start {
            key: KEY.to_owned(),
            fence,
            pid,
            t: t(at),
        }
    }

    /// The COMMAND of `pid` ended at `at` ms, its supervisor having been killed at `killed`.
    fn gone(pid: u32, killed: u64, at: u64) -> Line {
        Line::Gone {
            pid,
            killed: t(killed),
            t: t(at),
        }
    }

    #[test]
    fn turns_in_fence_order_pass() {
        let report = checked(&[
            start(1, 10, 100),
            Line::End { pid: 10, t: t(200) },
            start(2, 11, 210),
            gone(11, 300, 302),
            start(3, 12, 1_400),
        ]);
        assert_eq!(report.violations(), 0, "{:?}", report.findings);
    }

    #[test]
    fn a_command_outliving_its_lock_is_a_violation() {
        let report = checked(&[start(1, 10, 100), gone(10, 150, 5_000), start(2, 11, 1_200)]);
        let checkers: Vec<&str> = report.findings.iter().map(|f| f.checker).collect();
        assert_eq!(checkers, ["command-in-lock", "supervisor-death"]);
        assert_eq!(report.violations(), 2);
    }
}
