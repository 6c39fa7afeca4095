//! The store under test: a private server (or an SQLite file), the fault proxy in front of
//! a network server, and the faults that act on them.
//!
//! Workers reach Redis and PostgreSQL only through the [`FaultProxy`]; the parent's own
//! administrative commands (`SCRIPT FLUSH`, `CLIENT KILL`, `pg_terminate_backend`) and the
//! final audit go to the server directly. Store timeouts are short (Redis 500 ms,
//! PostgreSQL 1 s, SQLite's busy timeout 1 s), well below the workload's TTLs, so faults
//! show up as failed calls rather than as stalls.
//!
//! The Sentinel topology has no proxy: the workers follow the primary the sentinels name
//! (`redis+sentinel://`), and its faults act on the servers themselves (a primary killed and
//! a replica promoted, `SCRIPT FLUSH` and `CLIENT KILL` on whichever server is the primary).

use std::io;
use std::path::PathBuf;
use std::time::Duration;

use baton_testkit::postgres::{PostgresServer, Stop};
use baton_testkit::proxy::FaultProxy;
use baton_testkit::redis::RedisServer;
use baton_testkit::sentinel::SentinelTopology;

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
    Sentinel(SentinelTopology),
}

/// How long the sentinels may take to promote the replica, and the old primary to
/// synchronize as a replica of the new one, on a loaded machine.
const FAILOVER_PATIENCE: Duration = Duration::from_secs(60);

/// What a promotion did, for the nemesis's log.
#[derive(Debug, Clone, Copy)]
pub struct Promotion {
    /// The old primary's port.
    pub old: u16,
    /// The promoted replica's port.
    pub new: u16,
    /// When the sentinels named the promoted replica.
    pub promoted: baton_testkit::MonoTime,
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
            StoreKind::RedisSentinel => Server::Sentinel(SentinelTopology::start()?),
        };
        let proxy = match &server {
            Server::Redis(s) => Some(FaultProxy::start(s.addr())?),
            Server::Postgres(s) => Some(FaultProxy::start(s.addr())?),
            Server::Sqlite(_) | Server::Sentinel(_) => None,
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
            Server::Sentinel(t) => format!(
                "redis primary and replica (no persistence) on ports {:?}, sentinels on {:?}",
                t.servers()
                    .iter()
                    .map(RedisServer::port)
                    .collect::<Vec<_>>(),
                t.sentinel_ports()
            ),
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
            (Server::Sentinel(t), _) => {
                format!("{}?connect_timeout=500ms&response_timeout=500ms", t.url())
            }
            _ => unreachable!("network stores always have a proxy"),
        }
    }

    /// The URL of the server itself, for the final audit.
    pub fn direct_url(&self) -> String {
        match &self.server {
            Server::Redis(s) => s.url(),
            Server::Postgres(s) => s.url(),
            Server::Sqlite(path) => format!("sqlite://{}", path.display()),
            Server::Sentinel(t) => t.url(),
        }
    }

    /// The fault proxy between the workers and the server.
    ///
    /// # Errors
    /// When this store has none (SQLite, Sentinel).
    pub fn proxy(&self) -> io::Result<&FaultProxy> {
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
            Server::Sentinel(_) => Err(io::Error::other(
                "the sentinel topology's primary is killed by promote-replica",
            )),
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
            Server::Sentinel(_) => Err(io::Error::other(
                "the sentinel topology's primary is restarted by promote-replica",
            )),
        }
    }

    /// Whether a server restart loses the store's data (Redis without persistence).
    pub fn restart_loses_data(&self) -> bool {
        matches!(self.server, Server::Redis(_))
    }

    /// Kills the primary (SIGKILL) and waits until the sentinels promoted the replica.
    ///
    /// # Errors
    /// On another store, or when the sentinels name no new primary in time.
    pub fn kill_primary(&self) -> io::Result<Promotion> {
        let Server::Sentinel(t) = &self.server else {
            return Err(io::Error::other("only the sentinel topology has a replica"));
        };
        let old = t.primary_port()?;
        t.kill(old)?;
        let new = t.wait_for_failover(old, FAILOVER_PATIENCE)?;
        Ok(Promotion {
            old,
            new,
            promoted: baton_testkit::MonoTime::now(),
        })
    }

    /// Starts the old primary of `promotion` again (empty: no persistence), makes it a
    /// replica of the new primary and waits until it is synchronized, so that the next
    /// promotion has a replica to promote.
    ///
    /// The sentinels would convert it by themselves, but only once they next ask it for
    /// `INFO` (every ten seconds): `REPLICAOF` does what they would, at once, as an
    /// operator bringing a server back does.
    ///
    /// # Errors
    /// On another store, or when it does not start or synchronize in time.
    pub fn rejoin(&self, promotion: &Promotion) -> io::Result<()> {
        let Server::Sentinel(t) = &self.server else {
            return Err(io::Error::other("only the sentinel topology has a replica"));
        };
        t.restart(promotion.old)?;
        let server = t
            .server(promotion.old)
            .ok_or_else(|| io::Error::other("the old primary is gone"))?;
        server.command_ok(&["REPLICAOF", "127.0.0.1", &promotion.new.to_string()])?;
        server.wait_replicating(FAILOVER_PATIENCE)
    }

    /// The server the Redis commands of the nemesis go to: the only one, or the primary
    /// the sentinels name now.
    fn redis_primary(&self) -> io::Result<&RedisServer> {
        match &self.server {
            Server::Redis(s) => Ok(s),
            Server::Sentinel(t) => {
                let port = t.primary_port()?;
                t.server(port)
                    .ok_or_else(|| io::Error::other(format!("no server on port {port}")))
            }
            _ => Err(io::Error::other("not a Redis store")),
        }
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
        self.redis_primary()?
            .command_ok(&["SCRIPT", "FLUSH"])
            .map(drop)
    }

    /// `CLIENT KILL TYPE normal` and `CLIENT KILL TYPE pubsub` (Redis); answers how many
    /// connections were closed.
    ///
    /// # Errors
    /// On another store, or when the server answers an error.
    pub fn client_kill(&self) -> io::Result<u64> {
        let s = self.redis_primary()?;
        let mut killed = 0;
        for kind in ["normal", "pubsub"] {
            let reply = s.command_ok(&["CLIENT", "KILL", "TYPE", kind])?;
            killed += reply.as_integer().unwrap_or_default().max(0) as u64;
        }
        Ok(killed)
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
