//! (b) Fences strictly increase per key in grant order.

use std::collections::{BTreeMap, HashMap};

use super::exclusion::grant_ops;
use super::{Rule, Violation};
use crate::history::{Grant, History};

/// Finds grants whose fence is not larger than the fence of the grant before them, and
/// fences given to two different grants of one key.
///
/// Grant order is the order of the believed windows: when windows do not overlap (see
/// [`no_overlap`](super::no_overlap)) the store must have granted them in that order. A grant
/// that was never believed (its `valid_until` passed before `acquire` returned) has no
/// place in that order, so it is only checked for a repeated fence.
pub fn fences_increase(history: &History) -> Vec<Violation> {
    let mut by_key: BTreeMap<String, Vec<Grant>> = BTreeMap::new();
    for grant in history.grants() {
        by_key.entry(grant.key.clone()).or_default().push(grant);
    }
    let mut found = Vec::new();
    for (key, grants) in by_key {
        let mut seen: HashMap<u64, &Grant> = HashMap::new();
        for grant in &grants {
            if let Some(first) = seen.get(&grant.fence) {
                if !grant.same_holder(first) {
                    found.push(Violation::new(
                        Rule::DuplicateFence,
                        &key,
                        format!("fence {} granted twice: {first}; and {grant}", grant.fence),
                        grant_ops(history, &[first, grant]),
                    ));
                }
            } else {
                seen.insert(grant.fence, grant);
            }
        }
        let mut previous: Option<&Grant> = None;
        for grant in grants.iter().filter(|g| g.is_believed()) {
            if let Some(before) = previous
                && (grant.fence < before.fence
                    || (grant.fence == before.fence && !grant.same_holder(before)))
            {
                found.push(Violation::new(
                    Rule::FenceOrder,
                    &key,
                    format!(
                        "fence {} came after fence {}: {before}; then {grant}",
                        grant.fence, before.fence
                    ),
                    grant_ops(history, &[before, grant]),
                ));
            }
            previous = Some(grant);
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::tests::{acquired, held, holders, only_violation};
    use crate::history::Recorder;

    #[test]
    fn increasing_fences_pass() {
        let history = holders(&[
            (0, "k", 3, 0, 10),
            (1, "k", 7, 10, 20),
            (0, "k", 8, 20, 30),
            (0, "j", 1, 0, 30),
        ]);
        assert!(fences_increase(&history).is_empty());
    }

    #[test]
    fn a_smaller_fence_after_a_larger_one_is_reported() {
        let history = holders(&[(0, "k", 5, 0, 10), (1, "k", 4, 10, 20)]);
        only_violation(
            fences_increase(&history),
            Rule::FenceOrder,
            "fence 4 came after fence 5",
        );
    }

    #[test]
    fn a_repeated_fence_is_reported_once_per_repeat() {
        let history = holders(&[(0, "k", 5, 0, 10), (1, "k", 5, 10, 20)]);
        let rules: Vec<Rule> = fences_increase(&history).iter().map(|v| v.rule).collect();
        assert_eq!(rules, [Rule::DuplicateFence, Rule::FenceOrder]);
    }

    #[test]
    fn a_grant_never_believed_is_only_checked_for_repeats() {
        let r = Recorder::new(1);
        held(&r, 1, "k", 9, 10, 20);
        // Granted before fence 9 and paused: returned at 30, already expired at 8.
        acquired(&r, 0, "k", 8, 30, 0, 8);
        held(&r, 2, "k", 10, 40, 50);
        assert!(fences_increase(&r.history()).is_empty());
    }
}
