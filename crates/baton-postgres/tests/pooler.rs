//! Every capability of the PostgreSQL store through PgBouncer in transaction pooling mode
//! (`pool_mode = transaction`), where a server connection belongs to a client for one
//! transaction only: the lock and lease conformance rules, the limiter, the cache, the
//! idempotency log, semaphores, reader-writer locks and claimable work (queue, scheduler,
//! migrations), each rule in a fresh namespace, on one private pooler in front of the test
//! binary's shared server.
//!
//! Stores are opened with `pooler=transaction` and no `listen_url`, so waiters poll; the
//! wake-ups through a direct `listen_url` have tests of their own in `pooler_limits.rs`.
//! Operator actions (`evict`) go straight to the server, as an operator's `psql` would.

mod common;

mod locks {
    use super::common;

    baton_core::conformance_tests!(common::pooled_harness());
}

mod limit {
    use super::common;

    baton_core::rate_limit_conformance_tests!(common::pooled_harness());
}

mod cache {
    use super::common;

    baton_core::cache_conformance_tests!(common::pooled_harness());
}

mod idempotency {
    use super::common;

    baton_core::idempotency_conformance_tests!(common::pooled_harness());
}

mod semaphore {
    use super::common;

    baton_core::semaphore_conformance_tests!(common::pooled_harness());
}

mod election {
    use super::common;

    baton_core::election_conformance_tests!(common::pooled_harness());
}

mod rwlock {
    use super::common;

    baton_core::rwlock_conformance_tests!(common::pooled_harness());
}

mod work {
    use std::sync::Arc;

    use async_trait::async_trait;
    use baton_core::conformance::Opens;
    use baton_core::work::store::WorkStore;

    use super::common;

    /// Every `open` is a new store (its own pool), as another replica would be.
    struct PooledHarness;

    #[async_trait]
    impl Opens<dyn WorkStore> for PooledHarness {
        async fn open(&self) -> Arc<dyn WorkStore> {
            Arc::new(common::pooled().await)
        }
    }

    async fn pooled() -> PooledHarness {
        PooledHarness
    }

    baton_core::work_conformance_tests!(pooled());
}
