//! Recorded-history tests of locks over the in-memory store: many contenders on one key,
//! every acquire, release and fenced write recorded, and the history checked for
//! overlapping holders, fence order, stale writes and lost or doubled effects.

use std::sync::Arc;
use std::time::Duration;

use baton_core::store::{Claim, HolderInfo, LeaseRequest, LeaseStore, Release, Renewal, Wakeups};
use baton_core::{Fence, Holder, Locks, MemoryStore, Result, StoreKey, Ttl};
use baton_testkit::LockWorkload;
use baton_testkit::check::{self, Rule};

const CONTENDERS: u32 = 8;
const ROUNDS: u32 = 25;

fn locks() -> Locks {
    Locks::new(Arc::new(MemoryStore::new()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_contenders_on_one_key_keep_every_rule() {
    let (report, recorder, register) = LockWorkload::new("history")
        .contenders(CONTENDERS, 0)
        .rounds(ROUNDS)
        .run_recorded(&locks())
        .await;

    let wanted = u64::from(CONTENDERS * ROUNDS);
    report.assert_every_round_held(wanted);
    LockWorkload::assert_every_grant_landed(&recorder.history(), &register, wanted);
}

/// Holders that overstay their TTL (as a paused process would) lose the lock to the next
/// contender; their believed window ends at `valid_until`, the next grant has a larger
/// fence, and their late writes are rejected by the register rather than accepted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holders_that_overstay_their_ttl_are_fenced_off() {
    let (report, recorder, _) = LockWorkload::new("overstay")
        .contenders(CONTENDERS, 0)
        .rounds(6)
        .ttl(Duration::from_millis(40))
        .overstay(3, Duration::from_millis(80))
        .run_recorded(&locks())
        .await;

    report.assert_no_errors();
    check::assert_clean(&check::all(&recorder.history()));
    assert_eq!(report.grants, u64::from(CONTENDERS * 6), "{report:?}");
    assert!(
        report.expired > 0,
        "no holder overstayed its TTL: {report:?}"
    );
}

/// A store that grants every claim, to show that the checkers see what they are for.
#[derive(Debug, Default)]
struct GrantsEveryone {
    inner: MemoryStore,
    fences: std::sync::atomic::AtomicU64,
}

#[async_trait::async_trait]
impl LeaseStore for GrantsEveryone {
    async fn claim(&self, _key: &StoreKey, _request: LeaseRequest<'_>) -> Result<Claim> {
        let fence = self
            .fences
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst)
            / 2
            + 1;
        // Every second grant repeats the fence before it.
        Ok(Claim::Granted {
            fence: Fence::new(fence),
        })
    }
    async fn renew(&self, _: &StoreKey, _: &Holder, _: Ttl) -> Result<Renewal> {
        Ok(Renewal::Renewed)
    }
    async fn release(&self, _: &StoreKey, _: &Holder) -> Result<Release> {
        Ok(Release::Removed)
    }
    async fn inspect(&self, key: &StoreKey) -> Result<Option<HolderInfo>> {
        self.inner.inspect(key).await
    }
    async fn list(&self, prefix: &str, limit: usize) -> Result<Vec<HolderInfo>> {
        self.inner.list(prefix, limit).await
    }
    fn wakeups(&self) -> Wakeups {
        self.inner.wakeups()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_checkers_catch_a_store_that_grants_everyone() {
    let (report, recorder, _) = LockWorkload::new("broken")
        .contenders(CONTENDERS, 0)
        .rounds(3)
        .hold(Duration::from_millis(20), Duration::from_millis(1))
        .run_recorded(&Locks::new(Arc::new(GrantsEveryone::default())))
        .await;
    assert_eq!(report.grants, u64::from(CONTENDERS * 3));

    let rules: Vec<Rule> = check::all(&recorder.history())
        .iter()
        .map(|v| v.rule)
        .collect();
    assert!(rules.contains(&Rule::Overlap), "{rules:?}");
    assert!(rules.contains(&Rule::DuplicateFence), "{rules:?}");
}
