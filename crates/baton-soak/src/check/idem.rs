//! Idempotency: every acknowledged effect exactly once, and the record rules behind it.
//!
//! An attempt's completion is *acknowledged* when its `finalize(Completed)` answered with
//! the record completed by that attempt. The contract (`docs/idempotency.md`) is
//! exactly-once for acknowledged effects, with one documented exception: an attempt whose
//! owner's lease lapsed before it finalized (paused, killed, cut off) is taken over, and the
//! effect runs again — the effects of taken-over attempts are counted as documented
//! re-executions, not violations. The checkers here verify that the store keeps its side of
//! that bargain.

use std::collections::BTreeMap;

use baton_testkit::MonoTime;
use baton_testkit::check::exactly_once;

use super::{Audit, CLOCK_TOLERANCE, CheckReport, Losses};
use crate::journal::{Op, Operation, Phase};
use crate::workload::IDEM_LEASE;

/// A process and contender.
type Who = (u32, u32);

#[derive(Debug, Clone)]
struct Acquire {
    who: Who,
    invoked: MonoTime,
    completed: Option<MonoTime>,
    phase: Phase,
    attempt: Option<u32>,
    takeover: Option<bool>,
}

impl Acquire {
    fn acquired(&self) -> Option<(u32, MonoTime)> {
        match (self.phase, self.attempt, self.completed) {
            (Phase::Ok, Some(n), Some(done)) => Some((n, done)),
            _ => None,
        }
    }
}

#[derive(Debug, Clone)]
struct Finalize {
    who: Who,
    attempt: u32,
    invoked: MonoTime,
    completed: Option<MonoTime>,
    phase: Phase,
    result_attempt: Option<u32>,
    result_status: Option<String>,
}

impl Finalize {
    /// Whether this finalize acknowledged its own attempt's completion.
    fn acknowledged(&self) -> bool {
        self.phase == Phase::Ok
            && self.result_attempt == Some(self.attempt)
            && self.result_status.as_deref() == Some("completed")
    }
}

#[derive(Debug, Clone, Default)]
struct Scope {
    acquires: Vec<Acquire>,
    finalizes: Vec<Finalize>,
    effects: Vec<(Who, u32, MonoTime)>,
}

impl Scope {
    /// For each effect, whether a newer attempt than the effect's was acquired (took the
    /// scope over).
    fn effects_taken_over(&self) -> impl Iterator<Item = bool> + '_ {
        let newest = self
            .acquires
            .iter()
            .filter_map(|a| a.acquired().map(|(n, _)| n))
            .max();
        self.effects
            .iter()
            .map(move |&(_, attempt, _)| newest.is_some_and(|m| m > attempt))
    }
}

fn gather(operations: &[Operation<'_>]) -> BTreeMap<String, Scope> {
    let mut scopes: BTreeMap<String, Scope> = BTreeMap::new();
    for op in operations {
        let event = op.any();
        let who = (event.process, event.contender);
        let scope = || event.key.clone();
        match event.op {
            Op::IdemAcquire => {
                let done = op.done.map(|d| &d.detail);
                scopes.entry(scope()).or_default().acquires.push(Acquire {
                    who,
                    invoked: op.invoked(),
                    completed: op.completed(),
                    phase: op.phase(),
                    attempt: done.and_then(|d| d.attempt),
                    takeover: done.and_then(|d| d.takeover),
                });
            }
            Op::IdemFinalize => {
                let Some(attempt) = op.invoke.and_then(|i| i.detail.attempt) else {
                    continue;
                };
                let done = op.done.map(|d| &d.detail);
                scopes.entry(scope()).or_default().finalizes.push(Finalize {
                    who,
                    attempt,
                    invoked: op.invoked(),
                    completed: op.completed(),
                    phase: op.phase(),
                    result_attempt: done.and_then(|d| d.attempt),
                    result_status: done.and_then(|d| d.outcome.clone()),
                });
            }
            Op::IdemEffect => {
                if let Some(attempt) = event.detail.attempt {
                    scopes
                        .entry(scope())
                        .or_default()
                        .effects
                        .push((who, attempt, event.at));
                }
            }
            _ => {}
        }
    }
    scopes
}

/// The scopes whose completion a worker saw acknowledged: what the final audit reads back.
pub fn acknowledged(operations: &[Operation<'_>]) -> Vec<String> {
    gather(operations)
        .into_iter()
        .filter(|(_, s)| s.finalizes.iter().any(Finalize::acknowledged))
        .map(|(key, _)| key)
        .collect()
}

/// Runs the idempotency checkers; `audit` is what the store held at the end for the scopes
/// whose completion was acknowledged.
pub fn check(
    operations: &[Operation<'_>],
    losses: &Losses,
    audit: &Audit,
    report: &mut CheckReport,
) {
    let scopes = gather(operations);
    let far = MonoTime::from_nanos(u64::MAX);

    let attempts: usize = scopes.values().map(|s| s.acquires.len()).sum();
    let acquired: usize = scopes
        .values()
        .map(|s| s.acquires.iter().filter(|a| a.acquired().is_some()).count())
        .sum();
    let takeovers: usize = scopes
        .values()
        .map(|s| {
            s.acquires
                .iter()
                .filter(|a| a.acquired().is_some() && a.takeover == Some(true))
                .count()
        })
        .sum();
    let finalizes: usize = scopes.values().map(|s| s.finalizes.len()).sum();
    let acked: BTreeMap<&str, &Finalize> = scopes
        .iter()
        .filter_map(|(k, s)| {
            s.finalizes
                .iter()
                .find(|f| f.acknowledged())
                .map(|f| (k.as_str(), f))
        })
        .collect();
    report.stat("idem attempts acquired", acquired as u64);
    report.stat("idem takeovers of a lapsed attempt", takeovers as u64);
    report.stat("idem completions acknowledged", acked.len() as u64);

    report.checked(
        "idem-attempts",
        format!("{attempts} acquires on {} ids", scopes.len()),
    );
    report.checked("idem-takeover", format!("{takeovers} takeovers"));
    report.checked("idem-finalize", format!("{finalizes} finalizes"));
    report.checked(
        "idem-effects-once",
        format!("{} acknowledged effects", acked.len()),
    );
    report.checked(
        "idem-final-state",
        format!("{} records read back", acked.len()),
    );

    let mut reexecuted = 0u64;
    for (key, scope) in &scopes {
        // idem-attempts: numbers are never reused and grow in real time.
        for y in &scope.acquires {
            let Some((n, y_done)) = y.acquired() else {
                continue;
            };
            if y.takeover == Some(false) && n != 1 {
                report.find(
                    "idem-attempts",
                    key,
                    format!(
                        "a new record was created as attempt {n}, not 1 (by p{}/c{})",
                        y.who.0, y.who.1
                    ),
                    None,
                );
            }
            let earlier = scope.acquires.iter().find(|x| {
                !std::ptr::eq(*x, y)
                    && matches!((x.phase, x.attempt, x.completed), (Phase::Ok | Phase::Fail, Some(m), Some(done)) if done < y.invoked && m >= n)
            });
            if let Some(x) = earlier {
                report.find(
                    "idem-attempts",
                    key,
                    format!(
                        "p{}/c{} acquired attempt {n} after p{}/c{} had seen attempt {} (completed +{:.3}s, invoked +{:.3}s)",
                        y.who.0,
                        y.who.1,
                        x.who.0,
                        x.who.1,
                        x.attempt.unwrap_or_default(),
                        super::secs(x.completed.unwrap_or(x.invoked), losses.start),
                        super::secs(y.invoked, losses.start),
                    ),
                    losses.explain(x.invoked, y_done),
                );
            } else if let Some(x) = scope.acquires.iter().find(|x| {
                !std::ptr::eq(*x, y)
                    && x.acquired().is_some_and(|(m, _)| m == n)
                    && x.invoked < y.invoked
            }) {
                report.find(
                    "idem-attempts",
                    key,
                    format!(
                        "attempt {n} was handed to p{}/c{} and to p{}/c{}",
                        x.who.0, x.who.1, y.who.0, y.who.1
                    ),
                    losses.explain(x.invoked, y_done),
                );
            }
        }

        // idem-takeover: only after the owner's lease lapsed; never after a completion.
        for y in &scope.acquires {
            let Some((n, y_done)) = y.acquired() else {
                continue;
            };
            // The attempt taken over: the latest n - 1 invoked before this one completed
            // (after a Redis data loss an attempt number comes round again).
            let prev = scope
                .acquires
                .iter()
                .filter(|p| p.acquired().is_some_and(|(m, _)| m + 1 == n) && p.invoked < y_done)
                .max_by_key(|p| p.invoked);
            if y.takeover == Some(true)
                && let Some(prev) = prev
                && y_done + CLOCK_TOLERANCE < prev.invoked + IDEM_LEASE
            {
                report.find(
                    "idem-takeover",
                    key,
                    format!(
                        "attempt {n} (p{}/c{}) took over attempt {} within its lease: acquired by +{:.3}s, the lease ran at least until +{:.3}s",
                        y.who.0,
                        y.who.1,
                        n - 1,
                        super::secs(y_done, losses.start),
                        super::secs(prev.invoked + IDEM_LEASE, losses.start),
                    ),
                    losses.explain(prev.invoked, y_done),
                );
            }
            if let Some(fin) = scope
                .finalizes
                .iter()
                .find(|f| f.acknowledged() && f.completed.is_some_and(|c| c < y.invoked))
            {
                report.find(
                    "idem-takeover",
                    key,
                    format!(
                        "attempt {n} (p{}/c{}) acquired after attempt {}'s completion was acknowledged",
                        y.who.0, y.who.1, fin.attempt
                    ),
                    losses.explain(fin.invoked, y_done),
                );
            }
        }

        // idem-finalize: one completion; a finalize answers its own attempt; no zombie.
        let acks: Vec<&Finalize> = scope
            .finalizes
            .iter()
            .filter(|f| f.acknowledged())
            .collect();
        if acks.len() > 1 {
            let times: Vec<MonoTime> = acks.iter().map(|f| f.invoked).collect();
            let who: Vec<String> = acks
                .iter()
                .map(|f| format!("attempt {} by p{}/c{}", f.attempt, f.who.0, f.who.1))
                .collect();
            report.find(
                "idem-finalize",
                key,
                format!(
                    "{} completions were acknowledged: {}",
                    acks.len(),
                    who.join(", ")
                ),
                losses.explain(
                    times.iter().copied().min().unwrap_or(far),
                    times.iter().copied().max().unwrap_or(far),
                ),
            );
        }
        for f in &scope.finalizes {
            if f.phase == Phase::Ok && f.result_attempt != Some(f.attempt) {
                report.find(
                    "idem-finalize",
                    key,
                    format!(
                        "finalize of attempt {} (p{}/c{}) answered the record of attempt {:?}",
                        f.attempt, f.who.0, f.who.1, f.result_attempt
                    ),
                    None,
                );
            }
            if f.acknowledged()
                && let Some(newer) = scope.acquires.iter().find(|y| {
                    y.acquired()
                        .is_some_and(|(m, done)| m > f.attempt && done < f.invoked)
                })
            {
                report.find(
                    "idem-finalize",
                    key,
                    format!(
                        "attempt {} (p{}/c{}) finalized after attempt {} had taken it over",
                        f.attempt,
                        f.who.0,
                        f.who.1,
                        newer.attempt.unwrap_or_default()
                    ),
                    losses.explain(newer.invoked, f.completed.unwrap_or(far)),
                );
            }
        }

        // idem-effects-once, observed side: effects of attempts nobody took over.
        reexecuted += scope
            .effects_taken_over()
            .filter(|&taken_over| taken_over)
            .count() as u64;
    }
    report.stat(
        "idem effects of taken-over attempts (documented at-least-once)",
        reexecuted,
    );

    // idem-effects-once: every acknowledged completion's effect exactly once.
    let mut observed: Vec<String> = Vec::new();
    for key in acked.keys() {
        for taken_over in scopes[*key].effects_taken_over() {
            if !taken_over {
                observed.push((*key).to_owned());
            }
        }
    }
    for v in exactly_once(acked.keys().map(|k| (*k).to_owned()), observed) {
        let scope = &scopes[&v.key];
        let effects = &scope.effects;
        // The records behind the effects were made by their attempts' acquires: a loss
        // between the first acquire and the last explains a repeat.
        let acquires: Vec<&Acquire> = scope
            .acquires
            .iter()
            .filter(|a| {
                a.acquired().is_some_and(|(n, _)| {
                    effects.iter().any(|(who, m, _)| *who == a.who && *m == n)
                })
            })
            .collect();
        let first = acquires.iter().map(|a| a.invoked).min().unwrap_or(far);
        let last = acquires
            .iter()
            .filter_map(|a| a.completed)
            .max()
            .unwrap_or(far);
        let detail = format!(
            "{:?}: {}; effects by (process, contender, attempt): {:?}",
            v.rule,
            v.detail,
            effects
                .iter()
                .map(|(w, a, _)| (w.0, w.1, *a))
                .collect::<Vec<_>>()
        );
        report.find(
            "idem-effects-once",
            &v.key,
            detail,
            losses.explain(first, last),
        );
    }

    // idem-final-state: the acknowledged completion is what the store holds at the end.
    for (key, fin) in &acked {
        let found = audit.get(*key).cloned().flatten();
        if found
            .as_ref()
            .is_some_and(|(status, n)| status == "completed" && *n == fin.attempt)
        {
            continue;
        }
        report.find(
            "idem-final-state",
            *key,
            format!(
                "attempt {}'s completion was acknowledged, but at the end the store held {found:?}",
                fin.attempt
            ),
            losses.explain(fin.invoked, far),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::DataLoss;
    use crate::check::tests::{assert_violations, report_of, row, t};
    use crate::journal::{Detail, Event};

    #[derive(Default, Clone)]
    struct Script {
        events: Vec<Event>,
    }

    impl Script {
        fn push(&mut self, p: u32, id: u64, at: u64, op: Op, phase: Phase, detail: Detail) {
            let seq = self.events.len() as u64;
            self.events.push(Event {
                process: p,
                worker: 0,
                contender: 0,
                seq,
                id,
                at: t(at),
                op,
                phase,
                key: "req-1".into(),
                detail,
            });
        }

        /// Process `p` acquires attempt `n` over [at, at+1], does the effect, and (when
        /// `fin`) finalizes it as completed over [at+2, at+3].
        fn attempt(&mut self, p: u32, at: u64, n: u32, takeover: bool, fin: bool) {
            let id = self.events.len() as u64 * 10;
            self.push(p, id, at, Op::IdemAcquire, Phase::Invoke, Detail::default());
            self.push(
                p,
                id,
                at + 1,
                Op::IdemAcquire,
                Phase::Ok,
                Detail {
                    attempt: Some(n),
                    takeover: Some(takeover),
                    ..Detail::default()
                },
            );
            let with = Detail {
                attempt: Some(n),
                ..Detail::default()
            };
            self.push(p, id + 1, at + 1, Op::IdemEffect, Phase::Ok, with.clone());
            if fin {
                self.push(p, id + 2, at + 2, Op::IdemFinalize, Phase::Invoke, with);
                self.push(
                    p,
                    id + 2,
                    at + 3,
                    Op::IdemFinalize,
                    Phase::Ok,
                    Detail {
                        attempt: Some(n),
                        outcome: Some("completed".into()),
                        ..Detail::default()
                    },
                );
            }
        }

        fn check(self, losses: &Losses, audit: &Audit) -> CheckReport {
            report_of(self.events, |operations, report| {
                check(operations, losses, audit, report)
            })
        }
    }

    fn completed(n: u32) -> Audit {
        [("req-1".to_owned(), Some(("completed".to_owned(), n)))].into()
    }

    /// The report on p1 acquiring attempt 1 at 0 and dying before finalizing, and p2
    /// taking over at `at` ms and completing.
    fn taken_over_at(at: u64) -> CheckReport {
        let mut s = Script::default();
        s.attempt(1, 0, 1, false, false);
        s.attempt(2, at, 2, true, true);
        s.check(&Losses::none(t(0)), &completed(2))
    }

    #[test]
    fn one_completed_attempt_and_a_late_takeover_of_a_crashed_one_are_clean() {
        // After the lease.
        let report = taken_over_at(1_500);
        assert_eq!(report.violations(), 0, "{:?}", report.findings);
        assert_eq!(
            report.stats["idem effects of taken-over attempts (documented at-least-once)"],
            1
        );
        assert_eq!(
            row(&report, "idem-effects-once").checked,
            "1 acknowledged effects"
        );
    }

    #[test]
    fn a_takeover_within_the_owners_lease_is_a_violation() {
        let report = taken_over_at(500);
        assert_violations(&report, "idem-takeover", 1);
        assert_eq!(report.violations(), 1, "{:?}", report.findings);
    }

    #[test]
    fn a_second_fresh_attempt_after_a_completion_is_a_violation_unless_redis_lost_it() {
        let mut s = Script::default();
        s.attempt(1, 0, 1, false, true);
        s.attempt(2, 100, 1, false, true);
        let report = s.clone().check(&Losses::none(t(0)), &completed(1));
        for checker in ["idem-attempts", "idem-effects-once", "idem-finalize"] {
            assert!(
                row(&report, checker).violations >= 1,
                "{checker}: {:?}",
                report.findings
            );
        }

        let losses = Losses {
            losses: vec![DataLoss {
                from: t(50),
                to: t(55),
                back: t(60),
                cause: Default::default(),
                spared: Vec::new(),
            }],
            start: t(0),
        };
        let report = s.check(&losses, &completed(1));
        assert_eq!(report.violations(), 0, "{:?}", report.findings);
        assert_eq!(report.documented(), 4, "{:?}", report.findings);
    }

    #[test]
    fn a_lost_completion_is_found_at_the_end() {
        let mut s = Script::default();
        s.attempt(1, 0, 1, false, true);
        let report = s.check(&Losses::none(t(0)), &[("req-1".to_owned(), None)].into());
        assert_violations(&report, "idem-final-state", 1);
    }
}
