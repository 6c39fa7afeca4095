//! [`RwLockWorkload`]: contenders that read and write one reader-writer lock, one per OS
//! process, recorded for the [reader-writer checkers](crate::check::writers_alone).

use std::time::Duration;

use baton_core::{LockOptions, RwLock};

use crate::check::{self, Mode, rw_key};
use crate::history::{History, OpKind, Outcome, Recorder};
use crate::time::MonoTime;
use crate::workload::{run_child, run_rounds};

/// How often each contender reads and writes, and for how long.
#[derive(Debug, Clone, Copy)]
#[must_use = "a workload does nothing until run"]
pub struct RwLockWorkload {
    rounds: u32,
    write_every: u32,
    read_hold: Duration,
    write_hold: Duration,
}

impl Default for RwLockWorkload {
    fn default() -> Self {
        RwLockWorkload::new()
    }
}

impl RwLockWorkload {
    /// 12 rounds per contender, one in three a write (staggered across contenders); reads
    /// hold 20 ms, writes 3 ms.
    pub fn new() -> Self {
        RwLockWorkload {
            rounds: 12,
            write_every: 3,
            read_hold: Duration::from_millis(20),
            write_hold: Duration::from_millis(3),
        }
    }

    /// Rounds per contender.
    pub fn rounds(self, rounds: u32) -> Self {
        RwLockWorkload { rounds, ..self }
    }

    /// How long each read holds (20 ms by default). A store whose hand-over of the gate
    /// between processes takes longer than a read needs longer reads for readers of
    /// different processes to overlap, which the run checks happened.
    pub fn read_hold(self, read_hold: Duration) -> Self {
        RwLockWorkload { read_hold, ..self }
    }

    fn writes(&self, contender: u32, round: u32) -> bool {
        (round + contender).is_multiple_of(self.write_every)
    }

    /// The parent side: runs `child_test` (which calls [`run_as_child`](Self::run_as_child))
    /// in `processes` processes and checks the merged history: well formed, every round
    /// granted, no writer overlapping any reader or writer, every writer's fence above every
    /// earlier grant's, no fence given twice, and readers sharing at some moment.
    ///
    /// # Panics
    /// When a child fails, or a rule is broken.
    pub fn run_in_processes(
        self,
        child_test: &str,
        processes: u32,
        dir: &std::path::Path,
        env: &[(&str, &str)],
    ) -> History {
        let history = run_rounds(child_test, processes, self.rounds, dir, env);
        let grants = history.grants();
        let writes = (0..processes)
            .flat_map(|p| (0..self.rounds).map(move |r| (p, r)))
            .filter(|&(p, r)| self.writes(p, r))
            .count();
        assert_eq!(
            grants.iter().filter(|g| g.key.ends_with("@write")).count(),
            writes,
            "every write round wrote"
        );
        check::assert_clean(&check::writers_alone(&history));
        check::assert_clean(&check::writer_fences_above_earlier(&history));
        // Reads and writes share one fence counter: no fence twice across both modes.
        let mut fences: Vec<u64> = grants.iter().map(|g| g.fence).collect();
        fences.sort_unstable();
        let before = fences.len();
        fences.dedup();
        assert_eq!(fences.len(), before, "a fence given twice");
        let reads: Vec<_> = grants.iter().filter(|g| g.key.ends_with("@read")).collect();
        let shared = reads.iter().enumerate().any(|(i, a)| {
            reads[i + 1..]
                .iter()
                .any(|b| a.acquired < b.believed_until() && b.acquired < a.believed_until())
        });
        assert!(
            shared,
            "readers never shared: the run did not exercise reads"
        );
        history
    }

    /// The child side of [`run_in_processes`](Self::run_in_processes): opens the lock with
    /// `open`, waits for the parent's go, reads or writes `rounds` times (waiting up to a
    /// minute for each), and writes its history. Returns at once when this process is not
    /// such a child (an ordinary run of the ignored test).
    ///
    /// # Panics
    /// When an acquire failed, or the parent's files cannot be read or written.
    pub fn run_as_child<F, Fut>(self, open: F)
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = RwLock>,
    {
        run_child(open, async |lock, recorder, index| {
            let options = LockOptions::new(Duration::from_secs(10))
                .wait(Duration::from_secs(60))
                .keep_alive(Duration::from_secs(3));
            for round in 0..self.rounds {
                let requested = MonoTime::now();
                if self.writes(index, round) {
                    let guard = lock.write(&options).await.expect("a write in time");
                    let key = rw_key(lock.key(), Mode::Write);
                    acquired(
                        recorder,
                        index,
                        &key,
                        guard.fence().get(),
                        requested,
                        guard.valid_until(),
                    );
                    // Blocking, as work is: the runtime's other workers keep the grant alive.
                    std::thread::sleep(self.write_hold);
                    let (fence, sent) = (guard.fence().get(), MonoTime::now());
                    let outcome = guard.release().await;
                    released(recorder, index, &key, fence, sent, Outcome::from(&outcome));
                } else {
                    let guard = lock.read(&options).await.expect("a read in time");
                    let key = rw_key(lock.key(), Mode::Read);
                    acquired(
                        recorder,
                        index,
                        &key,
                        guard.fence().get(),
                        requested,
                        guard.valid_until(),
                    );
                    std::thread::sleep(self.read_hold);
                    let (fence, sent) = (guard.fence().get(), MonoTime::now());
                    let outcome = guard.release().await;
                    released(recorder, index, &key, fence, sent, Outcome::from(&outcome));
                }
            }
        });
    }
}

fn acquired(
    recorder: &Recorder,
    contender: u32,
    key: &str,
    fence: u64,
    requested: MonoTime,
    valid_until: tokio::time::Instant,
) {
    recorder.record(
        contender,
        key,
        MonoTime::now(),
        OpKind::Acquired {
            fence,
            requested,
            valid_until: MonoTime::from_instant(valid_until.into_std()),
        },
    );
}

fn released(
    recorder: &Recorder,
    contender: u32,
    key: &str,
    fence: u64,
    sent: MonoTime,
    outcome: Outcome,
) {
    let answered = Some(MonoTime::now());
    recorder.record(
        contender,
        key,
        sent,
        OpKind::Released {
            fence,
            outcome,
            answered,
        },
    );
}
