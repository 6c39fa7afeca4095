//! Reader-writer lock histories: no writer's believed window overlaps any other reader's or
//! writer's of the same lock, and a writer's fence is above every grant made before it asked.
//!
//! Reads and writes of lock `K` are recorded under the keys [`rw_key`]`(K, Mode::Read)` and
//! `rw_key(K, Mode::Write)`, so the other checkers ([`well_formed`](super::well_formed),
//! [`at_most`](super::at_most), ...) still see each mode's grants as their own key.

use std::collections::BTreeMap;

use super::exclusion::grant_ops;
use super::{Rule, Violation};
use crate::history::{Grant, History};

/// How a reader-writer lock was held.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mode {
    /// Shared.
    Read,
    /// Exclusive.
    Write,
}

impl Mode {
    fn as_str(self) -> &'static str {
        match self {
            Mode::Read => "read",
            Mode::Write => "write",
        }
    }
}

/// The history key of `mode` grants of reader-writer lock `key`: `<key>@read`,
/// `<key>@write`.
pub fn rw_key(key: &str, mode: Mode) -> String {
    format!("{key}@{}", mode.as_str())
}

/// The lock and mode of a history key made by [`rw_key`].
fn split(key: &str) -> Option<(&str, Mode)> {
    match key.rsplit_once('@')? {
        (lock, "read") => Some((lock, Mode::Read)),
        (lock, "write") => Some((lock, Mode::Write)),
        _ => None,
    }
}

/// The believed grants of each reader-writer lock, with their modes, in start order.
fn by_lock(history: &History) -> BTreeMap<String, Vec<(Mode, Grant)>> {
    let mut locks: BTreeMap<String, Vec<(Mode, Grant)>> = BTreeMap::new();
    for grant in history.grants() {
        if let Some((lock, mode)) = split(&grant.key)
            && grant.is_believed()
        {
            locks
                .entry(lock.to_owned())
                .or_default()
                .push((mode, grant));
        }
    }
    locks
}

/// Finds writers whose believed window overlaps another grant's (a reader's or another
/// writer's) of the same lock. Touching windows do not overlap.
pub fn writers_alone(history: &History) -> Vec<Violation> {
    let mut found = Vec::new();
    for (lock, grants) in by_lock(history) {
        for (i, (mode, writer)) in grants.iter().enumerate() {
            if *mode != Mode::Write {
                continue;
            }
            for (j, (other_mode, other)) in grants.iter().enumerate() {
                let overlaps = other.acquired < writer.believed_until()
                    && writer.acquired < other.believed_until();
                // A pair of writers is reported once.
                if i == j || !overlaps || (*other_mode == Mode::Write && j < i) {
                    continue;
                }
                found.push(Violation::new(
                    Rule::Overlap,
                    &lock,
                    format!(
                        "a writer beside a {}: {writer}; and {other}",
                        other_mode.as_str()
                    ),
                    grant_ops(history, &[writer, other]),
                ));
            }
        }
    }
    found
}

/// Finds writers whose fence is not above the fence of a grant of the same lock (read or
/// write) whose acquire returned before the writer's was called.
pub fn writer_fences_above_earlier(history: &History) -> Vec<Violation> {
    let mut found = Vec::new();
    for (lock, grants) in by_lock(history) {
        for (mode, writer) in &grants {
            if *mode != Mode::Write {
                continue;
            }
            for (other_mode, earlier) in &grants {
                if earlier.acquired < writer.requested && earlier.fence >= writer.fence {
                    found.push(Violation::new(
                        Rule::FenceOrder,
                        &lock,
                        format!(
                            "a writer's fence is not above an earlier {}'s: {writer}; after {earlier}",
                            other_mode.as_str()
                        ),
                        grant_ops(history, &[writer, earlier]),
                    ));
                }
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::tests::holders;

    #[test]
    fn readers_may_share_and_a_writer_may_not() {
        let shared = holders(&[
            (0, "k@read", 1, 0, 10),
            (1, "k@read", 2, 5, 20),
            (2, "k@write", 3, 20, 30),
            (3, "j@write", 1, 5, 28),
        ]);
        assert!(writers_alone(&shared).is_empty());
        assert!(writer_fences_above_earlier(&shared).is_empty());
        let beside = holders(&[(0, "k@read", 1, 0, 10), (1, "k@write", 2, 9, 20)]);
        let found = writers_alone(&beside);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].detail.contains("beside a read"), "{found:?}");
        let two = holders(&[(0, "k@write", 1, 0, 10), (1, "k@write", 2, 9, 20)]);
        assert_eq!(writers_alone(&two).len(), 1, "reported once");
    }

    #[test]
    fn a_writer_s_fence_below_an_earlier_read_s_is_reported() {
        let history = holders(&[(0, "k@read", 5, 0, 10), (1, "k@write", 3, 20, 30)]);
        let found = writer_fences_above_earlier(&history);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].rule, Rule::FenceOrder);
    }
}
