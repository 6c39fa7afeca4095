//! The pool the hand-written baselines run their SQL on: plain sqlx, as a careful user would
//! open it, with as many connections as the store it is compared with.

use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

/// A pool of `size` connections on `url`, named `baton-bench-raw` in `pg_stat_activity`.
pub(crate) async fn raw_pool(url: &str, size: u32) -> PgPool {
    PgPoolOptions::new()
        .max_connections(size)
        .test_before_acquire(false)
        .connect_with(
            url.parse::<PgConnectOptions>()
                .expect("url")
                .application_name("baton-bench-raw"),
        )
        .await
        .expect("the baseline pool")
}
