//! Locks and leases: the journal turned into a testkit [`History`], checked by the testkit's
//! checkers, plus the lost-update check on the fenced registers.
//!
//! A grant's believed window runs from the moment its acquire (or claim) returned to the
//! earlier of the moment its release was sent and its last known `valid_until`. Keep-alive
//! (locks) and renewals (leases) move `valid_until` forward while the grant is held, so the
//! window uses the largest `valid_until` the holder recorded for it: at the acquire, at each
//! renewal, at each write, and just before the release. Each of those is measured from
//! before the request that granted or renewed it was sent, so the window never outlasts
//! the store's own expiry; a holder killed between records only shortens it.

use std::collections::{BTreeMap, HashMap};

use baton_testkit::check::{self, Rule};
use baton_testkit::{Grant, History, MonoTime, OpKind, Outcome, Recorder};

use super::{CheckReport, Losses};
use crate::journal::{Op, Operation, Phase};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Acquire,
    Renew,
    Write,
    Release,
}

fn role(op: Op) -> Option<(&'static str, Role)> {
    Some(match op {
        Op::LockAcquire => ("lock", Role::Acquire),
        Op::LockWrite => ("lock", Role::Write),
        Op::LockRelease => ("lock", Role::Release),
        Op::LeaseClaim => ("lease", Role::Acquire),
        Op::LeaseRenew => ("lease", Role::Renew),
        Op::LeaseWrite => ("lease", Role::Write),
        Op::LeaseRelease => ("lease", Role::Release),
        _ => return None,
    })
}

/// The key of a grant: process, contender, history key (`lock:<key>`), fence.
type GrantId = (u32, u32, String, u64);

/// One fenced write that completed.
#[derive(Debug, Clone)]
struct WriteInfo {
    grant: GrantId,
    register: String,
    value: u64,
    accepted: bool,
    invoked: MonoTime,
    done: MonoTime,
}

/// The journal's lock and lease operations as a testkit history, with the writes that
/// completed and the (register, fence) of writes that never did.
struct Converted {
    history: History,
    writes: Vec<WriteInfo>,
    unfinished_writes: Vec<(String, u64)>,
    releases: usize,
}

fn convert(operations: &[Operation<'_>]) -> Converted {
    // Pass 1: the largest valid_until recorded for each grant.
    let mut until: HashMap<GrantId, MonoTime> = HashMap::new();
    for op in operations {
        let event = op.any();
        let Some((family, role)) = role(event.op) else {
            continue;
        };
        let hkey = format!("{family}:{}", event.key);
        let (fence, valid_until) = match role {
            Role::Acquire => match op.done.filter(|_| op.is_ok()) {
                Some(done) => (done.detail.fence, done.detail.valid_until),
                None => continue,
            },
            Role::Renew => match (op.invoke, op.done.filter(|_| op.is_ok())) {
                (Some(invoke), Some(done)) => (invoke.detail.fence, done.detail.valid_until),
                _ => continue,
            },
            Role::Write | Role::Release => match op.invoke {
                Some(invoke) => (invoke.detail.fence, invoke.detail.valid_until),
                None => continue,
            },
        };
        if let (Some(fence), Some(valid_until)) = (fence, valid_until) {
            let slot = until
                .entry((event.process, event.contender, hkey, fence))
                .or_insert(valid_until);
            *slot = (*slot).max(valid_until);
        }
    }

    // Pass 2: the testkit ops, in each process's program order.
    let mut recorders: BTreeMap<u32, Recorder> = BTreeMap::new();
    let mut writes = Vec::new();
    let mut unfinished_writes = Vec::new();
    let mut releases = 0;
    for op in operations {
        let event = op.any();
        let Some((family, role)) = role(event.op) else {
            continue;
        };
        let hkey = format!("{family}:{}", event.key);
        let recorder = recorders
            .entry(event.process)
            .or_insert_with(|| Recorder::new(event.process));
        match role {
            Role::Acquire => {
                let (Some(invoke), Some(done)) = (op.invoke, op.done.filter(|_| op.is_ok())) else {
                    continue;
                };
                let Some(fence) = done.detail.fence else {
                    continue;
                };
                let id = (event.process, event.contender, hkey.clone(), fence);
                let valid_until = until.get(&id).copied().unwrap_or(done.at);
                recorder.record(
                    event.contender,
                    &hkey,
                    done.at,
                    OpKind::Acquired {
                        fence,
                        requested: invoke.at,
                        valid_until,
                    },
                );
            }
            Role::Renew => {}
            Role::Write => {
                let Some(invoke) = op.invoke else { continue };
                let fence = invoke.detail.fence.unwrap_or_default();
                match op.done.filter(|_| op.is_ok()) {
                    Some(done) => {
                        let value = invoke.detail.value.unwrap_or_default();
                        let accepted = done.detail.accepted.unwrap_or_default();
                        recorder.record(
                            event.contender,
                            &hkey,
                            invoke.at,
                            OpKind::Write {
                                register: hkey.clone(),
                                fence,
                                order: done.detail.order.unwrap_or_default(),
                                value,
                                accepted,
                            },
                        );
                        writes.push(WriteInfo {
                            grant: (event.process, event.contender, hkey.clone(), fence),
                            register: hkey.clone(),
                            value,
                            accepted,
                            invoked: invoke.at,
                            done: done.at,
                        });
                    }
                    None => unfinished_writes.push((hkey.clone(), fence)),
                }
            }
            Role::Release => {
                let Some(invoke) = op.invoke else { continue };
                let Some(fence) = invoke.detail.fence else {
                    continue;
                };
                let outcome = match (
                    op.phase(),
                    op.done.and_then(|d| d.detail.outcome.as_deref()),
                ) {
                    (Phase::Ok, Some("released" | "removed")) => Outcome::Released,
                    (Phase::Ok, Some(_)) => Outcome::Expired,
                    _ => Outcome::Faulted,
                };
                releases += 1;
                recorder.record(
                    event.contender,
                    &hkey,
                    invoke.at,
                    OpKind::Released { fence, outcome },
                );
            }
        }
    }
    Converted {
        history: History::merge(recorders.into_values().map(|r| r.history())),
        writes,
        unfinished_writes,
        releases,
    }
}

/// The (acquired, requested) times of the grants an overlap violation names, earliest
/// acquired first.
fn acquired_times(ops: &[baton_testkit::Op]) -> Vec<(MonoTime, MonoTime)> {
    let mut times: Vec<(MonoTime, MonoTime)> = ops
        .iter()
        .filter_map(|op| match op.kind {
            OpKind::Acquired { requested, .. } => Some((op.at, requested)),
            _ => None,
        })
        .collect();
    times.sort();
    times
}

/// Runs the lock and lease checkers.
pub fn check(operations: &[Operation<'_>], losses: &Losses, report: &mut CheckReport) {
    let converted = convert(operations);
    let history = &converted.history;
    let grants = history.grants();
    let keys: std::collections::BTreeSet<&str> = grants.iter().map(|g| g.key.as_str()).collect();
    let on_keys = format!("{} grants on {} keys", grants.len(), keys.len());
    for family in ["lock", "lease"] {
        let n = grants
            .iter()
            .filter(|g| g.key.starts_with(&format!("{family}:")))
            .count();
        report.stat(&format!("{family} grants"), n as u64);
    }

    report.checked("well-formed", format!("{} releases", converted.releases));
    for v in check::well_formed(history) {
        report.violation("well-formed", &v, None);
    }

    report.checked("no-overlap", on_keys.clone());
    for v in check::no_overlap(history) {
        let times = acquired_times(&v.ops);
        let documented = match (times.first(), times.last()) {
            (Some(&(_, earlier_requested)), Some(&(later_acquired, _))) => {
                losses.explain(earlier_requested, later_acquired)
            }
            _ => None,
        };
        report.violation("no-overlap", &v, documented);
    }

    report.checked("fences-increase", on_keys);
    for v in check::fences_increase(history) {
        report.violation("fences-increase", &v, None);
    }

    let rejected = converted.writes.iter().filter(|w| !w.accepted).count();
    report.stat("stale writes rejected by a register", rejected as u64);
    report.checked(
        "stale-fence",
        format!(
            "{} fenced writes, {rejected} rejected as stale",
            converted.writes.len()
        ),
    );
    for v in check::stale_fences(history) {
        let documented = match (v.rule, v.ops.first().map(|op| &op.kind)) {
            (Rule::CurrentFenceRejected, Some(OpKind::Write { fence, .. })) => converted
                .unfinished_writes
                .iter()
                .find(|(register, f)| *register == v.key && f >= fence)
                .map(|(_, f)| {
                    format!("a writer killed before it journaled its write of fence {f} came first")
                }),
            _ => None,
        };
        report.violation("stale-fence", &v, documented);
    }

    lost_updates(&converted.writes, &grants, losses, report);
}

/// Two accepted writes of one counter value, each sent after its grant's acquire returned
/// and completed before its believed window ended: both holders read the counter inside
/// their windows, so their windows overlapped (or the register lost a write).
fn lost_updates(writes: &[WriteInfo], grants: &[Grant], losses: &Losses, report: &mut CheckReport) {
    let mut by_grant: HashMap<GrantId, Vec<&Grant>> = HashMap::new();
    for g in grants {
        by_grant
            .entry((g.process, g.contender, g.key.clone(), g.fence))
            .or_default()
            .push(g);
    }
    let window_of = |w: &WriteInfo| -> Option<&Grant> {
        by_grant
            .get(&w.grant)?
            .iter()
            .rev()
            .find(|g| g.acquired <= w.invoked)
            .copied()
    };
    let inside = |w: &WriteInfo| -> Option<&Grant> {
        window_of(w).filter(|g| g.acquired <= w.invoked && w.done <= g.believed_until())
    };
    let accepted: Vec<&WriteInfo> = writes.iter().filter(|w| w.accepted).collect();
    report.checked("lost-update", format!("{} accepted writes", accepted.len()));
    let mut by_value: BTreeMap<(&str, u64), Vec<&WriteInfo>> = BTreeMap::new();
    for w in &accepted {
        by_value.entry((&w.register, w.value)).or_default().push(w);
    }
    for ((register, value), mut same) in by_value {
        if same.len() < 2 {
            continue;
        }
        same.sort_by_key(|w| w.invoked);
        for (i, a) in same.iter().enumerate() {
            for b in &same[i + 1..] {
                let (Some(ga), Some(gb)) = (inside(a), inside(b)) else {
                    continue;
                };
                let documented =
                    losses.explain(ga.requested.min(gb.requested), ga.acquired.max(gb.acquired));
                report.find(
                    "lost-update",
                    register,
                    format!(
                        "value {value} written twice by holders inside their windows: {ga}; and {gb}"
                    ),
                    documented,
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::journal::{Detail, Event, Events};

    fn t(ms: u64) -> MonoTime {
        MonoTime::from_nanos(1_000_000_000 + ms * 1_000_000)
    }

    /// Builds journals by hand: (process, contender, op, phase, at ms, key, detail).
    struct Script {
        events: Vec<Event>,
        next: u64,
        order: u64,
    }

    impl Script {
        fn new() -> Self {
            Script {
                events: Vec::new(),
                next: 0,
                order: 0,
            }
        }

        fn op(
            &mut self,
            process: u32,
            contender: u32,
            op: Op,
            key: &str,
            invoke: (u64, Detail),
            done: Option<(u64, Phase, Detail)>,
        ) {
            let id = self.next;
            self.next += 1;
            let mut push = |at, phase, detail| {
                let seq = self.events.len() as u64;
                self.events.push(Event {
                    process,
                    worker: 0,
                    contender,
                    seq,
                    id,
                    at: t(at),
                    op,
                    phase,
                    key: key.into(),
                    detail,
                });
            };
            push(invoke.0, Phase::Invoke, invoke.1);
            if let Some((at, phase, detail)) = done {
                push(at, phase, detail);
            }
        }

        /// A lock held by (process, contender) over [from, to) with fence, valid until
        /// `until`, writing `value` (accepted) in between.
        #[allow(clippy::too_many_arguments)]
        fn held(&mut self, p: u32, c: u32, fence: u64, from: u64, to: u64, until: u64, value: u64) {
            self.op(
                p,
                c,
                Op::LockAcquire,
                "k",
                (from.saturating_sub(1), Detail::default()),
                Some((
                    from,
                    Phase::Ok,
                    Detail {
                        fence: Some(fence),
                        valid_until: Some(t(until)),
                        ..Detail::default()
                    },
                )),
            );
            self.order += 1;
            let order = self.order;
            self.op(
                p,
                c,
                Op::LockWrite,
                "k",
                (
                    from + 1,
                    Detail {
                        fence: Some(fence),
                        value: Some(value),
                        valid_until: Some(t(until)),
                        ..Detail::default()
                    },
                ),
                Some((
                    from + 2,
                    Phase::Ok,
                    Detail {
                        accepted: Some(true),
                        order: Some(order),
                        ..Detail::default()
                    },
                )),
            );
            self.op(
                p,
                c,
                Op::LockRelease,
                "k",
                (
                    to,
                    Detail {
                        fence: Some(fence),
                        valid_until: Some(t(until)),
                        ..Detail::default()
                    },
                ),
                Some((
                    to + 1,
                    Phase::Ok,
                    Detail {
                        outcome: Some("released".into()),
                        ..Detail::default()
                    },
                )),
            );
        }

        fn check(mut self, losses: &Losses) -> CheckReport {
            self.events.sort_by_key(|e| (e.process, e.seq));
            let events = Events {
                events: self.events,
                torn_lines: 0,
            };
            let mut report = CheckReport::default();
            check(&events.operations(), losses, &mut report);
            report
        }
    }

    fn row<'a>(report: &'a CheckReport, name: &str) -> &'a super::super::CheckRow {
        &report.rows.iter().find(|(n, _)| *n == name).unwrap().1
    }

    #[test]
    fn back_to_back_holders_in_two_processes_are_clean() {
        let mut s = Script::new();
        s.held(1, 0, 10, 0, 50, 1_000, 1);
        s.held(2, 0, 11, 60, 100, 1_000, 2);
        let report = s.check(&Losses::none(t(0)));
        assert_eq!(report.violations(), 0, "{:?}", report.findings);
        assert_eq!(row(&report, "no-overlap").checked, "2 grants on 1 keys");
        assert_eq!(report.stats["lock grants"], 2);
    }

    #[test]
    fn overlapping_holders_and_their_lost_update_are_violations() {
        let mut s = Script::new();
        s.held(1, 0, 10, 0, 50, 1_000, 1);
        s.held(2, 0, 11, 20, 100, 1_000, 1);
        let report = s.check(&Losses::none(t(0)));
        assert_eq!(
            row(&report, "no-overlap").violations,
            1,
            "{:?}",
            report.findings
        );
        assert_eq!(
            row(&report, "lost-update").violations,
            1,
            "{:?}",
            report.findings
        );
        assert_eq!(report.violations(), 2);
    }

    #[test]
    fn a_window_extended_by_keep_alive_counts_to_its_last_valid_until() {
        // Acquired valid until 40, but the release (at 90) carries valid_until 200: the
        // holder believed until 90, so a grant at 60 overlaps.
        let mut s = Script::new();
        s.op(
            1,
            0,
            Op::LockAcquire,
            "k",
            (0, Detail::default()),
            Some((
                1,
                Phase::Ok,
                Detail {
                    fence: Some(1),
                    valid_until: Some(t(40)),
                    ..Detail::default()
                },
            )),
        );
        s.op(
            1,
            0,
            Op::LockRelease,
            "k",
            (
                90,
                Detail {
                    fence: Some(1),
                    valid_until: Some(t(200)),
                    ..Detail::default()
                },
            ),
            Some((91, Phase::Ok, Detail::default())),
        );
        s.held(2, 0, 2, 60, 80, 1_000, 5);
        let report = s.check(&Losses::none(t(0)));
        assert_eq!(
            row(&report, "no-overlap").violations,
            1,
            "{:?}",
            report.findings
        );
    }

    #[test]
    fn an_overlap_across_a_redis_data_loss_is_documented_not_a_violation() {
        let mut s = Script::new();
        s.held(1, 0, 10, 0, 500, 1_000, 1);
        s.held(2, 0, 99, 200, 300, 1_000, 2);
        let loss = super::super::DataLoss {
            from: t(100),
            to: t(110),
            back: t(150),
            cause: super::super::LossCause::Promotion,
        };
        let losses = Losses {
            losses: vec![loss],
            start: t(0),
        };
        let report = s.check(&losses);
        assert_eq!(report.violations(), 0, "{:?}", report.findings);
        assert_eq!(row(&report, "no-overlap").documented, 1);
        assert!(
            report.findings[0]
                .documented
                .as_ref()
                .unwrap()
                .contains("(replica promoted): killed at +0.100s")
        );
        // Fences are never excused: a lower fence after a promotion is a violation.
        let mut s = Script::new();
        s.held(1, 0, 10, 0, 50, 1_000, 1);
        s.held(2, 0, 9, 200, 300, 1_000, 2);
        let report = s.check(&losses);
        assert_eq!(
            row(&report, "fences-increase").violations,
            1,
            "{:?}",
            report.findings
        );
        // The same overlap with the loss after both grants began is a violation.
        let mut s = Script::new();
        s.held(1, 0, 10, 0, 500, 1_000, 1);
        s.held(2, 0, 99, 200, 300, 1_000, 2);
        let late = Losses {
            losses: vec![super::super::DataLoss {
                from: t(250),
                to: t(260),
                back: t(270),
                cause: Default::default(),
            }],
            start: t(0),
        };
        assert_eq!(s.check(&late).violations(), 1);
    }

    #[test]
    fn a_stale_write_accepted_and_a_lower_fence_later_are_violations() {
        let mut s = Script::new();
        s.held(1, 0, 10, 0, 50, 1_000, 1);
        s.held(2, 0, 9, 60, 100, 1_000, 2);
        let report = s.check(&Losses::none(t(0)));
        assert_eq!(
            row(&report, "fences-increase").violations,
            1,
            "{:?}",
            report.findings
        );
        // order 2 after order 1 with a lower fence, yet recorded accepted.
        assert_eq!(
            row(&report, "stale-fence").violations,
            1,
            "{:?}",
            report.findings
        );
    }
}
