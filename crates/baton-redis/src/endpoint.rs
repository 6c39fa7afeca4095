//! Where the store's connections go: [`Endpoint`].
//!
//! A `redis://` URL names one server: every connection goes there, and the redis client
//! reconnects to it by itself. A `redis+sentinel://` URL names sentinels: every connection
//! the store opens goes to the primary they name at that moment ([`crate::sentinel`]).
//!
//! ## Behavior
//! - Opening the store's multiplexed connection ([`Endpoint::open`]) loads the lock scripts,
//!   reads the server's facts and refuses a server that reports itself a replica
//!   (`role:slave` in `INFO replication`): it refuses writes, and through Sentinel it may be
//!   the old primary that has not heard of the failover. With Sentinel the next sentinel's
//!   answer is tried then.
//! - Pub/sub connections ([`Endpoint::client`]) go to the first primary the sentinels name;
//!   they are not checked (a subscribed connection cannot run `INFO`), and their tasks
//!   reconnect when the store's connection has followed the primary elsewhere.

use std::sync::Arc;

use baton_core::{Error, Result};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::io::tcp::TcpSettings;
use redis::{Client, IntoConnectionInfo, RedisError};
use tokio::time::timeout;

use crate::error::{redis_error, timed_out};
use crate::options::RedisOptions;
use crate::scripts::SCRIPTS;
use crate::sentinel::{self, Answer};
use crate::server::{self, ServerInfo};
use crate::url::{Sentinels, Target, host_port};

/// Where the store connects: one server, or the primary Sentinel names.
#[derive(Clone)]
pub(crate) enum Endpoint {
    /// The one server of a `redis://` URL (boxed: a client is large, and endpoints are
    /// cloned into every connection task).
    Direct(Box<Client>),
    /// The primary of a `redis+sentinel://` URL.
    Sentinel {
        sentinels: Arc<Sentinels>,
        tls: bool,
        db: i64,
    },
}

/// The store's multiplexed connection, ready for its calls.
pub(crate) struct Opened {
    pub(crate) conn: ConnectionManager,
    pub(crate) info: ServerInfo,
    /// The server's `host:port`.
    pub(crate) address: String,
}

impl Endpoint {
    /// The endpoint of `target`.
    ///
    /// # Errors
    /// `Unsupported` for TLS without the `tls` feature; `InvalidInput` for a URL the redis
    /// client rejects.
    pub(crate) fn new(target: &Target) -> Result<Endpoint> {
        match &target.sentinels {
            None => Ok(Endpoint::Direct(Box::new(client_for(
                &target.client_url,
                target.tls,
                &target.redacted,
            )?))),
            Some(sentinels) => {
                // Checks TLS support and the credentials before any I/O.
                client_for(
                    &sentinels.server_url(target.tls, "127.0.0.1", 6379, target.db),
                    target.tls,
                    &target.redacted,
                )?;
                Ok(Endpoint::Sentinel {
                    sentinels: Arc::new(sentinels.clone()),
                    tls: target.tls,
                    db: target.db,
                })
            }
        }
    }

    /// Whether the store follows the primary through Sentinel.
    pub(crate) fn follows_sentinel(&self) -> bool {
        matches!(self, Endpoint::Sentinel { .. })
    }

    /// A client for the server to use now, and its `host:port`, for pub/sub connections.
    ///
    /// # Errors
    /// `Unavailable` when no sentinel names the primary.
    pub(crate) async fn client(
        &self,
        options: &RedisOptions,
        server: &str,
    ) -> Result<(Client, String)> {
        match self {
            Endpoint::Direct(client) => {
                let address = client.get_connection_info().addr().to_string();
                Ok((Client::clone(client), address))
            }
            Endpoint::Sentinel { sentinels, tls, db } => {
                let mut why = Vec::new();
                for (host, port) in &sentinels.hosts {
                    match sentinel::ask(sentinels, *tls, host, *port, options).await {
                        Answer::Primary(h, p) => {
                            let url = sentinels.server_url(*tls, &h, p, *db);
                            return Ok((client_for(&url, *tls, server)?, host_port(&h, p)));
                        }
                        answer => why.push(explain(host, *port, &sentinels.master, &answer)),
                    }
                }
                Err(no_primary(server, &sentinels.master, &why))
            }
        }
    }

    /// Opens the store's multiplexed connection to the primary: loads the lock scripts and
    /// reads the server's facts, within the call deadline per server tried.
    ///
    /// # Errors
    /// `Unavailable` when the server cannot be reached or reports itself a replica; with
    /// Sentinel, when no sentinel names a primary that can be reached and is one.
    pub(crate) async fn open(
        &self,
        config: &ConnectionManagerConfig,
        options: &RedisOptions,
        server: &str,
    ) -> Result<Opened> {
        match self {
            Endpoint::Direct(client) => {
                let address = client.get_connection_info().addr().to_string();
                open_at(client, address, config, options, server).await
            }
            Endpoint::Sentinel { sentinels, tls, db } => {
                let mut why = Vec::new();
                let mut tried = Vec::new();
                for (host, port) in &sentinels.hosts {
                    let answer = sentinel::ask(sentinels, *tls, host, *port, options).await;
                    let Answer::Primary(h, p) = &answer else {
                        why.push(explain(host, *port, &sentinels.master, &answer));
                        continue;
                    };
                    let address = host_port(h, *p);
                    if tried.contains(&address) {
                        continue;
                    }
                    tried.push(address.clone());
                    let client = client_for(&sentinels.server_url(*tls, h, *p, *db), *tls, server)?;
                    match open_at(&client, address, config, options, server).await {
                        Ok(opened) => return Ok(opened),
                        Err(e) => why.push(format!(
                            "sentinel {} named {}: {}",
                            host_port(host, *port),
                            host_port(h, *p),
                            e.message()
                        )),
                    }
                }
                Err(no_primary(server, &sentinels.master, &why))
            }
        }
    }
}

/// Opens a connection to `client`'s server, loads the lock scripts and reads its facts;
/// refuses a replica.
async fn open_at(
    client: &Client,
    address: String,
    config: &ConnectionManagerConfig,
    options: &RedisOptions,
    server: &str,
) -> Result<Opened> {
    let deadline = options.call_deadline();
    let connecting = async {
        let mut conn = ConnectionManager::new_with_config(client.clone(), config.clone()).await?;
        let mut load = redis::pipe();
        for script in SCRIPTS.all() {
            load.load_script(script);
        }
        load.query_async::<Vec<String>>(&mut conn).await?;
        let info = server::read(&mut conn).await?;
        Ok::<_, RedisError>((conn, info))
    };
    let (conn, info) = match timeout(deadline, connecting).await {
        Ok(Ok(connected)) => connected,
        Ok(Err(e)) => return Err(redis_error(e, "connecting", server)),
        Err(_) => return Err(timed_out("connecting", server, deadline)),
    };
    if info.is_replica() {
        return Err(Error::unavailable(format!(
            "{server}: the server at {address} reports itself a replica (role {}); it refuses writes, so the store does not use it: name the primary, or use a redis+sentinel:// URL",
            info.role.as_deref().unwrap_or("unknown")
        )));
    }
    Ok(Opened {
        conn,
        info,
        address,
    })
}

fn explain(host: &str, port: u16, master: &str, answer: &Answer) -> String {
    let sentinel = host_port(host, port);
    match answer {
        Answer::Primary(h, p) => format!("sentinel {sentinel} named {}", host_port(h, *p)),
        Answer::Unknown => format!("sentinel {sentinel} monitors no master named {master:?}"),
        Answer::Failed(why) => format!("sentinel {sentinel}: {why}"),
    }
}

fn no_primary(server: &str, master: &str, why: &[String]) -> Error {
    Error::unavailable(format!(
        "{server}: found no primary for {master:?}: {}",
        why.join("; ")
    ))
}

/// A redis client for the server at `url`: `TCP_NODELAY`, TLS for `rediss://`.
///
/// # Errors
/// `Unsupported` for TLS in a build without the `tls` feature; `InvalidInput` when the
/// redis client rejects the URL.
pub(crate) fn client_for(url: &str, tls: bool, server: &str) -> Result<Client> {
    tls_ready(tls, server)?;
    let info = url
        .into_connection_info()
        .map_err(|e| redis_error(e, "parsing the URL", server))?
        .set_tcp_settings(TcpSettings::default().set_nodelay(true));
    Client::open(info).map_err(|e| redis_error(e, "opening a client", server))
}

/// Makes TLS ready for the connections of the store `server`, when `tls` asks for it.
///
/// # Errors
/// `Unsupported` for TLS in a build without the `tls` feature.
pub(crate) fn tls_ready(tls: bool, server: &str) -> Result<()> {
    if tls {
        #[cfg(not(feature = "tls"))]
        return Err(Error::unsupported(format!(
            "store URL {server:?} asks for TLS, but this build of baton-redis has no TLS support; enable its `tls` feature (on by default)"
        )));
        #[cfg(feature = "tls")]
        {
            // rustls needs a process-wide crypto provider; install ring unless the
            // application installed one already.
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
    }
    // Named only by the error of a build without TLS.
    let _ = server;
    Ok(())
}
