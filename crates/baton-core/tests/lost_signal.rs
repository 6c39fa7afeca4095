//! The lost signal of every kept grant is an owned future that `tokio::select!` takes as it
//! is (no temporary token to keep alive), and fires when the grant is gone.

use std::sync::Arc;
use std::time::Duration;

use baton_core::idempotency::{Acquire, IdempotencyLog, Outcome, Scope};
use baton_core::{
    CancellationToken, KeptClaim, LeaseOptions, Leases, LockOptions, Locks, MemoryStore,
};

const S: Duration = Duration::from_secs(1);

/// Selects on `lost` against a sleep of `within`: whether `lost` won.
async fn fires_within(lost: impl std::future::Future<Output = ()>, within: Duration) -> bool {
    tokio::select! {
        _ = lost => true,
        () = tokio::time::sleep(within) => false,
    }
}

#[tokio::test(start_paused = true)]
async fn a_lock_guard_s_lost_is_select_able_and_fires_at_valid_until() {
    let locks = Locks::new(Arc::new(MemoryStore::new()));
    let guard = locks
        .acquire("job", &LockOptions::new(2 * S))
        .await
        .unwrap();
    tokio::select! {
        _ = guard.lost() => panic!("not lost yet"),
        () = tokio::time::sleep(S) => {}
    }
    let token: CancellationToken = guard.lost_token();
    assert!(
        fires_within(guard.lost(), 2 * S).await,
        "lost at valid_until"
    );
    assert!(token.is_cancelled() && guard.is_lost());
    guard.release().await;
}

#[tokio::test(start_paused = true)]
async fn a_lease_keep_alive_s_lost_fires_once_the_lease_is_gone() {
    let leases = Leases::new(Arc::new(MemoryStore::new()));
    let options = LeaseOptions::new(3 * S).reason("rewind").keep_alive(S);
    let Ok(KeptClaim::Kept {
        keep_alive: kept, ..
    }) = leases
        .claim_and_keep("stream/a", "instance-1", &options)
        .await
    else {
        panic!("a free lease is claimed");
    };
    assert!(!fires_within(kept.lost(), 5 * S).await, "kept alive");
    leases.release("stream/a", "instance-1").await.unwrap();
    assert!(
        fires_within(kept.lost(), 2 * S).await,
        "the next renewal finds it not held"
    );
}

#[tokio::test(start_paused = true)]
async fn an_idempotency_attempt_s_lost_fires_once_it_no_longer_owns_its_record() {
    let log = IdempotencyLog::new(Arc::new(MemoryStore::new()));
    let scope = Scope::new("org", "payments.charge", "order-1").unwrap();
    let Acquire::Acquired(attempt) = log.try_acquire(&scope, 3600 * S).await.unwrap() else {
        panic!("first acquire owns the record");
    };
    let kept = log.keep_alive(&attempt);
    let lease = attempt.lease();
    assert!(
        !fires_within(kept.lost(), lease * 2).await,
        "renewed past its lease"
    );
    assert!(kept.valid_until() > tokio::time::Instant::now());
    log.finalize(&attempt, Outcome::Completed, b"done")
        .await
        .unwrap();
    assert!(
        fires_within(kept.lost(), lease).await,
        "the next renewal finds the record finalized"
    );
}
