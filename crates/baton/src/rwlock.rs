//! Reader-writer locks: [`Baton::rwlock`] and the types it hands out (re-exported from
//! `baton-core`).
//!
//! Any number of readers of one key at a time, or one writer, with writer preference (a
//! waiting writer keeps new readers out); reads and writes are taken with
//! [`LockOptions`](crate::lock::LockOptions), a read is held as a
//! [`LockGuard`](crate::lock::LockGuard) and a write as a [`WriteGuard`]. A reader-writer
//! lock is made of the store's lock and semaphore atoms, so it works wherever both do:
//! `memory://` within the process, `sqlite://` across the processes of one host,
//! `postgres://` and `redis://` across hosts.

use std::sync::Arc;

use crate::{Baton, Key, Result};
pub use baton_core::rwlock::{RwHolders, RwLock, RwLockInfo, WriteGuard};

impl Baton {
    /// The reader-writer lock `key` on this store, in this connection's namespace.
    ///
    /// # Errors
    /// `InvalidInput` for a bad key; `Unsupported` when the store keeps no semaphores.
    ///
    /// # Examples
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// use baton::lock::LockOptions;
    ///
    /// let baton = baton::connect("memory://").await?;
    /// let model = baton.rwlock("model")?;
    /// let options = LockOptions::new(Duration::from_secs(30)).wait(Duration::from_secs(5));
    /// let reader = model.read(&options).await?;
    /// // ... read the model ...
    /// reader.release().await;
    /// let writer = model.write(&options).await?;
    /// println!("replacing the model with fence {}", writer.fence());
    /// writer.release().await;
    /// # Ok(()) }
    /// ```
    pub fn rwlock(&self, key: &str) -> Result<RwLock> {
        Key::new(key)?;
        let permits = Arc::clone(self.store()).semaphore_store()?;
        RwLock::new(
            Arc::clone(self.locks().store()),
            permits,
            self.namespace().clone(),
            key,
        )
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::ErrorKind;
    use crate::lock::LockOptions;

    #[tokio::test]
    async fn memory_and_sqlite_keep_rwlocks_and_a_store_without_semaphores_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let file = format!("sqlite://{}", dir.path().join("b.db").display());
        for url in ["memory://", file.as_str()] {
            let baton = crate::connect(url).await.unwrap();
            let rw = baton.rwlock("k").unwrap();
            let opts = LockOptions::new(Duration::from_secs(30));
            let reader = rw.try_read(&opts).await.unwrap().expect("free");
            assert!(rw.try_write(&opts).await.unwrap().is_none(), "{url}");
            reader.release().await;
            let writer = rw.try_write(&opts).await.unwrap().expect("free");
            assert!(rw.try_read(&opts).await.unwrap().is_none(), "{url}");
            writer.release().await;
        }
        let custom = crate::testing::locks_only();
        let err = custom.rwlock("k").unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}");
        assert!(err.message().contains("keeps no semaphores"), "{err}");
        let err = custom.rwlock("").unwrap_err();
        assert_eq!(
            err.kind(),
            ErrorKind::InvalidInput,
            "bad input first: {err}"
        );
    }
}
