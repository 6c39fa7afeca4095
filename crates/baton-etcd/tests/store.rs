//! The etcd store through the facade: `baton::connect` opens `etcd://` URLs, offers
//! semaphores (so reader-writer locks), broadcast, the cache and idempotency records, and
//! refuses every capability it lacks when asked for, with the reason.

mod common;

use std::time::Duration;

use baton::ErrorKind;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_opens_etcd_urls_and_refuses_what_it_lacks() {
    let cluster = common::cluster().await;
    let baton = baton::connect(&cluster.url()).await.expect("etcd:// opens");
    assert_eq!(baton.store().name(), "etcd");
    let guard = baton
        .locks()
        .acquire(
            "facade",
            &baton::lock::LockOptions::new(Duration::from_secs(5)),
        )
        .await
        .unwrap();
    assert!(guard.fence().get() > 0);
    guard.release().await;

    let cache = baton.cache().expect("a cache on etcd");
    cache
        .set("facade", &7u32, Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(cache.get::<u32>("facade").await.unwrap(), Some(7));
    let store = baton.store().clone();
    let e = store.clone().rate_store().expect_err("refused");
    assert!(
        e.message()
            .contains("etcd has none that a transaction can read"),
        "{e}"
    );
    let e = store.clone().work_store().expect_err("refused");
    assert_eq!(e.kind(), ErrorKind::Unsupported, "{e}");
    assert!(
        e.message()
            .starts_with("the etcd store keeps no claimable work"),
        "{e}"
    );
    let log = baton.idempotency().expect("idempotency records on etcd");
    let scope = baton::idempotency::Scope::new("org", "facade", "k").unwrap();
    assert!(
        log.try_acquire(&scope, Duration::from_secs(60))
            .await
            .unwrap()
            .is_acquired()
    );
    let permits = baton.semaphore("facade", 2).expect("semaphores on etcd");
    let permit = permits
        .try_acquire(&baton::lock::LockOptions::new(Duration::from_secs(5)))
        .await
        .unwrap()
        .expect("a free permit");
    permit.release().await;
    assert!(baton::store::check_url(&cluster.url()).is_ok());
    let e = baton::store::check_url("etcd://u:hunter2@h:0").unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput);
    assert!(!e.message().contains("hunter2"), "{e}");
}
