//! (d) No lost and no doubled side effect.

use std::collections::BTreeMap;

use super::{Rule, Violation};
use crate::history::{History, OpKind};

/// Compares the effects that happened with those that should have: every expected id must
/// occur exactly once, and no other id may occur.
pub fn exactly_once<E, O>(expected: E, observed: O) -> Vec<Violation>
where
    E: IntoIterator,
    E::Item: Into<String>,
    O: IntoIterator,
    O::Item: Into<String>,
{
    let mut counts: BTreeMap<String, (bool, usize)> = BTreeMap::new();
    for id in expected {
        counts.entry(id.into()).or_default().0 = true;
    }
    for id in observed {
        counts.entry(id.into()).or_default().1 += 1;
    }
    counts
        .into_iter()
        .filter_map(|(id, (wanted, count))| {
            let (rule, detail) = match (wanted, count) {
                (true, 1) => return None,
                (true, 0) => (Rule::LostEffect, "expected once, never happened".to_owned()),
                (true, n) => (
                    Rule::DoubledEffect,
                    format!("expected once, happened {n} times"),
                ),
                (false, n) => (
                    Rule::UnexpectedEffect,
                    format!("not expected, happened {n} time(s)"),
                ),
            };
            Some(Violation::new(rule, &id, detail, Vec::new()))
        })
        .collect()
}

/// [`exactly_once`] over the history's [`Effect`](OpKind::Effect) ops, each violation
/// carrying the ops of its id.
pub fn effects<E>(history: &History, expected: E) -> Vec<Violation>
where
    E: IntoIterator,
    E::Item: Into<String>,
{
    let mut found = exactly_once(expected, history.effects());
    for violation in &mut found {
        violation.ops = history
            .ops()
            .iter()
            .filter(|op| matches!(&op.kind, OpKind::Effect { id } if *id == violation.key))
            .cloned()
            .collect();
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::tests::t;
    use crate::history::Recorder;

    #[test]
    fn each_expected_effect_once_passes() {
        assert!(exactly_once(["a", "b"], ["b", "a"]).is_empty());
        assert!(exactly_once(Vec::<String>::new(), Vec::<String>::new()).is_empty());
    }

    #[test]
    fn lost_doubled_and_unexpected_effects_are_reported() {
        let found = exactly_once(["a", "b", "c"], ["a", "c", "c", "z"]);
        let got: Vec<(Rule, &str)> = found.iter().map(|v| (v.rule, v.key.as_str())).collect();
        assert_eq!(
            got,
            [
                (Rule::LostEffect, "b"),
                (Rule::DoubledEffect, "c"),
                (Rule::UnexpectedEffect, "z")
            ]
        );
        assert!(found[1].detail.contains("2 times"), "{}", found[1].detail);
    }

    #[test]
    fn effects_in_a_history_carry_their_ops() {
        let r = Recorder::new(1);
        r.record(0, "k", t(1), OpKind::Effect { id: "1".into() });
        r.record(1, "k", t(2), OpKind::Effect { id: "2".into() });
        r.record(2, "k", t(3), OpKind::Effect { id: "2".into() });
        assert!(
            effects(&r.history(), ["1"])
                .iter()
                .any(|v| v.rule == Rule::UnexpectedEffect)
        );
        let found = effects(&r.history(), ["1", "2", "3"]);
        assert_eq!(found.len(), 2, "{found:?}");
        assert_eq!(found[0].rule, Rule::DoubledEffect);
        assert_eq!(found[0].ops.len(), 2);
        assert_eq!(found[1].rule, Rule::LostEffect);
    }
}
