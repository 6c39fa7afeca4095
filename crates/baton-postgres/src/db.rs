//! The pool and the one way every statement is run: within the call deadline, retried on a
//! new connection when the pooled one had broken.

use std::future::Future;

use baton_core::Result;
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;
use tokio::time::timeout;

use crate::error::{is_broken_connection, sql_error, timed_out};
use crate::options::PostgresOptions;
use crate::url::Target;

/// A store's pool, the server it talks to (redacted) and its options. Cheap to clone.
#[derive(Debug, Clone)]
pub(crate) struct Db {
    pub(crate) pool: PgPool,
    pub(crate) server: String,
    pub(crate) options: PostgresOptions,
}

impl Db {
    /// A pool that connects on first use. Connections are not tested before each use (that
    /// would double every round trip): a connection that broke while idle fails its
    /// statement at once, and [`Db::call`] tries again on another.
    pub(crate) fn new(target: &Target, options: PostgresOptions) -> Self {
        let pool = PgPoolOptions::new()
            .max_connections(options.get_max_connections())
            .min_connections(0)
            .acquire_timeout(options.get_connect_timeout())
            .test_before_acquire(false)
            .connect_lazy_with(target.connect.clone());
        Db {
            pool,
            server: target.redacted.clone(),
            options,
        }
    }

    /// Runs `attempt` and returns its answer within `connect_timeout + response_timeout`.
    ///
    /// An attempt that failed because its connection was broken (the server restarted, the
    /// connection was terminated) is tried again on another connection, as often as the
    /// pool has connections that may be stale, within the same deadline. A broken attempt
    /// may or may not have run on the server: the later answer is taken only if
    /// `trust_retry` says it means the same either way (always, for idempotent statements);
    /// otherwise the first error stands.
    pub(crate) async fn call<T, F, Fut>(
        &self,
        what: impl Fn() -> String,
        attempt: F,
        trust_retry: impl Fn(&T) -> bool,
    ) -> Result<T>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<T, sqlx::Error>>,
    {
        let deadline = self.options.call_deadline();
        let tries = self.options.get_max_connections() + 1;
        let attempts = async {
            let first = match attempt().await {
                Err(e) if is_broken_connection(&e) => e,
                answer => return answer,
            };
            let mut last = None;
            for _ in 0..tries {
                match attempt().await {
                    Ok(answer) if trust_retry(&answer) => return Ok(answer),
                    Ok(_) => return Err(first),
                    Err(e) if is_broken_connection(&e) => last = Some(e),
                    Err(e) => return Err(e),
                }
            }
            Err(last.unwrap_or(first))
        };
        match timeout(deadline, attempts).await {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(e)) => Err(sql_error(e, &what(), &self.server)),
            Err(_) => Err(timed_out(&what(), &self.server, deadline)),
        }
    }
}
