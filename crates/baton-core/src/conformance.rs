//! The conformance kit: what every primitive's suite shares, and the lock and lease suite.
//!
//! Each primitive keeps its rules beside its code (`lease/conformance.rs` for locks and
//! leases, `limit/conformance.rs`, `cache/conformance.rs`, ...); a store's test target
//! implements that suite's harness and expands its macro
//! ([`conformance_tests!`](crate::conformance_tests),
//! [`work_conformance_tests!`](crate::work_conformance_tests), ...), which generates one
//! `#[tokio::test]` per rule. Every rule uses a [fresh namespace](fresh_namespace), so the
//! rules may share a server. [`Faulty`] wraps a store for the rules about misbehaving stores.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::time::{Instant, sleep};

use crate::error::{Error, Result};
use crate::key::Namespace;

pub use crate::lease::conformance::*;

/// The harness of a suite whose rules only open the store (the cache, rate limits, broadcast
/// and claimable work): what a store's test target provides, as that suite's atom trait `S`.
/// Each suite names it for its trait ([`CacheHarness`](crate::cache::conformance::CacheHarness),
/// [`WorkHarness`](crate::work::conformance::WorkHarness), ...).
#[async_trait::async_trait]
pub trait Opens<S: ?Sized>: Send + Sync + 'static {
    /// The store under test. Every call within one harness reaches the same data.
    async fn open(&self) -> Arc<S>;
}

/// A namespace no other test uses.
pub fn fresh_namespace() -> Namespace {
    Namespace::new(format!("t{:016x}", rand::random::<u64>())).expect("valid namespace")
}

/// `n` milliseconds.
pub(crate) fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Waits until `cond` holds, polling; panics after `limit`.
pub(crate) async fn eventually<F, Fut>(limit: Duration, what: &str, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    while !cond().await {
        assert!(
            start.elapsed() < limit,
            "{what} did not happen within {limit:?}"
        );
        sleep(ms(10)).await;
    }
}

/// A store wrapper for the rules about misbehaving stores: counts calls and, while failing,
/// answers every call with `Unavailable` without reaching the store. Each suite names it for
/// its store trait (e.g. [`FaultyCacheStore`](crate::cache::conformance::FaultyCacheStore)).
#[derive(Debug)]
pub struct Faulty<S: ?Sized> {
    pub(crate) inner: Arc<S>,
    failing: AtomicBool,
    calls: AtomicUsize,
}

impl<S: ?Sized> Faulty<S> {
    /// Wraps `inner`.
    pub fn new(inner: Arc<S>) -> Self {
        Faulty {
            inner,
            failing: AtomicBool::new(false),
            calls: AtomicUsize::new(0),
        }
    }

    /// While `true`, every call fails with `Unavailable` without reaching the store.
    pub fn set_failing(&self, failing: bool) {
        self.failing.store(failing, Ordering::SeqCst);
    }

    /// Calls made so far, of any operation.
    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    /// Counts a call; `Unavailable` while failing.
    pub(crate) fn enter(&self) -> Result<()> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        if self.failing.load(Ordering::SeqCst) {
            return Err(Error::unavailable("injected fault"));
        }
        Ok(())
    }
}
