//! Semaphores: [`Baton::semaphore`] and the types it hands out (re-exported from
//! `baton-core`).
//!
//! At most N holders of one key at a time, each holding a fenced permit that expires when
//! its holder stops renewing it; a permit is taken with [`LockOptions`](crate::lock::LockOptions)
//! and held as a [`LockGuard`](crate::lock::LockGuard). `memory://` bounds holders within the
//! process, `sqlite://` across the processes of one host (table `baton_permit` in the same
//! file), `postgres://` across hosts (table `baton_permit`, one statement per claim), and
//! `redis://` (also through Sentinel) across hosts (a sorted set of permits beside a hash of
//! their fences under the key's hash tag, one Lua script per operation).

use std::sync::Arc;

use crate::{Baton, Result};
pub use baton_core::semaphore::{
    MAX_PERMITS, PermitInfo, Semaphore, SemaphoreInfo, SemaphoreStore, check_permits,
};

impl Baton {
    /// The semaphore `key` of `permits` permits on this store, in this connection's
    /// namespace.
    ///
    /// # Errors
    /// `InvalidInput` for a bad key, or `permits` of 0 or above [`MAX_PERMITS`];
    /// `Unsupported` when the store keeps no semaphores.
    ///
    /// # Examples
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// use baton::lock::LockOptions;
    ///
    /// let baton = baton::connect("memory://").await?;
    /// // At most four report builders at once.
    /// let builders = baton.semaphore("report-builders", 4)?;
    /// let permit = builders
    ///     .acquire(&LockOptions::new(Duration::from_secs(30)).wait(Duration::from_secs(5)))
    ///     .await?;
    /// println!("building with permit {}", permit.fence());
    /// permit.release().await;
    /// # Ok(()) }
    /// ```
    pub fn semaphore(&self, key: &str, permits: u32) -> Result<Semaphore> {
        check_permits(permits)?;
        let store = Arc::clone(self.store()).semaphore_store()?;
        Semaphore::new(store, self.namespace().clone(), key, permits)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::ErrorKind;
    use crate::lock::LockOptions;

    #[tokio::test]
    async fn memory_and_sqlite_keep_semaphores_and_a_store_without_them_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let file = format!("sqlite://{}", dir.path().join("b.db").display());
        for url in ["memory://", file.as_str()] {
            let baton = crate::connect(url).await.unwrap();
            let sem = baton.semaphore("k", 1).unwrap();
            let opts = LockOptions::new(Duration::from_secs(30));
            let permit = sem.try_acquire(&opts).await.unwrap().expect("free");
            assert!(sem.try_acquire(&opts).await.unwrap().is_none(), "{url}");
            permit.release().await;
        }
        let custom = crate::testing::locks_only();
        let err = custom.semaphore("k", 1).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}");
        assert!(err.message().contains("keeps no semaphores"), "{err}");
        let err = custom.semaphore("k", 0).unwrap_err();
        assert_eq!(
            err.kind(),
            ErrorKind::InvalidInput,
            "bad input first: {err}"
        );
    }
}
