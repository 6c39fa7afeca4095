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
    use crate::check::tests::t;
    use crate::history::Recorder;

    fn write(r: &Recorder, order: u64, fence: u64, accepted: bool) {
        r.record(
            0,
            "k",
            t(order),
            OpKind::Write {
                register: "reg".into(),
                fence,
                order,
                value: order,
                accepted,
            },
        );
    }

    #[test]
    fn rejecting_stale_fences_passes() {
        let r = Recorder::new(1);
        write(&r, 0, 2, true);
        write(&r, 1, 2, true);
        write(&r, 2, 1, false);
        write(&r, 3, 5, true);
        assert!(stale_fences(&r.history()).is_empty());
    }

    #[test]
    fn an_accepted_stale_fence_is_reported() {
        let r = Recorder::new(1);
        write(&r, 0, 5, true);
        write(&r, 1, 3, true);
        let found = stale_fences(&r.history());
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].rule, Rule::StaleFenceAccepted);
        assert!(
            found[0].detail.contains("fence 3 accepted after fence 5"),
            "{}",
            found[0].detail
        );
        assert_eq!(found[0].ops.len(), 2);
    }

    #[test]
    fn writes_are_replayed_in_register_order_not_time_order() {
        let a = Recorder::new(1);
        let b = Recorder::new(2);
        // Process 2 sent its write earlier but the register applied it second.
        a.record(
            0,
            "k",
            t(10),
            OpKind::Write {
                register: "reg".into(),
                fence: 7,
                order: 0,
                value: 1,
                accepted: true,
            },
        );
        b.record(
            0,
            "k",
            t(5),
            OpKind::Write {
                register: "reg".into(),
                fence: 6,
                order: 1,
                value: 1,
                accepted: false,
            },
        );
        assert!(stale_fences(&History::merge([a.history(), b.history()])).is_empty());
    }

    #[test]
    fn a_rejected_current_fence_and_a_repeated_order_are_reported() {
        let r = Recorder::new(1);
        write(&r, 0, 5, true);
        write(&r, 1, 6, false);
        write(&r, 1, 7, true);
        let rules: Vec<Rule> = stale_fences(&r.history()).iter().map(|v| v.rule).collect();
        assert_eq!(rules, [Rule::CurrentFenceRejected, Rule::Malformed]);
    }
}
