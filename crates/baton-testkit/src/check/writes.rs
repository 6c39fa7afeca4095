//! (c) A fenced register never accepts a stale fence.

use std::collections::BTreeMap;

use super::{Rule, Violation};
use crate::history::{History, Op, OpKind};

/// Replays every register's recorded writes in the register's own order and finds
/// accepted writes whose fence is below the largest fence accepted before them (the
/// resource was corrupted by a stale holder) and rejected writes whose fence was current
/// (the register itself misbehaved). Two writes recorded with one order are malformed.
pub fn stale_fences(history: &History) -> Vec<Violation> {
    let mut by_register: BTreeMap<&str, Vec<(u64, u64, bool, &Op)>> = BTreeMap::new();
    for op in history.ops() {
        if let OpKind::Write {
            register,
            fence,
            order,
            accepted,
            ..
        } = &op.kind
        {
            by_register
                .entry(register)
                .or_default()
                .push((*order, *fence, *accepted, op));
        }
    }
    let mut found = Vec::new();
    for (register, mut writes) in by_register {
        writes.sort_by_key(|w| w.0);
        let mut max: Option<(u64, &Op)> = None;
        let mut last_order = None;
        for (order, fence, accepted, op) in writes {
            if last_order == Some(order) {
                found.push(Violation::new(
                    Rule::Malformed,
                    register,
                    format!("two writes recorded with register order {order}"),
                    vec![op.clone()],
                ));
            }
            last_order = Some(order);
            let current = max.is_none_or(|(m, _)| fence >= m);
            match (accepted, current, max) {
                (true, false, Some((m, by))) => found.push(Violation::new(
                    Rule::StaleFenceAccepted,
                    register,
                    format!("write #{order} with fence {fence} accepted after fence {m} was"),
                    vec![by.clone(), op.clone()],
                )),
                (false, true, _) => found.push(Violation::new(
                    Rule::CurrentFenceRejected,
                    register,
                    format!(
                        "write #{order} with fence {fence} rejected although the largest accepted fence was {}",
                        max.map_or("none".to_owned(), |(m, _)| m.to_string())
                    ),
                    vec![op.clone()],
                )),
                _ => {}
            }
            if accepted && current {
                max = Some((fence, op));
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::tests::{only_violation, t};
    use crate::history::Recorder;

    /// Records a write to register `reg` sent at `at` ms, applied as the register's
    /// `order`th.
    fn write_at(r: &Recorder, at: u64, order: u64, fence: u64, accepted: bool) {
        let kind = OpKind::Write {
            register: "reg".into(),
            fence,
            order,
            value: order,
            accepted,
        };
        r.record(0, "k", t(at), kind);
    }

    /// The history of one process whose writes, each `(order, fence, accepted)`, were sent
    /// when the register applied them.
    fn writes(writes: &[(u64, u64, bool)]) -> History {
        let r = Recorder::new(1);
        for &(order, fence, accepted) in writes {
            write_at(&r, order, order, fence, accepted);
        }
        r.history()
    }

    #[test]
    fn rejecting_stale_fences_passes() {
        let history = writes(&[(0, 2, true), (1, 2, true), (2, 1, false), (3, 5, true)]);
        assert!(stale_fences(&history).is_empty());
    }

    #[test]
    fn an_accepted_stale_fence_is_reported() {
        let stale = only_violation(
            stale_fences(&writes(&[(0, 5, true), (1, 3, true)])),
            Rule::StaleFenceAccepted,
            "fence 3 accepted after fence 5",
        );
        assert_eq!(stale.ops.len(), 2);
    }

    #[test]
    fn writes_are_replayed_in_register_order_not_time_order() {
        let a = Recorder::new(1);
        let b = Recorder::new(2);
        // Process 2 sent its write earlier but the register applied it second.
        write_at(&a, 10, 0, 7, true);
        write_at(&b, 5, 1, 6, false);
        assert!(stale_fences(&History::merge([a.history(), b.history()])).is_empty());
    }

    #[test]
    fn a_rejected_current_fence_and_a_repeated_order_are_reported() {
        let history = writes(&[(0, 5, true), (1, 6, false), (1, 7, true)]);
        let rules: Vec<Rule> = stale_fences(&history).iter().map(|v| v.rule).collect();
        assert_eq!(rules, [Rule::CurrentFenceRejected, Rule::Malformed]);
    }
}
