//! [`Migration`]: one step a [`Migrations`](super::Migrations) coordinator runs, with its
//! optional undo; [`MigrationFn`] makes one from closures; [`MigrationContext`] is what
//! `up()` and `down()` are told.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use async_trait::async_trait;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

use crate::work::store::MigrationState;

/// The error a migration step returns: anything that is an error.
pub type MigrationError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// One data migration: a name unique within its set, `up()`, and optionally `down()` to
/// undo a failed `up()`.
///
/// `up()` runs at least once and, barring a crash or a store fault, exactly once per set: a
/// writer that dies in the middle leaves the record pending, and once its lease lapses
/// another writer runs `up()` again; a run whose result could not be recorded (the store
/// was down) runs it again when it retries ([`MigrationContext::is_takeover`] either way).
/// Write it so that a second run after a partial first one is safe (idempotent steps, or
/// checks of what is already done).
#[async_trait]
pub trait Migration: Send + Sync + 'static {
    /// The migration's name, unique within its set (records are keyed by it; order comes
    /// from the order of [`Migrations::migration`](super::Migrations::migration)).
    fn name(&self) -> &str;

    /// Applies the migration.
    async fn up(&self, context: &MigrationContext) -> Result<(), MigrationError>;

    /// Whether [`down`](Migration::down) can undo a failed `up()`. `false` by default: a
    /// failed `up()` is then recorded as `failed`.
    fn reversible(&self) -> bool {
        false
    }

    /// Undoes what a failed `up()` did; called only when [`reversible`](Migration::reversible).
    async fn down(&self, context: &MigrationContext) -> Result<(), MigrationError> {
        let _ = context;
        Err("this migration has no down()".into())
    }
}

/// What `up()` and `down()` are told: which migration, which attempt, and a signal that
/// fires when the writer lost its record. Cheap to clone.
#[derive(Clone, Debug)]
pub struct MigrationContext {
    inner: Arc<ContextInner>,
}

#[derive(Debug)]
struct ContextInner {
    name: String,
    attempt: u32,
    previous: Option<MigrationState>,
    lost: CancellationToken,
}

impl MigrationContext {
    pub(crate) fn new(
        name: &str,
        attempt: u32,
        previous: Option<MigrationState>,
        lost: CancellationToken,
    ) -> Self {
        MigrationContext {
            inner: Arc::new(ContextInner {
                name: name.to_owned(),
                attempt,
                previous,
                lost,
            }),
        }
    }

    /// The migration's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The claim number of the record, from 1 (runs of earlier boots and takeovers count).
    pub fn attempt(&self) -> u32 {
        self.inner.attempt
    }

    /// The state the record was in before this claim: `None` for the first run, `Failed` or
    /// `RolledBack` for a retry, `Pending` for a takeover (of a writer whose lease lapsed, or
    /// of this run's own attempt that a store fault cut short).
    pub fn previous(&self) -> Option<MigrationState> {
        self.inner.previous
    }

    /// Whether this run takes over from a writer that stopped in the middle (its lease
    /// lapsed, or it was this run, retrying after a store fault): part of `up()` may
    /// already have run.
    pub fn is_takeover(&self) -> bool {
        self.inner.previous == Some(MigrationState::Pending)
    }

    /// Resolves when the writer lost its record (its heartbeats stopped landing and another
    /// writer took over): stop, and make no further changes. An owned future, as every lost
    /// signal in baton: await it, or make it a `tokio::select!` branch.
    pub fn lost(&self) -> WaitForCancellationFutureOwned {
        self.inner.lost.clone().cancelled_owned()
    }

    /// The lost signal as a [`CancellationToken`], to hand to code that takes one (a child
    /// of the record's own: cancelling it changes nothing for the run).
    pub fn lost_token(&self) -> CancellationToken {
        self.inner.lost.child_token()
    }

    /// Whether [`lost`](MigrationContext::lost) has fired.
    pub fn is_lost(&self) -> bool {
        self.inner.lost.is_cancelled()
    }
}

type StepFn = dyn Fn(MigrationContext) -> Pin<Box<dyn Future<Output = Result<(), MigrationError>> + Send>>
    + Send
    + Sync;

/// A [`Migration`] made of closures.
///
/// # Examples
/// ```
/// use baton_core::work::{MigrationContext, MigrationFn};
///
/// let add_column = MigrationFn::new("2024-06-add-email-column", |_ctx: MigrationContext| async {
///     // ALTER TABLE users ADD COLUMN IF NOT EXISTS email text
///     Ok(())
/// })
/// .down(|_ctx: MigrationContext| async {
///     // ALTER TABLE users DROP COLUMN IF EXISTS email
///     Ok(())
/// });
/// # let _ = add_column;
/// ```
#[must_use]
pub struct MigrationFn {
    name: String,
    up: Arc<StepFn>,
    down: Option<Arc<StepFn>>,
}

impl fmt::Debug for MigrationFn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MigrationFn")
            .field("name", &self.name)
            .field("reversible", &self.down.is_some())
            .finish()
    }
}

fn step<F, Fut>(f: F) -> Arc<StepFn>
where
    F: Fn(MigrationContext) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), MigrationError>> + Send + 'static,
{
    Arc::new(move |ctx| Box::pin(f(ctx)))
}

impl MigrationFn {
    /// A migration named `name` whose `up()` is `up`, without `down()`.
    pub fn new<F, Fut>(name: impl Into<String>, up: F) -> Self
    where
        F: Fn(MigrationContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), MigrationError>> + Send + 'static,
    {
        MigrationFn {
            name: name.into(),
            up: step(up),
            down: None,
        }
    }

    /// The same, with `down()` to undo a failed `up()`.
    pub fn down<F, Fut>(mut self, down: F) -> Self
    where
        F: Fn(MigrationContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), MigrationError>> + Send + 'static,
    {
        self.down = Some(step(down));
        self
    }
}

#[async_trait]
impl Migration for MigrationFn {
    fn name(&self) -> &str {
        &self.name
    }

    async fn up(&self, context: &MigrationContext) -> Result<(), MigrationError> {
        (self.up)(context.clone()).await
    }

    fn reversible(&self) -> bool {
        self.down.is_some()
    }

    async fn down(&self, context: &MigrationContext) -> Result<(), MigrationError> {
        match &self.down {
            Some(down) => down(context.clone()).await,
            None => Err("this migration has no down()".into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn the_lost_signal_is_a_future_and_a_token_like_every_other() {
        let record = CancellationToken::new();
        let ctx = MigrationContext::new("001", 1, None, record.clone());
        let token = ctx.lost_token();
        token.cancel();
        assert!(
            !ctx.is_lost(),
            "cancelling the handed-out token changes nothing for the run"
        );

        let lost = tokio::spawn(ctx.lost());
        record.cancel();
        tokio::time::timeout(Duration::from_secs(5), lost)
            .await
            .expect("lost resolves once the record is lost")
            .unwrap();
        assert!(ctx.is_lost() && ctx.lost_token().is_cancelled());
    }
}
