//! Semaphores, reader-writer locks and elections: their journaled grants turned into
//! testkit `History`s (as [`locks`](super::locks) turns locks and
//! leases), checked by the testkit's checkers.
//!
//! A grant's believed window is as for locks: from the moment its acquire (read, write,
//! campaign) returned to the earlier of the moment its release (resign) was sent and its
//! last known `valid_until`. A grant lost during a fault is fine, as long as no believed
//! windows break the rule:
//!
//! - permits: never more than the semaphore's permits believed at once
//!   ([`check::at_most`]), and no fence handed out twice;
//! - reader-writer locks: no writer beside another reader or writer
//!   ([`check::writers_alone`]), and a writer's fence above every grant's made before it
//!   asked ([`check::writer_fences_above_earlier`]);
//! - elections: no two leaders at once ([`check::no_overlap`]), and terms strictly
//!   increasing in the order of the leaderships ([`check::fences_increase`]).
//!
//! Holders believed at once across a Redis data loss are documented, as for locks; fences
//! and terms never are.

use baton_testkit::History;
use baton_testkit::check::{self, Rule};

use super::locks::{ELECTION, RWLOCK, SEMAPHORE, convert, overlap_explained};
use super::{CheckReport, Losses};
use crate::journal::Operation;
use crate::workload::SEM_PERMITS;

/// Runs the semaphore, reader-writer lock and election checkers.
pub fn check(operations: &[Operation<'_>], losses: &Losses, report: &mut CheckReport) {
    permits(&convert(operations, &[SEMAPHORE]).history, losses, report);
    rwlocks(&convert(operations, &[RWLOCK]).history, losses, report);
    elections(&convert(operations, &[ELECTION]).history, losses, report);
}

/// "3 grants on 1 keys".
fn on_keys(history: &History) -> (usize, String) {
    let grants = history.grants();
    let keys: std::collections::BTreeSet<&str> = grants.iter().map(|g| g.key.as_str()).collect();
    let text = format!("{} grants on {} keys", grants.len(), keys.len());
    (grants.len(), text)
}

/// The most holders of one key believed at once.
fn most_at_once(history: &History, up_to: usize) -> usize {
    (0..=up_to)
        .find(|&n| check::at_most(history, n).is_empty())
        .unwrap_or(up_to + 1)
}

fn permits(history: &History, losses: &Losses, report: &mut CheckReport) {
    let (grants, on_keys) = on_keys(history);
    let permits = SEM_PERMITS as usize;
    report.stat("permit grants", grants as u64);
    report.stat(
        "most permit holders at once",
        most_at_once(history, permits) as u64,
    );
    report.testkit(
        "permits-at-most",
        format!("{on_keys}, at most {permits} at once"),
        check::at_most(history, permits),
        |v| overlap_explained(v, losses),
    );
    // Permits overlap, so their grant order says nothing about their fences' order: only
    // a fence handed out twice is wrong.
    let mut repeated = check::fences_increase(history);
    repeated.retain(|v| v.rule == Rule::DuplicateFence);
    report.testkit("permit-fences", on_keys, repeated, |_| None);
}

fn rwlocks(history: &History, losses: &Losses, report: &mut CheckReport) {
    let grants = history.grants();
    let writes = grants.iter().filter(|g| g.key.ends_with("@write")).count();
    let reads = grants.len() - writes;
    report.stat("rw read grants", reads as u64);
    report.stat("rw write grants", writes as u64);
    let readers = History::new(
        history
            .ops()
            .iter()
            .filter(|op| op.key.ends_with("@read"))
            .cloned()
            .collect(),
    );
    report.stat(
        "most rw readers at once",
        most_at_once(&readers, reads) as u64,
    );
    let checked = format!("{writes} writes beside {reads} reads");
    report.testkit(
        "rw-writers-alone",
        checked.clone(),
        check::writers_alone(history),
        |v| overlap_explained(v, losses),
    );
    let fences = check::writer_fences_above_earlier(history);
    report.testkit("rw-writer-fence", checked, fences, |_| None);
}

fn elections(history: &History, losses: &Losses, report: &mut CheckReport) {
    let (grants, on_keys) = on_keys(history);
    report.stat("leaderships", grants as u64);
    let checked = on_keys
        .replace("grants on", "leaderships of")
        .replace("keys", "elections");
    report.testkit(
        "leaders-no-overlap",
        checked.clone(),
        check::no_overlap(history),
        |v| overlap_explained(v, losses),
    );
    let terms = check::fences_increase(history);
    report.testkit("terms-increase", checked, terms, |_| None);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::tests::{assert_violations, event, report_of, row, t};
    use crate::check::{DataLoss, LossCause};
    use crate::journal::{Detail, Event, Op, Phase};

    /// Hand-made journals of grants.
    #[derive(Default)]
    struct Grants {
        events: Vec<Event>,
    }

    impl Grants {
        fn push(&mut self, holder: (u32, u32), id: u64, at: u64, what: (Op, Phase, Detail)) {
            let seq = self.events.len() as u64;
            self.events.push(event(holder, (seq, id), at, what));
        }

        /// A grant by `ops.0`, released by `ops.1`, to process `p` with `fence`, returned
        /// at `from` ms (asked for 1 ms before), valid until 1 s, released at `to`.
        fn held(mut self, ops: (Op, Op), p: u32, fence: u64, from: u64, to: u64) -> Self {
            let grant = Detail {
                fence: Some(fence),
                valid_until: Some(t(1_000)),
                ..Detail::default()
            };
            let released = Detail {
                outcome: Some("released".into()),
                ..Detail::default()
            };
            let id = self.events.len() as u64;
            let holder = (p, 0);
            self.push(
                holder,
                id,
                from - 1,
                (ops.0, Phase::Invoke, Detail::default()),
            );
            self.push(holder, id, from, (ops.0, Phase::Ok, grant.clone()));
            self.push(holder, id + 1, to, (ops.1, Phase::Invoke, grant));
            self.push(holder, id + 1, to + 1, (ops.1, Phase::Ok, released));
            self
        }

        fn permit(self, p: u32, fence: u64, from: u64, to: u64) -> Self {
            self.held((Op::SemAcquire, Op::SemRelease), p, fence, from, to)
        }

        fn read(self, p: u32, fence: u64, from: u64, to: u64) -> Self {
            self.held((Op::RwRead, Op::RwReadRelease), p, fence, from, to)
        }

        fn write(self, p: u32, fence: u64, from: u64, to: u64) -> Self {
            self.held((Op::RwWrite, Op::RwWriteRelease), p, fence, from, to)
        }

        fn leader(self, p: u32, term: u64, from: u64, to: u64) -> Self {
            self.held((Op::ElectCampaign, Op::ElectResign), p, term, from, to)
        }

        fn check(self, losses: &Losses) -> CheckReport {
            report_of(self.events, |operations, report| {
                check(operations, losses, report);
                super::super::locks::check(operations, losses, report);
            })
        }
    }

    fn clean() -> Losses {
        Losses::none(t(0))
    }

    #[test]
    fn permits_up_to_the_limit_and_one_more() {
        assert_eq!(
            SEM_PERMITS, 3,
            "the journals below hold 3 and 4 permits at once"
        );
        let three = Grants::default()
            .permit(1, 1, 10, 100)
            .permit(2, 2, 20, 100)
            .permit(3, 3, 30, 100)
            .permit(4, 4, 100, 150);
        let report = three.check(&clean());
        assert_eq!(report.violations(), 0, "{:?}", report.findings);
        assert_eq!(report.stats["most permit holders at once"], 3);
        assert_eq!(row(&report, "well-formed").checked, "4 releases");

        let four = Grants::default()
            .permit(1, 1, 10, 100)
            .permit(2, 2, 20, 100)
            .permit(3, 3, 30, 100)
            .permit(4, 4, 99, 150);
        assert_violations(&four.check(&clean()), "permits-at-most", 1);
    }

    #[test]
    fn a_permit_fence_handed_out_twice_is_a_violation_a_lower_one_is_not() {
        let lower = Grants::default().permit(1, 5, 10, 20).permit(2, 4, 30, 40);
        assert_eq!(lower.check(&clean()).violations(), 0);
        let twice = Grants::default().permit(1, 5, 10, 20).permit(2, 5, 30, 40);
        assert_violations(&twice.check(&clean()), "permit-fences", 1);
    }

    #[test]
    fn permits_over_the_limit_across_a_redis_restart_are_documented() {
        let four = Grants::default()
            .permit(1, 1, 10, 300)
            .permit(2, 2, 20, 300)
            .permit(3, 3, 30, 300)
            .permit(4, 4, 200, 350);
        let losses = Losses {
            losses: vec![DataLoss {
                from: t(100),
                to: t(110),
                back: t(150),
                cause: LossCause::Restart,
                spared: Vec::new(),
            }],
            start: t(0),
        };
        let report = four.check(&losses);
        assert_eq!(report.violations(), 0, "{:?}", report.findings);
        assert_eq!(row(&report, "permits-at-most").documented, 1);
    }

    #[test]
    fn readers_share_and_a_writer_beside_a_reader_is_a_violation() {
        let shared = Grants::default()
            .read(1, 1, 10, 50)
            .read(2, 2, 20, 60)
            .write(3, 3, 60, 80)
            .read(1, 4, 80, 90);
        let report = shared.check(&clean());
        assert_eq!(report.violations(), 0, "{:?}", report.findings);
        assert_eq!(report.stats["most rw readers at once"], 2);
        assert_eq!(
            row(&report, "rw-writers-alone").checked,
            "1 writes beside 3 reads"
        );

        let beside = Grants::default().read(1, 1, 10, 50).write(2, 2, 40, 80);
        assert_violations(&beside.check(&clean()), "rw-writers-alone", 1);
        let two = Grants::default().write(1, 1, 10, 50).write(2, 2, 40, 80);
        assert_violations(&two.check(&clean()), "rw-writers-alone", 1);
    }

    #[test]
    fn a_writer_fence_below_an_earlier_read_is_a_violation() {
        let stale = Grants::default().read(1, 7, 10, 50).write(2, 6, 60, 80);
        assert_violations(&stale.check(&clean()), "rw-writer-fence", 1);
    }

    #[test]
    fn two_leaders_at_once_are_a_violation() {
        let turns = Grants::default().leader(1, 1, 10, 50).leader(2, 2, 50, 80);
        let report = turns.check(&clean());
        assert_eq!(report.violations(), 0, "{:?}", report.findings);
        assert_eq!(
            row(&report, "leaders-no-overlap").checked,
            "2 leaderships of 1 elections"
        );
        let two = Grants::default().leader(1, 1, 10, 50).leader(2, 2, 49, 80);
        assert_violations(&two.check(&clean()), "leaders-no-overlap", 1);
    }

    #[test]
    fn a_term_not_above_the_last_leader_s_is_a_violation() {
        let lower = Grants::default().leader(1, 5, 10, 50).leader(2, 4, 60, 80);
        assert_violations(&lower.check(&clean()), "terms-increase", 1);
        let same = Grants::default().leader(1, 5, 10, 50).leader(2, 5, 60, 80);
        // Twice: a term handed out twice, and not above the one before.
        assert_violations(&same.check(&clean()), "terms-increase", 2);
    }

    #[test]
    fn a_leader_told_lost_before_the_next_is_elected_is_clean() {
        // The first leader's valid_until (1 s) is not what ends its window here: its
        // resign, sent when lost() fired at 40, is. The next leader comes at 45.
        let report = Grants::default()
            .leader(1, 1, 10, 40)
            .leader(2, 2, 45, 80)
            .check(&clean());
        assert_eq!(report.violations(), 0, "{:?}", report.findings);
        // And a release that matches no grant is malformed, whatever the family.
        let mut orphan = Grants::default().leader(1, 1, 10, 40);
        orphan.events.remove(1);
        assert_violations(&orphan.check(&clean()), "well-formed", 1);
    }
}
