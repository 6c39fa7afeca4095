//! Helpers shared by this crate's integration tests: private servers started by the
//! testkit, stores with test timeouts, raw connections for operator actions, captured
//! telemetry, and bounded waiting.
//!
//! Every wait here is a poll with a generous deadline, so the tests hold on a loaded 2-core
//! machine; no test asserts how fast anything happened.

#![allow(dead_code, unreachable_pub)]

use std::time::Duration;

use async_trait::async_trait;
use baton_core::{Key, KeyKind, Namespace, StoreKey};
use baton_postgres::PostgresStore;
use baton_testkit::harness::{Evictor, Opener, Stores};
use baton_testkit::postgres::PostgresServer;
use sqlx::Connection;

/// The test binary's shared server (started on first use, off the async workers).
pub async fn shared() -> &'static PostgresServer {
    blocking(PostgresServer::shared).await
}

/// A private server of this test's own, for tests that restart it or kill connections.
pub async fn private() -> PostgresServer {
    blocking(|| PostgresServer::start().expect("a private PostgreSQL server")).await
}

/// `url` with the test timeouts: generous for a loaded machine, short enough that a dead
/// server shows within seconds.
pub fn with_timeouts(url: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}connect_timeout=5s&response_timeout=5s")
}

/// A store on `url` (a bare `postgres://` URL), with the test timeouts.
pub async fn connect(url: &str) -> PostgresStore {
    PostgresStore::connect(&with_timeouts(url))
        .await
        .unwrap_or_else(|e| panic!("connect to {url}: {e}"))
}

/// The error a store on `url` (with the test timeouts) is refused with, because `why`.
pub async fn refused(url: &str, why: &str) -> baton_core::Error {
    match PostgresStore::connect(&with_timeouts(url)).await {
        Ok(_) => panic!("connect to {url} succeeded despite {why}"),
        Err(e) => e,
    }
}

/// A raw connection, as an operator's `psql` would have.
pub async fn raw(url: &str) -> sqlx::PgConnection {
    sqlx::PgConnection::connect(url)
        .await
        .expect("raw connection")
}

/// Runs `sql` (no parameters) on `conn`, as an operator would in `psql`.
pub async fn execute(conn: &mut sqlx::PgConnection, sql: &str) {
    sqlx::query(sql)
        .execute(conn)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
}

/// A raw connection in a transaction that holds the lock on `key`'s lease row, as an
/// operator's `SELECT ... FOR UPDATE` would; dropping it ends the transaction.
pub async fn row_locked(url: &str, key: &StoreKey) -> sqlx::PgConnection {
    let mut operator = raw(url).await;
    execute(&mut operator, "BEGIN").await;
    sqlx::query("SELECT 1 FROM baton_lease WHERE key = $1 FOR UPDATE")
        .bind(key.as_str())
        .execute(&mut operator)
        .await
        .unwrap_or_else(|e| panic!("lock the row of {key}: {e}"));
    operator
}

/// A namespace no other test uses, so tests may share a server.
pub fn namespace() -> Namespace {
    baton_core::conformance::fresh_namespace()
}

/// The qualified key of lock `key` in `ns`.
pub fn lock_key(ns: &Namespace, key: &str) -> StoreKey {
    ns.qualify(KeyKind::Lock, &Key::new(key).expect("a valid key"))
}

/// The qualified key of lease `key` in `ns`.
pub fn lease_key(ns: &Namespace, key: &str) -> StoreKey {
    ns.qualify(KeyKind::Lease, &Key::new(key).expect("a valid key"))
}

pub use baton_testkit::capture::*;

/// Lock `k` held through one store while a waiter on another waits for it.
#[must_use = "release it to the waiter"]
pub struct Handoff {
    /// The holder's guard.
    pub guard: baton_core::LockGuard,
    waiting: tokio::task::JoinHandle<Result<baton_core::LockGuard, baton_core::AcquireError>>,
}

impl Handoff {
    /// Releases the holder's guard and returns the waiter's grant, which must come within
    /// [`within`]'s patience; `what` says how the waiter learns of the release.
    pub async fn release_to_waiter(self, what: &str) -> baton_core::LockGuard {
        self.guard.release().await;
        within(what, self.waiting)
            .await
            .expect("the waiter panicked")
            .unwrap_or_else(|e| panic!("{what}: {e}"))
    }

    /// [`release_to_waiter`](Self::release_to_waiter), and the waiter releases too.
    pub async fn hand_over(self, what: &str) {
        self.release_to_waiter(what).await.release().await;
    }
}

/// Lock `k` held through `holder` (for ten minutes), and `waiter` waiting for it in a task
/// of its own: up to `wait`, for a grant of `ttl`.
pub async fn hold_while_waiting(
    holder: &baton_core::Locks,
    waiter: baton_core::Locks,
    ttl: Duration,
    wait: Duration,
) -> Handoff {
    let guard = holder
        .acquire("k", &baton_core::LockOptions::new(Duration::from_secs(600)))
        .await
        .expect("an uncontended acquire");
    let options = baton_core::LockOptions::new(ttl).wait(wait);
    let waiting = tokio::spawn(async move { waiter.acquire("k", &options).await });
    Handoff { guard, waiting }
}

/// The test binary's shared PgBouncer in transaction pooling mode, in front of its shared
/// server (both started on first use, off the async workers).
pub async fn transaction_pooler() -> &'static baton_testkit::pgbouncer::PgBouncer {
    blocking(|| {
        baton_testkit::pgbouncer::PgBouncer::shared(baton_testkit::pgbouncer::PoolMode::Transaction)
    })
    .await
}

/// The URL of the shared transaction pooler as a store URL (`pooler=transaction`, no
/// `listen_url`), with the test timeouts.
pub async fn pooled_url() -> String {
    with_timeouts(&format!(
        "{}?pooler=transaction",
        transaction_pooler().await.url()
    ))
}

/// A store through the shared transaction pooler.
pub async fn pooled() -> PostgresStore {
    let url = pooled_url().await;
    PostgresStore::connect(&url)
        .await
        .unwrap_or_else(|e| panic!("connect to {url}: {e}"))
}

/// Opens stores on the test binary's shared server; evicts a grant by deleting its row with
/// a connection of its own, as an operator in `psql` would (the fence sequence keeps the next
/// grant's fence above it).
pub struct SharedServer;

#[async_trait]
impl Opener for SharedServer {
    type Store = PostgresStore;

    /// A new `PostgresStore` (new pool, new LISTEN connection) on the shared server.
    async fn open(&self) -> PostgresStore {
        connect(&shared().await.url()).await
    }
}

#[async_trait]
impl Evictor for SharedServer {
    async fn evict(&self, key: &StoreKey) {
        evict(key).await
    }
}

/// Deletes `key`'s grant row on the shared server with a connection of its own.
pub async fn evict(key: &StoreKey) {
    {
        let mut conn = raw(&shared().await.url()).await;
        let deleted = sqlx::query("DELETE FROM baton_lease WHERE key = $1")
            .bind(key.as_str())
            .execute(&mut conn)
            .await
            .expect("operator delete")
            .rows_affected();
        assert_eq!(deleted, 1, "nothing to evict at {key}");
    }
}

/// The conformance harness on the shared server.
pub async fn harness() -> Stores<SharedServer> {
    Stores::new(SharedServer)
}

/// Opens stores through the shared transaction pooler; evicts on the server behind it.
pub struct Pooler;

#[async_trait]
impl Opener for Pooler {
    type Store = PostgresStore;

    async fn open(&self) -> PostgresStore {
        pooled().await
    }
}

#[async_trait]
impl Evictor for Pooler {
    async fn evict(&self, key: &StoreKey) {
        evict(key).await
    }
}

/// The conformance harness through the shared transaction pooler.
pub async fn pooled_harness() -> Stores<Pooler> {
    Stores::new(Pooler)
}
