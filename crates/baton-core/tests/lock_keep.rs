//! A lock kept until its TTL ends is quiet in telemetry: one debug event, no
//! `baton.lock.lost` (an ERROR with an alarm) when the grant then expires.

use std::sync::Arc;
use std::time::Duration;

use baton_core::telemetry::events;
use baton_core::{LockOptions, Locks, MemoryStore, Ttl};
use baton_testkit::capture::{capture_events, events as captured, wait_for_event};

#[tokio::test]
async fn keeping_a_lock_until_expiry_emits_no_lost_event() {
    capture_events();
    let locks = Locks::new(Arc::new(MemoryStore::new()));
    let ms = Duration::from_millis;
    for (key, keep_alive) in [("kept-plain", None), ("kept-renewed", Some(ms(60)))] {
        let mut options = LockOptions::new(ms(200));
        if let Some(interval) = keep_alive {
            options = options.keep_alive(interval);
        }
        let guard = locks.acquire(key, &options).await.unwrap();
        let stored = format!("baton:lock:{key}");
        let handle = guard.handle();
        guard.keep_until_expiry();
        wait_for_event(&events::LOCK_KEPT_UNTIL_EXPIRY, |c| c.key == stored).await;
        // Past the TTL, and past when a watchdog would have fired.
        tokio::time::sleep(ms(400)).await;
        assert!(locks.inspect(key).await.unwrap().is_none(), "expired");
        assert!(!handle.is_lost());
        let lost = captured(&events::LOCK_LOST, |c| c.key == stored);
        assert!(lost.is_empty(), "{key}: {lost:?}");
        let dropped = captured(&events::LOCK_DROPPED_UNRELEASED, |c| c.key == stored);
        assert!(
            dropped.is_empty(),
            "{key}: nothing was released: {dropped:?}"
        );
    }

    let guard = locks
        .acquire("kept-for", &LockOptions::new(Duration::from_secs(30)))
        .await
        .unwrap();
    guard.keep_for(Ttl::new(ms(100)).unwrap()).await;
    tokio::time::sleep(ms(300)).await;
    assert!(locks.inspect("kept-for").await.unwrap().is_none());
    assert!(captured(&events::LOCK_LOST, |c| c.key == "baton:lock:kept-for").is_empty());
}
