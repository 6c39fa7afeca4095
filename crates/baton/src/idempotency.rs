//! The idempotency log: [`Baton::idempotency`] and the types it hands out (re-exported from
//! `baton-core`).
//!
//! Every store baton opens by URL keeps idempotency records: `memory://` in the process,
//! `sqlite://` in the same file as its locks and `postgres://` in the same database (table
//! `baton_idempotency` in both), `redis://` as one hash per record. A store of your own
//! ([`Baton::from_store`]) that keeps none says so when the log is asked for.

use std::sync::Arc;

use crate::{Baton, Result};
pub use baton_core::idempotency::*;

impl Baton {
    /// The idempotency log of this store, in this connection's namespace: "don't run this
    /// side effect twice for `(org, domain, key)`". See
    /// [`IdempotencyLog`] and `docs/idempotency.md`.
    ///
    /// Cheap: every call hands out a client of the same records (for `memory://`, the
    /// records live as long as the memory store does).
    ///
    /// # Errors
    /// `Unsupported` when the store keeps no idempotency records (a store of your own given
    /// to [`Baton::from_store`] that offers none).
    ///
    /// # Examples
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// use baton::idempotency::{Acquire, Outcome, Scope};
    ///
    /// let baton = baton::connect("memory://").await?;
    /// let log = baton.idempotency()?;
    /// let scope = Scope::new("org-42", "webhooks.stripe", "evt_1NG8Du2eZvKYlo2C")?;
    /// if let Acquire::Acquired(attempt) = log.try_acquire(&scope, Duration::from_secs(3 * 86_400)).await? {
    ///     // apply the event, then:
    ///     log.finalize(&attempt, Outcome::Completed, b"").await?;
    /// }
    /// # Ok(()) }
    /// ```
    pub fn idempotency(&self) -> Result<IdempotencyLog> {
        let store = Arc::clone(self.store()).idempotency_store()?;
        Ok(IdempotencyLog::with_namespace(
            store,
            self.namespace().clone(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use baton_core::idempotency::{Acquire, Scope};

    #[tokio::test]
    async fn memory_logs_of_one_store_share_records_and_other_stores_do_not() {
        let baton = crate::connect("memory://").await.unwrap();
        let scope = Scope::new("o", "d", "k").unwrap();
        let ttl = Duration::from_secs(60);
        let first = baton
            .idempotency()
            .unwrap()
            .try_acquire(&scope, ttl)
            .await
            .unwrap();
        assert!(first.is_acquired());
        let again = baton
            .clone()
            .idempotency()
            .unwrap()
            .try_acquire(&scope, ttl)
            .await
            .unwrap();
        assert!(
            matches!(again, Acquire::Duplicate(_)),
            "same store, same records"
        );
        let other = crate::connect("memory://").await.unwrap();
        assert!(
            other
                .idempotency()
                .unwrap()
                .try_acquire(&scope, ttl)
                .await
                .unwrap()
                .is_acquired()
        );
    }

    #[tokio::test]
    async fn a_custom_store_has_no_idempotency_log() {
        let baton = crate::testing::locks_only();
        let e = baton.idempotency().unwrap_err();
        assert_eq!(e.kind(), baton_core::ErrorKind::Unsupported);
        assert!(e.message().contains("custom"), "{e}");
    }
}
