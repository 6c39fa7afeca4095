//! Health checks of a store's deployment, for `baton doctor` and for services that want the
//! same checks at start-up: [`diagnose`] returns a [`Report`] of [`Check`]s.
//!
//! Each store crate judges its own deployment (`baton_redis::doctor`,
//! `baton_postgres::doctor`, `baton_sqlite::doctor`), through the report types of
//! `baton_core::doctor`; this module picks the store by URL and checks a store without
//! checks of its own by connecting and reading once.
//!
//! Each check is `Ok`, a `Note` (worth knowing, nothing to fix: what no persistence means
//! for fences) or a `Finding` (something to fix, with the fix). A store that cannot be
//! reached is a finding too, so a report is always an answer; only a malformed URL or a
//! store this build lacks is an error.
//!
//! | store | checks |
//! |---|---|
//! | `redis://` | connect and round trip; server version, role and cluster mode; server clock against this host's; `maxmemory-policy`; persistence (`appendonly`, `appendfsync`, `save`) and what it means for exclusion and fences |
//! | `redis+cluster://` | the slot map (every slot served, `cluster_state`, failing slots, masters without a replica); then, for every master, what `redis://` checks |
//! | `sqlite://` | the file, its file system and permissions; header and schema version; the claimable-work tables (`work-schema`: present or not, since SQLite keeps no version of them); WAL mode; whether this user can take the write lock; `synchronous`; the clock (the host's: nothing to compare) |
//! | `postgres://` | connect and round trip; version, standby or read-only; server clock against this host's; baton schema version; claimable-work schema version (`work-schema`, `baton_work_schema`); whether grants are flushed before they answer (`durable-grants`: the URL's `durable_grants`, the server's `synchronous_commit` and `fsync`); a transaction-pooling proxy in front without `pooler=transaction` (a finding whatever `listen` says), or with it but without `listen_url` (a note); the pool size against the server's `max_connections` (`connections`) |
//! | `memory://` | one finding: it is process-local |
//!
//! Checking never changes the store: Redis and PostgreSQL get read commands only, and the
//! SQLite file is neither created nor written (see `baton_sqlite::doctor`). For Redis the store itself is
//! opened too, as an application would, so script loading and the release-message
//! subscription are checked (and the store's own eviction-policy event is emitted).
//!
//! # Examples
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> baton::Result<()> {
//! let report = baton::doctor::diagnose("memory://").await?;
//! assert!(!report.is_healthy());
//! for check in report.findings() {
//!     eprintln!("{}: {} (fix: {})", check.name, check.detail, check.fix.as_deref().unwrap_or("-"));
//! }
//! # Ok(()) }
//! ```

use std::time::Instant;

use baton_core::Result;
use baton_core::doctor::{self, millis};
pub use baton_core::doctor::{CLOCK_TOLERANCE, Check, Report, Verdict};

/// Checks the store named by `url` (see the [module docs](self)).
///
/// # Errors
/// `InvalidInput` for a malformed URL or an unknown scheme; `Unsupported` for a scheme this
/// build lacks. A store that cannot be reached is not an error: the report says so.
pub async fn diagnose(url: &str) -> Result<Report> {
    let scheme = url.split_once("://").map(|(s, _)| s).unwrap_or("");
    match scheme {
        "memory" => {
            crate::connect(url).await?;
            Ok(baton_core::doctor::memory(url))
        }
        #[cfg(feature = "sqlite")]
        "sqlite" => baton_sqlite::doctor::diagnose(url).await,
        #[cfg(feature = "redis")]
        "redis" | "rediss" | "redis+sentinel" | "rediss+sentinel" => {
            baton_redis::doctor::diagnose(url).await
        }
        #[cfg(feature = "redis")]
        "redis+cluster" | "rediss+cluster" => baton_redis::doctor::diagnose_cluster(url).await,
        #[cfg(feature = "postgres")]
        "postgres" | "postgresql" => baton_postgres::doctor::diagnose(url).await,
        // A store without checks of its own (or a scheme this build lacks, which
        // `connect` names) gets the generic ones. A new store adds an arm above for
        // its crate's `doctor::diagnose`, which judges the facts it reads.
        _ => generic(url).await,
    }
}

/// Connect and round trip, for a store without checks of its own.
async fn generic(url: &str) -> Result<Report> {
    let started = Instant::now();
    let baton = match crate::connect(url).await {
        Ok(baton) => baton,
        Err(e) => return doctor::unreachable(url, e),
    };
    let opened = started.elapsed();
    let started = Instant::now();
    let mut checks = Vec::new();
    match baton.locks().inspect("baton-doctor-probe").await {
        Ok(_) => checks.push(Check::ok(
            "connect",
            format!(
                "opened in {}; one read took {}",
                millis(opened),
                millis(started.elapsed())
            ),
        )),
        Err(e) => checks.push(Check::finding(
            "connect",
            format!("opened, but a read failed: {e}"),
            "check the store's health and credentials",
        )),
    }
    checks.push(Check::note(
        "store",
        format!(
            "{} stores have no checks of their own in this version of baton",
            baton.store().name()
        ),
        None,
    ));
    Ok(Report::new(url, checks))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn memory_is_a_finding() {
        let report = diagnose("memory://").await.unwrap();
        assert!(!report.is_healthy());
        assert_eq!(report.findings().count(), 1);
        assert!(report.checks[0].fix.is_some());
    }

    #[tokio::test]
    async fn bad_urls_are_errors() {
        for url in ["nonsense", "mysql://x", "sqlite://"] {
            assert!(diagnose(url).await.is_err(), "{url}");
        }
    }
}
