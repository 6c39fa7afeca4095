//! The election conformance rules: written once, run by every store.
//!
//! A store's test target implements [`Opens`] for its store as [`Store`] (the
//! [`ElectionHarness`]) and expands
//! [`election_conformance_tests!`](crate::election_conformance_tests)
//! (`baton_core::election_conformance_tests!(my_harness())`), which generates one
//! `#[tokio::test]` per rule. Each rule uses a fresh random namespace, so rules may share a
//! server. Every wait is generous and no rule asserts how fast anything happened.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::{sleep, timeout};

use super::{Election, Leader, MAX_CANDIDATE_BYTES, MAX_VALUE_BYTES};
use crate::ErrorKind;
use crate::capability::Store;
use crate::conformance::{Opens, eventually, fresh_namespace, ms};
use crate::key::Namespace;
use crate::lock::{LockOptions, Locks, ReleaseOutcome};

/// What a store's test target provides to the election rules: the store under test, as
/// [`Store`] (elections use its locks, and its broadcast when it has one).
pub type ElectionHarness = dyn Opens<dyn Store>;

/// Generates one `#[tokio::test]` per election rule. `$harness` is an expression that
/// evaluates to a future of an [`ElectionHarness`]; it is evaluated once per test.
#[macro_export]
macro_rules! election_conformance_tests {
    ($harness:expr) => {
        $crate::__conformance_rules!($crate::election::conformance; $harness;
            one_leader_at_a_time_and_terms_increase,
            leader_reports_candidate_value_and_term,
            proclaim_replaces_the_value_and_keeps_the_term,
            a_waiting_candidate_is_elected_with_its_value_when_the_leader_resigns,
            an_expired_leader_is_told_before_another_is_elected,
            keep_alive_keeps_the_leadership_across_ttls,
            proclaim_after_the_leadership_ended_fails_and_elects_nobody,
            observe_yields_each_settled_change,
            a_dropped_leadership_resigns,
            elections_namespaces_and_locks_are_separate,
            bad_input_is_rejected_before_io,
        );
    };
}

fn election(store: Arc<dyn Store>, ns: &Namespace, name: &str) -> Election {
    Election::new(store, ns.clone(), name).expect("valid election")
}

fn options(ttl: Duration) -> LockOptions {
    LockOptions::new(ttl)
}

const LONG: Duration = Duration::from_secs(30);

/// While one candidate leads, no other is elected; the next leader's term is larger.
pub async fn one_leader_at_a_time_and_terms_increase(h: &ElectionHarness) {
    let e = election(h.open().await, &fresh_namespace(), "scheduler");
    let a = e.campaign("a", "", &options(LONG)).await.unwrap();
    assert!(
        e.try_campaign("b", "", &options(LONG))
            .await
            .unwrap()
            .is_none(),
        "b elected while a leads"
    );
    let waited = e
        .try_campaign("b", "", &options(LONG).wait(ms(200)))
        .await
        .unwrap();
    assert!(waited.is_none(), "b elected while a leads");
    let first = a.term();
    assert_eq!(a.resign().await, ReleaseOutcome::Released);
    let b = e.campaign("b", "", &options(LONG)).await.unwrap();
    assert!(b.term() > first, "term {} after {first}", b.term());
    let again = {
        b.resign().await;
        e.campaign("a", "", &options(LONG)).await.unwrap()
    };
    assert!(again.term() > first, "a's second term {}", again.term());
    again.resign().await;
}

/// `leader` names the candidate, its value and its term, with its remaining time; `None`
/// when nobody leads.
pub async fn leader_reports_candidate_value_and_term(h: &ElectionHarness) {
    let e = election(h.open().await, &fresh_namespace(), "owner");
    assert_eq!(e.leader().await.unwrap(), None);
    let leadership = e
        .campaign("pod-7/eu-west", "http://10.0.0.7:8080", &options(LONG))
        .await
        .unwrap();
    let Leader {
        candidate,
        value,
        term,
        remaining,
    } = e.leader().await.unwrap().expect("a leader");
    assert_eq!(candidate, "pod-7/eu-west", "a candidate id may contain '/'");
    assert_eq!(value, "http://10.0.0.7:8080");
    assert_eq!(term, leadership.term());
    assert!(
        remaining > Duration::ZERO && remaining <= LONG,
        "{remaining:?}"
    );
    assert_eq!(leadership.candidate(), "pod-7/eu-west");
    assert_eq!(leadership.value(), "http://10.0.0.7:8080");
    leadership.resign().await;
    assert_eq!(e.leader().await.unwrap(), None);
}

/// Proclaiming replaces the value everyone reads and keeps the term.
pub async fn proclaim_replaces_the_value_and_keeps_the_term(h: &ElectionHarness) {
    let e = election(h.open().await, &fresh_namespace(), "p");
    let leadership = e.campaign("a", "v1", &options(LONG)).await.unwrap();
    let term = leadership.term();
    leadership.proclaim("v2").await.unwrap();
    let leader = e.leader().await.unwrap().expect("a leader");
    assert_eq!((leader.value.as_str(), leader.term), ("v2", term));
    assert_eq!(leadership.value(), "v2");
    leadership.proclaim("").await.unwrap();
    assert_eq!(e.leader().await.unwrap().unwrap().value, "");
    assert_eq!(leadership.term(), term);
    leadership.resign().await;
}

/// A candidate campaigning while another leads is elected when the leader resigns, with
/// the value it campaigned with (also where the store hands the grant over to a waiter).
pub async fn a_waiting_candidate_is_elected_with_its_value_when_the_leader_resigns(
    h: &ElectionHarness,
) {
    let e = election(h.open().await, &fresh_namespace(), "w");
    let a = e.campaign("a", "value-a", &options(LONG)).await.unwrap();
    let waiting = {
        let e = e.clone();
        tokio::spawn(async move { e.campaign("b", "value-b", &options(LONG)).await })
    };
    sleep(ms(200)).await;
    assert!(!waiting.is_finished(), "b elected while a leads");
    let first = a.term();
    a.resign().await;
    let b = timeout(Duration::from_secs(10), waiting)
        .await
        .expect("b is elected after a resigns")
        .unwrap()
        .unwrap();
    assert!(b.term() > first);
    let leader = e.leader().await.unwrap().expect("b leads");
    assert_eq!(
        (
            leader.candidate.as_str(),
            leader.value.as_str(),
            leader.term
        ),
        ("b", "value-b", b.term())
    );
    b.resign().await;
}

/// A leader without keep-alive is told its leadership is lost when its TTL runs out, and
/// before the candidate waiting behind it is elected.
pub async fn an_expired_leader_is_told_before_another_is_elected(h: &ElectionHarness) {
    let e = election(h.open().await, &fresh_namespace(), "x");
    let a = e.campaign("a", "", &options(ms(400))).await.unwrap();
    let b = e.campaign("b", "", &options(LONG)).await.unwrap();
    let elected = tokio::time::Instant::now();
    assert!(a.is_lost(), "a was not told before b was elected");
    assert!(a.valid_until() <= elected);
    assert!(b.term() > a.term());
    b.resign().await;
    assert_ne!(a.resign().await, ReleaseOutcome::Released);
}

/// With keep-alive a leader stays leader across many TTLs.
pub async fn keep_alive_keeps_the_leadership_across_ttls(h: &ElectionHarness) {
    let e = election(h.open().await, &fresh_namespace(), "k");
    let a = e
        .campaign("a", "", &options(ms(600)).keep_alive(ms(150)))
        .await
        .unwrap();
    sleep(ms(1500)).await;
    assert!(!a.is_lost(), "lost with keep-alive");
    assert!(
        e.try_campaign("b", "", &options(LONG))
            .await
            .unwrap()
            .is_none()
    );
    assert_eq!(e.leader().await.unwrap().unwrap().term, a.term());
    assert_eq!(a.resign().await, ReleaseOutcome::Released);
}

/// A leader whose leadership ended cannot proclaim: the call fails, nobody becomes leader,
/// and the value is not changed.
pub async fn proclaim_after_the_leadership_ended_fails_and_elects_nobody(h: &ElectionHarness) {
    let e = election(h.open().await, &fresh_namespace(), "ended");
    let a = e.campaign("a", "old", &options(ms(300))).await.unwrap();
    timeout(Duration::from_secs(5), a.lost())
        .await
        .expect("lost after its TTL");
    sleep(ms(100)).await;
    let err = a.proclaim("new").await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Timeout, "{err}");
    assert_eq!(e.leader().await.unwrap(), None, "a proclaim elected nobody");
    assert_eq!(a.value(), "old");
}

/// An observer answers the current leader, then each change once it has settled: a new
/// leader, a new value, no leader.
pub async fn observe_yields_each_settled_change(h: &ElectionHarness) {
    let e = election(h.open().await, &fresh_namespace(), "o");
    let mut observer = e.observe().await.unwrap();
    assert_eq!(next(&mut observer).await, None, "nobody leads yet");
    let a = e.campaign("a", "v1", &options(LONG)).await.unwrap();
    let seen = next(&mut observer).await.expect("a leads");
    assert_eq!((seen.candidate.as_str(), seen.value.as_str()), ("a", "v1"));
    a.proclaim("v2").await.unwrap();
    let seen = next(&mut observer).await.expect("a leads");
    assert_eq!((seen.value.as_str(), seen.term), ("v2", a.term()));
    a.resign().await;
    assert_eq!(next(&mut observer).await, None, "a resigned");
    let b = e.campaign("b", "v3", &options(ms(500))).await.unwrap();
    let seen = next(&mut observer).await.expect("b leads");
    assert_eq!((seen.candidate.as_str(), seen.term), ("b", b.term()));
    // Expiry publishes nothing: the observer sees it when b's time runs out.
    assert_eq!(next(&mut observer).await, None, "b's leadership expired");
}

/// The observer's next answer, within a generous limit.
async fn next(observer: &mut super::Observer) -> Option<Leader> {
    timeout(Duration::from_secs(10), observer.next())
        .await
        .expect("a change is observed")
        .unwrap()
}

/// Dropping a leadership without resigning frees the election in the background.
pub async fn a_dropped_leadership_resigns(h: &ElectionHarness) {
    let e = election(h.open().await, &fresh_namespace(), "d");
    let mut observer = e.observe().await.unwrap();
    assert_eq!(next(&mut observer).await, None);
    let a = e.campaign("a", "", &options(LONG)).await.unwrap();
    assert!(next(&mut observer).await.is_some(), "a leads");
    drop(a);
    eventually(Duration::from_secs(5), "background resignation", || async {
        e.leader().await.unwrap().is_none()
    })
    .await;
    // Observers are told, not left to find out at their poll interval (5 s on stores that
    // broadcast) or at the leader's TTL (30 s).
    let seen = timeout(Duration::from_secs(3), observer.next())
        .await
        .expect("the observer is told of the resignation")
        .unwrap();
    assert_eq!(seen, None);
}

/// Elections of other names and namespaces are other elections, and a lock of the same
/// name is another key.
pub async fn elections_namespaces_and_locks_are_separate(h: &ElectionHarness) {
    let store = h.open().await;
    let ns = fresh_namespace();
    let a = election(Arc::clone(&store), &ns, "same")
        .campaign("a", "", &options(LONG))
        .await
        .unwrap();
    let other_name = election(Arc::clone(&store), &ns, "other")
        .try_campaign("b", "", &options(LONG))
        .await
        .unwrap()
        .expect("another name is another election");
    let other_ns = election(Arc::clone(&store), &fresh_namespace(), "same")
        .try_campaign("c", "", &options(LONG))
        .await
        .unwrap()
        .expect("another namespace is another election");
    let locks = Locks::with_namespace(store, ns);
    let lock = locks
        .try_acquire("same", &options(LONG))
        .await
        .unwrap()
        .expect("a lock of the same name is another key");
    lock.release().await;
    for leadership in [a, other_name, other_ns] {
        leadership.resign().await;
    }
}

/// Bad names, candidates, values and options are refused before any I/O.
pub async fn bad_input_is_rejected_before_io(h: &ElectionHarness) {
    let store = h.open().await;
    let ns = fresh_namespace();
    for name in ["", "a\nb"] {
        let err = Election::new(Arc::clone(&store), ns.clone(), name).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidInput, "{name:?}: {err}");
    }
    let e = election(store, &ns, "input");
    let long_candidate = "c".repeat(MAX_CANDIDATE_BYTES + 1);
    let long_value = "v".repeat(MAX_VALUE_BYTES + 1);
    let cases: [(&str, &str, LockOptions); 5] = [
        ("", "", options(LONG)),
        ("a\u{7}", "", options(LONG)),
        (&long_candidate, "", options(LONG)),
        ("a", &long_value, options(LONG)),
        ("a", "", options(Duration::ZERO)),
    ];
    for (candidate, value, options) in cases {
        let err = e
            .try_campaign(candidate, value, &options)
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
        let err = e.campaign(candidate, value, &options).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
    }
    assert_eq!(e.leader().await.unwrap(), None, "nothing was written");
    let a = e.campaign("a", "ok", &options(LONG)).await.unwrap();
    let err = a.proclaim("tab\tseparated").await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
    assert_eq!(e.leader().await.unwrap().unwrap().value, "ok");
    a.resign().await;
}
