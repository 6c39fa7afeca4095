//! Checkers of recorded [histories](crate::history): each returns the [`Violation`]s it
//! found, with the ops involved, so a failing test says what went wrong and where.
//!
//! | checker | rule |
//! |---|---|
//! | [`well_formed`] | every release matches a grant of the same contender, key and fence |
//! | [`no_overlap`] | (a) no two holders of one key with overlapping believed windows |
//! | [`fences_increase`] | (b) fences strictly increase per key in grant order, never repeat |
//! | [`stale_fences`] | (c) a fenced register never accepts a fence below one it accepted |
//! | [`effects`] / [`exactly_once`] | (d) every side effect happens exactly once |
//! | [`writers_alone`] / [`writer_fences_above_earlier`] | a reader-writer lock's writer overlaps nobody; its fence is above every earlier grant's |
//!
//! [`all`] runs the first four (the fourth needs no expectations); [`effects`] needs the
//! list of effects that should have happened. [`assert_clean`] panics with a readable
//! report.

mod effects;
mod exclusion;
mod fences;
mod readers_writers;
mod writes;

use std::fmt;

pub use effects::{effects, exactly_once};
pub use exclusion::{at_most, no_overlap};
pub use fences::fences_increase;
pub use readers_writers::{Mode, rw_key, writer_fences_above_earlier, writers_alone};
pub use writes::stale_fences;

use crate::history::{History, Op};

/// Which rule a violation breaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Rule {
    /// The history itself is inconsistent (a release of a grant nobody recorded, two
    /// writes with one register order).
    Malformed,
    /// Two holders believed they held one key at the same time.
    Overlap,
    /// More holders than a semaphore's permits believed they held one key at the same time.
    TooManyHolders,
    /// A grant's fence is not larger than the fence of the grant before it.
    FenceOrder,
    /// Two grants of one key share a fence.
    DuplicateFence,
    /// A fenced register accepted a write whose fence is below one it accepted earlier.
    StaleFenceAccepted,
    /// A fenced register rejected a write whose fence was current (a register fault).
    CurrentFenceRejected,
    /// An effect that should have happened did not.
    LostEffect,
    /// An effect happened more than once.
    DoubledEffect,
    /// An effect happened that nobody expected.
    UnexpectedEffect,
}

/// One broken rule, with the ops that show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// The rule broken.
    pub rule: Rule,
    /// The key (or register, for register rules; the effect id for effect rules).
    pub key: String,
    /// What went wrong, in words, with times and fences.
    pub detail: String,
    /// The ops involved.
    pub ops: Vec<Op>,
}

impl Violation {
    pub(crate) fn new(rule: Rule, key: &str, detail: String, ops: Vec<Op>) -> Self {
        Violation {
            rule,
            key: key.to_owned(),
            detail,
            ops,
        }
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?} on {:?}: {}", self.rule, self.key, self.detail)?;
        for op in &self.ops {
            write!(f, "\n    {}", serde_json::to_string(op).unwrap_or_default())?;
        }
        Ok(())
    }
}

/// Every checker that needs no expectations: [`well_formed`], [`no_overlap`],
/// [`fences_increase`] and [`stale_fences`].
pub fn all(history: &History) -> Vec<Violation> {
    let mut found = well_formed(history);
    found.extend(no_overlap(history));
    found.extend(fences_increase(history));
    found.extend(stale_fences(history));
    found
}

/// Releases that match no recorded grant.
pub fn well_formed(history: &History) -> Vec<Violation> {
    use std::collections::HashSet;

    use crate::history::OpKind;

    let mut open = HashSet::new();
    let mut found = Vec::new();
    for op in history.ordered() {
        match &op.kind {
            OpKind::Acquired { fence, .. } => {
                open.insert((op.process, op.contender, op.key.as_str(), *fence));
            }
            OpKind::Released { fence, .. } => {
                if !open.remove(&(op.process, op.contender, op.key.as_str(), *fence)) {
                    found.push(Violation::new(
                        Rule::Malformed,
                        &op.key,
                        format!(
                            "p{}/c{} released fence {fence}, which it holds no recorded grant of",
                            op.process, op.contender
                        ),
                        vec![op.clone()],
                    ));
                }
            }
            OpKind::Write { .. } | OpKind::Effect { .. } => {}
        }
    }
    found
}

/// Panics with every violation listed, if there are any.
///
/// # Panics
/// When `violations` is not empty.
#[track_caller]
pub fn assert_clean(violations: &[Violation]) {
    if violations.is_empty() {
        return;
    }
    let mut report = format!("{} violation(s) in the recorded history:", violations.len());
    for (i, v) in violations.iter().enumerate().take(20) {
        report.push_str(&format!("\n{}. {v}", i + 1));
    }
    if violations.len() > 20 {
        report.push_str(&format!("\n... and {} more", violations.len() - 20));
    }
    panic!("{report}");
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::history::{OpKind, Outcome, Recorder};
    use crate::time::MonoTime;

    pub(crate) fn t(ms: u64) -> MonoTime {
        MonoTime::from_nanos(ms * 1_000_000)
    }

    /// Records that `contender`'s `acquire` of `key`, sent at `requested`, returned at `at`
    /// with `fence`, valid until `valid_until` (all in ms).
    pub(crate) fn acquired(
        r: &Recorder,
        contender: u32,
        key: &str,
        fence: u64,
        at: u64,
        requested: u64,
        valid_until: u64,
    ) {
        let kind = OpKind::Acquired {
            fence,
            requested: t(requested),
            valid_until: t(valid_until),
        };
        r.record(contender, key, t(at), kind);
    }

    /// Records that `contender` released `fence` of `key` at `at` ms, with `outcome`.
    pub(crate) fn released(
        r: &Recorder,
        contender: u32,
        key: &str,
        fence: u64,
        at: u64,
        outcome: Outcome,
    ) {
        let answered = None;
        r.record(
            contender,
            key,
            t(at),
            OpKind::Released {
                fence,
                outcome,
                answered,
            },
        );
    }

    /// Records a grant of `key` held over [from, to) (released at `to`), valid for 1 s.
    pub(crate) fn held(r: &Recorder, contender: u32, key: &str, fence: u64, from: u64, to: u64) {
        let requested = from.saturating_sub(1);
        acquired(r, contender, key, fence, from, requested, from + 1_000);
        released(r, contender, key, fence, to, Outcome::Released);
    }

    /// The history of one process whose grants, each `(contender, key, fence, from, to)`,
    /// are [`held`].
    pub(crate) fn holders(grants: &[(u32, &str, u64, u64, u64)]) -> History {
        let r = Recorder::new(1);
        for &(contender, key, fence, from, to) in grants {
            held(&r, contender, key, fence, from, to);
        }
        r.history()
    }

    /// The one violation `found`, which breaks `rule` and whose detail says `detail`.
    #[track_caller]
    pub(crate) fn only_violation(found: Vec<Violation>, rule: Rule, detail: &str) -> Violation {
        let [violation]: [Violation; 1] = found
            .try_into()
            .unwrap_or_else(|found| panic!("not one violation: {found:?}"));
        assert_eq!(violation.rule, rule, "{violation}");
        assert!(violation.detail.contains(detail), "{violation}");
        violation
    }

    #[test]
    fn a_release_without_a_grant_is_malformed() {
        let r = Recorder::new(1);
        held(&r, 0, "k", 1, 0, 10);
        released(&r, 0, "k", 1, 20, Outcome::Released);
        only_violation(
            well_formed(&r.history()),
            Rule::Malformed,
            "released fence 1",
        );
    }

    #[test]
    fn a_clean_history_passes_everything() {
        let history = holders(&[
            (0, "k", 1, 0, 10),
            (1, "k", 2, 10, 20),
            (0, "other", 1, 5, 15),
        ]);
        assert!(all(&history).is_empty());
        assert_clean(&[]);
    }

    #[test]
    #[should_panic(expected = "1 violation(s) in the recorded history:\n1. Overlap on \"k\"")]
    fn assert_clean_lists_the_violations() {
        assert_clean(&all(&holders(&[(0, "k", 1, 0, 10), (1, "k", 2, 5, 20)])));
    }
}
