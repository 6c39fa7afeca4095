//! Asking Redis Sentinel where the primary is.
//!
//! A `redis+sentinel://` store asks its sentinels, in the URL's order, with
//! `SENTINEL GET-MASTER-ADDR-BY-NAME <master>`, whenever it opens a connection to the
//! primary: at connect, and again when the connection it has stops working (see
//! [`crate::endpoint`]). Each question goes on a connection of its own, opened and closed
//! for it, bounded by the store's `connect_timeout` and `response_timeout`; the sentinels
//! are asked without credentials (the URL's are the Redis servers').

use std::time::Duration;

use redis::{AsyncConnectionConfig, Client, IntoConnectionInfo};
use tokio::time::timeout;

use crate::options::RedisOptions;
use crate::url::Sentinels;

/// What one sentinel said about the primary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Answer {
    /// The primary's address, as the sentinel announces it.
    Primary(String, u16),
    /// The sentinel does not monitor a master of that name.
    Unknown,
    /// The sentinel could not be asked (why, for messages).
    Failed(String),
}

/// Asks the sentinel at `host:port` for the address of the primary of `sentinels.master`.
pub(crate) async fn ask(
    sentinels: &Sentinels,
    tls: bool,
    host: &str,
    port: u16,
    options: &RedisOptions,
) -> Answer {
    let url = Sentinels::sentinel_url(tls, host, port);
    let client = match url.as_str().into_connection_info().and_then(Client::open) {
        Ok(client) => client,
        Err(e) => return Answer::Failed(e.to_string()),
    };
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(options.get_connect_timeout()))
        .set_response_timeout(Some(options.get_response_timeout()));
    let deadline: Duration = options.call_deadline();
    let asking = async {
        let mut conn = client
            .get_multiplexed_async_connection_with_config(&config)
            .await?;
        redis::cmd("SENTINEL")
            .arg("GET-MASTER-ADDR-BY-NAME")
            .arg(&sentinels.master)
            .query_async::<Option<(String, String)>>(&mut conn)
            .await
    };
    match timeout(deadline, asking).await {
        Ok(Ok(Some((host, port)))) => match port.parse() {
            Ok(port) => Answer::Primary(host, port),
            Err(_) => Answer::Failed(format!("answered the port {port:?}")),
        },
        Ok(Ok(None)) => Answer::Unknown,
        Ok(Err(e)) => Answer::Failed(e.to_string()),
        Err(_) => Answer::Failed(format!("no answer within {deadline:?}")),
    }
}
