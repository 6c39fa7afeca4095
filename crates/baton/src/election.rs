//! Leader election: [`Baton::election`] and the types it hands out (re-exported from
//! `baton-core`).
//!
//! At most one leader of a name at a time, elected by [`Election::campaign`]; its
//! [`Leadership`] has the term (a fence strictly increasing across leaders), the lost
//! signal, `valid_until`, [`Leadership::proclaim`] and [`Leadership::resign`]. Everyone
//! else reads the leader with [`Election::leader`] or follows it with
//! [`Election::observe`]. Every store baton ships keeps elections: observers are pushed
//! notices on `memory://`, `redis://` and `postgres://`, and poll on `sqlite://`.

use std::sync::Arc;

use crate::{Baton, Result};
pub use baton_core::election::{
    Election, Leader, Leadership, MAX_CANDIDATE_BYTES, MAX_VALUE_BYTES, Observer, check_candidate,
    check_value,
};

impl Baton {
    /// The election `name` on this store, in this connection's namespace.
    ///
    /// # Errors
    /// `InvalidInput` for a bad name.
    ///
    /// # Examples
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// use baton::lock::LockOptions;
    /// # async fn run_the_scheduler(_term: u64) {}
    ///
    /// let baton = baton::connect("memory://").await?;
    /// let election = baton.election("scheduler")?;
    /// let options = LockOptions::new(Duration::from_secs(15)).keep_alive(Duration::from_secs(5));
    /// // Blocks until this replica is the leader.
    /// let leadership = election.campaign("pod-a", "10.0.0.7:8080", &options).await?;
    /// tokio::select! {
    ///     () = run_the_scheduler(leadership.term().get()) => {}
    ///     _ = leadership.lost() => { /* another replica may lead now: stop */ }
    /// }
    /// leadership.resign().await;
    /// # Ok(()) }
    /// ```
    pub fn election(&self, name: &str) -> Result<Election> {
        Election::new(Arc::clone(self.store()), self.namespace().clone(), name)
    }
}
