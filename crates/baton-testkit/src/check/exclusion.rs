//! (a) No two holders of one key with overlapping believed windows; for a semaphore, no more
//! than its permits.

use std::collections::BTreeMap;

use super::{Rule, Violation};
use crate::history::{Grant, History, Op, OpKind};

/// Finds grants of one key whose believed windows overlap.
///
/// A holder believes it holds a grant from when `acquire` returned until the earlier of
/// when it sent the release and `valid_until` ([`Grant::believed_until`]). Two such windows
/// of one key must not overlap; touching (one ends exactly when the next begins) is fine.
/// A grant re-claimed by the same holder with the same fence is one grant, not two.
pub fn no_overlap(history: &History) -> Vec<Violation> {
    let by_key = believed_by_key(history);
    let mut found = Vec::new();
    for (key, grants) in by_key {
        // Sorted by start; compare each with the earlier grant that ends last.
        let mut latest: Option<&Grant> = None;
        for grant in &grants {
            if let Some(earlier) = latest
                && grant.acquired < earlier.believed_until()
                && !grant.same_holder(earlier)
            {
                let overlap = earlier
                    .believed_until()
                    .min(grant.believed_until())
                    .saturating_since(grant.acquired);
                found.push(Violation::new(
                    Rule::Overlap,
                    &key,
                    format!("two holders for {overlap:?}: {earlier}; and {grant}"),
                    grant_ops(history, &[earlier, grant]),
                ));
            }
            if latest.is_none_or(|l| grant.believed_until() > l.believed_until()) {
                latest = Some(grant);
            }
        }
    }
    found
}

/// Finds moments when more than `permits` holders of one key (a semaphore's permits)
/// believed they held it at once.
///
/// Each grant's believed window is as for [`no_overlap`]; a window that ends exactly when
/// another begins does not overlap it. Each moment of too many holders is reported once,
/// with the grants that were believed then.
pub fn at_most(history: &History, permits: usize) -> Vec<Violation> {
    let by_key = believed_by_key(history);
    let mut found = Vec::new();
    for (key, grants) in by_key {
        // Starts and ends in time order, ends first at equal times (touching is fine).
        let mut edges: Vec<(crate::time::MonoTime, bool, usize)> = Vec::new();
        for (i, grant) in grants.iter().enumerate() {
            edges.push((grant.acquired, true, i));
            edges.push((grant.believed_until(), false, i));
        }
        edges.sort_by_key(|&(at, starts, i)| (at, starts, i));
        let mut believed: Vec<usize> = Vec::new();
        let mut reported = false;
        for (at, starts, i) in edges {
            if !starts {
                believed.retain(|&j| j != i);
                reported = false;
                continue;
            }
            believed.push(i);
            if believed.len() > permits && !reported {
                reported = true;
                let involved: Vec<&Grant> = believed.iter().map(|&j| &grants[j]).collect();
                let list: Vec<String> = involved.iter().map(|g| g.to_string()).collect();
                found.push(Violation::new(
                    Rule::TooManyHolders,
                    &key,
                    format!(
                        "{} holders of {permits} permits at {at}: {}",
                        involved.len(),
                        list.join("; ")
                    ),
                    grant_ops(history, &involved),
                ));
            }
        }
    }
    found
}

/// The grants whose holders believed them for any time, by key, in start order.
fn believed_by_key(history: &History) -> BTreeMap<String, Vec<Grant>> {
    let mut by_key: BTreeMap<String, Vec<Grant>> = BTreeMap::new();
    for grant in history.grants() {
        if grant.is_believed() {
            by_key.entry(grant.key.clone()).or_default().push(grant);
        }
    }
    by_key
}

/// The acquire and release ops of `grants`.
pub(super) fn grant_ops(history: &History, grants: &[&Grant]) -> Vec<Op> {
    history
        .ops()
        .iter()
        .filter(|op| {
            let fence = match op.kind {
                OpKind::Acquired { fence, .. } | OpKind::Released { fence, .. } => fence,
                _ => return false,
            };
            grants.iter().any(|g| {
                g.process == op.process
                    && g.contender == op.contender
                    && g.key == op.key
                    && g.fence == fence
            })
        })
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::tests::{acquired, held, holders, only_violation, released};
    use crate::history::{Outcome, Recorder};

    #[test]
    fn up_to_n_holders_pass_and_one_more_is_reported() {
        let two = holders(&[
            (0, "k", 1, 0, 10),
            (1, "k", 2, 5, 20),
            (2, "k", 3, 10, 30),
            (3, "j", 1, 5, 28),
        ]);
        assert!(at_most(&two, 2).is_empty());
        let three = holders(&[(0, "k", 1, 0, 10), (1, "k", 2, 5, 20), (2, "k", 3, 9, 30)]);
        let too_many = only_violation(at_most(&three, 2), Rule::TooManyHolders, "3 holders of 2");
        assert_eq!(too_many.key, "k");
        assert!(at_most(&three, 3).is_empty());
    }

    #[test]
    fn back_to_back_holders_pass() {
        let history = holders(&[
            (0, "k", 1, 0, 10),
            (1, "k", 2, 10, 20),
            (2, "k", 3, 25, 30),
            (3, "j", 1, 5, 28),
        ]);
        assert!(no_overlap(&history).is_empty());
    }

    #[test]
    fn overlapping_holders_are_reported_with_their_ops() {
        let history = holders(&[(0, "k", 1, 0, 10), (1, "k", 2, 9, 20)]);
        let overlap = only_violation(no_overlap(&history), Rule::Overlap, "1ms");
        assert_eq!(overlap.key, "k");
        assert_eq!(overlap.ops.len(), 4);
        assert!(
            overlap.detail.contains("fence 1 held by p1/c0"),
            "{}",
            overlap.detail
        );
    }

    #[test]
    fn a_long_holder_overlaps_later_short_ones() {
        let history = holders(&[
            (0, "k", 1, 0, 100),
            (1, "k", 2, 10, 20),
            (2, "k", 3, 30, 40),
        ]);
        assert_eq!(no_overlap(&history).len(), 2);
    }

    #[test]
    fn the_window_ends_at_valid_until_when_the_release_is_late() {
        let r = Recorder::new(1);
        acquired(&r, 0, "k", 1, 0, 0, 50);
        // Released long after its deadline: it stopped believing at 50.
        released(&r, 0, "k", 1, 200, Outcome::Expired);
        held(&r, 1, "k", 2, 60, 70);
        assert!(no_overlap(&r.history()).is_empty());

        // Never released at all: believed until valid_until.
        let r = Recorder::new(1);
        acquired(&r, 0, "k", 1, 0, 0, 50);
        held(&r, 1, "k", 2, 40, 70);
        assert_eq!(no_overlap(&r.history()).len(), 1);
    }

    #[test]
    fn a_grant_never_believed_overlaps_nothing() {
        let r = Recorder::new(1);
        held(&r, 1, "k", 2, 10, 70);
        // Its acquire returned at 60, after its deadline at 5 (paused holder).
        acquired(&r, 0, "k", 1, 60, 0, 5);
        assert!(no_overlap(&r.history()).is_empty());
    }

    #[test]
    fn holders_in_different_processes_are_compared() {
        let a = Recorder::new(1);
        let b = Recorder::new(2);
        held(&a, 0, "k", 1, 0, 10);
        held(&b, 0, "k", 2, 5, 15);
        let merged = History::merge([a.history(), b.history()]);
        assert_eq!(no_overlap(&merged).len(), 1);
    }
}
