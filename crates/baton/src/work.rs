//! Claimable work: [`Baton::queue`], [`Baton::scheduler`], [`Baton::migrations`] and the
//! types they hand out (re-exported from `baton-core`).
//!
//! Work lives in rows that one conditional statement claims, so it needs a store with
//! transactions over rows: `sqlite://` (tables in the same file as the locks),
//! `postgres://` (tables in the same database, claimed with `FOR UPDATE SKIP LOCKED`) and
//! `memory://` (in the process, for tests). Redis keeps no claimable work: a Redis
//! restart without persistence would lose queued items silently, which is the failure this
//! module exists to prevent. The user guide page is `docs/work.md`.

use std::sync::Arc;

use crate::{Baton, Result};
pub use baton_core::work::*;

impl Baton {
    /// The claimable-work atoms of this store (queues, schedules, migration records).
    ///
    /// # Errors
    /// `Unsupported` for a store that keeps no claimable work (Redis, or a store of your
    /// own given to [`Baton::from_store`] that offers none).
    pub fn work_store(&self) -> Result<Arc<dyn WorkStore>> {
        Arc::clone(self.store()).work_store()
    }

    /// The queue `name` in this connection's namespace, with the default options. See
    /// [`Queue`] and `docs/work.md`.
    ///
    /// # Errors
    /// `InvalidInput` for a bad name; `Unsupported` as for [`Baton::work_store`].
    ///
    /// # Examples
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use baton::work::EnqueueOptions;
    ///
    /// let baton = baton::connect("memory://").await?;
    /// let emails = baton.queue("emails")?;
    /// emails.enqueue(br#"{"to":"a@example.com"}"#, EnqueueOptions::dedup("signup-42")).await?;
    /// for item in emails.claim(10).await? {
    ///     // send it, then:
    ///     item.complete().await?;
    /// }
    /// # Ok(()) }
    /// ```
    pub fn queue(&self, name: &str) -> Result<Queue> {
        let store: Arc<dyn QueueStore> = self.work_store()?;
        Queue::with_namespace(store, self.namespace().clone(), name)
    }

    /// A scheduler over this store's schedule rows, in this connection's namespace: every
    /// due tick of a registered cron entry runs on exactly one replica. See [`Scheduler`].
    ///
    /// # Errors
    /// `Unsupported` as for [`Baton::work_store`].
    pub fn scheduler(&self) -> Result<Scheduler> {
        let store: Arc<dyn ScheduleStore> = self.work_store()?;
        Ok(Scheduler::with_namespace(store, self.namespace().clone()))
    }

    /// The boot-migration coordinator of the migration set `set`: an orchestration lock
    /// over this connection's locks plus one record per migration. See [`Migrations`].
    ///
    /// # Errors
    /// `InvalidInput` for a bad set name; `Unsupported` as for [`Baton::work_store`].
    pub fn migrations(&self, set: &str) -> Result<Migrations> {
        let store: Arc<dyn MigrationStore> = self.work_store()?;
        Migrations::new(store, self.locks().clone(), set)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn memory_queues_of_one_store_share_items_and_other_stores_do_not() {
        let baton = crate::connect("memory://").await.unwrap();
        let added = baton
            .queue("q")
            .unwrap()
            .enqueue(b"x", EnqueueOptions::dedup("r-1"))
            .await
            .unwrap();
        assert!(added.is_added());
        let again = baton
            .clone()
            .queue("q")
            .unwrap()
            .enqueue(b"x", EnqueueOptions::dedup("r-1"))
            .await
            .unwrap();
        assert!(!again.is_added(), "same store, same dedup ids");
        let other = crate::connect("memory://").await.unwrap();
        assert!(
            other
                .queue("q")
                .unwrap()
                .claim(10)
                .await
                .unwrap()
                .is_empty()
        );
        assert_eq!(baton.queue("q").unwrap().claim(10).await.unwrap().len(), 1);
    }

    #[tokio::test]
    async fn bad_names_are_input_errors_and_custom_stores_are_unsupported() {
        let baton = crate::connect("memory://").await.unwrap();
        let error = baton.queue("").unwrap_err();
        assert!(error.is_invalid_input(), "{error}");
        let custom = crate::testing::locks_only();
        let error = custom.queue("q").unwrap_err();
        assert_eq!(error.kind(), baton_core::ErrorKind::Unsupported, "{error}");
        assert!(error.message().contains("sqlite://"), "{error}");
        assert!(custom.scheduler().is_err() && custom.migrations("app").is_err());
    }
}
