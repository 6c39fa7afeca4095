//! A private Redis Sentinel topology for failover tests: one primary, one replica and three
//! `redis-sentinel` processes, all on loopback ports of their own.
//!
//! [`SentinelTopology::start`] starts the primary and a synchronized replica
//! ([`RedisServer`]), then three sentinels monitoring the primary as [`MASTER_NAME`] with
//! quorum 2, `down-after-milliseconds` [`DOWN_AFTER`] and `failover-timeout`
//! [`FAILOVER_TIMEOUT`], each announcing `127.0.0.1` and its own port, and returns once every
//! sentinel knows the replica and the two other sentinels (so a failover can be agreed on).
//! Killing the primary ([`SentinelTopology::kill`]) makes the sentinels promote the replica
//! within a couple of seconds;
//! [`SentinelTopology::wait_for_failover`] waits until they name another primary.
//!
//! A missing `redis-sentinel` binary is an error that names the fix (`apt-get install
//! redis-sentinel`), never a reason to skip.
//!
//! ```no_run
//! use baton_testkit::sentinel::SentinelTopology;
//!
//! let topology = SentinelTopology::start().unwrap();
//! let url = topology.url(); // redis+sentinel://127.0.0.1:p1,127.0.0.1:p2,127.0.0.1:p3/baton
//! let old = topology.primary_port().unwrap();
//! topology.kill(old).unwrap(); // SIGKILL, and the port stays taken
//! let new = topology.wait_for_failover(old, std::time::Duration::from_secs(30)).unwrap();
//! # let _ = (url, new);
//! ```
//!
//! ## Behavior
//! - Dropping the topology kills every process (SIGKILL) and removes their directories.
//! - The servers keep the testkit's defaults (no persistence); the replica announces
//!   `127.0.0.1` and its port, so the sentinels name loopback addresses only.

use std::ffi::{OsStr, OsString};
use std::fmt;
use std::io;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::ops::ControlFlow;
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::redis::{RedisOptions, RedisServer, Resp, command, ping};
use crate::server::{ServerProcess, on_a_free_port, poll_until, retry};

/// The environment variable that names the `redis-sentinel` binary, when it is not
/// `redis-sentinel` on `PATH`.
pub const REDIS_SENTINEL_ENV: &str = "BATON_REDIS_SENTINEL";

/// The one-line fix for a machine without Sentinel.
pub const INSTALL_HINT: &str = "install it with `apt-get install redis-sentinel` (Debian/Ubuntu), or name the binary in BATON_REDIS_SENTINEL";

/// The name the sentinels monitor the primary by.
pub const MASTER_NAME: &str = "baton";

/// How long the primary may be silent before a sentinel considers it down.
pub const DOWN_AFTER: Duration = Duration::from_millis(1000);

/// The sentinels' `failover-timeout`.
pub const FAILOVER_TIMEOUT: Duration = Duration::from_millis(3000);

/// How long a sentinel may take to start and to learn the topology.
const STARTUP: Duration = Duration::from_secs(30);

/// One primary, one replica and three sentinels. See the [module docs](self).
pub struct SentinelTopology {
    servers: Vec<RedisServer>,
    sentinels: Vec<Sentinel>,
    /// Listeners holding the ports of killed servers, so that no other test's server binds
    /// one while these sentinels still watch it (they would take it for the old primary).
    reserved: Mutex<Vec<TcpListener>>,
}

impl fmt::Debug for SentinelTopology {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SentinelTopology")
            .field(
                "servers",
                &self
                    .servers
                    .iter()
                    .map(RedisServer::port)
                    .collect::<Vec<_>>(),
            )
            .field("sentinels", &self.sentinel_ports())
            .finish()
    }
}

/// One `redis-sentinel`, killed when dropped.
struct Sentinel {
    process: ServerProcess,
}

impl SentinelTopology {
    /// Starts the primary, the replica and three sentinels, and waits until the sentinels
    /// know each other and the replica.
    ///
    /// # Errors
    /// When a binary is missing (the message says how to install it), or a process does not
    /// start or the sentinels do not learn the topology in time (the message quotes a log).
    pub fn start() -> io::Result<SentinelTopology> {
        let primary = RedisServer::start_with(
            RedisOptions::new().args(["--replica-announce-ip", "127.0.0.1"]),
        )?;
        let replica = RedisServer::start_replica_of(
            &primary,
            RedisOptions::new().args(["--replica-announce-ip", "127.0.0.1"]),
        )?;
        let binary = std::env::var_os(REDIS_SENTINEL_ENV)
            .filter(|b| !b.is_empty())
            .unwrap_or_else(|| OsString::from("redis-sentinel"));
        let mut sentinels = Vec::new();
        for _ in 0..3 {
            sentinels.push(Sentinel::start(&binary, primary.port())?);
        }
        let topology = SentinelTopology {
            servers: vec![primary, replica],
            sentinels,
            reserved: Mutex::new(Vec::new()),
        };
        topology.wait_until_known()?;
        Ok(topology)
    }

    /// `redis+sentinel://127.0.0.1:<p1>,127.0.0.1:<p2>,127.0.0.1:<p3>/baton`.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .sentinels
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.port()))
            .collect();
        format!("redis+sentinel://{}/{MASTER_NAME}", hosts.join(","))
    }

    /// The Redis servers, the first started as the primary.
    pub fn servers(&self) -> &[RedisServer] {
        &self.servers
    }

    /// The server listening on `port`.
    pub fn server(&self, port: u16) -> Option<&RedisServer> {
        self.servers.iter().find(|s| s.port() == port)
    }

    /// Kills the server on `port` (SIGKILL) and keeps its port bound by a listener that
    /// accepts and never answers, until [`SentinelTopology::restart`]: the sentinels see a
    /// dead server, and no other test's server can take the port meanwhile.
    ///
    /// # Errors
    /// When no server of the topology listens on `port`.
    pub fn kill(&self, port: u16) -> io::Result<()> {
        let server = self
            .server(port)
            .ok_or_else(|| io::Error::other(format!("no server on port {port}")))?;
        server.kill();
        // The port is free now; take it before anyone else does.
        let listener = retry(Duration::from_secs(5), Duration::from_millis(10), || {
            TcpListener::bind((Ipv4Addr::LOCALHOST, port))
        })?;
        self.reserved
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(listener);
        Ok(())
    }

    /// Frees the port that [`SentinelTopology::kill`] held and starts the server on it
    /// again (with its original arguments: the sentinels make it a replica of the new
    /// primary).
    ///
    /// # Errors
    /// As [`RedisServer::restart`].
    pub fn restart(&self, port: u16) -> io::Result<()> {
        let server = self
            .server(port)
            .ok_or_else(|| io::Error::other(format!("no server on port {port}")))?;
        self.reserved
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|l| l.local_addr().map(|a| a.port()).ok() != Some(port));
        server.restart()
    }

    /// The ports of the sentinels.
    pub fn sentinel_ports(&self) -> Vec<u16> {
        self.sentinels.iter().map(Sentinel::port).collect()
    }

    /// The port of the primary the first sentinel that answers names.
    ///
    /// # Errors
    /// When no sentinel answers with an address.
    pub fn primary_port(&self) -> io::Result<u16> {
        let mut last = None;
        for sentinel in &self.sentinels {
            match sentinel.primary() {
                Ok(port) => return Ok(port),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| io::Error::other("no sentinel")))
    }

    /// Waits until every sentinel names a primary other than `old` that answers as a
    /// primary (`role:master`), and returns its port.
    ///
    /// # Errors
    /// When that does not happen within `timeout` (the message quotes a sentinel's log).
    pub fn wait_for_failover(&self, old: u16, timeout: Duration) -> io::Result<u16> {
        poll_until(
            timeout,
            Duration::from_millis(50),
            || {
                let named: Vec<Option<u16>> =
                    self.sentinels.iter().map(|s| s.primary().ok()).collect();
                if let Some(Some(new)) = named.first()
                    && *new != old
                    && named.iter().all(|n| *n == Some(*new))
                    && self.answers_as_primary(*new)
                {
                    return Ok(ControlFlow::Break(*new));
                }
                Ok(ControlFlow::Continue(named))
            },
            |named| {
                format!(
                    "the sentinels named {named:?} (old primary {old}) after {timeout:?}; the first, {}: {}",
                    self.sentinels[0].process,
                    self.sentinels[0].process.diagnostics()
                )
            },
        )
    }

    /// Whether the server on `port` answers as a primary (`role:master`).
    fn answers_as_primary(&self, port: u16) -> bool {
        self.server(port)
            .and_then(|s| s.info("replication").ok())
            .is_some_and(|info| info.lines().any(|l| l.trim() == "role:master"))
    }

    /// Waits until every sentinel knows the replica and the two other sentinels.
    fn wait_until_known(&self) -> io::Result<()> {
        let deadline = Instant::now() + STARTUP;
        for sentinel in &self.sentinels {
            poll_until(
                deadline.saturating_duration_since(Instant::now()),
                Duration::from_millis(50),
                || {
                    let replicas = sentinel.count(&["SENTINEL", "REPLICAS", MASTER_NAME]);
                    let others = sentinel.count(&["SENTINEL", "SENTINELS", MASTER_NAME]);
                    Ok(if replicas == Some(1) && others == Some(2) {
                        ControlFlow::Break(())
                    } else {
                        ControlFlow::Continue((replicas, others))
                    })
                },
                |(replicas, others)| {
                    format!(
                        "{} knows {replicas:?} replicas and {others:?} other sentinels after {STARTUP:?}; {}",
                        sentinel.process,
                        sentinel.process.diagnostics()
                    )
                },
            )?;
        }
        Ok(())
    }
}

impl Sentinel {
    /// Starts a sentinel monitoring the primary on port `primary`, and waits until it
    /// answers `PING`.
    fn start(binary: &OsStr, primary: u16) -> io::Result<Sentinel> {
        on_a_free_port(|port| {
            let sentinel = Sentinel {
                process: ServerProcess::new(
                    "redis-sentinel",
                    INSTALL_HINT,
                    port,
                    Some("sentinel.log"),
                )?,
            };
            sentinel.launch(binary, primary)?;
            Ok(sentinel)
        })
    }

    fn launch(&self, binary: &OsStr, primary: u16) -> io::Result<()> {
        let dir = self.process.dir();
        let config = dir.join("sentinel.conf");
        std::fs::write(
            &config,
            format!(
                "port {port}\nbind 127.0.0.1\ndaemonize no\ndir {dir}\nlogfile {log}\n\
                 sentinel announce-ip 127.0.0.1\nsentinel announce-port {port}\n\
                 sentinel resolve-hostnames no\n\
                 sentinel monitor {MASTER_NAME} 127.0.0.1 {primary} 2\n\
                 sentinel down-after-milliseconds {MASTER_NAME} {down}\n\
                 sentinel failover-timeout {MASTER_NAME} {failover}\n\
                 sentinel parallel-syncs {MASTER_NAME} 1\n",
                port = self.port(),
                dir = dir.display(),
                log = self.process.log_path().display(),
                down = DOWN_AFTER.as_millis(),
                failover = FAILOVER_TIMEOUT.as_millis(),
            ),
        )?;
        let mut command = Command::new(binary);
        command.arg(&config);
        self.process
            .start(&mut command, STARTUP, "answer PING", || ping(self.addr()))
    }

    fn port(&self) -> u16 {
        self.process.port()
    }

    fn addr(&self) -> SocketAddr {
        self.process.addr()
    }

    /// The port of the primary this sentinel names.
    fn primary(&self) -> io::Result<u16> {
        let reply = command(
            self.addr(),
            &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER_NAME],
            Duration::from_secs(2),
        )?;
        let texts = reply
            .as_texts()
            .ok_or_else(|| io::Error::other(format!("sentinel answered {reply:?}")))?;
        texts
            .get(1)
            .and_then(|p| p.parse().ok())
            .ok_or_else(|| io::Error::other(format!("sentinel answered {texts:?}")))
    }

    /// The length of the array a `SENTINEL` command answers.
    fn count(&self, args: &[&str]) -> Option<usize> {
        match command(self.addr(), args, Duration::from_secs(2)).ok()? {
            Resp::Array(Some(items)) => Some(items.len()),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sentinels_promote_the_replica_when_the_primary_is_killed() {
        let topology = SentinelTopology::start().unwrap();
        let url = topology.url();
        assert!(url.starts_with("redis+sentinel://127.0.0.1:"), "{url}");
        assert!(url.ends_with("/baton"), "{url}");
        let old = topology.primary_port().unwrap();
        assert_eq!(old, topology.servers()[0].port());
        topology.kill(old).unwrap();
        let new = topology
            .wait_for_failover(old, Duration::from_secs(30))
            .unwrap();
        assert_eq!(new, topology.servers()[1].port());
    }
}
