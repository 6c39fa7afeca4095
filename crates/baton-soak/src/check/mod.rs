//! The checkers of a soak run: what the recorded operations must satisfy.
//!
//! | checker | rule | from |
//! |---|---|---|
//! | `well-formed` | every release (of every family of grants) matches a recorded grant | testkit [`check::well_formed`] |
//! | `no-overlap` | no two holders of one lock or lease key with overlapping believed windows | testkit [`check::no_overlap`] |
//! | `fences-increase` | fences strictly increase per key in grant order, never repeat | testkit [`check::fences_increase`] |
//! | `stale-fence` | a fenced register never accepts a fence below one it accepted (nor rejects the current one) | testkit [`check::stale_fences`] |
//! | `lost-update` | no counter value written twice by holders that both wrote inside their believed windows | [`locks`] |
//! | `idem-attempts` | attempt numbers are never handed out twice and grow in real time | [`idem`] |
//! | `idem-takeover` | a pending record is taken over only after its owner's lease lapsed, a completed one never | [`idem`] |
//! | `idem-finalize` | one completion per record; a taken-over attempt cannot finalize | [`idem`] |
//! | `idem-effects-once` | every acknowledged completion's effect happened exactly once | testkit [`check::exactly_once`] |
//! | `idem-final-state` | every acknowledged completion is still in the store at the end | [`idem`] |
//! | `rate-limit` | no window of the limiter's length holds more admitted units than the limit | [`rate`] |
//! | `permits-at-most` | never more permit holders of a semaphore with overlapping believed windows than its permits | testkit [`check::at_most`], in [`primitives`] |
//! | `permit-fences` | no permit fence handed out twice per semaphore | testkit [`check::fences_increase`] |
//! | `rw-writers-alone` | no writer's believed window overlaps a reader's or another writer's | testkit [`check::writers_alone`] |
//! | `rw-writer-fence` | a writer's fence is above every grant's of the lock made before it asked | testkit [`check::writer_fences_above_earlier`] |
//! | `leaders-no-overlap` | no two leaders of an election with overlapping believed windows | testkit [`check::no_overlap`] |
//! | `terms-increase` | terms strictly increase in leadership order and are never handed out twice | testkit [`check::fences_increase`] |
//!
//! Every check errs toward *not* reporting: a time is only used where it bounds the store's
//! own moment of decision from the safe side (an invocation from below, a completion from
//! above), so a reported violation really happened.
//!
//! **Documented unsafe windows.** A Redis server restarted without persistence forgets every
//! grant, record and budget, and a replica promoted without `min_replicas` (by the sentinels,
//! or by a Redis Cluster whose master was killed) misses what the primary had not yet sent
//! it (see `docs/redis.md`). A finding that needs that loss to be
//! explained — its earlier operation could have reached the store before the kill, its later
//! one after it — is reported as *documented*, with the window, and does not fail the run.
//! Nothing else is ever excused.
//!
//! [`check::well_formed`]: baton_testkit::check::well_formed
//! [`check::no_overlap`]: baton_testkit::check::no_overlap
//! [`check::fences_increase`]: baton_testkit::check::fences_increase
//! [`check::stale_fences`]: baton_testkit::check::stale_fences
//! [`check::exactly_once`]: baton_testkit::check::exactly_once
//! [`check::at_most`]: baton_testkit::check::at_most
//! [`check::writers_alone`]: baton_testkit::check::writers_alone
//! [`check::writer_fences_above_earlier`]: baton_testkit::check::writer_fences_above_earlier

pub mod idem;
pub mod locks;
pub mod primitives;
pub mod rate;

use std::collections::BTreeMap;
use std::time::Duration;

use baton_testkit::MonoTime;
use serde::Serialize;

use crate::journal::Events;
use crate::plan::StoreKind;

/// What the store's clock and the host's monotonic clock may drift apart by within one
/// check (NTP slews a wall clock by at most 0.05 %): subtracted in favour of the store.
pub const CLOCK_TOLERANCE: Duration = Duration::from_millis(5);

/// A span in which the store lost its data (a Redis restart without persistence), or some
/// of it (a replica promoted without `min_replicas`, a Redis Cluster master killed).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct DataLoss {
    /// When the kill was sent.
    pub from: MonoTime,
    /// When the killed server had exited (a promotion: when the sentinels named the
    /// promoted replica).
    pub to: MonoTime,
    /// When the new server answered (a promotion: the promoted replica).
    pub back: MonoTime,
    /// What lost the data.
    #[serde(default)]
    pub cause: LossCause,
    /// The history keys (`lock:lock-0`, `sem:sem-0`, ...) the loss is known not to have
    /// touched: a killed Redis Cluster master spares the contended keys whose slots other
    /// masters served. Empty: every key may have lost its data.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub spared: Vec<String>,
}

/// What lost a store's data.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LossCause {
    /// A Redis server killed and started again without persistence: everything is gone.
    #[default]
    Restart,
    /// A Redis primary killed and its replica promoted without `min_replicas`: what the
    /// replica had not received when the primary died is gone.
    Promotion,
    /// A Redis Cluster master killed and its replica taking over its slots (the cluster
    /// store offers no `min_replicas`): what the replica had not received is gone.
    MasterFailover,
}

impl LossCause {
    /// The window in words, for reports.
    pub fn describe(self) -> &'static str {
        match self {
            LossCause::Restart => {
                "redis restart without persistence: every grant, record and budget lost"
            }
            LossCause::Promotion => {
                "redis replica promoted without min_replicas: what the replica had not received is lost"
            }
            LossCause::MasterFailover => {
                "redis cluster master killed, its replica took over (asynchronous replication): what the replica had not received is lost"
            }
        }
    }
}

/// The data losses of a run.
#[derive(Debug, Clone)]
pub struct Losses {
    /// The losses.
    pub losses: Vec<DataLoss>,
    /// The start of the run, for the times in reports.
    pub start: MonoTime,
}

impl Losses {
    /// No loss, in a run that started at `start`.
    pub fn none(start: MonoTime) -> Losses {
        Losses {
            losses: Vec::new(),
            start,
        }
    }

    /// The documented window that explains a conflict between an operation that may have
    /// reached the store as early as `earlier` and one that may have reached it as late as
    /// `later`, in words; `None` when no loss falls between them.
    pub fn explain(&self, earlier: MonoTime, later: MonoTime) -> Option<String> {
        self.explain_on(None, earlier, later)
    }

    /// As [`Losses::explain`], for a conflict on the history key `key` (`lock:lock-0`): a
    /// loss that spared `key` explains nothing on it.
    pub fn explain_key(&self, key: &str, earlier: MonoTime, later: MonoTime) -> Option<String> {
        self.explain_on(Some(key), earlier, later)
    }

    fn explain_on(&self, key: Option<&str>, earlier: MonoTime, later: MonoTime) -> Option<String> {
        self.between_on(key, earlier, later).map(|l| {
            format!(
                "redis data loss ({}): killed at +{:.3}s, back at +{:.3}s",
                match l.cause {
                    LossCause::Restart => "restart",
                    LossCause::Promotion => "replica promoted",
                    LossCause::MasterFailover => "cluster master killed",
                },
                secs(l.from, self.start),
                secs(l.back, self.start)
            )
        })
    }

    /// The loss that can explain a conflict between an operation that may have reached
    /// the store as early as `earlier` and one that may have reached it as late as `later`:
    /// one whose kill falls between them.
    pub fn between(&self, earlier: MonoTime, later: MonoTime) -> Option<&DataLoss> {
        self.between_on(None, earlier, later)
    }

    /// As [`Losses::between`], leaving out the losses that spared `key`.
    fn between_on(
        &self,
        key: Option<&str>,
        earlier: MonoTime,
        later: MonoTime,
    ) -> Option<&DataLoss> {
        self.losses.iter().find(|l| {
            earlier <= l.to
                && later >= l.from
                && key.is_none_or(|key| !l.spared.iter().any(|s| s == key))
        })
    }
}

/// One finding of a checker.
#[derive(Debug, Clone, Serialize)]
pub struct Finding {
    /// The checker.
    pub checker: &'static str,
    /// The key, register or scope.
    pub key: String,
    /// What happened, in one line.
    pub detail: String,
    /// The recorded operations involved, one JSON line each (in the JSON summary only).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub ops: Vec<String>,
    /// When the finding is explained by a documented unsafe window: which. `None` for a
    /// violation.
    pub documented: Option<String>,
}

/// What one checker looked at and found.
#[derive(Debug, Clone, Default, Serialize)]
pub struct CheckRow {
    /// What it checked, in words ("412 grants").
    pub checked: String,
    /// Violations.
    pub violations: usize,
    /// Findings inside documented unsafe windows.
    pub documented: usize,
}

/// Everything the checkers found.
#[derive(Debug, Clone, Default, Serialize)]
pub struct CheckReport {
    /// Per checker, in the order they ran.
    pub rows: Vec<(&'static str, CheckRow)>,
    /// Every finding.
    pub findings: Vec<Finding>,
    /// Numbers worth showing beside the operations (stale writes rejected, takeovers, ...).
    pub stats: BTreeMap<String, u64>,
}

impl CheckReport {
    /// Registers checker `name` as having checked `checked`.
    pub fn checked(&mut self, name: &'static str, checked: String) {
        self.row(name).checked = checked;
    }

    fn row(&mut self, name: &'static str) -> &mut CheckRow {
        let i = match self.rows.iter().position(|(n, _)| *n == name) {
            Some(i) => i,
            None => {
                self.rows.push((name, CheckRow::default()));
                self.rows.len() - 1
            }
        };
        &mut self.rows[i].1
    }

    /// Adds a finding: a violation, or, when `documented` says which documented unsafe
    /// window explains it, a documented finding.
    pub fn find(
        &mut self,
        checker: &'static str,
        key: impl Into<String>,
        detail: impl Into<String>,
        documented: Option<String>,
    ) {
        let row = self.row(checker);
        match documented {
            Some(_) => row.documented += 1,
            None => row.violations += 1,
        }
        self.findings.push(Finding {
            checker,
            key: key.into(),
            detail: detail.into(),
            ops: Vec::new(),
            documented,
        });
    }

    /// Adds a finding of a testkit checker, with the operations it names.
    pub fn violation(
        &mut self,
        checker: &'static str,
        v: &baton_testkit::Violation,
        documented: Option<String>,
    ) {
        self.find(
            checker,
            &v.key,
            format!("{:?}: {}", v.rule, v.detail),
            documented,
        );
        if let Some(last) = self.findings.last_mut() {
            last.ops = v
                .ops
                .iter()
                .map(|op| serde_json::to_string(op).unwrap_or_default())
                .collect();
        }
    }

    /// Registers testkit checker `name` as having checked `checked` and adds what it
    /// `found`, each a violation unless `documented` names the window that explains it.
    pub fn testkit(
        &mut self,
        name: &'static str,
        checked: String,
        found: Vec<baton_testkit::Violation>,
        documented: impl Fn(&baton_testkit::Violation) -> Option<String>,
    ) {
        self.checked(name, checked);
        for v in found {
            self.violation(name, &v, documented(&v));
        }
    }

    /// Adds `n` to statistic `name`.
    pub fn stat(&mut self, name: &str, n: u64) {
        *self.stats.entry(name.to_owned()).or_default() += n;
    }

    /// Violations over every checker.
    pub fn violations(&self) -> usize {
        self.rows.iter().map(|(_, r)| r.violations).sum()
    }

    /// Documented findings over every checker.
    pub fn documented(&self) -> usize {
        self.rows.iter().map(|(_, r)| r.documented).sum()
    }
}

/// Seconds from `start` to `t`.
pub fn secs(t: MonoTime, start: MonoTime) -> f64 {
    t.saturating_since(start).as_secs_f64()
}

/// What the store said at the end about the scopes whose completion was acknowledged.
pub type Audit = BTreeMap<String, Option<(String, u32)>>;

/// Runs every checker of `store`'s contenders over `events`: the rate-limit checker only
/// where the store keeps rate limits (not on etcd, whose workers run no rate contenders).
pub fn check_all(store: StoreKind, events: &Events, losses: &Losses, audit: &Audit) -> CheckReport {
    let mut report = CheckReport::default();
    let operations = events.operations();
    locks::check(&operations, losses, &mut report);
    idem::check(&operations, losses, audit, &mut report);
    if store.keeps_budgets() {
        rate::check(&operations, losses, &mut report);
    }
    primitives::check(&operations, losses, &mut report);
    report
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::journal::{Detail, Event, Op, Operation, Phase};

    /// `ms` milliseconds after the journals' start, one second after the clock's zero.
    pub(crate) fn t(ms: u64) -> MonoTime {
        MonoTime::from_nanos(1_000_000_000 + ms * 1_000_000)
    }

    /// Event `id` of `holder` (process, contender) on key `k`: `op` in `phase` at `at` ms,
    /// recorded `seq`-th in its process.
    pub(crate) fn event(
        holder: (u32, u32),
        (seq, id): (u64, u64),
        at: u64,
        (op, phase, detail): (Op, Phase, Detail),
    ) -> Event {
        Event {
            process: holder.0,
            worker: 0,
            contender: holder.1,
            seq,
            id,
            at: t(at),
            op,
            phase,
            key: "k".into(),
            detail,
        }
    }

    /// The report of `check` over hand-built `events`, read as journals are (in process and
    /// recording order).
    pub(crate) fn report_of(
        mut events: Vec<Event>,
        check: impl FnOnce(&[Operation<'_>], &mut CheckReport),
    ) -> CheckReport {
        events.sort_by_key(|e| (e.process, e.seq));
        let events = Events {
            events,
            torn_lines: 0,
        };
        let mut report = CheckReport::default();
        check(&events.operations(), &mut report);
        report
    }

    /// The row of `checker`.
    pub(crate) fn row<'a>(report: &'a CheckReport, checker: &str) -> &'a CheckRow {
        &report.rows.iter().find(|(n, _)| *n == checker).unwrap().1
    }

    /// Asserts that `checker` found `n` violations.
    #[track_caller]
    pub(crate) fn assert_violations(report: &CheckReport, checker: &str, n: usize) {
        assert_eq!(
            row(report, checker).violations,
            n,
            "{checker}: {:?}",
            report.findings
        );
    }
}
