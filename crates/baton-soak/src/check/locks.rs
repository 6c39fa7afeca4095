//! Locks and leases: the journal turned into a testkit [`History`], checked by the testkit's
//! checkers, plus the lost-update check on the fenced registers. The same conversion turns
//! semaphore permits, reader-writer grants and leaderships into histories for
//! [`primitives`](super::primitives); `well-formed` checks the releases of every family.
//!
//! A grant's believed window runs from the moment its acquire (or claim) returned to the
//! earlier of the moment its release was sent and its last known `valid_until`. Keep-alive
//! (locks) and renewals (leases) move `valid_until` forward while the grant is held, so the
//! window uses the largest `valid_until` the holder recorded for it: at the acquire, at each
//! renewal, at each write, and just before the release. Each of those is measured from
//! before the request that granted or renewed it was sent, so the window never outlasts
//! the store's own expiry; a holder killed between records only shortens it.

use std::collections::{BTreeMap, HashMap};

use baton_testkit::check::{self, Mode, Rule, rw_key};
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

/// The family of `op` (the history key's prefix), the reader-writer mode it takes or
/// gives back, and its role in a grant's life.
fn role(op: Op) -> Option<(&'static str, Option<Mode>, Role)> {
    let (family, role) = match op {
        Op::LockAcquire => ("lock", Role::Acquire),
        Op::LockWrite => ("lock", Role::Write),
        Op::LockRelease => ("lock", Role::Release),
        Op::LeaseClaim => ("lease", Role::Acquire),
        Op::LeaseRenew => ("lease", Role::Renew),
        Op::LeaseWrite => ("lease", Role::Write),
        Op::LeaseRelease => ("lease", Role::Release),
        Op::SemAcquire => (SEMAPHORE, Role::Acquire),
        Op::SemRelease => (SEMAPHORE, Role::Release),
        Op::ElectCampaign => (ELECTION, Role::Acquire),
        Op::ElectResign => (ELECTION, Role::Release),
        Op::RwRead => return Some((RWLOCK, Some(Mode::Read), Role::Acquire)),
        Op::RwReadRelease => return Some((RWLOCK, Some(Mode::Read), Role::Release)),
        Op::RwWrite => return Some((RWLOCK, Some(Mode::Write), Role::Acquire)),
        Op::RwWriteRelease => return Some((RWLOCK, Some(Mode::Write), Role::Release)),
        _ => return None,
    };
    Some((family, None, role))
}

/// Every family of grants.
const FAMILIES: [&str; 5] = ["lock", "lease", SEMAPHORE, RWLOCK, ELECTION];

/// The history key prefix of semaphore permits.
pub(crate) const SEMAPHORE: &str = "sem";
/// The history key prefix of reader-writer locks (then `@read` or `@write`, see
/// [`rw_key`]).
pub(super) const RWLOCK: &str = "rw";
/// The history key prefix of elections (a grant is a leadership, its fence the term).
pub(super) const ELECTION: &str = "elect";

/// The history key of `op` on `key`, and its role, when `op` belongs to one of `families`.
fn history_key(op: Op, key: &str, families: &[&str]) -> Option<(String, Role)> {
    let (family, mode, role) = role(op)?;
    if !families.contains(&family) {
        return None;
    }
    let hkey = format!("{family}:{key}");
    match mode {
        Some(mode) => Some((rw_key(&hkey, mode), role)),
        None => Some((hkey, role)),
    }
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
pub(super) struct Converted {
    pub(super) history: History,
    writes: Vec<WriteInfo>,
    unfinished_writes: Vec<(String, u64)>,
    releases: usize,
}

/// The grants of the `families` (`lock`, `lease`, [`SEMAPHORE`], [`RWLOCK`], [`ELECTION`])
/// in `operations`, as a testkit history.
pub(super) fn convert(operations: &[Operation<'_>], families: &[&str]) -> Converted {
    // Pass 1: the largest valid_until recorded for each grant.
    let mut until: HashMap<GrantId, MonoTime> = HashMap::new();
    for op in operations {
        let event = op.any();
        let Some((hkey, role)) = history_key(event.op, &event.key, families) else {
            continue;
        };
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
        let Some((hkey, role)) = history_key(event.op, &event.key, families) else {
            continue;
        };
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
                    OpKind::Released {
                        fence,
                        outcome,
                        answered: op.done.map(|d| d.at),
                    },
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

/// The documented window that explains the holders an overlap violation `v` names being
/// believed at once: a data loss between the earliest one's request and the latest one's
/// grant.
pub(super) fn overlap_explained(v: &baton_testkit::Violation, losses: &Losses) -> Option<String> {
    let times = acquired_times(&v.ops);
    match (times.first(), times.last()) {
        (Some(&(_, earlier_requested)), Some(&(later_acquired, _))) => {
            losses.explain_key(&v.key, earlier_requested, later_acquired)
        }
        _ => None,
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
    let converted = convert(operations, &["lock", "lease"]);
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

    // Every grant's release, of every family.
    let every = convert(operations, &FAMILIES);
    let releases = format!("{} releases", every.releases);
    report.testkit(
        "well-formed",
        releases,
        check::well_formed(&every.history),
        |_| None,
    );
    report.testkit(
        "no-overlap",
        on_keys.clone(),
        check::no_overlap(history),
        |v| overlap_explained(v, losses),
    );
    let fences = check::fences_increase(history);
    report.testkit("fences-increase", on_keys, fences, |_| None);

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
                let documented = losses.explain_key(
                    register,
                    ga.requested.min(gb.requested),
                    ga.acquired.max(gb.acquired),
                );
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
    use crate::check::tests::{assert_violations, event, report_of, row, t};
    use crate::journal::{Detail, Event};

    /// Builds journals of key `k` by hand.
    #[derive(Clone)]
    struct Script {
        events: Vec<Event>,
        next: u64,
        order: u64,
    }

    /// A grant's fence and its `valid_until` (ms).
    fn grant(fence: u64, until: u64) -> Detail {
        Detail {
            fence: Some(fence),
            valid_until: Some(t(until)),
            ..Detail::default()
        }
    }

    /// A script of locks [`held`](Script::held), each `(p, fence, from, to, value)`.
    fn holders(held: &[(u32, u64, u64, u64, u64)]) -> Script {
        let mut s = Script::new();
        for &(p, fence, from, to, value) in held {
            s.held(p, fence, from, to, value);
        }
        s
    }

    impl Script {
        fn new() -> Self {
            Script {
                events: Vec::new(),
                next: 0,
                order: 0,
            }
        }

        /// Operation `op` on `k` by `holder` (process, contender), invoked at `invoke.0` ms
        /// with `invoke.1` and completed `Ok` at `ok.0` with `ok.1`.
        fn op(&mut self, holder: (u32, u32), op: Op, invoke: (u64, Detail), ok: (u64, Detail)) {
            let id = self.next;
            self.next += 1;
            for (at, phase, detail) in
                [(invoke.0, Phase::Invoke, invoke.1), (ok.0, Phase::Ok, ok.1)]
            {
                let seq = self.events.len() as u64;
                let what = (op, phase, detail);
                self.events.push(event(holder, (seq, id), at, what));
            }
        }

        /// A lock held by contender 0 of process `p` over [from, to) with `fence`, valid
        /// until 1 s, writing `value` (accepted) in between.
        fn held(&mut self, p: u32, fence: u64, from: u64, to: u64, value: u64) {
            let (c, until) = (0, 1_000);
            let acquire = (from.saturating_sub(1), Detail::default());
            self.op(
                (p, c),
                Op::LockAcquire,
                acquire,
                (from, grant(fence, until)),
            );
            self.order += 1;
            let write = Detail {
                value: Some(value),
                ..grant(fence, until)
            };
            let accepted = Detail {
                accepted: Some(true),
                order: Some(self.order),
                ..Detail::default()
            };
            self.op(
                (p, c),
                Op::LockWrite,
                (from + 1, write),
                (from + 2, accepted),
            );
            let released = Detail {
                outcome: Some("released".into()),
                ..Detail::default()
            };
            let release = (to, grant(fence, until));
            self.op((p, c), Op::LockRelease, release, (to + 1, released));
        }

        fn check(self, losses: &Losses) -> CheckReport {
            report_of(self.events, |operations, report| {
                check(operations, losses, report)
            })
        }
    }

    #[test]
    fn back_to_back_holders_in_two_processes_are_clean() {
        let report = holders(&[(1, 10, 0, 50, 1), (2, 11, 60, 100, 2)]).check(&Losses::none(t(0)));
        assert_eq!(report.violations(), 0, "{:?}", report.findings);
        assert_eq!(row(&report, "no-overlap").checked, "2 grants on 1 keys");
        assert_eq!(report.stats["lock grants"], 2);
    }

    #[test]
    fn overlapping_holders_and_their_lost_update_are_violations() {
        let report = holders(&[(1, 10, 0, 50, 1), (2, 11, 20, 100, 1)]).check(&Losses::none(t(0)));
        assert_violations(&report, "no-overlap", 1);
        assert_violations(&report, "lost-update", 1);
        assert_eq!(report.violations(), 2);
    }

    #[test]
    fn a_window_extended_by_keep_alive_counts_to_its_last_valid_until() {
        // Acquired valid until 40, but the release (at 90) carries valid_until 200: the
        // holder believed until 90, so a grant at 60 overlaps.
        let mut s = Script::new();
        s.op(
            (1, 0),
            Op::LockAcquire,
            (0, Detail::default()),
            (1, grant(1, 40)),
        );
        s.op(
            (1, 0),
            Op::LockRelease,
            (90, grant(1, 200)),
            (91, Detail::default()),
        );
        s.held(2, 2, 60, 80, 5);
        let report = s.check(&Losses::none(t(0)));
        assert_violations(&report, "no-overlap", 1);
    }

    #[test]
    fn an_overlap_across_a_redis_data_loss_is_documented_not_a_violation() {
        let overlap = holders(&[(1, 10, 0, 500, 1), (2, 99, 200, 300, 2)]);
        let loss = super::super::DataLoss {
            from: t(100),
            to: t(110),
            back: t(150),
            cause: super::super::LossCause::Promotion,
            spared: Vec::new(),
        };
        // A killed cluster master that did not serve the key's slot spared it: its window
        // explains nothing on the key, neither the overlap nor a value written twice.
        let spared = Losses {
            losses: vec![super::super::DataLoss {
                spared: vec!["lock:k".into()],
                ..loss.clone()
            }],
            start: t(0),
        };
        let report = overlap.clone().check(&spared);
        assert_violations(&report, "no-overlap", 1);
        assert_eq!(row(&report, "no-overlap").documented, 0);
        assert_eq!(row(&report, "lost-update").documented, 0);
        let losses = Losses {
            losses: vec![loss],
            start: t(0),
        };
        let report = overlap.clone().check(&losses);
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
        let report = holders(&[(1, 10, 0, 50, 1), (2, 9, 200, 300, 2)]).check(&losses);
        assert_violations(&report, "fences-increase", 1);
        // The same overlap with the loss after both grants began is a violation.
        let late = Losses {
            losses: vec![super::super::DataLoss {
                from: t(250),
                to: t(260),
                back: t(270),
                cause: Default::default(),
                spared: Vec::new(),
            }],
            start: t(0),
        };
        assert_eq!(overlap.check(&late).violations(), 1);
    }

    #[test]
    fn a_stale_write_accepted_and_a_lower_fence_later_are_violations() {
        let report = holders(&[(1, 10, 0, 50, 1), (2, 9, 60, 100, 2)]).check(&Losses::none(t(0)));
        assert_violations(&report, "fences-increase", 1);
        // order 2 after order 1 with a lower fence, yet recorded accepted.
        assert_violations(&report, "stale-fence", 1);
    }
}
