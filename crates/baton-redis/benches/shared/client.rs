//! The client the hand-written baselines use: configured as the store configures its own
//! (the `redis` crate's `ConnectionManager`, one multiplexed connection, `TCP_NODELAY`, the
//! same timeouts, no retries), so a baseline differs from the store only in what baton adds.

use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::io::tcp::TcpSettings;
use redis::{Client, IntoConnectionInfo};

/// Connects to `url` as the store does, with `timeout` to connect and per response.
pub(crate) async fn connect_as_the_store(url: &str, timeout: Duration) -> ConnectionManager {
    let info = url
        .into_connection_info()
        .expect("a redis URL")
        .set_tcp_settings(TcpSettings::default().set_nodelay(true));
    let client = Client::open(info).expect("a redis client");
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(timeout))
        .set_response_timeout(Some(timeout))
        .set_number_of_retries(0);
    ConnectionManager::new_with_config(client, config)
        .await
        .expect("connect to the benchmark's redis-server")
}
