//! The store under test: a private server (or an SQLite file), the fault proxy in front of
//! a network server, and the faults that act on them.
//!
//! Workers reach Redis and PostgreSQL only through the [`FaultProxy`]; the parent's own
//! administrative commands (`SCRIPT FLUSH`, `CLIENT KILL`, `pg_terminate_backend`) and the
//! final audit go to the server directly. Store timeouts are short (Redis 500 ms,
//! PostgreSQL 1 s, SQLite's busy timeout 1 s), well below the workload's TTLs, so faults
//! show up as failed calls rather than as stalls.

use std::io;
use std::path::PathBuf;
use std::time::Duration;

use baton_testkit::postgres::{PostgresServer, Stop};
use baton_testkit::proxy::FaultProxy;
use baton_testkit::redis::RedisServer;

use crate::plan::StoreKind;

/// The `application_name` of the workers' PostgreSQL connections, for
/// `pg_terminate_backend`.
pub const PG_APPLICATION: &str = "baton-soak";

/// The application names whose backends a `terminate-backends` fault ends: the workers'
/// pools and the stores' `LISTEN` connections.
const PG_TERMINATED: [&str; 2] = [PG_APPLICATION, "baton-listen"];

enum Server {
    Redis(RedisServer),
    Postgres(PostgresServer),
    Sqlite(PathBuf),
}

/// The store under test and what stands in front of it.
pub struct Cluster {
    server: Server,
    proxy: Option<FaultProxy>,
}

impl Cluster {
    /// Starts the store: a private `redis-server` or PostgreSQL behind a fault proxy, or
    /// names an SQLite file in `dir`.
    ///
    /// # Errors
    /// When the server binary is missing (the message says how to install it) or the
    /// server does not start.
    pub fn start(store: StoreKind, dir: &std::path::Path) -> io::Result<Cluster> {
        let server = match store {
            StoreKind::Redis => Server::Redis(RedisServer::start()?),
            StoreKind::Postgres => Server::Postgres(PostgresServer::start()?),
            StoreKind::Sqlite => Server::Sqlite(dir.join("baton.db")),
        };
        let proxy = match &server {
            Server::Redis(s) => Some(FaultProxy::start(s.addr())?),
            Server::Postgres(s) => Some(FaultProxy::start(s.addr())?),
            Server::Sqlite(_) => None,
        };
        Ok(Cluster { server, proxy })
    }

    /// One line on what runs where.
    pub fn describe(&self) -> String {
        let via = |p: &Option<FaultProxy>| {
            p.as_ref()
                .map(|p| format!(" via fault proxy {}", p.addr()))
                .unwrap_or_default()
        };
        match &self.server {
            Server::Redis(s) => format!(
                "redis-server (no persistence) on {}{}",
                s.addr(),
                via(&self.proxy)
            ),
            Server::Postgres(s) => format!("postgres on {}{}", s.addr(), via(&self.proxy)),
            Server::Sqlite(path) => format!("sqlite file {}", path.display()),
        }
    }

    /// The URL the workers use: through the proxy, with short timeouts.
    pub fn worker_url(&self) -> String {
        let proxy = self.proxy.as_ref().map(|p| p.addr());
        match (&self.server, proxy) {
            (Server::Redis(_), Some(addr)) => {
                format!("redis://{addr}/0?connect_timeout=500ms&response_timeout=500ms")
            }
            (Server::Postgres(_), Some(addr)) => format!(
                "postgres://postgres@{addr}/postgres?application_name={PG_APPLICATION}&connect_timeout=1s&response_timeout=1s"
            ),
            (Server::Sqlite(path), _) => format!("sqlite://{}?busy_timeout=1s", path.display()),
            _ => unreachable!("network stores always have a proxy"),
        }
    }

    /// The URL of the server itself, for the final audit.
    pub fn direct_url(&self) -> String {
        match &self.server {
            Server::Redis(s) => s.url(),
            Server::Postgres(s) => s.url(),
            Server::Sqlite(path) => format!("sqlite://{}", path.display()),
        }
    }

    fn proxy(&self) -> io::Result<&FaultProxy> {
        self.proxy
            .as_ref()
            .ok_or_else(|| io::Error::other("this store has no fault proxy"))
    }

    /// Kills the server (Redis: SIGKILL, the data is gone; PostgreSQL: an immediate or a
    /// fast shutdown). Nothing for SQLite.
    ///
    /// # Errors
    /// When PostgreSQL does not stop in time.
    pub fn stop_server(&self, crash: bool) -> io::Result<()> {
        match &self.server {
            Server::Redis(s) => {
                s.kill();
                Ok(())
            }
            Server::Postgres(s) => s.stop(if crash { Stop::Immediate } else { Stop::Fast }),
            Server::Sqlite(_) => Err(io::Error::other("sqlite has no server")),
        }
    }

    /// Starts the stopped server again, on the same port, and waits until it answers.
    ///
    /// # Errors
    /// When it does not come back in time.
    pub fn start_server(&self) -> io::Result<()> {
        match &self.server {
            Server::Redis(s) => s.restart(),
            Server::Postgres(s) => s.start_again(),
            Server::Sqlite(_) => Err(io::Error::other("sqlite has no server")),
        }
    }

    /// Whether a server restart loses the store's data (Redis without persistence).
    pub fn restart_loses_data(&self) -> bool {
        matches!(self.server, Server::Redis(_))
    }

    /// Delays every chunk of bytes through the proxy by `delay` each way.
    ///
    /// # Errors
    /// Without a proxy.
    pub fn latency(&self, delay: Duration) -> io::Result<()> {
        self.proxy()?.set_latency(delay);
        Ok(())
    }

    /// Switches the proxy to a blackhole.
    ///
    /// # Errors
    /// Without a proxy.
    pub fn blackhole(&self) -> io::Result<()> {
        self.proxy()?.blackhole();
        Ok(())
    }

    /// Resets every proxied connection until healed.
    ///
    /// # Errors
    /// Without a proxy.
    pub fn reset(&self) -> io::Result<()> {
        self.proxy()?.reset();
        Ok(())
    }

    /// Swallows the server's replies until healed.
    ///
    /// # Errors
    /// Without a proxy.
    pub fn drop_replies(&self) -> io::Result<()> {
        self.proxy()?.drop_replies();
        Ok(())
    }

    /// Resets the current proxied connections once.
    ///
    /// # Errors
    /// Without a proxy.
    pub fn kill_connections(&self) -> io::Result<()> {
        self.proxy()?.kill_connections();
        Ok(())
    }

    /// Ends the proxy's fault and its latency. Nothing without a proxy.
    pub fn heal(&self) {
        if let Some(proxy) = &self.proxy {
            proxy.heal();
            proxy.set_latency(Duration::ZERO);
        }
    }

    /// `SCRIPT FLUSH` (Redis).
    ///
    /// # Errors
    /// On another store, or when the server answers an error.
    pub fn script_flush(&self) -> io::Result<()> {
        match &self.server {
            Server::Redis(s) => s.command_ok(&["SCRIPT", "FLUSH"]).map(drop),
            _ => Err(io::Error::other("SCRIPT FLUSH is a Redis command")),
        }
    }

    /// `CLIENT KILL TYPE normal` and `CLIENT KILL TYPE pubsub` (Redis); answers how many
    /// connections were closed.
    ///
    /// # Errors
    /// On another store, or when the server answers an error.
    pub fn client_kill(&self) -> io::Result<u64> {
        match &self.server {
            Server::Redis(s) => {
                let mut killed = 0;
                for kind in ["normal", "pubsub"] {
                    let reply = s.command_ok(&["CLIENT", "KILL", "TYPE", kind])?;
                    killed += reply.as_integer().unwrap_or_default().max(0) as u64;
                }
                Ok(killed)
            }
            _ => Err(io::Error::other("CLIENT KILL is a Redis command")),
        }
    }

    /// `pg_terminate_backend` of every worker connection (PostgreSQL); answers how many.
    ///
    /// # Errors
    /// On another store, or when `psql` fails.
    pub fn terminate_backends(&self) -> io::Result<u64> {
        match &self.server {
            Server::Postgres(s) => {
                let mut ended = 0;
                for application in PG_TERMINATED {
                    ended += s.terminate_backends(application)?;
                }
                Ok(ended)
            }
            _ => Err(io::Error::other(
                "pg_terminate_backend is a PostgreSQL function",
            )),
        }
    }
}
