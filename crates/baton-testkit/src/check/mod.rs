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
//!
//! [`all`] runs the first four (the fourth needs no expectations); [`effects`] needs the
//! list of effects that should have happened. [`assert_clean`] panics with a readable
//! report.

mod effects;
mod exclusion;
mod fences;
mod writes;

use std::fmt;

pub use effects::{effects, exactly_once};
pub use exclusion::no_overlap;
pub use fences::fences_increase;
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

    /// Records a grant of `key` held over [from, to) (released at `to`), valid for 1 s.
    pub(crate) fn held(r: &Recorder, contender: u32, key: &str, fence: u64, from: u64, to: u64) {
        r.record(
            contender,
            key,
            t(from),
            OpKind::Acquired {
                fence,
                requested: t(from.saturating_sub(1)),
                valid_until: t(from + 1_000),
            },
        );
        r.record(
            contender,
            key,
            t(to),
            OpKind::Released {
                fence,
                outcome: Outcome::Released,
            },
        );
    }

    #[test]
    fn a_release_without_a_grant_is_malformed() {
        let r = Recorder::new(1);
        held(&r, 0, "k", 1, 0, 10);
        r.record(
            0,
            "k",
            t(20),
            OpKind::Released {
                fence: 1,
                outcome: Outcome::Released,
            },
        );
        let found = well_formed(&r.history());
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].rule, Rule::Malformed);
    }

    #[test]
    fn a_clean_history_passes_everything() {
        let r = Recorder::new(1);
        held(&r, 0, "k", 1, 0, 10);
        held(&r, 1, "k", 2, 10, 20);
        held(&r, 0, "other", 1, 5, 15);
        assert!(all(&r.history()).is_empty());
        assert_clean(&[]);
    }

    #[test]
    #[should_panic(expected = "1 violation(s) in the recorded history:\n1. Overlap on \"k\"")]
    fn assert_clean_lists_the_violations() {
        let r = Recorder::new(1);
        held(&r, 0, "k", 1, 0, 10);
        held(&r, 1, "k", 2, 5, 20);
        assert_clean(&all(&r.history()));
    }
}
